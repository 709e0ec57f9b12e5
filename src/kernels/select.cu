/* Distributed argmax and top-k: the local pass over a rank's vocab shard and
 * the merge of every rank's candidates (interface: select_kernels.h).
 *
 * Order everywhere: larger value first, then lower global index (then lower
 * source list, which only separates the {-inf, 0xffffffff} fillers). NaN is
 * read as -inf, -0.0 as +0.0. Argmax compares floats; top-k compares 32-bit
 * order keys (orderKey) with the index packed below them.
 *
 * A row is cut into `chunks` column ranges, one block each, the blocks of a
 * row forming one thread-block cluster: each block reduces its range (vector
 * loads where the row's alignment allows) and stores its partial result into
 * block 0's shared memory; after one cluster barrier block 0 folds them and
 * emits the row's result (a first, relaxed cluster barrier, passed long
 * before, makes sure every block has started before those stores). (Few
 * rows: the split keeps every SM reading.)
 *
 * Argmax: value and index by compare-and-select; the logsumexp is an online
 * (m, s) pair, rescaled once per vector of 4 or 8 elements.
 *
 * Top-k, per block:
 *  1. every thread keeps the float maximum of its strided elements; groups of
 *     threads fold theirs into G >= 2k group maxima, and the k-th largest
 *     of those, t, is a lower bound of the range's k-th largest value (the
 *     maxima are distinct elements);
 *  2. the elements >= t (about 1.4 k for real logits) are collected in shared
 *     memory, and the k best are placed by counting (or a bitonic sort);
 *  3. if more than SEL_CAND of them (many ties), a radix selection over the
 *     order keys finds the exact k-th key T, and the selection is every key
 *     > T plus the lowest-index keys == T, collected in index order.
 * The chunks' sorted lists (and the ranks' lists in the merge kernel) are
 * merged by placement: an entry's place is its place in its own list plus
 * the entries of every other list that beat it (binary search).
 *
 * Exchange: LL lines (two words, the flag in each 8-byte half) into every
 * rank's staging; the merge kernel polls them with the onesided timeout.
 * The local kernel's epoch comes from dpsOsDevState.epoch[op] (read after
 * the PDL wait, published by its last block); the merge kernel, which runs
 * after it on the stream, reads the published value. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "kernels/select_kernels.h"

using namespace dpsos;

namespace {

constexpr int ARGMAX_THREADS = 512;
constexpr int TOPK_THREADS = 512;
/* resident blocks per SM asked of the compiler (registers: 32 and 64) */
constexpr int ARGMAX_BLOCKS_PER_SM = 4;
constexpr int TOPK_BLOCKS_PER_SM = 2;
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

/* 2^x (ex2.approx: -inf -> 0, NaN -> NaN). */
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
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

/* ---- the blocks of a row: one cluster (sm_90+) --------------------------------- */
/* The address of `p` (this block's shared memory) in block 0 of the cluster. */
template <typename T>
__device__ __forceinline__ T* clusterLeader(T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return reinterpret_cast<T*>(__cluster_map_shared_rank(p, 0));
#else
  return p;
#endif
}

/* Distributed shared memory may be touched only once every block of the
 * cluster has started: each thread arrives (relaxed, not waiting) when its
 * kernel starts, and waits before its first store into another block. */
__device__ __forceinline__ void clusterArriveStarted() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive_relaxed();
#endif
}
__device__ __forceinline__ void clusterWaitStarted() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_wait();
#endif
}

/* Every thread of every block of the cluster: stores before it (to any
 * block's shared memory) are visible to every block after it. */
__device__ __forceinline__ void clusterBarrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive(); /* release */
  __cluster_barrier_wait();   /* acquire */
#else
  __trap(); /* never launched with chunks > 1 (dpsSelectWaves finds no clusters) */
#endif
}

