/* The production provider (core/provider.h): the group is an NCCL
 * communicator (comm->nccl); symmetric memory is NCCL's (ncclMemAlloc +
 * ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC); the collectives are
 * NCCL's (backends/nccl_collectives.c).
 *
 * Symmetric memory is decided from what NCCL actually hands out, never
 * assumed. NCCL gives a symmetric window only when its communicator has
 * symmetric support: cuMem allocations (NCCL_CUMEM_ENABLE not 0, and a
 * driver and device with CUDA virtual memory management), windows enabled
 * (NCCL_WIN_ENABLE not 0) and every pair of ranks CUDA-P2P connected (no
 * NCCL_P2P_DISABLE / NCCL_P2P_LEVEL restriction; 2.28.3 also wants a single
 * node). Otherwise ncclMemAlloc falls back to cudaMalloc and
 * ncclCommWindowRegister returns success with a *local registration handle*
 * (host memory) instead of a device window: reading peer addresses through
 * it is an illegal access that kills the CUDA context. So:
 *   before registering (sym_alloc): the runtime NCCL is the one the device
 *     API was compiled against (same major.minor), the memory is a cuMem
 *     allocation, NCCL_WIN_ENABLE is not 0 -- each a dpsUnavailable naming
 *     the cause, agreed by the ranks before anyone registers;
 *   after registering (sym_register): the window handle is device memory of
 *     this GPU; else the local registration is undone and dpsUnavailable. */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "provider.h"
#include "registry.h"
#include "kernels/onesided_setup.h"

#define NP_WIN_ROUND ((size_t)2 << 20) /* windows are whole 2 MiB granules */

static int npReachable(dpsComm_t comm) { return dpsOnesidedReachable(comm->nccl); }

/* Host all-gather over NCCL (a device buffer on a private stream). */
static dpsResult_t npExchange(dpsComm_t comm, const int64_t* mine, int64_t* all, int count) {
  const int tp = comm->config.tp_size;
  const size_t bytes = sizeof(int64_t) * (size_t)count;
  int64_t* dev = NULL;
  cudaStream_t s = NULL;
  dpsResult_t res = dpsSuccess;
  cudaError_t ce = cudaMalloc((void**)&dev, bytes * (size_t)(tp + 1));
  if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  /* on `s`: the all-gather is ordered after the copy from pageable memory */
  if (ce == cudaSuccess)
    ce = cudaMemcpyAsync(dev + (size_t)count * tp, mine, bytes, cudaMemcpyHostToDevice, s);
  if (ce != cudaSuccess) {
    res = dpsSetError(dpsCudaError, "creation exchange: %s", cudaGetErrorString(ce));
    goto out;
  }
  ncclResult_t nr = ncclAllGather(dev + (size_t)count * tp, dev, bytes, ncclInt8, comm->nccl, s);
  if (nr != ncclSuccess) {
    res = dpsSetError(dpsNcclError, "creation exchange: ncclAllGather failed: %s",
                      ncclGetErrorString(nr));
    goto out;
  }
  ce = cudaMemcpyAsync(all, dev, bytes * (size_t)tp, cudaMemcpyDeviceToHost, s);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
  if (ce != cudaSuccess)
    res = dpsSetError(dpsCudaError, "creation exchange: %s", cudaGetErrorString(ce));
out:
  if (s) cudaStreamDestroy(s);
  if (dev) cudaFree(dev);
  return res;
}

static dpsResult_t npAsyncError(dpsComm_t comm) {
  ncclResult_t async = ncclSuccess;
  if (comm->nccl == NULL) return dpsSuccess;
  if (ncclCommGetAsyncError(comm->nccl, &async) != ncclSuccess) return dpsSuccess;
  if (async != ncclSuccess && async != ncclInProgress)
    return dpsSetError(dpsNcclError, "NCCL communicator async error: %s",
                       ncclGetErrorString(async));
  return dpsSuccess;
}

static void npFinish(dpsComm_t comm, int failed) {
  if (comm->owns_nccl && comm->nccl) {
    if (failed) ncclCommAbort(comm->nccl);
    else ncclCommDestroy(comm->nccl);
  }
  comm->nccl = NULL; /* a borrowed one may go now */
}

