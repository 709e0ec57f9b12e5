/* dpsSample's kernels (interface and steps: sample_kernels.h; design:
 * docs/sampling.md).
 *
 * Everything that decides a token is a function of the full row, computed so
 * that no result depends on how the vocabulary is split or in which order
 * partial results meet: maxima and race winners (ties to the lower index),
 * counts, and masses as integers (fixed point). Masses:
 *  - the first pass cannot know the row's maximum, so it sums
 *    t = 2^(y - 16b) * 2^24 (y = score * log2 e, b = floor(y / 16)) per
 *    absolute bucket b, keeping the 4 highest buckets (Zb): the merge adds
 *    the integer sums bucket by bucket, so Z is the same integer at every tp;
 *  - once the maximum score smax is known (the merge, the searches), a kept
 *    index weighs massTerm = 2^((s - smax) * log2 e) * 2^40, rounded down.
 * The noise is sample_rng.h's, bit for bit the host reference's. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#include "kernels/device.cuh"
#include "kernels/sample_kernels.h"
#include "kernels/shard_reduce.cuh"
#include "kernels/verify_walk.cuh"
#include "sample_rng.h"

using namespace dpsos;
using namespace dpsshard;

namespace {

constexpr int THREADS = TOPK_THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int CAND = DPS_SAMPLE_CAND;
constexpr int HDR = DPS_SAMPLE_HDR_WORDS;
constexpr int BINS = DPS_SAMPLE_BINS;
constexpr int MERGE_THREADS = 256;
constexpr float TERM_SCALE = 1099511627776.0f; /* 2^40 */
constexpr float LOG2E_16 = LOG2E * 0.0625f;     /* exact: the same mantissa */
constexpr uint32_t KEY_NEG_INF = 0x007fffffu;   /* orderKey(-inf): valid keys are above */
constexpr long long ZB_NONE = LLONG_MIN;

enum { MODE_DONE = 0, MODE_K = 1, MODE_P = 2, MODE_RACE = 3 };
enum { PATH_GREEDY = 0, PATH_FAST = 1, PATH_EXACT = 2 };

/* ---- parameters ---------------------------------------------------------------- */
struct RowP {
  float T;
  long long k;
  float top_p, min_p;
  u64 seed, offset;
};

__device__ __forceinline__ RowP rowParams(const dpsSampleParamsDev& d, long long row) {
  const dpsSampleParams_t& p = d.v;
  const long long r = row / d.per_entry; /* the entry of the row */
  RowP q;
  q.T = p.temperatures ? p.temperatures[r] : p.temperature;
  q.k = p.top_ks ? (long long)p.top_ks[r]
                 : p.top_ks_i64 ? (long long)p.top_ks_i64[r] : (long long)p.top_k;
  q.top_p = p.top_ps ? p.top_ps[r] : p.top_p;
  q.min_p = p.min_ps ? p.min_ps[r] : p.min_p;
  q.seed = p.seeds ? (u64)p.seeds[r] : (u64)p.seed;
  q.offset = (p.offsets ? (u64)p.offsets[r] : (u64)p.offset) + (u64)(row - r * d.per_entry);
  return q;
}

/* What the reads of row `row` see: X = NoXform (the call has neither a
 * mask nor a soft-cap: the kernels' own instances, no cost) or LogitXform. */
template <typename X>
__device__ __forceinline__ X rowXform(const dpsSampleArgs& a, long long row);
template <>
__device__ __forceinline__ NoXform rowXform<NoXform>(const dpsSampleArgs&, long long) {
  return NoXform();
}
template <>
__device__ __forceinline__ LogitXform rowXform<LogitXform>(const dpsSampleArgs& a, long long row) {
  LogitXform x;
  x.mask = a.xf.mask ? a.xf.mask + row * a.xf.mask_words : nullptr;
  x.g0 = a.col0;
  x.cap = a.xf.cap;
  return x;
}

/* 0, or the invalid argument (1 temperature, 3 top_p, 4 min_p) and its bits. */
__device__ __forceinline__ int badArg(const RowP& q, uint32_t* bits) {
  const int arg = dpsSampleBadParam(q.T, q.top_p, q.min_p);
  *bits = __float_as_uint(arg == DPS_SAMPLE_ARG_TEMPERATURE ? q.T
                          : arg == DPS_SAMPLE_ARG_TOP_P   ? q.top_p
                                                          : q.min_p);
  return arg;
}

/* Whether the call has an invalid array entry (block-uniform). `report`:
 * this block counts the call and records the first such entry. */
__device__ bool callInvalid(const dpsSampleArgs& a, bool report) {
  if (!a.p.any_array) return false;
  __shared__ long long s_bad;
  if (threadIdx.x == 0) s_bad = LLONG_MAX;
  __syncthreads();
  const long long entries = (a.rows + a.p.per_entry - 1) / a.p.per_entry;
  for (long long r = threadIdx.x; r < entries; r += blockDim.x) {
    const dpsSampleParams_t& p = a.p.v; /* the checked arrays only */
    const float T = p.temperatures ? p.temperatures[r] : p.temperature;
    const float tp = p.top_ps ? p.top_ps[r] : p.top_p;
    const float mp = p.min_ps ? p.min_ps[r] : p.min_p;
    if (dpsSampleBadParam(T, tp, mp)) atomicMin(&s_bad, r);
  }
  __syncthreads();
  const long long bad = s_bad;
  if (bad != LLONG_MAX && report && threadIdx.x == 0) {
    uint32_t b = 0;
    const int arg = badArg(rowParams(a.p, bad * a.p.per_entry), &b);
    dpsRecordInvalid(a.s.counters, bad, arg, b);
  }
  __syncthreads();
  return bad != LLONG_MAX;
}

/* ---- fixed-point sums of exp over absolute buckets ------------------------------ */
struct Zb {
  long long b; /* highest bucket, ZB_NONE: empty */
  u64 s0, s1, s2, s3; /* sums of buckets b, b-1, b-2, b-3 */
};

__device__ __forceinline__ void zInit(Zb& z) {
  z.b = ZB_NONE;
  z.s0 = z.s1 = z.s2 = z.s3 = 0ull;
}

__device__ __forceinline__ u64 zGet(const Zb& z, long long b) {
  if (z.b == ZB_NONE) return 0ull;
  const long long d = z.b - b;
  return d == 0 ? z.s0 : d == 1 ? z.s1 : d == 2 ? z.s2 : d == 3 ? z.s3 : 0ull;
}

__device__ __forceinline__ void zMerge(Zb& a, const Zb& o) {
  if (o.b == ZB_NONE) return;
  if (a.b == ZB_NONE) {
    a = o;
    return;
  }
  const long long B = a.b > o.b ? a.b : o.b;
  Zb r;
  r.b = B;
  r.s0 = zGet(a, B) + zGet(o, B);
  r.s1 = zGet(a, B - 1) + zGet(o, B - 1);
  r.s2 = zGet(a, B - 2) + zGet(o, B - 2);
  r.s3 = zGet(a, B - 3) + zGet(o, B - 3);
  a = r;
}

/* Adds 2^y as 2^(y - 16b) * 2^24 to bucket b = floor(y / 16); y16 = y / 16
 * (finite: the score times log2(e) / 16, which cannot overflow). */
