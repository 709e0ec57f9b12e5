/* The backends' ops tables and onesided's probe, for the registry's table
 * (registry.c); the core asks the table (core/internal.h dpsBackendEntry,
 * dpsBackendLookup), never a backend by name. */
#ifndef DPS_BACKENDS_REGISTRY_H_
#define DPS_BACKENDS_REGISTRY_H_

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const dpsBackendOps dpsNcclBackendOps;
extern const dpsBackendOps dpsOnesidedBackendOps;

/* Whether every rank of nccl_comm is in its LSA (load/store) team
 * (kernels/onesided_setup.cu). */
int dpsOnesidedReachable(ncclComm_t nccl_comm);

#ifdef __cplusplus
}
#endif

#endif /* DPS_BACKENDS_REGISTRY_H_ */
