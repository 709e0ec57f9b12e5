/* Reliability on 2..8 GPUs (one process per GPU):
 *  lifecycle     5 warm-up cycles, then DPS_RELIABILITY_CYCLES (default 200)
 *                measured ones: create / swap+gather checked / destroy per
 *                rank over the fixture's borrowed NCCL communicator
 *                (dpsCommInitFromNccl: NCCL bootstrap paid once), both
 *                backends. GPU free memory (cudaMemGetInfo) and host RSS
 *                (/proc/self/statm) are taken after the warm-up (which pays
 *                NCCL's and CUDA's one-time allocations) and at the end:
 *                fails if free memory dropped by more than 64 MiB or RSS grew
 *                by more than 32 MiB.
 *  destroy_busy  a host function sleeping 300 ms is queued on the stream
 *                before (then after) a swap + both gathers whose outputs are
 *                copied into the test's own buffers; dpsCommClose is called
 *                at once: it must succeed and wait for the communicator's own
 *                work only: after >= 250 ms when the sleep came first, at once
 *                (< 250 ms, stream still busy) when it came after the ops
 *                and their copies; the copied results must be right, and
 *                dpsCommRelease + dpsReleasePending then free everything.
 *                Both backends, every rank at the same point.
 *  kill          (onesided, tp 2) timeout_ms=1000: both ranks loop checked
 *                swap+gather calls; at iteration 5 rank 1 SIGKILLs itself
 *                after a barrier. Rank 0's next swap must report dpsTimeout
 *                (from the call or dpsCommGetAsyncError after synchronizing)
 *                within 2x the timeout + 1 s with a message naming rank 1;
 *                later calls fail the same way, destroy succeeds and the
 *                device is still usable. A rank dying by SIGKILL is a failure
 *                for fxRunRanks, so this scenario runs under its own small
 *                two-process launcher (below), which expects exactly that
 *                death. It is onesided-only: the nccl backend has no timeout
 *                (NCCL collectives wait for a missing peer forever, see
 *                README "Guarantees and faults"), so rank 0 would hang.
 *  slow          timeout_ms=5000: rank 1 sleeps 2 s on the host before each of
 *                3 swaps (checked, then a checked gather); every result right,
 *                no asynchronous error; rank 0's swap waited >= 1 s (so the
 *                gap really happened). Both backends (nccl: no timeout at all).
 *  soak          swap + both gathers + D2H copies of every output into pinned
 *                host memory, captured in one CUDA graph (16x2x1024 bf16),
 *                replayed DPS_SOAK_REPLAYS times (default 2000), the inputs
 *                switched every 100 replays among 8 precomputed sets; the
 *                pinned copy is poisoned before each replay and compared
 *                (memcmp, exact) with the precomputed expected image of the
 *                current set after it; wrong values are counted; replays/s
 *                printed. Both backends.
 * Usage: test_gpu_reliability [lifecycle|destroy_busy|kill|slow|soak|asym_create|asym_prepare|all]
 *                             [nccl|onesided|all]          (default all all)
 * The device acceptance run of the issue:
 *   DPS_RELIABILITY_CYCLES=1000 DPS_SOAK_REPLAYS=100000 test_gpu_reliability
 * Files: this one is the driver; the scenarios are reliability/rel_scenarios.c,
 * the harness (helpers, kill's own launcher) reliability/rel_harness.c.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reliability.h"

#define REL_TIMEOUT_S 600

/* ---- driver ---------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  gtBody body; /* NULL: kill (own launcher) */
} relTest;

int main(int argc, char** argv) {
  const relTest tests[] = {
      {"lifecycle", bodyLifecycle}, {"destroy_busy", bodyDestroyBusy}, {"kill", NULL},
      {"slow", bodySlow},           {"soak", bodySoak},          {"asym_create", bodyAsymCreate},
      {"asym_prepare", bodyAsymPrepare},
  };
  const int ntests = (int)(sizeof tests / sizeof tests[0]);
  const char* only = argc > 1 ? argv[1] : NULL;
  if (only && strcmp(only, "all") == 0) only = NULL;
  if (only) {
    int found = 0;
    for (int t = 0; t < ntests; ++t) found |= strcmp(only, tests[t].name) == 0;
    if (!found) {
      fprintf(stderr,
              "usage: test_gpu_reliability [lifecycle|destroy_busy|kill|slow|soak|asym_create|asym_prepare|all] "
              "[nccl|onesided|all]\n");
      return 2;
    }
  }
  dpsBackend_t backends[GT_MAX_BACKENDS];
  const int nb = gtBackends(argc - 1, argv + 1, backends); /* argv[2] or $DPS_TEST_BACKEND */
  if (nb < 0) return 2;
  const int ngpu = fxGpuCount();
  if (ngpu < 2) {
    printf("test_gpu_reliability: SKIP: needs >= 2 GPUs, found %d\n", ngpu);
    return 77;
  }
  unsetenv("DPSAMPLING_BACKEND");
  unsetenv("TOKENSPEED_DP_SAMPLING_BACKEND");
  unsetenv("DPSAMPLING_ONESIDED_LL_BYTES");
  unsetenv("DPSAMPLING_TIMEOUT_MS");
  int failures = 0, passes = 0, skips = 0;
  for (int t = 0; t < ntests; ++t) {
    if (only && strcmp(only, tests[t].name) != 0) continue;
    if (tests[t].body == NULL) { /* kill: onesided, tp 2 */
      int has_os = 0;
      for (int k = 0; k < nb; ++k) has_os |= backends[k] == dpsBackendOnesided;
      if (!has_os) {
        printf("test_gpu_reliability: kill: onesided only (the nccl backend has no timeout: a "
               "dead peer hangs NCCL); not selected\n");
        continue;
      }
      printf("test_gpu_reliability: kill tp=2 backend=onesided (rank 1 SIGKILLs itself) ...\n");
      fflush(stdout);
      const double t0 = nowS();
      const int rc = runKill(killRank);
      printf("test_gpu_reliability: kill tp=2 backend=onesided %s (%.1f s)\n",
             rc == 0 ? "PASS" : rc == 77 ? "SKIPPED (onesided unavailable)" : "FAIL",
             nowS() - t0);
      fflush(stdout);
      if (rc == 0) ++passes;
      else if (rc == 77) ++skips;
      else ++failures;
      continue;
    }
    const int tps[3] = {2, 4, 8};
    for (int i = 0; i < 3; ++i) {
      const int tp = tps[i];
      if (tp > ngpu) continue;
      for (int k = 0; k < nb; ++k) {
        gtRunArg arg = {tests[t].body, backends[k]};
        printf("test_gpu_reliability: %s tp=%d backend=%s ...\n", tests[t].name, tp,
               dpsBackendName(backends[k]));
        fflush(stdout);
        const double t0 = nowS();
        const int rc = fxRunRanks(tp, gtRankMain, &arg, REL_TIMEOUT_S);
        printf("test_gpu_reliability: %s tp=%d backend=%s %s (%.1f s)\n", tests[t].name, tp,
               dpsBackendName(backends[k]),
               rc == 0 ? "PASS" : rc == 77 ? "SKIPPED (backend unavailable)" : "FAIL",
               nowS() - t0);
        fflush(stdout);
        if (rc == 0) ++passes;
        else if (rc == 77) ++skips;
        else ++failures;
      }
    }
  }
  if (failures) return 1;
  if (passes == 0) {
    printf("test_gpu_reliability: SKIP: nothing ran (%d skipped)\n", skips);
    return 77;
  }
  return 0;
}
