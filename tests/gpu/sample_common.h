/* Rows, per-row parameters, the host reference and the comparisons of the
 * dpsSample tests (test_gpu_sample; test_gpu_virtual_ranks scenario=sample,
 * tests/gpu/vr/vr_sample.c): header-only, static. Include after
 * gpu_common.h.
 *
 * A batch (smpHost) holds full rows [rows, V] as stored in the logits dtype
 * (and their fp32 values, which is what the reference reads), one filter
 * template per row (kSmpTemplates: greedy, temperature only, top-k 1..5000,
 * top-p, min-p and their combinations) and random uint64 seeds and offsets.
 * The kernels decide top-p with fixed-point masses, the reference with
 * float64 sums, so an index whose prefix mass lies within their rounding of
 * top_p may be kept on one side and cut on the other. With tens of
 * thousands of tokens in a nucleus the prefix masses step by ~2e-6, so such
 * an index exists in almost every large nucleus; what must not happen is
 * that it wins the race. The generator re-draws a row (and its seed and
 * offset) until its token is the same whether every index within
 * SMP_BOUNDARY_REL of the boundary is kept or cut (smpDrawClear); the
 * chi-square rows have no prefix mass that close at all (smpTopPClear). */
#ifndef DPS_SAMPLE_COMMON_H_
#define DPS_SAMPLE_COMMON_H_

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "sample_ref.h"
#include "sample_rng.h"
#include "stats.h"

#define SMP_LP_TOL 2e-5        /* logprob vs the reference: the kernels' fixed-point sums */
#define SMP_BOUNDARY_REL 1e-5  /* no top-p prefix mass this close (relative) to top_p */

/* ---- rows ---------------------------------------------------------------------- */
enum {
  SMP_REAL,       /* Gaussian (sd 2) plus 1..6 peaks 6..14 above it */
  SMP_HOLES,      /* SMP_REAL with ~1 % NaN and ~1 % -inf */
  SMP_FLAT,       /* one value (in [-2, 2]) everywhere, 0..30 % -inf holes (|A| varies) */
  SMP_PLATEAU,    /* ~600 values within 3 nats at the top, the rest 8 nats below */
  SMP_POSINF,     /* SMP_REAL with two +inf entries (token: the lower; logprob NaN) */
  SMP_ALL_NEGINF, /* nothing valid: token 0, logprob -inf */
  SMP_ALL_NAN,    /* NaN counts as -inf: the same */
  SMP_KINDS
};
static const char* const kSmpKindNames[SMP_KINDS] = {"real", "holes", "flat", "plateau",
                                                     "+inf", "all -inf", "all NaN"};
/* Row r's kind: kSmpSchedule[r % 17] (17 is prime to the 30 templates, so
 * every template meets every kind within 510 rows). */
static const int kSmpSchedule[17] = {SMP_REAL,    SMP_REAL,   SMP_HOLES,   SMP_FLAT,
                                     SMP_REAL,    SMP_PLATEAU, SMP_HOLES,  SMP_REAL,
                                     SMP_FLAT,    SMP_REAL,   SMP_HOLES,   SMP_POSINF,
                                     SMP_REAL,    SMP_PLATEAU, SMP_ALL_NEGINF, SMP_REAL,
                                     SMP_ALL_NAN};

