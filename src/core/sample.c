/* dpsSample, dpsVerifyChain and dpsCommGetSampleStats: the argument checks,
 * the steps (at tp == 1 one kernel; else records steps through the backend,
 * see kernels/sample_kernels.h; verify adds the chain walk) and the scratch
 * they share. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "kernels/sample_kernels.h"
#include "provider.h"
#include "select_plan.h" /* dpsSelPlanInit */

/* ---- scratch ---------------------------------------------------------------------- */
typedef struct {
  size_t state, partial, tickets, counters;
  size_t tokens, token_lps, predict, accept_index, accept_length, logprobs, walk; /* verify */
  size_t exact_arrivals, exact_pending;
  size_t bytes;
} ScratchLayout;

static int64_t maxRows(dpsComm_t comm) {
  return (int64_t)comm->config.max_pad_bs * comm->config.num_tokens_per_req;
}

static ScratchLayout scratchLayout(dpsComm_t comm) {
  ScratchLayout L;
  const size_t rows = (size_t)maxRows(comm);
  L.state = 0;
  L.partial = dpsRoundUp(rows * DPS_SAMPLE_STATE_BYTES, 256);
  L.tickets = L.partial + dpsRoundUp((size_t)DPS_SAMPLE_MAX_PARTIALS * DPS_SAMPLE_MAX_WORDS * 4, 256);
  L.counters = L.tickets + dpsRoundUp(rows * sizeof(unsigned int), 256);
  L.tokens = L.counters + dpsRoundUp(sizeof(dpsSampleCounters), 256);
  L.token_lps = L.tokens + dpsRoundUp(rows * sizeof(int64_t), 256);
  L.predict = L.token_lps + dpsRoundUp(rows * sizeof(float), 256);
  L.accept_index = L.predict + dpsRoundUp(rows * sizeof(int32_t), 256);
  L.accept_length = L.accept_index + dpsRoundUp(rows * sizeof(int32_t), 256);
  L.logprobs = L.accept_length +
               dpsRoundUp((size_t)comm->config.max_pad_bs * sizeof(int32_t), 256);
  L.walk = L.logprobs + dpsRoundUp(rows * sizeof(float), 256);
  L.exact_arrivals = L.walk + sizeof(unsigned int);
  L.exact_pending = L.exact_arrivals + sizeof(unsigned int);
  L.bytes = L.exact_pending + sizeof(unsigned int);
  return L;
}

static dpsSampleScratch scratchOf(dpsComm_t comm) {
  const ScratchLayout L = scratchLayout(comm);
  char* b = (char*)comm->sample_mem;
  dpsSampleScratch s;
  s.state = b + L.state;
  s.partial = (uint32_t*)(b + L.partial);
  s.tickets = (unsigned int*)(b + L.tickets);
  s.counters = (dpsSampleCounters*)(b + L.counters);
  s.tokens = (int64_t*)(b + L.tokens);
  s.token_lps = (float*)(b + L.token_lps);
  s.predict = (int32_t*)(b + L.predict);
  s.accept_index = (int32_t*)(b + L.accept_index);
  s.accept_length = (int32_t*)(b + L.accept_length);
  s.logprobs = (float*)(b + L.logprobs);
  s.walk_arrivals = (unsigned int*)(b + L.walk);
  s.exact_arrivals = (unsigned int*)(b + L.exact_arrivals);
  s.exact_pending = (unsigned int*)(b + L.exact_pending);
  return s;
}

_Static_assert(DPS_SHARD_MAX_RANKS == DPS_PEER_MAX_RANKS, "the merges' per-rank arrays");