/* ---- symmetric memory ------------------------------------------------------ */
/* Whether an environment variable is set to the number 0. */
typedef CUresult (*RetainFn)(CUmemGenericAllocationHandle*, void*);
typedef CUresult (*ReleaseFn)(CUmemGenericAllocationHandle);

/* 1 when p lies in a cuMem (CUDA VMM) mapping, 0 when not, -1 when the
 * driver cannot say. Through the runtime's driver entry points: the library
 * does not link libcuda. */
static int isCuMemMapping(void* p) {
  void* retain = NULL;
  void* release = NULL;
  enum cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
  const cudaError_t before = cudaPeekAtLastError();
  if (cudaGetDriverEntryPointByVersion("cuMemRetainAllocationHandle", &retain, 11000,
                                       cudaEnableDefault, &q1) != cudaSuccess ||
      cudaGetDriverEntryPointByVersion("cuMemRelease", &release, 11000, cudaEnableDefault, &q2) !=
          cudaSuccess ||
      q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess || !retain ||
      !release) {
    if (before == cudaSuccess) (void)cudaGetLastError();
    return -1;
  }
  CUmemGenericAllocationHandle h = 0;
  if (((RetainFn)retain)(&h, p) != CUDA_SUCCESS) return 0;
  (void)((ReleaseFn)release)(h); /* drop the reference the query took */
  return 1;
}

static dpsResult_t unavailable(const char* what, const char* cause) {
  return dpsSetError(dpsUnavailable,
                     "onesided: NCCL symmetric memory is not available for the %s window: %s; "
                     "the onesided backend cannot run here (backend='auto' uses nccl)",
                     what, cause);
}

