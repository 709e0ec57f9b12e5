/* Operation argument checks shared by every backend, on a communicator
 * of the host-only test provider whose backend only records what reaches it (no GPU needed):
 * bad calls fail with a message naming the argument, reach no backend and
 * write no output; good calls reach the backend once and return the
 * persistent buffers; argmax / top-k hand the backend each output in its
 * documented place (values, then indices); dpsSample's checks and the
 * records steps it plans; dtype locking and sticky asynchronous errors. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixtures.h"
#include "internal.h"
#include "select_plan.h"
#include "testsupport.h"

static struct {
  int init, prepare, swap, gather, logprobs, select, destroy;
  int last_pad_bs;
  dpsSelectCall last_select; /* what the last argmax / top-k handed the backend */
  int select_words;          /* its records step's words per row */
  int records;             /* records steps of the calls so far */
  int64_t step_rows[32];
  int step_words[32];
  int first_counts; /* a sample call's first step was argmax's and counts its rows greedy */
  dpsResult_t fail_with;   /* returned by the next operation, then cleared */
  dpsResult_t async_error; /* reported by async_error */
} rec;

static char swap_buf[64], p_buf[64], ai_buf[64], al_buf[64], lp_buf[64];

static _Alignas(256) char sample_buf[16];
static dpsResult_t fInit(dpsComm_t c) {
  rec.init++;
  c->sample_mem = sample_buf; /* never read: the fake records step launches nothing */
  c->vout.predict = (int32_t*)p_buf;
  c->vout.accept_index = (int32_t*)ai_buf;
  c->vout.accept_length = (int32_t*)al_buf;
  c->vout.logprobs = (float*)lp_buf;
  return dpsSuccess;
}
static dpsResult_t fPrepare(dpsComm_t c) {
  rec.prepare++;
  c->swap_out = swap_buf;
  return dpsSuccess;
}
static dpsResult_t opResult(int* counter, int pad_bs) {
  (*counter)++;
  rec.last_pad_bs = pad_bs;
  dpsResult_t r = rec.fail_with;
  rec.fail_with = dpsSuccess;
  return r == dpsSuccess ? dpsSuccess : dpsSetError(r, "fake backend failure");
}
static dpsResult_t fSwap(dpsComm_t c, const dpsShape* sh, const void* in, cudaStream_t s) {
  (void)c, (void)in, (void)s;
  return opResult(&rec.swap, sh->pad_bs);
}
static dpsResult_t fGather(dpsComm_t c, const dpsShape* sh, const int32_t* p, const int32_t* ai,
                           const int32_t* al, cudaStream_t s) {
  (void)c, (void)p, (void)ai, (void)al, (void)s;
  return opResult(&rec.gather, sh->pad_bs);
}
static dpsResult_t fLogprobs(dpsComm_t c, const dpsShape* sh, const float* in, cudaStream_t s) {
  (void)c, (void)in, (void)s;
  return opResult(&rec.logprobs, sh->pad_bs);
}
/* A records step: its shape is recorded, nothing is launched. Argmax and
 * top-k (one step per call): the call the step was planned from. */
static dpsResult_t fRecords(dpsComm_t c, const dpsRecOp* op, cudaStream_t s) {
  (void)c, (void)s;
  if (strcmp(op->name, "argmax") == 0 || strcmp(op->name, "topk") == 0) {
    const dpsSelStep* st = (const dpsSelStep*)op->ctx;
    rec.last_select = st->call;
    rec.select_words = op->words;
    if (op->rows != st->call.rows) rec.select_words = -1;
    return opResult(&rec.select, 0);
  }
  if (rec.records < 32) {
    rec.step_rows[rec.records] = op->rows;
    rec.step_words[rec.records] = op->words;
  }
  /* a sampling call's first step of argmax's size is argmax's (the sampling
   * pass's first record has 26 words or more) */
  if (rec.records == 0 && op->words == dpsSelWords(0)) {
    const dpsSelStep* st = (const dpsSelStep*)op->ctx;
    rec.first_counts = st->call.k == 0 && st->call.count_rows != NULL;
  }
  rec.records++;
  return dpsSuccess;
}
static dpsResult_t fAsync(dpsComm_t c) {
  (void)c;
  /* atomic: the watchdog test calls it from a second thread */
  const dpsResult_t a = __atomic_load_n(&rec.async_error, __ATOMIC_SEQ_CST);
  return a == dpsSuccess ? dpsSuccess : dpsSetError(a, "peer 1 did not arrive");
}
static void fDestroy(dpsComm_t c) {
  (void)c;
  rec.destroy++;
}
static const dpsBackendOps kFake = {.name = "fake", .init = fInit, .prepare = fPrepare,
                                    .swap = fSwap, .gather_outputs = fGather,
                                    .gather_logprobs = fLogprobs,
                                    .records = fRecords,
                                    .async_error = fAsync, .destroy = fDestroy};

static dpsConfig_t config(dpsDataType_t dtype) {
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  c.tp_size = 4;
  c.rank = 1;
  c.max_pad_bs = 64;
  c.num_tokens_per_req = 3;
  c.vocab_size = 4 * 100;
  c.logits_dtype = dtype;
  c.backend = dpsBackendNccl;
  return c;
}

static _Alignas(16) char in_buf[16];
#define SENTINEL ((void*)0x5eed)

