/* dpsResolveBackend / dpsParseBackend with the environment overrides
 * DPSAMPLING_BACKEND and TOKENSPEED_DP_SAMPLING_BACKEND (host only). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

static const char* kPrimary = "DPSAMPLING_BACKEND";
static const char* kAlias = "TOKENSPEED_DP_SAMPLING_BACKEND";

static void clearEnv(void) {
  unsetenv(kPrimary);
  unsetenv(kAlias);
}

/* Resolves and expects `want` (for both availabilities if want_any). */
#define EXPECT_RESOLVE(req, avail, want)                                              \
  do {                                                                                \
    dpsBackend_t out_ = (dpsBackend_t)-7;                                             \
    FX_CHECK_OK(dpsResolveBackend((req), (avail), &out_));                            \
    FX_CHECK(out_ == (want), "resolve(%s, avail=%d) = %s, want %s",                   \
             dpsBackendName(req), (avail), dpsBackendName(out_), dpsBackendName(want)); \
  } while (0)

/* Fails with `code`, message contains s1 and s2, output untouched. */
#define EXPECT_RESOLVE_ERR(req, avail, code, s1, s2)                                  \
  do {                                                                                \
    dpsBackend_t out_ = (dpsBackend_t)-7;                                             \
    FX_CHECK_ERR(dpsResolveBackend((req), (avail), &out_), (code), (s1));             \
    FX_CHECK(strstr(dpsGetLastError(), (s2)) != NULL, "message \"%s\" lacks \"%s\"",  \
             dpsGetLastError(), (s2));                                                \
    FX_CHECK(out_ == (dpsBackend_t)-7, "output written on error: %d", (int)out_);     \
  } while (0)

