/* dps-perf operation: dpsSwapBatchVocab (batch-sharded logits <-> vocab-sharded).
 * Each rank holds [pad_bs*N, V/tp] and gets [pad_bs/tp*N, V]; it sends
 * (tp-1)/tp of its input. Shapes: the PxNxV items of -s, each in every -d
 * dtype (default bf16). */
#include <stdlib.h>

#include "dps_perf.h"
#include "fixtures.h"

/* Host inputs of steps 1 and 2. */
typedef struct {
  void* in[2];
  size_t in_bytes;
} HostIn;

typedef struct {
  void* in_d;   /* input */
  void* out;    /* output (persistent, the library's) */
  void* out_h;  /* host copy of the output */
  size_t in_bytes, out_bytes;
} Bufs;

static void addCases(const DpOp* self, const DpCaseArgs* a) {
  static const DpShape kSwap[] = {{8, 1, 64},       {64, 1, 152064},  {64, 4, 152064},
                                  {256, 4, 152064}, {512, 4, 129280}, {8, 1, 129280},
                                  {128, 2, 152064}};
  const DpShape* list = a->shapes ? a->shapes : kSwap;
  const int count = a->shapes ? a->nshapes : (int)(sizeof kSwap / sizeof kSwap[0]);
  for (int i = 0; i < count; ++i) {
    const DpShape* s = &list[i];
    if (!s->vocab) continue;
    if (a->ndtypes) {
      for (int d = 0; d < a->ndtypes; ++d) dpAddCase(self, s->pad_bs, s->n, s->vocab, a->dtypes[d]);
    } else {
      dpAddCase(self, s->pad_bs, s->n, s->vocab, dpsBfloat16);
      if (!a->shapes && i == 0) dpAddCase(self, s->pad_bs, s->n, s->vocab, dpsFloat32);
    }
  }
}

static int valid(const DpCase* c, int tp) { return c->pad_bs % tp == 0 && c->vocab % tp == 0; }

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)(tp - 1) * fxSwapChunkBytes(tp, c->pad_bs, c->n, c->vocab, c->dtype);
}

static void hostFree(void* p) {
  HostIn* h = (HostIn*)p;
  for (int k = 0; k < 2; ++k) free(h->in[k]);
  free(h);
}

static int hostInit(const DpCase* c, int rank, int tp, void** out) {
  HostIn* h = (HostIn*)calloc(1, sizeof *h);
  if (!h) return 1;
  h->in_bytes = fxSwapInputBytes(tp, c->pad_bs, c->n, c->vocab, c->dtype);
  for (int k = 0; k < 2; ++k) {
    h->in[k] = malloc(h->in_bytes);
    if (!h->in[k]) {
      hostFree(h);
      return 1;
    }
    fxFillSwapInput(h->in[k], tp, rank, c->pad_bs, c->n, c->vocab, c->dtype, k + 1);
  }
  *out = h;
  return 0;
}

static int setup(const DpCase* c, int tp, void** out, DpLocal* l) {
  Bufs* b = (Bufs*)dpHostAlloc(l, sizeof *b, 1);
  if (!b) return 1;
  *out = b;
  b->in_bytes = fxSwapInputBytes(tp, c->pad_bs, c->n, c->vocab, c->dtype);
  b->out_bytes = fxSwapOutputBytes(tp, c->pad_bs, c->n, c->vocab, c->dtype);
  DP_TRY_CUDA(l, cudaMalloc(&b->in_d, b->in_bytes), fail);
  b->out_h = dpHostAlloc(l, b->out_bytes, 0);
  if (!b->out_h) return 1;
  return 0;
fail:
  return 1;
}

static void teardown(void* p) {
  Bufs* b = (Bufs*)p;
  cudaFree(b->in_d);
  free(b->out_h);
  free(b);
}

static int fill(const DpCase* c, void* p, const void* hp, int tp, int step, cudaStream_t s,
                DpLocal* l) {
  (void)c;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const HostIn* h = (const HostIn*)hp;
  const int k = step - 1;
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->in_d, h->in[k], b->in_bytes, cudaMemcpyHostToDevice, s), fail);
  return 0;
fail:
  return 1;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* p, int tp, cudaStream_t s) {
  Bufs* b = (Bufs*)p;
  return dpsSwapBatchVocab(comm, b->in_d, (int64_t)c->pad_bs * c->n, c->vocab / tp, c->dtype,
                           c->pad_bs, &b->out, s);
}

static long long check(const DpCase* c, void* p, int rank, int tp, int step, cudaStream_t s,
                       DpLocal* l) {
  Bufs* b = (Bufs*)p;
  char* h = (char*)b->out_h;
  DP_TRY_CUDA(l, cudaMemcpyAsync(h, b->out, b->out_bytes, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return (long long)fxCheckSwapOutput(h, tp, rank, c->pad_bs, c->n, c->vocab, c->dtype, step);
fail:
  return 0;
}

const DpOp dpOpSwap = {
    .name = "swap",
    .aliases = NULL,
    .add_cases = addCases,
    .valid = valid,
    .bytes = bytes,
    .host_init = hostInit,
    .host_free = hostFree,
    .setup = setup,
    .fill = fill,
    .run = run,
    .check = check,
    .teardown = teardown,
};
