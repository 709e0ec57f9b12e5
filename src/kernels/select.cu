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
 * Exchange: the backend's records step (kernels/records.h; docs/design.md,
 * "The records pipeline" and, for the LL lines and epochs, "The onesided
 * protocol"). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "kernels/device.cuh"
#include "kernels/verify_walk.cuh"
#include "kernels/select_kernels.h"
#include "kernels/shard_reduce.cuh"

using namespace dpsos;
using namespace dpsshard;

namespace {

constexpr int ARGMAX_THREADS = 512;
/* resident blocks per SM asked of the compiler (registers: 32 and 64) */
constexpr int ARGMAX_BLOCKS_PER_SM = 4;
constexpr int TOPK_BLOCKS_PER_SM = 2;

/* ---- logsumexp as an online (m, s) pair ------------------------------------- */
struct Lse {
  float m, s;
  __device__ Lse() : m(-INFINITY), s(0.f) {}
  /* C elements (raw: NaN propagates into s) whose non-NaN values are all
   * <= vm (the argmax's running maximum: no maxima of their own); one
   * rescale per call.
   * A term is 2^(v*log2e - m*log2e), the product rounded before the
   * subtraction: the maximum's own term is 2^0 = 1 exactly, with no compare,
   * and a term below 2^-126 is flushed to 0 (ex2.approx.ftz; next to the
   * maximum's 1 it cannot count). For an infinite m the subtrahend is 0
   * instead: m = +inf gives s = +inf (the +inf element's term), m = -inf
   * gives 0 for the -inf elements; value() reads neither (it returns m), and
   * a NaN element makes s NaN either way. FMUL, FADD, MUFU and FADD per
   * element, where the compare and ex2's denormal scaling took eleven. */
  template <int C>
  __device__ __forceinline__ void add(const float (&v)[C], float vm) {
    if (vm > m) {
      s *= fastExp2Ftz((m - vm) * LOG2E); /* m = -inf: 0 */
      m = vm;
    }
    const float mb = fabsf(m) < INFINITY ? __fmul_rn(m, LOG2E) : 0.f;
#pragma unroll
    for (int t = 0; t < C; ++t) s += fastExp2Ftz(__fmul_rn(v[t], LOG2E) - mb);
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
__device__ __forceinline__ void emitWords(const dpsRecSink& k, long long row,
                                          const uint32_t* w, int nwords, uint32_t flag,
                                          int parity) {
  if (k.kind == DPS_REC_PLAIN) {
    for (int i = 0; i < nwords; ++i) k.plain[row * nwords + i] = w[i];
    return;
  }
  const int lines = nwords / 2;
  for (int l = 0; l < lines; ++l) {
    const size_t off = DPS_PEER_LL_OFFSET(parity, k.c.rank, row * lines + l, k.c.tp, k.cap);
    for (int r = 0; r < k.c.tp; ++r) stLine(k.stage_peer.p[r] + off, w[2 * l], w[2 * l + 1], flag);
  }
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
    if (LSE) st.lse.add(v, st.v);
  }
};

template <bool LSE>
__global__ void __launch_bounds__(ARGMAX_THREADS, ARGMAX_BLOCKS_PER_SM)
    argmaxLocalKernel(dpsSelLocalArgs a) {
  const long long row = blockIdx.x / a.chunks;
  const int chunk = (int)(blockIdx.x % a.chunks);
  const bool ll = a.sink.kind == DPS_REC_LL;
  if (a.chunks > 1) dpsClusterArriveStarted();
  dpsPdlWait();
  /* e == 0: the communicator failed earlier; a block of a cluster still
   * takes part in the cluster barriers */
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0 && a.chunks == 1) return;
  ArgVisit<LSE> vis;
  vis.col0 = (uint32_t)a.col0;
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  long long from, to;
  chunkRange(e != 0 ? a.nvalid : 0, a.chunks, chunk, &from, &to);
  /* the logsumexp's registers leave no room for four loads ahead of use
   * (32 a thread): two stages of two instead */
  if (LSE) forEachElemStaged<4>(rowp, a.dtype, from, to, vis);
  else forEachElem(rowp, a.dtype, from, to, vis);
  if (a.early_release) dpsPdlRelease(); /* the dependent may be scheduled (it waits for us) */
  ArgState& st = vis.st;
  blockArgReduce<ARGMAX_THREADS, LSE>(st);

