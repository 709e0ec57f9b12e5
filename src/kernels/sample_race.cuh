/* dpsSample's race (the argmax of key = l/T + G over the visited indices,
 * the exact key only where it may still win) and the first pass's visit of
 * a shard that runs it (kernels/sample.cu is the only includer;
 * docs/sampling.md, "The race, cheaply"). */
#ifndef DPS_SAMPLE_RACE_CUH_
#define DPS_SAMPLE_RACE_CUH_

#include <type_traits>

#include "kernels/sample_row.cuh"

namespace {

/* ---- the race: argmax of key = l/T + G over visited indices --------------------- */
/* The race visits a row a warp at a time (every lane calls together) and
 * computes the exact key (the index's own word, three logs in double) only
 * for the indices that may still reach wb, the best key known so far (the
 * warp's, another warp's of the block, or a lower bound). The group word w
 * alone bounds the noise of its 8 indices: G <= -log(Emin), Emin = -log(Um)
 * / 8 >= (1 - Um) / 8, so key >= wb needs (1 - Um) <= 8 e^(s - wb), i.e.
 * 2^29 - 1 - (w >> 3) < 2^32 e^(s - wb + delta) (the left side is below
 * 2^29 (1 - Um)), delta covering the fp32 score l * (1/T), ex2.approx and
 * the rounding of the key. One Philox call serves 32 indices' bounds; an
 * index that passes is queued, and the warp computes the queued keys
 * together, a lane per index, so the exact evaluations neither diverge nor
 * run for more than a few indices per warp. */
__device__ __noinline__ float exactKey(float x, float T, u64 seed, u64 offset, uint32_t gi) {
  return dpsSampleKey(dpsSampleScore(x, T), dpsSampleGumbel(seed, offset, (int64_t)gi));
}

/* 2^29 - 1 - (w >> 3), the bound's left side (exact below 2^24, rounded
 * above: delta covers it). */
__device__ __forceinline__ float raceGap(uint32_t w) { return (float)(~w >> 3); }

/* May the index with logit x in the group with gap `gap` reach wb, the
 * bound being gap < ex2(x * A + B)? (x = -inf, NaN: no.) A bound below
 * 2^-126 flushes to 0 and fails the index only at gap = 0, where its score
 * is more than 100 below wb (G <= 22.87): the flush never drops an index
 * that can win. */
__device__ __forceinline__ bool raceMayReach(float x, float gap, float A, float B) {
  const float t = fastExp2Ftz(fmaf(x, A, B));
  return x > -INFINITY && !(gap >= t);
}

/* raceMayReach refined by the index's own word xb (an index other than its
 * group's minimum holder): E = Emin + E' >= gap 2^-32 + E'_lb with E' =
 * 32 ln 2 - ln(xb + 0.5) >= 22.1807 - ln(xb + 1) (less 2e-5: __logf and the
 * rounding of xb + 1), so the bound's left side grows by 2^32 E'_lb: about as
 * tight as the exact key, for an index call and two MUFU operations. */
__device__ __forceinline__ bool raceMayReachOwn(float x, float gap, uint32_t xb, float A,
                                                float B) {
  const float e1 = fmaxf(22.1807098f - __logf((float)xb + 1.f) - 2e-5f, 0.f);
  return raceMayReach(x, fmaf(e1, 4294967296.f, gap), A, B);
}

/* The exact key of index gi with logit x when the refined bound lets it
 * reach wb (else -inf): both words, then three logs in double. */
__device__ __noinline__ float raceExactKey(float x, float T, float A, float B, u64 seed,
                                          u64 offset, uint32_t gi) {
  const uint32_t w = dpsSampleGroupWord(seed, offset, (int64_t)gi);
  const uint32_t t = gi & 7u;
  uint32_t xb = 0u;
  if (t != (w & 7u)) {
    xb = dpsSampleIndexBits(seed, offset, (int64_t)gi);
    if (!raceMayReachOwn(x, raceGap(w), xb, A, B)) return -INFINITY;
  }
  return dpsSampleKey(dpsSampleScore(x, T), dpsSampleGumbelIn(w, t, xb));
}

constexpr int RACE_QUEUE = 64; /* queued indices per warp */
struct RaceQueue {
  uint32_t idx[RACE_QUEUE];
  float x[RACE_QUEUE];
};

/* The block's race scratch, one allocation per kernel whichever pass runs
 * the race: a queue per warp and the block's best key (orderKey). */
__device__ __forceinline__ RaceQueue* raceQueues() {
  __shared__ RaceQueue q[WARPS];
  return q;
}
__device__ __forceinline__ uint32_t* raceBlockBest() {
  __shared__ uint32_t b;
  return &b;
}

struct RaceBest {
  float k;    /* key */
  uint32_t i; /* index (NO_INDEX: none) */
  float v;    /* logit */
};

/* The better of b and the warp's best m (every lane calls; the result is
 * the same on every lane). */
__device__ __forceinline__ RaceBest raceWarpBest(RaceBest m, RaceBest b) {
  const uint32_t ok = orderKey(m.k);
  const uint32_t mk = __reduce_max_sync(0xffffffffu, ok);
  const uint32_t mi = __reduce_min_sync(0xffffffffu, ok == mk ? m.i : NO_INDEX);
  const int src = __ffs(__ballot_sync(0xffffffffu, ok == mk && m.i == mi)) - 1;
  const float k = __shfl_sync(0xffffffffu, m.k, src);
  const float v = __shfl_sync(0xffffffffu, m.v, src);
  if (raceBetter(k, mi, b.k, b.i)) b = RaceBest{k, mi, v};
  return b;
}

/* The exact keys of the n queued indices (a whole warp calls): the better of
 * their best and `b`, the same on every lane. A key of -inf takes part: a
 * score that overflows downwards (every kept score -inf: the lowest index
 * wins, as the spec's ties say), or raceExactKey's rejection, which only a
 * finite bound gives, i.e. where a key above -inf exists and wins. */
__device__ __noinline__ RaceBest raceFlush(const RaceQueue* q, int n, float T, float A, float B,
                                           u64 seed, u64 offset, RaceBest b) {
  __syncwarp();
  RaceBest m = {-INFINITY, NO_INDEX, -INFINITY};
  for (int e = threadIdx.x & 31; e < n; e += 32) {
    const uint32_t gi = q->idx[e];
    const float x = q->x[e];
    const float k = raceExactKey(x, T, A, B, seed, offset, gi);
    if (raceBetter(k, gi, m.k, m.i)) m = RaceBest{k, gi, x};
  }
  __syncwarp(); /* the slots may be refilled */
  return raceWarpBest(m, b);
}

template <int C>
struct RaceVals {
  float v[C];
};

/* The pass mask of C values at gi0.. that do not lie in one aligned group
 * (heads, tails, unaligned vectors): out of line, so that the hot loop
 * holds one Philox call per vector. */
template <int C>
__device__ __noinline__ uint32_t racePassMaskAnyAlign(u64 seed, u64 offset, float A, float B,
                                                      uint32_t gi0, RaceVals<C> vals) {
  uint32_t m = 0u, cq = 0xffffffffu;
  float gap = 0.f;
#pragma unroll
  for (int t = 0; t < C; ++t) {
    if (!(vals.v[t] > -INFINITY)) continue; /* not in the race (the exact path's race) */
    const uint32_t gi = gi0 + (uint32_t)t;
    if ((gi >> 3) != cq) {
      gap = raceGap(dpsSampleGroupWord(seed, offset, (int64_t)gi));
      cq = gi >> 3;
    }
    m |= raceMayReach(vals.v[t], gap, A, B) ? 1u << t : 0u;
  }
  return m;
}
struct Race;
template <int C>
__device__ __noinline__ Race raceEnqueue(Race r, uint32_t gi0, RaceVals<C> vals, uint32_t m);

struct Race {
  float T;
  float A, B; /* index may pass: gap < ex2(l * A + B); A = log2(e) / T */
  bool prune;
  u64 seed, offset;
  RaceBest best; /* the same on every lane of the warp */
  int n;         /* queued in this warp's queue */