__device__ __forceinline__ void zAdd(Zb& z, float y16) {
  const float fb = floorf(y16);
  const float fbc = fminf(fmaxf(fb, -1099511627776.f), 1099511627776.f); /* |b| <= 2^40 */
  const long long bi = (long long)fbc;
  const float f = fminf(fmaxf(__fmul_rn(__fsub_rn(y16, fbc), 16.f), 0.f), 15.9999f);
  const u64 t = __float2ull_rz(__fmul_rn(fastExp2(f), 16777216.f));
  if (bi > z.b) {
    const long long d = z.b == ZB_NONE ? 4 : bi - z.b;
    if (d >= 4) {
      z.s0 = z.s1 = z.s2 = z.s3 = 0ull;
    } else if (d == 1) {
      z.s3 = z.s2; z.s2 = z.s1; z.s1 = z.s0; z.s0 = 0ull;
    } else if (d == 2) {
      z.s3 = z.s1; z.s2 = z.s0; z.s1 = 0ull; z.s0 = 0ull;
    } else {
      z.s3 = z.s0; z.s2 = z.s1 = z.s0 = 0ull;
    }
    z.b = bi;
  }
  const long long d = z.b - bi;
  z.s0 += d == 0 ? t : 0ull;
  z.s1 += d == 1 ? t : 0ull;
  z.s2 += d == 2 ? t : 0ull;
  z.s3 += d == 3 ? t : 0ull;
}

/* The sum in units of 2^(16 b - 24) (the buckets below b - 3 are dropped:
 * each of their terms weighs below 2^-48 of the largest). */
__device__ __forceinline__ u64 zFixed(const Zb& z) {
  return z.s0 + (z.s1 >> 16) + (z.s2 >> 32) + (z.s3 >> 48);
}

/* log2 of the sum, in double; -inf when empty. */
__device__ __forceinline__ double zLog2(const Zb& z) {
  if (z.b == ZB_NONE) return -INFINITY;
  return (double)(16 * z.b - 24) + log2((double)zFixed(z));
}

/* ---- the record of the first pass ------------------------------------------------ */
struct Hdr {
  float lmax;     /* largest valid logit (-inf: none) */
  uint32_t aidx;  /* its lowest global index (NO_INDEX: none) */
  uint32_t cnt;   /* valid columns */
  float rkey;     /* race over every valid column: best key */
  uint32_t ridx;  /* its index (NO_INDEX: no race) */
  float rval;     /* its logit */
  Zb zraw;        /* sum of exp(l): the logprob */
  Zb zs;          /* sum of exp(l / T): top-p without top-k and min-p */
};

__device__ __forceinline__ void hdrInit(Hdr& h) {
  h.lmax = -INFINITY;
  h.aidx = NO_INDEX;
  h.cnt = 0u;
  h.rkey = -INFINITY;
  h.ridx = NO_INDEX;
  h.rval = -INFINITY;
  zInit(h.zraw);
  zInit(h.zs);
}

__device__ __forceinline__ bool raceBetter(float k, uint32_t i, float bk, uint32_t bi) {
  return i != NO_INDEX && (bi == NO_INDEX || k > bk || (k == bk && i < bi));
}

/* ZR, ZS: whether the record's fixed-point sums (zraw, zs) take part; a
 * pass that never adds to one leaves it empty on every thread, so its
 * reductions may skip it (the result keeps the empty sum). */
template <bool ZR = true, bool ZS = true>
__device__ __forceinline__ void hdrMerge(Hdr& a, const Hdr& o) {
  if (o.aidx != NO_INDEX &&
      (a.aidx == NO_INDEX || o.lmax > a.lmax || (o.lmax == a.lmax && o.aidx < a.aidx))) {
    a.lmax = o.lmax;
    a.aidx = o.aidx;
  }
  a.cnt += o.cnt;
  if (raceBetter(o.rkey, o.ridx, a.rkey, a.ridx)) {
    a.rkey = o.rkey;
    a.ridx = o.ridx;
    a.rval = o.rval;
  }
  if (ZR) zMerge(a.zraw, o.zraw);
  if (ZS) zMerge(a.zs, o.zs);
}

__device__ __forceinline__ void zPack(const Zb& z, uint32_t* w) {
  w[0] = (uint32_t)(u64)z.b;
  w[1] = (uint32_t)((u64)z.b >> 32);
  const u64 s[4] = {z.s0, z.s1, z.s2, z.s3};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[2 + 2 * j] = (uint32_t)s[j];
    w[3 + 2 * j] = (uint32_t)(s[j] >> 32);
  }
}
__device__ __forceinline__ void zUnpack(const uint32_t* w, Zb& z) {
  z.b = (long long)((u64)w[0] | ((u64)w[1] << 32));
  z.s0 = (u64)w[2] | ((u64)w[3] << 32);
  z.s1 = (u64)w[4] | ((u64)w[5] << 32);
  z.s2 = (u64)w[6] | ((u64)w[7] << 32);
  z.s3 = (u64)w[8] | ((u64)w[9] << 32);
}
__device__ __forceinline__ void hdrPack(const Hdr& h, uint32_t* w) {
  w[0] = __float_as_uint(h.lmax);
  w[1] = h.aidx;
  w[2] = h.cnt;
  w[3] = __float_as_uint(h.rkey);
  w[4] = h.ridx;
  w[5] = __float_as_uint(h.rval);
  zPack(h.zraw, w + 6);
  zPack(h.zs, w + 16);
}
__device__ __forceinline__ void hdrUnpack(const uint32_t* w, Hdr& h) {
  h.lmax = __uint_as_float(w[0]);
  h.aidx = w[1];
  h.cnt = w[2];
  h.rkey = __uint_as_float(w[3]);
  h.ridx = w[4];
  h.rval = __uint_as_float(w[5]);
  zUnpack(w + 6, h.zraw);
  zUnpack(w + 16, h.zs);
}
static_assert(HDR == 26, "hdrPack writes 26 words");

__device__ __forceinline__ Zb zShfl(const Zb& z, int o) {
  Zb r;
  r.b = __shfl_down_sync(0xffffffffu, z.b, o);
  r.s0 = __shfl_down_sync(0xffffffffu, z.s0, o);
  r.s1 = __shfl_down_sync(0xffffffffu, z.s1, o);
  r.s2 = __shfl_down_sync(0xffffffffu, z.s2, o);
  r.s3 = __shfl_down_sync(0xffffffffu, z.s3, o);
  return r;
}
template <bool ZR, bool ZS>
__device__ __forceinline__ Hdr hdrShfl(const Hdr& h, int o) {
  Hdr r;
  r.lmax = __shfl_down_sync(0xffffffffu, h.lmax, o);
  r.aidx = __shfl_down_sync(0xffffffffu, h.aidx, o);
  r.cnt = __shfl_down_sync(0xffffffffu, h.cnt, o);
  r.rkey = __shfl_down_sync(0xffffffffu, h.rkey, o);
  r.ridx = __shfl_down_sync(0xffffffffu, h.ridx, o);
  r.rval = __shfl_down_sync(0xffffffffu, h.rval, o);
  if (ZR) r.zraw = zShfl(h.zraw, o);
  else zInit(r.zraw);
  if (ZS) r.zs = zShfl(h.zs, o);
  else zInit(r.zs);
  return r;
}

