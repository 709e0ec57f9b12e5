/* The host reference of chain speculative verify (testing/verify_ref.c,
 * spec section 4), which the GPU tests of dpsVerifyChain will trust.
 *
 *  1. The chain walk on hand-made chains: every draft accepted, the first
 *     rejected, a rejection in the middle (a later draft that matches is not
 *     looked at), N = 1, several requests (flat indices b*N + i), the -1 / 0
 *     fill, the unused candidates[b, 0], invalid sizes.
 *  2. The whole reference verify on hand-made batches: greedy rows by
 *     argmax, per-request parameters, seeds and offsets (position j draws
 *     with offset[b] + j), per-row masks, the soft-cap, the logprobs, batch
 *     invariance, invalid parameters and candidates (nothing written).
 *  3. The statistics that make "sample every row, then walk" a verify
 *     (spec 4): for a target row and one draft x (N = 2 positions), over many
 *     offsets (a) the draft is accepted with probability p(x) (binomial
 *     test, N derived so that a 1 % relative error in p(x) fails), (b) after
 *     a rejection the emitted token t[b, 0] follows p without x,
 *     renormalized (pooled chi-square against float64; never x, never
 *     outside K), (c) after an acceptance the bonus token t[b, 1] follows p;
 *     and with N = 4 positions the distribution of accept_length.
 *  4. Planted bugs (fxRefVerifyBug): the walk comparing with t[b, i], no
 *     bonus token, one offset for every position; the tests above must
 *     reject each (the p-values are printed).
 *
 * DPS_SAMPLE_CHI2_SCALE (a number in (0, 1], default 1) scales the draws of
 * part 3 (make check-valgrind sets it low); the planted-bug runs keep theirs. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "sample_ref.h"
#include "stats.h"
#include "verify_ref.h"

#define CHECK FX_EXPECT

static double g_scale = 1.0;

/* ---- 1. the chain walk, by hand ----------------------------------------------- */
/* Expected outputs of one chain: t[0..N), the number acc of accepted drafts. */
static int expectChain(const char* name, int report, const int32_t* cand, const int64_t* t,
                       int pad_bs, int N, const int* acc) {
  int32_t pr[64], ai[64], al[8];
  for (int r = 0; r < 64; ++r) pr[r] = 0x7777, ai[r] = 0x7777;
  for (int b = 0; b < 8; ++b) al[b] = 0x7777;
  if (fxRefVerifyChain(cand, t, pad_bs, N, pr, ai, al) != 0) {
    if (report) CHECK(0, "%s: the walk failed", name);
    return 1;
  }
  int bad = 0;
  for (int b = 0; b < pad_bs; ++b) {
    bad += al[b] != acc[b] + 1;
    for (int j = 0; j < N; ++j) {
      const int r = b * N + j;
      const int32_t want_pr = j <= acc[b] ? (int32_t)t[r] : 0;
      const int32_t want_ai = j <= acc[b] ? r : -1;
      bad += pr[r] != want_pr || ai[r] != want_ai;
      if (report)
        CHECK(pr[r] == want_pr && ai[r] == want_ai,
              "%s: request %d position %d: predict %d accept_index %d, want %d %d", name, b, j,
              pr[r], ai[r], want_pr, want_ai);
    }
    if (report)
      CHECK(al[b] == acc[b] + 1, "%s: request %d: accept_length %d, want %d", name, b, al[b],
            acc[b] + 1);
  }
  for (int r = pad_bs * N; r < 64; ++r) bad += pr[r] != 0x7777 || ai[r] != 0x7777;
  for (int b = pad_bs; b < 8; ++b) bad += al[b] != 0x7777;
  if (report) CHECK(bad == 0, "%s: %d entries wrong (or written beyond the batch)", name, bad);
  return bad != 0;
}

/* The hand-made chains; returns how many of them came out wrong (report:
 * count each as a failed check). */
#define HAND_CHAINS 8
static int handChains(int report) {
  int wrong = 0;
  { /* every draft accepted: candidates[1..3] = t[0..2]; the bonus t[3] */
    const int32_t c[4] = {11, 5, 7, 9};
    const int64_t t[4] = {5, 7, 9, 2};
    wrong += expectChain("all accepted", report, c, t, 1, 4, (const int[]){3});
  }
  { /* the first draft rejected: only t[0] */
    const int32_t c[4] = {11, 6, 7, 9};
    const int64_t t[4] = {5, 7, 9, 2};
    wrong += expectChain("first rejected", report, c, t, 1, 4, (const int[]){0});
  }
  { /* rejected in the middle: draft 2 (8) != t[1] (7); draft 3 would match
     * t[2] but the walk has stopped */
    const int32_t c[4] = {11, 5, 8, 9};
    const int64_t t[4] = {5, 7, 9, 2};
    wrong += expectChain("middle rejected", report, c, t, 1, 4, (const int[]){1});
  }
  { /* a draft equal to the token of its own position (t[i]), not of the one
     * before (t[i-1]): rejected */
    const int32_t c[3] = {0, 4, 4};
    const int64_t t[3] = {3, 4, 4};
    wrong += expectChain("draft == t[i], != t[i-1]", report, c, t, 1, 3, (const int[]){0});
  }
  { /* N = 1: no draft; predict = t[0], accept_index = 0 */
    const int32_t c[1] = {42};
    const int64_t t[1] = {17};
    wrong += expectChain("N = 1", report, c, t, 1, 1, (const int[]){0});
  }
  { /* three requests of N = 3: flat indices b*N + i; request 1 all accepted,
     * request 0 none, request 2 one; candidates[b, 0] plays no part */
    const int32_t c[9] = {1, 9, 9, 77, 20, 21, 123456, 30, 99};
    const int64_t t[9] = {10, 11, 12, 20, 21, 22, 30, 31, 32};
    wrong += expectChain("pad_bs 3", report, c, t, 3, 3, (const int[]){0, 2, 1});
  }
  { /* N = 1, several requests: accept_index b */
    const int32_t c[3] = {0, 0, 0};
    const int64_t t[3] = {7, 0, 65535};
    wrong += expectChain("pad_bs 3, N = 1", report, c, t, 3, 1, (const int[]){0, 0, 0});
  }
  { /* token 0 is a token like any other (and the fill value of predict) */
    const int32_t c[3] = {5, 0, 0};
    const int64_t t[3] = {0, 0, 3};
    wrong += expectChain("token 0", report, c, t, 1, 3, (const int[]){2});
  }
  return wrong;
}