  /* Whether the bound prunes at temperature t (else every index passes). */
  __device__ __forceinline__ static bool prunes(float t) {
    const float a = __fmul_rn(__frcp_rn(t), LOG2E);
    return a > 0.f && a < INFINITY;
  }

  /* Every thread of the block calls (a barrier: the block's best is reset). */
  __device__ __forceinline__ void init(float t, u64 sd, u64 off) {
    T = t;
    A = __fmul_rn(__frcp_rn(t), LOG2E);
    prune = prunes(t);
    seed = sd;
    offset = off;
    best = RaceBest{-INFINITY, NO_INDEX, -INFINITY};
    n = 0;
    __syncthreads(); /* the previous user of the block's best is done */
    if (threadIdx.x == 0) *raceBlockBest() = KEY_NEG_INF;
    __syncthreads();
    bound();
  }

  /* The margin of a bound at score s: the fp32 score l * (1/T), ex2.approx
   * and the rounding of the key, over the scores that can reach s. */
  __device__ __forceinline__ static float margin(float s) {
    return 2e-3f + 2e-5f * (fabsf(s) + 24.f);
  }

  /* floor: a lower bound of the best key known to the caller */
  __device__ __forceinline__ void bound(float floor = -INFINITY) {
    float wb = best.i == NO_INDEX ? -INFINITY : best.k;
    wb = fmaxf(fmaxf(wb, floor), keyValue(*(volatile uint32_t*)raceBlockBest()));
    if (!prune) { /* everything passes: l * 0 + inf is inf, or NaN for l = +inf */
      A = 0.f;
      B = INFINITY;
      return;
    }
    if (wb == INFINITY) {
      /* only a +inf key ties (lower index wins): a score l / T that
       * overflows, which needs l * A >= FLT_MAX * log2(e) (about 4.9e38,
       * +inf in fp32); every index with l * A >= 1.2e38 passes */
      B = 32.f - 1.2e38f;
      return;
    }
    if (!(fabsf(wb) < 1e30f)) { /* -inf or huge: everything passes */
      B = INFINITY;
      return;
    }
    B = fmaf(-(wb - margin(wb)), LOG2E, 32.f);
  }

