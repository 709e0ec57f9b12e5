/* The records step of the shard reductions, and the peer transport it shares
 * with the onesided kernels (plain C; host: the core and both backends;
 * device: every kernel through kernels/device.cuh).
 *
 * A step of a shard reduction is a local pass that writes a fixed-size
 * record of `words` 32-bit words per row (even), the backend's move of the
 * records (nccl: one all-gather of a plain buffer; onesided: LL lines of two
 * words stored into every rank's staging), and a merge that reads every
 * rank's record of a row. The backend fills the sink and the source; the op
 * fills everything else. The shard reductions that take this path: dpsArgmax
 * and dpsTopK (kernels/select_kernels.h) and dpsSample's steps
 * (kernels/sample_kernels.h).
 *
 * The peer transport (the second half of this header) is what an LL sink
 * carries and what the onesided backend's own kernels (onesided_kernels.h)
 * build on: the device state with the epochs and the error word, the fail
 * area, every rank's addresses, the LL line layout. The protocol (epochs,
 * lines, staging, run-ahead, timeouts): docs/design.md, "The onesided
 * protocol". The nccl backend's code includes this header (its records are
 * DPS_REC_PLAIN) but never the onesided backend's kernel interface. */
#ifndef DPS_RECORDS_H_
#define DPS_RECORDS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the peer transport ---------------------------------------------------- */

#define DPS_PEER_MAX_RANKS 8

/* Operations (index of the epoch counter, recorded in timeouts). */
enum {
  DPS_PEER_OP_SWAP = 0,
  DPS_PEER_OP_GATHER_OUTPUTS = 1,
  DPS_PEER_OP_GATHER_LOGPROBS = 2,
  DPS_PEER_OP_RECORDS = 3, /* records steps: argmax, top-k, sample */
  DPS_PEER_NUM_OPS = 4
};

/* What a timed-out kernel was waiting for. */
enum {
  DPS_PEER_WAIT_READY = 1, /* swap: peer's "my output buffer is free" flag */
  DPS_PEER_WAIT_DONE = 2,  /* swap: peer's "my stores into you landed" flag */
  DPS_PEER_WAIT_DATA = 3,  /* LL: peer's data+flag words */
  DPS_PEER_WAIT_PEER_FAILED = 4 /* the peer marked itself failed (fail area) */
};

/* Error word (device copy in dpsPeerDevState.err, host copy in mapped pinned
 * memory): 0 = no error, else
 *   bit 63 set | wait kind << 40 | op << 32 | peer (low 16 bits). */
#define DPS_PEER_ERR_SET (1ull << 63)
#define DPS_PEER_ERR_PEER(w) ((int)((w)&0xffffu))
#define DPS_PEER_ERR_OP(w) ((int)(((w) >> 32) & 0xffu))
#define DPS_PEER_ERR_WAIT(w) ((int)(((w) >> 40) & 0xffu))

/* The gathers run a grid fixed at creation (a function of max_pad_bs only),
 * so block b always owns the same staging lines and keeps its own epoch:
 * no cross-block ticket on the latency path. */
#define DPS_PEER_GATHER_MAX_BLOCKS 64

/* Local (not symmetric) device state, zeroed at creation. */
typedef struct {
  unsigned long long epoch[DPS_PEER_NUM_OPS]; /* last completed epoch per op */
  unsigned int ticket[DPS_PEER_NUM_OPS];      /* blocks finished in the running kernel */
  unsigned int pad_[2];
  unsigned long long err;                   /* first failure wins (atomicCAS) */
  /* gathers: epochs claimed by block b, [op - DPS_PEER_OP_GATHER_OUTPUTS][b]
   * (claimBlockEpoch) */
  unsigned long long block_epoch[2][DPS_PEER_GATHER_MAX_BLOCKS];
} dpsPeerDevState;

typedef struct {
  char* p[DPS_PEER_MAX_RANKS];
} dpsPeers;

/* Fields every kernel that waits for a peer needs. */
typedef struct {
  int tp, rank;
  dpsPeerDevState* state;
  unsigned long long* host_err; /* device view of the mapped pinned error word */
  unsigned long long timeout_ns;
  int pdl; /* launch with programmatic dependent launch (kernels/device.cuh) */
  /* Fail area (window A, DPS_PEER_MAX_RANKS u64 per rank): a rank that gives up
   * writes its error word into fail[me] of every peer, so that a peer which
   * has not noticed anything yet stops waiting at once and skips the
   * collective window deregistration at destroy (which would wait forever
   * for the failed rank). */
  const unsigned long long* fail;             /* mine: fail[src] written by src */
  unsigned long long* fail_peer[DPS_PEER_MAX_RANKS]; /* every rank's fail area */
} dpsPeerCommon;

/* Staging layout of the LL protocols: [parity 2][src tp][cap lines] of
 * line_bytes each. LL: 16-byte lines {data0, flag, data1, flag} (two 8-byte
 * LL words), 2 values per line (the swap's small path, the records, the
 * gathers by default). The gathers' LL128 lines: onesided_kernels.h. */
#define DPS_PEER_LL_LINE_BYTES 16
#define DPS_PEER_LL_LINE_VALUES 2
#define DPS_PEER_STAGE_OFFSET(parity, src, line, tp, cap, line_bytes)                              \
  ((((size_t)(parity) * (size_t)(tp) + (size_t)(src)) * (size_t)(cap) + (size_t)(line)) *      \
   (size_t)(line_bytes))
#define DPS_PEER_LL_OFFSET(parity, src, line, tp, cap) \
  DPS_PEER_STAGE_OFFSET(parity, src, line, tp, cap, DPS_PEER_LL_LINE_BYTES)

/* ---- the records step ------------------------------------------------------- */

enum {
  DPS_REC_NONE = 0,  /* no records: the local pass writes the op's outputs (tp == 1) */
  DPS_REC_PLAIN = 1, /* plain[row * words + w] (nccl: all-gathered; tp == 1: kept) */
  DPS_REC_LL = 2     /* LL lines into every rank's staging (onesided) */
};

typedef struct {
  int kind;
  uint32_t* plain;       /* DPS_REC_PLAIN: [rows][words] */
  dpsPeerCommon c;         /* DPS_REC_LL: epochs, error word, peers */
  int op;                /* DPS_REC_LL: the epoch counter (DPS_PEER_OP_*) */
  dpsPeers stage_peer; /* DPS_REC_LL: every rank's staging */
  long long cap;         /* DPS_REC_LL: lines per (parity, src) */
  int max_blocks;        /* the most blocks a kernel may run (0: any) */
} dpsRecSink;

typedef struct {
  int ll;                   /* 0: plain [tp][rows][words] in gathered */
  const uint32_t* gathered;
  dpsPeerCommon c;            /* ll: epochs, error word, peers, timeout */
  int op;
  const char* stage;        /* ll: the local staging */
  long long cap;
  int max_blocks;           /* the most blocks a kernel may run (0: any) */
} dpsRecSource;

#ifdef __cplusplus
}
#endif

#endif /* DPS_RECORDS_H_ */
