/* The sampling noise and the scalar rules of dpsSample, one definition for the
 * host (C11) and the device (CUDA): the kernels, the host reference
 * (testing/sample_ref.c) and the tests all use these functions, so
 * that a token drawn on the GPU can be reproduced bit for bit on the host.
 * docs/sampling.md restates the mapping for users.
 *
 * THE MAPPING (row with seed s: uint64, offset o: uint64; global vocabulary
 * index i: int64 >= 0). The indices come in groups of 8 (g = i >> 3, t =
 * i & 7); a group's smallest exponential is drawn first, then every other
 * index's excess over it (the memorylessness of the exponential):
 *
 *   key      = { (uint32)s, (uint32)(s >> 32) }
 *   P(q, d)  = Philox4x32-10({ (uint32)q, (uint32)(q >> 32) | d << 31,
 *                              (uint32)o, (uint32)(o >> 32) }, key)  (Random123)
 *   w        = P(((g >> 7) << 5) | (g & 31), 1)[(g >> 5) & 3]   (the group's
 *              word: the groups g, g+32, g+64, g+96 of an aligned run of 128
 *              share one call)
 *   pos      = w & 7                      (the index of g holding the minimum)
 *   Um       = ((w >> 3) + 0.5) * 2^-29   (double, exact)
 *   Emin     = -dpsLogDet(Um) * 0.125     (double; Exp(8))
 *   x        = P(i >> 2, 0)[i & 3]        (the index's own word)
 *   U        = (x + 0.5) * 2^-32          (double, exact)
 *   E        = Emin                          if t == pos
 *              Emin + (-dpsLogDet(U))        otherwise   (one double add)
 *   G        = -dpsLogDet(E)              (double)
 *   score    = l_i / T                    (fp32, round to nearest)
 *   key_i    = (float)((double)score + G) (one double add, then round to
 *                                          nearest fp32)
 *   token    = the i of K with the largest key_i, ties to the lower index.
 *
 * Why exact: 8 i.i.d. Exp(1) variables are, jointly, their minimum (Exp(8),
 * which -log(Um) / 8 is), its position (uniform, independent of the minimum)
 * and the excesses of the 7 others over it (i.i.d. Exp(1), independent of
 * both). So E is i.i.d. Exp(1) over all indices, G = -log E i.i.d. standard
 * Gumbel, and argmax (score + G) is distributed as softmax(score) over K (for
 * any K: the indices outside it take no part).
 *
 * Why groups: G <= -log(Emin) over the whole group, so one word bounds the
 * noise of 8 indices, and one Philox call serves 32 indices; the kernels
 * compute an index's own word only where its group's bound lets it reach the
 * best key so far: a few indices per row. The strided sharing (g, g+32, ...)
 * lets lane l of a warp reading 32 consecutive groups 4 times draw its 4
 * groups' words in one call. (i >> 2 < 2^62, so bit 31 of the counter's word
 * 1 is free for the stream d.)
 *
 * Why U in double: x + 0.5 needs 33 bits, so (x + 0.5) * 2^-32 is exact in
 * double; U lies in [2^-33, 1 - 2^-33], never 0 or 1, and all 2^32 values of
 * x stay distinct (likewise Um with 29 bits). Emin then lies in [1.16e-10,
 * 2.60], E in [1.16e-10, 25.47], G in [-3.24, 22.87] (finite): a kept index
 * whose score is more than 26.2 below the row's best can never win.
 *
 * Why the key is rounded to fp32: the kernels compare and exchange 32-bit
 * keys (an order key with the index packed below it in 64 bits, as
 * dpsTopK's merge does). The rounding of score + G to fp32 is the spec's
 * "fp32 rounding of the scores": its effect on a probability is of the order
 * of ulp(|score|) (4e-6 at |score| = 32).
 *
 * BIT-IDENTITY, host vs device. Everything above is integer arithmetic or
 * IEEE-754 basic operations (+, -, *, /, conversions) rounded to nearest,
 * which the host and the GPU both round correctly. What could still differ:
 *  - contraction of a*b+c into one fma (nvcc does it by default, gcc in its
 *    GNU modes with FMA hardware, clang within an expression): on the device
 *    every operation is an explicit _rn intrinsic (__dmul_rn, __dadd_rn,
 *    __ddiv_rn, __fdiv_rn, ...), which the CUDA documentation guarantees are
 *    never merged into an fma; on the host every product passes through
 *    DPS_RNG_OPAQUE (an empty asm that takes the rounded double in a
 *    register), so no compiler flag can fuse it with the next addition;
 *  - -ffast-math (reassociation, reciprocals) on the host: refused below;
 *  - x87 extended precision (float or double evaluated wider): refused below;
 *  - libm: not used (log is dpsLogDet below, with fixed coefficients).
 * nvcc's -fmad=true and -prec-div=false do not affect the _rn intrinsics
 * (checked in the PTX: every f64 operation is mul/add/sub/div.rn, no fma).
 * -ftz=true (which --use_fast_math implies) turns the fp32 ones into .ftz
 * forms that flush fp32 subnormals to 0: the double-precision noise is
 * unaffected, but the score of a subnormal logit changes (measured on an
 * H200: scores differed, keys and min-p decisions did not), and the key
 * changes too when T is below about 2e-12 (above, the change, below
 * 1.2e-38 / T, is lost next to |G| >= 1.2e-10 in the double sum) or T itself
 * is subnormal; the soft-cap of a subnormal logit becomes 0 (its input
 * conversion turns into cvt.ftz.f64.f32; seen in the PTX). Compile the
 * kernels that use this header without -ftz=true (the library's kernels
 * are).
 *
 * THE DETERMINISTIC LOG (dpsLogDet, double in, double out): x = 2^e * m with
 * m in [sqrt(1/2), sqrt(2)) from the bits; f = (m - 1) / (m + 1) (m - 1 is
 * exact); log(m) = 2 atanh(f) = 2f + f s P(s), s = f^2, with
 * P(s) = sum_{k=1..8} 2 s^(k-1) / (2k + 1) (Estrin's scheme, order fixed);
 * log(x) = e ln2_hi + ((e ln2_lo + f s P(s)) + 2f), ln2 split as in fdlibm
 * (e ln2_hi exact). |f| <= 0.1716, s <= 0.0295: the first omitted term,
 * 2 f^19 / 19, is below 9e-16 of the result; measured against libm
 * (tests/cpu/test_sample_ref.c): at most 1.2e-15 relative (7 double ulp, at
 * the edges of the reduction), about 1e-8 of an fp32 ulp.
 *
 * THE DETERMINISTIC TANH (dpsTanhDet, double in, double out), for the
 * soft-cap: tanh(x) = sign(x) E / (E + 2) with E = expm1(2|x|) (no
 * cancellation: E >= 0); x for |x| < 2^-27 (tanh x = x (1 - x^2/3 + ...),
 * the correction below half an ulp), +-1 for |x| >= 22 (1 - tanh 22 =
 * 1.6e-19, below half an ulp of 1). expm1(y) (dpsExpm1Det, 0 <= y < 44):
 * k = (int)(y / ln2 + 0.5), r = (y - k ln2_hi) - k ln2_lo (y - k ln2_hi
 * exact: k ln2_hi has at most 39 bits, Sterbenz), |r| <= 0.347;
 * expm1(r) = r + r^2 Q(r), Q(r) = sum_{n=2..13} r^(n-2) / n! by Horner;
 * expm1(y) = (2^k - 1) + 2^k expm1(r) (2^k - 1 and the product exact).
 * The first omitted term, r^14 / 14!, is below 1.2e-17 of expm1(r); measured
 * against libm's tanh (tests/cpu/test_sample_ref.c): see docs/sampling.md.
 *
 * Also here, as the kernels need them:
 *  - dpsSampleMinPKeep: min-p as (l_i - l_max) / T >= log(min_p), the
 *    difference and the quotient in fp32, log(min_p) = dpsLogDet(min_p) in
 *    double (the spec's exp((l_i - l_max)/T) >= min_p, in the log domain,
 *    so that host and device decide every boundary alike);
 *  - dpsSampleSoftCap: the soft-cap c * tanh(l / c) of a finite fp32 logit,
 *    as fp32((double)c * dpsTanhDet((double)l / (double)c)) (the quotient
 *    and the product in double, one rounding to fp32 at the end); NaN and
 *    +-inf logits pass unchanged (our rule: -inf stays outside the
 *    candidates, +inf keeps the +inf rule). */
