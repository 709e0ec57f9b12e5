/* Queries a binding asks instead of knowing each backend's behaviour. */
#include "internal.h"

dpsResult_t dpsCommOpMayBlock(dpsComm_t comm, int* may_block) {
  if (comm == NULL || may_block == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommOpMayBlock: %s is NULL",
                       comm ? "may_block" : "comm");
  /* Unprepared: the call may allocate (collective). Prepared: as the
   * backend's entry says (backends/registry.c), except at tp == 1 without
   * installed collectives: one rank exchanges nothing, so no backend's
   * operation calls NCCL or waits for a peer there (nccl: the swap skips
   * its all-to-all, the gathers copy, argmax / top-k / sample run their
   * local pass only). An installed table may do anything: may block. */
  const dpsBackendEntry* e = dpsBackendLookup(comm->backend);
  const int alone = comm->config.tp_size == 1 && comm->coll.all_gather == NULL &&
                    comm->coll.all_to_all == NULL;
  *may_block = !comm->initialized || e == NULL || (e->may_block && !alone);
  return dpsSuccess;
}
