/* dpsArgmax / dpsTopK on real communicators: tp = 1 (one GPU) and every tp in
 * {2, 4, 8} that the machine has GPUs for, both backends. Every value is
 * checked against the host reference over the full row (fixtures): fp32,
 * bf16, fp16; V/tp of 1, 7, 33, 1001 and 152064/2; rows changing on every
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

enum { MAXK = 64 };

typedef struct {
  int tp, rank;
  int64_t v_local, vocab;
  int max_rows;
  dpsDataType_t dtype;
  void* d_in;
  int64_t *d_idx, *d_tidx;
  void *d_val, *d_tval;
  float* d_lse;
  void* h_in;
  float* h_row; /* one full row, fp32 */
  int64_t *h_idx, *h_tidx;
  void *h_val, *h_tval;
  float* h_lse;
} SelBufs;

static int selAlloc(SelBufs* b, int tp, int rank, int64_t v_local, int max_rows,
                    dpsDataType_t dtype) {
  memset(b, 0, sizeof *b);
  b->tp = tp;
  b->rank = rank;
  b->v_local = v_local;
  b->vocab = v_local * tp;
  b->max_rows = max_rows;
  b->dtype = dtype;
  const size_t es = dpsDataTypeSize(dtype), R = (size_t)max_rows;
  GT_CUDA(cudaMalloc(&b->d_in, R * (size_t)v_local * es));
  GT_CUDA(cudaMalloc((void**)&b->d_idx, R * 8));
  GT_CUDA(cudaMalloc(&b->d_val, R * es));
  GT_CUDA(cudaMalloc((void**)&b->d_lse, R * 4));
  GT_CUDA(cudaMalloc((void**)&b->d_tidx, R * MAXK * 8));
  GT_CUDA(cudaMalloc(&b->d_tval, R * MAXK * es));
  b->h_in = malloc(R * (size_t)v_local * es);
  b->h_row = (float*)malloc((size_t)b->vocab * 4);
  b->h_idx = (int64_t*)malloc(R * 8);
  b->h_val = malloc(R * es);
  b->h_lse = (float*)malloc(R * 4);
  b->h_tidx = (int64_t*)malloc(R * MAXK * 8);
  b->h_tval = malloc(R * MAXK * es);
  FX_CHECK(b->h_in && b->h_row && b->h_idx && b->h_val && b->h_lse && b->h_tidx && b->h_tval,
           "host allocation");
  return 0;
}

static void selFree(SelBufs* b) {
  cudaFree(b->d_in);
  cudaFree(b->d_idx);
  cudaFree(b->d_val);
  cudaFree(b->d_lse);
  cudaFree(b->d_tidx);
  cudaFree(b->d_tval);
  free(b->h_in);
  free(b->h_row);
  free(b->h_idx);
  free(b->h_val);
  free(b->h_lse);
  free(b->h_tidx);
  free(b->h_tval);
}

static int selUpload(SelBufs* b, int rows, int step) {
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < b->v_local; ++c)
      fxStore(b->h_in, (size_t)r * b->v_local + c,
              fxSelValue(r, b->rank * b->v_local + c, b->vocab, b->v_local, step), b->dtype);
  GT_CUDA(cudaMemcpy(b->d_in, b->h_in, (size_t)rows * b->v_local * dpsDataTypeSize(b->dtype),
                     cudaMemcpyHostToDevice));
  /* poison the outputs: a row not written is caught */
  GT_CUDA(cudaMemset(b->d_idx, 0xab, (size_t)b->max_rows * 8));
  GT_CUDA(cudaMemset(b->d_tidx, 0xab, (size_t)b->max_rows * MAXK * 8));
  return 0;
}

static int sameFloat(float a, float b) { return (a != a && b != b) || a == b; }

