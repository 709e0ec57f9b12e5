/* The table of backends: what creation resolves against. Adding a backend is
 * one entry here (and its enum value in the public header). */
#include "provider.h"
#include "registry.h"

static int ncclAvailable(dpsComm_t comm) {
  (void)comm;
  return 1; /* wherever the group's collectives run */
}

static int onesidedAvailable(dpsComm_t comm) { return comm->prov->onesided_reachable(comm); }

static const dpsBackendEntry kBackends[] = {
    {.id = dpsBackendNccl, .name = "nccl", .available = ncclAvailable, .ops = &dpsNcclBackendOps},
    {.id = dpsBackendOnesided,
     .name = "onesided",
     .available = onesidedAvailable,
     .ops = &dpsOnesidedBackendOps},
};

const dpsBackendEntry* dpsBackendLookup(dpsBackend_t id) {
  for (size_t i = 0; i < sizeof kBackends / sizeof kBackends[0]; ++i)
    if (kBackends[i].id == id) return &kBackends[i];
  return NULL;
}