static void testChainInvalid(void) {
  const int32_t c[4] = {0, 1, 2, 3};
  const int64_t t[4] = {1, 2, 3, 4}, neg[2] = {1, -1}, big[2] = {1, (int64_t)INT32_MAX + 1};
  int32_t pr[4] = {9, 9, 9, 9}, ai[4] = {9, 9, 9, 9}, al[2] = {9, 9};
  CHECK(fxRefVerifyChain(c, t, 1, 0, pr, ai, al) == -1, "N = 0 accepted");
  CHECK(fxRefVerifyChain(c, t, -1, 2, pr, ai, al) == -1, "pad_bs = -1 accepted");
  CHECK(fxRefVerifyChain(c, t, 1 << 16, 1 << 16, pr, ai, al) == -1,
        "pad_bs*N > INT32_MAX accepted");
  CHECK(fxRefVerifyChain(c, neg, 1, 2, pr, ai, al) == -1, "a negative token accepted");
  CHECK(fxRefVerifyChain(c, big, 1, 2, pr, ai, al) == -1, "a token beyond int32 accepted");
  CHECK(fxRefVerifyChain(NULL, t, 1, 2, pr, ai, al) == -1, "NULL candidates accepted");
  CHECK(pr[0] == 9 && ai[0] == 9 && al[0] == 9, "an invalid call wrote its outputs");
  CHECK(fxRefVerifyChain(NULL, NULL, 0, 3, NULL, NULL, NULL) == 0, "pad_bs = 0 refused");
}

/* ---- 2. the whole reference verify, by hand ------------------------------------- */
enum { HV = 40, HN = 3, HB = 4, HW = (HV + 31) / 32 };

typedef struct {
  float logits[HB * HN * HV];
  int32_t cand[HB * HN];
  fxSampleParams params[HB];
  uint64_t seed[HB], offset[HB];
  uint32_t mask[HB * HN * HW];
} handBatch;

/* Four requests of N = 3 over V = 40: 0 greedy with drafts = the argmaxes
 * (all accepted), 1 sampled (T 0.9, top-k 5), 2 masked and capped (cap 3,
 * min-p 0.05, T 1.1), 3 greedy with a wrong first draft; offsets near
 * 2^64 for request 1 (offset[b] + j wraps). */
static void handBatchInit(handBatch* h) {
  uint64_t s = 99;
  for (int i = 0; i < HB * HN * HV; ++i) h->logits[i] = (float)(6.0 * fxUnif01(&s) - 3.0);
  for (int r = 0; r < HB * HN; ++r) h->cand[r] = (int32_t)(fxSplitmix(&s) % HV);
  for (int w = 0; w < HB * HN * HW; ++w) h->mask[w] = 0xffffffffu;
  for (int b = 0; b < HB; ++b) {
    h->params[b] = fxSampleParamsDefault(HV);
    h->seed[b] = 0x1000 + (uint64_t)b;
    h->offset[b] = 1000 * (uint64_t)b;
  }
  h->params[0].temperature = 0.0f;
  h->params[1].temperature = 0.9f, h->params[1].top_k = 5;
  h->offset[1] = UINT64_MAX - 1;
  h->params[2].temperature = 1.1f, h->params[2].min_p = 0.05f, h->params[2].softcap = 3.0f;
  for (int j = 0; j < HN; ++j) /* request 2: every third token masked */
    for (int i = 0; i < HV; i += 3) h->mask[(2 * HN + j) * HW + i / 32] &= ~(1u << (i % 32));
  h->params[3].temperature = 0.0f;
  /* request 0's drafts: the argmaxes of its rows 0 and 1; request 3's first
   * draft: anything but its row 0's argmax */
  for (int b = 0; b < HB; b += 3)
    for (int j = 0; j + 1 < HN; ++j) {
      const float* row = h->logits + (b * HN + j) * HV;
      int32_t best = 0;
      for (int i = 1; i < HV; ++i)
        if (row[i] > row[best]) best = i;
      h->cand[b * HN + j + 1] = b == 0 ? best : (best + 1) % HV;
    }
}

static fxVerifyInput handInput(const handBatch* h, int b0, int nb) {
  fxVerifyInput in;
  in.logits = h->logits + b0 * HN * HV;
  in.V = HV;
  in.candidates = h->cand + b0 * HN;
  in.pad_bs = nb;
  in.N = HN;
  in.params = h->params + b0;
  in.seed = h->seed + b0;
  in.offset = h->offset + b0;
  in.mask = h->mask + b0 * HN * HW;
  return in;
}

