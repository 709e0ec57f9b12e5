/* Communicator lifecycle on 2..8 GPUs, every backend: both bootstrap paths
 * (dpsGetUniqueId + dpsCommInitRank via fxShareUniqueId; dpsCommInitFromNccl
 * over a borrowed NCCL communicator that stays usable after destroy), info,
 * dtype fixing (prepare, first swap, prepare after swap keeps the dtype, swap
 * with another dtype -> dpsInvalidUsage, first swap inside capture ->
 * dpsInvalidUsage), argument validation on a live communicator (bad pad_bs,
 * rows, cols, reqs, n, NULLs, dtype) writing nothing (out-parameters and
 * device buffers unchanged), the caller's current device restored, two
 * communicators used interleaved, and no asynchronous error after all that. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_common.h"

static int bootstrapUniqueId(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  dpsUniqueId id;
  FX_CHECK(fxShareUniqueId(&id) == 0, "fxShareUniqueId");
  dpsConfig_t cfg = gtConfig(rank, tp, 16, 2, 96 * tp, dpsBfloat16, backend);
  dpsComm_t comm = NULL;
  dpsResult_t r = dpsCommInitRank(&comm, &id, &cfg);
  if (r == dpsUnavailable) {
    if (rank == 0) printf("  dpsCommInitRank: %s unavailable: %s\n", dpsBackendName(backend),
                          dpsGetLastError());
    return 77;
  }
  FX_CHECK_OK(r);
  if (gtCheckInfo(comm, &cfg)) return 1;
  gtBufs b;
  if (gtAllocBufs(&b, tp, 16, 2, 96 * tp, dpsBfloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, 16, 1, s, NULL)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, 16, 2, s, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  /* A second communicator from a fresh id. */
  FX_CHECK(fxShareUniqueId(&id) == 0, "fxShareUniqueId");
  cfg.cuda_device = -1; /* the current device (= rank in the fixture) */
  FX_CHECK_OK(dpsCommInitRank(&comm, &id, &cfg));
  {
    dpsCommInfo_t info;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.cuda_device == rank, "cuda_device -1 resolved to %d", info.cuda_device);
  }
  if (gtSwapChecked(comm, &b, rank, tp, 2 * tp <= 16 ? 2 * tp : 16, 3, s, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int bootstrapBorrowed(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  dpsConfig_t cfg = gtConfig(rank, tp, 8, 1, 64, dpsFloat32, backend);
  gtBufs b;
  if (gtAllocBufs(&b, tp, 8, 1, 64, dpsFloat32, 0)) return 1;
  for (int round = 0; round < 2; ++round) {
    dpsComm_t comm;
    int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    if (gtSwapChecked(comm, &b, rank, tp, 8, 10 + round, s, NULL)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, 8, 10 + round, s, NULL, NULL)) return 1;
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
  }
  /* The borrowed NCCL communicator still works after two destroys. */
  ncclComm_t nc = (ncclComm_t)fxNcclComm();
  int* d;
  int h[8] = {0};
  GT_CUDA(cudaMalloc((void**)&d, sizeof(int) * 8));
  GT_CUDA(cudaMemset(d, 0, sizeof(int) * 8));
  GT_CUDA(cudaMemcpy(d, &rank, sizeof(int), cudaMemcpyHostToDevice));
  if (gtUploadDone()) return 1;
  FX_CHECK(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, nc, s) == ncclSuccess,
           "borrowed NCCL comm unusable after dpsCommDestroy");
  GT_CUDA(cudaStreamSynchronize(s));
  GT_CUDA(cudaMemcpy(h, d, sizeof(int), cudaMemcpyDeviceToHost));
  FX_CHECK(h[0] == tp * (tp - 1) / 2, "allreduce %d", h[0]);
  cudaFree(d);
  /* Wrong group description over the borrowed comm. */
  dpsComm_t bad = (dpsComm_t)&b;
  dpsConfig_t wrong = cfg;
  wrong.tp_size = tp == 2 ? 4 : 2;
  wrong.max_pad_bs = 8;
  wrong.vocab_size = 64;
  wrong.rank = rank % wrong.tp_size;
  FX_CHECK(dpsCommInitFromNccl(&bad, nc, &wrong) == dpsInvalidArgument, "tp mismatch accepted");
  FX_CHECK(strstr(dpsGetLastError(), "tp_size") != NULL, "message: %s", dpsGetLastError());
  FX_CHECK(bad == (dpsComm_t)&b, "comm written on failure");
  gtFreeBufs(&b);
  return 0;
}

