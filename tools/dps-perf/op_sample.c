/* dps-perf operations: dpsSample, the family "sample" (-o sample runs every
 * member below; each also runs by its own name). Each rank reads its
 * [rows, V/tp] shard and exchanges a fixed-size record per row; bytes = the
 * shard's bytes (algbw = logits bytes / time), the efficiency is against the
 * HBM read peak, as for argmax and topk.
 *
 * Members (every parameter a device array [rows], as an engine passes them,
 * but sample_greedy_scalar's temperature;
 * top_k / top_p / min_p arrays only where the case uses them, as vLLM passes
 * None for a filter no request uses; seeds and offsets differ per row):
 *   sample_argmax   dpsArgmax on the same rows (reference: one read + argmax)
 *   sample_topk50   dpsTopK k=50 on the same rows (reference of sample_kp)
 *   sample_greedy   T = 0 for every row (an array: the sampling pass)
 *   sample_greedy_scalar  T = 0 as the scalar, tokens only: argmax's pass
 *                   draws (dpsSample's greedy route)
 *   sample_t        (a) T = 0.7, no filter
 *   sample_kp       (b) top-k 50 + top-p 0.9, T = 0.7
 *   sample_kp_mixed (b) on even rows, temperature only on odd rows (top-k 0
 *                   and top-p 1 in the arrays, as a batch whose requests
 *                   differ: the race and the candidates in one call)
 *   sample_p        (c) top-p 0.9 alone, T = 0.7
 *   sample_p_flat   (d) top-p 0.9, T = 0.7, every logit of the row equal (the
 *                   nucleus is 90% of the vocabulary: the threshold search)
 *   sample_minp     (e) min-p 0.1, T = 0.7
 *   *_lp            the same with logprobs (t, kp, p)
 * Rows (all but p_flat): like an LLM's logits, deterministic from (row, col,
 * step): N(0, 2.5^2) for the bulk and 1-4 head tokens at 10..20 anywhere in
 * the row. At T = 0.7 the bulk holds about e^18 of the mass, a head token at
 * 20 about e^28: most rows have a nucleus of a few tokens, the rows whose
 * heads are low (~12 and below) a nucleus spread over the bulk (the exact
 * path). Measured on the host reference (64 x 129280, steps 1-2): top-p 0.9
 * alone keeps 105 tokens on average and more than 64 in 1 row of 8; top-k
 * 50 + top-p 0.9 keeps 3.6, min-p 0.1 keeps 1.9. The row's note prints
 * which path the rows took.
 *
 * Shapes: the PxNxV items of -s (rows = P*N), default {8,64,1024}x129280 and
 * {8,64,1024}x152064 (bf16). Valid when tp divides V (every rank holds every
 * row). vocab_limit = V.
 *
 * #wrong counts rows (elements for the references) where:
 *  - every sample row: the token is not an index < vocab_limit;
 *  - greedy rows: the token is not the host argmax (ties to the lower index);
 *  - top-k rows: the token is not in the host top-50 (value descending,
 *    index ascending);
 *  - min-p rows: exp((l_token - l_max)/T) < min_p (with 1e-4 slack);
 *  - flat rows: the token is past the first ceil(0.9 V) indices (the
 *    nucleus of a flat row under the index order);
 *  - logprobs: |logprob - (l_token - logsumexp(row))| > 1e-4 max(1, |.|),
 *    the logsumexp in double on the host;
 *  - up to SMP_REF_ROWS rows per step (spread over the batch): the token is
 *    not the host reference's (testing/sample_ref.c, the same Philox
 *    noise: bit for bit by contract);
 *  - sample_argmax / sample_topk50: index or value differs from the host's.
 * A sample row that no check above pins (T > 0, no filter, not a reference
 * row) is only checked for a valid index.
 *
 * Note at the end of each row: time / (bytes / HBM read peak) ("read x"),
 * time / sample_argmax's and (top-k members) / sample_topk50's on the same
 * shape and backend when those ran before, and the rows by path from
 * dpsCommGetSampleStats over every call of the case (eager, warm-up,
 * replays); invalid calls count as wrong. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dps_perf.h"
#include "select_case.h"
#include "fixtures.h"
#include "sample_ref.h"

#define SMP_K 50        /* top-k of case (b) and of the dpsTopK reference */
#define SMP_REF_ROWS 8  /* rows per step checked against the exact host reference */
#define SMP_HEADS 4     /* most head tokens per row */

