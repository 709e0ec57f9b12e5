/* Peer-bandwidth kernel of dps-perf: the machine's SM store peak over the
 * link, against which the operations' efficiency is reported. */
#include <cuda_runtime.h>

#include "dps_perf.h"

__global__ void __launch_bounds__(1024) dpPeerStoreKernel(int4* __restrict__ dst, size_t n16,
                                                          int tag) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int4 v = make_int4(tag, (int)i, tag ^ 0x5a5a5a5a, 0x01020304);
  /* 4 independent stores in flight per thread per iteration. */
  for (; i + 3 * stride < n16; i += 4 * stride) {
    dst[i] = v;
    dst[i + stride] = v;
    dst[i + 2 * stride] = v;
    dst[i + 3 * stride] = v;
  }
  for (; i < n16; i += stride) dst[i] = v;
}

extern "C" cudaError_t dpLaunchPeerStore(void* dst, size_t bytes, int blocks, int threads,
                                         int tag, cudaStream_t stream) {
  if (blocks < 1 || threads < 32 || threads > 1024 || (bytes % 16) != 0)
    return cudaErrorInvalidValue;
  dpPeerStoreKernel<<<blocks, threads, 0, stream>>>((int4*)dst, bytes / 16, tag);
  return cudaGetLastError();
}

/* HBM read peak: every thread reads int4 (4 in flight) and folds them into
 * one word, written only when it matches `tag` (never, in practice), so the
 * loads cannot be dropped. */
__global__ void __launch_bounds__(1024) dpReadKernel(const int4* __restrict__ src, size_t n16,
                                                     int tag, int* sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  int acc = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const int4 a = __ldg(src + i), b = __ldg(src + i + stride), c = __ldg(src + i + 2 * stride),
               d = __ldg(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const int4 a = __ldg(src + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == tag) *sink = acc;
}

extern "C" cudaError_t dpLaunchRead(const void* src, size_t bytes, int blocks, int threads,
                                    int* sink, cudaStream_t stream) {
  if (blocks < 1 || threads < 32 || threads > 1024 || (bytes % 16) != 0)
    return cudaErrorInvalidValue;
  dpReadKernel<<<blocks, threads, 0, stream>>>((const int4*)src, bytes / 16, 0x7f3a91c5, sink);
  return cudaGetLastError();
}