#ifndef DPS_SAMPLE_RNG_H_
#define DPS_SAMPLE_RNG_H_

#include <float.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DPS_RNG_HD static __host__ __device__ __forceinline__
#else
#define DPS_RNG_HD static inline
#endif

#if !defined(__CUDA_ARCH__)
#if defined(__FAST_MATH__)
#error "sample_rng.h: -ffast-math reorders the generator's arithmetic; compile this code without it"
#endif
/* float and double evaluated in their own types: FLT_EVAL_METHOD 0, or 16 /
 * 32 (ISO/IEC TS 18661-3: only narrower types are widened; gcc 13 in GNU mode
 * on CPUs with AVX512-FP16 says 16) */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0 && FLT_EVAL_METHOD != 16 && \
    FLT_EVAL_METHOD != 32
#error "sample_rng.h: float and double must be evaluated in their own types (not x87)"
#endif
/* The host side of "no fma": the product is materialized as a rounded double
 * in a register the compiler cannot see through, so it cannot be fused with
 * the addition that consumes it, whatever -ffp-contract says. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define DPS_RNG_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__GNUC__) && defined(__aarch64__)
#define DPS_RNG_OPAQUE(v) __asm__("" : "+w"(v))
#elif defined(__GNUC__)
#define DPS_RNG_OPAQUE(v) __asm__("" : "+m"(v))
#else
#error "sample_rng.h: no contraction barrier for this host compiler"
#endif
#endif

/* ---- Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11; Random123) -------- */
#define DPS_PHILOX_M0 0xD2511F53u
#define DPS_PHILOX_M1 0xCD9E8D57u
#define DPS_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define DPS_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* The 64-bit product of two words: low word returned, high word in *hi
 * (one IMAD.WIDE.U32 on the GPU, one MUL on x86-64). */
