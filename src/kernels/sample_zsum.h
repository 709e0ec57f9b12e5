/* The first pass's fixed-point sums of 2^y over absolute buckets (Zb in
 * kernels/sample_row.cuh), accumulated a vector at a time. One definition for
 * the device (CUDA) and the host (C11): tests/cpu/test_zsum.c checks the
 * accumulation against the definition on the CPU.
 *
 * THE DEFINITION. An element comes as y + ylo, its score * log2(e) / 16
 * (dpsZsY): y the fp32 product clamped to [-2^40, 2^40], ylo the part below
 * y's last bit (the product's residual by fma, so that a term's error does
 * not grow with y; 0 where |y| >= 2^21, scores beyond about 2.3e7). It lies
 * in bucket b = floor(y) and weighs 2^(16 (y + ylo - b)) in units of 2^-20:
 *   t = trunc(2^f * 2^20),  f = clamp(((y - b) + ylo) * 16, -4, FMAX)
 * (2^f by ex2.approx on the device; FMAX the float below 20, so t < 2^40;
 * |ylo| < 0.19, so f lies in (-4, 20) and no clamp bites but at |y| >= 2^21,
 * where y is integral or nearly so).
 * A sum holds its highest bucket B and the sums of the terms of buckets B,
 * B-1, B-2 and B-3; lower buckets weigh below 2^-48 of the largest term and
 * are dropped. The integers do not depend on the order of the elements or on
 * how they are split.
 *
 * WHY A VECTOR AT A TIME. Element by element, the bucket came from floorf and
 * a 64-bit conversion, was compared with and subtracted from the 64-bit top
 * bucket, the term went through four 64-bit selects, and the raise of the top
 * bucket sat behind a branch in every element: about 100 instructions an
 * element in the first pass (sm_90 SASS). Here the vector's largest y raises
 * the top bucket once, before its elements are added; then an element's
 * bucket is B - k for the first k with y >= B - k, by float compares with
 * thresholds rounded up (a float y is >= the real B - k iff it is >= B - k
 * rounded up, so the compares are exact for every B), and the sums are kept
 * cumulative (a_k: the terms of buckets B .. B-k), so that an element adds
 * its term under its own compares alone. */
#ifndef DPS_SAMPLE_ZSUM_H_
#define DPS_SAMPLE_ZSUM_H_

#include <limits.h>
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DPS_ZS_FN static __host__ __device__ __forceinline__
#define DPS_ZS_COLD static __host__ __device__ __noinline__ /* rare: out of the loop */
#else
#define DPS_ZS_FN static inline
#define DPS_ZS_COLD static
#endif

#define DPS_ZACC_NONE LLONG_MIN           /* the empty sum's bucket (Zb's ZB_NONE) */
#define DPS_ZACC_CLAMP 1099511627776.0f   /* 2^40: y's clamp */
#define DPS_ZACC_FMAX 0x1.3ffffep+4f      /* the float below 20: 2^FMAX * 2^20 < 2^40 */
#define DPS_ZACC_UNIT 20                  /* a sum counts units of 2^(16 b - 20) */
#define DPS_ZACC_EXACT 2097152.0f         /* 2^21: ylo carried below it */

typedef struct {
  long long b;             /* the highest bucket; DPS_ZACC_NONE: empty */
  float fb;                /* b as a float (exact: the floor of a float); -inf: empty */
  uint64_t a0, a1, a2, a3; /* a_k: the sum of the terms of buckets b .. b - k */
} dpsZAcc;