static int testSwapChecks(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  FX_CHECK(rec.init == 1 && rec.prepare == 1, "init=%d prepare=%d", rec.init, rec.prepare);
  void* out = SENTINEL;
  /* pad_bs: 0, negative, above max, not a multiple of tp */
  const int bad_pad[] = {0, -4, 68, 6};
  for (size_t i = 0; i < sizeof bad_pad / sizeof bad_pad[0]; ++i) {
    char want[64];
    snprintf(want, sizeof want, "pad_bs=%d", bad_pad[i]);
    FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, (int64_t)bad_pad[i] * 3, 100, dpsBfloat16,
                                   bad_pad[i], &out, NULL),
                 dpsInvalidArgument, want);
  }
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 8 * 3 + 1, 100, dpsBfloat16, 8, &out, NULL),
               dpsInvalidArgument, "local_logits is [25, 100]");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 8 * 3, 400, dpsBfloat16, 8, &out, NULL),
               dpsInvalidArgument, "expected [pad_bs*N, V/tp]");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, NULL, 24, 100, dpsBfloat16, 8, &out, NULL),
               dpsInvalidArgument, "local_logits is NULL");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsBfloat16, 8, NULL, NULL),
               dpsInvalidArgument, "output is NULL");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, (dpsDataType_t)7, 8, &out, NULL),
               dpsInvalidArgument, "dtype=invalid (7)");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsDtypeUnset, 8, &out, NULL),
               dpsInvalidArgument, "dtype=unset");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsFloat32, 8, &out, NULL),
               dpsInvalidUsage, "differs from the communicator's logits dtype bf16");
  FX_CHECK_ERR(dpsSwapBatchVocab(NULL, in_buf, 24, 100, dpsBfloat16, 8, &out, NULL),
               dpsInvalidArgument, "comm is NULL");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf + 1, 24, 100, dpsBfloat16, 8, &out, NULL),
               dpsInvalidArgument, "is not aligned to its 2-byte bf16 elements");
  FX_CHECK(out == SENTINEL, "output written on error");
  FX_CHECK(rec.swap == 0, "backend reached %d times by bad calls", rec.swap);
  /* good calls, pad_bs changing */
  const int good[] = {4, 64, 8};
  for (size_t i = 0; i < 3; ++i) {
    out = SENTINEL;
    FX_CHECK_OK(dpsSwapBatchVocab(comm, in_buf, (int64_t)good[i] * 3, 100, dpsBfloat16, good[i],
                                  &out, NULL));
    FX_CHECK(out == swap_buf, "output %p is not the persistent buffer", out);
    FX_CHECK(rec.last_pad_bs == good[i], "backend saw pad_bs=%d", rec.last_pad_bs);
  }
  FX_CHECK(rec.swap == 3, "swap reached backend %d times", rec.swap);
  /* a backend failure propagates and writes nothing */
  out = SENTINEL;
  rec.fail_with = dpsNcclError;
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsBfloat16, 8, &out, NULL), dpsNcclError,
               "fake backend failure");
  FX_CHECK(out == SENTINEL, "output written on backend failure");
  FX_CHECK_OK(dpsCommDestroy(comm));
  FX_CHECK(rec.destroy == 1, "destroy called %d times", rec.destroy);
  return 0;
}

static int testGatherChecks(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsDtypeUnset);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  int32_t p[4], ai[4], al[4];
  float lp[4];
  int32_t *po = SENTINEL, *aio = SENTINEL, *alo = SENTINEL;
  float* lpo = SENTINEL;
  /* reqs must be pad_bs/tp = 4, n must be N = 3 */
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, ai, al, 3, 3, 16, &po, &aio, &alo, NULL),
               dpsInvalidArgument, "predict/accept_index is [3, 3], expected [pad_bs/tp, N]");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, ai, al, 4, 2, 16, &po, &aio, &alo, NULL),
               dpsInvalidArgument, "= [4, 3]");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, ai, NULL, 4, 3, 16, &po, &aio, &alo, NULL),
               dpsInvalidArgument, "accept_length is NULL");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, ai, al, 4, 3, 16, &po, NULL, &alo, NULL),
               dpsInvalidArgument, "accept_index_out is NULL");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, ai, al, 4, 3, 18, &po, &aio, &alo, NULL),
               dpsInvalidArgument, "pad_bs=18 must be a multiple of tp_size=4");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, lp, 4, 4, 16, &lpo, NULL), dpsInvalidArgument,
               "logprobs is [4, 4]");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, NULL, 4, 3, 16, &lpo, NULL), dpsInvalidArgument,
               "logprobs is NULL");
  {
    const int32_t* odd = (const int32_t*)(const void*)((const char*)p + 2);
    FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, p, odd, al, 4, 3, 16, &po, &aio, &alo, NULL),
                 dpsInvalidArgument, "accept_index=");
    FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, (const float*)(const void*)odd, 4, 3, 16, &lpo,
                                         NULL),
                 dpsInvalidArgument, "is not 4-byte aligned");
  }
  FX_CHECK(po == SENTINEL && aio == SENTINEL && alo == SENTINEL && lpo == SENTINEL,
           "outputs written on error");
  FX_CHECK(rec.gather == 0 && rec.logprobs == 0, "backend reached by bad calls");
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, p, ai, al, 4, 3, 16, &po, &aio, &alo, NULL));
  FX_CHECK(po == (int32_t*)p_buf && aio == (int32_t*)ai_buf && alo == (int32_t*)al_buf,
           "verify outputs are not the persistent buffers");
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, lp, 1, 3, 4, &lpo, NULL));
  FX_CHECK(lpo == (float*)lp_buf && rec.last_pad_bs == 4, "logprobs output/pad_bs wrong");
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

/* tp above DPS_SHARD_MAX_RANKS (nccl allows it; the merges hold every rank's
 * record on chip): argmax, top-k and sample refuse, naming tp_size, before any
 * backend work; the swap still runs. */
static int testShardRankLimit(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  cfg.tp_size = 16;
  cfg.rank = 3;
  cfg.vocab_size = 16 * 100;
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  static _Alignas(16) char out8[64 * 8 * 8];
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 1600, NULL, (int64_t*)out8, NULL, NULL),
               dpsUnavailable, "argmax: tp_size=16");
  FX_CHECK_ERR(dpsTopK(comm, in_buf, 8, 100, dpsBfloat16, 4, 1600, NULL, (int64_t*)out8, NULL),
               dpsUnavailable, "topk: tp_size=16");
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 1600, &p, (int64_t*)out8, NULL, NULL),
               dpsUnavailable, "sample: tp_size=16");
  FX_CHECK(rec.select == 0 && rec.records == 0, "a refused call reached the backend: select=%d "
           "records=%d", rec.select, rec.records);
  void* out = SENTINEL;
  FX_CHECK_OK(dpsSwapBatchVocab(comm, in_buf, 16 * 3, 100, dpsBfloat16, 16, &out, NULL));
  FX_CHECK_OK(dpsCommDestroy(comm));
  printf("shard reductions: tp_size=16 refused (at most %d ranks), the swap runs\n",
         DPS_SHARD_MAX_RANKS);
  return 0;
}

