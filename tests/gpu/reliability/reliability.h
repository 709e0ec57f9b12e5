/* test_gpu_reliability's harness (rel_harness.c) and scenarios
 * (rel_scenarios.c); the driver and what each scenario checks:
 * tests/gpu/test_gpu_reliability.c. */
#ifndef DPS_REL_RELIABILITY_H_
#define DPS_REL_RELIABILITY_H_

#include "gpu_common.h"

/* ---- harness: time, environment, memory --------------------------------------- */
double nowS(void);
void sleepMs(long ms);
/* A positive integer from the environment, else `def`. */
long envLong(const char* name, long def);
/* This process's resident set (/proc/self/statm), -1 if unknown. */
long rssBytes(void);
#define MIB (1024.0 * 1024.0)

/* ---- harness: kill's own launcher -----------------------------------------------------
 * fxRunRanks counts a rank killed by a signal as a failure and then aborts the
 * others' barriers, and a grandchild of a rank cannot use CUDA (fxRunRanks
 * made the device current before the body runs), so the kill scenario has its
 * own launcher: two processes forked from the CUDA-free parent, a shared
 * page with a barrier and the dpsUniqueId, rank 1's death by SIGKILL
 * expected. */
#define KC_RANKS 2
#define KC_BARRIER_S 120.0
#define KC_WAIT_S 240.0

typedef struct {
  int nranks;
  int abort_flag;
  int bar_count;
  int bar_gen;
  int id_ok;
  dpsUniqueId id;
} kcShared;

/* The shared page (set in each rank before its body runs). */
extern kcShared* g_kc;
/* The two ranks' barrier; 1 when the other rank failed or it timed out. */
int kcBarrier(int rank);
/* Runs body(rank) on device rank in each of KC_RANKS processes. Returns 0
 * (rank 0 passed, rank 1 died by SIGKILL), 77 (skipped), 1. */
int runKill(int (*body)(int rank));

/* ---- scenarios (rel_scenarios.c) ---------------------------------------------- */
int bodyLifecycle(int rank, int tp, dpsBackend_t backend);
int bodyDestroyBusy(int rank, int tp, dpsBackend_t backend);
int bodySlow(int rank, int tp, dpsBackend_t backend);
int bodySoak(int rank, int tp, dpsBackend_t backend);
int bodyAsymCreate(int rank, int tp, dpsBackend_t backend);
int bodyAsymPrepare(int rank, int tp, dpsBackend_t backend);
/* kill: one rank of runKill (rank 1 SIGKILLs itself). */
int killRank(int rank);

#endif /* DPS_REL_RELIABILITY_H_ */