GT_FN double smpGauss(uint64_t* s) { /* Box-Muller: host inputs only */
  const double u1 = 1.0 - fxUnif01(s), u2 = fxUnif01(s);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Fills one row of `kind` (fp32 values; the caller rounds them to the dtype). */
GT_FN void smpFillRow(float* row, int64_t V, int kind, uint64_t* s) {
  switch (kind) {
    case SMP_FLAT: {
      const float c = (float)(4.0 * fxUnif01(s) - 2.0);
      const double holes = 0.3 * fxUnif01(s);
      for (int64_t i = 0; i < V; ++i) row[i] = fxUnif01(s) < holes ? -INFINITY : c;
      return;
    }
    case SMP_PLATEAU:
      for (int64_t i = 0; i < V; ++i)
        row[i] = fxUnif01(s) * (double)V < 600.0 ? (float)(3.0 * fxUnif01(s))
                                                  : (float)(-8.0 + smpGauss(s));
      return;
    case SMP_ALL_NEGINF:
      for (int64_t i = 0; i < V; ++i) row[i] = -INFINITY;
      return;
    case SMP_ALL_NAN:
      for (int64_t i = 0; i < V; ++i) row[i] = NAN;
      return;
    default:
      break;
  }
  for (int64_t i = 0; i < V; ++i) row[i] = (float)(2.0 * smpGauss(s));
  const int peaks = 1 + (int)(fxSplitmix(s) % 6);
  for (int k = 0; k < peaks; ++k)
    row[fxSplitmix(s) % (uint64_t)V] += (float)(6.0 + 8.0 * fxUnif01(s));
  if (kind == SMP_HOLES)
    for (int64_t i = 0; i < V; ++i) {
      const double u = fxUnif01(s);
      if (u < 0.01) row[i] = NAN;
      else if (u < 0.02) row[i] = -INFINITY;
    }
  if (kind == SMP_POSINF) {
    row[fxSplitmix(s) % (uint64_t)V] = INFINITY;
    row[fxSplitmix(s) % (uint64_t)V] = INFINITY;
  }
}

/* ---- parameters ------------------------------------------------------------------ */
typedef struct {
  float T;
  int64_t top_k;
  float top_p, min_p;
} smpFilter;

/* Row r's filters: kSmpTemplates[(r + shift) % SMP_NTEMPLATES]. */
static const smpFilter kSmpTemplates[] = {
    {0.0f, 0, 1.0f, 0.0f},       /* greedy */
    {1.0f, 0, 1.0f, 0.0f},       /* temperature only */
    {0.7f, 0, 1.0f, 0.0f},
    {1.0f, 1, 1.0f, 0.0f},       /* top-k */
    {1.0f, 5, 1.0f, 0.0f},
    {0.9f, 50, 1.0f, 0.0f},
    {1.0f, 64, 1.0f, 0.0f},      /* DPS_SAMPLE_CANDIDATES */
    {1.0f, 65, 1.0f, 0.0f},      /* one above: the exact path */
    {1.1f, 300, 1.0f, 0.0f},
    {1.0f, 5000, 1.0f, 0.0f},
    {1.0f, 0, 0.5f, 0.0f},       /* top-p */
    {0.8f, 0, 0.9f, 0.0f},
    {1.0f, 0, 0.99f, 0.0f},      /* flat rows: a nucleus of ~99 % of V */
    {1.0f, 0, 1.0f, 0.05f},      /* min-p */
    {1.3f, 0, 1.0f, 0.2f},
    {0.8f, 50, 0.9f, 0.0f},      /* combined */
    {1.2f, 300, 0.95f, 0.02f},
    {1.0f, 0, 0.9f, 0.05f},
    {0.9f, 5000, 0.99f, 0.0f},
    {1.0f, 64, 1.0f, 0.2f},
    {1.5f, 65, 0.5f, 0.0f},
    {0.0f, 5, 0.5f, 0.1f},       /* greedy: the filters are ignored */
    {0.6f, 1000000, 1.0f, 0.0f}, /* top_k beyond |A| (off); -1 below (off) */
    {1e-3f, -1, 0.9f, 0.0f},     /* tiny T: scores up to ~1e4 */
    {2e-38f, 0, 0.9f, 0.0f},     /* scores overflow fp32: top-p skipped, lowest inf score */
    {1e-42f, 0, 0.9f, 0.0f},     /* subnormal T: a negative flat row's scores all -inf, */
    {1e-42f, 0, 1.0f, 0.0f},     /* where the token is the lowest index of K */
    {1e-42f, 40, 1.0f, 0.0f},
    {1e-42f, 300, 1.0f, 0.0f},
    {1e-42f, 0, 1.0f, 0.1f},
};
#define SMP_NTEMPLATES ((int)(sizeof kSmpTemplates / sizeof kSmpTemplates[0]))

/* Which parameters a call passes as device arrays (the rest as scalars). */
enum {
  SMP_A_T = 1,
  SMP_A_K32 = 2,
  SMP_A_K64 = 4,
  SMP_A_P = 8,
  SMP_A_MINP = 16,
  SMP_A_SEED = 32,
  SMP_A_OFF = 64
};
#define SMP_A_ALL (SMP_A_T | SMP_A_K32 | SMP_A_P | SMP_A_MINP | SMP_A_SEED | SMP_A_OFF)
#define SMP_A_ALL64 (SMP_A_T | SMP_A_K64 | SMP_A_P | SMP_A_MINP | SMP_A_SEED | SMP_A_OFF)

/* A call's parameters: the arrays named in `arrays` (the batch's per-row
 * values), the scalars below for the others. */
typedef struct {
  unsigned arrays;
  float T;
  int64_t top_k;
  float top_p, min_p;
  uint64_t seed, offset;
} smpSpec;

GT_FN smpSpec smpSpecArrays(int use_i64) {
  smpSpec s = {use_i64 ? SMP_A_ALL64 : SMP_A_ALL, 1.0f, 0, 1.0f, 0.0f, 0, 0};
  return s;
}

/* ---- a batch on the host ---------------------------------------------------------- */
typedef struct {
  int64_t rows, V;
  dpsDataType_t dtype;
  float* row;   /* [rows, V]: the logits as stored in dtype, in fp32 (the reference's input) */
  void* stored; /* [rows, V] in dtype: what is uploaded */
  float *T, *top_p, *min_p;
  int64_t* top_k;
  int32_t* top_k32;
  uint64_t *seed, *offset;
  int* kind;
  int* tmpl;
} smpHost;

GT_FN void smpHostFree(smpHost* h) {
  free(h->row), free(h->stored), free(h->T), free(h->top_p), free(h->min_p), free(h->top_k);
  free(h->top_k32), free(h->seed), free(h->offset), free(h->kind), free(h->tmpl);
  memset(h, 0, sizeof *h);
}

GT_FN int smpHostAlloc(smpHost* h, int64_t rows, int64_t V, dpsDataType_t dtype) {
  memset(h, 0, sizeof *h);
  h->rows = rows, h->V = V, h->dtype = dtype;
  const size_t R = (size_t)rows, n = R * (size_t)V;
  h->row = (float*)malloc(n * 4);
  h->stored = malloc(n * dpsDataTypeSize(dtype));
  h->T = (float*)malloc(R * 4), h->top_p = (float*)malloc(R * 4), h->min_p = (float*)malloc(R * 4);
  h->top_k = (int64_t*)malloc(R * 8), h->top_k32 = (int32_t*)malloc(R * 4);
  h->seed = (uint64_t*)malloc(R * 8), h->offset = (uint64_t*)malloc(R * 8);
  h->kind = (int*)malloc(R * sizeof(int)), h->tmpl = (int*)malloc(R * sizeof(int));
  FX_CHECK(h->row && h->stored && h->T && h->top_p && h->min_p && h->top_k && h->top_k32 &&
               h->seed && h->offset && h->kind && h->tmpl,
           "host allocation (%lld x %lld)", (long long)rows, (long long)V);
  return 0;
}

/* Rounds row r's fp32 values to the dtype: `stored` gets the dtype's bits,
 * `row` what they mean. */
GT_FN void smpRoundRow(smpHost* h, int64_t r) {
  float* x = h->row + (size_t)r * h->V;
  for (int64_t i = 0; i < h->V; ++i) {
    fxStore(h->stored, (size_t)r * h->V + i, x[i], h->dtype);
    x[i] = fxLoad(h->stored, (size_t)r * h->V + i, h->dtype);
  }
}

GT_FN void smpSetFilter(smpHost* h, int64_t r, smpFilter f) {
  h->T[r] = f.T, h->top_k[r] = f.top_k, h->top_k32[r] = (int32_t)f.top_k;
  h->top_p[r] = f.top_p, h->min_p[r] = f.min_p;
}

/* Row r's parameters under `spec`, for the reference. */
GT_FN fxSampleParams smpRowParams(const smpHost* h, const smpSpec* spec, int64_t r, int64_t limit,
                                  uint64_t* seed, uint64_t* offset) {
  fxSampleParams p = fxSampleParamsDefault(h->V);
  const int64_t k = (spec->arrays & (SMP_A_K32 | SMP_A_K64)) ? h->top_k[r] : spec->top_k;
  p.temperature = (spec->arrays & SMP_A_T) ? h->T[r] : spec->T;
  p.top_k = k > INT32_MAX ? INT32_MAX : k < -1 ? -1 : (int)k;
  p.top_p = (spec->arrays & SMP_A_P) ? h->top_p[r] : spec->top_p;
  p.min_p = (spec->arrays & SMP_A_MINP) ? h->min_p[r] : spec->min_p;
  p.vocab_limit = limit;
  *seed = (spec->arrays & SMP_A_SEED) ? h->seed[r] : spec->seed;
  *offset = (spec->arrays & SMP_A_OFF) ? h->offset[r] : spec->offset;
  return p;
}

/* S of (row, p) (the set min-p and top-k leave, in the order) into
 * scratch[0..*n), and the float64 prefix masses' cut: *lo = the indices of S
 * kept whatever the rounding (mass before them below top_p by more than
 * SMP_BOUNDARY_REL relative), *hi = those kept by a rounding that far up.
 * Returns 0 when top-p does not apply (off, greedy, one index, overflow:
 * *lo = *hi = *n), 1 when it does, -1 for invalid parameters. */
GT_FN int smpTopPCut(const float* row, int64_t V, const fxSampleParams* p, int64_t* scratch,
                     int64_t* n, int64_t* lo, int64_t* hi) {
  fxSampleParams q = *p;
  q.top_p = 1.0f;
  if (fxRefSampleKeep(row, V, &q, scratch, n) != 0) return -1;
  *lo = *hi = *n;
  if (p->temperature == 0.0f || p->top_p >= 1.0f || *n <= 1) return 0;
  const float s0f = dpsSampleScore(row[scratch[0]], p->temperature);
  if (!(s0f - s0f == 0.0f)) return 0; /* the largest score overflows: top-p is skipped */
  double total = 0.0;
  for (int64_t j = 0; j < *n; ++j)
    total += exp((double)dpsSampleScore(row[scratch[j]], p->temperature) - (double)s0f);
  const double tp = (double)p->top_p;
  double before = 0.0;
  int64_t j = 0;
  for (; j < *n && before / total < tp * (1 - SMP_BOUNDARY_REL); ++j)
    before += exp((double)dpsSampleScore(row[scratch[j]], p->temperature) - (double)s0f);
  *lo = j;
  for (; j < *n && before / total < tp * (1 + SMP_BOUNDARY_REL); ++j)
    before += exp((double)dpsSampleScore(row[scratch[j]], p->temperature) - (double)s0f);
  *hi = j;
  return 1;
}

/* 1 when no prefix mass of (row, p) lies within SMP_BOUNDARY_REL of top_p:
 * every top-p decision is the same in any rounding that close. */
GT_FN int smpTopPClear(const float* row, int64_t V, const fxSampleParams* p, int64_t* scratch) {
  int64_t n = 0, lo = 0, hi = 0;
  return smpTopPCut(row, V, p, scratch, &n, &lo, &hi) >= 0 && lo == hi;
}

/* 1 when the token of (row, p, seed, offset) does not depend on the
 * indices within SMP_BOUNDARY_REL of the top-p boundary: the race over
 * every index that a rounding might keep is won by one that every rounding
 * keeps (it then wins over any kept set between the two). */
GT_FN int smpDrawClear(const float* row, int64_t V, const fxSampleParams* p, uint64_t seed,
                       uint64_t offset, int64_t* scratch) {
  int64_t n = 0, lo = 0, hi = 0;
  const int rc = smpTopPCut(row, V, p, scratch, &n, &lo, &hi);
  if (rc < 0) return 0;
  if (rc == 0 || lo == hi) return 1;
  const int64_t w = fxRefSampleRace(row, p->temperature, scratch, hi, seed, offset);
  for (int64_t j = 0; j < lo; ++j)
    if (scratch[j] == w) return 1;
  return 0;
}

/* Fills row r (kind, template, seed and offset from `s`) and re-draws it
 * until its token is clear of the top-p boundary (smpDrawClear), also
 * under `limit2` (a second vocab_limit the test uses; V for none). */
GT_FN int smpGenRow(smpHost* h, int64_t r, int kind, int tmpl, uint64_t* s, int64_t limit2,
                    int64_t* scratch) {
  h->kind[r] = kind, h->tmpl[r] = tmpl;
  smpSetFilter(h, r, kSmpTemplates[tmpl]);
  const smpSpec spec = smpSpecArrays(0);
  for (int tries = 0; tries < 100; ++tries) {
    float* x = h->row + (size_t)r * h->V;
    h->seed[r] = fxSplitmix(s);
    h->offset[r] = fxSplitmix(s);
    if (r % 23 == 7) h->offset[r] = UINT64_MAX - (uint64_t)tries; /* the largest offsets */
    if (r % 29 == 11) h->seed[r] = (uint64_t)tries; /* seed 0 first */
    smpFillRow(x, h->V, kind, s);
    smpRoundRow(h, r);
    uint64_t sd, of;
    const fxSampleParams p1 = smpRowParams(h, &spec, r, h->V, &sd, &of);
    const fxSampleParams p2 = smpRowParams(h, &spec, r, limit2, &sd, &of);
    if (smpDrawClear(x, h->V, &p1, sd, of, scratch) && smpDrawClear(x, h->V, &p2, sd, of, scratch))
      return 0;
  }
  fprintf(stderr, "row %lld (%s, template %d): no draw clear of the top-p boundary\n",
          (long long)r, kSmpKindNames[kind], tmpl);
  return 1;
}

/* Runs fn(arg, i) for i in [0, n) on host threads (the reference and the
 * generator are slow and independent per row). Returns 1 if any call did. */
typedef int (*smpRowFn)(void* arg, int64_t i, int64_t* scratch);
typedef struct {
  smpRowFn fn;
  void* arg;
  int64_t n, V, next;
  int failed;
} smpPool;

GT_FN void* smpPoolWorker(void* p) {
  smpPool* j = (smpPool*)p;
  int64_t* scratch = (int64_t*)malloc((size_t)j->V * 8);
  if (scratch == NULL) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return NULL;
  }
  for (;;) {
    const int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
    if (i >= j->n) break;
    if (j->fn(j->arg, i, scratch)) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
  }
  free(scratch);
  return NULL;
}

