/* Every rank count on one GPU: tp = 2..8 virtual ranks in one process, on
 * one device, one host thread and one stream per rank, for both backends.
 *
 *  onesided  the library's planning (backends/onesided_plan.c: layout,
 *            common arguments, every call's plan) and launch functions
 *            (dpsOsLaunchSwap, dpsOsLaunchGather) over real windows: each
 *            rank's window A and B is a cudaMalloc of the same device, and a
 *            rank's "peer pointers" are the other ranks' allocations. Every
 *            rank's grid is capped (the agreed grid cap maxb, which also caps
 *            the gathers at min(maxb, DPS_OS_GATHER_MAX_BLOCKS)) so that all
 *            ranks' blocks, and PDL's early-resident dependants, fit on the
 *            device together: maxb = (SMs - 2) / (2 tp). The kernels are
 *            loaded before the first launch (lazy module loading deadlocked a
 *            first launch in an experiment), and the timeout is short, so a
 *            co-residency mistake ends as a reported dpsTimeout, never a hang.
 *  nccl      the real backend (dpsNcclBackendOps) through its public seam:
 *            detached communicators (dpsCommCreateDetached; the backend's init
 *            and prepare allocate on the current device) and
 *            dpsCommSetCollectives with a loopback rendezvous: the all-gather
 *            and all-to-all are device copies between the virtual ranks'
 *            buffers, ordered with events (see vrExchange).
 *
 * Scenarios, every value checked against the fixtures' host reference:
 *  shapes    fp32/bf16/fp16, V/tp in {1, 7, 33, 1001, 152064/tp}, N in
 *            {1, 3, 8}; pad_bs changes on every call (crossing the swap's
 *            LL/direct switch: asserted for V/tp=1001 N=8); inputs offset by
 *            0, 1 or 2 elements depending on the rank (different vector
 *            widths on different ranks); onesided LL and LL128 gathers, PDL on
 *            and off (the nccl backend has neither: one run per shape);
 *  runahead  the last rank is held by a spin kernel before every call while
 *            the others enqueue all calls at once; every call's outputs are
 *            snapshotted on the rank's stream and checked afterwards;
 *  graph     capture swap + both gathers, replay with new inputs, an eager
 *            call between replays (onesided: one graph per rank; nccl: one
 *            graph over all ranks' streams, since the loopback collectives
 *            join them);
 *  timeout   (onesided) one rank stops calling: every other rank's error word
 *            is set within the timeout and names it, directly or through a
 *            peer that gave up first (DPS_OS_WAIT_PEER_FAILED). Not applicable
 *            to the nccl backend, which has no timeout (its peers would wait
 *            in NCCL forever); reported as n/a.
 *
 * Default: a reduced matrix for every tp in 2..8 and both backends (well
 * under a minute on one H200). DPS_VR_FULL=1 (or "full"): the full matrix.
 * Arguments (or environment): tp=2,5-8 (DPS_VR_TP), backend=nccl|onesided|
 * all (DPS_VR_BACKEND), scenario=shapes,runahead,graph,timeout,select|all
 * (DPS_VR_SCENARIO), full, small (= DPS_TEST_SMALL=1: skips shapes above
 * 1 Mi logits elements and lengthens the timeout, for compute-sanitizer).
 * DPS_VR_TIMEOUT_MS (default 2000, 20000 with small), DPS_VR_BLOCKS (grid
 * cap per rank instead of (SMs - 2) / (2 tp)), DPS_VR_WATCHDOG_S (the
 * whole run's limit, default 600, 1800 with small; 0 = none).
 *
 * What this cannot cover (the multi-GPU tests do): ordering and visibility
 * across NVLink, LL128's 128-byte store atomicity over NVLink, NCCL windows
 * and their registration, NCCL itself, timing skew between real GPUs, and
 * the production grid sizes (the grids here are capped for co-residency).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"
#include "select_common.h"
#include "internal.h"
#include "testsupport.h"
#include "backends/onesided_plan.h"
#include "backends/select_plan.h"
#include "backends/registry.h"
#include "kernels/onesided_kernels.h"

cudaError_t vrLaunchSpin(unsigned long long ns, cudaStream_t stream); /* vr_spin.cu */
cudaError_t vrPreloadSpin(void);

#define VR_MAX_TP 8
#define VR_MAX_SETS 4
#define VR_REAL_VOCAB 152064
#define VR_BARRIER_S 120 /* a host barrier waiting longer than this gives up */

enum { VR_NCCL = 0, VR_ONESIDED = 1 };
enum { VR_SC_SHAPES = 1, VR_SC_RUNAHEAD = 2, VR_SC_GRAPH = 4, VR_SC_TIMEOUT = 8, VR_SC_SELECT = 16 };
enum { VR_OP_SWAP_LL = 0, VR_OP_SWAP_DIRECT = 1, VR_OP_OUTPUTS = 2, VR_OP_LOGPROBS = 3 };
#define VR_LL_DEFAULT ((uint64_t)256 * 1024) /* the backend's default swap LL threshold */
#define VR_LL_ALWAYS ((uint64_t)16 << 20)    /* its maximum: LL wherever the staging fits */

/* ---- options ------------------------------------------------------------------ */
static int g_tps[VR_MAX_TP + 1]; /* g_tps[tp] = 1: run it */
static int g_backends = 3;       /* bit VR_NCCL, bit VR_ONESIDED */
static int g_scenarios = VR_SC_SHAPES | VR_SC_RUNAHEAD | VR_SC_GRAPH | VR_SC_TIMEOUT | VR_SC_SELECT;
static int g_full = 0, g_small = 0;
static int g_timeout_ms = 2000;
static int g_blocks_override = 0;
static int g_sms = 0, g_major = 0, g_pdl_ok = 0;
static const int g_dev = 0;
static dpsSelWaves g_sel_waves; /* the argmax / top-k row split */

/* ---- one virtual rank ------------------------------------------------------- */
typedef struct {
  dpsDataType_t dtype;
  int v_local; /* 0: VR_REAL_VOCAB / tp */
  int n;
  int mr; /* max requests per rank: max_pad_bs = tp * mr */
  int gproto;
  int pdl;
  uint64_t ll_bytes;
  int cross; /* assert that the swap took both paths (onesided, default threshold) */
} VrCfg;

struct VrGroup;

typedef struct {
  struct VrGroup* g;
  int rank;
} VrCollCtx;

typedef struct {
  dpsOsLayout L;
  dpsOsCommon common;
  dpsOsWindows wa, wb;
  dpsOsOutputs out;
  void *a_mem, *b_mem, *out_mem;
  dpsOsDevState* dstate;
  volatile unsigned long long* herr; /* mapped pinned host word */
  unsigned long long* herr_dev;
} VrOs;

typedef struct {
  cudaStream_t s;
  dpsComm_t comm; /* nccl */
  VrCollCtx cctx;
  VrOs os; /* onesided */
  size_t in_off, v_off; /* input pointer offsets (alignment variety) */
  void* in_alloc[VR_MAX_SETS];
  void* in[VR_MAX_SETS];
  void* vin_alloc[VR_MAX_SETS];
  int32_t *p[VR_MAX_SETS], *ai[VR_MAX_SETS], *al[VR_MAX_SETS];
  float* lp[VR_MAX_SETS];
  void* snap_alloc[VR_MAX_SETS]; /* runahead: every call's outputs */
  void* snap_out[VR_MAX_SETS];
  int32_t *snap_p[VR_MAX_SETS], *snap_ai[VR_MAX_SETS], *snap_al[VR_MAX_SETS];
  float* snap_lp[VR_MAX_SETS];
  void *h_in, *h_out;
  int32_t *h_p, *h_ai, *h_al, *h_po, *h_aio, *h_alo;
  float *h_lp, *h_lpo;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int paths_seen;      /* bit 0 direct, bit 1 LL (onesided swap plans) */
  unsigned widths_seen; /* OR of the swap plans' widths */
  double stall_s;      /* timeout scenario: seconds until the error word was set */
  SelBufs sel;         /* select scenario */
} VrRank;