/* In the order of dpOpSample[] below. */
static const DpVariant kVariants[DP_SAMPLE_OPS] = {
    /* kind, T, top_k, top_p, min_p, logprobs, flat, ref, scalar_t, mixed */
    {DP_KIND_ARGMAX, 0.0f, 0, 1.0f, 0.0f, 0, 0, NULL, 0, 0},          /* sample_argmax */
    {DP_KIND_TOPK, 0.0f, SMP_K, 1.0f, 0.0f, 0, 0, NULL, 0, 0},        /* sample_topk50 */
    {DP_KIND_SAMPLE, 0.0f, 0, 1.0f, 0.0f, 0, 0, NULL, 0, 0},          /* sample_greedy */
    {DP_KIND_SAMPLE, 0.0f, 0, 1.0f, 0.0f, 0, 0, NULL, 1, 0},          /* sample_greedy_scalar */
    {DP_KIND_SAMPLE, 0.7f, 0, 1.0f, 0.0f, 0, 0, NULL, 0, 0},          /* sample_t */
    {DP_KIND_SAMPLE, 0.7f, 0, 1.0f, 0.0f, 1, 0, NULL, 0, 0},          /* sample_t_lp */
    {DP_KIND_SAMPLE, 0.7f, SMP_K, 0.9f, 0.0f, 0, 0, NULL, 0, 0},      /* sample_kp */
    {DP_KIND_SAMPLE, 0.7f, SMP_K, 0.9f, 0.0f, 1, 0, NULL, 0, 0},      /* sample_kp_lp */
    {DP_KIND_SAMPLE, 0.7f, SMP_K, 0.9f, 0.0f, 0, 0, NULL, 0, 1},      /* sample_kp_mixed */
    {DP_KIND_SAMPLE, 0.7f, 0, 0.9f, 0.0f, 0, 0, NULL, 0, 0},          /* sample_p */
    {DP_KIND_SAMPLE, 0.7f, 0, 0.9f, 0.0f, 1, 0, NULL, 0, 0},          /* sample_p_lp */
    {DP_KIND_SAMPLE, 0.7f, 0, 0.9f, 0.0f, 0, 1, NULL, 0, 0},          /* sample_p_flat */
    {DP_KIND_SAMPLE, 0.7f, 0, 1.0f, 0.1f, 0, 0, NULL, 0, 0},          /* sample_minp */
};

static const DpVariant* variantOf(const DpCase* c) { return &kVariants[c->op - dpOpSample]; }

/* Row i's top-k and top-p (the mixed member's odd rows have neither). */
static int rowTopK(const DpVariant* v, int64_t i) { return v->mixed && (i & 1) ? 0 : v->top_k; }
static float rowTopP(const DpVariant* v, int64_t i) { return v->mixed && (i & 1) ? 1.0f : v->top_p; }

/* ---- the rows ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* murmur3's finalizer */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(a * 0x9e3779b97f4a7c15ull + b * 0xc2b2ae3d27d4eb4full + c * 0x165667b19e3779f9ull);
}

/* The bulk: 2.5 x the N(0,1) quantile at (i + 1/2) / 2^16 as the dtype
 * stores it, and its exp (for the host logsumexp). A table lookup per
 * element keeps the host fill of 1024 x 152064 rows near a second; the
 * tails stop at 4.3 sd, about the largest of 152064 draws. */
#define SMP_BULK (1 << 16)
static float g_bulk[SMP_BULK];
static double g_bulk_exp[SMP_BULK];
static int g_bulk_dtype = -1;

static float toDtype(float x, dpsDataType_t dt) {
  uint32_t t = 0;
  fxStore(&t, 0, x, dt);
  return fxLoad(&t, 0, dt);
}

static void initBulk(dpsDataType_t dt) {
  if (g_bulk_dtype == (int)dt) return;
  for (int i = 0; i < SMP_BULK; ++i) {
    const double u = ((double)i + 0.5) / SMP_BULK;
    double lo = -10.0, hi = 10.0;
    for (int it = 0; it < 60; ++it) { /* Phi(x) = erfc(-x / sqrt 2) / 2 */
      const double mid = 0.5 * (lo + hi);
      if (0.5 * erfc(-mid / sqrt(2.0)) < u) lo = mid;
      else hi = mid;
    }
    g_bulk[i] = toDtype((float)(2.5 * 0.5 * (lo + hi)), dt);
    g_bulk_exp[i] = exp((double)g_bulk[i]);
  }
  g_bulk_dtype = (int)dt;
}

