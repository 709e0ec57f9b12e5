/* dpsVerifyChain at tp = 1 on every backend (the virtual ranks take it to
 * tp = 2..8: tests/gpu/vr/vr_verify.c). Ground truth:
 *  (a) sample + walk: every row drawn by dpsSample with request b's
 *      parameters at offset offset[b] + j (per-row arrays expanded on the
 *      host), the chains walked by the host reference (fxRefVerifyChain):
 *      predict, accept_index, accept_length and logprobs equal bit for bit;
 *      the candidates are built from those tokens so that request b accepts
 *      exactly b % N drafts (mixed rows and filters of sample_common.h,
 *      greedy requests included); also on a graph replayed with new
 *      parameters and candidates, and on a sub-batch;
 *  (b) grammar mask and soft-cap: against the host reference of the whole
 *      verify (fxRefVerifyRows: the same soft-cap, the mask, the filters,
 *      the noise) — tokens exactly, logprobs within SMP_LP_TOL; no masked
 *      token is ever in predict; a fully masked row gives token 0;
 *  (c) statistics: N = 2, draft x; over ~10^6 requests x is accepted with
 *      probability p(x) (z-test) and after a rejection the emitted token
 *      follows p without x (pooled chi-square), with T only, with top-k +
 *      top-p, and with x outside the kept set (never accepted);
 *  (d) argument errors name the argument; nothing is written.
 * DPS_TEST_SMALL=1 shrinks (c); DPS_SAMPLE_CHI2_SCALE scales its draws;
 * DPS_TEST_PART=stats runs (c) alone (a planted bug in the walk fails (a)
 * first; docs/validation.md has the negative control). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"
#include "sample_common.h"
#include "verify_common.h"

#define P_REJECT 1e-6
#define Z_ALPHA 1e-6
#define REL_ERR 0.01
#define Z_POWER 1.6449

static double g_scale = 1.0;
static int g_small = 0;
static int g_stats_only = 0; /* DPS_TEST_PART=stats (negative controls of the statistics) */

/* ---- (a) sample + walk --------------------------------------------------------------- */
static void reqFromRows(const smpHost* h, int B, int n, int r0, uint64_t salt, ReqHost* rh) {
  for (int b = 0; b < B; ++b) {
    const int64_t r = r0 + (int64_t)b * n; /* the request takes its first row's filters */
    rh->T[b] = h->T[r], rh->top_p[b] = h->top_p[r], rh->min_p[b] = h->min_p[r];
    rh->k[b] = h->top_k32[r];
    rh->seed[b] = h->seed[r] ^ salt;
    rh->offset[b] = b % 7 == 3 ? UINT64_MAX - 1 : h->offset[r]; /* offset + j wraps */
  }
}