int main(void) {
  const dpsBackend_t all[] = {dpsBackendAuto, dpsBackendNccl, dpsBackendOnesided};

  /* ---- no environment ---- */
  clearEnv();
  EXPECT_RESOLVE(dpsBackendAuto, 1, dpsBackendOnesided);
  EXPECT_RESOLVE(dpsBackendAuto, 0, dpsBackendNccl);
  EXPECT_RESOLVE(dpsBackendNccl, 1, dpsBackendNccl);
  EXPECT_RESOLVE(dpsBackendNccl, 0, dpsBackendNccl);
  EXPECT_RESOLVE(dpsBackendOnesided, 1, dpsBackendOnesided);
  /* onesided requested while unavailable: dpsUnavailable saying how to fall back. */
  EXPECT_RESOLVE_ERR(dpsBackendOnesided, 0, dpsUnavailable, "onesided", "nccl");
  FX_CHECK(strstr(dpsGetLastError(), "auto") != NULL || strstr(dpsGetLastError(), kPrimary),
           "fallback advice missing: %s", dpsGetLastError());
  FX_CHECK(strstr(dpsGetLastError(), kPrimary) != NULL, "no mention of %s: %s", kPrimary,
           dpsGetLastError());
  /* Invalid requested value and NULL output. */
  EXPECT_RESOLVE_ERR((dpsBackend_t)5, 1, dpsInvalidArgument, "backend", "5");
  FX_CHECK_ERR(dpsResolveBackend(dpsBackendAuto, 1, NULL), dpsInvalidArgument, "resolved");

  /* ---- empty values count as unset ---- */
  setenv(kPrimary, "", 1);
  setenv(kAlias, "", 1);
  EXPECT_RESOLVE(dpsBackendAuto, 1, dpsBackendOnesided);
  EXPECT_RESOLVE(dpsBackendNccl, 1, dpsBackendNccl);
  clearEnv();

  /* ---- each variable alone: nccl overrides auto and onesided (spec) ---- */
  const char* vars[2] = {kAlias, kPrimary};
  for (int v = 0; v < 2; ++v) {
    clearEnv();
    setenv(vars[v], "nccl", 1);
    for (int a = 0; a <= 1; ++a)
      for (int i = 0; i < 3; ++i) EXPECT_RESOLVE(all[i], a, dpsBackendNccl);

    setenv(vars[v], "onesided", 1);
    for (int i = 0; i < 3; ++i) EXPECT_RESOLVE(all[i], 1, dpsBackendOnesided);
    /* Forced onesided where it cannot run: unavailable, even if nccl was requested. */
    EXPECT_RESOLVE_ERR(dpsBackendNccl, 0, dpsUnavailable, "onesided", vars[v]);

    setenv(vars[v], "auto", 1);
    EXPECT_RESOLVE(dpsBackendNccl, 1, dpsBackendOnesided);
    EXPECT_RESOLVE(dpsBackendOnesided, 0, dpsBackendNccl);
    EXPECT_RESOLVE(dpsBackendOnesided, 1, dpsBackendOnesided);

    /* Bogus values name the variable (spec: ValueError matching the name). */
    const char* bogus[] = {"bogus", "NCCL", "nccl ", "one-sided", "1"};
    for (size_t b = 0; b < sizeof bogus / sizeof bogus[0]; ++b) {
      setenv(vars[v], bogus[b], 1);
      for (int i = 0; i < 3; ++i)
        EXPECT_RESOLVE_ERR(all[i], 1, dpsInvalidArgument, vars[v], bogus[b]);
    }
  }

  /* ---- both set ---- */
  clearEnv();
  setenv(kPrimary, "nccl", 1);
  setenv(kAlias, "nccl", 1);
  EXPECT_RESOLVE(dpsBackendOnesided, 1, dpsBackendNccl);
  setenv(kAlias, "onesided", 1);
  EXPECT_RESOLVE_ERR(dpsBackendAuto, 1, dpsInvalidArgument, kPrimary, kAlias);
  setenv(kPrimary, "auto", 1);
  EXPECT_RESOLVE_ERR(dpsBackendAuto, 1, dpsInvalidArgument, kPrimary, kAlias);
  setenv(kPrimary, "bogus", 1);
  setenv(kAlias, "nccl", 1);
  EXPECT_RESOLVE_ERR(dpsBackendAuto, 1, dpsInvalidArgument, kPrimary, "bogus");
  clearEnv();

  /* ---- dpsParseBackend ---- */
  {
    dpsBackend_t b = (dpsBackend_t)-7;
    FX_CHECK_OK(dpsParseBackend("auto", &b));
    FX_CHECK(b == dpsBackendAuto, "auto -> %d", (int)b);
    FX_CHECK_OK(dpsParseBackend("nccl", &b));
    FX_CHECK(b == dpsBackendNccl, "nccl -> %d", (int)b);
    FX_CHECK_OK(dpsParseBackend("onesided", &b));
    FX_CHECK(b == dpsBackendOnesided, "onesided -> %d", (int)b);
    b = (dpsBackend_t)-7;
    FX_CHECK_ERR(dpsParseBackend("Nccl", &b), dpsInvalidArgument, "Nccl");
    FX_CHECK(b == (dpsBackend_t)-7, "written on error");
    FX_CHECK_ERR(dpsParseBackend("", &b), dpsInvalidArgument, "backend");
    FX_CHECK_ERR(dpsParseBackend(NULL, &b), dpsInvalidArgument, "name");
    FX_CHECK_ERR(dpsParseBackend("nccl", NULL), dpsInvalidArgument, "backend");
    for (int i = 0; i < 3; ++i) {
      FX_CHECK_OK(dpsParseBackend(dpsBackendName(all[i]), &b));
      FX_CHECK(b == all[i], "round trip of %s", dpsBackendName(all[i]));
    }
  }

  /* A successful call after a failure does not need to clear the message, but
   * a failing one must set it: checked above by FX_CHECK_ERR. */
  printf("test_backend_env: OK\n");
  return 0;
}
