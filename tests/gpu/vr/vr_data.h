/* The host data and references of the scenarios sample, verify and mixed of
 * test_gpu_virtual_ranks (vr_sample.c, vr_verify.c, vr_mixed.c): made once
 * per dtype by the first scenario that asks (on the main thread, before its
 * rank threads start), then shared read-only. Include after defining
 * _POSIX_C_SOURCE. */
#ifndef DPS_VR_DATA_H_
#define DPS_VR_DATA_H_

#include <stdint.h>

#include "vr_harness.h"
#include "../sample_common.h"
#include "../verify_common.h"

/* index 0, 1, 2 of the per-dtype data */
extern const dpsDataType_t kVrDtypes[3];

/* ---- sample (vr_sample.c) ----------------------------------------------------------- */
#define SMP_VR_ROWS 48
#define SMP_VR_V (840 * 40) /* a multiple of every tp in 1..8 */

enum { SET_A, SET_B, SET_S, SET_G, NSETS };

/* Full logits [SMP_VR_ROWS, SMP_VR_V] (sample_common.h's mixed rows) with two
 * sets of per-row parameters (A, B: the same logits) and one of scalars (S:
 * T 0.8, top-k 300, top-p 0.95, the exact path), and every set's reference
 * tokens and logprobs (fxRefSampleToken). */
typedef struct {
  int ready, failed;
  smpHost h[2];        /* A and B: the same logits, different parameters */
  smpSpec spec[NSETS]; /* A, B: arrays; S: scalars; G: greedy, tokens only */
  int64_t rtok[NSETS][SMP_VR_ROWS];
  float rlp[NSETS][SMP_VR_ROWS];
  unsigned char clear[NSETS][SMP_VR_ROWS]; /* S: rows whose token is clear of top-p's boundary */
  int have_base, base_failed;
  int64_t btok[NSETS][SMP_VR_ROWS]; /* the tp = 1 result (scenario sample) */
  float blp[NSETS][SMP_VR_ROWS];
} SmpData;

/* dtype kVrDtypes[di]'s data, made at the first call; NULL if that failed. */
SmpData* vrSampleData(int di);

/* ---- verify (vr_verify.c) ----------------------------------------------------------- */
#define VFY_VR_REQS 12
#define VFY_VR_N 4
#define VFY_VR_ROWS (VFY_VR_REQS * VFY_VR_N)
#define VFY_VR_V (840 * 40)
#define VFY_VR_WORDS ((VFY_VR_V + 31) / 32)
#define VFY_VR_CAP 6.0f

/* Full logits [VFY_VR_ROWS, VFY_VR_V], per-request parameters (request b
 * takes row b*N's), a grammar mask and the soft-cap VFY_VR_CAP, and the host
 * reference of the masked, soft-capped verify (fxRefVerifyRows, top-p off):
 * every row's token and logprob (rt, rlp_all), and the outputs for the
 * candidates mcand. */
typedef struct {
  int ready, failed;
  smpHost h;
  ReqHost rq, rqm; /* rqm: the masked calls' (no top-p) */
  fxSampleParams fp[VFY_VR_REQS];
  uint32_t mask[VFY_VR_ROWS * VFY_VR_WORDS];
  int64_t rt[VFY_VR_ROWS];     /* masked: every row's reference token */
  float rlp_all[VFY_VR_ROWS];  /* and its logprob */
  int32_t mcand[VFY_VR_ROWS];  /* masked: candidates from rt (makeCandidates) */
  int32_t rpr[VFY_VR_ROWS], rai[VFY_VR_ROWS], ral[VFY_VR_REQS];
  float rlp[VFY_VR_ROWS];
  int have_base; /* the first group's masked outputs (scenario verify) */
  int32_t bpr[VFY_VR_ROWS], bai[VFY_VR_ROWS], bal[VFY_VR_REQS];
  float blp[VFY_VR_ROWS];
} VfyData;

/* dtype kVrDtypes[di]'s data, made at the first call; NULL if that failed. */
VfyData* vrVerifyData(int di);

#endif /* DPS_VR_DATA_H_ */