typedef struct VrGroup {
  int tp, backend, nsets, timeout_ms;
  VrCfg cfg;
  int max_pad_bs, v_local;
  int64_t vocab;
  size_t esize;
  char desc[160];
  VrRank r[VR_MAX_TP];
  /* host barrier with abort */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int count, gen, abort;
  /* loopback rendezvous */
  const void* send[VR_MAX_TP];
  size_t bytes[VR_MAX_TP];
  cudaEvent_t ready[VR_MAX_TP], done[VR_MAX_TP], join[VR_MAX_TP], fork;
  /* value checks */
  long passed, failed;
} VrGroup;

static double vrNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void vrSleepMs(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void vrAbort(VrGroup* g) {
  pthread_mutex_lock(&g->mu);
  g->abort = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* All ranks' threads meet; 1 when the group was aborted (a rank failed) or
 * the wait exceeded VR_BARRIER_S (then the group is aborted). */
static int vrBarrier(VrGroup* g) {
  pthread_mutex_lock(&g->mu);
  if (g->abort) {
    pthread_mutex_unlock(&g->mu);
    return 1;
  }
  const int gen = g->gen;
  if (++g->count == g->tp) {
    g->count = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
  }
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += VR_BARRIER_S;
  while (g->gen == gen && !g->abort) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && g->gen == gen) {
      fprintf(stderr, "%s: host barrier timed out after %d s\n", g->desc, VR_BARRIER_S);
      g->abort = 1;
      pthread_cond_broadcast(&g->cv);
    }
  }
  const int rc = g->gen == gen ? 1 : 0;
  pthread_mutex_unlock(&g->mu);
  return rc;
}

static int vrCount(VrGroup* g, int ok) {
  __atomic_add_fetch(ok ? &g->passed : &g->failed, 1, __ATOMIC_RELAXED);
  return ok ? 0 : 1;
}

/* ---- the loopback collectives (nccl backend) -------------------------------- */
/* Every virtual rank calls this from its own thread, at the same point of the
 * same operation. Rank me records "send ready" on its stream, all meet, each
 * enqueues its receive copies on its own stream behind the senders' "send
 * ready" events and records "copies done"; all meet again, and each stream
 * waits for every other rank's "copies done", so that no sender overwrites
 * its send buffer (a later pack) while a peer still reads it. The second
 * meeting also keeps every rank's event waits ahead of the next re-record of
 * the events they wait on. During a capture every stream is part of the same
 * capture (bodyGraph), so the events join them. */
static dpsResult_t vrExchange(VrCollCtx* c, const void* send, void* recv, size_t bytes,
                              cudaStream_t stream, int a2a) {
  VrGroup* g = c->g;
  const int me = c->rank;
  g->send[me] = send;
  g->bytes[me] = bytes;
  cudaError_t e = cudaEventRecord(g->ready[me], stream);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s rank %d: loopback: cudaEventRecord: %s\n", g->desc, me,
            cudaGetErrorString(e));
    vrAbort(g);
    return dpsCudaError;
  }
  if (vrBarrier(g)) return dpsInternalError;
  for (int src = 0; src < g->tp && e == cudaSuccess; ++src) {
    if (g->bytes[src] != bytes) {
      fprintf(stderr, "%s rank %d: loopback: rank %d sends %zu bytes, this rank %zu\n", g->desc,
              me, src, g->bytes[src], bytes);
      vrAbort(g);
      return dpsInvalidUsage;
    }
    e = cudaStreamWaitEvent(stream, g->ready[src], 0);
    const char* from = (const char*)g->send[src] + (a2a ? (size_t)me * bytes : 0);
    if (e == cudaSuccess && bytes)
      e = cudaMemcpyAsync((char*)recv + (size_t)src * bytes, from, bytes,
                          cudaMemcpyDeviceToDevice, stream);
  }
  if (e == cudaSuccess) e = cudaEventRecord(g->done[me], stream);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s rank %d: loopback copies: %s\n", g->desc, me, cudaGetErrorString(e));
    vrAbort(g);
    return dpsCudaError;
  }
  if (vrBarrier(g)) return dpsInternalError;
  for (int q = 0; q < g->tp && e == cudaSuccess; ++q)
    if (q != me) e = cudaStreamWaitEvent(stream, g->done[q], 0);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s rank %d: loopback wait: %s\n", g->desc, me, cudaGetErrorString(e));
    return dpsCudaError; /* every rank is past the last meeting */
  }
  return dpsSuccess;
}

static dpsResult_t vrAllGather(void* ctx, const void* send, void* recv, size_t bytes,
                               cudaStream_t stream) {
  return vrExchange((VrCollCtx*)ctx, send, recv, bytes, stream, 0);
}

static dpsResult_t vrAllToAll(void* ctx, const void* send, void* recv, size_t bytes,
                              cudaStream_t stream) {
  return vrExchange((VrCollCtx*)ctx, send, recv, bytes, stream, 1);
}

/* ---- groups (created and destroyed by the main thread, nothing in flight) ---- */
static int vrCap(int tp) {
  if (g_blocks_override > 0) return g_blocks_override;
  const int c = (g_sms - 2) / (2 * tp);
  return c < 1 ? 1 : c;
}

static size_t vrRound(size_t x) { return (x + 255) / 256 * 256; }

static size_t vrInBytes(const VrGroup* g, int pad_bs) {
  return (size_t)pad_bs * (size_t)g->cfg.n * (size_t)g->v_local * g->esize;
}
static size_t vrOutBytes(const VrGroup* g, int pad_bs) {
  return (size_t)(pad_bs / g->tp) * (size_t)g->cfg.n * (size_t)g->vocab * g->esize;
}

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
    if (r->comm) {
      const dpsResult_t d = dpsCommDestroy(r->comm);
      if (d != dpsSuccess) {
        fprintf(stderr, "%s rank %d: dpsCommDestroy: %s\n", g->desc, q, dpsGetLastError());
        rc = 1;
      }
    }
    cudaFree(r->os.a_mem);
    cudaFree(r->os.b_mem);
    cudaFree(r->os.out_mem);
    cudaFree(r->os.dstate);
    if (r->sel.h_in) selFree(&r->sel);
    if (r->os.herr) cudaFreeHost((void*)r->os.herr);
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
    if (g->ready[q]) cudaEventDestroy(g->ready[q]);
    if (g->done[q]) cudaEventDestroy(g->done[q]);
    if (g->join[q]) cudaEventDestroy(g->join[q]);
  }
  if (g->fork) cudaEventDestroy(g->fork);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  return rc;
}

static const char* vrBackendName(int b) { return b == VR_ONESIDED ? "onesided" : "nccl"; }

