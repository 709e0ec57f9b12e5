/* Communicator lifecycle and the public operations: argument checks shared by
 * every backend, then dispatch to comm->ops. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "provider.h"

/* ---- devices ------------------------------------------------------------- */
dpsResult_t dpsDeviceEnter(dpsDeviceGuard* g, int device) {
  g->switched = 0;
  DPS_CUDA_CHECK(cudaGetDevice(&g->prev));
  if (g->prev != device) {
    DPS_CUDA_CHECK(cudaSetDevice(device));
    g->switched = 1;
  }
  return dpsSuccess;
}

void dpsDeviceLeave(dpsDeviceGuard* g) {
  if (g->switched) (void)cudaSetDevice(g->prev);
}

dpsResult_t dpsOnesidedAvailableOnDevices(const int* devs, int count, int* available) {
  if (available == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsOnesidedAvailableOnDevices: available is NULL");
  if (devs == NULL || count < 1)
    return dpsSetError(dpsInvalidArgument,
                       "dpsOnesidedAvailableOnDevices: cuda_devices=%p count=%d (need >= 1 device)",
                       (const void*)devs, count);
  int n = 0;
  const cudaError_t before = cudaPeekAtLastError();
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    /* no driver / no GPU: not available, not an error; forget our error
     * only, never one the caller had pending */
    if (before == cudaSuccess) (void)cudaGetLastError();
    *available = 0;
    return dpsSuccess;
  }
  for (int i = 0; i < count; ++i)
    if (devs[i] < 0 || devs[i] >= n)
      return dpsSetError(dpsInvalidArgument,
                         "dpsOnesidedAvailableOnDevices: cuda_devices[%d]=%d is not one of the %d "
                         "devices",
                         i, devs[i], n);
  /* with either at 0, ncclMemAlloc memory cannot be mapped by peers (or NCCL
   * registers no windows): creation would refuse onesided */
  int ok = !dpsEnvIsZero("NCCL_CUMEM_ENABLE") && !dpsEnvIsZero("NCCL_WIN_ENABLE");
  for (int i = 0; i < count && ok; ++i)
    for (int j = 0; j < count && ok; ++j) {
      if (devs[i] == devs[j]) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, devs[i], devs[j]) != cudaSuccess || !can) ok = 0;
    }
  *available = ok;
  return dpsSuccess;
}

/* ---- bootstrap ----------------------------------------------------------- */
dpsResult_t dpsGetUniqueId(dpsUniqueId* id) {
  if (id == NULL) return dpsSetError(dpsInvalidArgument, "dpsGetUniqueId: unique_id is NULL");
  _Static_assert(sizeof(ncclUniqueId) <= sizeof(dpsUniqueId), "dpsUniqueId too small");
  ncclUniqueId nid;
  DPS_NCCL_CHECK(ncclGetUniqueId(&nid));
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &nid, sizeof nid);
  return dpsSuccess;
}

/* Every rank must agree on the shape and the backend, or the first
 * collective would hang or corrupt: compare them once, at creation. The
 * exchange (dpsAgree) also carries each rank's local status (`local`: the
 * outcome of its own checks, e.g. an invalid environment value), so that a
 * rank failing on its own makes every rank fail here instead of leaving
 * them waiting in a later collective. A failing rank keeps its own message. */
