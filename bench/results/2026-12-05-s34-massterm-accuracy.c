/* Session 34's host check of massTerm's exponent (branch s34-zsum, 01fe1ed): over 20000 Gaussian
 * logits (sd 2.5) around an offset, at T, the sum of 2^v (exp2 in double, to isolate the exponent)
 * against float64's sum of exp((l - lmax) / T), for main's v = RN(RN(RN(l / T) - RN(lmax / T)) *
 * RN(log2(e))) and the branch's v = RN(RN(l - lmax) * RN(log2(e) / T)). Relative errors.
 *   gcc -std=c11 -O2 -ffp-contract=off -Itesting -Iinclude -I<build>/include \
 *       bench/results/2026-12-05-s34-massterm-accuracy.c testing/stats.c -lm
 * Its output: bench/results/2026-12-05-s34-massterm-accuracy.txt. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "stats.h"
/* massTerm accuracy: main's RN(RN(RN(x/T) - RN(lmax/T)) * RN(log2e)) vs the branch's RN(RN(x - lmax) * RN(log2e/T));
 * sum of 2^v * 2^40 (exp2 in double here, to isolate the exponent's error), relative to float64 sum exp((x - lmax)/T) */
int main(void) {
  enum { N = 20000 }; static float x[N]; uint64_t g = 3;
  const double offs[] = {0, 30, -1000, 4000, 1e5}; const float Ts[] = {1.f, 0.7f, 0.05f, 0.01f};
  const float L2E = 1.4426950408889634f;
  for (int o = 0; o < 5; ++o) for (int k = 0; k < 4; ++k) {
    const float T = Ts[k]; float lmax = -INFINITY;
    for (int i = 0; i < N; ++i) { double u1 = fxUnif01(&g) + 1e-300, u2 = fxUnif01(&g);
      x[i] = (float)(offs[o] + 2.5 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2)); if (x[i] > lmax) lmax = x[i]; }
    const float smax = lmax / T, c = (float)(1.4426950408889634 / (double)T);
    double ref = 0, a = 0, b = 0;
    for (int i = 0; i < N; ++i) {
      ref += exp(((double)x[i] - lmax) / T);
      const float va = ((x[i] / T) - smax) * L2E; a += exp2((double)va);
      const float vb = (x[i] - lmax) * c; b += exp2((double)vb);
    }
    printf("offset %7g T %5g: main %.3g branch %.3g\n", offs[o], (double)T, fabs(a / ref - 1), fabs(b / ref - 1));
  }
  return 0;
}