/* The block's Hdr into *out (thread 0's view is complete; shared memory);
 * ZR, ZS as hdrMerge's. */
template <bool ZR, bool ZS>
__device__ void blockHdrReduce(Hdr h, Hdr* out) {
  __shared__ Hdr s_w[WARPS];
  for (int o = 16; o > 0; o >>= 1) {
    const Hdr t = hdrShfl<ZR, ZS>(h, o);
    hdrMerge<ZR, ZS>(h, t);
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) s_w[w] = h;
  __syncthreads();
  if (w == 0) { /* the warps' records by one warp (every merge is order-free) */
    Hdr t;
    if (lane < (int)(blockDim.x >> 5)) t = s_w[lane];
    else hdrInit(t);
    for (int o = 16; o > 0; o >>= 1) {
      const Hdr u = hdrShfl<ZR, ZS>(t, o);
      hdrMerge<ZR, ZS>(t, u);
    }
    if (lane == 0) *out = t;
  }
  __syncthreads();
}

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
  u64 seed, offset;
  RaceBest best; /* the same on every lane of the warp */
  int n;         /* queued in this warp's queue */

  /* Every thread of the block calls (a barrier: the block's best is reset). */
  __device__ __forceinline__ void init(float t, u64 sd, u64 off) {
    T = t;
    A = __fmul_rn(__frcp_rn(t), LOG2E);
    prune = A > 0.f && A < INFINITY;
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
        const uint32_t wt = upper ? w[(2 + (t >> 1)) & 3] : w[t >> 1];
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
template <bool RACE, bool ZRAW, bool ZS>
struct FirstVisit {
  long long col0;
  float T;
  Hdr h;
  Race race;
  template <int CN>
  __device__ __forceinline__ void run(long long j0, const float (&v)[CN]) {
    const uint32_t g0 = (uint32_t)(col0 + j0);
#pragma unroll
    for (int t = 0; t < CN; ++t) {
      /* selects, not branches: this runs for every element */
      const float x = v[t];
      const bool valid = x > -INFINITY; /* NaN, -inf: not candidates */
      h.cnt += valid ? 1u : 0u;
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
    if (RACE) race.visit<CN>(g0, v);
  }
};

template <bool RACE, bool ZRAW, bool ZS, typename X>
__device__ __noinline__ void firstVisit(const char* rowp, int dtype, long long col0, long long from,
                           long long to, const RowP& q, const X& xf, Hdr* out,
                           float* tmax) {
  FirstVisit<RACE, ZRAW, ZS> f;
  f.col0 = col0;
  f.T = q.T;
  hdrInit(f.h);
  if (RACE) {
    f.race.init(q.T, q.seed, q.offset);
    f.race.seedBound(rowp, dtype, col0, from, to, xf);
  }
  /* eight vectors in flight per thread, four where the race's noise needs
   * the registers (one block per SM: 64 KB or 32 KB in flight; any traversal
   * gives topkRangeFromMax disjoint per-thread maxima) */
  forEachElemWarpX<RACE ? 4 : 8>(rowp, dtype, from, to, xf, f);
  if (RACE) {
    f.race.finish();
    f.h.rkey = f.race.best.k;
    f.h.ridx = f.race.best.i;
    f.h.rval = f.race.best.v;
  }
  *tmax = f.h.lmax; /* the thread's maximum (NaN ignored): the top-k threshold's first pass */
  blockHdrReduce<ZRAW, ZS>(f.h, out);
}

/* ---- search state (identical on every rank) -------------------------------------- */
struct SState {
  int mode, round;
  int has_thr, qall, topp_after;
  uint32_t prefix; /* the bits the search fixed so far */
  uint32_t tkey;   /* has_thr: kept keys are > tkey, and == tkey within quota */
  uint32_t mpkey;  /* min-p: kept keys are >= mpkey (KEY_NEG_INF + 1: off) */
  u64 need;        /* K: count still wanted within the prefix */
  u64 above;       /* P: mass of the kept bins above the prefix's */
  u64 P;           /* P: kept indices have a mass before them below P */
  float lmax, T, top_p, smax;
  double lse;
  u64 seed, offset;
  uint32_t quota[DPS_OS_MAX_RANKS];
};
static_assert(sizeof(SState) <= DPS_SAMPLE_STATE_BYTES, "state slot");

__device__ __forceinline__ u64 massTerm(float x, float T, float smax) {
  const float d = __fmul_rn(__fsub_rn(dpsSampleScore(x, T), smax), LOG2E);
  return __float2ull_rz(__fmul_rn(fastExp2(d), TERM_SCALE));
}

/* top_p * Z as the integer bound of the masses before a kept index: at
 * least 1 (the first index always stays), NaN and overflow clamped. */
__device__ __forceinline__ u64 ceilMass(double p) {
  if (!(p >= 1.0)) return 1ull;
  return p >= 9.2e18 ? 9200000000000000000ull : (u64)ceil(p);
}

/* Digit of round r: bits [shift, shift + width) of the order key. */
__device__ __forceinline__ void roundDigit(int r, int* shift, int* width) {
  const int hi = 32 - DPS_SAMPLE_DIGIT_BITS * r;
  const int sh = hi - DPS_SAMPLE_DIGIT_BITS > 0 ? hi - DPS_SAMPLE_DIGIT_BITS : 0;
  *shift = sh;
  *width = hi - sh;
}
__device__ __forceinline__ uint32_t roundMask(int r) {
  const int hi = 32 - DPS_SAMPLE_DIGIT_BITS * r;
  return hi >= 32 ? 0u : ~((1u << hi) - 1u);
}

/* The smallest order key that min-p keeps ((l - lmax) / T >= log min_p is
 * monotone in l), so that the passes compare keys only. */
__device__ uint32_t minpKey(float lmax, float T, float min_p) {
  if (!(min_p > 0.f)) return KEY_NEG_INF + 1u;
  const double lm = dpsLogDet((double)min_p);
  uint32_t lo = KEY_NEG_INF + 1u, hi = orderKey(lmax);
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2u;
    if (dpsSampleMinPKeep(keyValue(mid), lmax, T, lm)) hi = mid;
    else lo = mid + 1u;
  }
  return lo;
}

/* Whether key (of a valid index) is in the set the searches keep, ties at
 * tkey aside (they need their rank among the shard's ties). */
__device__ __forceinline__ bool aboveThr(const SState& st, uint32_t key) {
  return key >= st.mpkey && (!st.has_thr || key >= st.tkey);
}

/* ---- histogram passes (K: counts, P: masses) over a shard ------------------------- */
/* Lanes that hit the same bin add their terms first (one shared-memory
 * atomic per bin and warp: most of a row falls into a few bins). */
template <bool MASS>
struct HistVisit {
  const SState* st;
  uint32_t mask, prefix, dmask;
  int shift;
  uint32_t* cnt;
  u64* mass;
  template <int CN>
  __device__ __forceinline__ void run(long long, const float (&v)[CN]) {
    const unsigned act = __activemask();
    const unsigned lane_lt = (1u << (threadIdx.x & 31)) - 1u;
#pragma unroll
    for (int t = 0; t < CN; ++t) {
      const float x = v[t];
      const uint32_t key = orderKey(x);
      bool in = x > -INFINITY && (key & mask) == prefix && aboveThr(*st, key);
      /* P: ties of the top-k threshold come from the merge (their rank) */
      if (MASS && st->has_thr && !st->qall && key == st->tkey) in = false;
      const uint32_t d = in ? (key >> shift) & dmask : 0xffffffffu;
      const unsigned grp = __match_any_sync(act, d);
      if (!in) continue;
      const bool leader = (grp & lane_lt) == 0u;
      if (MASS) {
        /* terms <= 2^40: 20-bit halves sum without overflow over 32 lanes */
        const u64 m = massTerm(x, st->T, st->smax);
        const unsigned hi = __reduce_add_sync(grp, (unsigned)(m >> 20));
        const unsigned lo = __reduce_add_sync(grp, (unsigned)(m & 0xfffffu));
        if (leader) atomicAdd(&mass[d], ((u64)hi << 20) + (u64)lo);
      } else if (leader) {
        atomicAdd(&cnt[d], (unsigned)__popc(grp));
      }
    }
  }
};

/* The shard's histogram of the state's current round into bins[BINS] (u64;
 * counts for K). Every thread calls it. */
template <typename X>
__device__ void histPass(const SState& st, const char* rowp, int dtype, long long nvalid,
                         const X& xf, u64* bins) {
  __shared__ uint32_t s_cnt[BINS];
  for (int i = threadIdx.x; i < BINS; i += blockDim.x) {
    s_cnt[i] = 0u;
    bins[i] = 0ull;
  }
  __syncthreads();
  int shift, width;
  roundDigit(st.round, &shift, &width);
  if (st.mode == MODE_P) {
    HistVisit<true> v{&st, roundMask(st.round), st.prefix, (1u << width) - 1u, shift, s_cnt, bins};
    forEachElemX(rowp, dtype, 0, nvalid, xf, v);
  } else {
    HistVisit<false> v{&st, roundMask(st.round), st.prefix, (1u << width) - 1u, shift, s_cnt, bins};
    forEachElemX(rowp, dtype, 0, nvalid, xf, v);
  }
  __syncthreads();
  if (st.mode != MODE_P)
    for (int i = threadIdx.x; i < BINS; i += blockDim.x) bins[i] = s_cnt[i];
  __syncthreads();
}

/* One round of the search from every rank's bins (rb[r * BINS + d]); one
 * thread. Moves the state to its next round or mode. */
__device__ void searchMerge(SState& st, const u64* rb, int tp) {
  int shift, width;
  roundDigit(st.round, &shift, &width);
  const int nb = 1 << width;
  const uint32_t mask = roundMask(st.round);
  /* P: the ties of the top-k threshold, per rank */
  u64 tie_m = 0ull;
  int tie_d = -1;
  if (st.mode == MODE_P && st.has_thr && !st.qall && (st.tkey & mask) == st.prefix) {
    tie_m = massTerm(keyValue(st.tkey), st.T, st.smax);
    tie_d = (int)((st.tkey >> shift) & (uint32_t)(nb - 1));
  }
  auto bin = [&](int r, int d) -> u64 {
    u64 v = rb[r * BINS + d];
    if (d == tie_d) v += (u64)st.quota[r] * tie_m;
    return v;
  };
  u64 h[BINS];
  u64 total = 0ull;
  for (int d = 0; d < nb; ++d) {
    u64 s = 0ull;
    for (int r = 0; r < tp; ++r) s += bin(r, d);
    h[d] = s;
    total += s;
  }
  bool done = false;
  if (st.mode == MODE_K) {
    if (st.round == 0 && total < st.need) {
      done = true; /* min-p left fewer than k: top-k keeps them all */
    } else {
      u64 above = 0ull;
      int d = nb - 1;
      while (d > 0 && above + h[d] < st.need) above += h[--d + 1];
      st.need -= above;
      st.prefix |= (uint32_t)d << shift;
      if (h[d] == st.need || shift == 0) {
        st.has_thr = 1;
        st.tkey = st.prefix;
        st.qall = h[d] == st.need;
        if (!st.qall) { /* the first `need` ties by global index: rank by rank */
          u64 left = st.need;
          for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) {
            const u64 c = r < tp ? rb[r * BINS + d] : 0ull;
            st.quota[r] = (uint32_t)(left < c ? left : c);
            left -= st.quota[r];
          }
        }
        done = true;
      }
    }
    if (done) {
      st.mode = st.topp_after ? MODE_P : MODE_RACE;
      st.round = 0;
      st.prefix = 0u;
      st.above = 0ull;
      return;
    }
    ++st.round;
    return;
  }
  /* MODE_P: keep an index iff the mass before it is < P */
  if (st.round == 0) {
    st.P = ceilMass((double)st.top_p * (double)total);
    st.above = 0ull;
  }
  u64 above = st.above;
  int d = nb - 1;
  while (d > 0 && above + h[d] < st.P) above += h[--d + 1];
  st.above = above;
  st.prefix |= (uint32_t)d << shift;
  if (above + h[d] <= st.P || shift == 0) {
    uint32_t q[DPS_OS_MAX_RANKS];
    bool all = above + h[d] <= st.P;
    if (!all) { /* one key value: ties of equal mass m, by global index */
      const u64 m = massTerm(keyValue(st.prefix), st.T, st.smax);
      if (m == 0ull) {
        all = true;
      } else {
        u64 left = (st.P - above + m - 1ull) / m;
        for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) {
          const u64 c = r < tp ? bin(r, d) / m : 0ull;
          q[r] = (uint32_t)(left < c ? left : c);
          left -= q[r];
        }
      }
    }
    /* a whole bin at or below the top-k threshold keeps all of S: the top-k
     * threshold (and its quotas) stays */
    if (!(all && st.has_thr && st.prefix <= st.tkey)) {
      st.has_thr = 1;
      st.tkey = st.prefix;
      st.qall = all;
      if (!all)
        for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) st.quota[r] = q[r];
    }
    st.mode = MODE_RACE;
    st.round = 0;
    return;
  }
  ++st.round;
}

