/* dpsArgmax and dpsTopK: the argument checks shared by the shard reductions,
 * then the steps: at tp == 1 the local pass writes the outputs; else one
 * records step through the backend (dpsRecOp: the local pass's records, the
 * backend's exchange, the merge). core/select_plan.c plans the kernels. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "select_plan.h"

int dpsRecCapacityWords(int max_topk) {
  const int topk = dpsSelWords(max_topk);
  return topk > DPS_REC_MAX_WORDS ? topk : DPS_REC_MAX_WORDS;
}

/* Checks shared by the shard reductions (argmax, top-k, sample); fills
 * `call` (not k). */
dpsResult_t dpsCheckShardCall(dpsComm_t comm, const char* op, const void* logits, int64_t rows,
                               int64_t cols, dpsDataType_t dtype, int64_t vocab_limit,
                               dpsSelectCall* call) {
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", op);
  const dpsConfig_t* c = &comm->config;
  if (c->tp_size > DPS_SHARD_MAX_RANKS)
    return dpsSetError(dpsUnavailable,
                       "%s: tp_size=%d: argmax, topk and sample support at most %d ranks (their "
                       "merges hold every rank's record of a row on chip)",
                       op, c->tp_size, DPS_SHARD_MAX_RANKS);
  const int64_t max_rows = (int64_t)c->max_pad_bs * c->num_tokens_per_req;
  const int64_t want_cols = c->vocab_size / c->tp_size;
  if (rows < 1 || rows > max_rows)
    return dpsSetError(dpsInvalidArgument,
                       "%s: rows=%" PRId64 " must be in [1, max_pad_bs*N = %d*%d = %" PRId64 "]",
                       op, rows, c->max_pad_bs, c->num_tokens_per_req, max_rows);
  /* after rows: an empty tensor's data pointer is often NULL, and rows=0 is the cause */
  if (logits == NULL) return dpsSetError(dpsInvalidArgument, "%s: logits is NULL", op);
  DPS_CHECK(dpsCheckLogitsDtype(op, dtype));
  if (cols != want_cols)
    return dpsSetError(dpsInvalidArgument,
                       "%s: logits is [%" PRId64 ", %" PRId64 "], expected [rows, V/tp] = "
                       "[%" PRId64 ", %" PRId64 "/%d] = [%" PRId64 ", %" PRId64 "]",
                       op, rows, cols, rows, c->vocab_size, c->tp_size, rows, want_cols);
  if (vocab_limit < 1 || vocab_limit > c->vocab_size)
    return dpsSetError(dpsInvalidArgument,
                       "%s: vocab_limit=%" PRId64 " must be in [1, vocab_size=%" PRId64 "]", op,
                       vocab_limit, c->vocab_size);
  DPS_CHECK(dpsCheckLogitsData(comm, op, "logits", logits, dtype));
  /* vocab_size <= DPS_VOCAB_MAX (32-bit global indices): dpsConfigCheck, at creation. */
  call->logits = logits;
  call->rows = rows;
  call->dtype = dtype;
  call->vocab_limit = vocab_limit;
  return dpsSuccess;
}

dpsResult_t dpsCheckOutBuffer(const char* op, const char* name, const void* p, size_t align,
                              int required) {
  if (p == NULL) {
    if (required) return dpsSetError(dpsInvalidArgument, "%s: %s is NULL", op, name);
    return dpsSuccess;
  }
  if ((uintptr_t)p % align != 0)
    return dpsSetError(dpsInvalidArgument, "%s: %s=%p is not %zu-byte aligned", op, name, p, align);
  return dpsSuccess;
}

/* PDL as the backend's own kernels launch: its LL common arguments say;
 * plain records (nccl): none. */
static int sinkPdl(const dpsRecSink* sink) { return sink->kind == DPS_REC_LL ? sink->c.pdl : 0; }

static dpsResult_t selLocal(const dpsRecOp* op, const dpsRecSink* sink, cudaStream_t stream) {
  const dpsSelStep* s = (const dpsSelStep*)op->ctx;
  dpsSelLocalArgs a;
  dpsSelPlanStep(s, sink, sinkPdl(sink), &a);
  return dpsSelLaunchLocal(&a, s->call.k, s->op, stream);
}

