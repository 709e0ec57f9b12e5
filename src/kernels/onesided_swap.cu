/* One-sided swap_batch_vocab: [pad_bs*N, V/tp] -> [pad_bs/tp*N, V]. Rank
 * `me` sends the contiguous input rows [p*rows, (p+1)*rows) to peer p, where
 * they land in p's output rows [0, rows) at columns me*v_local. Two paths,
 * picked on the host from the shape only (onesided_plan.c): direct (ready /
 * done flags, stores into the peers' outputs) and LL (lines into the peers'
 * staging, unpacked by the receiver). The steps of each path, the epochs,
 * the parity rule and the timeouts: docs/design.md, "The onesided protocol"
 * (4.3 - 4.6). */
#include "kernels/device.cuh"
#include "kernels/onesided_kernels.h"

using namespace dpsos;

namespace {

template <int W>
struct VecT;
template <>
struct VecT<16> {
  typedef uint4 T;
};
template <>
struct VecT<8> {
  typedef uint2 T;
};
template <>
struct VecT<4> {
  typedef unsigned int T;
};
template <>
struct VecT<2> {
  typedef unsigned short T;
};

/* vectors in flight per thread and per stream of data */
template <int W>
struct Unroll {
  static constexpr int value = 4;
};

/* Copies vectors [from, to) of a contiguous chunk (vpr vectors per row) into
 * rows of dst_stride bytes. */
template <int W>
__device__ __forceinline__ void copyRange(const char* __restrict__ src, char* dst, u64 vpr,
                                          u64 dst_stride, u64 from, u64 to) {
  typedef typename VecT<W>::T V;
  constexpr int U = Unroll<W>::value;
  const V* s = reinterpret_cast<const V*>(src);
  const u64 bd = blockDim.x;
  for (u64 base = from + threadIdx.x; base < to; base += bd * U) {
    V v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      u64 i = base + k * bd;
      if (i < to) v[k] = __ldg(s + i);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      u64 i = base + k * bd;
      if (i < to) {
        u64 row = udiv(i, vpr);
        u64 col = i - row * vpr;
        *reinterpret_cast<V*>(dst + row * dst_stride + col * W) = v[k];
      }
    }
  }
}

/* Remote vectors [rfrom, rto) and local vectors [lfrom, rto) in one loop
 * (the local range is a suffix of the remote one: lfrom >= rfrom). */
template <int W>
__device__ __forceinline__ void copyFused(const char* __restrict__ rsrc, char* rdst,
                                          const char* __restrict__ lsrc, char* ldst, u64 vpr,
                                          u64 dst_stride, u64 rfrom, u64 lfrom, u64 to) {
  typedef typename VecT<W>::T V;
  constexpr int U = Unroll<W>::value;
  const V* rs = reinterpret_cast<const V*>(rsrc);
  const V* ls = reinterpret_cast<const V*>(lsrc);
  const u64 bd = blockDim.x;
  const u64 n = to - rfrom, nl = to - lfrom;
  for (u64 base = threadIdx.x; base < n; base += bd * U) {
    V rv[U], lv[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      u64 x = base + k * bd;
      if (x < n) rv[k] = __ldg(rs + rfrom + x);
      if (x < nl) lv[k] = __ldg(ls + lfrom + x);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      u64 x = base + k * bd;
      if (x < n) {
        u64 i = rfrom + x;
        u64 row = udiv(i, vpr);
        u64 col = i - row * vpr;
        *reinterpret_cast<V*>(rdst + row * dst_stride + col * W) = rv[k];
      }
      if (x < nl) {
        u64 i = lfrom + x;
        u64 row = udiv(i, vpr);
        u64 col = i - row * vpr;
        *reinterpret_cast<V*>(ldst + row * dst_stride + col * W) = lv[k];
      }
    }
  }
}

/* Thread 0 of the block waits for *f >= e; block-uniform result. */
__device__ __forceinline__ bool blockWait(const u64* f, u64 e, const dpsPeerCommon& c, u64 t0,
                                          int peer, int wait) {
  int fail = 0;
  if (threadIdx.x == 0) fail = !waitFlagGe(f, e, c, t0, DPS_PEER_OP_SWAP, peer, wait);
  return !__syncthreads_or(fail);
}

