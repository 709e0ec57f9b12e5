/* test_gpu_sample_rng: the records the host and sample_rng_check.cu share. */
#ifndef DPS_SAMPLE_RNG_CHECK_H_
#define DPS_SAMPLE_RNG_CHECK_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

enum {
  RNG_CHECK_GUMBEL_RANGE = 1, /* G of x0 + j * stride */
  RNG_CHECK_MAPPING = 2,      /* Philox of raw words; x and G of (seed, offset, index) */
  RNG_CHECK_LOG = 3,          /* dpsLogDet */
  RNG_CHECK_SCALAR = 4,       /* score, key, min-p decision, log(min_p) */
  RNG_CHECK_TANH = 5          /* dpsTanhDet, dpsExpm1Det, dpsSampleSoftCap */
};

typedef struct {
  uint32_t ctr[4], key[2];
  uint64_t seed, offset;
  int64_t index;
} rngTriple;

typedef struct {
  uint32_t philox[4];
  uint32_t x, pad;
  double g;
} rngMapOut;

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
