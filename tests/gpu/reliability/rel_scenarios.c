/* test_gpu_reliability's scenarios (what each checks: the head of
 * tests/gpu/test_gpu_reliability.c); the harness is rel_harness.c. */
#define _GNU_SOURCE
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "reliability.h"

/* ---- lifecycle ------------------------------------------------------------------ */
#define LC_WARMUP 5
#define LC_MAX_GPU_DROP ((size_t)64 << 20)
#define LC_MAX_RSS_GROWTH (32L << 20)

int bodyLifecycle(int rank, int tp, dpsBackend_t backend) {
  const long cycles = envLong("DPS_RELIABILITY_CYCLES", 200);
  /* Always warm up: a short run (the sanitizer stage runs 3 cycles) would
   * otherwise count the one-time allocations as a leak. */
  const long warm = LC_WARMUP;
  FX_CHECK(cycles >= 1, "DPS_RELIABILITY_CYCLES=%ld: need at least 1 measured cycle", cycles);
  const int pad = 16, n = 2;
  const int64_t vocab = (int64_t)tp * 256;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
  FX_CHECK(fxNcclComm() != NULL, "fxNcclComm"); /* NCCL bootstrap once, before measuring */
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsBfloat16, backend);
  size_t free0 = 0, free1 = 0, total = 0;
  long rss0 = -1, rss1 = -1;
  double t_start = 0.0;
  for (long c = 0; c < warm + cycles; ++c) {
    if (c == warm) {
      GT_CUDA(cudaDeviceSynchronize());
      GT_CUDA(cudaMemGetInfo(&free0, &total));
      rss0 = rssBytes();
      t_start = nowS();
    }
    dpsComm_t comm = NULL;
    int rc = gtCreate(&comm, &cfg);
    if (rc == 77 && c == 0) return 77;
    FX_CHECK(rc == 0, "rank %d: creation failed in cycle %ld", rank, c);
    const int step = (int)(c % 100000) + 1;
    if (gtSwapChecked(comm, &b, rank, tp, pad, step, s, NULL) ||
        gtGatherChecked(comm, &b, rank, tp, pad, step, s, NULL, NULL)) {
      fprintf(stderr, "rank %d: lifecycle cycle %ld (%s) wrong\n", rank, c,
              dpsBackendName(backend));
      return 1;
    }
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    if (rank == 0 && (c + 1) % 250 == 0) {
      printf("  %ld/%ld cycles\n", c + 1, warm + cycles);
      fflush(stdout);
    }
  }
  const double secs = nowS() - t_start;
  GT_CUDA(cudaDeviceSynchronize());
  GT_CUDA(cudaMemGetInfo(&free1, &total));
  rss1 = rssBytes();
  FX_CHECK(rss0 > 0 && rss1 > 0, "cannot read /proc/self/statm");
  const double gpu_drop = ((double)free0 - (double)free1) / MIB;
  const double rss_growth = ((double)rss1 - (double)rss0) / MIB;
  printf("  rank %d %s: %ld cycles (%.2f ms each after warm-up); GPU free %.1f -> %.1f MiB "
         "(drop %+.1f MiB); host RSS %.1f -> %.1f MiB (growth %+.1f MiB)\n",
         rank, dpsBackendName(backend), cycles, cycles > 0 ? 1e3 * secs / (double)cycles : 0.0, (double)free0 / MIB,
         (double)free1 / MIB, gpu_drop, (double)rss0 / MIB, (double)rss1 / MIB, rss_growth);
  FX_CHECK(free1 + LC_MAX_GPU_DROP >= free0,
           "rank %d %s: GPU free memory dropped by %.1f MiB over %ld cycles (limit 64 MiB)", rank,
           dpsBackendName(backend), gpu_drop, cycles);
  FX_CHECK(rss1 - rss0 <= LC_MAX_RSS_GROWTH,
           "rank %d %s: host RSS grew by %.1f MiB over %ld cycles (limit 32 MiB)", rank,
           dpsBackendName(backend), rss_growth, cycles);
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- destroy while busy ----------------------------------------------------------- */
static void hostSleep300ms(void* arg) {
  (void)arg;
  sleepMs(300);
}