template <int W>
__global__ void __launch_bounds__(DPS_OS_SWAP_THREADS) swapDirectKernel(dpsOsSwapArgs a) {
  const dpsPeerCommon& c = a.c;
  dpsPdlWait();
  dpsPdlRelease();
  const u64 e = beginEpoch(c, DPS_PEER_OP_SWAP);
  if (e == 0) return;
  const u64 t0 = globalTimer();
  const int tp = c.tp, me = c.rank, b = blockIdx.x, G = gridDim.x, maxb = a.max_blocks;
  const u64 C = (u64)a.row_bytes, OS = (u64)a.out_row_bytes, chunk = (u64)a.rows * C;
  const u64 vpr = C / W;
  const u64 T = (u64)a.rows * vpr;
  const u64 begin = T * (u64)b / (u64)G, end = T * (u64)(b + 1) / (u64)G;
  const char* lsrc = a.in + (u64)me * chunk;
  char* ldst = a.out + (u64)me * C;
  __shared__ int s_ready;

  /* 1. my output is free for this call */
  if ((int)threadIdx.x < tp && (int)threadIdx.x != me)
    stReleaseSys(reinterpret_cast<u64*>(a.flags_peer.p[threadIdx.x]) + DPS_OS_FLAG_READY(b, me, tp),
                 e);

  if (tp == 1) {
    copyRange<W>(lsrc, ldst, vpr, OS, begin, end);
    finishEpoch(c, DPS_PEER_OP_SWAP, e);
    return;
  }

  for (int k = 1; k < tp; ++k) {
    const int p = (me + k) % tp;
    const u64* ready = a.flags + DPS_OS_FLAG_READY(b, p, tp);
    const char* rsrc = a.in + (u64)p * chunk;
    char* rdst = a.out_peer.p[p] + (u64)me * C;
    if (k == 1) {
      /* 2. local slices while the first peer has not arrived, then fused */
      u64 lpos = begin;
      const u64 slice = (u64)blockDim.x * Unroll<W>::value;
      for (;;) {
        if (threadIdx.x == 0) s_ready = ldAcquireSys(ready) >= e;
        __syncthreads();
        const int ok = s_ready;
        __syncthreads();
        if (ok) break;
        if (lpos >= end) {
          if (!blockWait(ready, e, c, t0, p, DPS_PEER_WAIT_READY)) return;
          break;
        }
        const u64 stop = lpos + slice < end ? lpos + slice : end;
        copyRange<W>(lsrc, ldst, vpr, OS, lpos, stop);
        lpos = stop;
      }
      copyFused<W>(rsrc, rdst, lsrc, ldst, vpr, OS, begin, lpos, end);
    } else {
      /* 3. further peers */
      if (!blockWait(ready, e, c, t0, p, DPS_PEER_WAIT_READY)) return;
      copyRange<W>(rsrc, rdst, vpr, OS, begin, end);
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0)
      stReleaseSys(reinterpret_cast<u64*>(a.flags_peer.p[p]) + DPS_OS_FLAG_DONE(b, me, tp, maxb), e);
  }

  /* 4. everything destined to me landed */
  int fail = 0;
  if ((int)threadIdx.x < tp && (int)threadIdx.x != me)
    fail = !waitFlagGe(a.flags + DPS_OS_FLAG_DONE(b, threadIdx.x, tp, maxb), e, c, t0,
                       DPS_PEER_OP_SWAP, threadIdx.x, DPS_PEER_WAIT_DONE);
  if (__syncthreads_or(fail)) return;
  finishEpoch(c, DPS_PEER_OP_SWAP, e);
}

/* ---- LL path ---- */