GT_FN int smpParallel(smpRowFn fn, void* arg, int64_t n, int64_t V) {
  smpPool job = {fn, arg, n, V, 0, 0};
  long nt = sysconf(_SC_NPROCESSORS_ONLN);
  nt = nt < 1 ? 1 : nt > 32 ? 32 : nt;
  if (nt > n) nt = n > 0 ? (long)n : 1;
  pthread_t th[32];
  long started = 0;
  for (long t = 0; t < nt; ++t)
    if (pthread_create(&th[t], NULL, smpPoolWorker, &job) == 0) ++started;
  if (started == 0) smpPoolWorker(&job);
  for (long t = 0; t < started; ++t) pthread_join(th[t], NULL);
  return job.failed;
}

typedef struct {
  smpHost* h;
  uint64_t gen_seed;
  int shift;
  int64_t limit2;
} smpGenArg;

GT_FN int smpGenOne(void* p, int64_t r, int64_t* scratch) {
  const smpGenArg* a = (const smpGenArg*)p;
  uint64_t s = a->gen_seed ^ ((uint64_t)r * 0xD1B54A32D192ED03ull); /* one stream per row */
  return smpGenRow(a->h, r, kSmpSchedule[r % 17], (int)((r + a->shift) % SMP_NTEMPLATES), &s,
                   a->limit2, scratch);
}