static dpsResult_t checkGroupAgreement(dpsComm_t comm, dpsResult_t local) {
  enum { K = 7, BACKEND = 4 };
  const int tp = comm->config.tp_size;
  const int64_t mine[K] = {comm->config.max_pad_bs, comm->config.num_tokens_per_req,
                           comm->config.vocab_size, (int64_t)comm->config.logits_dtype,
                           (int64_t)comm->backend, comm->timeout_ms, comm->config.max_topk};
  static const char* names[K] = {"max_pad_bs", "num_tokens_per_req", "vocab_size",
                                 "logits_dtype", "backend", "timeout_ms", "max_topk"};
  int64_t* all = (int64_t*)malloc(sizeof(int64_t) * K * (size_t)tp);
  if (all == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  dpsResult_t res = dpsAgree(comm, local, "creation (its local checks)", mine, K, all);
  for (int r = 0; r < tp && res == dpsSuccess; ++r)
    for (int k = 0; k < K; ++k)
      if (all[r * K + k] != mine[k]) {
        if (k == BACKEND)
          res = dpsSetError(dpsInvalidUsage,
                            "ranks disagree on the backend: rank %d resolved '%s', rank %d '%s' "
                            "(check DPSAMPLING_BACKEND on every rank)",
                            comm->config.rank, dpsBackendName(comm->backend), r,
                            dpsBackendName((dpsBackend_t)all[r * K + k]));
        else
          res = dpsSetError(dpsInvalidArgument,
                            "ranks disagree: rank %d has %s=%" PRId64 ", rank %d has %s=%" PRId64,
                            comm->config.rank, names[k], mine[k], r, names[k], all[r * K + k]);
        break;
      }
  free(all);
  return res;
}

dpsResult_t dpsCommMarkFailed(dpsComm_t comm, dpsResult_t r) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&comm->sticky_error, &expected, (int)r)) return r;
  return (dpsResult_t)expected;
}

/* Fixes the logits dtype: the backend's prepare (collective). */
static dpsResult_t prepareDtype(dpsComm_t comm, dpsDataType_t dtype) {
  comm->dtype = dtype;
  dpsResult_t r = comm->ops->prepare(comm);
  if (r != dpsSuccess) {
    comm->dtype = dpsDtypeUnset;
    return r;
  }
  comm->initialized = 1;
  return dpsSuccess;
}

dpsResult_t dpsPreloadBackend(const dpsBackendOps* ops) {
  if (ops->preload == NULL) return dpsSuccess;
  cudaError_t e = ops->preload();
  if (e == cudaSuccess) e = dpsPreloadShardKernels();
  if (e != cudaSuccess) {
    char note[320];
    dpsDeviceCodeNote(note, sizeof note);
    return dpsSetError(dpsCudaError, "%s backend: loading the kernels failed: %s (%s)", ops->name,
                       cudaGetErrorString(e), note);
  }
  return dpsSuccess;
}

/* Programmatic dependent launch where DPSAMPLING_PDL allows it and the
 * device code waits for the previous kernel (a kernel launched with PDL
 * without that wait would read its inputs before they are written). A
 * local choice: the ranks need not agree. */
static void decidePdl(dpsComm_t comm) {
  comm->pdl = 0;
  if (!comm->env.pdl) return;
  const cudaError_t e = dpsKernelsSupportPdl(&comm->pdl);
  if (!comm->pdl)
    dpsLog(DPS_LOG_INFO, "rank %d: programmatic dependent launch off (%s)", comm->config.rank,
           e != cudaSuccess ? cudaGetErrorString(e)
                            : "the device code running here was built for an architecture "
                              "before sm_90");
}

/* Loads the backend's kernels and runs its init. */
static dpsResult_t initBackend(dpsComm_t comm, const dpsBackendOps* ops) {
  comm->ops = ops;
  DPS_CHECK(dpsPreloadBackend(ops));
  return ops->init(comm);
}

