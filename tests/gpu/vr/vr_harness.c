/* The harness of test_gpu_virtual_ranks (vr_harness.h). */
#define _POSIX_C_SOURCE 200809L
#include "vr_harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* vr_spin.cu */
cudaError_t vrPreloadKernels(void);
cudaError_t vrLaunchRendezvous(unsigned* count, int* ok, unsigned n, unsigned long long timeout_ns,
                               cudaStream_t stream);

VrOptions g_vr = {.backends = 3, .scenarios = VR_SC_ALL, .timeout_ms = 2000};

void vrReportFail(const VrGroup* g, int rank, const char* call, const char* status,
                  const char* msg) {
  if (rank >= 0)
    fprintf(stderr, "%s rank %d: %s -> %s: %s\n", g->desc, rank, call, status, msg);
  else
    fprintf(stderr, "%s: %s -> %s: %s\n", g->desc, call, status, msg);
}

double vrNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void vrSleepMs(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

const char* vrBackendName(int b) { return b == VR_ONESIDED ? "onesided" : "nccl"; }

/* (SMs - 2) / (2 tp): every rank's blocks, and PDL's early-resident
 * dependants, fit on the one device together. */
int vrCap(int tp) {
  if (g_vr.blocks_override > 0) return g_vr.blocks_override;
  const int c = (g_vr.sms - 2) / (2 * tp);
  return c < 1 ? 1 : c;
}

void vrAbort(VrGroup* g) { dpsVirtualGroupAbort(g->vg); }

int vrBarrier(VrGroup* g) { return dpsVirtualBarrier(g->vg); }

int vrCount(VrGroup* g, int ok) {
  __atomic_add_fetch(ok ? &g->passed : &g->failed, 1, __ATOMIC_RELAXED);
  return ok ? 0 : 1;
}

int vrCheckAsync(VrGroup* g, int rank, const char* what) {
  dpsResult_t a = dpsSuccess;
  VR_OK(g, rank, dpsCommGetAsyncError(g->r[rank].comm, &a));
  if (a == dpsSuccess) return 0;
  fprintf(stderr, "%s rank %d: %s: asynchronous error %s: %s\n", g->desc, rank, what,
          dpsGetErrorString(a), dpsGetLastError());
  return vrCount(g, 0);
}

void vrReportTimes(const VrGroup* g, int rank, const char* what) {
  const double* t = g->r[rank].t;
  fprintf(stderr,
          "%s rank %d: %s: host times (ms since the group's creation): barrier passed %.1f, "
          "enqueued by %.1f, stream waited for until %.1f\n",
          g->desc, rank, what, 1e3 * (t[0] - g->t0), 1e3 * (t[1] - g->t0), 1e3 * (t[2] - g->t0));
}

static size_t vrRound(size_t x) { return (x + 255) / 256 * 256; }

static size_t vrInBytes(const VrGroup* g, int pad_bs) {
  return (size_t)pad_bs * (size_t)g->cfg.n * (size_t)g->v_local * g->esize;
}
size_t vrOutBytes(const VrGroup* g, int pad_bs) {
  return (size_t)(pad_bs / g->tp) * (size_t)g->cfg.n * (size_t)g->vocab * g->esize;
}

int vrReqs(int mr, int c) {
  const int seq[6] = {mr, 1, mr / 2 + 1, 2, mr, 3};
  int v = seq[c % 6];
  return v < 1 ? 1 : v > mr ? mr : v;
}

/* ---- the operations of one rank (its own thread, its own stream) ------------- */
int vrSwap(VrGroup* g, int rank, int set, int pad_bs, void** out) {
  VrRank* r = &g->r[rank];
  VR_OK(g, rank,
        dpsSwapBatchVocab(r->comm, r->in[set], (int64_t)pad_bs * g->cfg.n, g->v_local,
                          g->cfg.dtype, pad_bs, out, r->s));
  return 0;
}

int vrGatherOutputs(VrGroup* g, int rank, int set, int pad_bs, int32_t** po, int32_t** aio,
                    int32_t** alo) {
  VrRank* r = &g->r[rank];
  VR_OK(g, rank,
        dpsGatherVerifyOutputs(r->comm, r->p[set], r->ai[set], r->al[set], pad_bs / g->tp,
                               g->cfg.n, pad_bs, po, aio, alo, r->s));
  return 0;
}

int vrGatherLogprobs(VrGroup* g, int rank, int set, int pad_bs, float** lpo) {
  VrRank* r = &g->r[rank];
  VR_OK(g, rank,
        dpsGatherVerifyLogprobs(r->comm, r->lp[set], pad_bs / g->tp, g->cfg.n, pad_bs, lpo,
                                r->s));
  return 0;
}

int vrCall(VrGroup* g, int rank, int set, int pad_bs, void** out, int32_t** po, int32_t** aio,
           int32_t** alo, float** lpo) {
  if (vrSwap(g, rank, set, pad_bs, out)) return 1;
  if (vrGatherOutputs(g, rank, set, pad_bs, po, aio, alo)) return 1;
  return vrGatherLogprobs(g, rank, set, pad_bs, lpo);
}

int vrUpload(VrGroup* g, int rank, int set, int pad_bs, int step) {
  VrRank* r = &g->r[rank];
  const size_t reqs = (size_t)(pad_bs / g->tp), n = (size_t)g->cfg.n;
  fxFillSwapInput(r->h_in, g->tp, rank, pad_bs, g->cfg.n, g->vocab, g->cfg.dtype, step);
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->in[set], r->h_in, vrInBytes(g, pad_bs), cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s)); /* h_in is refilled for the next set */
  fxFillVerifyInputs(r->h_p, r->h_ai, r->h_al, r->h_lp, g->tp, rank, pad_bs, g->cfg.n, step);
  VR_CUDA(g, rank, cudaMemcpyAsync(r->p[set], r->h_p, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->ai[set], r->h_ai, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank, cudaMemcpyAsync(r->al[set], r->h_al, reqs * 4, cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->lp[set], r->h_lp, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  return 0;
}

int vrCheckCall(VrGroup* g, int rank, const void* out, const int32_t* po, const int32_t* aio,
                const int32_t* alo, const float* lpo, int pad_bs, int step, const char* what) {
  VrRank* r = &g->r[rank];
  const size_t n = (size_t)g->cfg.n;
  int bad = 0;
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->h_out, out, vrOutBytes(g, pad_bs), cudaMemcpyDeviceToHost, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->h_po, po, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->h_aio, aio, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->h_alo, alo, (size_t)pad_bs * 4, cudaMemcpyDeviceToHost, r->s));
  VR_CUDA(g, rank,
          cudaMemcpyAsync(r->h_lpo, lpo, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  const size_t s_bad =
      fxCheckSwapOutput(r->h_out, g->tp, rank, pad_bs, g->cfg.n, g->vocab, g->cfg.dtype, step);
  const size_t v_bad = fxCheckVerifyOutputs(r->h_po, r->h_aio, r->h_alo, pad_bs, g->cfg.n, step);
  const size_t l_bad = fxCheckLogprobs(r->h_lpo, pad_bs, g->cfg.n, step);
  bad |= vrCount(g, s_bad == 0);
  bad |= vrCount(g, v_bad == 0);
  bad |= vrCount(g, l_bad == 0);
  if (bad)
    fprintf(stderr,
            "%s rank %d: %s pad_bs=%d step %d: swap %zu, verify outputs %zu, logprobs %zu values "
            "wrong (input offset %zu B)\n",
            g->desc, rank, what, pad_bs, step, s_bad, v_bad, l_bad, r->in_off);
  return bad;
}

int vrReplay(VrGroup* g, int rank) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_ONESIDED || rank == 0) { /* nccl: rank 0's graph runs every rank's work */
    VR_CUDA(g, rank, cudaGraphLaunch(r->exec, r->s));
    VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  }
  return vrBarrier(g);
}

