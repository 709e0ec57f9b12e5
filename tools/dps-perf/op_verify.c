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

enum { KIND_ARGMAX, KIND_SAMPLE, KIND_VERIFY };

typedef struct {
  int kind;
  float temperature;
  int top_k;       /* 0: no array */
  float top_p;     /* 1: no array */
  int logprobs;
  const char* ref; /* the member the note divides by (NULL: none) */
  int scalar_t;    /* the verify call passes T as the scalar (the references keep arrays) */
} Variant;

/* In the order of dpOpVerify[] below. */
static const Variant kVariants[DP_VERIFY_OPS] = {
    {KIND_ARGMAX, 0.0f, 0, 1.0f, 0, NULL, 0},                           /* verify_ref_argmax */
    {KIND_SAMPLE, VFY_T, 0, 1.0f, 0, NULL, 0},                          /* verify_ref_sample_t */
    {KIND_SAMPLE, VFY_T, VFY_K, VFY_P, 0, NULL, 0},                     /* verify_ref_sample */
    {KIND_VERIFY, 0.0f, 0, 1.0f, 0, VFY_REF "argmax", 0},               /* verify_greedy */
    {KIND_VERIFY, 0.0f, 0, 1.0f, 0, VFY_REF "argmax", 1},            /* verify_greedy_scalar */
    {KIND_VERIFY, VFY_T, 0, 1.0f, 0, VFY_REF "sample_t", 0},            /* verify_t */
    {KIND_VERIFY, VFY_T, VFY_K, VFY_P, 0, VFY_REF "sample", 0},         /* verify_kp */
    {KIND_VERIFY, VFY_T, VFY_K, VFY_P, 1, VFY_REF "sample", 0},         /* verify_kp_lp */
};

static const Variant* variantOf(const DpCase* c) { return &kVariants[c->op - dpOpVerify]; }

/* ---- host inputs: the shards and the host argmax / logsumexp of every row ---------- */

typedef struct {
  void* in[2]; /* this rank's shard [rows, V/tp] of steps 1 and 2 */
  size_t in_bytes;
  int64_t* amax_idx[2]; /* [rows] */
  float* amax_val[2];
  double* lse[2];
} HostIn;

static void hostFree(void* p) {
  HostIn* h = (HostIn*)p;
  for (int k = 0; k < 2; ++k) {
    free(h->in[k]);
    free(h->amax_idx[k]);
    free(h->amax_val[k]);
    free(h->lse[k]);
  }
  free(h);
}

static int hostInit(const DpCase* c, int rank, int tp, void** out) {
  HostIn* h = (HostIn*)calloc(1, sizeof *h);
  if (!h) return 1;
  const int64_t rows = (int64_t)c->pad_bs * c->n;
  const size_t r = (size_t)rows;
  h->in_bytes = r * (size_t)(c->vocab / tp) * dpsDataTypeSize(c->dtype);
  float* row = (float*)malloc((size_t)c->vocab * sizeof(float));
  int ok = row != NULL;
  for (int k = 0; k < 2 && ok; ++k) {
    h->in[k] = malloc(h->in_bytes);
    h->amax_idx[k] = (int64_t*)malloc(r * 8);
    h->amax_val[k] = (float*)malloc(r * 4);
    h->lse[k] = (double*)malloc(r * 8);
    ok = h->in[k] && h->amax_idx[k] && h->amax_val[k] && h->lse[k];
  }
  for (int k = 0; k < 2 && ok; ++k)
    for (int64_t i = 0; i < rows; ++i) {
      dpSelRow(c, rank, tp, i, k + 1, row, h->in[k]);
      fxRefArgmax(row, c->vocab, &h->amax_idx[k][i], &h->amax_val[k][i], &h->lse[k][i]);
    }
  free(row);
  if (!ok) {
    hostFree(h);
    return 1;
  }
  *out = h;
  return 0;
}

/* ---- device buffers ------------------------------------------------------------------ */

/* The parameter arrays hold pad_bs + rows entries: request b at [b] (the
 * verify's), row b*N + j at [pad_bs + b*N + j] (the references' and
 * prepare's), in one allocation per parameter. */