/* ---- logsumexp as an online (m, s) pair ------------------------------------- */
struct Lse {
  float m, s;
  __device__ Lse() : m(-INFINITY), s(0.f) {}
  /* C elements (raw: NaN propagates into s); one rescale per call. While m
   * is -inf (nothing finite yet) s counts the -inf elements, which value()
   * ignores. */
  template <int C>
  __device__ __forceinline__ void add(const float (&v)[C]) {
    float vm = v[0];
#pragma unroll
    for (int t = 1; t < C; ++t) vm = fmaxf(vm, v[t]);
    if (vm > m) {
      s *= fastExp2((m - vm) * LOG2E); /* m = -inf: 0 */
      m = vm;
    }
    const float mb = m * LOG2E;
#pragma unroll
    for (int t = 0; t < C; ++t) s += v[t] == m ? 1.f : fastExp2(fmaf(v[t], LOG2E, -mb));
  }
  __device__ __forceinline__ void merge(float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) { /* both empty or all -inf: keep s (counts or NaN) */
      s = s + s2;
      return;
    }
    const float a = m == mm ? s : s * expf(m - mm);
    const float b = m2 == mm ? s2 : s2 * expf(m2 - mm);
    s = a + b;
    m = mm;
  }
  __device__ __forceinline__ float value() const {
    if (s != s) return s;
    if (m == -INFINITY) return -INFINITY;
    return m + logf(s);
  }
};

/* argmax state: the best value (never NaN: NaN never wins) and its global
 * index, plus the Lse. */
struct ArgState {
  float v;
  uint32_t i;
  Lse lse;
  __device__ ArgState() : v(-INFINITY), i(0u) {} /* nothing beats -inf: index 0 */
};

template <bool LSE>
__device__ __forceinline__ void argMerge(ArgState& st, float v, uint32_t i, float m, float s) {
  if (v > st.v || (v == st.v && i < st.i)) {
    st.v = v;
    st.i = i;
  }
  if (LSE) st.lse.merge(m, s);
}

template <bool LSE>
__device__ __forceinline__ void warpArgReduce(ArgState& st) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_down_sync(0xffffffffu, st.v, o);
    const uint32_t i = __shfl_down_sync(0xffffffffu, st.i, o);
    const float m = __shfl_down_sync(0xffffffffu, st.lse.m, o);
    const float s = __shfl_down_sync(0xffffffffu, st.lse.s, o);
    argMerge<LSE>(st, v, i, m, s);
  }
}

/* Block-wide fold of ArgState into thread 0's. */
template <int THREADS, bool LSE>
__device__ __forceinline__ void blockArgReduce(ArgState& st) {
  __shared__ float s_v[THREADS / 32], s_m[THREADS / 32], s_s[THREADS / 32];
  __shared__ uint32_t s_i[THREADS / 32];
  warpArgReduce<LSE>(st);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    s_v[w] = st.v;
    s_i[w] = st.i;
    s_m[w] = st.lse.m;
    s_s[w] = st.lse.s;
  }
  __syncthreads();
  if (w == 0) {
    ArgState t;
    if (lane < THREADS / 32) {
      t.v = s_v[lane];
      t.i = s_i[lane];
      t.lse.m = s_m[lane];
      t.lse.s = s_s[lane];
    }
    warpArgReduce<LSE>(t);
    if (lane == 0) st = t;
  }
}

/* ---- emitting a row's result ------------------------------------------------- */
/* Writes words [0, nwords) of row `row`'s payload (LL: lines of two words). */
__device__ __forceinline__ void emitWords(const dpsSelLocalArgs& a, long long row,
                                          const uint32_t* w, int nwords, uint32_t flag,
                                          int parity) {
  if (a.sink == DPS_SEL_SINK_PLAIN) {
    for (int i = 0; i < nwords; ++i) a.cand[row * nwords + i] = w[i];
    return;
  }
  const int lines = nwords / 2;
  for (int l = 0; l < lines; ++l) {
    const size_t off = DPS_OS_LL_OFFSET(parity, a.c.rank, row * lines + l, a.c.tp, a.cap);
    for (int r = 0; r < a.c.tp; ++r) stLine(a.stage_peer.p[r] + off, w[2 * l], w[2 * l + 1], flag);
  }
}