DPS_RNG_HD uint32_t dpsMulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  /* the same words; the 64-bit form makes nvcc add a zero high word after
   * every product (18 more instructions per Philox call on sm_90) */
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
#endif
}

/* out = Philox4x32 with 10 rounds of (ctr, key), word for word as Random123's
 * philox4x32(ctr, key) (its kat_vectors hold the test values). */
DPS_RNG_HD void dpsPhilox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; ++r) {
    if (r > 0) { /* the key is bumped before every round but the first */
      k0 += DPS_PHILOX_W0;
      k1 += DPS_PHILOX_W1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = dpsMulhilo32(DPS_PHILOX_M0, c0, &hi0);
    const uint32_t lo1 = dpsMulhilo32(DPS_PHILOX_M1, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* Indices per group (the mapping above): 8; groups per Philox call: 4. */
#define DPS_SAMPLE_GROUP 8

/* The Philox call q of stream d (0: the indices' words, 1: the groups'). */
DPS_RNG_HD void dpsSamplePhilox(uint64_t seed, uint64_t offset, uint64_t q, uint32_t d,
                                uint32_t out[4]) {
  const uint32_t ctr[4] = {(uint32_t)q, (uint32_t)(q >> 32) | (d << 31), (uint32_t)offset,
                           (uint32_t)(offset >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  dpsPhilox4x32_10(ctr, key, out);
}

/* Word r (0..3) of a Philox output (selects, not an indexed array: on the
 * device the words stay in registers). */
DPS_RNG_HD uint32_t dpsSampleWord(const uint32_t w[4], uint32_t r) {
  return r == 0u ? w[0] : r == 1u ? w[1] : r == 2u ? w[2] : w[3];
}

/* The group call of index i: the groups g, g + 32, g + 64, g + 96 of an
 * aligned run of 128 groups (1024 indices) share it, word (g >> 5) & 3. */
DPS_RNG_HD uint64_t dpsSampleGroupCall(int64_t index) {
  const uint64_t g = (uint64_t)index >> 3;
  return ((g >> 7) << 5) | (g & 31u);
}
DPS_RNG_HD uint32_t dpsSampleGroupSlot(int64_t index) {
  return (uint32_t)(((uint64_t)index >> 8) & 3u);
}

/* w of (seed, offset, index): the word of index's group. */
DPS_RNG_HD uint32_t dpsSampleGroupWord(uint64_t seed, uint64_t offset, int64_t index) {
  uint32_t w[4];
  dpsSamplePhilox(seed, offset, dpsSampleGroupCall(index), 1u, w);
  return dpsSampleWord(w, dpsSampleGroupSlot(index));
}

/* x of (seed, offset, index): word i & 3 of the index stream's call i >> 2. */
DPS_RNG_HD uint32_t dpsSampleIndexBits(uint64_t seed, uint64_t offset, int64_t index) {
  uint32_t w[4];
  dpsSamplePhilox(seed, offset, (uint64_t)index >> 2, 0u, w);
  return dpsSampleWord(w, (uint32_t)((uint64_t)index & 3u));
}

/* ---- exact IEEE-754 operations, never contracted --------------------------- */
DPS_RNG_HD double dpsRngMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double r = a * b;
  DPS_RNG_OPAQUE(r);
  return r;
#endif
}
DPS_RNG_HD double dpsRngAdd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DPS_RNG_HD double dpsRngSub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
DPS_RNG_HD double dpsRngDiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
DPS_RNG_HD uint64_t dpsRngBits(double x) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)__double_as_longlong(x);
#else
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
#endif
}
DPS_RNG_HD double dpsRngFromBits(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)b);
#else
  double x;
  memcpy(&x, &b, sizeof x);
  return x;
#endif
}

