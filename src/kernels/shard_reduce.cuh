/* Device pieces shared by the shard reductions (kernels/select.cu,
 * kernels/sample.cu): element loads and the row visitor, order keys and
 * packed (key, index) pairs, the merge of sorted lists, and the exact top-k
 * of a column range. Include from .cu files only. */
#ifndef DPS_SHARD_REDUCE_CUH_
#define DPS_SHARD_REDUCE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "sample_rng.h" /* dpsSampleSoftCap */

namespace dpsshard {

using u64 = unsigned long long;

constexpr int TOPK_THREADS = 512;
constexpr int TOPK_UNROLL = 4; /* vectors in flight per thread in the top-k passes */
constexpr int SEL_CAND = 2048; /* candidates sorted in shared memory */
constexpr uint32_t NO_INDEX = 0xffffffffu;
constexpr uint32_t KEY_NONE = 0u; /* below every real key (key(-inf) = 0x007fffff) */
constexpr float LOG2E = 1.4426950408889634f;

__device__ __forceinline__ float loadValue(const void* base, long long i, int dtype) {
  if (dtype == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
  if (dtype == 2) return __half2float(reinterpret_cast<const __half*>(base)[i]);
  return reinterpret_cast<const float*>(base)[i];
}

__device__ __forceinline__ float noNan(float v) { return v != v ? -INFINITY : v; }

/* ---- what a read of the logits sees ---------------------------------------------- */
/* The raw values (argmax, top-k, dpsSample). */
struct NoXform {
  __device__ __forceinline__ bool on() const { return false; }
  __device__ __forceinline__ float one(long long, float x) const { return x; }
};
/* dpsVerifyChain's soft-cap (sample_rng.h's dpsSampleSoftCap, bit for bit
 * the host reference's), then its grammar mask, on every value read; a -inf
 * or NaN logit stays excluded (and a lane without a column, which
 * forEachElemWarp gives -inf, reads no mask word). */
/* Out of line: the soft-cap's double-precision tanh inlined into every
 * visitor instance would multiply the kernels' code (and compile time). */
template <int = 0>
__device__ __noinline__ float softCapOutOfLine(float x, float cap) {
  return dpsSampleSoftCap(x, cap);
}

struct LogitXform {
  const uint32_t* mask; /* the row's words over the global vocabulary; NULL: all allowed */
  long long g0;         /* global index of column 0 */
  float cap;            /* > 0: the soft-cap; 0: off */
  __device__ __forceinline__ bool on() const { return mask != nullptr || cap > 0.f; }
  __device__ __forceinline__ float one(long long j, float x) const {
    if (!(x > -INFINITY)) return x;
    if (cap > 0.f) x = softCapOutOfLine<>(x, cap);
    if (mask != nullptr) {
      const unsigned long long g = (unsigned long long)(g0 + j);
      if (!((__ldg(mask + (g >> 5)) >> (unsigned)(g & 31u)) & 1u)) x = -INFINITY;
    }
    return x;
  }
};

/* 2^x (ex2.approx: -inf -> 0, NaN -> NaN). */
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* 2^x with results below 2^-126 flushed to 0 (ex2.approx.ftz: one
 * instruction; the non-ftz form scales around it). */
__device__ __forceinline__ float fastExp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* -0.0 counts as +0.0 (equal values: the lower index wins, as in argmax). */
__device__ __forceinline__ uint32_t orderKey(float v) {
  const uint32_t u = __float_as_uint(noNan(v) + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float keyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* (key, index) pairs packed so that a larger u64 is better: key high, the
 * index inverted low (lower index wins a tie). */
__device__ __forceinline__ u64 packKI(uint32_t key, uint32_t idx) {
  return ((u64)key << 32) | (u64)(~idx);
}
__device__ __forceinline__ uint32_t packedKey(u64 p) { return (uint32_t)(p >> 32); }
__device__ __forceinline__ uint32_t packedIdx(u64 p) { return ~(uint32_t)p; }
__device__ __forceinline__ float packedValue(u64 p) {
  const uint32_t key = packedKey(p);
  return key == KEY_NONE ? -INFINITY : keyValue(key);
}

__device__ __forceinline__ void storeValue(void* out, long long i, float v, int dtype) {
  if (dtype == 1) reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  else if (dtype == 2) reinterpret_cast<__half*>(out)[i] = __float2half_rn(v);
  else reinterpret_cast<float*>(out)[i] = v;
}

/* ---- the row visitor ------------------------------------------------------------ */
/* Scalar columns of [from, to) before the first 16-byte aligned one. */
template <int DT>
__device__ __forceinline__ long long alignHead(const char* rowp, long long from, long long to) {
  constexpr int esize = DT == 0 ? 4 : 2;
  const uintptr_t a0 = (uintptr_t)(rowp + from * esize);
  const long long head = (long long)(((16u - (unsigned)(a0 & 15u)) & 15u) / (unsigned)esize);
  return head < to - from ? head : to - from;
}

/* The 16 / esize values of one 16-byte vector of dtype DT. */
template <int DT, int PER>
__device__ __forceinline__ void decodeVec(const uint4& q, float (&v)[PER]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    if (DT == 0) {
      v[t] = __uint_as_float(w[t]);
    } else {
      const unsigned short h = (unsigned short)(w[t >> 1] >> (16 * (t & 1)));
      v[t] = DT == 1 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
    }
  }
}

/* Calls f.run<C>(j0, v) for every column of [from, to) of the row, each
 * column in exactly one call of one thread, v[t] the value of column j0 + t:
 * a scalar head up to 16-byte alignment (C = 1), 16-byte vectors (C = 4 for
 * fp32, 8 for 16-bit dtypes; U in flight per thread), a scalar tail. */
template <int DT, int U, typename F>
__device__ __forceinline__ void forEachElemT(const char* rowp, long long from, long long to,
                                             F& f) {
  constexpr int esize = DT == 0 ? 4 : 2;
  constexpr int per = 16 / esize;
  const long long head = alignHead<DT>(rowp, from, to);
  for (long long j = from + threadIdx.x; j < from + head; j += blockDim.x) {
    const float v[1] = {loadValue(rowp, j, DT)};
    f.template run<1>(j, v);
  }
  const long long vfrom = from + head;
  const long long nvec = (to - vfrom) / per;
  const uint4* vp = reinterpret_cast<const uint4*>(rowp + vfrom * esize);
  for (long long i0 = threadIdx.x; i0 < nvec; i0 += (long long)blockDim.x * U) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      q[u] = i < nvec ? __ldg(vp + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      if (i >= nvec) break;
      float v[per];
      decodeVec<DT>(q[u], v);
      f.template run<per>(vfrom + i * per, v);
    }
  }
  for (long long j = vfrom + nvec * per + threadIdx.x; j < to; j += blockDim.x) {
    const float v[1] = {loadValue(rowp, j, DT)};
    f.template run<1>(j, v);
  }
}

/* U: vectors in flight per thread. */
template <int U = 4, typename F>
__device__ __forceinline__ void forEachElem(const char* rowp, int dtype, long long from,
                                            long long to, F& f) {
  if (dtype == 1) forEachElemT<1, U>(rowp, from, to, f);
  else if (dtype == 2) forEachElemT<2, U>(rowp, from, to, f);
  else forEachElemT<0, U>(rowp, from, to, f);
}

/* The vectors of [from, to) as two stages of U / 2 per thread: a stage's
 * loads are in flight while the previous stage is visited (a kernel held to
 * few registers, or one block per SM, has few loads in flight otherwise).
 * WARP = false: each thread visits its own columns (forEachElemStaged).
 * WARP = true: every call of f.run<C>(j0, v) is made by a whole warp at once
 * (warp-wide votes and shuffles are allowed inside run): a lane without a
 * column there gets v[t] = -inf (and an unspecified j0), which the visitor
 * must ignore like a -inf logit; the head and the tail go to warp 0
 * (forEachElemWarp). */
template <int DT, int U, bool WARP, typename F>
__device__ __forceinline__ void forEachElemStagesT(const char* rowp, long long from, long long to,
                                                   F& f) {
  constexpr int esize = DT == 0 ? 4 : 2;
  constexpr int per = 16 / esize;
  const int lane = threadIdx.x & 31;
  const long long head = alignHead<DT>(rowp, from, to);
  for (long long j = from + threadIdx.x; !WARP && j < from + head; j += blockDim.x) {
    const float v[1] = {loadValue(rowp, j, DT)};
    f.template run<1>(j, v);
  }
  const long long vfrom = from + head;
  const long long nvec = (to - vfrom) / per;
  const long long tail = vfrom + nvec * per;
  if (WARP && threadIdx.x < 32 && head > 0) {
    const long long j = from + lane;
    const float v[1] = {j < vfrom ? loadValue(rowp, j, DT) : -INFINITY};
    f.template run<1>(j, v);
  }
  const uint4* vp = reinterpret_cast<const uint4*>(rowp + vfrom * esize);
  /* base: the warp's first lane (WARP: its break is warp-uniform) or the
   * thread's own; loads past the end give a vector of -inf (WARP: lanes
   * past the end visit it) or 0 (never visited) */
  constexpr int H = U / 2 > 0 ? U / 2 : 1;
  constexpr uint32_t pad = !WARP ? 0u
                          : DT == 0 ? 0xFF800000u : DT == 1 ? 0xFF80FF80u : 0xFC00FC00u;
  const long long step = (long long)blockDim.x * H;
  const int off = WARP ? lane : 0;
  uint4 q[H], n[H];
  long long base = (long long)(threadIdx.x - off);
#pragma unroll
  for (int u = 0; u < H; ++u) {
    const long long i = base + off + (long long)u * blockDim.x;
    q[u] = i < nvec ? __ldg(vp + i) : make_uint4(pad, pad, pad, pad);
  }
  for (; base < nvec; base += step) {
#pragma unroll
    for (int u = 0; u < H; ++u) { /* the next stage */
      const long long i = base + step + off + (long long)u * blockDim.x;
      n[u] = i < nvec ? __ldg(vp + i) : make_uint4(pad, pad, pad, pad);
    }
#pragma unroll
    for (int u = 0; u < H; ++u) {
      if (base + (long long)u * blockDim.x >= nvec) break;
      const long long i = base + off + (long long)u * blockDim.x;
      float v[per];
      decodeVec<DT>(q[u], v);
      f.template run<per>(vfrom + i * per, v);
    }
#pragma unroll
    for (int u = 0; u < H; ++u) q[u] = n[u];
  }
  if (WARP && threadIdx.x < 32 && tail < to) {
    const long long j = tail + lane;
    const float v[1] = {j < to ? loadValue(rowp, j, DT) : -INFINITY};
    f.template run<1>(j, v);
  }
  for (long long j = vfrom + nvec * per + threadIdx.x; !WARP && j < to; j += blockDim.x) {
    const float v[1] = {loadValue(rowp, j, DT)};
    f.template run<1>(j, v);
  }
}

template <int U = 4, typename F>
__device__ __forceinline__ void forEachElemStaged(const char* rowp, int dtype, long long from,
                                                  long long to, F& f) {
  if (dtype == 1) forEachElemStagesT<1, U, false>(rowp, from, to, f);
  else if (dtype == 2) forEachElemStagesT<2, U, false>(rowp, from, to, f);
  else forEachElemStagesT<0, U, false>(rowp, from, to, f);
}

template <int U = 4, typename F>
__device__ __forceinline__ void forEachElemWarp(const char* rowp, int dtype, long long from,
                                                long long to, F& f) {
  if (dtype == 1) forEachElemStagesT<1, U, true>(rowp, from, to, f);
  else if (dtype == 2) forEachElemStagesT<2, U, true>(rowp, from, to, f);
  else forEachElemStagesT<0, U, true>(rowp, from, to, f);
}

/* A visitor f that sees the values through the transform xf (uniform over
 * the block: the warp visitor's convergence holds). */
template <typename X, typename F>
struct XformVisit {
  const X& xf;
  F& f;
  template <int C>
  __device__ __forceinline__ void run(long long j0, const float (&v)[C]) {
    float w[C];
#pragma unroll
    for (int t = 0; t < C; ++t) w[t] = v[t];
    if (xf.on()) {
#pragma unroll
      for (int t = 0; t < C; ++t) w[t] = xf.one(j0 + t, w[t]);
    }
    f.template run<C>(j0, w);
  }
};

template <int U = 4, typename X, typename F>
__device__ __forceinline__ void forEachElemX(const char* rowp, int dtype, long long from,
                                             long long to, const X& xf, F& f) {
  XformVisit<X, F> v{xf, f};
  forEachElem<U>(rowp, dtype, from, to, v);
}

/* No transform: the plain visitors, exactly. */
template <int U = 4, typename F>
__device__ __forceinline__ void forEachElemX(const char* rowp, int dtype, long long from,
                                             long long to, const NoXform&, F& f) {
  forEachElem<U>(rowp, dtype, from, to, f);
}

template <int U = 4, typename F>
__device__ __forceinline__ void forEachElemWarpX(const char* rowp, int dtype, long long from,
                                                 long long to, const NoXform&, F& f) {
  forEachElemWarp<U>(rowp, dtype, from, to, f);
}

template <int U = 4, typename X, typename F>
__device__ __forceinline__ void forEachElemWarpX(const char* rowp, int dtype, long long from,
                                                 long long to, const X& xf, F& f) {
  XformVisit<X, F> v{xf, f};
  forEachElemWarp<U>(rowp, dtype, from, to, v);
}

/* Column range [from, to) of chunk `chunk` of `chunks` over n columns. */
__device__ __forceinline__ void chunkRange(long long n, int chunks, int chunk, long long* from,
                                           long long* to) {
  const long long per = (n + chunks - 1) / chunks;
  const long long f = (long long)chunk * per;
  *from = f < n ? f : n;
  *to = f + per < n ? f + per : n;
}

/* Bitonic sort of n (a power of two) packed pairs in shared memory, best first. */
static __device__ void bitonicDesc(u64* v, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const u64 x = v[lo], y = v[hi];
        if ((x < y) == desc) {
          v[lo] = y;
          v[hi] = x;
        }
      }
    }
  }
  __syncthreads();
}