dpsResult_t dpsAllocShardState(dpsComm_t comm) {
  _Static_assert(DPS_SAMPLE_MAX_WORDS <= DPS_REC_MAX_WORDS, "record capacity");
  _Static_assert(DPS_SAMPLE_PSEARCH_WORDS <= DPS_REC_MAX_WORDS, "record capacity");
  if (comm->sample_mem != NULL) return dpsSuccess;
  DPS_CUDA_CHECK(cudaDeviceGetAttribute(&comm->sms, cudaDevAttrMultiProcessorCount, comm->device));
  dpsSelPlanInit(&comm->sel_waves, comm->env.select_split, comm->env.tiled_collect);
  comm->exact_clusters = 0;
  if (comm->config.tp_size == 1 && comm->env.exact_split) {
    const cudaError_t e = dpsSampleExactClusters(&comm->exact_clusters);
    if (e != cudaSuccess) {
      /* only a speed-up: without it each exact row is drawn on its first block */
      dpsLog(DPS_LOG_WARN, "sample: the exact kernel's occupancy query failed (%s); exact rows "
             "are not split", cudaGetErrorString(e));
    } else {
      dpsLog(DPS_LOG_INFO, "sample: exact rows on %d clusters of %d blocks", comm->exact_clusters,
             DPS_SAMPLE_EXACT_CHUNKS);
    }
  }
  return dpsDeviceAlloc(comm, &comm->sample_mem, scratchLayout(comm).bytes, "dpsSample's scratch");
}

void dpsFreeShardState(dpsComm_t comm) { dpsDeviceFree(comm, &comm->sample_mem); }

cudaError_t dpsPreloadShardKernels(void) {
  const cudaError_t e = dpsPreloadSelectKernels();
  return e == cudaSuccess ? dpsPreloadSampleKernels() : e;
}

/* ---- arguments --------------------------------------------------------------------- */
/* The scalars the call uses: one whose array is given is replaced by it and
 * not checked. Values print with %.9g, which tells every float apart (1 + 2^-23
 * is not "1"). */
static dpsResult_t checkScalars(const char* op, const dpsSampleParams_t* p) {
  const float t = p->temperatures != NULL ? 1.f : p->temperature;
  const float top_p = p->top_ps != NULL ? 1.f : p->top_p;
  const float min_p = p->min_ps != NULL ? 0.f : p->min_p;
  switch (dpsSampleBadParam(t, top_p, min_p)) {
    case DPS_SAMPLE_ARG_TEMPERATURE:
      return dpsSetError(dpsInvalidArgument,
                         "%s: params->temperature=%.9g must be finite and >= 0 (0: greedy)", op,
                         (double)t);
    case DPS_SAMPLE_ARG_TOP_P:
      return dpsSetError(dpsInvalidArgument, "%s: params->top_p=%.9g must be in (0, 1] (1: off)",
                         op, (double)top_p);
    case DPS_SAMPLE_ARG_MIN_P:
      return dpsSetError(dpsInvalidArgument, "%s: params->min_p=%.9g must be in [0, 1) (0: off)",
                         op, (double)min_p);
    default:
      return dpsSuccess;
  }
}

static dpsResult_t checkArray(const char* op, const char* name, const void* p, size_t align) {
  if (p != NULL && (uintptr_t)p % align != 0)
    return dpsSetError(dpsInvalidArgument, "%s: params->%s=%p is not %zu-byte aligned", op, name,
                       p, align);
  return dpsSuccess;
}

static dpsResult_t checkParams(const char* op, const dpsSampleParams_t* p) {
  if (p == NULL) return dpsSetError(dpsInvalidArgument, "%s: params is NULL", op);
  if (p->size != sizeof(dpsSampleParams_t))
    return dpsSetError(dpsInvalidArgument,
                       "%s: params->size=%zu, expected %zu: start from "
                       "DPS_SAMPLE_PARAMS_INITIALIZER",
                       op, p->size, sizeof(dpsSampleParams_t));
  DPS_CHECK(checkScalars(op, p));
  if (p->top_ks != NULL && p->top_ks_i64 != NULL)
    return dpsSetError(dpsInvalidArgument,
                       "%s: params->top_ks=%p and params->top_ks_i64=%p: give at most one", op,
                       (const void*)p->top_ks, (const void*)p->top_ks_i64);
  DPS_CHECK(checkArray(op, "temperatures", p->temperatures, 4));
  DPS_CHECK(checkArray(op, "top_ks", p->top_ks, 4));
  DPS_CHECK(checkArray(op, "top_ks_i64", p->top_ks_i64, 8));
  DPS_CHECK(checkArray(op, "top_ps", p->top_ps, 4));
  DPS_CHECK(checkArray(op, "min_ps", p->min_ps, 4));
  DPS_CHECK(checkArray(op, "seeds", p->seeds, 8));
  DPS_CHECK(checkArray(op, "offsets", p->offsets, 8));
  return dpsSuccess;
}

