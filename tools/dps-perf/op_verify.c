/* dps-perf operations: dpsVerifyChain, the family "verify" (-o verify runs
 * every member below; each also runs by its own name). A case PxNxV is
 * pad_bs = P requests of N positions, rows = P*N; each rank reads its
 * [rows, V/tp] shard and exchanges dpsSample's records; bytes = the shard's
 * bytes (algbw = logits bytes / time), the efficiency is against the HBM
 * read peak, as for the sample family.
 *
 * Members (T, top_k, top_p, seed and offset device arrays, as an engine
 * passes them; top_k / top_p only where the case uses them):
 *   verify_ref_argmax    dpsArgmax on the same P*N rows (reference of verify_greedy)
 *   verify_ref_sample_t  dpsSample on the same rows, T = 0.7 (reference of verify_t)
 *   verify_ref_sample    dpsSample on the same rows, top-k 50 + top-p 0.9, T = 0.7
 *                        (reference of verify_kp and verify_kp_lp)
 *   verify_greedy        dpsVerifyChain, T = 0 for every request
 *   verify_greedy_scalar T = 0 as the scalar (no temperature array, no
 *                        logprobs: the call takes dpsArgmax's pass)
 *   verify_t             T = 0.7, no filter
 *   verify_kp            top-k 50 + top-p 0.9, T = 0.7
 *   verify_kp_lp         the same with logprobs
 * The references take the per-row arrays [rows] that request b's parameters
 * expand to (row b*N + j: request b's T, top_k, top_p, its seed and offset
 * offset[b] + j), so they draw exactly the rows that the verify draws.
 * Request b: seed b, offset 1000 + b + (step-1)*N (a request's offsets
 * advance by N per step, docs/sampling.md). No mask, no soft-cap,
 * vocab_limit = V. Rows: the fixtures' logit values (fxLogitValue), as for
 * argmax and topk; every member here takes dpsSample's one-pass path
 * (greedy, temperature only, top-k <= DPS_SAMPLE_CANDIDATES), whatever the
 * rows.
 *
 * Drafts: before the timed calls of each step (prepare), dpsSample on the
 * rows with the expanded arrays gives t, the token of every row; request b's
 * drafts are candidates[b, i] = t[b*N + i-1] for 1 <= i < cut, a wrong token
 * (t + 1 mod V) at i = cut, and t[b*N + i-1] again after it (a match past the
 * first mismatch, which the walk must not accept); cut = N (every draft
 * matches) for half the requests, 1..N-1 for the others. Column 0 is
 * t[b*N] (a valid token; never compared).
 *
 * Shapes: the PxNxV items of -s, default {8,64,256}x4x152064 (bf16). Valid
 * when tp divides V (every rank holds every row; any pad_bs).
 *
 * Shard widths: the local pass of a tp-way run reads V/tp columns per row.
 * To time it alone (one GPU, nothing crosses a link), run tp = 1 with the
 * vocabulary of one shard; the vocab column then reads as the shard width:
 *   -t 1 -s 64x4x152064   tp = 1 (the full row)
 *   -t 1 -s 64x4x76032    shard width of tp = 2
 *   -t 1 -s 64x4x38016    shard width of tp = 4
 *   -t 1 -s 64x4x19008    shard width of tp = 8
 * (The tokens differ from a tp-way run's of 152064 columns: the rows are
 * other rows. The time is the local pass's, without the exchange.)
 *
 * #wrong counts, per step (after the eager calls and after the replays):
 *  - verify_*: requests whose predict, accept_index or accept_length (or,
 *    for _lp, a logprob) differ from the host walk (fixtures'
 *    fxRefVerifyChain) over prepare's tokens t and the drafts: the ground
 *    truth, given dpsSample (the contract: every row drawn as dpsSample
 *    draws it); logprobs: entry j < accept_length within 1e-4 max(1, |.|)
 *    of l - logsumexp(row) (double on the host), 0 elsewhere;
 *  - verify_greedy, in addition: rows whose t is not the host argmax (ties
 *    to the lower index);
 *  - verify_ref_sample*: rows whose token differs from prepare's (the same
 *    call on the same inputs: the same tokens, eager or replayed);
 *  - verify_ref_argmax: rows whose index or value differ from the host's.
 * prepare fails the case when dpsSample gives a token outside [0, V).
 *
 * Note at the end of each row: time / (bytes / HBM read peak) ("read x");
 * for verify_*: time / its reference's on the same shape and backend, and
 * the difference in us ("argmax x1.10 (+1.2 us)": the targets are
 * greedy <= argmax + 2 us and sampling <= 1.1 x sample, with verify 64x4
 * against sample of 256 rows: the row 64x4 of each), and the mean
 * accept_length of the last step's drafts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dps_perf.h"
#include "fixtures.h"
#include "select_case.h"
#include "verify_ref.h"

#define VFY_K 50     /* top-k of the kp cases */
#define VFY_P 0.9f   /* top-p of the kp cases */
#define VFY_T 0.7f   /* temperature of the sampling cases */
#define VFY_REF "verify_ref_"

