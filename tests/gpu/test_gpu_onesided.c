/* The onesided backend on 2..8 GPUs (one process per GPU):
 *  shapes     spec shapes, realistic LM-head shapes, odd v_local, misaligned
 *             inputs, pad_bs below max_pad_bs; each under the default path
 *             choice, forced direct (DPSAMPLING_ONESIDED_LL_BYTES=0) and forced
 *             LL (16 MiB), fp32 / bf16 / fp16, every value checked;
 *  lazy       dtype unset at creation: prepare then gather; first swap fixes
 *             the dtype; a later prepare(fp32) keeps it; a swap with another
 *             dtype is dpsInvalidUsage;
 *  runahead   one rank holds its stream 50 ms after every call (host function
 *             node) before copying the results out, while the other enqueues
 *             every call at once: each call's snapshot is checked (outputs must
 *             not be overwritten by a peer running ahead);
 *  graph      capture swap + both gathers once, replay with new inputs, eager
 *             calls between replays, back-to-back replays;
 *  timeout    (tp 2) timeout_ms=500: rank 1 does not call, rank 0's call gives
 *             dpsTimeout from dpsCommGetAsyncError within 2x the timeout,
 *             naming rank 1; the next call fails with dpsTimeout. Then rank 1
 *             calls and times out too (so both skip the collective window
 *             deregistration), for the swap's two paths and both gathers.
 *  peerfail   (tp 2) a failure only one rank saw: the other's destroy returns;
 *  dtype      ranks fixing different dtypes all get dpsInvalidUsage.
 * Usage: test_gpu_onesided [shapes|lazy|runahead|graph|timeout|peerfail|dtype]
 *        (default all)
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"

#define OS_TIMEOUT_S 900

static double nowS(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Creates a onesided communicator with DPSAMPLING_ONESIDED_LL_BYTES set to
 * `ll` ("" = unset, i.e. the default). */
static int createOs(dpsComm_t* comm, dpsConfig_t* cfg, const char* ll) {
  if (ll && ll[0]) setenv("DPSAMPLING_ONESIDED_LL_BYTES", ll, 1);
  else unsetenv("DPSAMPLING_ONESIDED_LL_BYTES");
  int rc = gtCreate(comm, cfg);
  unsetenv("DPSAMPLING_ONESIDED_LL_BYTES");
  return rc;
}

/* ---- shapes ------------------------------------------------------------------ */
typedef struct {
  int max_pad_bs, pad_bs, n;
  int64_t vocab;
  dpsDataType_t dtype;
  size_t in_offset;
} osShape;

static const osShape kShapes[] = {
    /* spec */
    {8, 8, 1, 64, dpsFloat32, 0},
    {8, 8, 4, 64, dpsFloat32, 0},
    {8, 8, 1, 64, dpsBfloat16, 0},
    {8, 8, 4, 64, dpsBfloat16, 0},
    {8, 8, 1, 64, dpsFloat16, 0},
    {8, 8, 4, 64, dpsFloat16, 0},
    /* odd v_local (2-byte units), misaligned inputs */
    {8, 8, 2, 74, dpsBfloat16, 0},
    {24, 24, 3, 296, dpsBfloat16, 2},
    {16, 16, 2, 296, dpsFloat32, 4},
    {16, 16, 2, 1000, dpsFloat16, 8},
    {32, 32, 3, 8 * 1001, dpsBfloat16, 0},
    /* pad_bs below max_pad_bs */
    {64, 16, 2, 4096, dpsBfloat16, 0},
    {64, 8, 1, 4096, dpsFloat32, 0},
    /* realistic */
    {64, 64, 1, 152064, dpsBfloat16, 0},
    {64, 64, 4, 152064, dpsBfloat16, 0},
    {64, 64, 2, 152064, dpsFloat32, 0},
    {256, 256, 4, 152064, dpsBfloat16, 0},
    {512, 512, 4, 129280, dpsBfloat16, 0},
};