dpsResult_t dpsCommCreate(dpsComm_t* out, const dpsConfig_t* config, int device,
                          const dpsProvider* provider, void* provider_ctx, struct ncclComm* nccl,
                          int owns_nccl, const dpsBackendOps* ops) {
  dpsComm_t comm = (dpsComm_t)calloc(1, sizeof *comm);
  if (comm == NULL) {
    if (owns_nccl) ncclCommDestroy(nccl);
    return dpsSetError(dpsSystemError, "out of host memory");
  }
  comm->config = *config;
  comm->device = device;
  comm->nccl = nccl;
  comm->owns_nccl = owns_nccl;
  comm->prov = provider;
  comm->prov_ctx = provider_ctx;
  comm->dtype = dpsDtypeUnset;
  comm->config.cuda_device = device;
  comm->rec_words = dpsRecCapacityWords(config->max_topk);
  (void)dpsReleasePending(NULL); /* creation is a safe point */

  /* Local checks record their failure in `local` instead of returning: the
   * agreement exchange below must still happen on every rank. */
  dpsResult_t res = dpsSuccess;
  comm->timeout_ms = DPS_DEFAULT_TIMEOUT_MS;
  dpsResult_t local = dpsReadEnv(&comm->env);
  if (local == dpsSuccess) local = dpsResolveTimeoutMs(config, &comm->timeout_ms);

  /* every backend's probe; auto takes the table's pick among them */
  const unsigned avail = dpsBackendsAvailable(comm);
  comm->backend = (dpsBackend_t)-1;
  if (local == dpsSuccess) local = dpsResolveBackendIn(config->backend, avail, &comm->backend);
  const dpsBackendEntry* be = local == dpsSuccess ? dpsBackendLookup(comm->backend) : NULL;
  if (ops == NULL && be != NULL) ops = be->ops;
  if (local == dpsSuccess) local = dpsPreloadBackend(ops);
  if (local == dpsSuccess && ops->preload != NULL) decidePdl(comm); /* a backend with kernels */
  if (local == dpsSuccess) local = provider->device->init(comm);
  res = checkGroupAgreement(comm, local);
  if (res != dpsSuccess) goto fail;

  comm->ops = ops;
  res = ops->init(comm);
  /* dpsUnavailable from a backend's init is agreed by every rank (e.g. no
   * symmetric memory for onesided): auto falls back along the table */
  const dpsBackendEntry* next = be;
  while (res == dpsUnavailable && config->backend == dpsBackendAuto && ops == be->ops &&
         (next = dpsBackendFallback(be)) != NULL) {
    dpsLog(DPS_LOG_INFO, "rank %d: backend=auto: %s is unavailable (%s); using %s", config->rank,
           be->name, dpsGetLastError(), next->name);
    if (ops->destroy) ops->destroy(comm);
    be = next;
    comm->backend = be->id;
    ops = be->ops;
    res = initBackend(comm, ops);
  }
  if (res != dpsSuccess) goto fail;
  if (config->logits_dtype != dpsDtypeUnset) {
    res = prepareDtype(comm, config->logits_dtype);
    if (res != dpsSuccess) goto fail;
  }
  dpsLog(DPS_LOG_INFO,
         "rank %d/%d device %d: backend=%s (requested %s, available mask 0x%x, provider %s) "
         "max_pad_bs=%d N=%d vocab=%" PRId64 " dtype=%s timeout=%d ms PDL %s%s",
         config->rank, config->tp_size, device, dpsBackendName(comm->backend),
         dpsBackendName(config->backend), avail, provider->name, config->max_pad_bs,
         config->num_tokens_per_req, config->vocab_size, dpsDataTypeName(comm->dtype),
         comm->timeout_ms, comm->pdl ? "on" : "off",
         comm->initialized ? "" : " (buffers for the logits dtype deferred)");
  dpsClearError();
  *out = comm;
  return dpsSuccess;
fail:
  /* every rank failed together, so nothing collective is owed: free it now */
  dpsCommFreeNow(comm);
  return res;
}

/* The NCCL communicator must be the group the config describes. */
static dpsResult_t checkNcclGroup(ncclComm_t nccl, const dpsConfig_t* config) {
  int count = 0, urank = 0;
  if (ncclCommCount(nccl, &count) != ncclSuccess || ncclCommUserRank(nccl, &urank) != ncclSuccess)
    return dpsSetError(dpsNcclError, "cannot query the NCCL communicator");
  if (count != config->tp_size || urank != config->rank)
    return dpsSetError(dpsInvalidArgument,
                       "the NCCL communicator has %d ranks and this is rank %d, but tp_size=%d "
                       "rank=%d",
                       count, urank, config->tp_size, config->rank);
  return dpsSuccess;
}

static dpsResult_t createComm(dpsComm_t* out, ncclComm_t nccl, int owns, const dpsConfig_t* config,
                              int device) {
  dpsResult_t r = checkNcclGroup(nccl, config);
  if (r != dpsSuccess) {
    if (owns) ncclCommDestroy(nccl);
    return r;
  }
  return dpsCommCreate(out, config, device, &dpsNcclProvider, NULL, nccl, owns, NULL);
}

/* The device ordinal to use, checked to be a usable CUDA device: without a
 * driver or GPU, or with an ordinal past the visible devices, say so plainly
 * (naming the ordinal) instead of passing on the runtime's first error. */
