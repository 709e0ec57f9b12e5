/* Scenario mixed of test_gpu_virtual_ranks: the records-pipeline operations
 * (dpsArgmax with and without lse, dpsSample, dpsTopK, dpsVerifyChain)
 * interleaved on ONE communicator per (tp, backend), in one stream order,
 * with no synchronization between them (vr_harness.h).
 *
 * Inputs, each rank passing its shard [rows, V/tp] (V = 840 * 40):
 *  - argmax / top-k: the fixtures' select rows (fxSelValue: ties across
 *    shard boundaries, NaN, +-inf) of one step in the rank's SelBufs, every
 *    call on other rows (a pointer offset), another vocab_limit and, top-k,
 *    another k (1, 7, 33, 64);
 *  - sample: vr_data.h's SmpData (greedy, temperature-only, top-k, top-p,
 *    min-p rows and combinations): per-row arrays A (int32 top-k), scalars S
 *    (the exact path), arrays B (int64 top-k);
 *  - verify: vr_data.h's VfyData with its grammar mask and soft-cap (top-p
 *    off), candidates that make request b accept (b + shift) % N drafts, a
 *    different shift on every call; the persistent outputs are copied in
 *    stream order after each call.
 * Three eager rounds are enqueued back to back and waited for once: round 0
 * and 2 in the order argmax+lse, sample, top-k, verify, argmax; round 1 in
 * the reverse order. Then one round (reverse order) is captured in a CUDA
 * graph once and replayed twice with changed parameters: new select rows
 * (another step), the sample arrays changed from A to B, other candidates.
 * Every output is checked against the host references: argmax / top-k
 * against fxRefArgmax / fxRefTopK (selCompare: indices and values exactly,
 * lse within 1e-4), sample against fxRefSampleToken (smpCheckRef: tokens
 * exactly, logprobs within SMP_LP_TOL), verify against the host walk
 * (fxRefVerifyChain, checkWalk) of the reference verify's tokens
 * (fxRefVerifyRows), logprobs within SMP_LP_TOL. Outputs are poisoned
 * before they are written.
 *
 * What it catches that the one-operation scenarios cannot: every records
 * step of every operation shares one exchange (onesided: the `rec` staging,
 * two parities, one epoch counter DPS_PEER_OP_RECORDS; nccl: the records
 * buffers and the all-gather). A planted bug such as a records step whose
 * epoch is not advanced (the local pass not publishing its epoch in
 * finishEpoch, or osRecords handing the merge the previous step's epoch)
 * makes a merge accept the lines of the previous step, i.e. pair one
 * operation's records with another's (an argmax merge reading sample's
 * 154-word records or top-k's lists): indices, values and tokens come out
 * wrong and the checks above fail. Run back to back without
 * synchronization, the peers' stale lines are still in the staging when a
 * merge starts. What the one-operation scenarios (select, sample, verify)
 * leave out: a step following a step of ANOTHER operation (other record
 * sizes and row counts), several operations in flight at once, and a graph
 * holding all of them. The checks also fail for a verify output read after
 * a later call overwrote it, or a graph replaying parameter arrays captured
 * by value instead of read at replay. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vr_data.h"

#define MIX_ROUNDS 3              /* eager rounds; pass MIX_ROUNDS is the graph's */
#define MIX_PASSES (MIX_ROUNDS + 1)
#define MIX_SEL_ROWS 32           /* select rows uploaded per step */
#define MIX_MAX_SEL 16            /* rows of one argmax / top-k call, at most */
#define MIX_STEP 400              /* the select step of the eager rounds (+1, +2: replays) */

enum { MIX_ARGMAX_LSE, MIX_SAMPLE, MIX_TOPK, MIX_VERIFY, MIX_ARGMAX, MIX_OPS };
enum { LIM_V, LIM_V1, LIM_SHARD, LIM_MID };

/* One pass: the order and every call's parameters. */
typedef struct {
  int reverse;                          /* 0: MIX_ARGMAX_LSE .. MIX_ARGMAX; 1: the reverse */
  int al_row0, al_rows, al_lim;         /* argmax with lse */
  int a_row0, a_rows, a_lim;            /* argmax without */
  int t_row0, t_rows, t_k, t_lim;       /* top-k */
  int set, i64, dev;                    /* sample: SET_*, int64 top-k, which smpDev */
  int shift;                            /* verify: request b accepts (b + shift) % N drafts */
} MixPass;

/* The graph's pass is captured as given (set A, shift 3) and replayed a
 * second time with B's arrays and shift 1 (kReplaySet, kReplayShift). */
