/* The first pass's fixed-point sums (src/kernels/sample_zsum.h, the code the
 * kernels run) on the host. No GPU: 2^f is the host's exp2f here (the
 * device's ex2.approx gives other terms, within 2^-22 of them).
 *  1. Fed a vector at a time, in vectors of 1 to 8, they hold exactly the
 *     definition's integers (the sums of the terms by absolute bucket, the
 *     four highest below the top one), for sequences that raise the top
 *     bucket often, span many buckets, sit on bucket edges, hold -inf (no
 *     part), or sit where floats are integers or sparser (|y| >= 2^23, up
 *     to the clamp at 2^40); dpsZsY clamps y there.
 *  2. log Z of rows of logits (Gaussian, offsets up to 1e5, T from 1 down to
 *     0.01, as the logprob's sum and top-p's Z take them) within 2e-6 of
 *     float64's log sum exp(l / T): the error does not grow with the
 *     scores.
 *  3. A value's own term in the scale decide() gives the row's maximum is 1,
 *     for tiny and huge T and clamped y. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fixtures.h"
#include "kernels/sample_zsum.h"
#include "stats.h"

#define MAXN 4096

static uint64_t g_rng = 0x5eed2026u;

static double u01(void) { return fxUnif01(&g_rng); }

/* The definition: every finite element in its bucket, the top bucket's and
 * the three below it summed, lower ones dropped. */
static void definition(const float* y, const float* ylo, int n, long long* b, uint64_t s[4]) {
  long long top = DPS_ZACC_NONE;
  for (int i = 0; i < n; ++i) {
    if (!(y[i] > -INFINITY)) continue;
    const long long bi = (long long)floorf(y[i]);
    if (top == DPS_ZACC_NONE || bi > top) top = bi;
  }
  s[0] = s[1] = s[2] = s[3] = 0u;
  *b = top;
  for (int i = 0; i < n; ++i) {
    if (!(y[i] > -INFINITY)) continue;
    const float fbc = floorf(y[i]);
    const long long d = top - (long long)fbc;
    if (d < 4) s[d] += dpsZAccTerm(y[i], ylo[i], fbc);
  }
}

/* The sequence accumulated in vectors of `vec` elements (0: random 1..8). */
static int check(const char* what, const float* y, const float* ylo, int n, int vec) {
  dpsZAcc z;
  dpsZAccInit(&z);
  for (int i = 0; i < n;) {
    int m = vec > 0 ? vec : 1 + (int)(u01() * 8.0);
    if (m > n - i) m = n - i;
    dpsZAccAdd(&z, y + i, ylo + i, m);
    i += m;
  }
  long long b, wb;
  uint64_t s[4], ws[4];
  dpsZAccSums(&z, &b, s);
  definition(y, ylo, n, &wb, ws);
  FX_CHECK(b == wb && s[0] == ws[0] && s[1] == ws[1] && s[2] == ws[2] && s[3] == ws[3],
           "%s (n %d, vectors of %d): bucket %lld sums %llu %llu %llu %llu, want %lld: %llu "
           "%llu %llu %llu",
           what, n, vec, b, (unsigned long long)s[0], (unsigned long long)s[1],
           (unsigned long long)s[2], (unsigned long long)s[3], wb, (unsigned long long)ws[0],
           (unsigned long long)ws[1], (unsigned long long)ws[2], (unsigned long long)ws[3]);
  return 0;
}

/* Every vector size, and random ones. */
static int checkAll(const char* what, const float* y, int n) {
  static const int kVec[] = {1, 2, 4, 8, 0, 0};
  static float ylo[MAXN]; /* the products' residuals: within half an ulp of y */
  for (int i = 0; i < n; ++i)
    ylo[i] = y[i] > -INFINITY ? (float)((u01() - 0.5) * (double)(nextafterf(fabsf(y[i]), INFINITY) - fabsf(y[i])))
                              : 0.f;
  for (size_t v = 0; v < sizeof kVec / sizeof kVec[0]; ++v)
    if (check(what, y, ylo, n, kVec[v])) return 1;
  return 0;
}

