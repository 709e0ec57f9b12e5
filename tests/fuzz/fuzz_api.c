/* libFuzzer target over the host-side validation of the public C API.
 *
 * Each input is decoded (see "Input format" below) into:
 *   - values for DPSAMPLING_BACKEND / TOKENSPEED_DP_SAMPLING_BACKEND (unset,
 *     empty, a backend name or arbitrary bytes) in the environment, and a call
 *     of dpsResolveBackend with a fuzzed requested value and availability;
 *   - dpsParseBackend on a fuzzed string;
 *   - a dpsConfig_t (bad size/magic, negative, zero, INT_MIN/INT_MAX, vocab
 *     near INT64_MAX, max_pad_bs*N*V*8 just below / just above INT64_MAX ...)
 *     checked by dpsConfigCheck (and by dpsCommInitRank / dpsCommInitFromNccl
 *     only when they must fail before touching CUDA or NCCL);
 *   - a host-only communicator (dpsTestCommCreateHost, no GPU, no NCCL) whose
 *     backend ops only record what reaches them, then a sequence of calls of
 *     every operation with fuzzed pointers (NULL or a dummy), shapes, pad_bs,
 *     dtypes, injected backend failures and an asynchronous error.
 *
 * Every call is compared with an independent model of the documented rules
 * (include/dpsampling.h). The fuzzer aborts (libFuzzer reports a crash) when:
 *   - a call fails although the model finds nothing wrong, or succeeds
 *     although the model finds a reason to fail;
 *   - a failure's status is not the one of a reason the model found, or its
 *     dpsGetLastError() message is empty or does not name that reason's
 *     argument (and value, where the message is documented to carry it);
 *   - a failed call wrote an output out-parameter (all start as sentinels);
 *   - a backend op was reached by a call that failed its checks, was reached
 *     more or less than once by a call that passed them, or saw a pad_bs or a
 *     shape breaking the rules (1 <= pad_bs <= max_pad_bs, pad_bs % tp == 0,
 *     rows == pad_bs*N, cols == V/tp, reqs == pad_bs/tp, n == N);
 *   - a successful call returned anything but the persistent buffers, or
 *     dpsCommGetInfo disagrees with the configuration and the dtype state;
 *   - ASan/UBSan find a memory error or undefined behaviour, LSan a leak.
 *
 * Not covered here: creation and operations on a real (GPU, NCCL)
 * communicator, which need GPUs and NCCL (tests/gpu); DPSAMPLING_DEBUG
 * logging (it would print every error of every run); a backend whose
 * async_error stops reporting an error it reported once (the fake latches it,
 * as the onesided backend's host-mapped error word does).
 *
 * Input format (bytes, read in order; a read past the end yields 0):
 *   env(DPSAMPLING_BACKEND), env(TOKENSPEED_DP_SAMPLING_BACKEND)
 *       env = m: m%8 in {0,6} unset, 1 "", 2 "auto", 3 "nccl", 4 "onesided",
 *       {5,7} string: length u8 (u16%2048 if m&0x80), then the bytes
 *   requested u8 (>= 0xf0: then fInt), available u8 (%3 == 2: then fInt),
 *   resolve flags u8, parse string (as env; unset -> NULL), parse flags u8,
 *   fInt (any enum value for the name functions),
 *   config (decodeConfig), bootstrap flags u8 (bit 5: then fInt),
 *   creation flags u8, init fault u8, prepare fault u8,
 *   then operations until the input ends: opcode u8, operation arguments.
 *   fInt = m: m&3 == 0 -> m>>2, 1 -> table[(m>>2) % n], 2 -> then raw u32, 3 -> -(m>>2).
 * tests/fuzz/gen_corpus.py writes the seed corpus in this format. */
#define _XOPEN_SOURCE 700 /* putenv */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testsupport.h"

/* ---- assertions ------------------------------------------------------------ */
#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "fuzz_api.c:%d: CHECK(%s) failed: ", __LINE__, #cond);              \
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

static uint8_t u8(Rd* r) {
  if (r->n == 0) return 0;
  r->n--;
  return *r->p++;
}
static uint16_t u16(Rd* r) { return (uint16_t)(u8(r) | (unsigned)u8(r) << 8); }
static uint32_t u32(Rd* r) { return (uint32_t)u16(r) | (uint32_t)u16(r) << 16; }
static uint64_t u64(Rd* r) { return (uint64_t)u32(r) | (uint64_t)u32(r) << 32; }

/* Arithmetic of the harness itself must not overflow (UBSan would blame it). */
static int addClampInt(int64_t a, int64_t b) {
  int64_t v = a + b; /* |a| <= INT_MAX, |b| small */
  return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : (int)v;
}
static int64_t addSat64(int64_t a, int64_t b) {
  int64_t v;
  if (__builtin_add_overflow(a, b, &v)) return b > 0 ? INT64_MAX : INT64_MIN;
  return v;
}

static int fInt(Rd* r) {
  static const int table[] = {0,       1,           -1,      2,          3,       4,
                              7,       8,           64,      1000,       INT_MAX, INT_MIN,
                              INT_MAX - 1, INT_MIN + 1, 1 << 30, (1 << 30) + 1, 65536, -2,
                              86400000, 86400001}; /* the timeout's limit and one past */
  uint8_t m = u8(r);
  switch (m & 3) {
    case 0: return m >> 2;
    case 1: return table[(m >> 2) % (sizeof table / sizeof table[0])];
    case 2: return (int)u32(r);
    default: return -(int)(m >> 2);
  }
}

static int64_t fI64(Rd* r) {
  static const int64_t table[] = {0,
                                  1,
                                  -1,
                                  INT64_MAX,
                                  INT64_MIN,
                                  INT64_MAX - 1,
                                  INT64_MAX / 2,
                                  INT64_MAX / 8,
                                  INT64_MAX / 8 + 1,
                                  (int64_t)1 << 62,
                                  (int64_t)1 << 32,
                                  (int64_t)UINT32_MAX, /* the largest vocab_size */
                                  (int64_t)1 << 31,
                                  INT32_MAX,
                                  (int64_t)INT32_MAX + 1,
                                  152064,
                                  -152064};
  uint8_t m = u8(r);
  switch (m & 3) {
    case 0: return m >> 2;
    case 1: return table[(m >> 2) % (sizeof table / sizeof table[0])];
    case 2: return (int64_t)u64(r);
    default: return -(int64_t)(m >> 2);
  }
}

/* Reads a string as described in the header; returns NULL for "unset". The
 * result lives in buf (NUL-terminated; bytes after an inner NUL are ignored,
 * as they would be by setenv). */
static const char* fString(Rd* r, char* buf, size_t cap, int null_if_unset) {
  uint8_t m = u8(r);
  switch (m % 8) {
    case 0:
    case 6: return null_if_unset ? NULL : strcpy(buf, "");
    case 1: return strcpy(buf, "");
    case 2: return strcpy(buf, "auto");
    case 3: return strcpy(buf, "nccl");
    case 4: return strcpy(buf, "onesided");
    default: {
      size_t len = (m & 0x80) ? u16(r) % 2048u : u8(r);
      if (len > cap - 1) len = cap - 1;
      for (size_t i = 0; i < len; ++i) buf[i] = (char)u8(r);
      buf[len] = '\0';
      return buf;
    }
  }
}

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

