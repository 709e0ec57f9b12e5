/* The selection cases of dps-perf (argmax, top-k): see select_case.h.
 * A case PxNxV runs rows = P*N rows of this rank's [rows, V/tp] shard. The
 * inputs are the fixtures' logit values (thousands of distinct values per
 * row, like real logits); the edge cases (ties, NaN, -inf) are the tests'. */
#include "select_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

/* the shapes of the selection targets: rows x V (N = 1), bf16 */
const DpShape dpSelShapes[4] = {{8, 1, 64640}, {64, 1, 76032}, {256, 1, 76032}, {1024, 1, 76032}};

int dpSelValid(const DpCase* c, int tp) { return c->pad_bs % tp == 0 && c->vocab % tp == 0; }

int dpValidVocab(const DpCase* c, int tp) { return c->vocab % tp == 0; }

size_t dpSelBytes(const DpCase* c, int tp) {
  return (size_t)c->pad_bs * (size_t)c->n * (size_t)(c->vocab / tp) * dpsDataTypeSize(c->dtype);
}

void dpNoteRead(const DpCase* c, int tp, const DpRow* row, char* out, size_t len) {
  if (row->hbm_peak > 0 && row->us > 0)
    dpNoteAppend(out, len, "read x%.2f",
                 row->us / ((double)dpSelBytes(c, tp) / (row->hbm_peak * 1e3)));
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

int dpSelHostRows(const DpCase* c, int rank, int tp, DpHost* h, int topk) {
  const int64_t rows = (int64_t)c->pad_bs * c->n;
  const size_t r = (size_t)rows;
  DpSelHost* s = (DpSelHost*)dpHostMem(h, sizeof *s);
  if (!s || dpHostIn(h, r * (size_t)(c->vocab / tp) * dpsDataTypeSize(c->dtype), 1) != 0)
    return 1;
  h->op = s;
  for (int k = 0; k < 2; ++k) {
    s->amax_idx[k] = (int64_t*)dpHostMem(h, r * 8);
    s->amax_val[k] = (float*)dpHostMem(h, r * 4);
    s->lse[k] = (double*)dpHostMem(h, r * 8);
    if (!s->amax_idx[k] || !s->amax_val[k] || !s->lse[k]) return 1;
    if (topk) {
      s->want_idx[k] = (int64_t*)dpHostMem(h, r * DP_TOPK_K * 8);
      s->want_val[k] = (float*)dpHostMem(h, r * DP_TOPK_K * 4);
      if (!s->want_idx[k] || !s->want_val[k]) return 1;
    }
  }
  float* row = (float*)malloc((size_t)c->vocab * sizeof(float));
  if (!row) return 1;
  for (int k = 0; k < 2; ++k)
    for (int64_t i = 0; i < rows; ++i) {
      dpSelRow(c, rank, tp, i, k + 1, row, h->in[0].step[k]);
      fxRefArgmax(row, c->vocab, &s->amax_idx[k][i], &s->amax_val[k][i], &s->lse[k][i]);
      if (topk)
        fxRefTopK(row, c->vocab, DP_TOPK_K, s->want_idx[k] + i * DP_TOPK_K,
                  s->want_val[k] + i * DP_TOPK_K);
    }
  free(row);
  return 0;
}

int dpSelHostInit(const DpCase* c, int rank, int tp, DpHost* h) {
  return dpSelHostRows(c, rank, tp, h, 1);
}

int dpSelSetup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l, int k) {
  DpSel* s = (DpSel*)b->op;
  s->k = k;
  s->rows = (size_t)c->pad_bs * (size_t)c->n;
  const size_t per = (size_t)(k > 0 ? k : 1), es = dpsDataTypeSize(c->dtype);
  s->in = dpDevIn(b, h, 0, l);
  s->idx = dpDevOut(b, s->rows * per * 8, 0xab, l);
  s->val = dpDevOut(b, s->rows * per * es, -1, l);
  if (k < 0) s->lse = dpDevOut(b, s->rows * 4, -1, l);
  return l->status != DP_OK;
}

dpsResult_t dpSelCall(const DpCase* c, dpsComm_t comm, const void* in, size_t rows, int tp,
                      int k, void* val, int64_t* idx, float* lse, cudaStream_t s) {
  if (k <= 0)
    return dpsArgmax(comm, in, (int64_t)rows, c->vocab / tp, c->dtype, c->vocab, val, idx, lse, s);
  return dpsTopK(comm, in, (int64_t)rows, c->vocab / tp, c->dtype, k, c->vocab, val, idx, s);
}

dpsResult_t dpSelRun(const DpCase* c, dpsComm_t comm, void* op, int tp, cudaStream_t s) {
  DpSel* x = (DpSel*)op;
  return dpSelCall(c, comm, x->in, x->rows, tp, x->k, x->val.dev, (int64_t*)x->idx.dev,
                   (float*)x->lse.dev, s);
}

long long dpWrongRefRows(const DpCase* c, const int64_t* idx, const void* val, size_t rows,
                         size_t per, const int64_t* want_idx, const float* want_val,
                         size_t stride) {
  long long wrong = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < per; ++j)
      wrong += idx[r * per + j] != want_idx[r * stride + j] ||
               !(fxLoad(val, r * per + j, c->dtype) == want_val[r * stride + j]);
  return wrong;
}

long long dpSelCheck(const DpCheck* k) {
  const DpSel* x = (const DpSel*)k->op;
  const DpSelHost* w = (const DpSelHost*)k->ref;
  const int s = k->step - 1;
  if (x->k > 0)
    return dpWrongRefRows(k->c, (const int64_t*)x->idx.host, x->val.host, x->rows, (size_t)x->k,
                          w->want_idx[s], w->want_val[s], DP_TOPK_K);
  const size_t es = dpsDataTypeSize(k->c->dtype);
  const int64_t* idx = (const int64_t*)x->idx.host;
  const char* val = (const char*)x->val.host;
  const float* lse = (const float*)x->lse.host;
  long long wrong = 0;
  for (size_t r = 0; r < x->rows; ++r) { /* a row is wrong once: index, value or logsumexp */
    const double wl = w->lse[s][r];
    const float gl = lse ? lse[r] : 0.f;
    const int lok = x->k == 0 || (wl != wl && gl != gl) || (isinf(wl) && gl == (float)wl) ||
                    (isfinite(wl) && fabs((double)gl - wl) <= 1e-4 * fmax(1.0, fabs(wl)));
    wrong += dpWrongRefRows(k->c, idx + r, val + r * es, 1, 1, w->amax_idx[s] + r,
                            w->amax_val[s] + r, 1) ||
             !lok;
  }
  return wrong;
}
