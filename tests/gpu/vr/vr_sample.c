/* Scenario sample of test_gpu_virtual_ranks: dpsSample at tp virtual ranks
 * against the tp = 1 result of the same full logits (vr_harness.h).
 *
 * Per dtype (fp32, bf16, fp16) the full logits [SMP_VR_ROWS, SMP_VR_V] are
 * generated once (sample_common.h's mixed rows; V = 840 * 40 divides by every
 * tp in 1..8) with two sets of per-row parameters (A, B) and one set of
 * scalars (S: T 0.8, top-k 300, top-p 0.95: the exact path), one greedy set
 * drawn without logprobs (G: argmax's pass), and their reference tokens. The first run computes the baseline at tp = 1 on both
 * backends (tokens equal to the reference, logprobs within 2e-5, both
 * backends bit-identical); every later group's ranks, each passing its shard
 * [rows, V/tp], must match it bit for bit:
 *  - A with int32 (even tp) or int64 (odd tp) top-k arrays, all rows;
 *  - A on the sub-batch of rows [5, 22) (another position in the batch);
 *  - S (scalar filters, seed and offset arrays);
 *  - G (scalar T = 0, tokens only);
 *  - a graph captured with A's arrays and replayed after B was uploaded
 *    into them;
 *  - and every rank's path counters grew alike;
 *  - an invalid device entry (top_p[9] = 1.5): every rank's call writes
 *    nothing, and every rank counts it and names row and argument. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vr_data.h"

#define SMP_VR_SUB0 5
#define SMP_VR_SUBN 17

const dpsDataType_t kVrDtypes[3] = {dpsFloat32, dpsBfloat16, dpsFloat16};
static SmpData g_smp[3]; /* per dtype: fp32, bf16, fp16 */
static dpsSampleStats_t g_smp_delta[VR_MAX_TP]; /* the ranks' path counters in a group */

static int smpDataInit(SmpData* d, dpsDataType_t dt, int di) {
  if (d->ready) return d->failed;
  d->ready = 1, d->failed = 1;
  const int64_t R = SMP_VR_ROWS, V = SMP_VR_V;
  if (smpHostAlloc(&d->h[0], R, V, dt) || smpHostAlloc(&d->h[1], R, V, dt)) return 1;
  if (smpGenMixed(&d->h[0], 0x243f6a8885a308d3ull + (uint64_t)di, 11 * di, V)) return 1;
  /* B: A's logits, every parameter re-drawn */
  smpHost* b = &d->h[1];
  memcpy(b->row, d->h[0].row, (size_t)R * V * 4);
  memcpy(b->stored, d->h[0].stored, (size_t)R * V * dpsDataTypeSize(dt));
  memcpy(b->kind, d->h[0].kind, (size_t)R * sizeof(int));
  if (smpRedrawParams(b, 0x13198a2e03707344ull + (uint64_t)di, 13 + 5 * di)) return 1;
  d->spec[SET_A] = smpSpecArrays(0);
  d->spec[SET_B] = smpSpecArrays(0);
  const smpSpec s = {SMP_A_SEED | SMP_A_OFF, 0.8f, 300, 0.95f, 0.0f, 0, 0};
  d->spec[SET_S] = s;
  /* greedy everywhere, tokens only: argmax's pass (the arrays ignored) */
  const smpSpec gs = {SMP_A_K32 | SMP_A_SEED | SMP_A_OFF, 0.0f, 0, 1.0f, 0.0f, 0, 0};
  d->spec[SET_G] = gs;
  for (int k = 0; k < NSETS; ++k) {
    const smpHost* h = &d->h[k == SET_B];
    if (smpRef(h, &d->spec[k], 0, R, V, d->rtok[k], d->rlp[k])) return 1;
    int64_t n = R;
    if (k == SET_S) {
      if (smpClearRows(h, &d->spec[k], 0, R, V, d->clear[k], &n)) return 1;
    } else {
      memset(d->clear[k], 1, R);
    }
  }
  d->failed = 0;
  return 0;
}

SmpData* vrSampleData(int di) {
  SmpData* d = &g_smp[di];
  return smpDataInit(d, kVrDtypes[di], di) ? NULL : d;
}

typedef struct {
  int di;
} SmpArg;

typedef struct {
  smpDev* dev;
  VrRank* r;
  const SmpData* d;
  const smpSpec* spec;
  int64_t cols;
  dpsDataType_t dtype;
} SmpCapture;