static dpsSampleParamsDev devParams(const dpsSampleParams_t* p) {
  dpsSampleParamsDev d;
  memset(&d, 0, sizeof d);
  d.v = *p;
  d.any_array = p->temperatures || p->top_ks || p->top_ks_i64 || p->top_ps || p->min_ps ||
                p->seeds || p->offsets;
  d.per_entry = 1;
  return d;
}

/* ---- the steps --------------------------------------------------------------------- */
/* A launch's status; the message names the call (sample, verify_chain). */
static dpsResult_t launched(cudaError_t e, const char* op, const char* kernel, int64_t rows) {
  if (e == cudaSuccess) return dpsSuccess;
  return dpsSetError(dpsCudaError, "%s: %s kernel launch (rows=%" PRId64 ") failed: %s", op,
                     kernel, rows, cudaGetErrorString(e));
}

static dpsResult_t stepLocal(const dpsRecOp* op, const dpsRecSink* sink, cudaStream_t stream) {
  dpsSampleArgs a = *(const dpsSampleArgs*)op->ctx;
  a.sink = *sink;
  return launched(dpsLaunchSampleLocal(&a, stream), op->name, "local", a.rows);
}

static dpsResult_t stepMerge(const dpsRecOp* op, const dpsRecSource* src, cudaStream_t stream) {
  dpsSampleArgs a = *(const dpsSampleArgs*)op->ctx;
  a.src = *src;
  return launched(dpsLaunchSampleMerge(&a, stream), op->name, "merge", a.rows);
}

/* Blocks of the first pass resident at once, per_sm on every SM. */
static int64_t residentBlocks(dpsComm_t comm, int per_sm) {
  return per_sm * (int64_t)(comm->sms > 0 ? comm->sms : 1);
}

/* Blocks per row of the first pass: more when few rows leave SMs idle, each
 * block at least 4096 columns, the partial records within the scratch. */
static int firstChunks(dpsComm_t comm, int64_t rows, int64_t nvalid) {
  const int64_t slots = residentBlocks(comm, DPS_SAMPLE_FIRST_BLOCKS_PER_SM);
  for (int c = DPS_SAMPLE_MAX_CHUNKS; c > 1; --c)
    if (rows * c <= slots && rows * c <= DPS_SAMPLE_MAX_PARTIALS && nvalid / c >= 4096) return c;
  return 1;
}

/* The first pass's block. A block spends a third of a row's time outside
 * the row's pass (its bounds, reductions, the draw: docs/performance.md,
 * session 19), with its SM otherwise idle when it is the SM's only block.
 * So at tp == 1, when the rows fill four small blocks on every SM, blocks
 * of DPS_SAMPLE_SMALL_THREADS run four per SM and overlap those phases with
 * the others' passes; but not when a row may take the exact path's passes
 * on its block (top-p or min-p without top-k, the exact kernel off), which
 * small blocks slow. Not at tp > 1: the onesided grid is capped at a block
 * per SM there (ranks sharing a GPU stay resident), and neither backend was
 * measured so. */
static int firstThreads(dpsComm_t comm, int64_t rows, int may_topk, int may_topp,
                        int may_minp, int exact_apart) {
  const int64_t small_slots = residentBlocks(comm, DPS_SAMPLE_SMALL_BLOCKS_PER_SM);
  if (comm->config.tp_size == 1 && rows >= small_slots &&
      (may_topk || exact_apart || !(may_topp || may_minp)))
    return DPS_SAMPLE_SMALL_THREADS;
  return DPS_SAMPLE_THREADS;
}

/* Whether the first pass's candidates are collected from the tiles that may
 * reach their threshold, or by a full re-read: past half the L2 (the
 * sampling pass holds its rows longer than dpsTopK's; one H200, 60 MiB:
 * top-k + top-p with tiles 32.7 -> 32.0 us at 128 x 152064 and 71.2 -> 64.0
 * at 256 rows, 39 and 40 MB resident; docs/performance.md, session 22, run
 * B). */
