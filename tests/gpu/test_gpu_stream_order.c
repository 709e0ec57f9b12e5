/* Stream order when the previous kernel lets its dependents launch early
 * (docs/api.md, "Streams"): every operation's kernels, launched with
 * programmatic dependent launch where the library uses it, must wait for the
 * previous kernel on the stream before they read their inputs. Before every
 * call a writer kernel (early_writer.cu) that triggers its dependents at once
 * and writes the call's inputs only after 0.3 ms is enqueued on the same
 * stream; the inputs hold other values until then (old logits: argmax 0).
 * A kernel that read before its wait would compute from the old values.
 * Every operation, tp = 1, both backends; outputs against the host reference
 * of the new inputs. With DPSAMPLING_PDL=0 (plain stream order) it must pass
 * as well. Usage: test_gpu_stream_order [nccl|onesided|all] */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"
#include "verify_ref.h"

cudaError_t gtLaunchEarlyWriter(void* dst, const void* src, size_t bytes, unsigned long long ns,
                                cudaStream_t stream);

enum { PAD_BS = 8, N = 4, ROWS = PAD_BS * N, K = 4, VOUT = 2 * ROWS + PAD_BS };
#define V 4096LL
#define SPIN_NS 300000ull /* far longer than a launch */

/* The new logits: -1 but for 4, 3, 2, 1 at columns top(r, 0..3) (never 0). */
static int64_t top(int r, int j) { return 1 + ((int64_t)r * 97 + (int64_t)j * 1031) % (V - 1); }

typedef struct {
  dpsComm_t comm;
  cudaStream_t s;
  uint16_t *h_old, *h_new;  /* bf16 [ROWS, V] */
  float* h_newf;            /* the new logits as floats */
  void *d_x, *d_xnew;       /* the call's logits, the writer's source */
  int32_t h_vold[VOUT], h_vnew[VOUT]; /* predict, accept_index [ROWS], accept_length [PAD_BS] */
  int32_t *d_v, *d_vnew;
  float h_lpold[ROWS], h_lpnew[ROWS];
  float *d_lp, *d_lpnew;
  int32_t h_cand[ROWS];
  int32_t* d_cand;
  int64_t* d_idx;  /* [ROWS * K] */
  float* d_lps;    /* [ROWS] */
  const char* be;
} Ctx;

/* Old values now; the writer puts the new ones there after SPIN_NS. */
static int stage(Ctx* c, void* d_dst, const void* h_old, const void* d_new, size_t bytes) {
  GT_CUDA(cudaMemcpy(d_dst, h_old, bytes, cudaMemcpyHostToDevice));
  GT_CUDA(gtLaunchEarlyWriter(d_dst, d_new, bytes, SPIN_NS, c->s));
  return 0;
}

static int stageLogits(Ctx* c) {
  return stage(c, c->d_x, c->h_old, c->d_xnew, (size_t)ROWS * V * 2);
}

static int checkTokens(Ctx* c, const char* what, const int64_t* h_tok) {
  for (int r = 0; r < ROWS; ++r)
    FX_CHECK(h_tok[r] == top(r, 0), "%s %s row %d: token %lld, want %lld (0: read before the "
             "writer finished)", c->be, what, r, (long long)h_tok[r], (long long)top(r, 0));
  return 0;
}

static int caseSwap(Ctx* c) {
  void* out = NULL;
  if (stageLogits(c)) return 1;
  FX_CHECK_OK(dpsSwapBatchVocab(c->comm, c->d_x, ROWS, V, dpsBfloat16, PAD_BS, &out, c->s));
  GT_CUDA(cudaStreamSynchronize(c->s));
  uint16_t* h = (uint16_t*)malloc((size_t)ROWS * V * 2);
  FX_CHECK(h != NULL, "malloc");
  GT_CUDA(cudaMemcpy(h, out, (size_t)ROWS * V * 2, cudaMemcpyDeviceToHost));
  const int same = memcmp(h, c->h_new, (size_t)ROWS * V * 2) == 0;
  free(h);
  FX_CHECK(same, "%s swap: the output is not the new logits", c->be);
  return 0;
}

