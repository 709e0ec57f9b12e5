/* Configuration rules, names, and backend resolution (environment overrides).
 * Host only: nothing here touches the GPU, so CI tests all of it. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

const char* dpsBackendName(dpsBackend_t backend) {
  switch (backend) {
    case dpsBackendAuto: return "auto";
    case dpsBackendNccl: return "nccl";
    case dpsBackendOnesided: return "onesided";
    default: return "invalid";
  }
}

const char* dpsDataTypeName(dpsDataType_t dtype) {
  switch (dtype) {
    case dpsDtypeUnset: return "unset";
    case dpsFloat32: return "fp32";
    case dpsBfloat16: return "bf16";
    case dpsFloat16: return "fp16";
    default: return "invalid";
  }
}

size_t dpsDataTypeSize(dpsDataType_t dtype) {
  switch (dtype) {
    case dpsFloat32: return 4;
    case dpsBfloat16:
    case dpsFloat16: return 2;
    default: return 0;
  }
}

dpsResult_t dpsParseBackend(const char* name, dpsBackend_t* backend) {
  if (name == NULL || backend == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsParseBackend: %s is NULL",
                       name == NULL ? "name" : "backend");
  static const dpsBackend_t all[] = {dpsBackendAuto, dpsBackendNccl, dpsBackendOnesided};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
    if (strcmp(name, dpsBackendName(all[i])) == 0) {
      *backend = all[i];
      return dpsSuccess;
    }
  }
  return dpsSetError(dpsInvalidArgument,
                     "backend='%s' is not a backend; expected 'auto', 'nccl' or 'onesided'", name);
}

static int validBackend(dpsBackend_t b) {
  return b == dpsBackendAuto || b == dpsBackendNccl || b == dpsBackendOnesided;
}
static int validDtype(dpsDataType_t d) {
  return d == dpsDtypeUnset || d == dpsFloat32 || d == dpsBfloat16 || d == dpsFloat16;
}

dpsResult_t dpsConfigCheck(const dpsConfig_t* c) {
  if (c == NULL) return dpsSetError(dpsInvalidArgument, "config is NULL");
  if (c->size != sizeof(dpsConfig_t) || c->magic != DPS_CONFIG_MAGIC)
    return dpsSetError(dpsInvalidArgument,
                       "config was not initialized with DPS_CONFIG_INITIALIZER "
                       "(size=%zu, expected %zu; magic=0x%x, expected 0x%x)",
                       c->size, sizeof(dpsConfig_t), c->magic, DPS_CONFIG_MAGIC);
  if (c->tp_size < 1) return dpsSetError(dpsInvalidArgument, "tp_size=%d must be >= 1", c->tp_size);
  if (c->rank < 0 || c->rank >= c->tp_size)
    return dpsSetError(dpsInvalidArgument, "rank=%d must be in [0, tp_size=%d)", c->rank, c->tp_size);
  if (c->max_pad_bs < 1 || c->max_pad_bs % c->tp_size != 0)
    return dpsSetError(dpsInvalidArgument,
                       "max_pad_bs=%d must be a positive multiple of tp_size=%d", c->max_pad_bs,
                       c->tp_size);
  if (c->num_tokens_per_req < 1)
    return dpsSetError(dpsInvalidArgument, "num_tokens_per_req=%d must be >= 1",
                       c->num_tokens_per_req);
  if (c->vocab_size < 1 || c->vocab_size % c->tp_size != 0)
    return dpsSetError(dpsInvalidArgument,
                       "vocab_size=%" PRId64 " must be a positive multiple of tp_size=%d",
                       c->vocab_size, c->tp_size);
  if (c->vocab_size > DPS_VOCAB_MAX)
    return dpsSetError(dpsInvalidArgument,
                       "vocab_size=%" PRId64 " must be below 2^32 = %" PRId64
                       " (global indices travel between the ranks as 32 bits)",
                       c->vocab_size, DPS_VOCAB_MAX + 1);
  if (!validDtype(c->logits_dtype))
    return dpsSetError(dpsInvalidArgument,
                       "logits_dtype=%d is not dpsFloat32, dpsBfloat16, dpsFloat16 or dpsDtypeUnset",
                       (int)c->logits_dtype);
  if (!validBackend(c->backend))
    return dpsSetError(dpsInvalidArgument,
                       "backend=%d is not dpsBackendAuto, dpsBackendNccl or dpsBackendOnesided",
                       (int)c->backend);
  if (c->cuda_device < -1)
    return dpsSetError(dpsInvalidArgument, "cuda_device=%d must be a device ordinal or -1",
                       c->cuda_device);
  if (c->timeout_ms < 0 || (c->timeout_ms > 0 && !dpsTimeoutMsInRange((uint64_t)c->timeout_ms)))
    return dpsSetError(dpsInvalidArgument,
                       "timeout_ms=%d must be in [0, %d] (0 = DPSAMPLING_TIMEOUT_MS, else 5000)",
                       c->timeout_ms, DPS_TIMEOUT_MS_MAX);
  if (c->max_topk < 0 || c->max_topk > DPS_TOPK_MAX)
    return dpsSetError(dpsInvalidArgument, "max_topk=%d must be in [0, %d]", c->max_topk,
                       DPS_TOPK_MAX);
  /* A call's rows index the kernels' grids and the per-row scratch as 32-bit
   * values (and the per-row sizes stay far from size_t's range). */
  const int64_t max_rows = (int64_t)c->max_pad_bs * c->num_tokens_per_req;
  if (max_rows > INT32_MAX)
    return dpsSetError(dpsInvalidArgument,
                       "max_pad_bs=%d x num_tokens_per_req=%d = %" PRId64
                       " rows: more than 2^31 - 1 overflow the kernels' 32-bit row indices",
                       c->max_pad_bs, c->num_tokens_per_req, max_rows);
  /* The largest buffer: the full logits [max_pad_bs*N, V] at 4 bytes, plus a
   * margin for staging. It must fit in 63 bits. */
  uint64_t elems, bytes;
  if (!dpsMulOk((uint64_t)c->max_pad_bs, (uint64_t)c->num_tokens_per_req, &elems) ||
      !dpsMulOk(elems, (uint64_t)c->vocab_size, &elems) || !dpsMulOk(elems, 8, &bytes) ||
      bytes > (uint64_t)INT64_MAX)
    return dpsSetError(dpsInvalidArgument,
                       "max_pad_bs=%d x num_tokens_per_req=%d x vocab_size=%" PRId64
                       " logits overflow a 64-bit byte count",
                       c->max_pad_bs, c->num_tokens_per_req, c->vocab_size);
  return dpsSuccess;
}