/* The place of entry j of list `src` among `nlists` sorted lists of k
 * entries each (L[list * k + j], best first) merged into one order: its
 * place in its own list plus the entries of every other list better than
 * it; equal packs (only fillers) go by list. */
__device__ __forceinline__ int mergePlace(const u64* L, int nlists, int k, int src, int j) {
  const u64 me = L[src * k + j];
  int place = j;
  for (int o = 0; o < nlists; ++o) {
    if (o == src) continue;
    const u64* lo = L + o * k;
    int l = 0, h = k;
    while (l < h) {
      const int mid = (l + h) >> 1;
      const bool better = lo[mid] > me || (lo[mid] == me && o < src);
      if (better) l = mid + 1;
      else h = mid;
    }
    place += l;
  }
  return place;
}

template <typename X = NoXform>
__device__ __forceinline__ uint32_t keyAt(const char* rowp, long long j, int dtype,
                                          const X& xf = X()) {
  return orderKey(xf.one(j, loadValue(rowp, j, dtype)));
}

/* A thread's float maximum (NaN ignored: fmaxf). */
struct MaxVisit {
  float m;
  template <int C>
  __device__ __forceinline__ void run(long long, const float (&v)[C]) {
#pragma unroll
    for (int t = 0; t < C; ++t) m = fmaxf(m, v[t]);
  }
};