static int destroyBusyCase(int rank, int tp, dpsBackend_t backend, int sleep_first,
                           cudaStream_t s) {
  const int pad = 16, n = 2;
  const int64_t vocab = (int64_t)tp * 512;
  const dpsDataType_t dt = dpsBfloat16;
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dt, backend);
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dt, 0)) return 1;
  /* a healthy round first */
  if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL) ||
      gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL))
    return 1;
  const int step = 2;
  if (gtUploadSwap(&b, rank, tp, pad, step) || gtUploadVerify(&b, rank, tp, pad, step)) return 1;
  const size_t outB = gtOutBytes(&b, tp, pad), full = (size_t)pad;
  const int64_t reqs = pad / tp;
  void* snap = NULL;
  int32_t* sv = NULL; /* p | ai | al | lp */
  GT_CUDA(cudaMalloc(&snap, outB));
  GT_CUDA(cudaMalloc((void**)&sv, (full * n * 3 + full) * 4));
  GT_CUDA(cudaMemset(snap, 0xff, outB));
  GT_CUDA(cudaMemset(sv, 0xff, (full * n * 3 + full) * 4));
  GT_CUDA(cudaDeviceSynchronize());
  fxBarrier();

  const double t0 = nowS();
  void* o = NULL;
  int32_t *p = NULL, *ai = NULL, *al = NULL;
  float* lp = NULL;
  if (sleep_first) GT_CUDA(cudaLaunchHostFunc(s, hostSleep300ms, NULL));
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b.d_in, (int64_t)pad * n, vocab / tp, dt, pad, &o, s));
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, pad, &p, &ai, &al, s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n, pad, &lp, s));
  GT_CUDA(cudaMemcpyAsync(snap, o, outB, cudaMemcpyDeviceToDevice, s));
  GT_CUDA(cudaMemcpyAsync(sv, p, full * n * 4, cudaMemcpyDeviceToDevice, s));
  GT_CUDA(cudaMemcpyAsync(sv + full * n, ai, full * n * 4, cudaMemcpyDeviceToDevice, s));
  GT_CUDA(cudaMemcpyAsync(sv + 2 * full * n, al, full * 4, cudaMemcpyDeviceToDevice, s));
  GT_CUDA(cudaMemcpyAsync(sv + 2 * full * n + full, lp, full * n * 4, cudaMemcpyDeviceToDevice,
                          s));
  if (!sleep_first) {
    /* the copies read our outputs: the caller's work, done before the close */
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaLaunchHostFunc(s, hostSleep300ms, NULL));
  }
  const double t_enq = nowS() - t0;
  dpsResult_t r = dpsCommClose(comm); /* at once: the stream holds >= 300 ms of work */
  const cudaError_t q = cudaStreamQuery(s);
  const double t_close = nowS() - t0;
  FX_CHECK(r == dpsSuccess, "rank %d %s: dpsCommClose on a busy stream -> %s: %s", rank,
           dpsBackendName(backend), dpsGetErrorString(r), dpsGetLastError());
  if (sleep_first) {
    FX_CHECK(t_close >= 0.25, "rank %d %s: dpsCommClose returned %.3f s after the 300 ms sleep "
             "was queued before its operations: it did not wait for its own work",
             rank, dpsBackendName(backend), t_close);
  } else {
    FX_CHECK(t_close < 0.25 && q == cudaErrorNotReady,
             "rank %d %s: dpsCommClose waited %.3f s (stream %s) for work queued after its "
             "operations: it must wait for its own work only",
             rank, dpsBackendName(backend), t_close, cudaGetErrorString(q));
  }
  (void)cudaGetLastError();
  if (rank == 0)
    printf("  %s sleep %s the ops: enqueue %.1f ms, close returned after %.1f ms\n",
           dpsBackendName(backend), sleep_first ? "before" : "after", 1e3 * t_enq,
           1e3 * t_close);
  GT_CUDA(cudaStreamSynchronize(s));
  /* the work that was queued at close time completed correctly */
  if (gtCheckSwapOut(&b, snap, rank, tp, pad, step) ||
      gtCheckVerifyOut(&b, sv, sv + full * n, sv + 2 * full * n, rank, pad, step) ||
      gtCheckLogprobsOut(&b, (const float*)(sv + 2 * full * n + full), rank, pad, step)) {
    fprintf(stderr, "rank %d %s: results of the work queued before close are wrong\n", rank,
            dpsBackendName(backend));
    return 1;
  }
  FX_CHECK_OK(dpsCommRelease(comm));
  int left = -1;
  FX_CHECK(dpsReleasePending(&left) == dpsSuccess && left == 0, "rank %d: %d still pending",
           rank, left);
  cudaFree(snap);
  cudaFree(sv);
  gtFreeBufs(&b);
  fxBarrier();
  return 0;
}

