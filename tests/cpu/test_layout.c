/* Host simulation of every operation with layout.h, checked by the fixtures'
 * reference checkers for tp 1..8: build each rank's swap input with
 * fxFillSwapInput, run an all-to-all + permute exactly as the nccl backend
 * does (chunk d = rows [d*reqs*n, (d+1)*reqs*n); staging chunk s from rank s;
 * out[row][s*v_local + c]), check with fxCheckSwapOutput; the same for the
 * pack / all-gather / unpack of the verify outputs and the logprobs gather.
 * Also proves the checkers catch misplacements, and tests the bf16/fp16
 * conversions and fxLogitValue's exactness and spread. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/onesided_plan.h"
#include "fixtures.h"
#include "internal.h"
#include "layout.h"

#define MAXTP 8

/* The checkers print their first mismatches: silence them while this test
 * feeds them deliberately wrong data. */
static int g_saved_stderr = -1;
static void quiet(int on) {
  fflush(stderr);
  if (on && g_saved_stderr < 0) {
    g_saved_stderr = dup(2);
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
  } else if (!on && g_saved_stderr >= 0) {
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    g_saved_stderr = -1;
  }
}

/* out (rank r) <- simulated swap over the inputs of all ranks. */
static void simulateSwap(void* const* inputs, void* out, dpsShape s, int rank, int corrupt) {
  const int64_t rows = s.rows_per_rank;
  const size_t chunk = dpsSwapChunkBytes(s);
  /* All-to-all into staging: staging[src] = inputs[src] + rank*chunk. */
  char* staging = (char*)malloc(chunk * (size_t)s.tp + 1);
  for (int src = 0; src < s.tp; ++src)
    memcpy(staging + (size_t)src * chunk, (const char*)inputs[src] + (size_t)rank * chunk, chunk);
  /* Permute. */
  for (int64_t row = 0; row < rows; ++row)
    for (int src = 0; src < s.tp; ++src) {
      int from = src;
      if (corrupt == 1 && row == rows - 1 && s.tp > 1) from = (src + 1) % s.tp; /* wrong chunk */
      memcpy((char*)out + ((size_t)row * (size_t)s.vocab + (size_t)src * (size_t)s.v_local) * s.esize,
             staging + (size_t)from * chunk + (size_t)row * (size_t)s.v_local * s.esize,
             (size_t)s.v_local * s.esize);
    }
  if (corrupt == 2 && s.v_local >= 2) { /* swap two adjacent elements of row 0 */
    char tmp[4];
    memcpy(tmp, out, s.esize);
    memcpy(out, (char*)out + s.esize, s.esize);
    memcpy((char*)out + s.esize, tmp, s.esize);
  }
  free(staging);
}

