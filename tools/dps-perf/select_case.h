/* What op_argmax.c and op_topk.c share, and op_sample.c and op_verify.c use:
 * the cases (rows x V shards), the inputs (the fixtures' selection rows and
 * their host argmax, logsumexp and top-k), the buffers and the reference
 * check. k == 0: argmax, k == -1: argmax with the logsumexp, else top-k. */
#ifndef DPS_PERF_SELECT_CASE_H_
#define DPS_PERF_SELECT_CASE_H_

#include "dps_perf.h"

#define DP_TOPK_K 64 /* k of the top-k cases */

/* The default shapes of argmax and topk: 8x64640 and {64,256,1024}x76032. */
extern const DpShape dpSelShapes[4];
/* The logit (row, col) of `step` as the dtype stores it (fixtures'
 * fxLogitValue), and row r of a case: the full row into row[0..V) and this
 * rank's slice of it into row r of shard ([rows, V/tp] of the case's dtype). */
float dpSelValue(int64_t row, int64_t col, int step, dpsDataType_t dtype);
void dpSelRow(const DpCase* c, int rank, int tp, int64_t r, int step, float* row, void* shard);

/* The state of a selection case (its device side). */
typedef struct {
  int k; /* 0 argmax, -1 argmax + logsumexp, else top-k */
  void* in;
  DpOut idx, val, lse; /* int64 [rows][per], dtype [rows][per], fp32 [rows] */
  size_t rows;
} DpSel;

/* The host side of a case on the fixtures' rows (h->op): host input 0, this
 * rank's shard [rows, V/tp] of steps 1 and 2, and per step the host argmax,
 * its value and the logsumexp of every row ([rows]), and with `topk` the
 * host top-DP_TOPK_K ([rows][DP_TOPK_K]; NULL without). */
typedef struct {
  int64_t* amax_idx[2];
  float* amax_val[2];
  double* lse[2];
  int64_t* want_idx[2];
  float* want_val[2];
} DpSelHost;
int dpSelHostRows(const DpCase* c, int rank, int tp, DpHost* h, int topk);

/* rows x (V/tp) x dtype size: the bytes of the shard a rank reads per call
 * (argmax, topk, the sample and verify families). */
size_t dpSelBytes(const DpCase* c, int tp);
/* Valid when tp divides V (every rank holds every row: only the vocabulary
 * is cut; the sample and verify families). */
int dpValidVocab(const DpCase* c, int tp);
/* Appends "read x<time / (bytes / HBM read peak)>" to a note (when the peak
 * is known). */
void dpNoteRead(const DpCase* c, int tp, const DpRow* row, char* out, size_t len);

int dpSelValid(const DpCase* c, int tp);
int dpSelHostInit(const DpCase* c, int rank, int tp, DpHost* h);
int dpSelSetup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l, int k);
dpsResult_t dpSelRun(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s);
long long dpSelCheck(const DpCheck* k);

/* The selection call on `rows` rows of the shard `in` ([rows, V/tp]):
 * dpsArgmax (k <= 0; lse: the logsumexp, or NULL) or dpsTopK (k > 0). */
dpsResult_t dpSelCall(const DpCase* c, dpsComm_t comm, const void* in, size_t rows, int tp,
                      int k, void* val, int64_t* idx, float* lse, cudaStream_t s);

/* The reference rows of the families (argmax, top-k): the elements whose
 * index or value (as the case's dtype stores it) differ from the host's;
 * got [rows][per], want [rows][stride] (the first per of each row). */
long long dpWrongRefRows(const DpCase* c, const int64_t* idx, const void* val, size_t rows,
                         size_t per, const int64_t* want_idx, const float* want_val,
                         size_t stride);

/* The descriptor of a selection operation (op_argmax.c, op_topk.c). */
#define DP_SELECT_OP(NAME, SETUP)                                                          \
  {                                                                                        \
    .name = NAME, .add_cases = dpAddShapeCases, .shapes = dpSelShapes, .nshapes = 4,       \
    .valid = dpSelValid, .bytes = dpSelBytes,                                              \
    .host_init = dpSelHostInit, .setup = SETUP, .run = dpSelRun, .check = dpSelCheck,      \
    .state_size = sizeof(DpSel), .hbm = 1,                                                 \
  }

/* A member of a family on shard rows (op_sample.c, op_verify.c): the call it
 * times and the parameters it passes (device arrays, as an engine passes
 * them; top_k / top_p / min_p only where the member uses them). */
enum { DP_KIND_ARGMAX, DP_KIND_TOPK, DP_KIND_SAMPLE, DP_KIND_VERIFY };
typedef struct {
  int kind;
  float temperature;
  int top_k;       /* 0: no array */
  float top_p;     /* 1: no array */
  float min_p;     /* 0: no array */
  int logprobs;
  int flat;        /* sample: every logit of the row equal */
  const char* ref; /* verify: the member the note divides by (NULL: none) */
  int scalar_t;    /* T as the scalar (verify: the references keep arrays) */
  int mixed;       /* sample: odd rows without top-k and top-p (temperature only) */
} DpVariant;

/* The descriptor of a member of a family on shard rows (op_sample.c,
 * op_verify.c): the file's default shapes kShapes, hostInit, setup, run,
 * check and note, its state Member, its family's alias list kAliases, valid
 * when tp divides V (dpValidVocab), bytes = the shard's (dpSelBytes), against
 * the HBM read peak; PREPARE: its prepare, or NULL. */
#define DP_FAMILY_OP(NAME, PREPARE)                                                        \
  {                                                                                        \
    .name = NAME, .aliases = kAliases, .add_cases = dpAddShapeCases, .shapes = kShapes,    \
    .nshapes = DP_COUNT(kShapes), .valid = dpValidVocab,                                   \
    .bytes = dpSelBytes, .host_init = hostInit, .setup = setup, .run = run,                \
    .check = check, .state_size = sizeof(Member), .hbm = 1, .note = note,                  \
    .prepare = PREPARE,                                                                    \
  }

#endif /* DPS_PERF_SELECT_CASE_H_ */
