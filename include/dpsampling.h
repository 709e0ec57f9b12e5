/*
 * dpsampling.h - batch-data-parallel sampling communication for tensor-parallel
 * LLM inference engines.
 *
 * With tensor parallelism over tp ranks the LM head leaves every rank with the
 * logits of the whole padded batch but only its slice of the vocabulary,
 * [pad_bs*N, V/tp] (N tokens per request: 1 for plain decode, >1 for
 * speculative verify). dpsampling moves those logits so that each rank samples
 * only its own pad_bs/tp requests, then gathers the verify results back:
 *
 *   dpsSwapBatchVocab           [pad_bs*N, V/tp] -> [pad_bs/tp*N, V]
 *   dpsGatherVerifyOutputs      3 x int32 [pad_bs/tp, N|1] -> [pad_bs, N|1]
 *   dpsGatherVerifyLogprobs     fp32 [pad_bs/tp, N] -> [pad_bs, N]
 *
 * Conventions (they hold for every function below unless its comment says
 * otherwise):
 *  - Every function returns a dpsResult_t. On failure dpsGetLastError() gives a
 *    message that names the offending argument and its value. Nothing is
 *    written to any output (pointer out-parameters or device buffers) when a
 *    call fails its argument checks.
 *  - Threading: a communicator may be used by one host thread at a time,
 *    except dpsCommGetAsyncError, which a watchdog thread may call at any
 *    time before dpsCommRelease. Different communicators are independent.
 *    dpsGetLastError() is per thread.
 *  - Devices: each communicator is bound to one CUDA device (the config's
 *    cuda_device). Calls switch to that device for their duration and restore
 *    the caller's current device before returning.
 *  - Streams: all device work of an operation is enqueued on the stream the
 *    caller passes, in stream order. Operations never synchronize the host,
 *    never allocate, and never copy between host and device, so they can be
 *    captured in a CUDA graph and replayed; a replay reads whatever the input
 *    buffers hold at replay time. A stream of another device than the
 *    communicator's is refused (dpsInvalidArgument). The onesided kernels are
 *    launched with programmatic dependent launch (sm_90+; set DPSAMPLING_PDL=0
 *    to turn it off): their launch overlaps the tail of the previous kernel
 *    on the stream, and each still waits for that kernel to complete before
 *    it touches memory, so stream order is unchanged. They also let the
 *    next kernel on the stream launch early: a following kernel that the
 *    application itself launches with programmatic stream serialization
 *    must call cudaGridDependencySynchronize() before reading our outputs,
 *    as PDL requires of every such kernel; ordinary launches are unaffected.
 *  - Collectives: every rank of the group must make the same sequence of
 *    operation calls with the same pad_bs (like NCCL collectives).
 *  - Outputs are persistent device buffers owned by the communicator, sized
 *    for max_pad_bs at initialization: every call returns the same pointers,
 *    and the contents stay valid until the next call of the same operation
 *    on this communicator (or dpsCommRelease).
 *
 * The header needs neither C++ nor the CUDA or NCCL headers: streams are
 * passed as cudaStream_t (struct CUstream_st *), NCCL communicators as
 * ncclComm_t (struct ncclComm *).
 */
#ifndef DPSAMPLING_H_
#define DPSAMPLING_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_VERSION_MAJOR 0
#define DPS_VERSION_MINOR 4
#define DPS_VERSION_PATCH 0
#define DPS_VERSION_CODE (DPS_VERSION_MAJOR * 10000 + DPS_VERSION_MINOR * 100 + DPS_VERSION_PATCH)

/* The library's exported functions; everything else in libdpsampling.so is
 * hidden (built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define DPS_API __attribute__((visibility("default")))
#else
#define DPS_API
#endif

struct CUstream_st; /* cudaStream_t */
struct ncclComm;    /* ncclComm_t   */

/* Status codes. */
typedef enum {
  dpsSuccess = 0,
  dpsInvalidArgument = 1, /* a bad value, shape, dtype or pointer; see dpsGetLastError() */
  dpsInvalidUsage = 2,    /* a call not allowed in the communicator's state (e.g. dtype changed) */
  dpsUnavailable = 3,     /* the requested backend cannot run on this group */
  dpsCudaError = 4,       /* a CUDA runtime call failed */
  dpsNcclError = 5,       /* an NCCL call failed */
  dpsSystemError = 6,     /* out of host or device memory, another system failure, or another
                             rank failed a step of creation or prepare (its error says why) */
  dpsTimeout = 7,         /* a peer did not arrive within the timeout; the communicator is unusable */
  dpsInternalError = 8,
  dpsNumResults = 9
} dpsResult_t;