/* ---- tile maxima: the collection re-reads only what may hold a candidate ------- */
/* A tile is 32 consecutive aligned vectors of a column range, the vectors one
 * warp visits in one call of a warp traversal (forEachElemWarp: vector i of
 * the range goes to lane i % 32 of one warp). The first pass records the
 * high 16 bits of the order key of each tile's maximum, rounded up, in
 * shared memory (TileRec: 4 KB; a tile's maximum key k >= a threshold's
 * key t implies ceil(k / 2^16) >= floor(t / 2^16), so rounding may only
 * add tiles); the top-k collection then reads only the tiles that may
 * reach the threshold, the scalar head and tail always (tileCollect).
 * Ranges of more than TILE_CAP tiles (512 K 16-bit or 256 K fp32 columns a
 * block) are collected by a full pass. */
constexpr int TILE_CAP = 2048;
__device__ __forceinline__ uint16_t* tileKeys() {
  __shared__ uint16_t k[TILE_CAP];
  return k;
}

__device__ __forceinline__ long long alignHeadAny(const char* rowp, int dtype, long long from,
                                                  long long to) {
  return dtype == 0 ? alignHead<0>(rowp, from, to) : alignHead<1>(rowp, from, to);
}

/* Records the tile maxima of a warp traversal of [from, to) of row rowp. */
struct TileRec {
  long long vfrom; /* the first aligned column */
  int lshift;      /* log2 of the columns of a vector */
  __device__ __forceinline__ void init(const char* rowp, int dtype, long long from, long long to) {
    vfrom = from + alignHeadAny(rowp, dtype, from, to);
    lshift = dtype == 0 ? 2 : 3;
  }
  /* Every lane of the warp calls, with its vector (a lane past the end: -inf);
   * the scalar head and tail (C == 1) are not in any tile. */
  template <int C>
  __device__ __forceinline__ void add(long long j0, const float (&v)[C]) {
    if (C == 1) return;
    float m = v[0];
#pragma unroll
    for (int t = 1; t < C; ++t) m = fmaxf(m, v[t]);
    const uint32_t k = __reduce_max_sync(0xffffffffu, orderKey(m));
    const uint32_t up = (k >> 16) + ((k & 0xffffu) != 0u ? 1u : 0u); /* ceil(k / 2^16) */
    const long long tile = ((j0 - vfrom) >> lshift) >> 5; /* the same on every lane */
    if ((threadIdx.x & 31) == 0 && tile < TILE_CAP)
      tileKeys()[tile] = (uint16_t)(up < 0xffffu ? up : 0xffffu);
  }
};

