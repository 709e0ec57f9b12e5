/* The nccl backend: swap = grouped ncclSend/ncclRecv (the self chunk never
 * goes through NCCL) + one permute kernel; verify outputs = pack + exactly one
 * all-gather + unpack; logprobs = one all-gather straight into the output
 * (at tp == 1 without installed collectives both gathers are one copy kernel);
 * a records step (argmax, top-k, sample) = the op's local pass into a plain
 * buffer + one all-gather + the op's merge.
 * Every buffer is allocated at init/prepare for max_pad_bs; the operations
 * only enqueue work on the caller's stream (graph capturable). */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "provider.h"
#include "registry.h"
#include "kernels/nccl_kernels.h"

typedef struct {
  int32_t* pack_send;  /* [max_reqs*(2N+1)]     */
  int32_t* pack_recv;  /* [tp*max_reqs*(2N+1)]  */
  void* staging;       /* [tp][max_reqs*N][V/tp] of dtype: all-to-all receive */
  /* records steps: this rank's records [rec_rows][rec_words] and their
   * all-gather [tp][rec_rows][rec_words] (rec_words: comm->rec_words) */
  uint32_t* rec_send;
  uint32_t* rec_recv;
  int64_t rec_rows;
} dpsNcclState;

/* Byte count a*b*c*d, or 0 with an error set on overflow. */
static dpsResult_t bytesOf(uint64_t a, uint64_t b, uint64_t c, uint64_t d, const char* what,
                           size_t* out) {
  uint64_t t1, t2, t3;
  if (!dpsMulOk(a, b, &t1) || !dpsMulOk(t1, c, &t2) || !dpsMulOk(t2, d, &t3) ||
      t3 > (uint64_t)SIZE_MAX)
    return dpsSetError(dpsInvalidArgument, "nccl backend: byte count of %s overflows", what);
  *out = (size_t)t3;
  return dpsSuccess;
}

static void nbDestroy(dpsComm_t comm) {
  dpsNcclState* st = (dpsNcclState*)comm->backend_state;
  dpsFreeVerifyOutputs(comm);
  dpsFreeShardState(comm);
  dpsDeviceFree(comm, &comm->swap_out);
  if (st != NULL) {
    dpsDeviceFree(comm, (void**)&st->pack_send);
    dpsDeviceFree(comm, (void**)&st->pack_recv);
    dpsDeviceFree(comm, &st->staging);
    dpsDeviceFree(comm, (void**)&st->rec_send);
    dpsDeviceFree(comm, (void**)&st->rec_recv);
    free(st);
  }
  comm->backend_state = NULL;
}

static dpsResult_t nbInit(dpsComm_t comm) {
  const int tp = comm->config.tp_size;
  const uint64_t n = (uint64_t)comm->config.num_tokens_per_req;
  const uint64_t max_bs = (uint64_t)comm->config.max_pad_bs;
  const uint64_t max_reqs = max_bs / (uint64_t)tp;
  size_t b_send = 0, b_recv = 0;
  dpsResult_t r;
  dpsNcclState* st;

  if (comm->backend_state != NULL) return dpsSuccess; /* already initialized */
  DPS_CHECK(bytesOf(max_reqs, 2 * n + 1, 4, 1, "verify pack buffer", &b_send));
  DPS_CHECK(bytesOf(max_reqs, 2 * n + 1, 4, (uint64_t)tp, "verify gather buffer", &b_recv));

  st = (dpsNcclState*)calloc(1, sizeof(*st));
  if (st == NULL) return dpsSetError(dpsSystemError, "nccl backend: out of host memory");
  comm->backend_state = st;

  if ((r = dpsAllocVerifyOutputs(comm)) != dpsSuccess ||
      (r = dpsAllocShardState(comm)) != dpsSuccess ||
      (r = dpsDeviceAlloc(comm, (void**)&st->pack_send, b_send, "verify pack buffer")) != dpsSuccess ||
      (r = dpsDeviceAlloc(comm, (void**)&st->pack_recv, b_recv, "verify gather buffer")) != dpsSuccess) {
    nbDestroy(comm);
    return r;
  }
  /* records steps (nbRecords) */
  size_t b_rec_send = 0, b_rec_recv = 0;
  const uint64_t words = (uint64_t)comm->rec_words;
  st->rec_rows = (int64_t)(max_bs * n);
  DPS_CHECK(bytesOf(max_bs * n, words, 4, 1, "records buffer", &b_rec_send));
  DPS_CHECK(bytesOf(max_bs * n, words, 4, (uint64_t)tp, "records gather buffer", &b_rec_recv));
  if ((r = dpsDeviceAlloc(comm, (void**)&st->rec_send, b_rec_send, "records buffer")) != dpsSuccess ||
      (r = dpsDeviceAlloc(comm, (void**)&st->rec_recv, b_rec_recv, "records gather buffer")) !=
          dpsSuccess) {
    nbDestroy(comm);
    return r;
  }
  return dpsSuccess;
}

