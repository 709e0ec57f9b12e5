/* Every rank count on one GPU: tp = 2..8 virtual ranks in one process, on
 * one device, one host thread and one stream per rank, for both backends.
 *
 * The ranks are real communicators: every rank's thread creates its own with
 * dpsCommInitVirtual (tests/support/virtual.c), which is the library's one
 * creation path (dpsCommCreate: backend resolution, the ranks' agreements,
 * the backend's kernel preload and init, the buffers of the logits dtype)
 * with a test provider for what NCCL supplies in production: the host
 * exchanges meet at a barrier, the symmetric memory is device memory of the
 * one GPU (a rank's "peer pointers" are the other ranks' allocations), and
 * the nccl backend's all-gather and all-to-all are device copies between
 * the ranks' buffers ordered with events. From then on everything goes
 * through the public API and the real backends' ops tables: onesided
 * (window layout, planning, the swap's LL and direct paths, the LL and
 * LL128 gathers, argmax / top-k, the timeout and its error reporting, the
 * close exchange and the windows' deregistration) and nccl (pack, permute,
 * unpack, merge around the collectives), and every rank's thread destroys
 * its communicator (collective for onesided).
 *
 * Per configuration the main thread sets, before the rank threads start
 * (creation reads them): DPSAMPLING_PDL, DPSAMPLING_ONESIDED_GATHER_PROTO,
 * DPSAMPLING_ONESIDED_LL_BYTES and DPSAMPLING_ONESIDED_MAX_BLOCKS = (SMs -
 * 2) / (2 tp), the grid cap that lets every rank's blocks, and PDL's
 * early-resident dependants, fit on the device together (DPS_VR_BLOCKS
 * overrides it). The timeout is short, so a co-residency mistake ends as a
 * reported dpsTimeout, never a hang. What the API does not show (the path,
 * vector width and grid a call took, whether LL128 and PDL were in effect)
 * is not asserted: the environment asks for it, and DPSAMPLING_DEBUG=INFO
 * logs what each rank agreed. CUDA_DEVICE_MAX_CONNECTIONS is raised
 * to 32 and the ranks' streams are created one after another, so that no
 * two ranks' streams share a hardware queue (vr/vr_harness.c says why);
 * DPS_VR_CONNECTIONS=1 forces one shared queue, and then the PDL-off swap
 * configurations time out every time (seen on one H200: tp=8 onesided
 * shapes, 8 failures, docs/validation.md).
 *
 * Scenarios, every value checked against the fixtures' host reference:
 *  shapes    fp32/bf16/fp16, V/tp in {1, 7, 33, 1001, 152064/tp}, N in
 *            {1, 3, 8}; pad_bs changes on every call (for V/tp=1001 N=8 the
 *            calls' per-peer chunks are asserted to lie on both sides of the
 *            swap's default LL threshold); inputs offset by 0, 1 or 2
 *            elements depending on the rank (different vector widths on
 *            different ranks); onesided LL and LL128 gathers, PDL on and off,
 *            and (full matrix) the swap forced onto its direct or LL path
 *            (the nccl backend has none of these: one run per shape);
 *  runahead  the last rank is held by a spin kernel before every call while
 *            the others enqueue all calls at once; every call's outputs are
 *            snapshotted on the rank's stream and checked afterwards;
 *  graph     capture swap + both gathers, replay with new inputs, an eager
 *            call between replays (onesided: one graph per rank; nccl: one
 *            graph over all ranks' streams, since the virtual collectives
 *            join them);
 *  timeout   (onesided) one rank stops calling: every other rank's
 *            dpsCommGetAsyncError reports dpsTimeout within about the
 *            timeout, naming the stopped rank directly or through a peer
 *            that gave up first; the stopped rank reports nothing; every
 *            rank's destroy returns within its bound. Not applicable to the
 *            nccl backend, which has no timeout (its peers would wait in
 *            NCCL forever); reported as n/a;
 *  select    dpsArgmax / dpsTopK (k = 1, 7, 64), rows and vocab_limit
 *            changing on every call.
 *  sample    dpsSample (vr/vr_sample.c): full logits [48, 33600] (V a
 *            multiple of every tp) generated once per dtype, each rank
 *            passing its shard, per-row filters of every kind (greedy,
 *            temperature, top-k up to 5000, top-p up to 0.99 on flat rows,
 *            min-p, combinations), int32 / int64 top-k arrays, a sub-batch,
 *            scalar parameters (top-k 300 + top-p 0.95: the exact path),
 *            and a captured call replayed with new parameter arrays: every
 *            rank's tokens and logprobs bit-identical to the tp = 1 result
 *            (both backends, computed first), tokens equal to
 *            fxRefSampleToken, the path counters equal on every rank.
 *  verify    dpsVerifyChain (vr/vr_verify.c): sample + the host walk, and
 *            with a mask and a soft-cap against the host reference.
 *  mixed     (vr/vr_mixed.c) argmax with and without lse, sample, top-k and
 *            verify interleaved on one communicator with no wait between
 *            them: three eager rounds (one in the reverse order), then one
 *            round captured in a graph and replayed twice with changed
 *            parameters; every output against the host references.
 * Every creation and every destroy is checked too (a failure counts).
 *
 * Default: a reduced matrix for every tp in 2..8 and both backends (well
 * under a minute on one H200 before the port to dpsCommInitVirtual; now each
 * configuration also creates and destroys its communicators). DPS_VR_FULL=1
 * (or "full"): the full matrix.
 * Arguments (or environment): tp=2,5-8 (DPS_VR_TP), backend=nccl|onesided|
 * all (DPS_VR_BACKEND), scenario=shapes,runahead,graph,timeout,select,sample,verify,
 * mixed|all
 * (DPS_VR_SCENARIO), full, small (= DPS_TEST_SMALL=1: skips shapes above
 * 1 Mi logits elements and lengthens the timeout, for compute-sanitizer).
 * DPS_VR_TIMEOUT_MS (default 2000, 20000 with small), DPS_VR_BLOCKS (grid
 * cap per rank instead of (SMs - 2) / (2 tp)), DPS_VR_CONNECTIONS (the
 * CUDA_DEVICE_MAX_CONNECTIONS asked for, default 32), DPS_VR_WATCHDOG_S
 * (the whole run's limit, default 600, 1800 with small; 0 = none).
 * Exit status: 0 passed, 1 failed, 2 bad arguments, 77 skipped (no GPU, or
 * nothing ran).
 *
 * What this cannot cover (the multi-GPU tests do): ordering and visibility
 * across NVLink, LL128's 128-byte store atomicity over NVLink, NCCL windows
 * and their registration, NCCL itself, timing skew between real GPUs, and
 * the production grid sizes (the grids here are capped for co-residency).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vr/vr_harness.h"

cudaError_t vrLaunchSpin(unsigned long long ns, cudaStream_t stream); /* vr_spin.cu */