static int runShape(int rank, int tp, const osShape* sh, const char* ll, cudaStream_t s) {
  if (gtSkipLarge("test_gpu_onesided", sh->max_pad_bs, sh->n, sh->vocab)) return 0;
  dpsConfig_t cfg =
      gtConfig(rank, tp, sh->max_pad_bs, sh->n, sh->vocab, sh->dtype, dpsBackendOnesided);
  dpsComm_t comm;
  int rc = createOs(&comm, &cfg, ll);
  if (rc) return rc;
  /* onesided uses no collectives: a table is refused (dpsUnavailable naming
   * the backend), NULL accepted, and the calls below run as before */
  const dpsCollectives_t table = {NULL, gtCountingAllGather, gtCountingAllToAll};
  FX_CHECK_ERR(dpsCommSetCollectives(comm, &table), dpsUnavailable, "onesided backend");
  FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
  gtBufs b;
  if (gtAllocBufs(&b, tp, sh->max_pad_bs, sh->n, sh->vocab, sh->dtype, sh->in_offset)) return 1;
  void* first = NULL;
  for (int step = 1; step <= 2; ++step) {
    void* o = NULL;
    if (gtSwapChecked(comm, &b, rank, tp, sh->pad_bs, step, s, &o) ||
        gtGatherChecked(comm, &b, rank, tp, sh->pad_bs, step, s, NULL, NULL)) {
      fprintf(stderr, "rank %d: shape max_pad_bs=%d pad_bs=%d N=%d V=%lld %s off=%zu LL=%s failed\n",
              rank, sh->max_pad_bs, sh->pad_bs, sh->n, (long long)sh->vocab,
              dpsDataTypeName(sh->dtype), sh->in_offset, ll[0] ? ll : "default");
      return 1;
    }
    if (first == NULL) first = o;
    FX_CHECK(o == first, "swap output moved");
  }
  /* a full-size call after the smaller one */
  if (sh->pad_bs != sh->max_pad_bs) {
    if (gtSwapChecked(comm, &b, rank, tp, sh->max_pad_bs, 3, s, NULL)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, sh->max_pad_bs, 3, s, NULL, NULL)) return 1;
    if (gtSwapChecked(comm, &b, rank, tp, tp, 4, s, NULL)) return 1;
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int bodyShapes(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* modes[3] = {"", "0", "16777216"};
  for (size_t i = 0; i < sizeof kShapes / sizeof kShapes[0]; ++i) {
    const osShape* sh = &kShapes[i];
    if (sh->max_pad_bs % tp || sh->pad_bs % tp || sh->vocab % tp) continue;
    const size_t in_bytes = (size_t)sh->max_pad_bs * sh->n * (size_t)(sh->vocab / tp) *
                            dpsDataTypeSize(sh->dtype);
    const int nmodes = in_bytes <= ((size_t)32 << 20) ? 3 : 1;
    for (int m = 0; m < nmodes; ++m) {
      int rc = runShape(rank, tp, sh, modes[m], s);
      if (rc) return rc;
    }
  }
  cudaStreamDestroy(s);
  return 0;
}

/* ---- lazy init ---------------------------------------------------------------- */
static int bodyLazy(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int pads[2] = {8, 8};
  const int ns[2] = {1, 4};
  for (int c = 0; c < 2; ++c) {
    const int pad = pads[c] < tp ? tp : pads[c], n = ns[c];
    const int64_t vocab = (int64_t)tp * 32;
    dpsCommInfo_t info;

    /* A: dtype unset, gather right away (no prepare), then prepare + gather */
    dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsDtypeUnset, dpsBackendOnesided);
    dpsComm_t comm;
    int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    gtBufs b;
    if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == dpsDtypeUnset, "dtype %s", dpsDataTypeName(info.logits_dtype));
    if (gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL)) return 1;
    FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
    if (gtGatherChecked(comm, &b, rank, tp, pad, 2, s, NULL, NULL)) return 1;
    if (gtSwapChecked(comm, &b, rank, tp, pad, 3, s, NULL)) return 1;
    FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32)); /* no-op: keeps bf16 */
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == dpsBfloat16, "dtype %s", dpsDataTypeName(info.logits_dtype));
    if (gtGatherChecked(comm, &b, rank, tp, pad, 4, s, NULL, NULL)) return 1;
    void* o = NULL;
    FX_CHECK(dpsSwapBatchVocab(comm, b.d_in, (int64_t)pad * n, vocab / tp, dpsFloat32, pad, &o,
                               s) == dpsInvalidUsage,
             "swap with fp32 on a bf16 communicator: %s", dpsGetLastError());
    FX_CHECK(o == NULL, "output written by a failing call");
    if (gtSwapChecked(comm, &b, rank, tp, pad, 5, s, NULL)) return 1;
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    gtFreeBufs(&b);

    /* B: dtype unset, the first swap (fp16) fixes it */
    cfg = gtConfig(rank, tp, pad, n, vocab, dpsDtypeUnset, dpsBackendOnesided);
    rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    if (gtAllocBufs(&b, tp, pad, n, vocab, dpsFloat16, 0)) return 1;
    if (gtSwapChecked(comm, &b, rank, tp, pad, 6, s, NULL)) return 1;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == dpsFloat16 && info.initialized == 1, "dtype %s init %d",
             dpsDataTypeName(info.logits_dtype), info.initialized);
    FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32));
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == dpsFloat16, "dtype %s", dpsDataTypeName(info.logits_dtype));
    if (gtGatherChecked(comm, &b, rank, tp, pad, 7, s, NULL, NULL)) return 1;
    FX_CHECK(dpsSwapBatchVocab(comm, b.d_in, (int64_t)pad * n, vocab / tp, dpsBfloat16, pad, &o,
                               s) == dpsInvalidUsage,
             "swap with bf16 on a fp16 communicator: %s", dpsGetLastError());
    if (gtSwapChecked(comm, &b, rank, tp, pad, 8, s, NULL)) return 1;
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    gtFreeBufs(&b);
  }
  cudaStreamDestroy(s);
  return 0;
}