/* ---- the race over the kept set of a shard (index order: ties need rank) ---------- */
template <typename X>
__device__ void racePass(const SState& st, const char* rowp, int dtype, long long col0,
                         long long nvalid, int rank, const X& xf, float* bk,
                         uint32_t* bi, float* bv) {
  __shared__ int s_warp[WARPS];
  __shared__ Hdr s_h;
  Race race;
  race.init(st.T, st.seed, st.offset);
  const bool ties = st.has_thr && !st.qall;
  const uint32_t quota = ties ? st.quota[rank] : 0u;
  uint32_t running = 0u;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (long long base = 0; base < nvalid; base += blockDim.x) {
    const long long j = base + threadIdx.x;
    const float x = j < nvalid ? noNan(xf.one(j, loadValue(rowp, j, dtype))) : -INFINITY;
    const uint32_t key = orderKey(x);
    const bool in = x > -INFINITY && aboveThr(st, key);
    const bool tied = ties && in && key == st.tkey;
    bool keep = in && !tied;
    if (ties) {
      const unsigned bal = __ballot_sync(0xffffffffu, tied);
      if (lane == 0) s_warp[w] = __popc(bal);
      __syncthreads();
      uint32_t before = 0u, total = 0u;
      for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
        before += i < w ? (uint32_t)s_warp[i] : 0u;
        total += (uint32_t)s_warp[i];
      }
      const uint32_t pos = running + before + (uint32_t)__popc(bal & ((1u << lane) - 1u));
      keep = keep || (tied && pos < quota);
      running += total;
      __syncthreads();
    }
    const float v[1] = {keep ? x : -INFINITY};
    race.visit<1>((uint32_t)(col0 + j), v); /* the loop's trip count is the block's */
  }
  race.finish();
  Hdr h;
  hdrInit(h);
  h.rkey = race.best.k;
  h.ridx = race.best.i;
  h.rval = race.best.v;
  blockHdrReduce<false, false>(h, &s_h);
  *bk = s_h.rkey;
  *bi = s_h.ridx;
  *bv = s_h.rval;
  __syncthreads();
}

