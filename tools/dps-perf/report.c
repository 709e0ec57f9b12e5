/* dps-perf: what rank 0 prints: the header (versions, build, ranks), the
 * table (or CSV) and its rows, the failures, the totals; the rows' agreed
 * times for the operations' notes (dpRowTime). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "harness.h"

#ifndef DPS_PERF_CUDA_COMPILER
#define DPS_PERF_CUDA_COMPILER "unknown"
#endif
#ifndef DPS_PERF_C_COMPILER
#define DPS_PERF_C_COMPILER "unknown"
#endif
#ifndef DPS_PERF_BUILD_TYPE
#define DPS_PERF_BUILD_TYPE "unknown"
#endif
#ifndef DPS_PERF_CUDA_ARCHS
#define DPS_PERF_CUDA_ARCHS "unknown"
#endif
#ifndef DPS_PERF_NCCL_LIBRARY
#define DPS_PERF_NCCL_LIBRARY "unknown"
#endif

void dpNoteAppend(char* out, size_t len, const char* fmt, ...) {
  const size_t n = strnlen(out, len);
  if (n + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + n, len - n, fmt, ap);
  va_end(ap);
}

void printFailures(const Agreed* a, int tp) {
  for (int r = 0; r < tp; ++r)
    if (a->status[r] != DP_OK) printf("#   rank %d: %s\n", r, a->msg[r]);
}

/* The dtype column: the logits dtype, else the operation's element type. */
static const char* dtypeName(const DpCase* c) {
  if (c->dtype != dpsDtypeUnset) return dpsDataTypeName(c->dtype);
  return c->op->elem_type ? c->op->elem_type : "-";
}

/* The rows measured so far (every rank holds the same agreed times), for
 * dpRowTime. */
typedef struct {
  const DpOp* op;
  DpCase c;
  dpsBackend_t be;
  double us;
} DpTimed;

static DpTimed g_timed[2 * DP_MAX_CASES];
static int g_ntimed;

void recordTime(const DpCase* c, dpsBackend_t be, double us) {
  if (g_ntimed < (int)(sizeof g_timed / sizeof g_timed[0])) {
    DpTimed t = {c->op, *c, be, us};
    g_timed[g_ntimed++] = t;
  }
}

double dpRowTime(const char* op, const DpCase* c, dpsBackend_t be) {
  for (int i = g_ntimed - 1; i >= 0; --i) {
    const DpTimed* t = &g_timed[i];
    if (!strcmp(t->op->name, op) && t->be == be && t->c.pad_bs == c->pad_bs && t->c.n == c->n &&
        t->c.vocab == c->vocab && t->c.dtype == c->dtype)
      return t->us;
  }
  return 0.0;
}

/* Width of the op column: the longest selected name, at least 8 (the
 * table of the original operations is unchanged). */
static int opWidth(void) {
  int w = 8;
  for (int i = 0; i < dpNumOps; ++i)
    if (g_opt.ops[i] && (int)strlen(dpOps[i]->name) > w) w = (int)strlen(dpOps[i]->name);
  return w;
}

/* 1 when a selected operation writes notes (the CSV gets a note column). */
static int anyNotes(void) {
  for (int i = 0; i < dpNumOps; ++i)
    if (g_opt.ops[i] && dpOps[i]->note) return 1;
  return 0;
}

/* ------------------------------------------------------------------------- */
/* Header                                                                     */

static const char* libPathOf(const char* symbol) {
  void* p = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info;
  if (p && dladdr(p, &info) && info.dli_fname) return info.dli_fname;
  return "?";
}

void printHeader(int tp) {
  int nccl_rt = 0, cudart = 0, driver = 0, dps = 0;
  ncclGetVersion(&nccl_rt);
  cudaRuntimeGetVersion(&cudart);
  cudaDriverGetVersion(&driver);
  dpsGetVersion(&dps);
  printf("# dps-perf: dpsampling %d.%d.%d (library loaded: %d.%d.%d, %s)\n", DPS_VERSION_MAJOR,
         DPS_VERSION_MINOR, DPS_VERSION_PATCH, dps / 10000, dps / 100 % 100, dps % 100,
         libPathOf("dpsGetVersion"));
  printf("# build: %s, CUDA compiler %s, C compiler %s, CUDA archs %s, CUDA runtime headers %d.%d,"
         " NCCL headers %d.%d.%d (%s)\n",
         DPS_PERF_BUILD_TYPE, DPS_PERF_CUDA_COMPILER, DPS_PERF_C_COMPILER, DPS_PERF_CUDA_ARCHS,
         CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
         DPS_PERF_NCCL_LIBRARY);
  printf("# running: NCCL %d.%d.%d (%s), CUDA runtime %d.%d (%s), driver API %d.%d\n",
         nccl_rt / 10000, nccl_rt / 100 % 100, nccl_rt % 100, libPathOf("ncclGetVersion"),
         cudart / 1000, cudart % 1000 / 10, libPathOf("cudaRuntimeGetVersion"), driver / 1000,
         driver % 1000 / 10);
  if (nccl_rt != NCCL_VERSION_CODE)
    printf("# WARNING: built against NCCL %d but running %d: the device API structures may not "
           "match\n",
           NCCL_VERSION_CODE, nccl_rt);
  printf("# tp %d | backends", tp);
  for (int i = 0; i < g_opt.nbackends; ++i)
    printf("%s%s", i ? "," : " ", dpsBackendName(g_opt.backends[i]));
  printf(" | ops");
  for (int i = 0, k = 0; i < dpNumOps; ++i)
    if (g_opt.ops[i]) printf("%s%s", k++ ? "," : " ", dpOps[i]->name);
  printf(" | warmup %d | %d calls per graph x %d replays | check %s\n", g_opt.warmup,
         g_opt.iters, g_opt.replays, g_opt.check ? "on" : "OFF");
  const char* envs[] = {"NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "NCCL_P2P_LEVEL",
                        "NCCL_PROTO", "NCCL_ALGO", "DPSAMPLING_TIMEOUT_MS"};
  printf("# env:");
  for (size_t i = 0; i < sizeof envs / sizeof envs[0]; ++i) {
    const char* v = getenv(envs[i]);
    if (v) printf(" %s=%s", envs[i], v);
  }
  printf("\n");
  for (int r = 0; r < tp; ++r)
    printf("#  Rank %2d Pid %6d on %10s device %2d [%s] %s\n", r, g_sh->pid[r], g_sh->host[r],
           g_sh->dev[r], g_sh->busid[r], g_sh->devname[r]);
  fflush(stdout);
}

