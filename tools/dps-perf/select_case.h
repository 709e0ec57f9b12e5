/* What op_argmax.c and op_topk.c share: the cases (rows x V shards), the
 * inputs (the fixtures' selection rows), the buffers and the reference
 * check. k == 0: argmax, k == -1: argmax with the logsumexp, else top-k. */
#ifndef DPS_PERF_SELECT_CASE_H_
#define DPS_PERF_SELECT_CASE_H_

#include "dps_perf.h"

#define DP_TOPK_K 64 /* k of the top-k cases */

/* A case per shape (rows x V items; a->shapes, else `defaults`) and dtype
 * (a->dtypes, else bf16). */
void dpAddShapeCases(const DpOp* self, const DpCaseArgs* a, const DpShape* defaults,
                     int ndefaults);
/* The logit (row, col) of `step` as the dtype stores it (fixtures'
 * fxLogitValue), and row r of a case: the full row into row[0..V) and this
 * rank's slice of it into row r of shard ([rows, V/tp] of the case's dtype). */
float dpSelValue(int64_t row, int64_t col, int step, dpsDataType_t dtype);
void dpSelRow(const DpCase* c, int rank, int tp, int64_t r, int step, float* row, void* shard);
void dpSelAddCases(const DpOp* self, const DpCaseArgs* a);
int dpSelValid(const DpCase* c, int tp);
size_t dpSelBytes(const DpCase* c, int tp);
int dpSelHostInit(const DpCase* c, int rank, int tp, void** host);
void dpSelHostFree(void* host);
int dpSelSetup(const DpCase* c, int tp, void** bufs, DpLocal* l, int k);
int dpSelFill(const DpCase* c, void* bufs, const void* host, int tp, int step, cudaStream_t s,
              DpLocal* l);
dpsResult_t dpSelRun(const DpCase* c, dpsComm_t comm, void* bufs, int tp, cudaStream_t s);
long long dpSelCheck(const DpCase* c, void* bufs, int rank, int tp, int step, cudaStream_t s,
                     DpLocal* l);
void dpSelTeardown(void* bufs);

/* The descriptor of a selection operation (op_argmax.c, op_topk.c). */
#define DP_SELECT_OP(NAME, SETUP)                                                       \
  {                                                                                     \
    .name = NAME, .aliases = NULL, .add_cases = dpSelAddCases, .valid = dpSelValid,     \
    .bytes = dpSelBytes, .host_init = dpSelHostInit, .host_free = dpSelHostFree,        \
    .setup = SETUP, .fill = dpSelFill, .run = dpSelRun, .check = dpSelCheck,            \
    .teardown = dpSelTeardown, .hbm = 1,                                                \
  }

#endif /* DPS_PERF_SELECT_CASE_H_ */