/* ---- outputs ----------------------------------------------------------------------- */
__device__ __forceinline__ void count(const dpsSampleArgs& a, int path) {
  unsigned long long* c = path == PATH_GREEDY  ? &a.s.counters->rows_greedy
                          : path == PATH_FAST ? &a.s.counters->rows_fast
                                              : &a.s.counters->rows_exact;
  atomicAdd(c, 1ull);
}

__device__ __forceinline__ void writeToken(const dpsSampleArgs& a, long long row, uint32_t idx,
                                           float val, double lse) {
  a.tokens[row] = (int64_t)idx;
  if (a.logprobs) a.logprobs[row] = (float)((double)val - lse);
}

/* ---- the decision from the merged first record (one warp) -------------------------- */
/* Draws the row when the first record proves its kept set (writes the output
 * unless `bad`), else fills *st for the searches. Returns the path. */
__device__ int decide(const dpsSampleArgs& a, long long row, const RowP& q, const Hdr& h,
                      const u64* sel, bool bad, SState* st) {
  const int lane = threadIdx.x & 31;
  double lse = NAN;
  if (a.want_logprob) lse = h.lmax == INFINITY ? NAN : zLog2(h.zraw) * 0.6931471805599453;
  auto finish = [&](uint32_t idx, float val, int path) {
    if (lane == 0 && !bad) writeToken(a, row, idx, val, lse);
    return path;
  };
  if (h.cnt == 0u) {
    if (lane == 0 && !bad) {
      a.tokens[row] = 0;
      if (a.logprobs) a.logprobs[row] = -INFINITY;
    }
    return PATH_GREEDY;
  }
  if (h.lmax == INFINITY) return finish(h.aidx, h.lmax, PATH_FAST); /* logprob NaN */
  if (q.T == 0.f) return finish(h.aidx, h.lmax, PATH_GREEDY);
  const long long nA = h.cnt;
  const bool topk_on = q.k > 0 && q.k < nA, topp_on = q.top_p < 1.f, minp_on = q.min_p > 0.f;
  const float smax = dpsSampleScore(h.lmax, q.T);
  const bool topp = topp_on && smax < INFINITY; /* an infinite score skips top-p */
  SState s;
  s.round = 0;
  s.has_thr = 0;
  s.qall = 0;
  s.prefix = 0u;
  s.tkey = 0u;
  s.need = 0ull;
  s.above = 0ull;
  s.P = 0ull;
  s.lmax = h.lmax;
  s.T = q.T;
  s.top_p = q.top_p;
  s.smax = smax;
  s.lse = lse;
  s.seed = q.seed;
  s.offset = q.offset;
  s.topp_after = topp;
  s.mpkey = minp_on ? minpKey(h.lmax, q.T, q.min_p) : KEY_NEG_INF + 1u;
  for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) s.quota[r] = 0u;
  auto exact = [&](int mode) {
    s.mode = mode;
    if (mode == MODE_K) s.need = (u64)q.k;
    if (lane == 0) *st = s;
    return PATH_EXACT;
  };
  if (!topk_on && !topp_on && !minp_on) {
    if (h.ridx != NO_INDEX) return finish(h.ridx, h.rval, PATH_FAST);
    return exact(MODE_RACE);
  }
  /* the candidates: the row's best min(cand, nA), best first */
  const int ncand = (int)(nA < a.cand ? nA : a.cand);
  uint32_t ck[2], ci[2];
  float cv[2];
  bool cm[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int j = lane + 32 * u;
    const u64 p = j < ncand ? sel[j] : 0ull;
    ck[u] = packedKey(p);
    ci[u] = packedIdx(p);
    cv[u] = packedValue(p);
    cm[u] = j < ncand && ck[u] >= s.mpkey;
  }
  const int n_minp = __popc(__ballot_sync(0xffffffffu, cm[0])) +
                     __popc(__ballot_sync(0xffffffffu, cm[1]));
  /* min-p's set beyond the candidates? (it is a prefix of the order) */
  const bool minp_big = minp_on ? (n_minp == ncand && nA > ncand) : nA > ncand;
  const long long ak = topk_on ? q.k : nA;
  long long nS;
  bool known;
  if (!minp_big) {
    const long long b = minp_on ? n_minp : nA;
    nS = ak < b ? ak : b;
    known = nS <= ncand;
  } else {
    nS = ak;
    known = ak <= ncand;
  }
  /* masses of the candidates in the kept order: massTerm, exclusive prefix */
  auto prefixKeep = [&](long long n, u64 P, int* nk, bool* reached) {
    u64 t[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = lane + 32 * u;
      t[u] = j < n ? massTerm(cv[u], q.T, smax) : 0ull;
    }
    /* inclusive scan over j = lane (u = 0), then 32 + lane (u = 1) */
    u64 inc0 = t[0], inc1 = t[1];
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y0 = __shfl_up_sync(0xffffffffu, inc0, o);
      const u64 y1 = __shfl_up_sync(0xffffffffu, inc1, o);
      if (lane >= o) {
        inc0 += y0;
        inc1 += y1;
      }
    }
    const u64 tot0 = __shfl_sync(0xffffffffu, inc0, 31);
    inc1 += tot0;
    const u64 before0 = inc0 - t[0], before1 = inc1 - t[1];
    const bool k0 = lane < n && before0 < P, k1 = lane + 32 < n && before1 < P;
    *nk = __popc(__ballot_sync(0xffffffffu, k0)) + __popc(__ballot_sync(0xffffffffu, k1));
    /* reached: some candidate's mass before it is >= P (the nucleus ends here) */
    const bool r0 = lane < n && before0 >= P, r1 = lane + 32 < n && before1 >= P;
    *reached = __any_sync(0xffffffffu, r0 || r1);
  };
  auto raceCand = [&](int nk) {
    float bk = -INFINITY;
    uint32_t bi = NO_INDEX;
    float bv = -INFINITY;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = lane + 32 * u;
      if (j < nk) {
        const float k = exactKey(cv[u], q.T, dpsSampleBits(q.seed, q.offset, ci[u]));
        if (raceBetter(k, ci[u], bk, bi)) {
          bk = k;
          bi = ci[u];
          bv = cv[u];
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float k2 = __shfl_down_sync(0xffffffffu, bk, o);
      const uint32_t i2 = __shfl_down_sync(0xffffffffu, bi, o);
      const float v2 = __shfl_down_sync(0xffffffffu, bv, o);
      if (raceBetter(k2, i2, bk, bi)) {
        bk = k2;
        bi = i2;
        bv = v2;
      }
    }
    bi = __shfl_sync(0xffffffffu, bi, 0);
    bv = __shfl_sync(0xffffffffu, bv, 0);
    return finish(bi, bv, PATH_FAST);
  };
  if (known) {
    int nk = (int)nS;
    if (topp) {
      u64 t[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int j = lane + 32 * u;
        t[u] = j < nS ? massTerm(cv[u], q.T, smax) : 0ull;
      }
      u64 Z = t[0] + t[1];
      for (int o = 16; o > 0; o >>= 1) Z += __shfl_xor_sync(0xffffffffu, Z, o);
      bool reached;
      prefixKeep(nS, ceilMass((double)q.top_p * (double)Z), &nk, &reached);
    }
    return raceCand(nk);
  }
  if (!topp) {
    if (topk_on && q.k > ncand) return exact(MODE_K);
    /* min-p's set is large and nothing else cuts: the whole shard's race
     * winner is the answer when min-p keeps it */
    if (h.ridx != NO_INDEX && orderKey(h.rval) >= s.mpkey) return finish(h.ridx, h.rval, PATH_FAST);
    return exact(MODE_RACE);
  }
  if (!topk_on && !minp_on && h.zs.b != ZB_NONE) {
    /* S is every valid index: Z from the first pass's buckets, in massTerm's
     * scale (2^40 at smax) */
    const u64 Zf = zFixed(h.zs);
    const double ex = (double)(16 * h.zs.b + 16) - 16.0 * (double)__fmul_rn(smax, LOG2E_16);
    const double ie = floor(ex);
    const double z = ldexp((double)Zf * exp2(ex - ie), (int)fmax(fmin(ie, 4000.0), -4000.0));
    const u64 P = ceilMass((double)q.top_p * z);
    int nk;
    bool reached;
    prefixKeep(ncand, P, &nk, &reached);
    if (reached) return raceCand(nk);
    return exact(MODE_P);
  }
  return exact(topk_on && q.k > ncand ? MODE_K : MODE_P);
}

