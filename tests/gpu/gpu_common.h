/* Helpers shared by the multi-GPU tests (header-only, static): world-size and
 * backend loops, communicator creation, device buffers, swap / gather
 * round trips checked against the fixtures' host reference, and counting
 * replacement collectives. Include after defining _POSIX_C_SOURCE. */
#ifndef DPS_GPU_COMMON_H_
#define DPS_GPU_COMMON_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dpsampling.h"
#include "fixtures.h"

#define GT_CUDA(call)                                                              \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    FX_CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));          \
  } while (0)

#define GT_MAX_BACKENDS 2

#if defined(__GNUC__)
#define GT_FN static __attribute__((unused))
#else
#define GT_FN static
#endif

/* ---- the driver ------------------------------------------------------------ */
typedef int (*gtBody)(int rank, int tp, dpsBackend_t backend);

typedef struct {
  gtBody body;
  dpsBackend_t backend;
} gtRunArg;

GT_FN int gtRankMain(int rank, int nranks, void* arg) {
  const gtRunArg* a = (const gtRunArg*)arg;
  return a->body(rank, nranks, a->backend);
}

/* Backends to test: argv[1] or $DPS_TEST_BACKEND = nccl | onesided | all (default). */
GT_FN int gtBackends(int argc, char** argv, dpsBackend_t* out) {
  const char* s = argc > 1 ? argv[1] : getenv("DPS_TEST_BACKEND");
  if (s == NULL || s[0] == '\0' || strcmp(s, "all") == 0) {
    out[0] = dpsBackendNccl;
    out[1] = dpsBackendOnesided;
    return 2;
  }
  if (strcmp(s, "nccl") == 0) {
    out[0] = dpsBackendNccl;
    return 1;
  }
  if (strcmp(s, "onesided") == 0) {
    out[0] = dpsBackendOnesided;
    return 1;
  }
  fprintf(stderr, "unknown backend '%s' (nccl | onesided | all)\n", s);
  return -1;
}

/* The start of a test's main: at least min_gpus GPUs (else SKIP, 77), the
 * backends of argv[1] / $DPS_TEST_BACKEND into backends (*nb of them; 2 when
 * unknown), and no environment override of the backend the test asks for.
 * Returns 0 with *ngpu and *nb set, else the exit status. */
GT_FN int gtStart(const char* name, int min_gpus, int argc, char** argv, dpsBackend_t* backends,
                  int* nb, int* ngpu) {
  *ngpu = fxGpuCount();
  if (*ngpu < min_gpus) {
    if (min_gpus == 1) printf("%s: SKIP: needs a GPU, found none\n", name);
    else printf("%s: SKIP: needs >= %d GPUs, found %d\n", name, min_gpus, *ngpu);
    return 77;
  }
  *nb = gtBackends(argc, argv, backends);
  if (*nb < 0) return 2;
  /* The tests request backends explicitly: an environment override would
   * silently turn every onesided case into nccl. */
  if (getenv("DPSAMPLING_BACKEND") || getenv("TOKENSPEED_DP_SAMPLING_BACKEND"))
    printf("%s: note: unsetting DPSAMPLING_BACKEND / TOKENSPEED_DP_SAMPLING_BACKEND\n", name);
  unsetenv("DPSAMPLING_BACKEND");
  unsetenv("TOKENSPEED_DP_SAMPLING_BACKEND");
  return 0;
}

/* Runs body for every world size of tps[0..ntp) that fits and every
 * backend (at least tps[0] GPUs, else SKIP). A backend whose creation
 * reports dpsUnavailable (all ranks return 77) is reported as skipped, never
 * as passed. */
GT_FN int gtMainTps(int argc, char** argv, const char* name, gtBody body, int timeout_s,
                    const int* tps, int ntp) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart(name, tps[0], argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  int failures = 0, passes = 0;
  for (int t = 0; t < ntp; ++t) {
    const int tp = tps[t];
    if (tp > ngpu) continue;
    for (int b = 0; b < nb; ++b) {
      gtRunArg arg = {body, backends[b]};
      printf("%s: tp=%d backend=%s ...\n", name, tp, dpsBackendName(backends[b]));
      fflush(stdout);
      const int rc = fxRunRanks(tp, gtRankMain, &arg, timeout_s);
      if (rc == 0) {
        ++passes;
        printf("%s: tp=%d backend=%s PASS\n", name, tp, dpsBackendName(backends[b]));
      } else if (rc == 77) {
        printf("%s: tp=%d backend=%s SKIPPED (backend unavailable on this group)\n", name, tp,
               dpsBackendName(backends[b]));
      } else {
        ++failures;
        printf("%s: tp=%d backend=%s FAIL\n", name, tp, dpsBackendName(backends[b]));
      }
      fflush(stdout);
    }
  }
  if (failures) return 1;
  if (passes == 0) return 77;
  return 0;
}