int vrRunWithBuffers(VrGroup* g, int rank, VrEnqueue alloc, VrEnqueue run,
                     void (*release)(void* ctx), void* ctx) {
  if (vrBarrier(g)) return 1;
  if (alloc(g, rank, ctx)) {
    vrCount(g, 0);
    vrAbort(g);
    return 1;
  }
  if (vrBarrier(g)) return 1;
  if (run(g, rank, ctx)) {
    vrAbort(g);
    cudaStreamSynchronize(g->r[rank].s);
    return 1;
  }
  if (vrBarrier(g)) return 1;
  release(ctx);
  return 0;
}

int vrEagerRound(VrGroup* g, int rank, int pad_bs, int step, const char* what) {
  void* out = NULL;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  VrRank* r = &g->r[rank];
  if (vrUpload(g, rank, 0, pad_bs, step) || vrBarrier(g)) return 1;
  r->t[0] = vrNow();
  if (vrCall(g, rank, 0, pad_bs, &out, &po, &aio, &alo, &lpo)) return 1;
  r->t[1] = vrNow();
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  r->t[2] = vrNow();
  if (vrCheckAsync(g, rank, what)) {
    vrReportTimes(g, rank, what);
    return 1;
  }
  if (vrCheckCall(g, rank, out, po, aio, alo, lpo, pad_bs, step, what)) return 1;
  return vrBarrier(g);
}

/* ---- graphs ---------------------------------------------------------------------- */
/* Captures what fn enqueues on the rank's stream (the operations of one
 * call) into r->graph / r->exec. The logits dtype was fixed at creation (the
 * config's logits_dtype), so no call allocates during the capture.
 * onesided: each rank its own graph on its own stream. nccl: the virtual
 * collectives make every rank's stream wait for events the others
 * record, so the capture is one graph over every rank's stream: rank 0
 * begins it and records `fork`, the others join by waiting for it before
 * they enqueue, record `join` at their end, and rank 0 waits for every join
 * and ends the capture. */
