/* Scenario verify of test_gpu_virtual_ranks: dpsVerifyChain at tp virtual
 * ranks (vr_harness.h), each rank passing its shard [pad_bs*N, V/tp].
 *
 * Per dtype the full logits [VFY_VR_REQS*VFY_VR_N, VFY_VR_V] (sample_common.h's
 * mixed rows; V = 840 * 40 divides by every tp in 1..8), per-request
 * parameters (request b takes row b*N's filters, seed and offset), a grammar
 * mask and the soft-cap VFY_VR_CAP are fixed once. Every group, on every rank:
 *  - plain: dpsSample on the expanded per-row parameters gives the tokens t;
 *    the candidates are built from t (request b accepts b % N drafts);
 *    dpsVerifyChain must equal the host walk of t (fxRefVerifyChain) bit for
 *    bit, logprobs included;
 *  - masked: dpsVerifyChain with the mask and the soft-cap (top-p off: the
 *    reference's float64 nucleus boundary is not the kernels'), candidates from
 *    the host reference of the whole verify (fxRefVerifyRows): tokens equal
 *    to the reference, logprobs within SMP_LP_TOL, and (after the first
 *    group) bit for bit the first group's outputs (tp = 1). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vr_data.h"

static VfyData g_vfy[3];

static int vfyDataInit(VfyData* d, dpsDataType_t dt, int di) {
  if (d->ready) return d->failed;
  d->ready = 1, d->failed = 1;
  const int64_t V = VFY_VR_V;
  if (smpHostAlloc(&d->h, VFY_VR_ROWS, V, dt)) return 1;
  if (smpGenMixed(&d->h, 0x452821e638d01377ull + (uint64_t)di, 7 * di, V)) return 1;
  uint64_t g = 0xbe5466cf34e90c6cull + (uint64_t)di;
  for (int b = 0; b < VFY_VR_REQS; ++b) {
    const int64_t r = (int64_t)b * VFY_VR_N;
    d->rq.T[b] = d->h.T[r], d->rq.top_p[b] = d->h.top_p[r], d->rq.min_p[b] = d->h.min_p[r];
    d->rq.k[b] = d->h.top_k32[r], d->rq.seed[b] = d->h.seed[r], d->rq.offset[b] = d->h.offset[r];
    d->fp[b] = fxSampleParamsDefault(V);
    d->fp[b].temperature = d->rq.T[b], d->fp[b].top_k = d->rq.k[b];
    d->fp[b].top_p = 1.0f; /* masked: no top-p (its fixed-point boundary; the plain part has it) */
    d->fp[b].min_p = d->rq.min_p[b], d->fp[b].softcap = VFY_VR_CAP;
  }
  d->rqm = d->rq;
  for (int b = 0; b < VFY_VR_REQS; ++b) d->rqm.top_p[b] = 1.0f;
  for (size_t w = 0; w < sizeof d->mask / 4; ++w)
    d->mask[w] = (uint32_t)fxSplitmix(&g) | (uint32_t)fxSplitmix(&g); /* ~3/4 allowed */
  memset(d->mask + 5 * VFY_VR_WORDS, 0, VFY_VR_WORDS * 4); /* row 5: nothing allowed */
  /* the tokens, then every row's logprob (candidates that accept every
   * draft), then the outputs for mcand */
  memset(d->mcand, 0, sizeof d->mcand);
  fxVerifyInput in = {d->h.row, V, d->mcand, VFY_VR_REQS, VFY_VR_N, d->fp,
                      d->rq.seed, d->rq.offset, d->mask};
  fxVerifyOutput out = {d->rpr, d->rai, d->ral, d->rlp, d->rt};
  if (fxRefVerifyRows(&in, &out) != 0) return 1;
  for (int k = 0; k < VFY_VR_ROWS; ++k)
    d->mcand[k] = k % VFY_VR_N == 0 ? 0 : (int32_t)d->rt[k - 1];
  out.logprob = d->rlp_all;
  if (fxRefVerifyRows(&in, &out) != 0) return 1;
  for (int b = 0; b < VFY_VR_REQS; ++b)
    if (d->ral[b] != VFY_VR_N) return 1; /* every draft accepted: every row's logprob */
  out.logprob = d->rlp;
  makeCandidates(d->rt, VFY_VR_REQS, VFY_VR_N, V, d->mcand);
  if (fxRefVerifyRows(&in, &out) != 0) return 1;
  d->failed = 0;
  return 0;
}