#if defined(__CUDA_ARCH__)
DPS_ZS_FN float dpsZsSub(float a, float b) { return __fsub_rn(a, b); }
DPS_ZS_FN float dpsZsAdd(float a, float b) { return __fadd_rn(a, b); }
DPS_ZS_FN float dpsZsAddUp(float a, float b) { return __fadd_ru(a, b); }
DPS_ZS_FN float dpsZsMul(float a, float b) { return __fmul_rn(a, b); }
DPS_ZS_FN float dpsZsExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#else
DPS_ZS_FN float dpsZsSub(float a, float b) { return a - b; }
DPS_ZS_FN float dpsZsAdd(float a, float b) { return a + b; }
/* a + b rounded up, for a float a and a small integer b (exact in double) */
DPS_ZS_FN float dpsZsAddUp(float a, float b) {
  const double d = (double)a + (double)b;
  const float f = (float)d;
  return (double)f < d ? nextafterf(f, INFINITY) : f;
}
DPS_ZS_FN float dpsZsMul(float a, float b) { return a * b; }
/* the host's stand-in for ex2.approx: the host checks the accumulation (the
 * buckets, the sums), which takes any function of f alike */
DPS_ZS_FN float dpsZsExp2(float x) { return exp2f(x); }
#endif

/* The factor log2(e) / 16 / T in two floats (lo below hi's last bit): the
 * logprob's sum takes T = 1, top-p's Z the row's T. hi is inf (lo 0) where T is
 * below about 2.6e-40: then no element takes part (and the row goes exact). */
typedef struct {
  float hi, lo;
} dpsZsScale;

DPS_ZS_FN dpsZsScale dpsZsScaleOf(float T) {
  const double c = 0.09016844005556021 / (double)T;
  const int fits = c <= 3.4028234663852886e38; /* FLT_MAX: a float's range */
  dpsZsScale z;
  z.hi = fits ? (float)c : INFINITY;
  z.lo = fits ? (float)(c - (double)z.hi) : 0.f;
  return z;
}

/* An element's y + ylo = x * (hi + lo): y the fp32 product, ylo its
 * residual (exact by fma) plus x * lo, so that a term's error does not grow
 * with the logits; y clamped to [-2^40, 2^40] (scores beyond 1.2e13, as a
 * mask of -FLT_MAX gives; ylo then 0). -inf (no part) where y is not finite
 * (a NaN or infinite x, or an overflow). */
DPS_ZS_FN float dpsZsY(float x, float hi, float lo, float* ylo) {
  const float y = dpsZsMul(x, hi);
  const int in = y > -INFINITY && y < INFINITY;
  const int mid = y > -DPS_ZACC_EXACT && y < DPS_ZACC_EXACT;
  *ylo = mid ? fmaf(x, lo, fmaf(x, hi, -y)) : 0.f;
  return !in ? -INFINITY : fminf(fmaxf(y, -DPS_ZACC_CLAMP), DPS_ZACC_CLAMP);
}

/* 16 (b - (y + ylo)): log2 of a unit of bucket b's sum (less DPS_ZACC_UNIT)
 * in units of the term of y + ylo (dpsZsY's, of the row's maximum: its term
 * is then 1 whatever the rounding or clamp). b - y first, exactly (b is the
 * floor of the largest y, within a bucket of this one): 16 b and 16 y reach
 * 2^44 at the clamp (masks of -FLT_MAX), where a double would keep the log of
 * the sum to 2^-8 only. */
DPS_ZS_FN double dpsZsBucketRel(long long b, float y, float ylo) {
  return 16.0 * (((double)b - (double)y) - (double)ylo);
}

/* The fixed-point total of the sums by bucket s[k] (bucket b - k), in units
 * of 2^(16 b - DPS_ZACC_UNIT): the buckets below b - 3 are dropped (each of
 * their terms weighs below 2^-44 of the largest). */
DPS_ZS_FN uint64_t dpsZsTotal(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
  return s0 + (s1 >> 16) + (s2 >> 32) + (s3 >> 48);
}

/* log2 of a sum (top bucket b, fixed-point total) in units of the term of
 * y + ylo (dpsZsBucketRel); -inf for the empty sum. */
DPS_ZS_FN double dpsZsLog2Rel(long long b, uint64_t total, float y, float ylo) {
  if (b == DPS_ZACC_NONE) return -INFINITY;
  return dpsZsBucketRel(b, y, ylo) - DPS_ZACC_UNIT + log2((double)total);
}

DPS_ZS_FN void dpsZAccInit(dpsZAcc* z) {
  z->b = DPS_ZACC_NONE;
  z->fb = -INFINITY;
  z->a0 = z->a1 = z->a2 = z->a3 = 0u;
}