/* ---- records ------------------------------------------------------------------------ */
__device__ void recEmit(const dpsRecSink& k, long long row, int words, const uint32_t* w, u64 e) {
  if (k.kind == DPS_REC_PLAIN) {
    for (int i = threadIdx.x; i < words; i += blockDim.x) k.plain[row * words + i] = w[i];
    return;
  }
  const int lines = words / 2;
  const uint32_t flag = llFlag(e);
  for (int l = threadIdx.x; l < lines; l += blockDim.x) {
    const size_t off = DPS_OS_LL_OFFSET((int)(e & 1), k.c.rank, row * lines + l, k.c.tp, k.cap);
    for (int r = 0; r < k.c.tp; ++r) stLine(k.stage_peer.p[r] + off, w[2 * l], w[2 * l + 1], flag);
  }
}

/* Every rank's record of `row` into dst[r * words + w]; false (block-uniform)
 * when a wait gave up. */
__device__ bool recFetch(const dpsRecSource& s, int tp, long long rows, long long row, int words,
                         uint32_t* dst, u64 e) {
  if (!s.ll) {
    for (int i = threadIdx.x; i < tp * words; i += blockDim.x) {
      const int r = i / words, w = i % words;
      dst[i] = s.gathered[((size_t)r * (size_t)rows + (size_t)row) * (size_t)words + w];
    }
    __syncthreads();
    return true;
  }
  const int lines = words / 2;
  const uint32_t flag = llFlag(e);
  const u64 t0 = globalTimer();
  int bad = 0;
  for (int i = threadIdx.x; i < tp * lines && !bad; i += blockDim.x) {
    const int r = i / lines, l = i % lines;
    const char* pl = s.stage + DPS_OS_LL_OFFSET((int)(e & 1), r, row * lines + l, tp, s.cap);
    unsigned n = 0;
    uint4 v = ldLine(pl);
    while (v.y != flag || v.w != flag) {
      if ((++n & 127u) == 0 && spinExpired(s.c, t0, s.op, r, DPS_OS_WAIT_DATA)) {
        bad = 1;
        break;
      }
      v = ldLine(pl);
    }
    dst[r * words + 2 * l] = v.x;
    dst[r * words + 2 * l + 1] = v.z;
  }
  return !__syncthreads_or(bad);
}

__device__ __forceinline__ SState* stateOf(const dpsSampleArgs& a, long long row) {
  return reinterpret_cast<SState*>((char*)a.s.state + (size_t)row * DPS_SAMPLE_STATE_BYTES);
}