int vrCaptureOps(VrGroup* g, int rank, VrEnqueue fn, void* ctx) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_ONESIDED) {
    VR_CUDA(g, rank, cudaStreamBeginCapture(r->s, cudaStreamCaptureModeRelaxed));
    const int rc = fn(g, rank, ctx);
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(r->s, &graph); /* also after a failure */
    r->graph = graph;
    if (rc) return 1;
    VR_CUDA(g, rank, e);
    VR_CUDA(g, rank, cudaGraphInstantiate(&r->exec, r->graph, 0));
    return vrBarrier(g); /* no rank replays while another still captures */
  }
  VrRank* r0 = &g->r[0];
  cudaError_t e = cudaSuccess;
  const char* step = NULL;
  int rc = 0;
  if (rank == 0) {
    e = cudaStreamBeginCapture(r0->s, cudaStreamCaptureModeRelaxed);
    step = "cudaStreamBeginCapture";
    if (e == cudaSuccess) {
      e = cudaEventRecord(g->fork, r0->s);
      step = "cudaEventRecord(fork)";
    }
  }
  if (e == cudaSuccess) rc = vrBarrier(g); /* the fork is recorded before anyone waits for it */
  if (e == cudaSuccess && !rc && rank != 0) {
    e = cudaStreamWaitEvent(r->s, g->fork, 0);
    step = "cudaStreamWaitEvent(fork)";
  }
  if (e == cudaSuccess && !rc) rc = fn(g, rank, ctx);
  if (e == cudaSuccess && !rc && rank != 0) {
    e = cudaEventRecord(g->join[rank], r->s);
    step = "cudaEventRecord(join)";
  }
  if (e != cudaSuccess) {
    vrReportFail(g, rank, step, "CUDA error", cudaGetErrorString(e));
    rc = 1;
  }
  if (rc) vrAbort(g);
  else rc = vrBarrier(g); /* every join is recorded */
  if (rank == 0) {
    for (int q = 1; q < g->tp && !rc; ++q) {
      e = cudaStreamWaitEvent(r0->s, g->join[q], 0);
      if (e != cudaSuccess) {
        vrReportFail(g, rank, "cudaStreamWaitEvent(join)", "CUDA error", cudaGetErrorString(e));
        rc = 1;
      }
    }
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(r0->s, &graph); /* also after a failure: no stream stays capturing */
    r0->graph = graph;
    if (!rc && e != cudaSuccess) {
      vrReportFail(g, rank, "cudaStreamEndCapture", "CUDA error", cudaGetErrorString(e));
      rc = 1;
    }
    if (!rc && (e = cudaGraphInstantiate(&r0->exec, r0->graph, 0)) != cudaSuccess) {
      vrReportFail(g, rank, "cudaGraphInstantiate", "CUDA error", cudaGetErrorString(e));
      rc = 1;
    }
    if (rc) vrAbort(g);
  }
  if (rc) return 1;
  return vrBarrier(g);
}


/* ---- the configuration's environment (main thread, no rank thread running) ---- */
/* Read by the onesided backend at creation. The harness owns them: vrStart
 * unsets them, vrEnvSet sets them for a onesided group, vrEnvClear unsets
 * them again once the group's threads have ended. */
static const char* const kVrEnv[4] = {"DPSAMPLING_PDL", "DPSAMPLING_ONESIDED_GATHER_PROTO",
                                      "DPSAMPLING_ONESIDED_LL_BYTES",
                                      "DPSAMPLING_ONESIDED_MAX_BLOCKS"};

static void vrEnvClear(void) {
  for (int i = 0; i < 4; ++i) unsetenv(kVrEnv[i]);
}

static void vrEnvSet(const VrGroup* g) {
  vrEnvClear();
  if (g->backend != VR_ONESIDED) return;
  char v[32];
  setenv("DPSAMPLING_PDL", g->cfg.pdl ? "1" : "0", 1);
  setenv("DPSAMPLING_ONESIDED_GATHER_PROTO", g->cfg.gproto == VR_GATHER_LL128 ? "ll128" : "ll", 1);
  snprintf(v, sizeof v, "%llu", (unsigned long long)g->cfg.ll_bytes);
  setenv("DPSAMPLING_ONESIDED_LL_BYTES", v, 1);
  snprintf(v, sizeof v, "%d", vrCap(g->tp)); /* the same on every rank: agreed as is */
  setenv("DPSAMPLING_ONESIDED_MAX_BLOCKS", v, 1);
}

