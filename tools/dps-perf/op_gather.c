/* dps-perf operation: dpsGatherVerifyOutputs (all-gather of the verify
 * outputs: predict [reqs, N], accept_index [reqs, N], accept_length [reqs]
 * int32 per rank into [pad_bs, ...] on every rank). Each rank sends its
 * packed reqs*(2N+1) int32 to every peer. Shapes: dpAddTokenCases. */
#include "dps_perf.h"
#include "fixtures.h"

typedef struct {
  int32_t *pred, *ai, *al;          /* inputs */
  int32_t *pred_o, *ai_o, *al_o;    /* outputs (persistent, the library's) */
  const int32_t *pred_h, *ai_h, *al_h; /* their host copies */
} Gather;

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)(tp - 1) * fxVerifyPackedElems(c->pad_bs / tp, c->n) * 4;
}

/* Inputs 0, 1, 2: predict, accept_index, accept_length of steps 1 and 2. */
static int hostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  if (dpHostIn(h, reqs * n * 4, 1) < 0 || dpHostIn(h, reqs * n * 4, 1) < 0 ||
      dpHostIn(h, reqs * 4, 1) < 0)
    return 1;
  for (int k = 0; k < 2; ++k)
    fxFillVerifyInputs((int32_t*)h->in[0].step[k], (int32_t*)h->in[1].step[k],
                       (int32_t*)h->in[2].step[k], NULL, tp, rank, c->pad_bs, c->n, k + 1);
  return 0;
}

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  Gather* g = (Gather*)b->op;
  const size_t pn = (size_t)c->pad_bs * (size_t)c->n;
  g->pred = (int32_t*)dpDevIn(b, h, 0, l);
  g->ai = (int32_t*)dpDevIn(b, h, 1, l);
  g->al = (int32_t*)dpDevIn(b, h, 2, l);
  g->pred_h = (const int32_t*)dpLibOut(b, &g->pred_o, pn * 4, l);
  g->ai_h = (const int32_t*)dpLibOut(b, &g->ai_o, pn * 4, l);
  g->al_h = (const int32_t*)dpLibOut(b, &g->al_o, (size_t)c->pad_bs * 4, l);
  return l->status != DP_OK;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  Gather* g = (Gather*)op;
  return dpsGatherVerifyOutputs(comm, g->pred, g->ai, g->al, c->pad_bs / tp, c->n, c->pad_bs,
                                &g->pred_o, &g->ai_o, &g->al_o, s);
}

static long long check(const DpCheck* k) {
  const Gather* g = (const Gather*)k->op;
  return (long long)fxCheckVerifyOutputs(g->pred_h, g->ai_h, g->al_h, k->c->pad_bs, k->c->n,
                                         k->step);
}

static const char* const kAliases[] = {"gather_verify_outputs", NULL};

const DpOp dpOpGather = DP_OP("gather", kAliases, "int32", dpAddTokenCases, dpValidTokens,
                               Gather);