static int vfyFetch(VrGroup* g, int rank, int32_t* const dev[4], Out* o) {
  VR_CUDA(g, rank, cudaStreamSynchronize(g->r[rank].s));
  if (vrCheckAsync(g, rank, "verify")) return 1;
  VR_CUDA(g, rank, cudaMemcpy(o->pr, dev[0], VFY_VR_ROWS * 4, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(o->ai, dev[1], VFY_VR_ROWS * 4, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(o->al, dev[2], VFY_VR_REQS * 4, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(o->lp, dev[3], VFY_VR_ROWS * 4, cudaMemcpyDeviceToHost));
  return 0;
}

static int bodyVerifyRun(VrGroup* g, int rank, VfyData* d, smpDev* dev, Req* q, Out* o) {
  VrRank* r = &g->r[rank];
  const int64_t col0 = (int64_t)rank * g->v_local;
  char what[240];
  if (smpDevUpload(dev, &d->h, 0, VFY_VR_ROWS, col0, r->s)) return vrCount(g, 0);
  if (reqUpload(q, &d->rq, r->s)) return vrCount(g, 0);
  /* plain: the tokens of dpsSample, candidates from them, the walk */
  const dpsSampleParams_t rp = reqParams(q, 1);
  if (vrBarrier(g)) return 1;
  VR_OK(g, rank, dpsSample(r->comm, dev->logits, VFY_VR_ROWS, g->v_local, g->cfg.dtype, VFY_VR_V,
                           &rp, q->tok, q->lp, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  if (vrCheckAsync(g, rank, "sample")) return 1;
  int64_t t[VFY_VR_ROWS];
  float tlp[VFY_VR_ROWS];
  int32_t cand[VFY_VR_ROWS];
  VR_CUDA(g, rank, cudaMemcpy(t, q->tok, sizeof t, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(tlp, q->lp, sizeof tlp, cudaMemcpyDeviceToHost));
  makeCandidates(t, VFY_VR_REQS, VFY_VR_N, VFY_VR_V, cand);
  VR_CUDA(g, rank, cudaMemcpy(q->cand, cand, sizeof cand, cudaMemcpyHostToDevice));
  const dpsSampleParams_t p = reqParams(q, 0);
  int32_t* out[4];
  if (vrBarrier(g)) return 1;
  VR_OK(g, rank, dpsVerifyChain(r->comm, dev->logits, VFY_VR_ROWS, g->v_local, g->cfg.dtype,
                                VFY_VR_V, VFY_VR_REQS, q->cand, &p, NULL, 0.0f, &out[0], &out[1],
                                &out[2], (float**)&out[3], r->s));
  if (vfyFetch(g, rank, out, o)) return 1;
  snprintf(what, sizeof what, "%s rank %d: verify (plain)", g->desc, rank);
  long bad = checkWalk(what, o, cand, t, tlp, VFY_VR_REQS, VFY_VR_N, 1, 1);
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld requests differ from sample + walk\n", what, bad);
    return 1;
  }
  /* masked and soft-capped: the reference, and the first group bit for bit */
  VR_CUDA(g, rank, cudaMemcpy(q->cand, d->mcand, sizeof d->mcand, cudaMemcpyHostToDevice));
  VR_CUDA(g, rank, cudaMemcpy(q->mask, d->mask, sizeof d->mask, cudaMemcpyHostToDevice));
  if (reqUpload(q, &d->rqm, r->s)) return vrCount(g, 0);
  if (vrBarrier(g)) return 1;
  VR_OK(g, rank, dpsVerifyChain(r->comm, dev->logits, VFY_VR_ROWS, g->v_local, g->cfg.dtype,
                                VFY_VR_V, VFY_VR_REQS, q->cand, &p, q->mask, VFY_VR_CAP, &out[0],
                                &out[1], &out[2], (float**)&out[3], r->s));
  if (vfyFetch(g, rank, out, o)) return 1;
  snprintf(what, sizeof what, "%s rank %d: verify (mask, soft-cap)", g->desc, rank);
  bad = 0;
  for (int b = 0; b < VFY_VR_REQS; ++b) {
    int ok = o->al[b] == d->ral[b];
    for (int i = 0; i < VFY_VR_N; ++i) {
      const int k = b * VFY_VR_N + i;
      ok = ok && o->pr[k] == d->rpr[k] && o->ai[k] == d->rai[k] && smpLpClose(o->lp[k], d->rlp[k]);
      if (d->have_base)
        ok = ok && o->pr[k] == d->bpr[k] && o->ai[k] == d->bai[k] && smpSameBits(o->lp[k], d->blp[k]);
    }
    if (!ok && bad < 3)
      fprintf(stderr, "  %s: request %d: accept_length %d (reference %d) predict[0] %d (%d) lp[0] "
              "%.9g (%.9g)\n", what, b, o->al[b], d->ral[b], o->pr[b * VFY_VR_N],
              d->rpr[b * VFY_VR_N], (double)o->lp[b * VFY_VR_N], (double)d->rlp[b * VFY_VR_N]);
    bad += !ok;
  }
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld requests differ from the %s\n", what, bad,
            d->have_base ? "reference or the first group" : "reference");
    return 1;
  }
  if (vrBarrier(g)) return 1;
  if (!d->have_base && rank == 0) {
    memcpy(d->bpr, o->pr, sizeof d->bpr), memcpy(d->bai, o->ai, sizeof d->bai);
    memcpy(d->bal, o->al, sizeof d->bal), memcpy(d->blp, o->lp, sizeof d->blp);
  }
  return 0;
}

VfyData* vrVerifyData(int di) {
  VfyData* d = &g_vfy[di];
  return vfyDataInit(d, kVrDtypes[di], di) ? NULL : d;
}

typedef struct {
  int di;
} VfyArg;

typedef struct {
  VfyData* d;
  smpDev dev;
  Req q;
  Out o;
} VfyBody;

static int vfyAlloc(VrGroup* g, int rank, void* p) {
  VfyBody* b = (VfyBody*)p;
  (void)rank;
  return smpDevAlloc(&b->dev, VFY_VR_ROWS, g->v_local, g->cfg.dtype) ||
         reqAlloc(&b->q, VFY_VR_REQS, VFY_VR_N, VFY_VR_WORDS) || outAlloc(&b->o, VFY_VR_ROWS);
}
static int vfyRun(VrGroup* g, int rank, void* p) {
  VfyBody* b = (VfyBody*)p;
  return bodyVerifyRun(g, rank, b->d, &b->dev, &b->q, &b->o);
}
static void vfyRelease(void* p) {
  VfyBody* b = (VfyBody*)p;
  smpDevFree(&b->dev), reqFree(&b->q), outFree(&b->o);
}

static int bodyVerify(VrGroup* g, int rank, const void* argp) {
  VfyBody b;
  memset(&b, 0, sizeof b);
  b.d = &g_vfy[((const VfyArg*)argp)->di];
  return vrRunWithBuffers(g, rank, vfyAlloc, vfyRun, vfyRelease, &b);
}

void vrRunVerify(VrTally* t, int tp, int backend) {
  const int di = (tp + 2 * backend) % 3;
  VfyData* d = &g_vfy[di];
  if (vfyDataInit(d, kVrDtypes[di], di)) {
    fprintf(stderr, "verify: no %s rows or no reference\n", dpsDataTypeName(kVrDtypes[di]));
    t->failed++;
    return;
  }
  VrCfg c = {kVrDtypes[di], VFY_VR_V / tp, VFY_VR_N, VFY_VR_REQS, VR_GATHER_LL, 1,
             VR_LL_DEFAULT, 0};
  VfyArg arg = {di};
  const long before = t->failed;
  vrRunGroup(t, tp, backend, &c, 1, tp + di, bodyVerify, &arg, "verify");
  if (t->failed == before) d->have_base = 1;
}
