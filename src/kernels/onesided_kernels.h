/* One-sided (NVLink load/store) kernels: the interface between
 * backends/onesided_backend.c (host, C) and kernels/onesided_*.cu.
 *
 * The hot kernels take plain peer pointers (obtained once at creation from
 * NCCL's symmetric windows, see onesided_setup.cu) and need no NCCL headers.
 *
 * Synchronisation is our own (flags in the symmetric window, checked with a
 * timeout), not NCCL's LSA barrier, because an LSA barrier waits forever when
 * a peer is gone. Hence no ncclDevComm is created: only windows.
 *
 * Epochs: the swap has a 64-bit counter in device memory
 * (dpsOsDevState.epoch[op]). Every block of a kernel reads it at start and
 * works on epoch+1; the last block to finish (atomic ticket) stores epoch+1,
 * so the next kernel of that operation on the stream sees the new value. The
 * gathers run a fixed grid and keep one counter per block instead, claimed
 * with an atomic before the PDL wait (claimBlockEpoch): no ticket and no
 * epoch read on their latency path. No host-side epoch: CUDA graph replays
 * advance them like eager calls.
 */
#ifndef DPS_ONESIDED_KERNELS_H_
#define DPS_ONESIDED_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_OS_MAX_RANKS 8

/* Operations (index of the epoch counter, recorded in timeouts). */
enum {
  DPS_OS_OP_SWAP = 0,
  DPS_OS_OP_GATHER_OUTPUTS = 1,
  DPS_OS_OP_GATHER_LOGPROBS = 2,
  DPS_OS_OP_RECORDS = 3, /* records steps (records.h): argmax, top-k, sample */
  DPS_OS_NUM_OPS = 4
};

/* What a timed-out kernel was waiting for. */
enum {
  DPS_OS_WAIT_READY = 1, /* swap: peer's "my output buffer is free" flag */
  DPS_OS_WAIT_DONE = 2,  /* swap: peer's "my stores into you landed" flag */
  DPS_OS_WAIT_DATA = 3,  /* LL: peer's data+flag words */
  DPS_OS_WAIT_PEER_FAILED = 4 /* the peer marked itself failed (fail area) */
};

/* Error word (device copy in dpsOsDevState.err, host copy in mapped pinned
 * memory): 0 = no error, else
 *   bit 63 set | wait kind << 40 | op << 32 | peer (low 16 bits). */
#define DPS_OS_ERR_SET (1ull << 63)
#define DPS_OS_ERR_PEER(w) ((int)((w)&0xffffu))
#define DPS_OS_ERR_OP(w) ((int)(((w) >> 32) & 0xffu))
#define DPS_OS_ERR_WAIT(w) ((int)(((w) >> 40) & 0xffu))

/* The gathers run a grid fixed at creation (a function of max_pad_bs only),
 * so block b always owns the same staging lines and keeps its own epoch:
 * no cross-block ticket on the latency path. */
#define DPS_OS_GATHER_MAX_BLOCKS 64

/* Local (not symmetric) device state, zeroed at creation. */
typedef struct {
  unsigned long long epoch[DPS_OS_NUM_OPS]; /* last completed epoch per op */
  unsigned int ticket[DPS_OS_NUM_OPS];      /* blocks finished in the running kernel */
  unsigned int pad_[2];
  unsigned long long err;                   /* first failure wins (atomicCAS) */
  /* gathers: epochs claimed by block b, [op - DPS_OS_OP_GATHER_OUTPUTS][b]
   * (claimBlockEpoch) */
  unsigned long long block_epoch[2][DPS_OS_GATHER_MAX_BLOCKS];
} dpsOsDevState;

typedef struct {
  char* p[DPS_OS_MAX_RANKS];
} dpsOsPeers;