/* U = (x + 0.5) * 2^-32: exact, in [2^-33, 1 - 2^-33]. */
DPS_RNG_HD double dpsSampleUniform(uint32_t x) {
  return dpsRngMul(dpsRngAdd((double)x, 0.5), 2.3283064365386962890625e-10 /* 2^-32 */);
}

/* Um = ((w >> 3) + 0.5) * 2^-29: exact, in [2^-30, 1 - 2^-30]. */
DPS_RNG_HD double dpsSampleGroupUniform(uint32_t w) {
  return dpsRngMul(dpsRngAdd((double)(w >> 3), 0.5), 1.862645149230957031e-09 /* 2^-29 */);
}

/* ---- the deterministic natural logarithm (double) -------------------------- */
/* log(x) for every double: NaN for NaN and x < 0, -inf for +-0, +inf for
 * +inf; subnormals are scaled by 2^54 first. Same bits on host and device. */
DPS_RNG_HD double dpsLogDet(double x) {
  uint64_t b = dpsRngBits(x);
  if (x != x || (b >> 63) != 0) { /* NaN, negative or -0 */
    if (x == 0) return dpsRngFromBits(0xFFF0000000000000ull); /* -0: -inf */
    return dpsRngFromBits(0x7FF8000000000000ull);
  }
  if (x == 0) return dpsRngFromBits(0xFFF0000000000000ull);
  if (b >= 0x7FF0000000000000ull) return x; /* +inf */
  int e = 0;
  if (b < 0x0010000000000000ull) { /* subnormal: x * 2^54 is exact and normal */
    b = dpsRngBits(dpsRngMul(x, 18014398509481984.0 /* 2^54 */));
    e = -54;
  }
  /* x = 2^e * m, m in [sqrt(1/2), sqrt(2)): m's exponent field is 1023 when
   * the fraction bits are below those of sqrt(2) (0x3FF6A09E667F3BCD), 1022
   * (m in [sqrt(2)/2, 1)) otherwise. */
  const uint64_t frac = b & 0x000FFFFFFFFFFFFFull;
  const uint64_t up = frac >= 0x6A09E667F3BCDull; /* 0 or 1, without a branch */
  e += (int)(b >> 52) - 1023 + (int)up;
  const double m = dpsRngFromBits(frac | ((1023ull - up) << 52));
  const double f = dpsRngDiv(dpsRngSub(m, 1.0), dpsRngAdd(m, 1.0)); /* m - 1 exact */
  const double s = dpsRngMul(f, f);
  /* P(s) = c1 + c2 s + ... + c8 s^7, c_k = 2/(2k+1), by Estrin's scheme
   *   P = (c1 + c2 s) + s^2 (c3 + c4 s) + s^4 ((c5 + c6 s) + s^2 (c7 + c8 s))
   * (this order, on both sides; shorter dependency chains than Horner). The
   * literals are the doubles nearest to 2/(2k+1) (17 significant digits,
   * read back exactly). */
  const double s2 = dpsRngMul(s, s);
  const double s4 = dpsRngMul(s2, s2);
  const double q1 = dpsRngAdd(0.66666666666666663, dpsRngMul(0.40000000000000002, s));
  const double q2 = dpsRngAdd(0.28571428571428571, dpsRngMul(0.22222222222222222, s));
  const double q3 = dpsRngAdd(0.18181818181818182, dpsRngMul(0.15384615384615385, s));
  const double q4 = dpsRngAdd(0.13333333333333333, dpsRngMul(0.11764705882352941, s));
  const double r1 = dpsRngAdd(q1, dpsRngMul(s2, q2));
  const double r2 = dpsRngAdd(q3, dpsRngMul(s2, q4));
  const double p = dpsRngAdd(r1, dpsRngMul(s4, r2));
  const double tail = dpsRngMul(dpsRngMul(f, s), p);  /* f s P(s) */
  const double two_f = dpsRngMul(2.0, f);              /* 2f, exact */
  const double de = (double)e;
  /* ln2 = LN2_HI + LN2_LO (fdlibm's split: LN2_HI has 32 significant bits,
   * so e * LN2_HI is exact for |e| < 2^21) */
  const double ln2_hi = 6.93147180369123816490e-01; /* 0x3FE62E42FEE00000 */
  const double ln2_lo = 1.90821492927058770002e-10; /* 0x3DEA39EF35793C76 */
  const double small = dpsRngAdd(dpsRngAdd(dpsRngMul(de, ln2_lo), tail), two_f);
  return dpsRngAdd(dpsRngMul(de, ln2_hi), small);
}

