/* Planning of dpsArgmax / dpsTopK shared by both backends (and usable by the
 * virtual-rank tests): the local pass's and the merge's arguments from a call,
 * and the launches. Plain C, no NCCL. */
#ifndef DPS_SELECT_PLAN_H_
#define DPS_SELECT_PLAN_H_

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "kernels/select_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Words of one row's candidates from one rank (argmax: k == 0). */
int dpsSelWords(int k);

/* The current device's waves of the local passes, DPSAMPLING_SELECT_SPLIT
 * applied; once per communicator, at creation. A failed occupancy query
 * leaves every row one block (with a warning), never an error. */
void dpsSelPlanInit(dpsSelWaves* w);

/* The local pass of `call` on rank `rank` (shard of cols columns), with sink
 * DPS_SEL_SINK_FINAL (the caller changes it for tp > 1). sms: the SMs the
 * pass may fill, waves: dpsSelPlanInit's (together: the row split). */
void dpsSelPlanLocal(const dpsSelectCall* call, int rank, int64_t cols, int sms,
                     const dpsSelWaves* waves, int pdl, dpsSelLocalArgs* a);

/* The merge's arguments for `call` (candidates and epoch fields left to the caller). */
void dpsSelPlanMerge(const dpsSelectCall* call, int tp, int pdl, dpsSelMergeArgs* m);

/* Launches; the message names `op` and the kernel on failure. */
dpsResult_t dpsSelLaunchLocal(const dpsSelLocalArgs* a, int k, cudaStream_t stream);
dpsResult_t dpsSelLaunchMerge(const dpsSelMergeArgs* m, int k, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DPS_SELECT_PLAN_H_ */
