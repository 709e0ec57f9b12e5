/* Device side of test_gpu_sample_rng: evaluates the functions of
 * src/core/sample_rng.h on the GPU for inputs the host chose, so that the
 * host can compare the results bit for bit with its own evaluation. This is
 * also the translation unit that compiles sample_rng.h for the device. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "sample_rng.h"
#include "sample_rng_check.h"

__global__ void rngCheckKernel(int mode, const void* in, void* out, long long n, uint32_t x0,
                               uint32_t stride) {
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n;
       j += (long long)gridDim.x * blockDim.x) {
    switch (mode) {
      case RNG_CHECK_NOISE_RANGE: { /* out: rngNoiseOut of v = x0 + j * stride (mod 2^32) */
        const uint32_t v = x0 + (uint32_t)j * stride;
        rngNoiseOut o;
        o.e = dpsSampleExpFromBits(v);
        o.emin = dpsSampleGroupMin(v);
        o.g_pos = dpsSampleGumbelIn(v, v & 7u, 0u);
        o.g = dpsSampleGumbelIn(v, (v & 7u) ^ 1u, v ^ RNG_CHECK_XMIX);
        ((rngNoiseOut*)out)[j] = o;
        break;
      }
      case RNG_CHECK_MAPPING: { /* in: rngTriple; out: rngMapOut */
        const rngTriple t = ((const rngTriple*)in)[j];
        rngMapOut o;
        uint32_t ctr[4] = {t.ctr[0], t.ctr[1], t.ctr[2], t.ctr[3]};
        uint32_t key[2] = {t.key[0], t.key[1]};
        dpsPhilox4x32_10(ctr, key, o.philox);
        o.w = dpsSampleGroupWord(t.seed, t.offset, t.index);
        o.x = dpsSampleIndexBits(t.seed, t.offset, t.index);
        o.call = dpsSampleGroupCall(t.index);
        o.slot = dpsSampleGroupSlot(t.index);
        o.pad = 0;
        o.emin = dpsSampleGroupMin(o.w);
        o.g = dpsSampleGumbel(t.seed, t.offset, t.index);
        ((rngMapOut*)out)[j] = o;
        break;
      }
      case RNG_CHECK_WORDS: { /* in: rngWordIn; out: rngWordOut */
        const rngWordIn a = ((const rngWordIn*)in)[j];
        rngWordOut o;
        o.um = dpsSampleGroupUniform(a.w);
        o.u = dpsSampleUniform(a.x);
        o.emin = dpsSampleGroupMin(a.w);
        o.e = dpsSampleExpFromBits(a.x);
        o.g = dpsSampleGumbelIn(a.w, a.t, a.x);
        ((rngWordOut*)out)[j] = o;
        break;
      }
      case RNG_CHECK_LOG: { /* in: double; out: double */
        ((double*)out)[j] = dpsLogDet(((const double*)in)[j]);
        break;
      }
      case RNG_CHECK_SCALAR: { /* in: rngScalarIn; out: rngScalarOut */
        const rngScalarIn a = ((const rngScalarIn*)in)[j];
        rngScalarOut o;
        o.score = dpsSampleScore(a.logit, a.temperature);
        o.key = dpsSampleKey(o.score, a.gumbel);
        o.minp = dpsSampleMinPKeep(a.logit, a.lmax, a.temperature, a.log_min_p);
        o.log_min_p = dpsLogDet((double)a.min_p);
        ((rngScalarOut*)out)[j] = o;
        break;
      }
      case RNG_CHECK_TANH: { /* in: rngTanhIn; out: rngTanhOut */
        const rngTanhIn a = ((const rngTanhIn*)in)[j];
        rngTanhOut o;
        o.tanh = dpsTanhDet(a.x);
        o.expm1 = dpsExpm1Det(a.y);
        o.capped = dpsSampleSoftCap(a.logit, a.cap);
        o.pad = 0;
        ((rngTanhOut*)out)[j] = o;
        break;
      }
      default:
        break;
    }
  }
}

extern "C" cudaError_t rngCheckLaunch(int mode, const void* in, void* out, long long n,
                                      uint32_t x0, uint32_t stride) {
  if (n <= 0) return cudaSuccess;
  long long blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  rngCheckKernel<<<(unsigned)blocks, 256>>>(mode, in, out, n, x0, stride);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}
