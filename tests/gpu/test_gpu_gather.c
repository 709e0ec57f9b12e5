/* gather_verify_outputs / gather_verify_logprobs on 1..8 GPUs, every backend:
 * the spec cases (pad_bs 8, N 1 and 4; persistent buffers with N 2), a sweep
 * of pad_bs 8..512 (changing between calls on one communicator sized for 512)
 * for N 1..8 and of pad_bs up to 4096 (N 8) with every value checked and output pointers identical across
 * calls, gathers before any swap (dtype fixed by prepare, or for nccl never),
 * and (nccl) a counting replacement all_gather proving exactly one all-gather
 * per gather_verify_outputs call, with correct values, and NCCL restored by a
 * NULL table. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_common.h"

static int specCases(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  const int ns[2] = {1, 4};
  for (int i = 0; i < 2; ++i) {
    dpsConfig_t cfg = gtConfig(rank, tp, 8, ns[i], tp * 4, dpsBfloat16, backend);
    dpsComm_t comm;
    int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    gtBufs b;
    if (gtAllocBufs(&b, tp, 8, ns[i], tp * 4, dpsBfloat16, 0)) return 1;
    if (gtGatherChecked(comm, &b, rank, tp, 8, 1 + i, s, NULL, NULL)) return 1;
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    gtFreeBufs(&b);
  }
  /* Persistent buffer reuse (spec: pad_bs 8, N 2). */
  dpsConfig_t cfg = gtConfig(rank, tp, 8, 2, tp * 4, dpsBfloat16, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, 8, 2, tp * 4, dpsBfloat16, 0)) return 1;
  int32_t* o1[3];
  int32_t* o2[3];
  float *l1, *l2;
  if (gtGatherChecked(comm, &b, rank, tp, 8, 3, s, o1, &l1)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, 8, 4, s, o2, &l2)) return 1;
  for (int k = 0; k < 3; ++k) FX_CHECK(o1[k] == o2[k], "output %d moved", k);
  FX_CHECK(l1 == l2, "logprobs output moved");
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

/* One communicator sized for max_pad, calls at each of pads[] (those
 * divisible by tp), every value checked, output pointers fixed. */
