/* dps-perf: benchmark and checker of dpsampling's operations, nccl-tests style.
 * This is the harness; the operations are the DpOp descriptors of op_*.c,
 * listed in ops.c (dps_perf.h describes the descriptor).
 *
 * One process per local GPU (testing/'s fxRunRanks). For every
 * (operation, shape, backend): create the communicator, fill the inputs, run
 * the operation eagerly and check the result against the host reference,
 * capture `iters` calls into one CUDA graph, refill the inputs with a new step
 * value, replay the graph (timed with CUDA events) and check the result again.
 * Reported time = the slowest rank's (total / calls). Before the table the run
 * measures the link: SM int4 stores into the peer's buffer (every rank at
 * once) and the copy engine (rank 0 -> rank 1), and the efficiency column is
 * relative to the store peak.
 *
 * Exit status: 0 when every result was right and nothing failed; 1 otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dps_perf.h"
#include "dpsampling.h"
#include "fixtures.h"

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

#define DP_MAX_RANKS 16
#define DP_MAX_CASES 512
#define DP_MAX_OPS 32

typedef struct {
  int tp;
  int nbackends;
  dpsBackend_t backends[2];
  int backends_explicit;
  int ops[DP_MAX_OPS];  /* selected, by index in dpOps */
  int warmup, iters, replays;
  int check, csv;
  int peak, peak_mib, peak_reps;
  int timeout_s;
  int dry_run;
  const char* shapes;   /* -s, NULL = defaults */
  const char* dtypes;   /* -d, NULL = defaults */
  DpCase cases[DP_MAX_CASES];
  int ncases;
} Opts;

static Opts g_opt;

/* Shared memory between the ranks (mmap'd by the parent before the fork).
 * Every rank writes only its own slots between two barriers. */
typedef struct {
  int status[DP_MAX_RANKS];
  double value[DP_MAX_RANKS];
  long long wrong[DP_MAX_RANKS];
  char msg[DP_MAX_RANKS][DP_MSG];
  cudaIpcMemHandle_t ipc[DP_MAX_RANKS];
  int pid[DP_MAX_RANKS], dev[DP_MAX_RANKS];
  char host[DP_MAX_RANKS][64];
  char devname[DP_MAX_RANKS][256];
  char busid[DP_MAX_RANKS][32];
} DpShared;

static DpShared* g_sh;

/* What every rank learns from an agreement round. */
typedef struct {
  int worst;                 /* max status over ranks */
  double max_value;          /* max value over ranks */
  long long wrong;           /* sum of wrong over ranks */
  int status[DP_MAX_RANKS];
  char msg[DP_MAX_RANKS][DP_MSG];
} Agreed;

void dpSetLocal(DpLocal* l, int status, const char* fmt, ...) {
  if (l->status != DP_OK) return; /* keep the first failure */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->msg, sizeof l->msg, fmt, ap);
  va_end(ap);
  l->status = status;
}

void dpNoteAppend(char* out, size_t len, const char* fmt, ...) {
  const size_t n = strnlen(out, len);
  if (n + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + n, len - n, fmt, ap);
  va_end(ap);
}

void* dpHostAlloc(DpLocal* l, size_t bytes, int zero) {
  void* p = zero ? calloc(1, bytes) : malloc(bytes);
  if (p == NULL) dpSetLocal(l, DP_ERR, "out of host memory (%zu bytes)", bytes);
  return p;
}

/* Collective: publishes this rank's outcome; every rank gets the same view. */
static void agree(int rank, int tp, const DpLocal* l, double value, long long wrong, Agreed* a) {
  g_sh->status[rank] = l->status;
  g_sh->value[rank] = value;
  g_sh->wrong[rank] = wrong;
  snprintf(g_sh->msg[rank], DP_MSG, "%s", l->status == DP_OK ? "" : l->msg);
  fxBarrier();
  a->worst = DP_OK;
  a->max_value = 0.0;
  a->wrong = 0;
  for (int r = 0; r < tp; ++r) {
    a->status[r] = g_sh->status[r];
    memcpy(a->msg[r], g_sh->msg[r], DP_MSG);
    if (g_sh->status[r] > a->worst) a->worst = g_sh->status[r];
    if (g_sh->value[r] > a->max_value) a->max_value = g_sh->value[r];
    a->wrong += g_sh->wrong[r];
  }
  fxBarrier(); /* nobody overwrites the slots before everyone has read them */
}

static void printFailures(const Agreed* a, int tp) {
  for (int r = 0; r < tp; ++r)
    if (a->status[r] != DP_OK) printf("#   rank %d: %s\n", r, a->msg[r]);
}

/* ------------------------------------------------------------------------- */
/* Options                                                                    */

static void usage(FILE* f) {
  fprintf(f,
          "usage: dps-perf [options]\n"
          "  -t, --tp N          ranks (one per GPU, devices 0..N-1); default: all local GPUs\n"
          "  -b, --backend L     nccl,onesided,all (default all: every available backend, side by side)\n"
          "  -o, --op L          ");
  for (int i = 0; i < dpNumOps; ++i) fprintf(f, "%s,", dpOps[i]->name);
  fprintf(f,
          "all (default all);\n"
          "                      sample: every sample_* (dpsSample's cases, op_sample.c)\n"
          "                      verify: every verify_* (dpsVerifyChain's cases, op_verify.c)\n"
          "  -s, --shapes L      comma list; PxNxV items are swap shapes (pad_bs x N x vocab),\n"
          "                      and the PxN of every item is a gather/logprobs shape\n"
          "  -d, --dtype L       swap logits dtype(s): bf16,fp16,fp32 (default bf16, plus fp32 for\n"
          "                      the smallest default shape)\n"
          "  -w, --warmup N      eager warm-up calls per case (default 5)\n"
          "  -n, --iters N       calls captured into one CUDA graph (default 20)\n"
          "  -r, --replays N     timed graph replays (default 10); time = total / (iters*replays)\n"
          "      --no-check      do not check results against the host reference\n"
          "      --csv           print the table as CSV\n"
          "      --peak-mib N    buffer size of the link-peak measurement (default 256)\n"
          "      --no-peak       skip the link-peak measurement\n"
          "  -T, --timeout S     kill the ranks after S seconds (default 480)\n"
          "      --dry-run       list the cases (tp from -t, else 2) and exit; needs no GPU\n"
          "  -h, --help\n"
          "Default shapes: swap 8x1x64 (bf16 and fp32), 64x1x152064, 64x4x152064, 256x4x152064,\n"
          "512x4x129280, 8x1x129280, 128x2x152064; gather/logprobs pad_bs {8,64,256,512} x N {1,4,8}.\n");
}

