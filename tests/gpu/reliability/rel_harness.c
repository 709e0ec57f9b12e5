/* test_gpu_reliability's harness (reliability.h): time, environment and
 * memory helpers, and the kill scenario's own two-process launcher. */
#define _GNU_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "reliability.h"

double nowS(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sleepMs(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

long envLong(const char* name, long def) {
  const char* v = getenv(name);
  if (v == NULL || v[0] == '\0') return def;
  char* end = NULL;
  long x = strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 1) {
    fprintf(stderr, "%s=%s is not a positive integer; using %ld\n", name, v, def);
    return def;
  }
  return x;
}

long rssBytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == NULL) return -1;
  long size = 0, res = 0;
  int n = fscanf(f, "%ld %ld", &size, &res);
  fclose(f);
  if (n != 2) return -1;
  return res * sysconf(_SC_PAGESIZE);
}


/* ---- kill's launcher (reliability.h) ---------------------------------------------- */
kcShared* g_kc = NULL;

int kcBarrier(int rank) {
  kcShared* sh = g_kc;
  const int gen = __atomic_load_n(&sh->bar_gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&sh->bar_count, 1, __ATOMIC_ACQ_REL) == sh->nranks) {
    __atomic_store_n(&sh->bar_count, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->bar_gen, 1, __ATOMIC_RELEASE);
    return 0;
  }
  const double t0 = nowS();
  while (__atomic_load_n(&sh->bar_gen, __ATOMIC_ACQUIRE) == gen) {
    if (__atomic_load_n(&sh->abort_flag, __ATOMIC_ACQUIRE)) {
      fprintf(stderr, "rank %d: kill barrier: the other rank failed; giving up\n", rank);
      return 1;
    }
    if (nowS() - t0 > KC_BARRIER_S) {
      fprintf(stderr, "rank %d: kill barrier timed out\n", rank);
      return 1;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

int runKill(int (*body)(int rank)) {
  kcShared* sh = (kcShared*)mmap(NULL, sizeof(kcShared), PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("kill: mmap");
    return 1;
  }
  memset(sh, 0, sizeof *sh);
  sh->nranks = KC_RANKS;
  pid_t pids[KC_RANKS];
  int status[KC_RANKS] = {0}, done[KC_RANKS] = {0}, killed[KC_RANKS] = {0};
  const pid_t parent = getpid();
  fflush(NULL);
  for (int r = 0; r < KC_RANKS; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("kill: fork");
      for (int k = 0; k < r; ++k) kill(pids[k], SIGKILL);
      for (int k = 0; k < r; ++k) waitpid(pids[k], NULL, 0);
      munmap(sh, sizeof *sh);
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      setvbuf(stdout, NULL, _IOLBF, 0);
      g_kc = sh;
      int rc;
      cudaError_t e = cudaSetDevice(r);
      if (e != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaSetDevice: %s\n", r, cudaGetErrorString(e));
        rc = 1;
      } else {
        rc = body(r);
      }
      fflush(NULL);
      _exit(rc == 0 ? 0 : (rc == 77 ? 77 : 1));
    }
    pids[r] = pid;
  }
  /* rank 0 is expected to exit 0 (or 77), rank 1 to die by SIGKILL (or exit 77) */
  const double start = nowS();
  int remaining = KC_RANKS;
  while (remaining > 0 && nowS() - start < KC_WAIT_S) {
    for (int r = 0; r < KC_RANKS; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = 1;
        status[r] = st;
        --remaining;
        const int skipped = WIFEXITED(st) && WEXITSTATUS(st) == 77;
        const int as_expected =
            skipped || (r == 0 ? (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                               : (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL));
        if (!as_expected) __atomic_store_n(&sh->abort_flag, 1, __ATOMIC_SEQ_CST);
      }
    }
    if (remaining > 0) sleepMs(5);
  }
  for (int r = 0; r < KC_RANKS; ++r)
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      killed[r] = 1;
      waitpid(pids[r], &status[r], 0);
      fprintf(stderr, "kill: rank %d still running after %.0f s; killed\n", r, KC_WAIT_S);
    }
  munmap(sh, sizeof *sh);
  int n_skip = 0, ok = 1;
  for (int r = 0; r < KC_RANKS; ++r) {
    const int st = status[r];
    if (killed[r]) {
      ok = 0;
      continue;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
      ++n_skip;
      continue;
    }
    if (r == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      ok = 0;
      if (WIFSIGNALED(st)) fprintf(stderr, "kill: rank 0 died by signal %d\n", WTERMSIG(st));
      else fprintf(stderr, "kill: rank 0 exited with %d\n", WEXITSTATUS(st));
    }
    if (r == 1 && !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
      ok = 0;
      if (WIFSIGNALED(st)) fprintf(stderr, "kill: rank 1 died by signal %d, not SIGKILL\n",
                                   WTERMSIG(st));
      else fprintf(stderr, "kill: rank 1 exited with %d before killing itself\n",
                   WEXITSTATUS(st));
    }
  }
  if (n_skip == KC_RANKS) return 77;
  if (n_skip > 0) {
    fprintf(stderr, "kill: %d rank(s) skipped, the others did not: the ranks disagree\n", n_skip);
    return 1;
  }
  return ok ? 0 : 1;
}