  /* Visits v[t] at global index gi0 + t (a whole warp calls together). */
  template <int C>
  __device__ __forceinline__ void visit(uint32_t gi0, const float (&v)[C]) {
    uint32_t m = 0u;
    if ((C == 8 || C == 4) && (gi0 & (uint32_t)(C - 1)) == 0u) {
      /* the C indices share one group of 8: one Philox call, one gap */
      const float gap = raceGap(dpsSampleGroupWord(seed, offset, (int64_t)gi0));
#pragma unroll
      for (int t = 0; t < C; ++t) m |= raceMayReach(v[t], gap, A, B) ? 1u << t : 0u;
    } else {
      RaceVals<C> vals;
#pragma unroll
      for (int t = 0; t < C; ++t) vals.v[t] = v[t];
      m = racePassMaskAnyAlign<C>(seed, offset, A, B, gi0, vals);
    }
    if (__any_sync(0xffffffffu, m != 0u)) { /* rare: out of line, the loop stays small */
      RaceVals<C> vals;
#pragma unroll
      for (int t = 0; t < C; ++t) vals.v[t] = v[t];
      *this = raceEnqueue<C>(*this, gi0, vals, m);
    }
  }

  /* visit() where the bound prunes (prunes(T)): an aligned group is tested
   * as one "may its largest value pass?" (with A > 0 finite the test is
   * monotone in x; fmaxf drops NaN; x = -inf gives ex2 = 0, which fails);
   * the mask of the passing indices is built only when some lane's group
   * has one. */
  template <int C>
  __device__ __forceinline__ void visitPruned(uint32_t gi0, const float (&v)[C]) {
    if (!((C == 8 || C == 4) && (gi0 & (uint32_t)(C - 1)) == 0u)) {
      visit<C>(gi0, v);
      return;
    }
    const float gap = raceGap(dpsSampleGroupWord(seed, offset, (int64_t)gi0));
    float mx = v[0];
#pragma unroll
    for (int t = 1; t < C; ++t) mx = fmaxf(mx, v[t]);
    const bool any = gap < fastExp2Ftz(fmaf(mx, A, B));
    if (__any_sync(0xffffffffu, any)) { /* rare: the mask, then the queue */
      RaceVals<C> vals;
      uint32_t m = 0u;
#pragma unroll
      for (int t = 0; t < C; ++t) {
        m |= raceMayReach(v[t], gap, A, B) ? 1u << t : 0u;
        vals.v[t] = v[t];
      }
      *this = raceEnqueue<C>(*this, gi0, vals, m);
    }
  }

