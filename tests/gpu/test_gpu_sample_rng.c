/* Host and device evaluate src/core/sample_rng.h bit for bit alike (one GPU):
 * the noise of a 32-bit word v on a stride over all 2^32 values (every v
 * with DPS_SAMPLE_RNG_EXHAUSTIVE=1; the stride 257 reaches 0 and 2^32 - 1):
 * -log(U(v)), Emin of v as a group's word (every w >> 3 from 0 to 2^29 - 1
 * on the stride), G at a group's position and away from it; the noise of
 * chosen words (w >> 3 = 0 and 2^29 - 1, x = 0 and 2^32 - 1, every
 * position t, and random); Philox4x32-10 on raw words and the mapping (seed,
 * offset, index) -> the group word w, its call and slot, the index word x,
 * Emin and G on random and edge inputs (index 0, INT64_MAX, seed and offset
 * all ones, groups across call and run boundaries, an eighth at their
 * group's position); dpsLogDet on random bit patterns (subnormals,
 * specials), the fp32 score, the key and the min-p decision, and the
 * soft-cap's dpsTanhDet, dpsExpm1Det and dpsSampleSoftCap. The grouped noise
 * (groups of 8) was added without a GPU at hand: compiled, not yet run.
 * Exits 77 (skipped) without a GPU.
 *
 * Needs only the CUDA runtime: besides the CMake target it builds alone, e.g.
 *   nvcc -O3 -arch=sm_90 -Isrc/core -Itests/gpu -c tests/gpu/sample_rng_check.cu
 *   gcc -O2 -std=c11 -Isrc/core -Itests/gpu -Itests/support -I$CUDA/include -c \
 *     tests/gpu/test_gpu_sample_rng.c
 *   nvcc sample_rng_check.o test_gpu_sample_rng.o -o t -lpthread */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "sample_rng.h"
#include "sample_rng_check.h"

#define CHECK FX_EXPECT

#define CUDA_OK(call)                                                           \
  do {                                                                          \
    cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
              cudaGetErrorString(e_));                                          \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

static uint64_t splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---- the noise over v: host threads compare a batch ----------------------- */
typedef struct {
  const rngNoiseOut* dev;
  uint32_t x0, stride;
  long long begin, end;
  long long mismatches;
  long long first;
} rangeJob;

static rngNoiseOut hostNoise(uint32_t v) {
  rngNoiseOut o;
  o.e = dpsSampleExpFromBits(v);
  o.emin = dpsSampleGroupMin(v);
  o.g_pos = dpsSampleGumbelIn(v, v & 7u, 0u);
  o.g = dpsSampleGumbelIn(v, (v & 7u) ^ 1u, v ^ RNG_CHECK_XMIX);
  return o;
}

static void* rangeWorker(void* arg) {
  rangeJob* j = (rangeJob*)arg;
  for (long long i = j->begin; i < j->end; ++i) {
    const uint32_t v = j->x0 + (uint32_t)i * j->stride;
    const rngNoiseOut h = hostNoise(v);
    if (memcmp(&h, &j->dev[i], sizeof h) != 0) {
      if (j->mismatches++ == 0) j->first = i;
    }
  }
  return NULL;
}