/* In the order of dpOpVerify[] below. */
static const DpVariant kVariants[DP_VERIFY_OPS] = {
    /* kind, T, top_k, top_p, min_p, logprobs, flat, ref, scalar_t, mixed */
    {DP_KIND_ARGMAX, 0.0f, 0, 1.0f, 0.0f, 0, 0, NULL, 0, 0},                   /* verify_ref_argmax */
    {DP_KIND_SAMPLE, VFY_T, 0, 1.0f, 0.0f, 0, 0, NULL, 0, 0}, /* verify_ref_sample_t */
    {DP_KIND_SAMPLE, VFY_T, VFY_K, VFY_P, 0.0f, 0, 0, NULL, 0, 0},             /* verify_ref_sample */
    {DP_KIND_VERIFY, 0.0f, 0, 1.0f, 0.0f, 0, 0, VFY_REF "argmax", 0, 0},       /* verify_greedy */
    {DP_KIND_VERIFY, 0.0f, 0, 1.0f, 0.0f, 0, 0, VFY_REF "argmax", 1, 0}, /* verify_greedy_scalar */
    {DP_KIND_VERIFY, VFY_T, 0, 1.0f, 0.0f, 0, 0, VFY_REF "sample_t", 0, 0},    /* verify_t */
    {DP_KIND_VERIFY, VFY_T, VFY_K, VFY_P, 0.0f, 0, 0, VFY_REF "sample", 0, 0}, /* verify_kp */
    {DP_KIND_VERIFY, VFY_T, VFY_K, VFY_P, 0.0f, 1, 0, VFY_REF "sample", 0, 0}, /* verify_kp_lp */
};

static const DpVariant* variantOf(const DpCase* c) { return &kVariants[c->op - dpOpVerify]; }

/* ---- host inputs: the shards, the host argmax / logsumexp of every row,
 * the parameter arrays ------------------------------------------------------------ */

/* The parameter arrays (host inputs 1..5, after the shard) hold pad_bs + rows
 * entries: request b at [b] (the verify's), row b*N + j at [pad_bs + b*N + j]
 * (the references' and prepare's), in one allocation per parameter. */
enum { IN_TEMPS = 1, IN_TOPKS, IN_TOPPS, IN_SEEDS, IN_OFFSETS };