static int testDtypeLock(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsDtypeUnset);
  dpsComm_t comm;
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(!info.initialized && info.logits_dtype == dpsDtypeUnset && rec.prepare == 0,
           "dtype unset must defer the swap buffers");
  FX_CHECK_ERR(dpsCommPrepare(comm, dpsDtypeUnset), dpsInvalidArgument, "dtype=-1");
  void* out = SENTINEL;
  FX_CHECK_OK(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsFloat16, 8, &out, NULL));
  FX_CHECK(rec.prepare == 1 && out == swap_buf, "first swap must prepare once");
  FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32)); /* keeps fp16 */
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.initialized && info.logits_dtype == dpsFloat16 && rec.prepare == 1,
           "prepare after swap changed state: dtype=%s prepares=%d",
           dpsDataTypeName(info.logits_dtype), rec.prepare);
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsBfloat16, 8, &out, NULL),
               dpsInvalidUsage, "local_logits dtype bf16 differs");
  FX_CHECK_OK(dpsCommDestroy(comm));

  /* prepare first fixes the dtype for the later swap */
  memset(&rec, 0, sizeof rec);
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32));
  FX_CHECK(rec.prepare == 1, "prepare ran %d times", rec.prepare);
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsFloat32, 8, &out, NULL),
               dpsInvalidUsage, "communicator's logits dtype bf16");
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

static int testStickyAsyncError(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  dpsResult_t async = dpsInternalError;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &async));
  FX_CHECK(async == dpsSuccess, "fresh comm reports %s", dpsGetErrorString(async));
  rec.async_error = dpsTimeout;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &async));
  FX_CHECK(async == dpsTimeout, "async error %s, want dpsTimeout", dpsGetErrorString(async));
  FX_CHECK(strstr(dpsGetLastError(), "peer 1") != NULL, "message: %s", dpsGetLastError());
  rec.async_error = dpsSuccess; /* still sticky: the communicator stays broken */
  void* out = SENTINEL;
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, in_buf, 24, 100, dpsBfloat16, 8, &out, NULL), dpsTimeout,
               "failed earlier with dpsTimeout; destroy it");
  FX_CHECK(out == SENTINEL && rec.swap == 0, "a broken communicator ran an operation");
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

/* dpsCommGetAsyncError on a watchdog thread while the main thread runs
 * operations: the watchdog sees the failure with its own message, the
 * operations fail from then on, and both agree on the sticky status. */
static double nowS(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  dpsComm_t comm;
  long polls;
  int saw_timeout, bad;
} Watch;

static void* watchdog(void* arg) {
  Watch* w = (Watch*)arg;
  const double t_end = nowS() + 30.0;
  while (!w->saw_timeout && nowS() < t_end) {
    dpsResult_t a = dpsInternalError;
    if (dpsCommGetAsyncError(w->comm, &a) != dpsSuccess) {
      w->bad++;
      break;
    }
    w->polls++;
    if (a == dpsTimeout) {
      w->saw_timeout = 1;
      if (strstr(dpsGetLastError(), "peer 1") == NULL) w->bad++;
    } else if (a != dpsSuccess) {
      w->bad++;
      break;
    }
  }
  return NULL;
}

static int testWatchdogThread(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  Watch w;
  memset(&w, 0, sizeof w);
  FX_CHECK_OK(dpsTestCommCreateHost(&w.comm, &cfg, dpsBackendOnesided, &kFake));
  pthread_t t;
  FX_CHECK(pthread_create(&t, NULL, watchdog, &w) == 0, "pthread_create");
  int failed_at = -1;
  for (int i = 0; i < 20000; ++i) {
    if (i == 5000) __atomic_store_n(&rec.async_error, dpsTimeout, __ATOMIC_SEQ_CST);
    void* out = NULL;
    const dpsResult_t r = dpsSwapBatchVocab(w.comm, in_buf, 24, 100, dpsBfloat16, 8, &out, NULL);
    if (r != dpsSuccess) {
      FX_CHECK(r == dpsTimeout && i >= 5000, "swap %d: %s: %s", i, dpsGetErrorString(r),
               dpsGetLastError());
      FX_CHECK(strstr(dpsGetLastError(), "peer 1") != NULL, "message: %s", dpsGetLastError());
      failed_at = i;
      break;
    }
  }
  FX_CHECK(pthread_join(t, NULL) == 0, "pthread_join");
  FX_CHECK(failed_at == 5000, "operations failed first at %d, want 5000", failed_at);
  FX_CHECK(w.saw_timeout && w.bad == 0, "watchdog: saw_timeout=%d bad=%d after %ld polls",
           w.saw_timeout, w.bad, w.polls);
  __atomic_store_n(&rec.async_error, dpsSuccess, __ATOMIC_SEQ_CST); /* sticky all the same */
  dpsResult_t a = dpsSuccess;
  FX_CHECK_OK(dpsCommGetAsyncError(w.comm, &a));
  FX_CHECK(a == dpsTimeout, "sticky status %s", dpsGetErrorString(a));
  FX_CHECK_OK(dpsCommDestroy(w.comm));
  return 0;
}