enum { VR_OP_SWAP_LL = 0, VR_OP_SWAP_DIRECT = 1, VR_OP_OUTPUTS = 2, VR_OP_LOGPROBS = 3 };

/* ---- shapes ------------------------------------------------------------------- */
/* The bytes a rank's swap sends each peer in a call of pad_bs (the per-peer
 * chunk, reqs * N * V/tp * esize): the onesided swap takes its LL path up to
 * the threshold DPSAMPLING_ONESIDED_LL_BYTES, direct stores above it. */
static uint64_t vrChunkBytes(const VrGroup* g, int pad_bs) {
  return (uint64_t)(pad_bs / g->tp) * (uint64_t)g->cfg.n * (uint64_t)g->v_local * g->esize;
}

static int bodyShapes(VrGroup* g, int rank, const void* arg) {
  (void)arg;
  const int calls = 6;
  int below = 0, above = 0;
  for (int c = 0; c < calls; ++c) {
    const int pad = g->tp * vrReqs(g->cfg.mr, c);
    if (vrChunkBytes(g, pad) <= VR_LL_DEFAULT) below = 1;
    else above = 1;
    if (vrEagerRound(g, rank, pad, 11 + c, "shapes")) return 1;
  }
  /* A check of the test's own coverage (the plan the backend picks is not
   * visible through the API): with the default threshold, the calls of a
   * `cross` configuration must lie on both sides of it, so that the
   * sequence switches between the two swap paths. The forced variants
   * (DPSAMPLING_ONESIDED_LL_BYTES=0 and its maximum, full matrix) cover each
   * path explicitly. Counted once per configuration. */
  if (rank == 0 && g->backend == VR_ONESIDED && g->cfg.cross && g->cfg.ll_bytes == VR_LL_DEFAULT &&
      vrCount(g, below && above)) {
    fprintf(stderr,
            "%s: the shapes never crossed the swap's LL/direct switch at %llu bytes per peer "
            "(a call at or below it: %s, above it: %s)\n",
            g->desc, (unsigned long long)VR_LL_DEFAULT, below ? "yes" : "no", above ? "yes" : "no");
    return 1;
  }
  return 0;
}