static void addReason(Reasons* rs, dpsResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void addReason(Reasons* rs, dpsResult_t code, const char* fmt, ...) {
  CHECK(rs->n < 16, "too many reasons");
  Reason* x = &rs->r[rs->n++];
  x->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->what, sizeof x->what, fmt, ap);
  va_end(ap);
}

static const char* lastError(void) {
  const char* m = dpsGetLastError();
  CHECK(m != NULL, "dpsGetLastError() returned NULL");
  size_t len = strnlen(m, 4096);
  CHECK(len < 1024, "message not terminated within its 1024-byte buffer");
  return m;
}

/* DPS_FUZZ_TRACE=1 prints every checked call (to see what a seed does). */
static void trace(const char* call, dpsResult_t got) {
  static int on = -1;
  if (on < 0) on = getenv("DPS_FUZZ_TRACE") != NULL;
  if (on) fprintf(stderr, "  %-30s %-20s %s\n", call, dpsGetErrorString(got), dpsGetLastError());
}

/* Checks a call's status against the reasons. Returns 1 if the call was
 * expected to fail (and did, for one of the reasons). */
static int expectOutcome(const char* call, dpsResult_t got, const Reasons* rs) {
  const char* msg = lastError();
  trace(call, got);
  if (rs->n == 0) {
    CHECK(got == dpsSuccess, "%s failed (%s: %s) but the model finds nothing wrong", call,
          dpsGetErrorString(got), msg);
    return 0;
  }
  CHECK(got != dpsSuccess, "%s succeeded but must fail: %s (%s)", call,
        dpsGetErrorString(rs->r[0].code), rs->r[0].what);
  CHECK(got > dpsSuccess && got < dpsNumResults, "%s returned %d, not a dpsResult_t", call,
        (int)got);
  CHECK(msg[0] != '\0', "%s failed with %s and an empty message", call, dpsGetErrorString(got));
  const int truncated = strlen(msg) == 1023;
  for (int i = 0; i < rs->n; ++i)
    if (rs->r[i].code == got && (truncated || strstr(msg, rs->r[i].what) != NULL)) return 1;
  fprintf(stderr, "%s -> %s \"%s\"; expected one of:\n", call, dpsGetErrorString(got), msg);
  for (int i = 0; i < rs->n; ++i)
    fprintf(stderr, "  %s \"...%s...\"\n", dpsGetErrorString(rs->r[i].code), rs->r[i].what);
  abort();
}

/* An operation call whose checks all pass reaches the (fake) backend, which
 * may inject `want`: that failure must come back unchanged. Otherwise the
 * checks decide (expectOutcome). Returns 1 on the injected-failure path. */
static int expectOpOutcome(const char* call, dpsResult_t got, dpsResult_t want,
                           const Reasons* rs) {
  if (rs->n != 0 || want == dpsSuccess) {
    (void)expectOutcome(call, got, rs);
    return 0;
  }
  char what[64];
  snprintf(what, sizeof what, "%s (fault)", call);
  trace(what, got);
  CHECK(got == want, "%s: backend failure %s came back as %s", call, dpsGetErrorString(want),
        dpsGetErrorString(got));
  return 1;
}

/* ---- model of dpsConfigCheck -------------------------------------------------- */
static int validDtype(int d) { return d >= dpsDtypeUnset && d <= dpsFloat16; }
static int validOpDtype(int d) { return d >= dpsFloat32 && d <= dpsFloat16; }
static int validBackend(int b) { return b >= dpsBackendAuto && b <= dpsBackendOnesided; }

static void configReasons(const dpsConfig_t* c, Reasons* rs) {
  if (c == NULL) {
    addReason(rs, dpsInvalidArgument, "config");
    return;
  }
  const dpsResult_t IA = dpsInvalidArgument;
  if (c->size != sizeof(dpsConfig_t)) addReason(rs, IA, "size=%zu", c->size);
  if (c->magic != DPS_CONFIG_MAGIC) addReason(rs, IA, "magic=0x%x", c->magic);
  if (rs->n) return; /* an uninitialized config: the other fields mean nothing */
  const int tp = c->tp_size;
  if (tp < 1) addReason(rs, IA, "tp_size=%d", tp);
  if (c->rank < 0 || (tp >= 1 && c->rank >= tp)) addReason(rs, IA, "rank=%d", c->rank);
  if (c->max_pad_bs < 1 || (tp >= 1 && c->max_pad_bs % tp != 0))
    addReason(rs, IA, "max_pad_bs=%d", c->max_pad_bs);
  if (c->num_tokens_per_req < 1) addReason(rs, IA, "num_tokens_per_req=%d", c->num_tokens_per_req);
  if (c->vocab_size < 1 || (tp >= 1 && c->vocab_size % tp != 0))
    addReason(rs, IA, "vocab_size=%" PRId64, c->vocab_size);
  if (c->vocab_size > (int64_t)UINT32_MAX) /* global indices travel as 32 bits */
    addReason(rs, IA, "vocab_size=%" PRId64, c->vocab_size);
  if (!validDtype((int)c->logits_dtype)) addReason(rs, IA, "logits_dtype=%d", (int)c->logits_dtype);
  if (!validBackend((int)c->backend)) addReason(rs, IA, "backend=%d", (int)c->backend);
  if (c->cuda_device < -1) addReason(rs, IA, "cuda_device=%d", c->cuda_device);
  if (c->timeout_ms < 0 || c->timeout_ms > 86400000) /* one day, as DPSAMPLING_TIMEOUT_MS */
    addReason(rs, IA, "timeout_ms=%d", c->timeout_ms);
  if (c->max_pad_bs >= 1 && c->num_tokens_per_req >= 1 && c->vocab_size >= 1) {
    /* Largest buffer: [max_pad_bs*N, V] at 8 bytes must fit in a signed 64-bit count. */
    unsigned __int128 bytes = (unsigned __int128)(uint64_t)c->max_pad_bs *
                              (uint64_t)c->num_tokens_per_req * (uint64_t)c->vocab_size * 8u;
    if (bytes > (unsigned __int128)INT64_MAX)
      addReason(rs, IA, "vocab_size=%" PRId64, c->vocab_size);
  }
}

/* Config decoding: mostly configurations that pass (so that the operations
 * get exercised), with boundary values mixed in. */