static dpsResult_t resolveDevice(const dpsConfig_t* config, int* device) {
  const cudaError_t before = cudaPeekAtLastError();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    if (e != cudaSuccess && before == cudaSuccess) (void)cudaGetLastError(); /* ours */
    char which[48];
    if (config->cuda_device >= 0)
      snprintf(which, sizeof which, "cuda_device=%d", config->cuda_device);
    else
      snprintf(which, sizeof which, "cuda_device=-1, the current device");
    return dpsSetError(dpsCudaError,
                       "no usable CUDA device (%s): %s (is an NVIDIA GPU visible and its driver "
                       "installed?)",
                       which, e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device is visible");
  }
  if (config->cuda_device >= 0) {
    if (config->cuda_device >= count)
      return dpsSetError(dpsInvalidArgument,
                         "no usable CUDA device: cuda_device=%d, but %d CUDA device%s visible "
                         "(ordinals 0..%d; see CUDA_VISIBLE_DEVICES)",
                         config->cuda_device, count, count == 1 ? " is" : "s are", count - 1);
    *device = config->cuda_device;
    return dpsSuccess;
  }
  DPS_CUDA_CHECK(cudaGetDevice(device));
  return dpsSuccess;
}

/* The steps both entry points share: the config's checks and the device,
 * then the NCCL communicator, the library's own from `id` (nccl NULL) or the
 * borrowed `nccl`, and creation on it, on the communicator's device. */
static dpsResult_t initComm(dpsComm_t* comm, const dpsUniqueId* id, ncclComm_t nccl,
                            const dpsConfig_t* config) {
  DPS_CHECK(dpsConfigCheck(config));
  int device;
  DPS_CHECK(resolveDevice(config, &device));
  int nccl_dev = -1;
  if (nccl != NULL && ncclCommCuDevice(nccl, &nccl_dev) == ncclSuccess && nccl_dev != device)
    return dpsSetError(dpsInvalidArgument,
                       "nccl_comm is on CUDA device %d but cuda_device=%d (config or current)",
                       nccl_dev, device);
  dpsDeviceGuard g;
  DPS_CHECK(dpsDeviceEnter(&g, device));
  const int owns = nccl == NULL;
  dpsResult_t res = dpsSuccess;
  if (owns) {
    ncclUniqueId nid;
    memcpy(&nid, id->internal, sizeof nid);
    ncclResult_t nr = ncclCommInitRank(&nccl, config->tp_size, nid, config->rank);
    if (nr != ncclSuccess)
      res = dpsSetError(dpsNcclError, "ncclCommInitRank(tp_size=%d, rank=%d) failed: %s",
                        config->tp_size, config->rank, ncclGetErrorString(nr));
  }
  if (res == dpsSuccess) res = createComm(comm, nccl, owns, config, device);
  dpsDeviceLeave(&g);
  return res;
}