/* ---- run-ahead ---------------------------------------------------------------- */
static void sleep50ms(void* arg) {
  (void)arg;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

#define RA_STEPS 6

static int runAhead(int rank, int tp, int slow, int pad, int n, int64_t vocab, dpsDataType_t dt,
                    cudaStream_t s) {
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dt, dpsBackendOnesided);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dt, 0)) return 1;
  const size_t inB = gtInBytes(&b, tp, pad), outB = gtOutBytes(&b, tp, pad);
  const size_t reqs = (size_t)(pad / tp), full = (size_t)pad;
  void *din[RA_STEPS], *snap[RA_STEPS];
  int32_t *dv[RA_STEPS], *sv[RA_STEPS]; /* verify inputs: p|ai|al|lp ; snapshots p|ai|al|lp */
  const size_t vin = reqs * n * 3 + reqs, vout = full * n * 3 + full;
  for (int k = 0; k < RA_STEPS; ++k) {
    GT_CUDA(cudaMalloc(&din[k], inB));
    GT_CUDA(cudaMalloc(&snap[k], outB));
    GT_CUDA(cudaMalloc((void**)&dv[k], vin * 4));
    GT_CUDA(cudaMalloc((void**)&sv[k], vout * 4));
    GT_CUDA(cudaMemset(snap[k], 0xff, outB));
    GT_CUDA(cudaMemset(sv[k], 0xff, vout * 4));
    fxFillSwapInput(b.h_in, tp, rank, pad, n, vocab, dt, 10 + k);
    GT_CUDA(cudaMemcpy(din[k], b.h_in, inB, cudaMemcpyHostToDevice));
    fxFillVerifyInputs(b.h_p, b.h_ai, b.h_al, b.h_lp, tp, rank, pad, n, 10 + k);
    GT_CUDA(cudaMemcpy(dv[k], b.h_p, reqs * n * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + reqs * n, b.h_ai, reqs * n * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + 2 * reqs * n, b.h_al, reqs * 4, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dv[k] + 2 * reqs * n + reqs, b.h_lp, reqs * n * 4,
                       cudaMemcpyHostToDevice));
  }
  if (gtUploadDone()) return 1;
  fxBarrier();
  const int64_t rows = (int64_t)pad * n, cols = vocab / tp;
  for (int k = 0; k < RA_STEPS; ++k) {
    void* o = NULL;
    int32_t *p = NULL, *ai = NULL, *al = NULL;
    float* lp = NULL;
    FX_CHECK_OK(dpsSwapBatchVocab(comm, din[k], rows, cols, dt, pad, &o, s));
    if (rank == slow) GT_CUDA(cudaLaunchHostFunc(s, sleep50ms, NULL));
    GT_CUDA(cudaMemcpyAsync(snap[k], o, outB, cudaMemcpyDeviceToDevice, s));
    int32_t* v = dv[k];
    FX_CHECK_OK(dpsGatherVerifyOutputs(comm, v, v + reqs * n, v + 2 * reqs * n, (int64_t)reqs, n,
                                       pad, &p, &ai, &al, s));
    if (rank == slow) GT_CUDA(cudaLaunchHostFunc(s, sleep50ms, NULL));
    GT_CUDA(cudaMemcpyAsync(sv[k], p, full * n * 4, cudaMemcpyDeviceToDevice, s));
    GT_CUDA(cudaMemcpyAsync(sv[k] + full * n, ai, full * n * 4, cudaMemcpyDeviceToDevice, s));
    GT_CUDA(cudaMemcpyAsync(sv[k] + 2 * full * n, al, full * 4, cudaMemcpyDeviceToDevice, s));
    FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, (const float*)(v + 2 * reqs * n + reqs),
                                        (int64_t)reqs, n, pad, &lp, s));
    if (rank == slow) GT_CUDA(cudaLaunchHostFunc(s, sleep50ms, NULL));
    GT_CUDA(cudaMemcpyAsync(sv[k] + 2 * full * n + full, lp, full * n * 4,
                            cudaMemcpyDeviceToDevice, s));
  }
  GT_CUDA(cudaStreamSynchronize(s));
  dpsResult_t ae;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
  FX_CHECK(ae == dpsSuccess, "async error %s: %s", dpsGetErrorString(ae), dpsGetLastError());
  for (int k = 0; k < RA_STEPS; ++k) {
    if (gtCheckSwapOut(&b, snap[k], rank, tp, pad, 10 + k)) {
      fprintf(stderr, "rank %d: run-ahead (slow rank %d) swap call %d wrong\n", rank, slow, k);
      return 1;
    }
    if (gtCheckVerifyOut(&b, sv[k], sv[k] + full * n, sv[k] + 2 * full * n, rank, pad, 10 + k) ||
        gtCheckLogprobsOut(&b, (const float*)(sv[k] + 2 * full * n + full), rank, pad, 10 + k)) {
      fprintf(stderr, "rank %d: run-ahead (slow rank %d) gather call %d wrong\n", rank, slow, k);
      return 1;
    }
  }
  for (int k = 0; k < RA_STEPS; ++k) {
    cudaFree(din[k]);
    cudaFree(snap[k]);
    cudaFree(dv[k]);
    cudaFree(sv[k]);
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int bodyRunAhead(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int slow = 0; slow < 2; ++slow) {
    /* LL swap path */
    int rc = runAhead(rank, tp, slow, 8, 2, (int64_t)tp * 32, dpsFloat32, s);
    if (rc) return rc;
    /* direct swap path (per-peer chunk >= 512 KiB), larger gathers */
    rc = runAhead(rank, tp, slow, 64, 4, (int64_t)tp * 8192, dpsBfloat16, s);
    if (rc) return rc;
  }
  cudaStreamDestroy(s);
  return 0;
}

