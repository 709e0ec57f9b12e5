/* The harness of test_gpu_virtual_ranks: options, groups of tp virtual
 * ranks on one GPU (a host thread, a stream and a communicator per rank),
 * the per-config environment, and one rank's calls of the three operations
 * checked against the fixtures' host reference. The scenarios are in
 * tests/gpu/test_gpu_virtual_ranks.c.
 *
 * Every communicator is created with dpsCommInitVirtual (tests/support:
 * the library's creation path with the virtual-rank provider) and used only
 * through the public API. Include after defining _POSIX_C_SOURCE. */
#ifndef DPS_VR_HARNESS_H_
#define DPS_VR_HARNESS_H_

#include <stdint.h>

#include "../gpu_common.h"
#include "../select_common.h"
#include "testsupport.h"

#define VR_MAX_TP 8
#define VR_MAX_SETS 4
#define VR_REAL_VOCAB 152064
#define VR_BARRIER_S 120 /* a host barrier waiting longer than this gives up */
#define VR_DEV 0

enum { VR_NCCL = 0, VR_ONESIDED = 1 };
enum {
  VR_SC_SHAPES = 1,
  VR_SC_RUNAHEAD = 2,
  VR_SC_GRAPH = 4,
  VR_SC_TIMEOUT = 8,
  VR_SC_SELECT = 16,
  VR_SC_SAMPLE = 32,
  VR_SC_VERIFY = 64,
  VR_SC_MIXED = 128
};
#define VR_SC_ALL \
  (VR_SC_SHAPES | VR_SC_RUNAHEAD | VR_SC_GRAPH | VR_SC_TIMEOUT | VR_SC_SELECT | VR_SC_SAMPLE | \
   VR_SC_VERIFY | VR_SC_MIXED)
/* the onesided gathers' protocol (DPSAMPLING_ONESIDED_GATHER_PROTO) */
enum { VR_GATHER_LL = 0, VR_GATHER_LL128 = 1 };
#define VR_LL_DEFAULT ((uint64_t)256 * 1024) /* the backend's default swap LL threshold */
#define VR_LL_ALWAYS ((uint64_t)16 << 20)    /* its maximum: LL wherever the staging fits */

/* ---- options (vrStart) ------------------------------------------------------ */
typedef struct {
  int tps[VR_MAX_TP + 1]; /* tps[tp] = 1: run it */
  int backends;           /* bit VR_NCCL, bit VR_ONESIDED */
  int scenarios;          /* VR_SC_* */
  int full, small;
  int timeout_ms;
  int blocks_override; /* DPS_VR_BLOCKS */
  int sms, major;
} VrOptions;

extern VrOptions g_vr;

/* ---- one configuration ---------------------------------------------------- */
typedef struct {
  dpsDataType_t dtype;
  int v_local; /* 0: VR_REAL_VOCAB / tp */
  int n;
  int mr; /* max requests per rank: max_pad_bs = tp * mr */
  int gproto;        /* onesided: VR_GATHER_* */
  int pdl;           /* onesided: DPSAMPLING_PDL */
  uint64_t ll_bytes; /* onesided: DPSAMPLING_ONESIDED_LL_BYTES */
  int cross; /* assert that the shapes cross the swap's LL/direct switch */
} VrCfg;

/* ---- one virtual rank ------------------------------------------------------- */
typedef struct {
  cudaStream_t s;
  dpsComm_t comm;       /* created and destroyed by the rank's own thread */
  size_t in_off, v_off; /* input pointer offsets (alignment variety) */
  void* in_alloc[VR_MAX_SETS];
  void* in[VR_MAX_SETS];
  void* vin_alloc[VR_MAX_SETS];
  int32_t *p[VR_MAX_SETS], *ai[VR_MAX_SETS], *al[VR_MAX_SETS];
  float* lp[VR_MAX_SETS];
  void* snap_alloc[VR_MAX_SETS]; /* runahead: every call's outputs */
  void* snap_out[VR_MAX_SETS];
  int32_t *snap_p[VR_MAX_SETS], *snap_ai[VR_MAX_SETS], *snap_al[VR_MAX_SETS];
  float* snap_lp[VR_MAX_SETS];
  void *h_in, *h_out;
  int32_t *h_p, *h_ai, *h_al, *h_po, *h_aio, *h_alo;
  float *h_lp, *h_lpo;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  /* timeout scenario: what dpsCommGetAsyncError reported, and when */
  dpsResult_t async;
  char async_msg[512];
  double stall_s;
  /* eager calls (vrNow): the barrier before them passed, the last one
   * enqueued, the stream waited for; vrReportTimes prints them when the
   * calls fail (was a rank's host thread late?) */
  double t[3];
  SelBufs sel; /* select scenario */
} VrRank;

typedef struct VrGroup {
  int tp, backend, nsets, timeout_ms;
  VrCfg cfg;
  int max_pad_bs, v_local;
  int64_t vocab;
  size_t esize;
  char desc[200];
  dpsVirtualGroup* vg; /* the provider's group: barrier, symmetric memory, collectives */
  VrRank r[VR_MAX_TP];
  cudaEvent_t join[VR_MAX_TP], fork; /* nccl graph: one capture over every rank's stream */
  long passed, failed;               /* checks */
  double t0;                         /* vrNow at creation: VrRank.t's origin */
} VrGroup;

typedef int (*VrBody)(VrGroup* g, int rank, const void* arg);

typedef struct {
  long passed, failed, skipped;
} VrTally;

/* A failing call names the configuration and the rank (rank < 0: the main
 * thread) and returns 1 from the caller. */