static unsigned bulkIndex(int64_t row, int64_t col, int step) {
  return (unsigned)(hash3((uint64_t)row, (uint64_t)col, (uint64_t)step) & (SMP_BULK - 1));
}

typedef struct {
  int n;
  int64_t pos[SMP_HEADS];
  float val[SMP_HEADS];
} Heads;

/* The row's head tokens (values as the dtype stores them). */
static void rowHeads(int64_t row, int step, int64_t V, dpsDataType_t dt, Heads* h) {
  h->n = 1 + (int)(hash3((uint64_t)row, (uint64_t)step, 0x4ead) % SMP_HEADS);
  for (int i = 0; i < h->n; ++i) {
    const uint64_t x = hash3((uint64_t)row, (uint64_t)step, 0x100 + (uint64_t)i);
    h->pos[i] = (int64_t)(x % (uint64_t)V);
    h->val[i] = toDtype(10.0f + 10.0f * (float)((x >> 40) & 0xffffff) / 16777216.0f, dt);
  }
}

#define SMP_FLAT 1.0f /* every logit of a flat row */

/* The logit at (row, col) as the dtype stores it (the bulk, or the largest
 * head there). initBulk(dtype) first. */
static float logitAt(const DpVariant* v, int64_t row, int64_t col, int step, const Heads* h) {
  if (v->flat) return SMP_FLAT;
  float x = g_bulk[bulkIndex(row, col, step)];
  for (int i = 0; i < h->n; ++i)
    if (h->pos[i] == col && h->val[i] > x) x = h->val[i];
  return x;
}

/* The full row into row[0..V) and its sum of exp (double: the values stay
 * below 2^5, nothing overflows), the bulk by table, then the heads. */
static double fillRow(const DpVariant* v, int64_t i, int step, int64_t V, const Heads* h,
                      float* row) {
  double s = 0.0;
  if (v->flat) {
    for (int64_t j = 0; j < V; ++j) row[j] = SMP_FLAT;
    return (double)V * exp((double)SMP_FLAT);
  }
  for (int64_t j = 0; j < V; ++j) {
    const unsigned b = bulkIndex(i, j, step);
    row[j] = g_bulk[b];
    s += g_bulk_exp[b];
  }
  for (int k = 0; k < h->n; ++k)
    if (h->val[k] > row[h->pos[k]]) {
      s += exp((double)h->val[k]) - exp((double)row[h->pos[k]]);
      row[h->pos[k]] = h->val[k];
    }
  return s;
}

/* ---- host inputs and references ------------------------------------------------- */

/* Host inputs, in the order of setup's dpDevIn: */
enum { IN_LOGITS, IN_TEMPS, IN_TOPKS, IN_TOPPS, IN_MINPS, IN_SEEDS, IN_OFFSETS };

typedef struct {
  int64_t* topk_idx[2]; /* [rows][SMP_K], host top-50 (column 0: the argmax) */
  float* topk_val[2];
  double* lse[2]; /* [rows] */
  int nref;
  int64_t ref_row[SMP_REF_ROWS];
  int64_t ref_tok[2][SMP_REF_ROWS];
} HostRef;

/* The first SMP_K of the row in the order (value descending, index
 * ascending), by insertion: a later index enters only above the current
 * last, so a scan in index order keeps the order. */
static void hostTopK(const float* row, int64_t V, int64_t* idx, float* val) {
  int n = 0;
  for (int64_t j = 0; j < V; ++j) {
    const float x = row[j];
    if (n == SMP_K && !(x > val[SMP_K - 1])) continue;
    int at = n < SMP_K ? n++ : SMP_K - 1;
    while (at > 0 && x > val[at - 1]) {
      val[at] = val[at - 1];
      idx[at] = idx[at - 1];
      --at;
    }
    val[at] = x;
    idx[at] = j;
  }
}