/* gtMainTps over {2, 4, 8}. */
GT_FN int gtMain(int argc, char** argv, const char* name, gtBody body, int timeout_s) {
  static const int tps[3] = {2, 4, 8};
  return gtMainTps(argc, argv, name, body, timeout_s, tps, 3);
}

/* DPS_TEST_SMALL=1 (runs under compute-sanitizer, which is slow): a case
 * whose full logits pad_bs*N*V exceed 1 Mi elements is skipped, and says so. */
GT_FN int gtSkipLarge(const char* test, int64_t pad_bs, int64_t n, int64_t vocab) {
  const char* v = getenv("DPS_TEST_SMALL");
  if (v == NULL || v[0] == '\0' || v[0] == '0' || pad_bs * n * vocab <= (1 << 20)) return 0;
  printf("%s: DPS_TEST_SMALL: skipping %lldx%lldx%lld\n", test, (long long)pad_bs, (long long)n,
         (long long)vocab);
  return 1;
}

/* Runs body(backend) at tp = 1 for each of the backends (one rank: a
 * child process under the fixtures' watchdog), printing "name: tp=1
 * backend=... PASS|SKIPPED|FAIL". Returns the exit status: 1 if any failed,
 * 77 if none passed. */
typedef int (*gtBodyTp1)(dpsBackend_t backend);
typedef struct {
  gtBodyTp1 body;
  dpsBackend_t backend;
} gtTp1Arg;

GT_FN int gtRankMainTp1(int rank, int nranks, void* arg) {
  (void)rank, (void)nranks;
  const gtTp1Arg* a = (const gtTp1Arg*)arg;
  return a->body(a->backend);
}

GT_FN int gtRunTp1(const char* name, gtBodyTp1 body, const dpsBackend_t* backends, int nb,
                   int timeout_s) {
  int failures = 0, passes = 0;
  for (int b = 0; b < nb; ++b) {
    gtTp1Arg arg = {body, backends[b]};
    const int rc = fxRunRanks(1, gtRankMainTp1, &arg, timeout_s);
    printf("%s: tp=1 backend=%s %s\n", name, dpsBackendName(backends[b]),
           rc == 0 ? "PASS" : rc == 77 ? "SKIPPED" : "FAIL");
    fflush(stdout);
    failures += rc != 0 && rc != 77;
    passes += rc == 0;
  }
  if (failures) return 1;
  return passes ? 0 : 77;
}

/* ---- communicators --------------------------------------------------------- */
GT_FN dpsConfig_t gtConfig(int rank, int tp, int max_pad_bs, int n, int64_t vocab,
                            dpsDataType_t dtype, dpsBackend_t backend) {
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  c.tp_size = tp;
  c.rank = rank;
  c.max_pad_bs = max_pad_bs;
  c.num_tokens_per_req = n;
  c.vocab_size = vocab;
  c.logits_dtype = dtype;
  c.backend = backend;
  c.cuda_device = rank;
  return c;
}

/* Checks what dpsCommGetInfo reports against the config. */
GT_FN int gtCheckInfo(dpsComm_t comm, const dpsConfig_t* c) {
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.tp_size == c->tp_size && info.rank == c->rank, "tp/rank %d/%d", info.tp_size,
           info.rank);
  FX_CHECK(info.max_pad_bs == c->max_pad_bs, "max_pad_bs %d", info.max_pad_bs);
  FX_CHECK(info.num_tokens_per_req == c->num_tokens_per_req, "N %d", info.num_tokens_per_req);
  FX_CHECK(info.vocab_size == c->vocab_size, "vocab %lld", (long long)info.vocab_size);
  FX_CHECK(info.requested_backend == c->backend, "requested %s",
           dpsBackendName(info.requested_backend));
  if (c->backend != dpsBackendAuto)
    FX_CHECK(info.backend == c->backend, "backend %s, requested %s", dpsBackendName(info.backend),
             dpsBackendName(c->backend));
  else
    FX_CHECK(info.backend == dpsBackendNccl || info.backend == dpsBackendOnesided, "backend %d",
             (int)info.backend);
  FX_CHECK(info.cuda_device == c->cuda_device, "device %d", info.cuda_device);
  if (c->logits_dtype != dpsDtypeUnset) {
    FX_CHECK(info.logits_dtype == c->logits_dtype, "dtype %s", dpsDataTypeName(info.logits_dtype));
    FX_CHECK(info.initialized == 1, "not initialized with a known dtype");
  }
  FX_CHECK(info.timeout_ms > 0, "timeout_ms %d", info.timeout_ms);
  return 0;
}

