/* dps-perf: the harness and its operations (nccl-tests style).
 *
 * The harness does everything that is the same for every operation:
 *   cli.c     options, the list of cases, main (the processes: one per GPU,
 *             testing/'s fxRunRanks);
 *   run.c     the rank body: the communicators, the timing of one case (eager
 *             call + warm-up, `iters` calls captured into one CUDA graph,
 *             timed replays), the agreement between ranks after every phase;
 *   bufs.c    the buffers: host inputs, device buffers, the uploads before the
 *             calls and the copies back before every check;
 *   peaks.c   the link-peak and HBM-peak measurements (kernels: peak.cu);
 *   report.c  the header, the table (or CSV) and the totals.
 * Each operation is one file (op_swap.c, op_gather.c, op_logprobs.c, ...)
 * that defines one DpOp descriptor; ops.c lists them in dpOps[], in the
 * order of the table.
 *
 * Adding an operation: write op_NAME.c defining
 *
 *   const DpOp dpOpName = {
 *       .name = "name",                 -o name and the op column
 *       .aliases = kAliases,            other -o names (NULL-terminated), or NULL
 *       .elem_type = "int32",           dtype column of cases without a logits dtype
 *                                       (may be left out when every case has one)
 *       .add_cases = addCases,          its cases from -s/-d, or its defaults
 *       .valid = valid,                 can this case run at this tp?
 *       .bytes = bytes,                 bytes column (algbw = bytes / time)
 *       .host_init = hostInit,          its host inputs (and references)
 *       .setup = setup,                 its device buffers and state
 *       .state_size = sizeof(State),    the state run and check read
 *       .run = run, .check = check,
 *   };
 *
 * (DP_OP below writes it for callbacks of these names; op_logprobs.c uses it),
 * and add `extern const DpOp dpOpName;` and `&dpOpName` to ops.c (the -o
 * list, the help and the header line come from that table). An -o item
 * selects every operation whose name or alias it is (op_sample.c's family
 * shares the alias "sample"). Every callback is required but `note` and
 * `prepare`; `.hbm = 1` marks an operation bound by its local HBM reads. An
 * operation without logits can take the harness's dpAddTokenCases and
 * dpValidTokens (gather and logprobs do), one on logits shards
 * dpAddShapeCases with default `shapes` (argmax, topk, the sample and verify
 * families). If its shapes read -s/-d
 * differently from the existing operations, say so in usage() (cli.c).
 * op_logprobs.c is the smallest example.
 *
 * bytes is what each rank sends across the link per call; the harness
 * derives algbw = bytes / time and link = algbw / peer store peak from it.
 *
 * The cases. A case (DpCase) is an operation and a shape: pad_bs, N, and
 * for operations on logits the vocab and the logits dtype (vocab 0 and
 * dpsDtypeUnset otherwise). vocab and dtype are also the communicator's
 * (vocab 0: the communicator gets vocab_size = tp and no logits dtype):
 * cases with the same N, vocab and dtype share one communicator per backend,
 * sized for the largest pad_bs among them.
 *
 * The buffers belong to the harness (bufs.c): the operation declares them
 * and the harness allocates, fills, copies back and frees them.
 *   host_init     once per case and rank (shared by the backends): declares
 *                 the host inputs of steps 1 and 2 (dpHostIn) and fills
 *                 them; host-only data (references) from dpHostMem; 0, or 1
 *                 when out of host memory;
 *   then for each backend:
 *   setup         fills the operation's own state b->op (state_size bytes,
 *                 zeroed: what run and check read) and declares the device
 *                 buffers: dpDevIn (the device copy of a host input),
 *                 dpDevOut (an output the call writes into), dpLibOut (an
 *                 output the library owns: the pointer the call returns),
 *                 dpDevTmp (device scratch); host scratch from dpMem. A
 *                 failed declaration records why in *l and returns NULL (and
 *                 every later one too); setup returns nonzero when *l holds
 *                 a failure;
 *   fill(step 1)  the harness copies step 1's host inputs to their device
 *                 copies, writes the poison byte over the outputs that have
 *                 one, calls prepare(step 1) when the operation has one, and
 *                 synchronizes the stream;
 *   run           1 + warmup eager calls;
 *   check(step 1) the harness copies every output back (dpDevOut's and
 *                 dpLibOut's host copies), then check returns the number of
 *                 wrong elements (skipped with --no-check);
 *   fill(step 2), run x iters under stream capture, graph replays (timed),
 *   check(step 2); then the harness frees the buffers, and after the last
 *   backend the host inputs.
 * run must be capturable (no host synchronization) and launch on `s` only.
 * Callbacks that fail record why with dpSetLocal / DP_TRY_CUDA and return
 * nonzero (check: its return value is ignored once *l holds a failure). The
 * harness agrees on every rank's outcome between the phases, so a failure on
 * one rank fails the case on all of them.
 */