static int hostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  const DpVariant* v = variantOf(c);
  initBulk(c->dtype);
  const int64_t rows = (int64_t)c->pad_bs * c->n, V = c->vocab, vl = V / tp;
  const size_t r = (size_t)rows;
  /* the inputs: the shard and the seeds and offsets per step, the filters shared */
  HostRef* x = (HostRef*)dpHostMem(h, sizeof *x);
  if (!x || dpHostIn(h, r * (size_t)vl * dpsDataTypeSize(c->dtype), 1) != IN_LOGITS ||
      dpHostIn(h, r * 4, 0) != IN_TEMPS || dpHostIn(h, r * 4, 0) != IN_TOPKS ||
      dpHostIn(h, r * 4, 0) != IN_TOPPS || dpHostIn(h, r * 4, 0) != IN_MINPS ||
      dpHostIn(h, r * 8, 1) != IN_SEEDS || dpHostIn(h, r * 8, 1) != IN_OFFSETS)
    return 1;
  h->op = x;
  for (int k = 0; k < 2; ++k) {
    x->topk_idx[k] = (int64_t*)dpHostMem(h, r * SMP_K * 8);
    x->topk_val[k] = (float*)dpHostMem(h, r * SMP_K * 4);
    x->lse[k] = (double*)dpHostMem(h, r * 8);
    if (!x->topk_idx[k] || !x->topk_val[k] || !x->lse[k]) return 1;
  }
  float* row = (float*)malloc((size_t)V * sizeof(float));
  if (!row) return 1;
  float* temps = (float*)h->in[IN_TEMPS].step[0];
  int32_t* topks = (int32_t*)h->in[IN_TOPKS].step[0];
  float* topps = (float*)h->in[IN_TOPPS].step[0];
  float* minps = (float*)h->in[IN_MINPS].step[0];
  for (int64_t i = 0; i < rows; ++i) {
    temps[i] = v->temperature;
    topks[i] = rowTopK(v, i);
    topps[i] = rowTopP(v, i);
    minps[i] = v->min_p;
  }
  /* the exact reference's rows: spread over the batch, the last one included */
  const int64_t stride = rows > SMP_REF_ROWS ? rows / SMP_REF_ROWS : 1;
  x->nref = 0;
  for (int64_t i = 0; i < rows && x->nref < SMP_REF_ROWS; i += stride) x->ref_row[x->nref++] = i;
  if (x->nref > 0) x->ref_row[x->nref - 1] = rows - 1;

  for (int k = 0; k < 2; ++k) {
    const int step = k + 1;
    uint64_t* seeds = (uint64_t*)h->in[IN_SEEDS].step[k];
    uint64_t* offsets = (uint64_t*)h->in[IN_OFFSETS].step[k];
    int next_ref = 0;
    for (int64_t i = 0; i < rows; ++i) {
      /* per-row seeds and offsets that change with the step, as an engine's */
      seeds[i] = hash3((uint64_t)i, (uint64_t)step, 0x5eed);
      offsets[i] = (uint64_t)step * 4096u + (uint64_t)i;
      Heads hd;
      rowHeads(i, step, V, c->dtype, &hd);
      x->lse[k][i] = log(fillRow(v, i, step, V, &hd, row));
      for (int64_t j = 0; j < vl; ++j)
        fxStore(h->in[IN_LOGITS].step[k], (size_t)(i * vl + j), row[rank * vl + j], c->dtype);
      hostTopK(row, V, x->topk_idx[k] + i * SMP_K, x->topk_val[k] + i * SMP_K);
      if (v->kind == DP_KIND_SAMPLE && next_ref < x->nref && x->ref_row[next_ref] == i) {
        fxSampleParams p = fxSampleParamsDefault(V);
        p.temperature = v->temperature;
        p.top_k = rowTopK(v, i);
        p.top_p = rowTopP(v, i);
        p.min_p = v->min_p;
        float lp = 0.f;
        if (fxRefSampleToken(row, V, &p, seeds[i], offsets[i], &x->ref_tok[k][next_ref], &lp) !=
            0)
          x->ref_tok[k][next_ref] = -1; /* out of memory: counted wrong, not hidden */
        ++next_ref;
      }
    }
  }
  free(row);
  return 0;
}

/* ---- device buffers ------------------------------------------------------------- */