/* Element types of the logits. */
typedef enum {
  dpsDtypeUnset = -1, /* "not known yet": fixed later by dpsCommPrepare or the first swap */
  dpsFloat32 = 0,
  dpsBfloat16 = 1,
  dpsFloat16 = 2
} dpsDataType_t;

/* Transport. dpsBackendAuto picks onesided when every rank of the group is
 * load/store reachable over NVLink (NCCL's LSA team covers the group) and
 * nccl otherwise. The environment variable DPSAMPLING_BACKEND (alias:
 * TOKENSPEED_DP_SAMPLING_BACKEND) overrides the request: see
 * dpsResolveBackend. */
typedef enum {
  dpsBackendAuto = 0,
  dpsBackendNccl = 1,
  dpsBackendOnesided = 2
} dpsBackend_t;

/* Opaque communicator. */
typedef struct dpsComm* dpsComm_t;

/* Configuration. Always start from DPS_CONFIG_INITIALIZER so that fields added
 * in later versions get their defaults. */
typedef struct {
  size_t size;                /* sizeof(dpsConfig_t); set by the initializer */
  unsigned int magic;         /* set by the initializer; catches uninitialized configs */
  int tp_size;                /* ranks in the group, >= 1 */
  int rank;                   /* this rank, 0 <= rank < tp_size */
  int max_pad_bs;             /* largest padded batch, a multiple of tp_size, >= 1 */
  int num_tokens_per_req;     /* N, >= 1 */
  int64_t vocab_size;         /* V, a multiple of tp_size, 1 <= V < 2^32 */
  dpsDataType_t logits_dtype; /* dtype of the logits, or dpsDtypeUnset */
  dpsBackend_t backend;       /* requested backend (environment may override) */
  int cuda_device;            /* CUDA device ordinal, or -1 for the current device */
  int timeout_ms;             /* onesided: how long a kernel waits for a peer before giving up,
                                 at most 86400000 (one day); 0 = DPSAMPLING_TIMEOUT_MS from
                                 the environment (the same range), else 5000 */
  int max_topk;               /* largest k of dpsTopK, 0..DPS_TOPK_MAX (0: no top-k buffers) */
} dpsConfig_t;

/* Largest k of dpsTopK. */
#define DPS_TOPK_MAX 64

#define DPS_CONFIG_MAGIC 0x64707331u
#define DPS_CONFIG_INITIALIZER                                                   \
  {                                                                              \
    sizeof(dpsConfig_t), DPS_CONFIG_MAGIC, 0, 0, 0, 1, 0, dpsDtypeUnset,         \
        dpsBackendAuto, -1, 0, DPS_TOPK_MAX                                      \
  }

/* ------------------------------------------------------------------------- */
/* Errors and versions                                                        */

/* Name of a status code, e.g. "dpsInvalidArgument". Never NULL. */
DPS_API const char* dpsGetErrorString(dpsResult_t result);

/* Message of the most recent failing call on this thread ("" if none). The
 * string is owned by the library and valid until the next call on this
 * thread. */
DPS_API const char* dpsGetLastError(void);

/* DPS_VERSION_CODE of the library actually loaded. */
DPS_API dpsResult_t dpsGetVersion(int* version);

/* Names: "auto", "nccl", "onesided"; "fp32", "bf16", "fp16", "unset". */
DPS_API const char* dpsBackendName(dpsBackend_t backend);
DPS_API const char* dpsDataTypeName(dpsDataType_t dtype);
/* Bytes per element: 4, 2, 2; 0 for dpsDtypeUnset or an invalid value. */
DPS_API size_t dpsDataTypeSize(dpsDataType_t dtype);

/* ------------------------------------------------------------------------- */
/* Configuration checks and backend resolution (host only, no GPU needed)     */

