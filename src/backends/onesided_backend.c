/* The `onesided` backend: NVLink load/store through NCCL symmetric windows.
 * Setup (what the ranks agree on, the windows, the device state and error
 * word), per-call dispatch to the kernels with onesided_plan.c's plans, the
 * records steps, the asynchronous error, and the collective close. The
 * windows, their peer addresses and the creation exchanges come from the
 * communicator's provider (core/provider.h); the DPSAMPLING_ONESIDED_*
 * variables are read and checked by the core at creation (comm->env,
 * core/config.c). Memory layout, agreed values, epochs, lines, the run-ahead
 * rule, timeouts and teardown: docs/design.md, "The onesided protocol".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "provider.h"
#include "registry.h"
#include "kernels/onesided_kernels.h"
#include "onesided_plan.h"

_Static_assert(DPS_PEER_MAX_RANKS <= DPS_PROVIDER_MAX_RANKS, "peer tables");
_Static_assert(DPS_ENV_GATHER_THREADS_DEFAULT == DPS_OS_GATHER_THREADS &&
                   DPS_ENV_GATHER_THREADS_MAX == DPS_OS_GATHER_THREADS_MAX,
               "DPSAMPLING_ONESIDED_GATHER_THREADS's range");
_Static_assert(DPS_OS_PROTO_LL == 0 && DPS_OS_PROTO_LL128 == 1, "comm->env.os_gather_ll128");

typedef struct {
  /* the configuration and what the ranks agreed on (tp, rank, grid cap
   * maxb, swap LL threshold ll_bytes, gather protocol gproto and block size
   * gthreads), the windows' layout and capacities (onesided_plan.h) */
  dpsOsLayout lay;
  dpsPeerCommon common; /* the kernels' common arguments (built at the end of init) */

  dpsSymMem a; /* flags + fail area + gather staging */
  dpsOsWindows va; /* window A's addresses for the plans */

  dpsSymMem b; /* swap_out + swap LL staging */
  dpsOsWindows vb; /* window B's addresses for the plans (once prepared) */
  int prepared;

  void* close_mem; /* the close exchange's words */
  dpsOsCloseWords close; /* inside `close_mem` */
  dpsPeerDevState* dstate;
  volatile unsigned long long* herr; /* host view */
  unsigned long long* herr_dev;      /* device view */
} OsState;

static const char* opName(int op) {
  switch (op) {
    case DPS_PEER_OP_SWAP: return "swap_batch_vocab";
    case DPS_PEER_OP_GATHER_OUTPUTS: return "gather_verify_outputs";
    case DPS_PEER_OP_GATHER_LOGPROBS: return "gather_verify_logprobs";
    case DPS_PEER_OP_RECORDS: return "shard reduction (argmax, topk or sample)";
    default: return "operation";
  }
}

static const char* waitName(int w) {
  switch (w) {
    case DPS_PEER_WAIT_READY: return "its ready flag";
    case DPS_PEER_WAIT_DONE: return "its completion flag";
    case DPS_PEER_WAIT_DATA: return "its data";
    case DPS_PEER_WAIT_PEER_FAILED: return "it after it reported its own failure";
    default: return "it";
  }
}

static unsigned long long hostErrWord(const OsState* st) {
  return st && st->herr ? *st->herr : 0ull;
}

static dpsResult_t osAsyncError(dpsComm_t comm) {
  OsState* st = (OsState*)comm->backend_state;
  unsigned long long w = hostErrWord(st);
  if (w == 0) return dpsSuccess;
  if (DPS_PEER_ERR_WAIT(w) == DPS_PEER_WAIT_PEER_FAILED)
    return dpsSetError(dpsTimeout,
                       "onesided %s: rank %d gave up (it timed out or saw a failure), so rank %d "
                       "stopped waiting for it. The communicator is unusable: destroy it",
                       opName(DPS_PEER_ERR_OP(w)), DPS_PEER_ERR_PEER(w), comm->config.rank);
  return dpsSetError(dpsTimeout,
                     "onesided %s: rank %d did not arrive within %d ms (peer dead or stuck?); "
                     "rank %d gave up waiting for %s. The communicator is unusable: destroy it",
                     opName(DPS_PEER_ERR_OP(w)), DPS_PEER_ERR_PEER(w), comm->timeout_ms,
                     comm->config.rank, waitName(DPS_PEER_ERR_WAIT(w)));
}

