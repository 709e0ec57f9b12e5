/* dpsSample at tp = 1 on the real device (a communicator over the fixture's
 * NCCL communicator, as test_gpu_select's tp = 1), both backends. tp 2..8
 * on one GPU: test_gpu_virtual_ranks scenario=sample.
 *  (a) 257 mixed rows (tests/gpu/sample_common.h: Gaussian rows with peaks,
 *      flat rows, NaN / -inf / +inf, all -inf and all NaN rows, a plateau;
 *      per-row greedy, temperature only, top-k 1..5000, top-p 0.5..0.99,
 *      min-p 0.05 / 0.2 and combinations, random uint64 seeds and offsets)
 *      for V = 32000 and V = 50257 (not a multiple of 4), fp32 / bf16 /
 *      fp16: every token equals fxRefSampleToken's, every logprob is
 *      within 2e-5 of the reference's; int32 and int64 top-k arrays, scalar
 *      parameters, vocab_limit < V, logprobs not wanted, greedy everywhere
 *      with tokens only (argmax's pass, also under vocab_limit < V); the
 *      path counters of the call add up to its rows;
 *  (b) a row alone (rows = 1), in a sub-batch and at another position of a
 *      permuted batch: the same token and the same logprob bits;
 *  (c) chi-square exactness (spec section 2): for every filter alone and
 *      combined (top-k 5, 50, 400 on a plateau, top-p, min-p, min-p
 *      keeping more than the candidates (fp32, and bf16 for the lean
 *      pass's vector loop), a flat row with top-p 0.99 whose nucleus is
 *      1990 of 2010 tokens, an exact top-p boundary), N draws of one row (one call: many copies of the
 *      row with distinct offsets) against fxRefSampleDist's float64
 *      probabilities: pooled chi-square and z-tests of every p >= 1 %
 *      (stats.h, as test_sample_ref), N so that a 1 % relative error in
 *      the smallest p >= 1 % fails 95 % of the time (capped; printed), and
 *      no token outside K;
 *  (d) a captured graph of dpsSample with parameter arrays, replayed with
 *      the logits and every array changed: equal to eager calls, bit for
 *      bit, and to the reference;
 *  (e) bad arguments: dpsInvalidArgument naming the argument, nothing
 *      written; invalid device array entries: the call succeeds, writes
 *      nothing, and dpsCommGetSampleStats counts it and names the row and
 *      the argument;
 *  (f) the path counters: greedy and empty rows greedy (also a greedy row
 *      holding +inf), temperature-only and top-k <= 64 rows fast, top-k
 *      5000 rows exact;
 *  (g) negative controls: the chi-square of (c) against the distribution
 *      of a reference with a planted bug (top-k keeping k + 1, top-p with
 *      <=) must reject the GPU's draws;
 *  (h) min-p's bound from the row's maximum where the lean pass prunes
 *      the warp that holds it: bf16 rows whose one kept index is alone in
 *      its warp's runs, every draw that index (testMinpIsolatedMax).
 * DPS_SAMPLE_CHI2_SCALE scales the draws of (c) (as in test_sample_ref);
 * DPS_TEST_SMALL=1 runs small shapes only (compute-sanitizer).
 * Usage: test_gpu_sample [nccl|onesided|all] */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_common.h"
#include "sample_common.h"

static double g_scale = 1.0;
static int g_small = 0;

#define P_REJECT 1e-6 /* the pooled chi-square rejects below this p-value */
#define Z_ALPHA 1e-6  /* family-wise level of the per-probability z-tests */
#define P_BIG 0.01    /* "every probability above 1 %" */
#define REL_ERR 0.01  /* "a 1 % relative error" */
#define Z_POWER 1.6449

