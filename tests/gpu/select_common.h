/* Buffers, inputs and the reference check of the argmax / top-k tests
 * (test_gpu_select, test_gpu_virtual_ranks): header-only, static. Include
 * after gpu_common.h. */
#ifndef DPS_SELECT_COMMON_H_
#define DPS_SELECT_COMMON_H_

#include <math.h>

enum { MAXK = 64 };

typedef struct {
  int tp, rank;
  int64_t v_local, vocab;
  int max_rows;
  dpsDataType_t dtype;
  void* d_in;
  int64_t *d_idx, *d_tidx;
  void *d_val, *d_tval;
  float* d_lse;
  void* h_in;
  float* h_row; /* one full row, fp32 */
  int64_t *h_idx, *h_tidx;
  void *h_val, *h_tval;
  float* h_lse;
  cudaStream_t s; /* the stream of the calls: uploads and poisons are ordered on it */
} SelBufs;

GT_FN int selAlloc(SelBufs* b, int tp, int rank, int64_t v_local, int max_rows,
                    dpsDataType_t dtype, cudaStream_t s) {
  memset(b, 0, sizeof *b);
  b->s = s;
  b->tp = tp;
  b->rank = rank;
  b->v_local = v_local;
  b->vocab = v_local * tp;
  b->max_rows = max_rows;
  b->dtype = dtype;
  const size_t es = dpsDataTypeSize(dtype), R = (size_t)max_rows;
  GT_CUDA(cudaMalloc(&b->d_in, R * (size_t)v_local * es));
  GT_CUDA(cudaMalloc((void**)&b->d_idx, R * 8));
  GT_CUDA(cudaMalloc(&b->d_val, R * es));
  GT_CUDA(cudaMalloc((void**)&b->d_lse, R * 4));
  GT_CUDA(cudaMalloc((void**)&b->d_tidx, R * MAXK * 8));
  GT_CUDA(cudaMalloc(&b->d_tval, R * MAXK * es));
  b->h_in = malloc(R * (size_t)v_local * es);
  b->h_row = (float*)malloc((size_t)b->vocab * 4);
  b->h_idx = (int64_t*)malloc(R * 8);
  b->h_val = malloc(R * es);
  b->h_lse = (float*)malloc(R * 4);
  b->h_tidx = (int64_t*)malloc(R * MAXK * 8);
  b->h_tval = malloc(R * MAXK * es);
  FX_CHECK(b->h_in && b->h_row && b->h_idx && b->h_val && b->h_lse && b->h_tidx && b->h_tval,
           "host allocation");
  return 0;
}

GT_FN void selFree(SelBufs* b) {
  cudaFree(b->d_in);
  cudaFree(b->d_idx);
  cudaFree(b->d_val);
  cudaFree(b->d_lse);
  cudaFree(b->d_tidx);
  cudaFree(b->d_tval);
  free(b->h_in);
  free(b->h_row);
  free(b->h_idx);
  free(b->h_val);
  free(b->h_lse);
  free(b->h_tidx);
  free(b->h_tval);
}

GT_FN int selUpload(SelBufs* b, int rows, int step) {
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < b->v_local; ++c)
      fxStore(b->h_in, (size_t)r * b->v_local + c,
              fxSelValue(r, b->rank * b->v_local + c, b->vocab, b->v_local, step), b->dtype);
  GT_CUDA(cudaMemcpyAsync(b->d_in, b->h_in, (size_t)rows * b->v_local * dpsDataTypeSize(b->dtype),
                          cudaMemcpyHostToDevice, b->s));
  /* poison the outputs: a row not written is caught */
  GT_CUDA(cudaMemsetAsync(b->d_idx, 0xab, (size_t)b->max_rows * 8, b->s));
  GT_CUDA(cudaMemsetAsync(b->d_tidx, 0xab, (size_t)b->max_rows * MAXK * 8, b->s));
  GT_CUDA(cudaStreamSynchronize(b->s));
  return 0;
}

GT_FN int sameFloat(float a, float b) { return (a != a && b != b) || a == b; }

/* Compares downloaded outputs (argmax: idx, val [rows], lse [rows] or NULL;
 * top-k: idx, val [rows, k]) with the reference of input rows
 * [row0, row0 + rows) of `step` (output row i is input row row0 + i).
 * Returns the count of wrong values (the first 5 printed). */