typedef struct {
  const DpVariant* v;
  size_t rows, per;
  void* in;
  DpOut tok; /* int64 tokens, or the references' indices [rows][per] */
  DpOut val; /* the references' values (argmax, topk50) */
  DpOut lp;  /* fp32 logprobs (the _lp members) */
  dpsSampleParams_t params;
  dpsSampleStats_t base; /* the communicator's counters before this case */
  int have_base;
} Member;

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  Member* x = (Member*)b->op;
  const DpVariant* v = variantOf(c);
  x->v = v;
  x->rows = (size_t)c->pad_bs * (size_t)c->n;
  x->per = v->kind == DP_KIND_TOPK ? SMP_K : 1;
  const size_t r = x->rows;
  x->in = dpDevIn(b, h, IN_LOGITS, l);
  x->tok = dpDevOut(b, r * x->per * 8, 0xab, l);
  if (v->kind != DP_KIND_SAMPLE)
    x->val = dpDevOut(b, r * x->per * dpsDataTypeSize(c->dtype), -1, l);
  if (v->logprobs) x->lp = dpDevOut(b, r * 4, 0xff, l);
  dpsSampleParams_t prm = DPS_SAMPLE_PARAMS_INITIALIZER;
  prm.temperatures = (const float*)dpDevIn(b, h, IN_TEMPS, l);
  const int32_t* topks = (const int32_t*)dpDevIn(b, h, IN_TOPKS, l);
  const float* topps = (const float*)dpDevIn(b, h, IN_TOPPS, l);
  const float* minps = (const float*)dpDevIn(b, h, IN_MINPS, l);
  prm.seeds = (const uint64_t*)dpDevIn(b, h, IN_SEEDS, l);
  prm.offsets = (const uint64_t*)dpDevIn(b, h, IN_OFFSETS, l);
  if (v->top_k > 0) prm.top_ks = topks;
  if (v->top_p < 1.0f) prm.top_ps = topps;
  if (v->min_p > 0.0f) prm.min_ps = minps;
  if (v->scalar_t) {
    prm.temperatures = NULL;
    prm.temperature = v->temperature;
  }
  x->params = prm;
  return l->status != DP_OK;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  Member* x = (Member*)op;
  if (x->v->kind != DP_KIND_SAMPLE) /* the references: argmax, top-50 */
    return dpSelCall(c, comm, x->in, x->rows, tp, x->v->top_k, x->val.dev, (int64_t*)x->tok.dev,
                     NULL, s);
  return dpsSample(comm, x->in, (int64_t)x->rows, c->vocab / tp, c->dtype, c->vocab, &x->params,
                   (int64_t*)x->tok.dev, (float*)x->lp.dev, s);
}

/* ---- check ------------------------------------------------------------------------ */

/* 1 when the sample row's token (and logprob) break a rule of the header. */
static int wrongRow(const DpCase* c, const DpVariant* v, const HostRef* h, int k, int64_t i,
                    int64_t tok, float lp) {
  const int64_t V = c->vocab;
  if (tok < 0 || tok >= V) return 1;
  const int64_t* top = h->topk_idx[k] + i * SMP_K;
  const float* topv = h->topk_val[k] + i * SMP_K;
  if (v->temperature == 0.0f && tok != top[0]) return 1;
  Heads hd;
  initBulk(c->dtype);
  rowHeads(i, k + 1, V, c->dtype, &hd);
  const float lt = logitAt(v, i, tok, k + 1, &hd);
  if (!isfinite(lt)) return 1;
  const int rk = rowTopK(v, i);
  if (rk > 0 && v->temperature > 0.0f) {
    /* in the top-k: above the k-th, or tied with it at a lower index */
    const float vk = topv[rk - 1];
    if (!(lt > vk || (lt == vk && tok <= top[rk - 1]))) return 1;
  }
  if (v->min_p > 0.0f && v->temperature > 0.0f &&
      ((double)lt - (double)topv[0]) / v->temperature < log((double)v->min_p) - 1e-4)
    return 1;
  if (v->flat && v->top_p < 1.0f && (double)tok >= ceil((double)v->top_p * (double)V)) return 1;
  if (v->logprobs) {
    const double want = (double)lt - h->lse[k][i];
    if (!(fabs((double)lp - want) <= 1e-4 * fmax(1.0, fabs(want)))) return 1;
  }
  for (int j = 0; j < h->nref; ++j)
    if (h->ref_row[j] == i && tok != h->ref_tok[k][j]) return 1;
  return 0;
}

