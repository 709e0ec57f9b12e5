/* Queries a binding asks instead of knowing each backend's behaviour. */
#include "internal.h"

dpsResult_t dpsCommOpMayBlock(dpsComm_t comm, int* may_block) {
  if (comm == NULL || may_block == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommOpMayBlock: %s is NULL",
                       comm ? "may_block" : "comm");
  /* Unprepared: the call may allocate (collective). Prepared: as the
   * backend's entry says (backends/registry.c). */
  const dpsBackendEntry* e = dpsBackendLookup(comm->backend);
  *may_block = !comm->initialized || e == NULL || e->may_block;
  return dpsSuccess;
}