static int caseGathers(Ctx* c) {
  int32_t *po, *aio, *alo;
  if (stage(c, c->d_v, c->h_vold, c->d_vnew, sizeof c->h_vold)) return 1;
  FX_CHECK_OK(dpsGatherVerifyOutputs(c->comm, c->d_v, c->d_v + ROWS, c->d_v + 2 * ROWS, PAD_BS, N,
                                     PAD_BS, &po, &aio, &alo, c->s));
  GT_CUDA(cudaStreamSynchronize(c->s));
  int32_t h[VOUT];
  GT_CUDA(cudaMemcpy(h, po, ROWS * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(h + ROWS, aio, ROWS * 4, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(h + 2 * ROWS, alo, PAD_BS * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < VOUT; ++i)
    FX_CHECK(h[i] == c->h_vnew[i], "%s gather_verify_outputs word %d: %d, want %d", c->be, i, h[i],
             c->h_vnew[i]);
  float* lo;
  if (stage(c, c->d_lp, c->h_lpold, c->d_lpnew, sizeof c->h_lpold)) return 1;
  FX_CHECK_OK(dpsGatherVerifyLogprobs(c->comm, c->d_lp, PAD_BS, N, PAD_BS, &lo, c->s));
  GT_CUDA(cudaStreamSynchronize(c->s));
  float hl[ROWS];
  GT_CUDA(cudaMemcpy(hl, lo, sizeof hl, cudaMemcpyDeviceToHost));
  for (int i = 0; i < ROWS; ++i)
    FX_CHECK(hl[i] == c->h_lpnew[i], "%s gather_verify_logprobs %d: %g, want %g", c->be, i,
             hl[i], c->h_lpnew[i]);
  return 0;
}

static int caseSelect(Ctx* c) {
  int64_t h[ROWS * K];
  if (stageLogits(c)) return 1;
  FX_CHECK_OK(dpsArgmax(c->comm, c->d_x, ROWS, V, dpsBfloat16, V, NULL, c->d_idx, NULL, c->s));
  GT_CUDA(cudaStreamSynchronize(c->s));
  GT_CUDA(cudaMemcpy(h, c->d_idx, ROWS * 8, cudaMemcpyDeviceToHost));
  if (checkTokens(c, "argmax", h)) return 1;
  if (stageLogits(c)) return 1;
  FX_CHECK_OK(dpsTopK(c->comm, c->d_x, ROWS, V, dpsBfloat16, K, V, NULL, c->d_idx, c->s));
  GT_CUDA(cudaStreamSynchronize(c->s));
  GT_CUDA(cudaMemcpy(h, c->d_idx, sizeof h, cudaMemcpyDeviceToHost));
  for (int r = 0; r < ROWS; ++r) {
    int64_t want[K];
    float wv[K];
    fxRefTopK(c->h_newf + (size_t)r * V, V, K, want, wv);
    for (int j = 0; j < K; ++j)
      FX_CHECK(h[r * K + j] == want[j], "%s topk row %d [%d]: %lld, want %lld", c->be, r, j,
               (long long)h[r * K + j], (long long)want[j]);
  }
  return 0;
}

/* T = 0 (argmax's pass), and T = 0.7 with top-k 1 (the sampling pass; the
 * only kept token is the maximum), with the logprob checked there. */
static int caseSample(Ctx* c) {
  int64_t h[ROWS];
  for (int v = 0; v < 2; ++v) {
    dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
    p.temperature = v == 0 ? 0.f : 0.7f;
    p.top_k = v == 0 ? 0 : 1;
    p.seed = 3;
    if (stageLogits(c)) return 1;
    FX_CHECK_OK(dpsSample(c->comm, c->d_x, ROWS, V, dpsBfloat16, V, &p, c->d_idx,
                          v == 0 ? NULL : c->d_lps, c->s));
    GT_CUDA(cudaStreamSynchronize(c->s));
    GT_CUDA(cudaMemcpy(h, c->d_idx, sizeof h, cudaMemcpyDeviceToHost));
    if (checkTokens(c, v == 0 ? "sample T=0" : "sample T=0.7 top-k 1", h)) return 1;
    if (v == 1) {
      float lp[ROWS];
      GT_CUDA(cudaMemcpy(lp, c->d_lps, sizeof lp, cudaMemcpyDeviceToHost));
      int64_t wi;
      float wv;
      double lse;
      for (int r = 0; r < ROWS; ++r) {
        fxRefArgmax(c->h_newf + (size_t)r * V, V, &wi, &wv, &lse);
        const double want = (double)wv - lse;
        FX_CHECK(fabs((double)lp[r] - want) <= 1e-4 * fmax(1.0, fabs(want)),
                 "%s sample row %d: logprob %.7g, want %.7g", c->be, r, lp[r], want);
      }
    }
  }
  return 0;
}

/* The drafts of request b match the new argmax for its first b % N
 * positions, then 0 (the old logits' argmax). */
static int caseVerify(Ctx* c) {
  int64_t tok[ROWS];
  for (int r = 0; r < ROWS; ++r) tok[r] = top(r, 0);
  int32_t wp[ROWS], wai[ROWS], wal[PAD_BS];
  FX_CHECK(fxRefVerifyChain(c->h_cand, tok, PAD_BS, N, wp, wai, wal) == 0, "reference walk");
  for (int v = 0; v < 2; ++v) {
    dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
    p.temperature = v == 0 ? 0.f : 0.7f;
    p.top_k = v == 0 ? 0 : 1;
    int32_t *po, *aio, *alo;
    if (stageLogits(c)) return 1;
    FX_CHECK_OK(dpsVerifyChain(c->comm, c->d_x, ROWS, V, dpsBfloat16, V, PAD_BS, c->d_cand, &p,
                               NULL, 0.f, &po, &aio, &alo, NULL, c->s));
    GT_CUDA(cudaStreamSynchronize(c->s));
    int32_t hp[ROWS], hai[ROWS], hal[PAD_BS];
    GT_CUDA(cudaMemcpy(hp, po, sizeof hp, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(hai, aio, sizeof hai, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(hal, alo, sizeof hal, cudaMemcpyDeviceToHost));
    for (int b = 0; b < PAD_BS; ++b)
      FX_CHECK(hal[b] == wal[b], "%s verify T=%g request %d: accept_length %d, want %d", c->be,
               p.temperature, b, hal[b], wal[b]);
    for (int i = 0; i < ROWS; ++i)
      FX_CHECK(hp[i] == wp[i] && hai[i] == wai[i],
               "%s verify T=%g entry %d: predict %d accept_index %d, want %d %d", c->be,
               p.temperature, i, hp[i], hai[i], wp[i], wai[i]);
  }
  return 0;
}

static int fill(Ctx* c) {
  const size_t n = (size_t)ROWS * V;
  c->h_old = (uint16_t*)malloc(n * 2);
  c->h_new = (uint16_t*)malloc(n * 2);
  c->h_newf = (float*)malloc(n * sizeof(float));
  FX_CHECK(c->h_old && c->h_new && c->h_newf, "malloc");
  for (int r = 0; r < ROWS; ++r)
    for (int64_t j = 0; j < V; ++j) {
      const size_t i = (size_t)r * V + (size_t)j;
      fxStore(c->h_old, i, j == 0 ? 5.f : -1.f, dpsBfloat16);
      c->h_newf[i] = -1.f;
    }
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < K; ++j) c->h_newf[(size_t)r * V + (size_t)top(r, j)] = (float)(K - j);
  for (size_t i = 0; i < n; ++i) fxStore(c->h_new, i, c->h_newf[i], dpsBfloat16);
  for (int i = 0; i < VOUT; ++i) {
    c->h_vold[i] = -7;
    c->h_vnew[i] = 1000 + 3 * i;
  }
  for (int i = 0; i < ROWS; ++i) {
    c->h_lpold[i] = -99.f;
    c->h_lpnew[i] = -0.25f * (float)(i + 1);
  }
  for (int b = 0; b < PAD_BS; ++b)
    for (int i = 0; i < N; ++i)
      c->h_cand[b * N + i] = i == 0 ? 7 : i <= b % N ? (int32_t)top(b * N + i - 1, 0) : 0;
  GT_CUDA(cudaMalloc(&c->d_x, n * 2));
  GT_CUDA(cudaMalloc(&c->d_xnew, n * 2));
  GT_CUDA(cudaMemcpy(c->d_xnew, c->h_new, n * 2, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMalloc((void**)&c->d_v, sizeof c->h_vnew));
  GT_CUDA(cudaMalloc((void**)&c->d_vnew, sizeof c->h_vnew));
  GT_CUDA(cudaMemcpy(c->d_vnew, c->h_vnew, sizeof c->h_vnew, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMalloc((void**)&c->d_lp, sizeof c->h_lpnew));
  GT_CUDA(cudaMalloc((void**)&c->d_lpnew, sizeof c->h_lpnew));
  GT_CUDA(cudaMemcpy(c->d_lpnew, c->h_lpnew, sizeof c->h_lpnew, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMalloc((void**)&c->d_cand, sizeof c->h_cand));
  GT_CUDA(cudaMemcpy(c->d_cand, c->h_cand, sizeof c->h_cand, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMalloc((void**)&c->d_idx, ROWS * K * sizeof(int64_t)));
  GT_CUDA(cudaMalloc((void**)&c->d_lps, ROWS * sizeof(float)));
  return 0;
}

static void release(Ctx* c) {
  cudaFree(c->d_x);
  cudaFree(c->d_xnew);
  cudaFree(c->d_v);
  cudaFree(c->d_vnew);
  cudaFree(c->d_lp);
  cudaFree(c->d_lpnew);
  cudaFree(c->d_cand);
  cudaFree(c->d_idx);
  cudaFree(c->d_lps);
  free(c->h_old);
  free(c->h_new);
  free(c->h_newf);
}

static int body(dpsBackend_t backend) {
  Ctx c;
  memset(&c, 0, sizeof c);
  c.be = dpsBackendName(backend);
  dpsConfig_t cfg = gtConfig(0, 1, PAD_BS, N, V, dpsBfloat16, backend);
  int rc = gtCreate(&c.comm, &cfg);
  if (rc) return rc;
  GT_CUDA(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
  rc = fill(&c);
  /* each case twice: the second call of an operation takes its warm path */
  for (int rep = 0; rep < 2 && rc == 0; ++rep)
    rc = caseSwap(&c) || caseGathers(&c) || caseSelect(&c) || caseSample(&c) || caseVerify(&c);
  release(&c);
  cudaStreamDestroy(c.s);
  FX_CHECK_OK(dpsCommDestroy(c.comm));
  if (rc == 0) printf("  %s: swap, gathers, argmax, topk, sample, verify_chain in order\n", c.be);
  return rc;
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_stream_order", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  return gtRunTp1("test_gpu_stream_order", body, backends, nb, 300);
}