static int vrGroupCreate(VrGroup* g, int tp, int backend, const VrCfg* cfg, int timeout_ms,
                         int nsets, int variant) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->tp = tp;
  g->backend = backend;
  g->cfg = *cfg;
  g->nsets = nsets;
  g->timeout_ms = timeout_ms;
  g->v_local = cfg->v_local > 0 ? cfg->v_local : VR_REAL_VOCAB / tp;
  g->vocab = (int64_t)tp * g->v_local;
  g->max_pad_bs = tp * cfg->mr;
  g->esize = dpsDataTypeSize(cfg->dtype);
  if (backend == VR_ONESIDED)
    snprintf(g->desc, sizeof g->desc,
             "tp=%d onesided %s V=%lld (V/tp=%d) N=%d max_pad_bs=%d gathers %s PDL %s swap LL<=%llu",
             tp, dpsDataTypeName(cfg->dtype), (long long)g->vocab, g->v_local, cfg->n,
             g->max_pad_bs, cfg->gproto == DPS_OS_PROTO_LL128 ? "LL128" : "LL",
             cfg->pdl ? "on" : "off", (unsigned long long)cfg->ll_bytes);
  else
    snprintf(g->desc, sizeof g->desc, "tp=%d nccl %s V=%lld (V/tp=%d) N=%d max_pad_bs=%d", tp,
             dpsDataTypeName(cfg->dtype), (long long)g->vocab, g->v_local, cfg->n, g->max_pad_bs);

  const size_t reqs = (size_t)cfg->mr, n = (size_t)cfg->n, full = (size_t)g->max_pad_bs;
  const size_t in_bytes = vrInBytes(g, g->max_pad_bs), out_bytes = vrOutBytes(g, g->max_pad_bs);
  GT_CUDA(cudaEventCreateWithFlags(&g->fork, cudaEventDisableTiming));
  for (int q = 0; q < tp; ++q) {
    VrRank* r = &g->r[q];
    GT_CUDA(cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking));
    GT_CUDA(cudaEventCreateWithFlags(&g->ready[q], cudaEventDisableTiming));
    GT_CUDA(cudaEventCreateWithFlags(&g->done[q], cudaEventDisableTiming));
    GT_CUDA(cudaEventCreateWithFlags(&g->join[q], cudaEventDisableTiming));
    /* 0, 1 or 2 elements of misalignment, different on neighbouring ranks */
    r->in_off = (size_t)((q + variant) % 3) * g->esize;
    r->v_off = (size_t)((q + variant) % 2) * 4;
    const size_t vseg = vrRound(reqs * n * 4 + 16);
    for (int k = 0; k < nsets; ++k) {
      GT_CUDA(cudaMalloc(&r->in_alloc[k], in_bytes + 64));
      r->in[k] = (char*)r->in_alloc[k] + r->in_off;
      GT_CUDA(cudaMalloc(&r->vin_alloc[k], 4 * vseg));
      char* v = (char*)r->vin_alloc[k] + r->v_off;
      r->p[k] = (int32_t*)v;
      r->ai[k] = (int32_t*)(v + vseg);
      r->al[k] = (int32_t*)(v + 2 * vseg);
      r->lp[k] = (float*)(v + 3 * vseg);
      if (nsets > 1) {
        const size_t so = vrRound(out_bytes), sv = vrRound(full * n * 4);
        GT_CUDA(cudaMalloc(&r->snap_alloc[k], so + 3 * sv + vrRound(full * 4)));
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
    FX_CHECK(r->h_in && r->h_out && r->h_p && r->h_ai && r->h_al && r->h_lp && r->h_po &&
                 r->h_aio && r->h_alo && r->h_lpo,
             "host allocation failed");

    if (backend == VR_NCCL) {
      dpsConfig_t c = DPS_CONFIG_INITIALIZER;
      c.tp_size = tp;
      c.rank = q;
      c.max_pad_bs = g->max_pad_bs;
      c.num_tokens_per_req = cfg->n;
      c.vocab_size = g->vocab;
      c.logits_dtype = cfg->dtype;
      c.backend = dpsBackendNccl;
      c.cuda_device = g_dev;
      c.timeout_ms = timeout_ms;
      FX_CHECK_OK(dpsCommCreateDetached(&r->comm, &c, dpsBackendNccl, &dpsNcclBackendOps));
      r->cctx.g = g;
      r->cctx.rank = q;
      dpsCollectives_t t = {&r->cctx, vrAllGather, vrAllToAll};
      FX_CHECK_OK(dpsCommSetCollectives(r->comm, &t));
      dpsCommInfo_t info;
      FX_CHECK_OK(dpsCommGetInfo(r->comm, &info));
      FX_CHECK(info.initialized == 1 && info.backend == dpsBackendNccl, "detached comm not ready");
    } else {
      VrOs* o = &r->os;
      dpsOsLayout* L = &o->L;
      L->tp = tp;
      L->rank = q;
      L->n = cfg->n;
      L->max_pad_bs = g->max_pad_bs;
      L->vocab = g->vocab;
      L->maxb = vrCap(tp); /* the "agreed" grid cap: the same on every rank */
      L->ll_bytes = cfg->ll_bytes;
      L->gproto = cfg->gproto;
      L->gthreads = DPS_OS_GATHER_THREADS;
      L->max_topk = DPS_TOPK_MAX;
      FX_CHECK_OK(dpsOsLayoutInit(L));
      FX_CHECK_OK(dpsOsLayoutPrepare(L, g->esize));
      GT_CUDA(cudaMalloc(&o->a_mem, L->bytes_a));
      GT_CUDA(cudaMemset(o->a_mem, 0, L->bytes_a));
      GT_CUDA(cudaMalloc(&o->b_mem, L->bytes_b));
      GT_CUDA(cudaMemset(o->b_mem, 0, L->bytes_b));
      const dpsVerifyOutLayout vo = dpsVerifyOutputsLayout(L->max_pad_bs, L->n);
      GT_CUDA(cudaMalloc(&o->out_mem, vo.bytes + L->close_bytes));
      GT_CUDA(cudaMemset(o->out_mem, 0, vo.bytes + L->close_bytes));
      GT_CUDA(cudaMalloc((void**)&o->dstate, sizeof(dpsOsDevState)));
      GT_CUDA(cudaMemset(o->dstate, 0, sizeof(dpsOsDevState)));
      void* h = NULL;
      GT_CUDA(cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
      memset(h, 0, 64);
      o->herr = (volatile unsigned long long*)h;
      GT_CUDA(cudaHostGetDevicePointer((void**)&o->herr_dev, h, 0));
      o->out = dpsOsOutputsOf(L, o->out_mem, (char*)o->out_mem + vo.bytes);
    }
    if (selAlloc(&r->sel, tp, q, g->v_local, g->max_pad_bs * cfg->n, cfg->dtype, r->s)) return 1;
  }
  if (backend == VR_ONESIDED) {
    /* every rank's "peer pointers": the other ranks' allocations */
    for (int q = 0; q < tp; ++q) {
      VrOs* o = &g->r[q].os;
      o->wa.base = (char*)o->a_mem;
      o->wb.base = (char*)o->b_mem;
      for (int p = 0; p < tp; ++p) {
        o->wa.peer[p] = (char*)g->r[p].os.a_mem;
        o->wb.peer[p] = (char*)g->r[p].os.b_mem;
      }
      o->common =
          dpsOsMakeCommon(&o->L, &o->wa, o->dstate, o->herr_dev, timeout_ms, cfg->pdl && g_pdl_ok);
    }
  }
  GT_CUDA(cudaDeviceSynchronize());
  return 0;
}

/* ---- operations of one rank (its own thread, its own stream) ------------------ */
static const char* vrErrWait(int w) {
  switch (w) {
    case DPS_OS_WAIT_READY: return "ready flag";
    case DPS_OS_WAIT_DONE: return "completion flag";
    case DPS_OS_WAIT_DATA: return "data";
    case DPS_OS_WAIT_PEER_FAILED: return "peer reported its own failure";
    default: return "?";
  }
}

/* onesided: the rank's error word must be clear */
static int vrCheckErrWord(VrGroup* g, int rank, const char* what) {
  if (g->backend != VR_ONESIDED) return 0;
  const unsigned long long w = *g->r[rank].os.herr;
  if (w == 0) return 0;
  fprintf(stderr,
          "%s rank %d: %s: dpsTimeout: error word 0x%llx (op %d, peer %d, waiting for its %s)\n",
          g->desc, rank, what, w, DPS_OS_ERR_OP(w), DPS_OS_ERR_PEER(w), vrErrWait(DPS_OS_ERR_WAIT(w)));
  return vrCount(g, 0);
}

static int vrSwap(VrGroup* g, int rank, const void* in, int pad_bs, void** out) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_NCCL) {
    FX_CHECK_OK(dpsSwapBatchVocab(r->comm, in, (int64_t)pad_bs * g->cfg.n, g->v_local,
                                  g->cfg.dtype, pad_bs, out, r->s));
    return 0;
  }
  dpsOsSwapArgs a;
  dpsOsSwapPlan p;
  const dpsShape sh = dpsMakeShape(g->tp, rank, pad_bs, g->cfg.n, g->vocab, g->esize);
  dpsOsPlanSwap(&r->os.L, &r->os.common, &r->os.wa, &r->os.wb, in, &sh, &a, &p);
  r->paths_seen |= 1 << p.path;
  r->widths_seen |= (unsigned)p.width;
  FX_CHECK(p.grid >= 1 && p.grid <= r->os.L.maxb, "swap grid %d, cap %d", p.grid, r->os.L.maxb);
  GT_CUDA(dpsOsLaunchSwap(&a, p.path, p.width, p.grid, r->s));
  *out = r->os.wb.base;
  return 0;
}