static int hostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  const DpVariant* v = variantOf(c);
  if (dpSelHostRows(c, rank, tp, h, 0)) return 1;
  const size_t q = (size_t)c->pad_bs, rows = q * (size_t)c->n, pr = q + rows;
  if (dpHostIn(h, pr * 4, 1) != IN_TEMPS || dpHostIn(h, pr * 4, 1) != IN_TOPKS ||
      dpHostIn(h, pr * 4, 1) != IN_TOPPS || dpHostIn(h, pr * 8, 1) != IN_SEEDS ||
      dpHostIn(h, pr * 8, 1) != IN_OFFSETS)
    return 1;
  for (int k = 0; k < 2; ++k) {
    const int step = k + 1;
    float* temps = (float*)h->in[IN_TEMPS].step[k];
    int32_t* topks = (int32_t*)h->in[IN_TOPKS].step[k];
    float* topps = (float*)h->in[IN_TOPPS].step[k];
    uint64_t* seeds = (uint64_t*)h->in[IN_SEEDS].step[k];
    uint64_t* offsets = (uint64_t*)h->in[IN_OFFSETS].step[k];
    /* entry `at`: request `req`'s parameters at `step`, drawing at its
     * position j (j = 0 for the request's own entry) */
    for (size_t at = 0; at < pr; ++at) {
      const size_t req = at < q ? at : (at - q) / (size_t)c->n;
      const size_t j = at < q ? 0 : (at - q) % (size_t)c->n;
      temps[at] = v->temperature;
      topks[at] = v->top_k;
      topps[at] = v->top_p;
      seeds[at] = (uint64_t)req;
      offsets[at] = 1000u + (uint64_t)req + (uint64_t)(step - 1) * (uint64_t)c->n + (uint64_t)j;
    }
  }
  return 0;
}

/* ---- device buffers ------------------------------------------------------------------ */

typedef struct {
  const DpVariant* v;
  int pad_bs, n;
  size_t rows;
  void* in;
  DpOut tok;     /* int64: the references' tokens / indices [rows] */
  DpOut val;     /* verify_ref_argmax's values [rows] */
  int64_t* pre;  /* prepare's tokens [rows] */
  int32_t* cand; /* [pad_bs, N] */
  dpsSampleParams_t per_req, per_row;
  /* the library's outputs (persistent; set by run) */
  int32_t* predict;
  int32_t* accept_index;
  int32_t* accept_length;
  float* logprobs;
  /* host copies of the outputs */
  const int32_t *predict_h, *accept_index_h, *accept_length_h;
  const float* lp_h;
  /* host scratch */
  int64_t* t_h;    /* prepare's tokens of the current step */
  int32_t* cand_h;
  int32_t* want;   /* the host walk: predict [rows], accept_index [rows], accept_length [pad_bs] */
  double accepted; /* mean accept_length of the current step's drafts */
} Member;

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  Member* x = (Member*)b->op;
  const DpVariant* v = variantOf(c);
  x->v = v;
  x->pad_bs = c->pad_bs;
  x->n = c->n;
  x->rows = (size_t)c->pad_bs * (size_t)c->n;
  const size_t r = x->rows, q = (size_t)c->pad_bs;
  x->in = dpDevIn(b, h, 0, l);
  if (v->kind != DP_KIND_VERIFY) x->tok = dpDevOut(b, r * 8, 0xab, l);
  if (v->kind == DP_KIND_ARGMAX) x->val = dpDevOut(b, r * dpsDataTypeSize(c->dtype), -1, l);
  x->pre = (int64_t*)dpDevTmp(b, r * 8, l);
  x->cand = (int32_t*)dpDevTmp(b, r * 4, l);
  const float* temps = (const float*)dpDevIn(b, h, IN_TEMPS, l);
  const int32_t* topks = (const int32_t*)dpDevIn(b, h, IN_TOPKS, l);
  const float* topps = (const float*)dpDevIn(b, h, IN_TOPPS, l);
  const uint64_t* seeds = (const uint64_t*)dpDevIn(b, h, IN_SEEDS, l);
  const uint64_t* offsets = (const uint64_t*)dpDevIn(b, h, IN_OFFSETS, l);
  if (v->kind == DP_KIND_VERIFY) {
    x->predict_h = (const int32_t*)dpLibOut(b, &x->predict, r * 4, l);
    x->accept_index_h = (const int32_t*)dpLibOut(b, &x->accept_index, r * 4, l);
    x->accept_length_h = (const int32_t*)dpLibOut(b, &x->accept_length, q * 4, l);
    if (v->logprobs) x->lp_h = (const float*)dpLibOut(b, &x->logprobs, r * 4, l);
  }
  x->t_h = (int64_t*)dpMem(b, r * 8, l);
  x->cand_h = (int32_t*)dpMem(b, r * 4, l);
  x->want = (int32_t*)dpMem(b, (2 * r + q) * 4, l);
  if (l->status != DP_OK) return 1;
  /* per request: the arrays' first pad_bs entries; per row: the rest */
  for (int k = 0; k < 2; ++k) {
    dpsSampleParams_t prm = DPS_SAMPLE_PARAMS_INITIALIZER;
    const size_t at = k ? q : 0;
    prm.temperatures = temps + at;
    prm.seeds = seeds + at;
    prm.offsets = offsets + at;
    if (v->top_k > 0) prm.top_ks = topks + at;
    if (v->top_p < 1.0f) prm.top_ps = topps + at;
    if (!k && v->scalar_t) {
      prm.temperatures = NULL;
      prm.temperature = v->temperature;
    }
    if (k) x->per_row = prm;
    else x->per_req = prm;
  }
  return 0;
}

