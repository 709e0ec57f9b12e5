/* The selection cases of dps-perf (argmax, top-k): see select_case.h.
 * A case PxNxV runs rows = P*N rows of this rank's [rows, V/tp] shard. The
 * inputs are the fixtures' logit values (thousands of distinct values per
 * row, like real logits); the edge cases (ties, NaN, -inf) are the tests'. */
#include "select_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

/* Inputs of steps 1 and 2 and their expected results (computed once: the
 * reference over 1024 full rows is too slow to repeat for every check). */
typedef struct {
  void* in[2];
  size_t in_bytes;
  int64_t* want_idx[2]; /* [rows][DP_TOPK_K] (argmax: column 0) */
  float* want_val[2];
  double* want_lse[2];
  int64_t* amax_idx[2];
  float* amax_val[2];
} HostIn;

typedef struct {
  int k;   /* 0 argmax, -1 argmax + logsumexp, else top-k */
  void* in_d;
  int64_t* idx_d;
  void* val_d;
  float* lse_d;
  size_t in_bytes, rows, es;
  int64_t* idx_h;
  void* val_h;
  float* lse_h;
  const HostIn* host; /* set by fill */
} Bufs;

void dpAddShapeCases(const DpOp* self, const DpCaseArgs* a, const DpShape* defaults,
                     int ndefaults) {
  const DpShape* list = a->shapes ? a->shapes : defaults;
  const int count = a->shapes ? a->nshapes : ndefaults;
  for (int i = 0; i < count; ++i) {
    if (!list[i].vocab) continue;
    if (a->ndtypes)
      for (int d = 0; d < a->ndtypes; ++d)
        dpAddCase(self, list[i].pad_bs, list[i].n, list[i].vocab, a->dtypes[d]);
    else
      dpAddCase(self, list[i].pad_bs, list[i].n, list[i].vocab, dpsBfloat16);
  }
}

void dpSelAddCases(const DpOp* self, const DpCaseArgs* a) {
  /* the shapes of the selection targets: rows x V (N = 1), bf16 */
  static const DpShape kSel[] = {{8, 1, 64640}, {64, 1, 76032}, {256, 1, 76032},
                                 {1024, 1, 76032}};
  dpAddShapeCases(self, a, kSel, (int)(sizeof kSel / sizeof kSel[0]));
}

int dpSelValid(const DpCase* c, int tp) { return c->pad_bs % tp == 0 && c->vocab % tp == 0; }

size_t dpSelBytes(const DpCase* c, int tp) {
  return (size_t)c->pad_bs * (size_t)c->n * (size_t)(c->vocab / tp) * dpsDataTypeSize(c->dtype);
}

void dpSelHostFree(void* p) {
  HostIn* h = (HostIn*)p;
  for (int k = 0; k < 2; ++k) {
    free(h->in[k]);
    free(h->want_idx[k]);
    free(h->want_val[k]);
    free(h->want_lse[k]);
    free(h->amax_idx[k]);
    free(h->amax_val[k]);
  }
  free(h);
}

float dpSelValue(int64_t row, int64_t col, int step, dpsDataType_t dtype) {
  uint32_t t = 0;
  fxStore(&t, 0, fxLogitValue(row, col, step, dtype), dtype);
  return fxLoad(&t, 0, dtype);
}

void dpSelRow(const DpCase* c, int rank, int tp, int64_t r, int step, float* row, void* shard) {
  const int64_t vl = c->vocab / tp;
  for (int64_t j = 0; j < c->vocab; ++j) row[j] = dpSelValue(r, j, step, c->dtype);
  for (int64_t j = 0; j < vl; ++j)
    fxStore(shard, (size_t)(r * vl + j), row[rank * vl + j], c->dtype);
}

int dpSelHostInit(const DpCase* c, int rank, int tp, void** out) {
  HostIn* h = (HostIn*)calloc(1, sizeof *h);
  if (!h) return 1;
  const int64_t rows = (int64_t)c->pad_bs * c->n, vl = c->vocab / tp;
  h->in_bytes = (size_t)rows * (size_t)vl * dpsDataTypeSize(c->dtype);
  float* row = (float*)malloc((size_t)c->vocab * sizeof(float));
  for (int k = 0; k < 2; ++k) {
    h->in[k] = malloc(h->in_bytes);
    h->want_idx[k] = (int64_t*)malloc((size_t)rows * DP_TOPK_K * 8);
    h->want_val[k] = (float*)malloc((size_t)rows * DP_TOPK_K * 4);
    h->want_lse[k] = (double*)malloc((size_t)rows * 8);
    h->amax_idx[k] = (int64_t*)malloc((size_t)rows * 8);
    h->amax_val[k] = (float*)malloc((size_t)rows * 4);
    if (!row || !h->in[k] || !h->want_idx[k] || !h->want_val[k] || !h->want_lse[k] ||
        !h->amax_idx[k] || !h->amax_val[k]) {
      free(row);
      dpSelHostFree(h);
      return 1;
    }
    for (int64_t r = 0; r < rows; ++r) {
      dpSelRow(c, rank, tp, r, k + 1, row, h->in[k]);
      fxRefArgmax(row, c->vocab, &h->amax_idx[k][r], &h->amax_val[k][r], &h->want_lse[k][r]);
      fxRefTopK(row, c->vocab, DP_TOPK_K, h->want_idx[k] + r * DP_TOPK_K,
                h->want_val[k] + r * DP_TOPK_K);
    }
  }
  free(row);
  *out = h;
  return 0;
}