/* ---- groups (created and destroyed by the main thread) ------------------------ */
static int vrGroupDestroy(VrGroup* g) {
  int rc = 0;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: cudaDeviceSynchronize at teardown: %s\n", g->desc, cudaGetErrorString(e));
    rc = 1;
  }
  for (int q = 0; q < g->tp; ++q) {
    VrRank* r = &g->r[q];
    if (r->exec) cudaGraphExecDestroy(r->exec);
    if (r->graph) cudaGraphDestroy(r->graph);
    if (r->comm) { /* its thread did not get to destroy it */
      fprintf(stderr, "%s rank %d: communicator left over; released without closing\n", g->desc,
              q);
      (void)dpsCommRelease(r->comm);
      r->comm = NULL;
      rc = 1;
    }
  }
  /* The threads destroyed their communicators; free any whose work had not
   * finished then (the device is idle now). */
  int pending = 0;
  const double t0 = vrNow();
  while (dpsReleasePending(&pending) == dpsSuccess && pending > 0 && vrNow() - t0 < 10.0)
    vrSleepMs(10);
  if (pending > 0) {
    fprintf(stderr, "%s: %d released communicators still wait for their work after 10 s\n",
            g->desc, pending);
    rc = 1;
  }
  for (int q = 0; q < g->tp; ++q) {
    VrRank* r = &g->r[q];
    if (r->sel.h_in) selFree(&r->sel);
    for (int k = 0; k < VR_MAX_SETS; ++k) {
      cudaFree(r->in_alloc[k]);
      cudaFree(r->vin_alloc[k]);
      cudaFree(r->snap_alloc[k]);
    }
    free(r->h_in);
    free(r->h_out);
    free(r->h_p);
    free(r->h_ai);
    free(r->h_al);
    free(r->h_po);
    free(r->h_aio);
    free(r->h_alo);
    free(r->h_lp);
    free(r->h_lpo);
    if (r->s) cudaStreamDestroy(r->s);
    if (g->join[q]) cudaEventDestroy(g->join[q]);
  }
  if (g->fork) cudaEventDestroy(g->fork);
  /* a communicator still pending would free into a destroyed group: leak it */
  if (pending == 0) dpsVirtualGroupDestroy(g->vg);
  return rc;
}

/* Whether one kernel on each rank's stream runs at the same time as all the
 * others (vrRendezvousKernel); -1 on a CUDA error (reported). */
static int vrStreamsConcurrent(VrGroup* g, unsigned* d_word) {
  const unsigned long long timeout_ns = 200ull * 1000 * 1000;
  const unsigned init[2] = {0u, 1u};
  int ok = 0;
  cudaError_t e = cudaMemcpy(d_word, init, sizeof init, cudaMemcpyHostToDevice);
  for (int q = 0; q < g->tp && e == cudaSuccess; ++q)
    e = vrLaunchRendezvous(d_word, (int*)(d_word + 1), (unsigned)g->tp, timeout_ns, g->r[q].s);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(&ok, d_word + 1, sizeof ok, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    vrReportFail(g, -1, "the streams' rendezvous", "CUDA error", cudaGetErrorString(e));
    return -1;
  }
  return ok;
}

/* The ranks' streams, one right after another (see vrGroupCreate), until
 * they run at once: made again, a few times, where CUDA put two on one
 * hardware queue, which the note line reports. */
static int vrMakeStreams(VrGroup* g) {
  enum { TRIES = 4 };
  unsigned* d_word = NULL;
  VR_CUDA(g, -1, cudaMalloc((void**)&d_word, 2 * sizeof(unsigned)));
  int ok = 0;
  for (int t = 0; t < TRIES && ok == 0; ++t) {
    for (int q = 0; q < g->tp; ++q) {
      if (g->r[q].s) cudaStreamDestroy(g->r[q].s);
      g->r[q].s = NULL;
    }
    for (int q = 0; q < g->tp && ok >= 0; ++q) {
      const cudaError_t e = cudaStreamCreateWithFlags(&g->r[q].s, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        vrReportFail(g, q, "cudaStreamCreateWithFlags", "CUDA error", cudaGetErrorString(e));
        ok = -1;
      }
    }
    if (ok == 0) ok = vrStreamsConcurrent(g, d_word);
    if (ok == 0)
      printf("  %s: note: the ranks' streams did not all run at once (two on one hardware "
             "queue?); making them again\n",
             g->desc);
  }
  cudaFree(d_word);
  if (ok == 0)
    fprintf(stderr, "%s: the ranks' streams did not run at once after %d tries\n", g->desc,
            TRIES);
  return ok == 1 ? 0 : 1;
}