/* ---- the row visitor ------------------------------------------------------------ */
/* Calls f.run<C>(j0, v) for every column of [from, to) of the row, each
 * column in exactly one call of one thread, v[t] the value of column j0 + t:
 * a scalar head up to 16-byte alignment (C = 1), 16-byte vectors (C = 4 for
 * fp32, 8 for 16-bit dtypes; U in flight per thread), a scalar tail. */
template <int DT, int U, typename F>
__device__ __forceinline__ void forEachElemT(const char* rowp, long long from, long long to,
                                             F& f) {
  constexpr int esize = DT == 0 ? 4 : 2;
  constexpr int per = 16 / esize;
  const uintptr_t a0 = (uintptr_t)(rowp + from * esize);
  long long head = (long long)(((16u - (unsigned)(a0 & 15u)) & 15u) / (unsigned)esize);
  if (head > to - from) head = to - from;
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
      const uint32_t w[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
      float v[per];
#pragma unroll
      for (int t = 0; t < per; ++t) {
        if (DT == 0) {
          v[t] = __uint_as_float(w[t]);
        } else {
          const unsigned short h = (unsigned short)(w[t >> 1] >> (16 * (t & 1)));
          v[t] = DT == 1 ? __bfloat162float(__ushort_as_bfloat16(h))
                         : __half2float(__ushort_as_half(h));
        }
      }
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

/* Column range [from, to) of chunk `chunk` of `chunks` over n columns. */
__device__ __forceinline__ void chunkRange(long long n, int chunks, int chunk, long long* from,
                                           long long* to) {
  const long long per = (n + chunks - 1) / chunks;
  const long long f = (long long)chunk * per;
  *from = f < n ? f : n;
  *to = f + per < n ? f + per : n;
}

/* ---- argmax local pass --------------------------------------------------------- */
template <bool LSE>
struct ArgVisit {
  ArgState st;
  uint32_t col0;
  /* a thread's elements come in increasing index: a strictly larger value
   * wins (NaN compares false, -0.0 == +0.0) */
  template <int C>
  __device__ __forceinline__ void run(long long j0, const float (&v)[C]) {
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const bool take = v[t] > st.v;
      st.v = take ? v[t] : st.v;
      st.i = take ? col0 + (uint32_t)(j0 + t) : st.i;
    }
    if (LSE) st.lse.add(v);
  }
};

template <bool LSE>
__global__ void __launch_bounds__(ARGMAX_THREADS, ARGMAX_BLOCKS_PER_SM)
    argmaxLocalKernel(dpsSelLocalArgs a) {
  const long long row = blockIdx.x / a.chunks;
  const int chunk = (int)(blockIdx.x % a.chunks);
  const bool ll = a.sink == DPS_SEL_SINK_LL;
  if (a.chunks > 1) clusterArriveStarted();
  dpsPdlWait();
  /* e == 0: the communicator failed earlier; a block of a cluster still
   * takes part in the cluster barriers */
  const u64 e = ll ? beginEpoch(a.c, a.op) : 1;
  if (e == 0 && a.chunks == 1) return;
  ArgVisit<LSE> vis;
  vis.col0 = (uint32_t)a.col0;
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  long long from, to;
  chunkRange(e != 0 ? a.nvalid : 0, a.chunks, chunk, &from, &to);
  forEachElem(rowp, a.dtype, from, to, vis);
  if (a.early_release) dpsPdlRelease(); /* the dependent may be scheduled (it waits for us) */
  ArgState& st = vis.st;
  blockArgReduce<ARGMAX_THREADS, LSE>(st);

  if (a.chunks > 1) {
    /* every block's partial into block 0, which folds them with one warp */
    __shared__ float4 s_part[DPS_SEL_MAX_CHUNKS];
    clusterWaitStarted();
    if (threadIdx.x == 0)
      *clusterLeader(&s_part[chunk]) = make_float4(st.v, __uint_as_float(st.i), st.lse.m, st.lse.s);
    clusterBarrier();
    if (e == 0) return;
    if (chunk != 0) {
      if (ll) finishEpoch(a.c, a.op, e);
      return;
    }
    if (threadIdx.x < 32) {
      ArgState t;
      if ((int)threadIdx.x < a.chunks) {
        const float4 q = s_part[threadIdx.x];
        t.v = q.x;
        t.i = __float_as_uint(q.y);
        t.lse.m = q.z;
        t.lse.s = q.w;
      }
      warpArgReduce<LSE>(t);
      if (threadIdx.x == 0) st = t;
    }
  }
  if (threadIdx.x == 0) {
    if (a.sink == DPS_SEL_SINK_FINAL) {
      a.out.index[row] = (int64_t)st.i;
      if (a.out.value) storeValue(a.out.value, row, st.v, a.dtype);
      if (a.out.lse) a.out.lse[row] = st.lse.value();
    } else {
      const uint32_t w[4] = {__float_as_uint(st.v), st.i, __float_as_uint(st.lse.m),
                             __float_as_uint(st.lse.s)};
      emitWords(a, row, w, 4, llFlag(e), (int)(e & 1));
    }
  }
  if (ll) finishEpoch(a.c, a.op, e);
}

/* ---- top-k local pass ------------------------------------------------------------ */
/* Bitonic sort of n (a power of two) packed pairs in shared memory, best first. */
__device__ void bitonicDesc(u64* v, int n) {
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

__device__ __forceinline__ uint32_t keyAt(const char* rowp, long long j, int dtype) {
  return orderKey(loadValue(rowp, j, dtype));
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

/* Groups of threads whose maxima bound the k-th largest value: a power of
 * two >= 2k (about 1.4 k elements pass the bound for real logits), at least
 * a warp's worth. */
__device__ __forceinline__ int topkGroups(int k) {
  int g = 32;
  while (g < 2 * k && g < TOPK_THREADS) g <<= 1;
  return g;
}

/* The k best of columns [from, to) of the row into sel[0..k), best first,
 * fillers {KEY_NONE, NO_INDEX} after the last. Every thread calls it. */
__device__ void topkRange(const dpsSelLocalArgs& a, const char* rowp, long long from,
                          long long to, u64* sel) {
  __shared__ u64 s_cand[SEL_CAND];
  __shared__ float s_max[TOPK_THREADS];
  __shared__ int s_count;
  __shared__ float s_thresh;
  const int k = a.k;

  /* 1. group maxima (-inf for a group without elements); the k-th largest
   * of them: the one with fewer than k maxima above it and at least k at or
   * above it (every candidate writes the same value) */
  MaxVisit mx{-INFINITY};
  forEachElem<TOPK_UNROLL>(rowp, a.dtype, from, to, mx);
  const int groups = topkGroups(k), gsize = TOPK_THREADS / groups;
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

  /* 2. collect the elements >= t */
  CollectVisit<false> col{t, orderKey(t), a.col0, s_cand, &s_count};
  forEachElem<TOPK_UNROLL>(rowp, a.dtype, from, to, col);
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
      forEachElem(rowp, a.dtype, from, to, rv);
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
    CollectVisit<true> gt{keyValue(T), T, a.col0, s_cand, &s_count};
    forEachElem(rowp, a.dtype, from, to, gt);
    __syncthreads();
    int have = s_count; /* < k */
    __syncthreads();
    __shared__ int s_warp[TOPK_THREADS / 32];
    for (long long base = from; base < to && have < k; base += blockDim.x) {
      const long long j = base + threadIdx.x;
      const bool eq = j < to && keyAt(rowp, j, a.dtype) == T;
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
      if (eq && pos < k) s_cand[pos] = packKI(T, (uint32_t)(a.col0 + j));
      __syncthreads();
      have += total;
    }
    count = k;
  }

  /* the k best candidates, best first, fillers after the last one: by
   * counting (packed pairs are distinct) when few, else a bitonic sort */
  for (int j = threadIdx.x; j < k; j += blockDim.x) sel[j] = packKI(KEY_NONE, NO_INDEX);
  __syncthreads();
  if (count <= TOPK_THREADS) {
    if ((int)threadIdx.x < count) {
      const u64 me = s_cand[threadIdx.x];
      int above = 0;
#pragma unroll 8
      for (int j = 0; j < count; ++j) above += s_cand[j] > me;
      if (above < k) sel[above] = me;
    }
  } else {
    int m = 1;
    while (m < count) m <<= 1;
    for (int i = count + threadIdx.x; i < m; i += blockDim.x) s_cand[i] = packKI(KEY_NONE, NO_INDEX);
    bitonicDesc(s_cand, m);
    for (int j = threadIdx.x; j < k; j += blockDim.x) sel[j] = s_cand[j];
  }
  __syncthreads();
}

__global__ void __launch_bounds__(TOPK_THREADS, TOPK_BLOCKS_PER_SM)
    topkLocalKernel(dpsSelLocalArgs a) {
  __shared__ u64 s_sel[DPS_TOPK_MAX];
  __shared__ u64 s_lists[DPS_SEL_MAX_CHUNKS * DPS_TOPK_MAX]; /* block 0: every chunk's list */
  const long long row = blockIdx.x / a.chunks;
  const int chunk = (int)(blockIdx.x % a.chunks);
  const int k = a.k;
  const bool ll = a.sink == DPS_SEL_SINK_LL;
  if (a.chunks > 1) clusterArriveStarted();
  dpsPdlWait();
  /* e == 0: failed earlier (a block of a cluster still takes part in its barriers) */
  const u64 e = ll ? beginEpoch(a.c, a.op) : 1;
  if (e == 0 && a.chunks == 1) return;
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  long long from, to;
  chunkRange(e != 0 ? a.nvalid : 0, a.chunks, chunk, &from, &to);
  topkRange(a, rowp, from, to, s_sel);
  if (a.early_release) dpsPdlRelease(); /* the dependent may be scheduled (it waits for us) */

  if (a.chunks > 1) {
    /* every chunk's list into block 0, which merges them (chunks are
     * disjoint column ranges: only fillers compare equal) */
    clusterWaitStarted();
    u64* lists = clusterLeader(s_lists) + chunk * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) lists[j] = s_sel[j];
    clusterBarrier();
    if (e == 0) return;
    if (chunk != 0) {
      if (ll) finishEpoch(a.c, a.op, e);
      return;
    }
    for (int i = threadIdx.x; i < a.chunks * k; i += blockDim.x) {
      const int place = mergePlace(s_lists, a.chunks, k, i / k, i % k);
      if (place < k) s_sel[place] = s_lists[i];
    }
    __syncthreads();
  }

  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const u64 p = s_sel[j];
    const uint32_t idx = packedIdx(p);
    const float v = packedValue(p);
    if (a.sink == DPS_SEL_SINK_FINAL) {
      a.out.index[row * k + j] = (int64_t)idx;
      if (a.out.value) storeValue(a.out.value, row * k + j, v, a.dtype);
    } else if (a.sink == DPS_SEL_SINK_PLAIN) {
      a.cand[(row * k + j) * 2] = __float_as_uint(v);
      a.cand[(row * k + j) * 2 + 1] = idx;
    } else {
      const size_t off = DPS_OS_LL_OFFSET((int)(e & 1), a.c.rank, row * k + j, a.c.tp, a.cap);
      const uint32_t flag = llFlag(e);
      for (int r = 0; r < a.c.tp; ++r) stLine(a.stage_peer.p[r] + off, __float_as_uint(v), idx, flag);
    }
  }
  if (ll) finishEpoch(a.c, a.op, e);
}