__device__ __forceinline__ const char* rowPtr(const dpsSampleArgs& a, long long row) {
  const int esize = a.dtype == 0 ? 4 : 2;
  return (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
}

/* The searches and the race of one row on this block alone (tp == 1). */
template <typename X>
__device__ void exactLocal(const dpsSampleArgs& a, long long row, SState* st, bool bad) {
  __shared__ u64 s_bins[BINS];
  const char* rowp = rowPtr(a, row);
  const X xf = rowXform<X>(a, row);
  while (st->mode == MODE_K || st->mode == MODE_P) {
    histPass(*st, rowp, a.dtype, a.nvalid, xf, s_bins);
    if (threadIdx.x == 0) searchMerge(*st, s_bins, 1);
    __syncthreads();
  }
  float bk, bv;
  uint32_t bi;
  racePass(*st, rowp, a.dtype, a.col0, a.nvalid, 0, xf, &bk, &bi, &bv);
  if (threadIdx.x == 0 && !bad) writeToken(a, row, bi == NO_INDEX ? 0u : bi, bv, st->lse);
}

/* The draw of a row from its merged first record (in shared memory): the
 * fast path here; the exact path on this block at tp == 1, else the row's
 * search state for the next steps. Nothing is written when `bad`. */
template <typename X>
__device__ __noinline__ void drawRow(const dpsSampleArgs& a, long long row, const Hdr& h, const u64* sel,
                        bool bad) {
  __shared__ SState s_st;
  __shared__ int s_path;
  RowP q = rowParams(a.p, row);
  uint32_t bits;
  if (badArg(q, &bits)) {
    q.T = 1.f;
    q.top_p = 1.f;
    q.min_p = 0.f;
  }
  if (threadIdx.x < 32) {
    s_st.mode = MODE_DONE;
    __syncwarp();
    const int path = decide(a, row, q, h, sel, bad, &s_st);
    if (threadIdx.x == 0) s_path = path;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (!bad) count(a, s_path);
    if (s_path != PATH_EXACT || bad) s_st.mode = MODE_DONE; /* nothing more is drawn */
    if (a.tp > 1) *stateOf(a, row) = s_st;
  }
  __syncthreads();
  if (a.tp == 1 && s_st.mode != MODE_DONE) exactLocal<X>(a, row, &s_st, bad);
}

/* ---- the kernels --------------------------------------------------------------------- */
/* The first pass of item = row * chunks + chunk; the last chunk of a row to
 * finish merges the chunks' records and emits the row's record, or at
 * tp == 1 draws the row itself. */
template <typename X>
__device__ __forceinline__ void firstItem(const dpsSampleArgs& a, long long item, u64 e) {
  __shared__ Hdr s_hdr;
  __shared__ u64 s_sel[CAND];
  __shared__ u64 s_lists[DPS_SAMPLE_MAX_CHUNKS * CAND];
  __shared__ uint32_t s_rec[DPS_SAMPLE_MAX_WORDS];
  __shared__ int s_last;
  const long long row = item / a.chunks;
  const int chunk = (int)(item % a.chunks);
  RowP q = rowParams(a.p, row);
  uint32_t bits;
  if (badArg(q, &bits)) { /* nothing is written; keep the pass well-defined */
    q.T = 1.f;
    q.top_p = 1.f;
    q.min_p = 0.f;
  }
  const bool greedy = q.T == 0.f;
  const bool topk_on = q.k > 0, topp_on = q.top_p < 1.f, minp_on = q.min_p > 0.f;
  const bool cand = a.cand > 0 && !greedy && (topk_on || topp_on || minp_on);
  const bool race = !greedy && !topk_on && !topp_on;
  const bool zs = !greedy && topp_on && !minp_on && !(q.k >= 1 && q.k <= CAND);
  const char* rowp = rowPtr(a, row);
  const X xf = rowXform<X>(a, row);
  long long from, to;
  chunkRange(a.nvalid, a.chunks, chunk, &from, &to);
  float tmax;
  /* race (no top-k, no top-p) and zs (top-p) never meet */
  const int sel = (race ? 4 : 0) | (a.want_logprob ? 2 : 0) | (zs ? 1 : 0);
  switch (sel) {
    case 0: firstVisit<false, false, false>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
    case 1: firstVisit<false, false, true>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
    case 2: firstVisit<false, true, false>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
    case 3: firstVisit<false, true, true>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
    case 4: firstVisit<true, false, false>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
    default: firstVisit<true, true, false>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax); break;
  }
  if (cand) {
    topkRangeFromMax(CAND, a.dtype, a.col0, rowp, from, to, tmax, s_sel, xf);
  } else {
    for (int j = threadIdx.x; j < CAND; j += blockDim.x) s_sel[j] = 0ull;
    __syncthreads();
  }
  const int words = DPS_SAMPLE_FIRST_WORDS(a.cand);
  if (a.chunks > 1) {
    /* this chunk's record into the partials; the last chunk merges them */
    uint32_t* part = a.s.partial + (size_t)item * DPS_SAMPLE_MAX_WORDS;
    if (threadIdx.x == 0) hdrPack(s_hdr, part);
    for (int j = threadIdx.x; j < a.cand; j += blockDim.x) {
      part[HDR + 2 * j] = (uint32_t)s_sel[j];
      part[HDR + 2 * j + 1] = (uint32_t)(s_sel[j] >> 32);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned t = atomicAdd(&a.s.tickets[row], 1u);
      s_last = t == (unsigned)a.chunks - 1u;
      if (s_last) a.s.tickets[row] = 0u;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const uint32_t* parts = a.s.partial + (size_t)row * a.chunks * DPS_SAMPLE_MAX_WORDS;
    if (threadIdx.x == 0) {
      Hdr h, t;
      hdrUnpack(parts, h);
      for (int c = 1; c < a.chunks; ++c) {
        hdrUnpack(parts + (size_t)c * DPS_SAMPLE_MAX_WORDS, t);
        hdrMerge(h, t);
      }
      s_hdr = h;
    }
    for (int i = threadIdx.x; i < a.chunks * a.cand; i += blockDim.x) {
      const uint32_t* p = parts + (size_t)(i / a.cand) * DPS_SAMPLE_MAX_WORDS + HDR + 2 * (i % a.cand);
      s_lists[i] = (u64)p[0] | ((u64)p[1] << 32);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < a.chunks * a.cand; i += blockDim.x) {
      const int place = mergePlace(s_lists, a.chunks, a.cand, i / a.cand, i % a.cand);
      if (place < a.cand) s_sel[place] = s_lists[i];
    }
    __syncthreads();
  }
  if (a.tp == 1) { /* no exchange: the draw on this block (one kernel per call) */
    drawRow<X>(a, row, s_hdr, s_sel, callInvalid(a, row == 0));
    return;
  }
  if (threadIdx.x == 0) hdrPack(s_hdr, s_rec);
  for (int j = threadIdx.x; j < a.cand; j += blockDim.x) {
    s_rec[HDR + 2 * j] = (uint32_t)s_sel[j];
    s_rec[HDR + 2 * j + 1] = (uint32_t)(s_sel[j] >> 32);
  }
  __syncthreads();
  recEmit(a.sink, row, words, s_rec, e);
}

/* Items of a kernel over a grid that may be capped (the onesided grid cap:
 * ranks sharing a GPU must all stay resident), one block at a time. */
#define FOR_ITEMS(i, n) for (long long i = blockIdx.x; i < (n); i += gridDim.x)

/* one block of 512 threads per SM, 128 registers a thread: the race's
 * noise and its vectors in flight (at 64 registers the race's loop spilled
 * about 1 KB a thread) */
template <typename X>
__global__ void __launch_bounds__(THREADS, DPS_SAMPLE_FIRST_BLOCKS_PER_SM) firstKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const bool ll = a.sink.kind == DPS_REC_LL;
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0) return;
  FOR_ITEMS(item, a.rows * a.chunks) {
    __syncthreads();
    firstItem<X>(a, item, e);
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
  /* tp == 1 verify: the last block to finish walks (every row drawn by then) */
  if (a.walk.pad_bs > 0) {
    const long long bad = dpsWalkCheck(a.walk);
    if (dpsWalkArrive(a.walk, 1u, gridDim.x) && !callInvalid(a, false)) dpsWalkRequests(a.walk, bad);
  }
}

/* The local pass of a search round or of the race (tp > 1): one block per
 * row; rows not in the step's mode move nothing. */
template <typename X>
__device__ __forceinline__ void stepItem(const dpsSampleArgs& a, long long row, u64 e) {
  __shared__ u64 s_bins[BINS];
  __shared__ uint32_t s_rec[DPS_SAMPLE_PSEARCH_WORDS];
  __shared__ SState s_st;
  if (threadIdx.x == 0) s_st = *stateOf(a, row);
  __syncthreads();
  const int want = a.step == DPS_SAMPLE_STEP_KSEARCH   ? MODE_K
                   : a.step == DPS_SAMPLE_STEP_PSEARCH ? MODE_P
                                                       : MODE_RACE;
  if (s_st.mode == want) {
    const char* rowp = rowPtr(a, row);
    const X xf = rowXform<X>(a, row);
    if (want == MODE_RACE) {
      float bk, bv;
      uint32_t bi;
      racePass(s_st, rowp, a.dtype, a.col0, a.nvalid, a.rank, xf, &bk, &bi, &bv);
      if (threadIdx.x == 0) {
        s_rec[0] = __float_as_uint(bk);
        s_rec[1] = bi;
        s_rec[2] = __float_as_uint(bv);
        s_rec[3] = 0u;
      }
    } else {
      histPass(s_st, rowp, a.dtype, a.nvalid, xf, s_bins);
      for (int d = threadIdx.x; d < BINS; d += blockDim.x) {
        if (want == MODE_K) {
          s_rec[d] = (uint32_t)s_bins[d];
        } else {
          s_rec[2 * d] = (uint32_t)s_bins[d];
          s_rec[2 * d + 1] = (uint32_t)(s_bins[d] >> 32);
        }
      }
    }
    __syncthreads();
    recEmit(a.sink, row, a.words, s_rec, e);
  }
}