static const MixPass kPasses[MIX_PASSES] = {
    {0, 0, 16, LIM_V, 20, 12, LIM_MID, 4, 8, 7, LIM_V1, SET_A, 0, 0, 0},
    {1, 3, 9, LIM_MID, 0, 7, LIM_V, 11, 6, 64, LIM_SHARD, SET_S, 0, 0, 1},
    {0, 9, 13, LIM_V1, 14, 10, LIM_SHARD, 0, 9, 1, LIM_V, SET_B, 1, 1, 2},
    {1, 1, 11, LIM_V, 18, 9, LIM_V1, 6, 7, 33, LIM_MID, SET_A, 0, 0, 3},
};
static const int kReplaySet[2] = {SET_A, SET_B}, kReplayShift[2] = {3, 1};

/* One pass's outputs (device, and the same layout in the host copy). */
typedef struct {
  void* val[2]; /* argmax: [0] with lse, [1] without */
  int64_t* idx[2];
  float* lse;
  void* tval;
  int64_t* tidx;
  int64_t* tok; /* sample */
  float* slp;
  int32_t *pr, *ai, *al; /* verify (copies of the persistent outputs) */
  float* vlp;
} MixOut;

static char* mixTake(char* base, size_t* off, size_t bytes) {
  char* p = base != NULL ? base + *off : NULL;
  *off += (bytes + 255) / 256 * 256;
  return p;
}

/* Lays one pass's outputs out from base (NULL: only the size). */
static size_t mixLayout(char* base, MixOut* o) {
  size_t off = 0;
  const size_t S = MIX_MAX_SEL, K = DPS_TOPK_MAX;
  for (int w = 0; w < 2; ++w) {
    o->val[w] = mixTake(base, &off, S * 4);
    o->idx[w] = (int64_t*)mixTake(base, &off, S * 8);
  }
  o->lse = (float*)mixTake(base, &off, S * 4);
  o->tval = mixTake(base, &off, S * K * 4);
  o->tidx = (int64_t*)mixTake(base, &off, S * K * 8);
  o->tok = (int64_t*)mixTake(base, &off, SMP_VR_ROWS * 8);
  o->slp = (float*)mixTake(base, &off, SMP_VR_ROWS * 4);
  o->pr = (int32_t*)mixTake(base, &off, VFY_VR_ROWS * 4);
  o->ai = (int32_t*)mixTake(base, &off, VFY_VR_ROWS * 4);
  o->al = (int32_t*)mixTake(base, &off, VFY_VR_REQS * 4);
  o->vlp = (float*)mixTake(base, &off, VFY_VR_ROWS * 4);
  return off;
}

typedef struct {
  SmpData* sd;
  VfyData* vd;
} MixArg;

typedef struct {
  SmpData* sd;
  VfyData* vd;
  smpDev sdev[2]; /* sample: A's logits and arrays, B's */
  smpDev vdev;    /* verify: its logits */
  Req q;          /* verify: per-request parameters (rqm) and the mask */
  size_t pass_bytes;
  char* d_out; /* [MIX_PASSES][pass_bytes] */
  char* h_out;
  int32_t* d_cand; /* [MIX_PASSES][VFY_VR_ROWS] */
  int32_t h_cand[VFY_VR_N][VFY_VR_ROWS]; /* by shift */
  int pass;                              /* the pass mixEnqueue enqueues */
} MixCtx;

static int64_t mixLimit(const VrGroup* g, int kind) {
  const int64_t V = g->vocab, vl = g->v_local;
  switch (kind) {
    case LIM_V1: return V - 1;
    case LIM_SHARD: return vl; /* the first shard boundary */
    case LIM_MID: return vl * (g->tp / 2) + (vl + 1) / 2; /* inside a middle shard */
    default: return V;
  }
}