  __device__ __forceinline__ void flush() {
    best = raceFlush(raceQueues() + (threadIdx.x >> 5), n, T, A, B, seed, offset, best);
    n = 0;
    if (best.i != NO_INDEX && (threadIdx.x & 31) == 0) atomicMax(raceBlockBest(), orderKey(best.k));
    bound();
  }

  /* A first lower bound of the best key, from one group per thread spread
   * over [from, to) (every index there takes part in the race): the key of
   * the group's minimum holder is s + G with G = -log(Emin) >= log(Um) -
   * log(1 - Um) + log 8 (as -log Um <= (1 - Um) / Um) >= log(m) - log(2^29 -
   * m) + log 8, m = w >> 3; the block's best of them is shared (every thread
   * of the block calls). */
  template <typename X>
  __device__ __forceinline__ void seedBound(const char* rowp, int dtype, long long col0,
                                            long long from, long long to, const X& xf) {
    float l = -INFINITY;
    if (prune && to > from) {
      long long j0 = from + (to - from) * (long long)threadIdx.x / (long long)blockDim.x;
      j0 -= (long long)((uint32_t)(col0 + j0) & 7u);
      const uint32_t w = dpsSampleGroupWord(seed, offset, (int64_t)(uint32_t)(col0 + j0));
      const long long j = j0 + (long long)(w & 7u);
      const uint32_t m = w >> 3;
      if (j >= from && j < to && m > 0u) {
        const float x = xf.one(j, loadValue(rowp, j, dtype));
        if (x > -INFINITY && x < INFINITY) {
          const float sc = x * __frcp_rn(T);
          const float g = __logf((float)m) - __logf((float)(0x20000000u - m)) + 2.0794415f;
          l = fmaxf(l, sc + g - margin(sc));
        }
      }
    }
    const uint32_t k = __reduce_max_sync(0xffffffffu, orderKey(l));
    if ((threadIdx.x & 31) == 0) atomicMax(raceBlockBest(), k);
    __syncthreads();
    bound();
  }