typedef struct {
  float* temps;
  int32_t* topks;
  float* topps;
  uint64_t* seeds;
  uint64_t* offsets;
} Params;

typedef struct {
  const Variant* v;
  int pad_bs, n;
  size_t rows, es, in_bytes;
  void* in_d;
  int64_t* tok_d;  /* the references' tokens / indices [rows] */
  void* val_d;     /* verify_ref_argmax's values [rows] */
  int64_t* pre_d;  /* prepare's tokens [rows] */
  int32_t* cand_d; /* [pad_bs, N] */
  Params prm_d, prm_h;
  dpsSampleParams_t per_req, per_row;
  /* the library's outputs (persistent; set by run) */
  int32_t* predict;
  int32_t* accept_index;
  int32_t* accept_length;
  float* logprobs;
  /* host */
  int64_t* tok_h;
  void* val_h;
  int64_t* t_h;    /* prepare's tokens of the current step */
  int32_t* cand_h;
  int32_t* want;   /* the host walk: predict [rows], accept_index [rows], accept_length [pad_bs] */
  int32_t* got;    /* the library's, same layout */
  float* lp_h;
  double accepted; /* mean accept_length of the current step's drafts */
  const HostIn* host; /* set by fill */
} Bufs;

static void freeParams(Params* p, int device) {
  void* a[] = {p->temps, p->topks, p->topps, p->seeds, p->offsets};
  for (size_t i = 0; i < sizeof a / sizeof a[0]; ++i) {
    if (device) cudaFree(a[i]);
    else free(a[i]);
  }
}

static void teardown(void* p) {
  Bufs* b = (Bufs*)p;
  cudaFree(b->in_d);
  cudaFree(b->tok_d);
  cudaFree(b->val_d);
  cudaFree(b->pre_d);
  cudaFree(b->cand_d);
  freeParams(&b->prm_d, 1);
  freeParams(&b->prm_h, 0);
  free(b->tok_h);
  free(b->val_h);
  free(b->t_h);
  free(b->cand_h);
  free(b->want);
  free(b->got);
  free(b->lp_h);
  free(b);
}

static int setup(const DpCase* c, int tp, void** out, DpLocal* l) {
  Bufs* b = (Bufs*)dpHostAlloc(l, sizeof *b, 1);
  if (!b) return 1;
  *out = b;
  const Variant* v = variantOf(c);
  b->v = v;
  b->pad_bs = c->pad_bs;
  b->n = c->n;
  b->rows = (size_t)c->pad_bs * (size_t)c->n;
  b->es = dpsDataTypeSize(c->dtype);
  b->in_bytes = b->rows * (size_t)(c->vocab / tp) * b->es;
  const size_t r = b->rows, q = (size_t)c->pad_bs, pr = q + r, outs = 2 * r + q;
  DP_TRY_CUDA(l, cudaMalloc(&b->in_d, b->in_bytes), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->tok_d, r * 8), fail);
  DP_TRY_CUDA(l, cudaMalloc(&b->val_d, r * b->es), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->pre_d, r * 8), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->cand_d, r * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->prm_d.temps, pr * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->prm_d.topks, pr * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->prm_d.topps, pr * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->prm_d.seeds, pr * 8), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->prm_d.offsets, pr * 8), fail);
  if (!(b->prm_h.temps = (float*)dpHostAlloc(l, pr * 4, 0)) ||
      !(b->prm_h.topks = (int32_t*)dpHostAlloc(l, pr * 4, 0)) ||
      !(b->prm_h.topps = (float*)dpHostAlloc(l, pr * 4, 0)) ||
      !(b->prm_h.seeds = (uint64_t*)dpHostAlloc(l, pr * 8, 0)) ||
      !(b->prm_h.offsets = (uint64_t*)dpHostAlloc(l, pr * 8, 0)) ||
      !(b->tok_h = (int64_t*)dpHostAlloc(l, r * 8, 0)) ||
      !(b->val_h = dpHostAlloc(l, r * b->es, 0)) ||
      !(b->t_h = (int64_t*)dpHostAlloc(l, r * 8, 0)) ||
      !(b->cand_h = (int32_t*)dpHostAlloc(l, r * 4, 0)) ||
      !(b->want = (int32_t*)dpHostAlloc(l, outs * 4, 0)) ||
      !(b->got = (int32_t*)dpHostAlloc(l, outs * 4, 0)) ||
      !(b->lp_h = (float*)dpHostAlloc(l, r * 4, 0)))
    return 1;
  /* per request: the arrays' first pad_bs entries; per row: the rest */
  for (int k = 0; k < 2; ++k) {
    dpsSampleParams_t prm = DPS_SAMPLE_PARAMS_INITIALIZER;
    const size_t at = k ? q : 0;
    prm.temperatures = b->prm_d.temps + at;
    prm.seeds = b->prm_d.seeds + at;
    prm.offsets = b->prm_d.offsets + at;
    if (v->top_k > 0) prm.top_ks = b->prm_d.topks + at;
    if (v->top_p < 1.0f) prm.top_ps = b->prm_d.topps + at;
    if (!k && v->scalar_t) {
      prm.temperatures = NULL;
      prm.temperature = v->temperature;
    }
    if (k) b->per_row = prm;
    else b->per_req = prm;
  }
  return 0;