/* Checks a configuration with the rules every creation applies (tp_size >= 1,
 * 0 <= rank < tp_size, max_pad_bs >= 1 and divisible by tp_size, N >= 1,
 * vocab_size >= 1, below 2^32 and divisible by tp_size, valid dtype/backend,
 * 0 <= timeout_ms <= 86400000, 0 <= max_topk <= DPS_TOPK_MAX, sizes whose
 * byte counts fit in 64 bits). Does not touch the GPU. */
DPS_API dpsResult_t dpsConfigCheck(const dpsConfig_t* config);

/* Resolves a requested backend against the environment and the availability
 * of the one-sided transport, exactly as creation does:
 *  - If DPSAMPLING_BACKEND or TOKENSPEED_DP_SAMPLING_BACKEND is set (and not
 *    empty) its value ("auto", "nccl" or "onesided") replaces `requested`.
 *    Another value is dpsInvalidArgument naming the variable; both set to
 *    different values is dpsInvalidArgument naming both.
 *  - auto -> onesided if onesided_available, else nccl.
 *  - onesided when !onesided_available -> dpsUnavailable, with a message that
 *    says how to fall back (request auto or nccl, or set DPSAMPLING_BACKEND).
 * Writes *resolved only on success. */
DPS_API dpsResult_t dpsResolveBackend(dpsBackend_t requested, int onesided_available,
                              dpsBackend_t* resolved);

/* Parses "auto" | "nccl" | "onesided" (exact, lower case). */
DPS_API dpsResult_t dpsParseBackend(const char* name, dpsBackend_t* backend);

/* Whether the one-sided transport can run between the given local CUDA
 * devices: every pair has peer access (NVLink load/store), and neither
 * NCCL_CUMEM_ENABLE nor NCCL_WIN_ENABLE is 0 in the environment. Writes 0
 * when no GPU is present. This is a quick local check; creation decides with
 * NCCL's LSA team, which is authoritative. */
DPS_API dpsResult_t dpsOnesidedAvailableOnDevices(const int* cuda_devices, int count, int* available);

/* ------------------------------------------------------------------------- */
/* Bootstrap                                                                  */

/* Opaque bootstrap token (an ncclUniqueId inside). Made by one rank with
 * dpsGetUniqueId, then sent by the caller to every rank (any out-of-band
 * channel: it is plain bytes). */
typedef struct {
  char internal[128];
} dpsUniqueId;

DPS_API dpsResult_t dpsGetUniqueId(dpsUniqueId* unique_id);

/* Collective over the group: every rank calls it with the same id, its own
 * config->rank, and the same tp_size, max_pad_bs, num_tokens_per_req,
 * vocab_size, logits_dtype, effective timeout and resolved backend (checked:
 * a disagreement fails creation on every rank, naming both values). A rank
 * whose environment, backend choice or kernel loading fails makes every rank
 * fail with it (that rank with its own status; the others dpsSystemError,
 * "failed on another rank", or dpsUnavailable when every failure was
 * dpsUnavailable). Every DPSAMPLING_* variable is read here, whichever
 * backend resolves: one set to an invalid value fails creation with
 * dpsInvalidArgument naming the variable and its value (the table: docs/api.md,
 * "Environment variables"). But a config rejected by dpsConfigCheck, or an NCCL
 * communicator that does not match it, fails before any collective and
 * leaves the other ranks waiting in NCCL, which has no timeout: check configs
 * first. Creates the library's own NCCL communicator (destroyed by
 * dpsCommDestroy, aborted instead once the communicator failed), resolves
 * the backend, loads its kernels and allocates every persistent buffer (those
 * that depend on the logits dtype only if it is known). Blocks the host until
 * the group has joined. */
DPS_API dpsResult_t dpsCommInitRank(dpsComm_t* comm, const dpsUniqueId* unique_id,
                            const dpsConfig_t* config);

/* Like dpsCommInitRank over an NCCL communicator the caller owns. It must
 * span exactly the group (ncclCommCount == tp_size, ncclCommUserRank ==
 * rank) on cuda_device. The communicator is borrowed: dpsampling never
 * destroys it; the caller keeps it alive until after dpsCommClose. The
 * onesided backend registers a symmetric window on it (collective). */
DPS_API dpsResult_t dpsCommInitFromNccl(dpsComm_t* comm, struct ncclComm* nccl_comm,
                                const dpsConfig_t* config);