/* ---- enqueue ---------------------------------------------------------------------- */
static int mixOp(VrGroup* g, int rank, MixCtx* c, int op) {
  VrRank* r = &g->r[rank];
  const MixPass* m = &kPasses[c->pass];
  MixOut o;
  mixLayout(c->d_out + (size_t)c->pass * c->pass_bytes, &o);
  const char* sel = (const char*)r->sel.d_in;
  const size_t row_bytes = (size_t)g->v_local * g->esize;
  const dpsDataType_t dt = g->cfg.dtype;
  if (op == MIX_ARGMAX_LSE || op == MIX_ARGMAX) {
    const int w = op == MIX_ARGMAX;
    const int row0 = w ? m->a_row0 : m->al_row0, rows = w ? m->a_rows : m->al_rows;
    VR_OK(g, rank,
          dpsArgmax(r->comm, sel + (size_t)row0 * row_bytes, rows, g->v_local, dt,
                    mixLimit(g, w ? m->a_lim : m->al_lim), o.val[w], o.idx[w], w ? NULL : o.lse,
                    r->s));
  } else if (op == MIX_TOPK) {
    VR_OK(g, rank,
          dpsTopK(r->comm, sel + (size_t)m->t_row0 * row_bytes, m->t_rows, g->v_local, dt, m->t_k,
                  mixLimit(g, m->t_lim), o.tval, o.tidx, r->s));
  } else if (op == MIX_SAMPLE) {
    smpSpec spec = c->sd->spec[m->set];
    if (m->i64 && (spec.arrays & SMP_A_K32)) spec.arrays = (spec.arrays & ~SMP_A_K32) | SMP_A_K64;
    const smpDev* d = &c->sdev[m->dev];
    const dpsSampleParams_t p = smpDpsParams(d, &spec, 0);
    VR_OK(g, rank,
          dpsSample(r->comm, d->logits, SMP_VR_ROWS, g->v_local, dt, SMP_VR_V, &p, o.tok, o.slp,
                    r->s));
  } else {
    const dpsSampleParams_t p = reqParams(&c->q, 0);
    int32_t *pr = NULL, *ai = NULL, *al = NULL;
    float* lp = NULL;
    VR_OK(g, rank,
          dpsVerifyChain(r->comm, c->vdev.logits, VFY_VR_ROWS, g->v_local, dt, VFY_VR_V,
                         VFY_VR_REQS, c->d_cand + (size_t)c->pass * VFY_VR_ROWS, &p, c->q.mask,
                         VFY_VR_CAP, &pr, &ai, &al, &lp, r->s));
    /* persistent outputs: copied in stream order, before the next verify */
    VR_CUDA(g, rank, cudaMemcpyAsync(o.pr, pr, VFY_VR_ROWS * 4, cudaMemcpyDeviceToDevice, r->s));
    VR_CUDA(g, rank, cudaMemcpyAsync(o.ai, ai, VFY_VR_ROWS * 4, cudaMemcpyDeviceToDevice, r->s));
    VR_CUDA(g, rank, cudaMemcpyAsync(o.al, al, VFY_VR_REQS * 4, cudaMemcpyDeviceToDevice, r->s));
    VR_CUDA(g, rank, cudaMemcpyAsync(o.vlp, lp, VFY_VR_ROWS * 4, cudaMemcpyDeviceToDevice, r->s));
  }
  return 0;
}

/* The five operations of pass c->pass, enqueued without waiting. */
static int mixEnqueue(VrGroup* g, int rank, void* ctx) {
  MixCtx* c = (MixCtx*)ctx;
  for (int i = 0; i < MIX_OPS; ++i)
    if (mixOp(g, rank, c, kPasses[c->pass].reverse ? MIX_OPS - 1 - i : i)) return 1;
  return 0;
}

/* ---- check ------------------------------------------------------------------------ */
/* Pass p's outputs (downloaded into h_out) against the references of select
 * step `step`, sample set `set` and candidates of `shift`. Returns 1 when
 * any check failed. */
