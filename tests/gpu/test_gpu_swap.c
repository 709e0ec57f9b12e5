/* swap_batch_vocab on 2..8 GPUs, every backend: fp32/bf16/fp16 for the spec
 * shapes (8x1x64, 8x4x64), realistic ones (64x1x152064, 256x4x152064,
 * 512x4x129280), odd vocab slices that force the 2/4/8-byte permute paths,
 * a misaligned input pointer, pad_bs below the maximum and changing between
 * calls (persistent output pointer identical across calls), dtype fixed at
 * creation or by the first swap, the legacy default stream, and (nccl) a
 * counting replacement all_to_all: called exactly once per swap with the same
 * values. Every element of every output is checked against the host
 * reference. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_common.h"

typedef struct {
  int max_pad_bs, n;
  int64_t vocab_per_rank; /* vocab = vocab_per_rank * tp, unless vocab_abs */
  int64_t vocab_abs;
  dpsDataType_t dtype;
  size_t in_offset_elems;
  int big; /* fewer pad_bs variations */
  const char* what;
} SwapCase;

static const SwapCase kCases[] = {
    /* spec shapes */
    {8, 1, 0, 64, dpsFloat32, 0, 0, "spec sample fp32"},
    {8, 1, 0, 64, dpsBfloat16, 0, 0, "spec sample bf16"},
    {8, 1, 0, 64, dpsFloat16, 0, 0, "spec sample fp16"},
    {8, 4, 0, 64, dpsFloat32, 0, 0, "spec verify fp32"},
    {8, 4, 0, 64, dpsBfloat16, 0, 0, "spec verify bf16"},
    {8, 4, 0, 64, dpsFloat16, 0, 0, "spec verify fp16"},
    /* realistic */
    {64, 1, 0, 152064, dpsBfloat16, 0, 1, "decode 64x1x152064 bf16"},
    {64, 1, 0, 152064, dpsFloat32, 0, 1, "decode 64x1x152064 fp32"},
    {64, 4, 0, 152064, dpsFloat16, 0, 1, "verify 64x4x152064 fp16"},
    {256, 4, 0, 152064, dpsBfloat16, 0, 1, "verify 256x4x152064 bf16"},
    {512, 4, 0, 129280, dpsBfloat16, 0, 1, "verify 512x4x129280 bf16"},
    /* odd slices: v_local*esize = 2002 (2-byte path), 4004 (4), 2004 (4), 2008 (8) */
    {16, 3, 1001, 0, dpsBfloat16, 0, 0, "odd v_local 1001 bf16"},
    {16, 3, 1001, 0, dpsFloat32, 0, 0, "odd v_local 1001 fp32"},
    {16, 3, 1001, 0, dpsFloat16, 0, 0, "odd v_local 1001 fp16"},
    {16, 2, 1002, 0, dpsBfloat16, 0, 0, "v_local 1002 bf16"},
    {16, 2, 1004, 0, dpsBfloat16, 0, 0, "v_local 1004 bf16"},
    {8, 5, 3, 0, dpsFloat16, 0, 0, "tiny v_local 3 fp16"},
    {8, 1, 1, 0, dpsBfloat16, 0, 0, "v_local 1 bf16"},
    {24, 2, 8192 + 24, 0, dpsBfloat16, 0, 0, "v_local 8216 bf16 (vector + tail)"},
    /* misaligned input (one element off a 16-byte boundary) */
    {16, 2, 1024, 0, dpsBfloat16, 1, 0, "misaligned input bf16"},
    {16, 2, 1024, 0, dpsFloat32, 1, 0, "misaligned input fp32"},
    {16, 2, 1024, 0, dpsFloat16, 3, 0, "misaligned input fp16 (+6 bytes)"},
};