static int testTimeoutEnv(void) {
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  dpsCommInfo_t info;
  unsetenv("DPSAMPLING_TIMEOUT_MS");
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.timeout_ms == 5000, "default timeout %d ms", info.timeout_ms);
  FX_CHECK_OK(dpsCommDestroy(comm));
  setenv("DPSAMPLING_TIMEOUT_MS", "250", 1);
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.timeout_ms == 250, "env timeout %d ms", info.timeout_ms);
  FX_CHECK_OK(dpsCommDestroy(comm));
  cfg.timeout_ms = 40; /* the config wins over the environment */
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.timeout_ms == 40, "config timeout %d ms", info.timeout_ms);
  FX_CHECK_OK(dpsCommDestroy(comm));
  cfg.timeout_ms = 0;
  const char* bad[] = {"abc", " 5", "+5", "0", "-3", "12ms", "86400001"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    setenv("DPSAMPLING_TIMEOUT_MS", bad[i], 1);
    comm = SENTINEL;
    FX_CHECK_ERR(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake),
                 dpsInvalidArgument, "DPSAMPLING_TIMEOUT_MS=");
    FX_CHECK(comm == SENTINEL, "comm written on error (value '%s')", bad[i]);
  }
  unsetenv("DPSAMPLING_TIMEOUT_MS");
  return 0;
}

/* Whether comm->env holds these values (what the backends read). */
static int envIs(dpsComm_t comm, const char* what, uint64_t ll, int blocks, int ll128, int threads,
                 int pdl, int split, int tiled, int exact_split) {
  const dpsEnv* e = &comm->env;
  FX_CHECK(e->os_ll_bytes == ll && e->os_max_blocks == blocks && e->os_gather_ll128 == ll128 &&
               e->os_gather_threads == threads && e->pdl == pdl && e->select_split == split &&
               e->tiled_collect == tiled && e->exact_split == exact_split,
           "%s: ll %llu blocks %d ll128 %d threads %d pdl %d split %d tiled %d exact split %d",
           what, (unsigned long long)e->os_ll_bytes, e->os_max_blocks, e->os_gather_ll128,
           e->os_gather_threads, e->pdl, e->select_split, e->tiled_collect, e->exact_split);
  return 0;
}

/* One policy for every environment variable (docs/api.md, "Environment
 * variables"): set to an invalid value, it fails creation with
 * dpsInvalidArgument naming the variable and its value, whichever backend;
 * nothing is written. Valid values reach comm->env. */
static int testEnvPolicy(void) {
  static const struct {
    const char* var;
    const char* bad;
  } kBad[] = {
      {"DPSAMPLING_BACKEND", "fast"},
      {"TOKENSPEED_DP_SAMPLING_BACKEND", "fast"},
      {"DPSAMPLING_DEBUG", "verbose"},
      {"DPSAMPLING_TIMEOUT_MS", "soon"},
      {"DPSAMPLING_ONESIDED_LL_BYTES", "1k"},
      {"DPSAMPLING_ONESIDED_MAX_BLOCKS", "0"},
      {"DPSAMPLING_ONESIDED_GATHER_PROTO", "LL128"},
      {"DPSAMPLING_ONESIDED_GATHER_THREADS", "48"},
      {"DPSAMPLING_ONESIDED_GATHER_THREADS", "2048"},
      {"DPSAMPLING_PDL", "2"},
      {"DPSAMPLING_SELECT_SPLIT", "9"},
      {"DPSAMPLING_SELECT_SPLIT", "-1"},
      {"DPSAMPLING_TILED_COLLECT", "yes"},
      {"DPSAMPLING_EXACT_SPLIT", "2"},
  };
  const dpsBackend_t backends[2] = {dpsBackendNccl, dpsBackendOnesided};
  dpsConfig_t cfg = config(dpsBfloat16);
  cfg.timeout_ms = 40; /* a config timeout does not hide a bad DPSAMPLING_TIMEOUT_MS */
  for (size_t i = 0; i < sizeof kBad / sizeof kBad[0]; ++i)
    for (int b = 0; b < 2; ++b) {
      setenv(kBad[i].var, kBad[i].bad, 1);
      char want[128];
      snprintf(want, sizeof want, "%s='%s'", kBad[i].var, kBad[i].bad);
      dpsComm_t comm = SENTINEL;
      memset(&rec, 0, sizeof rec);
      FX_CHECK_ERR(dpsTestCommCreateHost(&comm, &cfg, backends[b], &kFake), dpsInvalidArgument,
                   want);
      FX_CHECK(comm == SENTINEL && rec.init == 0, "%s: comm written or backend initialized", want);
      unsetenv(kBad[i].var);
    }
  /* valid values, each as the backends read it */
  setenv("DPSAMPLING_DEBUG", "warn", 1);
  setenv("DPSAMPLING_ONESIDED_LL_BYTES", "99999999", 1); /* above the cap: capped */
  setenv("DPSAMPLING_ONESIDED_MAX_BLOCKS", "4", 1);
  setenv("DPSAMPLING_ONESIDED_GATHER_PROTO", "ll128", 1);
  setenv("DPSAMPLING_ONESIDED_GATHER_THREADS", "64", 1);
  setenv("DPSAMPLING_PDL", "0", 1);
  setenv("DPSAMPLING_SELECT_SPLIT", "1", 1);
  setenv("DPSAMPLING_TILED_COLLECT", "1", 1);
  setenv("DPSAMPLING_EXACT_SPLIT", "0", 1);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  if (envIs(comm, "set", 16u << 20, 4, 1, 64, 0, 1, DPS_TILED_ALWAYS, 0)) return 1; /* LL bytes capped */
  FX_CHECK_OK(dpsCommDestroy(comm));
  setenv("DPSAMPLING_TILED_COLLECT", "0", 1);
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  if (envIs(comm, "tiled 0", 16u << 20, 4, 1, 64, 0, 1, DPS_TILED_NEVER, 0)) return 1;
  FX_CHECK_OK(dpsCommDestroy(comm));
  const char* set[] = {"DPSAMPLING_DEBUG", "DPSAMPLING_ONESIDED_LL_BYTES",
                       "DPSAMPLING_ONESIDED_MAX_BLOCKS", "DPSAMPLING_ONESIDED_GATHER_PROTO",
                       "DPSAMPLING_ONESIDED_GATHER_THREADS", "DPSAMPLING_PDL",
                       "DPSAMPLING_SELECT_SPLIT", "DPSAMPLING_TILED_COLLECT",
                       "DPSAMPLING_EXACT_SPLIT"};
  for (size_t i = 0; i < sizeof set / sizeof set[0]; ++i) setenv(set[i], "", 1); /* empty: unset */
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  if (envIs(comm, "defaults", 256u << 10, 0, 0, 256, 1, 8, DPS_TILED_AUTO, 1)) return 1;
  FX_CHECK_OK(dpsCommDestroy(comm));
  for (size_t i = 0; i < sizeof set / sizeof set[0]; ++i) unsetenv(set[i]);
  return 0;
}

