/* dps-host-cost: the host time of one eager call of every C operation at
 * tp = 1, next to the single CUDA calls it is made of, so that the host time
 * of a Python call (bench/host_time.py) can be split into the kernel launch,
 * the library's own work and the binding's (docs/performance.md, "Host time").
 *
 *   build/tools/dps-host-cost [calls]        (one GPU; default 5000 calls)
 *
 * Every row: the median over 7 repetitions of (wall time of `calls`
 * back-to-back calls) / calls, min and max after it, with no synchronization
 * inside the timed loop (one after each repetition). A loop whose device
 * work per call outlasts its host time measures the device instead: the
 * `device` column gives the device time per call of the same loop (CUDA
 * events) and the row says `device-bound` when it is within 10 % of the
 * host time. `idle`: the median host time of one call made with the
 * stream drained (a synchronization before each, outside the timing), the
 * host's own cost whatever the device's pace. Shapes: pad_bs 8, N 4, V 256,
 * bf16 (small, so that the device keeps up). Streams: one created non-blocking stream, and the legacy
 * default stream (NULL: torch's default). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dpsampling.h"

__global__ void emptyKernel(void) {}

static double nowUs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmpDouble(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

#define REPS 7
static int g_calls = 5000;
static int g_failed = 0;
#define IDLE_CALLS 2000
static double g_idle[IDLE_CALLS];

/* Times the statement after `stream` (OP(call): a library call whose
 * failure stops the row) on `stream`. */
#define TIME_ROW(name, backend, sname, stream, ...)                                        \
  do {                                                                                     \
    int ok = 1;                                                                            \
    for (int w_ = 0; w_ < 200 && ok; ++w_) { __VA_ARGS__; }                                      \
    cudaStreamSynchronize(stream);                                                         \
    double host[REPS], dev_us = 0.0;                                                       \
    cudaEvent_t e0, e1;                                                                    \
    cudaEventCreate(&e0);                                                                  \
    cudaEventCreate(&e1);                                                                  \
    for (int r_ = 0; r_ < REPS && ok; ++r_) {                                              \
      cudaEventRecord(e0, stream);                                                         \
      const double t0 = nowUs();                                                           \
      for (int i_ = 0; i_ < g_calls && ok; ++i_) { __VA_ARGS__; }                                 \
      host[r_] = (nowUs() - t0) / g_calls;                                                 \
      cudaEventRecord(e1, stream);                                                         \
      cudaEventSynchronize(e1);                                                            \
      float ms = 0.f;                                                                      \
      cudaEventElapsedTime(&ms, e0, e1);                                                   \
      if (r_ == REPS / 2) dev_us = 1000.0 * ms / g_calls;                                  \
    }                                                                                      \
    cudaEventDestroy(e0);                                                                  \
    cudaEventDestroy(e1);                                                                  \
    const int idle_n_ = g_calls < IDLE_CALLS ? g_calls : IDLE_CALLS;                       \
    for (int i_ = 0; i_ < idle_n_ && ok; ++i_) {                                           \
      cudaStreamSynchronize(stream);                                                       \
      const double t0 = nowUs();                                                           \
      __VA_ARGS__;                                                                         \
      g_idle[i_] = nowUs() - t0;                                                           \
    }                                                                                      \
    cudaStreamSynchronize(stream);                                                         \
    if (!ok) {                                                                             \
      printf("%-36s %-9s %-7s failed: %s\n", name, backend, sname, dpsGetLastError());     \
      g_failed = 1;                                                                        \
      break;                                                                               \
    }                                                                                      \
    qsort(host, REPS, sizeof host[0], cmpDouble);                                          \
    qsort(g_idle, idle_n_, sizeof g_idle[0], cmpDouble);                                   \
    printf("%-36s %-9s %-7s %8.3f %8.3f %8.3f %8.3f %8.3f%s\n", name, backend, sname,      \
           host[REPS / 2], host[0], host[REPS - 1], dev_us, g_idle[idle_n_ / 2],           \
           dev_us >= 0.9 * host[REPS / 2] ? "  device-bound" : "");                        \
  } while (0)

#define OP(...) ok = (__VA_ARGS__) == dpsSuccess

