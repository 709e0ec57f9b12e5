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

#include "kernels/onesided_kernels.h"

/* Whether every rank of the communicator is in its LSA (load/store) team,
 * i.e. every peer's symmetric memory can be mapped and stored to directly.
 * Groups larger than DPS_OS_MAX_RANKS are reported unreachable (the kernels
 * take peer pointers by value), so auto falls back to nccl. */
extern "C" int dpsOnesidedReachable(ncclComm_t comm) {
  if (comm == nullptr) return 0;
  int nranks = 0;
  if (ncclCommCount(comm, &nranks) != ncclSuccess) return 0;
  if (nranks < 1 || nranks > DPS_OS_MAX_RANKS) return 0;
  ncclTeam_t lsa = ncclTeamLsa(comm);
  return lsa.nRanks == nranks ? 1 : 0;
}

/* ncclGetPeerPointer reads the window descriptor (device memory); one thread
 * per rank. Peer numbers are world ranks: the LSA team is the whole group. */
__global__ void dpsOsPeerPointerKernel(ncclWindow_t win, int nranks, void** out) {
  int p = (int)threadIdx.x;
  if (p < nranks) out[p] = ncclGetPeerPointer(win, 0, p);
}

extern "C" cudaError_t dpsOsGetPeerPointers(ncclWindow_t win, int nranks, void** out) {
  if (nranks < 1 || nranks > DPS_OS_MAX_RANKS) return cudaErrorInvalidValue;
  void** dev = nullptr;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaMalloc((void**)&dev, sizeof(void*) * DPS_OS_MAX_RANKS);
  if (e != cudaSuccess) return e;
  e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = dpsLaunch(dpsOsPeerPointerKernel, dim3(1), dim3(32), s, 0, win, nranks, dev);
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(out, dev, sizeof(void*) * (size_t)nranks,
                                            cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (s) cudaStreamDestroy(s);
  cudaFree(dev);
  return e;
}

/* Which device code of this build runs here: 1 if it was compiled for sm_90
 * or newer (so the kernels contain griddepcontrol.wait), 0 otherwise (an
 * older GPU, or a build without sm_90 code JIT-compiling older PTX). Every
 * .cu file of the library is compiled for the same architectures. */
__global__ void dpsOsArchProbeKernel(int* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  *out = 1;
#else
  *out = 0;
#endif
}

extern "C" cudaError_t dpsOsKernelsSupportPdl(int* yes) {
  *yes = 0;
  const cudaError_t before = cudaPeekAtLastError();
  int* dev = nullptr;
  int host = 0;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaMalloc((void**)&dev, sizeof(int));
  if (e != cudaSuccess) return e;
  e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = dpsLaunch(dpsOsArchProbeKernel, dim3(1), dim3(1), s, 0, dev);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&host, dev, sizeof(int), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (s) cudaStreamDestroy(s);
  cudaFree(dev);
  if (e == cudaSuccess) *yes = host;
  else dpsForgetOwnError(before);
  return e;
}