fail:
  return 1;
}

/* Entry `at` of the host arrays: request `req`'s parameters at `step`, drawing
 * at its position j (j = 0 for the request's own entry). */
static void putParams(Bufs* b, size_t at, int req, int step, int j) {
  b->prm_h.temps[at] = b->v->temperature;
  b->prm_h.topks[at] = b->v->top_k;
  b->prm_h.topps[at] = b->v->top_p;
  b->prm_h.seeds[at] = (uint64_t)req;
  b->prm_h.offsets[at] =
      1000u + (uint64_t)req + (uint64_t)(step - 1) * (uint64_t)b->n + (uint64_t)j;
}

static int fill(const DpCase* c, void* p, const void* hp, int tp, int step, cudaStream_t s,
                DpLocal* l) {
  (void)c;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const HostIn* h = (const HostIn*)hp;
  const size_t q = (size_t)b->pad_bs, pr = q + b->rows;
  b->host = h;
  for (int i = 0; i < b->pad_bs; ++i) putParams(b, (size_t)i, i, step, 0);
  for (size_t r = 0; r < b->rows; ++r)
    putParams(b, q + r, (int)(r / (size_t)b->n), step, (int)(r % (size_t)b->n));
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->in_d, h->in[step - 1], b->in_bytes, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->prm_d.temps, b->prm_h.temps, pr * 4, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->prm_d.topks, b->prm_h.topks, pr * 4, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->prm_d.topps, b->prm_h.topps, pr * 4, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->prm_d.seeds, b->prm_h.seeds, pr * 8, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->prm_d.offsets, b->prm_h.offsets, pr * 8,
                                 cudaMemcpyHostToDevice, s),
              fail);
  /* outputs a call did not write show up as wrong (an invalid index) */
  DP_TRY_CUDA(l, cudaMemsetAsync(b->tok_d, 0xab, b->rows * 8, s), fail);
  return 0;
fail:
  return 1;
}

/* Drafts of request q at `step` (header): cut = N, every draft matches;
 * else drafts 1..cut-1 match and draft cut does not. */
static int cutOf(int q, int step, int n) {
  if (n < 2 || (q + step) % 2 == 0) return n;
  return 1 + (q / 2 + step) % (n - 1);
}

/* The rows' tokens t by dpsSample (the references' and verify's draws), and
 * for verify the drafts and the host walk over them. */
