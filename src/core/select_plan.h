/* Planning of dpsArgmax / dpsTopK (core/select.c): the local pass's and the
 * merge's arguments from a call, the sink and source of the backend's records
 * step applied, and the launches. Plain C, no NCCL. */
#ifndef DPS_SELECT_PLAN_H_
#define DPS_SELECT_PLAN_H_

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "kernels/select_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Words of one row's record (candidates) from one rank (argmax: k == 0). */
int dpsSelWords(int k);

/* The current device's waves of the local passes, with at most `split`
 * blocks per row (DPSAMPLING_SELECT_SPLIT, comm->env); once per
 * communicator, at creation. A failed occupancy query leaves every row one
 * block (with a warning), never an error. */
void dpsSelPlanInit(dpsSelWaves* w, int split, int tiled);

/* Whether a top-k collection (dpsTopK's, dpsSample's candidates) re-reads
 * only the tiles that may reach its threshold: when the column ranges of
 * the `blocks` resident at once, each ceil(nvalid / chunks) columns of
 * dtype, exceed l2_share of the L2 of `w`, or as DPSAMPLING_TILED_COLLECT
 * (w->tiled) says. */
int dpsSelCollectTiled(const dpsSelWaves* w, int64_t blocks, int64_t nvalid, int chunks,
                       dpsDataType_t dtype, double l2_share);

/* The local pass of `call` on rank `rank` (shard of cols columns), with sink
 * DPS_REC_NONE (the outputs; dpsSelPlanStep sets the records sink at tp > 1).
 * sms: the SMs the pass may fill, waves: dpsSelPlanInit's (together: the row
 * split). */
void dpsSelPlanLocal(const dpsSelectCall* call, int rank, int64_t cols, int sms,
                     const dpsSelWaves* waves, int pdl, dpsSelLocalArgs* a);

/* The merge's arguments for `call` (the records source left to the caller). */
void dpsSelPlanMerge(const dpsSelectCall* call, int tp, int pdl, dpsSelMergeArgs* m);

/* One dpsArgmax / dpsTopK call as the context of its records op
 * (core/select.c): what the local pass and the merge are planned from once
 * the backend's sink or source is known. */
typedef struct dpsSelStep {
  const char* op; /* the call's name (argmax, topk, sample, verify_chain), for messages */
  dpsSelectCall call;
  int tp, rank;
  int64_t cols;             /* V / tp */
  int sms;                  /* the device's SMs: the budget of a sink without a grid cap */
  const dpsSelWaves* waves; /* the communicator's (dpsSelPlanInit) */
} dpsSelStep;

/* The local pass of a step into `sink`: DPS_REC_NONE at tp == 1 (the
 * outputs), else the backend's records. The sink's grid cap (max_blocks; 0:
 * none, the device's SMs) is the SM budget of the row split. */
void dpsSelPlanStep(const dpsSelStep* s, const dpsRecSink* sink, int pdl, dpsSelLocalArgs* a);
/* The merge of a step from the backend's records source. */
void dpsSelPlanStepMerge(const dpsSelStep* s, const dpsRecSource* src, int pdl,
                         dpsSelMergeArgs* m);

/* Launches; the message names `op` and the kernel on failure. */
dpsResult_t dpsSelLaunchLocal(const dpsSelLocalArgs* a, int k, const char* op, cudaStream_t stream);
dpsResult_t dpsSelLaunchMerge(const dpsSelMergeArgs* m, int k, const char* op, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DPS_SELECT_PLAN_H_ */
