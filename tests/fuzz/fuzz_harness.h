/* The harness of fuzz_api (fuzz_harness.c): the input decoding, the model's
 * failure reasons and their checks, the model of dpsConfigCheck, the recording
 * fake backend and the model of the communicator. The scenarios (fuzz_api.c)
 * drive the public API with them; fuzz_api.c's head describes the input format
 * and what makes the fuzzer abort. */
#ifndef DPS_FUZZ_HARNESS_H_
#define DPS_FUZZ_HARNESS_H_

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* ---- assertions ------------------------------------------------------------ */
#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);            \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fprintf(stderr, "\n  dpsGetLastError() = \"%s\"\n", dpsGetLastError());            \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

/* ---- input decoding ---------------------------------------------------------- */
typedef struct {
  const uint8_t* p;
  size_t n;
} Rd;

static inline uint8_t u8(Rd* r) {
  if (r->n == 0) return 0;
  r->n--;
  return *r->p++;
}
static inline uint16_t u16(Rd* r) { return (uint16_t)(u8(r) | (unsigned)u8(r) << 8); }
static inline uint32_t u32(Rd* r) { return (uint32_t)u16(r) | (uint32_t)u16(r) << 16; }
static inline uint64_t u64(Rd* r) { return (uint64_t)u32(r) | (uint64_t)u32(r) << 32; }

/* Arithmetic of the harness itself must not overflow (UBSan would blame it). */
static inline int addClampInt(int64_t a, int64_t b) {
  int64_t v = a + b; /* |a| <= INT_MAX, |b| small */
  return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : (int)v;
}
static inline int64_t addSat64(int64_t a, int64_t b) {
  int64_t v;
  if (__builtin_add_overflow(a, b, &v)) return b > 0 ? INT64_MAX : INT64_MIN;
  return v;
}

/* fInt / fI64: a value, a table entry (boundary values) or raw bits (format:
 * fuzz_api.c's head). */
int fInt(Rd* r);
int64_t fI64(Rd* r);
/* Reads a string as described in fuzz_api.c's head; returns NULL for "unset".
 * The result lives in buf (NUL-terminated; bytes after an inner NUL are
 * ignored, as they would be by setenv). */
const char* fString(Rd* r, char* buf, size_t cap, int null_if_unset);

/* ---- failure reasons ------------------------------------------------------------ */
/* The model lists every reason a call must fail for, each with the status and
 * a substring its message must contain. The library may report any one of
 * them (its check order is not part of the contract). */
typedef struct {
  dpsResult_t code;
  char what[96];
} Reason;
typedef struct {
  int n;
  Reason r[16];
} Reasons;

void addReason(Reasons* rs, dpsResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* dpsGetLastError(), checked to be a terminated string within its buffer. */
const char* lastError(void);
/* DPS_FUZZ_TRACE=1 prints every checked call (to see what a seed does). */
void trace(const char* call, dpsResult_t got);
/* Checks a call's status against the reasons. Returns 1 if the call was
 * expected to fail (and did, for one of the reasons). */
int expectOutcome(const char* call, dpsResult_t got, const Reasons* rs);
/* An operation call whose checks all pass reaches the (fake) backend, which
 * may inject `want`: that failure must come back unchanged. Otherwise the
 * checks decide (expectOutcome). Returns 1 on the injected-failure path. */
int expectOpOutcome(const char* call, dpsResult_t got, dpsResult_t want, const Reasons* rs);

/* ---- model of dpsConfigCheck -------------------------------------------------- */
int validDtype(int d);
int validOpDtype(int d);
int validBackend(int b);
void configReasons(const dpsConfig_t* c, Reasons* rs);
/* Config decoding: mostly configurations that pass (so that the operations
 * get exercised), with boundary values mixed in. */
dpsConfig_t decodeConfig(Rd* r);

/* ---- the recording fake backend --------------------------------------------- */
extern char swap_buf[64], p_buf[64], ai_buf[64], al_buf[64], lp_buf[64];

typedef struct {
  dpsComm_t comm;        /* the communicator the operations are called on */
  int init, prepare, swap, gather, logprobs, destroy;
  dpsResult_t fail_init, fail_prepare, fail_op; /* injected failures (one call) */
  dpsResult_t async;                            /* latched asynchronous error */
  /* the call in flight, as its caller passed it */
  const void* in;
  const void *p, *ai, *al;
  cudaStream_t stream;
  int64_t rows, cols, reqs, n;
  int pad_bs;
  dpsDataType_t dtype;
} Recorder;
extern Recorder rec;

extern const dpsBackendOps kFake;
/* async_error may be NULL (internal.h): such a backend never reports one. */
extern const dpsBackendOps kFakeNoAsync;
/* Collectives installed by dpsCommSetCollectives: never called on a host-only
 * communicator whose backend is the fake. */
dpsResult_t neverAllGather(void* ctx, const void* s, void* r, size_t b, cudaStream_t st);
dpsResult_t neverAllToAll(void* ctx, const void* s, void* r, size_t b, cudaStream_t st);
/* Status codes a fake backend may fail with: disjoint from the argument
 * errors so that the model can tell who answered. */
dpsResult_t fault(uint8_t b);

/* ---- model of the communicator ----------------------------------------------- */
typedef struct {
  int live;              /* comm exists */
  int has_async;         /* its backend has an async_error op */
  dpsConfig_t cfg;
  dpsBackend_t backend;
  dpsDataType_t dtype;   /* fixed dtype or unset */
  int initialized;
  dpsCollectives_t coll;
} Model;

/* The fake backend's call counts, and the check that a call moved them by
 * exactly the given deltas (init and destroy never move). */
typedef struct {
  int init, prepare, swap, gather, logprobs, destroy;
} Counts;
Counts counts(void);
void expectDeltas(const char* call, Counts before, int prepare, int swap, int gather,
                  int logprobs);

extern _Alignas(16) char dummy_in[64]; /* never read: the fake backend moves no data */
#define SENTINEL ((void*)&dummy_in[7])
#define DUMMY_STREAM ((cudaStream_t)(uintptr_t)0x5170)

/* dummy_in, or NULL when bit `bit` of bits is set. */
static inline const void* fPtr(uint8_t bits, int bit) {
  return (bits >> bit) & 1 ? NULL : (const void*)dummy_in;
}

/* Adds the reasons shared by the operations: async error (the library checks
 * it once the arguments pass; with bad arguments either may be reported). */
void healthReason(const Model* m, Reasons* rs);
void padReasons(const Model* m, const char* op, int pad_bs, Reasons* rs);
/* The reasons both verify gathers share: pad_bs, the [reqs, n] shape of
 * `what` ("" or "logprobs "), the async error. */
void verifyReasons(const Model* m, const char* op, const char* what, int pad_bs, int64_t reqs,
                   int64_t n, Reasons* rs);

/* What an operation call must do, from the reasons found: its status, the
 * model after it, and whether prepare (fixing fix_dtype) and the backend op
 * run. `before` is the count snapshot the deltas are checked against. */
typedef struct {
  Counts before;
  Model after;
  dpsResult_t want;
  int prepare, ops;
} OpExpect;
OpExpect expectOp(const Model* m, const Reasons* rs, dpsDataType_t fix_dtype);

#endif /* DPS_FUZZ_HARNESS_H_ */
