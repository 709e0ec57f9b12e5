/* Test support (not in the shipped library): a communicator without NCCL
 * and without device state, whose backend ops are the caller's (fakes for
 * the CPU tests and the fuzzer; the real nccl ops for the virtual ranks). */
#include <stdlib.h>

#include "internal.h"
#include "testsupport.h"

dpsResult_t dpsCommCreateDetached(dpsComm_t* out, const dpsConfig_t* config, dpsBackend_t backend,
                                  const dpsBackendOps* ops) {
  if (out == NULL || ops == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommCreateDetached: %s is NULL", out ? "ops" : "comm");
  DPS_CHECK(dpsConfigCheck(config));
  dpsComm_t comm = (dpsComm_t)calloc(1, sizeof *comm);
  if (comm == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  comm->config = *config;
  comm->backend = backend;
  comm->dtype = dpsDtypeUnset;
  comm->device = config->cuda_device < 0 ? 0 : config->cuda_device;
  comm->detached = 1;
  comm->ops = ops;
  dpsResult_t r = dpsResolveTimeoutMs(config, &comm->timeout_ms);
  if (r != dpsSuccess) {
    free(comm);
    return r;
  }
  r = ops->init ? ops->init(comm) : dpsSuccess;
  if (r == dpsSuccess && config->logits_dtype != dpsDtypeUnset)
    r = dpsCommPrepareDtype(comm, config->logits_dtype);
  if (r != dpsSuccess) {
    dpsCommFreeUnused(comm);
    return r;
  }
  *out = comm;
  return dpsSuccess;
}
