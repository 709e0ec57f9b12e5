/* Distributed argmax and top-k over vocab shards: the kernels' interface
 * (host: core/select.c and the backends; device: kernels/select.cu).
 *
 * Every rank reduces its own [rows, V/tp] slice to a few candidates per row
 * (argmax: value, global index and the partial logsumexp (m, s); top-k: the
 * k best (value, global index) pairs, sorted), the ranks exchange the
 * candidates, and every rank merges them into the same result. Order: larger
 * value first, then lower global index; NaN counts as -inf; columns at or
 * beyond the vocab limit never take part.
 *
 * Candidate payload of one row from one rank, in 32-bit words:
 *   argmax: {value f32 bits, global index, m f32 bits, s f32 bits}
 *   top-k:  k x {value f32 bits, global index}, best first; missing entries
 *           (fewer than k valid columns) are {-inf, 0xffffffff}.
 * The payload of (row, rank) goes either to a plain buffer
 * [rows][words] (the nccl backend all-gathers it) or, as LL lines of two
 * words, to every rank's staging [parity][src][row * lines + l]
 * (DPS_OS_LL_OFFSET, the onesided backend). */
#ifndef DPS_SELECT_KERNELS_H_
#define DPS_SELECT_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h" /* DPS_TOPK_MAX */
#include "kernels/onesided_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_ARGMAX_WORDS 4
#define DPS_TOPK_WORDS(k) (2 * (k))
/* Blocks that share one row: one thread-block cluster (portable size), the
 * partial results folded through distributed shared memory (sm_90+). */
#define DPS_SEL_MAX_CHUNKS 8

/* Where a local kernel's per-row result goes. */
enum {
  DPS_SEL_SINK_FINAL = 0, /* tp == 1: the outputs themselves */
  DPS_SEL_SINK_PLAIN = 1, /* cand[row * words + w] */
  DPS_SEL_SINK_LL = 2     /* LL lines into every rank's staging (onesided) */
};

/* The caller's outputs (every rank gets every row). */
typedef struct {
  int64_t* index;  /* [rows] or [rows, k] */
  void* value;     /* same shape, logits dtype; NULL: not wanted */
  float* lse;      /* argmax only: [rows]; NULL: not wanted */
} dpsSelOut;

typedef struct {
  /* input slice: [rows, cols] of dtype (0 fp32, 1 bf16, 2 fp16), row pitch cols */
  const void* logits;
  long long rows, cols;
  int dtype;
  long long col0;   /* global index of column 0: rank * cols */
  long long nvalid; /* columns taking part: clamp(vocab_limit - col0, 0, cols) */
  int k;            /* top-k: 1..DPS_TOPK_MAX; argmax: 1 */
  int want_lse;     /* argmax: accumulate (m, s) */
  int chunks;       /* blocks per row (one cluster), 1..DPS_SEL_MAX_CHUNKS; > 1 only
                       where dpsSelectWaves() found clusters of that size launchable */
  int early_release;      /* PDL: let the dependent launch once the reads are done (else at exit) */
  int sink;
  dpsSelOut out;          /* DPS_SEL_SINK_FINAL */
  uint32_t* cand;         /* DPS_SEL_SINK_PLAIN */
  dpsOsCommon c;          /* DPS_SEL_SINK_LL: epochs, error word, peers */
  int op;                 /* DPS_SEL_SINK_LL: DPS_OS_OP_ARGMAX or DPS_OS_OP_TOPK */
  dpsOsPeers stage_peer;  /* DPS_SEL_SINK_LL: every rank's staging of op */
  long long cap;          /* DPS_SEL_SINK_LL: lines per (parity, src) */
  int pdl;
} dpsSelLocalArgs;

typedef struct {
  long long rows;
  int tp, k, dtype;
  int want_lse;
  dpsSelOut out;
  /* candidates: plain [tp][rows][words] (nccl), or LL staging (onesided) */
  const uint32_t* gathered;
  int ll;
  dpsOsCommon c;   /* ll: epochs, error word, peers, timeout */
  int op;
  const char* stage; /* ll: local staging of op */
  long long cap;
  int pdl;
} dpsSelMergeArgs;

/* The local pass: argmax (k == 1 with a->want_lse, a->chunks) or top-k. */
cudaError_t dpsLaunchArgmaxLocal(const dpsSelLocalArgs* a, cudaStream_t stream);
cudaError_t dpsLaunchTopkLocal(const dpsSelLocalArgs* a, cudaStream_t stream);
/* The merge of every rank's candidates into the outputs. */
cudaError_t dpsLaunchArgmaxMerge(const dpsSelMergeArgs* a, cudaStream_t stream);
cudaError_t dpsLaunchTopkMerge(const dpsSelMergeArgs* a, cudaStream_t stream);
cudaError_t dpsPreloadSelectKernels(void);
/* One wave of a local pass on the current device: rows[kind][c] is how many
 * rows split over c blocks (a cluster of c when c > 1) are resident at once
 * (kind 0 argmax, 1 top-k; 0: c blocks per row cannot be launched, as without
 * clusters, i.e. before sm_90 or without sm_90+ device code). */
typedef struct {
  int sms; /* the device's SMs */
  int rows[2][DPS_SEL_MAX_CHUNKS + 1];
} dpsSelWaves;
cudaError_t dpsSelectWaves(dpsSelWaves* w);

#ifdef __cplusplus
}
#endif

#endif /* DPS_SELECT_KERNELS_H_ */
