/* Distributed argmax and top-k: the local pass over a rank's vocab shard and
 * the merge of every rank's candidates (interface: select_kernels.h).
 *
 * Order everywhere: larger value first, then lower global index (then lower
 * source rank, which only separates the {-inf, 0xffffffff} fillers). NaN is
 * read as -inf, -0.0 as +0.0. Argmax compares floats; top-k compares 32-bit
 * order keys (orderKey) with the index packed below them.
 *
 * Argmax local pass: a row is cut into `chunks` column ranges, one block
 * each; a block reduces its range (vector loads where the row's alignment
 * allows), the last block of a row (atomic ticket) folds the partials and
 * emits the row's candidate. The logsumexp is an online (m, s) pair.
 *
 * Top-k local pass, one block per row:
 *  1. every thread keeps the maximum of its strided elements; the k-th
 *     largest of those thread maxima, t, is a lower bound of the row's k-th
 *     largest value (the maxima are distinct elements);
 *  2. the elements >= t (a few times k for real logits) are collected in
 *     shared memory and sorted (bitonic) by (value desc, index asc);
 *  3. if more than SEL_CAND of them (many ties), a binary search over the
 *     order keys finds the exact k-th key T, and the selection is every key
 *     > T plus the lowest-index keys == T, collected in index order.
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
constexpr int TOPK_THREADS = 1024;
constexpr int TOPK_GROUPS = TOPK_THREADS / 2; /* thread pairs: disjoint element groups */
constexpr int SEL_CAND = 2048; /* candidates sorted in shared memory */
constexpr uint32_t NO_INDEX = 0xffffffffu;
constexpr uint32_t KEY_NONE = 0u; /* below every real key (key(-inf) = 0x007fffff) */

__device__ __forceinline__ float loadValue(const void* base, long long i, int dtype) {
  if (dtype == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
  if (dtype == 2) return __half2float(reinterpret_cast<const __half*>(base)[i]);
  return reinterpret_cast<const float*>(base)[i];
}

__device__ __forceinline__ float noNan(float v) { return v != v ? -INFINITY : v; }

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

__device__ __forceinline__ void storeValue(void* out, long long i, float v, int dtype) {
  if (dtype == 1) reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  else if (dtype == 2) reinterpret_cast<__half*>(out)[i] = __float2half_rn(v);
  else reinterpret_cast<float*>(out)[i] = v;
}

/* ---- logsumexp as an online (m, s) pair ------------------------------------- */
struct Lse {
  float m, s;
  __device__ Lse() : m(-INFINITY), s(0.f) {}
  __device__ __forceinline__ void add(float v) { /* v raw: NaN propagates into s */
    if (v > m) {
      s = s * __expf(m - v) + 1.f; /* m = -inf: exp(-inf) = 0 */
      m = v;
    } else {
      s += v == m ? 1.f : __expf(v - m);
    }
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

/* Elements of one thread come in increasing index: a strictly larger value
 * wins (NaN compares false, -0.0 == +0.0). */
template <bool LSE>
__device__ __forceinline__ void argAdd(ArgState& st, float v, uint32_t idx) {
  const bool take = v > st.v;
  st.v = take ? v : st.v;
  st.i = take ? idx : st.i;
  if (LSE) st.lse.add(v);
}

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
/* Calls f(j, value) for every column j in [from, to) of the row, each by one
 * thread of the block: a scalar head up to 16-byte alignment, 16-byte
 * vectors (four in flight per thread), a scalar tail. */
template <typename F>
__device__ __forceinline__ void forEachElem(const char* rowp, int dtype, long long from,
                                            long long to, F& f) {
  const int esize = dtype == 0 ? 4 : 2;
  const int per = 16 / esize;
  const uintptr_t a0 = (uintptr_t)(rowp + from * esize);
  long long head = (long long)(((16u - (unsigned)(a0 & 15u)) & 15u) / (unsigned)esize);
  if (head > to - from) head = to - from;
  for (long long j = from + threadIdx.x; j < from + head; j += blockDim.x)
    f(j, loadValue(rowp, j, dtype));
  const long long vfrom = from + head;
  const long long nvec = (to - vfrom) / per;
  const uint4* v = reinterpret_cast<const uint4*>(rowp + vfrom * esize);
  constexpr int U = 4;
  for (long long i0 = threadIdx.x; i0 < nvec; i0 += (long long)blockDim.x * U) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      q[u] = i < nvec ? __ldg(v + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      if (i >= nvec) break;
      const uint32_t w[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
      const long long j0 = vfrom + i * per;
      if (dtype == 0) {
#pragma unroll
        for (int t = 0; t < 4; ++t) f(j0 + t, __uint_as_float(w[t]));
      } else if (dtype == 1) {
#pragma unroll
        for (int t = 0; t < 8; ++t)
          f(j0 + t, __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[t >> 1] >> (16 * (t & 1))))));
      } else {
#pragma unroll
        for (int t = 0; t < 8; ++t)
          f(j0 + t, __half2float(__ushort_as_half((unsigned short)(w[t >> 1] >> (16 * (t & 1))))));
      }
    }
  }
  for (long long j = vfrom + nvec * per + threadIdx.x; j < to; j += blockDim.x)
    f(j, loadValue(rowp, j, dtype));
}

