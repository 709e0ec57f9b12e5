/* The `onesided` backend: NVLink load/store through NCCL symmetric windows.
 * Setup (what the ranks agree on, the windows, the device state and error
 * word), per-call dispatch to the kernels with onesided_plan.c's plans, the
 * records steps, the asynchronous error, and the collective close. The
 * windows, their peer addresses and the creation exchanges come from the
 * communicator's provider (core/provider.h). Memory layout, agreed values,
 * epochs, lines, the run-ahead rule, timeouts and teardown: docs/design.md,
 * "The onesided protocol".
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

#define OS_DEFAULT_LL_BYTES (256u * 1024u)
#define OS_MAX_LL_BYTES (16u * 1024u * 1024u)
_Static_assert(DPS_OS_MAX_RANKS <= DPS_PROVIDER_MAX_RANKS, "peer tables");

typedef struct {
  int tp, rank, n;
  int64_t vocab;
  int maxb;          /* agreed grid cap */
  uint64_t ll_bytes; /* agreed swap LL threshold (per-peer chunk bytes) */
  dpsOsCommon common; /* the kernels' common arguments (built at the end of init) */
  int pdl;           /* programmatic dependent launch (DPSAMPLING_PDL, default on) */
  int gthreads;      /* gather block size (DPSAMPLING_ONESIDED_GATHER_THREADS) */
  int gproto;        /* agreed gather protocol, DPS_OS_PROTO_* */

  dpsOsLayout lay; /* window layout and capacities (onesided_plan.h) */

  dpsSymMem a; /* flags + fail area + gather staging */
  size_t off_fail; /* = lay.off_fail */
  dpsOsWindows va; /* window A's addresses for the plans */

  dpsSymMem b; /* swap_out + swap LL staging */
  dpsOsWindows vb; /* window B's addresses for the plans (once prepared) */
  int prepared;

  void* outputs; /* the close exchange's words */
  dpsOsOutputs out; /* inside `outputs` */
  dpsOsDevState* dstate;
  volatile unsigned long long* herr; /* host view */
  unsigned long long* herr_dev;      /* device view */
} OsState;

static const char* opName(int op) {
  switch (op) {
    case DPS_OS_OP_SWAP: return "swap_batch_vocab";
    case DPS_OS_OP_GATHER_OUTPUTS: return "gather_verify_outputs";
    case DPS_OS_OP_GATHER_LOGPROBS: return "gather_verify_logprobs";
    case DPS_OS_OP_RECORDS: return "shard reduction (argmax, topk or sample)";
    default: return "operation";
  }
}