static int prepare(const DpCase* c, dpsComm_t comm, void* p, int tp, int step, cudaStream_t s,
                   DpLocal* l) {
  Bufs* b = (Bufs*)p;
  if (b->v->kind == KIND_ARGMAX) return 0;
  const int64_t V = c->vocab, rows = (int64_t)b->rows;
  const int n = b->n;
  DP_TRY_DPS(l, dpsSample(comm, b->in_d, rows, V / tp, c->dtype, V, &b->per_row, b->pre_d, NULL, s),
             fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->t_h, b->pre_d, b->rows * 8, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  for (int64_t r = 0; r < rows; ++r)
    if (b->t_h[r] < 0 || b->t_h[r] >= V) {
      dpSetLocal(l, DP_ERR, "prepare: dpsSample gave row %lld the token %lld (V = %lld)",
                 (long long)r, (long long)b->t_h[r], (long long)V);
      return 1;
    }
  if (b->v->kind != KIND_VERIFY) return 0;
  long long total = 0;
  for (int q = 0; q < b->pad_bs; ++q) {
    const int64_t* t = b->t_h + (size_t)q * n;
    int32_t* cand = b->cand_h + (size_t)q * n;
    const int cut = cutOf(q, step, n);
    cand[0] = (int32_t)t[0];
    for (int i = 1; i < n; ++i) cand[i] = (int32_t)(i == cut ? (t[i - 1] + 1) % V : t[i - 1]);
  }
  int32_t* want_al = b->want + 2 * b->rows;
  if (fxRefVerifyChain(b->cand_h, b->t_h, b->pad_bs, n, b->want, b->want + b->rows, want_al) != 0) {
    dpSetLocal(l, DP_ERR, "prepare: fxRefVerifyChain rejected the drafts");
    return 1;
  }
  for (int q = 0; q < b->pad_bs; ++q) total += want_al[q];
  b->accepted = (double)total / b->pad_bs;
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->cand_d, b->cand_h, b->rows * 4, cudaMemcpyHostToDevice, s),
              fail);
  return 0;
fail:
  return 1;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* p, int tp, cudaStream_t s) {
  Bufs* b = (Bufs*)p;
  const int64_t rows = (int64_t)b->rows, vl = c->vocab / tp;
  switch (b->v->kind) {
    case KIND_ARGMAX:
      return dpsArgmax(comm, b->in_d, rows, vl, c->dtype, c->vocab, b->val_d, b->tok_d, NULL, s);
    case KIND_SAMPLE:
      return dpsSample(comm, b->in_d, rows, vl, c->dtype, c->vocab, &b->per_row, b->tok_d, NULL, s);
    default:
      return dpsVerifyChain(comm, b->in_d, rows, vl, c->dtype, c->vocab, b->pad_bs, b->cand_d,
                            &b->per_req, NULL, 0.0f, &b->predict, &b->accept_index,
                            &b->accept_length, b->v->logprobs ? &b->logprobs : NULL, s);
  }
}

/* ---- check ---------------------------------------------------------------------------- */

/* 1 when request q's outputs differ from the host walk (or its logprobs from
 * the rows'). */
static int wrongRequest(const DpCase* c, const Bufs* b, int k, int q) {
  const size_t n = (size_t)b->n, r0 = (size_t)q * n, R = b->rows;
  const int32_t* w = b->want;
  const int32_t* g = b->got;
  if (memcmp(g + r0, w + r0, n * 4) || memcmp(g + R + r0, w + R + r0, n * 4) ||
      g[2 * R + (size_t)q] != w[2 * R + (size_t)q])
    return 1;
  if (!b->v->logprobs) return 0;
  for (size_t j = 0; j < n; ++j) {
    const float lp = b->lp_h[r0 + j];
    if ((int32_t)j >= w[2 * R + (size_t)q]) {
      if (lp != 0.0f) return 1;
      continue;
    }
    const int64_t row = (int64_t)(r0 + j);
    const double want = (double)dpSelValue(row, w[r0 + j], k + 1, c->dtype) - b->host->lse[k][row];
    if (!(fabs((double)lp - want) <= 1e-4 * fmax(1.0, fabs(want)))) return 1;
  }
  return 0;
}