/* dpsSample on the expanded parameters: the tokens verify must walk. */
static int sampleRows(dpsComm_t comm, const void* logits, int64_t cols, dpsDataType_t dt,
                      int64_t limit, Req* q, int64_t* t, float* lp, cudaStream_t s) {
  const size_t R = (size_t)q->pad_bs * q->n;
  const dpsSampleParams_t p = reqParams(q, 1);
  FX_CHECK_OK(dpsSample(comm, logits, (int64_t)R, cols, dt, limit, &p, q->tok, q->lp, s));
  GT_CUDA(cudaStreamSynchronize(s));
  GT_CUDA(cudaMemcpy(t, q->tok, R * 8, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(lp, q->lp, R * 4, cudaMemcpyDeviceToHost));
  return 0;
}

static int testWalk(dpsComm_t comm, const smpHost* h, const smpDev* d, int n, int64_t limit,
                    const char* tag, cudaStream_t s) {
  const int B = (int)(h->rows / n);
  const size_t R = (size_t)B * n;
  Req q;
  ReqHost* rh = malloc(sizeof *rh);
  int64_t* t = malloc(R * 8);
  float* lp = malloc(R * 4);
  int32_t* cand = malloc(R * 4);
  Out o;
  FX_CHECK(rh && t && lp && cand, "host alloc");
  if (reqAlloc(&q, B, n, 0) || outAlloc(&o, R)) return 1;
  char what[160];
  for (int round = 0; round < 2; ++round) {
    reqFromRows(h, B, n, 0, round * 0x9e3779b97f4a7c15ull, rh);
    if (reqUpload(&q, rh, s)) return 1;
    if (sampleRows(comm, d->logits, d->cols, d->dtype, limit, &q, t, lp, s)) return 1;
    makeCandidates(t, B, n, h->V, cand);
    GT_CUDA(cudaMemcpy(q.cand, cand, R * 4, cudaMemcpyHostToDevice));
    if (round == 0) {
      if (verifyCall(comm, d->logits, d->cols, d->dtype, limit, &q, NULL, 0.0f, &o, s)) return 1;
    } else { /* captured with the previous round's contents, replayed with these */
      cudaGraph_t g;
      cudaGraphExec_t ge;
      const dpsSampleParams_t p = reqParams(&q, 0);
      int32_t *pr, *ai, *al;
      float* glp;
      GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      FX_CHECK_OK(dpsVerifyChain(comm, d->logits, (int64_t)R, d->cols, d->dtype, limit, B, q.cand,
                                 &p, NULL, 0.0f, &pr, &ai, &al, &glp, s));
      GT_CUDA(cudaStreamEndCapture(s, &g));
      GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
      GT_CUDA(cudaMemsetAsync(pr, 0x7f, R * 4, s));
      GT_CUDA(cudaGraphLaunch(ge, s));
      GT_CUDA(cudaStreamSynchronize(s));
      GT_CUDA(cudaMemcpy(o.pr, pr, R * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(o.ai, ai, R * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(o.al, al, (size_t)B * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(o.lp, glp, R * 4, cudaMemcpyDeviceToHost));
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
    snprintf(what, sizeof what, "%s %s", tag, round == 0 ? "eager" : "graph replay");
    const long bad = checkWalk(what, &o, cand, t, lp, B, n, 1, 1);
    FX_CHECK(bad == 0, "%s: %ld of %d requests differ from sample + walk", what, bad, B);
  }
  /* a sub-batch: requests [3, 3 + 5) (another position in the batch) */
  const int B2 = B > 8 ? 5 : 1, b0 = B > 8 ? 3 : 0;
  Req q2;
  if (reqAlloc(&q2, B2, n, 0)) return 1;
  reqFromRows(h, B2, n, b0 * n, 0x51, rh);
  if (reqUpload(&q2, rh, s)) return 1;
  const void* lg2 = (const char*)d->logits + (size_t)b0 * n * d->cols * dpsDataTypeSize(d->dtype);
  if (sampleRows(comm, lg2, d->cols, d->dtype, limit, &q2, t, lp, s)) return 1;
  makeCandidates(t, B2, n, h->V, cand);
  GT_CUDA(cudaMemcpy(q2.cand, cand, (size_t)B2 * n * 4, cudaMemcpyHostToDevice));
  if (verifyCall(comm, lg2, d->cols, d->dtype, limit, &q2, NULL, 0.0f, &o, s)) return 1;
  snprintf(what, sizeof what, "%s sub-batch", tag);
  const long bad = checkWalk(what, &o, cand, t, lp, B2, n, 1, 1);
  FX_CHECK(bad == 0, "%s: %ld requests differ", what, bad);
  reqFree(&q2), reqFree(&q), outFree(&o);
  free(rh), free(t), free(lp), free(cand);
  printf("  %s: sample + walk bit for bit (%d requests x %d, eager, graph, sub-batch)\n", tag, B,
         n);
  return 0;
}

/* A greedy call that wants only tokens (scalar T = 0, seeds as an array, no
 * logprobs): dpsArgmax's pass draws; against the reference's greedy tokens
 * (NaN, +-inf and empty rows of the mixed batch included), eager and in a
 * graph; the eager call counts every row greedy. */
static int testGreedyTokens(dpsComm_t comm, const smpHost* h, const smpDev* d, int n,
                            int64_t limit, const char* tag, cudaStream_t s) {
  const int B = (int)(h->rows / n);
  const size_t R = (size_t)B * n;
  const smpSpec spec = {SMP_A_SEED, 0.0f, 0, 1.0f, 0.0f, 0, 0};
  int64_t* t = malloc(R * 8);
  float* lp = malloc(R * 4);
  int32_t* cand = malloc(R * 4);
  Out o;
  Req q;
  FX_CHECK(t && lp && cand, "host alloc");
  if (smpRef(h, &spec, 0, (int64_t)R, limit, t, lp) || reqAlloc(&q, B, n, 0) || outAlloc(&o, R))
    return 1;
  makeCandidates(t, B, n, h->V, cand);
  GT_CUDA(cudaMemcpy(q.cand, cand, R * 4, cudaMemcpyHostToDevice));
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.temperature = 0.0f;
  p.seeds = d->seed;
  int32_t *pr, *ai, *al;
  for (int graph = 0; graph < 2; ++graph) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    dpsSampleStats_t st0, st1;
    if (!graph) FX_CHECK_OK(dpsCommGetSampleStats(comm, &st0));
    if (graph) GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    FX_CHECK_OK(dpsVerifyChain(comm, d->logits, (int64_t)R, d->cols, d->dtype, limit, B, q.cand,
                               &p, NULL, 0.0f, &pr, &ai, &al, NULL, s));
    if (!graph) { /* every row counted greedy, once */
      FX_CHECK_OK(dpsCommGetSampleStats(comm, &st1));
      if (smpExpectPaths(tag, &st0, &st1, (uint64_t)R, 0, 0)) return 1;
    }
    if (graph) {
      GT_CUDA(cudaStreamEndCapture(s, &g));
      GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
      GT_CUDA(cudaMemsetAsync(pr, 0x7f, R * 4, s));
      GT_CUDA(cudaMemsetAsync(al, 0x7f, (size_t)B * 4, s));
      GT_CUDA(cudaGraphLaunch(ge, s));
    }
    GT_CUDA(cudaStreamSynchronize(s));
    if (graph) cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    GT_CUDA(cudaMemcpy(o.pr, pr, R * 4, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(o.ai, ai, R * 4, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(o.al, al, (size_t)B * 4, cudaMemcpyDeviceToHost));
    char what[160];
    snprintf(what, sizeof what, "%s greedy tokens only (%s)", tag, graph ? "graph" : "eager");
    const long bad = checkWalk(what, &o, cand, t, NULL, B, n, 1, 1);
    FX_CHECK(bad == 0, "%s: %ld of %d requests differ from the reference's argmax + walk", what,
             bad, B);
  }
  reqFree(&q), outFree(&o), free(t), free(lp), free(cand);
  printf("  %s: greedy, tokens only (argmax's pass): the reference's argmax + walk\n", tag);
  return 0;
}

/* ---- (b) grammar mask and soft-cap against the host reference ------------------------ */
static int testMaskCap(dpsComm_t comm, dpsDataType_t dt, int64_t V, int B, int n, float cap,
                       const char* tag, cudaStream_t s) {
  const size_t R = (size_t)B * n;
  const int64_t words = (V + 31) / 32;
  smpHost h;
  if (smpHostAlloc(&h, (int64_t)R, V, dt)) return 1;
  uint64_t g = 0xabcdef12ull + (uint64_t)dt;
  uint32_t* mask = malloc(R * (size_t)words * 4);
  FX_CHECK(mask != NULL, "host alloc");
  for (size_t r = 0; r < R; ++r) {
    float* x = h.row + r * V;
    for (int64_t i = 0; i < V; ++i) x[i] = (float)(2.0 * smpGauss(&g));
    for (int k = 0; k < 4; ++k) x[fxSplitmix(&g) % (uint64_t)V] = (float)(8.0 + 6.0 * fxUnif01(&g));
    if (r % 11 == 5) x[fxSplitmix(&g) % (uint64_t)V] = -INFINITY;
    smpRoundRow(&h, (int64_t)r);
    uint32_t* m = mask + r * words;
    for (int64_t w = 0; w < words; ++w) m[w] = (uint32_t)fxSplitmix(&g); /* about half allowed */
    if (r % 13 == 6) memset(m, 0, (size_t)words * 4);                  /* nothing allowed */
    if (r % 13 == 9) { /* only a few tokens allowed */
      memset(m, 0, (size_t)words * 4);
      for (int k = 0; k < 3; ++k) {
        const uint64_t i = fxSplitmix(&g) % (uint64_t)V;
        m[i / 32] |= 1u << (i % 32);
      }
    }
  }
  /* requests: greedy, T only, top-k, min-p, top-k + min-p */
  ReqHost* rh = malloc(sizeof *rh);
  fxSampleParams* fp = malloc((size_t)B * sizeof *fp);
  FX_CHECK(rh && fp, "host alloc");
  static const smpFilter kinds[5] = {{0.0f, 0, 1.0f, 0.0f},
                                     {0.8f, 0, 1.0f, 0.0f},
                                     {1.0f, 20, 1.0f, 0.0f},
                                     {1.2f, 0, 1.0f, 0.1f},
                                     {0.7f, 40, 1.0f, 0.02f}};
  const int64_t limit = V - 5;
  for (int b = 0; b < B; ++b) {
    const smpFilter f = kinds[b % 5];
    rh->T[b] = f.T, rh->k[b] = (int32_t)f.top_k, rh->top_p[b] = f.top_p, rh->min_p[b] = f.min_p;
    rh->seed[b] = fxSplitmix(&g), rh->offset[b] = fxSplitmix(&g);
    fp[b] = fxSampleParamsDefault(V);
    fp[b].temperature = f.T, fp[b].top_k = (int)f.top_k, fp[b].top_p = f.top_p;
    fp[b].min_p = f.min_p, fp[b].vocab_limit = limit, fp[b].softcap = cap;
  }
  /* the reference's tokens first (candidates from them), then the whole verify */
  int64_t* t = malloc(R * 8);
  int32_t* cand = malloc(R * 4);
  int32_t *pr = malloc(R * 4), *ai = malloc(R * 4), *al = malloc((size_t)B * 4);
  float* rlp = malloc(R * 4);
  FX_CHECK(t && cand && pr && ai && al && rlp, "host alloc");
  for (size_t i = 0; i < R; ++i) cand[i] = 0;
  fxVerifyInput in = {h.row, V, cand, B, n, fp, rh->seed, rh->offset, mask};
  fxVerifyOutput out = {pr, ai, al, rlp, t};
  FX_CHECK(fxRefVerifyRows(&in, &out) == 0, "reference refused");
  makeCandidates(t, B, n, V, cand);
  FX_CHECK(fxRefVerifyRows(&in, &out) == 0, "reference refused");
  /* the device */
  smpDev d;
  Req q;
  Out o;
  if (smpDevAlloc(&d, (int64_t)R, V, dt) || smpDevUpload(&d, &h, 0, (int64_t)R, 0, s) ||
      reqAlloc(&q, B, n, words) || reqUpload(&q, rh, s) || outAlloc(&o, R))
    return 1;
  GT_CUDA(cudaMemcpy(q.cand, cand, R * 4, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(q.mask, mask, R * (size_t)words * 4, cudaMemcpyHostToDevice));
  if (verifyCall(comm, d.logits, V, dt, limit, &q, q.mask, cap, &o, s)) return 1;
  long bad = 0, masked = 0;
  for (int b = 0; b < B; ++b) {
    int ok = o.al[b] == al[b];
    for (int i = 0; i < n; ++i) {
      const size_t r = (size_t)b * n + i;
      ok = ok && o.pr[r] == pr[r] && o.ai[r] == ai[r] && smpLpClose(o.lp[r], rlp[r]);
      if (i < o.al[b]) {
        const int64_t tk = o.pr[r];
        const int allowed = tk >= 0 && tk < V && ((mask[r * words + tk / 32] >> (tk % 32)) & 1u);
        const int empty = (r % 13 == 6); /* nothing allowed: token 0, logprob -inf */
        masked += empty ? !(tk == 0 && o.lp[r] == -INFINITY) : !allowed;
      }
    }
    if (!ok && bad < 5)
      fprintf(stderr, "  %s: request %d (T %g k %d min_p %g): accept_length %d/%d predict[0] %d/%d "
              "lp[0] %.9g/%.9g\n", tag, b, (double)rh->T[b], rh->k[b], (double)rh->min_p[b],
              o.al[b], al[b], o.pr[(size_t)b * n], pr[(size_t)b * n], (double)o.lp[(size_t)b * n],
              (double)rlp[(size_t)b * n]);
    bad += !ok;
  }
  FX_CHECK(bad == 0, "%s: %ld of %d requests differ from the reference verify", tag, bad, B);
  FX_CHECK(masked == 0, "%s: %ld predict entries are masked tokens", tag, masked);
  /* the same call without the mask must differ somewhere (the mask acts) */
  if (verifyCall(comm, d.logits, V, dt, limit, &q, NULL, cap, &o, s)) return 1;
  long diff = 0;
  for (size_t r = 0; r < R; ++r) diff += o.pr[r] != pr[r];
  FX_CHECK(diff > 0, "%s: the mask changed no token", tag);
  smpDevFree(&d), reqFree(&q), outFree(&o), smpHostFree(&h);
  free(mask), free(rh), free(fp), free(t), free(cand), free(pr), free(ai), free(al), free(rlp);
  printf("  %s: mask + soft-cap %g equal to the reference verify (%d requests x %d)\n", tag,
         (double)cap, B, n);
  return 0;
}

/* ---- (c) statistics ------------------------------------------------------------------- */
/* One case: every request the same two rows (row 0 a Zipf-like row, row 1
 * random), draft x; the acceptance rate against p(x) and the emitted token
 * after a rejection against p without x. */
static int statCase(dpsComm_t comm, int64_t V, int B, const char* name, fxSampleParams fpar,
                    int x_rank, cudaStream_t s) {
  const int n = 2;
  const size_t R = (size_t)B * n;
  float* row = malloc((size_t)V * 4);
  double* prob = malloc((size_t)V * 8);
  unsigned char* kept = malloc((size_t)V);
  int64_t* cnt = calloc((size_t)V, 8);
  FX_CHECK(row && prob && kept && cnt, "host alloc");
  uint64_t g = 0x77;
  for (int64_t i = 0; i < V; ++i) row[i] = (float)(4.0 - 1.2 * log(1.0 + (double)((i * 37) % V)) +
                                                   0.1 * fxUnif01(&g));
  int64_t nk = 0;
  FX_CHECK(fxRefSampleDist(row, V, &fpar, prob, kept, &nk) == 0, "dist");
  /* x: the x_rank-th most probable token (x_rank < 0: a token outside K) */
  int64_t x = -1;
  if (x_rank >= 0) { /* repeated argmax over K, the ones taken excluded */
    unsigned char* used = calloc((size_t)V, 1);
    FX_CHECK(used != NULL, "host alloc");
    for (int k = 0; k <= x_rank; ++k) {
      int64_t best = -1;
      for (int64_t i = 0; i < V; ++i)
        if (kept[i] && !used[i] && (best < 0 || prob[i] > prob[best])) best = i;
      if (best < 0) break;
      used[best] = 1;
      x = best;
    }
    free(used);
  } else {
    for (int64_t i = 0; i < V && x < 0; ++i)
      if (!kept[i]) x = i;
  }
  FX_CHECK(x >= 0, "%s: no draft token", name);
  const double px = prob[x];
  const double zc = fxZTwoSided(Z_ALPHA);
  double draws = px > 0 ? fxDrawsFor(px, zc, REL_ERR, Z_POWER) : 2e5;
  if (draws < 2e5) draws = 2e5;
  draws *= g_scale;
  const int calls = (int)ceil(draws / B);
  /* device rows: every request's two rows are `row` (fp32) */
  float* all = malloc(R * (size_t)V * 4);
  int32_t* cand = malloc(R * 4);
  FX_CHECK(all && cand, "host alloc");
  for (size_t r = 0; r < R; ++r) memcpy(all + r * V, row, (size_t)V * 4);
  for (int b = 0; b < B; ++b) cand[(size_t)b * n] = 0, cand[(size_t)b * n + 1] = (int32_t)x;
  void* dl;
  GT_CUDA(cudaMalloc(&dl, R * (size_t)V * 4));
  GT_CUDA(cudaMemcpy(dl, all, R * (size_t)V * 4, cudaMemcpyHostToDevice));
  Req q;
  ReqHost* rh = malloc(sizeof *rh);
  Out o;
  FX_CHECK(rh != NULL, "host alloc");
  if (reqAlloc(&q, B, n, 0) || outAlloc(&o, R)) return 1;
  GT_CUDA(cudaMemcpy(q.cand, cand, R * 4, cudaMemcpyHostToDevice));
  int64_t acc = 0, N = 0;
  for (int c = 0; c < calls; ++c) {
    for (int b = 0; b < B; ++b) {
      rh->T[b] = fpar.temperature, rh->k[b] = fpar.top_k, rh->top_p[b] = fpar.top_p;
      rh->min_p[b] = fpar.min_p;
      rh->seed[b] = 0x1234567ull * (uint64_t)(c + 1) + (uint64_t)b;
      rh->offset[b] = (uint64_t)c;
    }
    if (reqUpload(&q, rh, s)) return 1;
    if (verifyCall(comm, dl, V, dpsFloat32, V, &q, NULL, 0.0f, &o, s)) return 1;
    for (int b = 0; b < B; ++b) {
      const int al = o.al[b];
      FX_CHECK(al == 1 || al == 2, "%s: accept_length %d", name, al);
      if (al == 2) {
        FX_CHECK(o.pr[(size_t)b * n] == x, "%s: accepted but predict[0] = %d", name,
                 o.pr[(size_t)b * n]);
        ++acc;
      } else {
        const int32_t y = o.pr[(size_t)b * n];
        FX_CHECK(y >= 0 && y < V, "%s: token %d", name, y);
        cnt[y]++;
      }
      ++N;
    }
  }
  /* acceptance ~ Binomial(N, p(x)) */
  const double sd = sqrt((double)N * px * (1 - px));
  const double z = px > 0 ? ((double)acc - (double)N * px) / sd : 0.0;
  int ok = px > 0 ? fabs(z) <= zc : acc == 0;
  /* the rejections against p without x */
  int64_t rej = N - acc;
  double* q2 = malloc((size_t)V * 8);
  unsigned char* k2 = malloc((size_t)V);
  FX_CHECK(q2 && k2, "host alloc");
  for (int64_t i = 0; i < V; ++i) {
    q2[i] = i == x ? 0.0 : prob[i] / (1.0 - px);
    k2[i] = kept[i] && i != x;
  }
  const fxSampleCheck chk = fxCheckSampleCounts(q2, k2, cnt, V, rej, 0.01, Z_ALPHA);
  ok = ok && chk.outside == 0 && chk.pvalue >= P_REJECT && chk.zmax <= chk.zcrit && cnt[x] == 0;
  printf("  stats %-22s p(x)=%.4f accepted %lld of %lld (z %.2f, crit %.2f); rejections: chi2 "
         "%.1f over %lld bins, p %.3g, max |z| %.2f (crit %.2f), outside %lld: %s\n",
         name, px, (long long)acc, (long long)N, z, zc, chk.chi2, (long long)chk.bins,
         chk.pvalue, chk.zmax, chk.zcrit, (long long)chk.outside, ok ? "ok" : "FAIL");
  cudaFree(dl), reqFree(&q), outFree(&o);
  free(row), free(prob), free(kept), free(cnt), free(all), free(cand), free(rh), free(q2), free(k2);
  return ok ? 0 : 1;
}

static int testStats(dpsBackend_t backend, cudaStream_t s) {
  const int64_t V = 256;
  const int B = g_small ? 512 : 4096;
  dpsConfig_t cfg = gtConfig(0, 1, B, 2, V, dpsFloat32, backend);
  dpsComm_t comm;
  const int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  fxSampleParams t1 = fxSampleParamsDefault(V);
  fxSampleParams kp = fxSampleParamsDefault(V);
  kp.temperature = 0.8f, kp.top_k = 10, kp.top_p = 0.9f;
  int bad = 0;
  bad += statCase(comm, V, B, "T=1, x 1st", t1, 0, s);
  bad += statCase(comm, V, B, "T=1, x 3rd", t1, 2, s);
  bad += statCase(comm, V, B, "k10 p0.9 T0.8, x 2nd", kp, 1, s);
  bad += statCase(comm, V, B, "k10 p0.9, x outside K", kp, -1, s);
  FX_CHECK_OK(dpsCommDestroy(comm));
  FX_CHECK(bad == 0, "%d statistical cases failed", bad);
  return 0;
}

/* ---- (d) argument errors ---------------------------------------------------------------- */
static int testBadArgs(dpsComm_t comm, const smpDev* d, int n, cudaStream_t s) {
  Req q;
  if (reqAlloc(&q, 2, n, 0)) return 1;
  const dpsSampleParams_t p = reqParams(&q, 0);
  int32_t *pr = (int32_t*)0x1, *ai = (int32_t*)0x1, *al = (int32_t*)0x1;
  float* lp = (float*)0x1;
  const int64_t R = 2 * (int64_t)n;
  struct {
    const char* name;
    int64_t rows;
    int pad_bs;
    const int32_t* cand;
    const int32_t* mask;
    float cap;
    const char* needle;
  } cases[] = {
      {"rows != pad_bs*N", R + 1, 2, q.cand, NULL, 0.0f, "pad_bs*N"},
      {"pad_bs 0", R, 0, q.cand, NULL, 0.0f, "pad_bs=0"},
      {"candidates NULL", R, 2, NULL, NULL, 0.0f, "candidates"},
      {"candidates misaligned", R, 2, (const int32_t*)((const char*)q.cand + 2), NULL, 0.0f,
       "candidates"},
      {"mask misaligned", R, 2, q.cand, (const int32_t*)((const char*)q.cand + 1), 0.0f,
       "vocab_mask"},
      {"softcap -1", R, 2, q.cand, NULL, -1.0f, "softcap=-1"},
      {"softcap nan", R, 2, q.cand, NULL, NAN, "softcap=nan"},
      {"softcap inf", R, 2, q.cand, NULL, INFINITY, "softcap=inf"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    const dpsResult_t r =
        dpsVerifyChain(comm, d->logits, cases[i].rows, d->cols, d->dtype, d->cols, cases[i].pad_bs,
                       cases[i].cand, &p, cases[i].mask, cases[i].cap, &pr, &ai, &al, &lp, s);
    FX_CHECK(r == dpsInvalidArgument && strstr(dpsGetLastError(), cases[i].needle) != NULL,
             "%s: %s: %s", cases[i].name, dpsGetErrorString(r), dpsGetLastError());
    FX_CHECK(pr == (int32_t*)0x1 && ai == (int32_t*)0x1 && al == (int32_t*)0x1 &&
                 lp == (float*)0x1,
             "%s: an output pointer was written", cases[i].name);
  }
  const dpsResult_t r = dpsVerifyChain(comm, d->logits, R, d->cols, d->dtype, d->cols, 2, q.cand,
                                       &p, NULL, 0.0f, NULL, &ai, &al, NULL, s);
  FX_CHECK(r == dpsInvalidArgument && strstr(dpsGetLastError(), "predict") != NULL,
           "predict NULL: %s", dpsGetLastError());
  /* scalar top_p and min_p outside their ranges (spec section 5) */
  static const float bad_p[3] = {0.0f, 1.5f, NAN}, bad_m[3] = {1.0f, -0.1f, NAN};
  for (int i = 0; i < 6; ++i) {
    dpsSampleParams_t bp = p;
    const int is_p = i < 3;
    if (is_p) bp.top_p = bad_p[i];
    else bp.min_p = bad_m[i - 3];
    const char* needle = is_p ? "top_p=" : "min_p=";
    const dpsResult_t rb = dpsVerifyChain(comm, d->logits, R, d->cols, d->dtype, d->cols, 2,
                                          q.cand, &bp, NULL, 0.0f, &pr, &ai, &al, &lp, s);
    FX_CHECK(rb == dpsInvalidArgument && strstr(dpsGetLastError(), needle) != NULL,
             "scalar %s%g: %s: %s", needle, (double)(is_p ? bp.top_p : bp.min_p),
             dpsGetErrorString(rb), dpsGetLastError());
    FX_CHECK(pr == (int32_t*)0x1 && ai == (int32_t*)0x1 && al == (int32_t*)0x1 &&
                 lp == (float*)0x1,
             "scalar %s: an output pointer was written", needle);
  }
  /* found on the device: a candidate outside [0, V) (V, then -1), a
   * temperature < 0 */
  ReqHost* rh = calloc(1, sizeof *rh);
  FX_CHECK(rh != NULL, "host alloc");
  for (int b = 0; b < 2; ++b) rh->T[b] = 1.0f, rh->top_p[b] = 1.0f, rh->seed[b] = (uint64_t)b;
  if (reqUpload(&q, rh, s)) return 1;
  for (int bad = 0; bad < 3; ++bad) {
    int32_t cand[64] = {0};
    float T1 = bad == 1 ? -1.0f : 1.0f;
    if (bad == 0) cand[2 * n - 1] = (int32_t)d->cols; /* == V at tp 1 */
    if (bad == 2) cand[2 * n - 1] = -1;
    GT_CUDA(cudaMemcpy(q.cand, cand, (size_t)R * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(q.T + 1, &T1, 4, cudaMemcpyHostToDevice));
    dpsSampleStats_t st;
    FX_CHECK_OK(dpsCommGetSampleStats(comm, &st));
    const uint64_t inv0 = st.invalid_calls;
    /* a valid call first (the outputs' pointers), then the outputs poisoned */
    int32_t ok_cand[64] = {0};
    GT_CUDA(cudaMemcpy(q.cand, ok_cand, (size_t)R * 4, cudaMemcpyHostToDevice));
    if (bad == 1) GT_CUDA(cudaMemcpy(q.T + 1, &(float){1.0f}, 4, cudaMemcpyHostToDevice));
    FX_CHECK_OK(dpsVerifyChain(comm, d->logits, R, d->cols, d->dtype, d->cols, 2, q.cand, &p, NULL,
                               0.0f, &pr, &ai, &al, &lp, s));
    GT_CUDA(cudaMemsetAsync(pr, 0x5a, (size_t)R * 4, s));
    GT_CUDA(cudaMemsetAsync(al, 0x5a, 8, s));
    GT_CUDA(cudaMemcpyAsync(q.cand, cand, (size_t)R * 4, cudaMemcpyHostToDevice, s));
    GT_CUDA(cudaMemcpyAsync(q.T + 1, &T1, 4, cudaMemcpyHostToDevice, s));
    FX_CHECK_OK(dpsVerifyChain(comm, d->logits, R, d->cols, d->dtype, d->cols, 2, q.cand, &p, NULL,
                               0.0f, &pr, &ai, &al, &lp, s));
    GT_CUDA(cudaStreamSynchronize(s));
    int32_t hp[64], hal[2];
    GT_CUDA(cudaMemcpy(hp, pr, (size_t)R * 4, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(hal, al, 8, cudaMemcpyDeviceToHost));
    int touched = hal[0] != 0x5a5a5a5a || hal[1] != 0x5a5a5a5a;
    for (int64_t i = 0; i < R; ++i) touched |= hp[i] != 0x5a5a5a5a;
    static const char* const what[3] = {"candidate V", "T < 0", "candidate -1"};
    FX_CHECK(!touched, "%s: the invalid call wrote its outputs", what[bad]);
    FX_CHECK_OK(dpsCommGetSampleStats(comm, &st));
    const char* msg = dpsGetLastError();
    FX_CHECK(st.invalid_calls == inv0 + 1, "invalid_calls %llu, was %llu",
             (unsigned long long)st.invalid_calls, (unsigned long long)inv0);
    FX_CHECK(bad != 1 ? strstr(msg, "candidates[") != NULL : strstr(msg, "temperatures[1]") != NULL,
             "%s: the stats name %s", what[bad], msg);
  }
  free(rh);
  reqFree(&q);
  return 0;
}

/* ---- the driver ------------------------------------------------------------------------- */
static int body(dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  typedef struct {
    int64_t V;
    dpsDataType_t dtype;
    int pad_bs, n;
  } Cfg;
  /* N = 11: chains longer than the walk's chunk of 8 positions
   * (DPS_WALK_CHUNK), every acceptance length 0..10 (makeCandidates) */
  static const Cfg cfgs[] = {{32000, dpsBfloat16, 64, 4}, {50257, dpsFloat32, 25, 3},
                             {4001, dpsFloat16, 17, 5}, {4099, dpsBfloat16, 23, 11}};
  for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0] && !g_stats_only; ++ci) {
    const Cfg* c = &cfgs[ci];
    dpsConfig_t cfg = gtConfig(0, 1, c->pad_bs, c->n, c->V, c->dtype, backend);
    dpsComm_t comm;
    const int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    char tag[96];
    snprintf(tag, sizeof tag, "%s V=%lld %s N=%d", dpsBackendName(backend), (long long)c->V,
             dpsDataTypeName(c->dtype), c->n);
    const int64_t rows = (int64_t)c->pad_bs * c->n;
    smpHost h;
    smpDev d;
    if (smpHostAlloc(&h, rows, c->V, c->dtype) || smpDevAlloc(&d, rows, c->V, c->dtype)) return 1;
    const int64_t VL = c->V - c->V / 9;
    if (smpGenMixed(&h, 0x51ed270b27ull * (uint64_t)(ci + 1), (int)ci * 5, VL)) return 1;
    if (smpDevUpload(&d, &h, 0, rows, 0, s)) return 1;
    if (testWalk(comm, &h, &d, c->n, ci == 1 ? VL : c->V, tag, s)) return 1;
    if (testGreedyTokens(comm, &h, &d, c->n, ci == 1 ? VL : c->V, tag, s)) return 1;
    if (ci == 0 && testBadArgs(comm, &d, c->n, s)) return 1;
    if (testMaskCap(comm, c->dtype, c->V, c->pad_bs, c->n, ci == 2 ? 30.0f : 3.0f, tag, s))
      return 1;
    smpDevFree(&d);
    smpHostFree(&h);
    FX_CHECK_OK(dpsCommDestroy(comm));
  }
  if (testStats(backend, s)) return 1;
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_verify", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  if (fxSampleScaleFromEnv(&g_scale) != 0) return 2;
  const char* sm = getenv("DPS_TEST_SMALL");
  g_small = sm && sm[0] && sm[0] != '0';
  const char* part = getenv("DPS_TEST_PART");
  g_stats_only = part && strcmp(part, "stats") == 0;
  if (g_stats_only) printf("DPS_TEST_PART=stats: the statistical cases only\n");
  if (g_small && g_scale > 0.05) g_scale = 0.05;
  return gtRunTp1("test_gpu_verify", body, backends, nb, 900);
}
