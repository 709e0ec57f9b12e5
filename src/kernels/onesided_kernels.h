/* The onesided backend's kernels: the interface between
 * backends/onesided_backend.c, backends/onesided_plan.c (host, C) and
 * kernels/onesided_*.cu. The kernels take plain peer pointers (every rank's
 * address of the NCCL symmetric windows, obtained once at creation) and need
 * no NCCL headers; the transport types they share with the records steps
 * (device state, epochs, error word, fail area, LL lines) are in
 * kernels/records.h, their device side in kernels/device.cuh.
 *
 * The protocol (epochs, LL/LL128 lines, staging regions and their sizes, the
 * run-ahead rule, timeouts, teardown): docs/design.md, "The onesided
 * protocol". */
#ifndef DPS_ONESIDED_KERNELS_H_
#define DPS_ONESIDED_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/records.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flag area of window A (per rank, all u64 epochs):
 *   ready[b][src] at index            b*tp + src
 *   done [b][src] at index  max_blocks*tp + b*tp + src
 * Rank `src` writes them into the receiver's area. */
#define DPS_OS_FLAG_READY(b, src, tp) ((size_t)(b) * (size_t)(tp) + (size_t)(src))
#define DPS_OS_FLAG_DONE(b, src, tp, maxb) \
  ((size_t)(maxb) * (size_t)(tp) + (size_t)(b) * (size_t)(tp) + (size_t)(src))
#define DPS_OS_FLAG_WORDS(tp, maxb) (2u * (size_t)(maxb) * (size_t)(tp))

/* LL128 lines of the gathers (on request, every peer on NVLink): 128-byte
 * lines, 8 threads x 16 bytes stored by one warp instruction, words 0..30
 * data and word 31 the flag: 31 values per line, in the staging layout of
 * DPS_PEER_STAGE_OFFSET (kernels/records.h). Relies on NVLink delivering such
 * a 128-byte warp store as a unit (what NCCL's LL128 protocol relies on). */
#define DPS_OS_LL128_LINE_BYTES 128
#define DPS_OS_LL128_LINE_VALUES 31

/* Gather protocols (agreed at creation). */
enum { DPS_OS_PROTO_LL = 0, DPS_OS_PROTO_LL128 = 1 };

/* Swap. The chunk a rank sends to a peer is contiguous in its input: rows
 * [peer*rows, (peer+1)*rows) of row_bytes each; it lands in the peer's output
 * rows [0, rows) at byte column rank*row_bytes, output row stride
 * out_row_bytes (= tp*row_bytes). */
typedef struct {
  dpsPeerCommon c;
  const char* in;
  char* out;                /* local swap_out */
  dpsPeers out_peer;      /* every rank's swap_out (direct path) */
  unsigned long long* flags; /* local flag area */
  dpsPeers flags_peer;    /* every rank's flag area */
  char* ll;                 /* local swap LL staging */
  dpsPeers ll_peer;       /* every rank's swap LL staging */
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
  dpsPeerCommon c;
  int op;            /* DPS_OS_OP_GATHER_* */
  int nseg;
  const uint32_t* in[3];
  uint32_t* out[3];
  long long count[3];
  long long total;   /* sum of count */
  char* stage;       /* local staging of this op */
  dpsPeers stage_peer;
  long long cap;     /* lines per (parity, src) */
} dpsOsGatherArgs;

/* Load the kernels now (see dpsPreload in kernels/device.cuh). */
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

#ifdef __cplusplus
}
#endif

#endif /* DPS_ONESIDED_KERNELS_H_ */