dpsResult_t dpsCommInitRank(dpsComm_t* comm, const dpsUniqueId* id, const dpsConfig_t* config) {
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommInitRank: comm is NULL");
  if (id == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommInitRank: unique_id is NULL");
  return initComm(comm, id, NULL, config);
}

dpsResult_t dpsCommInitFromNccl(dpsComm_t* comm, struct ncclComm* nccl, const dpsConfig_t* config) {
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommInitFromNccl: comm is NULL");
  if (nccl == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommInitFromNccl: nccl_comm is NULL");
  return initComm(comm, NULL, nccl, config);
}


/* ---- queries ------------------------------------------------------------- */
dpsResult_t dpsCommGetInfo(dpsComm_t comm, dpsCommInfo_t* info) {
  if (comm == NULL || info == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommGetInfo: %s is NULL", comm ? "info" : "comm");
  info->tp_size = comm->config.tp_size;
  info->rank = comm->config.rank;
  info->max_pad_bs = comm->config.max_pad_bs;
  info->num_tokens_per_req = comm->config.num_tokens_per_req;
  info->vocab_size = comm->config.vocab_size;
  info->logits_dtype = comm->dtype;
  info->requested_backend = comm->config.backend;
  info->backend = comm->backend;
  info->cuda_device = comm->device;
  info->initialized = comm->initialized;
  info->timeout_ms = comm->timeout_ms;
  return dpsSuccess;
}

dpsResult_t dpsCommAsyncError(dpsComm_t comm) {
  if (comm->ops && comm->ops->async_error) DPS_CHECK(comm->ops->async_error(comm));
  if (comm->prov->async_error) DPS_CHECK(comm->prov->async_error(comm));
  return dpsSuccess;
}

/* Returns the communicator's error, making an asynchronous one sticky.
 * Thread-safe against itself (dpsCommGetAsyncError on a watchdog thread
 * while another thread runs operations): the backends' and the provider's
 * async_error read state the kernels or NCCL publish, and the sticky word is
 * atomic. */
dpsResult_t dpsCommHealth(dpsComm_t comm) {
  const int stuck = atomic_load(&comm->sticky_error);
  if (stuck) {
    const dpsResult_t sticky = (dpsResult_t)stuck;
    /* Prefer the backend's or the group's own account (it names the peer);
     * else say what happened. */
    if (dpsCommAsyncError(comm) == dpsSuccess)
      dpsSetError(sticky,
                  "the communicator failed earlier with %s; destroy it and create a new one",
                  dpsGetErrorString(sticky));
    return sticky;
  }
  {
    dpsResult_t r = dpsCommAsyncError(comm);
    if (r != dpsSuccess) {
      const dpsResult_t stands = dpsCommMarkFailed(comm, r);
      if (stands != r) /* another thread recorded a different failure first */
        dpsSetError(stands, "the communicator failed with %s; destroy it and create a new one",
                    dpsGetErrorString(stands));
      return stands;
    }
  }
  return dpsSuccess;
}

dpsResult_t dpsCommGetAsyncError(dpsComm_t comm, dpsResult_t* async_error) {
  if (comm == NULL || async_error == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommGetAsyncError: %s is NULL",
                       comm ? "async_error" : "comm");
  *async_error = dpsCommHealth(comm);
  return dpsSuccess;
}

dpsResult_t dpsCommSetCollectives(dpsComm_t comm, const dpsCollectives_t* table) {
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommSetCollectives: comm is NULL");
  const dpsBackendEntry* e = dpsBackendLookup(comm->backend);
  if (table != NULL && (e == NULL || !e->uses_collectives))
    return dpsSetError(dpsUnavailable,
                       "dpsCommSetCollectives: the communicator runs the %s backend, which uses no "
                       "collectives (%s): the table would never be called. Only the nccl backend "
                       "uses them (request backend nccl, or leave the defaults)",
                       dpsBackendName(comm->backend),
                       e != NULL && e->no_collectives_why ? e->no_collectives_why : "none");
  if (table == NULL) memset(&comm->coll, 0, sizeof comm->coll);
  else comm->coll = *table;
  return dpsSuccess;
}

/* ---- operations ---------------------------------------------------------- */
dpsResult_t dpsCheckLogitsDtype(const char* op, dpsDataType_t dtype) {
  if (dtype != dpsFloat32 && dtype != dpsBfloat16 && dtype != dpsFloat16)
    return dpsSetError(dpsInvalidArgument, "%s: dtype=%s (%d) is not fp32, bf16 or fp16", op,
                       dpsDataTypeName(dtype), (int)dtype);
  return dpsSuccess;
}

dpsResult_t dpsCheckLogitsData(dpsComm_t comm, const char* op, const char* name, const void* p,
                               dpsDataType_t dtype) {
  if ((uintptr_t)p % dpsDataTypeSize(dtype) != 0)
    return dpsSetError(dpsInvalidArgument, "%s: %s=%p is not aligned to its %zu-byte %s elements",
                       op, name, p, dpsDataTypeSize(dtype), dpsDataTypeName(dtype));
  if (comm->dtype != dpsDtypeUnset && comm->dtype != dtype)
    return dpsSetError(dpsInvalidUsage,
                       "%s: %s dtype %s differs from the communicator's logits dtype %s, fixed at "
                       "creation, by prepare or by the first swap",
                       op, name, dpsDataTypeName(dtype), dpsDataTypeName(comm->dtype));
  return dpsSuccess;
}

/* The one place a call's shape is derived (after the checks). */
static dpsShape callShape(dpsComm_t comm, int pad_bs, size_t esize) {
  return dpsMakeShape(comm->config.tp_size, comm->config.rank, pad_bs,
                      comm->config.num_tokens_per_req, comm->config.vocab_size, esize);
}

static dpsResult_t checkPadBs(dpsComm_t comm, const char* op, int pad_bs) {
  const int tp = comm->config.tp_size;
  if (pad_bs < 1 || pad_bs > comm->config.max_pad_bs || pad_bs % tp != 0)
    return dpsSetError(dpsInvalidArgument,
                       "%s: pad_bs=%d must be a multiple of tp_size=%d in [1, max_pad_bs=%d]", op,
                       pad_bs, tp, comm->config.max_pad_bs);
  return dpsSuccess;
}

#if CUDART_VERSION >= 12080 && defined(__GNUC__)
/* Weak: a process may have loaded an older libcudart of the same soname
 * first (e.g. the one of a Python package), which lacks this function; the
 * stream device check is then skipped instead of the library failing to
 * load. */
/* (__typeof__ goes through the header's per-thread-stream macro, if any;
 * #pragma weak would not.) */
extern __typeof__(cudaStreamGetDevice) cudaStreamGetDevice __attribute__((weak));
#define DPS_HAVE_STREAM_GET_DEVICE() (cudaStreamGetDevice != NULL)
#elif CUDART_VERSION >= 12080
#define DPS_HAVE_STREAM_GET_DEVICE() 1
#endif

static dpsResult_t checkStream(dpsComm_t comm, const char* op, cudaStream_t stream,
                               int* capturing, unsigned long long* capture_id) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  *capturing = 0;
  *capture_id = 0;
  cudaError_t e = dpsStreamCaptureInfo(stream, &st, capture_id);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "%s: stream=%p is not usable: %s", op, (void*)stream,
                       cudaGetErrorString(e));
  *capturing = st != cudaStreamCaptureStatusNone;
#if CUDART_VERSION >= 12080
  /* A stream of another device would run our kernels there, on memory of
   * this device: refuse it up front. (The legacy/per-thread default streams
   * report the current device, which opEnter just made ours.) Not while the
   * stream captures: the query is not permitted then and would invalidate
   * the capture. */
  if (*capturing || !DPS_HAVE_STREAM_GET_DEVICE()) return dpsSuccess;
  /* The legacy and per-thread default streams are the current device's,
   * which the device guard has just made the communicator's: the query
   * would only confirm it (one driver call less per operation on those
   * streams, e.g. torch's default stream, whose handle is NULL). */
  if (dpsIsDefaultStream(stream)) return dpsSuccess;
  int dev = -1;
  e = cudaStreamGetDevice(stream, &dev);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "%s: stream=%p: cudaStreamGetDevice failed: %s", op,
                       (void*)stream, cudaGetErrorString(e));
  if (dev != comm->device)
    return dpsSetError(dpsInvalidArgument,
                       "%s: stream=%p belongs to CUDA device %d, the communicator to device %d", op,
                       (void*)stream, dev, comm->device);
#endif
  return dpsSuccess;
}

