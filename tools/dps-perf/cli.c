/* dps-perf: benchmark and checker of dpsampling's operations, nccl-tests style.
 * This is the harness's command line: the options, the list of cases, and
 * main, which starts one process per GPU (testing/'s fxRunRanks) running
 * run.c's rankMain. The operations are the DpOp descriptors of op_*.c,
 * listed in ops.c (dps_perf.h describes the harness and the descriptor).
 *
 * For every (operation, shape, backend): create the communicator, fill the
 * inputs, run the operation eagerly and check the result against the host
 * reference, capture `iters` calls into one CUDA graph, refill the inputs
 * with a new step value, replay the graph (timed with CUDA events) and check
 * the result again. Reported time = the slowest rank's (total / calls).
 * Before the table the run measures the link: SM int4 stores into the peer's
 * buffer (every rank at once) and the copy engine (rank 0 -> rank 1), and the
 * efficiency column is relative to the store peak.
 *
 * Exit status: 0 when every result was right and nothing failed; 1 otherwise.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dpsampling.h"
#include "fixtures.h"
#include "harness.h"

Opts g_opt;

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

void dpAddShapeCases(const DpOp* self, const DpCaseArgs* a) {
  const DpShape* list = a->shapes ? a->shapes : self->shapes;
  const int count = a->shapes ? a->nshapes : self->nshapes;
  for (int i = 0; i < count; ++i) {
    if (!list[i].vocab) continue;
    if (a->ndtypes)
      for (int d = 0; d < a->ndtypes; ++d)
        dpAddCase(self, list[i].pad_bs, list[i].n, list[i].vocab, a->dtypes[d]);
    else
      dpAddCase(self, list[i].pad_bs, list[i].n, list[i].vocab, dpsBfloat16);
  }
}

/* Two cases share a communicator when they have the same key: the fields of
 * the communicator's configuration other than max_pad_bs. */
int sameCommKey(const DpCase* a, const DpCase* b) {
  return a->n == b->n && a->vocab == b->vocab && a->dtype == b->dtype;
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
    printCaseList();
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