/* dpsArgmax (..., value, index, lse, stream) and dpsTopK (..., values,
 * indices, stream): each pointer reaches the backend as the output it is
 * documented to be, a bad one is named as that output, and a refused call
 * reaches no backend. The config: tp 4, V = 400 (V/tp = 100), rows up to
 * max_pad_bs*N = 64*3 = 192, max_topk 64. */
static int testSelectOutputs(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  static _Alignas(16) char value[8 * 64 * 2], index[8 * 64 * 8], lse[8 * 4];
  FX_CHECK_OK(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 400, value, (int64_t*)index,
                        (float*)lse, NULL));
  FX_CHECK(rec.select == 1, "argmax reached the backend %d times", rec.select);
  FX_CHECK(rec.select_words == 4, "argmax: a records step of %d words per row", rec.select_words);
  FX_CHECK(comm->rec_words == 154 && comm->rec_words >= dpsSelWords(cfg.max_topk),
           "record capacity %d words for max_topk %d", comm->rec_words, cfg.max_topk);
  const dpsSelectCall* a = &rec.last_select;
  FX_CHECK(a->k == 0 && a->rows == 8 && a->vocab_limit == 400 && a->logits == in_buf &&
               a->dtype == dpsBfloat16,
           "argmax call: k=%d rows=%lld vocab_limit=%lld", a->k, (long long)a->rows,
           (long long)a->vocab_limit);
  FX_CHECK(a->value == (void*)value && a->index == (int64_t*)index && a->lse == (float*)lse,
           "argmax outputs swapped: value=%p index=%p lse=%p, passed value=%p index=%p lse=%p",
           a->value, (void*)a->index, (void*)a->lse, (void*)value, (void*)index, (void*)lse);
  FX_CHECK_OK(dpsArgmax(comm, in_buf, 3, 100, dpsBfloat16, 77, NULL, (int64_t*)index, NULL, NULL));
  FX_CHECK(a->value == NULL && a->index == (int64_t*)index && a->lse == NULL &&
               a->vocab_limit == 77 && a->rows == 3,
           "argmax without value / lse: value=%p index=%p lse=%p", a->value, (void*)a->index,
           (void*)a->lse);
  FX_CHECK_OK(dpsTopK(comm, in_buf, 5, 100, dpsBfloat16, 7, 400, value, (int64_t*)index, NULL));
  FX_CHECK(rec.select == 3, "top-k reached the backend %d times", rec.select);
  FX_CHECK(rec.select_words == 14, "top-k 7: a records step of %d words per row",
           rec.select_words);
  FX_CHECK(a->k == 7 && a->rows == 5 && a->value == (void*)value && a->index == (int64_t*)index &&
               a->lse == NULL,
           "top-k outputs swapped: k=%d values=%p indices=%p, passed values=%p indices=%p", a->k,
           a->value, (void*)a->index, (void*)value, (void*)index);
  /* each bad pointer is named as the output it stands for, and nothing runs */
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 400, value + 1, (int64_t*)index, NULL,
                         NULL),
               dpsInvalidArgument, "argmax: value=");
  FX_CHECK(strstr(dpsGetLastError(), "not 2-byte aligned") != NULL, "message: %s",
           dpsGetLastError());
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 400, value, (int64_t*)(index + 4),
                         NULL, NULL),
               dpsInvalidArgument, "argmax: index=");
  FX_CHECK(strstr(dpsGetLastError(), "not 8-byte aligned") != NULL, "message: %s",
           dpsGetLastError());
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 400, value, NULL, NULL, NULL),
               dpsInvalidArgument, "argmax: index is NULL");
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 400, value, (int64_t*)index,
                         (float*)(lse + 2), NULL),
               dpsInvalidArgument, "argmax: lse=");
  FX_CHECK_ERR(dpsTopK(comm, in_buf, 5, 100, dpsBfloat16, 7, 400, value + 1, (int64_t*)index, NULL),
               dpsInvalidArgument, "topk: values=");
  FX_CHECK_ERR(dpsTopK(comm, in_buf, 5, 100, dpsBfloat16, 7, 400, value, (int64_t*)(index + 4),
                       NULL),
               dpsInvalidArgument, "topk: indices=");
  FX_CHECK_ERR(dpsTopK(comm, in_buf, 5, 100, dpsBfloat16, 7, 400, value, NULL, NULL),
               dpsInvalidArgument, "topk: indices is NULL");
  FX_CHECK_ERR(dpsTopK(comm, in_buf, 5, 100, dpsBfloat16, 65, 400, value, (int64_t*)index, NULL),
               dpsInvalidArgument, "k=65");
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 193, 100, dpsBfloat16, 400, value, (int64_t*)index, NULL,
                         NULL),
               dpsInvalidArgument, "rows=193");
  FX_CHECK_ERR(dpsArgmax(comm, in_buf, 8, 100, dpsBfloat16, 401, value, (int64_t*)index, NULL,
                         NULL),
               dpsInvalidArgument, "vocab_limit=401");
  FX_CHECK(rec.select == 3, "refused calls reached the backend (%d calls)", rec.select);
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