void printTableHeader(void) {
  if (g_opt.csv) {
    printf("op,backend,pad_bs,N,vocab,dtype,bytes,time_us,algbw_GBps,link_eff_pct,wrong,status%s\n",
           anyNotes() ? ",note" : "");
  } else {
    printf("#\n# bytes: what each rank sends across the link per call ((tp-1)/tp of its input);"
           " algbw = bytes / time; link = algbw / peer store peak\n# argmax, topk: bytes = the"
           " local pass's HBM reads of the shard; link = algbw / HBM read peak\n# sample_*: the same"
           " (bytes = the shard's logits); the note after #wrong: op_sample.c\n# verify_*: the same"
           " (rows = pad_bs*N); the note after #wrong: op_verify.c\n#\n");
    printf("# %*s %9s %7s %3s %7s %6s %12s %10s %12s %7s %7s\n", opWidth(), "op", "backend",
           "pad_bs", "N", "vocab", "dtype", "bytes", "time(us)", "algbw(GB/s)", "link", "#wrong");
  }
  fflush(stdout);
}

void printRow(const DpCase* c, dpsBackend_t be, int tp, double us, long long wrong,
                     const char* status, const char* note) {
  const char* dt = dtypeName(c);
  char vocab[32];
  if (c->vocab) snprintf(vocab, sizeof vocab, "%lld", (long long)c->vocab);
  else snprintf(vocab, sizeof vocab, "-");
  const size_t bytes = c->op->bytes(c, tp);
  const int ok = status == NULL;
  const double algbw = ok && us > 0 ? (double)bytes / (us * 1e3) : 0.0;
  char eff[32], wr[32], tm[32], bw[32];
  const double peak = c->op->hbm ? g_hbm_peak : g_store_peak;
  if (ok && peak > 0) snprintf(eff, sizeof eff, "%.1f%%", 100.0 * algbw / peak);
  else snprintf(eff, sizeof eff, "-");
  if (!ok) snprintf(wr, sizeof wr, "-");
  else if (g_opt.check) snprintf(wr, sizeof wr, "%lld", wrong);
  else snprintf(wr, sizeof wr, "n/a");
  if (ok) {
    snprintf(tm, sizeof tm, "%.2f", us);
    snprintf(bw, sizeof bw, "%.2f", algbw);
  } else {
    snprintf(tm, sizeof tm, "%s", status);
    snprintf(bw, sizeof bw, "-");
  }
  const int notes = anyNotes();
  if (g_opt.csv) {
    printf("%s,%s,%d,%d,%s,%s,%zu,%s,%s,%s,%s,%s%s%s%s\n", c->op->name, dpsBackendName(be),
           c->pad_bs, c->n, vocab, dt, bytes, ok ? tm : "", ok ? bw : "",
           ok && peak > 0 ? eff : "", ok ? wr : "", ok ? (wrong ? "wrong" : "ok") : status,
           notes ? ",\"" : "", notes && note ? note : "", notes ? "\"" : "");
  } else {
    printf("  %*s %9s %7d %3d %7s %6s %12zu %10s %12s %7s %7s%s%s\n", opWidth(), c->op->name,
           dpsBackendName(be), c->pad_bs, c->n, vocab, dt, bytes, tm, bw, eff, wr,
           note && note[0] ? "  " : "", note ? note : "");
  }
  fflush(stdout);
}

void printTotals(const Totals* tot, int fatal, int ran) {
  printf("#\n# rows: %d | wrong elements: %lld%s | errors: %d | backends run: %d of %d\n",
         tot->rows, tot->wrong_total,
         g_opt.check ? (tot->wrong_total ? " FAILED" : " OK") : " (check off)", tot->errors, ran,
         g_opt.nbackends);
  printf("# %s\n", (tot->wrong_total || tot->errors || fatal || !ran) ? "FAILED" : "PASSED");
  fflush(stdout);
}

void printCaseList(void) {
  printf("# dry run: tp %d, %d cases x %d backend(s)\n", g_opt.tp, g_opt.ncases, g_opt.nbackends);
  printf("# %*s %7s %3s %7s %6s %12s %11s\n", opWidth(), "op", "pad_bs", "N", "vocab", "dtype",
         "bytes", "comm_max_bs");
  for (int i = 0; i < g_opt.ncases; ++i) {
    const DpCase* c = &g_opt.cases[i];
    char vocab[32];
    if (c->vocab) snprintf(vocab, sizeof vocab, "%lld", (long long)c->vocab);
    else snprintf(vocab, sizeof vocab, "-");
    printf("  %*s %7d %3d %7s %6s %12zu %11d\n", opWidth(), c->op->name, c->pad_bs, c->n, vocab,
           dtypeName(c), c->op->bytes(c, g_opt.tp), c->max_pad_bs);
  }
}
