/* The host reference of dpsArgmax / dpsTopK (fixtures), which the GPU tests
 * trust: hand-made rows with the documented rules (larger first, NaN as
 * -inf, ties to the lower index, nothing beats -inf -> index 0), and the
 * top-k list against a brute-force selection on generated rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fixtures.h"

static int brute(const float* row, int64_t n, int k, int64_t* idx) {
  for (int t = 0; t < k; ++t) {
    int64_t best = -1;
    for (int64_t j = 0; j < n; ++j) {
      int taken = 0;
      for (int u = 0; u < t; ++u) taken |= idx[u] == j;
      if (taken) continue;
      float a = row[j] != row[j] ? -INFINITY : row[j];
      float b = best < 0 ? 0 : (row[best] != row[best] ? -INFINITY : row[best]);
      if (best < 0 || a > b || (a == b && j < best)) best = j;
    }
    idx[t] = best;
  }
  return 0;
}

int main(void) {
  int fails = 0;
  struct {
    float v[6];
    int64_t limit;
    int64_t want;
    float wv;
  } cases[] = {
      {{1, 3, 3, 2, 0, 0}, 6, 1, 3},                          /* tie: lower index */
      {{NAN, 1, NAN, 2, NAN, 0}, 6, 3, 2},                    /* NaN never wins */
      {{NAN, NAN, NAN, NAN, NAN, NAN}, 6, 0, -INFINITY},      /* all NaN */
      {{-INFINITY, -INFINITY, NAN, -INFINITY, -INFINITY, -INFINITY}, 6, 0, -INFINITY},
      {{0, 1, INFINITY, 2, INFINITY, 0}, 6, 2, INFINITY},     /* +inf, tied */
      {{0, 1, 2, 9, 9, 0}, 3, 2, 2},                          /* limit excludes the max */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    int64_t idx;
    float v;
    double lse;
    fxRefArgmax(cases[i].v, cases[i].limit, &idx, &v, &lse);
    if (idx != cases[i].want || !(v == cases[i].wv)) {
      fprintf(stderr, "argmax case %zu: got %lld %g, want %lld %g\n", i, (long long)idx, v,
              (long long)cases[i].want, cases[i].wv);
      ++fails;
    }
  }
  /* lse: NaN propagates, all -inf -> -inf, a finite row */
  {
    const float r[3] = {0.0f, logf(2.0f), logf(5.0f)};
    int64_t idx;
    float v;
    double lse;
    fxRefArgmax(r, 3, &idx, &v, &lse);
    if (fabs(lse - log(8.0)) > 1e-6) {
      fprintf(stderr, "lse %g, want %g\n", lse, log(8.0));
      ++fails;
    }
    fxRefArgmax(cases[1].v, 6, &idx, &v, &lse);
    if (lse == lse) ++fails, fprintf(stderr, "lse of a row with NaN: %g, want NaN\n", lse);
    fxRefArgmax(cases[3].v, 2, &idx, &v, &lse);
    if (lse != -INFINITY) ++fails, fprintf(stderr, "lse of -inf row: %g\n", lse);
  }
  /* top-k against brute force, every generated row kind */
  enum { V = 300, K = 64 };
  float row[V];
  for (int r = 0; r < 40; ++r)
    for (int k = 1; k <= K; k += 9) {
      for (int c = 0; c < V; ++c) row[c] = fxSelValue(r, c, V, 50, 3);
      int64_t got[K], want[K];
      float gv[K];
      fxRefTopK(row, V - r, k, got, gv);
      brute(row, V - r, k, want);
      for (int t = 0; t < k; ++t)
        if (got[t] != want[t]) {
          fprintf(stderr, "top-%d row %d [%d]: %lld, want %lld\n", k, r, t, (long long)got[t],
                  (long long)want[t]);
          ++fails;
          break;
        }
    }
  if (fails) return 1;
  printf("test_select_ref: the argmax / top-k reference follows the documented rules\n");
  return 0;
}
