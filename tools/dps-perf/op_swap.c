/* dps-perf operation: dpsSwapBatchVocab (batch-sharded logits <-> vocab-sharded).
 * Each rank holds [pad_bs*N, V/tp] and gets [pad_bs/tp*N, V]; it sends
 * (tp-1)/tp of its input. Shapes: the PxNxV items of -s, each in every -d
 * dtype (default bf16). */
#include "dps_perf.h"
#include "fixtures.h"

typedef struct {
  void* in;          /* input */
  void* out;         /* output (persistent, the library's) */
  const void* out_h; /* its host copy */
} Swap;

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

static int hostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  const int i = dpHostIn(h, fxSwapInputBytes(tp, c->pad_bs, c->n, c->vocab, c->dtype), 1);
  if (i < 0) return 1;
  for (int k = 0; k < 2; ++k)
    fxFillSwapInput(h->in[i].step[k], tp, rank, c->pad_bs, c->n, c->vocab, c->dtype, k + 1);
  return 0;
}

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  Swap* w = (Swap*)b->op;
  w->in = dpDevIn(b, h, 0, l);
  w->out_h = dpLibOut(b, &w->out, fxSwapOutputBytes(b->tp, c->pad_bs, c->n, c->vocab, c->dtype), l);
  return l->status != DP_OK;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  Swap* w = (Swap*)op;
  return dpsSwapBatchVocab(comm, w->in, (int64_t)c->pad_bs * c->n, c->vocab / tp, c->dtype,
                           c->pad_bs, &w->out, s);
}

static long long check(const DpCheck* k) {
  const DpCase* c = k->c;
  return (long long)fxCheckSwapOutput(((const Swap*)k->op)->out_h, k->tp, k->rank, c->pad_bs, c->n,
                                      c->vocab, c->dtype, k->step);
}

const DpOp dpOpSwap = DP_OP("swap", NULL, NULL, addCases, valid, Swap);