/* MaxVisit with the tile maxima (a warp traversal). */
struct MaxTileVisit {
  float m;
  TileRec rec;
  template <int C>
  __device__ __forceinline__ void run(long long j0, const float (&v)[C]) {
#pragma unroll
    for (int t = 0; t < C; ++t) m = fmaxf(m, v[t]);
    rec.add<C>(j0, v);
  }
};

/* Visits (f.run) every column of [from, to) in a tile whose recorded
 * maximum may reach the key tkey, and the scalar head and tail; false
 * (nothing visited) when the range has more than TILE_CAP tiles. The tiles
 * are spread over the block's warps, four in flight per lane. */
template <int DT, typename F>
__device__ __forceinline__ bool tileCollectT(const char* rowp, long long from, long long to,
                                             uint32_t tkey, F& f) {
  constexpr int esize = DT == 0 ? 4 : 2;
  constexpr int per = 16 / esize;
  const long long head = alignHead<DT>(rowp, from, to);
  const long long vfrom = from + head;
  const long long nvec = (to - vfrom) / per;
  const long long tail = vfrom + nvec * per;
  const long long ntiles = (nvec + 31) / 32;
  if (ntiles > TILE_CAP) return false;
  if ((long long)threadIdx.x < head) {
    const float v[1] = {loadValue(rowp, from + threadIdx.x, DT)};
    f.template run<1>(from + threadIdx.x, v);
  }
  if ((long long)threadIdx.x < to - tail) {
    const float v[1] = {loadValue(rowp, tail + threadIdx.x, DT)};
    f.template run<1>(tail + threadIdx.x, v);
  }
  const uint4* vp = reinterpret_cast<const uint4*>(rowp + vfrom * esize);
  const uint16_t* keys = tileKeys();
  const uint32_t thi = tkey >> 16;
  const int nw = (int)(blockDim.x >> 5), lane = (int)(threadIdx.x & 31);
  for (int r0 = (int)(threadIdx.x >> 5); r0 < (int)ntiles; r0 += 32 * nw) {
    const int mine = r0 + lane * nw; /* this lane tests tile `mine` */
    uint32_t bal = __ballot_sync(0xffffffffu, mine < (int)ntiles && keys[mine] >= thi);
    while (bal != 0u) {
      int m[4];
      uint4 q[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        m[b] = bal != 0u ? r0 + (__ffs(bal) - 1) * nw : -1;
        bal &= bal - 1u;
        const long long i = (long long)m[b] * 32 + lane;
        q[b] = m[b] >= 0 && i < nvec ? __ldg(vp + i) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const long long i = (long long)m[b] * 32 + lane;
        if (m[b] < 0 || i >= nvec) continue;
        float v[per];
        decodeVec<DT>(q[b], v);
        f.template run<per>(vfrom + i * per, v);
      }
    }
  }
  return true;
}