static int vrGroupCreate(VrGroup* g, int tp, int backend, const VrCfg* cfg, int nsets,
                         int variant) {
  memset(g, 0, sizeof *g);
  g->tp = tp;
  g->backend = backend;
  g->cfg = *cfg;
  g->nsets = nsets;
  g->timeout_ms = g_vr.timeout_ms;
  g->t0 = vrNow();
  g->v_local = cfg->v_local > 0 ? cfg->v_local : VR_REAL_VOCAB / tp;
  g->vocab = (int64_t)tp * g->v_local;
  g->max_pad_bs = tp * cfg->mr;
  g->esize = dpsDataTypeSize(cfg->dtype);
  if (backend == VR_ONESIDED)
    snprintf(g->desc, sizeof g->desc,
             "tp=%d onesided %s V=%lld (V/tp=%d) N=%d max_pad_bs=%d gathers %s PDL %s swap "
             "LL<=%llu grid cap %d",
             tp, dpsDataTypeName(cfg->dtype), (long long)g->vocab, g->v_local, cfg->n,
             g->max_pad_bs, cfg->gproto == VR_GATHER_LL128 ? "LL128" : "LL",
             cfg->pdl ? "on" : "off", (unsigned long long)cfg->ll_bytes, vrCap(tp));
  else
    snprintf(g->desc, sizeof g->desc, "tp=%d nccl %s V=%lld (V/tp=%d) N=%d max_pad_bs=%d", tp,
             dpsDataTypeName(cfg->dtype), (long long)g->vocab, g->v_local, cfg->n, g->max_pad_bs);

  /* The ranks' streams first, one right after another, before anything else
   * creates a stream (the communicators create their own at creation).
   * CUDA spreads streams over a limited number of hardware work queues
   * (CUDA_DEVICE_MAX_CONNECTIONS; vrStart asks for 32) round-robin in
   * creation order. Two virtual ranks whose streams share a queue can
   * deadlock until the timeout: rank A's second kernel, waiting in stream
   * order behind A's first (which spins until rank B's data arrives), holds
   * the head of the queue while B's kernel sits behind it in the same queue.
   * Created consecutively, the tp streams land on distinct queues. This is
   * head-of-line blocking between virtual ranks sharing one GPU, not a
   * property of the protocol: real ranks are processes on separate GPUs.
   * vrMakeStreams checks that they run at once, and makes them again where
   * they do not. */
  if (vrMakeStreams(g)) return 1;
  const dpsResult_t vr = dpsVirtualGroupCreate(&g->vg, tp, VR_BARRIER_S);
  if (vr != dpsSuccess) {
    vrReportFail(g, -1, "dpsVirtualGroupCreate", dpsGetErrorString(vr), dpsGetLastError());
    return 1;
  }
  VR_CUDA(g, -1, cudaEventCreateWithFlags(&g->fork, cudaEventDisableTiming));

  const size_t reqs = (size_t)cfg->mr, n = (size_t)cfg->n, full = (size_t)g->max_pad_bs;
  const size_t in_bytes = vrInBytes(g, g->max_pad_bs), out_bytes = vrOutBytes(g, g->max_pad_bs);
  for (int q = 0; q < tp; ++q) {
    VrRank* r = &g->r[q];
    VR_CUDA(g, q, cudaEventCreateWithFlags(&g->join[q], cudaEventDisableTiming));
    /* 0, 1 or 2 elements of misalignment, different on neighbouring ranks */
    r->in_off = (size_t)((q + variant) % 3) * g->esize;
    r->v_off = (size_t)((q + variant) % 2) * 4;
    const size_t vseg = vrRound(reqs * n * 4 + 16);
    for (int k = 0; k < nsets; ++k) {
      VR_CUDA(g, q, cudaMalloc(&r->in_alloc[k], in_bytes + 64));
      r->in[k] = (char*)r->in_alloc[k] + r->in_off;
      VR_CUDA(g, q, cudaMalloc(&r->vin_alloc[k], 4 * vseg));
      char* v = (char*)r->vin_alloc[k] + r->v_off;
      r->p[k] = (int32_t*)v;
      r->ai[k] = (int32_t*)(v + vseg);
      r->al[k] = (int32_t*)(v + 2 * vseg);
      r->lp[k] = (float*)(v + 3 * vseg);
      if (nsets > 1) {
        const size_t so = vrRound(out_bytes), sv = vrRound(full * n * 4);
        VR_CUDA(g, q, cudaMalloc(&r->snap_alloc[k], so + 3 * sv + vrRound(full * 4)));
        char* b = (char*)r->snap_alloc[k];
        r->snap_out[k] = b;
        r->snap_p[k] = (int32_t*)(b + so);
        r->snap_ai[k] = (int32_t*)(b + so + sv);
        r->snap_lp[k] = (float*)(b + so + 2 * sv);
        r->snap_al[k] = (int32_t*)(b + so + 3 * sv);
      }
    }
    r->h_in = malloc(in_bytes + 16);
    r->h_out = malloc(out_bytes + 16);
    r->h_p = (int32_t*)malloc(reqs * n * 4);
    r->h_ai = (int32_t*)malloc(reqs * n * 4);
    r->h_al = (int32_t*)malloc(reqs * 4);
    r->h_lp = (float*)malloc(reqs * n * 4);
    r->h_po = (int32_t*)malloc(full * n * 4);
    r->h_aio = (int32_t*)malloc(full * n * 4);
    r->h_alo = (int32_t*)malloc(full * 4);
    r->h_lpo = (float*)malloc(full * n * 4);
    if (!(r->h_in && r->h_out && r->h_p && r->h_ai && r->h_al && r->h_lp && r->h_po && r->h_aio &&
          r->h_alo && r->h_lpo)) {
      fprintf(stderr, "%s rank %d: host allocation failed\n", g->desc, q);
      return 1;
    }
    if (selAlloc(&r->sel, tp, q, g->v_local, g->max_pad_bs * cfg->n, cfg->dtype, r->s)) return 1;
  }
  VR_CUDA(g, -1, cudaDeviceSynchronize());
  return 0;
}