int bodyDestroyBusy(int rank, int tp, dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int sleep_first = 1; sleep_first >= 0; --sleep_first) {
    int rc = destroyBusyCase(rank, tp, backend, sleep_first, s);
    if (rc) return rc;
  }
  /* a fresh communicator still works after the busy destroys */
  dpsConfig_t cfg = gtConfig(rank, tp, 8, 1, (int64_t)tp * 64, dpsFloat32, backend);
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, 8, 1, (int64_t)tp * 64, dpsFloat32, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, 8, 3, s, NULL) ||
      gtGatherChecked(comm, &b, rank, tp, 8, 3, s, NULL, NULL))
    return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- slow peer ---------------------------------------------------------------------- */
int bodySlow(int rank, int tp, dpsBackend_t backend) {
  const int pad = 16, n = 2, slow = 1, calls = 3;
  const int64_t vocab = (int64_t)tp * 512;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsBfloat16, backend);
  cfg.timeout_ms = 5000;
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL) ||
      gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL))
    return 1;
  fxBarrier();
  for (int i = 0; i < calls; ++i) {
    const int step = 10 + i;
    if (rank == slow) sleepMs(2000);
    const double t0 = nowS();
    if (gtSwapChecked(comm, &b, rank, tp, pad, step, s, NULL)) {
      fprintf(stderr, "rank %d %s: swap %d with a 2 s late peer wrong\n", rank,
              dpsBackendName(backend), i);
      return 1;
    }
    const double dt = nowS() - t0;
    if (gtGatherChecked(comm, &b, rank, tp, pad, step, s, NULL, NULL)) {
      fprintf(stderr, "rank %d %s: gather %d after a 2 s late peer wrong\n", rank,
              dpsBackendName(backend), i);
      return 1;
    }
    dpsResult_t ae = dpsSuccess;
    FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
    FX_CHECK(ae == dpsSuccess, "rank %d %s: async error %s with a peer 2 s late (timeout 5 s): %s",
             rank, dpsBackendName(backend), dpsGetErrorString(ae), dpsGetLastError());
    if (rank == 0) {
      printf("  %s call %d: rank 0's swap waited %.3f s for rank %d\n", dpsBackendName(backend), i,
             dt, slow);
      FX_CHECK(dt >= 1.0, "rank 0's swap took only %.3f s: the slow peer did not hold it", dt);
    }
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- soak: graph replays, every one checked ------------------------------------------- */
#define SK_SETS 8
#define SK_CHANGE_EVERY 100

/* Counts the elements of size es that differ. */
static size_t countDiff(const unsigned char* a, const unsigned char* b, size_t count, size_t es) {
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i)
    if (memcmp(a + i * es, b + i * es, es) != 0) ++bad;
  return bad;
}