static dpsConfig_t decodeConfig(Rd* r) {
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  const uint8_t f = u8(r);
  switch (f & 7) {
    case 0: {
      static const size_t sizes[] = {0, sizeof(dpsConfig_t) - 1, sizeof(dpsConfig_t) + 1,
                                     sizeof(dpsConfig_t) - 4, SIZE_MAX, 1};
      c.size = sizes[u8(r) % 6];
      break;
    }
    case 1: c.magic = u32(r); break;
    case 2: c.size = (size_t)u64(r), c.magic = u32(r); break;
    default: break;
  }
  if (f & 8) { /* raw fields */
    c.tp_size = fInt(r);
    c.rank = fInt(r);
    c.max_pad_bs = fInt(r);
    c.num_tokens_per_req = fInt(r);
    c.vocab_size = fI64(r);
    c.logits_dtype = (dpsDataType_t)fInt(r);
    c.backend = (dpsBackend_t)fInt(r);
    c.cuda_device = fInt(r);
    c.timeout_ms = fInt(r);
    return c;
  }
  /* consistent fields, with absurd sizes */
  uint8_t b = u8(r);
  int64_t tp = 1 + b % 8;
  if (b & 0x80) tp = 1 + (int64_t)(u32(r) % (uint32_t)INT_MAX); /* up to INT_MAX */
  c.tp_size = (int)tp;
  c.rank = (int)(u32(r) % (uint32_t)tp);
  b = u8(r);
  int64_t mpb = tp * (1 + b % 16);
  if (b & 0x80) mpb = tp * (1 + (int64_t)(u32(r) % (uint32_t)INT_MAX));
  if (mpb > INT_MAX) mpb = tp * (INT_MAX / tp);
  c.max_pad_bs = (int)mpb;
  b = u8(r);
  c.num_tokens_per_req = 1 + b % 8;
  if (b & 0x80) c.num_tokens_per_req = 1 + (int)(u32(r) % (uint32_t)INT_MAX);
  b = u8(r);
  const int64_t vmax = INT64_MAX - INT64_MAX % tp; /* largest multiple of tp */
  switch (b % 8) {
    case 5: c.vocab_size = vmax - tp * (int64_t)u8(r); break; /* near INT64_MAX */
    case 6:
    case 7: { /* max_pad_bs*N*V*8 just below (6) or just above (7) INT64_MAX */
      unsigned __int128 per = (unsigned __int128)(uint64_t)c.max_pad_bs *
                              (uint64_t)c.num_tokens_per_req * 8u;
      uint64_t lim = per > INT64_MAX ? 0 : (uint64_t)(INT64_MAX / (uint64_t)per);
      uint64_t v = lim - lim % (uint64_t)tp; /* largest valid multiple of tp (maybe 0) */
      if (b % 8 == 7) v += (uint64_t)tp;
      c.vocab_size = v > (uint64_t)vmax ? vmax : (int64_t)v;
      break;
    }
    default: c.vocab_size = tp * (1 + (int64_t)u16(r)); break;
  }
  b = u8(r);
  c.logits_dtype = (dpsDataType_t)((int)(b % 4) - 1);
  c.backend = (dpsBackend_t)((b >> 2) % 3);
  c.cuda_device = (int)((b >> 4) % 4) - 1;
  c.timeout_ms = (b & 0x40) ? 100 * (b >> 7) : 0;
  b = u8(r);
  if (b >= 0xe0) { /* overwrite one field with a boundary value */
    int v = fInt(r);
    switch (b % 11) {
      case 0: c.tp_size = v; break;
      case 1: c.rank = v; break;
      case 2: c.max_pad_bs = v; break;
      case 3: c.num_tokens_per_req = v; break;
      case 4: c.vocab_size = fI64(r); break;
      case 5: c.logits_dtype = (dpsDataType_t)v; break;
      case 6: c.backend = (dpsBackend_t)v; break;
      case 7: c.cuda_device = v; break;
      case 8: c.timeout_ms = v; break;
      case 9: c.size = (size_t)v; break;
      default: c.magic = (unsigned)v; break;
    }
  }
  return c;
}

/* ---- the recording fake backend --------------------------------------------- */
static char swap_buf[64], p_buf[64], ai_buf[64], al_buf[64], lp_buf[64];

static struct {
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
} rec;

static void checkPadBsRules(dpsComm_t c, int pad_bs) {
  CHECK(c == rec.comm, "backend got comm %p, operation was called on %p", (void*)c,
        (void*)rec.comm);
  CHECK(pad_bs == rec.pad_bs, "backend got pad_bs=%d, caller passed %d", pad_bs, rec.pad_bs);
  const dpsConfig_t* k = &c->config;
  CHECK(pad_bs >= 1 && pad_bs <= k->max_pad_bs && pad_bs % k->tp_size == 0,
        "backend reached with pad_bs=%d (tp=%d max_pad_bs=%d)", pad_bs, k->tp_size, k->max_pad_bs);
}

static dpsResult_t fInit(dpsComm_t c) {
  rec.init++;
  c->vout.predict = (int32_t*)p_buf;
  c->vout.accept_index = (int32_t*)ai_buf;
  c->vout.accept_length = (int32_t*)al_buf;
  c->vout.logprobs = (float*)lp_buf;
  dpsResult_t f = rec.fail_init;
  rec.fail_init = dpsSuccess;
  return f == dpsSuccess ? f : dpsSetError(f, "fake init failure");
}
static dpsResult_t fPrepare(dpsComm_t c) {
  rec.prepare++;
  CHECK(validOpDtype((int)c->dtype), "prepare with comm->dtype=%d", (int)c->dtype);
  dpsResult_t f = rec.fail_prepare;
  rec.fail_prepare = dpsSuccess;
  if (f != dpsSuccess) return dpsSetError(f, "fake prepare failure");
  c->swap_out = swap_buf;
  return dpsSuccess;
}
static dpsResult_t opResult(void) {
  dpsResult_t f = rec.fail_op;
  rec.fail_op = dpsSuccess;
  return f == dpsSuccess ? f : dpsSetError(f, "fake operation failure");
}
/* The core's shape: derived from pad_bs and the config, exactly. */
static void checkShape(dpsComm_t c, const dpsShape* sh, size_t esize) {
  const dpsShape w = dpsMakeShape(c->config.tp_size, c->config.rank, sh->pad_bs,
                                  c->config.num_tokens_per_req, c->config.vocab_size, esize);
  CHECK(sh->tp == w.tp && sh->rank == w.rank && sh->n == w.n && sh->vocab == w.vocab &&
            sh->v_local == w.v_local && sh->reqs == w.reqs && sh->esize == w.esize &&
            sh->rows == w.rows && sh->rows_per_rank == w.rows_per_rank && sh->packed == w.packed,
        "the backend got a shape the config does not give (pad_bs=%d)", sh->pad_bs);
}

