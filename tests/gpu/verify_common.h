/* Requests, their parameters and the chain-walk checks of the
 * dpsVerifyChain tests (test_gpu_verify; test_gpu_virtual_ranks
 * scenario=verify, tests/gpu/vr/vr_verify.c): header-only, static. Include
 * after gpu_common.h and sample_common.h. */
#ifndef DPS_VERIFY_COMMON_H_
#define DPS_VERIFY_COMMON_H_

#include "verify_ref.h"

#define VFY_MAX_REQS 4096

/* ---- per-request parameters on the device ------------------------------------------- */
typedef struct {
  int pad_bs, n;
  float *T, *top_p, *min_p; /* [pad_bs] */
  int32_t* k32;
  uint64_t *seed, *offset;
  /* expanded per row (dpsSample's view of the same draws) */
  float *rT, *rtop_p, *rmin_p;
  int32_t* rk32;
  uint64_t *rseed, *roffset;
  int32_t* cand;  /* [pad_bs, n] */
  int32_t* mask;  /* [pad_bs*n, words] or NULL */
  int64_t* tok;   /* [pad_bs*n] dpsSample's tokens */
  float* lp;
} Req;

GT_FN void reqFree(Req* q) {
  void* p[] = {q->T, q->top_p, q->min_p, q->k32, q->seed, q->offset, q->rT, q->rtop_p,
               q->rmin_p, q->rk32, q->rseed, q->roffset, q->cand, q->mask, q->tok, q->lp};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) cudaFree(p[i]);
  memset(q, 0, sizeof *q);
}

GT_FN int reqAlloc(Req* q, int pad_bs, int n, int64_t words) {
  memset(q, 0, sizeof *q);
  q->pad_bs = pad_bs, q->n = n;
  const size_t B = (size_t)pad_bs, R = B * (size_t)n;
  GT_CUDA(cudaMalloc((void**)&q->T, B * 4));
  GT_CUDA(cudaMalloc((void**)&q->top_p, B * 4));
  GT_CUDA(cudaMalloc((void**)&q->min_p, B * 4));
  GT_CUDA(cudaMalloc((void**)&q->k32, B * 4));
  GT_CUDA(cudaMalloc((void**)&q->seed, B * 8));
  GT_CUDA(cudaMalloc((void**)&q->offset, B * 8));
  GT_CUDA(cudaMalloc((void**)&q->rT, R * 4));
  GT_CUDA(cudaMalloc((void**)&q->rtop_p, R * 4));
  GT_CUDA(cudaMalloc((void**)&q->rmin_p, R * 4));
  GT_CUDA(cudaMalloc((void**)&q->rk32, R * 4));
  GT_CUDA(cudaMalloc((void**)&q->rseed, R * 8));
  GT_CUDA(cudaMalloc((void**)&q->roffset, R * 8));
  GT_CUDA(cudaMalloc((void**)&q->cand, R * 4));
  GT_CUDA(cudaMalloc((void**)&q->tok, R * 8));
  GT_CUDA(cudaMalloc((void**)&q->lp, R * 4));
  if (words > 0) GT_CUDA(cudaMalloc((void**)&q->mask, R * (size_t)words * 4));
  return 0;
}

/* Host values of the requests' parameters. */
typedef struct {
  float T[VFY_MAX_REQS], top_p[VFY_MAX_REQS], min_p[VFY_MAX_REQS];
  int32_t k[VFY_MAX_REQS];
  uint64_t seed[VFY_MAX_REQS], offset[VFY_MAX_REQS];
} ReqHost;

/* Uploads request parameters, and the same expanded per row. */
GT_FN int reqUpload(Req* q, const ReqHost* h, cudaStream_t s) {
  const int B = q->pad_bs, n = q->n;
  const size_t R = (size_t)B * n;
  float *rT = malloc(R * 4), *rp = malloc(R * 4), *rm = malloc(R * 4);
  int32_t* rk = malloc(R * 4);
  uint64_t *rs = malloc(R * 8), *ro = malloc(R * 8);
  FX_CHECK(rT && rp && rm && rk && rs && ro, "host alloc");
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < n; ++j) {
      const size_t r = (size_t)b * n + j;
      rT[r] = h->T[b], rp[r] = h->top_p[b], rm[r] = h->min_p[b], rk[r] = h->k[b];
      rs[r] = h->seed[b], ro[r] = fxRefVerifyOffset(h->offset[b], j);
    }
  GT_CUDA(cudaMemcpyAsync(q->T, h->T, (size_t)B * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->top_p, h->top_p, (size_t)B * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->min_p, h->min_p, (size_t)B * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->k32, h->k, (size_t)B * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->seed, h->seed, (size_t)B * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->offset, h->offset, (size_t)B * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->rT, rT, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->rtop_p, rp, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->rmin_p, rm, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->rk32, rk, R * 4, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->rseed, rs, R * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaMemcpyAsync(q->roffset, ro, R * 8, cudaMemcpyHostToDevice, s));
  GT_CUDA(cudaStreamSynchronize(s));
  free(rT), free(rp), free(rm), free(rk), free(rs), free(ro);
  return 0;
}