/* A batch of the mixed rows: row r has kind kSmpSchedule[r % 17] and template
 * (r + shift) % SMP_NTEMPLATES. */
GT_FN int smpGenMixed(smpHost* h, uint64_t gen_seed, int shift, int64_t limit2) {
  smpGenArg a = {h, gen_seed, shift, limit2};
  return smpParallel(smpGenOne, &a, h->rows, h->V);
}

/* Re-draws the seeds, offsets and filters of every row (the logits stay),
 * with template (r + shift), seeds and offsets re-drawn until the token is
 * clear of the top-p boundary (else top-p off for that row). */
GT_FN int smpRedrawParams(smpHost* h, uint64_t gen_seed, int shift) {
  uint64_t s = gen_seed;
  int64_t* scratch = (int64_t*)malloc((size_t)h->V * 8);
  FX_CHECK(scratch != NULL, "host allocation");
  const smpSpec spec = smpSpecArrays(0);
  for (int64_t r = 0; r < h->rows; ++r) {
    h->tmpl[r] = (int)((r + shift) % SMP_NTEMPLATES);
    smpSetFilter(h, r, kSmpTemplates[h->tmpl[r]]);
    int clear = 0;
    for (int tries = 0; tries < 100 && !clear; ++tries) {
      h->seed[r] = fxSplitmix(&s);
      h->offset[r] = fxSplitmix(&s);
      uint64_t sd, of;
      const fxSampleParams p = smpRowParams(h, &spec, r, h->V, &sd, &of);
      clear = smpDrawClear(h->row + (size_t)r * h->V, h->V, &p, sd, of, scratch);
    }
    if (!clear) h->top_p[r] = 1.0f;
  }
  free(scratch);
  return 0;
}

