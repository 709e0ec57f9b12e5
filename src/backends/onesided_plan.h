/* Host-side planning of the onesided backend, plain C, no NCCL: the memory
 * layout and capacities from the configuration, the kernels' common
 * arguments from the windows' addresses, and for every call the kernel
 * arguments and launch plan (swap path LL/direct, vector width, grid;
 * gather staging offsets and grid) from the shape and the pointers.
 *
 * Used by backends/onesided_backend.c, whose provider (production: NCCL
 * windows; the virtual-rank tests: cudaMalloc pointers of tp ranks on one
 * device) only supplies the addresses. Nothing here allocates or talks to a
 * device.
 *
 * The memory layout it computes (windows A and B, their regions and sizes;
 * the verify outputs are the core's, comm->vout) and the protocol the plans
 * serve: docs/design.md, "The onesided protocol" (4.1 Memory, 4.4 Lines and
 * staging).
 */
#ifndef DPS_ONESIDED_PLAN_H_
#define DPS_ONESIDED_PLAN_H_

#include <stddef.h>
#include <stdint.h>

#include "dpsampling.h"
#include "kernels/onesided_kernels.h"
#include "layout.h" /* dpsShape */

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a per-peer chunk per direct-path swap block, lines per LL block. */
#define DPS_OS_DIRECT_BYTES_PER_BLOCK ((uint64_t)32 * 1024)
#define DPS_OS_LL_LINES_PER_BLOCK 1024

typedef struct {
  /* inputs: the configuration and what the ranks agreed on */
  int tp, rank;
  int n;             /* tokens per request */
  int max_pad_bs;
  int64_t vocab;
  int maxb;          /* agreed grid cap (swap flag stride) */
  uint64_t ll_bytes; /* agreed swap LL threshold (per-peer chunk bytes) */
  int gproto;        /* agreed gather protocol, DPS_OS_PROTO_* */
  int gthreads;      /* gather block size */
  int rec_words;     /* record capacity, words per row (comm->rec_words) */
  /* derived by dpsOsLayoutInit */
  size_t close_bytes;          /* the close exchange's words */
  int64_t cap_out, cap_lp;     /* gather staging lines per (parity, src) */
  size_t off_fail, off_gout, off_glp;
  int64_t cap_rec;             /* records staging lines per (parity, src) */
  size_t off_rec;
  size_t bytes_a;              /* window A bytes before the allocation's rounding */
  /* derived by dpsOsLayoutPrepare */
  size_t esize;
  int64_t cap_sw;              /* swap LL staging lines per (parity, src) */
  size_t off_swll;
  size_t bytes_b;
} dpsOsLayout;

/* Fills the creation part of the layout from its inputs. dpsInvalidArgument
 * (message set) when window A's byte count overflows. */
dpsResult_t dpsOsLayoutInit(dpsOsLayout* L);

/* Fills the swap window's part for element size esize. dpsInvalidArgument
 * (message set) when the swap output size overflows. */
dpsResult_t dpsOsLayoutPrepare(dpsOsLayout* L, size_t esize);

/* A window's local base and every rank's address of it (peer[rank] is the
 * local one). */
typedef struct {
  char* base;
  char* peer[DPS_PEER_MAX_RANKS];
} dpsOsWindows;

/* The close exchange's words (close_bytes of device memory): this rank's
 * health word (0 = healthy) and every rank's after the exchange. */
typedef struct {
  uint32_t* in;  /* [1] */
  uint32_t* out; /* [tp] */
} dpsOsCloseWords;
dpsOsCloseWords dpsOsCloseWordsAt(void* close);

/* The kernels' common arguments, fixed once window A exists. */
dpsPeerCommon dpsOsMakeCommon(const dpsOsLayout* L, const dpsOsWindows* a, dpsPeerDevState* state,
                            unsigned long long* host_err_dev, int timeout_ms, int pdl);

/* One swap call: path 1 = LL, 0 = direct; width: vector/unit bytes. */
typedef struct {
  int path, width, grid;
} dpsOsSwapPlan;

/* Fills the swap kernel's arguments and plan for input `in` and the call's
 * shape (the core checked both). a: window A (flags), b: window B (output,
 * staging). */
void dpsOsPlanSwap(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                   const dpsOsWindows* b, const void* in, const dpsShape* sh,
                   dpsOsSwapArgs* args, dpsOsSwapPlan* plan);

/* Fill a gather's arguments; return its grid (launch with L->gproto and
 * L->gthreads). The grid depends only on the capacity (max_pad_bs), never
 * on this call's shape. */
int dpsOsPlanGatherOutputs(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                           const dpsVerifyOutputs* out, const int32_t* predict,
                           const int32_t* accept_index, const int32_t* accept_length,
                           const dpsShape* sh, dpsOsGatherArgs* args);
int dpsOsPlanGatherLogprobs(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                            const dpsVerifyOutputs* out, const float* in, const dpsShape* sh,
                            dpsOsGatherArgs* args);

/* dpsCommClose's health exchange: one more logprobs-gather call (the same
 * staging, kernel and epoch sequence, which every rank runs at the same
 * point) of one word per rank, w->in -> w->out[src]. Returns its grid. */
int dpsOsPlanCloseExchange(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                           const dpsOsCloseWords* w, dpsOsGatherArgs* args);

#ifdef __cplusplus
}
#endif

#endif /* DPS_ONESIDED_PLAN_H_ */