static int firstTiled(dpsComm_t comm, const dpsSampleArgs* a, dpsDataType_t dtype) {
  const int64_t blocks = a->rows * a->chunks;
  const int64_t resident = residentBlocks(comm, a->threads == DPS_SAMPLE_SMALL_THREADS
                                                    ? DPS_SAMPLE_SMALL_BLOCKS_PER_SM
                                                    : DPS_SAMPLE_FIRST_BLOCKS_PER_SM);
  return a->cand > 0 && dpsSelCollectTiled(&comm->sel_waves, blocks < resident ? blocks : resident,
                                           a->nvalid, a->chunks, dtype, 0.5);
}

static dpsResult_t runSample(dpsComm_t comm, const char* name, dpsSampleArgs* a, int may_topk,
                             int may_topp, int may_filter, cudaStream_t stream) {
  if (comm->config.tp_size == 1) { /* no exchange: the first kernel draws every row */
    a->step = DPS_SAMPLE_STEP_FIRST; /* no sink: nothing leaves the kernel but the outputs */
    a->pdl = comm->pdl;              /* no peer to wait for while resident */
    DPS_CHECK(launched(dpsLaunchSampleLocal(a, stream), name, "local", a->rows));
    if (a->exact_clusters == 0) return dpsSuccess;
    return launched(dpsLaunchSampleExact(a, stream), name, "exact", a->rows);
  }
  if (comm->ops->records == NULL)
    return dpsSetError(dpsUnavailable, "%s: the %s backend cannot exchange records", name,
                       comm->ops->name);
  dpsRecOp op;
  memset(&op, 0, sizeof op);
  op.name = name;
  op.rows = a->rows;
  op.local = stepLocal;
  op.merge = stepMerge;
  op.ctx = a;
  a->step = DPS_SAMPLE_STEP_FIRST;
  a->words = op.words = DPS_SAMPLE_FIRST_WORDS(a->cand);
  DPS_CHECK(comm->ops->records(comm, &op, stream));
  a->chunks = 1;
  /* the steps a row of this call may need, in order (rows without them skip) */
  const struct {
    int on, step, rounds, words;
  } steps[] = {{may_topk, DPS_SAMPLE_STEP_KSEARCH, DPS_SAMPLE_ROUNDS, DPS_SAMPLE_KSEARCH_WORDS},
               {may_topp, DPS_SAMPLE_STEP_PSEARCH, DPS_SAMPLE_ROUNDS, DPS_SAMPLE_PSEARCH_WORDS},
               {may_filter, DPS_SAMPLE_STEP_RACE, 1, DPS_SAMPLE_RACE_WORDS}};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i)
    for (int r = 0; steps[i].on && r < steps[i].rounds; ++r) {
      a->step = steps[i].step;
      a->words = op.words = steps[i].words;
      DPS_CHECK(comm->ops->records(comm, &op, stream));
    }
  return dpsSuccess;
}

/* The call as the kernels see it, and the steps its rows may need. */
typedef struct {
  dpsSampleArgs a;
  int may_topk, may_topp, may_filter;
  int by_argmax; /* every row greedy, no logprob, mask or soft-cap: argmax's pass draws */
  int64_t vocab_limit;
} SampleCall;

/* The checks every drawing call makes (the caller's own arguments first). */
static dpsResult_t checkDrawCall(dpsComm_t comm, const char* op, const void* logits, int64_t rows,
                                 int64_t cols, dpsDataType_t dtype, int64_t vocab_limit,
                                 const dpsSampleParams_t* params) {
  dpsSelectCall call;
  memset(&call, 0, sizeof call);
  DPS_CHECK(dpsCheckShardCall(comm, op, logits, rows, cols, dtype, vocab_limit, &call));
  if (comm->config.vocab_size > DPS_SAMPLE_VOCAB_MAX) /* the op's limit, as tp_size > 8 */
    return dpsSetError(dpsUnavailable,
                       "%s: vocab_size=%" PRId64 " is above %lld (the fixed-point masses' range)",
                       op, comm->config.vocab_size, (long long)DPS_SAMPLE_VOCAB_MAX);
  return checkParams(op, params);
}