/* Teardown comes in two steps, so that an engine can close a communicator
 * at one collective point while tensors still alias its outputs:
 *
 * dpsCommClose: the collective step; call it on every rank together, outside
 *   any CUDA-graph capture of this communicator's operations. It waits for
 *   the communicator's own queued work (the work of its operations that were
 *   not captured; never a device-wide synchronize) for at most twice the
 *   timeout plus one second, then, onesided: the ranks exchange their health with a timed
 *   kernel, and only if every rank is healthy they deregister the symmetric
 *   windows (collective), else every rank skips that step alike; a
 *   library-owned NCCL communicator is destroyed (aborted after a failure).
 *   A dead peer makes close take about one timeout, never hang. Afterwards
 *   every operation fails with dpsInvalidUsage; queries still work, and the
 *   output buffers stay valid and keep their contents until dpsCommRelease.
 *   Refused with dpsInvalidUsage, changing nothing, while a stream that
 *   captured one of its operations is still capturing (end or abandon the
 *   capture first; such a stream must not be destroyed before the capture
 *   ends or a later uncaptured operation ran on it). A second close is a
 *   no-op. It returns dpsSuccess also when it found the group failed (the
 *   failure stays readable with dpsCommGetAsyncError); graph replays that
 *   contain its operations must have finished before it and must not be
 *   launched after it.
 * dpsCommRelease: local, makes no CUDA or NCCL call, so it is safe anywhere,
 *   a CUDA-graph capture on any stream and a DLPack deleter included: the
 *   communicator goes onto a process-wide list and is freed at the next safe
 *   point (dpsReleasePending, which creation, dpsCommClose and
 *   dpsCommDestroy also run), once its own work has finished. The handle is
 *   invalid afterwards. Releasing a communicator that was never closed
 *   skips the collective step (windows are not deregistered: NCCL releases
 *   them with its communicator) and aborts a library-owned NCCL communicator.
 * dpsReleasePending: frees every released communicator whose work has
 *   finished; makes only calls that leave a capture on another stream intact
 *   (not on the calling thread's own capturing stream: call it outside
 *   capture). *still_pending (may be NULL) gets how many wait for their work.
 * dpsCommDestroy = dpsCommClose + dpsCommRelease + dpsReleasePending: the
 *   one call for C engines that hold no views of the outputs. NULL is a
 *   no-op; a refused close releases nothing. */
DPS_API dpsResult_t dpsCommClose(dpsComm_t comm);
DPS_API dpsResult_t dpsCommRelease(dpsComm_t comm);
DPS_API dpsResult_t dpsReleasePending(int* still_pending);
DPS_API dpsResult_t dpsCommDestroy(dpsComm_t comm);

/* ------------------------------------------------------------------------- */
/* Queries                                                                    */

typedef struct {
  int tp_size, rank, max_pad_bs, num_tokens_per_req;
  int64_t vocab_size;
  dpsDataType_t logits_dtype;     /* dpsDtypeUnset until fixed */
  dpsBackend_t requested_backend; /* as passed in the config */
  dpsBackend_t backend;           /* resolved: dpsBackendNccl or dpsBackendOnesided */
  int cuda_device;
  int initialized;                /* 1 once every persistent buffer exists */
  int timeout_ms;                 /* effective one-sided timeout */
} dpsCommInfo_t;

DPS_API dpsResult_t dpsCommGetInfo(dpsComm_t comm, dpsCommInfo_t* info);

/* Asynchronous error state, in the style of ncclCommGetAsyncError: does not
 * synchronize. *async_error is dpsSuccess, or dpsTimeout once a one-sided
 * kernel gave up waiting for a peer (dpsGetLastError() then names the peer
 * and the operation). A communicator in error fails every later operation
 * that passes its argument checks with the same status; destroy it and
 * create a new one. Unlike the other calls, this one may run on another
 * thread (a watchdog) while an operation runs on the communicator, but not
 * concurrently with dpsCommClose or dpsCommRelease. */
DPS_API dpsResult_t dpsCommGetAsyncError(dpsComm_t comm, dpsResult_t* async_error);

