/* A kernel that holds a stream for a while (test_gpu_virtual_ranks: the
 * delayed rank). One block of one warp; spins on the global timer. */
#include <cuda_runtime.h>

#include "spin.cuh"

__global__ void vrSpinKernel(unsigned long long ns) { gtSpinNs(ns); }

/* Enqueues the spin on `stream`; returns the launch's own status. */
extern "C" cudaError_t vrLaunchSpin(unsigned long long ns, cudaStream_t stream) {
  void* args[] = {&ns};
  return cudaLaunchKernel((const void*)vrSpinKernel, dim3(1), dim3(32), args, 0, stream);
}

/* Loads the kernel now (lazy module loading would load it at its first
 * launch, possibly while the other ranks' kernels occupy the device). */
extern "C" cudaError_t vrPreloadSpin(void) {
  cudaFuncAttributes fa;
  return cudaFuncGetAttributes(&fa, (const void*)vrSpinKernel);
}