static void sampleCall(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                       dpsDataType_t dtype, int64_t vocab_limit, const dpsSampleParams_t* params,
                       int want_logprob, SampleCall* c) {
  memset(c, 0, sizeof *c);
  dpsSampleArgs* a = &c->a;
  a->logits = logits;
  a->rows = rows;
  a->cols = cols;
  a->dtype = (int)dtype; /* 0 fp32, 1 bf16, 2 fp16 */
  a->tp = comm->config.tp_size;
  a->rank = comm->config.rank;
  a->col0 = (long long)a->rank * cols;
  const int64_t nv = vocab_limit - a->col0;
  a->nvalid = nv < 0 ? 0 : nv > cols ? cols : nv;
  a->p = devParams(params);
  c->may_topk = params->top_ks || params->top_ks_i64 || params->top_k > 0;
  c->may_topp = params->top_ps || params->top_p < 1.f;
  const int may_minp = params->min_ps || params->min_p > 0.f;
  c->may_filter = c->may_topk || c->may_topp || may_minp;
  a->cand = c->may_filter ? DPS_SAMPLE_CAND : 0;
  a->s = scratchOf(comm);
  a->want_logprob = want_logprob;
  /* tp == 1, rows that may filter: exact rows over clusters, at most one per row */
  if (a->tp == 1 && c->may_filter && comm->exact_clusters > 0)
    a->exact_clusters = (int)(rows < comm->exact_clusters ? rows : comm->exact_clusters);
  a->threads = firstThreads(comm, rows, c->may_topk, c->may_topp, may_minp, a->exact_clusters > 0);
  a->chunks = firstChunks(comm, rows, a->nvalid); /* 1 whenever the blocks are small */
  /* no candidates and no logprob: greedy and temperature-only rows only */
  a->first = a->cand == 0 && !want_logprob ? DPS_SAMPLE_FIRST_RACE
             : firstTiled(comm, a, dtype)  ? DPS_SAMPLE_FIRST_TILED
                                           : DPS_SAMPLE_FIRST_ANY;
  c->vocab_limit = vocab_limit;
}

/* Whether argmax's pass draws the call: greedy everywhere (T a scalar 0; no
 * top_ps or min_ps array, the only arrays besides temperatures that the
 * kernels would check) and nothing but tokens wanted. It gives the same
 * tokens (ties to the lower index, NaN as -inf, nothing valid: 0) from one
 * read per element, without the sampling pass's records. */
static int byArgmax(const dpsSampleParams_t* p, int want_logprob) {
  return p->temperatures == NULL && p->temperature == 0.f && p->top_ps == NULL &&
         p->min_ps == NULL && !want_logprob;
}

/* Checks the communicator's state, then runs the call's steps and `after`
 * (NULL: none) in one operation. */
static dpsResult_t runCall(dpsComm_t comm, const char* op, SampleCall* c,
                           const dpsVerifyWalkArgs* after, cudaStream_t stream) {
  DPS_CHECK(dpsCheckOpen(comm, op));
  if (comm->sample_mem == NULL)
    return dpsSetError(dpsUnavailable, "%s: the %s backend has no sampling buffers", op,
                       comm->ops->name);
  DPS_CHECK(dpsCommHealth(comm));
  dpsOpCtx x;
  DPS_CHECK(dpsOpEnter(comm, op, stream, &x));
  dpsResult_t r;
  /* tp == 1: the pass that writes the tokens walks in its last block */
  const int one_kernel = after != NULL && comm->config.tp_size == 1;
  if (c->by_argmax) {
    dpsSelectCall sel;
    memset(&sel, 0, sizeof sel);
    sel.rows = c->a.rows;
    sel.dtype = (dpsDataType_t)c->a.dtype;
    sel.vocab_limit = c->vocab_limit;
    sel.index = c->a.tokens;
    sel.logits = c->a.logits;
    sel.walk = one_kernel ? after : NULL;
    sel.count_rows = &c->a.s.counters->rows_greedy; /* every row greedy */
    r = dpsSelectSteps(comm, op, &sel, stream);
  } else {
    if (one_kernel) c->a.walk = *after;
    r = runSample(comm, op, &c->a, c->may_topk, c->may_topp, c->may_filter, stream);
  }
  if (r == dpsSuccess && after != NULL && !one_kernel) {
    const cudaError_t e = dpsLaunchVerifyWalk(&c->a, after, stream);
    if (e != cudaSuccess)
      r = dpsSetError(dpsCudaError, "%s: chain walk kernel launch (pad_bs=%d) failed: %s", op,
                      after->pad_bs, cudaGetErrorString(e));
  }
  /* a step missing on one rank leaves the others' records unpaired */
  if (r != dpsSuccess && comm->config.tp_size > 1) (void)dpsCommMarkFailed(comm, r);
  dpsOpLeave(comm, &x, r);
  return r;
}

