/* The planning of dpsArgmax / dpsTopK's local pass (core/select_plan.c)
 * on a fixed wave table, no GPU: the shard's columns and vocab limit, how
 * many blocks a row is split over (the most within one wave, about one block
 * per SM for argmax, chunks of at least 16K columns for top-k, none without
 * clusters), where the argmax pass lets its PDL dependent launch, and when a
 * top-k collection reads only the tiles that may reach its threshold (the
 * resident blocks' columns beyond the L2). */
#include <stdio.h>
#include <string.h>

#include "core/select_plan.h"

/* One H200 as dpsSelectWaves measured it (rows per wave for 1..8 blocks per row). */
static dpsSelWaves h200(void) {
  dpsSelWaves w;
  memset(&w, 0, sizeof w);
  w.sms = 132;
  w.l2_bytes = 60ll << 20;
  const int am[9] = {0, 528, 264, 163, 124, 94, 79, 69, 62};
  const int tk[9] = {0, 264, 132, 79, 62, 47, 39, 32, 30};
  memcpy(w.rows[0], am, sizeof am);
  memcpy(w.rows[1], tk, sizeof tk);
  return w;
}

static int g_fails = 0;

/* Plans one call and checks the split and the release. */
static void expect(const char* what, const dpsSelWaves* w, int k, int64_t rows, int rank,
                   int64_t cols, int64_t limit, int sms, int want_chunks, int want_early) {
  dpsSelectCall call;
  memset(&call, 0, sizeof call);
  call.k = k;
  call.rows = rows;
  call.dtype = dpsBfloat16;
  call.vocab_limit = limit;
  dpsSelLocalArgs a;
  dpsSelPlanLocal(&call, rank, cols, sms, w, 1, &a);
  const long long nvalid_want =
      limit - (int64_t)rank * cols < 0 ? 0
      : limit - (int64_t)rank * cols > cols ? cols
                                            : limit - (int64_t)rank * cols;
  int ok = a.chunks == want_chunks && a.rows == rows && a.cols == cols &&
           a.col0 == (long long)rank * cols && a.nvalid == nvalid_want &&
           a.k == (k > 0 ? k : 1) && a.sink.kind == DPS_REC_NONE && a.pdl == 1;
  if (want_early >= 0) ok = ok && a.early_release == want_early;
  if (!ok) {
    fprintf(stderr,
            "%s: rows=%lld cols=%lld limit=%lld sms=%d: chunks %d (want %d), early %d (want %d), "
            "col0 %lld nvalid %lld (want %lld), k %d\n",
            what, (long long)rows, (long long)cols, (long long)limit, sms, a.chunks, want_chunks,
            a.early_release, want_early, a.col0, a.nvalid, nvalid_want, a.k);
    ++g_fails;
  }
}

/* Plans a top-k call of bf16 rows and checks whether its collection is tiled. */
static void expectTiled(const char* what, const dpsSelWaves* w, int64_t rows, int64_t cols,
                        int want) {
  dpsSelectCall call;
  memset(&call, 0, sizeof call);
  call.k = 64;
  call.rows = rows;
  call.dtype = dpsBfloat16;
  call.vocab_limit = cols;
  dpsSelLocalArgs a;
  dpsSelPlanLocal(&call, 0, cols, w->sms, w, 1, &a);
  if (a.tiled != want) {
    fprintf(stderr, "%s: rows=%lld cols=%lld chunks %d: tiled %d (want %d)\n", what,
            (long long)rows, (long long)cols, a.chunks, a.tiled, want);
    ++g_fails;
  }
}