#ifndef DPS_PERF_H_
#define DPS_PERF_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- outcomes --------------------------------------------------------------- */
enum { DP_OK = 0, DP_UNAVAIL = 1, DP_ERR = 2 };
#define DP_MSG 400

/* A rank-local outcome of a phase: the first failure wins. */
typedef struct {
  int status;
  char msg[DP_MSG];
} DpLocal;

void dpSetLocal(DpLocal* l, int status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#define DP_TRY_CUDA(l, call, label)                                                  \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      dpSetLocal((l), DP_ERR, "%s: %s", #call, cudaGetErrorString(e_));              \
      goto label;                                                                    \
    }                                                                                \
  } while (0)

#define DP_TRY_DPS(l, call, label)                                                   \
  do {                                                                               \
    dpsResult_t r_ = (call);                                                         \
    if (r_ != dpsSuccess) {                                                          \
      dpSetLocal((l), r_ == dpsUnavailable ? DP_UNAVAIL : DP_ERR, "%s: %s: %s", #call, \
                 dpsGetErrorString(r_), dpsGetLastError());                          \
      goto label;                                                                    \
    }                                                                                \
  } while (0)

/* ---- cases ------------------------------------------------------------------ */
struct DpOp;
struct DpRow;

typedef struct {
  const struct DpOp* op;
  int pad_bs, n;
  int64_t vocab;        /* 0: the operation takes no logits */
  dpsDataType_t dtype;  /* logits dtype, dpsDtypeUnset without logits */
  int max_pad_bs;       /* of the communicator this case runs on (set by the harness) */
} DpCase;

/* One -s item: PADxN (vocab 0) or PADxNxVOCAB. */
typedef struct {
  int pad_bs, n;
  int64_t vocab;
} DpShape;

/* What add_cases reads: -s and -d as given (NULL/0 when not given). */
typedef struct {
  const DpShape* shapes;
  int nshapes;
  const dpsDataType_t* dtypes;
  int ndtypes;
} DpCaseArgs;

/* Appends a case (ignored when the same one is already listed). */
void dpAddCase(const struct DpOp* op, int pad_bs, int n, int64_t vocab, dpsDataType_t dtype);

/* add_cases and valid of the operations without logits (gather, logprobs):
 * the PxN of every -s item (its vocab ignored), by default pad_bs
 * {8,64,256,512} x N {1,4,8}, N outer; valid when tp divides pad_bs. */
void dpAddTokenCases(const struct DpOp* self, const DpCaseArgs* args);
int dpValidTokens(const DpCase* c, int tp);
/* add_cases of the operations on logits shards (argmax, topk, the sample and
 * verify families): a case per PxNxV item (of -s, else the operation's
 * default `shapes`) and dtype (of -d, else bf16). */
void dpAddShapeCases(const struct DpOp* self, const DpCaseArgs* args);
#define DP_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- buffers (bufs.c; see the top of this file) ------------------------------- */
#define DP_MAX_BUFS 24 /* host inputs, or device buffers, of one case */
#define DP_MAX_MEM 32  /* host allocations of one case */