static int vrGatherOutputs(VrGroup* g, int rank, int set, int pad_bs, int32_t** po,
                           int32_t** aio, int32_t** alo) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_NCCL) {
    FX_CHECK_OK(dpsGatherVerifyOutputs(r->comm, r->p[set], r->ai[set], r->al[set], pad_bs / g->tp,
                                       g->cfg.n, pad_bs, po, aio, alo, r->s));
    return 0;
  }
  dpsOsGatherArgs a;
  const dpsShape sh = dpsMakeShape(g->tp, rank, pad_bs, g->cfg.n, g->vocab, sizeof(int32_t));
  const int grid = dpsOsPlanGatherOutputs(&r->os.L, &r->os.common, &r->os.wa, &r->os.out,
                                          r->p[set], r->ai[set], r->al[set], &sh, &a);
  FX_CHECK(grid >= 1 && grid <= r->os.L.maxb, "gather grid %d, cap %d", grid, r->os.L.maxb);
  GT_CUDA(dpsOsLaunchGather(&a, r->os.L.gproto, grid, r->os.L.gthreads, r->s));
  *po = r->os.out.predict;
  *aio = r->os.out.accept_index;
  *alo = r->os.out.accept_length;
  return 0;
}

static int vrGatherLogprobs(VrGroup* g, int rank, int set, int pad_bs, float** lpo) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_NCCL) {
    FX_CHECK_OK(dpsGatherVerifyLogprobs(r->comm, r->lp[set], pad_bs / g->tp, g->cfg.n, pad_bs, lpo,
                                        r->s));
    return 0;
  }
  dpsOsGatherArgs a;
  const dpsShape sh = dpsMakeShape(g->tp, rank, pad_bs, g->cfg.n, g->vocab, sizeof(float));
  const int grid =
      dpsOsPlanGatherLogprobs(&r->os.L, &r->os.common, &r->os.wa, &r->os.out, r->lp[set], &sh, &a);
  FX_CHECK(grid >= 1 && grid <= r->os.L.maxb, "gather grid %d, cap %d", grid, r->os.L.maxb);
  GT_CUDA(dpsOsLaunchGather(&a, r->os.L.gproto, grid, r->os.L.gthreads, r->s));
  *lpo = r->os.out.logprobs;
  return 0;
}

