/* The onesided backend's NCCL window setup (onesided_setup.cu): the only
 * interface of the onesided code that needs NCCL's headers. The kernels and
 * the planning (backends/onesided_plan.h) take plain pointers. */
#ifndef DPS_ONESIDED_SETUP_H_
#define DPS_ONESIDED_SETUP_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the base address of every rank's registration of `win` (offset 0)
 * into out[0..nranks). Launches a one-thread kernel and synchronises. */
cudaError_t dpsOsGetPeerPointers(ncclWindow_t win, int nranks, void** out);

#ifdef __cplusplus
}
#endif

#endif /* DPS_ONESIDED_SETUP_H_ */