static void checkNoiseRange(int exhaustive) {
  const clock_t c0 = clock();
  const long long batch = 1ll << 24;
  const uint32_t stride = exhaustive ? 1u : 257u;
  const long long total = exhaustive ? (1ll << 32) : (long long)(0xffffffffull / 257u) + 1;
  rngNoiseOut *d_out, *h_out;
  CUDA_OK(cudaMalloc((void**)&d_out, (size_t)batch * sizeof *d_out));
  h_out = (rngNoiseOut*)malloc((size_t)batch * sizeof *h_out);
  long nthreads = sysconf(_SC_NPROCESSORS_ONLN);
  if (nthreads < 1) nthreads = 1;
  if (nthreads > 64) nthreads = 64;
  long long mismatches = 0, done = 0;
  for (long long b0 = 0; b0 < total; b0 += batch) {
    const long long n = total - b0 < batch ? total - b0 : batch;
    const uint32_t x0 = (uint32_t)((uint64_t)b0 * stride);
    CUDA_OK(rngCheckLaunch(RNG_CHECK_NOISE_RANGE, NULL, d_out, n, x0, stride));
    CUDA_OK(cudaMemcpy(h_out, d_out, (size_t)n * sizeof *h_out, cudaMemcpyDeviceToHost));
    pthread_t th[64];
    rangeJob jobs[64];
    for (long t = 0; t < nthreads; ++t) {
      jobs[t].dev = h_out;
      jobs[t].x0 = x0;
      jobs[t].stride = stride;
      jobs[t].begin = n * t / nthreads;
      jobs[t].end = n * (t + 1) / nthreads;
      jobs[t].mismatches = 0;
      jobs[t].first = -1;
      pthread_create(&th[t], NULL, rangeWorker, &jobs[t]);
    }
    for (long t = 0; t < nthreads; ++t) {
      pthread_join(th[t], NULL);
      if (jobs[t].mismatches > 0 && mismatches == 0) {
        const long long i = jobs[t].first;
        const uint32_t v = x0 + (uint32_t)i * stride;
        const rngNoiseOut h = hostNoise(v);
        fprintf(stderr,
                "noise(v = %08x): host -log U %.17g Emin %.17g G(pos) %.17g G %.17g, device "
                "%.17g %.17g %.17g %.17g\n",
                v, h.e, h.emin, h.g_pos, h.g, h_out[i].e, h_out[i].emin, h_out[i].g_pos,
                h_out[i].g);
      }
      mismatches += jobs[t].mismatches;
    }
    done += n;
  }
  CHECK(mismatches == 0, "noise: %lld of %lld words differ between host and device", mismatches,
        done);
  printf("noise of v (-log U, Emin, -log Emin at the position, -log(Emin - log U) away): %lld "
         "values of v (%s), host == device bit for bit: %s (%.1f s host CPU)\n",
         done, exhaustive ? "every v" : "stride 257", mismatches == 0 ? "yes" : "NO",
         (double)(clock() - c0) / CLOCKS_PER_SEC);
  cudaFree(d_out);
  free(h_out);
}

/* ---- the rest: n inputs each ---------------------------------------------- */
static void* devRun(int mode, const void* in, size_t in_size, size_t out_size, long long n) {
  void *d_in = NULL, *d_out, *h_out = malloc(out_size * (size_t)n);
  if (in != NULL) {
    CUDA_OK(cudaMalloc(&d_in, in_size * (size_t)n));
    CUDA_OK(cudaMemcpy(d_in, in, in_size * (size_t)n, cudaMemcpyHostToDevice));
  }
  CUDA_OK(cudaMalloc(&d_out, out_size * (size_t)n));
  CUDA_OK(rngCheckLaunch(mode, d_in, d_out, n, 0, 0));
  CUDA_OK(cudaMemcpy(h_out, d_out, out_size * (size_t)n, cudaMemcpyDeviceToHost));
  cudaFree(d_in);
  cudaFree(d_out);
  return h_out;
}