GT_FN dpsSampleParams_t reqParams(const Req* q, int per_row) {
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  p.temperatures = per_row ? q->rT : q->T;
  p.top_ps = per_row ? q->rtop_p : q->top_p;
  p.min_ps = per_row ? q->rmin_p : q->min_p;
  p.top_ks = per_row ? q->rk32 : q->k32;
  p.seeds = per_row ? q->rseed : q->seed;
  p.offsets = per_row ? q->roffset : q->offset;
  return p;
}

/* Candidates from the tokens t: request b accepts exactly acc_b =
 * (b + shift) % n drafts (then one wrong draft, then arbitrary ones). */
GT_FN void makeCandidatesShift(const int64_t* t, int B, int n, int64_t V, int shift,
                               int32_t* cand) {
  uint64_t s = 0x5eed;
  for (int b = 0; b < B; ++b) {
    const int acc = (b + shift) % n;
    cand[(size_t)b * n] = (int32_t)(fxSplitmix(&s) % (uint64_t)V);
    for (int i = 1; i < n; ++i) {
      const int64_t prev = t[(size_t)b * n + i - 1];
      cand[(size_t)b * n + i] = i <= acc        ? (int32_t)prev
                                : i == acc + 1 ? (int32_t)((prev + 1) % V)
                                               : (int32_t)(fxSplitmix(&s) % (uint64_t)V);
    }
  }
}

/* The same with acc_b = b % n (checkWalk's want_acc). */
GT_FN void makeCandidates(const int64_t* t, int B, int n, int64_t V, int32_t* cand) {
  makeCandidatesShift(t, B, n, V, 0, cand);
}

/* The outputs of one dpsVerifyChain call, downloaded. */
typedef struct {
  int32_t *pr, *ai, *al;
  float* lp;
} Out;

GT_FN int outAlloc(Out* o, size_t rows) {
  o->pr = malloc(rows * 4), o->ai = malloc(rows * 4), o->al = malloc(rows * 4);
  o->lp = malloc(rows * 4);
  FX_CHECK(o->pr && o->ai && o->al && o->lp, "host alloc");
  return 0;
}
GT_FN void outFree(Out* o) { free(o->pr), free(o->ai), free(o->al), free(o->lp); }

GT_FN int verifyCall(dpsComm_t comm, const void* logits, int64_t cols, dpsDataType_t dt,
                      int64_t limit, const Req* q, const int32_t* mask, float cap, Out* o,
                      cudaStream_t s) {
  const dpsSampleParams_t p = reqParams(q, 0);
  int32_t *pr, *ai, *al;
  float* lp;
  FX_CHECK_OK(dpsVerifyChain(comm, logits, (int64_t)q->pad_bs * q->n, cols, dt, limit, q->pad_bs,
                             q->cand, &p, mask, cap, &pr, &ai, &al, &lp, s));
  GT_CUDA(cudaStreamSynchronize(s));
  const size_t R = (size_t)q->pad_bs * q->n;
  GT_CUDA(cudaMemcpy(o->pr, pr, R * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(o->ai, ai, R * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(o->al, al, (size_t)q->pad_bs * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(o->lp, lp, R * 4, cudaMemcpyDeviceToHost));
  return 0;
}

/* Compares o with the walk of t over cand (fxRefVerifyChain) and the
 * tokens' logprobs lp (exactly when `exact`, else within SMP_LP_TOL; NULL:
 * not compared).
 * want_acc >= 0: every request must accept b % n drafts (the design of
 * makeCandidates). Returns the count of wrong requests. */
GT_FN long checkWalk(const char* what, const Out* o, const int32_t* cand, const int64_t* t,
                      const float* lp, int B, int n, int exact, int want_acc) {
  const size_t R = (size_t)B * n;
  int32_t *pr = malloc(R * 4), *ai = malloc(R * 4), *al = malloc((size_t)B * 4);
  if (!pr || !ai || !al || fxRefVerifyChain(cand, t, B, n, pr, ai, al) != 0) {
    fprintf(stderr, "  %s: the host walk failed\n", what);
    return B ? B : 1;
  }
  long bad = 0;
  for (int b = 0; b < B; ++b) {
    int ok = o->al[b] == al[b] && (!want_acc || al[b] == b % n + 1);
    for (int i = 0; i < n; ++i) {
      const size_t r = (size_t)b * n + i;
      const float wl = lp != NULL && i < al[b] ? lp[r] : 0.0f;
      ok = ok && o->pr[r] == pr[r] && o->ai[r] == ai[r] &&
           (lp == NULL || (exact ? smpSameBits(o->lp[r], wl) : smpLpClose(o->lp[r], wl)));
    }
    if (!ok && bad < 5) {
      fprintf(stderr, "  %s: request %d: accept_length %d (want %d):", what, b, o->al[b], al[b]);
      for (int i = 0; i < n; ++i) {
        const size_t r = (size_t)b * n + i;
        fprintf(stderr, " [%d: predict %d/%d index %d/%d lp %.9g/%.9g]", i, o->pr[r], pr[r],
                o->ai[r], ai[r], (double)o->lp[r], (double)(lp && i < al[b] ? lp[r] : 0.0f));
      }
      fprintf(stderr, "\n");
    }
    bad += !ok;
  }
  free(pr), free(ai), free(al);
  return bad;
}

#endif /* DPS_VERIFY_COMMON_H_ */