static int smpEnqueue(VrGroup* g, int rank, void* ctx) {
  SmpCapture* c = (SmpCapture*)ctx;
  const dpsSampleParams_t p = smpDpsParams(c->dev, c->spec, 0);
  VR_OK(g, rank,
        dpsSample(c->r->comm, c->dev->logits, SMP_VR_ROWS, c->cols, c->dtype, SMP_VR_V, &p,
                  c->dev->tok, c->dev->lp, c->r->s));
  return 0;
}

/* Compares rows [r0, r0 + n) of set k: with the baseline bit for bit, or
 * (tp = 1) with the reference, and stores or compares the baseline. */
static int smpCheck(VrGroup* g, int rank, SmpData* d, int k, int64_t r0, int64_t n,
                    const int64_t* tok, const float* lp, const char* what) {
  char msg[400];
  snprintf(msg, sizeof msg, "%s rank %d: sample %s", g->desc, rank, what);
  long bad = 0;
  if (g->tp == 1) {
    bad += smpCheckRef(msg, &d->h[k == SET_B], &d->spec[k], r0, n, SMP_VR_V, tok, lp,
                       d->rtok[k] + r0, d->rlp[k] + r0, d->clear[k] + r0);
  }
  if (d->have_base) {
    bad += smpCheckSame(msg, n, tok, lp, d->btok[k] + r0, d->blp[k] + r0, NULL);
  } else if (g->tp == 1 && r0 == 0 && n == SMP_VR_ROWS) {
    memcpy(d->btok[k], tok, sizeof d->btok[k]);
    if (lp) memcpy(d->blp[k], lp, sizeof d->blp[k]);
  }
  if (vrCount(g, bad == 0)) {
    fprintf(stderr, "%s: %ld rows differ from the %s\n", msg, bad,
            d->have_base ? "tp = 1 result" : "reference");
    return 1;
  }
  return 0;
}

/* One eager call of set k on rows [r0, r0 + n) of dev, every rank together
 * (set G without logprobs). */