/* dpsSample: every bad argument is refused by name before any step; a good
 * call at tp 4 plans the records steps its parameters may need: the first
 * (26 words, + 2 per candidate where a filter may act), 6 top-k rounds (64
 * words), 6 top-p rounds (128), the race (4); a greedy tokens-only call one
 * step of argmax's (4 words) that counts its rows, a greedy one with
 * logprobs or a temperature array the sampling pass's first step. */
static int testSampleChecks(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  static _Alignas(16) char tok[192 * 8], lp[192 * 4], arr[192 * 8];
  const struct {
    const char* what;
    int topk, topp, minp, steps, first_words;
  } plans[] = {{"temperature only", 0, 0, 0, 1, 26},
               {"top-k", 1, 0, 0, 8, 154},
               {"top-p", 0, 1, 0, 8, 154},
               {"min-p", 0, 0, 1, 2, 154},
               {"all", 1, 1, 1, 14, 154}};
  for (size_t i = 0; i < sizeof plans / sizeof plans[0]; ++i) {
    dpsSampleParams_t sp = DPS_SAMPLE_PARAMS_INITIALIZER;
    sp.temperature = 0.7f;
    if (plans[i].topk) sp.top_k = 50;
    if (plans[i].topp) sp.top_ps = (const float*)arr; /* an array: any row may filter */
    if (plans[i].minp) sp.min_p = 0.1f;
    rec.records = 0;
    FX_CHECK_OK(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &sp, (int64_t*)tok, NULL, NULL));
    FX_CHECK(rec.records == plans[i].steps && rec.step_words[0] == plans[i].first_words &&
                 rec.step_rows[0] == 8,
             "%s: %d steps (first %d words, %lld rows), want %d (%d words, 8 rows)",
             plans[i].what, rec.records, rec.step_words[0], (long long)rec.step_rows[0],
             plans[i].steps, plans[i].first_words);
    const int last = plans[i].steps - 1;
    FX_CHECK(last == 0 || rec.step_words[last] == 4, "%s: the last step has %d words",
             plans[i].what, rec.step_words[last]);
    if (plans[i].topk) FX_CHECK(rec.step_words[1] == 64, "%s: step 1 words %d", plans[i].what, rec.step_words[1]);
    if (plans[i].topp && !plans[i].topk)
      FX_CHECK(rec.step_words[1] == 128, "%s: step 1 words %d", plans[i].what, rec.step_words[1]);
  }
  const struct {
    const char* what;
    int t_array, logprobs, by_argmax;
  } greedy[] = {{"greedy, tokens only", 0, 0, 1},
                {"greedy with logprobs", 0, 1, 0},
                {"greedy by a temperature array", 1, 0, 0}};
  for (size_t i = 0; i < sizeof greedy / sizeof greedy[0]; ++i) {
    dpsSampleParams_t sp = DPS_SAMPLE_PARAMS_INITIALIZER;
    sp.temperature = 0.f;
    sp.top_ks = (const int32_t*)arr; /* ignored by greedy rows; never checked */
    sp.seeds = (const uint64_t*)arr;
    if (greedy[i].t_array) sp.temperatures = (const float*)arr;
    rec.records = 0;
    rec.first_counts = 0;
    FX_CHECK_OK(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &sp, (int64_t*)tok,
                          greedy[i].logprobs ? (float*)lp : NULL, NULL));
    const int want_words = greedy[i].by_argmax ? dpsSelWords(0) : 154;
    FX_CHECK(rec.step_rows[0] == 8 && rec.step_words[0] == want_words &&
                 rec.first_counts == greedy[i].by_argmax &&
                 (!greedy[i].by_argmax || rec.records == 1),
             "%s: %d steps, the first %d words (%lld rows), counted %d; want %d words%s",
             greedy[i].what, rec.records, rec.step_words[0], (long long)rec.step_rows[0],
             rec.first_counts, want_words, greedy[i].by_argmax ? ", one step, counted" : "");
  }
  rec.records = 0;
  dpsSampleParams_t ok = DPS_SAMPLE_PARAMS_INITIALIZER;
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, NULL, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "params is NULL");
  dpsSampleParams_t p = ok;
  p.size = 8;
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "DPS_SAMPLE_PARAMS_INITIALIZER");
  const struct {
    float* field;
    float value;
    const char* name;
  } bad[] = {{&p.temperature, -1.f, "params->temperature="},
             {&p.temperature, NAN, "params->temperature="},
             {&p.temperature, INFINITY, "params->temperature="},
             {&p.top_p, 0.f, "params->top_p="},
             {&p.top_p, 1.5f, "params->top_p="},
             {&p.top_p, -0.5f, "params->top_p="},
             {&p.top_p, NAN, "params->top_p="},
             {&p.min_p, 1.f, "params->min_p="},
             {&p.min_p, -0.1f, "params->min_p="},
             {&p.min_p, NAN, "params->min_p="}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    p = ok;
    *bad[i].field = bad[i].value;
    FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
                 dpsInvalidArgument, bad[i].name);
  }
  /* the value exactly: 1 + 2^-23 is not "1" */
  p = ok;
  p.top_p = nextafterf(1.f, 2.f);
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "params->top_p=1.00000012 must be in (0, 1]");
  /* a scalar whose array is given is not used, so not checked: the next
   * check (tokens) is the one that fails */
  p = ok;
  p.temperature = NAN;
  p.temperatures = (const float*)arr;
  p.top_p = 0.f;
  p.top_ps = (const float*)arr;
  p.min_p = 2.f;
  p.min_ps = (const float*)arr;
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, NULL, NULL, NULL),
               dpsInvalidArgument, "sample: tokens is NULL");
  p = ok;
  p.top_ks = (const int32_t*)arr;
  p.top_ks_i64 = (const int64_t*)arr;
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "give at most one");
  p = ok;
  p.seeds = (const uint64_t*)(arr + 4);
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "params->seeds=");
  p = ok;
  p.temperatures = (const float*)(arr + 2);
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &p, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "params->temperatures=");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &ok, NULL, NULL, NULL),
               dpsInvalidArgument, "sample: tokens is NULL");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &ok, (int64_t*)(tok + 4), NULL,
                         NULL),
               dpsInvalidArgument, "sample: tokens=");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 400, &ok, (int64_t*)tok,
                         (float*)(lp + 2), NULL),
               dpsInvalidArgument, "sample: logprobs=");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 193, 100, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "rows=193");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 0, 100, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "rows=0");
  FX_CHECK_ERR(dpsSample(comm, NULL, 0, 100, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "rows=0");
  FX_CHECK_ERR(dpsSample(comm, NULL, 8, 100, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "sample: logits is NULL");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 400, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "expected [rows, V/tp]");
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, 100, dpsBfloat16, 401, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "vocab_limit=401");
  FX_CHECK_ERR(dpsSample(NULL, in_buf, 8, 100, dpsBfloat16, 400, &ok, (int64_t*)tok, NULL, NULL),
               dpsInvalidArgument, "comm is NULL");
  FX_CHECK(rec.records == 0, "refused calls planned %d steps", rec.records);
  FX_CHECK_OK(dpsCommDestroy(comm));
  /* the fixed-point masses' range */
  cfg.vocab_size = 4 * ((1 << 21) + 1);
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  FX_CHECK_ERR(dpsSample(comm, in_buf, 8, (1 << 21) + 1, dpsBfloat16, cfg.vocab_size, &ok,
                         (int64_t*)tok, NULL, NULL),
               dpsUnavailable, "vocab_size=8388612");
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