static int parsePositive(const char* s, const char* what, int* out) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (!s[0] || *end || v < 1 || v > 1000000000L) {
    fprintf(stderr, "dps-perf: invalid %s \"%s\" (want a positive integer)\n", what, s);
    return 1;
  }
  *out = (int)v;
  return 0;
}

static int parseDtype(const char* s, dpsDataType_t* d) {
  if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *d = dpsBfloat16;
  else if (!strcmp(s, "fp16") || !strcmp(s, "half") || !strcmp(s, "float16")) *d = dpsFloat16;
  else if (!strcmp(s, "fp32") || !strcmp(s, "float") || !strcmp(s, "float32")) *d = dpsFloat32;
  else return 1;
  return 0;
}

/* Calls fn(item) for each comma-separated item of list. */
static int forEachItem(const char* list, int (*fn)(const char* item, void* ctx), void* ctx) {
  char buf[4096];
  if (strlen(list) >= sizeof buf) return 1;
  strcpy(buf, list);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    if (tok[0] && fn(tok, ctx)) return 1;
  return 0;
}

static int addBackend(const char* item, void* ctx) {
  (void)ctx;
  if (!strcmp(item, "all")) {
    g_opt.nbackends = 2;
    g_opt.backends[0] = dpsBackendNccl;
    g_opt.backends[1] = dpsBackendOnesided;
    g_opt.backends_explicit = 0;
    return 0;
  }
  dpsBackend_t b;
  if (dpsParseBackend(item, &b) != dpsSuccess || b == dpsBackendAuto) {
    fprintf(stderr, "dps-perf: invalid backend \"%s\" (want nccl, onesided or all)\n", item);
    return 1;
  }
  for (int i = 0; i < g_opt.nbackends; ++i)
    if (g_opt.backends[i] == b) return 0;
  g_opt.backends[g_opt.nbackends++] = b;
  g_opt.backends_explicit = 1;
  return 0;
}

static int opMatches(const DpOp* op, const char* item) {
  if (!strcmp(item, op->name)) return 1;
  for (const char* const* a = op->aliases; a && *a; ++a)
    if (!strcmp(item, *a)) return 1;
  return 0;
}

static int addOp(const char* item, void* ctx) {
  (void)ctx;
  if (!strcmp(item, "all")) {
    for (int i = 0; i < dpNumOps; ++i) g_opt.ops[i] = 1;
    return 0;
  }
  /* every match: an alias may name a family (-o sample) */
  int found = 0;
  for (int i = 0; i < dpNumOps; ++i)
    if (opMatches(dpOps[i], item)) {
      g_opt.ops[i] = 1;
      found = 1;
    }
  if (found) return 0;
  fprintf(stderr, "dps-perf: invalid op \"%s\" (want ", item);
  for (int i = 0; i < dpNumOps; ++i)
    fprintf(stderr, "%s%s", dpOps[i]->name, i + 1 < dpNumOps ? ", " : " ");
  fprintf(stderr, "or all)\n");
  return 1;
}

typedef struct {
  dpsDataType_t list[3];
  int count;
} DtypeList;

static int addDtype(const char* item, void* ctx) {
  DtypeList* dl = (DtypeList*)ctx;
  dpsDataType_t d;
  if (parseDtype(item, &d)) {
    fprintf(stderr, "dps-perf: invalid dtype \"%s\" (want bf16, fp16 or fp32)\n", item);
    return 1;
  }
  for (int i = 0; i < dl->count; ++i)
    if (dl->list[i] == d) return 0;
  dl->list[dl->count++] = d;
  return 0;
}

typedef struct {
  DpShape items[DP_MAX_CASES];
  int count;
} ShapeList;

static int addShape(const char* item, void* ctx) {
  ShapeList* sl = (ShapeList*)ctx;
  long long v[3] = {0, 0, 0};
  int k = 0;
  const char* p = item;
  while (*p && k < 3) {
    char* end = NULL;
    v[k++] = strtoll(p, &end, 10);
    if (end == p || v[k - 1] < 1) break;
    p = end;
    if (*p == 'x' || *p == 'X' || *p == '*') ++p;
    else break;
  }
  if (*p || k < 2 || v[0] > 1000000 || v[1] > 1000000 || v[k - 1] < 1 ||
      sl->count >= DP_MAX_CASES) {
    fprintf(stderr, "dps-perf: invalid shape \"%s\" (want PADxN or PADxNxVOCAB)\n", item);
    return 1;
  }
  DpShape s = {(int)v[0], (int)v[1], k == 3 ? (int64_t)v[2] : 0};
  sl->items[sl->count++] = s;
  return 0;
}

void dpAddCase(const DpOp* op, int pad_bs, int n, int64_t vocab, dpsDataType_t dtype) {
  if (g_opt.ncases >= DP_MAX_CASES) return;
  for (int i = 0; i < g_opt.ncases; ++i) {
    const DpCase* c = &g_opt.cases[i];
    if (c->op == op && c->pad_bs == pad_bs && c->n == n && c->vocab == vocab && c->dtype == dtype)
      return;
  }
  DpCase c = {op, pad_bs, n, vocab, dtype, 0};
  g_opt.cases[g_opt.ncases++] = c;
}