/* fxRefVerifyRows against its definition composed here: every row's token
 * from fxRefSampleToken at offset[b] + j, then fxRefVerifyChain. Returns the
 * number of entries that differ (report: as failed checks). */
static int rowsAgainstDefinition(const handBatch* h, int report) {
  int32_t pr[HB * HN], ai[HB * HN], al[HB];
  float lp[HB * HN];
  int64_t tk[HB * HN];
  const fxVerifyInput in = handInput(h, 0, HB);
  const fxVerifyOutput out = {pr, ai, al, lp, tk};
  if (fxRefVerifyRows(&in, &out) != 0) {
    if (report) CHECK(0, "fxRefVerifyRows failed on the hand-made batch");
    return 1;
  }
  int64_t t[HB * HN];
  float want_lp[HB * HN];
  int bad = 0;
  for (int b = 0; b < HB; ++b)
    for (int j = 0; j < HN; ++j) {
      const int r = b * HN + j;
      fxSampleParams p = h->params[b];
      p.allowed = h->mask + r * HW;
      fxRefSampleToken(h->logits + r * HV, HV, &p, h->seed[b], h->offset[b] + (uint64_t)j, &t[r],
                       &want_lp[r]);
      bad += tk[r] != t[r];
    }
  int32_t wpr[HB * HN], wai[HB * HN], wal[HB];
  fxRefVerifyChain(h->cand, t, HB, HN, wpr, wai, wal);
  for (int b = 0; b < HB; ++b) {
    bad += al[b] != wal[b];
    for (int j = 0; j < HN; ++j) {
      const int r = b * HN + j;
      const float wl = j < wal[b] ? want_lp[r] : 0.0f;
      bad += pr[r] != wpr[r] || ai[r] != wai[r] || memcmp(&lp[r], &wl, sizeof wl) != 0;
    }
  }
  if (report)
    CHECK(bad == 0, "fxRefVerifyRows: %d entries differ from fxRefSampleToken at offset[b] + j "
          "then the walk", bad);
  return bad;
}