template <typename X>
__global__ void __launch_bounds__(THREADS) stepKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const bool ll = a.sink.kind == DPS_REC_LL;
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0) return;
  FOR_ITEMS(row, a.rows) {
    __syncthreads();
    stepItem<X>(a, row, e);
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
}

/* The merge of a step (tp > 1): one block per row. */
/* false when a wait gave up (the communicator failed). */
__device__ __forceinline__ bool mergeItem(const dpsSampleArgs& a, long long row, u64 e,
                                          bool bad) {
  __shared__ uint32_t s_rec[DPS_OS_MAX_RANKS * DPS_SAMPLE_MAX_WORDS];
  __shared__ u64 s_lists[DPS_OS_MAX_RANKS * CAND];
  __shared__ u64 s_sel[CAND];
  __shared__ u64 s_bins[DPS_OS_MAX_RANKS * BINS];
  __shared__ Hdr s_hdr;
  __shared__ SState s_st;
  const int tp = a.tp;
  if (a.step == DPS_SAMPLE_STEP_FIRST) {
    if (!recFetch(a.src, tp, a.rows, row, a.words, s_rec, e)) return false;
    if (threadIdx.x == 0) {
      Hdr h, t;
      hdrUnpack(s_rec, h);
      for (int r = 1; r < tp; ++r) {
        hdrUnpack(s_rec + r * a.words, t);
        hdrMerge(h, t);
      }
      s_hdr = h;
    }
    for (int i = threadIdx.x; i < tp * a.cand; i += blockDim.x) {
      const uint32_t* p = s_rec + (i / a.cand) * a.words + HDR + 2 * (i % a.cand);
      s_lists[i] = (u64)p[0] | ((u64)p[1] << 32);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < tp * a.cand; i += blockDim.x) {
      const int place = mergePlace(s_lists, tp, a.cand, i / a.cand, i % a.cand);
      if (place < a.cand) s_sel[place] = s_lists[i];
    }
    __syncthreads();
    drawRow<NoXform>(a, row, s_hdr, s_sel, bad); /* tp > 1: no exact pass here, no reads */
    return true;
  }
  if (threadIdx.x == 0) s_st = *stateOf(a, row);
  __syncthreads();
  const int want = a.step == DPS_SAMPLE_STEP_KSEARCH   ? MODE_K
                   : a.step == DPS_SAMPLE_STEP_PSEARCH ? MODE_P
                                                       : MODE_RACE;
  if (s_st.mode != want) return true;
  if (!recFetch(a.src, tp, a.rows, row, a.words, s_rec, e)) return false;
  if (want == MODE_RACE) {
    if (threadIdx.x == 0) {
      float bk = -INFINITY, bv = -INFINITY;
      uint32_t bi = NO_INDEX;
      for (int r = 0; r < tp; ++r) {
        const uint32_t* w = s_rec + r * a.words;
        if (raceBetter(__uint_as_float(w[0]), w[1], bk, bi)) {
          bk = __uint_as_float(w[0]);
          bi = w[1];
          bv = __uint_as_float(w[2]);
        }
      }
      if (!bad) writeToken(a, row, bi == NO_INDEX ? 0u : bi, bv, s_st.lse);
      s_st.mode = MODE_DONE;
      *stateOf(a, row) = s_st;
    }
    return true;
  }
  for (int i = threadIdx.x; i < tp * BINS; i += blockDim.x) {
    const int r = i / BINS, d = i % BINS;
    const uint32_t* w = s_rec + r * a.words;
    s_bins[i] = want == MODE_K ? (u64)w[d] : ((u64)w[2 * d] | ((u64)w[2 * d + 1] << 32));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    searchMerge(s_st, s_bins, tp);
    *stateOf(a, row) = s_st;
  }
  return true;
}

__global__ void __launch_bounds__(MERGE_THREADS) mergeKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const u64 e = dpsRecMergeEpoch(a.src);
  if (e == 0) return;
  const bool bad = callInvalid(a, blockIdx.x == 0 && a.step == DPS_SAMPLE_STEP_FIRST);
  FOR_ITEMS(row, a.rows) {
    __syncthreads();
    if (!mergeItem(a, row, e, bad)) return;
  }
}

/* ---- dpsVerifyChain's chain walk ----------------------------------------------- */
constexpr int WALK_THREADS = 256;

/* tp > 1: one block after the last merge; nothing is written for an
 * invalid call (a parameter: the first pass counted it; a candidate: counted
 * by the walk). */
__global__ void __launch_bounds__(WALK_THREADS) walkKernel(const __grid_constant__ dpsSampleArgs a,
                                                           const __grid_constant__ dpsVerifyWalkArgs w) {
  dpsPdlWait();
  const long long bad = dpsWalkCheck(w);
  if (!callInvalid(a, false)) dpsWalkRequests(w, bad);
}

}  // namespace

static unsigned capped(long long items, int cap) {
  return (unsigned)(cap > 0 && items > cap ? cap : items);
}

/* The kernels' instances with the transform when the call has one. */
static bool hasXform(const dpsSampleArgs* a) { return a->xf.mask != NULL || a->xf.cap > 0.f; }

extern "C" cudaError_t dpsLaunchSampleLocal(const dpsSampleArgs* a, cudaStream_t stream) {
  if (a->step == DPS_SAMPLE_STEP_FIRST)
    return dpsLaunch(hasXform(a) ? firstKernel<LogitXform> : firstKernel<NoXform>,
                     dim3(capped(a->rows * a->chunks, a->sink.max_blocks)), dim3(THREADS), stream,
                     a->pdl, *a);
  return dpsLaunch(hasXform(a) ? stepKernel<LogitXform> : stepKernel<NoXform>,
                   dim3(capped(a->rows, a->sink.max_blocks)), dim3(THREADS), stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchSampleMerge(const dpsSampleArgs* a, cudaStream_t stream) {
  return dpsLaunch(mergeKernel, dim3(capped(a->rows, a->src.max_blocks)), dim3(MERGE_THREADS),
                   stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchVerifyWalk(const dpsSampleArgs* a, const dpsVerifyWalkArgs* w,
                                           cudaStream_t stream) {
  return dpsLaunch(walkKernel, dim3(1), dim3(WALK_THREADS), stream, a->pdl, *a, *w);
}

extern "C" cudaError_t dpsPreloadSampleKernels(void) {
  const void* const k[] = {(const void*)firstKernel<NoXform>, (const void*)firstKernel<LogitXform>,
                           (const void*)stepKernel<NoXform>, (const void*)stepKernel<LogitXform>,
                           (const void*)mergeKernel, (const void*)walkKernel};
  return dpsPreload(k, 6);
}