static void checkMapping(long long n) {
  uint64_t s = 11;
  rngTriple* in = (rngTriple*)calloc((size_t)n, sizeof *in);
  for (long long j = 0; j < n; ++j) {
    for (int w = 0; w < 4; ++w) in[j].ctr[w] = (uint32_t)splitmix(&s);
    for (int w = 0; w < 2; ++w) in[j].key[w] = (uint32_t)splitmix(&s);
    in[j].seed = splitmix(&s);
    in[j].offset = splitmix(&s) >> (j % 64);
    in[j].index = (int64_t)(splitmix(&s) >> (1 + j % 63));
  }
  /* edges: zeros, all ones, the published KAT inputs; then indices at call
   * and run boundaries (groups 31 / 32, 127 / 128: the call's slot and run
   * change), a call whose high word is set, the last group below 2^63, with
   * seeds and offsets at their extremes; every 8th other index moved onto
   * its group's position (E = Emin there) */
  memset(&in[0], 0, sizeof in[0]);
  memset(&in[1], 0xff, sizeof in[1]);
  in[1].index = INT64_MAX;
  const uint32_t kc[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
  const uint32_t kk[2] = {0xa4093822, 0x299f31d0};
  memcpy(in[2].ctr, kc, sizeof kc);
  memcpy(in[2].key, kk, sizeof kk);
  static const int64_t eidx[] = {0, 7, 8, 255, 256, 1023, 1024, (1ll << 39) * 8 - 1,
                                 (1ll << 39) * 8, (1ll << 42) + 5, INT64_MAX - 1023, INT64_MAX - 8,
                                 INT64_MAX};
  static const uint64_t eso[] = {0, 1, 0xffffffffull, 1ull << 32, ~0ull};
  const long long ne = (long long)(sizeof eidx / sizeof eidx[0]);
  const long long nso = (long long)(sizeof eso / sizeof eso[0]);
  for (long long k = 0; k < ne * nso * nso && 3 + k < n; ++k) {
    in[3 + k].index = eidx[k % ne];
    in[3 + k].seed = eso[(k / ne) % nso];
    in[3 + k].offset = eso[k / (ne * nso)];
  }
  long long at_pos = 0;
  for (long long j = 3 + ne * nso * nso; j < n; j += 8) {
    const uint32_t w = dpsSampleGroupWord(in[j].seed, in[j].offset, in[j].index);
    in[j].index = (int64_t)(((uint64_t)in[j].index & ~(uint64_t)7u) | (w & 7u));
  }
  rngMapOut* out = (rngMapOut*)devRun(RNG_CHECK_MAPPING, in, sizeof *in, sizeof *out, n);
  long long bad = 0;
  for (long long j = 0; j < n; ++j) {
    uint32_t ph[4];
    dpsPhilox4x32_10(in[j].ctr, in[j].key, ph);
    const uint32_t w = dpsSampleGroupWord(in[j].seed, in[j].offset, in[j].index);
    const uint32_t x = dpsSampleIndexBits(in[j].seed, in[j].offset, in[j].index);
    const uint64_t call = dpsSampleGroupCall(in[j].index);
    const uint32_t slot = dpsSampleGroupSlot(in[j].index);
    const double emin = dpsSampleGroupMin(w);
    const double g = dpsSampleGumbel(in[j].seed, in[j].offset, in[j].index);
    at_pos += ((uint64_t)in[j].index & 7u) == (w & 7u);
    if (memcmp(ph, out[j].philox, sizeof ph) != 0 || w != out[j].w || x != out[j].x ||
        call != out[j].call || slot != out[j].slot ||
        memcmp(&emin, &out[j].emin, sizeof emin) != 0 || memcmp(&g, &out[j].g, sizeof g) != 0) {
      if (bad++ == 0)
        fprintf(stderr,
                "mapping %lld (seed %llx, offset %llx, index %lld): host w %08x x %08x call %llx "
                "slot %u Emin %.17g G %.17g, device w %08x x %08x call %llx slot %u Emin %.17g "
                "G %.17g\n",
                j, (unsigned long long)in[j].seed, (unsigned long long)in[j].offset,
                (long long)in[j].index, w, x, (unsigned long long)call, slot, emin, g, out[j].w,
                out[j].x, (unsigned long long)out[j].call, out[j].slot, out[j].emin, out[j].g);
    }
  }
  /* in[0] is all zeros: Random123's first KAT vector, and x of (seed 0,
   * offset 0, index 0) is its word 0; w of that index and G are
   * tests/cpu/test_sample_ref.c's pins (computed by python/tests/refs.py) */
  uint64_t g0;
  memcpy(&g0, &out[0].g, sizeof g0);
  CHECK(out[0].philox[0] == 0x6627e8d5u && out[2].philox[0] == 0xd16cfe09u &&
            out[0].x == 0x6627e8d5u && out[0].w == 0xa2b20ccfu && g0 == 0x3f9991a39ebd1d03ull,
        "device Philox KAT: %08x %08x; (0, 0, 0): w %08x x %08x G %016llx", out[0].philox[0],
        out[2].philox[0], out[0].w, out[0].x, (unsigned long long)g0);
  CHECK(bad == 0, "mapping: %lld of %lld differ", bad, n);
  printf("Philox4x32-10 and (seed, offset, index) -> w, call, slot, x, Emin, G: %lld inputs (%lld "
         "at their group's position, %lld edges), host == device: %s\n",
         n, at_pos, ne * nso * nso + 3, bad == 0 ? "yes" : "NO");
  free(in);
  free(out);
}

/* The noise of chosen words: w at its extremes (w >> 3 = 0: the largest
 * Emin, 2^29 - 1: the smallest) and random, x at its extremes (0: the
 * largest -log U, 2^32 - 1: the smallest) and random, every position t
 * (one of them w's own: E = Emin). */
static void checkWords(long long n) {
  uint64_t s = 15;
  static const uint32_t ew[] = {0u, 7u, 8u, 0x80000000u, 0xfffffff0u, 0xfffffff8u, 0xffffffffu};
  static const uint32_t ex[] = {0u, 1u, 0x7fffffffu, 0xfffffffeu, 0xffffffffu};
  const long long nw = (long long)(sizeof ew / sizeof ew[0]);
  const long long nx = (long long)(sizeof ex / sizeof ex[0]);
  rngWordIn* in = (rngWordIn*)calloc((size_t)n, sizeof *in);
  long long j = 0;
  for (long long a = 0; a < nw; ++a)
    for (long long b = 0; b < nx; ++b)
      for (uint32_t t = 0; t < 8 && j < n; ++t, ++j) in[j].w = ew[a], in[j].x = ex[b], in[j].t = t;
  const long long nedge = j;
  for (; j < n; ++j) {
    const uint64_t r = splitmix(&s);
    in[j].w = (uint32_t)r;
    in[j].x = (uint32_t)(r >> 32);
    in[j].t = j % 4 == 0 ? in[j].w & 7u : (uint32_t)(j >> 2) & 7u;
    if (j % 16 == 1) in[j].w = (uint32_t)(j & 7) | (j % 32 == 1 ? 0u : 0xfffffff8u); /* extremes */
  }
  rngWordOut* out = (rngWordOut*)devRun(RNG_CHECK_WORDS, in, sizeof *in, sizeof *out, n);
  long long bad = 0;
  double gmin = INFINITY, gmax = -INFINITY;
  for (j = 0; j < n; ++j) {
    rngWordOut h;
    h.um = dpsSampleGroupUniform(in[j].w);
    h.u = dpsSampleUniform(in[j].x);
    h.emin = dpsSampleGroupMin(in[j].w);
    h.e = dpsSampleExpFromBits(in[j].x);
    h.g = dpsSampleGumbelIn(in[j].w, in[j].t, in[j].x);
    if (h.g < gmin) gmin = h.g;
    if (h.g > gmax) gmax = h.g;
    if (memcmp(&h, &out[j], sizeof h) != 0 && bad++ == 0)
      fprintf(stderr,
              "words %lld (w %08x t %u x %08x): host Um %a U %a Emin %a -log U %a G %a, device "
              "%a %a %a %a %a\n",
              j, in[j].w, in[j].t, in[j].x, h.um, h.u, h.emin, h.e, h.g, out[j].um, out[j].u,
              out[j].emin, out[j].e, out[j].g);
  }
  CHECK(bad == 0, "words: %lld of %lld differ", bad, n);
  CHECK(gmin > -3.238 && gmin < -3.237 && gmax > 22.87 && gmax < 22.88,
        "G of the edge words in [%.17g, %.17g], not the documented [-3.24, 22.87]", gmin, gmax);
  printf("the noise of chosen (w, t, x): %lld inputs (%lld at the extremes), G in [%.6f, %.6f], "
         "host == device: %s\n",
         n, nedge, gmin, gmax, bad == 0 ? "yes" : "NO");
  free(in);
  free(out);
}

static void checkLog(long long n) {
  uint64_t s = 12;
  double* in = (double*)malloc((size_t)n * sizeof *in);
  for (long long j = 0; j < n; ++j) {
    uint64_t b = splitmix(&s);
    if (j % 4 == 1) b &= 0x800FFFFFFFFFFFFFull; /* subnormals and zeros */
    if (j % 4 == 2) b = (b & 0x000FFFFFFFFFFFFFull) | (0x3FEull << 52) | ((b >> 63) << 52);
    memcpy(&in[j], &b, sizeof b);
  }
  const uint64_t specials[] = {0, 0x8000000000000000ull, 0x7FF0000000000000ull,
                               0xFFF0000000000000ull, 0x7FF8000000000000ull, 0x3FF0000000000000ull,
                               0x3FF6A09E667F3BCDull, 0x3FF6A09E667F3BCCull, 1ull,
                               0x7FEFFFFFFFFFFFFFull};
  for (size_t k = 0; k < sizeof specials / sizeof specials[0]; ++k)
    memcpy(&in[k], &specials[k], sizeof(double));
  double* out = (double*)devRun(RNG_CHECK_LOG, in, sizeof *in, sizeof *out, n);
  long long bad = 0;
  for (long long j = 0; j < n; ++j) {
    const double h = dpsLogDet(in[j]);
    /* NaN results: any NaN bits are fine only if both are NaN */
    const int both_nan = h != h && out[j] != out[j];
    if (!both_nan && memcmp(&h, &out[j], sizeof h) != 0)
      if (bad++ == 0) fprintf(stderr, "log(%a): host %a, device %a\n", in[j], h, out[j]);
  }
  CHECK(bad == 0, "dpsLogDet: %lld of %lld differ", bad, n);
  printf("dpsLogDet: %lld inputs (random bits, subnormals, specials), host == device: %s\n", n,
         bad == 0 ? "yes" : "NO");
  free(in);
  free(out);
}

static void checkScalars(long long n) {
  uint64_t s = 13;
  static const float temps[] = {1.0f, 0.7f, 0.3333333f, 1e-3f, 3.3f, 1e4f, 0.05f, 2.0f};
  rngScalarIn* in = (rngScalarIn*)malloc((size_t)n * sizeof *in);
  for (long long j = 0; j < n; ++j) {
    const double mag = (double)(j % 5 == 0 ? 1000 : j % 5 == 1 ? 1 : 30);
    in[j].lmax = (float)(mag * ((double)(splitmix(&s) >> 11) * 0x1p-53 - 0.2));
    in[j].logit = in[j].lmax - (float)(mag * (double)(splitmix(&s) >> 11) * 0x1p-53);
    in[j].temperature = temps[j % 8];
    const uint64_t r = splitmix(&s); /* G of random words, a quarter at the position */
    in[j].gumbel = dpsSampleGumbelIn((uint32_t)r, j % 4 == 0 ? (uint32_t)r & 7u : (uint32_t)j & 7u,
                                     (uint32_t)(r >> 32));
    in[j].min_p = j % 7 == 0 ? 0.0f : (float)((double)(splitmix(&s) >> 40) * 0x1p-24);
    in[j].log_min_p = dpsLogDet((double)in[j].min_p);
    if (j % 11 == 3) { /* fp32 subnormal logits (a build with -ftz=true differs here) */
      in[j].logit = (float)((double)(splitmix(&s) >> 41) * 0x1p-149);
      in[j].lmax = in[j].logit;
    }
  }
  rngScalarOut* out = (rngScalarOut*)devRun(RNG_CHECK_SCALAR, in, sizeof *in, sizeof *out, n);
  long long bad_score = 0, bad_key = 0, bad_minp = 0, bad_lmp = 0, kept = 0;
  for (long long j = 0; j < n; ++j) {
    const float score = dpsSampleScore(in[j].logit, in[j].temperature);
    const float key = dpsSampleKey(score, in[j].gumbel);
    const int minp = dpsSampleMinPKeep(in[j].logit, in[j].lmax, in[j].temperature, in[j].log_min_p);
    const double lmp = dpsLogDet((double)in[j].min_p);
    kept += minp;
    const int bs = memcmp(&score, &out[j].score, sizeof score) != 0;
    const int bk = memcmp(&key, &out[j].key, sizeof key) != 0;
    const int bm = minp != out[j].minp, bl = memcmp(&lmp, &out[j].log_min_p, sizeof lmp) != 0;
    if ((bs || bk || bm || bl) && bad_score + bad_key + bad_minp + bad_lmp == 0)
      fprintf(stderr, "scalars %lld (logit %a, T %a): host %a %a %d, device %a %a %d\n", j,
              in[j].logit, in[j].temperature, score, key, minp, out[j].score, out[j].key,
              out[j].minp);
    bad_score += bs, bad_key += bk, bad_minp += bm, bad_lmp += bl;
  }
  CHECK(bad_score + bad_key + bad_minp + bad_lmp == 0,
        "of %lld: %lld scores, %lld keys, %lld min-p decisions, %lld log(min_p) differ", n,
        bad_score, bad_key, bad_minp, bad_lmp);
  printf("score, key, min-p (%lld kept of %lld), log(min_p): host == device: %s\n", kept, n,
         bad_score + bad_key + bad_minp + bad_lmp == 0 ? "yes" : "NO");
  free(in);
  free(out);
}

/* The soft-cap's functions: dpsTanhDet on random bit patterns (subnormals,
 * specials, the range where it is not +-1 or x), dpsExpm1Det on [0, 44),
 * dpsSampleSoftCap on logits around the cap and specials. */
static void checkTanh(long long n) {
  uint64_t s = 14;
  static const float caps[] = {30.0f, 50.0f, 1.0f, 0.37f, 1e4f, 1e-20f, 15.0f, 3.0f};
  rngTanhIn* in = (rngTanhIn*)malloc((size_t)n * sizeof *in);
  for (long long j = 0; j < n; ++j) {
    uint64_t b = splitmix(&s);
    if (j % 4 == 1) b = (b & 0x800FFFFFFFFFFFFFull) | ((0x3E0ull + (b >> 52) % 0x44) << 52);
    memcpy(&in[j].x, &b, sizeof b); /* j % 4 == 1: |x| in [2^-31, 2^37) */
    in[j].y = 44.0 * (double)(splitmix(&s) >> 11) * 0x1p-53;
    in[j].cap = caps[j % 8];
    in[j].logit = (float)(16.0 * in[j].cap * ((double)(splitmix(&s) >> 11) * 0x1p-53 - 0.5));
  }
  const uint64_t specials[] = {0, 0x8000000000000000ull, 0x7FF0000000000000ull,
                               0xFFF0000000000000ull, 0x7FF8000000000000ull, 1ull,
                               0x3E40000000000000ull /* 2^-27 */, 0x4036000000000000ull /* 22 */};
  for (size_t k = 0; k < sizeof specials / sizeof specials[0]; ++k)
    memcpy(&in[k].x, &specials[k], sizeof(double));
  const float lspecial[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -3e38f, 1e-40f};
  for (size_t k = 0; k < sizeof lspecial / sizeof lspecial[0]; ++k) in[k].logit = lspecial[k];
  rngTanhOut* out = (rngTanhOut*)devRun(RNG_CHECK_TANH, in, sizeof *in, sizeof *out, n);
  long long bad_t = 0, bad_e = 0, bad_c = 0;
  for (long long j = 0; j < n; ++j) {
    const double t = dpsTanhDet(in[j].x), e = dpsExpm1Det(in[j].y);
    const float c = dpsSampleSoftCap(in[j].logit, in[j].cap);
    const int bt = !(t != t && out[j].tanh != out[j].tanh) && memcmp(&t, &out[j].tanh, sizeof t);
    const int be = memcmp(&e, &out[j].expm1, sizeof e) != 0;
    const int bc =
        !(c != c && out[j].capped != out[j].capped) && memcmp(&c, &out[j].capped, sizeof c);
    if ((bt || be || bc) && bad_t + bad_e + bad_c == 0)
      fprintf(stderr, "tanh %lld: tanh(%a) %a / %a, expm1(%a) %a / %a, cap(%a, %a) %a / %a\n", j,
              in[j].x, t, out[j].tanh, in[j].y, e, out[j].expm1, in[j].logit, in[j].cap, c,
              out[j].capped);
    bad_t += bt, bad_e += be, bad_c += bc;
  }
  CHECK(bad_t + bad_e + bad_c == 0, "of %lld: %lld tanh, %lld expm1, %lld soft-caps differ", n,
        bad_t, bad_e, bad_c);
  printf("dpsTanhDet, dpsExpm1Det, dpsSampleSoftCap: %lld inputs, host == device: %s\n", n,
         bad_t + bad_e + bad_c == 0 ? "yes" : "NO");
  free(in);
  free(out);
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIP test_gpu_sample_rng: no GPU\n");
    return 77;
  }
  const char* ex = getenv("DPS_SAMPLE_RNG_EXHAUSTIVE");
  checkNoiseRange(ex != NULL && strcmp(ex, "1") == 0);
  checkWords(1 << 20);
  checkMapping(1 << 20);
  checkLog(1 << 22);
  checkScalars(1 << 22);
  checkTanh(1 << 22);
  if (fxExpectFailed) {
    fprintf(stderr, "test_gpu_sample_rng: %d checks failed\n", fxExpectFailed);
    return 1;
  }
  printf("test_gpu_sample_rng: host and device agree bit for bit\n");
  return 0;
}
