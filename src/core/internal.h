/* Internal state shared by the core and the backends. Not installed. */
#ifndef DPS_INTERNAL_H_
#define DPS_INTERNAL_H_

#include <stdatomic.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dpsampling.h"
#include "layout.h"
#include "kernels/records.h"
#include "kernels/select_kernels.h" /* dpsSelWaves */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (core/error.c) --------------------------------------------- */
/* Records a printf-style message as this thread's last error; returns res. */
dpsResult_t dpsSetError(dpsResult_t res, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void dpsClearError(void);
/* For a kernel that could not be loaded: the current device's compute
 * capability and the architectures this build has device code for. */
void dpsDeviceCodeNote(char* buf, size_t size);

/* The message names the call and the error; the source file and line go only
 * to the debug log (DPSAMPLING_DEBUG=INFO), never into user-facing errors. */
#define DPS_CUDA_CHECK(call)                                                          \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      dpsLog(DPS_LOG_INFO, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),    \
             __FILE__, __LINE__);                                                     \
      return dpsSetError(dpsCudaError, "%s failed: %s", #call, cudaGetErrorString(e_)); \
    }                                                                                 \
  } while (0)

#define DPS_NCCL_CHECK(call)                                                          \
  do {                                                                                \
    ncclResult_t n_ = (call);                                                         \
    if (n_ != ncclSuccess) {                                                          \
      dpsLog(DPS_LOG_INFO, "%s failed: %s (%s:%d)", #call, ncclGetErrorString(n_),    \
             __FILE__, __LINE__);                                                     \
      return dpsSetError(dpsNcclError, "%s failed: %s", #call, ncclGetErrorString(n_)); \
    }                                                                                 \
  } while (0)

#define DPS_CHECK(call)                                                               \
  do {                                                                                \
    dpsResult_t r_ = (call);                                                          \
    if (r_ != dpsSuccess) return r_;                                                  \
  } while (0)

/* ---- logging (core/log.c): DPSAMPLING_DEBUG=INFO|WARN ------------------- */
enum { DPS_LOG_NONE = 0, DPS_LOG_WARN = 1, DPS_LOG_INFO = 2 };
int dpsLogLevel(void);
void dpsLog(int level, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- communicator state (core/comm.c) ------------------------------------ */
/* Records the communicator's first failure (thread-safe; later ones do not
 * replace it) and returns the one that stands. A failed communicator fails
 * every later operation, and destroy aborts a library-owned NCCL
 * communicator instead of destroying it (no waiting for peers). */
dpsResult_t dpsCommMarkFailed(dpsComm_t comm, dpsResult_t r);

/* ---- environment (core/config.c) ---------------------------------------- */
/* Reads a whole decimal number from the environment: digits only (no sign,
 * space or prefix), at most UINT64_MAX. Returns 0 when unset or empty, 1 with
 * *value set, -1 when malformed (*value untouched). Ranges are the caller's. */
int dpsEnvUint(const char* name, uint64_t* value);
/* Whether environment variable `name` is set to a number equal to 0 (as NCCL
 * reads NCCL_CUMEM_ENABLE / NCCL_WIN_ENABLE). */
int dpsEnvIsZero(const char* name);

/* Every DPSAMPLING_* variable but the backend override (dpsResolveBackend),
 * read and checked at each creation before the agreement, whichever
 * backend resolves: a value that is set and invalid fails creation with
 * dpsInvalidArgument naming the variable and its value, on every rank (the
 * others: another rank failed). Unset or empty: the default. The table:
 * docs/api.md, "Environment variables". */
#define DPS_DEFAULT_TIMEOUT_MS 5000
#define DPS_ENV_LL_BYTES_DEFAULT (256u * 1024u)
#define DPS_ENV_LL_BYTES_MAX (16u * 1024u * 1024u)
#define DPS_ENV_GATHER_THREADS_DEFAULT 256
#define DPS_ENV_GATHER_THREADS_MAX 1024
#define DPS_ENV_SELECT_SPLIT_MAX 8
typedef struct {
  int timeout_ms;        /* DPSAMPLING_TIMEOUT_MS; 0: unset */
  uint64_t os_ll_bytes;  /* DPSAMPLING_ONESIDED_LL_BYTES, at most DPS_ENV_LL_BYTES_MAX */
  int os_max_blocks;     /* DPSAMPLING_ONESIDED_MAX_BLOCKS; 0: unset (the SM count) */
  int os_gather_ll128;   /* DPSAMPLING_ONESIDED_GATHER_PROTO: 0 ll, 1 ll128 */
  int os_gather_threads; /* DPSAMPLING_ONESIDED_GATHER_THREADS */
  int pdl;               /* DPSAMPLING_PDL */
  int select_split;      /* DPSAMPLING_SELECT_SPLIT */
  int tiled_collect;     /* DPSAMPLING_TILED_COLLECT: DPS_TILED_AUTO, _NEVER, _ALWAYS */
  int exact_split;       /* DPSAMPLING_EXACT_SPLIT */
} dpsEnv;
dpsResult_t dpsReadEnv(dpsEnv* env);

/* ---- limits (core/config.c), checked once, in 64 bits ------------------- */
/* The longest one-sided timeout, from the config or DPSAMPLING_TIMEOUT_MS:
 * one day. */
#define DPS_TIMEOUT_MS_MAX 86400000
/* Whether `ms` is a timeout the library takes: 1 <= ms <= DPS_TIMEOUT_MS_MAX. */
int dpsTimeoutMsInRange(uint64_t ms);
/* The largest vocab_size: global indices travel between the ranks as 32 bits. */
#define DPS_VOCAB_MAX ((int64_t)UINT32_MAX)
/* How long dpsCommClose waits for the communicator's own work (core/teardown.c):
 * twice the timeout plus a second, in 64 bits. */
int64_t dpsCloseWaitMs(int timeout_ms);

/* ---- backends ------------------------------------------------------------ */
/* One dpsArgmax / dpsTopK call (core/select.c). */
typedef struct dpsSelectCall {
  int k;             /* 0: argmax, else top-k */
  int64_t rows;
  dpsDataType_t dtype;
  int64_t vocab_limit;
  int64_t* index;
  void* value;
  float* lse;
  const void* logits;
  const dpsVerifyWalkArgs* walk; /* tp == 1: the pass walks these chains after the tokens (NULL: no) */
  unsigned long long* count_rows; /* argmax: `rows` added once per call (a drawing call's greedy
                                     counter; NULL: none) */
} dpsSelectCall;

/* One step of a shard reduction through the backend (kernels/records.h):
 * local(op, sink) writes `words` per row for `rows` rows, the backend moves
 * them, merge(op, src) reads every rank's. tp > 1 only. Every shard
 * reduction takes this path: dpsArgmax and dpsTopK (core/select.c, one step
 * per call) and dpsSample (core/sample.c, one step per round). */
typedef struct dpsRecOp {
  const char* name;
  int64_t rows;
  int words; /* even, at most comm->rec_words */
  dpsResult_t (*local)(const struct dpsRecOp* op, const dpsRecSink* sink, cudaStream_t stream);
  dpsResult_t (*merge)(const struct dpsRecOp* op, const dpsRecSource* src, cudaStream_t stream);
  void* ctx;
} dpsRecOp;
/* The largest record of dpsSample's steps (words per row). */
#define DPS_REC_MAX_WORDS 154
/* The record capacity the backends size their buffers for (words per row):
 * the largest record of any op, top-k's of max_topk included (core/select.c;
 * comm->rec_words, fixed at creation). */
int dpsRecCapacityWords(int max_topk);

typedef struct dpsBackendOps {
  const char* name;
  /* At creation, after the core filled in comm: allocate what does not depend
   * on the logits dtype (verify-output buffers). Collective. */
  dpsResult_t (*init)(dpsComm_t comm);
  /* Once comm->dtype is fixed: allocate the dtype-dependent buffers (swap
   * output) and set comm->swap_out. Collective. */
  dpsResult_t (*prepare)(dpsComm_t comm);
  /* Arguments are validated by the core before these are called. */
  /* `s`: the call's shape (core/layout.h), checked and derived by the core. */
  dpsResult_t (*swap)(dpsComm_t comm, const dpsShape* s, const void* in, cudaStream_t stream);
  dpsResult_t (*gather_outputs)(dpsComm_t comm, const dpsShape* s, const int32_t* predict,
                                const int32_t* accept_index, const int32_t* accept_length,
                                cudaStream_t stream);
  dpsResult_t (*gather_logprobs)(dpsComm_t comm, const dpsShape* s, const float* in,
                                 cudaStream_t stream);
  /* Non-blocking: dpsSuccess or the asynchronous error (message set). May be NULL. */
  dpsResult_t (*async_error)(dpsComm_t comm);
  /* Frees backend state, locally: the communicator's work has finished, and
   * windows still registered are released without deregistration. Only
   * calls that leave another stream's CUDA-graph capture intact when made in
   * relaxed capture mode (dpsDeviceFree, ncclMemFree, cudaFreeHost: no
   * cudaFree, no device synchronization). Never fails. */
  void (*destroy)(dpsComm_t comm);
  /* At creation, local, before the agreement exchange (so that a failure
   * makes every rank fail): loads the backend's own kernels now; the core
   * (dpsPreloadBackend) adds the shard reductions' and names a failure.
   * May be NULL: nothing is loaded (the CPU tests' backends). */
  cudaError_t (*preload)(void);
  /* The collective part of teardown (dpsCommClose), on every rank together,
   * after the core waited for the communicator's own work. `failed`: whether
   * this rank knows the communicator failed. Returns the decision every rank
   * takes alike (e.g. after exchanging health), 1 = failed: then nothing
   * collective that could wait for a dead peer is done. May be NULL. */
  int (*close)(dpsComm_t comm, int failed);
  /* A records step (dpsRecOp) over the group, every shard reduction's
   * exchange at tp > 1 (argmax, top-k, sample): rows x words within
   * max_pad_bs*N x comm->rec_words. NULL: the backend has none. */
  dpsResult_t (*records)(dpsComm_t comm, const dpsRecOp* op, cudaStream_t stream);
} dpsBackendOps;

/* The registry (backends/registry.c): one entry per resolved backend. The
 * core asks the table, never a backend by name: which backends can run here,
 * which one `auto` picks, whether an operation may block the host, whether
 * dpsCommSetCollectives applies. Adding a backend is one entry there (and
 * its enum value in the public header). */
typedef struct {
  dpsBackend_t id;
  const char* name;
  /* `auto` picks the available entry of the highest priority. */
  int auto_priority;
  /* Whether the backend can run on the communicator's group (a local
   * probe; the ranks agree on the resolved backend afterwards). NULL:
   * wherever the group runs, on every rank alike (a fallback candidate). */
  int (*available)(dpsComm_t comm);
  /* Why `available` can say no (in the message of an explicit request). */
  const char* unavailable_why;
  /* Whether an operation of a prepared communicator may block the host
   * (dpsCommOpMayBlock). */
  int may_block;
  /* Whether the operations go through the replaceable collectives
   * (dpsCommSetCollectives); else why not (in its message). */
  int uses_collectives;
  const char* no_collectives_why;
  const dpsBackendOps* ops;
} dpsBackendEntry;
/* The entry of a resolved backend (dpsBackendNccl, dpsBackendOnesided), or NULL. */
const dpsBackendEntry* dpsBackendLookup(dpsBackend_t id);
/* The set of backends as a mask: bit (1u << id). */
#define DPS_BACKEND_BIT(id) (1u << (unsigned)(id))
/* Every entry whose probe says it can run on comm's group (comm NULL: only
 * those without a probe). */
unsigned dpsBackendsAvailable(dpsComm_t comm);
/* What `auto` resolves to among the backends of `mask`: the entry of the
 * highest priority, or NULL when the mask holds none. */
const dpsBackendEntry* dpsBackendPickAuto(unsigned mask);
/* auto's fallback after `failed` reported dpsUnavailable at its (agreed)
 * initialization: the next entry by priority whose availability needs no
 * probe, so every rank takes the same one without another agreement; NULL
 * when none is left. */
const dpsBackendEntry* dpsBackendFallback(const dpsBackendEntry* failed);
/* dpsResolveBackend with the availability of every backend as a mask. */
dpsResult_t dpsResolveBackendIn(dpsBackend_t requested, unsigned available, dpsBackend_t* resolved);

/* ---- the communicator ---------------------------------------------------- */
#define DPS_MAX_CAPTURES 8 /* streams remembered as capturing this communicator's work */

struct dpsComm {
  dpsConfig_t config;     /* as given, validated */
  dpsBackend_t backend;   /* resolved */
  dpsDataType_t dtype;    /* fixed logits dtype, or dpsDtypeUnset */
  int device;             /* CUDA ordinal */
  int timeout_ms;
  dpsEnv env;             /* the environment, read at creation */
  int initialized;        /* every persistent buffer exists */
  /* A dpsResult_t once the communicator broke (first error wins). Atomic:
   * dpsCommGetAsyncError may run on another thread than the operations. */
  _Atomic int sticky_error;

  /* The group (core/provider.h): where memory, exchanges and collectives
   * come from. nccl: the NCCL provider's communicator. */
  const struct dpsProvider* prov;
  void* prov_ctx;
  ncclComm_t nccl;
  int owns_nccl;

  dpsCollectives_t coll;  /* NULL members: NCCL */

  const dpsBackendOps* ops;
  void* backend_state;

  /* Persistent outputs: the verify outputs from dpsAllocVerifyOutputs (one
   * allocation, verify_mem, carved into vout), swap_out from the backend's
   * prepare. */
  void* verify_mem;
  dpsVerifyOutputs vout;
  void* swap_out;               /* [max_pad_bs/tp*N, V] of dtype */
  /* The shard reductions (dpsAllocShardState): dpsSample's scratch
   * (core/sample.c: state, partial records, tickets, counters), the device's
   * SM count and the argmax / top-k row-split table for the row splits. */
  void* sample_mem;
  int sms;
  dpsSelWaves sel_waves;
  int exact_clusters; /* tp == 1: clusters of dpsSample's exact kernel (0: none, see
                         dpsSampleArgs.exact_clusters) */
  /* The record capacity (dpsRecCapacityWords(config.max_topk)), set before
   * the backend's init, which sizes its records buffers by it. */
  int rec_words;
  /* Whether kernels may be launched with programmatic dependent launch:
   * DPSAMPLING_PDL and sm_90+ device code (set before the backend's init;
   * which launches use it: docs/design.md, "The per-call flow"). */
  int pdl;
  /* The grid cap of a shard reduction's local pass at tp == 1 (no backend
   * op runs), as the backend's own kernels; set by the backend's init (0:
   * none beyond the device's SMs). */
  int local_max_blocks;

  /* Teardown (core/teardown.c). */
  cudaStream_t aux;       /* internal stream: allocations, frees, the close exchange */
  cudaEvent_t work_done;  /* recorded after every operation that is not captured */
  struct {
    cudaStream_t stream;
    unsigned long long id;
    int used;
  } captures[DPS_MAX_CAPTURES]; /* captures that recorded our operations */
  int closed;             /* dpsCommClose ran: operations are refused */
  dpsComm_t next_pending; /* the process-wide list of released communicators */
};

/* Switches to comm->device, remembering the caller's device. */
typedef struct dpsDeviceGuard {
  int prev;
  int switched;
} dpsDeviceGuard;
dpsResult_t dpsDeviceEnter(dpsDeviceGuard* g, int device);
void dpsDeviceLeave(dpsDeviceGuard* g);

/* ---- teardown and capture-safe memory (core/teardown.c) ------------------
 * Teardown runs with this thread's capture mode relaxed and makes only calls
 * that leave another stream's global-mode capture intact (measured on H200:
 * event and stream queries and syncs, cudaFreeAsync, cudaFreeHost,
 * ncclMemFree, window deregistration, ncclCommDestroy; cudaFree and
 * cudaDeviceSynchronize break it). So device buffers come from the stream
 * ordered allocator on comm->aux and go back with cudaFreeAsync. */
typedef struct {
  enum cudaStreamCaptureMode prev;
} dpsCaptureRelax;
void dpsRelaxEnter(dpsCaptureRelax* r);
void dpsRelaxLeave(dpsCaptureRelax* r);

/* Creates comm->aux and comm->work_done (creation, before the backend's init). */
dpsResult_t dpsTeardownInit(dpsComm_t comm);
/* Zeroed device memory of `bytes` (at least 16) for `what` (in messages);
 * creation/prepare only (synchronizes comm->aux). */
dpsResult_t dpsDeviceAlloc(dpsComm_t comm, void** p, size_t bytes, const char* what);
/* Stream-ordered free on comm->aux; NULL is a no-op; sets *p to NULL. */
void dpsDeviceFree(dpsComm_t comm, void** p);
/* The verify outputs every backend needs (comm->vout): one allocation
 * (layout.h), made by the backend's init through this, freed by
 * dpsFreeVerifyOutputs. */
dpsResult_t dpsAllocVerifyOutputs(dpsComm_t comm);
/* DPS_SHARD_MAX_RANKS (dpsampling.h), the most ranks of a shard reduction,
 * equals the onesided limit (DPS_PEER_MAX_RANKS, checked in core/sample.c);
 * nccl alone allows more. */

/* Argument checks shared by the shard reductions (core/select.c): the
 * logits of a call (fills call's logits, rows, dtype, vocab_limit), and an
 * output buffer (NULL allowed unless required; aligned to `align`). */
dpsResult_t dpsCheckShardCall(dpsComm_t comm, const char* op, const void* logits, int64_t rows,
                              int64_t cols, dpsDataType_t dtype, int64_t vocab_limit,
                              dpsSelectCall* call);
dpsResult_t dpsCheckOutBuffer(const char* op, const char* name, const void* p, size_t align,
                              int required);
/* The steps of a checked argmax / top-k call, inside an operation the
 * caller entered (dpsVerifyChain's greedy calls run argmax's pass). */
dpsResult_t dpsSelectSteps(dpsComm_t comm, const char* op, const dpsSelectCall* call,
                           cudaStream_t stream);
/* The shard reductions' state (core/sample.c): the SM count, the argmax /
 * top-k row-split table (DPSAMPLING_SELECT_SPLIT) and dpsSample's scratch;
 * made by every backend's init on the communicator's device and freed by
 * its destroy. */
dpsResult_t dpsAllocShardState(dpsComm_t comm);
void dpsFreeShardState(dpsComm_t comm);
/* Loads the shard reductions' kernels (argmax, top-k, sample): part of
 * every backend's preload. */
cudaError_t dpsPreloadShardKernels(void);
/* Loads a backend's kernels and the shard reductions' (core/comm.c);
 * dpsCudaError naming the device's sm and the build's architectures. */
dpsResult_t dpsPreloadBackend(const dpsBackendOps* ops);
void dpsFreeVerifyOutputs(dpsComm_t comm);
/* Called by every operation after its backend call succeeded: records
 * work_done (uncaptured) or remembers the capture (captured). */
void dpsNoteWork(dpsComm_t comm, cudaStream_t stream, int capturing, unsigned long long capture_id);
/* Frees everything of a communicator now (its work has finished or can no
 * longer be waited for). Relaxed capture mode is the caller's. */
void dpsCommFreeNow(dpsComm_t comm);

/* ---- the operations' common steps (core/comm.c) ------------------------- */
/* An operation's view of its stream. */
typedef struct dpsOpCtx {
  dpsDeviceGuard g;
  cudaStream_t stream;
  int capturing;
  unsigned long long capture_id;
} dpsOpCtx;
/* Switches to the communicator's device and inspects the stream (capture
 * state, device), through the provider's device hooks. */
dpsResult_t dpsOpEnter(dpsComm_t comm, const char* op, cudaStream_t stream, dpsOpCtx* x);
/* An operation's first steps after its argument checks: refused once
 * closed (dpsCheckOpen), the communicator's health (dpsCommHealth), then
 * dpsOpEnter. */
dpsResult_t dpsOpBegin(dpsComm_t comm, const char* op, cudaStream_t stream, dpsOpCtx* x);
/* Ends an operation whose outcome is r (successful work is noted for teardown). */
void dpsOpLeave(dpsComm_t comm, dpsOpCtx* x, dpsResult_t r);
/* The argument checks of a logits input shared by the swap and the
 * selections: a logits dtype; aligned to its elements and, once the
 * communicator's dtype is fixed, of that dtype. `name` names the argument. */
dpsResult_t dpsCheckLogitsDtype(const char* op, dpsDataType_t dtype);
dpsResult_t dpsCheckLogitsData(dpsComm_t comm, const char* op, const char* name, const void* p,
                               dpsDataType_t dtype);
/* A stream's capture status and id (cudaStreamGetCaptureInfo of any
 * runtime version); allowed while the stream captures. */
static inline cudaError_t dpsStreamCaptureInfo(cudaStream_t stream,
                                               enum cudaStreamCaptureStatus* status,
                                               unsigned long long* id) {
#if CUDART_VERSION >= 12030
  return cudaStreamGetCaptureInfo(stream, status, id, NULL, NULL, NULL, NULL);
#else
  return cudaStreamGetCaptureInfo(stream, status, id);
#endif
}
/* Whether `stream` is the legacy (NULL, cudaStreamLegacy) or per-thread
 * (cudaStreamPerThread) default stream: a stream of the current device. */
static inline int dpsIsDefaultStream(cudaStream_t stream) {
  return stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}
/* dpsInvalidUsage after dpsCommClose. */
dpsResult_t dpsCheckOpen(dpsComm_t comm, const char* op);
/* The communicator's error, making an asynchronous one sticky. */
dpsResult_t dpsCommHealth(dpsComm_t comm);
/* The backend's, then the group's asynchronous error (non-blocking). */
dpsResult_t dpsCommAsyncError(dpsComm_t comm);

/* The effective one-sided timeout of a config: config, else
 * DPSAMPLING_TIMEOUT_MS, else DPS_DEFAULT_TIMEOUT_MS (core/config.c). */
dpsResult_t dpsResolveTimeoutMs(const dpsConfig_t* config, int* ms);

/* The default NCCL collectives (backends/nccl_collectives.c), behind the
 * NCCL provider and the public dpsNcclAllGatherBytes / dpsNcclAllToAllBytes.
 * The all-to-all is the one send/recv loop of the tree, without the
 * exchange with `skip_rank` (-1: none; the swap copies its own chunk
 * locally). */
dpsResult_t dpsNcclAllGather(ncclComm_t nccl, const void* sendbuf, void* recvbuf, size_t bytes,
                             cudaStream_t stream);
dpsResult_t dpsNcclAllToAllSkip(ncclComm_t nccl, const void* sendbuf, void* recvbuf, size_t bytes,
                                int skip_rank, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DPS_INTERNAL_H_ */