static int mixCheck(VrGroup* g, int rank, MixCtx* c, int p, int step, int set, int shift,
                    const char* when) {
  const MixPass* m = &kPasses[p];
  SelBufs* sb = &g->r[rank].sel;
  MixOut o;
  mixLayout(c->h_out + (size_t)p * c->pass_bytes, &o);
  char what[512];
  int failed = 0;
  for (int w = 0; w < 2; ++w) {
    const int row0 = w ? m->a_row0 : m->al_row0, rows = w ? m->a_rows : m->al_rows;
    const int64_t limit = mixLimit(g, w ? m->a_lim : m->al_lim);
    snprintf(what, sizeof what, "%s rank %d: mixed %s: argmax%s rows [%d, %d) limit %lld",
             g->desc, rank, when, w ? "" : " + lse", row0, row0 + rows, (long long)limit);
    const long bad = selCompare(sb, row0, rows, step, limit, 0, o.idx[w], o.val[w],
                                w ? NULL : o.lse, what);
    if (vrCount(g, bad == 0)) {
      fprintf(stderr, "%s: %ld rows wrong\n", what, bad);
      failed = 1;
    }
  }
  const int64_t tlim = mixLimit(g, m->t_lim);
  snprintf(what, sizeof what, "%s rank %d: mixed %s: top-%d rows [%d, %d) limit %lld", g->desc,
           rank, when, m->t_k, m->t_row0, m->t_row0 + m->t_rows, (long long)tlim);
  long bad = selCompare(sb, m->t_row0, m->t_rows, step, tlim, m->t_k, o.tidx, o.tval, NULL, what);
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld values wrong\n", what, bad);
    failed = 1;
  }

  snprintf(what, sizeof what, "%s rank %d: mixed %s: sample set %c%s", g->desc, rank, when,
           "ABS"[set], m->i64 ? " (int64 top-k)" : "");
  bad = smpCheckRef(what, &c->sd->h[set == SET_B], &c->sd->spec[set], 0, SMP_VR_ROWS, SMP_VR_V,
                    o.tok, o.slp, c->sd->rtok[set], c->sd->rlp[set], c->sd->clear[set]);
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld rows differ from the reference\n", what, bad);
    failed = 1;
  }

  snprintf(what, sizeof what, "%s rank %d: mixed %s: verify (mask, soft-cap, shift %d)", g->desc,
           rank, when, shift);
  const Out vo = {o.pr, o.ai, o.al, o.vlp};
  bad = checkWalk(what, &vo, c->h_cand[shift], c->vd->rt, c->vd->rlp_all, VFY_VR_REQS, VFY_VR_N,
                  0, 0);
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld requests differ from the reference\n", what, bad);
    failed = 1;
  }
  return failed;
}

/* ---- the body ------------------------------------------------------------------------ */
static int mixAlloc(VrGroup* g, int rank, void* p) {
  MixCtx* c = (MixCtx*)p;
  (void)rank;
  const int64_t vl = g->v_local;
  MixOut o;
  c->pass_bytes = mixLayout(NULL, &o);
  const size_t out = MIX_PASSES * c->pass_bytes;
  if (smpDevAlloc(&c->sdev[0], SMP_VR_ROWS, vl, g->cfg.dtype) ||
      smpDevAlloc(&c->sdev[1], SMP_VR_ROWS, vl, g->cfg.dtype) ||
      smpDevAlloc(&c->vdev, VFY_VR_ROWS, vl, g->cfg.dtype) ||
      reqAlloc(&c->q, VFY_VR_REQS, VFY_VR_N, VFY_VR_WORDS))
    return 1;
  GT_CUDA(cudaMalloc((void**)&c->d_out, out));
  GT_CUDA(cudaMalloc((void**)&c->d_cand, (size_t)MIX_PASSES * VFY_VR_ROWS * 4));
  c->h_out = (char*)malloc(out);
  return c->h_out == NULL;
}

static void mixRelease(void* p) {
  MixCtx* c = (MixCtx*)p;
  smpDevFree(&c->sdev[0]), smpDevFree(&c->sdev[1]), smpDevFree(&c->vdev), reqFree(&c->q);
  cudaFree(c->d_out), cudaFree(c->d_cand), free(c->h_out);
}

/* Uploads everything the eager rounds read and poisons their outputs
 * (waits for the copies). */
static int mixUpload(VrGroup* g, int rank, MixCtx* c) {
  VrRank* r = &g->r[rank];
  const int64_t col0 = (int64_t)rank * g->v_local;
  if (smpDevUpload(&c->sdev[0], &c->sd->h[0], 0, SMP_VR_ROWS, col0, r->s) ||
      smpDevUpload(&c->sdev[1], &c->sd->h[1], 0, SMP_VR_ROWS, col0, r->s) ||
      smpDevUpload(&c->vdev, &c->vd->h, 0, VFY_VR_ROWS, col0, r->s) ||
      reqUpload(&c->q, &c->vd->rqm, r->s))
    return 1;
  VR_CUDA(g, rank,
          cudaMemcpyAsync(c->q.mask, c->vd->mask, sizeof c->vd->mask, cudaMemcpyHostToDevice, r->s));
  for (int p = 0; p < MIX_ROUNDS; ++p)
    VR_CUDA(g, rank,
            cudaMemcpyAsync(c->d_cand + (size_t)p * VFY_VR_ROWS, c->h_cand[kPasses[p].shift],
                            VFY_VR_ROWS * 4, cudaMemcpyHostToDevice, r->s));
  VR_CUDA(g, rank, cudaMemsetAsync(c->d_out, 0xab, MIX_ROUNDS * c->pass_bytes, r->s));
  return selUpload(&r->sel, MIX_SEL_ROWS, MIX_STEP); /* waits for the stream */
}

