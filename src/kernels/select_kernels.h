/* Distributed argmax and top-k over vocab shards: the kernels' interface
 * (host: core/select.c, core/select_plan.c; device: kernels/select.cu).
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
 * The payload of (row, rank) is a record of the backend's records step
 * (kernels/records.h): the local pass writes it into the sink the backend
 * gives (plain [rows][words], which the nccl backend all-gathers, or LL lines
 * of two words into every rank's staging [parity][src][row * lines + l],
 * DPS_PEER_LL_OFFSET, onesided), the merge reads every rank's from the source.
 * At tp == 1 the sink is DPS_REC_NONE: the local pass writes the outputs. */
#ifndef DPS_SELECT_KERNELS_H_
#define DPS_SELECT_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h" /* DPS_TOPK_MAX */
#include "kernels/records.h"
#include "kernels/verify_walk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_ARGMAX_WORDS 4
#define DPS_TOPK_WORDS(k) (2 * (k))
/* Blocks that share one row: one thread-block cluster (portable size), the
 * partial results folded through distributed shared memory (sm_90+). */
#define DPS_SEL_MAX_CHUNKS 8

/* The caller's outputs (every rank gets every row). */
typedef struct {
  int64_t* index;  /* [rows] or [rows, k] */
  void* value;     /* same shape, logits dtype; NULL: not wanted */
  float* lse;      /* argmax only: [rows]; NULL: not wanted */
  unsigned long long* count_rows; /* argmax only: `rows` added once per call by the pass that
                                     writes index (dpsSample's greedy counter); NULL: none */
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
  int tiled;              /* top-k: the collection re-reads only the tiles that may reach
                             its threshold (dpsSelCollectTiled) */
  dpsRecSink sink;        /* the records (DPS_REC_NONE: the outputs) */
  dpsSelOut out;          /* DPS_REC_NONE */
  int pdl;
  dpsVerifyWalkArgs walk; /* tp == 1 argmax: the last row's block walks (pad_bs 0: no walk) */
} dpsSelLocalArgs;

typedef struct {
  long long rows;
  int tp, k, dtype;
  int want_lse;
  dpsSelOut out;
  dpsRecSource src; /* every rank's records */
  int pdl;
} dpsSelMergeArgs;

/* The local pass: argmax (k == 1 with a->want_lse, a->chunks) or top-k. */
cudaError_t dpsLaunchArgmaxLocal(const dpsSelLocalArgs* a, cudaStream_t stream);
cudaError_t dpsLaunchTopkLocal(const dpsSelLocalArgs* a, cudaStream_t stream);
/* The merge of every rank's candidates into the outputs. */
cudaError_t dpsLaunchArgmaxMerge(const dpsSelMergeArgs* a, cudaStream_t stream);
cudaError_t dpsLaunchTopkMerge(const dpsSelMergeArgs* a, cudaStream_t stream);
cudaError_t dpsPreloadSelectKernels(void);
/* *yes = 1 when the library's device code that runs on the current device
 * was compiled from sm_90+ PTX, so that its kernels wait in
 * griddepcontrol.wait (kernels/device.cuh): only then may they be launched
 * with programmatic dependent launch. Every .cu file of the library is
 * compiled for the same architectures; no kernel runs. */
cudaError_t dpsKernelsSupportPdl(int* yes);

/* When a top-k collection reads only the tiles that may reach its threshold
 * (DPSAMPLING_TILED_COLLECT). */
enum { DPS_TILED_AUTO = 0, DPS_TILED_NEVER = 1, DPS_TILED_ALWAYS = 2 };

/* One wave of a local pass on the current device: rows[kind][c] is how many
 * rows split over c blocks (a cluster of c when c > 1) are resident at once
 * (kind 0 argmax, 1 top-k; 0: c blocks per row cannot be launched, as without
 * clusters, i.e. before sm_90 or without sm_90+ device code); with the
 * device's L2 and the choice of tiled collections (dpsSelCollectTiled). */
typedef struct {
  int sms;            /* the device's SMs */
  long long l2_bytes; /* the device's L2 cache */
  int tiled;          /* DPS_TILED_* */
  int rows[2][DPS_SEL_MAX_CHUNKS + 1];
} dpsSelWaves;
cudaError_t dpsSelectWaves(dpsSelWaves* w);

#ifdef __cplusplus
}
#endif

#endif /* DPS_SELECT_KERNELS_H_ */