/* Fields every kernel needs. */
typedef struct {
  int tp, rank;
  dpsOsDevState* state;
  unsigned long long* host_err; /* device view of the mapped pinned error word */
  unsigned long long timeout_ns;
  int pdl; /* launch with programmatic dependent launch (kernels/launch.cuh) */
  /* Fail area (window A, DPS_OS_MAX_RANKS u64 per rank): a rank that gives up
   * writes its error word into fail[me] of every peer, so that a peer which
   * has not noticed anything yet stops waiting at once and skips the
   * collective window deregistration at destroy (which would wait forever
   * for the failed rank). */
  const unsigned long long* fail;             /* mine: fail[src] written by src */
  unsigned long long* fail_peer[DPS_OS_MAX_RANKS]; /* every rank's fail area */
} dpsOsCommon;

/* Flag area of window A (per rank, all u64 epochs):
 *   ready[b][src] at index            b*tp + src
 *   done [b][src] at index  max_blocks*tp + b*tp + src
 * Rank `src` writes them into the receiver's area. */
#define DPS_OS_FLAG_READY(b, src, tp) ((size_t)(b) * (size_t)(tp) + (size_t)(src))
#define DPS_OS_FLAG_DONE(b, src, tp, maxb) \
  ((size_t)(maxb) * (size_t)(tp) + (size_t)(b) * (size_t)(tp) + (size_t)(src))
#define DPS_OS_FLAG_WORDS(tp, maxb) (2u * (size_t)(maxb) * (size_t)(tp))

/* Staging layout of the LL protocols: [parity 2][src tp][cap lines].
 *  LL:    16-byte lines {data0, flag, data1, flag} (two 8-byte LL words):
 *         2 values per line (the swap, and the gathers off NVLink).
 *  LL128: 128-byte lines, 8 threads x 16 bytes stored by one warp
 *         instruction, words 0..30 data and word 31 the flag: 31 values per
 *         line. Relies on NVLink delivering such a 128-byte warp store as a
 *         unit (what NCCL's LL128 protocol relies on), so it runs only on
 *         request and only when every peer is on NVLink (onesided_backend.c). */
#define DPS_OS_LL_LINE_BYTES 16
#define DPS_OS_LL_LINE_VALUES 2
#define DPS_OS_LL128_LINE_BYTES 128
#define DPS_OS_LL128_LINE_VALUES 31
#define DPS_OS_STAGE_OFFSET(parity, src, line, tp, cap, line_bytes)                              \
  ((((size_t)(parity) * (size_t)(tp) + (size_t)(src)) * (size_t)(cap) + (size_t)(line)) *      \
   (size_t)(line_bytes))
#define DPS_OS_LL_OFFSET(parity, src, line, tp, cap) \
  DPS_OS_STAGE_OFFSET(parity, src, line, tp, cap, DPS_OS_LL_LINE_BYTES)

/* Gather protocols (agreed at creation). */
enum { DPS_OS_PROTO_LL = 0, DPS_OS_PROTO_LL128 = 1 };

/* Swap. The chunk a rank sends to a peer is contiguous in its input: rows
 * [peer*rows, (peer+1)*rows) of row_bytes each; it lands in the peer's output
 * rows [0, rows) at byte column rank*row_bytes, output row stride
 * out_row_bytes (= tp*row_bytes). */
typedef struct {
  dpsOsCommon c;
  const char* in;
  char* out;                /* local swap_out */
  dpsOsPeers out_peer;      /* every rank's swap_out (direct path) */
  unsigned long long* flags; /* local flag area */
  dpsOsPeers flags_peer;    /* every rank's flag area */
  char* ll;                 /* local swap LL staging */
  dpsOsPeers ll_peer;       /* every rank's swap LL staging */
  long long rows;           /* reqs*N */
  long long row_bytes;      /* v_local*esize */
  long long out_row_bytes;  /* V*esize */
  long long ll_cap;         /* LL staging lines per (parity, src) */
  int max_blocks;           /* flag area stride (agreed at creation) */
} dpsOsSwapArgs;

/* path: 0 = direct (ready/done flags, stores into the peers' outputs),
 *       1 = LL (data+flag words into the peers' staging; local unpack).
 * width: direct: vector bytes 16/8/4/2; LL: unit bytes 8/4/2.
 * The grid must be the same on every rank (a function of the shape only). */
cudaError_t dpsOsLaunchSwap(const dpsOsSwapArgs* a, int path, int width, int grid,
                            cudaStream_t stream);

