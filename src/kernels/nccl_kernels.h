/* Launchers of the nccl backend's kernels (swap_permute.cu, verify_pack.cu).
 * Plain C prototypes; every launcher only enqueues on `stream` and returns the
 * launch's own status; pdl != 0 launches with programmatic dependent launch
 * (the kernels wait for the previous one first: kernels/device.cuh). */
#ifndef DPS_NCCL_KERNELS_H_
#define DPS_NCCL_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Swap permute. For every output row (0 <= row < rows) and source rank s:
 *   out[row][s*v_local + c] = src_s[row][c]      (0 <= c < v_local)
 * where src_s = self_in        (rows contiguous rows of v_local) when s == self_rank,
 *       src_s = staging + s*chunk_bytes          otherwise.
 * Pass self_rank = -1 to take every chunk (including the caller's) from staging.
 * Element size esize in bytes (2 or 4); picks 16/8/4/2-byte vectors from the
 * alignment of every pointer and row pitch. */
cudaError_t dpsLaunchSwapPermute(void* out, const void* staging, size_t chunk_bytes,
                                 const void* self_in, int self_rank, int tp, int64_t rows,
                                 int64_t v_local, size_t esize, cudaStream_t stream,
                                 int pdl);

/* Packs int32 predict [reqs*n], accept_index [reqs*n], accept_length [reqs]
 * into packed [reqs*(2n+1)] in that order. */
cudaError_t dpsLaunchVerifyPack(int32_t* packed, const int32_t* predict,
                                const int32_t* accept_index, const int32_t* accept_length,
                                int reqs, int n, cudaStream_t stream, int pdl);

/* Unpacks the all-gathered [tp][reqs*(2n+1)] into predict_out / accept_index_out
 * [tp*reqs, n] and accept_length_out [tp*reqs]; rank src's row r lands at
 * src*reqs + r. */
cudaError_t dpsLaunchVerifyUnpack(int32_t* predict_out, int32_t* accept_index_out,
                                  int32_t* accept_length_out, const int32_t* gathered,
                                  int tp, int reqs, int n, cudaStream_t stream, int pdl);

/* Copies up to three int32 segments in one launch: out[k][j] = in[k][j] for
 * j < count[k] (count 0: segment unused). The nccl backend's gathers at
 * tp == 1, where the all-gather of one rank is a copy. */
cudaError_t dpsLaunchCopySegments(int32_t* const out[3], const int32_t* const in[3],
                                  const int64_t count[3], cudaStream_t stream,
                                  int pdl);
/* Load the kernels now (see dpsPreload in kernels/device.cuh). */
cudaError_t dpsPreloadSwapPermute(void);
cudaError_t dpsPreloadVerifyPack(void);

#ifdef __cplusplus
}
#endif

#endif /* DPS_NCCL_KERNELS_H_ */