/* Drafts of request q at `step` (header): cut = N, every draft matches;
 * else drafts 1..cut-1 match and draft cut does not. */
static int cutOf(int q, int step, int n) {
  if (n < 2 || (q + step) % 2 == 0) return n;
  return 1 + (q / 2 + step) % (n - 1);
}

/* The rows' tokens t by dpsSample (the references' and verify's draws), and
 * for verify the drafts and the host walk over them. */
static int prepare(const DpCase* c, dpsComm_t comm, void* op, int tp, int step, cudaStream_t s,
                   DpLocal* l) {
  Member* x = (Member*)op;
  if (x->v->kind == DP_KIND_ARGMAX) return 0;
  const int64_t V = c->vocab, rows = (int64_t)x->rows;
  const int n = x->n;
  DP_TRY_DPS(l, dpsSample(comm, x->in, rows, V / tp, c->dtype, V, &x->per_row, x->pre, NULL, s),
             fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(x->t_h, x->pre, x->rows * 8, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  for (int64_t r = 0; r < rows; ++r)
    if (x->t_h[r] < 0 || x->t_h[r] >= V) {
      dpSetLocal(l, DP_ERR, "prepare: dpsSample gave row %lld the token %lld (V = %lld)",
                 (long long)r, (long long)x->t_h[r], (long long)V);
      return 1;
    }
  if (x->v->kind != DP_KIND_VERIFY) return 0;
  long long total = 0;
  for (int q = 0; q < x->pad_bs; ++q) {
    const int64_t* t = x->t_h + (size_t)q * n;
    int32_t* cand = x->cand_h + (size_t)q * n;
    const int cut = cutOf(q, step, n);
    cand[0] = (int32_t)t[0];
    for (int i = 1; i < n; ++i) cand[i] = (int32_t)(i == cut ? (t[i - 1] + 1) % V : t[i - 1]);
  }
  int32_t* want_al = x->want + 2 * x->rows;
  if (fxRefVerifyChain(x->cand_h, x->t_h, x->pad_bs, n, x->want, x->want + x->rows, want_al)) {
    dpSetLocal(l, DP_ERR, "prepare: fxRefVerifyChain rejected the drafts");
    return 1;
  }
  for (int q = 0; q < x->pad_bs; ++q) total += want_al[q];
  x->accepted = (double)total / x->pad_bs;
  DP_TRY_CUDA(l, cudaMemcpyAsync(x->cand, x->cand_h, x->rows * 4, cudaMemcpyHostToDevice, s),
              fail);
  return 0;
fail:
  return 1;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  Member* x = (Member*)op;
  const int64_t rows = (int64_t)x->rows, vl = c->vocab / tp;
  if (x->v->kind == DP_KIND_ARGMAX)
    return dpSelCall(c, comm, x->in, x->rows, tp, 0, x->val.dev, (int64_t*)x->tok.dev, NULL, s);
  if (x->v->kind == DP_KIND_SAMPLE)
    return dpsSample(comm, x->in, rows, vl, c->dtype, c->vocab, &x->per_row, (int64_t*)x->tok.dev,
                     NULL, s);
  return dpsVerifyChain(comm, x->in, rows, vl, c->dtype, c->vocab, x->pad_bs, x->cand, &x->per_req,
                        NULL, 0.0f, &x->predict, &x->accept_index, &x->accept_length,
                        x->v->logprobs ? &x->logprobs : NULL, s);
}

/* ---- check ---------------------------------------------------------------------------- */

/* 1 when request q's outputs differ from the host walk (or its logprobs from
 * the rows'). */
static int wrongRequest(const DpCase* c, const Member* x, const DpSelHost* ref, int k, int q) {
  const size_t n = (size_t)x->n, r0 = (size_t)q * n, R = x->rows;
  const int32_t* w = x->want;
  if (memcmp(x->predict_h + r0, w + r0, n * 4) ||
      memcmp(x->accept_index_h + r0, w + R + r0, n * 4) ||
      x->accept_length_h[q] != w[2 * R + (size_t)q])
    return 1;
  if (!x->v->logprobs) return 0;
  for (size_t j = 0; j < n; ++j) {
    const float lp = x->lp_h[r0 + j];
    if ((int32_t)j >= w[2 * R + (size_t)q]) {
      if (lp != 0.0f) return 1;
      continue;
    }
    const int64_t row = (int64_t)(r0 + j);
    const double want = (double)dpSelValue(row, w[r0 + j], k + 1, c->dtype) - ref->lse[k][row];
    if (!(fabs((double)lp - want) <= 1e-4 * fmax(1.0, fabs(want)))) return 1;
  }
  return 0;
}

static long long check(const DpCheck* k) {
  const Member* x = (const Member*)k->op;
  const DpSelHost* ref = (const DpSelHost*)k->ref;
  const int s = k->step - 1;
  long long wrong = 0;
  if (x->v->kind == DP_KIND_ARGMAX)
    return dpWrongRefRows(k->c, (const int64_t*)x->tok.host, x->val.host, x->rows, 1,
                          ref->amax_idx[s], ref->amax_val[s], 1);
  if (x->v->kind == DP_KIND_SAMPLE) {
    const int64_t* tok = (const int64_t*)x->tok.host;
    for (size_t r = 0; r < x->rows; ++r) wrong += tok[r] != x->t_h[r];
    return wrong;
  }
  for (int q = 0; q < x->pad_bs; ++q) wrong += wrongRequest(k->c, x, ref, s, q);
  if (x->v->temperature == 0.0f)
    for (size_t r = 0; r < x->rows; ++r) wrong += x->t_h[r] != ref->amax_idx[s][r];
  return wrong;
}

/* ---- note: ratios to the references ------------------------------------------------------ */

static long long note(const DpCase* c, dpsComm_t comm, void* op, int tp, int phase,
                      const DpRow* row, char* out, size_t len, DpLocal* l) {
  (void)comm, (void)l;
  const Member* x = (const Member*)op;
  if (phase == 0) return 0;
  out[0] = 0;
  dpNoteRead(c, tp, row, out, len);
  if (x->v->kind != DP_KIND_VERIFY) return 0;
  const double ref = dpRowTime(x->v->ref, c, row->backend);
  if (ref > 0)
    dpNoteAppend(out, len, " | %s x%.2f (%+.2f us)", x->v->ref + strlen(VFY_REF), row->us / ref,
                 row->us - ref);
  dpNoteAppend(out, len, " | accept_length %.2f of %d", x->accepted, x->n);
  return 0;
}

/* ---- cases ---------------------------------------------------------------------------------- */

static const DpShape kShapes[] = {{8, 4, 152064}, {64, 4, 152064}, {256, 4, 152064}};

static const char* const kAliases[] = {"verify", NULL};

/* The verify_ref_* members first: verify_*'s notes divide by their times. */
const DpOp dpOpVerify[DP_VERIFY_OPS] = {
    DP_FAMILY_OP("verify_ref_argmax", prepare),
    DP_FAMILY_OP("verify_ref_sample_t", prepare),
    DP_FAMILY_OP("verify_ref_sample", prepare),
    DP_FAMILY_OP("verify_greedy", prepare),
    DP_FAMILY_OP("verify_greedy_scalar", prepare),
    DP_FAMILY_OP("verify_t", prepare),
    DP_FAMILY_OP("verify_kp", prepare),
    DP_FAMILY_OP("verify_kp_lp", prepare),
};