static void testRows(void) {
  static handBatch h;
  handBatchInit(&h);
  rowsAgainstDefinition(&h, 1);
  int32_t pr[HB * HN], ai[HB * HN], al[HB];
  float lp[HB * HN];
  int64_t tk[HB * HN];
  const fxVerifyInput in = handInput(&h, 0, HB);
  const fxVerifyOutput out = {pr, ai, al, lp, tk};
  CHECK(fxRefVerifyRows(&in, &out) == 0, "the hand-made batch failed");
  /* request 0, greedy with the argmaxes as drafts: all accepted, predict =
   * the argmaxes, the logprobs raw log_softmax values */
  CHECK(al[0] == HN, "greedy request: accept_length %d, want %d", al[0], HN);
  for (int j = 0; j < HN; ++j) {
    const float* row = h.logits + j * HV;
    int32_t best = 0;
    double m = row[0], z = 0;
    for (int i = 1; i < HV; ++i)
      if (row[i] > row[best]) best = i, m = row[i];
    for (int i = 0; i < HV; ++i) z += exp((double)row[i] - m);
    CHECK(pr[j] == best && ai[j] == j, "greedy request, position %d: predict %d index %d, want %d",
          j, pr[j], ai[j], best);
    CHECK(fabs(lp[j] - (float)(-log(z))) <= 1e-6f, "greedy request, position %d: logprob %.9g, "
          "want %.9g", j, lp[j], -log(z));
    if (j > 0) CHECK(h.cand[j] == tk[j - 1], "greedy request: draft %d is not the argmax", j);
  }
  /* request 3, greedy with a wrong first draft: length 1, the correction is
   * the argmax of row 0 */
  CHECK(al[3] == 1 && pr[3 * HN] == tk[3 * HN] && ai[3 * HN] == 3 * HN && ai[3 * HN + 1] == -1 &&
            pr[3 * HN + 1] == 0 && lp[3 * HN + 1] == 0.0f,
        "greedy request 3: length %d predict %d", al[3], pr[3 * HN]);
  /* request 2: no masked token drawn; its rows capped (the logprob of the
   * capped row) */
  for (int j = 0; j < HN; ++j)
    CHECK(tk[2 * HN + j] % 3 != 0, "masked token %lld drawn", (long long)tk[2 * HN + j]);
  /* batch invariance: each request alone gives the same outputs */
  for (int b = 0; b < HB; ++b) {
    int32_t pr1[HN], ai1[HN], al1[1];
    float lp1[HN];
    int64_t tk1[HN];
    const fxVerifyInput in1 = handInput(&h, b, 1);
    const fxVerifyOutput out1 = {pr1, ai1, al1, lp1, tk1};
    CHECK(fxRefVerifyRows(&in1, &out1) == 0, "request %d alone failed", b);
    int same = al1[0] == al[b];
    for (int j = 0; j < HN; ++j)
      same &= pr1[j] == pr[b * HN + j] && (ai1[j] < 0 ? -1 : ai1[j] + b * HN) == ai[b * HN + j] &&
              memcmp(&lp1[j], &lp[b * HN + j], sizeof(float)) == 0 && tk1[j] == tk[b * HN + j];
    CHECK(same, "request %d alone differs from request %d of the batch", b, b);
  }
  /* greedy requests ignore the seed and the offset */
  {
    static handBatch g;
    g = h;
    g.seed[0] ^= 0xabcdef, g.offset[0] += 12345, g.seed[3] += 1, g.offset[3] = 7;
    int32_t pr4[HB * HN], ai4[HB * HN], al4[HB];
    const fxVerifyInput gi = handInput(&g, 0, HB);
    const fxVerifyOutput o4 = {pr4, ai4, al4, NULL, NULL};
    fxRefVerifyRows(&gi, &o4);
    CHECK(memcmp(pr4, pr, HN * sizeof *pr) == 0 &&
              memcmp(pr4 + 3 * HN, pr + 3 * HN, HN * sizeof *pr) == 0 && al4[0] == al[0] &&
              al4[3] == al[3],
          "a greedy request's outputs depend on its seed or offset");
  }
  /* the offsets: position j draws with offset[b] + j (request 1 wraps past
   * 2^64); an offset one higher shifts the tokens by one position */
  {
    static handBatch g;
    g = h;
    for (int j = 0; j < HN; ++j) /* request 1: every row the same logits */
      memcpy(g.logits + (HN + j) * HV, h.logits + HN * HV, HV * sizeof(float));
    int64_t ta[HB * HN], tb[HB * HN];
    int32_t x[HB * HN], y[HB * HN], zz[HB];
    const fxVerifyInput ga = handInput(&g, 0, HB);
    const fxVerifyOutput oa = {x, y, zz, NULL, ta};
    fxRefVerifyRows(&ga, &oa);
    g.offset[1] += 1;
    const fxVerifyOutput ob = {x, y, zz, NULL, tb};
    fxRefVerifyRows(&ga, &ob);
    CHECK(ta[HN + 1] == tb[HN] && ta[HN + 2] == tb[HN + 1],
          "offset + 1 did not shift the positions: %lld %lld / %lld %lld",
          (long long)ta[HN + 1], (long long)ta[HN + 2], (long long)tb[HN], (long long)tb[HN + 1]);
  }
  /* NULL logprob and tokens: the same predict */
  {
    int32_t pr2[HB * HN], ai2[HB * HN], al2[HB];
    const fxVerifyOutput o2 = {pr2, ai2, al2, NULL, NULL};
    CHECK(fxRefVerifyRows(&in, &o2) == 0 && memcmp(pr2, pr, sizeof pr) == 0 &&
              memcmp(al2, al, sizeof al) == 0,
          "without logprob and tokens the outputs differ");
  }
  /* invalid inputs (spec 5): nothing written */
  {
    static handBatch g;
    int32_t pr3[HB * HN], ai3[HB * HN], al3[HB];
    float lp3[HB * HN];
    memset(pr3, 0x55, sizeof pr3), memset(ai3, 0x55, sizeof ai3), memset(al3, 0x55, sizeof al3);
    memset(lp3, 0x55, sizeof lp3);
    const fxVerifyOutput o3 = {pr3, ai3, al3, lp3, NULL};
    const char* what[6] = {"candidate V", "candidate -1", "top_p 0", "T -1", "soft-cap -1", "N 0"};
    for (int k = 0; k < 6; ++k) {
      g = h;
      fxVerifyInput gi = handInput(&g, 0, HB);
      if (k == 0) g.cand[5] = HV;
      if (k == 1) g.cand[HB * HN - 1] = -1;
      if (k == 2) g.params[2].top_p = 0.0f;
      if (k == 3) g.params[3].temperature = -1.0f;
      if (k == 4) g.params[1].softcap = -1.0f;
      if (k == 5) gi.N = 0;
      CHECK(fxRefVerifyRows(&gi, &o3) == -1, "invalid input (%s) accepted", what[k]);
    }
    int untouched = 1;
    for (int r = 0; r < HB * HN; ++r) untouched &= pr3[r] == 0x55555555 && ai3[r] == 0x55555555;
    CHECK(untouched && al3[0] == 0x55555555, "an invalid call wrote its outputs");
  }
  printf("verify rows: greedy drafts = argmaxes all accepted with raw logprobs; a wrong greedy "
         "draft gives the argmax as correction; masks, soft-cap, per-request seeds and offsets "
         "(offset[b] + j, wrapping) as defined; batch invariant; invalid inputs write nothing\n");
}

/* ---- 3. the statistics of section 4 ------------------------------------------------ */
#define P_REJECT 1e-6  /* the tests reject below this p-value */
#define REL_ERR 0.01   /* "a 1 % relative error" */
#define Z_POWER 1.6449 /* one-sided 95 % */

typedef struct {
  const char* name;
  const float* row; /* the target row of every position */
  int64_t V;
  fxSampleParams p; /* with p.allowed: the mask of every row */
  int32_t draft;    /* x */
} vCase;

typedef struct {
  int64_t trials, accepted, rejected;
  int64_t outside_rej; /* after a rejection: x, or a token outside K */
  int64_t outside_acc; /* bonus tokens outside K */
  int64_t bad_layout;  /* trials whose outputs break the layout of spec 4 */
  int64_t mismatch;    /* cross-checks against fxRefVerifyRows that differ */
  double px, nk, z_a, p_a;
  double qmax; /* the largest probability of p without x, renormalized */
  fxChi2Result rej, bon;
} vResult;

/* The walk's outputs of one request keep the layout of spec 4 for its
 * tokens t[0..N) (acc from accept_length). */
static int layoutOk(const int32_t* pr, const int32_t* ai, int32_t al, const int64_t* t, int N) {
  if (al < 1 || al > N) return 0;
  for (int j = 0; j < N; ++j) {
    if (j < al && (pr[j] != t[j] || ai[j] != j)) return 0;
    if (j >= al && (pr[j] != 0 || ai[j] != -1)) return 0;
  }
  return 1;
}

