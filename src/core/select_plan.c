/* Planning of dpsArgmax / dpsTopK: see select_plan.h. */
#include "select_plan.h"

#include <stdlib.h>
#include <string.h>

/* A row is split over a cluster of blocks when there are few rows, within
 * one wave (dpsSelWaves) and with at least MIN_CHUNK_COLS columns per block.
 * Measured on one H200 (bf16, docs/performance.md): argmax is fastest at
 * about one block per SM (64 x 76032: 4.5 us over 2 blocks per row, 5.7 us
 * over 7, 5.4 us over 1), top-k with chunks of some 16K columns (its merge
 * grows with the chunks). */
#define ARGMAX_MIN_CHUNK_COLS 2048
#define TOPK_MIN_CHUNK_COLS 16384

int dpsSelWords(int k) { return k > 0 ? DPS_TOPK_WORDS(k) : DPS_ARGMAX_WORDS; }

_Static_assert(DPS_ENV_SELECT_SPLIT_MAX == DPS_SEL_MAX_CHUNKS, "DPSAMPLING_SELECT_SPLIT's range");

void dpsSelPlanInit(dpsSelWaves* w, int split, int tiled) {
  const cudaError_t e = dpsSelectWaves(w);
  if (e != cudaSuccess) {
    /* the split is only a speed-up: without the table every row is one block
     * (and, the L2 unknown, no collection tiled unless forced) */
    dpsLog(DPS_LOG_WARN, "argmax/topk: the occupancy query failed (%s); rows are not split",
           cudaGetErrorString(e));
    memset(w, 0, sizeof *w);
  } else {
    for (int kind = 0; kind < 2; ++kind)
      for (int c = split + 1; c <= DPS_SEL_MAX_CHUNKS; ++c) w->rows[kind][c] = 0;
    const int* am = w->rows[0];
    const int* tk = w->rows[1];
    dpsLog(DPS_LOG_INFO,
           "argmax/topk: rows per wave with 1..8 blocks per row: argmax %d %d %d %d %d %d %d %d, "
           "top-k %d %d %d %d %d %d %d %d (%d SMs)",
           am[1], am[2], am[3], am[4], am[5], am[6], am[7], am[8], tk[1], tk[2], tk[3], tk[4],
           tk[5], tk[6], tk[7], tk[8], w->sms);
  }
  w->tiled = tiled;
}

_Static_assert(DPS_SEL_MAX_CHUNKS == 8, "dpsSelPlanInit logs 8 counts per kind");

/* The SMs a pass may fill: `sms`, at most the device's (< 1: all of them). */
static int budgetSms(const dpsSelWaves* w, int sms) {
  const int dev_sms = w->sms > 0 ? w->sms : 1;
  return sms < 1 || sms > dev_sms ? dev_sms : sms;
}

/* Rows of one wave with c blocks per row on budgetSms(w, sms) SMs. */
static int64_t waveRows(const dpsSelWaves* w, int kind, int c, int sms) {
  const int dev_sms = w->sms > 0 ? w->sms : 1;
  return (int64_t)w->rows[kind][c] * budgetSms(w, sms) / dev_sms;
}

/* Blocks per row: the most (up to DPS_SEL_MAX_CHUNKS) for which `rows` rows
 * fit one wave on `sms` of the device's SMs, in at most max_blocks blocks
 * (0: no limit), each chunk of at least min_cols columns; else 1. */
static int selChunks(const dpsSelWaves* w, int kind, int64_t rows, int64_t nvalid, int sms,
                     int64_t max_blocks, int min_cols) {
  for (int c = DPS_SEL_MAX_CHUNKS; c > 1; --c)
    if (nvalid / c >= min_cols && rows <= waveRows(w, kind, c, sms) &&
        (max_blocks == 0 || rows * c <= max_blocks))
      return c;
  return 1;
}

/* PDL: whether the argmax pass lets its dependent launch as soon as its
 * reads are done rather than as its blocks exit. Measured on one H200 (bf16,
 * docs/performance.md): early is faster up to one block per SM (8 x 64640:
 * 2.69 against 3.01 us) and beyond one wave, but with more than one block
 * per SM within one wave the early dependents slow the pass (256 x 76032:
 * 9.95 against 8.24 us). Top-k: early at every size measured. */
static int earlyRelease(const dpsSelWaves* w, int64_t blocks, int sms) {
  return blocks <= budgetSms(w, sms) || blocks > waveRows(w, 0, 1, sms);
}