/* ---- argmax local pass --------------------------------------------------------- */
template <bool LSE>
struct ArgVisit {
  ArgState st;
  uint32_t col0;
  __device__ __forceinline__ void operator()(long long j, float v) {
    argAdd<LSE>(st, v, col0 + (uint32_t)j);
  }
};

template <bool LSE>
__global__ void __launch_bounds__(ARGMAX_THREADS) argmaxLocalKernel(dpsSelLocalArgs a) {
  const long long row = blockIdx.x / a.chunks;
  const int chunk = (int)(blockIdx.x % a.chunks);
  const bool ll = a.sink == DPS_SEL_SINK_LL;
  dpsPdlWait();
  u64 e = 0;
  if (ll) {
    e = beginEpoch(a.c, a.op);
    if (e == 0) return; /* failed earlier */
  }
  ArgVisit<LSE> vis;
  vis.col0 = (uint32_t)a.col0;
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  const long long per = (a.nvalid + a.chunks - 1) / a.chunks;
  const long long from = (long long)chunk * per;
  const long long to = from + per < a.nvalid ? from + per : a.nvalid;
  if (from < to) forEachElem(rowp, a.dtype, from, to, vis);
  dpsPdlRelease(); /* the merge may be scheduled (it waits for this grid) */
  ArgState& st = vis.st;
  blockArgReduce<ARGMAX_THREADS, LSE>(st);

  __shared__ int s_last;
  if (a.chunks > 1) {
    /* partials of the row's chunks; the last block folds them with one warp */
    if (threadIdx.x == 0) {
      uint4* p = reinterpret_cast<uint4*>(a.partial) + (size_t)row * a.chunks + chunk;
      *p = make_uint4(__float_as_uint(st.v), st.i, __float_as_uint(st.lse.m),
                      __float_as_uint(st.lse.s));
      __threadfence();
      const unsigned t = atomicAdd(&a.tickets[row], 1u);
      s_last = t == (unsigned)a.chunks - 1;
    }
    __syncthreads();
    if (!s_last) {
      if (ll) finishEpoch(a.c, a.op, e);
      return;
    }
    if (threadIdx.x < 32) {
      __threadfence();
      ArgState t;
      if ((int)threadIdx.x < a.chunks) {
        const uint4 q = __ldcg(reinterpret_cast<const uint4*>(a.partial) +
                               (size_t)row * a.chunks + threadIdx.x);
        t.v = __uint_as_float(q.x);
        t.i = q.y;
        t.lse.m = __uint_as_float(q.z);
        t.lse.s = __uint_as_float(q.w);
      }
      warpArgReduce<LSE>(t);
      if (threadIdx.x == 0) {
        st = t;
        a.tickets[row] = 0;
      }
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

__device__ __forceinline__ uint32_t keyAt(const char* rowp, long long j, int dtype) {
  return orderKey(loadValue(rowp, j, dtype));
}

struct MaxVisit {
  uint32_t m;
  __device__ __forceinline__ void operator()(long long, float v) {
    const uint32_t k = orderKey(v);
    m = k > m ? k : m;
  }
};
/* Collects the elements whose key is >= t (STRICT: > t) into cand, at most
 * SEL_CAND of them (*count keeps counting past that). */
template <bool STRICT>
struct CollectVisit {
  uint32_t t;
  long long col0;
  u64* cand;
  int* count;
  __device__ __forceinline__ void operator()(long long j, float v) {
    const uint32_t k = orderKey(v);
    if (STRICT ? k > t : k >= t) {
      const int slot = atomicAdd(count, 1);
      if (slot < SEL_CAND) cand[slot] = packKI(k, (uint32_t)(col0 + j));
    }
  }
};

/* Radix selection: histogram of the digit at `shift` of the keys matching
 * `prefix` on `mask`. */
struct RadixVisit {
  uint32_t prefix, mask;
  int shift;
  int* hist;
  __device__ __forceinline__ void operator()(long long, float v) {
    const uint32_t key = orderKey(v);
    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1);
  }
};

__global__ void __launch_bounds__(TOPK_THREADS) topkLocalKernel(dpsSelLocalArgs a) {
  __shared__ u64 s_cand[SEL_CAND];
  __shared__ int s_count;
  __shared__ uint32_t s_thresh;
  const long long row = blockIdx.x;
  const int k = a.k;
  const bool ll = a.sink == DPS_SEL_SINK_LL;
  dpsPdlWait();
  u64 e = 0;
  if (ll) {
    e = beginEpoch(a.c, a.op);
    if (e == 0) return;
  }
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  const long long n = a.nvalid;

  /* 1. thread maxima (KEY_NONE for a thread without elements); a thread's
   * elements are disjoint from every other thread's */
  MaxVisit mx{KEY_NONE};
  forEachElem(rowp, a.dtype, 0, n, mx);
  /* the k-th largest thread maximum: the maximum that has fewer than k
   * maxima above it and at least k at or above it (every thread counts) */
  __shared__ uint32_t s_max[TOPK_GROUPS];
  {
    const uint32_t o = __shfl_xor_sync(0xffffffffu, mx.m, 1);
    mx.m = o > mx.m ? o : mx.m; /* the maximum of a pair of threads' elements */
  }
  if ((threadIdx.x & 1) == 0) s_max[threadIdx.x >> 1] = mx.m;
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  if ((threadIdx.x & 1) == 0) {
    const uint32_t me = mx.m;
    int gt = 0, ge = 0;
#pragma unroll 8
    for (int j = 0; j < TOPK_GROUPS; ++j) {
      const uint32_t o = s_max[j];
      gt += o > me;
      ge += o >= me;
    }
    if (gt < k && ge >= k) s_thresh = me; /* every writer writes the same value */
  }
  __syncthreads();
  const uint32_t t = s_thresh; /* >= k elements have key >= t (KEY_NONE: all of them) */

  /* 2. collect the elements >= t */
  CollectVisit<false> col{t, a.col0, s_cand, &s_count};
  forEachElem(rowp, a.dtype, 0, n, col);
  dpsPdlRelease(); /* the merge may be scheduled (it waits for this grid) */
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
      forEachElem(rowp, a.dtype, 0, n, rv);
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
    CollectVisit<true> gt{T, a.col0, s_cand, &s_count};
    forEachElem(rowp, a.dtype, 0, n, gt);
    __syncthreads();
    int have = s_count; /* < k */
    __syncthreads();
    __shared__ int s_warp[TOPK_THREADS / 32];
    for (long long base = 0; base < n && have < k; base += blockDim.x) {
      const long long j = base + threadIdx.x;
      const bool eq = j < n && keyAt(rowp, j, a.dtype) == T;
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
  __shared__ u64 s_sel[DPS_TOPK_MAX];
  for (int j = threadIdx.x; j < k; j += blockDim.x) s_sel[j] = packKI(KEY_NONE, NO_INDEX);
  __syncthreads();
  if (count <= TOPK_THREADS) {
    if (threadIdx.x < count) {
      const u64 me = s_cand[threadIdx.x];
      int above = 0;
      for (int j = 0; j < count; ++j) above += s_cand[j] > me;
      if (above < k) s_sel[above] = me;
    }
  } else {
    int m = 1;
    while (m < count) m <<= 1;
    for (int i = count + threadIdx.x; i < m; i += blockDim.x) s_cand[i] = packKI(KEY_NONE, NO_INDEX);
    bitonicDesc(s_cand, m);
    for (int j = threadIdx.x; j < k; j += blockDim.x) s_sel[j] = s_cand[j];
  }
  __syncthreads();

  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const u64 p = s_sel[j];
    const uint32_t key = packedKey(p), idx = packedIdx(p);
    const float v = key == KEY_NONE ? -INFINITY : keyValue(key);
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
    const int src = i / k, j = i % k;
    const u64 me = L[i];
    long long place = j;
    for (int o = 0; o < tp; ++o) {
      if (o == src) continue;
      /* entries of list o better than me; equal packs (fillers) break by rank */
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
    if (place < k) {
      const uint32_t key = packedKey(me);
      a.out.index[row * k + place] = (int64_t)packedIdx(me);
      if (a.out.value)
        storeValue(a.out.value, row * k + place, key == KEY_NONE ? -INFINITY : keyValue(key),
                   a.dtype);
    }
  }
}

}  // namespace

extern "C" cudaError_t dpsLaunchArgmaxLocal(const dpsSelLocalArgs* a, cudaStream_t stream) {
  const long long blocks = a->rows * (long long)a->chunks;
  if (a->want_lse)
    return dpsLaunch(argmaxLocalKernel<true>, dim3((unsigned)blocks), dim3(ARGMAX_THREADS), stream,
                     a->pdl, *a);
  return dpsLaunch(argmaxLocalKernel<false>, dim3((unsigned)blocks), dim3(ARGMAX_THREADS), stream,
                   a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchTopkLocal(const dpsSelLocalArgs* a, cudaStream_t stream) {
  return dpsLaunch(topkLocalKernel, dim3((unsigned)a->rows), dim3(TOPK_THREADS), stream, a->pdl,
                   *a);
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