/* Whether a peer marked itself failed in our fail area (read after our own
 * work finished; an unreadable area counts as failed). */
static int peerFailed(const OsState* st) {
  if (st->a.base == NULL || !st->a.registered) return 0;
  unsigned long long f[DPS_PEER_MAX_RANKS] = {0};
  if (cudaMemcpy(f, (char*)st->a.base + st->lay.off_fail, sizeof f, cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (int r = 0; r < st->lay.tp; ++r)
    if (r != st->lay.rank && f[r] != 0) {
      dpsLog(DPS_LOG_INFO, "onesided rank %d: rank %d reported a failure", st->lay.rank, r);
      return 1;
    }
  return 0;
}

static dpsResult_t launchGather(const OsState* st, const dpsOsGatherArgs* a, int grid,
                                cudaStream_t stream);

/* The close exchange: every rank sends one health word to every peer with
 * the logprobs gather's kernel and staging (one more call in that
 * operation's sequence, which every rank makes at the same point), on the
 * internal stream behind the communicator's own work. Bounded by the
 * kernel's timeout. Returns 1 when any rank reported a failure or the
 * exchange itself failed (a peer is gone or gave up). */
static int closeExchange(dpsComm_t comm, OsState* st, int failed) {
  const uint32_t mine = failed ? 1u : 0u;
  cudaError_t ce = cudaStreamWaitEvent(comm->aux, comm->work_done, 0);
  if (ce == cudaSuccess)
    ce = cudaMemcpyAsync(st->close.in, &mine, sizeof mine, cudaMemcpyHostToDevice, comm->aux);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  dpsOsGatherArgs a;
  const int grid = dpsOsPlanCloseExchange(&st->lay, &st->common, &st->va, &st->close, &a);
  if (launchGather(st, &a, grid, comm->aux) != dpsSuccess ||
      cudaStreamSynchronize(comm->aux) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  if (hostErrWord(st) != 0) return 1;
  uint32_t all[DPS_PEER_MAX_RANKS] = {0};
  if (cudaMemcpy(all, st->close.out, sizeof(uint32_t) * (size_t)st->lay.tp,
                 cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (int r = 0; r < st->lay.tp; ++r)
    if (all[r] != 0) {
      dpsLog(DPS_LOG_INFO, "onesided rank %d: rank %d closes as failed; every rank skips the "
             "window deregistration", st->lay.rank, r);
      return 1;
    }
  return 0;
}

/* dpsCommClose's collective part: agree on the group's health, then
 * deregister the windows only if every rank is healthy, so that the ranks
 * take the same decision (at tp >= 3 a rank that saw no failure would
 * otherwise wait in the deregistration for a pair that skipped it). A rank
 * whose kernels already gave up does not run the exchange: its fail marks
 * in the peers' fail areas make their exchange give up at once. */
static int osClose(dpsComm_t comm, int failed) {
  OsState* st = (OsState*)comm->backend_state;
  if (st == NULL || !st->a.registered) return failed; /* nothing was registered */
  failed = failed || hostErrWord(st) != 0 || peerFailed(st);
  if (st->lay.tp > 1 && hostErrWord(st) == 0) failed = closeExchange(comm, st, failed);
  if (failed) return 1;
  /* same order on every rank (collective deregistration) */
  comm->prov->sym_deregister(comm, &st->b);
  comm->prov->sym_deregister(comm, &st->a);
  return 0;
}

static void osDestroy(dpsComm_t comm) {
  OsState* st = (OsState*)comm->backend_state;
  if (st == NULL) return;
  comm->prov->sym_free(comm, &st->b);
  comm->prov->sym_free(comm, &st->a);
  dpsDeviceFree(comm, &st->close_mem);
  dpsFreeVerifyOutputs(comm);
  dpsFreeShardState(comm);
  dpsDeviceFree(comm, (void**)&st->dstate);
  if (st->herr) (void)cudaFreeHost((void*)st->herr);
  free(st);
  comm->backend_state = NULL;
  comm->swap_out = NULL;
  comm->local_max_blocks = 0;
}

/* The PCI address of a device as one number (-1 if unknown). */
static int64_t pciKey(int dev) {
  int dom = 0, bus = 0, slot = 0;
  if (cudaDeviceGetAttribute(&dom, cudaDevAttrPciDomainId, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&slot, cudaDevAttrPciDeviceId, dev) != cudaSuccess)
    return -1;
  return ((int64_t)dom << 16) | ((int64_t)bus << 8) | (int64_t)slot;
}

/* Whether this rank reaches every peer over NVLink, which the LL128 gathers
 * need (PCIe does not deliver a 128-byte warp store as a unit). Each peer's
 * GPU (PCI address keys[r]) is looked up among the devices visible here, and
 * the pair must report native P2P atomics, which NVLink has and PCIe P2P
 * lacks. A peer that is not visible here (CUDA_VISIBLE_DEVICES) counts as
 * unverified. Leaves no CUDA error behind. */
static int nvlinkToAllPeers(const OsState* st, int dev, const int64_t* keys) {
  const cudaError_t before = cudaPeekAtLastError();
  int ndev = 0, ok = cudaGetDeviceCount(&ndev) == cudaSuccess;
  const int64_t mine = keys[st->lay.rank];
  for (int r = 0; ok && r < st->lay.tp; ++r) {
    /* a peer on this very GPU stores into its own device memory */
    if (r == st->lay.rank || (mine >= 0 && keys[r] == mine)) continue;
    int peer = -1;
    for (int d = 0; d < ndev && peer < 0; ++d)
      if (d != dev && keys[r] >= 0 && pciKey(d) == keys[r]) peer = d;
    int atomics = 0;
    ok = peer >= 0 &&
         cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, dev, peer) ==
             cudaSuccess &&
         atomics == 1;
  }
  if (before == cudaSuccess) (void)cudaGetLastError();
  return ok;
}

/* The kernels' common arguments: fixed once window A exists. */
static dpsOsWindows windowView(const dpsSymMem* w, int tp) {
  dpsOsWindows v;
  memset(&v, 0, sizeof v);
  v.base = (char*)w->base;
  for (int r = 0; r < tp; ++r) v.peer[r] = w->peer[r];
  return v;
}

static dpsPeerCommon buildCommon(dpsComm_t comm, OsState* st) {
  st->va = windowView(&st->a, st->lay.tp);
  return dpsOsMakeCommon(&st->lay, &st->va, st->dstate, st->herr_dev, comm->timeout_ms, comm->pdl);
}

/* Creation's local part, after the exchanges that fix the grid cap and the
 * gather protocol (st->lay's inputs): device state, error word, close words,
 * window A's memory. Nothing here talks to the peers, so a failure on one
 * rank (out of memory) is agreed on before the collective registration. */
static dpsResult_t initLocal(dpsComm_t comm, OsState* st) {
  dpsOsLayout* L = &st->lay;
  /* error word: device copy + mapped pinned host copy */
  DPS_CHECK(dpsDeviceAlloc(comm, (void**)&st->dstate, sizeof(dpsPeerDevState),
                           "the onesided device state"));
  void* h = NULL;
  DPS_CUDA_CHECK(cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(h, 0, 64);
  st->herr = (volatile unsigned long long*)h;
  DPS_CUDA_CHECK(cudaHostGetDevicePointer((void**)&st->herr_dev, h, 0));

  /* verify outputs (plain device memory) and window A */
  DPS_CHECK(dpsOsLayoutInit(L));
  DPS_CHECK(dpsAllocVerifyOutputs(comm));
  DPS_CHECK(dpsAllocShardState(comm));
  DPS_CHECK(dpsDeviceAlloc(comm, &st->close_mem, L->close_bytes, "the onesided close exchange"));
  st->close = dpsOsCloseWordsAt(st->close_mem);
  return comm->prov->sym_alloc(comm, &st->a, L->bytes_a, "flag/staging");
}

static dpsResult_t osInitImpl(dpsComm_t comm, OsState* st) {
  const dpsConfig_t* cfg = &comm->config;
  const dpsEnv* env = &comm->env;
  dpsOsLayout* L = &st->lay;
  memset(L, 0, sizeof *L);
  L->tp = cfg->tp_size;
  L->rank = cfg->rank;
  L->n = cfg->num_tokens_per_req;
  L->max_pad_bs = cfg->max_pad_bs;
  L->vocab = cfg->vocab_size;
  L->rec_words = comm->rec_words;
  if (L->tp > DPS_PEER_MAX_RANKS)
    return dpsSetError(dpsUnavailable,
                       "onesided backend supports at most %d ranks, tp_size=%d (use backend=nccl)",
                       DPS_PEER_MAX_RANKS, L->tp);

  int sms = 0, major = 0;
  DPS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm->device));
  DPS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, comm->device));
  /* {grid cap (DPSAMPLING_ONESIDED_MAX_BLOCKS, at most the SM count), LL
   * threshold, gather block size, PCI address of every rank (others' slots
   * at INT64_MAX, so the min fills them in)} */
  int64_t vals[3 + DPS_PEER_MAX_RANKS];
  vals[0] = env->os_max_blocks > 0 && env->os_max_blocks < sms ? env->os_max_blocks : sms;
  vals[1] = (int64_t)env->os_ll_bytes;
  const int askedThreads = env->os_gather_threads;
  vals[2] = askedThreads;
  const cudaError_t before = cudaPeekAtLastError();
  const int64_t myKey = pciKey(comm->device);
  if (myKey < 0 && before == cudaSuccess) (void)cudaGetLastError(); /* ours: forget it */
  for (int r = 0; r < L->tp; ++r) vals[3 + r] = r == L->rank ? myKey : INT64_MAX;
  DPS_CHECK(dpsAgreeMin(comm, dpsSuccess, "onesided settings", vals, 3 + L->tp));
  L->maxb = vals[0] < 1 ? 1 : (int)vals[0];
  L->ll_bytes = (uint64_t)vals[1];
  /* A gather block waits for lines its peers' same-numbered block stores,
   * so the grids must match: the ranks use the smallest block size asked. */
  L->gthreads = (int)vals[2];
  if (L->gthreads != askedThreads)
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: gather blocks of %d threads asked here, %d agreed (the smallest "
           "asked by any rank)",
           L->rank, askedThreads, L->gthreads);
  /* Gather protocol: LL128 only where validated (sm_90+, NVLink). */
  int64_t proto = env->os_gather_ll128 ? DPS_OS_PROTO_LL128 : DPS_OS_PROTO_LL;
  if (proto == DPS_OS_PROTO_LL128 && !(major >= 9 && nvlinkToAllPeers(st, comm->device, vals + 3))) {
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: DPSAMPLING_ONESIDED_GATHER_PROTO=ll128 needs sm_90+ and every peer's "
           "GPU visible here and on NVLink (native P2P atomics); using ll",
           L->rank);
    proto = DPS_OS_PROTO_LL;
  }
  const int64_t asked = proto;
  DPS_CHECK(dpsAgreeMin(comm, dpsSuccess, "the onesided gather protocol", &proto, 1));
  L->gproto = (int)proto;
  if (asked != proto)
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: DPSAMPLING_ONESIDED_GATHER_PROTO=ll128 here, but another rank asked "
           "for or could only verify ll: every rank uses ll",
           L->rank);

  /* Symmetric memory that is unavailable is dpsUnavailable on every rank
   * (auto then falls back to nccl): agreed before anyone registers, and
   * again on what the registration handed out. */
  DPS_CHECK(dpsAgreeStatus(comm, initLocal(comm, st), "onesided buffers"));
  DPS_CHECK(dpsAgreeStatus(comm, comm->prov->sym_register(comm, &st->a, "flag/staging"),
                           "onesided window registration"));
  st->common = buildCommon(comm, st);
  /* a shard reduction's local pass at tp == 1 (the core's, no records step)
   * stays within this backend's grid cap */
  comm->local_max_blocks = L->maxb;

  dpsLog(DPS_LOG_INFO,
         "onesided rank %d/%d: grid cap %d, swap LL up to %llu bytes per peer, window A %zu bytes, "
         "PDL %s, gathers %s in blocks of %d threads",
         L->rank, L->tp, L->maxb, (unsigned long long)L->ll_bytes, st->a.size,
         comm->pdl ? "on" : "off", L->gproto == DPS_OS_PROTO_LL128 ? "LL128" : "LL", L->gthreads);
  return dpsSuccess;
}