/* ---- a rank's thread: create, run, destroy -------------------------------------- */
typedef struct {
  VrGroup* g;
  int rank;
  VrBody fn;
  const void* arg;
  int rc;
} VrThreadArg;

/* Collective (every rank's thread at once): the library's creation path
 * with the virtual provider. A failure aborts the group (dpsCommInitVirtual
 * does), so the other ranks' creation fails too instead of waiting. */
static int vrCommCreate(VrGroup* g, int rank) {
  VrRank* r = &g->r[rank];
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  c.tp_size = g->tp;
  c.rank = rank;
  c.max_pad_bs = g->max_pad_bs;
  c.num_tokens_per_req = g->cfg.n;
  c.vocab_size = g->vocab;
  c.logits_dtype = g->cfg.dtype; /* fixed at creation: graphs may capture the first calls */
  c.backend = g->backend == VR_ONESIDED ? dpsBackendOnesided : dpsBackendNccl;
  c.cuda_device = VR_DEV;
  c.timeout_ms = g->timeout_ms;
  c.max_topk = DPS_TOPK_MAX; /* the select scenario's largest k */
  r->comm = NULL;
  const dpsResult_t res = dpsCommInitVirtual(&r->comm, g->vg, &c);
  if (res != dpsSuccess) {
    r->comm = NULL;
    vrReportFail(g, rank, "dpsCommInitVirtual", dpsGetErrorString(res), dpsGetLastError());
    return vrCount(g, 0);
  }
  if (gtCheckInfo(r->comm, &c)) {
    fprintf(stderr, "%s rank %d: dpsCommGetInfo does not match the config\n", g->desc, rank);
    return vrCount(g, 0);
  }
  return 0;
}

/* Every rank destroys its own communicator (collective for onesided: the
 * close exchange and the windows' deregistration). It must return within
 * its bound: close waits for the communicator's own work at most twice the
 * timeout plus a second, and the close exchange gives up after a timeout. */
static int vrCommDestroy(VrGroup* g, int rank) {
  VrRank* r = &g->r[rank];
  if (r->comm == NULL) return 0;
  const double bound = 3.0 * g->timeout_ms / 1000.0 + 5.0;
  const double t0 = vrNow();
  const dpsResult_t d = dpsCommDestroy(r->comm);
  const double dt = vrNow() - t0;
  int rc = 0;
  if (d != dpsSuccess) {
    vrReportFail(g, rank, "dpsCommDestroy", dpsGetErrorString(d), dpsGetLastError());
    (void)dpsCommRelease(r->comm); /* a refused close releases nothing */
    rc = vrCount(g, 0);
  }
  r->comm = NULL;
  if (dt > bound) {
    fprintf(stderr, "%s rank %d: dpsCommDestroy took %.2f s (bound %.2f s)\n", g->desc, rank, dt,
            bound);
    rc = vrCount(g, 0);
  }
  return rc;
}

static void* vrThreadMain(void* p) {
  VrThreadArg* a = (VrThreadArg*)p;
  VrGroup* g = a->g;
  const cudaError_t e = cudaSetDevice(VR_DEV);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s rank %d: cudaSetDevice: %s\n", g->desc, a->rank, cudaGetErrorString(e));
    a->rc = 1;
    vrAbort(g); /* the others' creation would wait for this rank */
    return NULL;
  }
  a->rc = vrCommCreate(g, a->rank);
  if (a->rc == 0) a->rc = a->fn(g, a->rank, a->arg);
  /* Close together: a rank still checking on the host would otherwise
   * count against its peers' close exchange. */
  if (a->rc) vrAbort(g);
  else a->rc = vrBarrier(g);
  if (vrCommDestroy(g, a->rank)) a->rc = 1;
  if (a->rc) vrAbort(g);
  return NULL;
}

