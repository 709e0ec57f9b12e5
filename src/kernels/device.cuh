/* The device header shared by every kernel file of the library (the one
 * place of device code that more than one .cu file uses; the shard
 * reductions' own pieces are kernels/shard_reduce.cuh):
 *
 *  - kernel launch: dpsLaunch() enqueues with cudaLaunchKernelEx and returns
 *    that launch's own status. (A <<<>>> launch followed by
 *    cudaGetLastError() would also return, and clear, an error some
 *    unrelated earlier call of the application left behind.) pdl != 0 adds
 *    cudaLaunchAttributeProgrammaticStreamSerialization: programmatic
 *    dependent launch (sm_90+), so that the launch and block scheduling of
 *    this kernel overlap the tail of the previous kernel on the stream;
 *    graph capture keeps it as a programmatic edge. A kernel launched that
 *    way must call dpsPdlWait() before it touches memory that earlier work
 *    on the stream writes or reads.
 *  - the peer transport's device side (namespace dpsos, types in
 *    kernels/records.h): system-scope loads and stores, LL lines and their
 *    flags, timed waits that record the first failure, and the epochs. Used
 *    by the onesided kernels and by the records steps of the shard
 *    reductions. The protocol: docs/design.md, "The onesided protocol". */
#ifndef DPS_DEVICE_CUH_
#define DPS_DEVICE_CUH_

#include <cuda_runtime.h>

#include "kernels/records.h"

/* Returns once every preceding kernel of the stream has completed and its
 * writes are visible; a no-op for a kernel not launched with PDL. */
__device__ __forceinline__ void dpsPdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next PDL-launched kernel of the stream be scheduled (it still
 * waits in its own dpsPdlWait() until this kernel has completed). Issued
 * after dpsPdlWait() so that at most one dependent grid waits behind us. */
__device__ __forceinline__ void dpsPdlRelease() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---- thread-block clusters (sm_90+; a kernel launched with cluster 1 never
 * calls these but dpsClusterArriveStarted / dpsClusterWaitStarted) ------------- */
/* The address of `p` (this block's shared memory) in block `rank` of the cluster. */
template <typename T>
__device__ __forceinline__ T* dpsClusterMap(T* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return reinterpret_cast<T*>(__cluster_map_shared_rank(p, rank));
#else
  return p;
#endif
}
template <typename T>
__device__ __forceinline__ T* dpsClusterLeader(T* p) {
  return dpsClusterMap(p, 0u);
}

/* Distributed shared memory may be touched only once every block of the
 * cluster has started: each thread arrives (relaxed, not waiting) when its
 * kernel starts, and waits before its first access to another block. */
__device__ __forceinline__ void dpsClusterArriveStarted() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive_relaxed();
#endif
}
__device__ __forceinline__ void dpsClusterWaitStarted() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_wait();
#endif
}

/* Every thread of every block of the cluster: stores before it (to any
 * block's shared memory) are visible to every block after it. */
__device__ __forceinline__ void dpsClusterBarrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive(); /* release */
  __cluster_barrier_wait();   /* acquire */
#else
  __trap(); /* never launched in clusters there (the hosts' occupancy queries find none) */
#endif
}

/* Whether `kernel` can run in clusters on the current device: the device
 * launches clusters and the kernel's code is sm_90+ (the cluster code exists
 * in such device code only; PTX for an older architecture, JIT-compiled
 * here, reports the device's binary version but has no cluster code). */
static inline cudaError_t dpsClustersUsable(const void* kernel, int* yes) {
  int dev = 0, cl = 0;
  cudaFuncAttributes fa;
  *yes = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kernel);
  if (e == cudaSuccess) *yes = cl && fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
  return e;
}

/* Clusters of `cluster` blocks of `threads` of `kernel` resident at once
 * (cudaOccupancyMaxActiveClusters for a 1-D grid of `grid` blocks). */
static inline cudaError_t dpsMaxActiveClusters(const void* kernel, unsigned grid, unsigned threads,
                                               unsigned cluster, int* n) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  *n = 0;
  return cudaOccupancyMaxActiveClusters(n, kernel, &cfg);
}

/* cluster > 1: blocks [c * cluster, (c + 1) * cluster) of the 1-D grid form
 * one thread-block cluster (sm_90+; grid.x a multiple of cluster). */