/* Switches to the communicator's device and inspects the stream. */
dpsResult_t dpsOpEnter(dpsComm_t comm, const char* op, cudaStream_t stream, dpsOpCtx* x) {
  x->capturing = 0;
  x->capture_id = 0;
  x->stream = stream;
  x->g.switched = 0;
  DPS_CHECK(comm->prov->device->enter(comm, &x->g));
  dpsResult_t r =
      comm->prov->device->inspect_stream(comm, op, stream, &x->capturing, &x->capture_id);
  if (r != dpsSuccess) dpsDeviceLeave(&x->g);
  return r;
}

dpsResult_t dpsOpBegin(dpsComm_t comm, const char* op, cudaStream_t stream, dpsOpCtx* x) {
  DPS_CHECK(dpsCheckOpen(comm, op));
  DPS_CHECK(dpsCommHealth(comm));
  return dpsOpEnter(comm, op, stream, x);
}

/* Ends an operation; `r` is its outcome. Successful work is noted for
 * teardown (dpsNoteWork). */
void dpsOpLeave(dpsComm_t comm, dpsOpCtx* x, dpsResult_t r) {
  if (r == dpsSuccess) dpsNoteWork(comm, x->stream, x->capturing, x->capture_id);
  dpsDeviceLeave(&x->g);
}

