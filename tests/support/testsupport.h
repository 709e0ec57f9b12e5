/* Test-only providers (core/provider.h), built into the tests' support
 * library, never into libdpsampling. Both create communicators through the
 * library's one creation path (dpsCommCreate); only where the group's memory
 * and collectives come from differs from production. */
#ifndef DPS_TESTSUPPORT_H_
#define DPS_TESTSUPPORT_H_

#include "internal.h"
#include "provider.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- host-only (host.c): the CPU tests and the fuzzer, no GPU ------------
 * A communicator of rank config->rank whose peers all agree with it, whose
 * backend is `ops` (recording fakes) resolved as `backend`, and which makes
 * no CUDA or NCCL call of its own. */
dpsResult_t dpsTestCommCreateHost(dpsComm_t* comm, const dpsConfig_t* config, dpsBackend_t backend,
                                  const dpsBackendOps* ops);

/* ---- virtual ranks (virtual.c): tp ranks on one GPU, a thread each -------
 * Symmetric memory is device memory of the one GPU (every rank's peer
 * pointers are the other ranks' allocations), exchanges meet at a host
 * barrier, and the nccl backend's collectives are device copies between the
 * ranks' buffers ordered with events. Every rank's thread calls the group's
 * collective steps (creation, operations of the nccl backend, close) at the
 * same point, as with NCCL. */
typedef struct dpsVirtualGroup dpsVirtualGroup;

/* A group of tp ranks on the current device; a barrier that waits longer
 * than barrier_s seconds aborts the group (then every waiting rank fails). */
dpsResult_t dpsVirtualGroupCreate(dpsVirtualGroup** group, int tp, int barrier_s);
/* After every rank's communicator was destroyed (and freed: none left
 * waiting in dpsReleasePending), outside any capture: waits for the device
 * and frees the ranks' symmetric memory, which the group keeps until then. */
void dpsVirtualGroupDestroy(dpsVirtualGroup* group);
/* Wakes every rank waiting at the group's barrier with a failure. */
void dpsVirtualGroupAbort(dpsVirtualGroup* group);
/* The host barrier itself (0 = met, 1 = aborted or timed out). */
int dpsVirtualBarrier(dpsVirtualGroup* group);
/* Collective over the group's ranks (config->rank of config->tp_size == the
 * group's tp): the library's creation path with the virtual provider, on
 * config->cuda_device (or the current device). */
dpsResult_t dpsCommInitVirtual(dpsComm_t* comm, dpsVirtualGroup* group, const dpsConfig_t* config);

#ifdef __cplusplus
}
#endif

#endif /* DPS_TESTSUPPORT_H_ */
