/* dps-perf operation: dpsGatherVerifyOutputs (all-gather of the verify
 * outputs: predict [reqs, N], accept_index [reqs, N], accept_length [reqs]
 * int32 per rank into [pad_bs, ...] on every rank). Each rank sends its
 * packed reqs*(2N+1) int32 to every peer. Shapes: dpAddTokenCases. */
#include <stdlib.h>

#include "dps_perf.h"
#include "fixtures.h"

typedef struct {
  int32_t *pred[2], *ai[2], *al[2];
} HostIn;

typedef struct {
  int32_t *pred_d, *ai_d, *al_d;     /* inputs */
  int32_t *pred_o, *ai_o, *al_o;     /* outputs (persistent, the library's) */
  void* out_h;                       /* host copy of the outputs */
  size_t out_bytes;
} Bufs;

static size_t bytes(const DpCase* c, int tp) {
  return (size_t)(tp - 1) * fxVerifyPackedElems(c->pad_bs / tp, c->n) * 4;
}

static void hostFree(void* p) {
  HostIn* h = (HostIn*)p;
  for (int k = 0; k < 2; ++k) {
    free(h->pred[k]);
    free(h->ai[k]);
    free(h->al[k]);
  }
  free(h);
}

static int hostInit(const DpCase* c, int rank, int tp, void** out) {
  HostIn* h = (HostIn*)calloc(1, sizeof *h);
  if (!h) return 1;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  for (int k = 0; k < 2; ++k) {
    h->pred[k] = (int32_t*)malloc(reqs * n * 4);
    h->ai[k] = (int32_t*)malloc(reqs * n * 4);
    h->al[k] = (int32_t*)malloc(reqs * 4);
    if (!h->pred[k] || !h->ai[k] || !h->al[k]) {
      hostFree(h);
      return 1;
    }
    fxFillVerifyInputs(h->pred[k], h->ai[k], h->al[k], NULL, tp, rank, c->pad_bs, c->n, k + 1);
  }
  *out = h;
  return 0;
}

static int setup(const DpCase* c, int tp, void** out, DpLocal* l) {
  Bufs* b = (Bufs*)dpHostAlloc(l, sizeof *b, 1);
  if (!b) return 1;
  *out = b;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->pred_d, reqs * n * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->ai_d, reqs * n * 4), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->al_d, reqs * 4), fail);
  b->out_bytes = fxVerifyPackedElems(c->pad_bs, c->n) * 4;
  b->out_h = dpHostAlloc(l, b->out_bytes, 0);
  if (!b->out_h) return 1;
  return 0;
fail:
  return 1;
}

static void teardown(void* p) {
  Bufs* b = (Bufs*)p;
  cudaFree(b->pred_d);
  cudaFree(b->ai_d);
  cudaFree(b->al_d);
  free(b->out_h);
  free(b);
}

static int fill(const DpCase* c, void* p, const void* hp, int tp, int step, cudaStream_t s,
                DpLocal* l) {
  Bufs* b = (Bufs*)p;
  const HostIn* h = (const HostIn*)hp;
  const int k = step - 1;
  const size_t reqs = (size_t)(c->pad_bs / tp), n = (size_t)c->n;
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->pred_d, h->pred[k], reqs * n * 4, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->ai_d, h->ai[k], reqs * n * 4, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->al_d, h->al[k], reqs * 4, cudaMemcpyHostToDevice, s), fail);
  return 0;
fail:
  return 1;
}

static dpsResult_t run(const DpCase* c, dpsComm_t comm, void* p, int tp, cudaStream_t s) {
  Bufs* b = (Bufs*)p;
  const int reqs = c->pad_bs / tp;
  return dpsGatherVerifyOutputs(comm, b->pred_d, b->ai_d, b->al_d, reqs, c->n, c->pad_bs,
                                &b->pred_o, &b->ai_o, &b->al_o, s);
}

static long long check(const DpCase* c, void* p, int rank, int tp, int step, cudaStream_t s,
                       DpLocal* l) {
  (void)rank;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const size_t pn = (size_t)c->pad_bs * (size_t)c->n;
  char* h = (char*)b->out_h;
  DP_TRY_CUDA(l, cudaMemcpyAsync(h, b->pred_o, pn * 4, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(h + pn * 4, b->ai_o, pn * 4, cudaMemcpyDeviceToHost, s), fail);
  DP_TRY_CUDA(l, cudaMemcpyAsync(h + 2 * pn * 4, b->al_o, (size_t)c->pad_bs * 4,
                                 cudaMemcpyDeviceToHost, s),
              fail);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return (long long)fxCheckVerifyOutputs((const int32_t*)h, (const int32_t*)(h + pn * 4),
                                         (const int32_t*)(h + 2 * pn * 4), c->pad_bs, c->n,
                                         step);
fail:
  return 0;
}

static const char* const kAliases[] = {"gather_verify_outputs", NULL};

const DpOp dpOpGather = {
    .name = "gather",
    .aliases = kAliases,
    .elem_type = "int32",
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
