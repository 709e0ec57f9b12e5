/* dpsSample's race (the argmax of key = l/T + G over the visited indices,
 * the exact key only where it may still win) and the first pass's visit of
 * a shard that runs it (kernels/sample.cu is the only includer;
 * docs/sampling.md, "The race, cheaply"). */
#ifndef DPS_SAMPLE_RACE_CUH_
#define DPS_SAMPLE_RACE_CUH_

#include "kernels/sample_row.cuh"

namespace {

/* ---- the race: argmax of key = l/T + G over visited indices --------------------- */
/* The race visits a row a warp at a time (every lane calls together) and
 * computes the exact key (both halves of the noise, two logs in double) only
 * for the indices that may still reach wb, the best key known so far (the
 * warp's, another warp's of the block, or a lower bound). With the high half
 * h of x alone, U < (h + 1) / 2^16; key >= wb needs G >= wb - s, so
 * -log U <= e^(s - wb), so 1 - U <= e^(s - wb), so
 * 65535 - h < 2^16 e^(s - wb + delta), delta covering the fp32 score
 * l * (1/T), ex2.approx and the rounding of the key. The high halves cost one
 * Philox call per 8 indices; an index that passes is queued, and the warp
 * computes the queued keys together, a lane per index, so the exact
 * evaluations neither diverge nor run for more than a few indices per warp
 * (about log n of n indices in random order, plus n / 2^16). */
__device__ __noinline__ float exactKey(float x, float T, uint32_t xb) {
  return dpsSampleKey(dpsSampleScore(x, T), dpsGumbelFromBits(xb));
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

/* The exact keys of the n queued indices (a whole warp calls): the better of
 * their best and `b`, the same on every lane. */
__device__ __noinline__ RaceBest raceFlush(const RaceQueue* q, int n, float T, u64 seed,
                                           u64 offset, RaceBest b) {
  __syncwarp();
  RaceBest m = {-INFINITY, NO_INDEX, -INFINITY};
  for (int e = threadIdx.x & 31; e < n; e += 32) {
    const uint32_t gi = q->idx[e];
    const float x = q->x[e];
    const float k = exactKey(x, T, dpsSampleBits(seed, offset, (int64_t)gi));
    if (raceBetter(k, gi, m.k, m.i)) m = RaceBest{k, gi, x};
  }
  __syncwarp(); /* the slots may be refilled */
  const uint32_t ok = orderKey(m.k);
  const uint32_t mk = __reduce_max_sync(0xffffffffu, ok);
  const uint32_t mi = __reduce_min_sync(0xffffffffu, ok == mk ? m.i : NO_INDEX);
  const int src = __ffs(__ballot_sync(0xffffffffu, ok == mk && m.i == mi)) - 1;
  const float k = __shfl_sync(0xffffffffu, m.k, src);
  const float v = __shfl_sync(0xffffffffu, m.v, src);
  if (raceBetter(k, mi, b.k, b.i)) b = RaceBest{k, mi, v};
  return b;
}

template <int C>
struct RaceVals {
  float v[C];
};

/* The high halves' Philox words of the group of 8 holding index gi. */
__device__ __forceinline__ void raceHighWords(u64 seed, u64 offset, uint32_t gi, uint32_t out[4]) {
  uint32_t ctr[4];
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  dpsSampleCounter(offset, (int64_t)gi, 0u, ctr);
  dpsPhilox4x32_10(ctr, key, out);
}

/* May the index with logit x and high half h reach wb, the bound being
 * 65535 - h < ex2(x * A + B)? (x = -inf, NaN: no.) A bound below 2^-126
 * flushes to 0 and fails the index only at h = 65535, where its score is
 * more than 98 below wb (G <= 22.87): the flush never drops an index that
 * can win. */
__device__ __forceinline__ bool raceMayReach(float x, uint32_t h, float A, float B) {
  const float t = fastExp2Ftz(fmaf(x, A, B));
  const float hf = __uint_as_float(0x4B000000u | (h ^ 0xffffu)) - 8388608.f; /* 65535 - h */
  return x > -INFINITY && !(hf >= t);
}

/* 65535 - h exactly, h the 16-bit half HI of w: a byte permutation puts h
 * under 2^23's exponent (0x4B00hhhh = 2^23 + h), and 2^23 + 65535 - that is
 * exact. k holds 0x4B000000 in a register (prmt takes one immediate: the
 * selector; with the constant as the immediate, nvcc reloads the selector
 * into a register at every use). */
template <bool HI>
__device__ __forceinline__ float raceHalfGap(uint32_t w, uint32_t k) {
  uint32_t b;
  if (HI) asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(b) : "r"(w), "r"(k));
  else asm("prmt.b32 %0, %1, %2, 0x7610;" : "=r"(b) : "r"(w), "r"(k));
  return 8454143.f - __uint_as_float(b);
}

/* The Philox word holding index t of an aligned group of C (8, or 4 for
 * fp32 vectors: the group of 8's first or second half, `upper`). */
__device__ __forceinline__ uint32_t raceGroupWord(const uint32_t (&w)[4], bool upper, int t) {
  return upper ? w[(2 + (t >> 1)) & 3] : w[t >> 1];
}

/* The pass mask of C values at gi0.. that do not lie in one aligned group
 * (heads, tails, unaligned vectors): out of line, so that the hot loop
 * holds one Philox call per vector. */
template <int C>
__device__ __noinline__ uint32_t racePassMaskAnyAlign(u64 seed, u64 offset, float A, float B,
                                                      uint32_t gi0, RaceVals<C> vals) {
  uint32_t m = 0u, cq = 0xffffffffu, w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int t = 0; t < C; ++t) {
    if (!(vals.v[t] > -INFINITY)) continue; /* not in the race (the exact path's race) */
    const uint32_t gi = gi0 + (uint32_t)t;
    if ((gi >> 3) != cq) {
      raceHighWords(seed, offset, gi, w);
      cq = gi >> 3;
    }
    m |= raceMayReach(vals.v[t], dpsSampleHalf(w, gi), A, B) ? 1u << t : 0u;
  }
  return m;
}
struct Race;
template <int C>
__device__ __noinline__ Race raceEnqueue(Race r, uint32_t gi0, RaceVals<C> vals, uint32_t m);