static dpsResult_t fSwap(dpsComm_t c, const dpsShape* sh, const void* in, cudaStream_t s) {
  const int pad_bs = sh->pad_bs;
  checkShape(c, sh, dpsDataTypeSize(c->dtype));
  rec.swap++;
  checkPadBsRules(c, pad_bs);
  CHECK(in == rec.in && in != NULL && s == rec.stream, "swap got other pointers/stream");
  CHECK(c->dtype == rec.dtype, "swap with comm dtype %d, caller's %d", (int)c->dtype,
        (int)rec.dtype);
  CHECK(c->swap_out != NULL && c->initialized, "swap before prepare");
  CHECK(rec.rows == (int64_t)pad_bs * c->config.num_tokens_per_req &&
            rec.cols == c->config.vocab_size / c->config.tp_size,
        "swap reached with local_logits [%" PRId64 ", %" PRId64 "], pad_bs=%d N=%d V=%" PRId64
        " tp=%d",
        rec.rows, rec.cols, pad_bs, c->config.num_tokens_per_req, c->config.vocab_size,
        c->config.tp_size);
  return opResult();
}
static void checkVerifyShape(dpsComm_t c, int pad_bs) {
  CHECK(rec.reqs == pad_bs / c->config.tp_size && rec.n == c->config.num_tokens_per_req,
        "gather reached with [%" PRId64 ", %" PRId64 "], pad_bs=%d tp=%d N=%d", rec.reqs, rec.n,
        pad_bs, c->config.tp_size, c->config.num_tokens_per_req);
}
static dpsResult_t fGather(dpsComm_t c, const dpsShape* sh, const int32_t* p, const int32_t* ai,
                           const int32_t* al, cudaStream_t s) {
  const int pad_bs = sh->pad_bs;
  checkShape(c, sh, sizeof(int32_t));
  rec.gather++;
  checkPadBsRules(c, pad_bs);
  checkVerifyShape(c, pad_bs);
  CHECK(p == rec.p && ai == rec.ai && al == rec.al && p && ai && al && s == rec.stream,
        "gather_outputs got other pointers/stream");
  return opResult();
}
static dpsResult_t fLogprobs(dpsComm_t c, const dpsShape* sh, const float* in, cudaStream_t s) {
  const int pad_bs = sh->pad_bs;
  checkShape(c, sh, sizeof(float));
  rec.logprobs++;
  checkPadBsRules(c, pad_bs);
  checkVerifyShape(c, pad_bs);
  CHECK(in == rec.in && in != NULL && s == rec.stream, "gather_logprobs got other pointers/stream");
  return opResult();
}
static dpsResult_t fAsync(dpsComm_t c) {
  (void)c;
  return rec.async == dpsSuccess ? dpsSuccess : dpsSetError(rec.async, "fake async error");
}
static void fDestroy(dpsComm_t c) {
  (void)c;
  rec.destroy++;
}
static const dpsBackendOps kFake = {.name = "fake", .init = fInit, .prepare = fPrepare,
                                    .swap = fSwap, .gather_outputs = fGather,
                                    .gather_logprobs = fLogprobs, .async_error = fAsync,
                                    .destroy = fDestroy};
/* async_error may be NULL (internal.h): such a backend never reports one. */
static const dpsBackendOps kFakeNoAsync = {.name = "fake-no-async", .init = fInit,
                                           .prepare = fPrepare, .swap = fSwap,
                                           .gather_outputs = fGather,
                                           .gather_logprobs = fLogprobs, .destroy = fDestroy};

/* Collectives installed by dpsCommSetCollectives: never called on a host-only
 * communicator whose backend is the fake. */
static dpsResult_t neverAllGather(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  CHECK(0, "all_gather called");
  return dpsInternalError;
}
static dpsResult_t neverAllToAll(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  CHECK(0, "all_to_all called");
  return dpsInternalError;
}

/* Status codes a fake backend may fail with: disjoint from the argument
 * errors so that the model can tell who answered. */
static dpsResult_t fault(uint8_t b) {
  static const dpsResult_t codes[] = {dpsCudaError, dpsNcclError, dpsSystemError, dpsTimeout,
                                      dpsInternalError, dpsUnavailable};
  return (b & 0x80) ? codes[b % 6] : dpsSuccess; /* half the time: no fault */
}

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

typedef struct {
  int init, prepare, swap, gather, logprobs, destroy;
} Counts;
static Counts counts(void) {
  Counts k = {rec.init, rec.prepare, rec.swap, rec.gather, rec.logprobs, rec.destroy};
  return k;
}
static void expectDeltas(const char* call, Counts before, int prepare, int swap, int gather,
                         int logprobs) {
  Counts now = counts();
  CHECK(now.init == before.init && now.destroy == before.destroy &&
            now.prepare - before.prepare == prepare && now.swap - before.swap == swap &&
            now.gather - before.gather == gather && now.logprobs - before.logprobs == logprobs,
        "%s reached the backend: init %+d prepare %+d (want %+d) swap %+d (want %+d) gather %+d "
        "(want %+d) logprobs %+d (want %+d) destroy %+d",
        call, now.init - before.init, now.prepare - before.prepare, prepare,
        now.swap - before.swap, swap, now.gather - before.gather, gather,
        now.logprobs - before.logprobs, logprobs, now.destroy - before.destroy);
}

static _Alignas(16) char dummy_in[64]; /* never read: the fake backend moves no data */
#define SENTINEL ((void*)&dummy_in[7])
#define DUMMY_STREAM ((cudaStream_t)(uintptr_t)0x5170)

static const void* fPtr(uint8_t bits, int bit) {
  return (bits >> bit) & 1 ? NULL : (const void*)dummy_in;
}

/* Adds the reasons shared by the operations: async error (the library checks
 * it once the arguments pass; with bad arguments either may be reported). */
static void healthReason(const Model* m, Reasons* rs) {
  if (m->live && m->has_async && rec.async != dpsSuccess) addReason(rs, rec.async, "fake async error");
}
static void padReasons(const Model* m, const char* op, int pad_bs, Reasons* rs) {
  const int tp = m->cfg.tp_size;
  if (pad_bs < 1 || pad_bs > m->cfg.max_pad_bs || pad_bs % tp != 0)
    addReason(rs, dpsInvalidArgument, "%s: pad_bs=%d", op, pad_bs);
}

/* The reasons both verify gathers share: pad_bs, the [reqs, n] shape of
 * `what` ("" or "logprobs "), the async error. */
static void verifyReasons(const Model* m, const char* op, const char* what, int pad_bs,
                          int64_t reqs, int64_t n, Reasons* rs) {
  if (!m->live) return;
  padReasons(m, op, pad_bs, rs);
  if (reqs != pad_bs / m->cfg.tp_size || n != m->cfg.num_tokens_per_req)
    addReason(rs, dpsInvalidArgument, "%sis [%" PRId64 ", %" PRId64 "]", what, reqs, n);
  healthReason(m, rs);
}

/* What an operation call must do, from the reasons found: its status, the
 * model after it, and whether prepare (fixing fix_dtype) and the backend op
 * run. `before` is the count snapshot the deltas are checked against. */
typedef struct {
  Counts before;
  Model after;
  dpsResult_t want;
  int prepare, ops;
} OpExpect;