/* Host memory freed with its owner. */
typedef struct {
  int n;
  void* p[DP_MAX_MEM];
} DpMemList;

/* A case's host side on one rank: its inputs of steps 1 and 2, and the
 * operation's host-only data. */
typedef struct DpHost {
  int nin;
  struct {
    void* step[2]; /* step 1, step 2 (the same array for a shared input) */
    size_t bytes;
  } in[DP_MAX_BUFS];
  DpMemList mem;
  void* op; /* the operation's host state (dpHostMem), or NULL */
} DpHost;

/* A case's device side on one rank, for one backend. */
typedef struct DpBufs {
  int n;
  struct {
    void* dev;        /* device memory (the harness's), NULL for a library output */
    const void* slot; /* library output: where run stores the library's pointer */
    void* host;       /* outputs: the host copy check reads */
    size_t bytes;
    int input;        /* the host input uploaded into dev at every fill, or -1 */
    int poison;       /* byte written over dev at every fill, or -1 */
  } b[DP_MAX_BUFS];
  DpMemList mem;
  void* op; /* the operation's state (DpOp.state_size bytes, zeroed) */
  int tp;
} DpBufs;

/* host_init: a host input of `bytes` per step (per_step 0: one array, the
 * same in both steps); returns its index (for h->in[i].step[k] and dpDevIn),
 * -1 when out of host memory. */
int dpHostIn(DpHost* h, size_t bytes, int per_step);
/* host_init: host memory (zeroed) freed with the host side; NULL when out of
 * host memory. */
void* dpHostMem(DpHost* h, size_t bytes);

/* setup: the device copy of host input `input`, uploaded at every fill. */
void* dpDevIn(DpBufs* b, const DpHost* h, int input, DpLocal* l);
/* setup: a device output of `bytes`, poisoned with the byte `poison` (-1:
 * not) at every fill, copied back into its host copy before every check
 * ({NULL, NULL} on failure). */
typedef struct {
  void* dev;
  const void* host;
} DpOut;
DpOut dpDevOut(DpBufs* b, size_t bytes, int poison, DpLocal* l);
/* setup: device scratch, neither filled nor copied back. */
void* dpDevTmp(DpBufs* b, size_t bytes, DpLocal* l);
/* setup: an output the library owns: run stores its pointer at `slot` (a
 * pointer variable of the operation's state); its first `bytes` are copied
 * back before every check (a NULL pointer then fails the check). Returns the
 * host copy. */
void* dpLibOut(DpBufs* b, const void* slot, size_t bytes, DpLocal* l);
/* setup: host scratch (zeroed), freed with the buffers. */
void* dpMem(DpBufs* b, size_t bytes, DpLocal* l);

/* What check reads. */
typedef struct DpCheck {
  const DpCase* c;
  const void* op;  /* setup's state (b->op), its host copies filled */
  const void* ref; /* host_init's host state (DpHost.op) */
  int rank, tp, step;
  DpLocal* l;      /* where a failure is recorded */
} DpCheck;

