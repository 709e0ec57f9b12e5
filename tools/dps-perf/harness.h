/* dps-perf: what the harness's files share (dps_perf.h describes the
 * harness and its operations): the options (cli.c), the ranks' shared page
 * and their agreement (run.c), the measured peaks (peaks.c) and the report
 * (report.c). Operations include dps_perf.h only. */
#ifndef DPS_PERF_HARNESS_H_
#define DPS_PERF_HARNESS_H_

#include <stdio.h>

#include "dps_perf.h"

#define DP_MAX_RANKS 16
#define DP_MAX_CASES 512
#define DP_MAX_OPS 32

/* ---- cli.c: the options and the cases ------------------------------------------ */
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

extern Opts g_opt;

/* Two cases share a communicator when they have the same key: the fields of
 * the communicator's configuration other than max_pad_bs. */
int sameCommKey(const DpCase* a, const DpCase* b);

/* ---- run.c: the ranks ------------------------------------------------------------ */
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

extern DpShared* g_sh;

/* What every rank learns from an agreement round. */
typedef struct {
  int worst;                 /* max status over ranks */
  double max_value;          /* max value over ranks */
  long long wrong;           /* sum of wrong over ranks */
  int status[DP_MAX_RANKS];
  char msg[DP_MAX_RANKS][DP_MSG];
} Agreed;

/* Collective: publishes this rank's outcome; every rank gets the same view. */
void agree(int rank, int tp, const DpLocal* l, double value, long long wrong, Agreed* a);

/* The body of every rank (fxRunRanks). */
int rankMain(int rank, int nranks, void* arg);

/* ---- peaks.c: the link and HBM peaks ---------------------------------------------- */
extern double g_store_peak; /* GB/s per direction, 0 = unknown */
extern double g_hbm_peak;   /* GB/s of local reads, 0 = unknown */
/* Collective: the local HBM read peak (every rank, its own device). */
void measureHbm(int rank, int tp, cudaStream_t s);
/* Collective: the peer store peak and the copy engine's (tp > 1); 0 (a failed
 * measurement is reported, not fatal). */
int measurePeaks(int rank, int tp, cudaStream_t s);

/* ---- bufs.c: the harness's side of the buffers --------------------------------- */
void dpHostFree(DpHost* h);
/* Copies `step`'s host inputs to their device copies and poisons the outputs
 * (stream-ordered on s). */
int dpUpload(const DpBufs* b, const DpHost* h, int step, cudaStream_t s, DpLocal* l);
/* Copies every output back to its host copy and synchronizes s. */
int dpFetch(DpBufs* b, const char* op, cudaStream_t s, DpLocal* l);
void dpBufsFree(DpBufs* b);
/* The operation's state b->op (zeroed). */
void* dpState(DpBufs* b, size_t bytes, DpLocal* l);

/* ---- report.c: what rank 0 prints --------------------------------------------------- */
typedef struct {
  long long wrong_total;
  int rows, errors;
} Totals;

void printFailures(const Agreed* a, int tp);
void printHeader(int tp);
void printTableHeader(void);
/* One row: the agreed time us (status NULL), or the status ("error",
 * "unavailable") of a case that did not run; note: the operation's. */
void printRow(const DpCase* c, dpsBackend_t be, int tp, double us, long long wrong,
              const char* status, const char* note);
/* The last lines: rows, wrong elements, errors, backends run, PASSED/FAILED. */
void printTotals(const Totals* tot, int fatal, int ran);
/* --dry-run: the cases, one line each. */
void printCaseList(void);
/* Records a row's agreed time (for dpRowTime). */
void recordTime(const DpCase* c, dpsBackend_t be, double us);

#endif /* DPS_PERF_HARNESS_H_ */
