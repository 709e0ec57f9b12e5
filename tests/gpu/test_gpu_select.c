/* dpsArgmax / dpsTopK on real communicators: tp = 1 (one GPU) and every tp in
 * {2, 4, 8} that the machine has GPUs for, both backends. Every value is
 * checked against the host reference over the full row (fixtures): fp32,
 * bf16, fp16; V/tp of 1, 7, 33, 1001 and 152064/2 (bf16 and fp32); rows changing on every
 * call; vocab_limit at V, inside a shard, on a shard boundary and 1; k = 1,
 * 7 and 64; rows with ties across a shard boundary, NaN, all-NaN, all -inf,
 * +inf; a captured graph replayed with changed inputs; and bad arguments
 * (nothing written). tp 2..8 on one GPU: test_gpu_virtual_ranks scenario=select.
 * Usage: test_gpu_select [nccl|onesided|all] */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"
#include "select_common.h"

static int body(int rank, int tp, dpsBackend_t backend) {
  static const int64_t vlocals[] = {1, 7, 33, 1001, 76032};
  static const dpsDataType_t dtypes[] = {dpsFloat32, dpsBfloat16, dpsFloat16};
  const char* small = getenv("DPS_TEST_SMALL");
  const int is_small = small && small[0] && small[0] != '0';
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  long cases = 0;
  for (int vi = 0; vi < 5; ++vi)
    for (int di = 0; di < 3; ++di) {
      const int64_t v_local = vlocals[vi];
      if (is_small && v_local > 1001) continue;
      const dpsDataType_t dt = dtypes[(di + vi) % 3];
      /* two dtypes at the real size: bf16 (8-element vectors) and fp32 (4:
       * tiles of 128 columns under DPSAMPLING_TILED_COLLECT=1) */
      if (di == 1 && v_local == 76032) continue;
      const int max_pad_bs = 2 * tp, n = 4, max_rows = max_pad_bs * n;
      dpsConfig_t cfg = gtConfig(rank, tp, max_pad_bs, n, v_local * tp, dt, backend);
      dpsComm_t comm;
      int rc = gtCreate(&comm, &cfg);
      if (rc) return rc;
      SelBufs b;
      if (selAlloc(&b, tp, rank, v_local, max_rows, dt, s)) return 1;
      const int64_t V = b.vocab;
      const int64_t limits[] = {V, V - 1, v_local, 1, (v_local + 1) / 2};
      const int rows_seq[] = {max_rows, 1, 5, max_rows / 2, 3};
      char what[160];
      for (int li = 0; li < 5; ++li) {
        const int64_t limit = limits[li] < 1 ? 1 : limits[li];
        const int rows = rows_seq[li];
        const int step = 7 * vi + 3 * di + li;
        fxBarrier(); /* no rank's host-side check counts against a peer's timeout */
        if (selUpload(&b, rows, step)) return 1;
        const int want_lse = li != 3;
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, limit, b.d_val, b.d_idx,
                              want_lse ? b.d_lse : NULL, s));
        GT_CUDA(cudaStreamSynchronize(s));
        snprintf(what, sizeof what, "rank %d tp=%d %s %s V/tp=%lld rows=%d limit=%lld argmax", rank,
                 tp, dpsBackendName(backend), dpsDataTypeName(dt), (long long)v_local, rows,
                 (long long)limit);
        if (selCheck(&b, rows, step, limit, 0, want_lse, what)) return 1;
        ++cases;
        const int ks[] = {1, 7, MAXK};
        for (int ki = 0; ki < 3; ++ki) {
          const int k = ks[ki];
          if (k > limit) continue;
          FX_CHECK_OK(dpsTopK(comm, b.d_in, rows, v_local, dt, k, limit, b.d_tval, b.d_tidx, s));
          GT_CUDA(cudaStreamSynchronize(s));
          snprintf(what, sizeof what, "rank %d tp=%d %s %s V/tp=%lld rows=%d limit=%lld top-%d",
                   rank, tp, dpsBackendName(backend), dpsDataTypeName(dt), (long long)v_local, rows,
                   (long long)limit, k);
          if (selCheck(&b, rows, step, limit, k, 0, what)) return 1;
          ++cases;
        }
      }
      /* graph: argmax + top-7 captured, replayed with changed inputs */
      if (v_local >= 7) {
        const int rows = max_rows - 1;
        if (selUpload(&b, rows, 90)) return 1;
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, V, b.d_val, b.d_idx, b.d_lse, s));
        GT_CUDA(cudaStreamSynchronize(s));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, V, b.d_val, b.d_idx, b.d_lse, s));
        FX_CHECK_OK(dpsTopK(comm, b.d_in, rows, v_local, dt, 7, V, b.d_tval, b.d_tidx, s));
        GT_CUDA(cudaStreamEndCapture(s, &g));
        GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
        for (int step = 91; step < 94; ++step) {
          if (selUpload(&b, rows, step)) return 1;
          fxBarrier();
          GT_CUDA(cudaGraphLaunch(ge, s));
          GT_CUDA(cudaStreamSynchronize(s));
          snprintf(what, sizeof what, "rank %d tp=%d %s graph replay step %d", rank, tp,
                   dpsBackendName(backend), step);
          if (selCheck(&b, rows, step, V, 0, 1, what) || selCheck(&b, rows, step, V, 7, 0, what))
            return 1;
          cases += 2;
        }
        GT_CUDA(cudaGraphExecDestroy(ge));
        GT_CUDA(cudaGraphDestroy(g));
      }
      /* bad arguments: an error naming the argument, nothing written */
      if (vi == 1 && di == 0) {
        GT_CUDA(cudaMemsetAsync(b.d_idx, 0x5a, (size_t)max_rows * 8, s));
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, max_rows + 1, v_local, dt, V, NULL, b.d_idx, NULL, s),
                     dpsInvalidArgument, "rows=");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local + 1, dt, V, NULL, b.d_idx, NULL, s),
                     dpsInvalidArgument, "logits is");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V + 1, NULL, b.d_idx, NULL, s),
                     dpsInvalidArgument, "vocab_limit=");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, 0, NULL, b.d_idx, NULL, s),
                     dpsInvalidArgument, "vocab_limit=0");
        FX_CHECK_ERR(dpsArgmax(comm, NULL, 2, v_local, dt, V, NULL, b.d_idx, NULL, s),
                     dpsInvalidArgument, "logits is NULL");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V, b.d_val, NULL, NULL, s),
                     dpsInvalidArgument, "index is NULL");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V, NULL,
                               (int64_t*)((char*)b.d_idx + 4), NULL, s),
                     dpsInvalidArgument, "not 8-byte aligned");
        FX_CHECK(strstr(dpsGetLastError(), "argmax: index=") != NULL, "message: %s",
                 dpsGetLastError());
        /* value pointers off their element size (2 or 4 bytes), named as such */
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V, (char*)b.d_val + 1, b.d_idx,
                               NULL, s),
                     dpsInvalidArgument, "argmax: value=");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, 3, V, (char*)b.d_tval + 1, b.d_tidx,
                             s),
                     dpsInvalidArgument, "topk: values=");
        const dpsDataType_t other = dt == dpsFloat32 ? dpsBfloat16 : dpsFloat32;
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, other, V, NULL, b.d_idx, NULL, s),
                     dpsInvalidUsage, "differs");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, 0, V, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "k=0");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, MAXK + 1, V, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "k=65");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, 5, 4, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "vocab_limit=4");
        GT_CUDA(cudaStreamSynchronize(s));
        int64_t h[4];
        GT_CUDA(cudaMemcpyAsync(h, b.d_idx, sizeof h, cudaMemcpyDeviceToHost, s));
        GT_CUDA(cudaStreamSynchronize(s));
        for (int i = 0; i < 4; ++i)
          FX_CHECK(h[i] == 0x5a5a5a5a5a5a5a5all, "a refused call wrote the output");
        ++cases;
      }
      fxBarrier();
      selFree(&b);
      FX_CHECK_OK(dpsCommDestroy(comm));
    }
  if (rank == 0) printf("  tp=%d %s: %ld cases passed\n", tp, dpsBackendName(backend), cases);
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

static int rankMain(int rank, int nranks, void* arg) {
  return body(rank, nranks, *(const dpsBackend_t*)arg);
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_select", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  int failures = 0;
  const int tps[4] = {1, 2, 4, 8};
  for (int t = 0; t < 4; ++t) {
    if (tps[t] > ngpu) {
      printf("test_gpu_select: tp=%d SKIPPED: needs %d GPUs, found %d\n", tps[t], tps[t], ngpu);
      continue;
    }
    for (int b = 0; b < nb; ++b) {
      const int rc = fxRunRanks(tps[t], rankMain, &backends[b], 600);
      printf("test_gpu_select: tp=%d backend=%s %s\n", tps[t], dpsBackendName(backends[b]),
             rc == 0 ? "PASS" : rc == 77 ? "SKIPPED" : "FAIL");
      fflush(stdout);
      failures += rc != 0 && rc != 77;
    }
  }
  return failures ? 1 : 0;
}