/* ---- graph capture and replay -------------------------------------------------- */
static int graphCase(int rank, int tp, int pad, int n, int64_t vocab, dpsDataType_t dt,
                     cudaStream_t s) {
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dt, dpsBackendOnesided);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dt, 0)) return 1;
  const int64_t rows = (int64_t)pad * n, cols = vocab / tp, reqs = pad / tp;
  /* warm-up, eager */
  for (int i = 0; i < 3; ++i) {
    if (gtSwapChecked(comm, &b, rank, tp, pad, 100 + i, s, NULL)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, pad, 100 + i, s, NULL, NULL)) return 1;
  }
  fxBarrier();
  void* o = NULL;
  int32_t *p = NULL, *ai = NULL, *al = NULL;
  float* lp = NULL;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, pad, &o, s));
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, pad, &p, &ai, &al, s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n, pad, &lp, s));
  GT_CUDA(cudaStreamEndCapture(s, &graph));
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  fxBarrier();
  for (int step = 1; step <= 5; ++step) {
    if (gtUploadSwap(&b, rank, tp, pad, step) || gtUploadVerify(&b, rank, tp, pad, step)) return 1;
    GT_CUDA(cudaGraphLaunch(exec, s));
    GT_CUDA(cudaStreamSynchronize(s));
    if (gtCheckSwapOut(&b, o, rank, tp, pad, step) ||
        gtCheckVerifyOut(&b, p, ai, al, rank, pad, step) ||
        gtCheckLogprobsOut(&b, lp, rank, pad, step)) {
      fprintf(stderr, "rank %d: graph replay step %d wrong\n", rank, step);
      return 1;
    }
    /* an eager call between replays (epochs shared with the graph) */
    if (gtSwapChecked(comm, &b, rank, tp, pad, 200 + step, s, NULL)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, pad, 200 + step, s, NULL, NULL)) return 1;
  }
  /* back-to-back replays, then the last inputs */
  if (gtUploadSwap(&b, rank, tp, pad, 42) || gtUploadVerify(&b, rank, tp, pad, 42)) return 1;
  for (int i = 0; i < 20; ++i) GT_CUDA(cudaGraphLaunch(exec, s));
  GT_CUDA(cudaStreamSynchronize(s));
  if (gtCheckSwapOut(&b, o, rank, tp, pad, 42) || gtCheckVerifyOut(&b, p, ai, al, rank, pad, 42) ||
      gtCheckLogprobsOut(&b, lp, rank, pad, 42))
    return 1;
  dpsResult_t ae;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
  FX_CHECK(ae == dpsSuccess, "async error %s", dpsGetErrorString(ae));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int bodyGraph(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc = graphCase(rank, tp, 8 < tp ? tp : 8, 2, 64, dpsFloat32, s); /* spec, LL swap */
  if (rc) return rc;
  rc = graphCase(rank, tp, 64, 4, (int64_t)tp * 8192, dpsBfloat16, s); /* direct swap */
  if (rc) return rc;
  cudaStreamDestroy(s);
  return 0;
}

