/* The table of backends: what creation resolves against and what the core
 * asks about a backend (core/internal.h dpsBackendEntry). Adding a backend
 * is one entry here (and its enum value in the public header). */
#include "provider.h"
#include "registry.h"

static int onesidedAvailable(dpsComm_t comm) { return comm->prov->onesided_reachable(comm); }

static const dpsBackendEntry kBackends[] = {
    {.id = dpsBackendOnesided,
     .name = "onesided",
     .auto_priority = 2,
     .available = onesidedAvailable,
     .unavailable_why = "not every rank of the group is load/store reachable over NVLink (NCCL "
                        "LSA team) or symmetric memory is unsupported",
     .may_block = 0, /* its kernels wait for peers on the device, not the host */
     .uses_collectives = 0,
     .no_collectives_why = "its kernels store straight into the peers' memory",
     .ops = &dpsOnesidedBackendOps},
    {.id = dpsBackendNccl,
     .name = "nccl",
     .auto_priority = 1,
     .available = NULL, /* wherever the group's collectives run */
     .may_block = 1,    /* NCCL's enqueue may connect to the peers lazily */
     .uses_collectives = 1,
     .ops = &dpsNcclBackendOps},
};
#define NUM_BACKENDS (sizeof kBackends / sizeof kBackends[0])

const dpsBackendEntry* dpsBackendLookup(dpsBackend_t id) {
  for (size_t i = 0; i < NUM_BACKENDS; ++i)
    if (kBackends[i].id == id) return &kBackends[i];
  return NULL;
}

unsigned dpsBackendsAvailable(dpsComm_t comm) {
  unsigned mask = 0;
  for (size_t i = 0; i < NUM_BACKENDS; ++i) {
    const dpsBackendEntry* e = &kBackends[i];
    if (e->available == NULL || (comm != NULL && e->available(comm)))
      mask |= DPS_BACKEND_BIT(e->id);
  }
  return mask;
}

/* The entry of the highest priority in `mask` below `below` (INT_MAX: any). */
static const dpsBackendEntry* best(unsigned mask, int below, int unprobed_only) {
  const dpsBackendEntry* pick = NULL;
  for (size_t i = 0; i < NUM_BACKENDS; ++i) {
    const dpsBackendEntry* e = &kBackends[i];
    if (!(mask & DPS_BACKEND_BIT(e->id)) || e->auto_priority >= below) continue;
    if (unprobed_only && e->available != NULL) continue;
    if (pick == NULL || e->auto_priority > pick->auto_priority) pick = e;
  }
  return pick;
}

const dpsBackendEntry* dpsBackendPickAuto(unsigned mask) { return best(mask, 1 << 30, 0); }

const dpsBackendEntry* dpsBackendFallback(const dpsBackendEntry* failed) {
  return best(~0u, failed->auto_priority, 1);
}
