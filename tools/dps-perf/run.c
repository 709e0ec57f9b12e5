/* dps-perf: the rank body (one process per GPU): the agreement between the
 * ranks after every phase, the communicators, and the timing and checks of
 * one (case, backend); dps_perf.h describes the phases. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h"
#include "fixtures.h"
#include "harness.h"

DpShared* g_sh;

void dpSetLocal(DpLocal* l, int status, const char* fmt, ...) {
  if (l->status != DP_OK) return; /* keep the first failure */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->msg, sizeof l->msg, fmt, ap);
  va_end(ap);
  l->status = status;
}

/* Collective: publishes this rank's outcome; every rank gets the same view. */
void agree(int rank, int tp, const DpLocal* l, double value, long long wrong, Agreed* a) {
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

/* Copies `step`'s host inputs to the device (and poisons the outputs), then
 * lets the operation derive the rest with the library (prepare), and
 * synchronizes. */
static int fillInputs(const DpCase* c, dpsComm_t comm, DpBufs* b, const DpHost* h, int tp,
                      int step, cudaStream_t s, DpLocal* l) {
  if (dpUpload(b, h, step, s, l)) goto fail;
  if (c->op->prepare && c->op->prepare(c, comm, b->op, tp, step, s, l)) goto fail;
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return 0;
fail:
  return 1;
}

/* Copies the outputs back and counts the elements that differ from `step`'s reference. */
static long long checkOutputs(const DpCase* c, DpBufs* b, const DpHost* h, int rank, int tp,
                              int step, cudaStream_t s, DpLocal* l) {
  if (!g_opt.check) return 0;
  if (dpFetch(b, c->op->name, s, l)) return 0;
  const DpCheck k = {c, b->op, h->op, rank, tp, step, l};
  const long long wrong = c->op->check(&k);
  return l->status == DP_OK ? wrong : 0;
}

/* Runs one (case, backend) on every rank; rank 0 prints the row. */
static void runCase(int rank, int tp, const DpCase* c, const DpHost* h, dpsBackend_t be,
                    CommSlot* slot, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, Totals* tot) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  DpBufs b;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  long long wrong = 0;
  double us = 0.0;
  memset(&b, 0, sizeof b);

  int have_comm = 0;
  if (ensureComm(rank, tp, be, slot, c, &a)) goto failed;
  have_comm = 1;
  dpsComm_t comm = slot->comm;

  /* Phase A: step-1 inputs, eager call + warm-up. */
  b.tp = tp;
  if (!dpState(&b, c->op->state_size, &l) || c->op->setup(c, h, &b, &l)) goto a_done;
  if (c->op->note && c->op->note(c, comm, b.op, tp, 0, NULL, NULL, 0, &l)) goto a_done;
  if (fillInputs(c, comm, &b, h, tp, 1, s, &l)) goto a_done;
  for (int i = 0; i < 1 + g_opt.warmup; ++i)
    DP_TRY_DPS(&l, c->op->run(c, comm, b.op, tp, s), a_done);
  DP_TRY_CUDA(&l, cudaStreamSynchronize(s), a_done);
a_done:
  agree(rank, tp, &l, 0, 0, &a);
  if (a.worst != DP_OK) goto failed;

  /* Phase B: check step 1, then step-2 inputs and capture (nothing runs). */
  wrong = checkOutputs(c, &b, h, rank, tp, 1, s, &l);
  if (l.status != DP_OK) goto b_done;
  if (fillInputs(c, comm, &b, h, tp, 2, s, &l)) goto b_done;
  DP_TRY_CUDA(&l, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), b_done);
  for (int i = 0; i < g_opt.iters; ++i) {
    dpsResult_t r = c->op->run(c, comm, b.op, tp, s);
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
    wrong += checkOutputs(c, &b, h, rank, tp, 2, s, &l);
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
      bad = c->op->note(c, comm, b.op, tp, 1, &row, note, sizeof note, &l);
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
  dpBufsFree(&b);
  cudaGetLastError();
  fflush(stdout);
}

/* ------------------------------------------------------------------------- */
/* Rank body                                                                  */

int rankMain(int rank, int nranks, void* arg) {
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
    DpHost h;
    DpLocal l = {DP_OK, ""};
    Agreed a;
    memset(&h, 0, sizeof h);
    if (c->op->host_init(c, rank, tp, &h))
      dpSetLocal(&l, DP_ERR, "out of host memory for the inputs");
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
    dpHostFree(&h);
  }

  for (int i = 0; i < 2; ++i)
    if (slots[i].valid) dpsCommDestroy(slots[i].comm);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);

  if (rank == 0) {
    int ran = 0;
    for (int i = 0; i < g_opt.nbackends; ++i) ran += avail[i];
    printTotals(&tot, fatal, ran);
  }
  int ran_any = 0;
  for (int i = 0; i < g_opt.nbackends; ++i) ran_any |= avail[i];
  return (tot.wrong_total || tot.errors || fatal || !ran_any) ? 1 : 0;
}
