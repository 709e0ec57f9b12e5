/* Swap permute of the nccl backend: one pass that assembles the swap output
 * [rows, tp*v_local] from tp source blocks [rows, v_local] (the all-to-all
 * staging chunks, and the caller's own block read straight from its input).
 *
 * The copy is 2D: blockIdx.y walks (row, source) segments, blockIdx.x tiles of
 * one segment. Each segment is a contiguous run of v_local elements on both
 * sides, so there is no per-element division; a thread moves UNROLL vectors of
 * the widest width (16/8/4/2 bytes) that every pointer and pitch allows, all
 * loads before all stores. */
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/device.cuh"
#include "kernels/nccl_kernels.h"

namespace {

constexpr int kUnroll = 4;
constexpr int kMaxThreads = 256;
constexpr unsigned kMaxGridY = 65535u;

template <typename V>
__global__ void __launch_bounds__(kMaxThreads)
    swapPermuteKernel(V* __restrict__ out, const char* __restrict__ staging,
                      size_t chunk_bytes, const V* __restrict__ self_in, int self_rank, int tp,
                      int64_t segments, int64_t seg_vecs, int64_t tiles_per_seg) {
  dpsPdlWait();
  const int64_t tile_vecs = (int64_t)blockDim.x * kUnroll;
  for (int64_t seg = blockIdx.y; seg < segments; seg += gridDim.y) {
    const int64_t row = seg / tp;
    const int s = (int)(seg - row * tp);
    const V* src;
    if (s == self_rank) {
      src = self_in + row * seg_vecs;
    } else {
      src = reinterpret_cast<const V*>(staging + (size_t)s * chunk_bytes) + row * seg_vecs;
    }
    V* dst = out + seg * seg_vecs; /* == out + row*(tp*seg_vecs) + s*seg_vecs */
    for (int64_t tile = blockIdx.x; tile < tiles_per_seg; tile += gridDim.x) {
      const int64_t base = tile * tile_vecs + threadIdx.x;
      V v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + (int64_t)u * blockDim.x;
        if (i < seg_vecs) v[u] = __ldcs(src + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + (int64_t)u * blockDim.x;
        if (i < seg_vecs) dst[i] = v[u];
      }
    }
  }
}

template <typename V>
cudaError_t launchPermute(void* out, const void* staging, size_t chunk_bytes, const void* self_in,
                          int self_rank, int tp, int64_t rows, int64_t seg_bytes,
                          cudaStream_t stream, int pdl) {
  const int64_t seg_vecs = seg_bytes / (int64_t)sizeof(V);
  const int64_t segments = rows * tp;
  /* Threads: enough to cover a segment with kUnroll vectors each, rounded to a
   * warp, at most kMaxThreads (small vocab slices do not waste idle warps). */
  int64_t want = (seg_vecs + kUnroll - 1) / kUnroll;
  int threads = (int)(want >= kMaxThreads ? kMaxThreads : ((want + 31) / 32) * 32);
  if (threads < 32) threads = 32;
  const int64_t tile_vecs = (int64_t)threads * kUnroll;
  const int64_t tiles = (seg_vecs + tile_vecs - 1) / tile_vecs;
  dim3 grid((unsigned)(tiles < 0x7fffffffLL ? tiles : 0x7fffffffLL),
            (unsigned)(segments < (int64_t)kMaxGridY ? segments : (int64_t)kMaxGridY), 1);
  return dpsLaunch(swapPermuteKernel<V>, grid, dim3((unsigned)threads), stream, pdl,
                   static_cast<V*>(out), static_cast<const char*>(staging), chunk_bytes,
                   static_cast<const V*>(self_in), self_rank, tp, segments, seg_vecs, tiles);
}

}  // namespace

extern "C" cudaError_t dpsLaunchSwapPermute(void* out, const void* staging, size_t chunk_bytes,
                                            const void* self_in, int self_rank, int tp,
                                            int64_t rows, int64_t v_local, size_t esize,
                                            cudaStream_t stream, int pdl) {
  if (rows <= 0 || v_local <= 0 || tp <= 0) return cudaSuccess;
  const int64_t seg_bytes = v_local * (int64_t)esize;
  /* Every address the kernel forms is one of these plus multiples of them. */
  uintptr_t bits = (uintptr_t)out | (uintptr_t)staging | (uintptr_t)chunk_bytes |
                   (uintptr_t)seg_bytes;
  if (self_rank >= 0) bits |= (uintptr_t)self_in;
  if ((bits & 15u) == 0)
    return launchPermute<uint4>(out, staging, chunk_bytes, self_in, self_rank, tp, rows,
                                seg_bytes, stream, pdl);
  if ((bits & 7u) == 0)
    return launchPermute<uint2>(out, staging, chunk_bytes, self_in, self_rank, tp, rows,
                                seg_bytes, stream, pdl);
  if ((bits & 3u) == 0)
    return launchPermute<unsigned int>(out, staging, chunk_bytes, self_in, self_rank, tp, rows,
                                       seg_bytes, stream, pdl);
  if ((bits & 1u) == 0)
    return launchPermute<unsigned short>(out, staging, chunk_bytes, self_in, self_rank, tp,
                                         rows, seg_bytes, stream, pdl);
  return launchPermute<unsigned char>(out, staging, chunk_bytes, self_in, self_rank, tp, rows,
                                      seg_bytes, stream, pdl);
}

extern "C" cudaError_t dpsPreloadSwapPermute(void) {
  const void* const k[] = {
      (const void*)swapPermuteKernel<uint4>, (const void*)swapPermuteKernel<uint2>,
      (const void*)swapPermuteKernel<unsigned int>, (const void*)swapPermuteKernel<unsigned short>,
      (const void*)swapPermuteKernel<unsigned char>};
  return dpsPreload(k, (int)(sizeof k / sizeof k[0]));
}
