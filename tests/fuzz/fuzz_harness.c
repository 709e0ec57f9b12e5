/* The harness of fuzz_api (fuzz_harness.h says what each part is); the
 * scenarios that use it are fuzz_api.c. */
#define _XOPEN_SOURCE 700
#include "fuzz_harness.h"

#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

int fInt(Rd* r) {
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

int64_t fI64(Rd* r) {
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
const char* fString(Rd* r, char* buf, size_t cap, int null_if_unset) {
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

void addReason(Reasons* rs, dpsResult_t code, const char* fmt, ...) {
  CHECK(rs->n < 16, "too many reasons");
  Reason* x = &rs->r[rs->n++];
  x->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->what, sizeof x->what, fmt, ap);
  va_end(ap);
}

const char* lastError(void) {
  const char* m = dpsGetLastError();
  CHECK(m != NULL, "dpsGetLastError() returned NULL");
  size_t len = strnlen(m, 4096);
  CHECK(len < 1024, "message not terminated within its 1024-byte buffer");
  return m;
}

/* DPS_FUZZ_TRACE=1 prints every checked call (to see what a seed does). */
void trace(const char* call, dpsResult_t got) {
  static int on = -1;
  if (on < 0) on = getenv("DPS_FUZZ_TRACE") != NULL;
  if (on) fprintf(stderr, "  %-30s %-20s %s\n", call, dpsGetErrorString(got), dpsGetLastError());
}

/* Checks a call's status against the reasons. Returns 1 if the call was
 * expected to fail (and did, for one of the reasons). */
int expectOutcome(const char* call, dpsResult_t got, const Reasons* rs) {
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
int expectOpOutcome(const char* call, dpsResult_t got, dpsResult_t want, const Reasons* rs) {
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
int validDtype(int d) { return d >= dpsDtypeUnset && d <= dpsFloat16; }
int validOpDtype(int d) { return d >= dpsFloat32 && d <= dpsFloat16; }
int validBackend(int b) { return b >= dpsBackendAuto && b <= dpsBackendOnesided; }

void configReasons(const dpsConfig_t* c, Reasons* rs) {
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
  if ((int64_t)c->max_pad_bs * c->num_tokens_per_req > INT32_MAX) /* 32-bit row indices */
    addReason(rs, IA, "max_pad_bs=%d", c->max_pad_bs);
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
dpsConfig_t decodeConfig(Rd* r) {
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
char swap_buf[64], p_buf[64], ai_buf[64], al_buf[64], lp_buf[64];

Recorder rec;

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
const dpsBackendOps kFake = {.name = "fake", .init = fInit, .prepare = fPrepare,
                                    .swap = fSwap, .gather_outputs = fGather,
                                    .gather_logprobs = fLogprobs, .async_error = fAsync,
                                    .destroy = fDestroy};
/* async_error may be NULL (internal.h): such a backend never reports one. */
const dpsBackendOps kFakeNoAsync = {.name = "fake-no-async", .init = fInit,
                                           .prepare = fPrepare, .swap = fSwap,
                                           .gather_outputs = fGather,
                                           .gather_logprobs = fLogprobs, .destroy = fDestroy};

/* Collectives installed by dpsCommSetCollectives: never called on a host-only
 * communicator whose backend is the fake. */
dpsResult_t neverAllGather(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  CHECK(0, "all_gather called");
  return dpsInternalError;
}
dpsResult_t neverAllToAll(void* ctx, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)ctx, (void)s, (void)r, (void)b, (void)st;
  CHECK(0, "all_to_all called");
  return dpsInternalError;
}

/* Status codes a fake backend may fail with: disjoint from the argument
 * errors so that the model can tell who answered. */
dpsResult_t fault(uint8_t b) {
  static const dpsResult_t codes[] = {dpsCudaError, dpsNcclError, dpsSystemError, dpsTimeout,
                                      dpsInternalError, dpsUnavailable};
  return (b & 0x80) ? codes[b % 6] : dpsSuccess; /* half the time: no fault */
}

/* ---- model of the communicator ----------------------------------------------- */

Counts counts(void) {
  Counts k = {rec.init, rec.prepare, rec.swap, rec.gather, rec.logprobs, rec.destroy};
  return k;
}
void expectDeltas(const char* call, Counts before, int prepare, int swap, int gather,
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

_Alignas(16) char dummy_in[64];

/* Adds the reasons shared by the operations: async error (the library checks
 * it once the arguments pass; with bad arguments either may be reported). */
void healthReason(const Model* m, Reasons* rs) {
  if (m->live && m->has_async && rec.async != dpsSuccess) addReason(rs, rec.async, "fake async error");
}
void padReasons(const Model* m, const char* op, int pad_bs, Reasons* rs) {
  const int tp = m->cfg.tp_size;
  if (pad_bs < 1 || pad_bs > m->cfg.max_pad_bs || pad_bs % tp != 0)
    addReason(rs, dpsInvalidArgument, "%s: pad_bs=%d", op, pad_bs);
}

/* The reasons both verify gathers share: pad_bs, the [reqs, n] shape of
 * `what` ("" or "logprobs "), the async error. */
void verifyReasons(const Model* m, const char* op, const char* what, int pad_bs, int64_t reqs,
                   int64_t n, Reasons* rs) {
  if (!m->live) return;
  padReasons(m, op, pad_bs, rs);
  if (reqs != pad_bs / m->cfg.tp_size || n != m->cfg.num_tokens_per_req)
    addReason(rs, dpsInvalidArgument, "%sis [%" PRId64 ", %" PRId64 "]", what, reqs, n);
  healthReason(m, rs);
}

/* What an operation call must do, from the reasons found: its status, the
 * model after it, and whether prepare (fixing fix_dtype) and the backend op
 * run. `before` is the count snapshot the deltas are checked against. */

OpExpect expectOp(const Model* m, const Reasons* rs, dpsDataType_t fix_dtype) {
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