static int smpEager(VrGroup* g, int rank, smpDev* dev, SmpData* d, int k, int use_i64, int64_t r0,
                    int64_t n, int64_t* tok, float* lp, const char* what) {
  VrRank* r = &g->r[rank];
  smpSpec spec = d->spec[k];
  if (use_i64 && (spec.arrays & SMP_A_K32)) spec.arrays = (spec.arrays & ~SMP_A_K32) | SMP_A_K64;
  const dpsSampleParams_t p = smpDpsParams(dev, &spec, r0);
  const size_t es = dpsDataTypeSize(g->cfg.dtype);
  VR_CUDA(g, rank, cudaMemsetAsync(dev->tok, 0xab, (size_t)n * 8, r->s));
  if (vrBarrier(g)) return 1;
  const int want_lp = k != SET_G;
  VR_OK(g, rank,
        dpsSample(r->comm, (const char*)dev->logits + (size_t)r0 * g->v_local * es, n, g->v_local,
                  g->cfg.dtype, SMP_VR_V, &p, dev->tok, want_lp ? dev->lp : NULL, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  if (vrCheckAsync(g, rank, what)) return 1;
  VR_CUDA(g, rank, cudaMemcpy(tok, dev->tok, (size_t)n * 8, cudaMemcpyDeviceToHost));
  if (want_lp) VR_CUDA(g, rank, cudaMemcpy(lp, dev->lp, (size_t)n * 4, cudaMemcpyDeviceToHost));
  return smpCheck(g, rank, d, k, r0, n, tok, want_lp ? lp : NULL, what);
}

/* An invalid device entry (top_p[9] = 1.5) seen by every rank: each call
 * succeeds and writes nothing, and each rank counts it and names the row
 * and the argument. */
static int smpInvalidEntry(VrGroup* g, int rank, SmpData* d, smpDev* dev) {
  VrRank* r = &g->r[rank];
  const int64_t R = SMP_VR_ROWS;
  const int bad_row = 9;
  const float bad_p = 1.5f;
  char what[320];
  snprintf(what, sizeof what, "%s rank %d: sample with top_p[%d] = 1.5", g->desc, rank, bad_row);
  if (smpDevUploadParams(dev, &d->h[0], 0, R, r->s)) return vrCount(g, 0);
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  VR_CUDA(g, rank, cudaMemcpy(dev->top_p + bad_row, &bad_p, 4, cudaMemcpyHostToDevice));
  VR_CUDA(g, rank, cudaMemsetAsync(dev->tok, 0x5a, (size_t)R * 8, r->s));
  VR_CUDA(g, rank, cudaMemsetAsync(dev->lp, 0x5a, (size_t)R * 4, r->s));
  dpsSampleStats_t s0, s1;
  VR_OK(g, rank, dpsCommGetSampleStats(r->comm, &s0));
  if (vrBarrier(g)) return 1;
  const dpsSampleParams_t p = smpDpsParams(dev, &d->spec[SET_A], 0);
  VR_OK(g, rank,
        dpsSample(r->comm, dev->logits, R, g->v_local, g->cfg.dtype, SMP_VR_V, &p, dev->tok,
                  dev->lp, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  if (vrCheckAsync(g, rank, what)) return 1;
  unsigned char tok[SMP_VR_ROWS * 8], lp[SMP_VR_ROWS * 4];
  VR_CUDA(g, rank, cudaMemcpy(tok, dev->tok, sizeof tok, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(lp, dev->lp, sizeof lp, cudaMemcpyDeviceToHost));
  size_t written = 0;
  for (size_t i = 0; i < sizeof tok; ++i) written += tok[i] != 0x5a;
  for (size_t i = 0; i < sizeof lp; ++i) written += lp[i] != 0x5a;
  VR_OK(g, rank, dpsCommGetSampleStats(r->comm, &s1));
  const char* msg = dpsGetLastError();
  const int named = strstr(msg, "top_p") != NULL &&
                    (strstr(msg, "row 9") != NULL || strstr(msg, "[9]") != NULL);
  const uint64_t drawn0 = s0.rows_greedy + s0.rows_fast + s0.rows_exact;
  const uint64_t drawn1 = s1.rows_greedy + s1.rows_fast + s1.rows_exact;
  if (vrCount(g, written == 0 && s1.invalid_calls == s0.invalid_calls + 1 && drawn1 == drawn0 &&
                     named)) {
    fprintf(stderr,
            "%s: %zu output bytes written, invalid_calls %llu -> %llu, rows counted %llu, "
            "message \"%s\"\n",
            what, written, (unsigned long long)s0.invalid_calls,
            (unsigned long long)s1.invalid_calls, (unsigned long long)(drawn1 - drawn0), msg);
    return 1;
  }
  return 0;
}

static int bodySampleRun(VrGroup* g, int rank, SmpData* d, smpDev* dev) {
  VrRank* r = &g->r[rank];
  const int64_t R = SMP_VR_ROWS, col0 = (int64_t)rank * g->v_local;
  int64_t tok[SMP_VR_ROWS];
  float lp[SMP_VR_ROWS];
  dpsSampleStats_t st0, st1;
  VR_OK(g, rank, dpsCommGetSampleStats(r->comm, &st0));
  if (smpDevUpload(dev, &d->h[0], 0, R, col0, r->s)) return vrCount(g, 0);
  if (smpEager(g, rank, dev, d, SET_A, g->tp % 2, 0, R, tok, lp, "A (arrays)")) return 1;
  if (smpEager(g, rank, dev, d, SET_A, 0, SMP_VR_SUB0, SMP_VR_SUBN, tok, lp, "A rows [5, 22)"))
    return 1;
  if (smpEager(g, rank, dev, d, SET_S, 0, 0, R, tok, lp, "S (scalars)")) return 1;
  if (smpEager(g, rank, dev, d, SET_G, 0, 0, R, tok, lp, "G (greedy, tokens only)")) return 1;
  /* a graph captured with A's arrays, replayed with B's contents in them */
  SmpCapture cap = {dev, r, d, &d->spec[SET_A], g->v_local, g->cfg.dtype};
  if (vrBarrier(g) || vrCaptureOps(g, rank, smpEnqueue, &cap)) return 1;
  if (smpDevUploadParams(dev, &d->h[1], 0, R, r->s)) return vrCount(g, 0);
  VR_CUDA(g, rank, cudaMemsetAsync(dev->tok, 0xab, (size_t)R * 8, r->s));
  VR_CUDA(g, rank, cudaStreamSynchronize(r->s));
  if (vrBarrier(g) || vrReplay(g, rank)) return 1;
  if (vrCheckAsync(g, rank, "graph replay")) return 1;
  VR_CUDA(g, rank, cudaMemcpy(tok, dev->tok, (size_t)R * 8, cudaMemcpyDeviceToHost));
  VR_CUDA(g, rank, cudaMemcpy(lp, dev->lp, (size_t)R * 4, cudaMemcpyDeviceToHost));
  if (smpCheck(g, rank, d, SET_B, 0, R, tok, lp, "B (graph replay)")) return 1;
  /* every rank took the same paths */
  VR_OK(g, rank, dpsCommGetSampleStats(r->comm, &st1));
  g_smp_delta[rank].rows_greedy = st1.rows_greedy - st0.rows_greedy;
  g_smp_delta[rank].rows_fast = st1.rows_fast - st0.rows_fast;
  g_smp_delta[rank].rows_exact = st1.rows_exact - st0.rows_exact;
  g_smp_delta[rank].invalid_calls = st1.invalid_calls - st0.invalid_calls;
  if (vrBarrier(g)) return 1;
  const dpsSampleStats_t* a = &g_smp_delta[rank];
  const dpsSampleStats_t* z = &g_smp_delta[0];
  const uint64_t rows = (uint64_t)(4 * R + SMP_VR_SUBN);
  if (vrCount(g, a->rows_greedy == z->rows_greedy && a->rows_fast == z->rows_fast &&
                     a->rows_exact == z->rows_exact && a->invalid_calls == 0 &&
                     a->rows_greedy + a->rows_fast + a->rows_exact == rows)) {
    fprintf(stderr,
            "%s rank %d: path counters greedy %llu fast %llu exact %llu invalid %llu (rank 0: "
            "%llu %llu %llu; %llu rows drawn)\n",
            g->desc, rank, (unsigned long long)a->rows_greedy, (unsigned long long)a->rows_fast,
            (unsigned long long)a->rows_exact, (unsigned long long)a->invalid_calls,
            (unsigned long long)z->rows_greedy, (unsigned long long)z->rows_fast,
            (unsigned long long)z->rows_exact, (unsigned long long)rows);
    return 1;
  }
  return smpInvalidEntry(g, rank, d, dev);
}

typedef struct {
  SmpData* d;
  smpDev dev;
} SmpBody;

static int smpAlloc(VrGroup* g, int rank, void* p) {
  (void)rank;
  return smpDevAlloc(&((SmpBody*)p)->dev, SMP_VR_ROWS, g->v_local, g->cfg.dtype);
}
static int smpRun(VrGroup* g, int rank, void* p) {
  SmpBody* b = (SmpBody*)p;
  return bodySampleRun(g, rank, b->d, &b->dev);
}
static void smpRelease(void* p) { smpDevFree(&((SmpBody*)p)->dev); }

static int bodySample(VrGroup* g, int rank, const void* argp) {
  SmpBody b;
  memset(&b, 0, sizeof b);
  b.d = &g_smp[((const SmpArg*)argp)->di];
  return vrRunWithBuffers(g, rank, smpAlloc, smpRun, smpRelease, &b);
}

static void smpRunOne(VrTally* t, int tp, int backend, int di) {
  VrCfg c = {kVrDtypes[di], SMP_VR_V / tp, 1, SMP_VR_ROWS, VR_GATHER_LL, 1, VR_LL_DEFAULT, 0};
  SmpArg arg = {di};
  vrRunGroup(t, tp, backend, &c, 1, tp + di, bodySample, &arg, "sample");
}

void vrRunSample(VrTally* t, int tp, int backend) {
  const int di = (tp + backend) % 3;
  SmpData* d = &g_smp[di];
  if (smpDataInit(d, kVrDtypes[di], di) || d->base_failed) {
    fprintf(stderr, "sample: no %s rows or no tp=1 result to compare with\n",
            dpsDataTypeName(kVrDtypes[di]));
    t->failed++;
    return;
  }
  if (!d->have_base) { /* tp = 1 on the backends asked for: the reference, then each other */
    for (int b = 0; b < 2; ++b) {
      if (!(g_vr.backends & (1 << b))) continue;
      const long before = t->failed;
      smpRunOne(t, 1, b, di);
      if (t->failed != before) {
        d->base_failed = 1; /* the data stay valid (scenario mixed) */
        return;
      }
      d->have_base = 1; /* a second backend compares with the first bit for bit */
    }
    printf("  sample %s: tp=1 equal to the reference%s\n", dpsDataTypeName(kVrDtypes[di]),
           g_vr.backends == 3 ? ", nccl and onesided bit for bit" : "");
  }
  smpRunOne(t, tp, backend, di);
}