  __device__ __forceinline__ void finish() {
    if (n > 0) flush();
  }
};

template <int C>
__device__ Race raceEnqueue(Race r, uint32_t gi0, RaceVals<C> vals, uint32_t m) {
  const uint32_t lt = (1u << (threadIdx.x & 31)) - 1u;
  for (int t = 0; t < C; ++t) {
    const bool in = (m >> t) & 1u;
    const uint32_t bal = __ballot_sync(0xffffffffu, in);
    if (bal == 0u) continue;
    if (in) {
      RaceQueue* q = raceQueues() + (threadIdx.x >> 5);
      const int p = r.n + __popc(bal & lt);
      q->idx[p] = gi0 + (uint32_t)t;
      q->x[p] = vals.v[t];
    }
    r.n += __popc(bal);
    if (r.n > RACE_QUEUE - 32) r.flush();
  }
  return r;
}

/* ---- the lean pass: a temperature-only row of 2-byte logits --------------------- */
/* The row is read as runs of 128 groups of 8 (1024 indices, aligned in the
 * global index): lane l of a warp reads groups 32k + l (k = 0..3) of a run,
 * whose 4 words are one Philox call (the mapping's strided sharing). A group
 * is tested as a whole (its largest value against its word's bound); the
 * key of each group's minimum holder (a lower bound from its word alone)
 * raises the warp's best key as it goes (and the block's). Passing groups
 * are queued (their first index) and flushed between steps, a lane per
 * group: the word and the values again, then per index the group bound, the
 * bound refined by the index's own word, and only then the exact key.
 * Queues: the RACE kernel's own (2 runs per step, 288 groups per warp); the
 * other kernels', which have no room for more shared memory, reuse the
 * race's queue (1 run per step, 128 groups per warp, flushed after every
 * step that passed). docs/sampling.md, "The lean pass". */
constexpr int LEAN_RUNS = 2;
constexpr int LEAN_QUEUE = 128 * LEAN_RUNS + 32; /* a step adds at most 128 per run */
__device__ __forceinline__ uint32_t* leanQueue() {
  __shared__ uint32_t q[WARPS][LEAN_QUEUE];
  return q[threadIdx.x >> 5];
}
static_assert(sizeof(RaceQueue) == 128 * sizeof(uint32_t), "the race's queue holds 128 groups");

template <int DT>
__device__ __forceinline__ float leanMax8(uint4 v) {
  if (DT == 1) {
    __nv_bfloat162 a, b, c, d;
    memcpy(&a, &v.x, 4);
    memcpy(&b, &v.y, 4);
    memcpy(&c, &v.z, 4);
    memcpy(&d, &v.w, 4);
    const __nv_bfloat162 m = __hmax2(__hmax2(a, b), __hmax2(c, d)); /* NaN: the other */
    return fmaxf(__low2float(m), __high2float(m));
  } else {
    __half2 a, b, c, d;
    memcpy(&a, &v.x, 4);
    memcpy(&b, &v.y, 4);
    memcpy(&c, &v.z, 4);
    memcpy(&d, &v.w, 4);
    const __half2 m = __hmax2(__hmax2(a, b), __hmax2(c, d));
    return fmaxf(__low2float(m), __high2float(m));
  }
}

template <int DT>
__device__ __forceinline__ float leanValueAt(uint4 v, uint32_t t) {
  const uint32_t wd = t < 4u ? (t < 2u ? v.x : v.y) : (t < 6u ? v.z : v.w);
  const uint32_t h = (t & 1u) ? wd >> 16 : wd & 0xffffu;
  if (DT == 1) return __uint_as_float(h << 16);
  return __half2float(__ushort_as_half((unsigned short)h));
}

/* The exact keys of a warp's queued groups (a whole warp calls): the better
 * of their best and b, the same on every lane. */
template <int DT>
__device__ __noinline__ RaceBest leanFlush(const uint32_t* q, int n, const char* rowp,
                                           long long col0, float T, float A, float B, u64 seed,
                                           u64 offset, RaceBest b) {
  __syncwarp();
  RaceBest m = {-INFINITY, NO_INDEX, -INFINITY};
  for (int e = threadIdx.x & 31; e < n; e += 32) {
    const uint32_t gi0 = q[e];
    const uint32_t w = dpsSampleGroupWord(seed, offset, (int64_t)gi0);
    uint32_t xw[4] = {0u, 0u, 0u, 0u}, xq = 0xffffffffu; /* the index call of gi >> 2 */
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(rowp + ((long long)gi0 - col0) * 2));
    const float gap = raceGap(w);
#pragma unroll 1
    for (uint32_t t = 0; t < 8u; ++t) {
      const float x = leanValueAt<DT>(v, t);
      if (!raceMayReach(x, gap, A, B)) continue;
      const uint32_t gi = gi0 + t;
      uint32_t xb = 0u;
      if (t != (w & 7u)) {
        if ((gi >> 2) != xq) {
          xq = gi >> 2;
          dpsSamplePhilox(seed, offset, (u64)xq, 0u, xw);
        }
        xb = dpsSampleWord(xw, t & 3u);
        if (!raceMayReachOwn(x, gap, xb, A, B)) continue;
      }
      const float k = dpsSampleKey(dpsSampleScore(x, T), dpsSampleGumbelIn(w, t, xb));
      if (raceBetter(k, gi, m.k, m.i)) m = RaceBest{k, gi, x};
    }
  }
  __syncwarp(); /* the slots may be refilled */
  return raceWarpBest(m, b);
}

