/* Planning of dpsArgmax / dpsTopK: see select_plan.h. */
#include "select_plan.h"

#include <string.h>

/* A row is split over a cluster of blocks when there are few rows: as many
 * blocks per row as keep the SMs busy without a second wave, each with at
 * least this many columns. */
#define ARGMAX_MIN_CHUNK_COLS 2048
#define TOPK_MIN_CHUNK_COLS 4096

int dpsSelWords(int k) { return k > 0 ? DPS_TOPK_WORDS(k) : DPS_ARGMAX_WORDS; }

/* Blocks per row: the largest count <= DPS_SEL_MAX_CHUNKS that keeps
 * rows * chunks within one wave of `slots` blocks, each chunk of at least
 * min_cols columns; 1 without clusters. */
static int selChunks(int64_t rows, int64_t nvalid, int slots, int min_cols, int clusters) {
  if (!clusters || rows < 1) return 1;
  int64_t c = (int64_t)(slots > 0 ? slots : 1) / rows;
  const int64_t by_cols = nvalid / min_cols;
  if (c > by_cols) c = by_cols;
  if (c > DPS_SEL_MAX_CHUNKS) c = DPS_SEL_MAX_CHUNKS;
  return c < 1 ? 1 : (int)c;
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

void dpsSelPlanLocal(const dpsSelectCall* call, int rank, int64_t cols, int sms, int clusters,
                     int pdl, dpsSelLocalArgs* a) {
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
  const int topk = call->k > 0;
  a->chunks = selChunks(call->rows, a->nvalid,
                        sms * (topk ? DPS_TOPK_BLOCKS_PER_SM : DPS_ARGMAX_BLOCKS_PER_SM),
                        topk ? TOPK_MIN_CHUNK_COLS : ARGMAX_MIN_CHUNK_COLS, clusters);
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
