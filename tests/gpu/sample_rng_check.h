/* test_gpu_sample_rng: the records the host and sample_rng_check.cu share. */
#ifndef DPS_SAMPLE_RNG_CHECK_H_
#define DPS_SAMPLE_RNG_CHECK_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

enum {
  RNG_CHECK_NOISE_RANGE = 1, /* the noise of the word v = x0 + j * stride (rngNoiseOut) */
  RNG_CHECK_MAPPING = 2,     /* Philox of raw words; w, x, the group's call, Emin and G of
                                (seed, offset, index) */
  RNG_CHECK_LOG = 3,         /* dpsLogDet */
  RNG_CHECK_SCALAR = 4,      /* score, key, min-p decision, log(min_p) */
  RNG_CHECK_TANH = 5,        /* dpsTanhDet, dpsExpm1Det, dpsSampleSoftCap */
  RNG_CHECK_WORDS = 6        /* the noise of chosen (w, t, x) (rngWordIn, rngWordOut) */
};

/* The noise of one 32-bit word v, as a group's word w = v and as an index's
 * word x = v ^ RNG_CHECK_XMIX:
 *   e     = dpsSampleExpFromBits(v)                        -log(U(v))
 *   emin  = dpsSampleGroupMin(v)                           -log(Um(v)) / 8
 *   g_pos = dpsSampleGumbelIn(v, v & 7, 0)                 -log(Emin): at the position
 *   g     = dpsSampleGumbelIn(v, (v & 7) ^ 1, v ^ XMIX)    -log(Emin - log(U(x))) */
#define RNG_CHECK_XMIX 0x9E3779B9u
typedef struct {
  double e, emin, g_pos, g;
} rngNoiseOut;

typedef struct {
  uint32_t ctr[4], key[2];
  uint64_t seed, offset;
  int64_t index;
} rngTriple;

/* Of rngTriple: philox = Philox4x32-10 of the raw (ctr, key); of (seed,
 * offset, index): w = dpsSampleGroupWord, x = dpsSampleIndexBits, call and
 * slot = dpsSampleGroupCall and dpsSampleGroupSlot, emin =
 * dpsSampleGroupMin(w), g = dpsSampleGumbel. */
typedef struct {
  uint32_t philox[4];
  uint32_t w, x;
  uint64_t call;
  uint32_t slot, pad;
  double emin, g;
} rngMapOut;

/* Chosen words: um = dpsSampleGroupUniform(w), u = dpsSampleUniform(x), emin
 * = dpsSampleGroupMin(w), e = dpsSampleExpFromBits(x), g =
 * dpsSampleGumbelIn(w, t, x). */
typedef struct {
  uint32_t w, t, x, pad;
} rngWordIn;
typedef struct {
  double um, u, emin, e, g;
} rngWordOut;

typedef struct {
  float logit, lmax, temperature, min_p;
  double gumbel, log_min_p;
} rngScalarIn;

typedef struct {
  float score, key;
  int minp, pad;
  double log_min_p;
} rngScalarOut;

typedef struct {
  double x, y; /* tanh(x); expm1(y), y in [0, 44) */
  float logit, cap;
} rngTanhIn;

typedef struct {
  double tanh, expm1;
  float capped;
  int pad;
} rngTanhOut;

#ifdef __cplusplus
extern "C" {
#endif
/* Runs the check kernel of `mode` over n items and waits for it. */
cudaError_t rngCheckLaunch(int mode, const void* in, void* out, long long n, uint32_t x0,
                           uint32_t stride);
#ifdef __cplusplus
}
#endif

#endif /* DPS_SAMPLE_RNG_CHECK_H_ */