/* The race over global [col0 + from, col0 + to) of a row whose 16-byte
 * vectors hold aligned groups ((rowp - 2 col0) 16-byte aligned); every
 * thread of the block calls, after race.init. MAXV: also the largest
 * element (NaN ignored) this thread loaded into *vmax (the threads' sets
 * disjoint, together the range: min-p's bound and its candidates' first
 * pass); a max per vector, which the temperature-only RACE kernel leaves out. */
template <int DT, int RUNS, int CAP, bool MAXV>
__device__ __forceinline__ void leanRange(const char* rowp, long long col0, long long from,
                                          long long to, Race& race, uint32_t* lq, float* vmax) {
  float mx = -INFINITY;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const long long g0 = col0 + from, g1 = col0 + to;
  const long long ga = (g0 + 7) >> 3, gb = g1 >> 3; /* whole groups: [ga, gb) */
  if (warp == 0) { /* the partial groups at the ends: lanes 0..7 the head, 8..15 the tail */
    const long long hend = 8 * ga < g1 ? 8 * ga : g1;
    const long long tbeg = gb >= ga ? 8 * gb : g1;
    long long gi = -1;
    if (lane < 8 && g0 + lane < hend) gi = g0 + lane;
    if (lane >= 8 && lane < 16 && tbeg + lane - 8 < g1) gi = tbeg + lane - 8;
    const float v[1] = {gi >= 0 ? loadValue(rowp, gi - col0, DT) : -INFINITY};
    if (MAXV) mx = fmaxf(mx, v[0]);
    race.visit<1>((uint32_t)(gi >= 0 ? gi : 0), v);
    race.finish(); /* the race's queue is free (the other kernels' lean queue) */
  }
  int n = 0;
  const uint32_t pad = DT == 1 ? 0xFF80FF80u : 0xFC00FC00u;
  const uint32_t key[2] = {(uint32_t)race.seed, (uint32_t)(race.seed >> 32)};
  const float invT = __frcp_rn(race.T);
  const uint32_t lt = (1u << lane) - 1u;
  const long long r0 = ga >> 7, r1 = (gb + 127) >> 7; /* runs of 128 groups */
  for (long long r = r0 + (long long)warp * RUNS; r < r1; r += (long long)nwarps * RUNS) {
    if (n >= 32 || n > CAP - 128 * RUNS) {
      race.best = leanFlush<DT>(lq, n, rowp, col0, race.T, race.A, race.B, race.seed,
                                race.offset, race.best);
      n = 0;
      if (lane == 0) atomicMax(raceBlockBest(), orderKey(race.best.k));
      race.bound();
    }
    uint4 v[RUNS][4];
#pragma unroll
    for (int u = 0; u < RUNS; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const long long g = (r + u) * 128 + 32 * k + lane;
        v[u][k] = g >= ga && g < gb
                      ? __ldg(reinterpret_cast<const uint4*>(rowp + (g * 8 - col0) * 2))
                      : make_uint4(pad, pad, pad, pad);
      }
    uint32_t w[RUNS][4];
#pragma unroll
    for (int u = 0; u < RUNS; ++u) {
      const u64 q = (u64)(r + u) * 32u + (u64)lane;
      const uint32_t ctr[4] = {(uint32_t)q, (uint32_t)(q >> 32) | (1u << 31),
                               (uint32_t)race.offset, (uint32_t)(race.offset >> 32)};
      dpsPhilox4x32_10(ctr, key, w[u]);
    }
    /* the minimum holders' keys from below: G >= ln 2 (lg2 m - lg2 (2^29 - m) + 3) */
    float lb = -INFINITY;
#pragma unroll
    for (int u = 0; u < RUNS; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t m = w[u][k] >> 3;
        const float xp = leanValueAt<DT>(v[u][k], w[u][k] & 7u);
        const float g = __log2f((float)m) - __log2f((float)(0x20000000u - m));
        lb = fmaxf(lb, fmaf(g + 3.f, 0.6931472f, xp * invT));
      }
    if (lb < INFINITY) lb -= 3e-3f + 2e-5f * (fabsf(lb) + 48.f);
    const uint32_t wk = __reduce_max_sync(0xffffffffu, orderKey(lb));
    if (lane == 0 && wk > *(volatile uint32_t*)raceBlockBest()) atomicMax(raceBlockBest(), wk);
    race.bound(keyValue(wk));
    bool pass[RUNS][4], any = false;
#pragma unroll
    for (int u = 0; u < RUNS; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float m8 = leanMax8<DT>(v[u][k]);
        if (MAXV) mx = fmaxf(mx, m8);
        pass[u][k] = raceGap(w[u][k]) < fastExp2Ftz(fmaf(m8, race.A, race.B));
        any = any || pass[u][k];
      }
    if (__any_sync(0xffffffffu, any)) { /* rare: queue the passing groups */
#pragma unroll
      for (int u = 0; u < RUNS; ++u)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t bal = __ballot_sync(0xffffffffu, pass[u][k]);
          if (pass[u][k]) {
            const int slot = n + __popc(bal & lt);
            lq[slot] = (uint32_t)(((r + u) * 128 + 32 * k + lane) * 8);
          }
          n += __popc(bal);
        }
    }
  }
  if (n > 0) {
    race.best = leanFlush<DT>(lq, n, rowp, col0, race.T, race.A, race.B, race.seed, race.offset,
                              race.best);
    if (lane == 0) atomicMax(raceBlockBest(), orderKey(race.best.k));
  }
  if (MAXV) *vmax = mx;
}