static dpsResult_t cudaEnter(dpsComm_t comm, dpsDeviceGuard* g) {
  return dpsDeviceEnter(g, comm->device);
}

const dpsDeviceHooks dpsCudaDeviceHooks = {
    .init = dpsTeardownInit,
    .enter = cudaEnter,
    .inspect_stream = checkStream,
};

/* After dpsCommClose every operation is refused. */
dpsResult_t dpsCheckOpen(dpsComm_t comm, const char* op) {
  if (comm->closed)
    return dpsSetError(dpsInvalidUsage, "%s: the communicator is closed (dpsCommClose)", op);
  return dpsSuccess;
}

dpsResult_t dpsCommPrepare(dpsComm_t comm, dpsDataType_t dtype) {
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "dpsCommPrepare: comm is NULL");
  if (dtype != dpsFloat32 && dtype != dpsBfloat16 && dtype != dpsFloat16)
    return dpsSetError(dpsInvalidArgument, "prepare_verify_outputs: dtype=%d is not fp32, bf16 or fp16",
                       (int)dtype);
  DPS_CHECK(dpsCheckOpen(comm, "prepare_verify_outputs"));
  DPS_CHECK(dpsCommHealth(comm));
  if (comm->dtype != dpsDtypeUnset) return dpsSuccess; /* the communicator keeps its dtype */
  dpsOpCtx x;
  DPS_CHECK(dpsOpEnter(comm, "prepare_verify_outputs", NULL, &x));
  dpsResult_t r = prepareDtype(comm, dtype);
  dpsDeviceLeave(&x.g); /* no work on a caller's stream to note */
  return r;
}

dpsResult_t dpsSwapBatchVocab(dpsComm_t comm, const void* in, int64_t rows, int64_t cols,
                              dpsDataType_t dtype, int pad_bs, void** output, cudaStream_t stream) {
  static const char* op = "swap_batch_vocab";
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", op);
  if (in == NULL) return dpsSetError(dpsInvalidArgument, "%s: local_logits is NULL", op);
  if (output == NULL) return dpsSetError(dpsInvalidArgument, "%s: output is NULL", op);
  DPS_CHECK(dpsCheckLogitsDtype(op, dtype));
  DPS_CHECK(checkPadBs(comm, op, pad_bs));
  const dpsShape sh = callShape(comm, pad_bs, dpsDataTypeSize(dtype));
  const int64_t want_rows = sh.rows, want_cols = sh.v_local;
  if (rows != want_rows || cols != want_cols)
    return dpsSetError(dpsInvalidArgument,
                       "%s: local_logits is [%" PRId64 ", %" PRId64 "], expected [pad_bs*N, V/tp] = "
                       "[%d*%d, %" PRId64 "/%d] = [%" PRId64 ", %" PRId64 "]",
                       op, rows, cols, pad_bs, comm->config.num_tokens_per_req,
                       comm->config.vocab_size, comm->config.tp_size, want_rows, want_cols);
  DPS_CHECK(dpsCheckLogitsData(comm, op, "local_logits", in, dtype));
  dpsOpCtx x;
  DPS_CHECK(dpsOpBegin(comm, op, stream, &x));
  dpsResult_t r = dpsSuccess;
  if (comm->dtype == dpsDtypeUnset) {
    if (x.capturing)
      r = dpsSetError(dpsInvalidUsage,
                      "%s: the logits dtype is not fixed yet and the first swap allocates; call "
                      "dpsCommPrepare(%s) or run one swap before capturing a CUDA graph",
                      op, dpsDataTypeName(dtype));
    else
      r = prepareDtype(comm, dtype);
  }
  if (r == dpsSuccess) r = comm->ops->swap(comm, &sh, in, stream);
  dpsOpLeave(comm, &x, r);
  if (r == dpsSuccess) *output = comm->swap_out;
  return r;
}

