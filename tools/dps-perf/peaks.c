/* dps-perf: the peaks the table's efficiency column divides by, measured
 * once before the table (kernels: peak.cu): the local HBM read peak (every
 * rank, its own device), the peer store peak (every rank stores int4 into
 * rank+1's cudaIpc buffer at once) and the copy engine's (rank 0 -> rank 1). */
#include <stdio.h>
#include <string.h>

#include "fixtures.h"
#include "harness.h"

double g_store_peak = 0.0; /* GB/s per direction, 0 = unknown */
double g_hbm_peak = 0.0;   /* GB/s of local reads, 0 = unknown */

/* What the measurements share: a buffer of --peak-mib MiB filled with the
 * byte `fill`, two events and the device's SM count. */
typedef struct {
  size_t bytes;
  void* buf;
  cudaEvent_t e0, e1;
  int sms;
} Bench;

static int benchInit(Bench* b, int fill, DpLocal* l) {
  int dev = 0;
  DP_TRY_CUDA(l, cudaMalloc(&b->buf, b->bytes), fail);
  DP_TRY_CUDA(l, cudaMemset(b->buf, fill, b->bytes), fail);
  DP_TRY_CUDA(l, cudaEventCreate(&b->e0), fail);
  DP_TRY_CUDA(l, cudaEventCreate(&b->e1), fail);
  DP_TRY_CUDA(l, cudaGetDevice(&dev), fail);
  DP_TRY_CUDA(l, cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, dev), fail);
  return 0;
fail:
  return 1;
}

static void benchFree(Bench* b) {
  if (b->buf) cudaFree(b->buf);
  if (b->e0) cudaEventDestroy(b->e0);
  if (b->e1) cudaEventDestroy(b->e1);
}

/* One transfer of the measurements (a kernel or a copy) on s. */
typedef struct {
  int kind; /* 0: HBM read, 1: peer store, 2: copy engine */
  void* dst;
  const void* src;
  int blocks, threads, tag;
  int* sink;
} Transfer;

static cudaError_t launch(const Bench* b, const Transfer* t, cudaStream_t s) {
  switch (t->kind) {
    case 0: return dpLaunchRead(t->src, b->bytes, t->blocks, t->threads, t->sink, s);
    case 1: return dpLaunchPeerStore(t->dst, b->bytes, t->blocks, t->threads, t->tag, s);
    default: return cudaMemcpyAsync(t->dst, t->src, b->bytes, cudaMemcpyDeviceToDevice, s);
  }
}

/* --peak-reps transfers between the events (after one untimed when `warm`);
 * their time in *ms. */
static int timeReps(const Bench* b, const Transfer* t, int warm, cudaStream_t s, float* ms,
                    DpLocal* l) {
  if (warm) DP_TRY_CUDA(l, launch(b, t, s), fail);
  DP_TRY_CUDA(l, cudaEventRecord(b->e0, s), fail);
  for (int i = 0; i < g_opt.peak_reps; ++i) DP_TRY_CUDA(l, launch(b, t, s), fail);
  DP_TRY_CUDA(l, cudaEventRecord(b->e1, s), fail);
  DP_TRY_CUDA(l, cudaEventSynchronize(b->e1), fail);
  DP_TRY_CUDA(l, cudaEventElapsedTime(ms, b->e0, b->e1), fail);
  return 0;
fail:
  return 1;
}

/* GB/s of --peak-reps transfers in `ms`. */
static double gbps(const Bench* b, double ms) {
  return (double)b->bytes * g_opt.peak_reps / (ms * 1e-3) / 1e9;
}

static const int kGridMul[] = {1, 2, 4, 8}; /* grids of sms x these, swept */

/* The local HBM read peak (every rank, its own device). */
void measureHbm(int rank, int tp, cudaStream_t s) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  Bench b = {(size_t)g_opt.peak_mib << 20, NULL, NULL, NULL, 0};
  Transfer t = {0, NULL, NULL, 0, 512, 0, NULL};
  double best = 0.0;
  int best_blocks = 0;
  float ms = 0.f;
  if (benchInit(&b, 1, &l)) goto done;
  DP_TRY_CUDA(&l, cudaMalloc((void**)&t.sink, 4), done);
  t.src = b.buf;
  for (size_t m = 0; m < sizeof kGridMul / sizeof kGridMul[0]; ++m) {
    t.blocks = b.sms * kGridMul[m];
    if (timeReps(&b, &t, 1, s, &ms, &l)) goto done;
    const double gbs = gbps(&b, ms);
    if (gbs > best) {
      best = gbs;
      best_blocks = t.blocks;
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
  if (t.sink) cudaFree(t.sink);
  benchFree(&b);
  cudaGetLastError();
}

int measurePeaks(int rank, int tp, cudaStream_t s) {
  DpLocal l = {DP_OK, ""};
  Agreed a;
  Bench b = {(size_t)g_opt.peak_mib << 20, NULL, NULL, NULL, 0};
  void* peer = NULL;
  double store = 0.0, ce = 0.0;
  int best_blocks = 0;
  const int threads = 512;

  if (benchInit(&b, rank, &l)) goto setup_done;
  DP_TRY_CUDA(&l, cudaIpcGetMemHandle(&g_sh->ipc[rank], b.buf), setup_done);
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
  for (size_t m = 0; m < sizeof kGridMul / sizeof kGridMul[0]; ++m) {
    const Transfer t = {1, peer, NULL, b.sms * kGridMul[m], threads, rank, NULL};
    float ms = 0.f;
    DP_TRY_CUDA(&l, launch(&b, &t, s), store_done);
    DP_TRY_CUDA(&l, cudaStreamSynchronize(s), store_done);
  store_done:
    agree(rank, tp, &l, 0, 0, &a);
    if (a.worst != DP_OK) goto fail;
    timeReps(&b, &t, 0, s, &ms, &l);
    agree(rank, tp, &l, ms, 0, &a);
    if (a.worst != DP_OK) goto fail;
    double gbs = gbps(&b, a.max_value);
    if (gbs > store) {
      store = gbs;
      best_blocks = t.blocks;
    }
  }

  /* (b) copy engine, rank 0 -> rank 1 only. */
  {
    const Transfer t = {2, peer, b.buf, 0, 0, 0, NULL};
    float ms = 0.f;
    if (rank == 0) timeReps(&b, &t, 1, s, &ms, &l);
    agree(rank, tp, &l, ms, 0, &a);
    if (a.worst != DP_OK) goto fail;
    ce = gbps(&b, a.max_value);
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
  benchFree(&b);
  cudaGetLastError();
  return 0; /* a failed peak is reported, not fatal */
}