/* Whether the next operation call (swap, gather, prepare) on this
 * communicator may block the host thread: *may_block is 1 while the
 * communicator is not yet prepared (the call may allocate, which is
 * collective) or when its backend's enqueue can wait for peers (nccl: NCCL
 * may set up connections lazily), 0 when the call only launches kernels
 * (a prepared onesided communicator). A binding that holds a lock such as
 * Python's GIL can keep it across a call that cannot block and must release
 * it otherwise, so that another rank's thread of the same process can reach
 * the collective. The answer holds until the next call on the communicator;
 * it works after dpsCommClose too. */
DPS_API dpsResult_t dpsCommOpMayBlock(dpsComm_t comm, int* may_block);

/* ------------------------------------------------------------------------- */
/* Operations                                                                 */

/* Fixes the logits dtype if it is still unset and allocates the buffers that
 * depend on it (collective when it allocates; do it outside graph capture).
 * dtype must be fp32, bf16 or fp16. If the dtype is already fixed (at
 * creation, by an earlier prepare, or by the first swap) this is a no-op that
 * succeeds for any of the three on a healthy communicator: the communicator
 * keeps its dtype. Ranks must fix the same dtype: the onesided backend checks
 * it here (all ranks get dpsInvalidUsage on a mismatch); the nccl backend
 * does not need to (it exchanges raw bytes). */
DPS_API dpsResult_t dpsCommPrepare(dpsComm_t comm, dpsDataType_t dtype);

/* swap_batch_vocab.
 * local_logits: device pointer, row-major contiguous [rows, cols] of `dtype`
 *   with rows == pad_bs*N and cols == V/tp, aligned to its element size;
 *   16-byte alignment gives the fastest path.
 * pad_bs: 1 <= pad_bs <= max_pad_bs, divisible by tp_size.
 * *output: set to the persistent buffer, row-major [pad_bs/tp*N, V]; row
 *   local_req*N+d holds global request rank*pad_bs/tp+local_req at draft
 *   position d, columns in vocabulary order.
 * If the communicator's dtype is unset, the first swap fixes it (and
 * allocates, which must happen outside graph capture); a later swap with a
 * different dtype is dpsInvalidUsage. */
DPS_API dpsResult_t dpsSwapBatchVocab(dpsComm_t comm, const void* local_logits, int64_t rows,
                              int64_t cols, dpsDataType_t dtype, int pad_bs, void** output,
                              struct CUstream_st* stream);

/* gather_verify_outputs.
 * predict, accept_index: int32 [reqs, n]; accept_length: int32 [reqs], with
 *   reqs == pad_bs/tp_size and n == num_tokens_per_req; 4-byte aligned.
 * Outputs (persistent): predict_out, accept_index_out int32 [pad_bs, N];
 *   accept_length_out int32 [pad_bs]. Row r from rank src lands at
 *   src*reqs + r. */
DPS_API dpsResult_t dpsGatherVerifyOutputs(dpsComm_t comm, const int32_t* predict,
                                   const int32_t* accept_index, const int32_t* accept_length,
                                   int64_t reqs, int64_t n, int pad_bs, int32_t** predict_out,
                                   int32_t** accept_index_out, int32_t** accept_length_out,
                                   struct CUstream_st* stream);

/* gather_verify_logprobs: fp32 [reqs, n] -> persistent fp32 [pad_bs, N]. */
DPS_API dpsResult_t dpsGatherVerifyLogprobs(dpsComm_t comm, const float* logprobs, int64_t reqs,
                                    int64_t n, int pad_bs, float** output,
                                    struct CUstream_st* stream);