int dpsTimeoutMsInRange(uint64_t ms) { return ms >= 1 && ms <= DPS_TIMEOUT_MS_MAX; }

int dpsEnvUint(const char* name, uint64_t* value) {
  const char* v = getenv(name);
  if (v == NULL || v[0] == '\0') return 0;
  uint64_t x = 0;
  for (const char* c = v; *c; ++c) {
    if (*c < '0' || *c > '9') return -1;
    const uint64_t d = (uint64_t)(*c - '0');
    if (x > (UINT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  *value = x;
  return 1;
}

int dpsEnvIsZero(const char* name) {
  const char* v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  char* end = NULL;
  const long x = strtol(v, &end, 10);
  return *end == '\0' && x == 0;
}

/* ---- the environment: one policy for every variable ---------------------
 * Read and checked at every creation, whichever backend resolves; a value
 * that is set and invalid fails creation with dpsInvalidArgument naming the
 * variable and its value (docs/api.md, "Environment variables"). */
static dpsResult_t envBad(const char* var, const char* want) {
  return dpsSetError(dpsInvalidArgument, "%s='%s' %s (unset it for the default)", var,
                     getenv(var), want);
}

/* A whole number in [lo, hi] (digits only); *v untouched when unset. */
static dpsResult_t envRange(const char* var, uint64_t lo, uint64_t hi, const char* want,
                            uint64_t* v) {
  uint64_t x = 0;
  const int got = dpsEnvUint(var, &x);
  if (got == 0) return dpsSuccess;
  if (got < 0 || x < lo || x > hi) return envBad(var, want);
  *v = x;
  return dpsSuccess;
}

/* One of `names` (exact); *v = its index, untouched when unset. */
static dpsResult_t envChoice(const char* var, const char* const* names, int count,
                             int ignore_case, const char* want, int* v) {
  const char* s = getenv(var);
  if (s == NULL || s[0] == '\0') return dpsSuccess;
  for (int i = 0; i < count; ++i)
    if ((ignore_case ? strcasecmp(s, names[i]) : strcmp(s, names[i])) == 0) {
      *v = i;
      return dpsSuccess;
    }
  return envBad(var, want);
}

static dpsResult_t envTimeout(uint64_t* ms) {
  uint64_t x = 0;
  const int got = dpsEnvUint("DPSAMPLING_TIMEOUT_MS", &x);
  if (got == 0) return dpsSuccess;
  if (got < 0 || !dpsTimeoutMsInRange(x))
    return dpsSetError(dpsInvalidArgument,
                       "DPSAMPLING_TIMEOUT_MS='%s' must be a whole number of milliseconds in "
                       "[1, %d]",
                       getenv("DPSAMPLING_TIMEOUT_MS"), DPS_TIMEOUT_MS_MAX);
  *ms = x;
  return dpsSuccess;
}

dpsResult_t dpsResolveTimeoutMs(const dpsConfig_t* config, int* ms) {
  if (config->timeout_ms > 0) {
    *ms = config->timeout_ms;
    return dpsSuccess;
  }
  uint64_t v = DPS_DEFAULT_TIMEOUT_MS;
  DPS_CHECK(envTimeout(&v));
  *ms = (int)v;
  return dpsSuccess;
}

dpsResult_t dpsReadEnv(dpsEnv* e) {
  memset(e, 0, sizeof *e);
  static const char* const levels[] = {"WARN", "INFO", "TRACE"};
  int level = 0;
  DPS_CHECK(envChoice("DPSAMPLING_DEBUG", levels, 3, 1, "is not WARN, INFO or TRACE", &level));
  uint64_t v = 0;
  DPS_CHECK(envTimeout(&v));
  e->timeout_ms = (int)v;
  v = DPS_ENV_LL_BYTES_DEFAULT;
  DPS_CHECK(envRange("DPSAMPLING_ONESIDED_LL_BYTES", 0, UINT64_MAX, "is not a byte count", &v));
  e->os_ll_bytes = v > DPS_ENV_LL_BYTES_MAX ? DPS_ENV_LL_BYTES_MAX : v;
  v = 0;
  DPS_CHECK(envRange("DPSAMPLING_ONESIDED_MAX_BLOCKS", 1, UINT64_MAX, "is not a positive count",
                     &v));
  e->os_max_blocks = v > (uint64_t)INT32_MAX ? INT32_MAX : (int)v;
  static const char* const protos[] = {"ll", "ll128"};
  DPS_CHECK(envChoice("DPSAMPLING_ONESIDED_GATHER_PROTO", protos, 2, 0, "is neither ll nor ll128",
                      &e->os_gather_ll128));
  v = DPS_ENV_GATHER_THREADS_DEFAULT;
  DPS_CHECK(envRange("DPSAMPLING_ONESIDED_GATHER_THREADS", 32, DPS_ENV_GATHER_THREADS_MAX,
                     "is not a multiple of 32 in [32, 1024]", &v));
  if (v % 32 != 0) return envBad("DPSAMPLING_ONESIDED_GATHER_THREADS", "is not a multiple of 32 in [32, 1024]");
  e->os_gather_threads = (int)v;
  v = 1;
  DPS_CHECK(envRange("DPSAMPLING_PDL", 0, 1, "is neither 0 nor 1", &v));
  e->pdl = (int)v;
  v = DPS_ENV_SELECT_SPLIT_MAX;
  DPS_CHECK(envRange("DPSAMPLING_SELECT_SPLIT", 1, DPS_ENV_SELECT_SPLIT_MAX, "is not in [1, 8]",
                     &v));
  e->select_split = (int)v;
  static const char* const tiled[] = {"auto", "0", "1"}; /* DPS_TILED_* */
  e->tiled_collect = DPS_TILED_AUTO;
  DPS_CHECK(envChoice("DPSAMPLING_TILED_COLLECT", tiled, 3, 1, "is not auto, 0 or 1",
                      &e->tiled_collect));
  v = 1;
  DPS_CHECK(envRange("DPSAMPLING_EXACT_SPLIT", 0, 1, "is neither 0 nor 1", &v));
  e->exact_split = (int)v;
  return dpsSuccess;
}

/* Reads one override variable; *set = 0 if unset or empty. */
static dpsResult_t readEnvBackend(const char* var, int* set, dpsBackend_t* value) {
  const char* v = getenv(var);
  *set = 0;
  if (v == NULL || v[0] == '\0') return dpsSuccess;
  if (dpsParseBackend(v, value) != dpsSuccess)
    return dpsSetError(dpsInvalidArgument,
                       "%s='%s' is not a backend; expected 'auto', 'nccl' or 'onesided'", var, v);
  *set = 1;
  return dpsSuccess;
}

dpsResult_t dpsResolveBackend(dpsBackend_t requested, int onesided_available,
                              dpsBackend_t* resolved) {
  /* the backends without a probe run anywhere; onesided as the caller says */
  unsigned mask = dpsBackendsAvailable(NULL);
  if (onesided_available) mask |= DPS_BACKEND_BIT(dpsBackendOnesided);
  return dpsResolveBackendIn(requested, mask, resolved);
}

dpsResult_t dpsResolveBackendIn(dpsBackend_t requested, unsigned available,
                                dpsBackend_t* resolved) {
  if (resolved == NULL) return dpsSetError(dpsInvalidArgument, "dpsResolveBackend: resolved is NULL");
  if (!validBackend(requested))
    return dpsSetError(dpsInvalidArgument,
                       "requested backend=%d is not dpsBackendAuto, dpsBackendNccl or "
                       "dpsBackendOnesided",
                       (int)requested);
  static const char* const kPrimary = "DPSAMPLING_BACKEND";
  static const char* const kAlias = "TOKENSPEED_DP_SAMPLING_BACKEND";
  int set1, set2;
  dpsBackend_t env1 = dpsBackendAuto, env2 = dpsBackendAuto;
  DPS_CHECK(readEnvBackend(kPrimary, &set1, &env1));
  DPS_CHECK(readEnvBackend(kAlias, &set2, &env2));
  if (set1 && set2 && env1 != env2)
    return dpsSetError(dpsInvalidArgument, "%s='%s' and %s='%s' disagree; set one of them",
                       kPrimary, dpsBackendName(env1), kAlias, dpsBackendName(env2));
  const char* source = "requested";
  dpsBackend_t want = requested;
  if (set1) {
    want = env1;
    source = kPrimary;
  } else if (set2) {
    want = env2;
    source = kAlias;
  }
  /* auto walks the table: the available backend of the highest priority */
  const dpsBackendEntry* pick = dpsBackendPickAuto(available);
  if (want == dpsBackendAuto) {
    if (pick == NULL)
      return dpsSetError(dpsUnavailable, "backend 'auto' (%s): no backend is available", source);
    *resolved = pick->id;
    return dpsSuccess;
  }
  const dpsBackendEntry* e = dpsBackendLookup(want);
  if (e == NULL)
    return dpsSetError(dpsInternalError, "backend %s has no implementation", dpsBackendName(want));
  if (!(available & DPS_BACKEND_BIT(want))) {
    const char* alt = pick != NULL ? pick->name : "auto";
    return dpsSetError(dpsUnavailable,
                       "backend '%s' (%s) is not available: %s; request 'auto' or '%s', or set "
                       "DPSAMPLING_BACKEND=%s",
                       e->name, source, e->unavailable_why ? e->unavailable_why : "its probe failed",
                       alt, alt);
  }
  *resolved = want;
  return dpsSuccess;
}