/* Runs `trials` requests of N = 2 positions (both with the case's row)
 * through the verify: the positions' tokens by keep + race (the row filtered
 * once) at fxRefVerifyOffset(2n, j) for request n, then fxRefVerifyChain;
 * every 4096th request also through fxRefVerifyRows, which must agree. */
static vResult runDraft(const vCase* k, int64_t trials, uint64_t seed) {
  vResult r;
  memset(&r, 0, sizeof r);
  const int64_t V = k->V;
  double* prob = (double*)calloc((size_t)V, sizeof *prob);
  unsigned char* kept = (unsigned char*)calloc((size_t)V, 1);
  int64_t* keep = (int64_t*)calloc((size_t)V, sizeof *keep);
  int64_t* crej = (int64_t*)calloc((size_t)V, sizeof *crej);
  int64_t* cacc = (int64_t*)calloc((size_t)V, sizeof *cacc);
  float* capped = (float*)calloc((size_t)V, sizeof *capped);
  float* two = (float*)calloc((size_t)(2 * V), sizeof *two);
  uint32_t* mask2 = NULL;
  int64_t nk = 0, nkt = 0;
  fxRefSampleDist(k->row, V, &k->p, prob, kept, &nk);
  fxRefSampleKeep(k->row, V, &k->p, keep, &nkt);
  fxRefSampleCapRow(k->row, V, k->p.softcap, capped);
  memcpy(two, k->row, (size_t)V * sizeof *two);
  memcpy(two + V, k->row, (size_t)V * sizeof *two);
  const int64_t words = (V + 31) / 32;
  if (k->p.allowed != NULL) {
    mask2 = (uint32_t*)calloc((size_t)(2 * words), sizeof *mask2);
    memcpy(mask2, k->p.allowed, (size_t)words * sizeof *mask2);
    memcpy(mask2 + words, k->p.allowed, (size_t)words * sizeof *mask2);
  }
  fxSampleParams rp = k->p;
  rp.allowed = NULL; /* fxRefVerifyRows takes the mask per row */
  r.px = prob[k->draft];
  r.nk = (double)nk;
  const int32_t cand[2] = {0, k->draft};
  for (int64_t n = 0; n < trials; ++n) {
    const uint64_t o = 2 * (uint64_t)n;
    int64_t t[2];
    for (int j = 0; j < 2; ++j)
      t[j] = fxRefSampleRace(capped, k->p.temperature, keep, nkt, seed, fxRefVerifyOffset(o, j));
    int32_t pr[2], ai[2], al[1];
    fxRefVerifyChain(cand, t, 1, 2, pr, ai, al);
    r.bad_layout += !layoutOk(pr, ai, al[0], t, 2);
    const int32_t drafts = al[0] - 1; /* accepted drafts, as a caller reads them */
    if (drafts == 1) {
      ++r.accepted;
      if (pr[1] >= 0 && pr[1] < V && kept[pr[1]]) ++cacc[pr[1]];
      else ++r.outside_acc;
    } else if (drafts == 0) {
      ++r.rejected;
      if (pr[0] >= 0 && pr[0] < V && kept[pr[0]] && pr[0] != k->draft) ++crej[pr[0]];
      else ++r.outside_rej;
    }
    if ((n & 4095) == 0) { /* the whole reference verify agrees */
      int32_t pr2[2], ai2[2], al2[1];
      int64_t t2[2];
      const fxVerifyInput in = {two, V, cand, 1, 2, &rp, &seed, &o, mask2};
      const fxVerifyOutput out = {pr2, ai2, al2, NULL, t2};
      r.mismatch += fxRefVerifyRows(&in, &out) != 0 || t2[0] != t[0] || t2[1] != t[1] ||
                    pr2[0] != pr[0] || pr2[1] != pr[1] || ai2[1] != ai[1] || al2[0] != al[0];
    }
  }
  r.trials = trials;
  /* (a) acceptance ~ Binomial(trials, p(x)): normal approximation (N p (1 -
   * p) is 1e5 or more in the full runs) */
  if (r.px > 0 && r.px < 1) {
    r.z_a = ((double)r.accepted - (double)trials * r.px) /
            sqrt((double)trials * r.px * (1 - r.px));
    r.p_a = fxNormalTwoSided(r.z_a);
  } else {
    r.p_a = (double)r.accepted == (double)trials * r.px ? 1.0 : 0.0;
  }
  /* (b) after a rejection: p without x, renormalized, over K \ {x} */
  int64_t n = 0;
  double* q = (double*)calloc((size_t)V, sizeof *q);
  int64_t* c = (int64_t*)calloc((size_t)V, sizeof *c);
  for (int64_t i = 0; i < V; ++i)
    if (kept[i] && i != k->draft) {
      q[n] = prob[i] / (1 - r.px), c[n] = crej[i];
      if (q[n] > r.qmax) r.qmax = q[n];
      ++n;
    }
  r.rej = fxChi2Pooled(q, c, n, r.rejected);
  /* (c) after an acceptance: the bonus token follows p over K */
  n = 0;
  for (int64_t i = 0; i < V; ++i)
    if (kept[i]) q[n] = prob[i], c[n++] = cacc[i];
  r.bon = fxChi2Pooled(q, c, n, r.accepted);
  free(q), free(c);
  free(prob), free(kept), free(keep), free(crej), free(cacc), free(capped), free(two), free(mask2);
  return r;
}

/* a p-value for printing: "< 1e-300" where it underflows double */
static const char* pstr(double p) {
  static char buf[4][32];
  static int next = 0;
  char* b = buf[next++ % 4];
  if (p < 1e-300) snprintf(b, 32, "< 1e-300");
  else snprintf(b, 32, "%.3g", p);
  return b;
}