/* Gathers (LL). The packed per-rank vector is the concatenation of up to 3
 * int32/fp32 segments; value j of segment k from rank src lands at
 * out[k][src*count[k] + j]. */
typedef struct {
  dpsOsCommon c;
  int op;            /* DPS_OS_OP_GATHER_* */
  int nseg;
  const uint32_t* in[3];
  uint32_t* out[3];
  long long count[3];
  long long total;   /* sum of count */
  char* stage;       /* local staging of this op */
  dpsOsPeers stage_peer;
  long long cap;     /* lines per (parity, src) */
} dpsOsGatherArgs;

/* Load the kernels now (see dpsPreload in kernels/launch.cuh). */
cudaError_t dpsOsPreloadSwapKernels(void);
cudaError_t dpsOsPreloadGatherKernels(void);

/* proto: DPS_OS_PROTO_*; a->cap counts lines of that protocol. The grid
 * must depend only on the capacity (each block keeps its own epoch over a
 * fixed set of lines). */
cudaError_t dpsOsLaunchGather(const dpsOsGatherArgs* a, int proto, int grid, int threads,
                              cudaStream_t stream);

#define DPS_OS_SWAP_THREADS 512
/* Gather block size: default, and the range DPSAMPLING_ONESIDED_GATHER_THREADS
 * may choose from (a multiple of 32). */
#define DPS_OS_GATHER_THREADS 256
#define DPS_OS_GATHER_THREADS_MAX 1024

/* ---- setup (onesided_setup.cu; the only place that includes nccl_device.h;
 * the NCCL window helper is declared in kernels/onesided_setup.h) */
/* *yes = 1 when the device code that runs on the current device was built
 * for sm_90+ (it then waits in griddepcontrol.wait; see kernels/launch.cuh):
 * only then may the kernels be launched with programmatic dependent launch.
 * Launches a one-thread kernel and synchronises. */
cudaError_t dpsOsKernelsSupportPdl(int* yes);

#ifdef __cplusplus
}
#endif

/* ---- device helpers shared by onesided_swap.cu and onesided_gather.cu ---- */
#if defined(__CUDACC__)
#include "launch.cuh"

