/* dpsSample's device pieces that every pass uses (kernels/sample.cu is the
 * only includer; the design and the masses: its head comment and
 * docs/sampling.md): the constants, a row's parameters and logit
 * transform, the fixed-point sums of exp over absolute buckets (Zb; the
 * first pass accumulates them with sample_zsum.h) and the first pass's
 * record (Hdr), with its packing, shuffles and block reduction. */
#ifndef DPS_SAMPLE_ROW_CUH_
#define DPS_SAMPLE_ROW_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#include "kernels/device.cuh"
#include "kernels/sample_kernels.h"
#include "kernels/sample_zsum.h"
#include "kernels/shard_reduce.cuh"
#include "kernels/verify_walk.cuh"
#include "sample_rng.h"

using namespace dpsos;
using namespace dpsshard;

namespace {

constexpr int THREADS = DPS_SAMPLE_THREADS; /* the most; the shared arrays' size */
static_assert(THREADS <= TOPK_THREADS && DPS_SAMPLE_SMALL_THREADS >= 2 * DPS_SAMPLE_CAND,
              "topkRangeFromMax: its arrays, and 2k groups of threads for the candidates");
constexpr int WARPS = THREADS / 32;
constexpr int CAND = DPS_SAMPLE_CAND;
constexpr int HDR = DPS_SAMPLE_HDR_WORDS;
constexpr int BINS = DPS_SAMPLE_BINS;
constexpr int MERGE_THREADS = 256;
constexpr float TERM_SCALE = 1099511627776.0f; /* 2^40 */
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

/* The row's parameters, an invalid entry's replaced by T = 1 and no filter:
 * nothing is written for such a call, but its passes stay well-defined. */
__device__ __forceinline__ RowP rowParamsDefined(const dpsSampleParamsDev& d, long long row) {
  RowP q = rowParams(d, row);
  uint32_t bits;
  if (badArg(q, &bits)) {
    q.T = 1.f;
    q.top_p = 1.f;
    q.min_p = 0.f;
  }
  return q;
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

/* The sums of an accumulator (kernels/sample_zsum.h: the first pass adds
 * its elements there, a vector at a time). */
__device__ __forceinline__ Zb zOfAcc(const dpsZAcc& a) {
  static_assert(ZB_NONE == DPS_ZACC_NONE, "the empty sum");
  Zb z;
  uint64_t s[4];
  dpsZAccSums(&a, &z.b, s);
  z.s0 = s[0];
  z.s1 = s[1];
  z.s2 = s[2];
  z.s3 = s[3];
  return z;
}

/* The sum in units of 2^(16 b - DPS_ZACC_UNIT) (dpsZsTotal). */
__device__ __forceinline__ u64 zFixed(const Zb& z) { return dpsZsTotal(z.s0, z.s1, z.s2, z.s3); }

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

}  // namespace

#endif /* DPS_SAMPLE_ROW_CUH_ */