void dpAddTokenCases(const DpOp* self, const DpCaseArgs* a) {
  static const int kGatherPad[] = {8, 64, 256, 512};
  static const int kGatherN[] = {1, 4, 8};
  if (a->shapes) {
    for (int i = 0; i < a->nshapes; ++i)
      dpAddCase(self, a->shapes[i].pad_bs, a->shapes[i].n, 0, dpsDtypeUnset);
  } else {
    for (size_t j = 0; j < sizeof kGatherN / sizeof kGatherN[0]; ++j)
      for (size_t i = 0; i < sizeof kGatherPad / sizeof kGatherPad[0]; ++i)
        dpAddCase(self, kGatherPad[i], kGatherN[j], 0, dpsDtypeUnset);
  }
}

int dpValidTokens(const DpCase* c, int tp) { return c->pad_bs % tp == 0; }

/* Two cases share a communicator when they have the same key: the fields of
 * the communicator's configuration other than max_pad_bs. */
static int sameCommKey(const DpCase* a, const DpCase* b) {
  return a->n == b->n && a->vocab == b->vocab && a->dtype == b->dtype;
}

/* The dtype column: the logits dtype, else the operation's element type. */
static const char* dtypeName(const DpCase* c) {
  if (c->dtype != dpsDtypeUnset) return dpsDataTypeName(c->dtype);
  return c->op->elem_type ? c->op->elem_type : "-";
}

static int buildCases(void) {
  ShapeList sl;
  sl.count = 0;
  DtypeList dl;
  dl.count = 0;
  if (g_opt.shapes && forEachItem(g_opt.shapes, addShape, &sl)) return 1;
  if (g_opt.dtypes && forEachItem(g_opt.dtypes, addDtype, &dl)) return 1;
  if (g_opt.shapes && sl.count == 0) {
    fprintf(stderr, "dps-perf: -s gave no shape\n");
    return 1;
  }
  const int tp = g_opt.tp;
  const DpCaseArgs args = {g_opt.shapes ? sl.items : NULL, g_opt.shapes ? sl.count : 0, dl.list,
                           dl.count};
  for (int op = 0; op < dpNumOps; ++op)
    if (g_opt.ops[op]) dpOps[op]->add_cases(dpOps[op], &args);

  /* Drop what tp cannot divide (reported), then size the communicators. */
  int kept = 0;
  for (int i = 0; i < g_opt.ncases; ++i) {
    DpCase c = g_opt.cases[i];
    if (!c.op->valid(&c, tp)) {
      fprintf(stderr,
              "dps-perf: skipping %s pad_bs=%d N=%d vocab=%lld %s: not divisible by tp=%d\n",
              c.op->name, c.pad_bs, c.n, (long long)c.vocab,
              c.dtype != dpsDtypeUnset ? dpsDataTypeName(c.dtype) : "", tp);
      continue;
    }
    g_opt.cases[kept++] = c;
  }
  g_opt.ncases = kept;
  for (int i = 0; i < g_opt.ncases; ++i) {
    DpCase* c = &g_opt.cases[i];
    c->max_pad_bs = c->pad_bs;
    for (int j = 0; j < g_opt.ncases; ++j)
      if (sameCommKey(c, &g_opt.cases[j]) && g_opt.cases[j].pad_bs > c->max_pad_bs)
        c->max_pad_bs = g_opt.cases[j].pad_bs;
  }
  if (g_opt.ncases == 0) {
    fprintf(stderr, "dps-perf: nothing to run\n");
    return 1;
  }
  return 0;
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

static void recordTime(const DpCase* c, dpsBackend_t be, double us) {
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

static void printHeader(int tp) {
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

/* ------------------------------------------------------------------------- */
/* Link peak                                                                  */

static double g_store_peak = 0.0; /* GB/s per direction, 0 = unknown */
static double g_hbm_peak = 0.0;   /* GB/s of local reads, 0 = unknown */

/* The local HBM read peak (every rank, its own device). */
static void measureHbm(int rank, int tp, cudaStream_t s) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  const size_t bytes = (size_t)g_opt.peak_mib << 20;
  void* buf = NULL;
  int* sink = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int dev = rank, sms = 0;
  double best = 0.0;
  int best_blocks = 0;
  float ms = 0.f;
  DP_TRY_CUDA(&l, cudaMalloc(&buf, bytes), done);
  DP_TRY_CUDA(&l, cudaMalloc((void**)&sink, 4), done);
  DP_TRY_CUDA(&l, cudaMemset(buf, 1, bytes), done);
  DP_TRY_CUDA(&l, cudaEventCreate(&e0), done);
  DP_TRY_CUDA(&l, cudaEventCreate(&e1), done);
  DP_TRY_CUDA(&l, cudaGetDevice(&dev), done);
  DP_TRY_CUDA(&l, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), done);
  static const int kMul[] = {1, 2, 4, 8};
  for (size_t m = 0; m < sizeof kMul / sizeof kMul[0]; ++m) {
    const int blocks = sms * kMul[m];
    DP_TRY_CUDA(&l, dpLaunchRead(buf, bytes, blocks, 512, sink, s), done);
    DP_TRY_CUDA(&l, cudaEventRecord(e0, s), done);
    for (int i = 0; i < g_opt.peak_reps; ++i)
      DP_TRY_CUDA(&l, dpLaunchRead(buf, bytes, blocks, 512, sink, s), done);
    DP_TRY_CUDA(&l, cudaEventRecord(e1, s), done);
    DP_TRY_CUDA(&l, cudaEventSynchronize(e1), done);
    DP_TRY_CUDA(&l, cudaEventElapsedTime(&ms, e0, e1), done);
    const double gbs = (double)bytes * g_opt.peak_reps / (ms * 1e-3) / 1e9;
    if (gbs > best) {
      best = gbs;
      best_blocks = blocks;
    }
  }
done:
  agree(rank, tp, &l, best > 0 ? (float)(1e3 / best) : 0.f, 0, &a); /* slowest rank decides */
  if (a.worst == DP_OK && a.max_value > 0) g_hbm_peak = 1e3 / a.max_value;
  if (rank == 0) {
    if (g_hbm_peak > 0)
      printf("# HBM read peak: %.1f GB/s (int4 loads, %d MiB x %d, best grid %d x 512; the slowest "
             "rank; argmax/topk efficiency is against it)\n",
             g_hbm_peak, g_opt.peak_mib, g_opt.peak_reps, best_blocks);
    else
      printf("# HBM read peak: unavailable\n");
    fflush(stdout);
  }
  cudaDeviceSynchronize();
  if (buf) cudaFree(buf);
  if (sink) cudaFree(sink);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaGetLastError();
}

static int measurePeaks(int rank, int tp, cudaStream_t s) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  const size_t bytes = (size_t)g_opt.peak_mib << 20;
  void* buf = NULL;
  void* peer = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int dev = rank, sms = 0;
  double store = 0.0, ce = 0.0;
  int best_blocks = 0, threads = 512;

  DP_TRY_CUDA(&l, cudaMalloc(&buf, bytes), setup_done);
  DP_TRY_CUDA(&l, cudaMemset(buf, rank, bytes), setup_done);
  DP_TRY_CUDA(&l, cudaIpcGetMemHandle(&g_sh->ipc[rank], buf), setup_done);
  DP_TRY_CUDA(&l, cudaEventCreate(&e0), setup_done);
  DP_TRY_CUDA(&l, cudaEventCreate(&e1), setup_done);
  DP_TRY_CUDA(&l, cudaGetDevice(&dev), setup_done);
  DP_TRY_CUDA(&l, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), setup_done);