/* ---- the deterministic expm1 and tanh (double) ----------------------------- */
/* expm1(y) = e^y - 1 for 0 <= y < 44 (what dpsTanhDet needs; k <= 63 below).
 * Same bits on host and device. */
DPS_RNG_HD double dpsExpm1Det(double y) {
  const double ln2_hi = 6.93147180369123816490e-01; /* 0x3FE62E42FEE00000, as in dpsLogDet */
  const double ln2_lo = 1.90821492927058770002e-10; /* 0x3DEA39EF35793C76 */
  const int k = (int)dpsRngAdd(dpsRngMul(y, 1.4426950408889634 /* 1/ln2 */), 0.5);
  const double dk = (double)k;
  const double hi = dpsRngSub(y, dpsRngMul(dk, ln2_hi)); /* both steps exact */
  const double r = dpsRngSub(hi, dpsRngMul(dk, ln2_lo));
  /* Q(r) = 1/2! + r/3! + ... + r^11/13! by Horner; the literals are the
   * doubles nearest to 1/n! (17 significant digits, read back exactly) */
  double q = 1.6059043836821613e-10;                /* 1/13! */
  q = dpsRngAdd(2.08767569878681e-09, dpsRngMul(r, q));    /* 1/12! */
  q = dpsRngAdd(2.505210838544172e-08, dpsRngMul(r, q));   /* 1/11! */
  q = dpsRngAdd(2.7557319223985888e-07, dpsRngMul(r, q));  /* 1/10! */
  q = dpsRngAdd(2.7557319223985893e-06, dpsRngMul(r, q));  /* 1/9! */
  q = dpsRngAdd(2.4801587301587302e-05, dpsRngMul(r, q));  /* 1/8! */
  q = dpsRngAdd(1.9841269841269841e-04, dpsRngMul(r, q));  /* 1/7! */
  q = dpsRngAdd(1.3888888888888889e-03, dpsRngMul(r, q));  /* 1/6! */
  q = dpsRngAdd(8.3333333333333332e-03, dpsRngMul(r, q));  /* 1/5! */
  q = dpsRngAdd(4.1666666666666664e-02, dpsRngMul(r, q));  /* 1/4! */
  q = dpsRngAdd(1.6666666666666666e-01, dpsRngMul(r, q));  /* 1/3! */
  q = dpsRngAdd(0.5, dpsRngMul(r, q));                     /* 1/2! */
  const double em = dpsRngAdd(r, dpsRngMul(dpsRngMul(r, r), q)); /* expm1(r) */
  if (k == 0) return em;
  const double t = dpsRngFromBits((uint64_t)(1023 + k) << 52); /* 2^k */
  return dpsRngAdd(dpsRngSub(t, 1.0), dpsRngMul(t, em));
}

/* tanh(x) for every double: NaN for NaN, +-1 for +-inf, -0 for -0. Same
 * bits on host and device. */