static int testSwap(int tp, int pad_bs, int n, int64_t vocab, dpsDataType_t dt) {
  const size_t es = dpsDataTypeSize(dt);
  void* in[MAXTP];
  const dpsShape s0 = dpsMakeShape(tp, 0, pad_bs, n, vocab, es);
  FX_CHECK(s0.v_local * tp == vocab && s0.reqs * tp == pad_bs, "bad shape");
  const size_t in_elems = (size_t)pad_bs * (size_t)n * (size_t)s0.v_local;
  FX_CHECK(dpsSwapChunkBytes(s0) * (size_t)tp == in_elems * es, "chunks do not tile the input");
  FX_CHECK(s0.rows_per_rank * s0.vocab == (int64_t)s0.reqs * n * vocab, "out elems");
  /* The fixtures' sizes (what dps-perf uses) agree with the library's layout. */
  FX_CHECK(fxSwapChunkBytes(tp, pad_bs, n, vocab, dt) == dpsSwapChunkBytes(s0), "fx chunk bytes");
  FX_CHECK(fxSwapInputBytes(tp, pad_bs, n, vocab, dt) == in_elems * es, "fx input bytes");
  FX_CHECK(fxSwapOutputBytes(tp, pad_bs, n, vocab, dt) == (size_t)(s0.rows_per_rank * s0.vocab) * es,
           "fx output bytes");
  for (int r = 0; r < tp; ++r) {
    in[r] = malloc(in_elems * es);
    fxFillSwapInput(in[r], tp, r, pad_bs, n, vocab, dt, 3);
  }
  /* Inputs are the column slices of one full logits matrix. */
  for (int64_t row = 0; row < (int64_t)pad_bs * n; row += 7)
    for (int64_t col = 0; col < vocab; col += 5) {
      int r = (int)(col / s0.v_local);
      float v = fxLoad(in[r], (size_t)(row * s0.v_local + col % s0.v_local), dt);
      FX_CHECK(v == fxLogitValue(row, col, 3, dt), "input slice (%lld,%lld)", (long long)row,
               (long long)col);
    }
  const size_t out_elems = (size_t)(s0.rows_per_rank * s0.vocab);
  void* out = malloc(out_elems * es);
  int rc = 0;
  for (int r = 0; r < tp && rc == 0; ++r) {
    dpsShape s = dpsMakeShape(tp, r, pad_bs, n, vocab, es);
    simulateSwap(in, out, s, r, 0);
    size_t bad = fxCheckSwapOutput(out, tp, r, pad_bs, n, vocab, dt, 3);
    if (bad) {
      fprintf(stderr, "swap tp=%d rank=%d pad_bs=%d n=%d V=%lld %s: %zu mismatches\n", tp, r,
              pad_bs, n, (long long)vocab, dpsDataTypeName(dt), bad);
      rc = 1;
    }
    quiet(1);
    /* Wrong step is detected. */
    if (fxCheckSwapOutput(out, tp, r, pad_bs, n, vocab, dt, 4) < out_elems / 2) {
      fprintf(stderr, "checker does not see a wrong step\n");
      rc = 1;
    }
    /* Misplaced chunk / swapped elements are detected. */
    if (tp > 1) {
      simulateSwap(in, out, s, r, 1);
      if (fxCheckSwapOutput(out, tp, r, pad_bs, n, vocab, dt, 3) == 0) {
        fprintf(stderr, "checker misses a wrong chunk (tp=%d)\n", tp);
        rc = 1;
      }
    }
    if (s.v_local >= 2) {
      simulateSwap(in, out, s, r, 2);
      if (fxCheckSwapOutput(out, tp, r, pad_bs, n, vocab, dt, 3) == 0) {
        fprintf(stderr, "checker misses two swapped elements\n");
        rc = 1;
      }
    }
    /* The rank's output is not another rank's output. */
    if (tp > 1 && fxCheckSwapOutput(out, tp, (r + 1) % tp, pad_bs, n, vocab, dt, 3) == 0) {
      fprintf(stderr, "checker accepts another rank's output\n");
      rc = 1;
    }
    quiet(0);
    if (rc) fprintf(stderr, "swap checker sensitivity failed: tp=%d rank=%d\n", tp, r);
  }
  for (int r = 0; r < tp; ++r) free(in[r]);
  free(out);
  return rc;
}