static int dtypeLifecycle(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  const int max = 8;
  const int64_t vocab = 64 * tp;
  /* 1) unset -> prepare(bf16) -> prepare(fp32) keeps bf16 -> fp32 swap refused. */
  dpsConfig_t cfg = gtConfig(rank, tp, max, 4, vocab, dpsDtypeUnset, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsDtypeUnset && info.initialized == 0, "dtype %s init %d",
           dpsDataTypeName(info.logits_dtype), info.initialized);
  /* A swap inside graph capture cannot fix the dtype (it would allocate). */
  {
    gtBufs bb;
    if (gtAllocBufs(&bb, tp, max, 4, vocab, dpsBfloat16, 0)) return 1;
    void* out = (void*)&bb;
    GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    dpsResult_t r = dpsSwapBatchVocab(comm, bb.d_in, (int64_t)max * 4, vocab / tp, dpsBfloat16,
                                      max, &out, s);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    FX_CHECK(r == dpsInvalidUsage, "first swap in capture -> %s: %s", dpsGetErrorString(r),
             dpsGetLastError());
    FX_CHECK(strstr(dpsGetLastError(), "dpsCommPrepare") != NULL, "message: %s",
             dpsGetLastError());
    FX_CHECK(out == (void*)&bb, "output written on failure");
    FX_CHECK(e == cudaSuccess, "capture broken by the failed call: %s", cudaGetErrorString(e));
    gtFreeBufs(&bb);
  }
  FX_CHECK_OK(dpsCommPrepare(comm, dpsBfloat16));
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsBfloat16 && info.initialized == 1, "after prepare: %s %d",
           dpsDataTypeName(info.logits_dtype), info.initialized);
  FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32)); /* no-op: keeps bf16 */
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsBfloat16, "prepare changed dtype to %s",
           dpsDataTypeName(info.logits_dtype));
  FX_CHECK_ERR(dpsCommPrepare(comm, (dpsDataType_t)11), dpsInvalidArgument, "dtype");
  gtBufs b;
  if (gtAllocBufs(&b, tp, max, 4, vocab, dpsBfloat16, 0)) return 1;
  void* out0;
  if (gtSwapChecked(comm, &b, rank, tp, max, 20, s, &out0)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, max, 20, s, NULL, NULL)) return 1;
  void* out = (void*)&b;
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, (int64_t)max * 4, vocab / tp, dpsFloat32, max,
                                 &out, s),
               dpsInvalidUsage, "bf16");
  FX_CHECK(out == (void*)&b, "output written on failure");
  /* Verify gathers after prepare(fp32) still reuse the bf16 state (spec). */
  if (gtGatherChecked(comm, &b, rank, tp, max, 21, s, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);

  /* 2) unset -> the first swap (fp16) fixes the dtype; bf16 is then refused. */
  rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  if (gtAllocBufs(&b, tp, max, 4, vocab, dpsFloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, max, 22, s, NULL)) return 1;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsFloat16 && info.initialized == 1, "first swap: %s %d",
           dpsDataTypeName(info.logits_dtype), info.initialized);
  FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat32));
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, (int64_t)max * 4, vocab / tp, dpsBfloat16, max,
                                 &out, s),
               dpsInvalidUsage, "fp16");
  if (gtSwapChecked(comm, &b, rank, tp, tp, 23, s, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

/* Snapshot of a device buffer. */
static int snap(void* host, const void* dev, size_t bytes) {
  GT_CUDA(cudaDeviceSynchronize());
  GT_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
}

static int validation(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  const int max = 4 * tp, n = 2;
  const int64_t vocab = 128 * tp, cols = vocab / tp;
  const dpsDataType_t dt = dpsBfloat16;
  dpsConfig_t cfg = gtConfig(rank, tp, max, n, vocab, dt, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, max, n, vocab, dt, 0)) return 1;
  void* swap_out;
  int32_t* outs[3];
  float* lp_out;
  if (gtSwapChecked(comm, &b, rank, tp, max, 30, s, &swap_out)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, max, 30, s, outs, &lp_out)) return 1;
  const size_t out_bytes = gtOutBytes(&b, tp, max);
  unsigned char* before = (unsigned char*)malloc(out_bytes);
  unsigned char* after = (unsigned char*)malloc(out_bytes);
  int32_t* vb = (int32_t*)malloc((size_t)max * n * 4 * 3 + (size_t)max * 4);
  int32_t* va = (int32_t*)malloc((size_t)max * n * 4 * 3 + (size_t)max * 4);
  FX_CHECK(before && after && vb && va, "malloc");
  if (snap(before, swap_out, out_bytes)) return 1;
  if (snap(vb, outs[0], (size_t)max * n * 4) || snap(vb + max * n, outs[1], (size_t)max * n * 4) ||
      snap(vb + 2 * max * n, outs[2], (size_t)max * 4) ||
      snap(vb + 2 * max * n + max, lp_out, (size_t)max * n * 4))
    return 1;
  /* New inputs on the device: any call that ran would change the outputs. */
  if (gtUploadSwap(&b, rank, tp, max, 31) || gtUploadVerify(&b, rank, tp, max, 31)) return 1;

  void* const sent = (void*)&b;
  void* o = sent;
  const int64_t rows = (int64_t)max * n;
  /* swap */
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, max + tp, &o, s),
               dpsInvalidArgument, "pad_bs");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, 0, &o, s), dpsInvalidArgument,
               "pad_bs=0");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, -tp, &o, s), dpsInvalidArgument,
               "pad_bs");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, tp + 1, &o, s),
               dpsInvalidArgument, "pad_bs");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows + 1, cols, dt, max, &o, s),
               dpsInvalidArgument, "local_logits");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows - n, cols, dt, max, &o, s),
               dpsInvalidArgument, "local_logits");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols + 1, dt, max, &o, s),
               dpsInvalidArgument, "local_logits");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, vocab, dt, max, &o, s), dpsInvalidArgument,
               "local_logits");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, NULL, rows, cols, dt, max, &o, s), dpsInvalidArgument,
               "local_logits");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, max, NULL, s), dpsInvalidArgument,
               "output");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, (dpsDataType_t)5, max, &o, s),
               dpsInvalidArgument, "dtype");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dpsDtypeUnset, max, &o, s),
               dpsInvalidArgument, "dtype");
  FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dpsFloat16, max, &o, s),
               dpsInvalidUsage, "bf16");
  /* a stream of another device */
  {
    int here = -1, ndev = 0;
    GT_CUDA(cudaGetDevice(&here));
    GT_CUDA(cudaGetDeviceCount(&ndev));
    const int other = (here + 1) % ndev;
    if (other != here) {
      cudaStream_t os;
      GT_CUDA(cudaSetDevice(other));
      GT_CUDA(cudaStreamCreateWithFlags(&os, cudaStreamNonBlocking));
      GT_CUDA(cudaSetDevice(here));
      FX_CHECK_ERR(dpsSwapBatchVocab(comm, b.d_in, rows, cols, dt, max, &o, os),
                   dpsInvalidArgument, "belongs to CUDA device");
      int32_t *xp = NULL, *xai = NULL, *xal = NULL;
      float* xlp = NULL;
      FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, max / tp, n, max, &xp,
                                          &xai, &xal, os),
                   dpsInvalidArgument, "belongs to CUDA device");
      FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, max / tp, n, max, &xlp, os),
                   dpsInvalidArgument, "belongs to CUDA device");
      FX_CHECK(xp == NULL && xai == NULL && xal == NULL && xlp == NULL,
               "outputs written on failure");
      GT_CUDA(cudaSetDevice(other));
      GT_CUDA(cudaStreamDestroy(os));
      GT_CUDA(cudaSetDevice(here));
    }
  }
  FX_CHECK(o == sent, "swap output written on failure");
  /* gather_verify_outputs */
  int32_t *p = (int32_t*)sent, *ai = (int32_t*)sent, *al = (int32_t*)sent;
  const int64_t reqs = max / tp;
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, max + tp, &p, &ai,
                                      &al, s),
               dpsInvalidArgument, "pad_bs");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, tp + 1, &p, &ai, &al,
                                      s),
               dpsInvalidArgument, "pad_bs");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs + 1, n, max, &p, &ai,
                                      &al, s),
               dpsInvalidArgument, "predict");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n + 1, max, &p, &ai,
                                      &al, s),
               dpsInvalidArgument, "predict");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, NULL, b.d_ai, b.d_al, reqs, n, max, &p, &ai, &al, s),
               dpsInvalidArgument, "predict");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, NULL, b.d_al, reqs, n, max, &p, &ai, &al, s),
               dpsInvalidArgument, "accept_index");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, NULL, reqs, n, max, &p, &ai, &al, s),
               dpsInvalidArgument, "accept_length");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, max, NULL, &ai, &al,
                                      s),
               dpsInvalidArgument, "predict_out");
  FX_CHECK_ERR(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, reqs, n, max, &p, &ai, NULL,
                                      s),
               dpsInvalidArgument, "accept_length_out");
  FX_CHECK(p == (int32_t*)sent && ai == (int32_t*)sent && al == (int32_t*)sent,
           "gather outputs written on failure");
  /* gather_verify_logprobs */
  float* lp = (float*)sent;
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n, max + tp, &lp, s),
               dpsInvalidArgument, "pad_bs");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs - 1 + (reqs == 1 ? 2 : 0), n, max, &lp,
                                       s),
               dpsInvalidArgument, "logprobs");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n - 1, max, &lp, s),
               dpsInvalidArgument, "logprobs");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, NULL, reqs, n, max, &lp, s), dpsInvalidArgument,
               "logprobs");
  FX_CHECK_ERR(dpsGatherVerifyLogprobs(comm, b.d_lp, reqs, n, max, NULL, s), dpsInvalidArgument,
               "output");
  FX_CHECK(lp == (float*)sent, "logprobs output written on failure");

  /* Nothing ran: device outputs unchanged. */
  if (snap(after, swap_out, out_bytes)) return 1;
  FX_CHECK(memcmp(before, after, out_bytes) == 0, "swap output changed by failing calls");
  if (snap(va, outs[0], (size_t)max * n * 4) || snap(va + max * n, outs[1], (size_t)max * n * 4) ||
      snap(va + 2 * max * n, outs[2], (size_t)max * 4) ||
      snap(va + 2 * max * n + max, lp_out, (size_t)max * n * 4))
    return 1;
  FX_CHECK(memcmp(vb, va, (size_t)max * n * 4 * 3 + (size_t)max * 4) == 0,
           "verify outputs changed by failing calls");
  /* And the communicator is still healthy. */
  dpsResult_t ae = dpsInternalError;
  FX_CHECK_OK(dpsCommGetAsyncError(comm, &ae));
  FX_CHECK(ae == dpsSuccess, "async error %s", dpsGetErrorString(ae));
  fxBarrier();
  if (gtSwapChecked(comm, &b, rank, tp, max, 32, s, NULL)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, max, 32, s, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  free(before); free(after); free(vb); free(va);
  return 0;
}