/* ---- the operation descriptor (see the top of this file) ---------------------- */
typedef struct DpOp {
  const char* name;
  const char* const* aliases;
  const char* elem_type;
  void (*add_cases)(const struct DpOp* self, const DpCaseArgs* args);
  /* dpAddShapeCases's default shapes (when -s is not given), or NULL. */
  const DpShape* shapes;
  int nshapes;
  int (*valid)(const DpCase* c, int tp);
  size_t (*bytes)(const DpCase* c, int tp);
  /* 0 on success, 1 when out of host memory (the harness frees what is there). */
  int (*host_init)(const DpCase* c, int rank, int tp, DpHost* h);
  /* b->op: the operation's state (state_size bytes, zeroed), b->tp: the ranks. */
  int (*setup)(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l);
  size_t state_size;
  /* op: setup's state (b->op). */
  dpsResult_t (*run)(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s);
  /* The outputs are back on the host (and the stream synchronized). */
  long long (*check)(const struct DpCheck* k);
  /* Optional. 1: bytes counts the local pass's HBM reads (argmax, top-k),
   * and the efficiency column is against the HBM read peak, not the link. */
  int hbm;
  /* Optional (NULL: none). Called on every rank of one (case, backend):
   * phase 0 after setup, before the first call (e.g. to read counters the
   * communicator accumulates over cases); phase 1 after the timed replays
   * and the check, with the row's agreed time in *row. Phase 1 may write one
   * line into out (printed at the end of the row) and returns the number of
   * problems it found (counted as wrong elements); phase 0 returns nonzero
   * on failure (recorded in *l). May synchronize: nothing is timed then. */
  long long (*note)(const DpCase* c, dpsComm_t comm, void* op, int tp, int phase,
                    const struct DpRow* row, char* out, size_t len, DpLocal* l);
  /* Optional (NULL: none). Called on every rank right after the fill of
   * `step`, with the communicator: for inputs that an operation derives with
   * the library itself (op_verify.c: the drafts, from dpsSample's tokens of
   * the same rows). May synchronize and call collectives (every rank calls it
   * at the same point); nothing is timed then. Nonzero on failure (recorded
   * in *l). */
  int (*prepare)(const DpCase* c, dpsComm_t comm, void* op, int tp, int step, cudaStream_t s,
                 DpLocal* l);
} DpOp;

/* The descriptor of an operation whose file names its callbacks bytes,
 * hostInit, setup, run and check and its state STATE (op_swap.c, op_gather.c,
 * op_logprobs.c). */
#define DP_OP(NAME, ALIASES, ELEM_TYPE, ADD_CASES, VALID, STATE)                          \
  {                                                                                      \
    .name = NAME, .aliases = ALIASES, .elem_type = ELEM_TYPE, .add_cases = ADD_CASES,    \
    .valid = VALID, .bytes = bytes, .host_init = hostInit, .setup = setup, .run = run,   \
    .check = check, .state_size = sizeof(STATE),                                         \
  }

/* What the harness knows of a row when it calls note(phase 1). */
typedef struct DpRow {
  dpsBackend_t backend;
  double us;       /* the row's time per call (the slowest rank) */
  double hbm_peak; /* GB/s of local reads measured in this run, 0 = unknown */
  long long calls; /* calls made on this (case, backend): eager + warm-up + replays */
} DpRow;

/* Appends printf-style text to a note (out[0..len), NUL-terminated: note's
 * phase 1 starts from an empty string); what does not fit is cut. */
void dpNoteAppend(char* out, size_t len, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The time (us per call) of a row already measured in this run: operation
 * `op` (its name) on c's shape and dtype and backend `be`; 0 when none. For
 * an operation that reports its time against another's (run it after). */
double dpRowTime(const char* op, const DpCase* c, dpsBackend_t be);

/* ops.c: every operation, in table order. */
extern const DpOp* const dpOps[];
extern const int dpNumOps;

/* op_sample.c: the family -o sample (dpsSample's cases and their references). */
#define DP_SAMPLE_OPS 13
extern const DpOp dpOpSample[DP_SAMPLE_OPS];

/* op_verify.c: the family -o verify (dpsVerifyChain's cases and their references). */
#define DP_VERIFY_OPS 8
extern const DpOp dpOpVerify[DP_VERIFY_OPS];

/* ---- peak.cu ------------------------------------------------------------------ */
/* Stores int4 values over [dst, dst+bytes) (bytes a multiple of 16) with a
 * grid-stride loop: with dst a peer's buffer (cudaIpcOpenMemHandle) this is a
 * pure NVLink store stream, no loads. */
cudaError_t dpLaunchPeerStore(void* dst, size_t bytes, int blocks, int threads, int tag,
                              cudaStream_t stream);
/* Reads [src, src+bytes) (bytes a multiple of 16) as int4, grid-stride: the
 * local HBM read peak, against which the operations marked `hbm` report. */
cudaError_t dpLaunchRead(const void* src, size_t bytes, int blocks, int threads, int* sink,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DPS_PERF_H_ */
