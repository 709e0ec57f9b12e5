/* dpsVerifyChain's chain walk on the device (kernels/verify_walk.h): the
 * record of an invalid entry, the walk of every request by one block, and
 * the arrival count that picks the block that walks in the pass that
 * finishes the tokens. */
#ifndef DPS_VERIFY_WALK_CUH_
#define DPS_VERIFY_WALK_CUH_

#include <limits.h>

#include "kernels/sample_kernels.h" /* DPS_SAMPLE_ARG_CANDIDATE */
#include "kernels/verify_walk.h"

/* Counts an invalid call and, unless one is recorded and not yet read
 * (dpsCommGetSampleStats), records its first bad entry (one thread). */
__device__ __forceinline__ void dpsRecordInvalid(dpsSampleCounters* c, long long entry, int arg,
                                                 uint32_t bits) {
  atomicAdd(&c->invalid_calls, 1ull);
  if (atomicCAS(&c->bad_seen, 0ull, 2ull) == 0ull) {
    c->bad_row = entry;
    c->bad_arg = arg;
    c->bad_bits = bits;
    __threadfence();
    *(volatile unsigned long long*)&c->bad_seen = 1ull;
  }
}

/* Every thread of a block calls, after the block's writes of the tokens:
 * whether this block's `count` arrivals complete the `total` of the pass (the
 * same answer on every thread). The last arrival resets the count for the
 * next call (every other block has arrived by then) and sees every other
 * block's tokens (each block fenced its writes before arriving). */
__device__ __forceinline__ bool dpsWalkArrive(const dpsVerifyWalkArgs& w, unsigned count,
                                              unsigned total) {
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned before = atomicAdd(w.arrivals, count);
    s_last = before + count == total;
    if (s_last) {
      *w.arrivals = 0u;
      __threadfence();
    }
  }
  __syncthreads();
  return s_last != 0;
}

/* One block walks every request: nothing is written when a candidate is
 * outside [0, vocab) (the first one is counted and recorded, like an invalid
 * parameter). The tokens are read through L2 (other blocks of the same
 * kernel may have written them). */
__device__ __forceinline__ void dpsWalkRequests(const dpsVerifyWalkArgs& w) {
  __shared__ long long s_bad;
  if (threadIdx.x == 0) s_bad = LLONG_MAX;
  __syncthreads();
  const long long entries = (long long)w.pad_bs * w.n;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x) {
    const int32_t c = w.candidates[i];
    if (c < 0 || (long long)c >= w.vocab) atomicMin(&s_bad, i);
  }
  __syncthreads();
  const long long bad = s_bad;
  if (bad != LLONG_MAX) {
    if (threadIdx.x == 0)
      dpsRecordInvalid(w.counters, bad, DPS_SAMPLE_ARG_CANDIDATE, (uint32_t)w.candidates[bad]);
    return;
  }
  for (int b = threadIdx.x; b < w.pad_bs; b += blockDim.x) {
    const long long r0 = (long long)b * w.n;
    /* the first draft that differs from the token before it; the loads do
     * not depend on each other (one round trip, not one per accepted draft) */
    int acc = w.n - 1;
    for (int i = w.n - 2; i >= 0; --i)
      if (w.candidates[r0 + i + 1] != (int32_t)__ldcg(w.tokens + r0 + i)) acc = i;
    for (int i = 0; i < w.n; ++i) {
      const bool kept = i <= acc;
      w.predict[r0 + i] = kept ? (int32_t)__ldcg(w.tokens + r0 + i) : 0;
      w.accept_index[r0 + i] = kept ? (int32_t)(r0 + i) : -1;
      if (w.logprobs) w.logprobs[r0 + i] = kept ? __ldcg(w.token_lps + r0 + i) : 0.f;
    }
    w.accept_length[b] = acc + 1;
  }
}

#endif /* DPS_VERIFY_WALK_CUH_ */