/* ---- runahead ------------------------------------------------------------------ */
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
    const size_t rows_bytes = (size_t)pads[k] * n * 4;
    if (rank == delayed)
      VR_CUDA(g, rank, vrLaunchSpin((unsigned long long)arg->delay_ms * 1000000ull, r->s));
    if (vrSwap(g, rank, k, pads[k], &out)) return 1;
    VR_CUDA(g, rank,
            cudaMemcpyAsync(r->snap_out[k], out, vrOutBytes(g, pads[k]), cudaMemcpyDeviceToDevice,
                            r->s));
    if (vrGatherOutputs(g, rank, k, pads[k], &po, &aio, &alo)) return 1;
    VR_CUDA(g, rank, cudaMemcpyAsync(r->snap_p[k], po, rows_bytes, cudaMemcpyDeviceToDevice, r->s));
    VR_CUDA(g, rank,
            cudaMemcpyAsync(r->snap_ai[k], aio, rows_bytes, cudaMemcpyDeviceToDevice, r->s));
    VR_CUDA(g, rank,
            cudaMemcpyAsync(r->snap_al[k], alo, (size_t)pads[k] * 4, cudaMemcpyDeviceToDevice,
                            r->s));
    if (vrGatherLogprobs(g, rank, k, pads[k], &lpo)) return 1;
    VR_CUDA(g, rank,
            cudaMemcpyAsync(r->snap_lp[k], lpo, rows_bytes, cudaMemcpyDeviceToDevice, r->s));
  }
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  if (vrCheckAsync(g, rank, "runahead")) return 1;
  for (int k = 0; k < K; ++k)
    if (vrCheckCall(g, rank, r->snap_out[k], r->snap_p[k], r->snap_ai[k], r->snap_al[k],
                    r->snap_lp[k], pads[k], 31 + k, "runahead"))
      return 1;
  return vrBarrier(g);
}

/* ---- graph --------------------------------------------------------------------- */
typedef struct {
  int pad_bs;
  void** out;
  int32_t **po, **aio, **alo;
  float** lpo;
} VrCallArgs;

static int vrEnqueueCall(VrGroup* g, int rank, void* ctx) {
  VrCallArgs* a = (VrCallArgs*)ctx;
  return vrCall(g, rank, 0, a->pad_bs, a->out, a->po, a->aio, a->alo, a->lpo);
}