static dpsResult_t nbAllGatherBytes(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                                    cudaStream_t stream);

/* A records step: the op's local pass into the records buffer, one
 * all-gather, the op's merge. */
static dpsResult_t nbRecords(dpsComm_t comm, const dpsRecOp* op, cudaStream_t stream) {
  dpsNcclState* st = (dpsNcclState*)comm->backend_state;
  if (op->rows > st->rec_rows || op->words > comm->rec_words)
    return dpsSetError(dpsInternalError, "%s: %" PRId64 " rows x %d words exceed the buffers",
                       op->name, op->rows, op->words);
  dpsRecSink sink;
  memset(&sink, 0, sizeof sink);
  sink.kind = DPS_REC_PLAIN;
  sink.plain = st->rec_send;
  DPS_CHECK(op->local(op, &sink, stream));
  const size_t bytes = (size_t)op->rows * (size_t)op->words * sizeof(uint32_t);
  DPS_CHECK(nbAllGatherBytes(comm, st->rec_send, st->rec_recv, bytes, stream));
  dpsRecSource src;
  memset(&src, 0, sizeof src);
  src.gathered = st->rec_recv;
  return op->merge(op, &src, stream);
}

static dpsResult_t nbPrepare(dpsComm_t comm) {
  dpsNcclState* st = (dpsNcclState*)comm->backend_state;
  const int tp = comm->config.tp_size;
  const size_t esize = dpsDataTypeSize(comm->dtype);
  const uint64_t rows_max =
      (uint64_t)(comm->config.max_pad_bs / tp) * (uint64_t)comm->config.num_tokens_per_req;
  const uint64_t vocab = (uint64_t)comm->config.vocab_size;
  size_t b_out = 0, b_stage = 0;
  dpsResult_t r;

  if (st == NULL)
    return dpsSetError(dpsInternalError, "nccl backend: prepare before init");
  if (esize == 0)
    return dpsSetError(dpsInternalError, "nccl backend: prepare with dtype=%d unset",
                       (int)comm->dtype);
  if (comm->swap_out != NULL && st->staging != NULL) return dpsSuccess; /* already prepared */
  DPS_CHECK(bytesOf(rows_max, vocab, esize, 1, "swap output", &b_out));
  /* tp chunks of [rows_max, V/tp]: the same byte count as the output. */
  DPS_CHECK(bytesOf(rows_max, vocab / (uint64_t)tp, esize, (uint64_t)tp, "swap staging",
                    &b_stage));
  if ((r = dpsDeviceAlloc(comm, &comm->swap_out, b_out, "swap output")) != dpsSuccess) return r;
  if ((r = dpsDeviceAlloc(comm, &st->staging, b_stage, "swap staging")) != dpsSuccess) {
    dpsDeviceFree(comm, &comm->swap_out);
    return r;
  }
  return dpsSuccess;
}

static dpsResult_t nbSwap(dpsComm_t comm, const dpsShape* shape, const void* in,
                          cudaStream_t stream) {
  dpsNcclState* st = (dpsNcclState*)comm->backend_state;
  const dpsShape s = *shape;
  const int64_t rows = s.rows_per_rank;
  const size_t chunk = dpsSwapChunkBytes(s);
  const char* src = (const char*)in;
  char* stage;
  cudaError_t e;

  if (st == NULL || st->staging == NULL || comm->swap_out == NULL || s.esize == 0)
    return dpsSetError(dpsInternalError, "nccl backend: swap before prepare");
  stage = (char*)st->staging;

  if (comm->coll.all_to_all != NULL) {
    /* Replacement collective: full NCCL semantics, self chunk included. */
    dpsResult_t r = comm->coll.all_to_all(comm->coll.ctx, in, stage, chunk, stream);
    if (r != dpsSuccess)
      return dpsSetError(r, "nccl backend: the installed all_to_all (bytes=%zu) returned %s", chunk,
                         dpsGetErrorString(r));
    e = dpsLaunchSwapPermute(comm->swap_out, stage, chunk, NULL, -1, s.tp, rows, s.v_local,
                             s.esize, stream, comm->pdl);
  } else {
    /* the own chunk never goes through NCCL: the permute copies it */
    if (s.tp > 1) DPS_CHECK(comm->prov->all_to_all(comm, in, stage, chunk, s.rank, stream));
    e = dpsLaunchSwapPermute(comm->swap_out, stage, chunk, src + (size_t)s.rank * chunk, s.rank,
                             s.tp, rows, s.v_local, s.esize, stream, comm->pdl);
  }
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "nccl backend: swap permute launch failed: %s",
                       cudaGetErrorString(e));
  return dpsSuccess;
}