/* What the local pass and the merge take alike from a call. */
static int selK(const dpsSelectCall* call) { return call->k > 0 ? call->k : 1; }
static int selWantLse(const dpsSelectCall* call) { return call->k == 0 && call->lse != NULL; }
static dpsSelOut selOut(const dpsSelectCall* call) {
  dpsSelOut o;
  o.index = call->index;
  o.value = call->value;
  o.lse = call->lse;
  o.count_rows = call->count_rows;
  return o;
}

/* The full re-read of a top-k collection comes from HBM once the column
 * ranges of the resident blocks exceed what the L2 keeps; below that it
 * comes from L2, where the full pass may be faster than the tile maxima's
 * bookkeeping. An unknown L2 (0: the query failed) tiles nothing. */
int dpsSelCollectTiled(const dpsSelWaves* w, int64_t blocks, int64_t nvalid, int chunks,
                       dpsDataType_t dtype, double l2_share) {
  if (w->tiled != DPS_TILED_AUTO) return w->tiled == DPS_TILED_ALWAYS;
  const int64_t bytes = blocks * ((nvalid + chunks - 1) / chunks) * (int64_t)dpsDataTypeSize(dtype);
  return w->l2_bytes > 0 && (double)bytes > l2_share * (double)w->l2_bytes;
}

void dpsSelPlanLocal(const dpsSelectCall* call, int rank, int64_t cols, int sms,
                     const dpsSelWaves* waves, int pdl, dpsSelLocalArgs* a) {
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
  a->chunks = topk ? selChunks(waves, 1, call->rows, a->nvalid, sms, 0, TOPK_MIN_CHUNK_COLS)
                   : selChunks(waves, 0, call->rows, a->nvalid, sms, sms, ARGMAX_MIN_CHUNK_COLS);
  a->early_release = topk || earlyRelease(waves, call->rows * a->chunks, sms);
  if (topk) {
    /* the blocks resident at once (the call's, or one wave) against the
     * whole L2: one H200 (60 MiB) lost 2 us with tiles at 128 x 152064 (39
     * MB resident) and won 21 % at 256 rows (78 MB; docs/performance.md,
     * session 22) */
    const int64_t blocks = call->rows * a->chunks;
    const int64_t wave = waveRows(waves, 1, a->chunks, sms) * a->chunks;
    a->tiled = dpsSelCollectTiled(waves, wave > 0 && wave < blocks ? wave : blocks, a->nvalid,
                                  a->chunks, call->dtype, 1.0);
  }
  a->sink.kind = DPS_REC_NONE;
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

void dpsSelPlanStep(const dpsSelStep* s, const dpsRecSink* sink, int pdl, dpsSelLocalArgs* a) {
  const int sms = sink->max_blocks > 0 ? sink->max_blocks : s->sms;
  dpsSelPlanLocal(&s->call, s->rank, s->cols, sms, s->waves, pdl, a);
  a->sink = *sink;
  if (s->call.walk != NULL && sink->kind == DPS_REC_NONE) a->walk = *s->call.walk;
}

void dpsSelPlanStepMerge(const dpsSelStep* s, const dpsRecSource* src, int pdl,
                         dpsSelMergeArgs* m) {
  dpsSelPlanMerge(&s->call, s->tp, pdl, m);
  m->src = *src;
}

/* A launch's status; the message names the call (a sample call may run
 * argmax's pass) and the kernel. */
static dpsResult_t launched(cudaError_t e, const char* op, const char* kernel, long long rows) {
  if (e == cudaSuccess) return dpsSuccess;
  return dpsSetError(dpsCudaError, "%s: %s kernel launch (rows=%lld) failed: %s", op, kernel, rows,
                     cudaGetErrorString(e));
}

dpsResult_t dpsSelLaunchLocal(const dpsSelLocalArgs* a, int k, const char* op, cudaStream_t stream) {
  return launched(k > 0 ? dpsLaunchTopkLocal(a, stream) : dpsLaunchArgmaxLocal(a, stream), op,
                  "local", a->rows);
}

dpsResult_t dpsSelLaunchMerge(const dpsSelMergeArgs* m, int k, const char* op, cudaStream_t stream) {
  return launched(k > 0 ? dpsLaunchTopkMerge(m, stream) : dpsLaunchArgmaxMerge(m, stream), op,
                  "merge", m->rows);
}