/* ---- merge --------------------------------------------------------------------- */
/* Words (w0, w1) of line `line` from rank src: plain, or LL with a wait.
 * false when the wait gave up (the cause is recorded). */
__device__ __forceinline__ bool fetchPair(const dpsSelMergeArgs& a, int src, long long line,
                                          int words_per_row, uint32_t flag, int parity, u64 t0,
                                          uint32_t* w0, uint32_t* w1) {
  if (!a.ll) {
    const uint32_t* p = a.gathered + ((size_t)src * (size_t)a.rows * words_per_row) + line * 2;
    *w0 = p[0];
    *w1 = p[1];
    return true;
  }
  const char* pl = a.stage + DPS_OS_LL_OFFSET(parity, src, line, a.c.tp, a.cap);
  unsigned n = 0;
  uint4 v = ldLine(pl);
  while (v.y != flag || v.w != flag) {
    if ((++n & 127u) == 0 && spinExpired(a.c, t0, a.op, src, DPS_OS_WAIT_DATA)) return false;
    v = ldLine(pl);
  }
  *w0 = v.x;
  *w1 = v.z;
  return true;
}

__device__ __forceinline__ u64 mergeEpoch(const dpsSelMergeArgs& a) {
  if (!a.ll) return 1;
  if (ldVolatile(&a.c.state->err) != 0) return 0;
  return ldVolatile(&a.c.state->epoch[a.op]);
}