static OpExpect expectOp(const Model* m, const Reasons* rs, dpsDataType_t fix_dtype) {
  OpExpect x = {counts(), *m, dpsSuccess, 0, 0};
  if (rs->n != 0) return x;
  if (fix_dtype != dpsDtypeUnset && m->dtype == dpsDtypeUnset) {
    x.prepare = 1;
    if (rec.fail_prepare != dpsSuccess) {
      x.want = rec.fail_prepare;
      return x;
    }
    x.after.dtype = fix_dtype;
    x.after.initialized = 1;
  }
  x.ops = 1;
  x.want = rec.fail_op;
  return x;
}

static void opSwap(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t bits = u8(r);
  const void* in = fPtr(bits, 0);
  void** outp;
  void* out = SENTINEL;
  outp = (bits & 2) ? NULL : &out;
  cudaStream_t stream = (bits & 4) ? DUMMY_STREAM : NULL;
  int dtype = (bits & 8) ? fInt(r) : (int)(u8(r) % 4) - 1;
  int pad_bs;
  int64_t rows, cols;
  if (m->live && !(bits & 16)) { /* near-valid shapes */
    uint8_t b = u8(r);
    const int tp = m->cfg.tp_size;
    const int steps = m->cfg.max_pad_bs / tp;
    pad_bs = addClampInt((int64_t)tp * (1 + (int64_t)(u32(r) % (uint32_t)steps)),
                         (b & 1) ? (int)(b >> 4) - 8 : 0);
    rows = (int64_t)pad_bs * m->cfg.num_tokens_per_req + ((b & 2) ? (int)((b >> 2) & 3) - 2 : 0);
    cols = addSat64(m->cfg.vocab_size / tp, (b & 4) ? (b & 8 ? -1 : tp) : 0);
  } else {
    pad_bs = fInt(r);
    rows = fI64(r);
    cols = fI64(r);
  }
  rec.fail_prepare = fault(u8(r));
  rec.fail_op = fault(u8(r));

  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  if (!in) addReason(&rs, dpsInvalidArgument, "local_logits is NULL");
  if (!outp) addReason(&rs, dpsInvalidArgument, "output is NULL");
  if (!validOpDtype(dtype)) addReason(&rs, dpsInvalidArgument, "dtype=");
  if (m->live) {
    padReasons(m, "swap_batch_vocab", pad_bs, &rs);
    if (rows != (int64_t)pad_bs * m->cfg.num_tokens_per_req ||
        cols != m->cfg.vocab_size / m->cfg.tp_size)
      addReason(&rs, dpsInvalidArgument, "local_logits is [%" PRId64 ", %" PRId64 "]", rows, cols);
    if (validOpDtype(dtype) && m->dtype != dpsDtypeUnset && (int)m->dtype != dtype)
      addReason(&rs, dpsInvalidUsage, "differs from the communicator's logits dtype");
    healthReason(m, &rs);
  }
  rec.in = in, rec.stream = stream, rec.rows = rows, rec.cols = cols, rec.pad_bs = pad_bs;
  rec.dtype = (dpsDataType_t)dtype;
  const OpExpect x = expectOp(m, &rs, (dpsDataType_t)dtype);

  dpsClearError();
  dpsResult_t got = dpsSwapBatchVocab(comm, in, rows, cols, (dpsDataType_t)dtype, pad_bs, outp,
                                      stream);
  if (expectOpOutcome("dpsSwapBatchVocab", got, x.want, &rs))
    CHECK(strstr(lastError(), "fake") != NULL, "backend failure message lost");
  expectDeltas("dpsSwapBatchVocab", x.before, x.prepare, x.ops, 0, 0);
  if (got == dpsSuccess) CHECK(out == swap_buf, "swap output %p is not the persistent buffer", out);
  else CHECK(out == SENTINEL, "swap wrote *output on failure");
  *m = x.after;
  rec.fail_prepare = rec.fail_op = dpsSuccess;
}

/* The [reqs, n] and pad_bs of a gather call: near-valid (a valid shape,
 * sometimes nudged by a few) when `guided` on a live communicator, else raw. */
static void verifyShape(Rd* r, const Model* m, int guided, int* pad_bs, int64_t* reqs,
                        int64_t* n) {
  if (m->live && guided) {
    uint8_t b = u8(r);
    const int tp = m->cfg.tp_size;
    *pad_bs = addClampInt((int64_t)tp * (1 + (int64_t)(u32(r) % (uint32_t)(m->cfg.max_pad_bs / tp))),
                          (b & 1) ? (int)(b >> 4) - 8 : 0);
    /* 64-bit sums: pad_bs/tp and N may both be INT_MAX on a valid config. */
    *reqs = (int64_t)(*pad_bs / tp) + ((b & 2) ? (int)((b >> 2) & 3) - 2 : 0);
    *n = (int64_t)m->cfg.num_tokens_per_req + ((b & 4) ? (b & 8 ? -1 : 1) : 0);
  } else {
    *pad_bs = fInt(r);
    *reqs = fI64(r);
    *n = fI64(r);
  }
}

static void opGatherOutputs(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t bits = u8(r);
  const int32_t* p = fPtr(bits, 0);
  const int32_t* ai = fPtr(bits, 1);
  const int32_t* al = fPtr(bits, 2);
  int32_t *po = SENTINEL, *aio = SENTINEL, *alo = SENTINEL;
  int32_t** pop = (bits & 8) ? NULL : &po;
  int32_t** aiop = (bits & 16) ? NULL : &aio;
  int32_t** alop = (bits & 32) ? NULL : &alo;
  cudaStream_t stream = (bits & 64) ? DUMMY_STREAM : NULL;
  int pad_bs;
  int64_t reqs, n;
  verifyShape(r, m, !(bits & 128), &pad_bs, &reqs, &n);
  rec.fail_op = fault(u8(r));

  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  if (!p) addReason(&rs, dpsInvalidArgument, "predict is NULL");
  if (!ai) addReason(&rs, dpsInvalidArgument, "accept_index is NULL");
  if (!al) addReason(&rs, dpsInvalidArgument, "accept_length is NULL");
  if (!pop) addReason(&rs, dpsInvalidArgument, "predict_out is NULL");
  if (!aiop) addReason(&rs, dpsInvalidArgument, "accept_index_out is NULL");
  if (!alop) addReason(&rs, dpsInvalidArgument, "accept_length_out is NULL");
  verifyReasons(m, "gather_verify_outputs", "", pad_bs, reqs, n, &rs);
  rec.p = p, rec.ai = ai, rec.al = al, rec.stream = stream;
  rec.reqs = reqs, rec.n = n, rec.pad_bs = pad_bs;
  const OpExpect x = expectOp(m, &rs, dpsDtypeUnset);

  dpsClearError();
  dpsResult_t got =
      dpsGatherVerifyOutputs(comm, p, ai, al, reqs, n, pad_bs, pop, aiop, alop, stream);
  expectOpOutcome("dpsGatherVerifyOutputs", got, x.want, &rs);
  expectDeltas("dpsGatherVerifyOutputs", x.before, x.prepare, 0, x.ops, 0);
  if (got == dpsSuccess)
    CHECK(po == (int32_t*)p_buf && aio == (int32_t*)ai_buf && alo == (int32_t*)al_buf,
          "verify outputs are not the persistent buffers");
  else
    CHECK(po == SENTINEL && aio == SENTINEL && alo == SENTINEL,
          "gather_verify_outputs wrote an output on failure");
  *m = x.after;
  rec.fail_op = dpsSuccess;
}