static int runCase(int rank, int tp, dpsBackend_t backend, const SwapCase* sc, int idx,
                   cudaStream_t s) {
  if (sc->max_pad_bs % tp != 0) return 0;
  const int64_t vocab = sc->vocab_abs ? sc->vocab_abs : sc->vocab_per_rank * tp;
  if (vocab % tp != 0) return 0;
  if (gtSkipLarge("test_gpu_swap", sc->max_pad_bs, sc->n, vocab)) return 0;
  if (rank == 0) {
    printf("  [%s] tp=%d %s: max_pad_bs=%d N=%d V=%lld\n", dpsBackendName(backend), tp, sc->what,
           sc->max_pad_bs, sc->n, (long long)vocab);
    fflush(stdout);
  }
  /* Alternate: dtype fixed at creation / fixed by the first swap. */
  const dpsDataType_t cfg_dtype = (idx % 2 == 0) ? sc->dtype : dpsDtypeUnset;
  dpsConfig_t cfg = gtConfig(rank, tp, sc->max_pad_bs, sc->n, vocab, cfg_dtype, backend);
  dpsComm_t comm = NULL;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  rc = gtAllocBufs(&b, tp, sc->max_pad_bs, sc->n, vocab, sc->dtype,
                   sc->in_offset_elems * dpsDataTypeSize(sc->dtype));
  if (rc) return rc;

  /* pad_bs sequence: max, smaller ones, max again. */
  int pads[6], np = 0;
  const int max = sc->max_pad_bs;
  pads[np++] = max;
  if (max / 2 >= tp && (max / 2) % tp == 0) pads[np++] = max / 2;
  if (!sc->big) {
    if (tp != max) pads[np++] = tp;
    if (3 * tp <= max) pads[np++] = 3 * tp;
    pads[np++] = max;
  }
  void* first = NULL;
  for (int i = 0; i < np; ++i) {
    void* out = NULL;
    const int step = 10 * idx + i;
    rc = gtSwapChecked(comm, &b, rank, tp, pads[i], step, s, &out);
    if (rc) return rc;
    if (i == 0) first = out;
    FX_CHECK(out == first, "output pointer changed: %p then %p (pad_bs %d)", first, out, pads[i]);
  }
  {
    dpsCommInfo_t info;
    FX_CHECK_OK(dpsCommGetInfo(comm, &info));
    FX_CHECK(info.logits_dtype == sc->dtype && info.initialized == 1, "dtype %s init %d",
             dpsDataTypeName(info.logits_dtype), info.initialized);
  }
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

/* The legacy default stream (NULL) works like any other. */
static int defaultStream(int rank, int tp, dpsBackend_t backend) {
  dpsConfig_t cfg = gtConfig(rank, tp, 16, 2, 64 * tp, dpsBfloat16, backend);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, 16, 2, 64 * tp, dpsBfloat16, 0)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, 16, 900, NULL, NULL)) return 1;
  if (gtSwapChecked(comm, &b, rank, tp, 2 * tp <= 16 ? 2 * tp : 16, 901, NULL, NULL)) return 1;
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

/* nccl: a replacement all_to_all is called exactly once per swap, with the
 * full semantics (self chunk included), and gives the same values. */
static int replacementAllToAll(int rank, int tp, cudaStream_t s) {
  const int max = 32;
  const int64_t vocab = 1000 * tp;
  dpsConfig_t cfg = gtConfig(rank, tp, max, 3, vocab, dpsBfloat16, dpsBackendNccl);
  dpsComm_t comm;
  int rc = gtCreate(&comm, &cfg);
  if (rc) return rc;
  gtBufs b;
  if (gtAllocBufs(&b, tp, max, 3, vocab, dpsBfloat16, 0)) return 1;
  gtCounter cnt;
  if (gtInitCounter(&cnt, tp)) return 1;
  dpsCollectives_t table = {&cnt, gtCountingAllGather, gtCountingAllToAll};
  FX_CHECK_OK(dpsCommSetCollectives(comm, &table));
  const int pads[3] = {max, tp, max / 2 >= tp ? (max / 2 / tp) * tp : tp};
  for (int i = 0; i < 3; ++i) {
    const int before = cnt.all_to_alls;
    if (gtSwapChecked(comm, &b, rank, tp, pads[i], 500 + i, s, NULL)) return 1;
    FX_CHECK(cnt.all_to_alls == before + 1, "all_to_all called %d times in one swap",
             cnt.all_to_alls - before);
    FX_CHECK(cnt.all_gathers == 0, "swap called all_gather %d times", cnt.all_gathers);
  }
  /* Only all_gather replaced: the swap goes back to NCCL. */
  dpsCollectives_t only_gather = {&cnt, gtCountingAllGather, NULL};
  FX_CHECK_OK(dpsCommSetCollectives(comm, &only_gather));
  const int before = cnt.all_to_alls;
  if (gtSwapChecked(comm, &b, rank, tp, max, 510, s, NULL)) return 1;
  FX_CHECK(cnt.all_to_alls == before, "replacement all_to_all used after removal");
  /* NULL table restores NCCL. */
  FX_CHECK_OK(dpsCommSetCollectives(comm, NULL));
  if (gtSwapChecked(comm, &b, rank, tp, max, 511, s, NULL)) return 1;
  FX_CHECK(cnt.all_to_alls == before && cnt.all_gathers == 0, "counter moved after reset");
  fxBarrier();
  FX_CHECK_OK(dpsCommDestroy(comm));
  gtFreeBufs(&b);
  return 0;
}

static int body(int rank, int tp, dpsBackend_t backend) {
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i) {
    int rc = runCase(rank, tp, backend, &kCases[i], (int)i, s);
    if (rc) return rc; /* 77: the backend is unavailable (every rank agrees) */
  }
  if (defaultStream(rank, tp, backend)) return 1;
  if (backend == dpsBackendNccl && replacementAllToAll(rank, tp, s)) return 1;
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char** argv) { return gtMain(argc, argv, "test_gpu_swap", body, 600); }
