/* Queries a binding asks instead of knowing each backend's behaviour. */
#include "internal.h"

dpsResult_t dpsCommOpMayBlock(dpsComm_t comm, int* may_block) {
  if (comm == NULL || may_block == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommOpMayBlock: %s is NULL",
                       comm ? "may_block" : "comm");
  /* As the backend's entry says (backends/registry.c), except at tp == 1
   * without installed collectives: one rank exchanges nothing, so no
   * backend's operation calls NCCL or waits for a peer there (nccl: the swap
   * skips its all-to-all, the gathers copy, argmax / top-k / sample run their
   * local pass only). An installed table may do anything: may block. The
   * one operation an unset dtype changes is the swap that fixes it (it
   * allocates, collectively): the header leaves that case to the caller
   * (dpsCommGetInfo's `initialized`), so that argmax and the others on a
   * communicator that never swaps keep their answer. */
  const dpsBackendEntry* e = dpsBackendLookup(comm->backend);
  const int alone = comm->config.tp_size == 1 && comm->coll.all_gather == NULL &&
                    comm->coll.all_to_all == NULL;
  *may_block = e == NULL || (e->may_block && !alone);
  return dpsSuccess;
}
