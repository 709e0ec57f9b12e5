/* Pack / unpack of the verify outputs around the single all-gather of the nccl
 * backend. Packed per rank as int32: predict [reqs*n], accept_index [reqs*n],
 * accept_length [reqs] (core/layout.h, dpsShape.packed). At tp == 1 the
 * gathers are plain copies: one copy kernel of up to three segments. */
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/device.cuh"
#include "kernels/nccl_kernels.h"

namespace {

constexpr int kThreads = 256;

__global__ void verifyPackKernel(int32_t* __restrict__ packed, const int32_t* __restrict__ predict,
                                 const int32_t* __restrict__ accept_index,
                                 const int32_t* __restrict__ accept_length, int64_t rn,
                                 int64_t total) {
  dpsPdlWait();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int32_t v;
    if (i < rn)
      v = predict[i];
    else if (i < 2 * rn)
      v = accept_index[i - rn];
    else
      v = accept_length[i - 2 * rn];
    packed[i] = v;
  }
}

__global__ void verifyUnpackKernel(int32_t* __restrict__ predict_out,
                                   int32_t* __restrict__ accept_index_out,
                                   int32_t* __restrict__ accept_length_out,
                                   const int32_t* __restrict__ gathered, int reqs, int64_t rn,
                                   int64_t packed, int64_t total) {
  dpsPdlWait();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t src = i / packed;
    const int64_t j = i - src * packed;
    const int32_t v = gathered[i];
    if (j < rn)
      predict_out[src * rn + j] = v;
    else if (j < 2 * rn)
      accept_index_out[src * rn + (j - rn)] = v;
    else
      accept_length_out[src * reqs + (j - 2 * rn)] = v;
  }
}

/* Up to three int32 segments in one launch: out_s[j] = in_s[j], j < count_s;
 * element i of the grid-stride loop is segment 0's first, then 1's, then
 * 2's. No __restrict__: an input may be its own output (a no-op copy, as
 * NCCL's all-gather at one rank in place). */
struct CopySegs {
  const int32_t* in[3];
  int32_t* out[3];
  int64_t count[3];
};

__global__ void copySegsKernel(CopySegs s, int64_t total) {
  dpsPdlWait();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i;
    int k = 0;
    while (k < 2 && j >= s.count[k]) j -= s.count[k++];
    s.out[k][j] = s.in[k][j];
  }
}

unsigned gridFor(int64_t total) {
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024; /* grid-stride beyond that */
  return (unsigned)blocks;
}

}  // namespace

extern "C" cudaError_t dpsLaunchVerifyPack(int32_t* packed, const int32_t* predict,
                                           const int32_t* accept_index,
                                           const int32_t* accept_length, int reqs, int n,
                                           cudaStream_t stream, int pdl) {
  const int64_t rn = (int64_t)reqs * n;
  const int64_t total = 2 * rn + reqs;
  if (total <= 0) return cudaSuccess;
  return dpsLaunch(verifyPackKernel, dim3(gridFor(total)), dim3(kThreads), stream, pdl, packed,
                   predict, accept_index, accept_length, rn, total);
}

extern "C" cudaError_t dpsLaunchVerifyUnpack(int32_t* predict_out, int32_t* accept_index_out,
                                             int32_t* accept_length_out,
                                             const int32_t* gathered, int tp, int reqs, int n,
                                             cudaStream_t stream, int pdl) {
  const int64_t rn = (int64_t)reqs * n;
  const int64_t packed = 2 * rn + reqs;
  const int64_t total = packed * tp;
  if (total <= 0) return cudaSuccess;
  return dpsLaunch(verifyUnpackKernel, dim3(gridFor(total)), dim3(kThreads), stream, pdl,
                   predict_out, accept_index_out, accept_length_out, gathered, reqs, rn, packed,
                   total);
}

extern "C" cudaError_t dpsLaunchCopySegments(int32_t* const out[3], const int32_t* const in[3],
                                             const int64_t count[3], cudaStream_t stream,
                                             int pdl) {
  CopySegs s;
  int64_t total = 0;
  for (int k = 0; k < 3; ++k) {
    s.in[k] = in[k];
    s.out[k] = out[k];
    s.count[k] = count[k] > 0 ? count[k] : 0;
    total += s.count[k];
  }
  if (total <= 0) return cudaSuccess;
  return dpsLaunch(copySegsKernel, dim3(gridFor(total)), dim3(kThreads), stream, pdl, s, total);
}

extern "C" cudaError_t dpsPreloadVerifyPack(void) {
  const void* const k[] = {(const void*)verifyPackKernel, (const void*)verifyUnpackKernel,
                           (const void*)copySegsKernel};
  return dpsPreload(k, 3);
}