/* Captures one call of pad_bs on set 0 (vrCaptureOps). */
static int vrCapture(VrGroup* g, int rank, int pad_bs, void** out, int32_t** po, int32_t** aio,
                     int32_t** alo, float** lpo) {
  VrCallArgs a = {pad_bs, out, po, aio, alo, lpo};
  return vrCaptureOps(g, rank, vrEnqueueCall, &a);
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
  const int replays = g_vr.full ? 5 : 3;
  for (int k = 0; k < replays; ++k) {
    const int step = 60 + k;
    if (vrUpload(g, rank, 0, pad, step) || vrBarrier(g)) return 1;
    /* nccl: rank 0's graph runs every rank's work */
    if (g->backend == VR_ONESIDED || rank == 0) {
      VR_CUDA(g, rank, cudaGraphLaunch(r->exec, r->s));
      VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
    }
    if (vrBarrier(g)) return 1;
    if (vrCheckAsync(g, rank, "graph replay")) return 1;
    if (vrCheckCall(g, rank, out, po, aio, alo, lpo, pad, step, "graph replay")) return 1;
    if (vrBarrier(g)) return 1;
    if (k == 1 && vrEagerRound(g, rank, eager_pad, 70, "eager call between replays")) return 1;
  }
  return 0;
}

/* ---- timeout (onesided) ---------------------------------------------------------- */
typedef struct {
  int op, stopped;
} VrTimeoutArg;

static const char* const kOpNames[4] = {"swap (LL path)", "swap (direct path)",
                                        "gather_verify_outputs", "gather_verify_logprobs"};
/* the operation as the backend's messages name it */
static const char* const kOpApi[4] = {"swap_batch_vocab", "swap_batch_vocab",
                                      "gather_verify_outputs", "gather_verify_logprobs"};

static int vrOneOp(VrGroup* g, int rank, int op, int pad) {
  void* out = NULL;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  if (op <= VR_OP_SWAP_DIRECT) return vrSwap(g, rank, 0, pad, &out);
  if (op == VR_OP_OUTPUTS) return vrGatherOutputs(g, rank, 0, pad, &po, &aio, &alo);
  return vrGatherLogprobs(g, rank, 0, pad, &lpo);
}

/* What a rank's dpsTimeout message (onesided_backend.c, osAsyncError) says
 * about operation `api`: 1 "rank K did not arrive ... gave up waiting for
 * its <flag or data>", 2 "rank K gave up" (this rank stopped waiting for a
 * peer that had given up), 0 neither or another operation; *peer = K. */
static int vrParseTimeout(const char* msg, const char* api, int* peer) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, "onesided %s: rank ", api);
  const char* at = strstr(msg, prefix);
  if (at == NULL) return 0;
  at += strlen(prefix);
  char* end = NULL;
  const long k = strtol(at, &end, 10);
  if (end == at) return 0;
  *peer = (int)k;
  if (strncmp(end, " did not arrive", 15) == 0 && strstr(end, "gave up waiting for its ") != NULL)
    return 1;
  if (strncmp(end, " gave up", 8) == 0) return 2;
  return 0;
}

