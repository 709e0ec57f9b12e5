/* Creation's agreements between the ranks, over the provider's host
 * exchange (core/provider.h). Blocking; never on an operation's path. */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "provider.h"

dpsResult_t dpsAgreeMin(dpsComm_t comm, int64_t* vals, int count) {
  const int tp = comm->config.tp_size;
  int64_t* all = (int64_t*)malloc(sizeof(int64_t) * (size_t)count * (size_t)tp);
  if (all == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  dpsResult_t r = comm->prov->exchange(comm, vals, all, count);
  if (r == dpsSuccess)
    for (int q = 0; q < tp; ++q)
      for (int i = 0; i < count; ++i)
        if (all[(size_t)q * count + i] < vals[i]) vals[i] = all[(size_t)q * count + i];
  free(all);
  return r;
}

dpsResult_t dpsAgreeStatus(dpsComm_t comm, dpsResult_t local, const char* step) {
  const int tp = comm->config.tp_size;
  char msg[512] = "";
  if (local != dpsSuccess) snprintf(msg, sizeof msg, "%s", dpsGetLastError());
  int64_t* all = (int64_t*)malloc(sizeof(int64_t) * (size_t)tp);
  if (all == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  const int64_t mine = (int64_t)local;
  dpsResult_t r = comm->prov->exchange(comm, &mine, all, 1);
  int failed_rank = -1, all_unavailable = 1;
  for (int q = 0; q < tp && r == dpsSuccess; ++q)
    if (all[q] != dpsSuccess) {
      if (failed_rank < 0) failed_rank = q;
      if (all[q] != dpsUnavailable) all_unavailable = 0;
    }
  free(all);
  /* this rank's own failure stands with its own message; but an unavailable
   * step where another rank failed otherwise is a failure here too, so that
   * no rank falls back to another backend alone */
  if (local == dpsUnavailable && r == dpsSuccess && !all_unavailable)
    return dpsSetError(dpsSystemError, "%s; and %s failed on another rank (see its error)", msg,
                       step);
  if (local != dpsSuccess) return dpsSetError(local, "%s", msg);
  if (r != dpsSuccess) return r;
  if (failed_rank < 0) return dpsSuccess;
  if (all_unavailable)
    return dpsSetError(dpsUnavailable,
                       "rank %d: %s is unavailable on rank %d (its error says why); every rank "
                       "fails alike",
                       comm->config.rank, step, failed_rank);
  return dpsSetError(dpsSystemError,
                     "rank %d: %s failed on rank %d (see that rank's error); every rank fails",
                     comm->config.rank, step, failed_rank);
}
