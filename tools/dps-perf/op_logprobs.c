/* dps-perf operation: dpsGatherVerifyLogprobs (all-gather of the fp32
 * logprobs [reqs, N] per rank into [pad_bs, N] on every rank). Each rank
 * sends its reqs*N fp32 to every peer. Shapes: dpAddTokenCases. */
#include <stdlib.h>

#include "dps_perf.h"
#include "fixtures.h"

typedef struct {
  float* lp[2];
} HostIn;

typedef struct {
  float* lp_d;   /* input */
  float* lp_o;   /* output (persistent, the library's) */
  void* out_h;   /* host copy of the output */
  size_t out_bytes;
} Bufs;

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)(tp - 1) * (size_t)(c->pad_bs / tp) * (size_t)c->n * 4;
}

static void hostFree(void* p) {
  HostIn* h = (HostIn*)p;
  for (int k = 0; k < 2; ++k) free(h->lp[k]);
  free(h);
}

static int hostInit(const DpCase* c, int rank, int tp, void** out) {
  HostIn* h = (HostIn*)calloc(1, sizeof *h);
  if (!h) return 1;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  for (int k = 0; k < 2; ++k) {
    h->lp[k] = (float*)malloc(reqs * n * 4);
    if (!h->lp[k]) {
      hostFree(h);
      return 1;
    }
    fxFillVerifyInputs(NULL, NULL, NULL, h->lp[k], tp, rank, c->pad_bs, c->n, k + 1);
  }
  *out = h;
  return 0;
}

static int setup(const DpCase* c, int tp, void** out, DpLocal* l) {
  Bufs* b = (Bufs*)dpHostAlloc(l, sizeof *b, 1);
  if (!b) return 1;
  *out = b;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->lp_d, reqs * n * 4), fail);
  b->out_bytes = (size_t)c->pad_bs * n * 4;
  b->out_h = dpHostAlloc(l, b->out_bytes, 0);
  if (!b->out_h) return 1;
  return 0;
fail:
  return 1;
}

static void teardown(void* p) {
  Bufs* b = (Bufs*)p;
  cudaFree(b->lp_d);
  free(b->out_h);
  free(b);
}

static int fill(const DpCase* c, void* p, const void* hp, int tp, int step, cudaStream_t s,
                DpLocal* l) {
  Bufs* b = (Bufs*)p;
  const HostIn* h = (const HostIn*)hp;
  const int k = step - 1;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->lp_d, h->lp[k], reqs * n * 4, cudaMemcpyHostToDevice, s),
              fail);
  return 0;
fail:
  return 1;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* p, int tp, cudaStream_t s) {
  Bufs* b = (Bufs*)p;
  const int reqs = c->pad_bs / tp;
  return dpsGatherVerifyLogprobs(comm, b->lp_d, reqs, c->n, c->pad_bs, &b->lp_o, s);
}

static long long check(const DpCase* c, void* p, int rank, int tp, int step, cudaStream_t s,
                       DpLocal* l) {
  (void)rank;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const size_t pn = (size_t)c->pad_bs * (size_t)c->n;
  char* h = (char*)b->out_h;
  DP_TRY_CUDA(l, cudaMemcpyAsync(h, b->lp_o, pn * 4, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return (long long)fxCheckLogprobs((const float*)h, c->pad_bs, c->n, step);
fail:
  return 0;
}

static const char* const kAliases[] = {"gather_verify_logprobs", NULL};

const DpOp dpOpLogprobs = {
    .name = "logprobs",
    .aliases = kAliases,
    .elem_type = "fp32",
    .add_cases = dpAddTokenCases,
    .valid = dpValidTokens,
    .bytes = bytes,
    .host_init = hostInit,
    .host_free = hostFree,
    .setup = setup,
    .fill = fill,
    .run = run,
    .check = check,
    .teardown = teardown,
};