/* dpsVerifyChain's argument checks on the host (the GPU test covers some of
 * them with a device): each refused with the argument and its value named,
 * no output pointer written, no step planned. N = 3, max_pad_bs = 64. */
static int testVerifyChecks(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  static _Alignas(16) char cand[256 * 4], arr[256 * 8];
  const int32_t* cd = (const int32_t*)cand;
  const dpsSampleParams_t ok = DPS_SAMPLE_PARAMS_INITIALIZER;
  dpsSampleParams_t twok = ok, badseed = ok, badt = ok;
  twok.top_ks = (const int32_t*)arr;
  twok.top_ks_i64 = (const int64_t*)arr;
  badseed.seeds = (const uint64_t*)(arr + 4);
  badt.temperature = -1.f;
  const struct {
    const char* what;
    const void* logits;
    int64_t rows;
    int pad_bs;
    const int32_t* cand;
    const dpsSampleParams_t* params;
    const int32_t* mask;
    float cap;
    int null_out; /* 1: predict NULL */
    const char* needle;
  } cases[] = {
      {"pad_bs above max_pad_bs, rows its pad_bs*N", in_buf, 65 * 3, 65, cd, &ok, NULL, 0.f, 0,
       "pad_bs=65 must be in [1, max_pad_bs=64]"},
      {"pad_bs 0", in_buf, 6, 0, cd, &ok, NULL, 0.f, 0, "pad_bs=0"},
      {"rows != pad_bs*N", in_buf, 7, 2, cd, &ok, NULL, 0.f, 0, "rows=7 must be pad_bs*N = 2*3"},
      {"empty logits", NULL, 0, 2, cd, &ok, NULL, 0.f, 0, "rows=0"},
      {"logits NULL", NULL, 6, 2, cd, &ok, NULL, 0.f, 0, "verify_chain: logits is NULL"},
      {"params NULL", in_buf, 6, 2, cd, NULL, NULL, 0.f, 0, "params is NULL"},
      {"two top_k arrays", in_buf, 6, 2, cd, &twok, NULL, 0.f, 0, "give at most one"},
      {"seeds misaligned", in_buf, 6, 2, cd, &badseed, NULL, 0.f, 0, "params->seeds="},
      {"temperature -1", in_buf, 6, 2, cd, &badt, NULL, 0.f, 0, "params->temperature=-1"},
      {"candidates NULL", in_buf, 6, 2, NULL, &ok, NULL, 0.f, 0, "candidates is NULL"},
      {"candidates misaligned", in_buf, 6, 2, (const int32_t*)(cand + 2), &ok, NULL, 0.f, 0,
       "candidates="},
      {"vocab_mask misaligned", in_buf, 6, 2, cd, &ok, (const int32_t*)(cand + 1), 0.f, 0,
       "vocab_mask="},
      {"softcap -1", in_buf, 6, 2, cd, &ok, NULL, -1.f, 0, "softcap=-1"},
      {"softcap nan", in_buf, 6, 2, cd, &ok, NULL, NAN, 0, "softcap=nan"},
      {"softcap inf", in_buf, 6, 2, cd, &ok, NULL, INFINITY, 0, "softcap=inf"},
      {"predict NULL", in_buf, 6, 2, cd, &ok, NULL, 0.f, 1, "none may be NULL"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    int32_t *pr = SENTINEL, *ai = SENTINEL, *al = SENTINEL;
    float* lp = SENTINEL;
    FX_CHECK_ERR(dpsVerifyChain(comm, cases[i].logits, cases[i].rows, 100, dpsBfloat16, 400,
                                cases[i].pad_bs, cases[i].cand, cases[i].params, cases[i].mask,
                                cases[i].cap, cases[i].null_out ? NULL : &pr, &ai, &al, &lp,
                                NULL),
                 dpsInvalidArgument, cases[i].needle);
    FX_CHECK(pr == SENTINEL && ai == SENTINEL && al == SENTINEL && lp == SENTINEL,
             "%s: an output pointer was written", cases[i].what);
  }
  FX_CHECK(rec.records == 0, "refused calls planned %d steps", rec.records);
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

static dpsResult_t neverGatherMb(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  return dpsInternalError;
}
static dpsResult_t neverA2aMb(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  return dpsInternalError;
}

/* dpsCommOpMayBlock: nccl -> may block; onesided, or tp == 1 without
 * installed collectives -> not, prepared or not (only a swap that fixes the
 * dtype allocates, and the header leaves that to the caller: `initialized`). */
static int testOpMayBlock(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsDtypeUnset);
  dpsComm_t comm;
  dpsCommInfo_t info;
  int mb = -1;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_ERR(dpsCommOpMayBlock(comm, NULL), dpsInvalidArgument, "may_block");
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 0, "unprepared onesided: may_block=%d, want 0 (argmax and the others)", mb);
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.initialized == 0, "unprepared onesided: initialized=%d (a swap prepares)",
           info.initialized);
  FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 0, "prepared onesided: may_block=%d, want 0", mb);
  FX_CHECK_OK(dpsCommDestroy(comm));
  cfg = config(dpsBfloat16);
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 1, "prepared nccl: may_block=%d, want 1", mb);
  FX_CHECK_OK(dpsCommDestroy(comm));
  /* tp == 1: nothing to exchange, so no NCCL call, unless collectives are
   * installed (they may do anything) */
  cfg = config(dpsDtypeUnset);
  cfg.tp_size = 1;
  cfg.rank = 0;
  cfg.vocab_size = 100;
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 0, "unprepared nccl tp=1: may_block=%d, want 0", mb);
  FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 0, "prepared nccl tp=1: may_block=%d, want 0", mb);
  const dpsCollectives_t gather_only = {(void*)in_buf, neverGatherMb, NULL};
  FX_CHECK_OK(dpsCommSetCollectives(comm, &gather_only));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 1, "nccl tp=1 with an all_gather installed: may_block=%d, want 1", mb);
  const dpsCollectives_t a2a_only = {(void*)in_buf, NULL, neverA2aMb};
  FX_CHECK_OK(dpsCommSetCollectives(comm, &a2a_only));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 1, "nccl tp=1 with an all_to_all installed: may_block=%d, want 1", mb);
  FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
  FX_CHECK_OK(dpsCommOpMayBlock(comm, &mb));
  FX_CHECK(mb == 0, "nccl tp=1, collectives removed: may_block=%d, want 0", mb);
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

