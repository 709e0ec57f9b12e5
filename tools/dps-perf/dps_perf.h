/* dps-perf internals: the peer-bandwidth kernels (peak.cu) called from C. */
#ifndef DPS_PERF_H_
#define DPS_PERF_H_

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stores int4 values over [dst, dst+bytes) (bytes a multiple of 16) with a
 * grid-stride loop: with dst a peer's buffer (cudaIpcOpenMemHandle) this is a
 * pure NVLink store stream, no loads. */
cudaError_t dpLaunchPeerStore(void* dst, size_t bytes, int blocks, int threads, int tag,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DPS_PERF_H_ */
