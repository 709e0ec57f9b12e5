/* One-sided gathers (verify outputs, verify logprobs): one kernel per call,
 * LL protocol, no separate barrier.
 *
 * Each rank's packed vector (up to 3 int32/fp32 segments, total values P) is
 * cut into lines of 2 values; line l travels as one 16-byte store
 * {v[2l], flag, v[2l+1], flag} into every peer's staging[parity][me][l]
 * (parity = epoch & 1, flag = llFlag(epoch)). The receiver polls its own
 * staging[parity][src][l] until both flags match and writes the values into
 * its persistent outputs; its own values are copied directly. The grid is
 * fixed at creation: block b sends and receives lines b*threads + tid
 * (grid-stride), the same lines on every call and every rank, and keeps its
 * own epoch, so no block waits for another block of its own rank. Every call
 * has at least one line per rank, so every call waits for every peer.
 *
 * Double buffering by parity is safe: a peer at call e+1 has received my data
 * of call e, which I only send after my call e-1 kernel (the last reader of
 * staging[parity of e+1]) completed. The outputs are written only by the
 * local kernel, so a peer running ahead never overwrites a result the local
 * rank may still be reading.
 */
#include "kernels/onesided_kernels.h"

using namespace dpsos;

namespace {

__device__ __forceinline__ uint32_t loadPacked(const dpsOsGatherArgs& a, u64 j) {
  if (j < (u64)a.count[0]) return __ldg(a.in[0] + j);
  j -= (u64)a.count[0];
  if (j < (u64)a.count[1]) return __ldg(a.in[1] + j);
  j -= (u64)a.count[1];
  return __ldg(a.in[2] + j);
}

__device__ __forceinline__ void storeOut(const dpsOsGatherArgs& a, int src, u64 j, uint32_t v) {
  if (j < (u64)a.count[0]) {
    a.out[0][(u64)src * (u64)a.count[0] + j] = v;
    return;
  }
  j -= (u64)a.count[0];
  if (j < (u64)a.count[1]) {
    a.out[1][(u64)src * (u64)a.count[1] + j] = v;
    return;
  }
  j -= (u64)a.count[1];
  a.out[2][(u64)src * (u64)a.count[2] + j] = v;
}

__global__ void __launch_bounds__(DPS_OS_GATHER_THREADS_MAX) gatherLLKernel(dpsOsGatherArgs a) {
  const dpsOsCommon& c = a.c;
  const u64 P = (u64)a.total, L = (P + 1) / 2, cap = (u64)a.cap;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  dpsPdlWait();
  dpsPdlRelease();
  /* Issue the first line's input loads before the epoch read, so that the
   * two latencies overlap instead of adding up. */
  uint32_t pre0 = 0u, pre1 = 0u;
  if (first < L) {
    pre0 = loadPacked(a, 2 * first);
    if (2 * first + 1 < P) pre1 = loadPacked(a, 2 * first + 1);
  }
  const u64 e = beginBlockEpoch(c, a.op);
  if (e == 0) return;
  const u64 t0 = globalTimer();
  const int tp = c.tp, me = c.rank;
  const uint32_t flag = llFlag(e);
  const int par = (int)(e & 1);

  for (u64 l = first; l < L; l += stride) {
    const u64 j = 2 * l;
    const bool two = j + 1 < P;
    const uint32_t v0 = l == first ? pre0 : loadPacked(a, j);
    const uint32_t v1 = l == first ? pre1 : two ? loadPacked(a, j + 1) : 0u;
    for (int k = 1; k < tp; ++k) {
      const int p = (me + k) % tp;
      stLine(a.stage_peer.p[p] + DPS_OS_LL_OFFSET(par, me, l, tp, cap), v0, v1, flag);
    }
    storeOut(a, me, j, v0);
    if (two) storeOut(a, me, j + 1, v1);
  }

  int fail = 0;
  for (u64 l = first; l < L && !fail; l += stride) {
    const u64 j = 2 * l;
    for (int k = 1; k < tp && !fail; ++k) {
      const int src = (me + k) % tp;
      const char* line = a.stage + DPS_OS_LL_OFFSET(par, src, l, tp, cap);
      unsigned n = 0;
      uint4 v = ldLine(line);
      while (v.y != flag || v.w != flag) {
        if ((++n & 127u) == 0 && spinExpired(c, t0, a.op, src, DPS_OS_WAIT_DATA)) {
          fail = 1;
          break;
        }
        v = ldLine(line);
      }
      if (!fail) {
        storeOut(a, src, j, v.x);
        if (j + 1 < P) storeOut(a, src, j + 1, v.z);
      }
    }
  }
  if (__syncthreads_or(fail)) return;
  finishBlockEpoch(c, a.op, e);
}

}  // namespace

extern "C" cudaError_t dpsOsLaunchGather(const dpsOsGatherArgs* a, int grid, int threads,
                                         cudaStream_t stream) {
  return dpsLaunch(gatherLLKernel, dim3((unsigned)grid), dim3((unsigned)threads), stream,
                   a->c.pdl, *a);
}

extern "C" cudaError_t dpsOsPreloadGatherKernels(void) {
  const void* const k[] = {(const void*)gatherLLKernel};
  return dpsPreload(k, 1);
}