static void opGatherLogprobs(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t bits = u8(r);
  const float* in = fPtr(bits, 0);
  float* out = SENTINEL;
  float** outp = (bits & 2) ? NULL : &out;
  cudaStream_t stream = (bits & 4) ? DUMMY_STREAM : NULL;
  int pad_bs;
  int64_t reqs, n;
  verifyShape(r, m, !(bits & 8), &pad_bs, &reqs, &n);
  rec.fail_op = fault(u8(r));

  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  if (!in) addReason(&rs, dpsInvalidArgument, "logprobs is NULL");
  if (!outp) addReason(&rs, dpsInvalidArgument, "output is NULL");
  verifyReasons(m, "gather_verify_logprobs", "logprobs ", pad_bs, reqs, n, &rs);
  rec.in = in, rec.stream = stream, rec.reqs = reqs, rec.n = n, rec.pad_bs = pad_bs;
  const OpExpect x = expectOp(m, &rs, dpsDtypeUnset);

  dpsClearError();
  dpsResult_t got = dpsGatherVerifyLogprobs(comm, in, reqs, n, pad_bs, outp, stream);
  expectOpOutcome("dpsGatherVerifyLogprobs", got, x.want, &rs);
  expectDeltas("dpsGatherVerifyLogprobs", x.before, x.prepare, 0, 0, x.ops);
  if (got == dpsSuccess) CHECK(out == (float*)lp_buf, "logprobs output is not the persistent buffer");
  else CHECK(out == SENTINEL, "gather_verify_logprobs wrote *output on failure");
  *m = x.after;
  rec.fail_op = dpsSuccess;
}

static void opPrepare(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t b = u8(r);
  int dtype = (b & 0x80) ? fInt(r) : (int)(b % 5) - 1;
  rec.fail_prepare = fault(u8(r));
  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  if (!validOpDtype(dtype)) addReason(&rs, dpsInvalidArgument, "dtype=%d", dtype);
  healthReason(m, &rs);
  const Counts before = counts();
  int prepare = 0;
  dpsResult_t want = dpsSuccess;
  if (rs.n == 0 && m->dtype == dpsDtypeUnset) {
    prepare = 1;
    want = rec.fail_prepare;
  }
  dpsClearError();
  dpsResult_t got = dpsCommPrepare(comm, (dpsDataType_t)dtype);
  expectOpOutcome("dpsCommPrepare", got, want, &rs);
  expectDeltas("dpsCommPrepare", before, prepare, 0, 0, 0);
  if (prepare && got == dpsSuccess) {
    m->dtype = (dpsDataType_t)dtype;
    m->initialized = 1;
  }
  rec.fail_prepare = dpsSuccess;
}

static void opGetInfo(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t b = u8(r);
  dpsCommInfo_t info, blank;
  memset(&info, 0xa5, sizeof info);
  memcpy(&blank, &info, sizeof info);
  dpsCommInfo_t* ip = (b & 1) ? NULL : &info;
  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  else if (!ip) addReason(&rs, dpsInvalidArgument, "info is NULL");
  const Counts before = counts();
  dpsClearError();
  dpsResult_t got = dpsCommGetInfo(comm, ip);
  expectOutcome("dpsCommGetInfo", got, &rs);
  expectDeltas("dpsCommGetInfo", before, 0, 0, 0, 0);
  if (got != dpsSuccess) {
    CHECK(memcmp(&info, &blank, sizeof info) == 0, "dpsCommGetInfo wrote *info on failure");
    return;
  }
  const dpsConfig_t* c = &m->cfg;
  CHECK(info.tp_size == c->tp_size && info.rank == c->rank && info.max_pad_bs == c->max_pad_bs &&
            info.num_tokens_per_req == c->num_tokens_per_req && info.vocab_size == c->vocab_size,
        "info shape differs from the config");
  CHECK(info.logits_dtype == m->dtype && info.initialized == m->initialized,
        "info dtype=%d initialized=%d, model %d %d", (int)info.logits_dtype, info.initialized,
        (int)m->dtype, m->initialized);
  CHECK(info.requested_backend == c->backend && info.backend == m->backend, "info backend");
  CHECK(info.cuda_device == (c->cuda_device < 0 ? 0 : c->cuda_device), "info cuda_device=%d",
        info.cuda_device);
  CHECK(info.timeout_ms == (c->timeout_ms > 0 ? c->timeout_ms : 5000), "info timeout_ms=%d",
        info.timeout_ms);
}

static void opAsync(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t b = u8(r);
  dpsResult_t async = (dpsResult_t)-77;
  dpsResult_t* ap = (b & 1) ? NULL : &async;
  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  else if (!ap) addReason(&rs, dpsInvalidArgument, "async_error is NULL");
  const Counts before = counts();
  dpsClearError();
  dpsResult_t got = dpsCommGetAsyncError(comm, ap);
  expectOutcome("dpsCommGetAsyncError", got, &rs);
  expectDeltas("dpsCommGetAsyncError", before, 0, 0, 0, 0);
  if (got != dpsSuccess) {
    CHECK(async == (dpsResult_t)-77, "dpsCommGetAsyncError wrote *async_error on failure");
    return;
  }
  const dpsResult_t want = m->has_async ? rec.async : dpsSuccess;
  CHECK(async == want, "async_error=%s, expected %s", dpsGetErrorString(async),
        dpsGetErrorString(want));
  if (async != dpsSuccess)
    CHECK(strstr(lastError(), "fake async error") != NULL, "async error message lost");
}

static void opSetCollectives(Rd* r, Model* m, dpsComm_t comm) {
  uint8_t b = u8(r);
  dpsCollectives_t t = {(void*)dummy_in, (b & 2) ? NULL : neverAllGather,
                        (b & 4) ? NULL : neverAllToAll};
  const dpsCollectives_t* tp = (b & 1) ? NULL : &t;
  Reasons rs = {0};
  if (!m->live) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  /* only the nccl backend uses collectives: a table for another is refused */
  else if (tp && m->backend != dpsBackendNccl)
    addReason(&rs, dpsUnavailable, "runs the %s backend, which uses no collectives",
              dpsBackendName(m->backend));
  const Counts before = counts();
  dpsClearError();
  dpsResult_t got = dpsCommSetCollectives(comm, tp);
  expectOutcome("dpsCommSetCollectives", got, &rs);
  expectDeltas("dpsCommSetCollectives", before, 0, 0, 0, 0);
  if (got == dpsSuccess) {
    if (tp) m->coll = t;
    else memset(&m->coll, 0, sizeof m->coll);
    CHECK(memcmp(&comm->coll, &m->coll, sizeof m->coll) == 0, "collectives table not installed");
  }
}