template <typename F>
__device__ __forceinline__ bool tileCollect(const char* rowp, int dtype, long long from,
                                            long long to, uint32_t tkey, F& f) {
  if (dtype == 1) return tileCollectT<1>(rowp, from, to, tkey, f);
  if (dtype == 2) return tileCollectT<2>(rowp, from, to, tkey, f);
  return tileCollectT<0>(rowp, from, to, tkey, f);
}

/* Collects the elements whose key is >= key(t) (STRICT: > key(t)), NaN
 * counting as -inf, into cand: at most SEL_CAND of them (*count keeps
 * counting past that). */
template <bool STRICT>
struct CollectVisit {
  float t;
  uint32_t tkey;
  long long col0;
  u64* cand;
  int* count;
  template <int C>
  __device__ __forceinline__ void run(long long j0, const float (&v)[C]) {
    float vm = noNan(v[0]);
#pragma unroll
    for (int u = 1; u < C; ++u) vm = fmaxf(vm, noNan(v[u]));
    if (STRICT ? !(vm > t) : !(vm >= t)) return; /* the common case: nothing here */
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const uint32_t k = orderKey(v[u]);
      if (STRICT ? k > tkey : k >= tkey) {
        const int slot = atomicAdd(count, 1);
        if (slot < SEL_CAND) cand[slot] = packKI(k, (uint32_t)(col0 + j0 + u));
      }
    }
  }
};