static int testVerify(int tp, int pad_bs, int n) {
  const int reqs = pad_bs / tp;
  const int64_t packed = dpsMakeShape(tp, 0, pad_bs, n, tp, 4).packed;
  FX_CHECK(fxVerifyPackedElems(reqs, n) == (size_t)packed, "fx packed elems");
  int32_t* gathered = (int32_t*)malloc(sizeof(int32_t) * (size_t)packed * (size_t)tp);
  float* lp_gathered = (float*)malloc(sizeof(float) * (size_t)pad_bs * (size_t)n);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)reqs * (size_t)n);
  int32_t* ai = (int32_t*)malloc(sizeof(int32_t) * (size_t)reqs * (size_t)n);
  int32_t* al = (int32_t*)malloc(sizeof(int32_t) * (size_t)reqs);
  float* lp = (float*)malloc(sizeof(float) * (size_t)reqs * (size_t)n);
  /* Pack on every rank, all-gather (recv[src*bytes] <- rank src). */
  for (int src = 0; src < tp; ++src) {
    fxFillVerifyInputs(p, ai, al, lp, tp, src, pad_bs, n, 9);
    int32_t* dst = gathered + (size_t)src * (size_t)packed;
    memcpy(dst, p, sizeof(int32_t) * (size_t)reqs * (size_t)n);
    memcpy(dst + (size_t)reqs * n, ai, sizeof(int32_t) * (size_t)reqs * (size_t)n);
    memcpy(dst + (size_t)2 * reqs * n, al, sizeof(int32_t) * (size_t)reqs);
    memcpy(lp_gathered + (size_t)src * reqs * n, lp, sizeof(float) * (size_t)reqs * n);
  }
  /* Unpack: row r of rank src lands at src*reqs + r. */
  int32_t* po = (int32_t*)malloc(sizeof(int32_t) * (size_t)pad_bs * (size_t)n);
  int32_t* aio = (int32_t*)malloc(sizeof(int32_t) * (size_t)pad_bs * (size_t)n);
  int32_t* alo = (int32_t*)malloc(sizeof(int32_t) * (size_t)pad_bs);
  for (int src = 0; src < tp; ++src)
    for (int r = 0; r < reqs; ++r) {
      const int32_t* g = gathered + (size_t)src * (size_t)packed;
      for (int d = 0; d < n; ++d) {
        po[(src * reqs + r) * n + d] = g[r * n + d];
        aio[(src * reqs + r) * n + d] = g[reqs * n + r * n + d];
      }
      alo[src * reqs + r] = g[2 * reqs * n + r];
    }
  int rc = 0;
  if (fxCheckVerifyOutputs(po, aio, alo, pad_bs, n, 9) != 0) rc = 1;
  if (fxCheckLogprobs(lp_gathered, pad_bs, n, 9) != 0) rc = 1;
  /* Checkers detect a wrong step and single corruptions. */
  quiet(1);
  if (fxCheckVerifyOutputs(po, aio, alo, pad_bs, n, 10) < (size_t)pad_bs) rc = 1;
  if (fxCheckLogprobs(lp_gathered, pad_bs, n, 10) < (size_t)pad_bs * n / 2) rc = 1;
  po[pad_bs * n - 1] ^= 1;
  if (fxCheckVerifyOutputs(po, aio, alo, pad_bs, n, 9) != 1) rc = 1;
  po[pad_bs * n - 1] ^= 1;
  alo[0] += 1;
  if (fxCheckVerifyOutputs(po, aio, alo, pad_bs, n, 9) != 1) rc = 1;
  alo[0] -= 1;
  if (fxCheckVerifyOutputs(NULL, aio, NULL, pad_bs, n, 9) != 0) rc = 1;
  if (pad_bs > 1) { /* rows of two requests exchanged */
    int32_t t = alo[0];
    alo[0] = alo[1];
    alo[1] = t;
    if (fxCheckVerifyOutputs(po, aio, alo, pad_bs, n, 9) != 2) rc = 1;
  }
  lp_gathered[0] = 1.0f;
  if (fxCheckLogprobs(lp_gathered, pad_bs, n, 9) != 1) rc = 1;
  quiet(0);
  if (rc) fprintf(stderr, "verify simulation failed: tp=%d pad_bs=%d n=%d\n", tp, pad_bs, n);
  free(gathered); free(lp_gathered); free(p); free(ai); free(al); free(lp);
  free(po); free(aio); free(alo);
  return rc;
}

static int testConversions(void) {
  /* bf16: every non-NaN pattern round-trips. */
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t b = (uint16_t)h;
    int nan = ((b & 0x7f80u) == 0x7f80u) && (b & 0x7fu);
    if (nan) continue;
    FX_CHECK(fxFloatToBf16(fxBf16ToFloat(b)) == b, "bf16 0x%04x", h);
  }
  /* fp16: every non-NaN pattern round-trips (subnormals included). */
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t b = (uint16_t)h;
    int nan = ((b & 0x7c00u) == 0x7c00u) && (b & 0x3ffu);
    if (nan) continue;
    FX_CHECK(fxFloatToHalf(fxHalfToFloat(b)) == b, "fp16 0x%04x -> %g -> 0x%04x", h,
             (double)fxHalfToFloat(b), fxFloatToHalf(fxHalfToFloat(b)));
  }
  /* Known values. */
  FX_CHECK(fxFloatToBf16(1.0f) == 0x3f80, "bf16(1)");
  FX_CHECK(fxFloatToBf16(-2.0f) == 0xc000, "bf16(-2)");
  FX_CHECK(fxFloatToHalf(1.0f) == 0x3c00, "half(1)");
  FX_CHECK(fxFloatToHalf(-2.0f) == 0xc000, "half(-2)");
  FX_CHECK(fxFloatToHalf(65504.0f) == 0x7bff, "half(max)");
  FX_CHECK(fxFloatToHalf(65536.0f) == 0x7c00, "half overflow -> inf");
  FX_CHECK(fxFloatToHalf(5.9604645e-8f) == 0x0001, "half smallest subnormal");
  FX_CHECK(fxHalfToFloat(0x0001) == 5.9604645e-8f, "half subnormal value");
  /* Round to nearest even at the halfway points. */
  FX_CHECK(fxFloatToBf16(1.0f + 1.0f / 256) == 0x3f80, "bf16 tie to even (down)");
  FX_CHECK(fxFloatToBf16(1.0f + 3.0f / 256) == 0x3f82, "bf16 tie to even (up)");
  FX_CHECK(fxFloatToBf16(1.0f + 1.5f / 256) == 0x3f81, "bf16 above tie");
  FX_CHECK(fxFloatToHalf(1.0f + 1.0f / 2048) == 0x3c00, "half tie to even (down)");
  FX_CHECK(fxFloatToHalf(1.0f + 3.0f / 2048) == 0x3c02, "half tie to even (up)");
  FX_CHECK(fxFloatToHalf(2049.0f) == fxFloatToHalf(2048.0f), "half 2049 -> 2048");
  /* fxStore / fxLoad */
  {
    float f32[2];
    uint16_t h16[2];
    fxStore(f32, 1, 0.15625f, dpsFloat32);
    FX_CHECK(fxLoad(f32, 1, dpsFloat32) == 0.15625f, "fp32 store/load");
    fxStore(h16, 1, -3.5f, dpsBfloat16);
    FX_CHECK(h16[1] == fxFloatToBf16(-3.5f) && fxLoad(h16, 1, dpsBfloat16) == -3.5f, "bf16");
    fxStore(h16, 0, 0.75f, dpsFloat16);
    FX_CHECK(h16[0] == 0x3a00 && fxLoad(h16, 0, dpsFloat16) == 0.75f, "fp16");
  }
  return 0;
}