int dpSelSetup(const DpCase* c, int tp, void** out, DpLocal* l, int k) {
  Bufs* b = (Bufs*)dpHostAlloc(l, sizeof *b, 1);
  if (!b) return 1;
  *out = b;
  b->k = k;
  b->rows = (size_t)c->pad_bs * (size_t)c->n;
  b->es = dpsDataTypeSize(c->dtype);
  b->in_bytes = b->rows * (size_t)(c->vocab / tp) * b->es;
  const size_t per = (size_t)(k > 0 ? k : 1);
  DP_TRY_CUDA(l, cudaMalloc(&b->in_d, b->in_bytes), fail);
  DP_TRY_CUDA(l, cudaMalloc((void**)&b->idx_d, b->rows * per * 8), fail);
  DP_TRY_CUDA(l, cudaMalloc(&b->val_d, b->rows * per * b->es), fail);
  if (k < 0) DP_TRY_CUDA(l, cudaMalloc((void**)&b->lse_d, b->rows * 4), fail);
  if (!(b->idx_h = (int64_t*)dpHostAlloc(l, b->rows * per * 8, 0)) ||
      !(b->val_h = dpHostAlloc(l, b->rows * per * b->es, 0)) ||
      !(b->lse_h = (float*)dpHostAlloc(l, b->rows * 4, 0)))
    return 1;
  return 0;
fail:
  return 1;
}

void dpSelTeardown(void* p) {
  Bufs* b = (Bufs*)p;
  cudaFree(b->in_d);
  cudaFree(b->idx_d);
  cudaFree(b->val_d);
  cudaFree(b->lse_d);
  free(b->idx_h);
  free(b->val_h);
  free(b->lse_h);
  free(b);
}

int dpSelFill(const DpCase* c, void* p, const void* hp, int tp, int step, cudaStream_t s,
              DpLocal* l) {
  (void)c;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const HostIn* h = (const HostIn*)hp;
  b->host = h;
  DP_TRY_CUDA(l, cudaMemcpyAsync(b->in_d, h->in[step - 1], b->in_bytes, cudaMemcpyHostToDevice, s),
              fail);
  DP_TRY_CUDA(l, cudaMemsetAsync(b->idx_d, 0xab, b->rows * (size_t)(b->k > 0 ? b->k : 1) * 8, s),
              fail);
  return 0;
fail:
  return 1;
}

dpsResult_t dpSelRun(const DpCase* c, dpsComm_t comm, void* p, int tp, cudaStream_t s) {
  Bufs* b = (Bufs*)p;
  if (b->k <= 0)
    return dpsArgmax(comm, b->in_d, (int64_t)b->rows, c->vocab / tp, c->dtype, c->vocab,
                     b->val_d, b->idx_d, b->lse_d, s);
  return dpsTopK(comm, b->in_d, (int64_t)b->rows, c->vocab / tp, c->dtype, b->k, c->vocab,
                 b->val_d, b->idx_d, s);
}

long long dpSelCheck(const DpCase* c, void* p, int rank, int tp, int step, cudaStream_t s,
                     DpLocal* l) {
  (void)rank;
  (void)tp;
  Bufs* b = (Bufs*)p;
  const size_t per = (size_t)(b->k > 0 ? b->k : 1);
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  DP_TRY_CUDA(l, cudaMemcpy(b->idx_h, b->idx_d, b->rows * per * 8, cudaMemcpyDeviceToHost), fail);
  DP_TRY_CUDA(l, cudaMemcpy(b->val_h, b->val_d, b->rows * per * b->es, cudaMemcpyDeviceToHost),
              fail);
  if (b->k < 0)
    DP_TRY_CUDA(l, cudaMemcpy(b->lse_h, b->lse_d, b->rows * 4, cudaMemcpyDeviceToHost), fail);
  long long wrong = 0;
  const HostIn* h = b->host;
  const int k = step - 1;
  for (size_t r = 0; r < b->rows; ++r) {
    if (b->k <= 0) {
      const double wl = h->want_lse[k][r];
      const float gv = fxLoad(b->val_h, r, c->dtype), gl = b->lse_h[r];
      const int lok = b->k == 0 || (wl != wl && gl != gl) || (isinf(wl) && gl == (float)wl) ||
                      (isfinite(wl) && fabs((double)gl - wl) <= 1e-4 * fmax(1.0, fabs(wl)));
      wrong += b->idx_h[r] != h->amax_idx[k][r] || !(gv == h->amax_val[k][r]) || !lok;
    } else {
      for (int j = 0; j < b->k; ++j) {
        const float gv = fxLoad(b->val_h, r * per + (size_t)j, c->dtype);
        wrong += b->idx_h[r * per + (size_t)j] != h->want_idx[k][r * DP_TOPK_K + j] ||
                 !(gv == h->want_val[k][r * DP_TOPK_K + j]);
      }
    }
  }
  return wrong;
fail:
  return 0;
}
