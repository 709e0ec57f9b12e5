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
 * tests/fuzz/gen_corpus.py writes the seed corpus in this format.
 *
 * Files: this one holds the scenarios (the operations' calls, the host-only
 * entry points, the fuzzer's entry); fuzz_harness.{h,c} the harness (the
 * input decoding, the model's reasons and checks, the model of
 * dpsConfigCheck, the recording fake backend, the model of the communicator). */
#define _XOPEN_SOURCE 700 /* putenv */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_harness.h"
#include "testsupport.h"

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