static int bodyTimeout(VrGroup* g, int rank, const void* argp) {
  const VrTimeoutArg* a = (const VrTimeoutArg*)argp;
  VrRank* r = &g->r[rank];
  /* The swap's path is forced by the configuration's threshold
   * (DPSAMPLING_ONESIDED_LL_BYTES: the maximum for the LL path at one
   * request per rank, 0 for the direct path). */
  const int pad = g->tp * (a->op == VR_OP_SWAP_LL ? 1 : g->cfg.mr);
  /* every rank makes one call of each operation, checked */
  if (vrEagerRound(g, rank, pad, 81, "timeout warm-up")) return 1;
  if (vrUpload(g, rank, 0, pad, 82) || vrBarrier(g)) return 1;
  const double tmo = g->timeout_ms / 1000.0;
  const double limit = tmo + (g->timeout_ms < 2000 ? 1.0 : g->timeout_ms / 2000.0);
  const double deadline = 3.0 * tmo + 2.0; /* how long to poll */
  r->async = dpsSuccess;
  r->async_msg[0] = '\0';
  r->stall_s = -1.0;
  if (rank != a->stopped) {
    const double t0 = vrNow();
    if (vrOneOp(g, rank, a->op, pad)) return 1;
    dpsResult_t st = dpsSuccess;
    for (;;) {
      VR_OK(g, rank, dpsCommGetAsyncError(r->comm, &st));
      if (st != dpsSuccess || vrNow() - t0 >= deadline) break;
      vrSleepMs(1);
    }
    r->stall_s = vrNow() - t0;
    r->async = st;
    snprintf(r->async_msg, sizeof r->async_msg, "%s", st != dpsSuccess ? dpsGetLastError() : "");
    VR_CUDA(g, rank, cudaStreamSynchronize(r->s)); /* the kernel gave up */
  }
  if (vrBarrier(g)) return 1; /* every rank's report is in */
  if (rank == a->stopped) {
    dpsResult_t st = dpsSuccess;
    VR_OK(g, rank, dpsCommGetAsyncError(r->comm, &st));
    if (vrCount(g, st == dpsSuccess)) {
      fprintf(stderr, "%s: the stopped rank %d reports %s: %s\n", g->desc, rank,
              dpsGetErrorString(st), dpsGetLastError());
      return 1;
    }
    return vrBarrier(g);
  }
  /* The rank names the stopped one, or a rank that gave up before it and
   * whose own report (followed the same way) names the stopped one. */
  int cur = rank, ok = 0;
  for (int hops = 0; hops <= g->tp; ++hops) {
    const VrRank* c = &g->r[cur];
    int peer = -1;
    const int kind =
        c->async == dpsTimeout ? vrParseTimeout(c->async_msg, kOpApi[a->op], &peer) : 0;
    if (kind == 1) {
      ok = peer == a->stopped;
      break;
    }
    if (kind != 2 || peer < 0 || peer >= g->tp || peer == cur || peer == a->stopped) break;
    cur = peer;
  }
  const int in_time = r->stall_s <= limit && r->stall_s >= 0.8 * tmo;
  if (vrCount(g, r->async == dpsTimeout && ok && in_time)) {
    fprintf(stderr,
            "%s rank %d: %s with rank %d stopped: %s after %.3f s (timeout %.3f s, limit %.3f s): "
            "\"%s\"; the chain ends at rank %d: \"%s\"\n",
            g->desc, rank, kOpNames[a->op], a->stopped, dpsGetErrorString(r->async), r->stall_s,
            tmo, limit, r->async_msg, cur, g->r[cur].async_msg);
    return 1;
  }
  return vrBarrier(g);
}