/* ---- host-only entry points ----------------------------------------------------- */
static void fuzzResolve(Rd* r) {
  static const char* const vars[2] = {"DPSAMPLING_BACKEND", "TOKENSPEED_DP_SAMPLING_BACKEND"};
  static char val[2][2048];
  static char envbuf[2][2048 + 40];
  const char* v[2];
  int set[2] = {0, 0}, ok[2] = {1, 1};
  dpsBackend_t env[2] = {dpsBackendAuto, dpsBackendAuto};
  static const dpsBackend_t all[3] = {dpsBackendAuto, dpsBackendNccl, dpsBackendOnesided};
  for (int i = 0; i < 2; ++i) {
    v[i] = fString(r, val[i], sizeof val[i], 1);
    /* putenv of our own buffer rather than setenv: glibc's setenv keeps every
     * value ever set, which grows without bound over millions of runs. */
    if (v[i]) {
      snprintf(envbuf[i], sizeof envbuf[i], "%s=%s", vars[i], v[i]);
      CHECK(putenv(envbuf[i]) == 0, "putenv");
    } else {
      unsetenv(vars[i]);
    }
    set[i] = v[i] && v[i][0];
    if (set[i]) {
      ok[i] = 0;
      for (int k = 0; k < 3; ++k)
        if (strcmp(v[i], dpsBackendName(all[k])) == 0) ok[i] = 1, env[i] = all[k];
    }
  }
  uint8_t b = u8(r);
  int requested = b >= 0xf0 ? fInt(r) : (int)(b % 5) - 1;
  b = u8(r);
  int avail = b % 3 == 2 ? fInt(r) : b % 3;
  uint8_t flags = u8(r);
  dpsBackend_t resolved = (dpsBackend_t)-7;
  dpsBackend_t* rp = (flags & 1) ? NULL : &resolved;

  Reasons rs = {0};
  if (!rp) addReason(&rs, dpsInvalidArgument, "resolved is NULL");
  if (!validBackend(requested)) addReason(&rs, dpsInvalidArgument, "backend=%d", requested);
  for (int i = 0; i < 2; ++i)
    if (set[i] && !ok[i]) addReason(&rs, dpsInvalidArgument, "%s='", vars[i]);
  if (set[0] && set[1] && ok[0] && ok[1] && env[0] != env[1])
    addReason(&rs, dpsInvalidArgument, "disagree");
  dpsBackend_t want = set[0] && ok[0]   ? env[0]
                      : set[1] && ok[1] ? env[1]
                                        : (dpsBackend_t)requested;
  if (want == dpsBackendOnesided && !avail)
    addReason(&rs, dpsUnavailable, "DPSAMPLING_BACKEND=nccl");
  dpsClearError();
  dpsResult_t got = dpsResolveBackend((dpsBackend_t)requested, avail, rp);
  expectOutcome("dpsResolveBackend", got, &rs);
  if (got != dpsSuccess) {
    CHECK(resolved == (dpsBackend_t)-7, "dpsResolveBackend wrote *resolved on failure");
  } else {
    dpsBackend_t w = want == dpsBackendAuto ? (avail ? dpsBackendOnesided : dpsBackendNccl) : want;
    CHECK(resolved == w, "resolved %d, expected %d (requested %d avail %d)", (int)resolved,
          (int)w, requested, avail);
  }

  /* dpsParseBackend */
  static char name_buf[2048];
  const char* name = fString(r, name_buf, sizeof name_buf, 1);
  flags = u8(r);
  dpsBackend_t parsed = (dpsBackend_t)-7;
  dpsBackend_t* pp = (flags & 1) ? NULL : &parsed;
  Reasons ps = {0};
  int known = -1;
  if (name)
    for (int k = 0; k < 3; ++k)
      if (strcmp(name, dpsBackendName(all[k])) == 0) known = k;
  if (!name) addReason(&ps, dpsInvalidArgument, "name is NULL");
  if (!pp) addReason(&ps, dpsInvalidArgument, "backend is NULL");
  if (name && known < 0) addReason(&ps, dpsInvalidArgument, "backend='%.40s", name);
  dpsClearError();
  got = dpsParseBackend(name, pp);
  expectOutcome("dpsParseBackend", got, &ps);
  if (got == dpsSuccess) CHECK(parsed == all[known], "parsed %d", (int)parsed);
  else CHECK(parsed == (dpsBackend_t)-7, "dpsParseBackend wrote *backend on failure");
  /* The variables' effect on creation is dpsResolveBackend's, checked above:
   * the host-only creation below resolves the backend it is given. */
  for (int i = 0; i < 2; ++i) unsetenv(vars[i]);

  /* names and sizes of arbitrary enum values */
  const int any = fInt(r);
  CHECK(dpsGetErrorString((dpsResult_t)any) != NULL, "dpsGetErrorString NULL");
  CHECK(dpsBackendName((dpsBackend_t)any) != NULL, "dpsBackendName NULL");
  CHECK(dpsDataTypeName((dpsDataType_t)any) != NULL, "dpsDataTypeName NULL");
  size_t es = dpsDataTypeSize((dpsDataType_t)any);
  CHECK(es == (any == dpsFloat32 ? 4u : validOpDtype(any) ? 2u : 0u), "size of dtype %d = %zu",
        any, es);
}