static dpsResult_t nbAllGatherBytes(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                                      cudaStream_t stream) {
  if (comm->coll.all_gather != NULL) {
    /* A replacement cannot set the message (dpsSetError is internal). */
    dpsResult_t r = comm->coll.all_gather(comm->coll.ctx, send, recv, bytes, stream);
    if (r != dpsSuccess)
      return dpsSetError(r, "nccl backend: the installed all_gather (bytes=%zu) returned %s", bytes,
                         dpsGetErrorString(r));
    return dpsSuccess;
  }
  return comm->prov->all_gather(comm, send, recv, bytes, stream);
}

/* At tp == 1 an all-gather is a copy of the rank's own data: with the
 * default collectives (NCCL) the gathers launch one copy kernel instead of
 * NCCL's one-rank all-gather (and the pack / unpack around it), the same
 * bytes in the same place. An installed all_gather is still called, at every
 * tp: the caller asked for it. */
static int oneRankCopy(dpsComm_t comm, const dpsShape* sh) {
  return sh->tp == 1 && comm->coll.all_gather == NULL;
}

static dpsResult_t copied(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return dpsSuccess;
  return dpsSetError(dpsCudaError, "nccl backend: %s copy (tp=1) launch failed: %s", what,
                     cudaGetErrorString(e));
}

static dpsResult_t nbGatherOutputs(dpsComm_t comm, const dpsShape* sh, const int32_t* predict,
                                   const int32_t* accept_index, const int32_t* accept_length,
                                   cudaStream_t stream) {
  dpsNcclState* st = (dpsNcclState*)comm->backend_state;
  const int tp = sh->tp, n = sh->n, reqs = sh->reqs;
  const size_t bytes = (size_t)sh->packed * sizeof(int32_t);
  cudaError_t e;

  if (st == NULL) return dpsSetError(dpsInternalError, "nccl backend: gather before init");
  if (oneRankCopy(comm, sh)) {
    int32_t* const dst[3] = {comm->vout.predict, comm->vout.accept_index,
                             comm->vout.accept_length};
    const int32_t* const src[3] = {predict, accept_index, accept_length};
    const int64_t count[3] = {sh->rows_per_rank, sh->rows_per_rank, reqs};
    return copied(dpsLaunchCopySegments(dst, src, count, stream, comm->pdl), "verify outputs");
  }
  e = dpsLaunchVerifyPack(st->pack_send, predict, accept_index, accept_length, reqs, n, stream,
                          comm->pdl);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "nccl backend: verify pack launch failed: %s",
                       cudaGetErrorString(e));
  DPS_CHECK(nbAllGatherBytes(comm, st->pack_send, st->pack_recv, bytes, stream));
  e = dpsLaunchVerifyUnpack(comm->vout.predict, comm->vout.accept_index, comm->vout.accept_length,
                            st->pack_recv, tp, reqs, n, stream, comm->pdl);
  if (e != cudaSuccess)
    return dpsSetError(dpsCudaError, "nccl backend: verify unpack launch failed: %s",
                       cudaGetErrorString(e));
  return dpsSuccess;
}

static dpsResult_t nbGatherLogprobs(dpsComm_t comm, const dpsShape* sh, const float* in,
                                   cudaStream_t stream) {
  const size_t bytes = (size_t)sh->rows_per_rank * sizeof(float);
  if (comm->vout.logprobs == NULL)
    return dpsSetError(dpsInternalError, "nccl backend: gather before init");
  if (oneRankCopy(comm, sh)) {
    int32_t* const dst[3] = {(int32_t*)comm->vout.logprobs, NULL, NULL};
    const int32_t* const src[3] = {(const int32_t*)in, NULL, NULL};
    const int64_t count[3] = {sh->rows_per_rank, 0, 0};
    return copied(dpsLaunchCopySegments(dst, src, count, stream, comm->pdl), "logprobs");
  }
  /* [tp][reqs, N] of the gather is exactly [pad_bs, N] with row src*reqs + r. */
  return nbAllGatherBytes(comm, in, comm->vout.logprobs, bytes, stream);
}

static cudaError_t nbPreload(void) {
  const cudaError_t e = dpsPreloadSwapPermute();
  return e == cudaSuccess ? dpsPreloadVerifyPack() : e;
}

const dpsBackendOps dpsNcclBackendOps = {
    .name = "nccl",
    .init = nbInit,
    .prepare = nbPrepare,
    .swap = nbSwap,
    .gather_outputs = nbGatherOutputs,
    .gather_logprobs = nbGatherLogprobs,
    .async_error = NULL, /* the group's (the provider's) */
    .destroy = nbDestroy,
    .preload = nbPreload,
    .close = NULL, /* nothing collective beyond the NCCL communicator (the core's) */
    .records = nbRecords,
};