int bodySoak(int rank, int tp, dpsBackend_t backend) {
  const long replays = envLong("DPS_SOAK_REPLAYS", 2000);
  const int pad = 16, n = 2;
  const int64_t vocab = 1024;
  const dpsDataType_t dt = dpsBfloat16;
  const size_t es = dpsDataTypeSize(dt);
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dt, backend);
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dt, 0)) return 1;
  const int64_t reqs = pad / tp, rows = (int64_t)pad * n, cols = vocab / tp;
  const size_t inB = gtInBytes(&b, tp, pad), outB = gtOutBytes(&b, tp, pad);
  const size_t full = (size_t)pad, vinN = (size_t)reqs * n;
  /* host image layout (pinned result and expected): swap | p | ai | al | lp */
  const size_t offP = outB, offAi = offP + full * n * 4, offAl = offAi + full * n * 4,
               offLp = offAl + full * 4, imgB = offLp + full * n * 4;

  /* the input sets on the device and their expected images on the host */
  void* din[SK_SETS];
  int32_t* dv[SK_SETS]; /* p | ai | al | lp, each reqs*n (al: reqs) */
  unsigned char* expect[SK_SETS];
  for (int k = 0; k < SK_SETS; ++k) {
    const int step = 5000 + k;
    GT_CUDA(cudaMalloc(&din[k], inB));
    GT_CUDA(cudaMalloc((void**)&dv[k], (vinN * 3 + (size_t)reqs) * 4));
    fxFillSwapInput(b.h_in, tp, rank, pad, n, vocab, dt, step);
    GT_CUDA(cudaMemcpy(din[k], b.h_in, inB, cudaMemcpyHostToDevice));
    fxFillVerifyInputs(b.h_p, b.h_ai, b.h_al, b.h_lp, tp, rank, pad, n, step);
    GT_CUDA(cudaMemcpy(dv[k], b.h_p, vinN * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + vinN, b.h_ai, vinN * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + 2 * vinN, b.h_al, (size_t)reqs * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + 2 * vinN + reqs, b.h_lp, vinN * 4, cudaMemcpyHostToDevice));
    expect[k] = (unsigned char*)malloc(imgB);
    FX_CHECK(expect[k] != NULL, "host allocation");
    const int64_t orows = reqs * n, row0 = (int64_t)rank * orows;
    for (int64_t r = 0; r < orows; ++r)
      for (int64_t c = 0; c < vocab; ++c)
        fxStore(expect[k], (size_t)(r * vocab + c), fxLogitValue(row0 + r, c, step, dt), dt);
    fxFillVerifyInputs((int32_t*)(expect[k] + offP), (int32_t*)(expect[k] + offAi),
                       (int32_t*)(expect[k] + offAl), (float*)(expect[k] + offLp), 1, 0, pad, n,
                       step); /* tp=1, rank 0: the whole gathered [pad_bs, n] */
  }
  if (gtUploadDone()) return 1;
  unsigned char* pinned = NULL;
  GT_CUDA(cudaMallocHost((void**)&pinned, imgB));

  /* warm-up, eager */
  if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL) ||
      gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL))
    return 1;
  fxBarrier();
  void* o = NULL;
  int32_t *p = NULL, *ai = NULL, *al = NULL;
  float* lp = NULL;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, pad, &o, s));
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, pad, &p, &ai, &al, s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n, pad, &lp, s));
  GT_CUDA(cudaMemcpyAsync(pinned, o, outB, cudaMemcpyDeviceToHost, s));
  GT_CUDA(cudaMemcpyAsync(pinned + offP, p, full * n * 4, cudaMemcpyDeviceToHost, s));
  GT_CUDA(cudaMemcpyAsync(pinned + offAi, ai, full * n * 4, cudaMemcpyDeviceToHost, s));
  GT_CUDA(cudaMemcpyAsync(pinned + offAl, al, full * 4, cudaMemcpyDeviceToHost, s));
  GT_CUDA(cudaMemcpyAsync(pinned + offLp, lp, full * n * 4, cudaMemcpyDeviceToHost, s));
  GT_CUDA(cudaStreamEndCapture(s, &graph));
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  fxBarrier();

  long bad_replays = 0;
  size_t bad_values = 0;
  int set = -1;
  const double t0 = nowS();
  for (long r = 0; r < replays; ++r) {
    if (r % SK_CHANGE_EVERY == 0) {
      /* stream-ordered before the next replay; every rank switches at the
       * same replay, after its previous replay completed */
      set = (int)((r / SK_CHANGE_EVERY) % SK_SETS);
      int32_t* v = dv[set];
      GT_CUDA(cudaMemcpyAsync(b.d_in, din[set], inB, cudaMemcpyDeviceToDevice, s));
      GT_CUDA(cudaMemcpyAsync(b.d_p, v, vinN * 4, cudaMemcpyDeviceToDevice, s));
      GT_CUDA(cudaMemcpyAsync(b.d_ai, v + vinN, vinN * 4, cudaMemcpyDeviceToDevice, s));
      GT_CUDA(cudaMemcpyAsync(b.d_al, v + 2 * vinN, (size_t)reqs * 4, cudaMemcpyDeviceToDevice,
                              s));
      GT_CUDA(cudaMemcpyAsync(b.d_lp, v + 2 * vinN + reqs, vinN * 4, cudaMemcpyDeviceToDevice, s));
    }
    memset(pinned, 0xa5, imgB); /* nothing in flight: the previous replay was synchronized */
    GT_CUDA(cudaGraphLaunch(exec, s));
    GT_CUDA(cudaStreamSynchronize(s));
    const unsigned char* want = expect[set];
    if (memcmp(pinned, want, imgB) != 0) {
      const size_t bv = countDiff(pinned, want, outB / es, es) +
                        countDiff(pinned + offP, want + offP, (imgB - offP) / 4, 4);
      if (bad_replays < 3) {
        const int step = 5000 + set;
        fprintf(stderr, "rank %d %s: soak replay %ld (input set %d) has %zu wrong values:\n", rank,
                dpsBackendName(backend), r, set, bv);
        (void)fxCheckSwapOutput(pinned, tp, rank, pad, n, vocab, dt, step);
        (void)fxCheckVerifyOutputs((const int32_t*)(pinned + offP),
                                   (const int32_t*)(pinned + offAi),
                                   (const int32_t*)(pinned + offAl), pad, n, step);
        (void)fxCheckLogprobs((const float*)(pinned + offLp), pad, n, step);
      }
      ++bad_replays;
      bad_values += bv;
    }
  }
  const double secs = nowS() - t0;
  dpsResult_t ae = dpsSuccess;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
  FX_CHECK(ae == dpsSuccess, "rank %d %s: async error %s: %s", rank, dpsBackendName(backend),
           dpsGetErrorString(ae), dpsGetLastError());
  printf("  rank %d %s: %ld replays in %.2f s (%.0f replays/s, each checked), %ld wrong replays, "
         "%zu wrong values\n",
         rank, dpsBackendName(backend), replays, secs, secs > 0 ? (double)replays / secs : 0.0,
         bad_replays, bad_values);
  FX_CHECK(bad_replays == 0, "rank %d %s: %ld of %ld replays wrong (%zu values)", rank,
           dpsBackendName(backend), bad_replays, replays, bad_values);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  for (int k = 0; k < SK_SETS; ++k) {
    cudaFree(din[k]);
    cudaFree(dv[k]);
    free(expect[k]);
  }
  cudaFreeHost(pinned);
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- kill: a peer dies by SIGKILL ----------------------------------------------------------
 * Runs under its own launcher (runKill, rel_harness.c): see reliability.h. */