/* Checks rows [0, rows) of the argmax (k == 0) or top-k outputs. */
static int selCheck(SelBufs* b, int rows, int step, int64_t limit, int k, int want_lse,
                    const char* what) {
  const size_t es = dpsDataTypeSize(b->dtype);
  long bad = 0;
  if (k == 0) {
    GT_CUDA(cudaMemcpy(b->h_idx, b->d_idx, (size_t)rows * 8, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(b->h_val, b->d_val, (size_t)rows * es, cudaMemcpyDeviceToHost));
    if (want_lse)
      GT_CUDA(cudaMemcpy(b->h_lse, b->d_lse, (size_t)rows * 4, cudaMemcpyDeviceToHost));
  } else {
    GT_CUDA(cudaMemcpy(b->h_tidx, b->d_tidx, (size_t)rows * k * 8, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(b->h_tval, b->d_tval, (size_t)rows * k * es, cudaMemcpyDeviceToHost));
  }
  for (int r = 0; r < rows; ++r) {
    /* the reference sees the values as stored in the dtype */
    for (int64_t c = 0; c < b->vocab; ++c) {
      uint32_t tmp = 0;
      fxStore(&tmp, 0, fxSelValue(r, c, b->vocab, b->v_local, step), b->dtype);
      b->h_row[c] = fxLoad(&tmp, 0, b->dtype);
    }
    if (k == 0) {
      int64_t wi;
      float wv;
      double wl;
      fxRefArgmax(b->h_row, limit, &wi, &wv, &wl);
      const float gv = fxLoad(b->h_val, (size_t)r, b->dtype);
      int ok = b->h_idx[r] == wi && sameFloat(gv, wv);
      if (want_lse) {
        const float gl = b->h_lse[r];
        const int lok = (wl != wl && gl != gl) || (isinf(wl) && gl == (float)wl) ||
                        (isfinite(wl) && fabs((double)gl - wl) <= 1e-4 * fmax(1.0, fabs(wl)));
        ok = ok && lok;
        if (!lok && bad < 5)
          fprintf(stderr, "  %s row %d: lse %.7g, want %.7g\n", what, r, gl, wl);
      }
      if (!ok && bad < 5)
        fprintf(stderr, "  %s row %d: index %lld value %g, want %lld %g\n", what, r,
                (long long)b->h_idx[r], gv, (long long)wi, wv);
      bad += !ok;
    } else {
      int64_t wi[MAXK];
      float wv[MAXK];
      fxRefTopK(b->h_row, limit, k, wi, wv);
      for (int j = 0; j < k; ++j) {
        const int64_t gi = b->h_tidx[(size_t)r * k + j];
        const float gv = fxLoad(b->h_tval, (size_t)r * k + j, b->dtype);
        const int ok = gi == wi[j] && sameFloat(gv, wv[j]);
        if (!ok && bad < 5)
          fprintf(stderr, "  %s row %d [%d]: index %lld value %g, want %lld %g\n", what, r, j,
                  (long long)gi, gv, (long long)wi[j], wv[j]);
        bad += !ok;
      }
    }
  }
  FX_CHECK(bad == 0, "%s: %ld values wrong", what, bad);
  return 0;
}

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
      if (di > 0 && v_local == 76032) continue; /* one dtype at the real size */
      const int max_pad_bs = 2 * tp, n = 4, max_rows = max_pad_bs * n;
      dpsConfig_t cfg = gtConfig(rank, tp, max_pad_bs, n, v_local * tp, dt, backend);
      dpsComm_t comm;
      int rc = gtCreate(&comm, &cfg);
      if (rc) return rc;
      SelBufs b;
      if (selAlloc(&b, tp, rank, v_local, max_rows, dt)) return 1;
      const int64_t V = b.vocab;
      const int64_t limits[] = {V, V - 1, v_local, 1, (v_local + 1) / 2};
      const int rows_seq[] = {max_rows, 1, 5, max_rows / 2, 3};
      char what[160];
      for (int li = 0; li < 5; ++li) {
        const int64_t limit = limits[li] < 1 ? 1 : limits[li];
        const int rows = rows_seq[li];
        const int step = 7 * vi + 3 * di + li;
        if (selUpload(&b, rows, step)) return 1;
        const int want_lse = li != 3;
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, limit, b.d_idx, b.d_val,
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
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, V, b.d_idx, b.d_val, b.d_lse, s));
        GT_CUDA(cudaStreamSynchronize(s));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        FX_CHECK_OK(dpsArgmax(comm, b.d_in, rows, v_local, dt, V, b.d_idx, b.d_val, b.d_lse, s));
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
        GT_CUDA(cudaMemset(b.d_idx, 0x5a, (size_t)max_rows * 8));
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, max_rows + 1, v_local, dt, V, b.d_idx, NULL, NULL, s),
                     dpsInvalidArgument, "rows=");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local + 1, dt, V, b.d_idx, NULL, NULL, s),
                     dpsInvalidArgument, "logits is");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V + 1, b.d_idx, NULL, NULL, s),
                     dpsInvalidArgument, "vocab_limit=");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, 0, b.d_idx, NULL, NULL, s),
                     dpsInvalidArgument, "vocab_limit=0");
        FX_CHECK_ERR(dpsArgmax(comm, NULL, 2, v_local, dt, V, b.d_idx, NULL, NULL, s),
                     dpsInvalidArgument, "logits is NULL");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V, NULL, NULL, NULL, s),
                     dpsInvalidArgument, "index is NULL");
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, dt, V, (int64_t*)((char*)b.d_idx + 4),
                               NULL, NULL, s),
                     dpsInvalidArgument, "not 8-byte aligned");
        const dpsDataType_t other = dt == dpsFloat32 ? dpsBfloat16 : dpsFloat32;
        FX_CHECK_ERR(dpsArgmax(comm, b.d_in, 2, v_local, other, V, b.d_idx, NULL, NULL, s),
                     dpsInvalidUsage, "differs");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, 0, V, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "k=0");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, MAXK + 1, V, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "k=65");
        FX_CHECK_ERR(dpsTopK(comm, b.d_in, 2, v_local, dt, 5, 4, NULL, b.d_tidx, s),
                     dpsInvalidArgument, "vocab_limit=4");
        GT_CUDA(cudaStreamSynchronize(s));
        int64_t h[4];
        GT_CUDA(cudaMemcpy(h, b.d_idx, sizeof h, cudaMemcpyDeviceToHost));
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
  const int ngpu = fxGpuCount();
  if (ngpu < 1) {
    printf("test_gpu_select: SKIP: needs a GPU, found none\n");
    return 77;
  }
  dpsBackend_t backends[GT_MAX_BACKENDS];
  const int nb = gtBackends(argc, argv, backends);
  if (nb < 0) return 2;
  unsetenv("DPSAMPLING_BACKEND");
  unsetenv("TOKENSPEED_DP_SAMPLING_BACKEND");
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