/* Before registration: what can be known locally. */
static dpsResult_t symPrecheck(void* base, const char* what) {
  int rt = 0;
  if (ncclGetVersion(&rt) != ncclSuccess) rt = 0;
  if (rt / 100 != NCCL_VERSION_CODE / 100) {
    char cause[200];
    snprintf(cause, sizeof cause,
             "NCCL %d.%d.%d is loaded but this library was built against NCCL %d.%d.%d, whose "
             "device API structures may differ (build against the NCCL that runs)",
             rt / 10000, rt / 100 % 100, rt % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return unavailable(what, cause);
  }
  if (dpsEnvIsZero("NCCL_WIN_ENABLE"))
    return unavailable(what, "NCCL_WIN_ENABLE=0 is set (unset it to use onesided)");
  const int vmm = isCuMemMapping(base);
  if (vmm == 1) return dpsSuccess;
  if (dpsEnvIsZero("NCCL_CUMEM_ENABLE"))
    return unavailable(what,
                       "NCCL_CUMEM_ENABLE=0 is set (vLLM and SGLang set it), so ncclMemAlloc "
                       "returns cudaMalloc memory that peers cannot map (set NCCL_CUMEM_ENABLE=1 "
                       "to use onesided)");
  return unavailable(what, vmm == 0 ? "ncclMemAlloc returned memory that is not a cuMem (CUDA "
                                      "virtual memory) allocation: the driver or device does "
                                      "not support cuMem, or NCCL disabled it"
                                    : "the driver cannot tell whether ncclMemAlloc's memory is a "
                                      "cuMem allocation");
}

static dpsResult_t npSymAlloc(dpsComm_t comm, dpsSymMem* m, size_t bytes, const char* what) {
  (void)comm;
  memset(m, 0, sizeof *m);
  const size_t size = dpsRoundUp(bytes ? bytes : 1, NP_WIN_ROUND);
  ncclResult_t nr = ncclMemAlloc(&m->base, size);
  if (nr != ncclSuccess) {
    m->base = NULL;
    return dpsSetError(dpsNcclError, "onesided: ncclMemAlloc(%zu bytes) for the %s window failed: %s",
                       size, what, ncclGetErrorString(nr));
  }
  m->size = size;
  dpsResult_t r = symPrecheck(m->base, what);
  if (r != dpsSuccess) return r; /* sym_free releases the memory */
  /* Zeroed before registration: no peer can address it before then. */
  DPS_CUDA_CHECK(cudaMemset(m->base, 0, size));
  DPS_CUDA_CHECK(cudaDeviceSynchronize());
  return dpsSuccess;
}

/* Whether `win` is what a symmetric registration returns: an object in
 * device memory of this GPU (a local registration handle is host memory). */
static int isDeviceWindow(const void* win, int device) {
  if (win == NULL) return 0;
  struct cudaPointerAttributes a;
  const cudaError_t before = cudaPeekAtLastError();
  if (cudaPointerGetAttributes(&a, win) != cudaSuccess) {
    if (before == cudaSuccess) (void)cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice && a.device == device;
}

static dpsResult_t npSymRegister(dpsComm_t comm, dpsSymMem* m, const char* what) {
  const int tp = comm->config.tp_size;
  ncclWindow_t win = NULL;
  ncclResult_t nr =
      ncclCommWindowRegister(comm->nccl, m->base, m->size, &win, NCCL_WIN_COLL_SYMMETRIC);
  if (nr != ncclSuccess)
    return dpsSetError(dpsNcclError,
                       "onesided: ncclCommWindowRegister(%zu bytes, NCCL_WIN_COLL_SYMMETRIC) for "
                       "the %s window failed: %s",
                       m->size, what, ncclGetErrorString(nr));
  if (!isDeviceWindow((const void*)win, comm->device)) {
    /* a local registration (or none): undo it, locally */
    if (win != NULL) (void)ncclCommWindowDeregister(comm->nccl, win);
    return unavailable(what,
                       "NCCL registered the memory without a symmetric window (its communicator "
                       "has no symmetric support: every pair of GPUs must be CUDA-P2P connected, "
                       "NCCL_P2P_DISABLE / NCCL_P2P_LEVEL must not restrict that, and "
                       "NCCL_CUMEM_ENABLE / NCCL_WIN_ENABLE must not be 0)");
  }
  m->handle = (void*)win;
  m->registered = 1;
  void* peers[DPS_PROVIDER_MAX_RANKS] = {0};
  cudaError_t ce = dpsOsGetPeerPointers(win, tp, peers);
  if (ce != cudaSuccess)
    return dpsSetError(dpsCudaError, "onesided: reading the peer addresses of the %s window: %s",
                       what, cudaGetErrorString(ce));
  for (int r = 0; r < tp; ++r) {
    if (peers[r] == NULL)
      return dpsSetError(dpsInternalError, "onesided: %s window has no address for rank %d", what,
                         r);
    m->peer[r] = (char*)peers[r];
  }
  return dpsSuccess;
}

static void npSymDeregister(dpsComm_t comm, dpsSymMem* m) {
  if (!m->registered) return;
  ncclResult_t nr = ncclCommWindowDeregister(comm->nccl, (ncclWindow_t)m->handle);
  if (nr != ncclSuccess)
    dpsLog(DPS_LOG_WARN, "onesided: ncclCommWindowDeregister failed: %s", ncclGetErrorString(nr));
  m->handle = NULL;
  m->registered = 0;
}

/* A window still registered (the group failed, or the communicator was
 * released without dpsCommClose) keeps its registration: deregistering is
 * collective and a peer may be gone. The registration holds its own
 * reference to the physical memory until the NCCL communicator is destroyed
 * or aborted. */
static void npSymFree(dpsComm_t comm, dpsSymMem* m) {
  (void)comm;
  m->handle = NULL;
  m->registered = 0;
  if (m->base) {
    ncclResult_t nr = ncclMemFree(m->base);
    if (nr != ncclSuccess)
      dpsLog(DPS_LOG_WARN, "onesided: ncclMemFree failed: %s", ncclGetErrorString(nr));
    m->base = NULL;
  }
}

/* ---- device collectives ------------------------------------------------------ */
static dpsResult_t npAllGather(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                               cudaStream_t stream) {
  return dpsNcclAllGather(comm->nccl, send, recv, bytes, stream);
}

static dpsResult_t npAllToAll(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                              int skip_rank, cudaStream_t stream) {
  return dpsNcclAllToAllSkip(comm->nccl, send, recv, bytes, skip_rank, stream);
}

const dpsProvider dpsNcclProvider = {
    .name = "nccl",
    .device = &dpsCudaDeviceHooks,
    .onesided_reachable = npReachable,
    .exchange = npExchange,
    .async_error = npAsyncError,
    .finish = npFinish,
    .sym_alloc = npSymAlloc,
    .sym_register = npSymRegister,
    .sym_deregister = npSymDeregister,
    .sym_free = npSymFree,
    .all_gather = npAllGather,
    .all_to_all = npAllToAll,
};