/* Creates over the fixture's cached NCCL communicator (cheap: no NCCL init).
 * Returns 0, 77 when the backend is unavailable (the same on every rank), 1. */
GT_FN int gtCreate(dpsComm_t* comm, const dpsConfig_t* c) {
  struct ncclComm* nc = fxNcclComm();
  FX_CHECK(nc != NULL, "fxNcclComm failed");
  *comm = NULL;
  dpsResult_t r = dpsCommInitFromNccl(comm, nc, c);
  if (r == dpsUnavailable) {
    if (c->rank == 0) printf("  backend %s unavailable: %s\n", dpsBackendName(c->backend),
                             dpsGetLastError());
    return 77;
  }
  FX_CHECK(r == dpsSuccess, "dpsCommInitFromNccl(tp=%d max_pad_bs=%d N=%d V=%lld %s %s) -> %s: %s",
           c->tp_size, c->max_pad_bs, c->num_tokens_per_req, (long long)c->vocab_size,
           dpsDataTypeName(c->logits_dtype), dpsBackendName(c->backend), dpsGetErrorString(r),
           dpsGetLastError());
  FX_CHECK(*comm != NULL, "NULL communicator");
  if (gtCheckInfo(*comm, c)) return 1;
  return 0;
}

/* ---- buffers ---------------------------------------------------------------- */
typedef struct {
  int max_pad_bs, n;
  int64_t vocab;
  dpsDataType_t dtype;
  size_t in_offset; /* bytes added to the device input pointer (misalignment tests) */
  void* d_in_alloc;
  void* d_in;
  void* h_in;
  void* h_out;
  int32_t *d_p, *d_ai, *d_al;
  float* d_lp;
  int32_t *h_p, *h_ai, *h_al, *h_po, *h_aio, *h_alo;
  float *h_lp, *h_lpo;
} gtBufs;

GT_FN void gtFreeBufs(gtBufs* b) {
  cudaFree(b->d_in_alloc);
  cudaFree(b->d_p);
  cudaFree(b->d_ai);
  cudaFree(b->d_al);
  cudaFree(b->d_lp);
  free(b->h_in);
  free(b->h_out);
  free(b->h_p);
  free(b->h_ai);
  free(b->h_al);
  free(b->h_po);
  free(b->h_aio);
  free(b->h_alo);
  free(b->h_lp);
  free(b->h_lpo);
  memset(b, 0, sizeof *b);
}

/* Buffers for every call of a communicator of this shape (pad_bs <= max). */
GT_FN int gtAllocBufs(gtBufs* b, int tp, int max_pad_bs, int n, int64_t vocab,
                       dpsDataType_t dtype, size_t in_offset) {
  memset(b, 0, sizeof *b);
  b->max_pad_bs = max_pad_bs;
  b->n = n;
  b->vocab = vocab;
  b->dtype = dtype;
  b->in_offset = in_offset;
  const size_t es = dpsDataTypeSize(dtype);
  const size_t in_bytes = (size_t)max_pad_bs * (size_t)n * (size_t)(vocab / tp) * es;
  const size_t out_bytes = (size_t)(max_pad_bs / tp) * (size_t)n * (size_t)vocab * es;
  const size_t reqs = (size_t)(max_pad_bs / tp), full = (size_t)max_pad_bs;
  GT_CUDA(cudaMalloc(&b->d_in_alloc, in_bytes + in_offset + 16));
  b->d_in = (char*)b->d_in_alloc + in_offset;
  GT_CUDA(cudaMalloc((void**)&b->d_p, reqs * n * 4));
  GT_CUDA(cudaMalloc((void**)&b->d_ai, reqs * n * 4));
  GT_CUDA(cudaMalloc((void**)&b->d_al, reqs * 4));
  GT_CUDA(cudaMalloc((void**)&b->d_lp, reqs * n * 4));
  b->h_in = malloc(in_bytes + 16);
  b->h_out = malloc(out_bytes + 16);
  b->h_p = (int32_t*)malloc(reqs * n * 4);
  b->h_ai = (int32_t*)malloc(reqs * n * 4);
  b->h_al = (int32_t*)malloc(reqs * 4);
  b->h_lp = (float*)malloc(reqs * n * 4);
  b->h_po = (int32_t*)malloc(full * n * 4);
  b->h_aio = (int32_t*)malloc(full * n * 4);
  b->h_alo = (int32_t*)malloc(full * 4);
  b->h_lpo = (float*)malloc(full * n * 4);
  FX_CHECK(b->h_in && b->h_out && b->h_p && b->h_ai && b->h_al && b->h_lp && b->h_po &&
               b->h_aio && b->h_alo && b->h_lpo,
           "host allocation failed");
  return 0;
}