static const char* waitName(int w) {
  switch (w) {
    case DPS_OS_WAIT_READY: return "its ready flag";
    case DPS_OS_WAIT_DONE: return "its completion flag";
    case DPS_OS_WAIT_DATA: return "its data";
    case DPS_OS_WAIT_PEER_FAILED: return "it after it reported its own failure";
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
  if (DPS_OS_ERR_WAIT(w) == DPS_OS_WAIT_PEER_FAILED)
    return dpsSetError(dpsTimeout,
                       "onesided %s: rank %d gave up (it timed out or saw a failure), so rank %d "
                       "stopped waiting for it. The communicator is unusable: destroy it",
                       opName(DPS_OS_ERR_OP(w)), DPS_OS_ERR_PEER(w), comm->config.rank);
  return dpsSetError(dpsTimeout,
                     "onesided %s: rank %d did not arrive within %d ms (peer dead or stuck?); "
                     "rank %d gave up waiting for %s. The communicator is unusable: destroy it",
                     opName(DPS_OS_ERR_OP(w)), DPS_OS_ERR_PEER(w), comm->timeout_ms,
                     comm->config.rank, waitName(DPS_OS_ERR_WAIT(w)));
}

/* Whether a peer marked itself failed in our fail area (read after our own
 * work finished; an unreadable area counts as failed). */
static int peerFailed(const OsState* st) {
  if (st->a.base == NULL || !st->a.registered) return 0;
  unsigned long long f[DPS_OS_MAX_RANKS] = {0};
  if (cudaMemcpy(f, (char*)st->a.base + st->off_fail, sizeof f, cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (int r = 0; r < st->tp; ++r)
    if (r != st->rank && f[r] != 0) {
      dpsLog(DPS_LOG_INFO, "onesided rank %d: rank %d reported a failure", st->rank, r);
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
    ce = cudaMemcpyAsync(st->out.close_in, &mine, sizeof mine, cudaMemcpyHostToDevice, comm->aux);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  dpsOsGatherArgs a;
  const int grid = dpsOsPlanCloseExchange(&st->lay, &st->common, &st->va, &st->out, &a);
  if (launchGather(st, &a, grid, comm->aux) != dpsSuccess ||
      cudaStreamSynchronize(comm->aux) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  if (hostErrWord(st) != 0) return 1;
  uint32_t all[DPS_OS_MAX_RANKS] = {0};
  if (cudaMemcpy(all, st->out.close_out, sizeof(uint32_t) * (size_t)st->tp,
                 cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (int r = 0; r < st->tp; ++r)
    if (all[r] != 0) {
      dpsLog(DPS_LOG_INFO, "onesided rank %d: rank %d closes as failed; every rank skips the "
             "window deregistration", st->rank, r);
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
  if (st->tp > 1 && hostErrWord(st) == 0) failed = closeExchange(comm, st, failed);
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
  dpsDeviceFree(comm, &st->outputs);
  dpsFreeVerifyOutputs(comm);
  dpsFreeShardState(comm);
  dpsDeviceFree(comm, (void**)&st->dstate);
  if (st->herr) (void)cudaFreeHost((void*)st->herr);
  free(st);
  comm->backend_state = NULL;
  comm->swap_out = NULL;
  comm->local_pdl = 0;
  comm->local_max_blocks = 0;
}

static uint64_t envLLBytes(void) {
  uint64_t v = OS_DEFAULT_LL_BYTES;
  if (dpsEnvUint("DPSAMPLING_ONESIDED_LL_BYTES", &v) < 0) {
    dpsLog(DPS_LOG_WARN, "DPSAMPLING_ONESIDED_LL_BYTES='%s' is not a byte count; using %u",
           getenv("DPSAMPLING_ONESIDED_LL_BYTES"), OS_DEFAULT_LL_BYTES);
    return OS_DEFAULT_LL_BYTES;
  }
  return v > OS_MAX_LL_BYTES ? OS_MAX_LL_BYTES : v;
}

/* DPSAMPLING_ONESIDED_MAX_BLOCKS: the most blocks any onesided kernel of
 * this communicator runs (default: the SM count; the swap's blocks must all
 * be resident at once). Fewer leave SMs to work that overlaps ours, and let
 * several ranks share one GPU (the virtual-rank tests). Agreed at creation
 * (the smallest asked). */
static int64_t envMaxBlocks(int sms) {
  uint64_t v = (uint64_t)sms;
  if (dpsEnvUint("DPSAMPLING_ONESIDED_MAX_BLOCKS", &v) < 0 || v < 1) {
    dpsLog(DPS_LOG_WARN, "DPSAMPLING_ONESIDED_MAX_BLOCKS='%s' is not a positive count; using %d",
           getenv("DPSAMPLING_ONESIDED_MAX_BLOCKS"), sms);
    return sms;
  }
  return v < (uint64_t)sms ? (int64_t)v : sms;
}

/* DPSAMPLING_PDL: 1 (default) launches the kernels with programmatic
 * dependent launch (kernels/device.cuh), 0 with plain stream order. Local:
 * it changes no protocol, so ranks need not agree. */
static int envPdl(void) {
  uint64_t v = 1;
  if (dpsEnvUint("DPSAMPLING_PDL", &v) < 0 || v > 1) {
    dpsLog(DPS_LOG_WARN, "DPSAMPLING_PDL='%s' is neither 0 nor 1; using 1", getenv("DPSAMPLING_PDL"));
    return 1;
  }
  return (int)v;
}

/* DPSAMPLING_ONESIDED_GATHER_THREADS: threads per gather block, a multiple
 * of 32 in [32, 1024] (default 256). A thread owns one LL line, or an eighth
 * of an LL128 line, per call, so fewer, larger blocks trade block count for
 * block size. Agreed at creation (the smallest asked). */
static int envGatherThreads(void) {
  uint64_t v = DPS_OS_GATHER_THREADS;
  if (dpsEnvUint("DPSAMPLING_ONESIDED_GATHER_THREADS", &v) < 0 || v < 32 ||
      v > DPS_OS_GATHER_THREADS_MAX || v % 32 != 0) {
    dpsLog(DPS_LOG_WARN,
           "DPSAMPLING_ONESIDED_GATHER_THREADS='%s' is not a multiple of 32 in [32, %d]; using %d",
           getenv("DPSAMPLING_ONESIDED_GATHER_THREADS"), DPS_OS_GATHER_THREADS_MAX,
           DPS_OS_GATHER_THREADS);
    return DPS_OS_GATHER_THREADS;
  }
  return (int)v;
}

/* DPSAMPLING_ONESIDED_GATHER_PROTO: "ll" (default) or "ll128". On 2 x H200
 * LL128 measured 0.18-0.75 us slower than LL for every gather up to
 * pad_bs 512 x N 8 (docs/performance.md), hence opt-in. The ranks agree on the minimum,
 * so LL128 runs only if every rank asks for it and verifies NVLink. */
static int envGatherProto(void) {
  const char* v = getenv("DPSAMPLING_ONESIDED_GATHER_PROTO");
  if (v == NULL || *v == '\0' || strcmp(v, "ll") == 0) return DPS_OS_PROTO_LL;
  if (strcmp(v, "ll128") == 0) return DPS_OS_PROTO_LL128;
  dpsLog(DPS_LOG_WARN, "DPSAMPLING_ONESIDED_GATHER_PROTO='%s' is neither ll nor ll128; using ll", v);
  return DPS_OS_PROTO_LL;
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
  const int64_t mine = keys[st->rank];
  for (int r = 0; ok && r < st->tp; ++r) {
    /* a peer on this very GPU stores into its own device memory */
    if (r == st->rank || (mine >= 0 && keys[r] == mine)) continue;
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

static dpsOsCommon buildCommon(dpsComm_t comm, OsState* st) {
  st->va = windowView(&st->a, st->tp);
  return dpsOsMakeCommon(&st->lay, &st->va, st->dstate, st->herr_dev, comm->timeout_ms, st->pdl);
}

/* Creation's local part, after the exchanges that fix the grid cap and the
 * gather protocol: device state, error word, outputs, window A's memory.
 * Nothing here talks to the peers, so a failure on one rank (out of memory)
 * is agreed on before the collective registration. */
static dpsResult_t initLocal(dpsComm_t comm, OsState* st) {
  const dpsConfig_t* cfg = &comm->config;
  dpsOsLayout* L = &st->lay;
  memset(L, 0, sizeof *L);
  L->tp = st->tp;
  L->rank = st->rank;
  L->n = st->n;
  L->max_pad_bs = cfg->max_pad_bs;
  L->vocab = st->vocab;
  L->maxb = st->maxb;
  L->ll_bytes = st->ll_bytes;
  L->gproto = st->gproto;
  L->gthreads = st->gthreads;
  L->rec_words = comm->rec_words;
  /* error word: device copy + mapped pinned host copy */
  DPS_CHECK(dpsDeviceAlloc(comm, (void**)&st->dstate, sizeof(dpsOsDevState),
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
  DPS_CHECK(dpsDeviceAlloc(comm, &st->outputs, L->close_bytes, "the onesided close exchange"));
  st->out = dpsOsOutputsOf(L, comm->verify_mem, st->outputs);
  st->off_fail = L->off_fail;
  return comm->prov->sym_alloc(comm, &st->a, L->bytes_a, "flag/staging");
}

static dpsResult_t osInitImpl(dpsComm_t comm, OsState* st) {
  const dpsConfig_t* cfg = &comm->config;
  st->tp = cfg->tp_size;
  st->rank = cfg->rank;
  st->n = cfg->num_tokens_per_req;
  st->vocab = cfg->vocab_size;
  if (st->tp > DPS_OS_MAX_RANKS)
    return dpsSetError(dpsUnavailable,
                       "onesided backend supports at most %d ranks, tp_size=%d (use backend=nccl)",
                       DPS_OS_MAX_RANKS, st->tp);

  int sms = 0, major = 0;
  DPS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm->device));
  DPS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, comm->device));
  /* {SM count, LL threshold, gather block size, PCI address of every rank
   * (others' slots at INT64_MAX, so the min fills them in)} */
  int64_t vals[3 + DPS_OS_MAX_RANKS];
  vals[0] = envMaxBlocks(sms);
  vals[1] = (int64_t)envLLBytes();
  const int askedThreads = envGatherThreads();
  vals[2] = askedThreads;
  const cudaError_t before = cudaPeekAtLastError();
  const int64_t myKey = pciKey(comm->device);
  if (myKey < 0 && before == cudaSuccess) (void)cudaGetLastError(); /* ours: forget it */
  for (int r = 0; r < st->tp; ++r) vals[3 + r] = r == st->rank ? myKey : INT64_MAX;
  DPS_CHECK(dpsAgreeMin(comm, vals, 3 + st->tp));
  st->maxb = vals[0] < 1 ? 1 : (int)vals[0];
  st->ll_bytes = (uint64_t)vals[1];
  /* A gather block waits for lines its peers' same-numbered block stores,
   * so the grids must match: the ranks use the smallest block size asked. */
  st->gthreads = (int)vals[2];
  if (st->gthreads != askedThreads)
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: gather blocks of %d threads asked here, %d agreed (the smallest "
           "asked by any rank)",
           st->rank, askedThreads, st->gthreads);
  /* Gather protocol: LL128 only where validated (sm_90+, NVLink). */
  int64_t proto = envGatherProto();
  if (proto == DPS_OS_PROTO_LL128 && !(major >= 9 && nvlinkToAllPeers(st, comm->device, vals + 3))) {
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: DPSAMPLING_ONESIDED_GATHER_PROTO=ll128 needs sm_90+ and every peer's "
           "GPU visible here and on NVLink (native P2P atomics); using ll",
           st->rank);
    proto = DPS_OS_PROTO_LL;
  }
  const int64_t asked = proto;
  DPS_CHECK(dpsAgreeMin(comm, &proto, 1));
  st->gproto = (int)proto;
  if (asked != proto)
    dpsLog(DPS_LOG_WARN,
           "onesided rank %d: DPSAMPLING_ONESIDED_GATHER_PROTO=ll128 here, but another rank asked "
           "for or could only verify ll: every rank uses ll",
           st->rank);
  st->pdl = envPdl();
  if (st->pdl) {
    /* A kernel launched with PDL that was not compiled with the wait would
     * read its inputs before the previous kernel finished: never do that. */
    int ok = 0;
    cudaError_t ce = dpsOsKernelsSupportPdl(&ok);
    if (ce != cudaSuccess || !ok) {
      dpsLog(DPS_LOG_INFO,
             "onesided rank %d: programmatic dependent launch off (%s)", st->rank,
             ce != cudaSuccess ? cudaGetErrorString(ce)
                               : "the device code running here was built for an architecture "
                                 "before sm_90");
      st->pdl = 0;
    }
  }

  /* Symmetric memory that is unavailable is dpsUnavailable on every rank
   * (auto then falls back to nccl): agreed before anyone registers, and
   * again on what the registration handed out. */
  DPS_CHECK(dpsAgreeStatus(comm, initLocal(comm, st), "onesided buffers"));
  DPS_CHECK(dpsAgreeStatus(comm, comm->prov->sym_register(comm, &st->a, "flag/staging"),
                           "onesided window registration"));
  st->common = buildCommon(comm, st);
  /* a shard reduction's local pass at tp == 1 (the core's, no records step)
   * launches as this backend's kernels do */
  comm->local_pdl = st->pdl;
  comm->local_max_blocks = st->maxb;

  dpsLog(DPS_LOG_INFO,
         "onesided rank %d/%d: grid cap %d, swap LL up to %llu bytes per peer, window A %zu bytes, "
         "PDL %s, gathers %s in blocks of %d threads",
         st->rank, st->tp, st->maxb, (unsigned long long)st->ll_bytes, st->a.size,
         st->pdl ? "on" : "off", st->gproto == DPS_OS_PROTO_LL128 ? "LL128" : "LL", st->gthreads);
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
  /* Local part first (sizes, window B's memory), then one exchange of
   * {dtype, -dtype, ok}: the swap window is sized by the dtype and peers
   * store into it, so every rank must fix the same one (the first swap or
   * prepare decides it), and a rank that ran out of memory must not leave
   * the others in the collective registration. */
  dpsResult_t local = dpsOsLayoutPrepare(&st->lay, esize);
  if (local == dpsSuccess) local = comm->prov->sym_alloc(comm, &st->b, st->lay.bytes_b, "swap output");
  char msg[512] = "";
  if (local != dpsSuccess) snprintf(msg, sizeof msg, "%s", dpsGetLastError());
  int64_t x[3] = {(int64_t)comm->dtype, -(int64_t)comm->dtype, local == dpsSuccess ? 1 : 0};
  dpsResult_t r = dpsAgreeMin(comm, x, 3);
  if (r == dpsSuccess && local != dpsSuccess) r = dpsSetError(local, "%s", msg);
  if (r == dpsSuccess && x[0] != -x[1])
    r = dpsSetError(dpsInvalidUsage,
                    "onesided: the ranks fixed different logits dtypes (this rank %s, others "
                    "%s..%s); every rank must prepare or swap with the same dtype",
                    dpsDataTypeName(comm->dtype), dpsDataTypeName((dpsDataType_t)x[0]),
                    dpsDataTypeName((dpsDataType_t)-x[1]));
  if (r == dpsSuccess && x[2] == 0)
    r = dpsSetError(dpsSystemError,
                    "onesided rank %d: preparing the swap window failed on another rank (see that "
                    "rank's error); every rank fails",
                    st->rank);
  if (r != dpsSuccess) {
    comm->prov->sym_free(comm, &st->b); /* memory only: nothing was registered */
    return r;
  }
  DPS_CHECK(comm->prov->sym_register(comm, &st->b, "swap output"));
  st->vb = windowView(&st->b, st->tp);
  comm->swap_out = st->b.base;
  st->prepared = 1;
  dpsLog(DPS_LOG_INFO, "onesided rank %d: swap window %zu bytes (%s, LL staging %lld lines)",
         st->rank, st->b.size, dpsDataTypeName(comm->dtype), (long long)st->lay.cap_sw);
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
  cudaError_t ce = dpsOsLaunchGather(a, st->gproto, grid, st->gthreads, stream);
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
  const int grid = dpsOsPlanGatherOutputs(&st->lay, &st->common, &st->va, &st->out, predict,
                                          accept_index, accept_length, sh, &a);
  return launchGather(st, &a, grid, stream);
}

static dpsResult_t osGatherLogprobs(dpsComm_t comm, const dpsShape* sh, const float* in,
                                    cudaStream_t stream) {
  OsState* st = (OsState*)comm->backend_state;
  dpsOsGatherArgs a;
  const int grid = dpsOsPlanGatherLogprobs(&st->lay, &st->common, &st->va, &st->out, in, sh, &a);
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
  sink.op = DPS_OS_OP_RECORDS;
  sink.cap = L->cap_rec;
  sink.max_blocks = st->maxb; /* waiting kernels of ranks sharing a GPU must all be resident */
  for (int r = 0; r < L->tp; ++r) sink.stage_peer.p[r] = st->va.peer[r] + L->off_rec;
  DPS_CHECK(op->local(op, &sink, stream));
  dpsRecSource src;
  memset(&src, 0, sizeof src);
  src.ll = 1;
  src.c = st->common;
  src.op = DPS_OS_OP_RECORDS;
  src.stage = st->va.base + L->off_rec;
  src.cap = L->cap_rec;
  src.max_blocks = st->maxb;
  dpsResult_t r = op->merge(op, &src, stream);
  /* without its merge this step's records stay unread while the next step
   * overwrites the other parity: the ranks would no longer pair steps */
  if (r != dpsSuccess) (void)dpsCommMarkFailed(comm, r);
  return r;
}

static dpsResult_t osPreload(void) {
  cudaError_t e = dpsOsPreloadSwapKernels();
  if (e == cudaSuccess) e = dpsOsPreloadGatherKernels();
  if (e == cudaSuccess) e = dpsPreloadShardKernels();
  if (e != cudaSuccess) {
    char note[320];
    dpsDeviceCodeNote(note, sizeof note);
    return dpsSetError(dpsCudaError, "%s: loading the kernels failed: %s (%s)", "onesided",
                       cudaGetErrorString(e), note);
  }
  return dpsSuccess;
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