namespace dpsos {

typedef unsigned long long u64;

__device__ __forceinline__ u64 ldAcquireSys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseSys(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ldVolatile(const u64* p) { return *(const volatile u64*)p; }
__device__ __forceinline__ u64 globalTimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* LL line: two 8-byte {data, flag} words; each 8-byte half is single-copy
 * atomic, so a reader that sees both flags sees both data words. */
__device__ __forceinline__ void stLine(char* p, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag),
               "r"(d1), "r"(flag)
               : "memory");
}
/* One 16-byte slice of an LL128 line (a warp stores 4 lines at once). */
__device__ __forceinline__ void stV4(char* p, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w0), "r"(w1),
               "r"(w2), "r"(w3)
               : "memory");
}
__device__ __forceinline__ uint4 ldLine(const char* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
/* Flag of epoch e in LL words: never 0 (fresh staging is zeroed). A stale
 * line of the same parity is at least 2 epochs old, so it can only alias
 * after ~2^32 calls of one operation in which that line was never rewritten. */
__device__ __forceinline__ uint32_t llFlag(u64 e) { return (uint32_t)(e % 0xffffffffull) + 1u; }

__device__ __forceinline__ u64 udiv(u64 a, u64 b) {
  if (((a | b) >> 32) == 0) return (uint32_t)a / (uint32_t)b;
  return a / b;
}

__device__ __forceinline__ void recordError(const dpsOsCommon& c, int op, int peer, int wait) {
  u64 w = DPS_OS_ERR_SET | ((u64)(unsigned)wait << 40) | ((u64)(unsigned)op << 32) |
          (u64)((unsigned)peer & 0xffffu);
  if (atomicCAS(&c.state->err, 0ull, w) == 0ull) {
    *(volatile u64*)c.host_err = w;
    for (int p = 0; p < c.tp; ++p)
      if (p != c.rank) *(volatile u64*)(c.fail_peer[p] + c.rank) = w;
    __threadfence_system();
  }
}

/* Polled from spin loops: true when the loop must give up (another block or
 * a peer failed, or this wait ran past the timeout; the cause is recorded). */
__device__ __forceinline__ bool spinExpired(const dpsOsCommon& c, u64 t0, int op, int peer,
                                            int wait) {
  if (ldVolatile(&c.state->err) != 0) return true;
  for (int p = 0; p < c.tp; ++p) {
    if (p != c.rank && ldVolatile(c.fail + p) != 0) {
      recordError(c, op, p, DPS_OS_WAIT_PEER_FAILED);
      return true;
    }
  }
  if (globalTimer() - t0 > c.timeout_ns) {
    recordError(c, op, peer, wait);
    return true;
  }
  return false;
}

/* One thread: waits until *f >= e. false on timeout / error. */
__device__ __forceinline__ bool waitFlagGe(const u64* f, u64 e, const dpsOsCommon& c, u64 t0,
                                           int op, int peer, int wait) {
  unsigned n = 0;
  while (ldAcquireSys(f) < e) {
    if ((++n & 127u) == 0 && spinExpired(c, t0, op, peer, wait)) return false;
  }
  return true;
}

/* Kernel prologue: the epoch this kernel works on, or 0 if the communicator
 * already failed (then the whole block returns at once). Block-uniform. */
__device__ __forceinline__ u64 beginEpoch(const dpsOsCommon& c, int op) {
  __shared__ u64 s_epoch;
  if (threadIdx.x == 0) {
    const u64 err = ldVolatile(&c.state->err), ep = ldVolatile(&c.state->epoch[op]);
    s_epoch = err != 0 ? 0ull : ep + 1ull;
  }
  __syncthreads();
  return s_epoch;
}

/* Gathers: claims block b's next epoch (see DPS_OS_GATHER_MAX_BLOCKS), or
 * returns 0 if the communicator already failed. Block-uniform.
 *
 * Called BEFORE dpsPdlWait(), so that its latency hides behind the previous
 * kernel's tail: the claim is an atomic increment at L2, and the kernel only
 * lets its dependent launch (dpsPdlReleaseFromClaimer) after its thread 0
 * has made its own claim, so a claim always follows the previous kernel's
 * claim, even while that kernel still runs. Nothing else on the gather path
 * may be read before the wait except kernel parameters. A stale `err` here
 * costs nothing: the spin loops re-read it. */
__device__ __forceinline__ u64 claimBlockEpoch(const dpsOsCommon& c, int op) {
  __shared__ u64 s_epoch;
  if (threadIdx.x == 0) {
    u64 e = 0ull;
    if (ldVolatile(&c.state->err) == 0ull)
      e = atomicAdd(&c.state->block_epoch[op - DPS_OS_OP_GATHER_OUTPUTS][blockIdx.x], 1ull) + 1ull;
    s_epoch = e;
  }
  __syncthreads();
  return s_epoch;
}

/* The trigger of a kernel that claimed with claimBlockEpoch(): issued by
 * thread 0 alone (the first trigger of any thread counts for the whole
 * block), after dpsPdlWait() and after its own claim. */
__device__ __forceinline__ void dpsPdlReleaseFromClaimer() {
  if (threadIdx.x == 0) dpsPdlRelease();
}

/* Kernel epilogue: the last block to finish publishes the epoch. */
__device__ __forceinline__ void finishEpoch(const dpsOsCommon& c, int op, u64 e) {
  __syncthreads();
  if (threadIdx.x == 0 && gridDim.x == 1) {
    *(volatile u64*)&c.state->epoch[op] = e; /* visible to the next kernel */
  } else if (threadIdx.x == 0) {
    __threadfence();
    unsigned t = atomicAdd(&c.state->ticket[op], 1u);
    if (t == gridDim.x - 1) {
      c.state->ticket[op] = 0;
      *(volatile u64*)&c.state->epoch[op] = e;
      __threadfence();
    }
  }
}

}  // namespace dpsos
#endif /* __CUDACC__ */

#endif /* DPS_ONESIDED_KERNELS_H_ */