/* The term of y + ylo in bucket fbc (an integral float, y in [fbc, fbc + 1):
 * y - fbc is exact but where fbc = -1 and |y| < 1/2): f in [-4, 20), so 2^f
 * is normal (the ftz form gives the same) and t in [2^16, 2^40). An element
 * whose y + ylo lies just below its bucket (y on the edge, ylo < 0) weighs
 * below 2^20 there: its value, not the edge's. */
DPS_ZS_FN uint64_t dpsZAccTerm(float y, float ylo, float fbc) {
  const float f =
      fminf(fmaxf(dpsZsMul(dpsZsAdd(dpsZsSub(y, fbc), ylo), 16.f), -4.f), DPS_ZACC_FMAX);
  return (uint64_t)dpsZsMul(dpsZsExp2(f), 1048576.f);
}

/* z with its top bucket raised to bn (> z.b, or z empty): each cumulative sum
 * moves down by d = bn - b buckets (a_k = the old a_{k-d}), nothing of it
 * stays from d = 4 on. */
DPS_ZS_COLD dpsZAcc dpsZAccRaised(dpsZAcc z, long long bn) {
  const long long d = z.b == DPS_ZACC_NONE ? 4 : bn - z.b;
  if (d >= 4) {
    z.a0 = z.a1 = z.a2 = z.a3 = 0u;
  } else if (d == 3) {
    z.a3 = z.a0;
    z.a0 = z.a1 = z.a2 = 0u;
  } else if (d == 2) {
    z.a3 = z.a1;
    z.a2 = z.a0;
    z.a0 = z.a1 = 0u;
  } else {
    z.a3 = z.a2;
    z.a2 = z.a1;
    z.a1 = z.a0;
    z.a0 = 0u;
  }
  z.b = bn;
  z.fb = (float)bn;
  return z;
}

/* Adds y[0..n) + ylo[0..n) (n >= 1): each y in [-2^40, 2^40] (dpsZsY), or
 * -inf for an element that takes no part (its ylo then unused). */
DPS_ZS_FN void dpsZAccAdd(dpsZAcc* z, const float* y, const float* ylo, int n) {
  float m = y[0];
  for (int t = 1; t < n; ++t) m = fmaxf(m, y[t]);
  /* floor(m) > b iff m >= b + 1, rounded up (m is a float); fb = -inf: the first */
  if (m >= dpsZsAddUp(z->fb, 1.f)) {
    if (m == -INFINITY) return; /* nothing to add (then the sum is empty) */
    *z = dpsZAccRaised(*z, (long long)floorf(m));
  }
  /* every y below fb + 1: its bucket is the first fb - k at or below it */
  const float f0 = z->fb, f1 = dpsZsAddUp(f0, -1.f), f2 = dpsZsAddUp(f0, -2.f),
              f3 = dpsZsAddUp(f0, -3.f);
  for (int t = 0; t < n; ++t) {
    const float v = y[t];
    const int p0 = v >= f0, p1 = v >= f1, p2 = v >= f2, p3 = v >= f3;
    /* where p_k first holds, f_k is v's bucket exactly (the floor of a float
     * is a float), so v - f_k is v's part above its bucket */
    const uint64_t term = dpsZAccTerm(v, ylo[t], p0 ? f0 : p1 ? f1 : p2 ? f2 : f3);
    if (p0) z->a0 += term;
    if (p1) z->a1 += term;
    if (p2) z->a2 += term;
    if (p3) z->a3 += term;
  }
}

/* The sums by bucket: s_k = the terms of bucket b - k. */
DPS_ZS_FN void dpsZAccSums(const dpsZAcc* z, long long* b, uint64_t s[4]) {
  *b = z->b;
  s[0] = z->a0;
  s[1] = z->a1 - z->a0;
  s[2] = z->a2 - z->a1;
  s[3] = z->a3 - z->a2;
}

#endif /* DPS_SAMPLE_ZSUM_H_ */