static long long check(const DpCheck* k) {
  const Member* x = (const Member*)k->op;
  const HostRef* ref = (const HostRef*)k->ref;
  const int s = k->step - 1;
  if (x->v->kind != DP_KIND_SAMPLE) /* argmax: column 0 of the host top-k */
    return dpWrongRefRows(k->c, (const int64_t*)x->tok.host, x->val.host, x->rows, x->per,
                          ref->topk_idx[s], ref->topk_val[s], SMP_K);
  const int64_t* tok = (const int64_t*)x->tok.host;
  const float* lp = (const float*)x->lp.host;
  long long wrong = 0;
  for (size_t i = 0; i < x->rows; ++i)
    wrong += wrongRow(k->c, x->v, ref, s, (int64_t)i, tok[i], lp ? lp[i] : 0.f);
  return wrong;
}

/* ---- note: ratios and paths ------------------------------------------------------- */

static long long note(const DpCase* c, dpsComm_t comm, void* op, int tp, int phase,
                      const DpRow* row, char* out, size_t len, DpLocal* l) {
  (void)l;
  Member* x = (Member*)op;
  const int sampling = x->v->kind == DP_KIND_SAMPLE;
  if (phase == 0) {
    /* counters are the communicator's, over every case it ran: keep the base */
    x->have_base = sampling && dpsCommGetSampleStats(comm, &x->base) == dpsSuccess;
    return 0;
  }
  out[0] = 0;
  dpNoteRead(c, tp, row, out, len);
  const double am = dpRowTime("sample_argmax", c, row->backend);
  if (x->v->kind != DP_KIND_ARGMAX && am > 0)
    dpNoteAppend(out, len, " | argmax x%.2f", row->us / am);
  const double tk = dpRowTime("sample_topk50", c, row->backend);
  if (sampling && x->v->top_k > 0 && tk > 0)
    dpNoteAppend(out, len, " | topk50 x%.2f", row->us / tk);
  if (!sampling) return 0;
  dpsSampleStats_t st;
  if (!x->have_base || dpsCommGetSampleStats(comm, &st) != dpsSuccess) {
    dpNoteAppend(out, len, " | paths: dpsCommGetSampleStats failed: %.120s",
                 dpsGetLastError());
    return 0;
  }
  const unsigned long long g = st.rows_greedy - x->base.rows_greedy,
                           f = st.rows_fast - x->base.rows_fast,
                           e = st.rows_exact - x->base.rows_exact,
                           bad = st.invalid_calls - x->base.invalid_calls;
  const double all = (double)(g + f + e) > 0 ? (double)(g + f + e) : 1.0;
  dpNoteAppend(out, len, " | rows greedy %.1f%% fast %.1f%% exact %.1f%% (%llu rows, %lld calls)",
               100.0 * g / all, 100.0 * f / all, 100.0 * e / all, g + f + e, row->calls);
  if (bad) dpNoteAppend(out, len, " | INVALID CALLS %llu: %.120s", bad, dpsGetLastError());
  return (long long)bad;
}

/* ---- cases ---------------------------------------------------------------------- */

static const DpShape kShapes[] = {{8, 1, 129280}, {64, 1, 129280}, {1024, 1, 129280},
                                  {8, 1, 152064}, {64, 1, 152064}, {1024, 1, 152064}};

static const char* const kAliases[] = {"sample", NULL};

/* sample_argmax and sample_topk50 first: the other members' notes divide by
 * their times. */
const DpOp dpOpSample[DP_SAMPLE_OPS] = {
    DP_FAMILY_OP("sample_argmax", NULL),   DP_FAMILY_OP("sample_topk50", NULL),
    DP_FAMILY_OP("sample_greedy", NULL),   DP_FAMILY_OP("sample_greedy_scalar", NULL),
    DP_FAMILY_OP("sample_t", NULL),        DP_FAMILY_OP("sample_t_lp", NULL),
    DP_FAMILY_OP("sample_kp", NULL),       DP_FAMILY_OP("sample_kp_lp", NULL),
    DP_FAMILY_OP("sample_kp_mixed", NULL), DP_FAMILY_OP("sample_p", NULL),
    DP_FAMILY_OP("sample_p_lp", NULL),     DP_FAMILY_OP("sample_p_flat", NULL),
    DP_FAMILY_OP("sample_minp", NULL),
};