void vrRunGroup(VrTally* t, int tp, int backend, const VrCfg* cfg, int nsets, int variant,
                VrBody fn, const void* arg, const char* scenario) {
  VrGroup* g = (VrGroup*)calloc(1, sizeof(VrGroup));
  if (g == NULL) {
    fprintf(stderr, "out of host memory\n");
    t->failed++;
    return;
  }
  int rc = vrGroupCreate(g, tp, backend, cfg, nsets, variant);
  if (rc) {
    fprintf(stderr, "%s: %s: creating the virtual ranks failed\n", g->desc, scenario);
  } else {
    vrEnvSet(g); /* read by every rank's creation; no rank thread runs yet */
    pthread_t th[VR_MAX_TP];
    VrThreadArg ta[VR_MAX_TP];
    int started = 0;
    for (int q = 0; q < tp; ++q) {
      ta[q] = (VrThreadArg){g, q, fn, arg, 0};
      if (pthread_create(&th[q], NULL, vrThreadMain, &ta[q]) != 0) {
        fprintf(stderr, "%s: pthread_create failed\n", g->desc);
        vrAbort(g);
        rc = 1;
        break;
      }
      ++started;
    }
    for (int q = 0; q < started; ++q) {
      pthread_join(th[q], NULL);
      rc |= ta[q].rc;
    }
    vrEnvClear();
  }
  rc |= vrGroupDestroy(g);
  if (rc && g->failed == 0) g->failed = 1; /* a failure outside the counted checks */
  if (rc) fprintf(stderr, "FAIL %s: %s\n", scenario, g->desc);
  t->passed += g->passed;
  t->failed += g->failed;
  free(g);
}

int vrSkipLarge(int tp, const VrCfg* c) {
  const int v = c->v_local > 0 ? c->v_local : VR_REAL_VOCAB / tp;
  return gtSkipLarge("test_gpu_virtual_ranks", (int64_t)tp * c->mr, c->n, (int64_t)tp * v);
}

/* ---- options and start --------------------------------------------------------- */
static void vrWatchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_gpu_virtual_ranks: watchdog: the run exceeded DPS_VR_WATCHDOG_S; "
                            "aborting (a hang would be a bug of the harness or the kernels)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(124);
}

static int vrParseTps(const char* s) {
  memset(g_vr.tps, 0, sizeof g_vr.tps);
  while (*s) {
    char* end = NULL;
    long a = strtol(s, &end, 10), b = a;
    if (end == s) return -1;
    s = end;
    if (*s == '-') {
      ++s;
      b = strtol(s, &end, 10);
      if (end == s) return -1;
      s = end;
    }
    if (a < 2 || b > VR_MAX_TP || a > b) return -1;
    for (long k = a; k <= b; ++k) g_vr.tps[k] = 1;
    if (*s == ',') ++s;
    else if (*s) return -1;
  }
  return 0;
}

static int vrParseScenarios(const char* s) {
  if (strcmp(s, "all") == 0) {
    g_vr.scenarios = VR_SC_ALL;
    return 0;
  }
  g_vr.scenarios = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", s);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcmp(tok, "shapes") == 0) g_vr.scenarios |= VR_SC_SHAPES;
    else if (strcmp(tok, "runahead") == 0) g_vr.scenarios |= VR_SC_RUNAHEAD;
    else if (strcmp(tok, "graph") == 0) g_vr.scenarios |= VR_SC_GRAPH;
    else if (strcmp(tok, "timeout") == 0) g_vr.scenarios |= VR_SC_TIMEOUT;
    else if (strcmp(tok, "select") == 0) g_vr.scenarios |= VR_SC_SELECT;
    else if (strcmp(tok, "sample") == 0) g_vr.scenarios |= VR_SC_SAMPLE;
    else if (strcmp(tok, "verify") == 0) g_vr.scenarios |= VR_SC_VERIFY;
    else if (strcmp(tok, "mixed") == 0) g_vr.scenarios |= VR_SC_MIXED;
    else return -1;
  }
  return g_vr.scenarios ? 0 : -1;
}

static int vrParseBackend(const char* s) {
  if (strcmp(s, "all") == 0) g_vr.backends = 3;
  else if (strcmp(s, "nccl") == 0) g_vr.backends = 1 << VR_NCCL;
  else if (strcmp(s, "onesided") == 0) g_vr.backends = 1 << VR_ONESIDED;
  else return -1;
  return 0;
}

static int vrEnvOn(const char* name) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static int vrUsage(const char* bad) {
  fprintf(stderr,
          "test_gpu_virtual_ranks: bad argument '%s'\n"
          "usage: test_gpu_virtual_ranks [tp=2,3|2-8] [backend=nccl|onesided|all] "
          "[scenario=shapes,runahead,graph,timeout,select,sample,verify,mixed|all] [full] "
          "[small]\n",
          bad);
  return 2;
}

