/* A kernel that writes an operation's inputs late but lets the next kernel
 * launch at once (test_gpu_stream_order): it issues
 * griddepcontrol.launch_dependents first, as a kernel of an engine built for
 * programmatic dependent launch may, then holds the stream for `ns`
 * nanoseconds, then copies `words` 32-bit words from src to dst. A kernel
 * launched with PDL right after it is scheduled while it spins and must wait
 * (griddepcontrol.wait) before reading dst. One block. */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "spin.cuh"

__global__ void earlyWriterKernel(uint32_t* dst, const uint32_t* src, size_t words,
                                  unsigned long long ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (threadIdx.x == 0) gtSpinNs(ns);
  __syncthreads();
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

/* Enqueues the writer on `stream` (a plain launch); returns its own status. */
extern "C" cudaError_t gtLaunchEarlyWriter(void* dst, const void* src, size_t bytes,
                                           unsigned long long ns, cudaStream_t stream) {
  uint32_t* d = (uint32_t*)dst;
  const uint32_t* s = (const uint32_t*)src;
  size_t words = bytes / 4;
  void* args[] = {&d, &s, &words, &ns};
  return cudaLaunchKernel((const void*)earlyWriterKernel, dim3(1), dim3(256), args, 0, stream);
}