static void printDraft(const char* tag, const char* name, const vResult* r) {
  printf("%s %-34s |K| %3.0f p(x) %.4f N %8lld accepted %8lld (z %+.2f, p %s); after "
         "rejection: %8lld draws, chi2 %8.2f over %3lld bins p %s, %lld x or outside K; bonus: "
         "chi2 %8.2f over %3lld bins p %s, %lld outside K; layout broken %lld, cross-check "
         "differs %lld\n",
         tag, name, r->nk, r->px, (long long)r->trials, (long long)r->accepted, r->z_a,
         pstr(r->p_a), (long long)r->rejected, r->rej.chi2, (long long)r->rej.bins,
         pstr(r->rej.pvalue), (long long)r->outside_rej, r->bon.chi2, (long long)r->bon.bins,
         pstr(r->bon.pvalue), (long long)r->outside_acc, (long long)r->bad_layout,
         (long long)r->mismatch);
}

/* N = 4 positions with rows row[0..3] (the same parameters) and drafts
 * x[1..3]: accept_length L has P(L >= i + 1) = prod_{j < i} p_j(x_{j+1}).
 * Pooled chi-square of the counts of L = 1..4. */
typedef struct {
  double pvalue, chi2, expect[4];
  int64_t count[4], bad_layout, mismatch;
} lenResult;

static lenResult runLengths(const float* rows, int64_t V, const fxSampleParams* p,
                            const int32_t* cand, int64_t trials, uint64_t seed) {
  enum { NP = 4 };
  lenResult r;
  memset(&r, 0, sizeof r);
  int64_t* keep = (int64_t*)calloc((size_t)(NP * V), sizeof *keep);
  float* capped = (float*)calloc((size_t)(NP * V), sizeof *capped);
  double* prob = (double*)calloc((size_t)V, sizeof *prob);
  int64_t nkt[NP], nk;
  double a[NP] = {0, 0, 0, 0};
  for (int j = 0; j < NP; ++j) {
    fxRefSampleKeep(rows + j * V, V, p, keep + j * V, &nkt[j]);
    fxRefSampleCapRow(rows + j * V, V, p->softcap, capped + j * V);
    fxRefSampleDist(rows + j * V, V, p, prob, NULL, &nk);
    if (j + 1 < NP) a[j] = prob[cand[j + 1]]; /* draft j + 1 is accepted w.p. p_j(x_{j+1}) */
  }
  double reach = 1;
  for (int l = 0; l < NP; ++l) { /* P(L = l + 1) */
    r.expect[l] = reach * (l + 1 < NP ? 1 - a[l] : 1);
    reach *= a[l];
  }
  for (int64_t n = 0; n < trials; ++n) {
    const uint64_t o = NP * (uint64_t)n;
    int64_t t[NP];
    for (int j = 0; j < NP; ++j)
      t[j] = fxRefSampleRace(capped + j * V, p->temperature, keep + j * V, nkt[j], seed,
                             fxRefVerifyOffset(o, j));
    int32_t pr[NP], ai[NP], al[1];
    fxRefVerifyChain(cand, t, 1, NP, pr, ai, al);
    r.bad_layout += !layoutOk(pr, ai, al[0], t, NP);
    if (al[0] >= 1 && al[0] <= NP) ++r.count[al[0] - 1];
    if ((n & 4095) == 0) {
      int32_t pr2[NP], ai2[NP], al2[1];
      const fxVerifyInput in = {rows, V, cand, 1, NP, p, &seed, &o, NULL};
      const fxVerifyOutput out = {pr2, ai2, al2, NULL, NULL};
      r.mismatch += fxRefVerifyRows(&in, &out) != 0 || al2[0] != al[0] ||
                    memcmp(pr2, pr, sizeof pr) != 0 || memcmp(ai2, ai, sizeof ai) != 0;
    }
  }
  int64_t sum = 0;
  for (int l = 0; l < NP; ++l) sum += r.count[l];
  const fxChi2Result c = fxChi2Pooled(r.expect, r.count, NP, sum);
  r.chi2 = c.chi2;
  r.pvalue = sum == trials ? c.pvalue : 0.0; /* lengths outside 1..N: rejected */
  free(keep), free(capped), free(prob);
  return r;
}

/* A Zipf-like row: p ~ (1 + rank)^-s, ranks scattered over the indices by
 * a random permutation, logits log(p) + `jitter` uniform noise */
static void zipfRow(float* row, int64_t V, double s, double jitter, uint64_t* st) {
  int64_t* rank = (int64_t*)malloc((size_t)V * sizeof *rank);
  for (int64_t i = 0; i < V; ++i) rank[i] = i;
  for (int64_t i = V - 1; i > 0; --i) {
    const int64_t j = (int64_t)(fxSplitmix(st) % (uint64_t)(i + 1)), tmp = rank[i];
    rank[i] = rank[j];
    rank[j] = tmp;
  }
  for (int64_t i = 0; i < V; ++i)
    row[i] = (float)(4.0 - s * log(1.0 + (double)rank[i]) + jitter * (fxUnif01(st) - 0.5));
  free(rank);
}

/* the index of the j-th largest logit (j = 0: the largest), in the order of
 * the filters (value descending, index ascending); NaN rows are not used */