/* ---- the first pass -------------------------------------------------------------- */
/* a vector's terms into a fixed-point sum in the scale s (-inf: no part) */
template <int CN>
__device__ __forceinline__ void zsAdd(dpsZAcc& z, dpsZsScale s, const float (&v)[CN]) {
  float y[CN], yl[CN];
#pragma unroll
  for (int t = 0; t < CN; ++t) y[t] = dpsZsY(v[t], s.hi, s.lo, &yl[t]);
  dpsZAccAdd(&z, y, yl, CN);
}

/* LEAN (leanRow: a race row without logprob whose bound prunes): the race's
 * group test (Race::visitPruned) and no count of the valid columns (the
 * count then says only whether the thread saw one: such a row's draw needs
 * no more; a min-p row's draw counts its candidates instead, decide()).
 * TILES: the tile maxima of a row whose candidates are collected from them
 * (a template parameter: in the race's instances its state spilled the
 * loop). */
template <bool RACE, bool ZRAW, bool ZS, bool LEAN, bool TILES>
struct FirstVisit {
  long long col0;
  /* the sums' factors: the logprob's at T = 1, top-p's at T, so that Z takes
   * a product and two fma an element, not an IEEE division (Z decides top-p
   * on the fast path only; the race and the exact path keep the score l / T) */
  dpsZsScale sraw, ss;
  Hdr h;
  dpsZAcc zraw, zs; /* h.zraw and h.zs as they accumulate */
  Race race;
  TileRec tiles;
  template <int CN>
  __device__ __forceinline__ void run(long long j0, const float (&v)[CN]) {
    if (TILES) tiles.add<CN>(j0, v);
    const uint32_t g0 = (uint32_t)(col0 + j0);
#pragma unroll
    for (int t = 0; t < CN; ++t) {
      /* selects, not branches: this runs for every element */
      const float x = v[t];
      const bool valid = x > -INFINITY; /* NaN, -inf: not candidates */
      if (!LEAN) h.cnt += valid ? 1u : 0u;
      const bool better = x > h.lmax; /* a thread's indices increase: ties keep the lower */
      h.aidx = better ? g0 + (uint32_t)t : h.aidx;
      h.lmax = better ? x : h.lmax;
    }
    /* the fixed-point sums, a vector at a time */
    if (ZRAW) zsAdd<CN>(zraw, sraw, v);
    if (ZS) zsAdd<CN>(zs, ss, v);
    if (RACE) {
      if (LEAN) race.visitPruned<CN>(g0, v);
      else race.visit<CN>(g0, v);
    }
  }
};