static double nowS(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int readStats(dpsComm_t comm, dpsSampleStats_t* st) {
  memset(st, 0, sizeof *st);
  FX_CHECK_OK(dpsCommGetSampleStats(comm, st));
  return 0;
}

/* One call on rows [row0, row0 + rows) of d (logits and arrays), outputs
 * into d's tok / lp [0, rows) (poisoned first: a row not written is
 * caught), downloaded into tok / lp (lp NULL: logprobs not wanted). */
static int sampleCall(dpsComm_t comm, smpDev* d, const smpSpec* spec, int64_t row0, int64_t rows,
                      int64_t limit, cudaStream_t s, int64_t* tok, float* lp) {
  const size_t es = dpsDataTypeSize(d->dtype);
  GT_CUDA(cudaMemsetAsync(d->tok, 0xab, (size_t)rows * 8, s));
  GT_CUDA(cudaMemsetAsync(d->lp, 0xab, (size_t)rows * 4, s));
  const dpsSampleParams_t p = smpDpsParams(d, spec, row0);
  FX_CHECK_OK(dpsSample(comm, (const char*)d->logits + (size_t)row0 * (size_t)d->cols * es, rows,
                        d->cols, d->dtype, limit, &p, d->tok, lp ? d->lp : NULL, s));
  GT_CUDA(cudaStreamSynchronize(s));
  GT_CUDA(cudaMemcpy(tok, d->tok, (size_t)rows * 8, cudaMemcpyDeviceToHost));
  if (lp) GT_CUDA(cudaMemcpy(lp, d->lp, (size_t)rows * 4, cudaMemcpyDeviceToHost));
  return 0;
}

typedef struct {
  int64_t *tok, *rtok, *tok2;
  float *lp, *rlp, *lp2;
  unsigned char* clear;
} Res;

static int resAlloc(Res* r, int64_t n) {
  r->tok = (int64_t*)malloc((size_t)n * 8), r->rtok = (int64_t*)malloc((size_t)n * 8);
  r->tok2 = (int64_t*)malloc((size_t)n * 8);
  r->lp = (float*)malloc((size_t)n * 4), r->rlp = (float*)malloc((size_t)n * 4);
  r->lp2 = (float*)malloc((size_t)n * 4);
  r->clear = (unsigned char*)malloc((size_t)n);
  FX_CHECK(r->tok && r->rtok && r->tok2 && r->lp && r->rlp && r->lp2 && r->clear, "host alloc");
  return 0;
}
static void resFree(Res* r) {
  free(r->tok), free(r->rtok), free(r->tok2), free(r->lp), free(r->rlp), free(r->lp2);
  free(r->clear);
}

/* ---- (a), (b): the mixed batch -------------------------------------------------------- */
static int testMixed(dpsComm_t comm, smpHost* h, smpDev* d, Res* res, const char* tag,
                     cudaStream_t s) {
  const int64_t R = h->rows, V = h->V;
  const int64_t VL = V - V / 7 - 3, NL = R < 64 ? R : 64; /* a vocab_limit inside the row */
  char what[256];
  /* arrays, int32 top-k, logprobs */
  const smpSpec a32 = smpSpecArrays(0), a64 = smpSpecArrays(1);
  if (smpRef(h, &a32, 0, R, V, res->rtok, res->rlp)) return 1;
  dpsSampleStats_t st0, st1;
  if (readStats(comm, &st0)) return 1;
  if (sampleCall(comm, d, &a32, 0, R, V, s, res->tok, res->lp)) return 1;
  if (readStats(comm, &st1)) return 1;
  snprintf(what, sizeof what, "%s arrays (int32 top-k)", tag);
  long bad = smpCheckRef(what, h, &a32, 0, R, V, res->tok, res->lp, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)R);
  const uint64_t dg = st1.rows_greedy - st0.rows_greedy, df = st1.rows_fast - st0.rows_fast,
                 de = st1.rows_exact - st0.rows_exact;
  FX_CHECK(dg + df + de == (uint64_t)R && st1.invalid_calls == st0.invalid_calls,
           "%s: path counters grew by greedy %llu fast %llu exact %llu invalid %llu for %lld rows",
           what, (unsigned long long)dg, (unsigned long long)df, (unsigned long long)de,
           (unsigned long long)(st1.invalid_calls - st0.invalid_calls), (long long)R);
  printf("    %s: %lld rows equal to the reference (paths: greedy %llu, fast %llu, exact %llu)\n",
         what, (long long)R, (unsigned long long)dg, (unsigned long long)df,
         (unsigned long long)de);

  /* logprobs not wanted: the same tokens */
  if (sampleCall(comm, d, &a32, 0, R, V, s, res->tok2, NULL)) return 1;
  snprintf(what, sizeof what, "%s without logprobs", tag);
  bad = smpCheckSame(what, R, res->tok2, NULL, res->tok, NULL, NULL);
  FX_CHECK(bad == 0, "%s: %ld rows differ", what, bad);

  /* greedy everywhere, tokens only (argmax's pass; the top-k, seed and
   * offset arrays ignored): the reference's argmax, every row counted greedy */
  const smpSpec gs = {SMP_A_K32 | SMP_A_SEED | SMP_A_OFF, 0.0f, 0, 1.0f, 0.0f, 0, 0};
  if (smpRef(h, &gs, 0, R, V, res->rtok, res->rlp)) return 1;
  if (readStats(comm, &st0)) return 1;
  if (sampleCall(comm, d, &gs, 0, R, V, s, res->tok2, NULL)) return 1;
  if (readStats(comm, &st1)) return 1;
  snprintf(what, sizeof what, "%s greedy, tokens only", tag);
  bad = smpCheckRef(what, h, &gs, 0, R, V, res->tok2, NULL, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)R);
  if (smpExpectPaths(what, &st0, &st1, (uint64_t)R, 0, 0)) return 1;
  /* the same under a vocab_limit inside the row (argmax's pass has its own
   * limit handling) */
  if (smpRef(h, &gs, 0, NL, VL, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &gs, 0, NL, VL, s, res->tok2, NULL)) return 1;
  snprintf(what, sizeof what, "%s greedy, tokens only, vocab_limit %lld", tag, (long long)VL);
  bad = smpCheckRef(what, h, &gs, 0, NL, VL, res->tok2, NULL, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)NL);

  /* (b) a row alone, a sub-batch, another position: the same bits */
  int64_t singles = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int t = h->tmpl[r];
    if (r % 16 != 3 && t != 8 && t != 9 && t != 12 && t != 16 && t != 18) continue;
    if (r > 64 && r % 16 != 3) continue; /* the exact-path templates once each */
    if (sampleCall(comm, d, &a32, r, 1, V, s, res->tok2, res->lp2)) return 1;
    snprintf(what, sizeof what, "%s row %lld alone", tag, (long long)r);
    FX_CHECK(smpCheckSame(what, 1, res->tok2, res->lp2, res->tok + r, res->lp + r, &r) == 0,
             "%s", what);
    ++singles;
  }
  const int64_t sub0 = R / 3, subn = R / 5 + 1;
  if (sampleCall(comm, d, &a32, sub0, subn, V, s, res->tok2, res->lp2)) return 1;
  snprintf(what, sizeof what, "%s rows [%lld, %lld) as a batch", tag, (long long)sub0,
           (long long)(sub0 + subn));
  FX_CHECK(smpCheckSame(what, subn, res->tok2, res->lp2, res->tok + sub0, res->lp + sub0, NULL) ==
               0,
           "%s", what);
  {
    smpHost hp;
    smpDev dp;
    int64_t* perm = (int64_t*)malloc((size_t)R * 8);
    int64_t* want_t = (int64_t*)malloc((size_t)R * 8);
    float* want_l = (float*)malloc((size_t)R * 4);
    FX_CHECK(perm && want_t && want_l, "host alloc");
    for (int64_t j = 0; j < R; ++j) perm[j] = (j * 101 + 37) % R; /* 101: prime to R */
    if (smpHostAlloc(&hp, R, V, h->dtype) || smpDevAlloc(&dp, R, V, h->dtype)) return 1;
    smpHostPermute(&hp, h, perm);
    if (smpDevUpload(&dp, &hp, 0, R, 0, s)) return 1;
    if (sampleCall(comm, &dp, &a32, 0, R, V, s, res->tok2, res->lp2)) return 1;
    for (int64_t j = 0; j < R; ++j) want_t[j] = res->tok[perm[j]], want_l[j] = res->lp[perm[j]];
    snprintf(what, sizeof what, "%s permuted batch", tag);
    bad = smpCheckSame(what, R, res->tok2, res->lp2, want_t, want_l, perm);
    FX_CHECK(bad == 0, "%s: %ld rows differ from their place in the first batch", what, bad);
    smpDevFree(&dp);
    smpHostFree(&hp);
    free(perm), free(want_t), free(want_l);
  }
  printf("    %s: %lld rows alone, a sub-batch of %lld and a permuted batch: the same bits\n",
         tag, (long long)singles, (long long)subn);

  /* int64 top-k and a vocab_limit inside the row (on the first NL rows; the
   * generator kept them clear of the top-p boundary under VL too) */
  if (smpRef(h, &a64, 0, NL, VL, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &a64, 0, NL, VL, s, res->tok, res->lp)) return 1;
  snprintf(what, sizeof what, "%s int64 top-k, vocab_limit %lld", tag, (long long)VL);
  bad = smpCheckRef(what, h, &a64, 0, NL, VL, res->tok, res->lp, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)NL);
  for (int64_t i = 0; i < NL; ++i)
    FX_CHECK(res->tok[i] < VL, "%s: row %lld drew %lld", what, (long long)i, (long long)res->tok[i]);

  /* scalars for the filters and the seed, the offsets from their array */
  const smpSpec sc = {SMP_A_OFF, 0.85f, 40, 0.9f, 0.02f, 0x0123456789abcdefull, 0};
  const int64_t NS = R < 96 ? R : 96;
  int64_t nclear = 0;
  if (smpClearRows(h, &sc, 0, NS, V, res->clear, &nclear)) return 1;
  if (smpRef(h, &sc, 0, NS, V, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &sc, 0, NS, V, s, res->tok, res->lp)) return 1;
  snprintf(what, sizeof what, "%s scalars T 0.85 top-k 40 top-p 0.9 min-p 0.02", tag);
  bad = smpCheckRef(what, h, &sc, 0, NS, V, res->tok, res->lp, res->rtok, res->rlp, res->clear);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)nclear);
  /* every scalar, one seed and offset for all rows */
  const smpSpec sc2 = {0, 0.7f, 0, 1.0f, 0.0f, 42, 7};
  if (smpRef(h, &sc2, 0, NS, V, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &sc2, 0, NS, V, s, res->tok, res->lp)) return 1;
  snprintf(what, sizeof what, "%s scalars only (T 0.7, seed 42, offset 7)", tag);
  bad = smpCheckRef(what, h, &sc2, 0, NS, V, res->tok, res->lp, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)NS);
  printf("    %s: int64 top-k with vocab_limit %lld (%lld rows), scalar parameters (%lld rows, "
         "%lld clear of the top-p boundary): equal to the reference\n",
         tag, (long long)VL, (long long)NL, (long long)NS, (long long)nclear);
  return 0;
}

/* ---- (d) graph ------------------------------------------------------------------------------ */
static int testGraph(dpsComm_t comm, smpHost* h, smpDev* d, Res* res, const char* tag,
                     cudaStream_t s) {
  const int64_t R = h->rows, V = h->V;
  const smpSpec a32 = smpSpecArrays(0);
  char what[200];
  const dpsSampleParams_t p = smpDpsParams(d, &a32, 0);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const dpsResult_t rc = dpsSample(comm, d->logits, R, V, d->dtype, V, &p, d->tok, d->lp, s);
  const cudaError_t ec = cudaStreamEndCapture(s, &g); /* also after a failure */
  FX_CHECK(rc == dpsSuccess, "dpsSample in capture -> %s: %s", dpsGetErrorString(rc),
           dpsGetLastError());
  GT_CUDA(ec);
  GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int k = 0; k < 3; ++k) {
    /* new logits, filters, seeds and offsets in the same buffers */
    if (smpGenMixed(h, 0x6a09e667f3bcc908ull + (uint64_t)k, 5 + 7 * k, V)) return 1;
    if (smpDevUpload(d, h, 0, R, 0, s)) return 1;
    GT_CUDA(cudaMemsetAsync(d->tok, 0xab, (size_t)R * 8, s));
    GT_CUDA(cudaGraphLaunch(ge, s));
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaMemcpy(res->tok2, d->tok, (size_t)R * 8, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(res->lp2, d->lp, (size_t)R * 4, cudaMemcpyDeviceToHost));
    if (sampleCall(comm, d, &a32, 0, R, V, s, res->tok, res->lp)) return 1;
    snprintf(what, sizeof what, "%s graph replay %d vs eager", tag, k);
    FX_CHECK(smpCheckSame(what, R, res->tok2, res->lp2, res->tok, res->lp, NULL) == 0, "%s", what);
    if (smpRef(h, &a32, 0, R, V, res->rtok, res->rlp)) return 1;
    snprintf(what, sizeof what, "%s graph replay %d", tag, k);
    const long bad =
        smpCheckRef(what, h, &a32, 0, R, V, res->tok2, res->lp2, res->rtok, res->rlp, NULL);
    FX_CHECK(bad == 0, "%s: %ld rows wrong", what, bad);
  }
  GT_CUDA(cudaGraphExecDestroy(ge));
  GT_CUDA(cudaGraphDestroy(g));
  printf("    %s: graph replayed 3 times with new logits and arrays: equal to eager calls and "
         "to the reference\n",
         tag);
  return 0;
}