static long long check(const DpCase* c, void* p, int rank, int tp, int step, cudaStream_t s,
                       DpLocal* l) {
  (void)rank;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const HostIn* h = b->host;
  const int k = step - 1;
  const size_t R = b->rows, Q = (size_t)b->pad_bs;
  long long wrong = 0;
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  if (b->v->kind != KIND_VERIFY) {
    DP_TRY_CUDA(l, cudaMemcpy(b->tok_h, b->tok_d, R * 8, cudaMemcpyDeviceToHost), fail);
    if (b->v->kind == KIND_ARGMAX)
      DP_TRY_CUDA(l, cudaMemcpy(b->val_h, b->val_d, R * b->es, cudaMemcpyDeviceToHost), fail);
    for (size_t r = 0; r < R; ++r)
      wrong += b->v->kind == KIND_SAMPLE
                   ? b->tok_h[r] != b->t_h[r]
                   : b->tok_h[r] != h->amax_idx[k][r] ||
                         !(fxLoad(b->val_h, r, c->dtype) == h->amax_val[k][r]);
    return wrong;
  }
  if (!b->predict || !b->accept_index || !b->accept_length || (b->v->logprobs && !b->logprobs)) {
    dpSetLocal(l, DP_ERR, "dpsVerifyChain returned a NULL output pointer");
    return 0;
  }
  DP_TRY_CUDA(l, cudaMemcpy(b->got, b->predict, R * 4, cudaMemcpyDeviceToHost), fail);
  DP_TRY_CUDA(l, cudaMemcpy(b->got + R, b->accept_index, R * 4, cudaMemcpyDeviceToHost), fail);
  DP_TRY_CUDA(l, cudaMemcpy(b->got + 2 * R, b->accept_length, Q * 4, cudaMemcpyDeviceToHost),
              fail);
  if (b->v->logprobs)
    DP_TRY_CUDA(l, cudaMemcpy(b->lp_h, b->logprobs, R * 4, cudaMemcpyDeviceToHost), fail);
  for (int q = 0; q < b->pad_bs; ++q) wrong += wrongRequest(c, b, k, q);
  if (b->v->temperature == 0.0f)
    for (size_t r = 0; r < R; ++r) wrong += b->t_h[r] != h->amax_idx[k][r];
  return wrong;
fail:
  return 0;
}

/* ---- note: ratios to the references ------------------------------------------------------ */

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)c->pad_bs * (size_t)c->n * (size_t)(c->vocab / tp) * dpsDataTypeSize(c->dtype);
}

static long long note(const DpCase* c, dpsComm_t comm, void* p, int tp, int phase,
                      const DpRow* row, char* out, size_t len, DpLocal* l) {
  (void)comm;
  (void)l;
  const Bufs* b = (const Bufs*)p;
  if (phase == 0) return 0;
  out[0] = 0;
  if (row->hbm_peak > 0 && row->us > 0)
    dpNoteAppend(out, len, "read x%.2f",
                 row->us / ((double)bytes(c, tp) / (row->hbm_peak * 1e3)));
  if (b->v->kind != KIND_VERIFY) return 0;
  const double ref = dpRowTime(b->v->ref, c, row->backend);
  if (ref > 0)
    dpNoteAppend(out, len, " | %s x%.2f (%+.2f us)", b->v->ref + strlen(VFY_REF), row->us / ref,
                 row->us - ref);
  dpNoteAppend(out, len, " | accept_length %.2f of %d", b->accepted, b->n);
  return 0;
}

/* ---- cases ---------------------------------------------------------------------------------- */

static void addCases(const DpOp* self, const DpCaseArgs* a) {
  static const DpShape kShapes[] = {{8, 4, 152064}, {64, 4, 152064}, {256, 4, 152064}};
  dpAddShapeCases(self, a, kShapes, (int)(sizeof kShapes / sizeof kShapes[0]));
}

/* every rank holds every row: only the vocabulary is cut */
static int valid(const DpCase* c, int tp) { return c->vocab % tp == 0; }

static const char* const kAliases[] = {"verify", NULL};

#define VFY_OP(NAME)                                                                      \
  {                                                                                       \
    .name = NAME, .aliases = kAliases, .add_cases = addCases, .valid = valid,             \
    .bytes = bytes, .host_init = hostInit, .host_free = hostFree, .setup = setup,         \
    .fill = fill, .run = run, .check = check, .teardown = teardown, .hbm = 1,             \
    .note = note, .prepare = prepare,                                                     \
  }

/* The references first: the members' notes divide by their times. */
const DpOp dpOpVerify[DP_VERIFY_OPS] = {
    VFY_OP("verify_ref_argmax"), VFY_OP("verify_ref_sample_t"), VFY_OP("verify_ref_sample"),
    VFY_OP("verify_greedy"),     VFY_OP("verify_greedy_scalar"), VFY_OP("verify_t"),
    VFY_OP("verify_kp"),         VFY_OP("verify_kp_lp"),
};