int main(void) {
  const dpsSelWaves w = h200();
  /* argmax: about one block per SM, chunks of >= 2048 columns, one wave */
  expect("argmax 8 rows", &w, 0, 8, 0, 64640, 64640, 132, 8, 1);
  expect("argmax 64 rows", &w, 0, 64, 0, 76032, 76032, 132, 2, 1);
  expect("argmax 40 rows", &w, 0, 40, 0, 76032, 76032, 132, 3, 1);
  expect("argmax 128 rows", &w, 0, 128, 0, 76032, 76032, 132, 1, 1);
  expect("argmax 256 rows", &w, 0, 256, 0, 76032, 76032, 132, 1, 0);   /* one wave, > 1 per SM */
  expect("argmax 528 rows", &w, 0, 528, 0, 76032, 76032, 132, 1, 0);   /* exactly one wave */
  expect("argmax 1024 rows", &w, 0, 1024, 0, 76032, 76032, 132, 1, 1); /* beyond one wave */
  expect("argmax short row", &w, 0, 1, 0, 4000, 4000, 132, 1, 1);      /* 2 x 2000 < 2048 */
  expect("argmax 1 row", &w, 0, 1, 0, 76032, 76032, 132, 8, 1);
  /* the vocab limit: inside this shard, before it, after it */
  expect("argmax limit inside", &w, 0, 8, 1, 76032, 76032 + 5000, 132, 2, 1);
  expect("argmax limit before", &w, 0, 8, 1, 76032, 76032, 132, 1, 1);
  expect("argmax limit after", &w, 0, 8, 0, 76032, 152064, 132, 8, 1);
  /* fewer SMs to fill (the virtual ranks' grid cap): waves scaled, blocks <= sms */
  expect("argmax 8 rows on 16 SMs", &w, 0, 8, 0, 64640, 64640, 16, 2, 1);
  expect("argmax 64 rows on 16 SMs", &w, 0, 64, 0, 76032, 76032, 16, 1, 0);
  /* top-k: chunks of >= 16384 columns, one wave of 2 blocks per SM */
  expect("top-k 8 rows", &w, 64, 8, 0, 64640, 64640, 132, 3, 1);
  expect("top-k 64 rows", &w, 64, 64, 0, 76032, 76032, 132, 3, 1); /* 4 would need 64 <= 62 */
  expect("top-k 62 rows", &w, 64, 62, 0, 76032, 76032, 132, 4, 1);
  expect("top-k 80 rows", &w, 7, 80, 0, 76032, 76032, 132, 2, 1);
  expect("top-k 256 rows", &w, 64, 256, 0, 76032, 76032, 132, 1, 1);
  expect("top-k 1 row, V/tp 152064", &w, 1, 1, 0, 152064, 152064, 132, 8, 1);
  expect("top-k short row", &w, 64, 1, 0, 32767, 32767, 132, 1, 1);
  /* no clusters (before sm_90, or no sm_90+ device code): never split */
  dpsSelWaves none = w;
  for (int kind = 0; kind < 2; ++kind)
    for (int c = 2; c <= DPS_SEL_MAX_CHUNKS; ++c) none.rows[kind][c] = 0;
  expect("argmax without clusters", &none, 0, 8, 0, 64640, 64640, 132, 1, 1);
  expect("top-k without clusters", &none, 64, 8, 0, 64640, 64640, 132, 1, 1);
  /* a cap of 4 blocks per row (DPSAMPLING_SELECT_SPLIT=4 zeroes the rest) */
  dpsSelWaves cap4 = w;
  for (int kind = 0; kind < 2; ++kind)
    for (int c = 5; c <= DPS_SEL_MAX_CHUNKS; ++c) cap4.rows[kind][c] = 0;
  expect("argmax capped at 4", &cap4, 0, 8, 0, 64640, 64640, 132, 4, 1);
  /* tiles, against a 60 MiB L2 (62.9 MB): 64 x 76032 bf16 is 9.7 MB (3
   * chunks, all resident); 128 x 152064 two chunks a row, 38.9 MB; 256 x
   * 152064 one wave of 264 blocks, 77.9 MB; 1024 x 152064 keeps 264 blocks
   * of 304 KB resident (80.3 MB) */
  expectTiled("top-k 64 x 76032", &w, 64, 76032, 0);
  expectTiled("top-k 128 x 152064", &w, 128, 152064, 0);
  expectTiled("top-k 256 x 152064", &w, 256, 152064, 1);
  expectTiled("top-k 1024 x 152064", &w, 1024, 152064, 1);
  dpsSelWaves big = w;
  big.l2_bytes = 1ll << 30; /* an L2 that keeps them all */
  expectTiled("top-k 1024 x 152064, 1 GiB L2", &big, 1024, 152064, 0);
  dpsSelWaves never = w, always = w; /* DPSAMPLING_TILED_COLLECT=0, =1 */
  never.tiled = DPS_TILED_NEVER;
  always.tiled = DPS_TILED_ALWAYS;
  expectTiled("top-k 1024 x 152064, tiles off", &never, 1024, 152064, 0);
  expectTiled("top-k 64 x 76032, tiles on", &always, 64, 76032, 1);
  /* dpsSample's share, half the L2 (31.5 MB): 128 rows of 152064 on one
   * 512-thread block per SM, 39 MB, tile; 64 rows in two chunks, 19.5 MB, not */
  if (!dpsSelCollectTiled(&w, 128, 152064, 1, dpsBfloat16, 0.5) ||
      dpsSelCollectTiled(&w, 128, 152064, 2, dpsBfloat16, 0.5)) {
    fprintf(stderr, "dpsSelCollectTiled at half the L2: 39 MB not tiled or 19.5 MB tiled\n");
    ++g_fails;
  }
  dpsSelWaves unknown = w; /* the L2 query failed */
  unknown.l2_bytes = 0;
  expectTiled("top-k 1024 x 152064, L2 unknown", &unknown, 1024, 152064, 0);
  unknown.tiled = DPS_TILED_ALWAYS;
  expectTiled("top-k 1024 x 152064, L2 unknown, tiles on", &unknown, 1024, 152064, 1);
  if (g_fails) return 1;
  printf("test_select_plan: row splits, PDL release and tiled collections as planned\n");
  return 0;
}