int main(int argc, char** argv) {
  if (argc > 1) g_calls = atoi(argv[1]);
  if (g_calls < 1) {
    fprintf(stderr, "usage: %s [calls >= 1]\n", argv[0]);
    return 2;
  }
  if (cudaSetDevice(0) != cudaSuccess) {
    fprintf(stderr, "dps-host-cost: no CUDA device\n");
    return 2;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  char* buf = NULL;
  cudaMalloc((void**)&buf, 8 << 20);
  cudaMemset(buf, 0, 8 << 20); /* logits 0, candidates 0 */
  void* logits = buf;
  float* lps = (float*)(buf + (1 << 20));
  int32_t* cand = (int32_t*)(buf + (2 << 20));
  int64_t* idx = (int64_t*)(buf + (3 << 20));

  printf("# dps-host-cost: %d calls x %d repetitions; us per call\n", g_calls, REPS);
  printf("%-36s %-9s %-7s %8s %8s %8s %8s %8s\n", "what", "backend", "stream", "host", "min",
         "max", "device", "idle");
  int dev = 0;
  enum cudaStreamCaptureStatus cs;
  unsigned long long cid = 0;
  TIME_ROW("cudaGetDevice", "-", "-", s, cudaGetDevice(&dev));
  TIME_ROW("cudaStreamGetCaptureInfo", "-", "stream", s, cudaStreamGetCaptureInfo(s, &cs, &cid));
  TIME_ROW("cudaStreamGetDevice", "-", "stream", s, cudaStreamGetDevice(s, &dev));
  TIME_ROW("cudaEventRecord", "-", "stream", s, cudaEventRecord(ev, s));
  TIME_ROW("empty kernel launch", "-", "stream", s, emptyKernel<<<1, 32, 0, s>>>());
  TIME_ROW("empty kernel launch", "-", "null", (cudaStream_t)0, emptyKernel<<<1, 32, 0, 0>>>());
  /* the library's way: cudaLaunchKernelEx (no attribute) */
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(1);
  lc.blockDim = dim3(32);
  lc.stream = s;
  TIME_ROW("empty kernel cudaLaunchKernelEx", "-", "stream", s, cudaLaunchKernelEx(&lc, emptyKernel));
  lc.stream = 0;
  TIME_ROW("empty kernel cudaLaunchKernelEx", "-", "null", (cudaStream_t)0,
           cudaLaunchKernelEx(&lc, emptyKernel));
  /* with programmatic dependent launch, as the onesided kernels go */
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = pdl;
  lc.numAttrs = 1;
  lc.stream = s;
  TIME_ROW("empty kernel cudaLaunchKernelEx PDL", "-", "stream", s,
           cudaLaunchKernelEx(&lc, emptyKernel));
  lc.stream = 0;
  TIME_ROW("empty kernel cudaLaunchKernelEx PDL", "-", "null", (cudaStream_t)0,
           cudaLaunchKernelEx(&lc, emptyKernel));
  TIME_ROW("cudaMemcpyAsync 4 KB", "-", "stream", s,
           cudaMemcpyAsync(buf, buf + (4 << 20), 4096, cudaMemcpyDeviceToDevice, s));

  const dpsBackend_t backends[2] = {dpsBackendNccl, dpsBackendOnesided};
  for (int b = 0; b < 2; ++b) {
    const char* bn = dpsBackendName(backends[b]);
    dpsUniqueId id;
    dpsComm_t c = NULL;
    dpsConfig_t cfg = DPS_CONFIG_INITIALIZER;
    cfg.tp_size = 1;
    cfg.rank = 0;
    cfg.max_pad_bs = 8;
    cfg.num_tokens_per_req = 4;
    cfg.vocab_size = 256;
    cfg.logits_dtype = dpsBfloat16;
    cfg.backend = backends[b];
    cfg.cuda_device = 0;
    if (dpsGetUniqueId(&id) != dpsSuccess || dpsCommInitRank(&c, &id, &cfg) != dpsSuccess) {
      printf("%-36s %-9s unavailable: %s\n", "communicator", bn, dpsGetLastError());
      continue;
    }
    dpsSampleParams_t sp = DPS_SAMPLE_PARAMS_INITIALIZER;
    sp.temperature = 0.7f;
    sp.top_k = 50;
    dpsSampleParams_t greedy = DPS_SAMPLE_PARAMS_INITIALIZER;
    greedy.temperature = 0.f;
    for (int si = 0; si < 2; ++si) {
      cudaStream_t st = si == 0 ? s : (cudaStream_t)0;
      const char* sn = si == 0 ? "stream" : "null";
      void* out;
      int32_t *po, *aio, *alo;
      float* lo;
      TIME_ROW("swap_batch_vocab", bn, sn, st,
               OP(dpsSwapBatchVocab(c, logits, 32, 256, dpsBfloat16, 8, &out, st)));
      TIME_ROW("gather_verify_outputs", bn, sn, st,
               OP(dpsGatherVerifyOutputs(c, cand, cand, cand, 8, 4, 8, &po, &aio, &alo, st)));
      TIME_ROW("gather_verify_logprobs", bn, sn, st,
               OP(dpsGatherVerifyLogprobs(c, lps, 8, 4, 8, &lo, st)));
      TIME_ROW("argmax", bn, sn, st,
               OP(dpsArgmax(c, logits, 8, 256, dpsBfloat16, 256, NULL, idx, NULL, st)));
      TIME_ROW("topk k=8", bn, sn, st,
               OP(dpsTopK(c, logits, 8, 256, dpsBfloat16, 8, 256, NULL, idx, st)));
      TIME_ROW("sample T=0.7 top-k 50", bn, sn, st,
               OP(dpsSample(c, logits, 8, 256, dpsBfloat16, 256, &sp, idx, NULL, st)));
      TIME_ROW("verify_chain greedy", bn, sn, st,
               OP(dpsVerifyChain(c, logits, 32, 256, dpsBfloat16, 256, 8, cand, &greedy, NULL,
                                 0.f, &po, &aio, &alo, NULL, st)));
    }
    dpsCommDestroy(c);
  }
  cudaFree(buf);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return g_failed;
}