/* 8 payload bytes at chunk offset 8*l (zero past the end), read in LU units. */
template <int LU>
__device__ __forceinline__ uint2 loadPayload(const char* __restrict__ chunk, u64 S, u64 l) {
  const u64 off = l * 8;
  uint2 d = make_uint2(0u, 0u);
  if (LU == 8) {
    d = __ldg(reinterpret_cast<const uint2*>(chunk + off));
  } else if (LU == 4) {
    d.x = __ldg(reinterpret_cast<const unsigned int*>(chunk + off));
    if (off + 4 < S) d.y = __ldg(reinterpret_cast<const unsigned int*>(chunk + off + 4));
  } else {
    unsigned h[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (off + 2 * u < S) h[u] = __ldg(reinterpret_cast<const unsigned short*>(chunk + off + 2 * u));
    d.x = h[0] | (h[1] << 16);
    d.y = h[2] | (h[3] << 16);
  }
  return d;
}

/* Stores the 8 payload bytes of line l of rank src's chunk into my output. */
template <int LU>
__device__ __forceinline__ void unpackPayload(const dpsOsSwapArgs& a, int src, u64 l, uint2 d) {
  const u64 C = (u64)a.row_bytes, S = (u64)a.rows * C;
  char* out = a.out + (u64)src * C;
#pragma unroll
  for (int u = 0; u < 8 / LU; ++u) {
    const u64 off = l * 8 + (u64)u * LU;
    if (off < S) {
      const u64 row = udiv(off, C);
      char* dst = out + row * (u64)a.out_row_bytes + (off - row * C);
      if (LU == 8) {
        *reinterpret_cast<uint2*>(dst) = d;
      } else if (LU == 4) {
        *reinterpret_cast<unsigned int*>(dst) = u == 0 ? d.x : d.y;
      } else {
        const unsigned w = u < 2 ? d.x : d.y;
        *reinterpret_cast<unsigned short*>(dst) = (unsigned short)((u & 1) ? (w >> 16) : (w & 0xffffu));
      }
    }
  }
}

template <int LU>
__global__ void __launch_bounds__(DPS_OS_SWAP_THREADS) swapLLKernel(dpsOsSwapArgs a) {
  const dpsPeerCommon& c = a.c;
  const int tp = c.tp, me = c.rank, b = blockIdx.x, G = gridDim.x;
  const u64 S = (u64)a.rows * (u64)a.row_bytes;
  const u64 L = (S + 7) / 8;
  const u64 lb = L * (u64)b / (u64)G, le = L * (u64)(b + 1) / (u64)G;
  const u64 cap = (u64)a.ll_cap;
  dpsPdlWait();
  dpsPdlRelease();
  /* Issue the first payload load (first peer) before the epoch read. */
  const u64 l0 = lb + threadIdx.x;
  const uint2 pre = (l0 < le && tp > 1) ? loadPayload<LU>(a.in + (u64)((me + 1) % tp) * S, S, l0)
                                        : make_uint2(0u, 0u);
  const u64 e = beginEpoch(c, DPS_PEER_OP_SWAP);
  if (e == 0) return;
  const u64 t0 = globalTimer();
  const uint32_t flag = llFlag(e);
  const int par = (int)(e & 1);

  /* send to every peer, copy my own chunk */
  for (u64 l = l0; l < le; l += blockDim.x) {
    for (int k = 1; k < tp; ++k) {
      const int p = (me + k) % tp;
      const uint2 d = (l == l0 && k == 1) ? pre : loadPayload<LU>(a.in + (u64)p * S, S, l);
      stLine(a.ll_peer.p[p] + DPS_PEER_LL_OFFSET(par, me, l, tp, cap), d.x, d.y, flag);
    }
    unpackPayload<LU>(a, me, l, loadPayload<LU>(a.in + (u64)me * S, S, l));
  }

  /* receive */
  int fail = 0;
  for (u64 l = lb + threadIdx.x; l < le && !fail; l += blockDim.x) {
    for (int k = 1; k < tp && !fail; ++k) {
      const int src = (me + k) % tp;
      const char* line = a.ll + DPS_PEER_LL_OFFSET(par, src, l, tp, cap);
      unsigned n = 0;
      uint4 v = ldLine(line);
      while (v.y != flag || v.w != flag) {
        if ((++n & 127u) == 0 && spinExpired(c, t0, DPS_PEER_OP_SWAP, src, DPS_PEER_WAIT_DATA)) {
          fail = 1;
          break;
        }
        v = ldLine(line);
      }
      if (!fail) unpackPayload<LU>(a, src, l, make_uint2(v.x, v.z));
    }
  }
  if (__syncthreads_or(fail)) return;
  finishEpoch(c, DPS_PEER_OP_SWAP, e);
}

}  // namespace

extern "C" cudaError_t dpsOsLaunchSwap(const dpsOsSwapArgs* a, int path, int width, int grid,
                                       cudaStream_t stream) {
  const unsigned g = (unsigned)grid, t = DPS_OS_SWAP_THREADS;
  if (path == 0) {
    switch (width) {
      case 16: return dpsLaunch(swapDirectKernel<16>, dim3(g), dim3(t), stream, a->c.pdl, *a);
      case 8: return dpsLaunch(swapDirectKernel<8>, dim3(g), dim3(t), stream, a->c.pdl, *a);
      case 4: return dpsLaunch(swapDirectKernel<4>, dim3(g), dim3(t), stream, a->c.pdl, *a);
      case 2: return dpsLaunch(swapDirectKernel<2>, dim3(g), dim3(t), stream, a->c.pdl, *a);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (width) {
    case 8: return dpsLaunch(swapLLKernel<8>, dim3(g), dim3(t), stream, a->c.pdl, *a);
    case 4: return dpsLaunch(swapLLKernel<4>, dim3(g), dim3(t), stream, a->c.pdl, *a);
    case 2: return dpsLaunch(swapLLKernel<2>, dim3(g), dim3(t), stream, a->c.pdl, *a);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t dpsOsPreloadSwapKernels(void) {
  const void* const k[] = {
      (const void*)swapDirectKernel<16>, (const void*)swapDirectKernel<8>,
      (const void*)swapDirectKernel<4>,  (const void*)swapDirectKernel<2>,
      (const void*)swapLLKernel<8>,      (const void*)swapLLKernel<4>,
      (const void*)swapLLKernel<2>};
  return dpsPreload(k, (int)(sizeof k / sizeof k[0]));
}