setup_done:
  agree(rank, tp, &l, 0, 0, &a);
  if (a.worst != DP_OK) goto fail;
  DP_TRY_CUDA(&l, cudaIpcOpenMemHandle(&peer, g_sh->ipc[(rank + 1) % tp],
                                    cudaIpcMemLazyEnablePeerAccess),
           open_done);
  DP_TRY_CUDA(&l, cudaDeviceSynchronize(), open_done);
open_done:
  agree(rank, tp, &l, 0, 0, &a);
  if (a.worst != DP_OK) goto fail;

  /* (a) every rank stores into rank+1's buffer at once; sweep the grid size. */
  static const int kMul[] = {1, 2, 4, 8};
  for (size_t m = 0; m < sizeof kMul / sizeof kMul[0]; ++m) {
    const int blocks = sms * kMul[m];
    float ms = 0.f;
    DP_TRY_CUDA(&l, dpLaunchPeerStore(peer, bytes, blocks, threads, rank, s), store_done);
    DP_TRY_CUDA(&l, cudaStreamSynchronize(s), store_done);
  store_done:
    agree(rank, tp, &l, 0, 0, &a);
    if (a.worst != DP_OK) goto fail;
    for (int i = 0; i < g_opt.peak_reps && l.status == DP_OK; ++i) {
      if (i == 0) DP_TRY_CUDA(&l, cudaEventRecord(e0, s), timed_done);
      DP_TRY_CUDA(&l, dpLaunchPeerStore(peer, bytes, blocks, threads, rank, s), timed_done);
    }
    DP_TRY_CUDA(&l, cudaEventRecord(e1, s), timed_done);
    DP_TRY_CUDA(&l, cudaEventSynchronize(e1), timed_done);
    DP_TRY_CUDA(&l, cudaEventElapsedTime(&ms, e0, e1), timed_done);
  timed_done:
    agree(rank, tp, &l, ms, 0, &a);
    if (a.worst != DP_OK) goto fail;
    double gbs = (double)bytes * g_opt.peak_reps / (a.max_value * 1e-3) / 1e9;
    if (gbs > store) {
      store = gbs;
      best_blocks = blocks;
    }
  }

  /* (b) copy engine, rank 0 -> rank 1 only. */
  {
    float ms = 0.f;
    if (rank == 0) {
      DP_TRY_CUDA(&l, cudaMemcpyAsync(peer, buf, bytes, cudaMemcpyDeviceToDevice, s), ce_done);
      DP_TRY_CUDA(&l, cudaEventRecord(e0, s), ce_done);
      for (int i = 0; i < g_opt.peak_reps; ++i)
        DP_TRY_CUDA(&l, cudaMemcpyAsync(peer, buf, bytes, cudaMemcpyDeviceToDevice, s), ce_done);
      DP_TRY_CUDA(&l, cudaEventRecord(e1, s), ce_done);
      DP_TRY_CUDA(&l, cudaEventSynchronize(e1), ce_done);
      DP_TRY_CUDA(&l, cudaEventElapsedTime(&ms, e0, e1), ce_done);
    }
  ce_done:
    agree(rank, tp, &l, ms, 0, &a);
    if (a.worst != DP_OK) goto fail;
    ce = (double)bytes * g_opt.peak_reps / (a.max_value * 1e-3) / 1e9;
  }
  g_store_peak = store;
  if (rank == 0) {
    printf("# peer store peak: %.1f GB/s per direction; copy engine: %.1f GB/s\n", store, ce);
    printf("#   (store: every rank stores int4 into rank+1's cudaIpc buffer at once, %d MiB x %d,"
           " best grid %d x %d; copy engine: cudaMemcpyAsync rank 0 -> rank 1, one direction;"
           " GB = 1e9 bytes)\n",
           g_opt.peak_mib, g_opt.peak_reps, best_blocks, threads);
    fflush(stdout);
  }
  goto cleanup;