/* Inputs of (pad_bs, step) into set `set` (waits for the copies). */
static int vrUpload(VrGroup* g, int rank, int set, int pad_bs, int step) {
  VrRank* r = &g->r[rank];
  const size_t reqs = (size_t)(pad_bs / g->tp), n = (size_t)g->cfg.n;
  fxFillSwapInput(r->h_in, g->tp, rank, pad_bs, g->cfg.n, g->vocab, g->cfg.dtype, step);
  GT_CUDA(cudaMemcpyAsync(r->in[set], r->h_in, vrInBytes(g, pad_bs), cudaMemcpyHostToDevice, r->s));
  GT_CUDA(cudaStreamSynchronize(r->s)); /* h_in is refilled for the next set */
  fxFillVerifyInputs(r->h_p, r->h_ai, r->h_al, r->h_lp, g->tp, rank, pad_bs, g->cfg.n, step);
  GT_CUDA(cudaMemcpyAsync(r->p[set], r->h_p, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  GT_CUDA(cudaMemcpyAsync(r->ai[set], r->h_ai, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  GT_CUDA(cudaMemcpyAsync(r->al[set], r->h_al, reqs * 4, cudaMemcpyHostToDevice, r->s));
  GT_CUDA(cudaMemcpyAsync(r->lp[set], r->h_lp, reqs * n * 4, cudaMemcpyHostToDevice, r->s));
  GT_CUDA(cudaStreamSynchronize(r->s));
  return 0;
}

/* Downloads and checks every output of one call (the stream's work is done). */
static int vrCheckCall(VrGroup* g, int rank, const void* out, const int32_t* po, const int32_t* aio,
                       const int32_t* alo, const float* lpo, int pad_bs, int step, const char* what) {
  VrRank* r = &g->r[rank];
  const size_t n = (size_t)g->cfg.n;
  int bad = 0;
  GT_CUDA(cudaMemcpyAsync(r->h_out, out, vrOutBytes(g, pad_bs), cudaMemcpyDeviceToHost, r->s));
  GT_CUDA(cudaMemcpyAsync(r->h_po, po, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  GT_CUDA(cudaMemcpyAsync(r->h_aio, aio, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  GT_CUDA(cudaMemcpyAsync(r->h_alo, alo, (size_t)pad_bs * 4, cudaMemcpyDeviceToHost, r->s));
  GT_CUDA(cudaMemcpyAsync(r->h_lpo, lpo, (size_t)pad_bs * n * 4, cudaMemcpyDeviceToHost, r->s));
  GT_CUDA(cudaStreamSynchronize(r->s));
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

/* One call of the three operations on set `set`, enqueued; outputs returned. */
static int vrCall(VrGroup* g, int rank, int set, int pad_bs, void** out, int32_t** po,
                  int32_t** aio, int32_t** alo, float** lpo) {
  if (vrSwap(g, rank, g->r[rank].in[set], pad_bs, out)) return 1;
  if (vrGatherOutputs(g, rank, set, pad_bs, po, aio, alo)) return 1;
  return vrGatherLogprobs(g, rank, set, pad_bs, lpo);
}

/* Upload, meet, call, wait, check, meet: one eager round. */
static int vrEagerRound(VrGroup* g, int rank, int pad_bs, int step, const char* what) {
  void* out = NULL;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  if (vrUpload(g, rank, 0, pad_bs, step) || vrBarrier(g)) return 1;
  if (vrCall(g, rank, 0, pad_bs, &out, &po, &aio, &alo, &lpo)) return 1;
  GT_CUDA(cudaStreamSynchronize(g->r[rank].s));
  if (vrCheckErrWord(g, rank, what)) return 1;
  if (vrCheckCall(g, rank, out, po, aio, alo, lpo, pad_bs, step, what)) return 1;
  return vrBarrier(g);
}

/* ---- scenarios (run by every rank's thread) ---------------------------------- */
typedef int (*VrBody)(VrGroup* g, int rank, const void* arg);

/* requests per rank of call c: changes on every call */
static int vrReqs(int mr, int c) {
  const int seq[6] = {mr, 1, mr / 2 + 1, 2, mr, 3};
  int v = seq[c % 6];
  return v < 1 ? 1 : v > mr ? mr : v;
}

static int bodyShapes(VrGroup* g, int rank, const void* arg) {
  (void)arg;
  const int calls = 6;
  for (int c = 0; c < calls; ++c) {
    const int pad = g->tp * vrReqs(g->cfg.mr, c);
    if (vrEagerRound(g, rank, pad, 11 + c, "shapes")) return 1;
  }
  VrRank* r = &g->r[rank];
  if (g->backend == VR_ONESIDED && g->cfg.cross && g->cfg.ll_bytes == VR_LL_DEFAULT &&
      vrCount(g, r->paths_seen == 3)) {
    fprintf(stderr, "%s rank %d: the swap never crossed the LL/direct switch (paths seen 0x%x)\n",
            g->desc, rank, r->paths_seen);
    return 1;
  }
  return 0;
}

typedef struct {
  int delay_ms;
} VrRunaheadArg;

static int bodyRunahead(VrGroup* g, int rank, const void* argp) {
  const VrRunaheadArg* arg = (const VrRunaheadArg*)argp;
  VrRank* r = &g->r[rank];
  const int K = g->nsets, delayed = g->tp - 1;
  const size_t n = (size_t)g->cfg.n;
  int pads[VR_MAX_SETS];
  for (int k = 0; k < K; ++k) {
    pads[k] = g->tp * vrReqs(g->cfg.mr, k);
    if (vrUpload(g, rank, k, pads[k], 31 + k)) return 1;
  }
  if (vrBarrier(g)) return 1;
  for (int k = 0; k < K; ++k) {
    void* out = NULL;
    int32_t *po = NULL, *aio = NULL, *alo = NULL;
    float* lpo = NULL;
    if (rank == delayed) GT_CUDA(vrLaunchSpin((unsigned long long)arg->delay_ms * 1000000ull, r->s));
    if (vrSwap(g, rank, r->in[k], pads[k], &out)) return 1;
    GT_CUDA(cudaMemcpyAsync(r->snap_out[k], out, vrOutBytes(g, pads[k]), cudaMemcpyDeviceToDevice,
                            r->s));
    if (vrGatherOutputs(g, rank, k, pads[k], &po, &aio, &alo)) return 1;
    GT_CUDA(cudaMemcpyAsync(r->snap_p[k], po, (size_t)pads[k] * n * 4, cudaMemcpyDeviceToDevice, r->s));
    GT_CUDA(cudaMemcpyAsync(r->snap_ai[k], aio, (size_t)pads[k] * n * 4, cudaMemcpyDeviceToDevice,
                            r->s));
    GT_CUDA(cudaMemcpyAsync(r->snap_al[k], alo, (size_t)pads[k] * 4, cudaMemcpyDeviceToDevice, r->s));
    if (vrGatherLogprobs(g, rank, k, pads[k], &lpo)) return 1;
    GT_CUDA(cudaMemcpyAsync(r->snap_lp[k], lpo, (size_t)pads[k] * n * 4, cudaMemcpyDeviceToDevice,
                            r->s));
  }
  GT_CUDA(cudaStreamSynchronize(r->s));
  if (vrCheckErrWord(g, rank, "runahead")) return 1;
  for (int k = 0; k < K; ++k)
    if (vrCheckCall(g, rank, r->snap_out[k], r->snap_p[k], r->snap_ai[k], r->snap_al[k],
                    r->snap_lp[k], pads[k], 31 + k, "runahead"))
      return 1;
  return vrBarrier(g);
}

/* Captures one call of pad_bs on set 0. onesided: each rank its own graph.
 * nccl: one graph over every rank's stream, captured from rank 0's. */
static int vrCapture(VrGroup* g, int rank, int pad_bs, void** out, int32_t** po, int32_t** aio,
                     int32_t** alo, float** lpo) {
  VrRank* r = &g->r[rank];
  if (g->backend == VR_ONESIDED) {
    GT_CUDA(cudaStreamBeginCapture(r->s, cudaStreamCaptureModeRelaxed));
    const int rc = vrCall(g, rank, 0, pad_bs, out, po, aio, alo, lpo);
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(r->s, &graph);
    r->graph = graph;
    if (rc) return 1;
    GT_CUDA(e);
    GT_CUDA(cudaGraphInstantiate(&r->exec, r->graph, 0));
    return vrBarrier(g); /* no rank replays while another still captures */
  }
  VrRank* r0 = &g->r[0];
  if (rank == 0) {
    GT_CUDA(cudaStreamBeginCapture(r0->s, cudaStreamCaptureModeRelaxed));
    GT_CUDA(cudaEventRecord(g->fork, r0->s));
  }
  int rc = vrBarrier(g);
  if (!rc && rank != 0) rc = cudaStreamWaitEvent(r->s, g->fork, 0) != cudaSuccess;
  if (!rc) rc = vrCall(g, rank, 0, pad_bs, out, po, aio, alo, lpo);
  if (!rc && rank != 0) rc = cudaEventRecord(g->join[rank], r->s) != cudaSuccess;
  if (rc) vrAbort(g);
  if (!rc) rc = vrBarrier(g);
  if (rank == 0) {
    for (int q = 1; q < g->tp && !rc; ++q)
      rc = cudaStreamWaitEvent(r0->s, g->join[q], 0) != cudaSuccess;
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(r0->s, &graph); /* also after a failure */
    r0->graph = graph;
    if (!rc && e != cudaSuccess) {
      fprintf(stderr, "%s: cudaStreamEndCapture: %s\n", g->desc, cudaGetErrorString(e));
      rc = 1;
    }
    if (!rc) rc = cudaGraphInstantiate(&r0->exec, r0->graph, 0) != cudaSuccess;
    if (rc) vrAbort(g);
  }
  FX_CHECK(!rc, "%s rank %d: capture failed", g->desc, rank);
  return vrBarrier(g);
}

static int bodyGraph(VrGroup* g, int rank, const void* arg) {
  (void)arg;
  VrRank* r = &g->r[rank];
  const int pad = g->tp * (g->cfg.mr / 2 + 1), eager_pad = g->tp * 2;
  void* out = NULL;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  if (vrUpload(g, rank, 0, pad, 50) || vrBarrier(g)) return 1;
  if (vrCapture(g, rank, pad, &out, &po, &aio, &alo, &lpo)) return 1;
  const int replays = g_full ? 5 : 3;
  for (int k = 0; k < replays; ++k) {
    const int step = 60 + k;
    if (vrUpload(g, rank, 0, pad, step) || vrBarrier(g)) return 1;
    if (g->backend == VR_ONESIDED) {
      GT_CUDA(cudaGraphLaunch(r->exec, r->s));
      GT_CUDA(cudaStreamSynchronize(r->s));
    } else if (rank == 0) {
      GT_CUDA(cudaGraphLaunch(r->exec, r->s));
      GT_CUDA(cudaStreamSynchronize(r->s));
    }
    if (vrBarrier(g)) return 1; /* nccl: rank 0's graph ran every rank's work */
    if (vrCheckErrWord(g, rank, "graph replay")) return 1;
    if (vrCheckCall(g, rank, out, po, aio, alo, lpo, pad, step, "graph replay")) return 1;
    if (vrBarrier(g)) return 1;
    if (k == 1 && vrEagerRound(g, rank, eager_pad, 70, "eager call between replays")) return 1;
  }
  return 0;
}

typedef struct {
  int op, stopped;
} VrTimeoutArg;

static const char* kOpNames[4] = {"swap (LL path)", "swap (direct path)", "gather_verify_outputs",
                                  "gather_verify_logprobs"};

static int vrOneOp(VrGroup* g, int rank, int op, int pad) {
  void* out = NULL;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  if (op <= VR_OP_SWAP_DIRECT) return vrSwap(g, rank, g->r[rank].in[0], pad, &out);
  if (op == VR_OP_OUTPUTS) return vrGatherOutputs(g, rank, 0, pad, &po, &aio, &alo);
  return vrGatherLogprobs(g, rank, 0, pad, &lpo);
}

static int bodyTimeout(VrGroup* g, int rank, const void* argp) {
  const VrTimeoutArg* a = (const VrTimeoutArg*)argp;
  VrRank* r = &g->r[rank];
  const int pad = g->tp * (a->op == VR_OP_SWAP_LL ? 1 : g->cfg.mr);
  /* every rank makes one call of each operation, checked */
  if (vrEagerRound(g, rank, pad, 81, "timeout warm-up")) return 1;
  if (a->op <= VR_OP_SWAP_DIRECT &&
      vrCount(g, r->paths_seen == (a->op == VR_OP_SWAP_LL ? 2 : 1)) != 0) {
    fprintf(stderr, "%s rank %d: the warm-up swap took the wrong path (0x%x)\n", g->desc, rank,
            r->paths_seen);
    return 1;
  }
  if (vrUpload(g, rank, 0, pad, 82) || vrBarrier(g)) return 1;
  const double limit = g->timeout_ms / 1000.0 + (g->timeout_ms < 2000 ? 1.0 : g->timeout_ms / 2000.0);
  if (rank != a->stopped) {
    const double t0 = vrNow();
    if (vrOneOp(g, rank, a->op, pad)) return 1;
    while (*r->os.herr == 0 && vrNow() - t0 < limit) vrSleepMs(1);
    r->stall_s = vrNow() - t0;
    GT_CUDA(cudaStreamSynchronize(r->s)); /* the kernel gave up */
  }
  if (vrBarrier(g)) return 1;
  const unsigned long long mine = *r->os.herr;
  if (rank == a->stopped) {
    if (vrCount(g, mine == 0)) {
      fprintf(stderr, "%s: the stopped rank %d has error word 0x%llx\n", g->desc, rank, mine);
      return 1;
    }
    return vrBarrier(g);
  }
  const int want_op = a->op <= VR_OP_SWAP_DIRECT ? DPS_OS_OP_SWAP
                      : a->op == VR_OP_OUTPUTS   ? DPS_OS_OP_GATHER_OUTPUTS
                                                 : DPS_OS_OP_GATHER_LOGPROBS;
  /* The rank names the stopped one, or a rank that gave up before it and
   * whose own word (followed the same way) names the stopped one. */
  int cur = rank, ok = 0, hops = 0;
  unsigned long long w = mine;
  for (; hops <= g->tp; ++hops) {
    w = *g->r[cur].os.herr;
    if (!(w & DPS_OS_ERR_SET) || DPS_OS_ERR_OP(w) != want_op) break;
    if (DPS_OS_ERR_WAIT(w) != DPS_OS_WAIT_PEER_FAILED) {
      ok = DPS_OS_ERR_PEER(w) == a->stopped &&
           (DPS_OS_ERR_WAIT(w) == DPS_OS_WAIT_DATA || DPS_OS_ERR_WAIT(w) == DPS_OS_WAIT_READY ||
            DPS_OS_ERR_WAIT(w) == DPS_OS_WAIT_DONE);
      break;
    }
    const int next = DPS_OS_ERR_PEER(w);
    if (next < 0 || next >= g->tp || next == cur || next == a->stopped) break;
    cur = next;
  }
  const double tmo = g->timeout_ms / 1000.0;
  const int in_time = r->stall_s <= limit && r->stall_s >= 0.8 * tmo;
  if (vrCount(g, ok && in_time)) {
    fprintf(stderr,
            "%s rank %d: %s with rank %d stopped: error word 0x%llx (op %d, peer %d, %s; chain "
            "ends at rank %d word 0x%llx), set after %.3f s (timeout %.3f s, limit %.3f s)\n",
            g->desc, rank, kOpNames[a->op], a->stopped, mine, DPS_OS_ERR_OP(mine),
            DPS_OS_ERR_PEER(mine), vrErrWait(DPS_OS_ERR_WAIT(mine)), cur, w, r->stall_s, tmo, limit);
    return 1;
  }
  return vrBarrier(g);
}

/* ---- the runner ---------------------------------------------------------------- */
typedef struct {
  VrGroup* g;
  int rank;
  VrBody fn;
  const void* arg;
  int rc;
} VrThreadArg;

static void* vrThreadMain(void* p) {
  VrThreadArg* a = (VrThreadArg*)p;
  cudaError_t e = cudaSetDevice(g_dev);
  if (e != cudaSuccess) {
    fprintf(stderr, "rank %d: cudaSetDevice: %s\n", a->rank, cudaGetErrorString(e));
    a->rc = 1;
  } else {
    a->rc = a->fn(a->g, a->rank, a->arg);
  }
  if (a->rc) vrAbort(a->g);
  return NULL;
}

typedef struct {
  long passed, failed, skipped;
} VrTally;

/* Creates the group, runs fn on every rank's thread, destroys the group. */
static void vrRunGroup(VrTally* t, int tp, int backend, const VrCfg* cfg, int timeout_ms, int nsets,
                       int variant, VrBody fn, const void* arg, const char* scenario) {
  VrGroup* g = (VrGroup*)calloc(1, sizeof(VrGroup));
  if (g == NULL) {
    fprintf(stderr, "out of host memory\n");
    t->failed++;
    return;
  }
  int rc = vrGroupCreate(g, tp, backend, cfg, timeout_ms, nsets, variant);
  if (rc) {
    fprintf(stderr, "%s: %s: creating the virtual ranks failed\n", g->desc, scenario);
  } else {
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
  }
  rc |= vrGroupDestroy(g);
  if (rc && g->failed == 0) g->failed = 1; /* a failure outside the value checks */
  if (rc) fprintf(stderr, "FAIL %s: %s\n", scenario, g->desc);
  t->passed += g->passed;
  t->failed += g->failed;
  free(g);
}

static int vrSkipLarge(int tp, const VrCfg* c) {
  const int v = c->v_local > 0 ? c->v_local : VR_REAL_VOCAB / tp;
  return gtSkipLarge("test_gpu_virtual_ranks", (int64_t)tp * c->mr, c->n, (int64_t)tp * v);
}

static void runShapes(VrTally* t, int tp, int backend) {
  static const dpsDataType_t dtypes[3] = {dpsFloat32, dpsBfloat16, dpsFloat16};
  static const int vls[5] = {1, 7, 33, 1001, 0};
  static const int ns[3] = {1, 3, 8};
  /* reduced: every dtype, V/tp and N at least once; both gather protocols, PDL
   * on and off; V/tp=1001 N=8 crosses the swap's LL/direct switch */
  static const VrCfg kDefault[] = {
      {dpsFloat32, 1, 8, 24, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 7, 3, 24, DPS_OS_PROTO_LL128, 1, VR_LL_DEFAULT, 0},
      {dpsFloat16, 33, 1, 24, DPS_OS_PROTO_LL, 0, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 1001, 8, 24, DPS_OS_PROTO_LL128, 1, VR_LL_DEFAULT, 1},
      {dpsBfloat16, 0, 1, 4, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
  };
  int variant = 0;
  if (!g_full) {
    for (size_t i = 0; i < sizeof kDefault / sizeof kDefault[0]; ++i) {
      VrCfg c = kDefault[i];
      if (c.gproto == DPS_OS_PROTO_LL128 && g_major < 9) c.gproto = DPS_OS_PROTO_LL;
      if (vrSkipLarge(tp, &c)) {
        t->skipped++;
        continue;
      }
      vrRunGroup(t, tp, backend, &c, g_timeout_ms, 1, variant++, bodyShapes, NULL, "shapes");
    }
    return;
  }
  for (int d = 0; d < 3; ++d)
    for (int v = 0; v < 5; ++v)
      for (int k = 0; k < 3; ++k) {
        VrCfg base = {dtypes[d], vls[v], ns[k], vls[v] == 0 ? 4 : 24, DPS_OS_PROTO_LL, 1,
                      VR_LL_DEFAULT, vls[v] == 1001 && ns[k] == 8};
        if (vrSkipLarge(tp, &base)) {
          t->skipped++;
          continue;
        }
        if (backend == VR_NCCL) {
          vrRunGroup(t, tp, backend, &base, g_timeout_ms, 1, variant++, bodyShapes, NULL, "shapes");
          continue;
        }
        /* {LL, LL128} x {PDL on, off}, then forced direct / forced LL swaps */
        for (int m = 0; m < 6; ++m) {
          VrCfg c = base;
          if (m < 4) {
            c.gproto = (m & 1) ? DPS_OS_PROTO_LL128 : DPS_OS_PROTO_LL;
            c.pdl = (m & 2) ? 0 : 1;
          } else {
            if (vls[v] != 33 && vls[v] != 1001) continue;
            c.ll_bytes = m == 4 ? 0 : VR_LL_ALWAYS;
          }
          if (c.gproto == DPS_OS_PROTO_LL128 && g_major < 9) continue;
          vrRunGroup(t, tp, backend, &c, g_timeout_ms, 1, variant++, bodyShapes, NULL, "shapes");
        }
      }
}

/* Variant m of a scenario's configuration: 0 as given, 1 PDL off, 2 LL128
 * gathers (the full onesided matrix runs all three). 0 when the variant
 * does not apply here (LL128 before sm_90). */
static int vrVariants(int backend) { return backend == VR_ONESIDED && g_full ? 3 : 1; }
static int vrVariant(const VrCfg* base, int m, VrCfg* c) {
  *c = *base;
  if (m == 1) c->pdl = 0;
  if (m == 2) {
    if (g_major < 9) return 0;
    c->gproto = DPS_OS_PROTO_LL128;
  }
  return 1;
}

static void runRunahead(VrTally* t, int tp, int backend) {
  const VrCfg base = {dpsBfloat16, 33, 3, 8, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0};
  VrRunaheadArg arg = {g_full ? 20 : 5};
  for (int m = 0; m < vrVariants(backend); ++m) {
    VrCfg c;
    if (!vrVariant(&base, m, &c)) continue;
    if (vrSkipLarge(tp, &c)) {
      t->skipped++;
      continue;
    }
    vrRunGroup(t, tp, backend, &c, g_timeout_ms, VR_MAX_SETS, m, bodyRunahead, &arg, "runahead");
  }
}

static void runGraph(VrTally* t, int tp, int backend) {
  const VrCfg base = {dpsFloat16, 7, 3, 8, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0};
  for (int m = 0; m < vrVariants(backend); ++m) {
    VrCfg c;
    if (!vrVariant(&base, m, &c)) continue;
    vrRunGroup(t, tp, backend, &c, g_timeout_ms, 1, m, bodyGraph, NULL, "graph");
  }
}

static void runTimeout(VrTally* t, int tp, int backend) {
  if (backend != VR_ONESIDED) return; /* reported as n/a by the caller */
  for (int op = 0; op < 4; ++op) {
    if (!g_full && op != (tp - 2) % 4) continue; /* reduced: one operation per tp */
    VrCfg c = {dpsBfloat16, 33, 3, 8, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0};
    if (op == VR_OP_SWAP_LL) c.ll_bytes = VR_LL_ALWAYS;
    if (op == VR_OP_SWAP_DIRECT) c.ll_bytes = 0;
    VrTimeoutArg arg = {op, (op * 3 + 1) % tp};
    const long before = t->failed;
    const double t0 = vrNow();
    vrRunGroup(t, tp, backend, &c, g_timeout_ms, 1, op, bodyTimeout, &arg, "timeout");
    printf("  tp=%d onesided timeout: %s, rank %d stopped calling: %s (%.1f s)\n", tp,
           kOpNames[op], arg.stopped,
           t->failed == before ? "every other rank's error names it" : "FAILED", vrNow() - t0);
  }
}

/* ---- select: argmax / top-k --------------------------------------------------- */
/* One argmax (k == 0) or top-k call of one rank on its stream. */
static int vrSelect(VrGroup* g, int rank, int rows, int64_t limit, int k, int want_lse) {
  VrRank* r = &g->r[rank];
  SelBufs* b = &r->sel;
  if (g->backend == VR_NCCL) {
    if (k == 0)
      FX_CHECK_OK(dpsArgmax(r->comm, b->d_in, rows, g->v_local, g->cfg.dtype, limit, b->d_val,
                            b->d_idx, want_lse ? b->d_lse : NULL, r->s));
    else
      FX_CHECK_OK(dpsTopK(r->comm, b->d_in, rows, g->v_local, g->cfg.dtype, k, limit, b->d_tval,
                          b->d_tidx, r->s));
    return 0;
  }
  dpsSelectCall call;
  memset(&call, 0, sizeof call);
  call.k = k;
  call.rows = rows;
  call.dtype = g->cfg.dtype;
  call.vocab_limit = limit;
  call.logits = b->d_in;
  call.index = k ? b->d_tidx : b->d_idx;
  call.value = k ? b->d_tval : b->d_val;
  call.lse = k == 0 && want_lse ? b->d_lse : NULL;
  dpsSelLocalArgs a;
  dpsSelMergeArgs m;
  dpsOsPlanSelect(&r->os.L, &r->os.common, &r->os.wa, &call, vrCap(g->tp), &g_sel_waves,
                  r->os.common.pdl, &a, &m);
  FX_CHECK_OK(dpsSelLaunchLocal(&a, k, r->s));
  FX_CHECK_OK(dpsSelLaunchMerge(&m, k, r->s));
  return 0;
}

/* rows and vocab_limit change on every call: the whole capacity, one row,
 * odd counts; the limit at V, inside the last shard, on the first shard
 * boundary, 1, and inside a middle shard. */
static int bodySelect(VrGroup* g, int rank, const void* arg) {
  (void)arg;
  VrRank* r = &g->r[rank];
  const int max_rows = g->max_pad_bs * g->cfg.n;
  const int64_t V = g->vocab, vl = g->v_local;
  const int64_t limits[6] = {V, V - 1, vl, 1, vl * (g->tp / 2) + (vl + 1) / 2, V};
  const int rows_seq[6] = {max_rows, 1, 5, max_rows / 2, 3, max_rows - 1};
  static const int ks[3] = {1, 7, DPS_TOPK_MAX};
  char what[400];
  for (int c = 0; c < 6; ++c) {
    int rows = rows_seq[c];
    rows = rows < 1 ? 1 : rows > max_rows ? max_rows : rows;
    const int64_t limit = limits[c] < 1 ? 1 : limits[c] > V ? V : limits[c];
    const int step = 200 + c;
    /* every rank starts each call together: a rank still checking the last
     * one on the host would otherwise count against its peers' timeout */
    if (vrBarrier(g)) return 1;
    if (selUpload(&r->sel, rows, step)) return 1;
    const int want_lse = c != 3;
    if (vrSelect(g, rank, rows, limit, 0, want_lse) || vrCheckErrWord(g, rank, "argmax"))
      return 1;
    snprintf(what, sizeof what, "%s rank %d: argmax rows=%d limit=%lld", g->desc, rank, rows,
             (long long)limit);
    if (vrCount(g, selCheck(&r->sel, rows, step, limit, 0, want_lse, what) == 0)) return 1;
    for (int ki = 0; ki < 3; ++ki) {
      const int k = ks[ki];
      if (k > limit) continue;
      if (vrSelect(g, rank, rows, limit, k, 0) || vrCheckErrWord(g, rank, "topk")) return 1;
      snprintf(what, sizeof what, "%s rank %d: top-%d rows=%d limit=%lld", g->desc, rank, k, rows,
               (long long)limit);
      if (vrCount(g, selCheck(&r->sel, rows, step, limit, k, 0, what) == 0)) return 1;
    }
  }
  return 0;
}

static void runSelect(VrTally* t, int tp, int backend) {
  static const VrCfg kCfgs[] = {
      {dpsBfloat16, 1, 3, 4, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
      {dpsFloat32, 33, 1, 8, DPS_OS_PROTO_LL, 0, VR_LL_DEFAULT, 0},
      {dpsFloat16, 1001, 8, 2, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 0, 1, 4, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
      {dpsFloat32, 7, 3, 4, DPS_OS_PROTO_LL, 1, VR_LL_DEFAULT, 0},
  };
  const int n = g_full ? 5 : 3;
  for (int i = 0; i < n; ++i) {
    VrCfg c = kCfgs[g_full ? i : (i == 2 ? 3 : i)];
    if (vrSkipLarge(tp, &c)) {
      t->skipped++;
      continue;
    }
    vrRunGroup(t, tp, backend, &c, g_timeout_ms, 1, i, bodySelect, NULL, "select");
  }
}

/* ---- main ------------------------------------------------------------------------ */
static void vrWatchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_gpu_virtual_ranks: watchdog: the run exceeded DPS_VR_WATCHDOG_S; "
                            "aborting (a hang would be a bug of the harness or the kernels)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(124);
}

static int vrParseTps(const char* s) {
  memset(g_tps, 0, sizeof g_tps);
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
    for (long k = a; k <= b; ++k) g_tps[k] = 1;
    if (*s == ',') ++s;
    else if (*s) return -1;
  }
  return 0;
}

static int vrParseScenarios(const char* s) {
  if (strcmp(s, "all") == 0) {
    g_scenarios = VR_SC_SHAPES | VR_SC_RUNAHEAD | VR_SC_GRAPH | VR_SC_TIMEOUT | VR_SC_SELECT;
    return 0;
  }
  g_scenarios = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", s);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (strcmp(tok, "shapes") == 0) g_scenarios |= VR_SC_SHAPES;
    else if (strcmp(tok, "runahead") == 0) g_scenarios |= VR_SC_RUNAHEAD;
    else if (strcmp(tok, "graph") == 0) g_scenarios |= VR_SC_GRAPH;
    else if (strcmp(tok, "timeout") == 0) g_scenarios |= VR_SC_TIMEOUT;
    else if (strcmp(tok, "select") == 0) g_scenarios |= VR_SC_SELECT;
    else return -1;
  }
  return g_scenarios ? 0 : -1;
}

static int vrParseBackend(const char* s) {
  if (strcmp(s, "all") == 0) g_backends = 3;
  else if (strcmp(s, "nccl") == 0) g_backends = 1 << VR_NCCL;
  else if (strcmp(s, "onesided") == 0) g_backends = 1 << VR_ONESIDED;
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
          "[scenario=shapes,runahead,graph,timeout,select|all] [full] [small]\n",
          bad);
  return 2;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int k = 2; k <= VR_MAX_TP; ++k) g_tps[k] = 1;
  const char* e;
  if ((e = getenv("DPS_VR_TP")) && *e && vrParseTps(e)) return vrUsage(e);
  if ((e = getenv("DPS_VR_BACKEND")) && *e && vrParseBackend(e)) return vrUsage(e);
  if ((e = getenv("DPS_VR_SCENARIO")) && *e && vrParseScenarios(e)) return vrUsage(e);
  g_full = vrEnvOn("DPS_VR_FULL");
  g_small = vrEnvOn("DPS_TEST_SMALL");
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
      g_full = 1;
    } else if (strcmp(a, "small") == 0) {
      g_small = 1;
      setenv("DPS_TEST_SMALL", "1", 1); /* gtSkipLarge reads it */
    } else {
      return vrUsage(argv[i]);
    }
  }
  if (g_small) g_timeout_ms = 20000; /* sanitized kernels are slow */
  uint64_t v = 0;
  if (dpsEnvUint("DPS_VR_TIMEOUT_MS", &v) > 0 && v > 0 && v <= 600000) g_timeout_ms = (int)v;
  if (dpsEnvUint("DPS_VR_BLOCKS", &v) > 0 && v > 0 && v <= 1024) g_blocks_override = (int)v;
  uint64_t wd = g_small ? 1800 : 600;
  if (dpsEnvUint("DPS_VR_WATCHDOG_S", &wd) < 0) wd = 600;

  const int ngpu = fxGpuCount();
  if (ngpu < 1) {
    printf("test_gpu_virtual_ranks: SKIP: needs a GPU, found none\n");
    return 77;
  }
  if (wd > 0) {
    signal(SIGALRM, vrWatchdog);
    alarm((unsigned)wd);
  }
  GT_CUDA(cudaSetDevice(g_dev));
  struct cudaDeviceProp prop;
  GT_CUDA(cudaGetDeviceProperties(&prop, g_dev));
  g_sms = prop.multiProcessorCount;
  g_major = prop.major;
  /* Load every kernel before the first launch (lazy module loading). */
  GT_CUDA(dpsOsPreloadSwapKernels());
  GT_CUDA(dpsOsPreloadGatherKernels());
  GT_CUDA(dpsPreloadSelectKernels());
  dpsSelPlanInit(&g_sel_waves);
  GT_CUDA(vrPreloadSpin());
  if (dpsNcclBackendOps.preload) FX_CHECK_OK(dpsNcclBackendOps.preload());
  GT_CUDA(dpsOsKernelsSupportPdl(&g_pdl_ok));
  printf("test_gpu_virtual_ranks: device %d %s (%d SMs, sm_%d%d), matrix %s%s, timeout %d ms, "
         "PDL %s, LL128 %s\n",
         g_dev, prop.name, g_sms, prop.major, prop.minor, g_full ? "full" : "reduced",
         g_small ? " (small shapes)" : "", g_timeout_ms,
         g_pdl_ok ? "available" : "unavailable (device code before sm_90): every run without",
         g_major >= 9 ? "on" : "skipped (before sm_90)");
  printf("  grid cap per rank (all ranks' blocks and PDL dependants co-resident):");
  for (int tp = 2; tp <= VR_MAX_TP; ++tp)
    if (g_tps[tp]) printf(" tp=%d:%d", tp, vrCap(tp));
  printf("\n");

  long tot_pass = 0, tot_fail = 0;
  for (int tp = 2; tp <= VR_MAX_TP; ++tp) {
    if (!g_tps[tp]) continue;
    for (int b = 0; b < 2; ++b) {
      if (!(g_backends & (1 << b))) continue;
      VrTally t = {0, 0, 0};
      const double t0 = vrNow();
      if (g_scenarios & VR_SC_SHAPES) runShapes(&t, tp, b);
      if (g_scenarios & VR_SC_RUNAHEAD) runRunahead(&t, tp, b);
      if (g_scenarios & VR_SC_GRAPH) runGraph(&t, tp, b);
      if (g_scenarios & VR_SC_TIMEOUT) runTimeout(&t, tp, b);
      if (g_scenarios & VR_SC_SELECT) runSelect(&t, tp, b);
      printf("tp=%d %s: %ld passed, %ld failed", tp, vrBackendName(b), t.passed, t.failed);
      if (t.skipped) printf(", %ld shapes skipped (small)", t.skipped);
      if (b == VR_NCCL && (g_scenarios & VR_SC_TIMEOUT))
        printf(", timeout n/a (the nccl backend has no timeout)");
      printf(" (%.1f s)\n", vrNow() - t0);
      tot_pass += t.passed;
      tot_fail += t.failed;
    }
  }
  printf("test_gpu_virtual_ranks: total %ld passed, %ld failed\n", tot_pass, tot_fail);
  if (tot_fail) return 1;
  return tot_pass > 0 ? 0 : 77;
}