int vrStart(int argc, char** argv) {
  /* Before any CUDA call (the driver reads it when it creates the context):
   * as many hardware work queues as CUDA allows, so that the ranks' streams
   * do not share one (see vrGroupCreate). DPS_VR_CONNECTIONS overrides it
   * (e.g. 1 to show the head-of-line blocking). */
  const char* conn = getenv("DPS_VR_CONNECTIONS");
  if (conn == NULL || conn[0] == '\0') conn = "32";
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", conn, 1);

  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int k = 2; k <= VR_MAX_TP; ++k) g_vr.tps[k] = 1;
  const char* e;
  if ((e = getenv("DPS_VR_TP")) && *e && vrParseTps(e)) return vrUsage(e);
  if ((e = getenv("DPS_VR_BACKEND")) && *e && vrParseBackend(e)) return vrUsage(e);
  if ((e = getenv("DPS_VR_SCENARIO")) && *e && vrParseScenarios(e)) return vrUsage(e);
  g_vr.full = vrEnvOn("DPS_VR_FULL");
  g_vr.small = vrEnvOn("DPS_TEST_SMALL");
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    while (*a == '-') ++a;
    if (strncmp(a, "tp=", 3) == 0) {
      if (vrParseTps(a + 3)) return vrUsage(argv[i]);
    } else if (strncmp(a, "backend=", 8) == 0) {
      if (vrParseBackend(a + 8)) return vrUsage(argv[i]);
    } else if (strncmp(a, "scenario=", 9) == 0) {
      if (vrParseScenarios(a + 9)) return vrUsage(argv[i]);
    } else if (strcmp(a, "full") == 0) {
      g_vr.full = 1;
    } else if (strcmp(a, "small") == 0) {
      g_vr.small = 1;
      setenv("DPS_TEST_SMALL", "1", 1); /* gtSkipLarge reads it */
    } else {
      return vrUsage(argv[i]);
    }
  }
  if (g_vr.small) g_vr.timeout_ms = 20000; /* sanitized kernels are slow */
  uint64_t v = 0;
  if (dpsEnvUint("DPS_VR_TIMEOUT_MS", &v) > 0 && v > 0 && v <= 600000) g_vr.timeout_ms = (int)v;
  if (dpsEnvUint("DPS_VR_BLOCKS", &v) > 0 && v > 0 && v <= 1024) g_vr.blocks_override = (int)v;
  uint64_t wd = g_vr.small ? 1800 : 600;
  if (dpsEnvUint("DPS_VR_WATCHDOG_S", &wd) < 0) wd = 600;

  /* the SKIP line without a GPU; the backend override unset (the harness
   * asks for each backend itself) */
  dpsBackend_t unused[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  char* no_args[2] = {argv[0], NULL};
  const int start = gtStart("test_gpu_virtual_ranks", 1, 1, no_args, unused, &nb, &ngpu);
  if (start != 0) return start;
  for (int i = 0; i < 4; ++i)
    if (getenv(kVrEnv[i]))
      printf("test_gpu_virtual_ranks: note: unsetting %s (set per configuration)\n", kVrEnv[i]);
  vrEnvClear();
  if (wd > 0) {
    signal(SIGALRM, vrWatchdog);
    alarm((unsigned)wd);
  }
  GT_CUDA(cudaSetDevice(VR_DEV));
  struct cudaDeviceProp prop;
  GT_CUDA(cudaGetDeviceProperties(&prop, VR_DEV));
  g_vr.sms = prop.multiProcessorCount;
  g_vr.major = prop.major;
  /* The harness's own kernels; creation loads the library's (lazy module
   * loading would load them at their first launch, possibly while the other
   * ranks' kernels occupy the device). */
  GT_CUDA(vrPreloadKernels());
  printf("test_gpu_virtual_ranks: device %d %s (%d SMs, sm_%d%d), matrix %s%s, timeout %d ms, "
         "CUDA_DEVICE_MAX_CONNECTIONS=%s, PDL as configured (DPSAMPLING_PDL; off where the "
         "library's device code predates sm_90), LL128 %s\n",
         VR_DEV, prop.name, g_vr.sms, prop.major, prop.minor, g_vr.full ? "full" : "reduced",
         g_vr.small ? " (small shapes)" : "", g_vr.timeout_ms,
         getenv("CUDA_DEVICE_MAX_CONNECTIONS"), g_vr.major >= 9 ? "on" : "skipped (before sm_90)");
  printf("  onesided grid cap per rank (DPSAMPLING_ONESIDED_MAX_BLOCKS; all ranks' blocks and PDL "
         "dependants co-resident):");
  for (int tp = 2; tp <= VR_MAX_TP; ++tp)
    if (g_vr.tps[tp]) printf(" tp=%d:%d", tp, vrCap(tp));
  printf("\n");
  return -1;
}
