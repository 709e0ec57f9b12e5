/* Queries a binding asks instead of knowing each backend's behaviour. */
#include "internal.h"

dpsResult_t dpsCommOpMayBlock(dpsComm_t comm, int* may_block) {
  if (comm == NULL || may_block == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommOpMayBlock: %s is NULL",
                       comm ? "may_block" : "comm");
  /* Unprepared: the call may allocate (collective). nccl: NCCL's enqueue may
   * connect to the peers lazily. A prepared onesided communicator only
   * launches kernels (they wait for peers on the device, not the host). */
  *may_block = !comm->initialized || comm->backend != dpsBackendOnesided;
  return dpsSuccess;
}