static int mixRun(VrGroup* g, int rank, void* p) {
  MixCtx* c = (MixCtx*)p;
  VrRank* r = &g->r[rank];
  for (int s = 0; s < VFY_VR_N; ++s)
    makeCandidatesShift(c->vd->rt, VFY_VR_REQS, VFY_VR_N, VFY_VR_V, s, c->h_cand[s]);
  if (mixUpload(g, rank, c)) return vrCount(g, 0);
  /* the eager rounds: every operation enqueued, one wait at the end */
  if (vrBarrier(g)) return 1;
  r->t[0] = vrNow();
  for (c->pass = 0; c->pass < MIX_ROUNDS; ++c->pass)
    if (mixEnqueue(g, rank, c)) return 1;
  r->t[1] = vrNow();
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  r->t[2] = vrNow();
  if (vrCheckAsync(g, rank, "mixed rounds")) {
    vrReportTimes(g, rank, "mixed rounds");
    return 1;
  }
  VR_CUDA(g, rank,
          cudaMemcpy(c->h_out, c->d_out, MIX_ROUNDS * c->pass_bytes, cudaMemcpyDeviceToHost));
  static const char* const kRound[MIX_ROUNDS] = {"round 0", "round 1 (reverse order)",
                                                 "round 2"};
  int failed = 0;
  for (int q = 0; q < MIX_ROUNDS; ++q)
    failed |= mixCheck(g, rank, c, q, MIX_STEP, kPasses[q].set, kPasses[q].shift, kRound[q]);
  if (failed) return 1;
  /* one round captured once, replayed with new rows, B's arrays, other candidates */
  const size_t gb = (size_t)MIX_ROUNDS * c->pass_bytes;
  c->pass = MIX_ROUNDS;
  if (vrBarrier(g) || vrCaptureOps(g, rank, mixEnqueue, c)) return 1;
  for (int rep = 0; rep < 2; ++rep) {
    const int step = MIX_STEP + 1 + rep;
    if (rep == 1 && smpDevUploadParams(&c->sdev[0], &c->sd->h[1], 0, SMP_VR_ROWS, r->s))
      return vrCount(g, 0);
    VR_CUDA(g, rank,
            cudaMemcpyAsync(c->d_cand + (size_t)MIX_ROUNDS * VFY_VR_ROWS,
                            c->h_cand[kReplayShift[rep]], VFY_VR_ROWS * 4, cudaMemcpyHostToDevice,
                            r->s));
    VR_CUDA(g, rank, cudaMemsetAsync(c->d_out + gb, 0xab, c->pass_bytes, r->s));
    if (selUpload(&r->sel, MIX_SEL_ROWS, step)) return vrCount(g, 0); /* waits */
    if (vrBarrier(g) || vrReplay(g, rank)) return 1;
    if (vrCheckAsync(g, rank, "mixed graph replay")) return 1;
    VR_CUDA(g, rank, cudaMemcpy(c->h_out + gb, c->d_out + gb, c->pass_bytes,
                                cudaMemcpyDeviceToHost));
    if (mixCheck(g, rank, c, MIX_ROUNDS, step, kReplaySet[rep], kReplayShift[rep],
                 rep ? "graph replay 2 (B's arrays)" : "graph replay 1"))
      return 1;
  }
  return 0;
}

static int bodyMixed(VrGroup* g, int rank, const void* argp) {
  const MixArg* a = (const MixArg*)argp;
  MixCtx c;
  memset(&c, 0, sizeof c);
  c.sd = a->sd;
  c.vd = a->vd;
  return vrRunWithBuffers(g, rank, mixAlloc, mixRun, mixRelease, &c);
}

void vrRunMixed(VrTally* t, int tp, int backend) {
  const int di = (tp + backend + 1) % 3;
  MixArg arg = {vrSampleData(di), vrVerifyData(di)};
  if (arg.sd == NULL || arg.vd == NULL) {
    fprintf(stderr, "mixed: no %s rows or no reference\n", dpsDataTypeName(kVrDtypes[di]));
    t->failed++;
    return;
  }
  const VrCfg c = {kVrDtypes[di], SMP_VR_V / tp, VFY_VR_N, VFY_VR_REQS, VR_GATHER_LL, 1,
                   VR_LL_DEFAULT, 0};
  vrRunGroup(t, tp, backend, &c, 1, tp + di, bodyMixed, &arg, "mixed");
}