static dpsResult_t neverGather(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  return dpsInternalError;
}

/* dpsCommSetCollectives: the table is the nccl backend's; onesided uses no
 * collectives, so a table for it is dpsUnavailable naming the backend (it
 * was accepted and never called before), installs nothing, and NULL (the
 * defaults) is accepted on both. */
static int testSetCollectives(void) {
  memset(&rec, 0, sizeof rec);
  dpsConfig_t cfg = config(dpsBfloat16);
  dpsComm_t comm;
  const dpsCollectives_t table = {(void*)in_buf, neverGather, NULL};
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendOnesided, &kFake));
  FX_CHECK_ERR(dpsCommSetCollectives(comm, &table), dpsUnavailable, "onesided backend");
  FX_CHECK(strstr(dpsGetLastError(), "uses no collectives") != NULL, "message: %s",
           dpsGetLastError());
  FX_CHECK(comm->coll.all_gather == NULL && comm->coll.ctx == NULL, "table installed anyway");
  FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
  FX_CHECK_OK(dpsCommDestroy(comm));
  FX_CHECK_OK(dpsTestCommCreateHost(&comm, &cfg, dpsBackendNccl, &kFake));
  FX_CHECK_OK(dpsCommSetCollectives(comm, &table));
  FX_CHECK(comm->coll.all_gather == neverGather && comm->coll.ctx == (void*)in_buf,
           "table not installed");
  FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
  FX_CHECK(comm->coll.all_gather == NULL, "NULL did not restore the defaults");
  FX_CHECK_OK(dpsCommDestroy(comm));
  return 0;
}

/* The registry decides what the core asks: every backend has an entry,
 * auto picks the available entry of the highest priority, the fallback
 * needs no probe, may_block and uses_collectives as the backends behave. */
static int testRegistry(void) {
  const dpsBackendEntry* os = dpsBackendLookup(dpsBackendOnesided);
  const dpsBackendEntry* nc = dpsBackendLookup(dpsBackendNccl);
  FX_CHECK(os != NULL && nc != NULL && dpsBackendLookup(dpsBackendAuto) == NULL, "entries");
  FX_CHECK(strcmp(os->name, dpsBackendName(os->id)) == 0 &&
               strcmp(nc->name, dpsBackendName(nc->id)) == 0,
           "names");
  FX_CHECK(dpsBackendsAvailable(NULL) == DPS_BACKEND_BIT(dpsBackendNccl), "unprobed: 0x%x",
           dpsBackendsAvailable(NULL));
  const unsigned both = DPS_BACKEND_BIT(dpsBackendNccl) | DPS_BACKEND_BIT(dpsBackendOnesided);
  FX_CHECK(dpsBackendPickAuto(both) == os, "auto with both");
  FX_CHECK(dpsBackendPickAuto(DPS_BACKEND_BIT(dpsBackendNccl)) == nc, "auto with nccl");
  FX_CHECK(dpsBackendPickAuto(0) == NULL, "auto with none");
  FX_CHECK(dpsBackendFallback(os) == nc && dpsBackendFallback(nc) == NULL, "fallbacks");
  FX_CHECK(!os->may_block && nc->may_block, "may_block");
  FX_CHECK(!os->uses_collectives && nc->uses_collectives, "uses_collectives");
  dpsBackend_t b = (dpsBackend_t)-7;
  FX_CHECK_ERR(dpsResolveBackendIn(dpsBackendAuto, 0, &b), dpsUnavailable, "no backend");
  FX_CHECK(b == (dpsBackend_t)-7, "written on error");
  return 0;
}

int main(void) {
  int fails = 0;
  fails += testSetCollectives();
  fails += testEnvPolicy();
  fails += testRegistry();
  fails += testTimeoutEnv();
  fails += testSwapChecks();
  fails += testGatherChecks();
  fails += testSelectOutputs();
  fails += testSampleChecks();
  fails += testVerifyChecks();
  fails += testShardRankLimit();
  fails += testDtypeLock();
  fails += testOpMayBlock();
  fails += testStickyAsyncError();
  fails += testWatchdogThread();
  printf("test_op_checks: %s\n", fails ? "FAILED" : "passed");
  return fails ? 1 : 0;
}