static int sweepComm(int rank, int tp, dpsBackend_t backend, cudaStream_t s, int max_pad, int n,
                     const int* pads, size_t npads) {
  /* Odd N: dtype known at creation; even N: fixed later by prepare. */
  const dpsDataType_t dt = (n % 2) ? dpsBfloat16 : dpsDtypeUnset;
  dpsConfig_t cfg = gtConfig(rank, tp, max_pad, n, tp * 4, dt, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  if (dt == dpsDtypeUnset) FX_CHECK_OK(dpsCommPrepare(comm, dpsFloat16));
  gtBufs b;
  if (gtAllocBufs(&b, tp, max_pad, n, tp * 4, dpsBfloat16, 0)) return 1;
  int32_t* first[3] = {NULL, NULL, NULL};
  float* first_lp = NULL;
  for (size_t i = 0; i < npads; ++i) {
    if (pads[i] % tp) continue;
    int32_t* o[3];
    float* lp;
    if (gtGatherChecked(comm, &b, rank, tp, pads[i], 100 * n + (int)i, s, o, &lp)) {
      fprintf(stderr, "rank %d: sweep max_pad_bs=%d N=%d pad_bs=%d failed\n", rank, max_pad, n,
              pads[i]);
      return 1;
    }
    if (first_lp == NULL) {
      memcpy(first, o, sizeof first);
      first_lp = lp;
    }
    for (int k = 0; k < 3; ++k) FX_CHECK(o[k] == first[k], "output %d moved", k);
    FX_CHECK(lp == first_lp, "logprobs output moved");
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int sweep(int rank, int tp, dpsBackend_t backend, cudaStream_t s) {
  const int pads[] = {8, 16, 24, 64, 128, 256, 512, 40, 8, 512};
  for (int n = 1; n <= 8; ++n) {
    int rc = sweepComm(rank, tp, backend, s, 512, n, pads, sizeof pads / sizeof pads[0]);
    if (rc) return rc;
  }
  /* A large capacity: with 32-thread blocks (DPSAMPLING_ONESIDED_GATHER_THREADS=32,
   * which ctest also runs, with either protocol) the onesided gathers' grid
   * hits its 64-block cap, so every block loops over several lines (both
   * gathers at tp 2 and 4); with the default 256 threads the LL outputs
   * gather loops at tp 2. */
  const int big[] = {4096, 8, 1000, 4096};
  return sweepComm(rank, tp, backend, s, 4096, 8, big, sizeof big / sizeof big[0]);
}

/* nccl only: the verify gather is not the place where an engine's gather may
 * run more than once. */
static int countingAllGather(int rank, int tp, cudaStream_t s) {
  const int cases[3][2] = {{8, 1}, {8, 4}, {512, 8}};
  for (int c = 0; c < 3; ++c) {
    const int pad = cases[c][0], n = cases[c][1];
    dpsConfig_t cfg = gtConfig(rank, tp, pad, n, tp * 4, dpsBfloat16, dpsBackendNccl);
    dpsComm_t comm;
    int rc = gtCreate(&comm, &cfg);
    if (rc) return rc;
    gtBufs b;
    if (gtAllocBufs(&b, tp, pad, n, tp * 4, dpsBfloat16, 0)) return 1;
    gtCounter cnt;
    if (gtInitCounter(&cnt, tp)) return 1;
    dpsCollectives_t table = {&cnt, gtCountingAllGather, gtCountingAllToAll};
    FX_CHECK_OK(dpsCommSetCollectives(comm, &table));
    for (int rep = 0; rep < 3; ++rep) {
      if (gtUploadVerify(&b, rank, tp, pad, 40 + rep)) return 1;
      int32_t *p, *ai, *al;
      float* lp;
      const int before = cnt.all_gathers;
      FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b.d_p, b.d_ai, b.d_al, pad / tp, n, pad, &p, &ai,
                                         &al, s));
      FX_CHECK(cnt.all_gathers == before + 1,
               "expected 1 all_gather call per gather_verify_outputs, got %d",
               cnt.all_gathers - before);
      FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b.d_lp, pad / tp, n, pad, &lp, s));
      FX_CHECK(cnt.all_gathers == before + 2, "logprobs: %d all_gather calls",
               cnt.all_gathers - before - 1);
      FX_CHECK(cnt.all_to_alls == 0, "gather used all_to_all");
      GT_CUDA(cudaStreamSynchronize(s));
      if (gtCheckVerifyOut(&b, p, ai, al, rank, pad, 40 + rep)) return 1;
      if (gtCheckLogprobsOut(&b, lp, rank, pad, 40 + rep)) return 1;
    }
    /* A table whose all_gather is NULL, then a NULL table: back to NCCL. */
    dpsCollectives_t only_a2a = {&cnt, NULL, gtCountingAllToAll};
    FX_CHECK_OK(dpsCommSetCollectives(comm, &only_a2a));
    const int before = cnt.all_gathers;
    if (gtGatherChecked(comm, &b, rank, tp, pad, 50, s, NULL, NULL)) return 1;
    FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
    if (gtGatherChecked(comm, &b, rank, tp, pad, 51, s, NULL, NULL)) return 1;
    FX_CHECK(cnt.all_gathers == before, "replacement used after removal (%d)",
             cnt.all_gathers - before);
    fxBarrier();
    FX_CHECK_OK(dpsCommDestroy(comm));
    gtFreeBufs(&b);
  }
  return 0;
}

/* nccl: gathers work before the dtype is known (no prepare, no swap). */
static int gatherBeforeDtype(int rank, int tp, cudaStream_t s) {
  dpsConfig_t cfg = gtConfig(rank, tp, 16, 3, tp * 4, dpsDtypeUnset, dpsBackendNccl);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  dpsCommInfo_t info;
  FX_CHECK_OK(dpsCommGetInfo(comm, &info));
  FX_CHECK(info.logits_dtype == dpsDtypeUnset && info.initialized == 0, "dtype %s init %d",
           dpsDataTypeName(info.logits_dtype), info.initialized);
  gtBufs b;
  if (gtAllocBufs(&b, tp, 16, 3, tp * 4, dpsBfloat16, 0)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, 16, 60, s, NULL, NULL)) return 1;
  if (gtGatherChecked(comm, &b, rank, tp, tp, 61, s, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int body(int rank, int tp, dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc = specCases(rank, tp, backend, s);
  if (rc) return rc;
  if ((rc = sweep(rank, tp, backend, s))) return rc;
  if (backend == dpsBackendNccl) {
    if ((rc = countingAllGather(rank, tp, s))) return rc;
    if ((rc = gatherBeforeDtype(rank, tp, s))) return rc;
  }
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

/* tp = 1 too: there the nccl backend's gathers are one copy kernel instead
 * of NCCL's one-rank all-gather (an installed all_gather is still called,
 * once per call: countingAllGather). */
int main(int argc, char** argv) {
  static const int tps[4] = {1, 2, 4, 8};
  return gtMainTps(argc, argv, "test_gpu_gather", body, 300, tps, 4);
}