/* dst row j = src row perm[j] (dst allocated with src's shape). */
GT_FN void smpHostPermute(smpHost* dst, const smpHost* src, const int64_t* perm) {
  const size_t V = (size_t)src->V, es = dpsDataTypeSize(src->dtype);
  for (int64_t j = 0; j < src->rows; ++j) {
    const int64_t r = perm[j];
    memcpy(dst->row + (size_t)j * V, src->row + (size_t)r * V, V * 4);
    memcpy((char*)dst->stored + (size_t)j * V * es, (const char*)src->stored + (size_t)r * V * es,
           V * es);
    dst->T[j] = src->T[r], dst->top_p[j] = src->top_p[r], dst->min_p[j] = src->min_p[r];
    dst->top_k[j] = src->top_k[r], dst->top_k32[j] = src->top_k32[r];
    dst->seed[j] = src->seed[r], dst->offset[j] = src->offset[r];
    dst->kind[j] = src->kind[r], dst->tmpl[j] = src->tmpl[r];
  }
}

/* ---- the reference, on host threads ------------------------------------------------- */
typedef struct {
  const smpHost* h;
  const smpSpec* spec;
  int64_t r0, limit;
  int64_t* tok;
  float* lp;
} smpRefArg;

GT_FN int smpRefOne(void* p, int64_t i, int64_t* scratch) {
  const smpRefArg* a = (const smpRefArg*)p;
  (void)scratch;
  const int64_t r = a->r0 + i;
  uint64_t seed, offset;
  const fxSampleParams q = smpRowParams(a->h, a->spec, r, a->limit, &seed, &offset);
  return fxRefSampleToken(a->h->row + (size_t)r * a->h->V, a->h->V, &q, seed, offset, &a->tok[i],
                          &a->lp[i]) != 0;
}