/* ---- select: argmax / top-k --------------------------------------------------- */
/* One argmax (k == 0) or top-k call of one rank on its stream, waited for. */
static int vrSelect(VrGroup* g, int rank, int rows, int64_t limit, int k, int want_lse) {
  VrRank* r = &g->r[rank];
  SelBufs* b = &r->sel;
  if (k == 0)
    VR_OK(g, rank,
          dpsArgmax(r->comm, b->d_in, rows, g->v_local, g->cfg.dtype, limit, b->d_val, b->d_idx,
                    want_lse ? b->d_lse : NULL, r->s));
  else
    VR_OK(g, rank,
          dpsTopK(r->comm, b->d_in, rows, g->v_local, g->cfg.dtype, k, limit, b->d_tval,
                  b->d_tidx, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  return vrCheckAsync(g, rank, k ? "top-k" : "argmax");
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
    if (vrSelect(g, rank, rows, limit, 0, want_lse)) return 1;
    snprintf(what, sizeof what, "%s rank %d: argmax rows=%d limit=%lld", g->desc, rank, rows,
             (long long)limit);
    if (vrCount(g, selCheck(&r->sel, rows, step, limit, 0, want_lse, what) == 0)) return 1;
    for (int ki = 0; ki < 3; ++ki) {
      const int k = ks[ki];
      if (k > limit) continue;
      if (vrSelect(g, rank, rows, limit, k, 0)) return 1;
      snprintf(what, sizeof what, "%s rank %d: top-%d rows=%d limit=%lld", g->desc, rank, k, rows,
               (long long)limit);
      if (vrCount(g, selCheck(&r->sel, rows, step, limit, k, 0, what) == 0)) return 1;
    }
  }
  return 0;
}

/* ---- the matrix ------------------------------------------------------------------ */
static void runShapes(VrTally* t, int tp, int backend) {
  static const dpsDataType_t dtypes[3] = {dpsFloat32, dpsBfloat16, dpsFloat16};
  static const int vls[5] = {1, 7, 33, 1001, 0};
  static const int ns[3] = {1, 3, 8};
  /* reduced: every dtype, V/tp and N at least once; both gather protocols, PDL
   * on and off; V/tp=1001 N=8 crosses the swap's LL/direct switch */
  static const VrCfg kDefault[] = {
      {dpsFloat32, 1, 8, 24, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 7, 3, 24, VR_GATHER_LL128, 1, VR_LL_DEFAULT, 0},
      {dpsFloat16, 33, 1, 24, VR_GATHER_LL, 0, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 1001, 8, 24, VR_GATHER_LL128, 1, VR_LL_DEFAULT, 1},
      {dpsBfloat16, 0, 1, 4, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
  };
  int variant = 0;
  if (!g_vr.full) {
    for (size_t i = 0; i < sizeof kDefault / sizeof kDefault[0]; ++i) {
      VrCfg c = kDefault[i];
      if (c.gproto == VR_GATHER_LL128 && g_vr.major < 9) c.gproto = VR_GATHER_LL;
      if (vrSkipLarge(tp, &c)) {
        t->skipped++;
        continue;
      }
      vrRunGroup(t, tp, backend, &c, 1, variant++, bodyShapes, NULL, "shapes");
    }
    return;
  }
  for (int d = 0; d < 3; ++d)
    for (int v = 0; v < 5; ++v)
      for (int k = 0; k < 3; ++k) {
        VrCfg base = {dtypes[d], vls[v], ns[k], vls[v] == 0 ? 4 : 24, VR_GATHER_LL, 1,
                      VR_LL_DEFAULT, vls[v] == 1001 && ns[k] == 8};
        if (vrSkipLarge(tp, &base)) {
          t->skipped++;
          continue;
        }
        if (backend == VR_NCCL) {
          vrRunGroup(t, tp, backend, &base, 1, variant++, bodyShapes, NULL, "shapes");
          continue;
        }
        /* {LL, LL128} x {PDL on, off}, then forced direct / forced LL swaps */
        for (int m = 0; m < 6; ++m) {
          VrCfg c = base;
          if (m < 4) {
            c.gproto = (m & 1) ? VR_GATHER_LL128 : VR_GATHER_LL;
            c.pdl = (m & 2) ? 0 : 1;
          } else {
            if (vls[v] != 33 && vls[v] != 1001) continue;
            c.ll_bytes = m == 4 ? 0 : VR_LL_ALWAYS;
          }
          if (c.gproto == VR_GATHER_LL128 && g_vr.major < 9) continue;
          vrRunGroup(t, tp, backend, &c, 1, variant++, bodyShapes, NULL, "shapes");
        }
      }
}

/* Variant m of a scenario's configuration: 0 as given, 1 PDL off, 2 LL128
 * gathers (the full onesided matrix runs all three). 0 when the variant
 * does not apply here (LL128 before sm_90). */
static int vrVariants(int backend) { return backend == VR_ONESIDED && g_vr.full ? 3 : 1; }
static int vrVariant(const VrCfg* base, int m, VrCfg* c) {
  *c = *base;
  if (m == 1) c->pdl = 0;
  if (m == 2) {
    if (g_vr.major < 9) return 0;
    c->gproto = VR_GATHER_LL128;
  }
  return 1;
}

static void runRunahead(VrTally* t, int tp, int backend) {
  const VrCfg base = {dpsBfloat16, 33, 3, 8, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0};
  VrRunaheadArg arg = {g_vr.full ? 20 : 5};
  for (int m = 0; m < vrVariants(backend); ++m) {
    VrCfg c;
    if (!vrVariant(&base, m, &c)) continue;
    if (vrSkipLarge(tp, &c)) {
      t->skipped++;
      continue;
    }
    vrRunGroup(t, tp, backend, &c, VR_MAX_SETS, m, bodyRunahead, &arg, "runahead");
  }
}

static void runGraph(VrTally* t, int tp, int backend) {
  const VrCfg base = {dpsFloat16, 7, 3, 8, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0};
  for (int m = 0; m < vrVariants(backend); ++m) {
    VrCfg c;
    if (!vrVariant(&base, m, &c)) continue;
    vrRunGroup(t, tp, backend, &c, 1, m, bodyGraph, NULL, "graph");
  }
}

static void runTimeout(VrTally* t, int tp, int backend) {
  if (backend != VR_ONESIDED) return; /* reported as n/a by the caller */
  for (int op = 0; op < 4; ++op) {
    if (!g_vr.full && op != (tp - 2) % 4) continue; /* reduced: one operation per tp */
    VrCfg c = {dpsBfloat16, 33, 3, 8, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0};
    if (op == VR_OP_SWAP_LL) c.ll_bytes = VR_LL_ALWAYS;
    if (op == VR_OP_SWAP_DIRECT) c.ll_bytes = 0;
    VrTimeoutArg arg = {op, (op * 3 + 1) % tp};
    const long before = t->failed;
    const double t0 = vrNow();
    vrRunGroup(t, tp, backend, &c, 1, op, bodyTimeout, &arg, "timeout");
    printf("  tp=%d onesided timeout: %s, rank %d stopped calling: %s (%.1f s)\n", tp,
           kOpNames[op], arg.stopped,
           t->failed == before ? "every other rank's error names it" : "FAILED", vrNow() - t0);
  }
}

static void runSelect(VrTally* t, int tp, int backend) {
  static const VrCfg kCfgs[] = {
      {dpsBfloat16, 1, 3, 4, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
      {dpsFloat32, 33, 1, 8, VR_GATHER_LL, 0, VR_LL_DEFAULT, 0},
      {dpsFloat16, 1001, 8, 2, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
      {dpsBfloat16, 0, 1, 4, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
      {dpsFloat32, 7, 3, 4, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0},
  };
  const int n = g_vr.full ? 5 : 3;
  for (int i = 0; i < n; ++i) {
    VrCfg c = kCfgs[g_vr.full ? i : (i == 2 ? 3 : i)];
    if (vrSkipLarge(tp, &c)) {
      t->skipped++;
      continue;
    }
    vrRunGroup(t, tp, backend, &c, 1, i, bodySelect, NULL, "select");
  }
}

int main(int argc, char** argv) {
  const int start = vrStart(argc, argv); /* first: it sets the environment CUDA reads */
  if (start >= 0) return start;
  long tot_pass = 0, tot_fail = 0;
  for (int tp = 2; tp <= VR_MAX_TP; ++tp) {
    if (!g_vr.tps[tp]) continue;
    for (int b = 0; b < 2; ++b) {
      if (!(g_vr.backends & (1 << b))) continue;
      VrTally t = {0, 0, 0};
      const double t0 = vrNow();
      if (g_vr.scenarios & VR_SC_SHAPES) runShapes(&t, tp, b);
      if (g_vr.scenarios & VR_SC_RUNAHEAD) runRunahead(&t, tp, b);
      if (g_vr.scenarios & VR_SC_GRAPH) runGraph(&t, tp, b);
      if (g_vr.scenarios & VR_SC_TIMEOUT) runTimeout(&t, tp, b);
      if (g_vr.scenarios & VR_SC_SELECT) runSelect(&t, tp, b);
      if (g_vr.scenarios & VR_SC_SAMPLE) vrRunSample(&t, tp, b);
      if (g_vr.scenarios & VR_SC_VERIFY) vrRunVerify(&t, tp, b);
      if (g_vr.scenarios & VR_SC_MIXED) vrRunMixed(&t, tp, b);
      printf("tp=%d %s: %ld passed, %ld failed", tp, vrBackendName(b), t.passed, t.failed);
      if (t.skipped) printf(", %ld shapes skipped (small)", t.skipped);
      if (b == VR_NCCL && (g_vr.scenarios & VR_SC_TIMEOUT))
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
