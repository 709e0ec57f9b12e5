/* Planning of dpsArgmax / dpsTopK: see select_plan.h. */
#include "select_plan.h"

#include <string.h>

/* A row is split over several blocks when there are few rows: enough blocks
 * to keep every SM busy (four each), each with at least this many columns. */
#define SEL_MIN_CHUNK_COLS 2048

int dpsSelWords(int k) { return k > 0 ? DPS_TOPK_WORDS(k) : DPS_ARGMAX_WORDS; }

/* The scratch: row partials, then the row tickets. */
static size_t partialBytes(int64_t cap_rows) {
  return (size_t)cap_rows * DPS_ARGMAX_MAX_CHUNKS * 4u * sizeof(uint32_t);
}

size_t dpsSelScratchBytes(int64_t cap_rows) {
  return partialBytes(cap_rows) + (size_t)cap_rows * sizeof(uint32_t);
}

/* What the local pass and the merge take alike from a call. */
static int selK(const dpsSelectCall* call) { return call->k > 0 ? call->k : 1; }
static int selWantLse(const dpsSelectCall* call) { return call->k == 0 && call->lse != NULL; }
static dpsSelOut selOut(const dpsSelectCall* call) {
  dpsSelOut o;
  o.index = call->index;
  o.value = call->value;
  o.lse = call->lse;
  return o;
}

void dpsSelPlanLocal(const dpsSelectCall* call, int rank, int64_t cols, int sms, void* scratch,
                     int64_t cap_rows, int pdl, dpsSelLocalArgs* a) {
  memset(a, 0, sizeof *a);
  a->logits = call->logits;
  a->rows = call->rows;
  a->cols = cols;
  a->dtype = (int)call->dtype;
  a->col0 = (long long)rank * cols;
  long long nvalid = call->vocab_limit - a->col0;
  a->nvalid = nvalid < 0 ? 0 : nvalid > cols ? cols : nvalid;
  a->k = selK(call);
  a->want_lse = selWantLse(call);
  int chunks = 1;
  if (call->k == 0) {
    const long long want = ((long long)4 * (sms > 0 ? sms : 1) + call->rows - 1) / call->rows;
    const long long byCols = a->nvalid / SEL_MIN_CHUNK_COLS;
    chunks = (int)(want < byCols ? want : byCols);
    if (chunks > DPS_ARGMAX_MAX_CHUNKS) chunks = DPS_ARGMAX_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
  }
  a->chunks = chunks;
  a->partial = (uint32_t*)scratch;
  a->tickets = (unsigned int*)((char*)scratch + partialBytes(cap_rows));
  a->sink = DPS_SEL_SINK_FINAL;
  a->out = selOut(call);
  a->pdl = pdl;
}

void dpsSelPlanMerge(const dpsSelectCall* call, int tp, int pdl, dpsSelMergeArgs* m) {
  memset(m, 0, sizeof *m);
  m->rows = call->rows;
  m->tp = tp;
  m->k = selK(call);
  m->dtype = (int)call->dtype;
  m->want_lse = selWantLse(call);
  m->out = selOut(call);
  m->pdl = pdl;
}

dpsResult_t dpsSelLaunchLocal(const dpsSelLocalArgs* a, int k, cudaStream_t stream) {
  const cudaError_t e = k > 0 ? dpsLaunchTopkLocal(a, stream) : dpsLaunchArgmaxLocal(a, stream);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "%s: local kernel launch (rows=%lld) failed: %s",
                       k > 0 ? "topk" : "argmax", a->rows, cudaGetErrorString(e));
  return dpsSuccess;
}

dpsResult_t dpsSelLaunchMerge(const dpsSelMergeArgs* m, int k, cudaStream_t stream) {
  const cudaError_t e = k > 0 ? dpsLaunchTopkMerge(m, stream) : dpsLaunchArgmaxMerge(m, stream);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "%s: merge kernel launch (rows=%lld) failed: %s",
                       k > 0 ? "topk" : "argmax", m->rows, cudaGetErrorString(e));
  return dpsSuccess;
}
