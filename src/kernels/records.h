/* Where a shard reduction's per-row records go, and where its merge reads
 * them (host: the backends' records exchange; device: the kernels).
 *
 * A step of a shard reduction is a local pass that writes a fixed-size
 * record of `words` 32-bit words per row (even), the backend's move of the
 * records (nccl: one all-gather of a plain buffer; onesided: LL lines of two
 * words stored into every rank's staging), and a merge that reads every
 * rank's record of a row. The backend fills the sink and the source; the op
 * fills everything else. The shard reductions that take this path: dpsArgmax
 * and dpsTopK (kernels/select_kernels.h) and dpsSample's steps
 * (kernels/sample_kernels.h). */
#ifndef DPS_RECORDS_H_
#define DPS_RECORDS_H_

#include <stdint.h>

#include "kernels/onesided_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  DPS_REC_NONE = 0,  /* no records: the local pass writes the op's outputs (tp == 1) */
  DPS_REC_PLAIN = 1, /* plain[row * words + w] (nccl: all-gathered; tp == 1: kept) */
  DPS_REC_LL = 2     /* LL lines into every rank's staging (onesided) */
};

typedef struct {
  int kind;
  uint32_t* plain;       /* DPS_REC_PLAIN: [rows][words] */
  dpsOsCommon c;         /* DPS_REC_LL: epochs, error word, peers */
  int op;                /* DPS_REC_LL: the epoch counter (DPS_OS_OP_*) */
  dpsOsPeers stage_peer; /* DPS_REC_LL: every rank's staging */
  long long cap;         /* DPS_REC_LL: lines per (parity, src) */
  int max_blocks;        /* the most blocks a kernel may run (0: any) */
} dpsRecSink;

typedef struct {
  int ll;                   /* 0: plain [tp][rows][words] in gathered */
  const uint32_t* gathered;
  dpsOsCommon c;            /* ll: epochs, error word, peers, timeout */
  int op;
  const char* stage;        /* ll: the local staging */
  long long cap;
  int max_blocks;           /* the most blocks a kernel may run (0: any) */
} dpsRecSource;

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
/* The epoch of the records a merge reads: 1 for plain records; LL: the one
 * the local kernel published before it on the stream, 0 when the
 * communicator failed (the merge then writes nothing). */
__device__ __forceinline__ unsigned long long dpsRecMergeEpoch(const dpsRecSource& s) {
  if (!s.ll) return 1;
  if (dpsos::ldVolatile(&s.c.state->err) != 0) return 0;
  return dpsos::ldVolatile(&s.c.state->epoch[s.op]);
}
#endif

#endif /* DPS_RECORDS_H_ */
