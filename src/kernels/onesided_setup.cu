/* One-sided backend setup: the only translation unit that includes NCCL's
 * device API headers (C++ only). Host wrappers are extern "C". */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <nccl_device.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "kernels/device.cuh"
#include "kernels/onesided_kernels.h"
#include "kernels/onesided_setup.h"

/* Whether every rank of the communicator is in its LSA (load/store) team,
 * i.e. every peer's symmetric memory can be mapped and stored to directly.
 * Groups larger than DPS_PEER_MAX_RANKS are reported unreachable (the kernels
 * take peer pointers by value), so auto falls back to nccl. */
extern "C" int dpsOnesidedReachable(ncclComm_t comm) {
  if (comm == nullptr) return 0;
  int nranks = 0;
  if (ncclCommCount(comm, &nranks) != ncclSuccess) return 0;
  if (nranks < 1 || nranks > DPS_PEER_MAX_RANKS) return 0;
  ncclTeam_t lsa = ncclTeamLsa(comm);
  return lsa.nRanks == nranks ? 1 : 0;
}

/* Runs a setup kernel whose first parameter is an output array of `count`
 * elements, on one block of `threads` threads and a private stream, and
 * copies the array to `host`. Blocks the host. On failure no error of ours is
 * left in the runtime's last-error state (kernels/device.cuh). */
template <typename Out, typename... KArgs, typename... Args>
static cudaError_t runSetupKernel(void (*kernel)(Out*, KArgs...), unsigned threads, Out* host,
                                  size_t count, Args... args) {
  const cudaError_t before = cudaPeekAtLastError();
  Out* dev = nullptr;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaMalloc((void**)&dev, sizeof(Out) * count);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = dpsLaunch(kernel, dim3(1), dim3(threads), s, 0, dev, args...);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(host, dev, sizeof(Out) * count, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (s) cudaStreamDestroy(s);
  if (dev) cudaFree(dev);
  if (e != cudaSuccess) dpsForgetOwnError(before);
  return e;
}

/* ncclGetPeerPointer reads the window descriptor (device memory); one thread
 * per rank. Peer numbers are world ranks: the LSA team is the whole group. */
__global__ void dpsOsPeerPointerKernel(void** out, ncclWindow_t win, int nranks) {
  int p = (int)threadIdx.x;
  if (p < nranks) out[p] = ncclGetPeerPointer(win, 0, p);
}

extern "C" cudaError_t dpsOsGetPeerPointers(ncclWindow_t win, int nranks, void** out) {
  if (nranks < 1 || nranks > DPS_PEER_MAX_RANKS) return cudaErrorInvalidValue;
  return runSetupKernel(dpsOsPeerPointerKernel, 32, out, (size_t)nranks, win, nranks);
}
