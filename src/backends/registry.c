/* The table of backends: what creation resolves against. Adding a backend is
 * one entry here (and its enum value in the public header). */
#include "registry.h"

static int ncclAvailable(ncclComm_t nccl) {
  (void)nccl;
  return 1; /* wherever NCCL runs */
}

static const dpsBackendEntry kBackends[] = {
    {.id = dpsBackendNccl, .name = "nccl", .available = ncclAvailable, .ops = &dpsNcclBackendOps},
    {.id = dpsBackendOnesided,
     .name = "onesided",
     .available = dpsOnesidedReachable,
     .ops = &dpsOnesidedBackendOps},
};

const dpsBackendEntry* dpsBackendLookup(dpsBackend_t id) {
  for (size_t i = 0; i < sizeof kBackends / sizeof kBackends[0]; ++i)
    if (kBackends[i].id == id) return &kBackends[i];
  return NULL;
}