static dpsResult_t checkVerifyShape(dpsComm_t comm, const char* op, const char* what, int64_t reqs,
                                    int64_t n, int pad_bs) {
  const int64_t want_reqs = callShape(comm, pad_bs, sizeof(int32_t)).reqs;
  if (reqs != want_reqs || n != comm->config.num_tokens_per_req)
    return dpsSetError(dpsInvalidArgument,
                       "%s: %s is [%" PRId64 ", %" PRId64 "], expected [pad_bs/tp, N] = [%d/%d, %d] "
                       "= [%" PRId64 ", %d]",
                       op, what, reqs, n, pad_bs, comm->config.tp_size,
                       comm->config.num_tokens_per_req, want_reqs, comm->config.num_tokens_per_req);
  return dpsSuccess;
}

dpsResult_t dpsGatherVerifyOutputs(dpsComm_t comm, const int32_t* predict,
                                   const int32_t* accept_index, const int32_t* accept_length,
                                   int64_t reqs, int64_t n, int pad_bs, int32_t** predict_out,
                                   int32_t** accept_index_out, int32_t** accept_length_out,
                                   cudaStream_t stream) {
  static const char* op = "gather_verify_outputs";
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", op);
  const void* ins[3] = {predict, accept_index, accept_length};
  void* outs[3] = {predict_out, accept_index_out, accept_length_out};
  static const char* in_names[3] = {"predict", "accept_index", "accept_length"};
  static const char* out_names[3] = {"predict_out", "accept_index_out", "accept_length_out"};
  for (int i = 0; i < 3; ++i) {
    if (ins[i] == NULL) return dpsSetError(dpsInvalidArgument, "%s: %s is NULL", op, in_names[i]);
    if (outs[i] == NULL) return dpsSetError(dpsInvalidArgument, "%s: %s is NULL", op, out_names[i]);
    if ((uintptr_t)ins[i] % sizeof(int32_t) != 0)
      return dpsSetError(dpsInvalidArgument, "%s: %s=%p is not 4-byte aligned", op, in_names[i],
                         ins[i]);
  }
  DPS_CHECK(checkPadBs(comm, op, pad_bs));
  DPS_CHECK(checkVerifyShape(comm, op, "predict/accept_index", reqs, n, pad_bs));
  dpsOpCtx x;
  DPS_CHECK(dpsOpBegin(comm, op, stream, &x));
  const dpsShape sh = callShape(comm, pad_bs, sizeof(int32_t));
  dpsResult_t r = comm->ops->gather_outputs(comm, &sh, predict, accept_index, accept_length, stream);
  dpsOpLeave(comm, &x, r);
  if (r == dpsSuccess) {
    *predict_out = comm->vout.predict;
    *accept_index_out = comm->vout.accept_index;
    *accept_length_out = comm->vout.accept_length;
  }
  return r;
}

dpsResult_t dpsGatherVerifyLogprobs(dpsComm_t comm, const float* logprobs, int64_t reqs, int64_t n,
                                    int pad_bs, float** output, cudaStream_t stream) {
  static const char* op = "gather_verify_logprobs";
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", op);
  if (logprobs == NULL) return dpsSetError(dpsInvalidArgument, "%s: logprobs is NULL", op);
  if ((uintptr_t)logprobs % sizeof(float) != 0)
    return dpsSetError(dpsInvalidArgument, "%s: logprobs=%p is not 4-byte aligned", op,
                       (const void*)logprobs);
  if (output == NULL) return dpsSetError(dpsInvalidArgument, "%s: output is NULL", op);
  DPS_CHECK(checkPadBs(comm, op, pad_bs));
  DPS_CHECK(checkVerifyShape(comm, op, "logprobs", reqs, n, pad_bs));
  dpsOpCtx x;
  DPS_CHECK(dpsOpBegin(comm, op, stream, &x));
  const dpsShape sh = callShape(comm, pad_bs, sizeof(float));
  dpsResult_t r = comm->ops->gather_logprobs(comm, &sh, logprobs, stream);
  dpsOpLeave(comm, &x, r);
  if (r == dpsSuccess) *output = comm->vout.logprobs;
  return r;
}
