/* CUDA-graph capture of swap + gather_verify_outputs + gather_verify_logprobs
 * on 2..8 GPUs, every backend: warm-up outside capture, capture on a
 * non-blocking stream in global capture mode (any forbidden call fails the
 * capture), then 5 replays with new inputs copied into the same device
 * buffers between replays (every value checked against the host reference
 * for that step), interleaved with eager calls. Also two graphs with
 * different pad_bs on one communicator replayed alternately, the spec's
 * fp32 8x2x64 case, and (nccl) capture through counting replacement
 * collectives: called at capture only, replays still correct. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_common.h"

/* Enqueues the three operations for pad_bs (inputs already in b). */
static int enqueueStep(dpsComm_t comm, gtBufs* b, int tp, int pad_bs, cudaStream_t s,
                       void** swap_out, int32_t** outs, float** lp) {
  FX_CHECK_OK(dpsSwapBatchVocab(comm, b->d_in, (int64_t)pad_bs * b->n, b->vocab / tp, b->dtype,
                                pad_bs, swap_out, s));
  FX_CHECK_OK(dpsGatherVerifyOutputs(comm, b->d_p, b->d_ai, b->d_al, pad_bs / tp, b->n, pad_bs,
                                     &outs[0], &outs[1], &outs[2], s));
  FX_CHECK_OK(dpsGatherVerifyLogprobs(comm, b->d_lp, pad_bs / tp, b->n, pad_bs, lp, s));
  return 0;
}

static int upload(gtBufs* b, int rank, int tp, int pad_bs, int step) {
  if (gtUploadSwap(b, rank, tp, pad_bs, step)) return 1;
  if (gtUploadVerify(b, rank, tp, pad_bs, step)) return 1;
  return 0;
}

static int checkAll(gtBufs* b, int rank, int tp, int pad_bs, int step, void* swap_out,
                    int32_t** outs, float* lp) {
  if (gtCheckSwapOut(b, swap_out, rank, tp, pad_bs, step)) return 1;
  if (gtCheckVerifyOut(b, outs[0], outs[1], outs[2], rank, pad_bs, step)) return 1;
  if (gtCheckLogprobsOut(b, lp, rank, pad_bs, step)) return 1;
  return 0;
}

typedef struct {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int pad_bs;
  void* swap_out;
  int32_t* outs[3];
  float* lp;
} Captured;

static int capture(dpsComm_t comm, gtBufs* b, int tp, int pad_bs, cudaStream_t s, Captured* c) {
  memset(c, 0, sizeof *c);
  c->pad_bs = pad_bs;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int rc = enqueueStep(comm, b, tp, pad_bs, s, &c->swap_out, c->outs, &c->lp);
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (rc) {
    if (g) cudaGraphDestroy(g);
    return 1;
  }
  FX_CHECK(e == cudaSuccess && g != NULL, "capture failed: %s", cudaGetErrorString(e));
  c->graph = g;
  GT_CUDA(cudaGraphInstantiate(&c->exec, g, 0));
  return 0;
}

static void release(Captured* c) {
  if (c->exec) cudaGraphExecDestroy(c->exec);
  if (c->graph) cudaGraphDestroy(c->graph);
  memset(c, 0, sizeof *c);
}

