/* dpsConfigCheck rules (host only): every rule rejects with
 * dpsInvalidArgument and a message naming the argument and its value; valid
 * configurations pass; uninitialized configs and byte-count overflow are
 * caught; the limits (timeout_ms, vocab_size, close's wait bound) at and
 * just past each one. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "internal.h"

static dpsConfig_t good(void) {
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  c.tp_size = 4;
  c.rank = 1;
  c.max_pad_bs = 256;
  c.num_tokens_per_req = 4;
  c.vocab_size = 152064;
  return c;
}

/* The call fails with dpsInvalidArgument and the message has both substrings. */
#define EXPECT_BAD(cfg, s1, s2)                                                     \
  do {                                                                              \
    dpsConfig_t c_ = (cfg);                                                         \
    FX_CHECK_ERR(dpsConfigCheck(&c_), dpsInvalidArgument, s1);                      \
    FX_CHECK(strstr(dpsGetLastError(), s2) != NULL, "message \"%s\" lacks \"%s\"", \
             dpsGetLastError(), s2);                                                \
  } while (0)

int main(void) {
  dpsConfig_t c;

  /* Defaults of the initializer. */
  {
    dpsConfig_t d = DPS_CONFIG_INITIALIZER;
    FX_CHECK(d.size == sizeof(dpsConfig_t), "size=%zu", d.size);
    FX_CHECK(d.magic == DPS_CONFIG_MAGIC, "magic=0x%x", d.magic);
    FX_CHECK(d.num_tokens_per_req == 1, "N=%d", d.num_tokens_per_req);
    FX_CHECK(d.logits_dtype == dpsDtypeUnset, "dtype=%d", (int)d.logits_dtype);
    FX_CHECK(d.backend == dpsBackendAuto, "backend=%d", (int)d.backend);
    FX_CHECK(d.cuda_device == -1, "cuda_device=%d", d.cuda_device);
    FX_CHECK(d.timeout_ms == 0, "timeout_ms=%d", d.timeout_ms);
    /* tp_size = 0 in the initializer: must be filled in. */
    FX_CHECK_ERR(dpsConfigCheck(&d), dpsInvalidArgument, "tp_size");
  }

  /* Valid configurations. */
  c = good();
  FX_CHECK_OK(dpsConfigCheck(&c));
  for (int tp = 1; tp <= 8; ++tp)
    for (int rank = 0; rank < tp; ++rank) {
      c = good();
      c.tp_size = tp;
      c.rank = rank;
      c.max_pad_bs = 8 * tp;
      c.vocab_size = 1000 * (int64_t)tp;
      FX_CHECK_OK(dpsConfigCheck(&c));
    }
  {
    const dpsDataType_t dts[] = {dpsDtypeUnset, dpsFloat32, dpsBfloat16, dpsFloat16};
    const dpsBackend_t bks[] = {dpsBackendAuto, dpsBackendNccl, dpsBackendOnesided};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j) {
        c = good();
        c.logits_dtype = dts[i];
        c.backend = bks[j];
        FX_CHECK_OK(dpsConfigCheck(&c));
      }
  }
  c = good();
  c.cuda_device = 3;
  c.timeout_ms = 100;
  FX_CHECK_OK(dpsConfigCheck(&c));
  c = good();
  c.tp_size = 1;
  c.rank = 0;
  c.max_pad_bs = 1;
  c.num_tokens_per_req = 1;
  c.vocab_size = 1;
  FX_CHECK_OK(dpsConfigCheck(&c));

  /* NULL / uninitialized. */
  FX_CHECK_ERR(dpsConfigCheck(NULL), dpsInvalidArgument, "config");
  c = good();
  c.magic = 0;
  FX_CHECK_ERR(dpsConfigCheck(&c), dpsInvalidArgument, "DPS_CONFIG_INITIALIZER");
  c = good();
  c.size = sizeof(dpsConfig_t) - 8;
  FX_CHECK_ERR(dpsConfigCheck(&c), dpsInvalidArgument, "DPS_CONFIG_INITIALIZER");
  {
    dpsConfig_t junk;
    memset(&junk, 0xa5, sizeof junk);
    FX_CHECK_ERR(dpsConfigCheck(&junk), dpsInvalidArgument, "DPS_CONFIG_INITIALIZER");
  }

  /* tp_size. */
  c = good(); c.tp_size = 0; c.rank = 0;
  EXPECT_BAD(c, "tp_size", "0");
  c = good(); c.tp_size = -3; c.rank = 0;
  EXPECT_BAD(c, "tp_size", "-3");

  /* rank. */
  c = good(); c.rank = -1;
  EXPECT_BAD(c, "rank", "-1");
  c = good(); c.rank = 4;
  EXPECT_BAD(c, "rank=4", "tp_size=4");

  /* max_pad_bs. */
  c = good(); c.max_pad_bs = 0;
  EXPECT_BAD(c, "max_pad_bs", "0");
  c = good(); c.max_pad_bs = -8;
  EXPECT_BAD(c, "max_pad_bs", "-8");
  c = good(); c.max_pad_bs = 258;
  EXPECT_BAD(c, "max_pad_bs", "258");

  /* num_tokens_per_req. */
  c = good(); c.num_tokens_per_req = 0;
  EXPECT_BAD(c, "num_tokens_per_req", "0");
  c = good(); c.num_tokens_per_req = -2;
  EXPECT_BAD(c, "num_tokens_per_req", "-2");

  /* vocab_size. */
  c = good(); c.vocab_size = 0;
  EXPECT_BAD(c, "vocab_size", "0");
  c = good(); c.vocab_size = -4;
  EXPECT_BAD(c, "vocab_size", "-4");
  c = good(); c.vocab_size = 152066; /* not a multiple of 4 */
  EXPECT_BAD(c, "vocab_size", "152066");

  /* dtype / backend. */
  c = good(); c.logits_dtype = (dpsDataType_t)7;
  EXPECT_BAD(c, "dtype", "7");
  c = good(); c.logits_dtype = (dpsDataType_t)-2;
  EXPECT_BAD(c, "dtype", "-2");
  c = good(); c.backend = (dpsBackend_t)9;
  EXPECT_BAD(c, "backend", "9");
  c = good(); c.backend = (dpsBackend_t)-1;
  EXPECT_BAD(c, "backend", "-1");

  /* vocab_size below 2^32 (global indices travel as 32 bits), at creation. */
  c = good(); c.tp_size = 1; c.rank = 0; c.max_pad_bs = 8; c.vocab_size = UINT32_MAX;
  FX_CHECK_OK(dpsConfigCheck(&c)); /* 2^32 - 1: the largest */
  c.vocab_size = (int64_t)UINT32_MAX + 1;
  EXPECT_BAD(c, "vocab_size=4294967296", "2^32");
  c = good(); c.vocab_size = (int64_t)UINT32_MAX - 3; /* 2^32 - 4, the largest multiple of 4 */
  FX_CHECK_OK(dpsConfigCheck(&c));
  c.vocab_size = (int64_t)UINT32_MAX + 1; /* a multiple of tp_size=4, one past */
  EXPECT_BAD(c, "vocab_size=4294967296", "2^32");
  c = good(); c.tp_size = 1; c.rank = 0; c.vocab_size = INT64_MAX;
  EXPECT_BAD(c, "vocab_size", "9223372036854775807");
  c = good(); c.vocab_size = (INT64_MAX / 4) * 4; /* a multiple of tp_size, far too large */
  EXPECT_BAD(c, "vocab_size=9223372036854775804", "2^32");

  /* Rows (max_pad_bs * N) up to 2^31 - 1: the kernels' row indices. */
  c = good(); c.tp_size = 1; c.rank = 0; c.max_pad_bs = INT32_MAX; c.num_tokens_per_req = 1;
  c.vocab_size = 1;
  FX_CHECK_OK(dpsConfigCheck(&c)); /* the most rows */
  c.max_pad_bs = 1 << 28; c.num_tokens_per_req = 8; /* 2^31 */
  EXPECT_BAD(c, "max_pad_bs=268435456 x num_tokens_per_req=8 = 2147483648 rows", "2^31 - 1");
  c.max_pad_bs = INT32_MAX; c.num_tokens_per_req = INT32_MAX; /* the int product would wrap */
  EXPECT_BAD(c, "= 4611686014132420609 rows", "32-bit row indices");
  /* Byte counts that do not fit in 64 bits: the largest rows and vocab. */
  c = good(); c.max_pad_bs = (INT32_MAX / 4) * 4; c.num_tokens_per_req = 1;
  c.vocab_size = (int64_t)UINT32_MAX - 3; /* the product overflows */
  EXPECT_BAD(c, "vocab_size=4294967292", "overflow");
  /* Large but representable: 2^27 * 8 rows * 2^20 * 8 bytes = 2^56 fits. */
  c = good(); c.tp_size = 1; c.rank = 0; c.max_pad_bs = 1 << 27;
  c.num_tokens_per_req = 8; c.vocab_size = (int64_t)1 << 20;
  FX_CHECK_OK(dpsConfigCheck(&c));

  /* timeout_ms: 0 (the environment or the default) up to one day, the same
   * bound as DPSAMPLING_TIMEOUT_MS (dpsTimeoutMsInRange serves both). */
  c = good(); c.timeout_ms = 0;
  FX_CHECK_OK(dpsConfigCheck(&c));
  c.timeout_ms = 1;
  FX_CHECK_OK(dpsConfigCheck(&c));
  c.timeout_ms = 86400000;
  FX_CHECK_OK(dpsConfigCheck(&c));
  c.timeout_ms = 86400001;
  EXPECT_BAD(c, "timeout_ms=86400001", "86400000");
  c.timeout_ms = INT_MAX;
  EXPECT_BAD(c, "timeout_ms=2147483647", "86400000");
  c.timeout_ms = -1;
  EXPECT_BAD(c, "timeout_ms=-1", "86400000");
  c.timeout_ms = INT_MIN;
  EXPECT_BAD(c, "timeout_ms=-2147483648", "86400000");
  FX_CHECK(!dpsTimeoutMsInRange(0) && dpsTimeoutMsInRange(1) && dpsTimeoutMsInRange(86400000) &&
               !dpsTimeoutMsInRange(86400001) && !dpsTimeoutMsInRange(UINT64_MAX),
           "dpsTimeoutMsInRange bounds");
  {
    /* The environment path: the same bound, the config first. */
    const char* var = "DPSAMPLING_TIMEOUT_MS";
    int ms = -1;
    c = good();
    setenv(var, "86400000", 1);
    FX_CHECK_OK(dpsResolveTimeoutMs(&c, &ms));
    FX_CHECK(ms == 86400000, "%s=86400000 -> %d ms", var, ms);
    setenv(var, "86400001", 1);
    ms = -1;
    FX_CHECK_ERR(dpsResolveTimeoutMs(&c, &ms), dpsInvalidArgument, "DPSAMPLING_TIMEOUT_MS='86400001'");
    FX_CHECK(ms == -1, "timeout written on failure: %d", ms);
    c.timeout_ms = 86400000; /* the config's own value wins over the environment */
    FX_CHECK_OK(dpsResolveTimeoutMs(&c, &ms));
    FX_CHECK(ms == 86400000, "config 86400000 -> %d ms", ms);
    unsetenv(var);
  }
  /* dpsCommClose's wait bound, twice the timeout plus one second, in 64 bits
   * (2 * INT_MAX + 1000 would overflow an int). */
  FX_CHECK(dpsCloseWaitMs(5000) == 11000, "wait for 5000 ms: %lld",
           (long long)dpsCloseWaitMs(5000));
  FX_CHECK(dpsCloseWaitMs(86400000) == 172801000LL, "wait for 86400000 ms: %lld",
           (long long)dpsCloseWaitMs(86400000));
  FX_CHECK(dpsCloseWaitMs(INT_MAX) == 4294968294LL, "wait for INT_MAX ms: %lld",
           (long long)dpsCloseWaitMs(INT_MAX));

  /* Names and sizes used in messages. */
  FX_CHECK(dpsDataTypeSize(dpsFloat32) == 4, "fp32 size");
  FX_CHECK(dpsDataTypeSize(dpsBfloat16) == 2, "bf16 size");
  FX_CHECK(dpsDataTypeSize(dpsFloat16) == 2, "fp16 size");
  FX_CHECK(dpsDataTypeSize(dpsDtypeUnset) == 0, "unset size");
  FX_CHECK(dpsDataTypeSize((dpsDataType_t)42) == 0, "invalid size");

  /* Whole numbers from the environment (dpsEnvUint: every numeric knob). */
  {
    const char* var = "DPS_TEST_ENV_UINT";
    uint64_t v = 77;
    unsetenv(var);
    FX_CHECK(dpsEnvUint(var, &v) == 0 && v == 77, "unset: touched");
    setenv(var, "", 1);
    FX_CHECK(dpsEnvUint(var, &v) == 0 && v == 77, "empty: touched");
    const struct { const char* s; uint64_t want; } good_vals[] = {
        {"0", 0}, {"1", 1}, {"007", 7}, {"262144", 262144},
        {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof good_vals / sizeof good_vals[0]; ++i) {
      setenv(var, good_vals[i].s, 1);
      v = 77;
      FX_CHECK(dpsEnvUint(var, &v) == 1 && v == good_vals[i].want, "'%s' -> %llu",
               good_vals[i].s, (unsigned long long)v);
    }
    const char* bad_vals[] = {"-1", "+5", " 5", "5 ", "0x10", "12ms", "1e3", "abc",
                              "18446744073709551616", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_vals / sizeof bad_vals[0]; ++i) {
      setenv(var, bad_vals[i], 1);
      v = 77;
      FX_CHECK(dpsEnvUint(var, &v) == -1 && v == 77, "'%s' accepted (%llu)", bad_vals[i],
               (unsigned long long)v);
    }
    unsetenv(var);
  }

  printf("test_config: OK\n");
  return 0;
}