/* ---- Greedy selection without moving the logits --------------------------
 * Every rank passes its own vocab shard of the same rows and every rank gets
 * the same result for every row; only a few words per row cross the ranks.
 * Both calls take their outputs in one order, values then indices (as
 * torch.max / torch.topk return them).
 * Semantics, identical on both backends and at every tp:
 *  - global index = rank * (V/tp) + column; only global indices below
 *    vocab_limit take part (1 <= vocab_limit <= V; pass V for no limit);
 *  - larger value first, ties to the lower global index; NaN counts as -inf,
 *    so it never beats a number; a row in which nothing beats -inf yields
 *    index 0 (argmax) or the lowest indices (top-k), with value -inf;
 *  - logits: device pointer, row-major [rows, cols] of `dtype`, cols == V/tp,
 *    1 <= rows <= max_pad_bs*N, aligned to its element size; dtype must be
 *    the communicator's logits dtype once that is fixed (these calls do not
 *    fix it); every rank passes the same rows, vocab_limit (and k);
 *  - outputs are the caller's device buffers (8-byte aligned int64, the
 *    value buffers aligned to their element size), written on the stream;
 *    nothing is written when a check fails;
 *  - stream-ordered, no allocation, no host synchronization, capturable;
 *    onesided: one local kernel and one exchange kernel, a dead peer ends in
 *    dpsTimeout; nccl: a local kernel, one all-gather, a merge kernel;
 *  - V is below 2^32 (global indices travel as 32 bits; dpsConfigCheck);
 *  - tp_size <= 8 (as for dpsSample): on an nccl communicator of more ranks
 *    these calls return dpsUnavailable (the swap and the gathers run).
 * dpsArgmax: value [rows] of dtype (NULL: not wanted), index int64 [rows]
 *   (required), lse fp32 [rows] (NULL: not wanted), the row's logsumexp over
 *   the valid columns (NaN if one is NaN), so the argmax token's logprob is
 *   value - lse.
 * dpsTopK: the k (1 <= k <= config max_topk, k <= vocab_limit) best of every
 *   row, best first: values [rows, k] of dtype (NULL: not wanted), indices
 *   int64 [rows, k] (required). */
DPS_API dpsResult_t dpsArgmax(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                      dpsDataType_t dtype, int64_t vocab_limit, void* value, int64_t* index,
                      float* lse, struct CUstream_st* stream);
DPS_API dpsResult_t dpsTopK(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                    dpsDataType_t dtype, int k, int64_t vocab_limit, void* values,
                    int64_t* indices, struct CUstream_st* stream);

/* ---- Sampling without moving the logits ------------------------------------
 * dpsSample draws one token per row from the rows' vocab shards: every rank
 * passes its own [rows, V/tp] shard of the same rows and every rank gets every
 * row's token (and optionally its raw logprob). Only a fixed-size record per
 * row crosses the ranks. The distribution, the noise and the rules are
 * docs/sampling.md; in short, per row:
 *  - temperature T == 0: greedy (the argmax, ties to the lower index); else
 *    the filters in vLLM's order, on the scores l/T: min-p (keep
 *    exp((l - l_max)/T) >= min_p), top-k (exactly the first k in the order
 *    value descending, index ascending: indices tied with the k-th value are
 *    cut by index, where vLLM keeps them all), top-p (the smallest prefix of
 *    that order whose mass reaches top_p);
 *  - the token is argmax over the kept set of l/T + G, G a Gumbel variate from
 *    Philox4x32-10 keyed by the row's seed and counting over (offset, global
 *    index): exact in distribution, the same token at every tp, on both
 *    backends, whatever the batch around the row, bit for bit on every call;
 *    a user can recompute it on the host (docs/sampling.md); tp_size <= 8
 *    (more ranks: dpsUnavailable);
 *  - logprob: the raw log_softmax of the row at the token (no temperature, no
 *    filters); NaN counts as -inf; a row with nothing valid yields token 0 and
 *    logprob -inf; global indices >= vocab_limit never take part.
 * Parameters: a scalar for every row, or a device array [rows] (non-NULL
 * array wins). Scalars are checked at the call; arrays on the device, by the
 * call's first kernel: a call with an invalid array entry writes nothing
 * (tokens and logprobs keep their contents), is counted in
 * dpsSampleStats_t.invalid_calls, and dpsCommGetSampleStats names the first
 * such row, argument and value. Valid: 0 <= T < inf (0: greedy), top_k any
 * (<= 0: off), 0 < top_p <= 1 (1: off), 0 <= min_p < 1 (0: off), seed and
 * offset any uint64.
 * Paths: a row is drawn in one pass and one exchange when its kept set lies
 * within DPS_SAMPLE_CANDIDATES candidates per rank or needs no threshold
 * (greedy, temperature only, top-k <= DPS_SAMPLE_CANDIDATES, nuclei and min-p
 * sets of that size); any other row is drawn exactly by a threshold search
 * (more passes and exchanges); dpsCommGetSampleStats counts both.
 * Same contract as dpsArgmax otherwise (shapes, alignment, dtype, stream
 * order, no allocation or host synchronization, capturable with every
 * parameter array changing between replays, dpsTimeout for a dead peer on
 * onesided). Requires V <= 2^23 (the fixed-point masses). */
