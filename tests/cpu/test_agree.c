/* Creation's agreements (core/agree.c) over a scripted exchange: what every
 * rank returns for each combination of the ranks' local outcomes, so that
 * no rank goes on (or falls back to another backend) alone. No GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "internal.h"
#include "provider.h"

#define TP 4

/* What the other ranks say: words[r][0] their status, words[r][1 + i] their
 * words (dpsAgree's layout); this rank's own come from `mine`. */
static int64_t g_words[TP][8];
static int g_exchange_fails;

static dpsResult_t scriptedExchange(dpsComm_t comm, const int64_t* mine, int64_t* all, int count) {
  if (g_exchange_fails) return dpsSetError(dpsNcclError, "scripted exchange failure");
  for (int r = 0; r < TP; ++r)
    for (int i = 0; i < count; ++i)
      all[r * count + i] = r == comm->config.rank ? mine[i] : g_words[r][i];
  return dpsSuccess;
}

static const dpsProvider kScripted = {.name = "scripted", .exchange = scriptedExchange};

static struct dpsComm g_comm;

static dpsComm_t comm(int rank) {
  memset(&g_comm, 0, sizeof g_comm);
  g_comm.config.tp_size = TP;
  g_comm.config.rank = rank;
  g_comm.prov = &kScripted;
  return &g_comm;
}

/* The peers' statuses (this rank's entry is ignored), then this rank's. */
static dpsResult_t agreeWith(const dpsResult_t peers[TP], int rank, dpsResult_t local,
                             const char* local_msg) {
  for (int r = 0; r < TP; ++r) g_words[r][0] = peers[r];
  if (local != dpsSuccess) dpsSetError(local, "%s", local_msg);
  else dpsClearError();
  return dpsAgreeStatus(comm(rank), local, "the step");
}

static int testStatus(void) {
  const dpsResult_t ok[TP] = {dpsSuccess, dpsSuccess, dpsSuccess, dpsSuccess};
  const dpsResult_t una2[TP] = {dpsSuccess, dpsSuccess, dpsUnavailable, dpsSuccess};
  const dpsResult_t una_all[TP] = {dpsUnavailable, dpsUnavailable, dpsUnavailable,
                                   dpsUnavailable};
  const dpsResult_t oom3[TP] = {dpsUnavailable, dpsUnavailable, dpsUnavailable, dpsSystemError};
  /* everyone fine */
  FX_CHECK(agreeWith(ok, 1, dpsSuccess, "") == dpsSuccess, "all succeeded");
  /* rank 2 unavailable: the others fail alike, naming rank 2 and the step */
  FX_CHECK_ERR(agreeWith(una2, 1, dpsSuccess, ""), dpsUnavailable, "unavailable on rank 2");
  FX_CHECK(strstr(dpsGetLastError(), "the step") != NULL, "step not named: %s", dpsGetLastError());
  /* and rank 2 itself keeps its own message */
  FX_CHECK_ERR(agreeWith(una2, 2, dpsUnavailable, "no symmetric memory here"), dpsUnavailable,
               "no symmetric memory here");
  /* every rank unavailable: each keeps its own message */
  FX_CHECK_ERR(agreeWith(una_all, 0, dpsUnavailable, "cause on rank 0"), dpsUnavailable,
               "cause on rank 0");
  /* rank 3 failed otherwise: the unavailable ranks fail too (no fallback alone) */
  FX_CHECK_ERR(agreeWith(oom3, 0, dpsUnavailable, "cause on rank 0"), dpsSystemError,
               "cause on rank 0; and the step failed on another rank");
  FX_CHECK_ERR(agreeWith(oom3, 3, dpsSystemError, "out of memory on rank 3"), dpsSystemError,
               "out of memory on rank 3");
  /* a healthy rank among them: a failure, naming the first failed rank */
  const dpsResult_t mixed[TP] = {dpsSuccess, dpsUnavailable, dpsSuccess, dpsSystemError};
  FX_CHECK_ERR(agreeWith(mixed, 0, dpsSuccess, ""), dpsSystemError,
               "the step failed on another rank, rank 1");
  /* the exchange itself failing: its error (a healthy rank), the own one otherwise */
  g_exchange_fails = 1;
  FX_CHECK_ERR(agreeWith(ok, 0, dpsSuccess, ""), dpsNcclError, "scripted exchange failure");
  FX_CHECK_ERR(agreeWith(ok, 0, dpsUnavailable, "own cause"), dpsUnavailable, "own cause");
  g_exchange_fails = 0;
  return 0;
}

static int testMin(void) {
  const int64_t peers[TP][3] = {{5, -1, 7}, {0, 0, 0}, {9, 4, 3}, {6, 8, -2}};
  for (int r = 0; r < TP; ++r) {
    g_words[r][0] = dpsSuccess;
    memcpy(g_words[r] + 1, peers[r], sizeof peers[r]);
  }
  int64_t mine[3] = {4, 2, 2}; /* rank 1's own */
  FX_CHECK_OK(dpsAgreeMin(comm(1), dpsSuccess, "the step", mine, 3));
  FX_CHECK(mine[0] == 4 && mine[1] == -1 && mine[2] == -2, "min = {%lld, %lld, %lld}",
           (long long)mine[0], (long long)mine[1], (long long)mine[2]);
  /* the same exchange carries the status: a failed peer fails the step, and
   * the words are left as they were */
  g_words[3][0] = dpsInvalidArgument;
  int64_t again[3] = {4, 2, 2};
  FX_CHECK_ERR(dpsAgreeMin(comm(1), dpsSuccess, "the step", again, 3), dpsSystemError,
               "rank 1: the step failed on another rank, rank 3");
  FX_CHECK(again[0] == 4 && again[1] == 2 && again[2] == 2, "words changed on failure");
  /* every rank's words come back through dpsAgree */
  g_words[3][0] = dpsSuccess;
  int64_t all[TP * 3];
  const int64_t own[3] = {4, 2, 2};
  FX_CHECK_OK(dpsAgree(comm(2), dpsSuccess, "the step", own, 3, all));
  FX_CHECK(all[0] == 5 && all[3] == 0 && all[6] == 4 && all[9] == 6 && all[11] == -2,
           "all = {%lld, .., %lld, .., %lld}", (long long)all[0], (long long)all[6],
           (long long)all[11]);
  return 0;
}

int main(void) {
  if (testStatus() || testMin()) return 1;
  printf("test_agree: passed\n");
  return 0;
}
