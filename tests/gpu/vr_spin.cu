/* test_gpu_virtual_ranks' own kernels: one that holds a stream for a while
 * (the delayed rank; spins on the global timer), and the rendezvous that
 * shows the ranks' streams run at once. One block of one warp each. */
#include <cuda_runtime.h>

#include "spin.cuh"

__global__ void vrSpinKernel(unsigned long long ns) { gtSpinNs(ns); }

/* Enqueues the spin on `stream`; returns the launch's own status. */
extern "C" cudaError_t vrLaunchSpin(unsigned long long ns, cudaStream_t stream) {
  void* args[] = {&ns};
  return cudaLaunchKernel((const void*)vrSpinKernel, dim3(1), dim3(32), args, 0, stream);
}

/* Every launch of the rendezvous (one per stream) counts itself in, then
 * waits until all `n` have, or until `timeout_ns` passes; ok[0] stays 1
 * only if every launch saw all n. A launch queued behind another in one
 * hardware queue cannot start while that one waits: the count stays short. */
__global__ void vrRendezvousKernel(unsigned* count, int* ok, unsigned n,
                                   unsigned long long timeout_ns) {
  if (threadIdx.x != 0) return;
  atomicAdd(count, 1u);
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    if (*(volatile unsigned*)count >= n) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < timeout_ns);
  *(volatile int*)ok = 0;
}

extern "C" cudaError_t vrLaunchRendezvous(unsigned* count, int* ok, unsigned n,
                                          unsigned long long timeout_ns, cudaStream_t stream) {
  void* args[] = {&count, &ok, &n, &timeout_ns};
  return cudaLaunchKernel((const void*)vrRendezvousKernel, dim3(1), dim3(32), args, 0, stream);
}

/* Loads the kernels now (lazy module loading would load them at their first
 * launch, possibly while the other ranks' kernels occupy the device). */
extern "C" cudaError_t vrPreloadKernels(void) {
  cudaFuncAttributes fa;
  const cudaError_t e = cudaFuncGetAttributes(&fa, (const void*)vrSpinKernel);
  return e == cudaSuccess ? cudaFuncGetAttributes(&fa, (const void*)vrRendezvousKernel) : e;
}