#define DPS_SAMPLE_CANDIDATES 64

typedef struct {
  size_t size; /* sizeof(dpsSampleParams_t); set by the initializer */
  /* Scalars, for every row whose array below is NULL. */
  float temperature; /* 1 */
  int64_t top_k;     /* 0: off */
  float top_p;       /* 1: off */
  float min_p;       /* 0: off */
  uint64_t seed;     /* 0 */
  uint64_t offset;   /* 0 */
  /* Device arrays [rows] (NULL: the scalar). top_k: int32 or int64 (at most
   * one of the two). seed and offset: the uint64 bits (an int64 tensor's). */
  const float* temperatures;
  const int32_t* top_ks;
  const int64_t* top_ks_i64;
  const float* top_ps;
  const float* min_ps;
  const uint64_t* seeds;
  const uint64_t* offsets;
} dpsSampleParams_t;

#define DPS_SAMPLE_PARAMS_INITIALIZER \
  { sizeof(dpsSampleParams_t), 1.0f, 0, 1.0f, 0.0f, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL }

/* tokens: int64 [rows] (required); logprobs: fp32 [rows] (NULL: not wanted). */
DPS_API dpsResult_t dpsSample(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                              dpsDataType_t dtype, int64_t vocab_limit,
                              const dpsSampleParams_t* params, int64_t* tokens, float* logprobs,
                              struct CUstream_st* stream);

/* ---- Speculative verify without moving the logits -------------------------
 * dpsVerifyChain is the whole data-parallel chain verify (swap, verify,
 * gather) as one call on the vocab shards; only dpsSample's records cross the
 * ranks and every rank gets the full batch's outputs. rows == pad_bs*N (N:
 * the config's num_tokens_per_req; 1 <= pad_bs <= max_pad_bs, any pad_bs):
 * row b*N + j is request b's position j. Every row is drawn exactly as
 * dpsSample draws it (greedy when T == 0), with request b's parameters, its
 * position j drawing at offset offset[b] + j; then each request's chain is
 * walked (docs/sampling.md, "Speculative verify"), t[b, j] the token of row
 * b*N + j:
 *  - accept_index[b, 0] = b*N; for i = 1..N-1 while candidates[b, i] ==
 *    t[b, i-1]: predict[b, i-1] = t[b, i-1], accept_index[b, i] = b*N + i;
 *    acc = the last such i (0 if none);
 *  - predict[b, acc] = t[b, acc]; accept_length[b] = acc + 1 (the bonus token
 *    counted); every other entry is -1 (accept_index) or 0 (predict, logprobs).
 * candidates: int32 [pad_bs, N] (4-byte aligned), the same on every rank,
 *   every entry in [0, V) (column 0, the last accepted token, is checked but
 *   not compared).
 * params: as dpsSample's, with device arrays of pad_bs entries (one per
 *   request). An invalid array entry or a candidate outside [0, V) is found
 *   on the device: that call writes nothing, is counted in
 *   dpsSampleStats_t.invalid_calls, and dpsCommGetSampleStats names the first
 *   one. The rows verify draws count in the path counters too, except in a
 *   call that only wants tokens from greedy rows (a scalar temperature 0, no
 *   temperature, top_p or min_p array, no logprobs, mask or soft-cap): its
 *   rows are drawn by dpsArgmax's pass (the same tokens, a faster pass).
 * vocab_mask: NULL, or int32 [rows, ceil(V/32)] (4-byte aligned), the
 *   full-vocabulary grammar mask on every rank: bit i % 32 of word i / 32 of
 *   a row set = token i allowed; a disallowed token is a -inf logit.
 * softcap: 0 (off), or c > 0 finite: every finite logit l becomes
 *   c * tanh(l / c), rounded once to fp32 (computed the same way on host and
 *   device: docs/sampling.md), before the mask and everything else; NaN and
 *   +-inf logits stay as they are.
 * Outputs (persistent, valid until the next dpsVerifyChain): predict,
 *   accept_index int32 [pad_bs, N], accept_length int32 [pad_bs]; logprobs
 *   (NULL: not wanted) fp32 [pad_bs, N], the raw log_softmax of the capped,
 *   masked row at each predict entry (dpsSample's logprob).
 * Same contract as dpsSample otherwise (tp_size <= 8, V <= 2^23, stream
 * order, no allocation, capturable, dpsTimeout for a dead peer). */
