/* dps-perf: the operations, in the order of the table (and of -o's list).
 * An operation is one op_*.c file defining a DpOp (dps_perf.h) plus its two
 * lines here. */
#include "dps_perf.h"

extern const DpOp dpOpSwap;
extern const DpOp dpOpGather;
extern const DpOp dpOpLogprobs;
extern const DpOp dpOpArgmax;
extern const DpOp dpOpArgmaxLse;
extern const DpOp dpOpTopk;

/* dpOpSample[] and dpOpVerify[] (dps_perf.h): the families "sample" and
 * "verify", references first. */
const DpOp* const dpOps[] = {
    &dpOpSwap,       &dpOpGather,     &dpOpLogprobs,   &dpOpArgmax,     &dpOpArgmaxLse,
    &dpOpTopk,       &dpOpSample[0],  &dpOpSample[1],  &dpOpSample[2],  &dpOpSample[3],
    &dpOpSample[4],  &dpOpSample[5],  &dpOpSample[6],  &dpOpSample[7],  &dpOpSample[8],
    &dpOpSample[9],  &dpOpSample[10], &dpOpSample[11], &dpOpSample[12], &dpOpVerify[0],
    &dpOpVerify[1],  &dpOpVerify[2],  &dpOpVerify[3],  &dpOpVerify[4],  &dpOpVerify[5],
    &dpOpVerify[6],  &dpOpVerify[7]};
/* every family member listed (a member left out can never run; one fell out
 * once); 6: the single operations at the head of the table */
_Static_assert(sizeof dpOps / sizeof dpOps[0] == 6 + DP_SAMPLE_OPS + DP_VERIFY_OPS,
               "dpOps[]: list every single operation and every member of dpOpSample[] and "
               "dpOpVerify[] (and count the single ones here)");
const int dpNumOps = (int)(sizeof dpOps / sizeof dpOps[0]);