/* ---- timeout ---------------------------------------------------------------------- */
enum { TO_SWAP_LL, TO_SWAP_DIRECT, TO_GATHER, TO_LOGPROBS, TO_COUNT };
static const char* kToNames[TO_COUNT] = {"swap (LL)", "swap (direct)", "gather_verify_outputs",
                                         "gather_verify_logprobs"};

static dpsResult_t toCall(dpsComm_t comm, gtBufs* b, int which, int pad, int tp,
                          cudaStream_t s) {
  void* o;
  int32_t *p, *ai, *al;
  float* lp;
  const int64_t reqs = pad / tp;
  switch (which) {
    case TO_SWAP_LL:
    case TO_SWAP_DIRECT:
      return dpsSwapBatchVocab(comm, b->d_in, (int64_t)pad * b->n, b->vocab / tp, b->dtype, pad,
                               &o, s);
    case TO_GATHER:
      return dpsGatherVerifyOutputs(comm, b->d_p, b->d_ai, b->d_al, reqs, b->n, pad, &p, &ai, &al,
                                    s);
    default: return dpsGatherVerifyLogprobs(comm, b->d_lp, reqs, b->n, pad, &lp, s);
  }
}

static int bodyTimeout(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  FX_CHECK(tp == 2, "timeout test runs on 2 ranks");
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int timeout_ms = 500;
  for (int which = 0; which < TO_COUNT; ++which) {
    const int pad = 16, n = 2;
    /* LL: 8 KiB per peer; direct: forced by a zero LL threshold */
    const int64_t vocab = which == TO_SWAP_DIRECT ? 2 * 8192 : 2 * 128;
    dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsBfloat16, dpsBackendOnesided);
    cfg.timeout_ms = timeout_ms;
    dpsUniqueId id;
    FX_CHECK(fxShareUniqueId(&id) == 0, "fxShareUniqueId");
    if (which == TO_SWAP_DIRECT) setenv("DPSAMPLING_ONESIDED_LL_BYTES", "0", 1);
    dpsComm_t comm = NULL;
    dpsResult_t r = dpsCommInitRank(&comm, &id, &cfg);
    unsetenv("DPSAMPLING_ONESIDED_LL_BYTES");
    if (r == dpsUnavailable) return 77;
    FX_CHECK(r == dpsSuccess, "dpsCommInitRank: %s", dpsGetLastError());
    gtBufs b;
    if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
    if (gtUploadSwap(&b, rank, tp, pad, 1) || gtUploadVerify(&b, rank, tp, pad, 1)) return 1;
    /* one healthy round first */
    if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL)) return 1;
    fxBarrier();
    dpsResult_t ae = dpsSuccess;
    if (rank == 0) {
      const double t0 = nowS();
      FX_CHECK_OK(toCall(comm, &b, which, pad, tp, s));
      GT_CUDA(cudaStreamSynchronize(s));
      const double dt = nowS() - t0;
      FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
      FX_CHECK(ae == dpsTimeout, "%s: async error %s after %.3f s", kToNames[which],
               dpsGetErrorString(ae), dt);
      FX_CHECK(strstr(dpsGetLastError(), "rank 1") != NULL, "%s: message \"%s\" lacks rank 1",
               kToNames[which], dpsGetLastError());
      FX_CHECK(dt >= 0.8 * timeout_ms / 1000.0 && dt <= 2.0 * timeout_ms / 1000.0,
               "%s: the call took %.3f s with timeout %d ms", kToNames[which], dt, timeout_ms);
      printf("  rank 0: %s timed out after %.3f s: %s\n", kToNames[which], dt, dpsGetLastError());
      /* sticky: the next call fails at once, every operation */
      FX_CHECK_ERR(toCall(comm, &b, which, pad, tp, s), dpsTimeout, "rank 1");
      FX_CHECK_ERR(toCall(comm, &b, (which + 2) % TO_COUNT, pad, tp, s), dpsTimeout, "rank 1");
      GT_CUDA(cudaStreamSynchronize(s));
      fxBarrier(); /* let rank 1 run its calls */
    } else {
      fxBarrier(); /* rank 0 is done: now rank 1 calls and times out as well */
      for (int i = 0; i < 3 && ae == dpsSuccess; ++i) {
        r = toCall(comm, &b, which, pad, tp, s);
        FX_CHECK(r == dpsSuccess || r == dpsTimeout, "late call: %s", dpsGetLastError());
        GT_CUDA(cudaStreamSynchronize(s));
        FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
      }
      FX_CHECK(ae == dpsTimeout, "%s: rank 1 never timed out", kToNames[which]);
      /* rank 0 marked itself failed in rank 1's fail area: rank 1 stops on
       * that, not on its own timeout */
      FX_CHECK(strstr(dpsGetLastError(), "rank 0 gave up") != NULL,
               "message \"%s\" lacks \"rank 0 gave up\"", dpsGetLastError());
    }
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    gtFreeBufs(&b);
  }
  cudaStreamDestroy(s);
  return 0;
}