/* Calls switch to the communicator's device and restore the caller's. */
static int deviceRestore(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  const int ngpu = fxGpuCount();
  dpsConfig_t cfg = gtConfig(rank, tp, 2 * tp, 2, 32 * tp, dpsFloat32, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, 2 * tp, 2, 32 * tp, dpsFloat32, 0)) return 1;
  if (gtUploadSwap(&b, rank, tp, 2 * tp, 40)) return 1;
  if (gtUploadVerify(&b, rank, tp, 2 * tp, 40)) return 1;
  const int other = (rank + 1) % ngpu;
  GT_CUDA(cudaSetDevice(other));
  void* so;
  int32_t *p, *ai, *al;
  float* lp;
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b.d_in, (int64_t)2 * tp * 2, 32, dpsFloat32, 2 * tp, &so, s));
  int cur = -1;
  GT_CUDA(cudaGetDevice(&cur));
  FX_CHECK(cur == other, "swap left device %d current, caller had %d", cur, other);
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, 2, 2, 2 * tp, &p, &ai, &al, s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b.d_lp, 2, 2, 2 * tp, &lp, s));
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  GT_CUDA(cudaGetDevice(&cur));
  FX_CHECK(cur == other, "gathers left device %d current, caller had %d", cur, other);
  GT_CUDA(cudaSetDevice(rank));
  GT_CUDA(cudaStreamSynchronize(s));
  if (gtCheckSwapOut(&b, so, rank, tp, 2 * tp, 40)) return 1;
  if (gtCheckVerifyOut(&b, p, ai, al, rank, 2 * tp, 40)) return 1;
  if (gtCheckLogprobsOut(&b, lp, rank, 2 * tp, 40)) return 1;
  /* The default streams name the current device's: with another device
   * current, the guard makes them the communicator's (the library asks no
   * stream query for them), runs there and restores the caller's device. */
  const cudaStream_t defaults[2] = {NULL, cudaStreamPerThread};
  for (int d = 0; d < 2; ++d) {
    GT_CUDA(cudaSetDevice(rank));
    GT_CUDA(cudaMemsetAsync(so, 0, (size_t)2 * 2 * tp * 32 * 4, s)); /* the output, cleared */
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaSetDevice(other));
    void* so2 = NULL;
    FX_CHECK_OK(dpsSwapBatchVocab(comm, b.d_in, (int64_t)2 * tp * 2, 32, dpsFloat32, 2 * tp, &so2,
                                  defaults[d]));
    GT_CUDA(cudaGetDevice(&cur));
    FX_CHECK(cur == other, "swap on default stream %d left device %d current, caller had %d", d,
             cur, other);
    FX_CHECK(so2 == so, "the swap output moved");
    GT_CUDA(cudaSetDevice(rank));
    GT_CUDA(cudaDeviceSynchronize());
    if (gtCheckSwapOut(&b, so, rank, tp, 2 * tp, 40)) return 1;
  }
  fxBarrier();
  GT_CUDA(cudaSetDevice(other));
  FX_CHECK_OK(dpsCommDestroy(comm));
  GT_CUDA(cudaGetDevice(&cur));
  FX_CHECK(cur == other, "destroy left device %d current", cur);
  GT_CUDA(cudaSetDevice(rank));
  gtFreeBufs(&b);
  return 0;
}

