/* dpsVerifyChain's chain walk: what the kernels that finish a call's tokens
 * need to walk every request's chain themselves (kernels/verify_walk.cuh;
 * host: core/sample.c). At tp == 1 the pass that writes the tokens walks in
 * its last block (dpsSample's first pass, or argmax's pass for token-only
 * greedy calls); at tp > 1 a one-block kernel after the last merge does. */
#ifndef DPS_VERIFY_WALK_H_
#define DPS_VERIFY_WALK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which argument an invalid entry is in (dpsSampleCounters.bad_arg). */
enum { DPS_SAMPLE_ARG_TEMPERATURE = 1, DPS_SAMPLE_ARG_TOP_K = 2, DPS_SAMPLE_ARG_TOP_P = 3,
       DPS_SAMPLE_ARG_MIN_P = 4, DPS_SAMPLE_ARG_CANDIDATE = 5 /* bad_bits: the int32 */ };

/* Device counters of the drawing calls (dpsCommGetSampleStats), and the
 * first invalid entry. */
typedef struct dpsSampleCounters {
  unsigned long long rows_greedy, rows_fast, rows_exact, invalid_calls;
  unsigned long long bad_seen; /* 1 once bad_* hold an entry the host has not read */
  long long bad_row;
  int bad_arg; /* DPS_SAMPLE_ARG_* */
  uint32_t bad_bits; /* the value's bits (float) */
} dpsSampleCounters;

/* The walk of one call; pad_bs == 0: none. Request b's chain accepts draft
 * i while it equals the token of position i - 1 (docs/sampling.md). */
typedef struct {
  const int32_t* candidates; /* [pad_bs, n], each in [0, vocab) */
  int pad_bs, n;
  long long vocab;
  const int64_t* tokens;     /* [pad_bs * n]: the rows' tokens */
  const float* token_lps;    /* [pad_bs * n]: their logprobs (NULL: none) */
  int32_t* predict;          /* [pad_bs, n] */
  int32_t* accept_index;     /* [pad_bs, n] */
  int32_t* accept_length;    /* [pad_bs] */
  float* logprobs;           /* [pad_bs, n], NULL: not wanted */
  unsigned int* arrivals;    /* the finishing pass's count of done blocks or rows (0 between calls) */
  dpsSampleCounters* counters; /* an invalid candidate is recorded here */
} dpsVerifyWalkArgs;

#ifdef __cplusplus
}
#endif

#endif /* DPS_VERIFY_WALK_H_ */