/* ---- (e) bad arguments ------------------------------------------------------------------------ */
/* The call fails with `code` and the message contains s1 or s2. */
#define CHECK_ERR2(call, code, s1, s2)                                                       \
  do {                                                                                       \
    const dpsResult_t r_ = (call);                                                           \
    FX_CHECK(r_ == (code), "%s -> %s (want %s): %s", #call, dpsGetErrorString(r_),          \
             dpsGetErrorString(code), dpsGetLastError());                                    \
    FX_CHECK(strstr(dpsGetLastError(), (s1)) != NULL || strstr(dpsGetLastError(), (s2)),    \
             "%s: message \"%s\" names neither \"%s\" nor \"%s\"", #call, dpsGetLastError(), \
             s1, s2);                                                                        \
  } while (0)

/* Every entry of the outputs still holds the poison 0x5a. */
static int checkUntouched(const smpDev* d, int64_t rows, cudaStream_t s, const char* what) {
  GT_CUDA(cudaStreamSynchronize(s));
  int64_t* t = (int64_t*)malloc((size_t)rows * 8);
  uint32_t* l = (uint32_t*)malloc((size_t)rows * 4);
  FX_CHECK(t && l, "host alloc");
  GT_CUDA(cudaMemcpy(t, d->tok, (size_t)rows * 8, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(l, d->lp, (size_t)rows * 4, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i)
    bad += t[i] != (int64_t)0x5a5a5a5a5a5a5a5aull || l[i] != 0x5a5a5a5au;
  free(t), free(l);
  FX_CHECK(bad == 0, "%s: %lld rows of the outputs were written", what, (long long)bad);
  return 0;
}

static int testBadArgs(dpsComm_t comm, smpHost* h, smpDev* d, Res* res, int64_t capacity,
                       cudaStream_t s) {
  const int64_t V = h->V, R = 8;
  const dpsDataType_t dt = d->dtype;
  GT_CUDA(cudaMemsetAsync(d->tok, 0x5a, (size_t)d->rows * 8, s));
  GT_CUDA(cudaMemsetAsync(d->lp, 0x5a, (size_t)d->rows * 4, s));
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.top_k = 50;
  int64_t* tok = d->tok;
  float* lp = d->lp;
  const void* x = d->logits;
  CHECK_ERR2(dpsSample(NULL, x, R, V, dt, V, &p, tok, lp, s), dpsInvalidArgument, "comm", "comm");
  CHECK_ERR2(dpsSample(comm, NULL, R, V, dt, V, &p, tok, lp, s), dpsInvalidArgument, "logits",
             "logits");
  CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &p, NULL, lp, s), dpsInvalidArgument, "tokens",
             "tokens");
  CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &p, (int64_t*)((char*)tok + 4), lp, s),
             dpsInvalidArgument, "tokens=", "tokens");
  CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &p, tok, (float*)((char*)lp + 2), s),
             dpsInvalidArgument, "logprobs=", "logprobs");
  CHECK_ERR2(dpsSample(comm, x, R, V + 1, dt, V, &p, tok, lp, s), dpsInvalidArgument, "cols",
             "logits is");
  CHECK_ERR2(dpsSample(comm, x, R, V - 1, dt, V, &p, tok, lp, s), dpsInvalidArgument, "cols",
             "logits is");
  CHECK_ERR2(dpsSample(comm, x, capacity + 1, V, dt, V, &p, tok, lp, s), dpsInvalidArgument,
             "rows=", "rows");
  CHECK_ERR2(dpsSample(comm, x, 0, V, dt, V, &p, tok, lp, s), dpsInvalidArgument, "rows=", "rows");
  CHECK_ERR2(dpsSample(comm, x, R, V, dt, 0, &p, tok, lp, s), dpsInvalidArgument, "vocab_limit=",
             "vocab_limit");
  CHECK_ERR2(dpsSample(comm, x, R, V, dt, V + 1, &p, tok, lp, s), dpsInvalidArgument,
             "vocab_limit=", "vocab_limit");
  /* the communicator's dtype is fixed (at creation) */
  FX_CHECK(dpsSample(comm, x, R, V, dt == dpsFloat32 ? dpsBfloat16 : dpsFloat32, V, &p, tok, lp,
                     s) != dpsSuccess,
           "a dtype other than the communicator's was accepted");
  static const float bad_T[3] = {-1.0f, NAN, INFINITY};
  static const float bad_p[3] = {0.0f, 1.5f, NAN};
  static const float bad_m[3] = {1.0f, -0.1f, NAN};
  for (int i = 0; i < 3; ++i) {
    dpsSampleParams_t q = p;
    q.temperature = bad_T[i];
    CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &q, tok, lp, s), dpsInvalidArgument, "temperature",
               "temperature");
    q = p;
    q.top_p = bad_p[i];
    CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &q, tok, lp, s), dpsInvalidArgument, "top_p",
               "top_p");
    q = p;
    q.min_p = bad_m[i];
    CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &q, tok, lp, s), dpsInvalidArgument, "min_p",
               "min_p");
  }
  {
    dpsSampleParams_t q = p; /* int32 and int64 top-k arrays at once */
    q.top_ks = d->k32;
    q.top_ks_i64 = d->k64;
    CHECK_ERR2(dpsSample(comm, x, R, V, dt, V, &q, tok, lp, s), dpsInvalidArgument, "top_k",
               "top_k");
  }
  if (checkUntouched(d, d->rows, s, "refused calls")) return 1;

  /* invalid device entries: success, nothing written, counted and named */
  struct {
    int row;
    const char* arg;
    float T, top_p, min_p;
  } cases[4] = {{3, "top_p", 1.0f, 0.0f, 0.0f},
                {5, "temperature", -1.0f, 0.9f, 0.0f},
                {0, "min_p", 1.0f, 0.9f, 1.0f},
                {7, "temperature", NAN, 0.9f, 0.0f}};
  const smpSpec a32 = smpSpecArrays(0);
  for (int c = 0; c < 4; ++c) {
    if (smpDevUpload(d, h, 0, R, 0, s)) return 1; /* valid arrays, then one bad entry */
    const int r = cases[c].row;
    GT_CUDA(cudaMemcpy(d->T + r, &cases[c].T, 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(d->top_p + r, &cases[c].top_p, 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(d->min_p + r, &cases[c].min_p, 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemsetAsync(d->tok, 0x5a, (size_t)d->rows * 8, s));
    GT_CUDA(cudaMemsetAsync(d->lp, 0x5a, (size_t)d->rows * 4, s));
    dpsSampleStats_t st0, st1;
    if (readStats(comm, &st0)) return 1;
    const dpsSampleParams_t q = smpDpsParams(d, &a32, 0);
    FX_CHECK_OK(dpsSample(comm, x, R, V, dt, V, &q, tok, lp, s));
    char what[96];
    snprintf(what, sizeof what, "%s[%d] invalid", cases[c].arg, r);
    if (checkUntouched(d, d->rows, s, what)) return 1;
    if (readStats(comm, &st1)) return 1;
    const char* msg = dpsGetLastError();
    char row_a[32], row_b[32];
    snprintf(row_a, sizeof row_a, "row %d", r);
    snprintf(row_b, sizeof row_b, "[%d]", r);
    FX_CHECK(st1.invalid_calls == st0.invalid_calls + 1, "%s: invalid_calls %llu -> %llu", what,
             (unsigned long long)st0.invalid_calls, (unsigned long long)st1.invalid_calls);
    FX_CHECK(st1.rows_greedy + st1.rows_fast + st1.rows_exact ==
                 st0.rows_greedy + st0.rows_fast + st0.rows_exact,
             "%s: the refused call's rows were counted", what);
    FX_CHECK(strstr(msg, cases[c].arg) != NULL && (strstr(msg, row_a) || strstr(msg, row_b)),
             "%s: dpsGetLastError() after dpsCommGetSampleStats: \"%s\"", what, msg);
  }
  /* valid again: the same rows draw as the reference says */
  if (smpDevUpload(d, h, 0, R, 0, s)) return 1;
  if (smpRef(h, &a32, 0, R, V, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &a32, 0, R, V, s, res->tok, res->lp)) return 1;
  FX_CHECK(smpCheckRef("after the invalid calls", h, &a32, 0, R, V, res->tok, res->lp, res->rtok,
                       res->rlp, NULL) == 0,
           "a valid call after invalid ones");
  printf("    bad arguments refused (nothing written); 4 invalid device entries: nothing "
         "written, counted, named\n");
  return 0;
}

/* ---- (f) path counters --------------------------------------------------------------------------- */
static int testPaths(dpsComm_t comm, int64_t V, dpsDataType_t dt, Res* res, cudaStream_t s) {
  enum { N = 64 };
  smpHost h;
  smpDev d;
  if (smpHostAlloc(&h, N, V, dt) || smpDevAlloc(&d, N, V, dt)) return 1;
  uint64_t g = 0xfeedull;
  /* rows 0-9 greedy, 10-19 temperature only, 20-39 top-k 50, 40-47 top-k 64
   * (fast); 48-59 top-k 5000 (exact); 60-63 nothing valid (greedy). Rows 8,
   * 9 (greedy) and 18, 19 (temperature only) hold +inf: greedy and fast */
  for (int r = 0; r < N; ++r) {
    const int posinf = r == 8 || r == 9 || r == 18 || r == 19;
    h.kind[r] = r >= 60 ? SMP_ALL_NEGINF : posinf ? SMP_POSINF : SMP_REAL, h.tmpl[r] = 0;
    smpFillRow(h.row + (size_t)r * V, V, h.kind[r], &g);
    smpRoundRow(&h, r);
    smpFilter f = {1.0f, 0, 1.0f, 0.0f};
    if (r < 10) f.T = 0.0f;
    else if (r < 20) f.T = 0.9f;
    else if (r < 40) f.top_k = 50;
    else if (r < 48) f.top_k = 64;
    else f.top_k = 5000;
    smpSetFilter(&h, r, f);
    h.seed[r] = fxSplitmix(&g), h.offset[r] = fxSplitmix(&g);
  }
  if (smpDevUpload(&d, &h, 0, N, 0, s)) return 1;
  const smpSpec a64 = smpSpecArrays(1);
  dpsSampleStats_t st0, st1;
  if (readStats(comm, &st0)) return 1;
  if (sampleCall(comm, &d, &a64, 0, N, V, s, res->tok, res->lp)) return 1;
  if (readStats(comm, &st1)) return 1;
  if (smpExpectPaths("path rows", &st0, &st1, 14, 38, 12)) return 1;
  if (smpRef(&h, &a64, 0, N, V, res->rtok, res->rlp)) return 1;
  FX_CHECK(smpCheckRef("path rows", &h, &a64, 0, N, V, res->tok, res->lp, res->rtok, res->rlp,
                       NULL) == 0,
           "path rows wrong");
  printf("    path counters: greedy +14, fast +38, exact +12 as expected\n");
  smpDevFree(&d);
  smpHostFree(&h);
  return 0;
}

/* ---- (c), (g) chi-square --------------------------------------------------------------------------- */
enum { ROW_ZIPF, ROW_PLATEAU, ROW_FLAT0 };

typedef struct {
  const char* name;
  int row;
  int64_t limit;
  float T;
  int64_t top_k;
  float top_p, min_p;
  int boundary; /* 1: an exact top-p boundary on purpose (equal terms: exact in any arithmetic) */
  int bug;      /* FX_SAMPLE_BUG_*: the negative control run on this case's draws */
  int bf16;     /* the row rounded to bf16 and passed as bf16 (the lean pass's vector loop) */
} ChiCase;

static void chiRow(int which, float* row, int64_t V) {
  uint64_t s = 0xc4c4ull + (uint64_t)which;
  if (which == ROW_FLAT0) { /* 0.0 everywhere: every term of every mass is exactly 1 */
    for (int64_t i = 0; i < V; ++i) row[i] = 0.0f;
    return;
  }
  if (which == ROW_PLATEAU) { /* ~480 values in [0, 3], the rest ~6 nats below */
    for (int64_t i = 0; i < V; ++i)
      row[i] = fxUnif01(&s) < 480.0 / (double)V ? (float)(3.0 * fxUnif01(&s))
                                                : (float)(-6.0 + smpGauss(&s));
    return;
  }
  /* Zipf-like: p ~ (1 + rank)^-1.1, the ranks scattered over the indices */
  int64_t* perm = (int64_t*)malloc((size_t)V * 8);
  for (int64_t i = 0; i < V; ++i) perm[i] = i;
  for (int64_t i = V - 1; i > 0; --i) {
    const int64_t j = (int64_t)(fxSplitmix(&s) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int64_t i = 0; i < V; ++i)
    row[i] = (float)(5.0 - 1.1 * log(1.0 + (double)perm[i]) + 0.05 * (fxUnif01(&s) - 0.5));
  free(perm);
}

/* The distribution of the token path's kept set under a planted bug: K as
 * fxRefSampleKeep computes it with fxRefSampleBug = bug, p_i proportional to
 * exp(s_i) over it (as fxRefSampleDist, which never plants the bug). */
static int bugDist(const float* row, int64_t V, const fxSampleParams* p, int bug, double* prob,
                   unsigned char* kept) {
  int64_t* keep = (int64_t*)malloc((size_t)V * 8);
  int64_t n = 0;
  FX_CHECK(keep != NULL, "host alloc");
  fxRefSampleBug = bug;
  const int rc = fxRefSampleKeep(row, V, p, keep, &n);
  fxRefSampleBug = FX_SAMPLE_BUG_NONE;
  FX_CHECK(rc == 0 && n > 1, "bugged keep: rc %d n %lld", rc, (long long)n);
  memset(kept, 0, (size_t)V);
  for (int64_t i = 0; i < V; ++i) prob[i] = 0;
  const double s0 = (double)dpsSampleScore(row[keep[0]], p->temperature);
  double total = 0;
  for (int64_t j = 0; j < n; ++j) {
    kept[keep[j]] = 1;
    prob[keep[j]] = exp((double)dpsSampleScore(row[keep[j]], p->temperature) - s0);
    total += prob[keep[j]];
  }
  for (int64_t j = 0; j < n; ++j) prob[keep[j]] /= total;
  free(keep);
  return 0;
}

/* Finite logits whose score l / T overflows to +inf tie at a +inf key: the
 * lowest such index wins (spec: ties to the lower index). Each row: 0 below
 * index 8, 10 + i on [8, 128) (early survivors: the warps flush and share
 * their best), 0 on [128, 2048), 2e38 from 2048 on (2e38 / 0.5 = +inf). Once
 * one warp's best is +inf, the race must still visit the lower indices that
 * overflow too: every row's token is 2048. fp32. */
static int testOverflowTie(dpsComm_t comm, int64_t V, int64_t R, cudaStream_t s) {
  float* x = (float*)malloc((size_t)R * (size_t)V * sizeof(float));
  uint64_t* seeds = (uint64_t*)malloc((size_t)R * sizeof(uint64_t));
  int64_t* tok = (int64_t*)malloc((size_t)R * sizeof(int64_t));
  FX_CHECK(x && seeds && tok, "out of host memory\n");
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < V; ++i)
      x[r * V + i] = i >= 2048 ? 2e38f : (i >= 8 && i < 128) ? 10.0f + (float)i : 0.0f;
    seeds[r] = 0x5eed0000ull + (uint64_t)r;
  }
  float* d_x;
  uint64_t* d_seeds;
  int64_t* d_tok;
  GT_CUDA(cudaMalloc((void**)&d_x, (size_t)R * (size_t)V * sizeof(float)));
  GT_CUDA(cudaMalloc((void**)&d_seeds, (size_t)R * sizeof(uint64_t)));
  GT_CUDA(cudaMalloc((void**)&d_tok, (size_t)R * sizeof(int64_t)));
  GT_CUDA(cudaMemcpy(d_x, x, (size_t)R * (size_t)V * sizeof(float), cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(d_seeds, seeds, (size_t)R * sizeof(uint64_t), cudaMemcpyHostToDevice));
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.temperature = 0.5f;
  p.seeds = d_seeds;
  int wrong = 0;
  for (int rep = 0; rep < 8 && !wrong; ++rep) {
    p.offset = (uint64_t)rep;
    FX_CHECK_OK(dpsSample(comm, d_x, R, V, dpsFloat32, V, &p, d_tok, NULL, s));
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaMemcpy(tok, d_tok, (size_t)R * sizeof(int64_t), cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < R; ++r) wrong += tok[r] != 2048;
  }
  FX_CHECK(wrong == 0, "overflowing scores: %d rows not drawn at index 2048 (the lowest +inf key)\n",
           wrong);
  cudaFree(d_x), cudaFree(d_seeds), cudaFree(d_tok);
  free(x), free(seeds), free(tok);
  printf("    +inf keys from overflowing scores: the lowest index, %lld rows x 8 calls\n",
         (long long)R);
  return 0;
}

/* Rows [0, R) of h against the reference: uploaded, drawn with and without
 * logprobs; every token (and logprob) the reference's. */
static int checkRowsRef(dpsComm_t comm, smpHost* h, smpDev* d, Res* res, int64_t R, int64_t V,
                        const char* what, cudaStream_t s) {
  const smpSpec spec = smpSpecArrays(0);
  if (smpDevUpload(d, h, 0, R, 0, s) || smpRef(h, &spec, 0, R, V, res->rtok, res->rlp)) return 1;
  if (sampleCall(comm, d, &spec, 0, R, V, s, res->tok, res->lp)) return 1;
  long bad = smpCheckRef(what, h, &spec, 0, R, V, res->tok, res->lp, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s: %ld of %lld rows wrong", what, bad, (long long)R);
  if (sampleCall(comm, d, &spec, 0, R, V, s, res->tok2, NULL)) return 1;
  bad = smpCheckRef(what, h, &spec, 0, R, V, res->tok2, NULL, res->rtok, res->rlp, NULL);
  FX_CHECK(bad == 0, "%s, without logprobs: %ld of %lld rows wrong", what, bad, (long long)R);
  return 0;
}

/* Rows whose every score overflows downwards: logits in [-3, -2) (about one
 * in 8 -inf) at T = 1e-42, where the race's bound does not prune, and at
 * 5e-39, where it does (the lean pass for 16-bit rows without logprobs):
 * every kept score is -inf, so the token is the lowest index of K, with its
 * logprob (the spec's ties; top-p skipped as for +inf). Row r takes the
 * filter r % 6 of the list below; tokens and logprobs against the
 * reference, then tokens without logprobs. The reference's tokens must differ
 * from the rows' lowest valid index and from their argmax somewhere, or the
 * rows could not tell those answers apart. */
static int testNegOverflow(dpsComm_t comm, int64_t V, dpsDataType_t dtype, int64_t R,
                           cudaStream_t s) {
  static const smpFilter kF[] = {{1.f, 0, 1.f, 0.f},  {1.f, 5, 1.f, 0.f},    {1.f, 100, 1.f, 0.f},
                                 {1.f, 0, 1.f, 0.1f}, {1.f, 0, 0.9f, 0.f}, {1.f, 5, 0.9f, 0.1f}};
  static const float kT[] = {1e-42f, 5e-39f};
  const int nf = (int)(sizeof kF / sizeof kF[0]);
  smpHost h;
  smpDev d;
  Res res;
  if (smpHostAlloc(&h, R, V, dtype) || smpDevAlloc(&d, R, V, dtype) || resAlloc(&res, R)) return 1;
  uint64_t g = 0x6e65676f766572ull;
  for (int64_t r = 0; r < R; ++r) {
    float* x = h.row + (size_t)r * (size_t)V;
    for (int64_t i = 0; i < V; ++i)
      x[i] = (fxSplitmix(&g) & 7u) == 0u ? -INFINITY : (float)(-3.0 + fxUnif01(&g));
    smpRoundRow(&h, r);
    h.seed[r] = fxSplitmix(&g);
    h.offset[r] = fxSplitmix(&g);
    h.kind[r] = SMP_REAL;
    h.tmpl[r] = 0;
  }
  long not_lowest = 0, not_argmax = 0;
  char what[160];
  for (int ti = 0; ti < 2; ++ti) {
    for (int64_t r = 0; r < R; ++r) {
      smpFilter f = kF[r % nf];
      f.T = kT[ti];
      smpSetFilter(&h, r, f);
    }
    snprintf(what, sizeof what, "%s, scores all -inf at T = %g", dpsDataTypeName(dtype),
             (double)kT[ti]);
    if (checkRowsRef(comm, &h, &d, &res, R, V, what, s)) return 1;
    for (int64_t r = 0; r < R; ++r) {
      const float* x = h.row + (size_t)r * (size_t)V;
      int64_t lo = -1, am = -1;
      for (int64_t i = 0; i < V; ++i) {
        if (!(x[i] > -INFINITY)) continue;
        if (lo < 0) lo = i;
        if (am < 0 || x[i] > x[am]) am = i;
      }
      not_lowest += res.rtok[r] != lo;
      not_argmax += res.rtok[r] != am;
    }
  }
  FX_CHECK(not_lowest > 0 && not_argmax > 0,
           "scores all -inf: the reference's tokens are the lowest valid index in all but %ld "
           "and the argmax in all but %ld of %lld rows: the rows cannot tell them apart",
           not_lowest, not_argmax, (long long)(2 * R));
  smpDevFree(&d);
  smpHostFree(&h);
  resFree(&res);
  printf("    %s rows whose scores are all -inf: the reference's tokens, %lld rows x 2 "
         "temperatures (%ld not the lowest valid index, %ld not the argmax)\n",
         dpsDataTypeName(dtype), (long long)R, not_lowest, not_argmax);
  return 0;
}

/* Scores whose fp32 products with log2(e) / 16 lose their residual (beyond
 * about 2.3e7) or clamp (beyond 1.2e13), against the reference, with and
 * without logprobs. fp32 and bf16 (fp16 cannot hold such logits); three
 * kinds of row:
 *  0: values in [-3, 0) (an eighth -inf) and one logit H in {3e7, 1e9, 3e9,
 *     1e10, 1e20} at a random column, or -1e10 alone (every other -inf): the
 *     logprob of the maximum is about 0 (the sum's log was off by up to the
 *     rounding of H's product: +90 nats at 3e9, -3.4e38 for a mask row);
 *  1: every valid value the dtype's lowest (a row of masks), an eighth -inf:
 *     the logprob is -ln |A| (a log-sum added to -3.4e38 before was lost);
 *  2 (fp32 only): b at column c0 and b - j u at c0 + i for i in 1..199
 *     (j = (i - 1) % 5 + 1, u the spacing of floats at b), the rest -inf, at
 *     T = u / 4 or u / 2 (score gaps of 4 j or 2 j, all exact; scores about
 *     5e7 to 1e8), top-p 0.9 or 0.5: the first pass's bucket sums round
 *     these terms by up to 2^4, and a Z taken from them kept 4 of the
 *     nucleus' 33 indices (a review's row); the reference's tokens must go
 *     beyond c0 + 15 somewhere.
 * T = 0 (greedy: the logprob alone), 0.7 and 1 on kinds 0 and 1. */
static int testHugeScores(dpsComm_t comm, int64_t V, dpsDataType_t dtype, int64_t R,
                          cudaStream_t s) {
  static const float kH[] = {3e7f, 1e9f, 3e9f, 1e10f, 1e20f, -1e10f};
  static const smpFilter kF[] = {{1.f, 0, 1.f, 0.f}, {1.f, 5, 1.f, 0.f}, {1.f, 0, 0.9f, 0.f},
                                 {1.f, 0, 1.f, 0.1f}, {1.f, 300, 0.9f, 0.f}};
  static const float kT[] = {0.f, 0.7f, 1.f};
  static const float kBase[] = {26.f, 20.f, 27.f, 100.f, 3.f};
  const int kinds = dtype == dpsFloat32 ? 3 : 2;
  const float lowest = dtype == dpsFloat32 ? -FLT_MAX : -3.38953139e38f; /* bf16's lowest */
  smpHost h;
  smpDev d;
  Res res;
  if (smpHostAlloc(&h, R, V, dtype) || smpDevAlloc(&d, R, V, dtype) || resAlloc(&res, R)) return 1;
  uint64_t g = 0x6875676573636f72ull;
  int64_t* c0 = (int64_t*)malloc((size_t)R * sizeof *c0);
  FX_CHECK(c0 != NULL, "host alloc");
  for (int64_t r = 0; r < R; ++r) {
    float* x = h.row + (size_t)r * (size_t)V;
    const int kind = (int)(r % kinds);
    smpFilter f = kF[(r / kinds) % 5];
    f.T = kT[(r / kinds / 5) % 3];
    c0[r] = -1;
    if (kind == 0) {
      const float H = kH[(r / kinds) % 6];
      const int64_t at = (int64_t)(fxSplitmix(&g) % (uint64_t)V);
      for (int64_t i = 0; i < V; ++i)
        x[i] = H < 0.f || (fxSplitmix(&g) & 7u) == 0u ? -INFINITY : (float)(-3.0 + 3.0 * fxUnif01(&g));
      x[at] = H;
    } else if (kind == 1) {
      for (int64_t i = 0; i < V; ++i) x[i] = (fxSplitmix(&g) & 7u) == 0u ? -INFINITY : lowest;
    } else {
      const float b = kBase[(r / kinds) % 5];
      const float u = nextafterf(b, INFINITY) - b;
      c0[r] = (int64_t)(fxSplitmix(&g) % (uint64_t)(V - 200));
      for (int64_t i = 0; i < V; ++i) x[i] = -INFINITY;
      x[c0[r]] = b;
      for (int64_t i = 1; i < 200; ++i) x[c0[r] + i] = b - (float)((i - 1) % 5 + 1) * u;
      f.T = (r / kinds) % 2 ? u / 4.f : u / 2.f;
      f.top_k = 0;
      f.min_p = 0.f;
      f.top_p = (r / kinds / 2) % 2 ? 0.5f : 0.9f;
    }
    smpRoundRow(&h, r);
    h.seed[r] = fxSplitmix(&g);
    h.offset[r] = fxSplitmix(&g);
    h.kind[r] = SMP_REAL;
    h.tmpl[r] = 0;
    smpSetFilter(&h, r, f);
  }
  char what[96];
  snprintf(what, sizeof what, "%s, scores beyond 2.3e7", dpsDataTypeName(dtype));
  if (checkRowsRef(comm, &h, &d, &res, R, V, what, s)) return 1;
  long deep = 0, kind2 = 0;
  for (int64_t r = 0; r < R; ++r)
    if (c0[r] >= 0) kind2++, deep += res.rtok[r] > c0[r] + 15;
  FX_CHECK(kinds < 3 || deep > 0,
           "%s: the reference drew none of the near-ties' rows beyond its 16th column: the test "
           "cannot tell a short nucleus", what);
  free(c0);
  smpDevFree(&d);
  smpHostFree(&h);
  resFree(&res);
  printf("    %s rows with scores beyond 2.3e7: the reference's tokens and logprobs, %lld rows "
         "(%ld of %ld near-tie rows drawn beyond the 16th column)\n",
         dpsDataTypeName(dtype), (long long)R, deep, kind2);
  return 0;
}

/* min-p's bound is the row's largest logit, wherever the race prunes. bf16
 * rows of V = 32768: 0, but -inf on [15360, 16384) and [31744, 32768) and
 * 1.0 at 32000. T = 1, min_p = 0.5: exp(-1) < 0.5, so min-p keeps 32000
 * alone and every draw is 32000. The lean pass reads runs of 1024 columns,
 * a warp of 16 its runs w and w + 16: warp 15 holds the one value, whose
 * race key the zeros' bound (about ln of their count) usually prunes by
 * then, so that warp has no race winner but the row's maximum. 32 and 96
 * rows, 8 calls each with other offsets; its own communicator. */
static int testMinpIsolatedMax(dpsBackend_t backend, cudaStream_t s) {
  enum { CALLS = 8 };
  const int64_t V = 32768, top = 32000, Rs[2] = {32, 96}, R = 96;
  dpsConfig_t cfg = gtConfig(0, 1, (int)R, 1, V, dpsBfloat16, backend);
  dpsComm_t comm;
  const int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  uint16_t* x = (uint16_t*)malloc((size_t)R * (size_t)V * 2);
  uint64_t* off = (uint64_t*)malloc((size_t)R * 8);
  int64_t* tok = (int64_t*)malloc((size_t)R * 8);
  FX_CHECK(x && off && tok, "host alloc");
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < V; ++i) {
      const int hole = (i >= 15360 && i < 16384) || i >= 31744;
      x[r * V + i] = fxFloatToBf16(i == top ? 1.0f : hole ? -INFINITY : 0.0f);
    }
  void* d_x;
  uint64_t* d_off;
  int64_t* d_tok;
  GT_CUDA(cudaMalloc(&d_x, (size_t)R * (size_t)V * 2));
  GT_CUDA(cudaMalloc((void**)&d_off, (size_t)R * 8));
  GT_CUDA(cudaMalloc((void**)&d_tok, (size_t)R * 8));
  GT_CUDA(cudaMemcpy(d_x, x, (size_t)R * (size_t)V * 2, cudaMemcpyHostToDevice));
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.temperature = 1.0f;
  p.min_p = 0.5f;
  p.seed = 0x150dull;
  p.offsets = d_off;
  int64_t wrong = 0, draws = 0;
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < CALLS; ++c) {
      for (int64_t r = 0; r < Rs[k]; ++r) off[r] = ((uint64_t)(k * CALLS + c) << 20) + (uint64_t)r;
      GT_CUDA(cudaMemcpy(d_off, off, (size_t)Rs[k] * 8, cudaMemcpyHostToDevice));
      FX_CHECK_OK(dpsSample(comm, d_x, Rs[k], V, dpsBfloat16, V, &p, d_tok, NULL, s));
      GT_CUDA(cudaStreamSynchronize(s));
      GT_CUDA(cudaMemcpy(tok, d_tok, (size_t)Rs[k] * 8, cudaMemcpyDeviceToHost));
      for (int64_t r = 0; r < Rs[k]; ++r) wrong += tok[r] != top;
      draws += Rs[k];
    }
  FX_CHECK(wrong == 0, "min-p with an isolated maximum: %lld of %lld draws not %lld (the only "
           "index min-p keeps)\n", (long long)wrong, (long long)draws, (long long)top);
  cudaFree(d_x), cudaFree(d_off), cudaFree(d_tok);
  free(x), free(off), free(tok);
  FX_CHECK_OK(dpsCommDestroy(comm));
  printf("    min-p with an isolated maximum (bf16): every draw the kept index, %lld draws\n",
         (long long)draws);
  return 0;
}

/* The cases of one dtype (a communicator's logits dtype is fixed): bf16
 * (the rows rounded to bf16) or fp32. */
static int testChi(dpsComm_t comm, int bf16, int64_t V, int64_t R, cudaStream_t s,
                   double* seconds) {
  const double t_all = nowS();
  const ChiCase cases[] = {
      {"zipf T=0.8", ROW_ZIPF, 0, 0.8f, 0, 1.0f, 0.0f, 0, 0, 0},
      {"zipf top-k 5", ROW_ZIPF, 0, 1.0f, 5, 1.0f, 0.0f, 0, FX_SAMPLE_BUG_TOPK_PLUS1, 0},
      {"zipf T=1.2 top-k 50", ROW_ZIPF, 0, 1.2f, 50, 1.0f, 0.0f, 0, 0, 0},
      {"plateau top-k 400", ROW_PLATEAU, 0, 1.0f, 400, 1.0f, 0.0f, 0, 0, 0},
      {"zipf top-p 0.5", ROW_ZIPF, 0, 1.0f, 0, 0.5f, 0.0f, 0, 0, 0},
      {"zipf T=0.7 top-p 0.9", ROW_ZIPF, 0, 0.7f, 0, 0.9f, 0.0f, 0, 0, 0},
      {"zipf min-p 0.05", ROW_ZIPF, 0, 1.0f, 0, 1.0f, 0.05f, 0, 0, 0},
      {"zipf T=1.5 min-p 0.2", ROW_ZIPF, 0, 1.5f, 0, 1.0f, 0.2f, 0, 0, 0},
      /* min-p keeps ~370 plateau tokens, beyond the candidates, ~6 % of the
       * mass outside: the race's winner is kept, or the exact path draws */
      {"plateau min-p 0.1 (|K| > candidates)", ROW_PLATEAU, 0, 1.0f, 0, 1.0f, 0.1f, 0, 0, 0},
      {"plateau min-p 0.1 bf16", ROW_PLATEAU, 0, 1.0f, 0, 1.0f, 0.1f, 0, 0, 1},
      {"zipf T=0.9 k20 p0.9 minp0.02", ROW_ZIPF, 0, 0.9f, 20, 0.9f, 0.02f, 0, 0, 0},
      {"plateau T=1.1 k400 p0.95 minp0.01", ROW_PLATEAU, 0, 1.1f, 400, 0.95f, 0.01f, 0, 0, 0},
      {"flat top-p 0.99 limit 2010", ROW_FLAT0, 2010, 1.0f, 0, 0.99f, 0.0f, 0, 0, 0},
      {"flat top-p 0.125 limit 64 (exact boundary)", ROW_FLAT0, 64, 1.0f, 0, 0.125f, 0.0f, 1,
       FX_SAMPLE_BUG_TOPP_LE, 0},
  };
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  const double cap = 6e7; /* draws per case at most */
  enum { CALLS = 16 };    /* calls per download */
  void* d_logits = NULL;
  uint64_t* d_off = NULL;
  int64_t* d_tok = NULL;
  GT_CUDA(cudaMalloc(&d_logits, (size_t)R * (size_t)V * 4));
  GT_CUDA(cudaMalloc((void**)&d_off, (size_t)R * CALLS * 8));
  GT_CUDA(cudaMalloc((void**)&d_tok, (size_t)R * CALLS * 8));
  uint64_t* h_off = NULL;
  int64_t* h_tok = NULL;
  GT_CUDA(cudaMallocHost((void**)&h_off, (size_t)R * CALLS * 8));
  GT_CUDA(cudaMallocHost((void**)&h_tok, (size_t)R * CALLS * 8));
  float* row = (float*)malloc((size_t)V * 4);
  double* prob = (double*)malloc((size_t)V * 8);
  unsigned char* kept = (unsigned char*)malloc((size_t)V);
  int64_t* count = (int64_t*)malloc((size_t)V * 8);
  int64_t* scratch = (int64_t*)malloc((size_t)V * 8);
  FX_CHECK(row && prob && kept && count && scratch, "host alloc");
  int cur_row = -1;
  for (int c = 0; c < ncases; ++c) {
    const ChiCase* k = &cases[c];
    if (k->bf16 != bf16) continue;
    fxSampleParams p = fxSampleParamsDefault(V);
    p.temperature = k->T, p.top_k = (int)k->top_k, p.top_p = k->top_p, p.min_p = k->min_p;
    p.vocab_limit = k->limit > 0 ? k->limit : V;
    const size_t es = k->bf16 ? 2 : 4;
    const dpsDataType_t dt = k->bf16 ? dpsBfloat16 : dpsFloat32;
    if (cur_row != 2 * k->row + k->bf16) { /* R copies: one upload, then doubling copies */
      chiRow(k->row, row, V);
      if (k->bf16) { /* the reference sees the rounded values */
        uint16_t* h16 = (uint16_t*)scratch;
        for (int64_t i = 0; i < V; ++i) {
          h16[i] = fxFloatToBf16(row[i]);
          row[i] = fxBf16ToFloat(h16[i]);
        }
        GT_CUDA(cudaMemcpy(d_logits, h16, (size_t)V * es, cudaMemcpyHostToDevice));
      } else {
        GT_CUDA(cudaMemcpy(d_logits, row, (size_t)V * es, cudaMemcpyHostToDevice));
      }
      for (int64_t have = 1; have < R; have *= 2) {
        const int64_t n = have < R - have ? have : R - have;
        GT_CUDA(cudaMemcpy((char*)d_logits + (size_t)have * V * es, d_logits, (size_t)n * V * es,
                           cudaMemcpyDeviceToDevice));
      }
      cur_row = 2 * k->row + k->bf16;
    }
    FX_CHECK(k->boundary || smpTopPClear(row, V, &p, scratch),
             "%s: a top-p boundary within %g of top_p (change the case)", k->name,
             SMP_BOUNDARY_REL);
    int64_t nk = 0;
    FX_CHECK(fxRefSampleDist(row, V, &p, prob, kept, &nk) == 0, "%s: reference", k->name);
    memset(count, 0, (size_t)V * 8);
    /* N: a 1 % error in the smallest p >= 1 % fails the z-test 95 % of the
     * time; at least 1000 expected draws per kept token where none is >= 1 % */
    const fxSampleCheck pre = fxCheckSampleCounts(prob, kept, count, V, 0, P_BIG, Z_ALPHA);
    const double need = pre.nbig > 0 ? fxDrawsFor(pre.plo, pre.zcrit, REL_ERR, Z_POWER)
                                     : 1000.0 * (double)nk;
    int64_t N = (int64_t)ceil((need < cap ? need : cap) * g_scale);
    if (N < 100000) N = 100000;
    const uint64_t seed = 0x5eed0000ull + (uint64_t)c, base = (uint64_t)c << 40;
    dpsSampleParams_t sp = DPS_SAMPLE_PARAMS_INITIALIZER;
    sp.temperature = k->T, sp.top_k = k->top_k, sp.top_p = k->top_p, sp.min_p = k->min_p;
    sp.seed = seed;
    const double t0 = nowS();
    int64_t done = 0, outside = 0;
    while (done < N) {
      const int64_t chunk = N - done < R * CALLS ? N - done : R * CALLS;
      for (int64_t i = 0; i < chunk; ++i) h_off[i] = base + (uint64_t)(done + i);
      GT_CUDA(cudaMemcpyAsync(d_off, h_off, (size_t)chunk * 8, cudaMemcpyHostToDevice, s));
      for (int64_t c0 = 0; c0 < chunk; c0 += R) {
        const int64_t rows = chunk - c0 < R ? chunk - c0 : R;
        sp.offsets = d_off + c0;
        FX_CHECK_OK(dpsSample(comm, d_logits, rows, V, dt, p.vocab_limit, &sp,
                              d_tok + c0, NULL, s));
      }
      GT_CUDA(cudaMemcpyAsync(h_tok, d_tok, (size_t)chunk * 8, cudaMemcpyDeviceToHost, s));
      GT_CUDA(cudaStreamSynchronize(s));
      for (int64_t i = 0; i < chunk; ++i) {
        const int64_t t = h_tok[i];
        if (t < 0 || t >= V) ++outside;
        else ++count[t];
      }
      /* a few draws of every chunk bit for bit against the reference */
      for (int64_t i = 0; i < chunk; i += chunk / 3 + 1) {
        int64_t rt;
        float rl;
        fxRefSampleToken(row, V, &p, seed, base + (uint64_t)(done + i), &rt, &rl);
        FX_CHECK(h_tok[i] == rt, "%s: draw %lld (offset %llu): token %lld, reference %lld",
                 k->name, (long long)(done + i), (unsigned long long)(base + done + i),
                 (long long)h_tok[i], (long long)rt);
      }
      done += chunk;
    }
    const double sec = nowS() - t0;
    const fxSampleCheck r = fxCheckSampleCounts(prob, kept, count, V, N, P_BIG, Z_ALPHA);
    const double cc = ((r.zcrit + Z_POWER) / REL_ERR) * ((r.zcrit + Z_POWER) / REL_ERR);
    const double pstar = cc / ((double)N + cc);
    printf("    chi2 %-42s |K| %4lld N %9lld bins %4lld chi2 %8.2f p %.3f max|z| %.2f (crit "
           "%.2f, %2lld p >= 1%%) 1%% error fails 95%% for p >= %.4f: %s; %.1f s\n",
           k->name, (long long)r.nk, (long long)N, (long long)r.bins, r.chi2, r.pvalue, r.zmax,
           r.zcrit, (long long)r.nbig, pstar,
           r.nbig == 0 ? "no p >= 1 %"
                       : pstar <= r.plo * (1 + 1e-9) ? "every p >= 1 %" : "the largest only",
           sec);
    FX_CHECK(outside + r.outside == 0, "%s: %lld draws outside K (%lld out of range)", k->name,
             (long long)(outside + r.outside), (long long)outside);
    FX_CHECK(r.pvalue > P_REJECT, "%s: chi-square p-value %.3g (chi2 %.2f, %lld bins)", k->name,
             r.pvalue, r.chi2, (long long)r.bins);
    FX_CHECK(r.zmax < r.zcrit, "%s: a probability off by %.2f sigma (critical %.2f)", k->name,
             r.zmax, r.zcrit);
    /* (g) the same test against a planted bug's distribution must reject */
    if (k->bug != FX_SAMPLE_BUG_NONE) {
      double* bprob = (double*)malloc((size_t)V * 8);
      unsigned char* bkept = (unsigned char*)malloc((size_t)V);
      FX_CHECK(bprob && bkept, "host alloc");
      if (bugDist(row, V, &p, k->bug, bprob, bkept)) return 1;
      const fxSampleCheck b = fxCheckSampleCounts(bprob, bkept, count, V, N, P_BIG, Z_ALPHA);
      const int rejected = b.pvalue < P_REJECT || b.zmax >= b.zcrit || b.outside > 0;
      printf("    negative control (%s) on %s: chi2 %.1f over %lld bins, p-value %.3g, max|z| "
             "%.1f -> %s\n",
             k->bug == FX_SAMPLE_BUG_TOPK_PLUS1 ? "top-k keeps k+1" : "top-p uses <=", k->name,
             b.chi2, (long long)b.bins, b.pvalue, b.zmax, rejected ? "rejected" : "NOT REJECTED");
      FX_CHECK(b.pvalue < P_REJECT, "%s: the planted bug's distribution was not rejected",
               k->name);
      free(bprob), free(bkept);
    }
  }
  cudaFree(d_logits), cudaFree(d_off), cudaFree(d_tok);
  cudaFreeHost(h_off), cudaFreeHost(h_tok);
  free(row), free(prob), free(kept), free(count), free(scratch);
  *seconds = nowS() - t_all;
  return 0;
}

/* ---- the driver ------------------------------------------------------------------------------------ */
static int body(dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double t0 = nowS();
  typedef struct {
    int64_t V;
    dpsDataType_t dtype;
    int64_t rows;
  } Cfg;
  /* 600 rows: at least four per SM on an H200 (132 SMs), so the batch runs the first pass's
   * small blocks (core/sample.c, firstThreads) and its rows alone the large ones */
  static const Cfg full[] = {{32000, dpsFloat32, 257},
                             {32000, dpsFloat16, 600},
                             {50257, dpsBfloat16, 257},
                             {50257, dpsFloat32, 257}};
  static const Cfg small[] = {{4001, dpsBfloat16, 257}, {4096, dpsFloat32, 64}};
  const Cfg* cfgs = g_small ? small : full;
  const int ncfg = g_small ? 2 : 4;
  for (int ci = 0; ci < ncfg; ++ci) {
    const Cfg* c = &cfgs[ci];
    const int64_t capacity = c->rows + 11;
    dpsConfig_t cfg = gtConfig(0, 1, (int)capacity, 1, c->V, c->dtype, backend);
    dpsComm_t comm;
    const int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    char tag[96];
    snprintf(tag, sizeof tag, "%s V=%lld %s", dpsBackendName(backend), (long long)c->V,
             dpsDataTypeName(c->dtype));
    smpHost h;
    smpDev d;
    Res res;
    if (smpHostAlloc(&h, c->rows, c->V, c->dtype) || smpDevAlloc(&d, capacity, c->V, c->dtype) ||
        resAlloc(&res, capacity))
      return 1;
    const int64_t VL = c->V - c->V / 7 - 3;
    if (smpGenMixed(&h, 0x9e3779b97f4a7c15ull * (uint64_t)(ci + 1), ci * 3, VL)) return 1;
    if (smpDevUpload(&d, &h, 0, c->rows, 0, s)) return 1;
    if (testMixed(comm, &h, &d, &res, tag, s)) return 1;
    if (ci == 0 && testBadArgs(comm, &h, &d, &res, capacity, s)) return 1;
    if (ci == 0 && testPaths(comm, c->V, c->dtype, &res, s)) return 1;
    if (c->dtype == dpsFloat32 && testOverflowTie(comm, c->V, c->rows, s)) return 1;
    if (testNegOverflow(comm, c->V, c->dtype, c->rows < 96 ? c->rows : 96, s)) return 1;
    if (c->dtype != dpsFloat16 && testHugeScores(comm, c->V, c->dtype, c->rows < 120 ? c->rows : 120, s))
      return 1;
    if (ci < 2 && testGraph(comm, &h, &d, &res, tag, s)) return 1;
    smpDevFree(&d);
    smpHostFree(&h);
    resFree(&res);
    FX_CHECK_OK(dpsCommDestroy(comm));
  }
  const double t_mixed = nowS() - t0;
  /* (c), (g): one row, R copies per call */
  const int64_t Vc = 4096, Rc = g_small ? 256 : 16384;
  dpsConfig_t cfg = gtConfig(0, 1, (int)Rc, 1, Vc, dpsFloat32, backend);
  dpsComm_t comm;
  const int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  double chi_s = 0, chi16_s = 0;
  if (testChi(comm, 0, Vc, Rc, s, &chi_s)) return 1;
  FX_CHECK_OK(dpsCommDestroy(comm));
  cfg = gtConfig(0, 1, (int)Rc, 1, Vc, dpsBfloat16, backend);
  const int rc16 = gtCreate(&comm, &cfg);
  if (rc16) return rc16;
  if (testChi(comm, 1, Vc, Rc, s, &chi16_s)) return 1;
  chi_s += chi16_s;
  FX_CHECK_OK(dpsCommDestroy(comm));
  if (testMinpIsolatedMax(backend, s)) return 1;
  GT_CUDA(cudaStreamDestroy(s));
  printf("  %s: passed (mixed rows, positions, graph, arguments, paths %.1f s; chi-square %.1f "
         "s)\n",
         dpsBackendName(backend), t_mixed, chi_s);
  return 0;
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_sample", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  if (fxSampleScaleFromEnv(&g_scale) != 0) return 2;
  const char* sm = getenv("DPS_TEST_SMALL");
  g_small = sm && sm[0] && sm[0] != '0';
  if (g_small && g_scale > 0.01) g_scale = 0.01; /* sanitized kernels are slow */
  return gtRunTp1("test_gpu_sample", body, backends, nb, 900);
}