DPS_API dpsResult_t dpsVerifyChain(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                                   dpsDataType_t dtype, int64_t vocab_limit, int pad_bs,
                                   const int32_t* candidates, const dpsSampleParams_t* params,
                                   const int32_t* vocab_mask, float softcap, int32_t** predict,
                                   int32_t** accept_index, int32_t** accept_length,
                                   float** logprobs, struct CUstream_st* stream);

/* Counters of the rows dpsSample drew on this communicator, by path. Reading
 * them waits for the sampling work already enqueued on any stream to finish
 * (a copy on the communicator's own stream): not for the hot path, and not
 * while another thread captures in cudaStreamCaptureModeGlobal. When
 * invalid_calls > 0, dpsGetLastError() afterwards names the first invalid row,
 * argument and value seen since the previous read. */
typedef struct {
  uint64_t rows_greedy; /* T == 0, or nothing valid in the row */
  uint64_t rows_fast;   /* one pass, one exchange */
  uint64_t rows_exact;  /* the threshold search */
  uint64_t invalid_calls;
} dpsSampleStats_t;
DPS_API dpsResult_t dpsCommGetSampleStats(dpsComm_t comm, dpsSampleStats_t* stats);

/* ------------------------------------------------------------------------- */
/* Replaceable collectives (nccl backend)                                     */

/* The nccl backend moves data with these two collectives over device buffers;
 * byte counts are per rank. Both are enqueued on `stream` and must follow
 * NCCL semantics:
 *  - all_gather: recvbuf[i*bytes .. (i+1)*bytes) <- rank i's sendbuf.
 *  - all_to_all: recvbuf[i*bytes ..) <- rank i's sendbuf[rank*bytes ..).
 * The default table calls NCCL on the communicator's NCCL communicator.
 * A replacement (e.g. to count calls, or to route through an engine's own
 * communication layer) must keep these semantics; it is called from the
 * operation's host thread, during capture when the operation is captured.
 * gather_verify_outputs calls all_gather exactly once per call. */
typedef struct {
  void* ctx;
  dpsResult_t (*all_gather)(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                            struct CUstream_st* stream);
  dpsResult_t (*all_to_all)(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                            struct CUstream_st* stream);
} dpsCollectives_t;

/* Installs `table` (copied; NULL restores NCCL). A NULL function pointer in
 * the table means "use NCCL for this one". Not a collective. Only the nccl
 * backend uses collectives: a table for a communicator of another backend
 * (onesided) is dpsUnavailable naming the backend, and nothing is installed
 * (NULL is accepted on every backend). */
DPS_API dpsResult_t dpsCommSetCollectives(dpsComm_t comm, const dpsCollectives_t* table);

/* The default collectives themselves, over any NCCL communicator (e.g. for a
 * binding that offers them to an engine as its collectives object). Both are
 * enqueued on `stream` (the caller makes the communicator's device current),
 * make no host synchronization, and follow the semantics above with
 * `bytes` per rank: all_gather reads `bytes` from sendbuf and writes
 * nranks*bytes to recvbuf; all_to_all reads and writes nranks*bytes. bytes
 * == 0 is a no-op that succeeds. nccl_comm must not be NULL, nor sendbuf and
 * recvbuf when bytes > 0 (dpsInvalidArgument, naming the argument); an NCCL
 * failure is dpsNcclError naming the NCCL call. */
DPS_API dpsResult_t dpsNcclAllGatherBytes(struct ncclComm* nccl_comm, const void* sendbuf, void* recvbuf,
                                  size_t bytes, struct CUstream_st* stream);
DPS_API dpsResult_t dpsNcclAllToAllBytes(struct ncclComm* nccl_comm, const void* sendbuf, void* recvbuf,
                                 size_t bytes, struct CUstream_st* stream);

#ifdef __cplusplus
}
#endif

#endif /* DPSAMPLING_H_ */