/* The reference's token and logprob of rows [r0, r0 + n) under (spec,
 * limit) into tok[0..n), lp[0..n). fxRefSampleBug must be off meanwhile. */
GT_FN int smpRef(const smpHost* h, const smpSpec* spec, int64_t r0, int64_t n, int64_t limit,
                 int64_t* tok, float* lp) {
  smpRefArg a = {h, spec, r0, limit, tok, lp};
  FX_CHECK(smpParallel(smpRefOne, &a, n, 1) == 0, "the reference refused a row's parameters");
  return 0;
}

/* ---- on the device -------------------------------------------------------------------- */
typedef struct {
  int64_t rows, cols;
  dpsDataType_t dtype;
  void* logits; /* [rows, cols] */
  float *T, *top_p, *min_p;
  int32_t* k32;
  int64_t* k64;
  uint64_t *seed, *offset;
  int64_t* tok;
  float* lp;
} smpDev;

GT_FN void smpDevFree(smpDev* d) {
  cudaFree(d->logits), cudaFree(d->T), cudaFree(d->top_p), cudaFree(d->min_p);
  cudaFree(d->k32), cudaFree(d->k64), cudaFree(d->seed), cudaFree(d->offset);
  cudaFree(d->tok), cudaFree(d->lp);
  memset(d, 0, sizeof *d);
}

GT_FN int smpDevAlloc(smpDev* d, int64_t rows, int64_t cols, dpsDataType_t dtype) {
  memset(d, 0, sizeof *d);
  d->rows = rows, d->cols = cols, d->dtype = dtype;
  const size_t R = (size_t)rows;
  GT_CUDA(cudaMalloc(&d->logits, R * (size_t)cols * dpsDataTypeSize(dtype)));
  GT_CUDA(cudaMalloc((void**)&d->T, R * 4));
  GT_CUDA(cudaMalloc((void**)&d->top_p, R * 4));
  GT_CUDA(cudaMalloc((void**)&d->min_p, R * 4));
  GT_CUDA(cudaMalloc((void**)&d->k32, R * 4));
  GT_CUDA(cudaMalloc((void**)&d->k64, R * 8));
  GT_CUDA(cudaMalloc((void**)&d->seed, R * 8));
  GT_CUDA(cudaMalloc((void**)&d->offset, R * 8));
  GT_CUDA(cudaMalloc((void**)&d->tok, R * 8));
  GT_CUDA(cudaMalloc((void**)&d->lp, R * 4));
  return 0;
}