template <typename... KArgs, typename... Args>
static inline cudaError_t dpsLaunchCluster(void (*kernel)(KArgs...), dim3 grid, dim3 threads,
                                           unsigned cluster, cudaStream_t stream, int pdl,
                                           Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t dpsLaunch(void (*kernel)(KArgs...), dim3 grid, dim3 threads,
                                    cudaStream_t stream, int pdl, Args&&... args) {
  return dpsLaunchCluster(kernel, grid, threads, 1u, stream, pdl, static_cast<Args&&>(args)...);
}

/* After one of our CUDA calls failed and the failure was returned to the
 * caller: clear the runtime's last-error state, unless an error of the
 * application was already pending (`before`), so that the application's next
 * launch check does not blame an unrelated kernel for ours. */
static inline void dpsForgetOwnError(cudaError_t before) {
  if (before == cudaSuccess) (void)cudaGetLastError();
}

/* cudaFuncGetAttributes (which loads the kernel into the current device's
 * context), leaving no error of ours in the runtime's last-error state. */
static inline cudaError_t dpsKernelAttributes(const void* kernel, cudaFuncAttributes* fa) {
  const cudaError_t before = cudaPeekAtLastError();
  const cudaError_t e = cudaFuncGetAttributes(fa, kernel);
  if (e != cudaSuccess) dpsForgetOwnError(before);
  return e;
}

/* Loads the given kernels into the current device's context now. With CUDA's
 * lazy module loading a kernel is otherwise loaded at its first launch, and
 * that load may have to wait while kernels of ours spin for a peer. */
static inline cudaError_t dpsPreload(const void* const* kernels, int count) {
  for (int i = 0; i < count; ++i) {
    cudaFuncAttributes fa;
    const cudaError_t e = dpsKernelAttributes(kernels[i], &fa);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}


/* ---- the peer transport (onesided kernels, LL records) ---------------------- */
namespace dpsos {

typedef unsigned long long u64;

__device__ __forceinline__ u64 ldAcquireSys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseSys(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ldVolatile(const u64* p) { return *(const volatile u64*)p; }
__device__ __forceinline__ u64 globalTimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* LL line: two 8-byte {data, flag} words; each 8-byte half is single-copy
 * atomic, so a reader that sees both flags sees both data words. */
__device__ __forceinline__ void stLine(char* p, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag),
               "r"(d1), "r"(flag)
               : "memory");
}
/* One 16-byte slice of an LL128 line (a warp stores 4 lines at once). */
__device__ __forceinline__ void stV4(char* p, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w0), "r"(w1),
               "r"(w2), "r"(w3)
               : "memory");
}
__device__ __forceinline__ uint4 ldLine(const char* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
/* Flag of epoch e in LL words: never 0 (fresh staging is zeroed). A stale
 * line of the same parity is at least 2 epochs old, so it can only alias
 * after ~2^32 calls of one operation in which that line was never rewritten. */
__device__ __forceinline__ uint32_t llFlag(u64 e) { return (uint32_t)(e % 0xffffffffull) + 1u; }

__device__ __forceinline__ u64 udiv(u64 a, u64 b) {
  if (((a | b) >> 32) == 0) return (uint32_t)a / (uint32_t)b;
  return a / b;
}

__device__ __forceinline__ void recordError(const dpsPeerCommon& c, int op, int peer, int wait) {
  u64 w = DPS_PEER_ERR_SET | ((u64)(unsigned)wait << 40) | ((u64)(unsigned)op << 32) |
          (u64)((unsigned)peer & 0xffffu);
  if (atomicCAS(&c.state->err, 0ull, w) == 0ull) {
    *(volatile u64*)c.host_err = w;
    for (int p = 0; p < c.tp; ++p)
      if (p != c.rank) *(volatile u64*)(c.fail_peer[p] + c.rank) = w;
    __threadfence_system();
  }
}

/* Polled from spin loops: true when the loop must give up (another block or
 * a peer failed, or this wait ran past the timeout; the cause is recorded). */
__device__ __forceinline__ bool spinExpired(const dpsPeerCommon& c, u64 t0, int op, int peer,
                                            int wait) {
  if (ldVolatile(&c.state->err) != 0) return true;
  for (int p = 0; p < c.tp; ++p) {
    if (p != c.rank && ldVolatile(c.fail + p) != 0) {
      recordError(c, op, p, DPS_PEER_WAIT_PEER_FAILED);
      return true;
    }
  }
  if (globalTimer() - t0 > c.timeout_ns) {
    recordError(c, op, peer, wait);
    return true;
  }
  return false;
}

/* One thread: waits until *f >= e. false on timeout / error. */
__device__ __forceinline__ bool waitFlagGe(const u64* f, u64 e, const dpsPeerCommon& c, u64 t0,
                                           int op, int peer, int wait) {
  unsigned n = 0;
  while (ldAcquireSys(f) < e) {
    if ((++n & 127u) == 0 && spinExpired(c, t0, op, peer, wait)) return false;
  }
  return true;
}

/* Kernel prologue: the epoch this kernel works on, or 0 if the communicator
 * already failed (then the whole block returns at once). Block-uniform. */
__device__ __forceinline__ u64 beginEpoch(const dpsPeerCommon& c, int op) {
  __shared__ u64 s_epoch;
  if (threadIdx.x == 0) {
    const u64 err = ldVolatile(&c.state->err), ep = ldVolatile(&c.state->epoch[op]);
    s_epoch = err != 0 ? 0ull : ep + 1ull;
  }
  __syncthreads();
  return s_epoch;
}

/* Gathers: claims block b's next epoch (see DPS_PEER_GATHER_MAX_BLOCKS), or
 * returns 0 if the communicator already failed. Block-uniform.
 *
 * Called BEFORE dpsPdlWait(), so that its latency hides behind the previous
 * kernel's tail: the claim is an atomic increment at L2, and the kernel only
 * lets its dependent launch (dpsPdlReleaseFromClaimer) after its thread 0
 * has made its own claim, so a claim always follows the previous kernel's
 * claim, even while that kernel still runs. Nothing else on the gather path
 * may be read before the wait except kernel parameters. A stale `err` here
 * costs nothing: the spin loops re-read it. */
__device__ __forceinline__ u64 claimBlockEpoch(const dpsPeerCommon& c, int op) {
  __shared__ u64 s_epoch;
  if (threadIdx.x == 0) {
    u64 e = 0ull;
    if (ldVolatile(&c.state->err) == 0ull)
      e = atomicAdd(&c.state->block_epoch[op - DPS_PEER_OP_GATHER_OUTPUTS][blockIdx.x], 1ull) + 1ull;
    s_epoch = e;
  }
  __syncthreads();
  return s_epoch;
}

/* The trigger of a kernel that claimed with claimBlockEpoch(): issued by
 * thread 0 alone (the first trigger of any thread counts for the whole
 * block), after dpsPdlWait() and after its own claim. */
__device__ __forceinline__ void dpsPdlReleaseFromClaimer() {
  if (threadIdx.x == 0) dpsPdlRelease();
}

/* Kernel epilogue: the last block to finish publishes the epoch. */
__device__ __forceinline__ void finishEpoch(const dpsPeerCommon& c, int op, u64 e) {
  __syncthreads();
  if (threadIdx.x == 0 && gridDim.x == 1) {
    *(volatile u64*)&c.state->epoch[op] = e; /* visible to the next kernel */
  } else if (threadIdx.x == 0) {
    __threadfence();
    unsigned t = atomicAdd(&c.state->ticket[op], 1u);
    if (t == gridDim.x - 1) {
      c.state->ticket[op] = 0;
      *(volatile u64*)&c.state->epoch[op] = e;
      __threadfence();
    }
  }
}

}  // namespace dpsos
/* The epoch of the records a merge reads: 1 for plain records; LL: the one
 * the local kernel published before it on the stream, 0 when the
 * communicator failed (the merge then writes nothing). */
__device__ __forceinline__ unsigned long long dpsRecMergeEpoch(const dpsRecSource& s) {
  if (!s.ll) return 1;
  if (dpsos::ldVolatile(&s.c.state->err) != 0) return 0;
  return dpsos::ldVolatile(&s.c.state->epoch[s.op]);
}

#endif /* DPS_DEVICE_CUH_ */
