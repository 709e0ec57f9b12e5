/* Session 34's host check of the fixed-point sums' accuracy (branch s34-zsum): log Z of
 * 20000 Gaussian logits (sd 2.5) around an offset, at T, against float64's log sum exp(l / T),
 * for main's y = RN(RN(l / T) * RN(log2(e)) / 16) (no residual) and the branch's compensated y
 * (dpsZsY: the factor in two floats, the product's residual by fma). The accumulation is the
 * branch's sample_zsum.h for both (main's zAdd where ylo = 0, but for the unit, 2^-24 there, and f's clamp). 2^f is the
 * host's exp2f (the device's ex2.approx adds at most ~2.4e-7 a term). Build against the branch:
 *   gcc -std=c11 -O2 -Itesting -Iinclude -I<build>/include -Isrc -Isrc/core \
 *       bench/results/2026-12-05-s34-z-accuracy.c testing/stats.c -lm
 * Its output: bench/results/2026-12-05-s34-z-accuracy.txt. */
#include <math.h>
#include <stdio.h>
#include "kernels/sample_zsum.h"
#include "stats.h"
int main(void) {
  enum { N = 20000 };
  static float x[N], ya[N], yb[N], la[N], lb[N];
  static const double kOff[] = {0.0, -7.0, 30.0, -1.0e3, 4.0e3, 1.0e5, -1.0e5};
  static const float kT[] = {1.0f, 0.7f, 0.05f, 0.01f};
  const float L16 = 1.4426950408889634f * 0.0625f;
  uint64_t g = 99;
  for (size_t o = 0; o < 7; ++o) for (size_t k = 0; k < 4; ++k) {
    const dpsZsScale sc = dpsZsScaleOf(kT[k]);
    double m = -INFINITY;
    for (int i = 0; i < N; ++i) {
      const double u1 = fxUnif01(&g) + 1e-300, u2 = fxUnif01(&g);
      x[i] = (float)(kOff[o] + 2.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
      ya[i] = (k == 0 ? x[i] : x[i] / kT[k]) * L16; la[i] = 0.f;
      yb[i] = dpsZsY(x[i], sc.hi, sc.lo, &lb[i]);
      if ((double)x[i] / kT[k] > m) m = (double)x[i] / kT[k];
    }
    double acc = 0.0; for (int i = 0; i < N; ++i) acc += exp((double)x[i] / kT[k] - m);
    const double ref = m + log(acc);
    double e[2];
    for (int w = 0; w < 2; ++w) {
      dpsZAcc z; dpsZAccInit(&z);
      for (int i = 0; i < N; i += 8) dpsZAccAdd(&z, (w ? yb : ya) + i, (w ? lb : la) + i, 8);
      long long b; uint64_t s[4]; dpsZAccSums(&z, &b, s);
      const double zf = (double)(s[0] + (s[1] >> 16) + (s[2] >> 32) + (s[3] >> 48));
      e[w] = fabs(((double)(16 * b - DPS_ZACC_UNIT) + log2(zf)) * 0.6931471805599453 - ref);
    }
    printf("offset %8g T %5g: main %.3g  branch %.3g\n", kOff[o], (double)kT[k], e[0], e[1]);
  }
  return 0;
}