/* Uploads the per-row parameters of rows [r0, r0 + n) to rows [0, n). */
GT_FN int smpDevUploadParams(smpDev* d, const smpHost* h, int64_t r0, int64_t n, cudaStream_t s) {
  const size_t R = (size_t)n, o = (size_t)r0;
  GT_CUDA(cudaMemcpyAsync(d->T, h->T + o, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->top_p, h->top_p + o, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->min_p, h->min_p + o, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->k32, h->top_k32 + o, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->k64, h->top_k + o, R * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->seed, h->seed + o, R * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(d->offset, h->offset + o, R * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaStreamSynchronize(s));
  return 0;
}

/* Uploads rows [r0, r0 + n) of the logits, columns [col0, col0 + cols) (a
 * rank's shard), and their parameters, to rows [0, n). */
GT_FN int smpDevUpload(smpDev* d, const smpHost* h, int64_t r0, int64_t n, int64_t col0,
                       cudaStream_t s) {
  const size_t es = dpsDataTypeSize(h->dtype);
  GT_CUDA(cudaMemcpy2DAsync(d->logits, (size_t)d->cols * es,
                            (const char*)h->stored + ((size_t)r0 * h->V + (size_t)col0) * es,
                            (size_t)h->V * es, (size_t)d->cols * es, (size_t)n,
                            cudaMemcpyHostToDevice, s));
  return smpDevUploadParams(d, h, r0, n, s);
}

/* The call's dpsSampleParams_t: spec's scalars, and the device arrays it
 * names from row `row0` on. */
GT_FN dpsSampleParams_t smpDpsParams(const smpDev* d, const smpSpec* spec, int64_t row0) {
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.temperature = spec->T;
  p.top_k = spec->top_k;
  p.top_p = spec->top_p;
  p.min_p = spec->min_p;
  p.seed = spec->seed;
  p.offset = spec->offset;
  const unsigned a = spec->arrays;
  if (a & SMP_A_T) p.temperatures = d->T + row0;
  if (a & SMP_A_K32) p.top_ks = d->k32 + row0;
  if (a & SMP_A_K64) p.top_ks_i64 = d->k64 + row0;
  if (a & SMP_A_P) p.top_ps = d->top_p + row0;
  if (a & SMP_A_MINP) p.min_ps = d->min_p + row0;
  if (a & SMP_A_SEED) p.seeds = d->seed + row0;
  if (a & SMP_A_OFF) p.offsets = d->offset + row0;
  return p;
}

/* ---- comparisons ------------------------------------------------------------------------ */
GT_FN int smpSameBits(float a, float b) { /* bit-identical, any NaN equal to any NaN */
  return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}

GT_FN int smpLpClose(float got, float want) {
  if (want != want) return got != got;
  if (isinf(want)) return got == want;
  return isfinite(got) && fabs((double)got - (double)want) <= SMP_LP_TOL;
}

GT_FN void smpDescribe(const smpHost* h, const smpSpec* spec, int64_t r, int64_t limit, char* buf,
                       size_t size) {
  uint64_t seed, offset;
  const fxSampleParams p = smpRowParams(h, spec, r, limit, &seed, &offset);
  snprintf(buf, size,
           "row %lld (%s) T=%g top_k=%d top_p=%g min_p=%g limit=%lld seed=%llu offset=%llu",
           (long long)r, kSmpKindNames[h->kind[r]], (double)p.temperature, p.top_k,
           (double)p.top_p, (double)p.min_p, (long long)limit, (unsigned long long)seed,
           (unsigned long long)offset);
}

/* clear[i] = 1 when the token of row r0 + i under (spec, limit) is clear of
 * the top-p boundary (smpDrawClear); *nclear gets their count. For calls
 * whose scalars were not drawn with the rows. */
typedef struct {
  const smpHost* h;
  const smpSpec* spec;
  int64_t r0, limit;
  unsigned char* clear;
} smpClearArg;

GT_FN int smpClearOne(void* p, int64_t i, int64_t* scratch) {
  const smpClearArg* a = (const smpClearArg*)p;
  uint64_t sd, of;
  const fxSampleParams q = smpRowParams(a->h, a->spec, a->r0 + i, a->limit, &sd, &of);
  a->clear[i] = (unsigned char)smpDrawClear(a->h->row + (size_t)(a->r0 + i) * a->h->V, a->h->V,
                                            &q, sd, of, scratch);
  return 0;
}

GT_FN int smpClearRows(const smpHost* h, const smpSpec* spec, int64_t r0, int64_t n,
                       int64_t limit, unsigned char* clear, int64_t* nclear) {
  smpClearArg a = {h, spec, r0, limit, clear};
  FX_CHECK(smpParallel(smpClearOne, &a, n, h->V) == 0, "host allocation");
  *nclear = 0;
  for (int64_t i = 0; i < n; ++i) *nclear += clear[i];
  return 0;
}

/* Tokens equal to the reference's, logprobs within SMP_LP_TOL (when lp is
 * not NULL), for entries i (batch row r0 + i) with clear[i] (clear may be
 * NULL: every row). Returns the count of wrong rows (the first 5 printed). */
GT_FN long smpCheckRef(const char* what, const smpHost* h, const smpSpec* spec, int64_t r0,
                       int64_t n, int64_t limit, const int64_t* tok, const float* lp,
                       const int64_t* rtok, const float* rlp, const unsigned char* clear) {
  long bad = 0;
  char desc[256];
  for (int64_t i = 0; i < n; ++i) {
    if (clear != NULL && !clear[i]) continue;
    const int ok = tok[i] == rtok[i] && (lp == NULL || smpLpClose(lp[i], rlp[i]));
    if (!ok && bad < 5) {
      smpDescribe(h, spec, r0 + i, limit, desc, sizeof desc);
      fprintf(stderr, "  %s: %s: token %lld logprob %.9g, reference %lld %.9g\n", what, desc,
              (long long)tok[i], lp ? (double)lp[i] : 0.0, (long long)rtok[i], (double)rlp[i]);
    }
    bad += !ok;
  }
  return bad;
}

/* Bit-identical tokens and logprobs (lp, lp2 may be NULL). */
GT_FN long smpCheckSame(const char* what, int64_t n, const int64_t* tok, const float* lp,
                        const int64_t* tok2, const float* lp2, const int64_t* rows) {
  long bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int ok = tok[i] == tok2[i] && (lp == NULL || lp2 == NULL || smpSameBits(lp[i], lp2[i]));
    if (!ok && bad < 5)
      fprintf(stderr, "  %s: row %lld: token %lld logprob %.9g, expected %lld %.9g\n", what,
              (long long)(rows ? rows[i] : i), (long long)tok[i], lp ? (double)lp[i] : 0.0,
              (long long)tok2[i], lp2 ? (double)lp2[i] : 0.0);
    bad += !ok;
  }
  return bad;
}

/* The path counters grew by exactly (greedy, fast, exact) between two reads,
 * and no call was counted invalid: 0, else 1 with the deltas printed. */
GT_FN int smpExpectPaths(const char* what, const dpsSampleStats_t* st0,
                         const dpsSampleStats_t* st1, uint64_t greedy, uint64_t fast,
                         uint64_t exact) {
  const uint64_t dg = st1->rows_greedy - st0->rows_greedy, df = st1->rows_fast - st0->rows_fast,
                 de = st1->rows_exact - st0->rows_exact,
                 di = st1->invalid_calls - st0->invalid_calls;
  FX_CHECK(dg == greedy && df == fast && de == exact && di == 0,
           "%s: path counters grew by greedy %llu fast %llu exact %llu invalid %llu; want %llu, "
           "%llu, %llu, 0",
           what, (unsigned long long)dg, (unsigned long long)df, (unsigned long long)de,
           (unsigned long long)di, (unsigned long long)greedy, (unsigned long long)fast,
           (unsigned long long)exact);
  return 0;
}

#endif /* DPS_SAMPLE_COMMON_H_ */
