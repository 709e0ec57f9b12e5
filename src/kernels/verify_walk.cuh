/* dpsVerifyChain's chain walk on the device (kernels/verify_walk.h): the
 * record of an invalid entry, the walk of every request by one block, and
 * the arrival count that picks the block that walks in the pass that
 * finishes the tokens. */
#ifndef DPS_VERIFY_WALK_CUH_
#define DPS_VERIFY_WALK_CUH_

#include <limits.h>

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

/* The first entry of the candidates outside [0, vocab) among this thread's
 * (entries threadIdx.x + k * blockDim.x), LLONG_MAX: none. Loaded before the
 * arrival (dpsWalkArrive), so that the loads' latency overlaps the fence's
 * and the atomic's instead of adding to the last block's tail. */
__device__ __forceinline__ long long dpsWalkCheck(const dpsVerifyWalkArgs& w) {
  long long bad = LLONG_MAX;
  const long long entries = (long long)w.pad_bs * w.n;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x) {
    const int32_t c = w.candidates[i];
    if ((c < 0 || (long long)c >= w.vocab) && i < bad) bad = i;
  }
  return bad;
}

/* Every thread of a block calls, after the block's writes of the tokens:
 * whether this block's `count` arrivals at *counter complete the `total` of
 * the pass (the same answer on every thread). Thread 0 arrives with one acquire-release
 * atomic after the barrier: the release covers every write the block made
 * before the barrier (PTX memory model: the barrier orders them before
 * thread 0's release, which is cumulative, the pattern of cooperative
 * groups' grid sync), and in the last block the acquire, passed on by the
 * second barrier, makes every other block's tokens visible. The last
 * arrival resets the count for the next call (every other block has arrived
 * by then; the kernel's end makes the reset visible to the next call). */
__device__ __forceinline__ bool dpsArriveLast(unsigned* counter, unsigned count, unsigned total) {
  __shared__ int s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(before)
                 : "l"(counter), "r"(count)
                 : "memory");
    s_last = before + count == total;
    if (s_last) *counter = 0u;
  }
  __syncthreads();
  return s_last != 0;
}

/* The walk's arrivals (the last block walks). */
__device__ __forceinline__ bool dpsWalkArrive(const dpsVerifyWalkArgs& w, unsigned count,
                                              unsigned total) {
  return dpsArriveLast(w.arrivals, count, total);
}

/* Positions of a request whose tokens and drafts one thread loads at once
 * (one round trip for chains up to this long). */
#define DPS_WALK_CHUNK 8

/* One block walks every request (every thread calls, `bad` its
 * dpsWalkCheck): nothing is written when a candidate is outside [0, vocab)
 * (the first one is counted and recorded, like an invalid parameter). The
 * tokens are read through L2 (other blocks of the same kernel may have
 * written them), all of a chunk's loads before any store. */
__device__ __forceinline__ void dpsWalkRequests(const dpsVerifyWalkArgs& w, long long bad) {
  if (__syncthreads_or(bad != LLONG_MAX)) { /* rare: the block's first bad entry */
    __shared__ long long s_bad;
    if (threadIdx.x == 0) s_bad = LLONG_MAX;
    __syncthreads();
    if (bad != LLONG_MAX) atomicMin(&s_bad, bad);
    __syncthreads();
    if (threadIdx.x == 0)
      dpsRecordInvalid(w.counters, s_bad, DPS_SAMPLE_ARG_CANDIDATE,
                       (uint32_t)w.candidates[s_bad]);
    return;
  }
  const int32_t* __restrict__ cand = w.candidates;
  const int64_t* __restrict__ tok = w.tokens;
  const float* __restrict__ tlp = w.token_lps;
  int32_t* __restrict__ pred = w.predict;
  int32_t* __restrict__ aidx = w.accept_index;
  float* __restrict__ lps = w.logprobs;
  const int n = w.n;
  for (int b = threadIdx.x; b < w.pad_bs; b += blockDim.x) {
    const long long r0 = (long long)b * n;
    int acc = -1; /* the last accepted position once the chain stopped; -1: not yet */
    for (int i0 = 0; i0 < n; i0 += DPS_WALK_CHUNK) {
      int32_t t[DPS_WALK_CHUNK] = {0}, d[DPS_WALK_CHUNK] = {0};
      float l[DPS_WALK_CHUNK] = {0.f};
      if (acc < 0) { /* the chunk's tokens and the drafts after them, then the decisions */
#pragma unroll
        for (int u = 0; u < DPS_WALK_CHUNK; ++u) {
          const int i = i0 + u;
          t[u] = i < n ? (int32_t)__ldcg(tok + r0 + i) : 0;
          d[u] = i + 1 < n ? cand[r0 + i + 1] : 0;
          l[u] = lps != nullptr && i < n ? __ldcg(tlp + r0 + i) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < DPS_WALK_CHUNK; ++u) {
          const int i = i0 + u;
          if (acc < 0 && i < n && (i + 1 == n || d[u] != t[u])) acc = i;
        }
      }
#pragma unroll
      for (int u = 0; u < DPS_WALK_CHUNK; ++u) {
        const int i = i0 + u;
        if (i >= n) break;
        const bool kept = acc < 0 || i <= acc; /* acc < 0 here: the chain goes on past the chunk */
        pred[r0 + i] = kept ? t[u] : 0;
        aidx[r0 + i] = kept ? (int32_t)(r0 + i) : -1;
        if (lps != nullptr) lps[r0 + i] = kept ? l[u] : 0.f;
      }
    }
    w.accept_length[b] = acc + 1;
  }
}

#endif /* DPS_VERIFY_WALK_CUH_ */
