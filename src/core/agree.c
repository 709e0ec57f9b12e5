/* Creation's and prepare's agreements between the ranks: the one host-side
 * exchange of the library, over the provider's host all-gather
 * (core/provider.h). Blocking; never on an operation's path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "provider.h"

dpsResult_t dpsAgree(dpsComm_t comm, dpsResult_t local, const char* step, const int64_t* mine,
                     int count, int64_t* all) {
  const int tp = comm->config.tp_size;
  if (tp == 1) { /* no peer: nothing to exchange, the own outcome stands */
    if (all != NULL && count > 0) memcpy(all, mine, sizeof(int64_t) * (size_t)count);
    return local;
  }
  char msg[512] = "";
  if (local != dpsSuccess) snprintf(msg, sizeof msg, "%s", dpsGetLastError());
  /* word 0: the status, then the caller's words; every rank's, then ours */
  const size_t k = (size_t)count + 1;
  int64_t* buf = (int64_t*)malloc(sizeof(int64_t) * k * ((size_t)tp + 1));
  if (buf == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  int64_t* words = buf + k * (size_t)tp;
  words[0] = (int64_t)local;
  if (count > 0) memcpy(words + 1, mine, sizeof(int64_t) * (size_t)count);
  dpsResult_t r = comm->prov->exchange(comm, words, buf, (int)k);
  int failed_rank = -1, all_unavailable = 1;
  for (int q = 0; q < tp && r == dpsSuccess; ++q) {
    const int64_t s = buf[(size_t)q * k];
    if (s != dpsSuccess) {
      if (failed_rank < 0) failed_rank = q;
      if (s != dpsUnavailable) all_unavailable = 0;
    }
    if (all != NULL)
      for (int i = 0; i < count; ++i) all[(size_t)q * (size_t)count + (size_t)i] = buf[(size_t)q * k + 1 + (size_t)i];
  }
  free(buf);
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
                     "rank %d: %s failed on another rank, rank %d (its error says why); every "
                     "rank fails",
                     comm->config.rank, step, failed_rank);
}

dpsResult_t dpsAgreeStatus(dpsComm_t comm, dpsResult_t local, const char* step) {
  return dpsAgree(comm, local, step, NULL, 0, NULL);
}

dpsResult_t dpsAgreeMin(dpsComm_t comm, dpsResult_t local, const char* step, int64_t* vals,
                        int count) {
  const int tp = comm->config.tp_size;
  int64_t* all = (int64_t*)malloc(sizeof(int64_t) * (size_t)count * (size_t)tp);
  if (all == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  dpsResult_t r = dpsAgree(comm, local, step, vals, count, all);
  if (r == dpsSuccess)
    for (int q = 0; q < tp; ++q)
      for (int i = 0; i < count; ++i)
        if (all[(size_t)q * count + i] < vals[i]) vals[i] = all[(size_t)q * count + i];
  free(all);
  return r;
}