template <bool RACE, bool ZRAW, bool ZS, bool LEAN, bool TILES, int KERNEL, typename X>
__device__ __noinline__ void firstVisit(const char* rowp, int dtype, long long col0, long long from,
                           long long to, const RowP& q, const X& xf, Hdr* out, float* tmax) {
  if constexpr (LEAN && std::is_same<X, NoXform>::value) {
    const bool aligned = (((uintptr_t)rowp - (uintptr_t)(col0 * 2)) & 15u) == 0u;
    if (dtype != 0 && aligned) {
      Race race;
      race.init(q.T, q.seed, q.offset);
      /* the RACE kernel's rows are temperature-only; the others' may have
       * min-p, which needs the row's maximum */
      constexpr bool MAXV = KERNEL != DPS_SAMPLE_FIRST_RACE;
      float vmax = -INFINITY;
      if constexpr (KERNEL == DPS_SAMPLE_FIRST_RACE) {
        if (dtype == 1)
          leanRange<1, LEAN_RUNS, LEAN_QUEUE, false>(rowp, col0, from, to, race, leanQueue(), &vmax);
        else
          leanRange<2, LEAN_RUNS, LEAN_QUEUE, false>(rowp, col0, from, to, race, leanQueue(), &vmax);
      } else {
        uint32_t* q = reinterpret_cast<uint32_t*>(raceQueues() + (threadIdx.x >> 5));
        if (dtype == 1) leanRange<1, 1, 128, true>(rowp, col0, from, to, race, q, &vmax);
        else leanRange<2, 1, 128, true>(rowp, col0, from, to, race, q, &vmax);
      }
      race.finish();
      Hdr h;
      hdrInit(h);
      h.rkey = race.best.k;
      h.ridx = race.best.i;
      h.rval = race.best.v;
      /* race.best is the warp's. Its winner stands for the argmax's index:
       * a +inf logit wins its warp's race (the lowest such index), and no
       * lean row's draw reads the index otherwise. MAXV: each thread's own
       * maximum, also where its warp has no winner (every group pruned
       * against the others' bound), with a stand-in index that the merge
       * keeps (a thread holding +inf has its warp's winner); else the
       * winner's value stands for the maximum too. */
      if (MAXV) {
        if (vmax > -INFINITY) {
          h.lmax = vmax;
          h.aidx = race.best.i != NO_INDEX ? race.best.i : NO_INDEX - 1u;
          h.cnt = 1u;
        }
      } else if (race.best.i != NO_INDEX) {
        h.lmax = race.best.v;
        h.aidx = race.best.i;
        h.cnt = 1u;
      }
      *tmax = MAXV ? vmax : h.lmax;
      blockHdrReduce<false, false>(h, out);
      return;
    }
  }
  FirstVisit<RACE, ZRAW, ZS, LEAN, TILES> f;
  f.col0 = col0;
  f.sraw = dpsZsScaleOf(1.f);
  f.ss = dpsZsScaleOf(q.T);
  if (TILES) f.tiles.init(rowp, dtype, from, to);
  hdrInit(f.h);
  dpsZAccInit(&f.zraw);
  dpsZAccInit(&f.zs);
  if (RACE) {
    f.race.init(q.T, q.seed, q.offset);
    f.race.seedBound(rowp, dtype, col0, from, to, xf);
  }
  /* eight vectors in flight per thread, four where the race's noise needs
   * the registers (512 threads per SM: 64 KB or 32 KB in flight; a warp
   * traversal, as the tile maxima need) */
  forEachElemWarpX<RACE ? 4 : 8>(rowp, dtype, from, to, xf, f);
  if (RACE) {
    f.race.finish();
    f.h.rkey = f.race.best.k;
    f.h.ridx = f.race.best.i;
    f.h.rval = f.race.best.v;
  }
  if (LEAN) f.h.cnt = f.h.aidx != NO_INDEX ? 1u : 0u;
  if (ZRAW) f.h.zraw = zOfAcc(f.zraw);
  if (ZS) f.h.zs = zOfAcc(f.zs);
  *tmax = f.h.lmax; /* the thread's maximum (NaN ignored): the top-k threshold's first pass */
  blockHdrReduce<ZRAW, ZS>(f.h, out);
}

}  // namespace

#endif /* DPS_SAMPLE_RACE_CUH_ */