fail:
  if (rank == 0) {
    printf("# peer store peak: unavailable (link efficiency column left empty)\n");
    printFailures(&a, tp);
    fflush(stdout);
  }
cleanup:
  cudaDeviceSynchronize();
  fxBarrier(); /* peers are done writing into our buffer */
  if (peer) cudaIpcCloseMemHandle(peer);
  fxBarrier(); /* everyone closed our buffer before we free it */
  if (buf) cudaFree(buf);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaGetLastError();
  return 0; /* a failed peak is reported, not fatal */
}

/* ------------------------------------------------------------------------- */
/* Communicators                                                              */

typedef struct {
  dpsComm_t comm;
  int valid;
  DpCase key; /* the case it was made for (key fields + max_pad_bs) */
} CommSlot;

static dpsResult_t createComm(int rank, int tp, dpsBackend_t backend, const DpCase* c,
                              dpsComm_t* out, DpLocal* l) {
  dpsUniqueId id;
  if (fxShareUniqueId(&id) != 0) {
    dpSetLocal(l, DP_ERR, "fxShareUniqueId failed");
    return dpsSystemError;
  }
  dpsConfig_t cfg = DPS_CONFIG_INITIALIZER;
  cfg.tp_size = tp;
  cfg.rank = rank;
  cfg.max_pad_bs = c->max_pad_bs;
  cfg.num_tokens_per_req = c->n;
  cfg.vocab_size = c->vocab ? c->vocab : tp;
  cfg.logits_dtype = c->dtype;
  cfg.backend = backend;
  cfg.cuda_device = rank;
  dpsComm_t comm = NULL;
  dpsResult_t r = dpsCommInitRank(&comm, &id, &cfg);
  if (r != dpsSuccess) {
    dpSetLocal(l, r == dpsUnavailable ? DP_UNAVAIL : DP_ERR, "dpsCommInitRank(backend=%s): %s: %s",
             dpsBackendName(backend), dpsGetErrorString(r), dpsGetLastError());
    return r;
  }
  dpsCommInfo_t info;
  r = dpsCommGetInfo(comm, &info);
  if (r != dpsSuccess || info.backend != backend) {
    dpSetLocal(l, DP_ERR, "communicator resolved to backend %s, requested %s",
             r == dpsSuccess ? dpsBackendName(info.backend) : "?", dpsBackendName(backend));
    *out = comm; /* still created: the caller destroys it collectively */
    return dpsInternalError;
  }
  *out = comm;
  return dpsSuccess;
}

/* Collective: makes slot hold a communicator for case c. */
static int ensureComm(int rank, int tp, dpsBackend_t backend, CommSlot* slot, const DpCase* c,
                      Agreed* a) {
  DpLocal l = {DP_OK, ""};
  if (slot->valid && sameCommKey(&slot->key, c) && slot->key.max_pad_bs >= c->pad_bs) {
    a->worst = DP_OK;
    return 0;
  }
  if (slot->valid) {
    dpsResult_t r = dpsCommDestroy(slot->comm);
    if (r != dpsSuccess)
      dpSetLocal(&l, DP_ERR, "dpsCommDestroy: %s: %s", dpsGetErrorString(r), dpsGetLastError());
    slot->valid = 0;
    slot->comm = NULL;
  }
  dpsComm_t comm = NULL;
  if (l.status == DP_OK) createComm(rank, tp, backend, c, &comm, &l);
  agree(rank, tp, &l, 0, 0, a);
  if (a->worst == DP_OK) {
    slot->comm = comm;
    slot->valid = 1;
    slot->key = *c;
    return 0;
  }
  /* Some rank failed. Destroy only when every rank holds a communicator
   * (destruction is collective); otherwise leak it rather than hang. */
  int all_made = 1;
  for (int r = 0; r < tp; ++r)
    if (a->status[r] != DP_OK && strncmp(a->msg[r], "communicator resolved", 21) != 0)
      all_made = 0;
  if (all_made && comm) dpsCommDestroy(comm);
  return 1;
}

/* ------------------------------------------------------------------------- */
/* One case                                                                   */

/* The operation's state of one case: host inputs (host_init, shared by the
 * backends) and device buffers (setup). */
typedef struct {
  void* state;
} HostIn;

typedef struct {
  void* state;
} Bufs;

/* 0 on success; 1 when out of host memory. */
static int makeHostIn(const DpCase* c, HostIn* h, int rank, int tp) {
  h->state = NULL;
  return c->op->host_init(c, rank, tp, &h->state);
}

static void freeHostIn(const DpCase* c, HostIn* h) {
  if (h->state) c->op->host_free(h->state);
  h->state = NULL;
}

static int allocBufs(const DpCase* c, Bufs* b, int tp, DpLocal* l) {
  b->state = NULL;
  return c->op->setup(c, tp, &b->state, l);
}

static void freeBufs(const DpCase* c, Bufs* b) {
  if (b->state) c->op->teardown(b->state);
  b->state = NULL;
}

static dpsResult_t runOp(const DpCase* c, dpsComm_t comm, Bufs* b, int tp, cudaStream_t s) {
  return c->op->run(c, comm, b->state, tp, s);
}

/* Copies `step`'s host inputs to the device, then lets the operation derive
 * the rest with the library (prepare), and synchronizes. */
static int fillInputs(const DpCase* c, dpsComm_t comm, Bufs* b, const HostIn* h, int tp, int step,
                      cudaStream_t s, DpLocal* l) {
  if (c->op->fill(c, b->state, h->state, tp, step, s, l)) goto fail;
  if (c->op->prepare && c->op->prepare(c, comm, b->state, tp, step, s, l)) goto fail;
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return 0;
fail:
  return 1;
}