static int testLogitValues(void) {
  const dpsDataType_t dts[3] = {dpsFloat32, dpsBfloat16, dpsFloat16};
  for (int t = 0; t < 3; ++t) {
    const dpsDataType_t dt = dts[t];
    size_t same_col = 0, same_row = 0, same_step = 0, total = 0;
    uint16_t h[1];
    float f[1];
    for (int64_t row = 0; row < 200; ++row)
      for (int64_t col = 0; col < 1000; ++col) {
        const float v = fxLogitValue(row, col, 0, dt);
        /* Exact in its dtype, deterministic. */
        if (dt == dpsFloat32) fxStore(f, 0, v, dt);
        else fxStore(h, 0, v, dt);
        FX_CHECK(fxLoad(dt == dpsFloat32 ? (void*)f : (void*)h, 0, dt) == v,
                 "%s value %g not exact", dpsDataTypeName(dt), (double)v);
        FX_CHECK(v == fxLogitValue(row, col, 0, dt), "not deterministic");
        FX_CHECK(v == v && v != 0.0f, "value %g", (double)v);
        same_col += v == fxLogitValue(row, col + 1, 0, dt);
        same_row += v == fxLogitValue(row + 1, col, 0, dt);
        same_step += v == fxLogitValue(row, col, 1, dt);
        ++total;
      }
    /* bf16 has 4096 distinct values: expect ~total/4096 coincidences. */
    const size_t limit = total / 1000 + 1;
    FX_CHECK(same_col <= limit && same_row <= limit && same_step <= limit,
             "%s: too many equal neighbours: col %zu row %zu step %zu of %zu",
             dpsDataTypeName(dt), same_col, same_row, same_step, total);
    /* Large coordinates (vocab 152064, rows of 512x8) do not collapse. */
    size_t same_far = 0;
    for (int64_t col = 152000; col < 152064; ++col)
      same_far += fxLogitValue(4095, col, 5, dt) == fxLogitValue(4095 - 2048, col, 5, dt);
    FX_CHECK(same_far <= 2, "%s: far rows equal %zu/64", dpsDataTypeName(dt), same_far);
  }
  /* Verify-output values are distinct per coordinate with high probability. */
  size_t eq = 0;
  for (int g = 0; g < 512; ++g)
    for (int d = 0; d < 8; ++d) {
      eq += fxPredictValue(g, d, 0) == fxPredictValue(g, d + 1, 0);
      eq += fxPredictValue(g, d, 0) == fxPredictValue(g + 1, d, 0);
      eq += fxPredictValue(g, d, 0) == fxPredictValue(g, d, 1);
      eq += fxAcceptIndexValue(g, d, 0) == fxAcceptIndexValue(g + 1, d, 0);
      eq += fxLogprobValue(g, d, 0) == fxLogprobValue(g + 1, d, 0);
      eq += fxPredictValue(g, d, 0) == fxAcceptIndexValue(g, d, 0);
    }
  for (int g = 0; g < 512; ++g) eq += fxAcceptLengthValue(g, 0) == fxAcceptLengthValue(g + 1, 0);
  FX_CHECK(eq <= 2, "verify values collide %zu times", eq);
  return 0;
}