/* Two communicators of different shapes used interleaved. */
static int twoComms(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  dpsConfig_t ca = gtConfig(rank, tp, 8 * tp, 1, 300 * tp, dpsBfloat16, backend);
  dpsConfig_t cb = gtConfig(rank, tp, 4 * tp, 4, 77 * tp, dpsFloat32, backend);
  dpsComm_t a, bc;
  int rc = gtCreate(&a, &ca);
  if (rc) return rc;
  if ((rc = gtCreate(&bc, &cb))) return rc;
  gtBufs ba, bb;
  if (gtAllocBufs(&ba, tp, 8 * tp, 1, 300 * tp, dpsBfloat16, 0)) return 1;
  if (gtAllocBufs(&bb, tp, 4 * tp, 4, 77 * tp, dpsFloat32, 0)) return 1;
  void *oa = NULL, *ob = NULL;
  for (int i = 0; i < 3; ++i) {
    if (gtSwapChecked(a, &ba, rank, tp, 8 * tp, 50 + i, s, &oa)) return 1;
    if (gtSwapChecked(bc, &bb, rank, tp, 4 * tp, 60 + i, s, &ob)) return 1;
    FX_CHECK(oa != ob, "two communicators share an output buffer");
    if (gtGatherChecked(bc, &bb, rank, tp, 4 * tp, 70 + i, s, NULL, NULL)) return 1;
    if (gtGatherChecked(a, &ba, rank, tp, 8 * tp, 80 + i, s, NULL, NULL)) return 1;
  }
  /* a's swap output is still a's last result after b's calls. */
  if (gtCheckSwapOut(&ba, oa, rank, tp, 8 * tp, 52)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(bc));
  FX_CHECK_OK(dpsCommDestroy(a));
  gtFreeBufs(&ba);
  gtFreeBufs(&bb);
  return 0;
}

static int body(int rank, int tp, dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc;
  if ((rc = bootstrapUniqueId(rank, tp, backend, s))) return rc;
  if ((rc = bootstrapBorrowed(rank, tp, backend, s))) return rc;
  if ((rc = dtypeLifecycle(rank, tp, backend, s))) return rc;
  if ((rc = validation(rank, tp, backend, s))) return rc;
  if ((rc = deviceRestore(rank, tp, backend, s))) return rc;
  if ((rc = twoComms(rank, tp, backend, s))) return rc;
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char** argv) { return gtMain(argc, argv, "test_gpu_lifecycle", body, 300); }