/* Copies the outputs back and counts the elements that differ from `step`'s reference. */
static long long checkOutputs(const DpCase* c, Bufs* b, int rank, int tp, int step,
                              cudaStream_t s, DpLocal* l) {
  if (!g_opt.check) return 0;
  const long long wrong = c->op->check(c, b->state, rank, tp, step, s, l);
  return l->status == DP_OK ? wrong : 0;
}

typedef struct {
  long long wrong_total;
  int rows, errors;
} Totals;

static void printTableHeader(void) {
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

static void printRow(const DpCase* c, dpsBackend_t be, int tp, double us, long long wrong,
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

/* Runs one (case, backend) on every rank; rank 0 prints the row. */
static void runCase(int rank, int tp, const DpCase* c, const HostIn* h, dpsBackend_t be,
                    CommSlot* slot, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, Totals* tot) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  Bufs b;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  long long wrong = 0;
  double us = 0.0;
  b.state = NULL;

  int have_comm = 0;
  if (ensureComm(rank, tp, be, slot, c, &a)) goto failed;
  have_comm = 1;
  dpsComm_t comm = slot->comm;

  /* Phase A: step-1 inputs, eager call + warm-up. */
  if (allocBufs(c, &b, tp, &l)) goto a_done;
  if (c->op->note && c->op->note(c, comm, b.state, tp, 0, NULL, NULL, 0, &l)) goto a_done;
  if (fillInputs(c, comm, &b, h, tp, 1, s, &l)) goto a_done;
  for (int i = 0; i < 1 + g_opt.warmup; ++i) DP_TRY_DPS(&l, runOp(c, comm, &b, tp, s), a_done);
  DP_TRY_CUDA(&l, cudaStreamSynchronize(s), a_done);
a_done:
  agree(rank, tp, &l, 0, 0, &a);
  if (a.worst != DP_OK) goto failed;

  /* Phase B: check step 1, then step-2 inputs and capture (nothing runs). */
  wrong = checkOutputs(c, &b, rank, tp, 1, s, &l);
  if (l.status != DP_OK) goto b_done;
  if (fillInputs(c, comm, &b, h, tp, 2, s, &l)) goto b_done;
  DP_TRY_CUDA(&l, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), b_done);
  for (int i = 0; i < g_opt.iters; ++i) {
    dpsResult_t r = runOp(c, comm, &b, tp, s);
    if (r != dpsSuccess) {
      dpSetLocal(&l, DP_ERR, "%s during graph capture: %s: %s", c->op->name,
                 dpsGetErrorString(r), dpsGetLastError());
      break;
    }
  }
  {
    cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (e != cudaSuccess) dpSetLocal(&l, DP_ERR, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
  }
  if (l.status != DP_OK) goto b_done;
  DP_TRY_CUDA(&l, cudaGraphInstantiate(&exec, graph, 0), b_done);
  DP_TRY_CUDA(&l, cudaGraphUpload(exec, s), b_done);
  DP_TRY_CUDA(&l, cudaStreamSynchronize(s), b_done);
b_done:
  cudaGetLastError();
  agree(rank, tp, &l, 0, wrong, &a);
  if (a.worst != DP_OK) goto failed;

  /* Phase C: one untimed replay aligns the ranks on the device, then the
   * timed replays are queued right behind it. */
  {
    float ms = 0.f;
    DP_TRY_CUDA(&l, cudaGraphLaunch(exec, s), c_done);
    DP_TRY_CUDA(&l, cudaEventRecord(e0, s), c_done);
    for (int i = 0; i < g_opt.replays; ++i) DP_TRY_CUDA(&l, cudaGraphLaunch(exec, s), c_done);
    DP_TRY_CUDA(&l, cudaEventRecord(e1, s), c_done);
    DP_TRY_CUDA(&l, cudaEventSynchronize(e1), c_done);
    DP_TRY_CUDA(&l, cudaEventElapsedTime(&ms, e0, e1), c_done);
    us = (double)ms * 1e3 / ((double)g_opt.iters * g_opt.replays);
    wrong += checkOutputs(c, &b, rank, tp, 2, s, &l);
    dpsResult_t ae = dpsSuccess;
    if (dpsCommGetAsyncError(comm, &ae) == dpsSuccess && ae != dpsSuccess)
      dpSetLocal(&l, DP_ERR, "asynchronous error %s: %s", dpsGetErrorString(ae), dpsGetLastError());
  }
c_done:
  agree(rank, tp, &l, us, wrong, &a);
  if (a.worst != DP_OK) goto failed;
  recordTime(c, be, a.max_value);
  {
    /* The operation's note on the row (its own counters, ratios to earlier
     * rows); what it finds wrong is summed over the ranks like #wrong. */
    char note[DP_MSG] = "";
    long long bad = 0;
    const long long wrong_sum = a.wrong;
    const double row_us = a.max_value;
    if (c->op->note) {
      const DpRow row = {be, row_us, g_hbm_peak,
                         (long long)(1 + g_opt.warmup) + (long long)g_opt.iters * (1 + g_opt.replays)};
      bad = c->op->note(c, comm, b.state, tp, 1, &row, note, sizeof note, &l);
      agree(rank, tp, &l, 0, bad, &a);
      if (a.worst != DP_OK) {
        snprintf(note, sizeof note, "note failed: %.300s",
                 a.status[0] != DP_OK ? a.msg[0] : "on another rank");
        a.wrong = 0;
      }
      bad = a.wrong;
    }
    if (rank == 0) {
      printRow(c, be, tp, row_us, wrong_sum + bad, NULL, note);
      if (wrong_sum) printf("#   ^ %lld wrong elements (sum over ranks)\n", wrong_sum);
      if (bad) printf("#   ^ %lld problems in the note (sum over ranks)\n", bad);
    }
    tot->wrong_total += wrong_sum + bad;
  }
  tot->rows++;
  goto cleanup;

failed:
  if (rank == 0) {
    printRow(c, be, tp, 0, 0, a.worst == DP_UNAVAIL ? "unavailable" : "error", NULL);
    printFailures(&a, tp);
  }
  tot->rows++;
  tot->errors++;
  if (have_comm) {
    /* Every rank got here together (agreed status): start the next case on a
     * fresh communicator rather than one in an unknown state. */
    cudaStreamSynchronize(s);
    dpsCommDestroy(slot->comm);
    slot->comm = NULL;
    slot->valid = 0;
  }
cleanup:
  cudaStreamSynchronize(s);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  freeBufs(c, &b);
  cudaGetLastError();
  fflush(stdout);
}

/* ------------------------------------------------------------------------- */
/* Rank body                                                                  */

static int rankMain(int rank, int nranks, void* arg) {
  (void)arg;
  const int tp = nranks;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int fatal = 0;

  /* Who is where. */
  {
    struct cudaDeviceProp prop;
    int dev = -1;
    memset(&prop, 0, sizeof prop);
    cudaGetDevice(&dev);
    g_sh->pid[rank] = (int)getpid();
    g_sh->dev[rank] = dev;
    if (gethostname(g_sh->host[rank], sizeof g_sh->host[rank]) != 0)
      snprintf(g_sh->host[rank], sizeof g_sh->host[rank], "?");
    g_sh->host[rank][sizeof g_sh->host[rank] - 1] = 0;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      snprintf(g_sh->devname[rank], sizeof g_sh->devname[rank], "%s", prop.name);
    if (cudaDeviceGetPCIBusId(g_sh->busid[rank], (int)sizeof g_sh->busid[rank], dev) != cudaSuccess)
      snprintf(g_sh->busid[rank], sizeof g_sh->busid[rank], "?");
    fxBarrier();
    if (rank == 0) printHeader(tp);
    fxBarrier();
  }

  {
    DpLocal l = {DP_OK, ""};
    Agreed a;
    DP_TRY_CUDA(&l, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), setup_done);
    DP_TRY_CUDA(&l, cudaEventCreate(&e0), setup_done);
    DP_TRY_CUDA(&l, cudaEventCreate(&e1), setup_done);
  setup_done:
    agree(rank, tp, &l, 0, 0, &a);
    if (a.worst != DP_OK) {
      if (rank == 0) printFailures(&a, tp);
      return 1;
    }
  }

  if (g_opt.peak) measureHbm(rank, tp, s);
  if (g_opt.peak && tp > 1) measurePeaks(rank, tp, s);
  else if (rank == 0) printf("# peer store peak: not measured (--no-peak)\n");

  /* Which requested backends can run here (a small probe communicator each). */
  int avail[2] = {0, 0};
  for (int i = 0; i < g_opt.nbackends; ++i) {
    DpLocal l = {DP_OK, ""};
    Agreed a;
    /* The smallest communicator: no logits, pad_bs = tp, N = 1. */
    DpCase probe = {NULL, tp, 1, 0, dpsDtypeUnset, tp};
    dpsComm_t comm = NULL;
    createComm(rank, tp, g_opt.backends[i], &probe, &comm, &l);
    agree(rank, tp, &l, 0, 0, &a);
    if (a.worst == DP_OK) {
      avail[i] = 1;
      dpsCommDestroy(comm);
      if (rank == 0) printf("# backend %s: available\n", dpsBackendName(g_opt.backends[i]));
    } else {
      if (rank == 0) {
        printf("# backend %s: %s\n", dpsBackendName(g_opt.backends[i]),
               a.worst == DP_UNAVAIL ? "UNAVAILABLE on this machine" : "FAILED to initialize");
        printFailures(&a, tp);
      }
      if (g_opt.backends_explicit || a.worst != DP_UNAVAIL) fatal = 1;
    }
  }
  fflush(stdout);

  Totals tot = {0, 0, 0};
  CommSlot slots[2];
  memset(slots, 0, sizeof slots);
  if (rank == 0) printTableHeader();
  for (int ci = 0; ci < g_opt.ncases; ++ci) {
    const DpCase* c = &g_opt.cases[ci];
    HostIn h;
    DpLocal l = {DP_OK, ""};
    Agreed a;
    if (makeHostIn(c, &h, rank, tp)) dpSetLocal(&l, DP_ERR, "out of host memory for the inputs");
    agree(rank, tp, &l, 0, 0, &a);
    for (int i = 0; i < g_opt.nbackends; ++i) {
      if (!avail[i]) continue;
      if (a.worst == DP_OK) {
        runCase(rank, tp, c, &h, g_opt.backends[i], &slots[i], s, e0, e1, &tot);
      } else {
        if (rank == 0) {
          printRow(c, g_opt.backends[i], tp, 0, 0, "error", NULL);
          printFailures(&a, tp);
        }
        tot.rows++;
        tot.errors++;
      }
    }
    freeHostIn(c, &h);
  }

  for (int i = 0; i < 2; ++i)
    if (slots[i].valid) dpsCommDestroy(slots[i].comm);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);

  if (rank == 0) {
    int ran = 0;
    for (int i = 0; i < g_opt.nbackends; ++i) ran += avail[i];
    printf("#\n# rows: %d | wrong elements: %lld%s | errors: %d | backends run: %d of %d\n",
           tot.rows, tot.wrong_total,
           g_opt.check ? (tot.wrong_total ? " FAILED" : " OK") : " (check off)", tot.errors, ran,
           g_opt.nbackends);
    printf("# %s\n", (tot.wrong_total || tot.errors || fatal || !ran) ? "FAILED" : "PASSED");
    fflush(stdout);
  }
  int ran_any = 0;
  for (int i = 0; i < g_opt.nbackends; ++i) ran_any |= avail[i];
  return (tot.wrong_total || tot.errors || fatal || !ran_any) ? 1 : 0;
}