DPS_RNG_HD double dpsTanhDet(double x) {
  if (x != x) return x;
  const uint64_t b = dpsRngBits(x);
  const double ax = dpsRngFromBits(b & 0x7FFFFFFFFFFFFFFFull);
  if (ax < 7.450580596923828125e-09 /* 2^-27 */) return x;
  double t = 1.0;
  if (ax < 22.0) {
    const double e = dpsExpm1Det(dpsRngMul(2.0, ax)); /* 2|x| exact */
    t = dpsRngDiv(e, dpsRngAdd(e, 2.0));
  }
  return (b >> 63) != 0 ? -t : t;
}

/* ---- the noise of one index ------------------------------------------------ */
/* -log(U) of x: Exp(1), in [2^-33, 22.87]. */
DPS_RNG_HD double dpsSampleExpFromBits(uint32_t x) {
  return -dpsLogDet(dpsSampleUniform(x)); /* negation is exact */
}

/* Emin of a group word w: -log(Um) / 8, Exp(8), in [1.16e-10, 2.60]. */
DPS_RNG_HD double dpsSampleGroupMin(uint32_t w) {
  return dpsRngMul(-dpsLogDet(dpsSampleGroupUniform(w)), 0.125 /* exact */);
}

/* G of the index at position t (0..7) of the group with word w, x the
 * index's own word (unused where t is the group's position w & 7). */
DPS_RNG_HD double dpsSampleGumbelIn(uint32_t w, uint32_t t, uint32_t x) {
  const double emin = dpsSampleGroupMin(w);
  const double e = t == (w & 7u) ? emin : dpsRngAdd(emin, dpsSampleExpFromBits(x));
  return -dpsLogDet(e);
}

/* G of (seed, offset, index): in [-3.24, 22.87]. */
DPS_RNG_HD double dpsSampleGumbel(uint64_t seed, uint64_t offset, int64_t index) {
  const uint32_t w = dpsSampleGroupWord(seed, offset, index);
  const uint32_t t = (uint32_t)((uint64_t)index & 7u);
  return dpsSampleGumbelIn(w, t, t == (w & 7u) ? 0u : dpsSampleIndexBits(seed, offset, index));
}

/* ---- scores, keys and the min-p rule (fp32 where the spec says fp32) ------- */
/* score = l / T in fp32, rounded to nearest (T > 0). */
DPS_RNG_HD float dpsSampleScore(float logit, float temperature) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(logit, temperature);
#else
  return logit / temperature;
#endif
}

/* key = fp32(round to nearest of (double)score + G). */
DPS_RNG_HD float dpsSampleKey(float score, double gumbel) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dadd_rn((double)score, gumbel));
#else
  return (float)((double)score + gumbel);
#endif
}

/* min-p keeps index i iff (l_i - l_max) / T >= log(min_p), the difference and
 * the quotient in fp32 (rounded to nearest), compared in double with
 * log_min_p = dpsLogDet((double)min_p) (-inf for min_p == 0: every finite
 * logit kept). l_max is the row's maximum over its allowed, valid indices;
 * the maximum itself is always kept (0 >= log(min_p) for min_p < 1). */
DPS_RNG_HD int dpsSampleMinPKeep(float logit, float lmax, float temperature, double log_min_p) {
#if defined(__CUDA_ARCH__)
  const float d = __fdiv_rn(__fsub_rn(logit, lmax), temperature);
#else
  const float d = (logit - lmax) / temperature;
#endif
  return (double)d >= log_min_p;
}

/* The soft-cap (spec sections 1 and 4): c * tanh(l / c) for a finite logit
 * l and a cap c > 0 (finite), as fp32((double)c * dpsTanhDet((double)l /
 * (double)c)): the quotient and the product in double, rounded to nearest,
 * then one rounding to fp32. NaN and +-inf logits are returned unchanged (our
 * rule; the formula would map +-inf to +-c, making a -inf logit a
 * candidate). */
DPS_RNG_HD float dpsSampleSoftCap(float logit, float cap) {
  if (!(logit - logit == 0.0f)) return logit; /* NaN, +-inf */
  const double t = dpsTanhDet(dpsRngDiv((double)logit, (double)cap));
#if defined(__CUDA_ARCH__)
  return __double2float_rn(dpsRngMul((double)cap, t));
#else
  return (float)dpsRngMul((double)cap, t);
#endif
}

#endif /* DPS_SAMPLE_RNG_H_ */