  if (a.chunks > 1) {
    /* every block's partial into block 0, which folds them with one warp */
    __shared__ float4 s_part[DPS_SEL_MAX_CHUNKS];
    dpsClusterWaitStarted();
    if (threadIdx.x == 0)
      *dpsClusterLeader(&s_part[chunk]) = make_float4(st.v, __uint_as_float(st.i), st.lse.m, st.lse.s);
    dpsClusterBarrier();
    if (e == 0) return;
    if (chunk != 0) {
      if (ll) finishEpoch(a.sink.c, a.sink.op, e);
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
    if (a.sink.kind == DPS_REC_NONE) {
      a.out.index[row] = (int64_t)st.i;
      if (a.out.value) storeValue(a.out.value, row, st.v, a.dtype);
      if (a.out.lse) a.out.lse[row] = st.lse.value();
      if (a.out.count_rows && row == 0) atomicAdd(a.out.count_rows, (unsigned long long)a.rows);
    } else {
      const uint32_t w[4] = {__float_as_uint(st.v), st.i, __float_as_uint(st.lse.m),
                             __float_as_uint(st.lse.s)};
      emitWords(a.sink, row, w, 4, llFlag(e), (int)(e & 1));
    }
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
  /* tp == 1 verify (greedy, tokens only): the block of the last row written walks */
  if (a.walk.pad_bs > 0) {
    const long long bad = dpsWalkCheck(a.walk);
    if (dpsWalkArrive(a.walk, 1u, (unsigned)a.rows)) dpsWalkRequests(a.walk, bad);
  }
}

/* ---- top-k local pass ------------------------------------------------------------ */
__global__ void __launch_bounds__(TOPK_THREADS, TOPK_BLOCKS_PER_SM)
    topkLocalKernel(dpsSelLocalArgs a) {
  __shared__ u64 s_sel[DPS_TOPK_MAX];
  __shared__ u64 s_lists[DPS_SEL_MAX_CHUNKS * DPS_TOPK_MAX]; /* block 0: every chunk's list */
  const long long row = blockIdx.x / a.chunks;
  const int chunk = (int)(blockIdx.x % a.chunks);
  const int k = a.k;
  const bool ll = a.sink.kind == DPS_REC_LL;
  if (a.chunks > 1) dpsClusterArriveStarted();
  dpsPdlWait();
  /* e == 0: failed earlier (a block of a cluster still takes part in its barriers) */
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0 && a.chunks == 1) return;
  const int esize = a.dtype == 0 ? 4 : 2;
  const char* rowp = (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
  long long from, to;
  chunkRange(e != 0 ? a.nvalid : 0, a.chunks, chunk, &from, &to);
  topkRange(a.k, a.dtype, a.col0, rowp, from, to, s_sel, a.tiled != 0);
  if (a.early_release) dpsPdlRelease(); /* the dependent may be scheduled (it waits for us) */

  if (a.chunks > 1) {
    /* every chunk's list into block 0, which merges them (chunks are
     * disjoint column ranges: only fillers compare equal) */
    dpsClusterWaitStarted();
    u64* lists = dpsClusterLeader(s_lists) + chunk * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) lists[j] = s_sel[j];
    dpsClusterBarrier();
    if (e == 0) return;
    if (chunk != 0) {
      if (ll) finishEpoch(a.sink.c, a.sink.op, e);
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
    if (a.sink.kind == DPS_REC_NONE) {
      a.out.index[row * k + j] = (int64_t)idx;
      if (a.out.value) storeValue(a.out.value, row * k + j, v, a.dtype);
    } else if (a.sink.kind == DPS_REC_PLAIN) {
      a.sink.plain[(row * k + j) * 2] = __float_as_uint(v);
      a.sink.plain[(row * k + j) * 2 + 1] = idx;
    } else {
      const dpsRecSink& sk = a.sink;
      const size_t off = DPS_PEER_LL_OFFSET((int)(e & 1), sk.c.rank, row * k + j, sk.c.tp, sk.cap);
      const uint32_t flag = llFlag(e);
      for (int r = 0; r < sk.c.tp; ++r) stLine(sk.stage_peer.p[r] + off, __float_as_uint(v), idx, flag);
    }
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
}

/* ---- merge --------------------------------------------------------------------- */
/* Words (w0, w1) of line `line` from rank src: plain, or LL with a wait.
 * false when the wait gave up (the cause is recorded). */
__device__ __forceinline__ bool fetchPair(const dpsSelMergeArgs& a, int src, long long line,
                                          int words_per_row, uint32_t flag, int parity, u64 t0,
                                          uint32_t* w0, uint32_t* w1) {
  const dpsRecSource& s = a.src;
  if (!s.ll) {
    const uint32_t* p = s.gathered + ((size_t)src * (size_t)a.rows * words_per_row) + line * 2;
    *w0 = p[0];
    *w1 = p[1];
    return true;
  }
  const char* pl = s.stage + DPS_PEER_LL_OFFSET(parity, src, line, s.c.tp, s.cap);
  unsigned n = 0;
  uint4 v = ldLine(pl);
  while (v.y != flag || v.w != flag) {
    if ((++n & 127u) == 0 && spinExpired(s.c, t0, s.op, src, DPS_PEER_WAIT_DATA)) return false;
    v = ldLine(pl);
  }
  *w0 = v.x;
  *w1 = v.z;
  return true;
}

/* One thread per row. */
__global__ void argmaxMergeKernel(dpsSelMergeArgs a) {
  dpsPdlWait();
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 e = dpsRecMergeEpoch(a.src);
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
  if (a.out.count_rows && row == 0) atomicAdd(a.out.count_rows, (unsigned long long)a.rows);
}

/* One warp per row: every rank's list (sorted) goes to shared memory, then
 * each candidate's place in the merged order is its place in its own list
 * plus, for every other list, how many of that list's entries beat it
 * (binary search); places below k are written out. */
constexpr int MERGE_WARPS = 4;
__global__ void __launch_bounds__(MERGE_WARPS * 32) topkMergeKernel(dpsSelMergeArgs a) {
  __shared__ u64 s_list[MERGE_WARPS][DPS_PEER_MAX_RANKS * DPS_TOPK_MAX];
  dpsPdlWait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * MERGE_WARPS + warp;
  const u64 e = dpsRecMergeEpoch(a.src);
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

extern "C" cudaError_t dpsKernelsSupportPdl(int* yes) {
  cudaFuncAttributes fa;
  const cudaError_t e = dpsKernelAttributes((const void*)argmaxMergeKernel, &fa);
  /* the PTX the device code came from, not the GPU */
  *yes = e == cudaSuccess && fa.ptxVersion >= 90;
  return e;
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
    e = dpsMaxActiveClusters((const void*)kernel, (unsigned)(c * sms * per_sm), threads,
                             (unsigned)c, &rows[c]);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

extern "C" cudaError_t dpsSelectWaves(dpsSelWaves* w) {
  const cudaError_t before = cudaPeekAtLastError();
  int dev = 0, clusters = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&w->sms, cudaDevAttrMultiProcessorCount, dev);
  /* the L2 decides only the tiled collections: unknown (0) means none, not
   * a failed table */
  int l2 = 0;
  if (e == cudaSuccess && cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    l2 = 0;
    dpsForgetOwnError(before);
  }
  w->l2_bytes = l2;
  if (e == cudaSuccess) e = dpsClustersUsable((const void*)topkLocalKernel, &clusters);
  if (e == cudaSuccess)
    e = wavesOf(argmaxLocalKernel<false>, ARGMAX_THREADS, w->sms, clusters, w->rows[0]);
  if (e == cudaSuccess) e = wavesOf(topkLocalKernel, TOPK_THREADS, w->sms, clusters, w->rows[1]);
  if (e != cudaSuccess) dpsForgetOwnError(before);
  return e;
}