/* ------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  if (dpNumOps > DP_MAX_OPS) {
    fprintf(stderr, "dps-perf: %d operations in ops.c, at most %d\n", dpNumOps, DP_MAX_OPS);
    return 2;
  }
  g_opt.tp = 0;
  g_opt.warmup = 5;
  g_opt.iters = 20;
  g_opt.replays = 10;
  g_opt.check = 1;
  g_opt.peak = 1;
  g_opt.peak_mib = 256;
  g_opt.peak_reps = 10;
  g_opt.timeout_s = 480;

  enum { OPT_NO_CHECK = 256, OPT_CSV, OPT_PEAK_MIB, OPT_NO_PEAK, OPT_DRY_RUN };
  static const struct option longopts[] = {
      {"tp", required_argument, NULL, 't'},        {"backend", required_argument, NULL, 'b'},
      {"op", required_argument, NULL, 'o'},        {"ops", required_argument, NULL, 'o'},
      {"shapes", required_argument, NULL, 's'},    {"dtype", required_argument, NULL, 'd'},
      {"warmup", required_argument, NULL, 'w'},    {"iters", required_argument, NULL, 'n'},
      {"replays", required_argument, NULL, 'r'},   {"timeout", required_argument, NULL, 'T'},
      {"no-check", no_argument, NULL, OPT_NO_CHECK}, {"csv", no_argument, NULL, OPT_CSV},
      {"peak-mib", required_argument, NULL, OPT_PEAK_MIB},
      {"no-peak", no_argument, NULL, OPT_NO_PEAK}, {"dry-run", no_argument, NULL, OPT_DRY_RUN},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int have_ops = 0, ch;
  while ((ch = getopt_long(argc, argv, "t:b:o:s:d:w:n:r:T:h", longopts, NULL)) != -1) {
    switch (ch) {
      case 't': if (parsePositive(optarg, "tp", &g_opt.tp)) return 2; break;
      case 'b':
        g_opt.nbackends = 0;
        if (forEachItem(optarg, addBackend, NULL)) return 2;
        break;
      case 'o':
        have_ops = 1;
        if (forEachItem(optarg, addOp, NULL)) return 2;
        break;
      case 's': g_opt.shapes = optarg; break;
      case 'd': g_opt.dtypes = optarg; break;
      case 'w':
        if (!strcmp(optarg, "0")) g_opt.warmup = 0;
        else if (parsePositive(optarg, "warmup", &g_opt.warmup)) return 2;
        break;
      case 'n': if (parsePositive(optarg, "iters", &g_opt.iters)) return 2; break;
      case 'r': if (parsePositive(optarg, "replays", &g_opt.replays)) return 2; break;
      case 'T': if (parsePositive(optarg, "timeout", &g_opt.timeout_s)) return 2; break;
      case OPT_NO_CHECK: g_opt.check = 0; break;
      case OPT_CSV: g_opt.csv = 1; break;
      case OPT_PEAK_MIB: if (parsePositive(optarg, "peak-mib", &g_opt.peak_mib)) return 2; break;
      case OPT_NO_PEAK: g_opt.peak = 0; break;
      case OPT_DRY_RUN: g_opt.dry_run = 1; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "dps-perf: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (g_opt.nbackends == 0) addBackend("all", NULL);
  if (!have_ops) addOp("all", NULL);

  /* The benchmark chooses backends with -b: an override from the environment
   * would silently relabel the columns. */
  const char* benv[] = {"DPSAMPLING_BACKEND", "TOKENSPEED_DP_SAMPLING_BACKEND"};
  for (size_t i = 0; i < sizeof benv / sizeof benv[0]; ++i) {
    const char* v = getenv(benv[i]);
    if (v && v[0]) {
      fprintf(stderr, "dps-perf: note: ignoring %s=%s (choose backends with -b)\n", benv[i], v);
      unsetenv(benv[i]);
    }
  }
  /* NVLink multicast stays off on the shared machines. */
  setenv("NCCL_NVLS_ENABLE", "0", 0);

  if (g_opt.dry_run) {
    if (g_opt.tp == 0) g_opt.tp = 2;
    if (g_opt.tp < 1 || g_opt.tp > DP_MAX_RANKS) {
      fprintf(stderr, "dps-perf: --tp %d: need 1 <= tp <= %d\n", g_opt.tp, DP_MAX_RANKS);
      return 2;
    }
    if (buildCases()) return 2;
    printf("# dry run: tp %d, %d cases x %d backend(s)\n", g_opt.tp, g_opt.ncases,
           g_opt.nbackends);
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
    return 0;
  }

  const int gpus = fxGpuCount();
  if (gpus < 1) {
    printf("dps-perf needs at least 1 GPU, found 0\n");
    fflush(stdout);
    return 1;
  }
  if (g_opt.tp == 0) g_opt.tp = gpus;
  if (g_opt.tp < 1 || g_opt.tp > gpus || g_opt.tp > DP_MAX_RANKS) {
    fprintf(stderr, "dps-perf: --tp %d: need 1 <= tp <= %d (GPUs found: %d)\n", g_opt.tp,
            gpus < DP_MAX_RANKS ? gpus : DP_MAX_RANKS, gpus);
    return 2;
  }
  if (g_opt.tp == 1)
    printf("# tp=1 (one GPU): nothing crosses a link; the swap and gathers are local copies\n");
  if (buildCases()) return 2;

  g_sh = (DpShared*)mmap(NULL, sizeof(DpShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         -1, 0);
  if (g_sh == MAP_FAILED) {
    perror("dps-perf: mmap");
    return 1;
  }
  memset(g_sh, 0, sizeof *g_sh);
  fflush(stdout);
  fflush(stderr);
  const int rc = fxRunRanks(g_opt.tp, rankMain, NULL, g_opt.timeout_s);
  munmap(g_sh, sizeof(DpShared));
  if (rc != 0) fprintf(stderr, "dps-perf: FAILED (see above)\n");
  return rc == 0 ? 0 : 1;
}