/* Radix selection: histogram of the digit at `shift` of the keys matching
 * `prefix` on `mask`. */
struct RadixVisit {
  uint32_t prefix, mask;
  int shift;
  int* hist;
  template <int C>
  __device__ __forceinline__ void run(long long, const float (&v)[C]) {
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const uint32_t key = orderKey(v[t]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1);
    }
  }
};

/* Groups of the block's threads whose maxima bound the k-th largest value:
 * a power of two >= 2k (about 1.4 k elements pass the bound for real
 * logits), at least a warp's worth, at most a thread each (blocks of at
 * least 2k threads: then >= k groups, as the bound needs). */
__device__ __forceinline__ int topkGroups(int k) {
  int g = 32;
  while (g < 2 * k && g < (int)blockDim.x) g <<= 1;
  return g;
}

template <typename X = NoXform>
static __device__ void topkRangeFromMax(int k, int dtype, long long col0, const char* rowp,
                                        long long from, long long to, float thread_max, u64* sel,
                                        bool tiled, const X& xf = X());

/* The k best of columns [from, to) of the row into sel[0..k), best first,
 * fillers {KEY_NONE, NO_INDEX} after the last; tiled: the collection reads
 * only the tiles that may reach the threshold. Every thread calls it. */
__device__ __forceinline__ void topkRange(int k, int dtype, long long col0, const char* rowp,
                                          long long from, long long to, u64* sel, bool tiled) {
  if (tiled) {
    MaxTileVisit mx{-INFINITY, {}};
    mx.rec.init(rowp, dtype, from, to);
    forEachElemWarp<TOPK_UNROLL>(rowp, dtype, from, to, mx);
    topkRangeFromMax(k, dtype, col0, rowp, from, to, mx.m, sel, true);
    return;
  }
  MaxVisit mx{-INFINITY};
  forEachElem<TOPK_UNROLL>(rowp, dtype, from, to, mx);
  topkRangeFromMax(k, dtype, col0, rowp, from, to, mx.m, sel, false);
}

/* topkRange after its first pass: thread_max is the float maximum (NaN
 * ignored) of the elements this thread visits in a forEachElem over
 * [from, to), any unroll (the threads' element sets only need to be
 * disjoint; another pass may compute it alongside its own work); tiled:
 * that pass was a warp traversal that recorded the tile maxima (TileRec);
 * xf: what that pass saw. Blocks of 2k to TOPK_THREADS threads, a power of
 * two. */