static dpsResult_t osInit(dpsComm_t comm) {
  OsState* st = (OsState*)calloc(1, sizeof(OsState));
  if (st == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  comm->backend_state = st;
  dpsResult_t r = osInitImpl(comm, st);
  /* on failure the core calls destroy(), which frees what exists */
  return r;
}

static dpsResult_t osPrepare(dpsComm_t comm) {
  OsState* st = (OsState*)comm->backend_state;
  if (st == NULL) return dpsSetError(dpsInternalError, "onesided: prepare before init");
  if (st->prepared) return dpsSuccess;
  size_t esize = dpsDataTypeSize(comm->dtype);
  if (esize == 0)
    return dpsSetError(dpsInternalError, "onesided: prepare with dtype=%d", (int)comm->dtype);
  /* Local part first (sizes, window B's memory), then one agreement on
   * every rank's status and {dtype, -dtype}: the swap window is sized by the
   * dtype and peers store into it, so every rank must fix the same one (the
   * first swap or prepare decides it), and a rank that ran out of memory
   * must not leave the others in the collective registration. */
  dpsResult_t local = dpsOsLayoutPrepare(&st->lay, esize);
  if (local == dpsSuccess) local = comm->prov->sym_alloc(comm, &st->b, st->lay.bytes_b, "swap output");
  int64_t x[2] = {(int64_t)comm->dtype, -(int64_t)comm->dtype};
  dpsResult_t r = dpsAgreeMin(comm, local, "preparing the swap window", x, 2);
  if (r == dpsSuccess && x[0] != -x[1])
    r = dpsSetError(dpsInvalidUsage,
                    "onesided: the ranks fixed different logits dtypes (this rank %s, others "
                    "%s..%s); every rank must prepare or swap with the same dtype",
                    dpsDataTypeName(comm->dtype), dpsDataTypeName((dpsDataType_t)x[0]),
                    dpsDataTypeName((dpsDataType_t)-x[1]));
  if (r != dpsSuccess) {
    comm->prov->sym_free(comm, &st->b); /* memory only: nothing was registered */
    return r;
  }
  DPS_CHECK(comm->prov->sym_register(comm, &st->b, "swap output"));
  st->vb = windowView(&st->b, st->lay.tp);
  comm->swap_out = st->b.base;
  st->prepared = 1;
  dpsLog(DPS_LOG_INFO, "onesided rank %d: swap window %zu bytes (%s, LL staging %lld lines)",
         st->lay.rank, st->b.size, dpsDataTypeName(comm->dtype), (long long)st->lay.cap_sw);
  return dpsSuccess;
}

/* The core checked the arguments (alignment to the element size included)
 * and the communicator's health (osAsyncError) before any operation. */
static dpsResult_t osSwap(dpsComm_t comm, const dpsShape* sh, const void* in,
                          cudaStream_t stream) {
  OsState* st = (OsState*)comm->backend_state;
  if (!st->prepared)
    return dpsSetError(dpsInternalError, "onesided swap: the swap buffers were not prepared");
  dpsOsSwapArgs a;
  dpsOsSwapPlan p;
  dpsOsPlanSwap(&st->lay, &st->common, &st->va, &st->vb, in, sh, &a, &p);
  cudaError_t ce = dpsOsLaunchSwap(&a, p.path, p.width, p.grid, stream);
  if (ce != cudaSuccess)
    return dpsSetError(dpsCudaError, "onesided swap: kernel launch (%s, %d B, grid %d) failed: %s",
                       p.path ? "LL" : "direct", p.width, p.grid, cudaGetErrorString(ce));
  return dpsSuccess;
}

static dpsResult_t launchGather(const OsState* st, const dpsOsGatherArgs* a, int grid,
                                cudaStream_t stream) {
  cudaError_t ce = dpsOsLaunchGather(a, st->lay.gproto, grid, st->lay.gthreads, stream);
  if (ce != cudaSuccess)
    return dpsSetError(dpsCudaError, "onesided %s: kernel launch failed: %s", opName(a->op),
                       cudaGetErrorString(ce));
  return dpsSuccess;
}

static dpsResult_t osGatherOutputs(dpsComm_t comm, const dpsShape* sh, const int32_t* predict,
                                   const int32_t* accept_index, const int32_t* accept_length,
                                   cudaStream_t stream) {
  OsState* st = (OsState*)comm->backend_state;
  dpsOsGatherArgs a;
  const int grid = dpsOsPlanGatherOutputs(&st->lay, &st->common, &st->va, &comm->vout, predict,
                                          accept_index, accept_length, sh, &a);
  return launchGather(st, &a, grid, stream);
}

static dpsResult_t osGatherLogprobs(dpsComm_t comm, const dpsShape* sh, const float* in,
                                    cudaStream_t stream) {
  OsState* st = (OsState*)comm->backend_state;
  dpsOsGatherArgs a;
  const int grid = dpsOsPlanGatherLogprobs(&st->lay, &st->common, &st->va, &comm->vout, in, sh, &a);
  return launchGather(st, &a, grid, stream);
}

/* A records step (argmax, top-k, a step of sample): the op's local pass
 * stores every row's record as LL lines into every rank's records staging,
 * the op's merge polls its own (timeout as the gathers). */
static dpsResult_t osRecords(dpsComm_t comm, const dpsRecOp* op, cudaStream_t stream) {
  OsState* st = (OsState*)comm->backend_state;
  const dpsOsLayout* L = &st->lay;
  if (op->rows * (op->words / 2) > L->cap_rec || op->words > L->rec_words)
    return dpsSetError(dpsInternalError, "%s: %lld rows x %d words exceed the staging", op->name,
                       (long long)op->rows, op->words);
  dpsRecSink sink;
  memset(&sink, 0, sizeof sink);
  sink.kind = DPS_REC_LL;
  sink.c = st->common;
  sink.op = DPS_PEER_OP_RECORDS;
  sink.cap = L->cap_rec;
  sink.max_blocks = L->maxb; /* waiting kernels of ranks sharing a GPU must all be resident */
  for (int r = 0; r < L->tp; ++r) sink.stage_peer.p[r] = st->va.peer[r] + L->off_rec;
  DPS_CHECK(op->local(op, &sink, stream));
  dpsRecSource src;
  memset(&src, 0, sizeof src);
  src.ll = 1;
  src.c = st->common;
  src.op = DPS_PEER_OP_RECORDS;
  src.stage = st->va.base + L->off_rec;
  src.cap = L->cap_rec;
  src.max_blocks = L->maxb;
  dpsResult_t r = op->merge(op, &src, stream);
  /* without its merge this step's records stay unread while the next step
   * overwrites the other parity: the ranks would no longer pair steps */
  if (r != dpsSuccess) (void)dpsCommMarkFailed(comm, r);
  return r;
}

static cudaError_t osPreload(void) {
  const cudaError_t e = dpsOsPreloadSwapKernels();
  return e == cudaSuccess ? dpsOsPreloadGatherKernels() : e;
}

const dpsBackendOps dpsOnesidedBackendOps = {
    .name = "onesided",
    .init = osInit,
    .prepare = osPrepare,
    .swap = osSwap,
    .gather_outputs = osGatherOutputs,
    .gather_logprobs = osGatherLogprobs,
    .async_error = osAsyncError,
    .destroy = osDestroy,
    .preload = osPreload,
    .close = osClose,
    .records = osRecords,
};