dpsResult_t dpsSample(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                      dpsDataType_t dtype, int64_t vocab_limit, const dpsSampleParams_t* params,
                      int64_t* tokens, float* logprobs, cudaStream_t stream) {
  static const char* op = "sample";
  DPS_CHECK(checkDrawCall(comm, op, logits, rows, cols, dtype, vocab_limit, params));
  DPS_CHECK(dpsCheckOutBuffer(op, "tokens", tokens, 8, 1));
  DPS_CHECK(dpsCheckOutBuffer(op, "logprobs", logprobs, 4, 0));
  SampleCall c;
  sampleCall(comm, logits, rows, cols, dtype, vocab_limit, params, logprobs != NULL, &c);
  c.a.tokens = tokens;
  c.a.logprobs = logprobs;
  c.by_argmax = byArgmax(params, logprobs != NULL);
  return runCall(comm, op, &c, NULL, stream);
}

/* ---- dpsVerifyChain ----------------------------------------------------------------- */
dpsResult_t dpsVerifyChain(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                           dpsDataType_t dtype, int64_t vocab_limit, int pad_bs,
                           const int32_t* candidates, const dpsSampleParams_t* params,
                           const int32_t* vocab_mask, float softcap, int32_t** predict,
                           int32_t** accept_index, int32_t** accept_length, float** logprobs,
                           cudaStream_t stream) {
  static const char* op = "verify_chain";
  /* pad_bs before the rows it implies, so that the message names the caller's value */
  if (comm != NULL && (pad_bs < 1 || pad_bs > comm->config.max_pad_bs))
    return dpsSetError(dpsInvalidArgument, "%s: pad_bs=%d must be in [1, max_pad_bs=%d]", op,
                       pad_bs, comm->config.max_pad_bs);
  DPS_CHECK(checkDrawCall(comm, op, logits, rows, cols, dtype, vocab_limit, params));
  const dpsConfig_t* cfg = &comm->config;
  const int n = cfg->num_tokens_per_req;
  if (rows != (int64_t)pad_bs * n)
    return dpsSetError(dpsInvalidArgument,
                       "%s: rows=%" PRId64 " must be pad_bs*N = %d*%d = %" PRId64, op, rows,
                       pad_bs, n, (int64_t)pad_bs * n);
  DPS_CHECK(dpsCheckOutBuffer(op, "candidates", candidates, 4, 1));
  DPS_CHECK(dpsCheckOutBuffer(op, "vocab_mask", vocab_mask, 4, 0));
  if (!(softcap >= 0.f && softcap <= 3.40282347e38f))
    return dpsSetError(dpsInvalidArgument, "%s: softcap=%g must be finite and >= 0 (0: off)", op,
                       (double)softcap);
  if (predict == NULL || accept_index == NULL || accept_length == NULL)
    return dpsSetError(dpsInvalidArgument,
                       "%s: predict=%p, accept_index=%p, accept_length=%p: none may be NULL", op,
                       (void*)predict, (void*)accept_index, (void*)accept_length);
  SampleCall c;
  sampleCall(comm, logits, rows, cols, dtype, vocab_limit, params, logprobs != NULL, &c);
  c.a.p.per_entry = n;
  c.a.xf.mask = (const uint32_t*)vocab_mask;
  c.a.xf.mask_words = (cfg->vocab_size + 31) / 32;
  c.a.xf.cap = softcap;
  c.a.tokens = c.a.s.tokens;
  c.a.logprobs = logprobs != NULL ? c.a.s.token_lps : NULL;
  c.by_argmax = byArgmax(params, logprobs != NULL) && vocab_mask == NULL && softcap == 0.f;
  dpsVerifyWalkArgs w;
  memset(&w, 0, sizeof w);
  w.candidates = candidates;
  w.vocab = cfg->vocab_size;
  w.pad_bs = pad_bs;
  w.n = n;
  w.predict = c.a.s.predict;
  w.accept_index = c.a.s.accept_index;
  w.accept_length = c.a.s.accept_length;
  w.logprobs = logprobs != NULL ? c.a.s.logprobs : NULL;
  w.tokens = c.a.tokens;
  w.token_lps = c.a.logprobs;
  w.arrivals = c.a.s.walk_arrivals;
  w.counters = c.a.s.counters;
  DPS_CHECK(runCall(comm, op, &c, &w, stream));
  *predict = w.predict;
  *accept_index = w.accept_index;
  *accept_length = w.accept_length;
  if (logprobs != NULL) *logprobs = w.logprobs;
  return dpsSuccess;
}

