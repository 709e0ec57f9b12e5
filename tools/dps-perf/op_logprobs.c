/* dps-perf operation: dpsGatherVerifyLogprobs (all-gather of the fp32
 * logprobs [reqs, N] per rank into [pad_bs, N] on every rank). Each rank
 * sends its reqs*N fp32 to every peer. Shapes: dpAddTokenCases. */
#include "dps_perf.h"
#include "fixtures.h"

typedef struct {
  float* lp;          /* input */
  float* lp_o;        /* output (persistent, the library's) */
  const float* lp_h;  /* its host copy */
} Logprobs;

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)(tp - 1) * (size_t)(c->pad_bs / tp) * (size_t)c->n * 4;
}

static int hostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  const int i = dpHostIn(h, (size_t)(c->pad_bs / tp) * (size_t)c->n * 4, 1);
  if (i < 0) return 1;
  for (int k = 0; k < 2; ++k)
    fxFillVerifyInputs(NULL, NULL, NULL, (float*)h->in[i].step[k], tp, rank, c->pad_bs, c->n,
                       k + 1);
  return 0;
}

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  Logprobs* g = (Logprobs*)b->op;
  g->lp = (float*)dpDevIn(b, h, 0, l);
  g->lp_h = (const float*)dpLibOut(b, &g->lp_o, (size_t)c->pad_bs * (size_t)c->n * 4, l);
  return l->status != DP_OK;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  Logprobs* g = (Logprobs*)op;
  return dpsGatherVerifyLogprobs(comm, g->lp, c->pad_bs / tp, c->n, c->pad_bs, &g->lp_o, s);
}

static long long check(const DpCheck* k) {
  return (long long)fxCheckLogprobs(((const Logprobs*)k->op)->lp_h, k->c->pad_bs, k->c->n,
                                    k->step);
}

static const char* const kAliases[] = {"gather_verify_logprobs", NULL};

const DpOp dpOpLogprobs = DP_OP("logprobs", kAliases, "fp32", dpAddTokenCases,
                                 dpValidTokens, Logprobs);