template <typename X>
static __device__ void topkRangeFromMax(int k, int dtype, long long col0, const char* rowp,
                                        long long from, long long to, float thread_max, u64* sel,
                                        bool tiled, const X& xf) {
  __shared__ u64 s_cand[SEL_CAND];
  __shared__ float s_max[TOPK_THREADS];
  __shared__ int s_count;
  __shared__ float s_thresh;
  /* 1. group maxima (-inf for a group without elements); the k-th largest
   * of them: the one with fewer than k maxima above it and at least k at or
   * above it (every candidate writes the same value) */
  MaxVisit mx{thread_max};
  const int groups = topkGroups(k), gsize = (int)blockDim.x / groups;
  for (int o = gsize >> 1; o > 0; o >>= 1) mx.m = fmaxf(mx.m, __shfl_xor_sync(0xffffffffu, mx.m, o));
  if (threadIdx.x % gsize == 0) s_max[threadIdx.x / gsize] = mx.m;
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  if ((int)threadIdx.x < groups) {
    const float me = s_max[threadIdx.x];
    int gt = 0, ge = 0;
#pragma unroll 16
    for (int j = 0; j < groups; ++j) {
      const float o = s_max[j];
      gt += o > me;
      ge += o >= me;
    }
    if (gt < k && ge >= k) s_thresh = me;
  }
  __syncthreads();
  /* >= k elements are >= t (t = -inf: all of them, NaN included as -inf) */
  const float t = s_thresh;

  /* 2. collect the elements >= t: from the tiles that reach t, or all */
  CollectVisit<false> col{t, orderKey(t), col0, s_cand, &s_count};
  XformVisit<X, CollectVisit<false>> xcol{xf, col};
  if (!(tiled && tileCollect(rowp, dtype, from, to, orderKey(t), xcol)))
    forEachElemX<TOPK_UNROLL>(rowp, dtype, from, to, xf, col);
  __syncthreads();
  int count = s_count;
  __syncthreads();

  if (count > SEL_CAND) {
    /* 3. many ties: the exact k-th key T by radix selection (8-bit digits,
     * from the top), then every key > T and the lowest-index keys == T in
     * index order */
    __shared__ int s_hist[256];
    __shared__ uint32_t s_digit;
    __shared__ int s_need;
    uint32_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) s_need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) s_hist[i] = 0;
      __syncthreads();
      RadixVisit rv{prefix, mask, shift, s_hist};
      forEachElemX(rowp, dtype, from, to, xf, rv);
      __syncthreads();
      if (threadIdx.x == 0) {
        int need = s_need, above = 0, d = 255;
        for (; d > 0 && above + s_hist[d] < need; --d) above += s_hist[d];
        s_digit = (uint32_t)d;
        s_need = need - above;
      }
      __syncthreads();
      prefix |= s_digit << shift;
      mask |= 0xffu << shift;
    }
    const uint32_t T = prefix;
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    CollectVisit<true> gt{keyValue(T), T, col0, s_cand, &s_count};
    forEachElemX(rowp, dtype, from, to, xf, gt);
    __syncthreads();
    int have = s_count; /* < k */
    __syncthreads();
    __shared__ int s_warp[TOPK_THREADS / 32];
    for (long long base = from; base < to && have < k; base += blockDim.x) {
      const long long j = base + threadIdx.x;
      const bool eq = j < to && keyAt(rowp, j, dtype, xf) == T;
      const unsigned bal = __ballot_sync(0xffffffffu, eq);
      const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
      if (lane == 0) s_warp[w] = __popc(bal);
      __syncthreads();
      int before = 0, total = 0;
      for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
        before += i < w ? s_warp[i] : 0;
        total += s_warp[i];
      }
      const int pos = have + before + __popc(bal & ((1u << lane) - 1u));
      if (eq && pos < k) s_cand[pos] = packKI(T, (uint32_t)(col0 + j));
      __syncthreads();
      have += total;
    }
    count = k;
  }

  /* the k best candidates, best first, fillers after the last one: by
   * counting (packed pairs are distinct) when few, else a bitonic sort */
  for (int j = threadIdx.x; j < k; j += blockDim.x) sel[j] = packKI(KEY_NONE, NO_INDEX);
  __syncthreads();
  if (count <= (int)blockDim.x) {
    /* a candidate's rank = the candidates above it: p consecutive threads
     * (a power of two, at most a warp) per candidate, each comparing with
     * every p-th, then summed by shuffles; count^2 comparisons spread over
     * the block instead of over `count` threads */
    int p = 1;
    while (p < 32 && 2 * p * count <= (int)blockDim.x) p <<= 1;
    const int c = (int)threadIdx.x / p, part = (int)threadIdx.x % p;
    const u64 me = c < count ? s_cand[c] : 0ull;
    int above = 0;
    if (c < count) {
#pragma unroll 4
      for (int j = part; j < count; j += p) above += s_cand[j] > me;
    }
    for (int o = p >> 1; o > 0; o >>= 1) above += __shfl_xor_sync(0xffffffffu, above, o);
    if (c < count && part == 0 && above < k) sel[above] = me;
  } else {
    int m = 1;
    while (m < count) m <<= 1;
    for (int i = count + threadIdx.x; i < m; i += blockDim.x) s_cand[i] = packKI(KEY_NONE, NO_INDEX);
    bitonicDesc(s_cand, m);
    for (int j = threadIdx.x; j < k; j += blockDim.x) sel[j] = s_cand[j];
  }
  __syncthreads();
}

}  // namespace dpsshard

#endif /* DPS_SHARD_REDUCE_CUH_ */