/* Bootstrap entry points, only with arguments that fail before CUDA/NCCL. */
static void fuzzBootstrapChecks(Rd* r, const dpsConfig_t* cfg, int cfg_ok) {
  uint8_t b = u8(r);
  dpsComm_t out = SENTINEL;
  dpsComm_t* outp = (b & 1) ? NULL : &out;
  dpsUniqueId id;
  memset(&id, 0, sizeof id);
  const dpsUniqueId* idp = (b & 2) ? NULL : &id;
  const dpsConfig_t* cp = (b & 4) ? NULL : cfg;
  const int cp_ok = cp && cfg_ok;
  if (!outp || !idp || !cp_ok) {
    Reasons rs = {0};
    if (!outp) addReason(&rs, dpsInvalidArgument, "comm is NULL");
    if (!idp) addReason(&rs, dpsInvalidArgument, "unique_id is NULL");
    if (!cp_ok) configReasons(cp, &rs);
    dpsClearError();
    expectOutcome("dpsCommInitRank", dpsCommInitRank(outp, idp, cp), &rs);
    CHECK(out == SENTINEL, "dpsCommInitRank wrote *comm on failure");
  }
  struct ncclComm* nccl = (b & 8) ? NULL : (struct ncclComm*)(void*)dummy_in;
  if (!outp || !nccl || !cp_ok) {
    Reasons rs = {0};
    if (!outp) addReason(&rs, dpsInvalidArgument, "comm is NULL");
    if (!nccl) addReason(&rs, dpsInvalidArgument, "nccl_comm is NULL");
    if (!cp_ok) configReasons(cp, &rs);
    dpsClearError();
    expectOutcome("dpsCommInitFromNccl", dpsCommInitFromNccl(outp, nccl, cp), &rs);
    CHECK(out == SENTINEL, "dpsCommInitFromNccl wrote *comm on failure");
  }
  if (b & 16) {
    Reasons rs = {0};
    addReason(&rs, dpsInvalidArgument, "unique_id is NULL");
    dpsClearError();
    expectOutcome("dpsGetUniqueId", dpsGetUniqueId(NULL), &rs);
  }
  { /* argument checks of dpsOnesidedAvailableOnDevices (never its CUDA path) */
    int devs[2] = {0, 1};
    int avail = -7;
    const int count = (b & 32) ? fInt(r) : 0;
    const int* d = (b & 128) ? devs : NULL;
    int* a = (b & 64) ? NULL : &avail;
    if (!(a && d && count >= 1)) {
      Reasons rs = {0};
      if (!a) addReason(&rs, dpsInvalidArgument, "available is NULL");
      if (!d || count < 1) addReason(&rs, dpsInvalidArgument, "count=%d", count);
      dpsClearError();
      expectOutcome("dpsOnesidedAvailableOnDevices", dpsOnesidedAvailableOnDevices(d, count, a),
                    &rs);
      CHECK(avail == -7, "dpsOnesidedAvailableOnDevices wrote *available on failure");
    }
  }
  int version = -7;
  dpsClearError();
  CHECK(dpsGetVersion(&version) == dpsSuccess && version == DPS_VERSION_CODE, "version");
  CHECK(dpsGetVersion(NULL) == dpsInvalidArgument && lastError()[0], "dpsGetVersion(NULL)");
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Rd r = {data, size};
  memset(&rec, 0, sizeof rec);

  fuzzResolve(&r);

  /* configuration */
  const dpsConfig_t cfg = decodeConfig(&r);
  Reasons cr = {0};
  configReasons(&cfg, &cr);
  dpsClearError();
  expectOutcome("dpsConfigCheck", dpsConfigCheck(&cfg), &cr);
  {
    Reasons nr = {0};
    configReasons(NULL, &nr);
    dpsClearError();
    expectOutcome("dpsConfigCheck(NULL)", dpsConfigCheck(NULL), &nr);
  }
  fuzzBootstrapChecks(&r, &cfg, cr.n == 0);

  /* host-only communicator. Creation gathers every rank's words for the
   * agreement (O(tp) host memory, as a group of that size would have), so
   * the fuzzer creates groups of at most 2^16 ranks. */
  if (cfg.tp_size > (1 << 16)) return 0;
  const uint8_t cf = u8(&r);
  const dpsResult_t f_init = fault(u8(&r)), f_prepare = fault(u8(&r));
  rec.fail_init = f_init;
  rec.fail_prepare = f_prepare;
  dpsComm_t comm = SENTINEL;
  dpsComm_t* outp = (cf & 1) ? NULL : &comm;
  const dpsBackendOps* ops = (cf & 2) ? NULL : (cf & 16) ? &kFakeNoAsync : &kFake;
  const dpsConfig_t* cp = (cf & 4) ? NULL : &cfg;
  const dpsBackend_t backend = (cf & 8) ? dpsBackendOnesided : dpsBackendNccl;
  Reasons rs = {0};
  if (!outp) addReason(&rs, dpsInvalidArgument, "comm is NULL");
  if (!ops) addReason(&rs, dpsInvalidArgument, "ops is NULL");
  configReasons(cp, &rs);
  const int typed = cfg.logits_dtype != dpsDtypeUnset;
  /* expected: init once, then prepare once if the dtype is known; either may fail */
  int want_init = 0, want_prepare = 0;
  dpsResult_t want = dpsSuccess;
  if (rs.n == 0) {
    want_init = 1;
    want = f_init;
    if (want == dpsSuccess && typed) {
      want_prepare = 1;
      want = f_prepare;
    }
  }
  Model m;
  memset(&m, 0, sizeof m);
  dpsClearError();
  dpsResult_t got = dpsTestCommCreateHost(outp, cp, backend, ops);
  if (rs.n) {
    expectOutcome("dpsTestCommCreateHost", got, &rs);
  } else {
    trace("dpsTestCommCreateHost", got);
    CHECK(got == want, "dpsTestCommCreateHost -> %s, want %s", dpsGetErrorString(got),
          dpsGetErrorString(want));
    if (want != dpsSuccess) CHECK(strstr(lastError(), "fake") != NULL, "backend message lost");
  }
  CHECK(rec.init == want_init && rec.prepare == want_prepare &&
            rec.swap + rec.gather + rec.logprobs == 0,
        "creation: init=%d (want %d) prepare=%d (want %d) ops=%d", rec.init, want_init,
        rec.prepare, want_prepare, rec.swap + rec.gather + rec.logprobs);
  if (got != dpsSuccess) {
    CHECK(comm == SENTINEL, "dpsTestCommCreateHost wrote *comm on failure");
    /* a backend that was initialized is destroyed again; one never reached is not */
    CHECK(rec.destroy == want_init, "failed creation: destroy=%d", rec.destroy);
    comm = NULL;
  } else {
    CHECK(comm != NULL && comm != SENTINEL && rec.destroy == 0, "creation: comm=%p destroy=%d",
          (void*)comm, rec.destroy);
    m.live = 1;
    m.has_async = ops->async_error != NULL;
    m.cfg = cfg;
    m.backend = backend;
    m.dtype = cfg.logits_dtype;
    m.initialized = typed;
  }
  rec.comm = comm;
  rec.fail_init = rec.fail_prepare = dpsSuccess;

  /* operations */
  for (int i = 0; i < 256 && r.n > 0; ++i) {
    uint8_t op = u8(&r);
    switch (op % 10) {
      case 0:
      case 1: opSwap(&r, &m, comm); break;
      case 2: opGatherOutputs(&r, &m, comm); break;
      case 3: opGatherLogprobs(&r, &m, comm); break;
      case 4: opPrepare(&r, &m, comm); break;
      case 5: opGetInfo(&r, &m, comm); break;
      case 6: opAsync(&r, &m, comm); break;
      case 7: opSetCollectives(&r, &m, comm); break;
      case 8: /* the backend reports an asynchronous error from now on (latched) */
        if (rec.async == dpsSuccess) rec.async = fault(u8(&r) | 0x80);
        trace("(backend raises async error)", rec.async);
        break;
      default: break; /* no-op: lets the fuzzer realign */
    }
  }

  const int destroyed = rec.destroy;
  dpsClearError();
  CHECK(dpsCommDestroy(comm) == dpsSuccess, "dpsCommDestroy");
  CHECK(rec.destroy == destroyed + (comm != NULL), "destroy reached %d times",
        rec.destroy - destroyed);
  CHECK(dpsCommDestroy(NULL) == dpsSuccess, "dpsCommDestroy(NULL)");
  return 0;
}
