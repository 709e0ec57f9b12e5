/* dpsSample: the kernels' interface (host: core/sample.c; device:
 * kernels/sample.cu). docs/sampling.md is the design.
 *
 * Steps (each one local pass + one records exchange + one merge, see
 * records.h; at tp == 1 only the first pass, whose kernel then draws every
 * row itself, searches and race included, and nothing is exchanged):
 *  FIRST   every rank reduces its shard of a row to a record: the maximum and
 *          its index, the count of valid columns, the race winner over the
 *          whole shard (rows without top-k and top-p), fixed-point sums of
 *          exp for the logprob and for top-p, and the shard's best
 *          DPS_SAMPLE_CAND (value, index) pairs (rows with a filter). The
 *          merge draws every row it can prove from these (the fast path);
 *          the others get a search state.
 *  KSEARCH the top-k threshold of the remaining rows: a histogram of counts
 *          over the next digit of the value's order key per round.
 *  PSEARCH the top-p threshold: a histogram of fixed-point masses per round.
 *  RACE    the Gumbel race over the kept set the searches found.
 * Rows without a search state skip a step (no record moves for them). */
#ifndef DPS_SAMPLE_KERNELS_H_
#define DPS_SAMPLE_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h" /* DPS_SAMPLE_CANDIDATES */
#include "kernels/records.h"
#include "kernels/verify_walk.h" /* dpsSampleCounters, dpsVerifyWalkArgs */

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_SAMPLE_CAND DPS_SAMPLE_CANDIDATES
/* The first record: a header, then DPS_SAMPLE_CAND packed (key, index) pairs
 * (two words each) where the call may filter. */
#define DPS_SAMPLE_HDR_WORDS 26
#define DPS_SAMPLE_FIRST_WORDS(cand) (DPS_SAMPLE_HDR_WORDS + 2 * (cand))
/* Search digits: 6 bits of the 32-bit order key per round (the last round 2). */
#define DPS_SAMPLE_DIGIT_BITS 6
#define DPS_SAMPLE_BINS 64
#define DPS_SAMPLE_ROUNDS 6
#define DPS_SAMPLE_KSEARCH_WORDS DPS_SAMPLE_BINS       /* u32 counts */
#define DPS_SAMPLE_PSEARCH_WORDS (2 * DPS_SAMPLE_BINS) /* u64 masses */
#define DPS_SAMPLE_RACE_WORDS 4
#define DPS_SAMPLE_MAX_WORDS DPS_SAMPLE_FIRST_WORDS(DPS_SAMPLE_CAND)
/* Per-row state between the steps, identical on every rank. */
#define DPS_SAMPLE_STATE_BYTES 256
/* Rows x chunks of the first pass that may split a row (partial records). */
#define DPS_SAMPLE_MAX_PARTIALS 2048
#define DPS_SAMPLE_MAX_CHUNKS 8
/* Threads of a block of the first pass and the search steps (the most: the
 * shared arrays' size), and the blocks of the first pass resident per SM
 * (its launch bounds, 128 registers a thread; the host splits rows into
 * chunks to fill the SMs once). The first pass may also run blocks of
 * DPS_SAMPLE_SMALL_THREADS, four per SM under the same bounds
 * (dpsSampleArgs.threads; core/sample.c, firstThreads, says when). */
#define DPS_SAMPLE_THREADS 512
#define DPS_SAMPLE_FIRST_BLOCKS_PER_SM 1
#define DPS_SAMPLE_SMALL_THREADS 128
#define DPS_SAMPLE_SMALL_BLOCKS_PER_SM 4
/* tp == 1: blocks over which the exact kernel splits a row (one cluster; the
 * chunks take the place of the ranks in the searches' merge, so at most
 * DPS_PEER_MAX_RANKS). */
#define DPS_SAMPLE_EXACT_CHUNKS 8
/* The exact kernel splits rows over clusters while they number at most this
 * many a cluster, else draws each on one block. */
#define DPS_SAMPLE_EXACT_SPLIT_ROWS 2
/* The first pass's kernels (dpsSampleArgs.first), each holding only the
 * passes its calls may run, so that the passes of one do not weigh on the
 * code and registers of the others: ANY (every pass but the tile maxima),
 * TILED (the same with candidates collected from the tile maxima) and RACE
 * (calls without candidates or logprobs: greedy and temperature-only rows). */
enum { DPS_SAMPLE_FIRST_ANY = 0, DPS_SAMPLE_FIRST_TILED = 1, DPS_SAMPLE_FIRST_RACE = 2 };
/* The largest V: fixed-point sums of 2^40-scaled terms stay below 2^63. */
#define DPS_SAMPLE_VOCAB_MAX (1ll << 23)

enum {
  DPS_SAMPLE_STEP_FIRST = 0,
  DPS_SAMPLE_STEP_KSEARCH = 1,
  DPS_SAMPLE_STEP_PSEARCH = 2,
  DPS_SAMPLE_STEP_RACE = 3
};

/* The parameters as the kernels read them: the caller's (an array where
 * non-NULL, else the scalar), whether any array is given (then the kernels
 * check the values), and the rows per array entry: row r reads entry
 * r / per_entry and draws at offset + r % per_entry (dpsVerifyChain: N, the
 * positions of a request; dpsSample: 1). */
