/* Layout math shared by the core, the backends, the kernels, the host
 * reference used by tests and dps-perf. Plain C, also compiled by nvcc. */
#ifndef DPS_LAYOUT_H_
#define DPS_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DPS_HD __host__ __device__ __forceinline__
#else
#define DPS_HD static inline
#endif

/* Shape of one call, built once by the core after its checks and passed to
 * the backend, which derives nothing itself. Counts are in elements. */
typedef struct {
  int tp, rank;
  int pad_bs;        /* padded batch of this call */
  int n;             /* tokens per request */
  int64_t vocab;     /* V */
  int64_t v_local;   /* V / tp */
  int reqs;          /* pad_bs / tp: requests owned per rank */
  size_t esize;      /* logits element size in bytes (4 for the verify gathers) */
  int64_t rows;      /* pad_bs * n: rows of the swap input */
  int64_t rows_per_rank; /* reqs * n: rows one rank owns (swap output, verify [reqs, n]) */
  int64_t packed;    /* reqs * (2n + 1): a rank's packed verify outputs (int32) */
} dpsShape;

DPS_HD dpsShape dpsMakeShape(int tp, int rank, int pad_bs, int n, int64_t vocab, size_t esize) {
  dpsShape s;
  s.tp = tp;
  s.rank = rank;
  s.pad_bs = pad_bs;
  s.n = n;
  s.vocab = vocab;
  s.v_local = vocab / tp;
  s.reqs = pad_bs / tp;
  s.esize = esize;
  s.rows = (int64_t)pad_bs * n;
  s.rows_per_rank = (int64_t)s.reqs * n;
  s.packed = (int64_t)s.reqs * (2 * (int64_t)n + 1);
  return s;
}

/* swap input: [pad_bs*n, v_local] on every rank. Rows destined to rank d are
 * the contiguous block [d*rows_per_rank, (d+1)*rows_per_rank). swap output:
 * [rows_per_rank, vocab]; element (row, src*v_local + c) comes from rank
 * src's input element (dst_rank*rows_per_rank + row, c). Byte size of the
 * chunk one rank sends to one peer in the swap: */
DPS_HD size_t dpsSwapChunkBytes(dpsShape s) {
  return (size_t)s.rows_per_rank * (size_t)s.v_local * s.esize;
}

/* Verify outputs packed per rank as int32 (s.packed): predict [reqs*n],
 * accept_index [reqs*n], accept_length [reqs]. */

/* x rounded up to a multiple of a (a > 0): the one round-up of the tree. */
DPS_HD size_t dpsRoundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The persistent verify outputs, one device allocation per communicator
 * (every backend's): predict | accept_index | logprobs, [max_pad_bs*N] each,
 * then accept_length [max_pad_bs], each segment 256-byte aligned. The
 * config checks keep max_pad_bs*N below 2^31 and max_pad_bs*N*V*8 in 63
 * bits, so nothing overflows. */
typedef struct {
  size_t seg;   /* bytes of a [max_pad_bs*N] segment */
  size_t segl;  /* bytes of the accept_length segment */
  size_t bytes; /* the allocation */
} dpsVerifyOutLayout;

DPS_HD dpsVerifyOutLayout dpsVerifyOutputsLayout(int64_t max_pad_bs, int64_t n) {
  dpsVerifyOutLayout o;
  o.seg = dpsRoundUp((size_t)max_pad_bs * (size_t)n * 4u, 256);
  o.segl = dpsRoundUp((size_t)max_pad_bs * 4u, 256);
  o.bytes = 3u * o.seg + o.segl;
  return o;
}

/* The verify outputs' pointers inside their allocation `base` (the one
 * place they are carved). */
typedef struct {
  int32_t* predict;       /* [max_pad_bs, N] */
  int32_t* accept_index;  /* [max_pad_bs, N] */
  int32_t* accept_length; /* [max_pad_bs]    */
  float* logprobs;        /* [max_pad_bs, N] */
} dpsVerifyOutputs;

DPS_HD dpsVerifyOutputs dpsVerifyOutputsAt(void* base, int64_t max_pad_bs, int64_t n) {
  const dpsVerifyOutLayout o = dpsVerifyOutputsLayout(max_pad_bs, n);
  char* b = (char*)base;
  dpsVerifyOutputs v;
  v.predict = (int32_t*)b;
  v.accept_index = (int32_t*)(b + o.seg);
  v.logprobs = (float*)(b + 2 * o.seg);
  v.accept_length = (int32_t*)(b + 3 * o.seg);
  return v;
}

/* Overflow-checked product of non-negative sizes; returns 0 on overflow. */
DPS_HD int dpsMulOk(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

#endif /* DPS_LAYOUT_H_ */