/* One thread per row. */
__global__ void argmaxMergeKernel(dpsSelMergeArgs a) {
  dpsPdlWait();
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 e = mergeEpoch(a);
  if (e == 0 || row >= a.rows) return;
  const uint32_t flag = llFlag(e);
  const int parity = (int)(e & 1);
  const u64 t0 = globalTimer();
  ArgState st;
  for (int src = 0; src < a.tp; ++src) {
    uint32_t w[4];
    if (!fetchPair(a, src, row * 2, 4, flag, parity, t0, &w[0], &w[1]) ||
        !fetchPair(a, src, row * 2 + 1, 4, flag, parity, t0, &w[2], &w[3]))
      return;
    argMerge<true>(st, __uint_as_float(w[0]), w[1], __uint_as_float(w[2]), __uint_as_float(w[3]));
  }
  a.out.index[row] = (int64_t)st.i;
  if (a.out.value) storeValue(a.out.value, row, st.v, a.dtype);
  if (a.out.lse) a.out.lse[row] = st.lse.value();
}

/* One warp per row: every rank's list (sorted) goes to shared memory, then
 * each candidate's place in the merged order is its place in its own list
 * plus, for every other list, how many of that list's entries beat it
 * (binary search); places below k are written out. */
constexpr int MERGE_WARPS = 4;
__global__ void __launch_bounds__(MERGE_WARPS * 32) topkMergeKernel(dpsSelMergeArgs a) {
  __shared__ u64 s_list[MERGE_WARPS][DPS_OS_MAX_RANKS * DPS_TOPK_MAX];
  dpsPdlWait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * MERGE_WARPS + warp;
  const u64 e = mergeEpoch(a);
  if (e == 0 || row >= a.rows) return;
  const int k = a.k, tp = a.tp;
  const uint32_t flag = llFlag(e);
  const int parity = (int)(e & 1);
  const u64 t0 = globalTimer();
  u64* L = s_list[warp];
  int bad = 0;
  for (int i = lane; i < tp * k; i += 32) {
    const int src = i / k, j = i % k;
    uint32_t v, idx;
    if (!fetchPair(a, src, row * k + j, 2 * k, flag, parity, t0, &v, &idx)) {
      bad = 1;
      break;
    }
    /* fillers {-inf, 0xffffffff}: below every real entry */
    const uint32_t key = idx == NO_INDEX ? KEY_NONE : orderKey(__uint_as_float(v));
    L[i] = packKI(key, idx);
  }
  if (__any_sync(0xffffffffu, bad)) return;
  __syncwarp();
  for (int i = lane; i < tp * k; i += 32) {
    const long long place = mergePlace(L, tp, k, i / k, i % k);
    if (place < k) {
      a.out.index[row * k + place] = (int64_t)packedIdx(L[i]);
      if (a.out.value) storeValue(a.out.value, row * k + place, packedValue(L[i]), a.dtype);
    }
  }
}

}  // namespace