struct Race {
  float T;
  float A, B; /* index may pass: 65535 - h < ex2(l * A + B); A = log2(e) / T */
  bool prune;
  uint32_t expo; /* 0x4B000000: raceHalfGap's constant */
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
    expo = 0x4B000000u;
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

  __device__ __forceinline__ void bound() {
    float wb = best.i == NO_INDEX ? -INFINITY : best.k;
    wb = fmaxf(wb, keyValue(*(volatile uint32_t*)raceBlockBest()));
    if (!prune) { /* everything passes: l * 0 + inf is inf, or NaN for l = +inf */
      A = 0.f;
      B = INFINITY;
      return;
    }
    if (wb == INFINITY) {
      /* only a +inf key ties (lower index wins): a score l / T that
       * overflows, which needs l * A >= FLT_MAX * log2(e) (about 4.9e38,
       * +inf in fp32); every index with l * A >= 1.2e38 passes */
      B = 16.f - 1.2e38f;
      return;
    }
    if (!(fabsf(wb) < 1e30f)) { /* -inf or huge: everything passes */
      B = INFINITY;
      return;
    }
    B = fmaf(-(wb - margin(wb)), LOG2E, 16.f);
  }

  __device__ __forceinline__ void highWords(uint32_t gi, uint32_t out[4]) const {
    raceHighWords(seed, offset, gi, out);
  }