GT_FN size_t gtInBytes(const gtBufs* b, int tp, int pad_bs) {
  return (size_t)pad_bs * (size_t)b->n * (size_t)(b->vocab / tp) * dpsDataTypeSize(b->dtype);
}
GT_FN size_t gtOutBytes(const gtBufs* b, int tp, int pad_bs) {
  return (size_t)(pad_bs / tp) * (size_t)b->n * (size_t)b->vocab * dpsDataTypeSize(b->dtype);
}

/* cudaMemcpy from pageable memory may return before its DMA has landed, and
 * the tests' streams are non-blocking (no implicit ordering with it): wait
 * for the device before any stream reads what was uploaded. */
GT_FN int gtUploadDone(void) {
  GT_CUDA(cudaDeviceSynchronize());
  return 0;
}

/* Uploads the swap input of (pad_bs, step) (synchronous). */
GT_FN int gtUploadSwap(gtBufs* b, int rank, int tp, int pad_bs, int step) {
  fxFillSwapInput(b->h_in, tp, rank, pad_bs, b->n, b->vocab, b->dtype, step);
  GT_CUDA(cudaMemcpy(b->d_in, b->h_in, gtInBytes(b, tp, pad_bs), cudaMemcpyHostToDevice));
  return gtUploadDone();
}

