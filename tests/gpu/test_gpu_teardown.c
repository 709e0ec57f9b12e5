/* Teardown inside a real engine (one GPU is enough; tp=2 cases need two):
 *  - destroying a communicator while another stream of the process captures
 *    a CUDA graph in global mode (same thread and another thread) leaves
 *    that capture intact;
 *  - closing while one of its own operations is being captured is refused,
 *    changes nothing, and the graph replays correctly afterwards;
 *  - after dpsCommClose operations are refused, the outputs keep their
 *    contents until dpsCommRelease, and a release inside a capture makes no
 *    call that breaks it;
 *  - create/swap/close/release cycles leave device memory flat;
 *  - tp=2 (two GPUs): ranks close at different times with their outputs
 *    still in use; a peer that exits without closing makes the survivor's
 *    close come back within its timeout (onesided).
 * Usage: test_gpu_teardown [nccl|onesided|all] */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"

enum { PAD = 8, N = 2, V = 96, CYCLES = 20 };

static void nap(long us) {
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

static double nowS(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int create(dpsComm_t* c, int tp, int rank, dpsBackend_t backend) {
  dpsUniqueId id;
  FX_CHECK(fxShareUniqueId(&id) == 0, "sharing the unique id failed");
  dpsConfig_t cfg = gtConfig(rank, tp, PAD, N, V, dpsBfloat16, backend);
  cfg.timeout_ms = 1500;
  dpsResult_t r = dpsCommInitRank(c, &id, &cfg);
  if (r == dpsUnavailable) return 77;
  FX_CHECK(r == dpsSuccess, "dpsCommInitRank: %s", dpsGetLastError());
  return 0;
}

/* A swap of step `step` from a device input; returns the output pointer. */
static int swapStep(dpsComm_t c, int tp, int rank, void* din, int step, cudaStream_t s,
                    void** out) {
  const size_t in_elems = (size_t)PAD * N * (V / tp);
  uint16_t* h = (uint16_t*)malloc(in_elems * 2);
  fxFillSwapInput(h, tp, rank, PAD, N, V, dpsBfloat16, step);
  GT_CUDA(cudaMemcpy(din, h, in_elems * 2, cudaMemcpyHostToDevice));
  free(h);
  FX_CHECK(dpsSwapBatchVocab(c, din, (int64_t)PAD * N, V / tp, dpsBfloat16, PAD, out, s) ==
               dpsSuccess,
           "swap: %s", dpsGetLastError());
  return 0;
}

static int checkSwap(const void* dout, int tp, int rank, int step) {
  const size_t out_elems = (size_t)(PAD / tp) * N * V;
  uint16_t* h = (uint16_t*)malloc(out_elems * 2);
  GT_CUDA(cudaMemcpy(h, dout, out_elems * 2, cudaMemcpyDeviceToHost));
  const size_t bad = fxCheckSwapOutput(h, tp, rank, PAD, N, V, dpsBfloat16, step);
  free(h);
  FX_CHECK(bad == 0, "swap output (step %d): %zu of %zu elements wrong", step, bad, out_elems);
  return 0;
}

/* A global-mode capture of a memset on its own stream, kept open while `fn`
 * runs (on this thread, or on another one), then ended, instantiated and
 * launched: all must succeed. */
typedef struct {
  dpsComm_t comm;
  dpsResult_t got;
  int op; /* 0 destroy, 1 release */
} ForeignArg;

static void* foreignTeardown(void* p) {
  ForeignArg* a = (ForeignArg*)p;
  a->got = a->op == 0 ? dpsCommDestroy(a->comm) : dpsCommRelease(a->comm);
  return NULL;
}

static int underForeignCapture(dpsComm_t comm, int op, int other_thread, void* scratch) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  GT_CUDA(cudaMemsetAsync(scratch, 7, 256, s));
  ForeignArg a = {comm, dpsInternalError, op};
  if (other_thread) {
    pthread_t t;
    FX_CHECK(pthread_create(&t, NULL, foreignTeardown, &a) == 0, "pthread_create");
    pthread_join(t, NULL);
  } else {
    foreignTeardown(&a);
  }
  GT_CUDA(cudaMemsetAsync((char*)scratch + 256, 9, 256, s));
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  FX_CHECK(e == cudaSuccess, "%s during a foreign capture (%s thread) broke it: %s",
           op ? "dpsCommRelease" : "dpsCommDestroy", other_thread ? "another" : "the same",
           cudaGetErrorString(e));
  FX_CHECK(a.got == dpsSuccess, "%s during a foreign capture: %s",
           op ? "dpsCommRelease" : "dpsCommDestroy", dpsGetLastError());
  cudaGraphExec_t ge;
  GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
  GT_CUDA(cudaMemset(scratch, 0, 512));
  GT_CUDA(cudaGraphLaunch(ge, s));
  GT_CUDA(cudaStreamSynchronize(s));
  unsigned char h[512];
  GT_CUDA(cudaMemcpy(h, scratch, sizeof h, cudaMemcpyDeviceToHost));
  FX_CHECK(h[0] == 7 && h[255] == 7 && h[256] == 9 && h[511] == 9,
           "the foreign graph computed %u %u %u %u", h[0], h[255], h[256], h[511]);
  GT_CUDA(cudaGraphExecDestroy(ge));
  GT_CUDA(cudaGraphDestroy(g));
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

static int freeMiB(void) {
  size_t fr = 0, tot = 0;
  (void)cudaDeviceSynchronize();
  (void)cudaMemGetInfo(&fr, &tot);
  return (int)(fr >> 20);
}

/* ---- tp = 1 ------------------------------------------------------------------ */
static int body1(int rank, int tp, void* arg) {
  const dpsBackend_t backend = *(const dpsBackend_t*)arg;
  (void)rank;
  (void)tp;
  void *din = NULL, *scratch = NULL, *out = NULL;
  GT_CUDA(cudaMalloc(&din, (size_t)PAD * N * V * 2));
  GT_CUDA(cudaMalloc(&scratch, 512));
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc;

  /* destroy / release while a foreign capture is underway, both threads */
  for (int other = 0; other < 2; ++other) {
    dpsComm_t c;
    if ((rc = create(&c, 1, 0, backend)) != 0) return rc;
    if (swapStep(c, 1, 0, din, 1, s, &out)) return 1;
    if (underForeignCapture(c, 0, other, scratch)) return 1;
    if ((rc = create(&c, 1, 0, backend)) != 0) return rc;
    if (swapStep(c, 1, 0, din, 2, s, &out)) return 1;
    GT_CUDA(cudaStreamSynchronize(s));
    FX_CHECK(dpsCommClose(c) == dpsSuccess, "close: %s", dpsGetLastError());
    if (underForeignCapture(c, 1, other, scratch)) return 1;
    int left = -1;
    FX_CHECK(dpsReleasePending(&left) == dpsSuccess && left == 0, "release pending: %d left",
             left);
  }
  printf("  foreign captures intact (destroy and release, same and other thread)\n");

  /* close during its own capture: refused, nothing changed, the graph replays */
  {
    dpsComm_t c;
    if ((rc = create(&c, 1, 0, backend)) != 0) return rc;
    if (swapStep(c, 1, 0, din, 3, s, &out)) return 1;
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void* gout = NULL;
    FX_CHECK(dpsSwapBatchVocab(c, din, (int64_t)PAD * N, V, dpsBfloat16, PAD, &gout, s) ==
                 dpsSuccess,
             "captured swap: %s", dpsGetLastError());
    FX_CHECK_ERR(dpsCommClose(c), dpsInvalidUsage, "still capturing");
    FX_CHECK_ERR(dpsCommDestroy(c), dpsInvalidUsage, "still capturing");
    cudaGraph_t g;
    GT_CUDA(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
    for (int step = 4; step < 6; ++step) {
      uint16_t* h = (uint16_t*)malloc((size_t)PAD * N * V * 2);
      fxFillSwapInput(h, 1, 0, PAD, N, V, dpsBfloat16, step);
      GT_CUDA(cudaMemcpy(din, h, (size_t)PAD * N * V * 2, cudaMemcpyHostToDevice));
      free(h);
      GT_CUDA(cudaGraphLaunch(ge, s));
      GT_CUDA(cudaStreamSynchronize(s));
      if (checkSwap(gout, 1, 0, step)) return 1;
    }
    GT_CUDA(cudaGraphExecDestroy(ge));
    GT_CUDA(cudaGraphDestroy(g));
    FX_CHECK(dpsCommDestroy(c) == dpsSuccess, "destroy after the capture: %s", dpsGetLastError());
  }
  printf("  close during its own capture refused; replays correct; destroy after it\n");

  /* closed: operations refused, outputs keep their contents until release */
  {
    dpsComm_t c;
    if ((rc = create(&c, 1, 0, backend)) != 0) return rc;
    if (swapStep(c, 1, 0, din, 6, s, &out)) return 1;
    FX_CHECK(dpsCommClose(c) == dpsSuccess, "close: %s", dpsGetLastError());
    FX_CHECK(dpsCommClose(c) == dpsSuccess, "second close: %s", dpsGetLastError());
    void* o2 = NULL;
    FX_CHECK_ERR(dpsSwapBatchVocab(c, din, (int64_t)PAD * N, V, dpsBfloat16, PAD, &o2, s),
              dpsInvalidUsage, "closed");
    FX_CHECK(o2 == NULL, "a refused swap wrote its output");
    int32_t *p = NULL, *ai = NULL, *al = NULL;
    FX_CHECK_ERR(dpsGatherVerifyOutputs(c, (const int32_t*)din, (const int32_t*)din,
                                     (const int32_t*)din, PAD, N, PAD, &p, &ai, &al, s),
              dpsInvalidUsage, "closed");
    FX_CHECK_ERR(dpsCommPrepare(c, dpsBfloat16), dpsInvalidUsage, "closed");
    dpsCommInfo_t info;
    FX_CHECK(dpsCommGetInfo(c, &info) == dpsSuccess && info.tp_size == 1, "info after close");
    if (checkSwap(out, 1, 0, 6)) return 1;
    FX_CHECK(dpsCommRelease(c) == dpsSuccess, "release: %s", dpsGetLastError());
    int left = -1;
    FX_CHECK(dpsReleasePending(&left) == dpsSuccess && left == 0, "%d left", left);
  }
  printf("  closed: operations refused, outputs intact until release\n");

  /* memory stays flat over create/swap/close/release cycles */
  {
    const int before = freeMiB();
    const double t0 = nowS();
    for (int i = 0; i < CYCLES; ++i) {
      dpsComm_t c;
      if ((rc = create(&c, 1, 0, backend)) != 0) return rc;
      if (swapStep(c, 1, 0, din, 7 + i, s, &out)) return 1;
      FX_CHECK(dpsCommClose(c) == dpsSuccess, "close: %s", dpsGetLastError());
      if (i + 1 == CYCLES && checkSwap(out, 1, 0, 7 + i)) return 1;
      FX_CHECK(dpsCommRelease(c) == dpsSuccess, "release");
    }
    int left = -1;
    FX_CHECK(dpsReleasePending(&left) == dpsSuccess && left == 0, "%d left", left);
    const int after = freeMiB();
    printf("  %d cycles in %.1f s: free device memory %d -> %d MiB\n", CYCLES, nowS() - t0,
           before, after);
    FX_CHECK(before - after <= 64, "device memory dropped by %d MiB over %d cycles",
             before - after, CYCLES);
  }
  GT_CUDA(cudaFree(din));
  GT_CUDA(cudaFree(scratch));
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

/* ---- tp = 2 ------------------------------------------------------------------ */
typedef struct {
  dpsBackend_t backend;
  int peer_exits; /* rank 1 leaves without closing */
} Arg2;

static int body2(int rank, int tp, void* p) {
  const Arg2* a = (const Arg2*)p;
  void *din = NULL, *out = NULL;
  GT_CUDA(cudaMalloc(&din, (size_t)PAD * N * (V / tp) * 2));
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dpsComm_t c;
  int rc = create(&c, tp, rank, a->backend);
  if (rc) return rc;
  if (swapStep(c, tp, rank, din, 11, s, &out)) return 1;
  GT_CUDA(cudaStreamSynchronize(s));
  if (checkSwap(out, tp, rank, 11)) return 1;
  fxBarrier();
  if (a->peer_exits) {
    if (rank == 1) _exit(0); /* gone without closing */
    nap(200 * 1000);
    const double t0 = nowS();
    FX_CHECK(dpsCommClose(c) == dpsSuccess, "close after the peer left: %s", dpsGetLastError());
    const double dt = nowS() - t0;
    dpsResult_t ae = dpsSuccess;
    FX_CHECK(dpsCommGetAsyncError(c, &ae) == dpsSuccess && ae != dpsSuccess,
             "the group should count as failed after the peer left");
    printf("  rank 0: close after the peer exited took %.2f s (timeout 1.5 s)\n", dt);
    FX_CHECK(dt < 5.0, "close took %.2f s", dt);
    if (checkSwap(out, tp, rank, 11)) return 1;
    FX_CHECK(dpsCommRelease(c) == dpsSuccess, "release");
    return 0;
  }
  /* closes at different times, outputs still used after close */
  if (rank == 1) nap(1000 * 1000);
  FX_CHECK(dpsCommClose(c) == dpsSuccess, "close: %s", dpsGetLastError());
  if (rank == 0) nap(2000 * 1000); /* keeps its output for seconds */
  if (checkSwap(out, tp, rank, 11)) return 1;
  FX_CHECK(dpsCommRelease(c) == dpsSuccess, "release");
  int left = -1;
  FX_CHECK(dpsReleasePending(&left) == dpsSuccess && left == 0, "%d left", left);
  return 0;
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_teardown", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  int failures = 0;
  for (int b = 0; b < nb; ++b) {
    printf("test_gpu_teardown: tp=1 backend=%s\n", dpsBackendName(backends[b]));
    fflush(stdout);
    int rc = fxRunRanks(1, body1, &backends[b], 300);
    printf("test_gpu_teardown: tp=1 backend=%s %s\n", dpsBackendName(backends[b]),
           rc == 0 ? "PASS" : rc == 77 ? "SKIPPED" : "FAIL");
    failures += rc != 0 && rc != 77;
    if (ngpu < 2) {
      printf("test_gpu_teardown: tp=2 backend=%s SKIPPED: needs 2 GPUs, found %d\n",
             dpsBackendName(backends[b]), ngpu);
      continue;
    }
    for (int exits = 0; exits < 2; ++exits) {
      if (exits && backends[b] != dpsBackendOnesided) continue; /* nccl has no timeout */
      Arg2 a = {backends[b], exits};
      rc = fxRunRanks(2, body2, &a, 120);
      printf("test_gpu_teardown: tp=2 backend=%s %s %s\n", dpsBackendName(backends[b]),
             exits ? "peer exits before close" : "closes at different times",
             rc == 0 ? "PASS" : rc == 77 ? "SKIPPED" : "FAIL");
      failures += rc != 0 && rc != 77;
    }
  }
  fflush(stdout);
  return failures ? 1 : 0;
}