static dpsResult_t selMerge(const dpsRecOp* op, const dpsRecSource* src, cudaStream_t stream) {
  const dpsSelStep* s = (const dpsSelStep*)op->ctx;
  dpsSelMergeArgs m;
  dpsSelPlanStepMerge(s, src, src->ll ? src->c.pdl : 0, &m);
  return dpsSelLaunchMerge(&m, s->call.k, s->op, stream);
}

static dpsResult_t runSteps(dpsComm_t comm, const char* name, const dpsSelStep* s,
                            cudaStream_t stream) {
  if (s->tp == 1) { /* no exchange: the local pass writes the outputs */
    dpsRecSink sink;
    memset(&sink, 0, sizeof sink);
    sink.kind = DPS_REC_NONE;
    sink.max_blocks = comm->local_max_blocks;
    dpsSelLocalArgs a;
    dpsSelPlanStep(s, &sink, comm->pdl, &a);
    return dpsSelLaunchLocal(&a, s->call.k, s->op, stream);
  }
  if (comm->ops->records == NULL)
    return dpsSetError(dpsUnavailable, "%s: the %s backend cannot exchange records", name,
                       comm->ops->name);
  dpsRecOp op;
  memset(&op, 0, sizeof op);
  op.name = name;
  op.rows = s->call.rows;
  op.words = dpsSelWords(s->call.k);
  op.local = selLocal;
  op.merge = selMerge;
  op.ctx = (void*)s;
  return comm->ops->records(comm, &op, stream);
}

dpsResult_t dpsSelectSteps(dpsComm_t comm, const char* op, const dpsSelectCall* call,
                           cudaStream_t stream) {
  dpsSelStep s;
  memset(&s, 0, sizeof s);
  s.op = op;
  s.call = *call;
  s.tp = comm->config.tp_size;
  s.rank = comm->config.rank;
  s.cols = comm->config.vocab_size / s.tp;
  s.sms = comm->sms;
  s.waves = &comm->sel_waves;
  return runSteps(comm, op, &s, stream);
}

static dpsResult_t runSelect(dpsComm_t comm, const char* op, const dpsSelectCall* call,
                             cudaStream_t stream) {
  dpsOpCtx x;
  DPS_CHECK(dpsOpBegin(comm, op, stream, &x));
  dpsResult_t r = dpsSelectSteps(comm, op, call, stream);
  /* a step missing on one rank leaves the others' records unpaired */
  if (r != dpsSuccess && comm->config.tp_size > 1) (void)dpsCommMarkFailed(comm, r);
  dpsOpLeave(comm, &x, r);
  return r;
}

dpsResult_t dpsArgmax(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                      dpsDataType_t dtype, int64_t vocab_limit, void* value, int64_t* index,
                      float* lse, cudaStream_t stream) {
  static const char* op = "argmax";
  dpsSelectCall call = {0};
  DPS_CHECK(dpsCheckShardCall(comm, op, logits, rows, cols, dtype, vocab_limit, &call));
  DPS_CHECK(dpsCheckOutBuffer(op, "value", value, dpsDataTypeSize(dtype), 0));
  DPS_CHECK(dpsCheckOutBuffer(op, "index", index, 8, 1));
  DPS_CHECK(dpsCheckOutBuffer(op, "lse", lse, 4, 0));
  call.k = 0;
  call.index = index;
  call.value = value;
  call.lse = lse;
  return runSelect(comm, op, &call, stream);
}

dpsResult_t dpsTopK(dpsComm_t comm, const void* logits, int64_t rows, int64_t cols,
                    dpsDataType_t dtype, int k, int64_t vocab_limit, void* values,
                    int64_t* indices, cudaStream_t stream) {
  static const char* op = "topk";
  dpsSelectCall call = {0};
  DPS_CHECK(dpsCheckShardCall(comm, op, logits, rows, cols, dtype, vocab_limit, &call));
  const int kmax = comm->config.max_topk;
  if (k < 1 || k > kmax || (int64_t)k > vocab_limit)
    return dpsSetError(dpsInvalidArgument,
                       "%s: k=%d must be in [1, min(max_topk=%d, vocab_limit=%" PRId64 ")]%s", op,
                       k, kmax, vocab_limit,
                       kmax == 0 ? " (created with max_topk=0: no top-k buffers)" : "");
  DPS_CHECK(dpsCheckOutBuffer(op, "values", values, dpsDataTypeSize(dtype), 0));
  DPS_CHECK(dpsCheckOutBuffer(op, "indices", indices, 8, 1));
  call.k = k;
  call.index = indices;
  call.value = values;
  return runSelect(comm, op, &call, stream);
}