/* The local passes: rows x chunks blocks, the chunks of a row one cluster. */
template <typename... KArgs>
static cudaError_t launchLocal(void (*kernel)(KArgs...), const dpsSelLocalArgs* a,
                               unsigned threads, cudaStream_t stream) {
  const dim3 grid((unsigned)(a->rows * (long long)a->chunks));
  return dpsLaunchCluster(kernel, grid, dim3(threads), (unsigned)a->chunks, stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchArgmaxLocal(const dpsSelLocalArgs* a, cudaStream_t stream) {
  if (a->want_lse) return launchLocal(argmaxLocalKernel<true>, a, ARGMAX_THREADS, stream);
  return launchLocal(argmaxLocalKernel<false>, a, ARGMAX_THREADS, stream);
}

extern "C" cudaError_t dpsLaunchTopkLocal(const dpsSelLocalArgs* a, cudaStream_t stream) {
  return launchLocal(topkLocalKernel, a, TOPK_THREADS, stream);
}

extern "C" cudaError_t dpsLaunchArgmaxMerge(const dpsSelMergeArgs* a, cudaStream_t stream) {
  const unsigned threads = 128;
  const unsigned grid = (unsigned)((a->rows + threads - 1) / threads);
  return dpsLaunch(argmaxMergeKernel, dim3(grid), dim3(threads), stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchTopkMerge(const dpsSelMergeArgs* a, cudaStream_t stream) {
  const unsigned grid = (unsigned)((a->rows + MERGE_WARPS - 1) / MERGE_WARPS);
  return dpsLaunch(topkMergeKernel, dim3(grid), dim3(MERGE_WARPS * 32), stream, a->pdl, *a);
}

extern "C" cudaError_t dpsPreloadSelectKernels(void) {
  const void* const k[] = {(const void*)argmaxLocalKernel<true>,
                           (const void*)argmaxLocalKernel<false>, (const void*)topkLocalKernel,
                           (const void*)argmaxMergeKernel, (const void*)topkMergeKernel};
  return dpsPreload(k, 5);
}

/* Rows of one wave of `kernel` split over c blocks, c = 1..DPS_SEL_MAX_CHUNKS. */
template <typename... KArgs>
static cudaError_t wavesOf(void (*kernel)(KArgs...), unsigned threads, int sms, int clusters,
                           int* rows) {
  int per_sm = 0;
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)threads, 0);
  if (e != cudaSuccess) return e;
  rows[0] = 0;
  rows[1] = per_sm * sms;
  for (int c = 2; c <= DPS_SEL_MAX_CHUNKS; ++c) {
    rows[c] = 0;
    if (!clusters) continue;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)c;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(c * sms * per_sm));
    cfg.blockDim = dim3(threads);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if ((e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg)) != cudaSuccess) return e;
    rows[c] = n;
  }
  return cudaSuccess;
}

extern "C" cudaError_t dpsSelectWaves(dpsSelWaves* w) {
  const cudaError_t before = cudaPeekAtLastError();
  int dev = 0, cl = 0;
  cudaFuncAttributes fa;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&w->sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, (const void*)topkLocalKernel);
  /* the kernels' cluster code exists in sm_90+ device code only: the PTX
   * architecture counts (PTX for an older one, JIT-compiled here, reports
   * the device's binary version but has no cluster code) */
  const int clusters = e == cudaSuccess && cl && fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
  if (e == cudaSuccess)
    e = wavesOf(argmaxLocalKernel<false>, ARGMAX_THREADS, w->sms, clusters, w->rows[0]);
  if (e == cudaSuccess) e = wavesOf(topkLocalKernel, TOPK_THREADS, w->sms, clusters, w->rows[1]);
  if (e != cudaSuccess) dpsForgetOwnError(before);
  return e;
}
