/* Test-only entry points, built into the tests' support library (never
 * into libdpsampling). */
#ifndef DPS_TESTSUPPORT_H_
#define DPS_TESTSUPPORT_H_

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator with the given resolved backend and ops, no NCCL
 * communicator and no device state. Operations that pass their checks call
 * `ops`; dpsCommDestroy calls ops->destroy only. */
dpsResult_t dpsCommCreateDetached(dpsComm_t* comm, const dpsConfig_t* config, dpsBackend_t backend,
                                  const dpsBackendOps* ops);

#ifdef __cplusplus
}
#endif

#endif /* DPS_TESTSUPPORT_H_ */