#define KC_KILL_AT 5
#define KC_TIMEOUT_MS 1000

int killRank(int rank) {
  kcShared* sh = g_kc;
  const int tp = KC_RANKS, pad = 16, n = 2;
  const int64_t vocab = (int64_t)tp * 128;
  const dpsDataType_t dt = dpsBfloat16;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  /* bootstrap: the library creates (and on destroy after a timeout aborts)
   * its own NCCL communicator */
  if (rank == 0) {
    dpsResult_t r = dpsGetUniqueId(&sh->id);
    if (r != dpsSuccess) fprintf(stderr, "rank 0: dpsGetUniqueId: %s\n", dpsGetLastError());
    __atomic_store_n(&sh->id_ok, r == dpsSuccess, __ATOMIC_RELEASE);
  }
  if (kcBarrier(rank)) return 1;
  FX_CHECK(__atomic_load_n(&sh->id_ok, __ATOMIC_ACQUIRE), "no unique id");
  dpsUniqueId id;
  memcpy(&id, &sh->id, sizeof id);
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dt, dpsBackendOnesided);
  cfg.timeout_ms = KC_TIMEOUT_MS;
  dpsComm_t comm = NULL;
  dpsResult_t r = dpsCommInitRank(&comm, &id, &cfg);
  if (r == dpsUnavailable) {
    if (rank == 0) printf("  onesided unavailable: %s\n", dpsGetLastError());
    return 77;
  }
  FX_CHECK(r == dpsSuccess, "rank %d: dpsCommInitRank -> %s: %s", rank, dpsGetErrorString(r),
           dpsGetLastError());
  {
    dpsCommInfo_t info;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.timeout_ms == KC_TIMEOUT_MS, "effective timeout %d ms, configured %d",
             info.timeout_ms, KC_TIMEOUT_MS);
  }
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dt, 0)) return 1;
  for (int it = 0; it < KC_KILL_AT; ++it) {
    if (gtSwapChecked(comm, &b, rank, tp, pad, it + 1, s, NULL) ||
        gtGatherChecked(comm, &b, rank, tp, pad, it + 1, s, NULL, NULL)) {
      fprintf(stderr, "rank %d: kill: healthy iteration %d wrong\n", rank, it);
      return 1;
    }
  }
  if (gtUploadSwap(&b, rank, tp, pad, KC_KILL_AT + 1)) return 1;
  if (kcBarrier(rank)) return 1;
  if (rank == 1) {
    printf("  rank 1: iteration %d: raising SIGKILL\n", KC_KILL_AT);
    fflush(NULL);
    raise(SIGKILL);
    return 1; /* not reached */
  }
  /* rank 0: no more barriers from here on (the peer is gone) */
  const double t0 = nowS();
  void* o = NULL;
  r = dpsSwapBatchVocab(comm, b.d_in, (int64_t)pad * n, vocab / tp, dt, pad, &o, s);
  FX_CHECK(r == dpsSuccess || r == dpsTimeout, "swap after the kill -> %s: %s",
           dpsGetErrorString(r), dpsGetLastError());
  dpsResult_t ae = r;
  if (r == dpsSuccess) {
    GT_CUDA(cudaStreamSynchronize(s));
    FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
  }
  const double dt_s = nowS() - t0;
  const double limit = 2.0 * KC_TIMEOUT_MS / 1000.0 + 1.0;
  FX_CHECK(ae == dpsTimeout, "rank 0: swap after rank 1 died: %s after %.3f s (want dpsTimeout)",
           dpsGetErrorString(ae), dt_s);
  FX_CHECK(strstr(dpsGetLastError(), "rank 1") != NULL, "timeout message \"%s\" lacks \"rank 1\"",
           dpsGetLastError());
  FX_CHECK(dt_s <= limit, "rank 0: dpsTimeout after %.3f s, limit %.1f s", dt_s, limit);
  FX_CHECK(dt_s >= 0.5 * KC_TIMEOUT_MS / 1000.0,
           "rank 0: dpsTimeout after only %.3f s with timeout %d ms", dt_s, KC_TIMEOUT_MS);
  printf("  rank 0: dpsTimeout %.3f s after rank 1 died (limit %.1f s): %s\n", dt_s, limit,
         dpsGetLastError());
  /* sticky: every later call fails at once, naming the peer */
  {
    int32_t *p = NULL, *ai = NULL, *al = NULL;
    float* lp = NULL;
    FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, pad / tp, n, pad, &p, &ai,
                                        &al, s),
                 dpsTimeout, "rank 1");
    FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, pad / tp, n, pad, &lp, s), dpsTimeout,
                 "rank 1");
    FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, (int64_t)pad * n, vocab / tp, dt, pad, &o, s),
                 dpsTimeout, "rank 1");
  }
  const double td = nowS();
  FX_CHECK_OK(dpsCommDestroy(comm));
  printf("  rank 0: dpsCommDestroy after the timeout took %.3f s\n", nowS() - td);
  /* the device is still usable */
  void* d = NULL;
  GT_CUDA(cudaMalloc(&d, (size_t)1 << 20));
  GT_CUDA(cudaMemsetAsync(d, 0x5a, (size_t)1 << 20, s));
  GT_CUDA(cudaStreamSynchronize(s));
  unsigned char h[16];
  GT_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  FX_CHECK(h[0] == 0x5a && h[15] == 0x5a, "device unusable after the timeout");
  GT_CUDA(cudaFree(d));
  GT_CUDA(cudaGetLastError());
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- asymmetric creation ------------------------------------------------------------------- */
/* Rank 1 alone has an invalid DPSAMPLING_TIMEOUT_MS: creation must fail on
 * every rank, promptly (the local failure travels in the agreement exchange),
 * rank 1 naming the variable and the others naming rank 1. */