GT_FN long selCompare(SelBufs* b, int row0, int rows, int step, int64_t limit, int k,
                      const int64_t* idx, const void* val, const float* lse, const char* what) {
  long bad = 0;
  for (int i = 0; i < rows; ++i) {
    const int r = row0 + i;
    /* the reference sees the values as stored in the dtype */
    for (int64_t c = 0; c < b->vocab; ++c) {
      uint32_t tmp = 0;
      fxStore(&tmp, 0, fxSelValue(r, c, b->vocab, b->v_local, step), b->dtype);
      b->h_row[c] = fxLoad(&tmp, 0, b->dtype);
    }
    if (k == 0) {
      int64_t wi;
      float wv;
      double wl;
      fxRefArgmax(b->h_row, limit, &wi, &wv, &wl);
      const float gv = fxLoad(val, (size_t)i, b->dtype);
      int ok = idx[i] == wi && sameFloat(gv, wv);
      if (lse != NULL) {
        const float gl = lse[i];
        const int lok = (wl != wl && gl != gl) || (isinf(wl) && gl == (float)wl) ||
                        (isfinite(wl) && fabs((double)gl - wl) <= 1e-4 * fmax(1.0, fabs(wl)));
        ok = ok && lok;
        if (!lok && bad < 5)
          fprintf(stderr, "  %s row %d: lse %.7g, want %.7g\n", what, r, gl, wl);
      }
      if (!ok && bad < 5)
        fprintf(stderr, "  %s row %d: index %lld value %g, want %lld %g\n", what, r,
                (long long)idx[i], gv, (long long)wi, wv);
      bad += !ok;
    } else {
      int64_t wi[MAXK];
      float wv[MAXK];
      fxRefTopK(b->h_row, limit, k, wi, wv);
      for (int j = 0; j < k; ++j) {
        const int64_t gi = idx[(size_t)i * k + j];
        const float gv = fxLoad(val, (size_t)i * k + j, b->dtype);
        const int ok = gi == wi[j] && sameFloat(gv, wv[j]);
        if (!ok && bad < 5)
          fprintf(stderr, "  %s row %d [%d]: index %lld value %g, want %lld %g\n", what, r, j,
                  (long long)gi, gv, (long long)wi[j], wv[j]);
        bad += !ok;
      }
    }
  }
  return bad;
}

/* Checks rows [0, rows) of the argmax (k == 0) or top-k outputs. */
GT_FN int selCheck(SelBufs* b, int rows, int step, int64_t limit, int k, int want_lse,
                    const char* what) {
  const size_t es = dpsDataTypeSize(b->dtype);
  /* wait for the calls first: a pageable copy queued behind a kernel that
   * polls for a peer would hold the host thread (and the driver's staging)
   * while that peer's thread needs them to launch its side */
  GT_CUDA(cudaStreamSynchronize(b->s));
  if (k == 0) {
    GT_CUDA(cudaMemcpyAsync(b->h_idx, b->d_idx, (size_t)rows * 8, cudaMemcpyDeviceToHost, b->s));
    GT_CUDA(cudaMemcpyAsync(b->h_val, b->d_val, (size_t)rows * es, cudaMemcpyDeviceToHost, b->s));
    if (want_lse)
      GT_CUDA(cudaMemcpyAsync(b->h_lse, b->d_lse, (size_t)rows * 4, cudaMemcpyDeviceToHost, b->s));
  } else {
    GT_CUDA(cudaMemcpyAsync(b->h_tidx, b->d_tidx, (size_t)rows * k * 8, cudaMemcpyDeviceToHost, b->s));
    GT_CUDA(cudaMemcpyAsync(b->h_tval, b->d_tval, (size_t)rows * k * es, cudaMemcpyDeviceToHost, b->s));
  }
  GT_CUDA(cudaStreamSynchronize(b->s));
  const long bad = k == 0 ? selCompare(b, 0, rows, step, limit, 0, b->h_idx, b->h_val,
                                       want_lse ? b->h_lse : NULL, what)
                          : selCompare(b, 0, rows, step, limit, k, b->h_tidx, b->h_tval, NULL,
                                       what);
  FX_CHECK(bad == 0, "%s: %ld values wrong", what, bad);
  return 0;
}


#endif /* DPS_SELECT_COMMON_H_ */
