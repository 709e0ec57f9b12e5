/* One-sided gathers (verify outputs, verify logprobs): one kernel per call,
 * the flag travels with the data (LL or LL128 lines), no separate barrier.
 * The grid is fixed at creation and each block keeps its own epoch, claimed
 * before the PDL wait (claimBlockEpoch); receivers write their persistent
 * outputs themselves. Lines, staging, epochs, the parity rule and timeouts:
 * docs/design.md, "The onesided protocol" (4.3 - 4.6). */
#include "kernels/device.cuh"
#include "kernels/onesided_kernels.h"

using namespace dpsos;

namespace {

__device__ __forceinline__ int peerAt(int me, int k, int tp) {
  const int p = me + k;
  return p >= tp ? p - tp : p;
}

/* The segments of the packed vector. Value j lives in segment
 * k = (j >= c0) + (j >= c01); the pointer is chosen with selects, not
 * branches: neighbouring threads of a warp often straddle a segment
 * boundary. */
struct Segs {
  u64 c0, c1, c2, c01;
  __device__ explicit Segs(const dpsOsGatherArgs& a)
      : c0((u64)a.count[0]), c1((u64)a.count[1]), c2((u64)a.count[2]),
        c01((u64)a.count[0] + (u64)a.count[1]) {}

  __device__ __forceinline__ uint32_t load(const dpsOsGatherArgs& a, u64 j) const {
    const uint32_t* p = a.in[0] + j;
    p = j >= c0 ? a.in[1] + (j - c0) : p;
    p = j >= c01 ? a.in[2] + (j - c01) : p;
    return __ldg(p);
  }
  /* where value j of rank src lands: out[k][src*count[k] + (j - start of k)] */
  __device__ __forceinline__ uint32_t* dst(const dpsOsGatherArgs& a, int src, u64 j) const {
    uint32_t* p = a.out[0] + (u64)src * c0 + j;
    p = j >= c0 ? a.out[1] + (u64)src * c1 + (j - c0) : p;
    p = j >= c01 ? a.out[2] + (u64)src * c2 + (j - c01) : p;
    return p;
  }
  __device__ __forceinline__ void store(const dpsOsGatherArgs& a, int src, u64 j,
                                        uint32_t v) const {
    *dst(a, src, j) = v;
  }
  /* values j and (if two) j+1 of rank src: one 8-byte store when both land
   * in one segment at an 8-byte aligned address */
  __device__ __forceinline__ void store2(const dpsOsGatherArgs& a, int src, u64 j, uint32_t v0,
                                         uint32_t v1, bool two) const {
    uint32_t* p = dst(a, src, j);
    const bool oneSeg = ((j + 1 < c0) == (j < c0)) && ((j + 1 < c01) == (j < c01));
    if (two && oneSeg && ((uintptr_t)p & 7u) == 0) {
      *(uint2*)p = make_uint2(v0, v1);
    } else {
      *p = v0;
      if (two) store(a, src, j + 1, v1);
    }
  }
};

/* Reads the kernel parameters of the hot path once, so that their reads
 * after dpsPdlWait() hit the constant cache: a parameter's first read
 * misses it (hundreds of cycles), and ptxas places parameter reads where
 * they are used, after the wait, on the critical path. The fold goes to
 * shared memory so that the reads are neither dropped nor moved. */
__device__ __forceinline__ void warmParams(const dpsOsGatherArgs& a) {
  __shared__ volatile unsigned long long s_sink;
  if (threadIdx.x == 0) {
    u64 x = (u64)a.c.tp ^ (u64)a.c.rank ^ (u64)(uintptr_t)a.c.state ^ (u64)a.op ^
            (u64)a.total ^ (u64)a.cap ^ (u64)(uintptr_t)a.stage;
#pragma unroll
    for (int k = 0; k < 3; ++k)
      x ^= (u64)(uintptr_t)a.in[k] ^ (u64)(uintptr_t)a.out[k] ^ (u64)a.count[k];
#pragma unroll
    for (int r = 0; r < DPS_PEER_MAX_RANKS; ++r) x ^= (u64)(uintptr_t)a.stage_peer.p[r];
    s_sink = x;
  }
}

/* The part of a gather block that does not depend on the previous kernel
 * on the stream; runs before dpsPdlWait(). e == 0: the communicator already
 * failed, the block returns. */
struct GatherBlock {
  u64 e;
  uint32_t flag;
  int par;
  __device__ explicit GatherBlock(const dpsOsGatherArgs& a) {
    warmParams(a);
    e = claimBlockEpoch(a.c, a.op); /* its barrier also orders warmParams */
    flag = llFlag(e);
    par = (int)(e & 1);
  }
};

__global__ void __launch_bounds__(DPS_OS_GATHER_THREADS_MAX, 1) gatherLLKernel(dpsOsGatherArgs a) {
  const dpsPeerCommon& c = a.c;
  const GatherBlock g(a);
  if (g.e == 0) return;
  const Segs sg(a);
  const int tp = c.tp, me = c.rank;
  const u64 P = (u64)a.total, L = (P + 1) / 2, cap = (u64)a.cap;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  dpsPdlWait();
  dpsPdlReleaseFromClaimer();
  uint32_t pre0 = 0u, pre1 = 0u;
  if (first < L) {
    pre0 = sg.load(a, 2 * first);
    if (2 * first + 1 < P) pre1 = sg.load(a, 2 * first + 1);
  }
  const u64 t0 = globalTimer();

  for (u64 l = first; l < L; l += stride) {
    const u64 j = 2 * l;
    const bool two = j + 1 < P;
    const uint32_t v0 = l == first ? pre0 : sg.load(a, j);
    const uint32_t v1 = l == first ? pre1 : two ? sg.load(a, j + 1) : 0u;
    const size_t off = DPS_PEER_LL_OFFSET(g.par, me, l, tp, cap);
    for (int k = 1; k < tp; ++k) stLine(a.stage_peer.p[peerAt(me, k, tp)] + off, v0, v1, g.flag);
    sg.store2(a, me, j, v0, v1, two);
  }

  for (u64 l = first; l < L; l += stride) {
    const u64 j = 2 * l;
    for (int k = 1; k < tp; ++k) {
      const int src = peerAt(me, k, tp);
      const char* line = a.stage + DPS_PEER_LL_OFFSET(g.par, src, l, tp, cap);
      unsigned n = 0;
      uint4 v = ldLine(line);
      while (v.y != g.flag || v.w != g.flag) {
        if ((++n & 127u) == 0 && spinExpired(c, t0, a.op, src, DPS_PEER_WAIT_DATA)) return;
        v = ldLine(line);
      }
      sg.store2(a, src, j, v.x, v.z, j + 1 < P);
    }
  }
}

/* LL128. Control flow is warp-uniform (loops run over the warp's first
 * line), so that every 128-byte line is stored and loaded by one warp
 * instruction of its eight threads, and __any_sync sees the whole warp.
 * Thread `sub` (lane % 8) of a line holds words 4*sub .. 4*sub+3; sub 7's
 * last word is the flag. */
__global__ void __launch_bounds__(DPS_OS_GATHER_THREADS_MAX, 1)
    gatherLL128Kernel(dpsOsGatherArgs a) {
  const dpsPeerCommon& c = a.c;
  const GatherBlock g(a);
  if (g.e == 0) return;
  const Segs sg(a);
  const int tp = c.tp, me = c.rank;
  const u64 P = (u64)a.total, cap = (u64)a.cap;
  const u64 L = (P + DPS_OS_LL128_LINE_VALUES - 1) / DPS_OS_LL128_LINE_VALUES;
  const unsigned lane = threadIdx.x & 31u, sub = lane & 7u;
  const u64 warp0 = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32u * 4u; /* warp's 1st line */
  const u64 strideLines = (u64)gridDim.x * blockDim.x / 8u;
  const u64 myLine0 = warp0 + (lane >> 3);
  const unsigned nw = sub == 7u ? 3u : 4u; /* data words of this thread */
  dpsPdlWait();
  dpsPdlReleaseFromClaimer();
  uint32_t pre[4] = {0u, 0u, 0u, 0u};
  if (myLine0 < L) {
    const u64 j0 = myLine0 * DPS_OS_LL128_LINE_VALUES + 4u * sub;
#pragma unroll
    for (unsigned i = 0; i < 4; ++i)
      if (i < nw && j0 + i < P) pre[i] = sg.load(a, j0 + i);
  }
  const u64 t0 = globalTimer();

  for (u64 w = warp0; w < L; w += strideLines) {
    const u64 l = w + (lane >> 3);
    const bool act = l < L;
    const u64 j0 = l * DPS_OS_LL128_LINE_VALUES + 4u * sub;
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    if (act) {
#pragma unroll
      for (unsigned i = 0; i < 4; ++i)
        if (i < nw && j0 + i < P) v[i] = w == warp0 ? pre[i] : sg.load(a, j0 + i);
    }
    if (sub == 7u) v[3] = g.flag;
    __syncwarp();
    if (act) {
      const size_t off =
          DPS_PEER_STAGE_OFFSET(g.par, me, l, tp, cap, DPS_OS_LL128_LINE_BYTES) + 16u * sub;
      for (int k = 1; k < tp; ++k)
        stV4(a.stage_peer.p[peerAt(me, k, tp)] + off, v[0], v[1], v[2], v[3]);
#pragma unroll
      for (unsigned i = 0; i < 4; ++i)
        if (i < nw && j0 + i < P) sg.store(a, me, j0 + i, v[i]);
    }
  }

  for (u64 w = warp0; w < L; w += strideLines) { /* warp-uniform */
    const u64 l = w + (lane >> 3);
    const bool act = l < L;
    const u64 j0 = l * DPS_OS_LL128_LINE_VALUES + 4u * sub;
    for (int k = 1; k < tp; ++k) {
      const int src = peerAt(me, k, tp);
      const char* line =
          a.stage +
          DPS_PEER_STAGE_OFFSET(g.par, src, act ? l : 0u, tp, cap, DPS_OS_LL128_LINE_BYTES) +
          16u * sub;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      unsigned n = 0;
      for (;;) {
        if (act) v = ldLine(line);
        if (!__any_sync(0xffffffffu, act && sub == 7u && v.w != g.flag)) break;
        if ((++n & 127u) == 0) {
          int f = 0;
          if (lane == 0) f = spinExpired(c, t0, a.op, src, DPS_PEER_WAIT_DATA);
          if (__shfl_sync(0xffffffffu, f, 0)) return; /* the whole warp */
        }
      }
      if (act) {
        const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (unsigned i = 0; i < 4; ++i)
          if (i < nw && j0 + i < P) sg.store(a, src, j0 + i, vv[i]);
      }
    }
  }
}

}  // namespace

extern "C" cudaError_t dpsOsLaunchGather(const dpsOsGatherArgs* a, int proto, int grid,
                                         int threads, cudaStream_t stream) {
  if (proto == DPS_OS_PROTO_LL128)
    return dpsLaunch(gatherLL128Kernel, dim3((unsigned)grid), dim3((unsigned)threads), stream,
                     a->c.pdl, *a);
  return dpsLaunch(gatherLLKernel, dim3((unsigned)grid), dim3((unsigned)threads), stream,
                   a->c.pdl, *a);
}

extern "C" cudaError_t dpsOsPreloadGatherKernels(void) {
  const void* const k[] = {(const void*)gatherLLKernel, (const void*)gatherLL128Kernel};
  return dpsPreload(k, 2);
}