int bodyAsymCreate(int rank, int tp, dpsBackend_t backend) {
  const int pad = 2 * tp, n = 1;
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, (int64_t)tp * 64, dpsBfloat16, backend);
  if (rank == 1) setenv("DPSAMPLING_TIMEOUT_MS", "soon", 1);
  dpsUniqueId id;
  if (fxShareUniqueId(&id)) return 1;
  dpsComm_t comm = (dpsComm_t)(void*)&id; /* sentinel: must stay untouched */
  const double t0 = nowS();
  const dpsResult_t r = dpsCommInitRank(&comm, &id, &cfg);
  const double dt = nowS() - t0;
  unsetenv("DPSAMPLING_TIMEOUT_MS");
  FX_CHECK(r != dpsSuccess, "rank %d: creation succeeded although rank 1 failed its checks", rank);
  FX_CHECK(comm == (dpsComm_t)(void*)&id, "rank %d: comm written on error", rank);
  if (rank == 1)
    FX_CHECK(r == dpsInvalidArgument && strstr(dpsGetLastError(), "DPSAMPLING_TIMEOUT_MS"),
             "rank 1: %s: %s", dpsGetErrorString(r), dpsGetLastError());
  else
    FX_CHECK(r == dpsSystemError && strstr(dpsGetLastError(), "failed on another rank, rank 1"),
             "rank %d: %s: %s", rank, dpsGetErrorString(r), dpsGetLastError());
  FX_CHECK(dt < 30.0, "rank %d: failing creation took %.1f s", rank, dt);
  fxBarrier();
  return 0;
}