static const float* g_order_row;
static int byLogit(const void* pa, const void* pb) {
  const int32_t a = *(const int32_t*)pa, b = *(const int32_t*)pb;
  const float va = g_order_row[a], vb = g_order_row[b];
  if (va != vb) return va > vb ? -1 : 1;
  return (a > b) - (a < b);
}
static int32_t nthLargest(const float* row, int64_t V, int j) {
  int32_t* idx = (int32_t*)malloc((size_t)V * sizeof *idx);
  int64_t n = 0;
  for (int32_t i = 0; i < V; ++i)
    if (row[i] == row[i]) idx[n++] = i;
  g_order_row = row;
  qsort(idx, (size_t)n, sizeof *idx, byLogit);
  const int32_t r = j < n ? idx[j] : -1;
  free(idx);
  return r;
}

int main(void) {
  if (fxSampleScaleFromEnv(&g_scale) != 0) return 2;
  if (g_scale < 1) printf("DPS_SAMPLE_CHI2_SCALE=%g: fewer draws\n", g_scale);
  const clock_t c0 = clock();

  CHECK(handChains(1) == 0, "hand-made chains");
  testChainInvalid();
  printf("chain walk: hand-made chains (all accepted, first and middle rejection, N = 1, "
         "pad_bs 3, the -1 / 0 fill) as derived\n");
  testRows();

  /* rows and cases of part 3 */
  uint64_t st = 4242;
  enum { VZ = 96, VG = 160, VC = 64 };
  static float zr[VZ], gr[VG], cr[VC], lrows[4 * VZ];
  static uint32_t cmask[(VC + 31) / 32];
  zipfRow(zr, VZ, 1.3, 0.2, &st);
  zr[5] = NAN, zr[50] = -INFINITY;
  for (int i = 0; i < VG; ++i) { /* Gaussian logits, sd 2 */
    double z = 0;
    for (int u = 0; u < 4; ++u) z += fxUnif01(&st);
    gr[i] = (float)(2.0 * (z - 2.0) * sqrt(3.0));
  }
  for (int i = 0; i < VC; ++i) cr[i] = (float)(60.0 * (fxUnif01(&st) - 0.5)); /* +-30 */
  for (int i = 0; i < VC; ++i)
    if (i % 4 != 1) cmask[i / 32] |= 1u << (i % 32); /* every 4th token masked */

  vCase cases[4];
  fxSampleParams p;
  p = fxSampleParamsDefault(VZ), p.temperature = 0.8f, p.top_k = 8;
  cases[0] = (vCase){"zipf96 T=0.8 top-k 8, x = top", zr, VZ, p, nthLargest(zr, VZ, 0)};
  p = fxSampleParamsDefault(VG), p.top_p = 0.8f;
  cases[1] = (vCase){"gauss160 top-p 0.8, x = 2nd", gr, VG, p, nthLargest(gr, VG, 1)};
  p = fxSampleParamsDefault(VC), p.temperature = 1.0f, p.softcap = 15.0f, p.min_p = 0.02f,
  p.allowed = cmask;
  cases[2] = (vCase){"unif64 cap 15 mask min-p .02", cr, VC, p, 0};
  p = fxSampleParamsDefault(VZ), p.temperature = 0.8f, p.top_k = 8;
  cases[3] = (vCase){"zipf96 top-k 8, x outside K", zr, VZ, p, nthLargest(zr, VZ, 20)};
  { /* case 2's draft: the most likely allowed token after the cap; the cap
     * must matter here (it widens K through min-p) */
    double prob[VC];
    int64_t nk, nk_off;
    fxRefSampleDist(cr, VC, &cases[2].p, prob, NULL, &nk);
    for (int i = 1; i < VC; ++i)
      if (prob[i] > prob[cases[2].draft]) cases[2].draft = i;
    fxSampleParams off = cases[2].p;
    off.softcap = 0.0f;
    fxRefSampleDist(cr, VC, &off, NULL, NULL, &nk_off);
    printf("case '%s': |K| %lld with the cap, %lld without\n", cases[2].name, (long long)nk,
           (long long)nk_off);
    CHECK(nk != nk_off, "the cap does not change case 2's kept set");
  }

  const double zcrit = fxZTwoSided(P_REJECT);
  const clock_t s0 = clock();
  for (int c = 0; c < 4; ++c) {
    const vCase* k = &cases[c];
    double prob[VG];
    unsigned char kept[VG];
    int64_t nk;
    fxRefSampleDist(k->row, k->V, &k->p, prob, kept, &nk);
    const double px = prob[k->draft];
    /* N so that a 1 % relative error in p(x) fails the binomial test 95 %
     * of the time: ((zcrit + 1.645) / 0.01)^2 (1 - p) / p */
    const double need = px > 0 ? fxDrawsFor(px, zcrit, REL_ERR, Z_POWER) : 100000;
    int64_t N = (int64_t)ceil(need * g_scale);
    if (N < 2000) N = 2000;
    const clock_t t0 = clock();
    const vResult r = runDraft(k, N, 0x7e51f00ull + (uint64_t)c);
    printDraft("verify", k->name, &r);
    /* the relative error in the largest probability q after a rejection that
     * its count alone would show (z-test at the same level, 95 %) */
    const double rel_b =
        r.rejected > 0 ? (zcrit + Z_POWER) * sqrt((1 - r.qmax) / (r.qmax * (double)r.rejected)) : 0;
    if (px > 0)
      printf("       N = ((%.3f + 1.645) / 0.01)^2 (1 - p) / p = %.0f for p(x) = %.4f%s; after "
             "rejection the count of q = %.4f alone shows a %.1f %% error; %.1f s\n",
             zcrit, need, px, g_scale < 1 ? " (scaled down: the 1 % claim does not hold)" : "",
             r.qmax, 100 * rel_b, (double)(clock() - t0) / CLOCKS_PER_SEC);
    else
      printf("       p(x) = 0: N = %lld (never accepted); after rejection the count of q = %.4f "
             "alone shows a %.1f %% error; %.1f s\n",
             (long long)N, r.qmax, 100 * rel_b, (double)(clock() - t0) / CLOCKS_PER_SEC);
    CHECK(r.p_a > P_REJECT, "%s: acceptance %lld of %lld, p(x) %.6f: p-value %s", k->name,
          (long long)r.accepted, (long long)r.trials, px, pstr(r.p_a));
    CHECK(r.rej.pvalue > P_REJECT, "%s: tokens after rejection: chi-square p-value %.3g",
          k->name, r.rej.pvalue);
    CHECK(r.accepted == 0 || r.bon.pvalue > P_REJECT, "%s: bonus tokens: chi-square p-value %.3g",
          k->name, r.bon.pvalue);
    CHECK(r.outside_rej == 0 && r.outside_acc == 0,
          "%s: %lld tokens after rejection were x or outside K, %lld bonus tokens outside K",
          k->name, (long long)r.outside_rej, (long long)r.outside_acc);
    CHECK(r.bad_layout == 0 && r.mismatch == 0, "%s: %lld layouts broken, %lld cross-checks differ",
          k->name, (long long)r.bad_layout, (long long)r.mismatch);
    CHECK(r.accepted + r.rejected == r.trials, "%s: lengths outside 1..2", k->name);
  }

  /* accept_length over N = 4 positions: three rows of other distributions
   * (zipf rows of other exponents and permutations), top-k 8, T 0.9; the
   * drafts the 1st, 2nd and 1st most likely of the rows before them */
  for (int j = 0; j < 4; ++j) zipfRow(lrows + j * VZ, VZ, 0.9 + 0.3 * j, 0.3, &st);
  fxSampleParams lp = fxSampleParamsDefault(VZ);
  lp.temperature = 0.9f, lp.top_k = 8;
  const int32_t lcand[4] = {0, nthLargest(lrows, VZ, 0), nthLargest(lrows + VZ, VZ, 1),
                            nthLargest(lrows + 2 * VZ, VZ, 0)};
  int64_t LN = (int64_t)ceil(300000 * g_scale);
  if (LN < 2000) LN = 2000;
  const clock_t t1 = clock();
  const lenResult L = runLengths(lrows, VZ, &lp, lcand, LN, 0x1e4ull);
  printf("accept_length, N = 4 positions, %lld requests: counts %lld %lld %lld %lld, expected "
         "%.0f %.0f %.0f %.0f: chi2 %.2f p %s; layout broken %lld, cross-check differs %lld; "
         "%.1f s\n",
         (long long)LN, (long long)L.count[0], (long long)L.count[1], (long long)L.count[2],
         (long long)L.count[3], L.expect[0] * LN, L.expect[1] * LN, L.expect[2] * LN,
         L.expect[3] * LN, L.chi2, pstr(L.pvalue), (long long)L.bad_layout, (long long)L.mismatch,
         (double)(clock() - t1) / CLOCKS_PER_SEC);
  CHECK(L.pvalue > P_REJECT && L.bad_layout == 0 && L.mismatch == 0,
        "accept_length: p-value %.3g", L.pvalue);
  const double stat_sec = (double)(clock() - s0) / CLOCKS_PER_SEC;

  /* ---- 4. planted bugs: the tests above must reject each ---- */
  static const struct {
    int bug;
    const char* name;
  } bugs[3] = {{FX_VERIFY_BUG_SAME_POSITION, "draft compared with t[b, i]"},
               {FX_VERIFY_BUG_NO_BONUS, "no bonus token (accept_length = acc)"},
               {FX_VERIFY_BUG_SAME_OFFSET, "one offset for every position"}};
  for (int b = 0; b < 3; ++b) {
    const int64_t N = 20000;
    static handBatch h;
    handBatchInit(&h);
    fxRefVerifyBug = bugs[b].bug;
    const vResult r = runDraft(&cases[0], N, 0xbad00ull + (uint64_t)b);
    const lenResult l = runLengths(lrows, VZ, &lp, lcand, N, 0xbad10ull + (uint64_t)b);
    const int chains = handChains(0), rows = rowsAgainstDefinition(&h, 0);
    fxRefVerifyBug = FX_VERIFY_BUG_NONE;
    char tag[96];
    snprintf(tag, sizeof tag, "planted bug (%s):", bugs[b].name);
    printf("%s\n", tag);
    printDraft("      ", cases[0].name, &r);
    const double pmin = fmin(fmin(r.p_a, r.rej.pvalue), fmin(r.bon.pvalue, l.pvalue));
    printf("       accept_length N = 4: chi2 %.1f p %s; smallest p-value %s -> %s; value "
           "tests: %d of %d hand-made chains wrong, %d entries of the hand-made batch differ\n",
           l.chi2, pstr(l.pvalue), pstr(pmin), pmin < P_REJECT ? "rejected" : "NOT REJECTED",
           chains, HAND_CHAINS, rows);
    CHECK(pmin < P_REJECT, "planted bug '%s' not rejected: smallest p-value %.3g", bugs[b].name,
          pmin);
  }

  const double total = (double)(clock() - c0) / CLOCKS_PER_SEC;
  if (fxExpectFailed) {
    fprintf(stderr, "test_verify_ref: %d checks failed\n", fxExpectFailed);
    return 1;
  }
  printf("test_verify_ref: passed (statistics %.1f s, total %.1f s CPU)\n", stat_sec, total);
  return 0;
}