/* ---- a failure seen by one rank only ------------------------------------------------
 * (tp 2) timeout_ms=500. Rank 0 swaps alone and times out. Rank 1 then makes
 * one LL swap (rank 0's data had already landed, so it may well succeed)
 * and destroys at once, before rank 0 destroys: the destroy must return
 * (rank 1 learns of rank 0's failure from its fail area and skips the window
 * deregistration, as rank 0 does). alarm() turns a hang into a failure. */
static int bodyPeerFail(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  FX_CHECK(tp == 2, "peerfail runs on 2 ranks");
  alarm(60);
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int pad = 16, n = 2;
  const int64_t vocab = 2 * 128;
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsBfloat16, dpsBackendOnesided);
  cfg.timeout_ms = 500;
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL)) return 1;
  if (gtUploadSwap(&b, rank, tp, pad, 2)) return 1;
  fxBarrier();
  dpsResult_t ae = dpsSuccess;
  if (rank == 0) {
    FX_CHECK_OK(toCall(comm, &b, TO_SWAP_LL, pad, tp, s));
    GT_CUDA(cudaStreamSynchronize(s));
    FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
    FX_CHECK(ae == dpsTimeout, "rank 0: async error %s", dpsGetErrorString(ae));
    fxBarrier();
  } else {
    fxBarrier();
    const dpsResult_t r = toCall(comm, &b, TO_SWAP_LL, pad, tp, s);
    FX_CHECK(r == dpsSuccess || r == dpsTimeout, "late call: %s", dpsGetLastError());
    GT_CUDA(cudaStreamSynchronize(s));
  }
  /* Rank 1 (which saw no failure of its own) destroys first, while rank 0
   * is alive and waits: a destroy that waited for rank 0 would hang here
   * (alarm). Only then does rank 0 destroy. */
  if (rank == 0) fxBarrier();
  const double t0 = nowS();
  FX_CHECK_OK(dpsCommDestroy(comm));
  const double dt = nowS() - t0;
  printf("  rank %d: destroy after the failure took %.3f s\n", rank, dt);
  FX_CHECK(dt < 5.0, "rank %d: destroy took %.3f s", rank, dt);
  if (rank != 0) fxBarrier();
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  alarm(0);
  return 0;
}