/* ---- one rank out of memory at prepare ---------------------------------------------------- */
#define AP_SWAP_BYTES ((int64_t)1 << 30) /* each rank's swap output: 1 GiB */
#define AP_HEADROOM ((size_t)512 << 20)  /* rank 1 leaves this much free */

int bodyAsymPrepare(int rank, int tp, dpsBackend_t backend) {
  const int pad = 2 * tp, n = 1;
  /* swap output [pad/tp*N, V] bf16 = 2 * V * 2 bytes = 1 GiB */
  const int64_t vocab = AP_SWAP_BYTES / 4 / tp * tp;
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsDtypeUnset, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  void* hog = NULL;
  if (rank == 1) { /* leave too little for the swap window here only */
    size_t freeB = 0, total = 0;
    GT_CUDA(cudaMemGetInfo(&freeB, &total));
    FX_CHECK(freeB > AP_HEADROOM, "rank 1: only %zu bytes free", freeB);
    GT_CUDA(cudaMalloc(&hog, freeB - AP_HEADROOM));
  }
  fxBarrier();
  const double t0 = nowS();
  const dpsResult_t r = dpsCommPrepare(comm, dpsBfloat16);
  const double dt = nowS() - t0;
  if (rank == 1) {
    FX_CHECK(r != dpsSuccess, "rank 1: prepare succeeded with %zu MiB free", AP_HEADROOM >> 20);
  } else if (backend == dpsBackendOnesided) {
    /* the registration is collective: the healthy rank must fail too, not hang */
    FX_CHECK(r == dpsSystemError && strstr(dpsGetLastError(), "failed on another rank"),
             "rank %d: %s: %s", rank, dpsGetErrorString(r), dpsGetLastError());
  } /* nccl: nothing collective at prepare; the healthy rank may succeed */
  FX_CHECK(dt < 30.0, "rank %d: prepare took %.1f s", rank, dt);
  if (hog) GT_CUDA(cudaFree(hog));
  fxBarrier();
  if (r != dpsSuccess) {
    /* The memory is back: the failed prepare leaves the dtype unset and can
     * be retried (onesided: every rank failed, so every rank retries). */
    dpsCommInfo_t info;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == dpsDtypeUnset, "rank %d: dtype %s after a failed prepare", rank,
             dpsDataTypeName(info.logits_dtype));
    FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}