/* The onesided window A layout: 256-byte aligned regions in order, the
 * byte count they add up to, and the overflow error onesided_plan.h
 * promises (returned where max_pad_bs x N x the record words overflow). */
static int testOsLayout(void) {
  dpsOsLayout L;
  memset(&L, 0, sizeof L);
  L.tp = 4;
  L.n = 4;
  L.max_pad_bs = 64;
  L.vocab = 4000;
  L.maxb = 16;
  L.ll_bytes = 256 * 1024;
  L.gproto = DPS_OS_PROTO_LL;
  L.gthreads = 256;
  L.rec_words = 154;
  FX_CHECK_OK(dpsOsLayoutInit(&L));
  FX_CHECK(L.cap_out == (16 * 9 + 1) / 2 && L.cap_lp == 16 * 4 / 2 && L.cap_rec == 256 * 77,
           "caps %lld %lld %lld", (long long)L.cap_out, (long long)L.cap_lp, (long long)L.cap_rec);
  FX_CHECK(L.off_fail % 256 == 0 && L.off_gout % 256 == 0 && L.off_glp % 256 == 0 &&
               L.off_rec % 256 == 0 && L.off_fail < L.off_gout && L.off_gout < L.off_glp &&
               L.off_glp < L.off_rec,
           "offsets %zu %zu %zu %zu", L.off_fail, L.off_gout, L.off_glp, L.off_rec);
  FX_CHECK(L.off_glp - L.off_gout >= 2u * 4 * (size_t)L.cap_out * DPS_PEER_LL_LINE_BYTES &&
               L.off_rec - L.off_glp >= 2u * 4 * (size_t)L.cap_lp * DPS_PEER_LL_LINE_BYTES &&
               L.bytes_a == L.off_rec + 2u * 4 * (size_t)L.cap_rec * 16u,
           "regions do not hold their staging");
  L.max_pad_bs = 1 << 30;
  L.n = 1 << 30;
  FX_CHECK_ERR(dpsOsLayoutInit(&L), dpsInvalidArgument, "window A");
  FX_CHECK(strstr(dpsGetLastError(), "overflows") != NULL, "message: %s", dpsGetLastError());
  return 0;
}

int main(void) {
  if (testConversions()) return 1;
  if (testOsLayout()) return 1;
  if (testLogitValues()) return 1;
  const dpsDataType_t dts[3] = {dpsFloat32, dpsBfloat16, dpsFloat16};
  struct { int pad_bs, n; int64_t vpr; } shapes[] = {
      /* pad_bs, n, vocab per rank */
      {8, 1, 32}, {8, 4, 32}, {16, 2, 7}, {24, 3, 17}, {40, 1, 1}, {8, 8, 100},
  };
  int failures = 0;
  for (int tp = 1; tp <= MAXTP; ++tp)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
      if (shapes[i].pad_bs % tp) continue;
      for (int t = 0; t < 3; ++t)
        failures += testSwap(tp, shapes[i].pad_bs, shapes[i].n, shapes[i].vpr * tp, dts[t]);
    }
  /* Spec shapes with their literal vocab. */
  for (int tp = 1; tp <= MAXTP; tp *= 2) {
    failures += testSwap(tp, 8, 1, 64, dpsBfloat16);
    failures += testSwap(tp, 8, 4, 64, dpsFloat32);
  }
  for (int tp = 1; tp <= MAXTP; ++tp) {
    const int pads[] = {8, 16, 24, 64, 512};
    for (int p = 0; p < 5; ++p) {
      if (pads[p] % tp) continue;
      for (int n = 1; n <= 8; ++n) failures += testVerify(tp, pads[p], n);
    }
  }
  /* Overflow helper. */
  {
    uint64_t out = 0;
    FX_CHECK(dpsMulOk(1ull << 32, 1ull << 31, &out) && out == 1ull << 63, "mul ok");
    FX_CHECK(!dpsMulOk(1ull << 32, 1ull << 32, &out), "mul overflow");
    FX_CHECK(dpsMulOk(0, UINT64_MAX, &out) && out == 0, "mul zero");
    FX_CHECK(dpsMakeShape(2, 0, 8, 3, 2, 4).packed == 28, "packed elems");
  }
  if (failures) {
    fprintf(stderr, "test_layout: %d failures\n", failures);
    return 1;
  }
  printf("test_layout: OK\n");
  return 0;
}