  /* Visits v[t] at global index gi0 + t (a whole warp calls together). */
  template <int C>
  __device__ __forceinline__ void visit(uint32_t gi0, const float (&v)[C]) {
    uint32_t m = 0u;
    if ((C == 8 || C == 4) && (gi0 & (uint32_t)(C - 1)) == 0u) {
      /* the C indices share one group of 8: one Philox call (fp32 vectors
       * hold 4: the group's first or second half) */
      uint32_t w[4];
      highWords(gi0, w);
      const bool upper = C == 4 && (gi0 & 4u) != 0u;
#pragma unroll
      for (int t = 0; t < C; ++t) {
        const uint32_t wt = raceGroupWord(w, upper, t);
        const uint32_t h = (t & 1) ? wt >> 16 : wt & 0xffffu;
        m |= raceMayReach(v[t], h, A, B) ? 1u << t : 0u;
      }
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
   * as one "may any index pass?", 65535 - h < ex2(x A + B) per index and
   * no test of x (with A > 0 finite, x = -inf or NaN gives ex2 = 0 or NaN,
   * so the index fails; x = +inf gives +inf, so it passes); the mask of the
   * passing indices is built only when some lane's group has one (one
   * predicate chain per vector instead of a mask; the test is the same
   * as raceMayReach's where the bound prunes). */
  template <int C>
  __device__ __forceinline__ void visitPruned(uint32_t gi0, const float (&v)[C]) {
    if (!((C == 8 || C == 4) && (gi0 & (uint32_t)(C - 1)) == 0u)) {
      visit<C>(gi0, v);
      return;
    }
    uint32_t w[4];
    highWords(gi0, w);
    const bool upper = C == 4 && (gi0 & 4u) != 0u;
    /* index t of the group may pass (t unrolled: its half is known) */
    auto pass = [&](int t) {
      const uint32_t wt = raceGroupWord(w, upper, t);
      const float gap = (t & 1) ? raceHalfGap<true>(wt, expo) : raceHalfGap<false>(wt, expo);
      return gap < fastExp2Ftz(fmaf(v[t], A, B));
    };
    bool any0 = false, any1 = false; /* two chains: half the latency */
#pragma unroll
    for (int t = 0; t < C; ++t) {
      if (t & 2) any1 |= pass(t);
      else any0 |= pass(t);
    }
    if (__any_sync(0xffffffffu, any0 || any1)) { /* rare: the mask, then the queue */
      RaceVals<C> vals;
      uint32_t m = 0u;
#pragma unroll
      for (int t = 0; t < C; ++t) {
        m |= pass(t) ? 1u << t : 0u;
        vals.v[t] = v[t];
      }
      *this = raceEnqueue<C>(*this, gi0, vals, m);
    }
  }

  __device__ __forceinline__ void flush() {
    best = raceFlush(raceQueues() + (threadIdx.x >> 5), n, T, seed, offset, best);
    n = 0;
    if (best.i != NO_INDEX && (threadIdx.x & 31) == 0) atomicMax(raceBlockBest(), orderKey(best.k));
    bound();
  }

  /* A first lower bound of the best key, from 8 indices per thread spread
   * over [from, to) (every index there takes part in the race): an index's
   * key is >= s + log(U / (1 - U)) (as -log U <= (1 - U) / U) with
   * U >= h / 2^16; the block's best of them is shared (every thread of the
   * block calls). */
  template <typename X>
  __device__ __forceinline__ void seedBound(const char* rowp, int dtype, long long col0,
                                            long long from, long long to, const X& xf) {
    float l = -INFINITY;
    if (prune && to > from) {
      long long j0 = from + (to - from) * (long long)threadIdx.x / (long long)blockDim.x;
      j0 -= (long long)((uint32_t)(col0 + j0) & 7u); /* one Philox call for the 8 */
      uint32_t w[4];
      highWords((uint32_t)(col0 + j0), w);
      const float invT = __frcp_rn(T);
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const long long j = j0 + t;
        if (j < from || j >= to) continue;
        const float x = xf.one(j, loadValue(rowp, j, dtype));
        const uint32_t h = dpsSampleHalf(w, (int64_t)t);
        if (x > -INFINITY && x < INFINITY && h > 0u) {
          const float sc = x * invT;
          const float g = __logf((float)h) - __logf((float)(65536u - h));
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

/* ---- the first pass -------------------------------------------------------------- */
/* LEAN (a race row with temperature alone whose bound prunes): the race's
 * group test (Race::visitPruned) and no count of the valid columns (the
 * count then says only whether the thread saw one: such a row's draw needs
 * no more). TILES: the tile maxima of a row whose candidates are collected
 * from them (a template parameter: in the race's instances its state
 * spilled the loop). */
template <bool RACE, bool ZRAW, bool ZS, bool LEAN, bool TILES>
struct FirstVisit {
  long long col0;
  float T;
  Hdr h;
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
      if (!ZRAW && !ZS) continue;
      if (ZRAW && valid && x < INFINITY) zAdd(h.zraw, __fmul_rn(x, LOG2E_16));
      if (ZS && valid) {
        const float y16 = __fmul_rn(dpsSampleScore(x, T), LOG2E_16);
        if (y16 > -INFINITY && y16 < INFINITY) zAdd(h.zs, y16);
      }
    }
    if (RACE) {
      if (LEAN) race.visitPruned<CN>(g0, v);
      else race.visit<CN>(g0, v);
    }
  }
};

template <bool RACE, bool ZRAW, bool ZS, bool LEAN, bool TILES, int KERNEL, typename X>
__device__ __noinline__ void firstVisit(const char* rowp, int dtype, long long col0, long long from,
                           long long to, const RowP& q, const X& xf, Hdr* out, float* tmax) {
  FirstVisit<RACE, ZRAW, ZS, LEAN, TILES> f;
  f.col0 = col0;
  f.T = q.T;
  if (TILES) f.tiles.init(rowp, dtype, from, to);
  hdrInit(f.h);
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
  *tmax = f.h.lmax; /* the thread's maximum (NaN ignored): the top-k threshold's first pass */
  blockHdrReduce<ZRAW, ZS>(f.h, out);
}

}  // namespace

#endif /* DPS_SAMPLE_RACE_CUH_ */