void vrReportFail(const VrGroup* g, int rank, const char* call, const char* status,
                  const char* msg);
#define VR_OK(g, rank, call)                                                        \
  do {                                                                              \
    const dpsResult_t r_ = (call);                                                  \
    if (r_ != dpsSuccess) {                                                         \
      vrReportFail((g), (rank), #call, dpsGetErrorString(r_), dpsGetLastError());   \
      return 1;                                                                     \
    }                                                                               \
  } while (0)
#define VR_CUDA(g, rank, call)                                                      \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                        \
      vrReportFail((g), (rank), #call, "CUDA error", cudaGetErrorString(e_));       \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

/* ---- start ------------------------------------------------------------------ */
/* The start of main, before any CUDA call: sets CUDA_DEVICE_MAX_CONNECTIONS,
 * reads the options and the environment, needs a GPU (else the SKIP line),
 * arms the watchdog, prints the header. Returns -1 to go on, else the exit
 * status. */
int vrStart(int argc, char** argv);
const char* vrBackendName(int backend);
/* The grid cap of every onesided kernel at tp ranks on the one GPU. */
int vrCap(int tp);
double vrNow(void);
void vrSleepMs(long ms);

/* ---- a rank's thread ------------------------------------------------------------ */
int vrBarrier(VrGroup* g); /* 1: the group was aborted (a rank failed) */
void vrAbort(VrGroup* g);
int vrCount(VrGroup* g, int ok); /* counts a check; 1 when it failed */
void vrReportTimes(const VrGroup* g, int rank, const char* what); /* the rank's t[] */
/* dpsCommGetAsyncError must report dpsSuccess (else counted as a failure). */
int vrCheckAsync(VrGroup* g, int rank, const char* what);
size_t vrOutBytes(const VrGroup* g, int pad_bs);
int vrReqs(int mr, int c); /* requests per rank of call c: changes on every call */

int vrSwap(VrGroup* g, int rank, int set, int pad_bs, void** out);
int vrGatherOutputs(VrGroup* g, int rank, int set, int pad_bs, int32_t** po, int32_t** aio,
                    int32_t** alo);
int vrGatherLogprobs(VrGroup* g, int rank, int set, int pad_bs, float** lpo);
/* swap + both gathers on set `set`, enqueued on the rank's stream */
int vrCall(VrGroup* g, int rank, int set, int pad_bs, void** out, int32_t** po, int32_t** aio,
           int32_t** alo, float** lpo);
/* Inputs of (pad_bs, step) into set `set` (waits for the copies). */
int vrUpload(VrGroup* g, int rank, int set, int pad_bs, int step);
/* Downloads and checks every output of one call (the stream's work is done). */
int vrCheckCall(VrGroup* g, int rank, const void* out, const int32_t* po, const int32_t* aio,
                const int32_t* alo, const float* lpo, int pad_bs, int step, const char* what);
/* Upload, meet, call, wait, check, meet: one eager round. */
int vrEagerRound(VrGroup* g, int rank, int pad_bs, int step, const char* what);
/* Graphs: vrCaptureOps captures what fn enqueues on each rank's stream
 * (onesided: a graph per rank; nccl: one graph over every rank's stream,
 * rank 0's, since the virtual collectives join them) into r->graph /
 * r->exec, and meets; vrReplay launches it (nccl: rank 0 only), waits and
 * meets. */
typedef int (*VrEnqueue)(VrGroup* g, int rank, void* ctx);
int vrCaptureOps(VrGroup* g, int rank, VrEnqueue fn, void* ctx);
int vrReplay(VrGroup* g, int rank);
/* A body with device buffers of its own (ctx: the scenario's): alloc, run,
 * release, each rank on its thread. Allocates and frees only while no rank
 * has work in flight (cudaFree waits for the device, where a peer's kernel
 * may wait for this rank); an alloc failure counts as a failed check; after
 * a failure of run the group is aborted and the buffers leak (freeing could
 * wait for an aborted peer's kernel). Returns 1 on any failure. */
int vrRunWithBuffers(VrGroup* g, int rank, VrEnqueue alloc, VrEnqueue run,
                     void (*release)(void* ctx), void* ctx);

/* ---- the runner (main thread) ----------------------------------------------------- */
/* Creates the group (streams, buffers, the provider's group), sets the
 * configuration's environment, runs fn on every rank's thread between its
 * communicator's creation and destruction, and destroys the group. */
void vrRunGroup(VrTally* t, int tp, int backend, const VrCfg* cfg, int nsets, int variant,
                VrBody fn, const void* arg, const char* scenario);
int vrSkipLarge(int tp, const VrCfg* c);

/* ---- scenario sample (vr_sample.c) ------------------------------------------------- */
/* dpsSample at tp ranks against the tp = 1 result of the same full logits
 * (computed by the first call, on both backends) and the host reference. */
void vrRunSample(VrTally* t, int tp, int backend);

/* ---- scenario verify (vr_verify.c) ------------------------------------------------- */
/* dpsVerifyChain at tp ranks: sample + the host walk bit for bit; with a mask
 * and a soft-cap, the host reference and the first group bit for bit. */
void vrRunVerify(VrTally* t, int tp, int backend);

/* ---- scenario mixed (vr_mixed.c) -------------------------------------------------- */
/* argmax (with and without lse), sample, top-k and verify interleaved on one
 * communicator without waiting between them, three eager rounds and a graph
 * replayed with changed parameters, every output against the host
 * references. */
void vrRunMixed(VrTally* t, int tp, int backend);

#endif /* DPS_VR_HARNESS_H_ */