/* Uploads the verify inputs of (pad_bs, step) (synchronous). */
GT_FN int gtUploadVerify(gtBufs* b, int rank, int tp, int pad_bs, int step) {
  const size_t reqs = (size_t)(pad_bs / tp);
  fxFillVerifyInputs(b->h_p, b->h_ai, b->h_al, b->h_lp, tp, rank, pad_bs, b->n, step);
  GT_CUDA(cudaMemcpy(b->d_p, b->h_p, reqs * b->n * 4, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(b->d_ai, b->h_ai, reqs * b->n * 4, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(b->d_al, b->h_al, reqs * 4, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(b->d_lp, b->h_lp, reqs * b->n * 4, cudaMemcpyHostToDevice));
  return gtUploadDone();
}

/* Downloads and checks a swap output (device work must be complete). */
GT_FN int gtCheckSwapOut(gtBufs* b, const void* d_out, int rank, int tp, int pad_bs, int step) {
  GT_CUDA(cudaMemcpy(b->h_out, d_out, gtOutBytes(b, tp, pad_bs), cudaMemcpyDeviceToHost));
  size_t bad = fxCheckSwapOutput(b->h_out, tp, rank, pad_bs, b->n, b->vocab, b->dtype, step);
  FX_CHECK(bad == 0,
           "rank %d: swap tp=%d pad_bs=%d/%d N=%d V=%lld %s step %d: %zu of %zu elements wrong",
           rank, tp, pad_bs, b->max_pad_bs, b->n, (long long)b->vocab, dpsDataTypeName(b->dtype),
           step, bad, gtOutBytes(b, tp, pad_bs) / dpsDataTypeSize(b->dtype));
  return 0;
}

GT_FN int gtCheckVerifyOut(gtBufs* b, const int32_t* p, const int32_t* ai, const int32_t* al,
                            int rank, int pad_bs, int step) {
  GT_CUDA(cudaMemcpy(b->h_po, p, (size_t)pad_bs * b->n * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(b->h_aio, ai, (size_t)pad_bs * b->n * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(b->h_alo, al, (size_t)pad_bs * 4, cudaMemcpyDeviceToHost));
  size_t bad = fxCheckVerifyOutputs(b->h_po, b->h_aio, b->h_alo, pad_bs, b->n, step);
  FX_CHECK(bad == 0, "rank %d: gather_verify_outputs pad_bs=%d/%d N=%d step %d: %zu wrong", rank,
           pad_bs, b->max_pad_bs, b->n, step, bad);
  return 0;
}

GT_FN int gtCheckLogprobsOut(gtBufs* b, const float* lp, int rank, int pad_bs, int step) {
  GT_CUDA(cudaMemcpy(b->h_lpo, lp, (size_t)pad_bs * b->n * 4, cudaMemcpyDeviceToHost));
  size_t bad = fxCheckLogprobs(b->h_lpo, pad_bs, b->n, step);
  FX_CHECK(bad == 0, "rank %d: gather_verify_logprobs pad_bs=%d/%d N=%d step %d: %zu wrong", rank,
           pad_bs, b->max_pad_bs, b->n, step, bad);
  return 0;
}

/* One swap of (pad_bs, step), checked. *out gets the output pointer. */
GT_FN int gtSwapChecked(dpsComm_t comm, gtBufs* b, int rank, int tp, int pad_bs, int step,
                         cudaStream_t s, void** out) {
  if (gtUploadSwap(b, rank, tp, pad_bs, step)) return 1;
  void* o = NULL;
  const int64_t rows = (int64_t)pad_bs * b->n, cols = b->vocab / tp;
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b->d_in, rows, cols, b->dtype, pad_bs, &o, s));
  FX_CHECK(o != NULL, "NULL swap output");
  GT_CUDA(cudaStreamSynchronize(s));
  if (gtCheckSwapOut(b, o, rank, tp, pad_bs, step)) return 1;
  if (out) *out = o;
  return 0;
}

/* One gather_verify_outputs + gather_verify_logprobs of (pad_bs, step), checked. */
GT_FN int gtGatherChecked(dpsComm_t comm, gtBufs* b, int rank, int tp, int pad_bs, int step,
                           cudaStream_t s, int32_t** outs /* [3] or NULL */, float** lp_out) {
  if (gtUploadVerify(b, rank, tp, pad_bs, step)) return 1;
  int32_t *p = NULL, *ai = NULL, *al = NULL;
  float* lp = NULL;
  const int64_t reqs = pad_bs / tp;
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b->d_p, b->d_ai, b->d_al, reqs, b->n, pad_bs, &p, &ai,
                                     &al, s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b->d_lp, reqs, b->n, pad_bs, &lp, s));
  FX_CHECK(p && ai && al && lp, "NULL gather outputs");
  GT_CUDA(cudaStreamSynchronize(s));
  if (gtCheckVerifyOut(b, p, ai, al, rank, pad_bs, step)) return 1;
  if (gtCheckLogprobsOut(b, lp, rank, pad_bs, step)) return 1;
  if (outs) {
    outs[0] = p;
    outs[1] = ai;
    outs[2] = al;
  }
  if (lp_out) *lp_out = lp;
  return 0;
}

/* ---- counting replacement collectives (an "engine's own" NCCL layer) ------- */
typedef struct {
  ncclComm_t nccl;
  int nranks;
  int all_gathers;
  int all_to_alls;
} gtCounter;

GT_FN dpsResult_t gtCountingAllGather(void* ctx, const void* send, void* recv, size_t bytes,
                                       cudaStream_t stream) {
  gtCounter* c = (gtCounter*)ctx;
  c->all_gathers++;
  if (ncclAllGather(send, recv, bytes, ncclInt8, c->nccl, stream) != ncclSuccess)
    return dpsNcclError;
  return dpsSuccess;
}

GT_FN dpsResult_t gtCountingAllToAll(void* ctx, const void* send, void* recv, size_t bytes,
                                      cudaStream_t stream) {
  gtCounter* c = (gtCounter*)ctx;
  c->all_to_alls++;
  if (ncclGroupStart() != ncclSuccess) return dpsNcclError;
  for (int p = 0; p < c->nranks; ++p) {
    if (ncclSend((const char*)send + (size_t)p * bytes, bytes, ncclInt8, p, c->nccl, stream) !=
            ncclSuccess ||
        ncclRecv((char*)recv + (size_t)p * bytes, bytes, ncclInt8, p, c->nccl, stream) !=
            ncclSuccess) {
      ncclGroupEnd();
      return dpsNcclError;
    }
  }
  if (ncclGroupEnd() != ncclSuccess) return dpsNcclError;
  return dpsSuccess;
}

GT_FN int gtInitCounter(gtCounter* c, int tp) {
  memset(c, 0, sizeof *c);
  c->nccl = fxNcclComm();
  FX_CHECK(c->nccl != NULL, "fxNcclComm");
  c->nranks = tp;
  return 0;
}

#endif /* DPS_GPU_COMMON_H_ */