typedef struct {
  dpsSampleParams_t v;
  int any_array;
  int per_entry;
} dpsSampleParamsDev;

/* What every read of a logit sees (dpsVerifyChain): cap > 0 soft-caps it
 * (cap * tanhf(l / cap)), then a clear bit of the row's mask words (NULL:
 * none) excludes it. */
typedef struct {
  const uint32_t* mask; /* [rows, mask_words] over the global vocabulary */
  long long mask_words;
  float cap;
} dpsSampleXform;

/* The valid ranges of the float parameters, one rule for the host's check
 * of the scalars and the kernels' check of the arrays: 0 when valid, else
 * DPS_SAMPLE_ARG_* (kernels/verify_walk.h) of the first one out of range. */
#if defined(__CUDACC__)
#define DPS_SAMPLE_HD static __host__ __device__ __forceinline__
#else
#define DPS_SAMPLE_HD static inline
#endif
DPS_SAMPLE_HD int dpsSampleBadParam(float temperature, float top_p, float min_p) {
  if (!(temperature >= 0.f && temperature <= 3.40282347e38f)) /* NaN, negative, inf */
    return DPS_SAMPLE_ARG_TEMPERATURE;
  if (!(top_p > 0.f && top_p <= 1.f)) return DPS_SAMPLE_ARG_TOP_P;
  if (!(min_p >= 0.f && min_p < 1.f)) return DPS_SAMPLE_ARG_MIN_P;
  return 0;
}

/* Scratch of a communicator (core/sample.c allocates it once). */
typedef struct {
  void* state;              /* [max rows] x DPS_SAMPLE_STATE_BYTES */
  uint32_t* partial;        /* [DPS_SAMPLE_MAX_PARTIALS] x DPS_SAMPLE_MAX_WORDS */
  unsigned int* tickets;    /* [max rows] */
  dpsSampleCounters* counters;
  /* dpsVerifyChain: the rows' tokens and logprobs, then its persistent outputs */
  int64_t* tokens;          /* [max rows] */
  float* token_lps;         /* [max rows] */
  int32_t* predict;         /* [max rows] */
  int32_t* accept_index;    /* [max rows] */
  int32_t* accept_length;   /* [max_pad_bs] */
  float* logprobs;          /* [max rows] */
  unsigned int* walk_arrivals; /* the walk's arrival count (dpsVerifyWalkArgs) */
  unsigned int* exact_arrivals; /* the exact kernel's arrival count (its last block) */
  unsigned int* exact_pending;  /* rows the first pass left to the exact kernel (a hint: it
                                   looks for them only when nonzero; its last block zeroes it) */
} dpsSampleScratch;

typedef struct {
  const void* logits; /* [rows, cols] of dtype */
  long long rows, cols;
  int dtype;          /* 0 fp32, 1 bf16, 2 fp16 */
  long long col0;     /* global index of column 0 */
  long long nvalid;   /* columns below the vocab limit */
  int tp, rank;
  int cand;           /* DPS_SAMPLE_CAND, or 0 when no row can filter */
  int chunks;         /* blocks per row of the first pass (1..DPS_SAMPLE_MAX_CHUNKS) */
  int threads;        /* the first pass's block: DPS_SAMPLE_THREADS or _SMALL_THREADS */
  int want_logprob;
  int first;          /* the first pass's kernel: DPS_SAMPLE_FIRST_* (TILED: the candidates'
                         collection re-reads only the tiles that may reach its threshold,
                         dpsSelCollectTiled) */
  int step;           /* DPS_SAMPLE_STEP_* (a row's round is in its state) */
  int words;          /* record words of this step */
  dpsSampleParamsDev p;
  dpsSampleXform xf;
  int64_t* tokens;
  float* logprobs;
  dpsSampleScratch s;
  dpsRecSink sink;
  dpsRecSource src;
  int pdl;
  dpsVerifyWalkArgs walk; /* tp == 1: the last kernel walks in its last block (pad_bs 0: no walk) */
  int exact_clusters; /* tp == 1: > 0: the first pass leaves exact rows to the exact kernel, run
                         on this many clusters of DPS_SAMPLE_EXACT_CHUNKS blocks; 0: each
                         exact row is drawn on the block of its first pass */
} dpsSampleArgs;

cudaError_t dpsLaunchSampleLocal(const dpsSampleArgs* a, cudaStream_t stream);
/* tp > 1: the walk after the last merge (one block). */
cudaError_t dpsLaunchVerifyWalk(const dpsSampleArgs* a, const dpsVerifyWalkArgs* w,
                                cudaStream_t stream);
cudaError_t dpsLaunchSampleMerge(const dpsSampleArgs* a, cudaStream_t stream);
/* tp == 1, after the first pass: the rows it left to the exact path
 * (a->exact_clusters > 0). */
cudaError_t dpsLaunchSampleExact(const dpsSampleArgs* a, cudaStream_t stream);
/* Clusters of the exact kernel resident at once on the current device (0:
 * clusters unavailable: the first pass draws its exact rows itself). */
cudaError_t dpsSampleExactClusters(int* clusters);
cudaError_t dpsPreloadSampleKernels(void);

#ifdef __cplusplus
}
#endif

#endif /* DPS_SAMPLE_KERNELS_H_ */