/* Graphs for each pad_bs in pads (replayed round robin), 5 replays each. */
static int graphCase(int rank, int tp, dpsBackend_t backend, int max_pad_bs, int n, int64_t vocab,
                     dpsDataType_t dt, const int* pads, int npads, int with_counter, int base) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dpsConfig_t cfg = gtConfig(rank, tp, max_pad_bs, n, vocab, dt, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, max_pad_bs, n, vocab, dt, 0)) return 1;
  gtCounter cnt;
  if (with_counter) {
    if (gtInitCounter(&cnt, tp)) return 1;
    dpsCollectives_t table = {&cnt, gtCountingAllGather, gtCountingAllToAll};
    FX_CHECK_OK(dpsCommSetCollectives(comm, &table));
  }
  /* Warm-up outside capture, values checked. */
  for (int i = 0; i < npads; ++i)
    for (int w = 0; w < 3; ++w) {
      void* so;
      int32_t* o[3];
      float* lp;
      if (upload(&b, rank, tp, pads[i], base + w)) return 1;
      if (enqueueStep(comm, &b, tp, pads[i], s, &so, o, &lp)) return 1;
      GT_CUDA(cudaStreamSynchronize(s));
      if (checkAll(&b, rank, tp, pads[i], base + w, so, o, lp)) return 1;
    }
  fxBarrier();
  Captured g[4];
  for (int i = 0; i < npads; ++i) {
    if (upload(&b, rank, tp, pads[i], base)) return 1;
    const int before_ag = with_counter ? cnt.all_gathers : 0;
    const int before_a2a = with_counter ? cnt.all_to_alls : 0;
    if (capture(comm, &b, tp, pads[i], s, &g[i])) return 1;
    if (with_counter) {
      FX_CHECK(cnt.all_gathers == before_ag + 2 && cnt.all_to_alls == before_a2a + 1,
               "capture called all_gather %d and all_to_all %d times",
               cnt.all_gathers - before_ag, cnt.all_to_alls - before_a2a);
    }
  }
  GT_CUDA(cudaDeviceSynchronize());
  fxBarrier();
  const int counted_ag = with_counter ? cnt.all_gathers : 0;
  for (int step = 1; step <= 5; ++step)
    for (int i = 0; i < npads; ++i) {
      const int st = base + 100 * step + i;
      if (upload(&b, rank, tp, g[i].pad_bs, st)) return 1;
      GT_CUDA(cudaGraphLaunch(g[i].exec, s));
      GT_CUDA(cudaStreamSynchronize(s));
      if (checkAll(&b, rank, tp, g[i].pad_bs, st, g[i].swap_out, g[i].outs, g[i].lp)) {
        fprintf(stderr, "rank %d: graph replay %d (pad_bs %d) wrong\n", rank, step, g[i].pad_bs);
        return 1;
      }
      fxBarrier();
      /* Eager call in between: same buffers, same results for its inputs. */
      void* so;
      int32_t* o[3];
      float* lp;
      if (upload(&b, rank, tp, g[i].pad_bs, st + 50)) return 1;
      if (enqueueStep(comm, &b, tp, g[i].pad_bs, s, &so, o, &lp)) return 1;
      GT_CUDA(cudaStreamSynchronize(s));
      if (checkAll(&b, rank, tp, g[i].pad_bs, st + 50, so, o, lp)) return 1;
      FX_CHECK(so == g[i].swap_out && o[0] == g[i].outs[0] && o[1] == g[i].outs[1] &&
                   o[2] == g[i].outs[2] && lp == g[i].lp,
               "eager outputs differ from the captured ones");
      fxBarrier();
    }
  if (with_counter)
    FX_CHECK(cnt.all_gathers == counted_ag + 2 * 5 * npads, "replays called the host table?");
  for (int i = 0; i < npads; ++i) release(&g[i]);
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

static int body(int rank, int tp, dpsBackend_t backend) {
  int rc;
  /* The spec's case: fp32, pad_bs 8, N 2, vocab 64. */
  const int spec[1] = {8};
  if ((rc = graphCase(rank, tp, backend, 8, 2, 64, dpsFloat32, spec, 1, 0, 1000))) return rc;
  /* bf16 verify shape, two graphs (full and partial batch). */
  const int two[2] = {64, 16};
  if ((rc = graphCase(rank, tp, backend, 64, 4, 2048 * tp, dpsBfloat16, two, 2, 0, 2000)))
    return rc;
  /* fp16 with an odd vocab slice, three graphs. */
  int three[3] = {8 * tp, 2 * tp, tp};
  if ((rc = graphCase(rank, tp, backend, 8 * tp, 3, 1001 * tp, dpsFloat16, three, 3, 0, 3000)))
    return rc;
  if (backend == dpsBackendNccl) {
    if ((rc = graphCase(rank, tp, backend, 32, 2, 512 * tp, dpsBfloat16, two + 1, 1, 1, 4000)))
      return rc;
  }
  return 0;
}

int main(int argc, char** argv) { return gtMain(argc, argv, "test_gpu_graph", body, 300); }
