/* Kernel launch shared by every .cu file of the library.
 *
 * dpsLaunch() enqueues with cudaLaunchKernelEx and returns that launch's own
 * status. (A <<<>>> launch followed by cudaGetLastError() would also return,
 * and clear, an error some unrelated earlier call of the application left
 * behind.)
 *
 * pdl != 0 adds cudaLaunchAttributeProgrammaticStreamSerialization:
 * programmatic dependent launch (sm_90+), so that the launch and block
 * scheduling of this kernel overlap the tail of the previous kernel on the
 * stream; graph capture keeps it as a programmatic edge. A kernel launched
 * that way must call dpsPdlWait() before it touches memory that earlier work
 * on the stream writes or reads. */
#ifndef DPS_LAUNCH_CUH_
#define DPS_LAUNCH_CUH_

#include <cuda_runtime.h>

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

/* Loads the given kernels into the current device's context now. With CUDA's
 * lazy module loading a kernel is otherwise loaded at its first launch, and
 * that load may have to wait while kernels of ours spin for a peer. */
static inline cudaError_t dpsPreload(const void* const* kernels, int count) {
  const cudaError_t before = cudaPeekAtLastError();
  for (int i = 0; i < count; ++i) {
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, kernels[i]);
    if (e != cudaSuccess) {
      dpsForgetOwnError(before);
      return e;
    }
  }
  return cudaSuccess;
}

#endif /* DPS_LAUNCH_CUH_ */