/* ---- counters ----------------------------------------------------------------------- */
static const char* argName(int arg) {
  switch (arg) {
    case DPS_SAMPLE_ARG_TEMPERATURE: return "temperatures";
    case DPS_SAMPLE_ARG_TOP_K: return "top_ks";
    case DPS_SAMPLE_ARG_TOP_P: return "top_ps";
    case DPS_SAMPLE_ARG_MIN_P: return "min_ps";
    default: return "a parameter";
  }
}

dpsResult_t dpsCommGetSampleStats(dpsComm_t comm, dpsSampleStats_t* stats) {
  static const char* op = "sample stats";
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", op);
  if (stats == NULL) return dpsSetError(dpsInvalidArgument, "%s: stats is NULL", op);
  DPS_CHECK(dpsCheckOpen(comm, op));
  if (comm->sample_mem == NULL) { /* no draw yet */
    memset(stats, 0, sizeof *stats);
    dpsClearError();
    return dpsSuccess;
  }
  dpsDeviceGuard g;
  DPS_CHECK(comm->prov->device->enter(comm, &g));
  dpsSampleCounters c;
  dpsSampleCounters* dc = scratchOf(comm).counters;
  /* after the work enqueued so far (work_done), on the communicator's own stream */
  cudaError_t e = comm->work_done ? cudaStreamWaitEvent(comm->aux, comm->work_done, 0) : cudaSuccess;
  if (e == cudaSuccess) e = cudaMemcpyAsync(&c, dc, sizeof c, cudaMemcpyDeviceToHost, comm->aux);
  if (e == cudaSuccess) e = cudaStreamSynchronize(comm->aux);
  if (e == cudaSuccess && c.bad_seen == 1ull) /* reported once: the next invalid call is recorded */
    e = cudaMemsetAsync(&dc->bad_seen, 0, sizeof dc->bad_seen, comm->aux);
  if (e == cudaSuccess) e = cudaStreamSynchronize(comm->aux);
  dpsDeviceLeave(&g);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "%s: reading the counters failed: %s", op,
                       cudaGetErrorString(e));
  memset(stats, 0, sizeof *stats); /* written only once the counters are read */
  stats->rows_greedy = c.rows_greedy;
  stats->rows_fast = c.rows_fast;
  stats->rows_exact = c.rows_exact;
  stats->invalid_calls = c.invalid_calls;
  if (c.bad_seen == 1ull && c.bad_arg == DPS_SAMPLE_ARG_CANDIDATE) {
    dpsSetError(dpsInvalidArgument,
                "verify_chain: candidates[%lld]=%d (flat over [pad_bs, N]) is outside [0, "
                "vocab_size=%" PRId64 "); that call wrote nothing",
                c.bad_row, (int)(int32_t)c.bad_bits, comm->config.vocab_size);
  } else if (c.bad_seen == 1ull) {
    float v;
    memcpy(&v, &c.bad_bits, sizeof v);
    dpsSetError(dpsInvalidArgument,
                "sample or verify_chain: params->%s[%lld]=%.9g is invalid (temperature finite >= 0, top_p in (0, 1], "
                "min_p in [0, 1)); that call wrote nothing",
                argName(c.bad_arg), c.bad_row, (double)v);
  } else {
    dpsClearError();
  }
  return dpsSuccess;
}