/* ---- dtype fixed differently on the ranks ----------------------------------------------
 * dtype unset at creation; rank 0 prepares fp32, the others bf16: every rank
 * gets dpsInvalidUsage naming the disagreement (none proceeds with a swap
 * window of another size than its peers'), the communicator stays unprepared,
 * and a second, agreeing prepare works (checked swap + gather). */
static int bodyDtypeMismatch(int rank, int tp, dpsBackend_t backend) {
  (void)backend;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int pad = 8 < tp ? tp : 8, n = 2;
  const int64_t vocab = (int64_t)tp * 64;
  dpsConfig_t cfg = gtConfig(rank, tp, pad, n, vocab, dpsDtypeUnset, dpsBackendOnesided);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  FX_CHECK_ERR(dpsCommPrepare(comm, rank == 0 ? dpsFloat32 : dpsBfloat16), dpsInvalidUsage,
               "different logits dtypes");
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsDtypeUnset && info.initialized == 0, "dtype %s init %d",
           dpsDataTypeName(info.logits_dtype), info.initialized);
  FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  gtBufs b;
  if (gtAllocBufs(&b, tp, pad, n, vocab, dpsBfloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, pad, 1, s, NULL)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, pad, 1, s, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  cudaStreamDestroy(s);
  return 0;
}

/* ---- driver ------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  gtBody body;
  int only_tp2;
} osTest;

int main(int argc, char** argv) {
  const osTest tests[] = {
      {"shapes", bodyShapes, 0},     {"lazy", bodyLazy, 0},       {"runahead", bodyRunAhead, 0},
      {"graph", bodyGraph, 0},       {"timeout", bodyTimeout, 1},
      {"peerfail", bodyPeerFail, 1}, {"dtype", bodyDtypeMismatch, 0},
  };
  const int ngpu = fxGpuCount();
  if (ngpu < 2) {
    printf("test_gpu_onesided: SKIP: needs >= 2 GPUs, found %d\n", ngpu);
    return 77;
  }
  unsetenv("DPSAMPLING_BACKEND");
  unsetenv("TOKENSPEED_DP_SAMPLING_BACKEND");
  unsetenv("DPSAMPLING_ONESIDED_LL_BYTES");
  unsetenv("DPSAMPLING_TIMEOUT_MS");
  const char* only = argc > 1 ? argv[1] : NULL;
  int failures = 0, passes = 0, skips = 0;
  for (size_t t = 0; t < sizeof tests / sizeof tests[0]; ++t) {
    if (only && strcmp(only, tests[t].name) != 0) continue;
    const int tps[3] = {2, 4, 8};
    for (int i = 0; i < 3; ++i) {
      const int tp = tps[i];
      if (tp > ngpu || (tests[t].only_tp2 && tp != 2)) continue;
      gtRunArg arg = {tests[t].body, dpsBackendOnesided};
      printf("test_gpu_onesided: %s tp=%d ...\n", tests[t].name, tp);
      fflush(stdout);
      const double t0 = nowS();
      const int rc = fxRunRanks(tp, gtRankMain, &arg, OS_TIMEOUT_S);
      const char* verdict = rc == 0 ? "PASS" : rc == 77 ? "SKIPPED (onesided unavailable)" : "FAIL";
      printf("test_gpu_onesided: %s tp=%d %s (%.1f s)\n", tests[t].name, tp, verdict,
             nowS() - t0);
      fflush(stdout);
      if (rc == 0) ++passes;
      else if (rc == 77) ++skips;
      else ++failures;
    }
  }
  if (failures) return 1;
  if (passes == 0) {
    printf("test_gpu_onesided: SKIP: nothing ran (%d skipped)\n", skips);
    return 77;
  }
  return 0;
}