/* 2: log Z against float64 (in nats). */
static int checkAccuracy(void) {
  enum { N = 20000 };
  static float x[N], y[N], ylo[N];
  static const double kOff[] = {0.0, -7.0, 30.0, -1.0e3, 4.0e3, 1.0e5, -1.0e5};
  static const float kT[] = {1.0f, 0.7f, 0.05f, 0.01f};
  double worst = 0.0;
  for (size_t o = 0; o < sizeof kOff / sizeof kOff[0]; ++o)
    for (size_t k = 0; k < sizeof kT / sizeof kT[0]; ++k) {
      const dpsZsScale sc = dpsZsScaleOf(kT[k]);
      double m = -INFINITY;
      for (int i = 0; i < N; ++i) {
        const double u1 = u01() + 1e-300, u2 = u01();
        x[i] = (float)(kOff[o] + 2.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        y[i] = dpsZsY(x[i], sc.hi, sc.lo, &ylo[i]);
        if ((double)x[i] / kT[k] > m) m = (double)x[i] / kT[k];
      }
      dpsZAcc z;
      dpsZAccInit(&z);
      for (int i = 0; i < N; i += 8) dpsZAccAdd(&z, y + i, ylo + i, 8);
      long long b;
      uint64_t s[4];
      dpsZAccSums(&z, &b, s);
      const double zf = (double)(s[0] + (s[1] >> 16) + (s[2] >> 32) + (s[3] >> 48));
      const double got = ((double)(16 * b - DPS_ZACC_UNIT) + log2(zf)) * 0.6931471805599453;
      double acc = 0.0;
      for (int i = 0; i < N; ++i) acc += exp((double)x[i] / kT[k] - m);
      const double err = fabs(got - (m + log(acc)));
      if (err > worst) worst = err;
      FX_CHECK(err <= 2e-6, "log Z of logits around %g at T = %g: %.9g, float64 %.9g (error %.3g)",
               kOff[o], (double)kT[k], got, m + log(acc), err);
    }
  printf("test_zsum: log Z within %.3g of float64 (offsets to 1e5, T to 0.01)\n", worst);
  return 0;
}

enum { GEN_NARROW, GEN_LOGITS, GEN_WIDE, GEN_UP, GEN_DOWN, GEN_EDGES, GEN_FAR, GEN_CLAMP, GEN_KINDS };
static const char* const kGenName[GEN_KINDS] = {"narrow", "logits", "wide", "rising", "falling",
                                                "bucket edges", "around 2^22..2^25",
                                                "up to the clamp 2^40"};

static float gen(int kind, int i, int n, double c) {
  switch (kind) {
    case GEN_NARROW: return (float)(c + 1.5 * u01());
    case GEN_LOGITS: { /* logits in [-10, 20] at T in [0.2, 2], as y = l / T * log2(e) / 16 */
      const double l = -10.0 + 30.0 * u01() * u01();
      return (float)(l / (0.2 + 1.8 * fabs(c) / 1000.0) * 1.4426950408889634 / 16.0);
    }
    case GEN_WIDE: return (float)(c + 16.0 * (u01() - 0.5));
    case GEN_UP: return (float)(c + 12.0 * i / n + 0.3 * u01());
    case GEN_DOWN: return (float)(c - 12.0 * i / n + 0.3 * u01());
    case GEN_EDGES: { /* on and next to the integers b .. b - 5 */
      const float e = (float)(floor(c) - (double)(int)(u01() * 6.0));
      const int w = (int)(u01() * 3.0);
      return w == 0 ? e : w == 1 ? nextafterf(e, -INFINITY) : nextafterf(e, INFINITY);
    }
    case GEN_FAR: { /* around 2^22 .. 2^25, where floats become integers, then sparser */
      const double e = ldexp(1.0, 22 + (int)(u01() * 4.0)) + (double)(int)(u01() * 12.0) - 8.0 + u01();
      return (float)(c < 0 ? -e : e);
    }
    default: { /* up to the clamp: 2^38 .. 2^40, and the clamp itself (dpsZsY's) */
      const double e = u01() < 0.2 ? ldexp(1.0, 40) : ldexp(1.0 + u01(), 38 + (int)(u01() * 2.0));
      return (float)(c < 0 ? -e : e);
    }
  }
}

/* 3: n copies of a value, their sum taken to the value's own scale by
 * dpsZsLog2Rel (as lseRel and decide() take the row's maximum), is log2 n:
 * also where y is rounded without its residual (|y| >= 2^21, tiny T) or
 * clamped (2^40, as -FLT_MAX at T = 1 gives, where 16 b and 16 y are 2^44
 * and log2 n must not be rounded to a double's 2^-8 there). */
static int checkScaleOfMax(void) {
  static const float kX[] = {23.5f, -23.5f, 0.0f, 1e-3f, 7.0f, 30.0f, -1e9f, 3e38f, -FLT_MAX};
  static const float kT[] = {1.0f, 0.7f, 1e-3f, 1e-6f, 1e-7f, 1e-9f, 1e-13f, 1e30f};
  enum { NMAX = 28001 }; /* the largest n: a row of masks' valid count, not a power of two */
  static const int kN[] = {1, 3, 1000, NMAX};
  static float ys[NMAX], los[NMAX];
  for (size_t i = 0; i < sizeof kX / sizeof kX[0]; ++i)
    for (size_t k = 0; k < sizeof kT / sizeof kT[0]; ++k) {
      const dpsZsScale sc = dpsZsScaleOf(kT[k]);
      float lo;
      const float y = dpsZsY(kX[i], sc.hi, sc.lo, &lo);
      if (!(y > -INFINITY)) continue; /* no part: such a row goes exact */
      for (int t = 0; t < NMAX; ++t) ys[t] = y, los[t] = lo;
      for (size_t j = 0; j < sizeof kN / sizeof kN[0]; ++j) {
        dpsZAcc z;
        dpsZAccInit(&z);
        dpsZAccAdd(&z, ys, los, kN[j]);
        long long b;
        uint64_t s[4];
        dpsZAccSums(&z, &b, s);
        const double got =
            dpsZsLog2Rel(b, dpsZsTotal(s[0], s[1], s[2], s[3]), y, lo) - log2((double)kN[j]);
        FX_CHECK(fabs(got) <= 1e-6, "%d copies of %g at T = %g: log2 of their sum in the "
                 "value's own scale less log2 %d: %.3g (want 0)", kN[j], (double)kX[i],
                 (double)kT[k], kN[j], got);
      }
    }
  /* T below about 2.6e-40 (the factor beyond FLT_MAX): no element takes part */
  const dpsZsScale sub = dpsZsScaleOf(1e-42f);
  FX_CHECK(sub.hi == INFINITY && sub.lo == 0.f, "T = 1e-42: the factor %g + %g (want inf + 0)",
           (double)sub.hi, (double)sub.lo);
  for (size_t i = 0; i < sizeof kX / sizeof kX[0]; ++i) {
    float lo;
    const float y = dpsZsY(kX[i], sub.hi, sub.lo, &lo);
    FX_CHECK(y == -INFINITY, "T = 1e-42: %g took part as y = %g", (double)kX[i], (double)y);
  }
  return 0;
}

int main(void) {
  static float y[MAXN];
  /* nothing, and nothing but -inf */
  FX_CHECK(checkAll("empty", y, 0) == 0, "empty");
  for (int i = 0; i < 64; ++i) y[i] = -INFINITY;
  if (checkAll("all -inf", y, 64)) return 1;
  long long cases = 0;
  for (int rep = 0; rep < 400; ++rep)
    for (int kind = 0; kind < GEN_KINDS; ++kind) {
      const int n = 1 + (int)(u01() * u01() * (MAXN - 1));
      const double c = (u01() - 0.5) * (rep % 4 == 0 ? 2000.0 : 40.0);
      const double ninf = rep % 3 == 0 ? 0.0 : u01() * 0.5; /* share of -inf */
      for (int i = 0; i < n; ++i) y[i] = u01() < ninf ? -INFINITY : gen(kind, i, n, c);
      if (rep % 5 == 0) /* leading -inf runs (a masked head) */
        for (int i = 0; i < n / 3; ++i) y[i] = -INFINITY;
      if (checkAll(kGenName[kind], y, n)) return 1;
      ++cases;
    }
  /* where floats turn integer (2^23), then even (2^24, where B - 1 is no
   * float), on both sides */
  for (int k = 0; k < 4; ++k) {
    const float t = (float)(k < 2 ? 8388608.0 : 16777216.0) * (k % 2 ? -1.0f : 1.0f);
    const float seq[] = {t, t - 2.0f, t + 2.0f, t - 4.0f, t + 4.0f, t - 1.0f, t + 1.0f, t - 6.0f};
    if (checkAll("2^23 and 2^24", seq, 8)) return 1;
    ++cases;
  }
  /* a row masked with -FLT_MAX (every y clamped to -2^40), then raised */
  {
    float seq[9], lo[9];
    const float x[] = {-FLT_MAX, -1.0e9f, -FLT_MAX, 3.5f, -2.0f, -FLT_MAX, 12.0f, -7.0f, 0.5f};
    for (int i = 0; i < 9; ++i) seq[i] = dpsZsY(x[i], 0.0901684388518f, 1.2037e-9f, &lo[i]);
    FX_CHECK(seq[0] == -DPS_ZACC_CLAMP && lo[0] == 0.f && seq[1] > -DPS_ZACC_CLAMP,
             "dpsZsY: -FLT_MAX to %g (ylo %g), -1e9 to %g", (double)seq[0], (double)lo[0],
             (double)seq[1]);
    if (checkAll("masked with -FLT_MAX", seq, 9)) return 1;
    ++cases;
  }
  if (checkAccuracy() || checkScaleOfMax()) return 1;
  printf("test_zsum: passed (%lld sequences, each in vectors of 1, 2, 4, 8 and random)\n", cases);
  return 0;
}
