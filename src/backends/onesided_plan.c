/* Host-side planning of the onesided backend: see onesided_plan.h. */
#include "onesided_plan.h"

#include <stdint.h>
#include <string.h>

#include "internal.h"


static int clampGrid(uint64_t want, int cap) {
  if (want < 1) return 1;
  return want > (uint64_t)cap ? cap : (int)want;
}

/* Byte arithmetic that remembers an overflow (*ovf = 1) instead of wrapping. */
static size_t mulc(size_t a, size_t b, int* ovf) {
  uint64_t r;
  if (!dpsMulOk(a, b, &r) || r > (uint64_t)SIZE_MAX) {
    *ovf = 1;
    return 0;
  }
  return (size_t)r;
}
static size_t addc(size_t a, size_t b, int* ovf) {
  if (b > SIZE_MAX - 255 || a > SIZE_MAX - 255 - b) { /* room for a 256-byte rounding */
    *ovf = 1;
    return 0;
  }
  return a + b;
}

dpsResult_t dpsOsLayoutInit(dpsOsLayout* L) {
  const size_t max_reqs = (size_t)(L->max_pad_bs / L->tp);
  const size_t tp = (size_t)L->tp, n = (size_t)L->n;
  int ovf = 0;
  /* the close exchange's words: in [1], out [DPS_PEER_MAX_RANKS] */
  L->close_bytes = dpsRoundUp(sizeof(uint32_t) * (1 + DPS_PEER_MAX_RANKS), 256);

  /* window A */
  const size_t lineVals =
      L->gproto == DPS_OS_PROTO_LL128 ? DPS_OS_LL128_LINE_VALUES : DPS_PEER_LL_LINE_VALUES;
  const size_t lineBytes =
      L->gproto == DPS_OS_PROTO_LL128 ? DPS_OS_LL128_LINE_BYTES : DPS_PEER_LL_LINE_BYTES;
  const size_t outVals = mulc(max_reqs, addc(mulc(2, n, &ovf), 1, &ovf), &ovf);
  L->cap_out = (int64_t)((outVals + lineVals - 1) / lineVals);
  L->cap_lp = (int64_t)((mulc(max_reqs, n, &ovf) + lineVals - 1) / lineVals);
  const size_t flags = DPS_OS_FLAG_WORDS(L->tp, L->maxb) * 8u;
  L->off_fail = dpsRoundUp(flags, 256);
  L->off_gout = L->off_fail + dpsRoundUp(DPS_PEER_MAX_RANKS * sizeof(unsigned long long), 256);
  const size_t gout = mulc(mulc(2 * tp, (size_t)L->cap_out, &ovf), lineBytes, &ovf);
  L->off_glp = dpsRoundUp(addc(L->off_gout, gout, &ovf), 256);
  /* records (argmax, top-k, sample): LL lines of two words */
  const size_t recRows = mulc((size_t)L->max_pad_bs, n, &ovf);
  L->cap_rec = (int64_t)mulc(recRows, (size_t)(L->rec_words / 2), &ovf);
  const size_t glp = mulc(mulc(2 * tp, (size_t)L->cap_lp, &ovf), lineBytes, &ovf);
  L->off_rec = dpsRoundUp(addc(L->off_glp, glp, &ovf), 256);
  const size_t rec = mulc(mulc(2 * tp, (size_t)L->cap_rec, &ovf), 16u, &ovf);
  L->bytes_a = addc(L->off_rec, rec, &ovf);
  if (ovf || L->cap_rec < 0 || L->cap_out < 0)
    return dpsSetError(dpsInvalidArgument,
                       "onesided: the byte count of window A (max_pad_bs=%d, N=%d, tp=%d, records "
                       "of %d words) overflows",
                       L->max_pad_bs, L->n, L->tp, L->rec_words);
  return dpsSuccess;
}

dpsResult_t dpsOsLayoutPrepare(dpsOsLayout* L, size_t esize) {
  uint64_t rowsN, outBytes;
  if (!dpsMulOk((uint64_t)(L->max_pad_bs / L->tp), (uint64_t)L->n, &rowsN) ||
      !dpsMulOk(rowsN, (uint64_t)L->vocab, &outBytes) || !dpsMulOk(outBytes, esize, &outBytes))
    return dpsSetError(dpsInvalidArgument, "onesided: swap output size overflows");
  const uint64_t chunk = outBytes / (uint64_t)L->tp; /* per-peer chunk at max_pad_bs */
  const uint64_t llMax = L->ll_bytes < chunk ? L->ll_bytes : chunk;
  L->esize = esize;
  L->cap_sw = (int64_t)((llMax + 7) / 8);
  L->off_swll = dpsRoundUp((size_t)outBytes, 256);
  L->bytes_b = L->off_swll + 2u * (size_t)L->tp * (size_t)L->cap_sw * 16u;
  return dpsSuccess;
}

dpsOsCloseWords dpsOsCloseWordsAt(void* close) {
  dpsOsCloseWords w;
  w.in = (uint32_t*)close;
  w.out = w.in + 1;
  return w;
}

dpsPeerCommon dpsOsMakeCommon(const dpsOsLayout* L, const dpsOsWindows* a, dpsPeerDevState* state,
                            unsigned long long* host_err_dev, int timeout_ms, int pdl) {
  dpsPeerCommon c;
  c.tp = L->tp;
  c.rank = L->rank;
  c.state = state;
  c.host_err = host_err_dev;
  c.timeout_ns = (unsigned long long)(timeout_ms > 0 ? timeout_ms : 1) * 1000000ull;
  c.pdl = pdl;
  c.fail = (const unsigned long long*)((const char*)a->base + L->off_fail);
  for (int r = 0; r < DPS_PEER_MAX_RANKS; ++r)
    c.fail_peer[r] = r < L->tp ? (unsigned long long*)(a->peer[r] + L->off_fail) : NULL;
  return c;
}

void dpsOsPlanSwap(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                   const dpsOsWindows* b, const void* in, const dpsShape* sh,
                   dpsOsSwapArgs* args, dpsOsSwapPlan* plan) {
  const uintptr_t addr = (uintptr_t)in;
  memset(args, 0, sizeof *args);
  args->c = *c;
  args->in = (const char*)in;
  args->out = b->base;
  args->flags = (unsigned long long*)a->base;
  args->ll = b->base + L->off_swll;
  for (int r = 0; r < L->tp; ++r) {
    args->out_peer.p[r] = b->peer[r];
    args->flags_peer.p[r] = a->peer[r];
    args->ll_peer.p[r] = b->peer[r] + L->off_swll;
  }
  args->rows = sh->rows_per_rank;
  args->row_bytes = sh->v_local * (long long)sh->esize;
  args->out_row_bytes = sh->vocab * (long long)sh->esize;
  args->ll_cap = L->cap_sw;
  args->max_blocks = L->maxb;
  const uint64_t S = (uint64_t)args->rows * (uint64_t)args->row_bytes; /* per-peer chunk */
  const uint64_t C = (uint64_t)args->row_bytes;

  if (S <= L->ll_bytes && (S + 7) / 8 <= (uint64_t)L->cap_sw) {
    plan->path = 1;
    plan->width = (C % 8 == 0 && addr % 8 == 0) ? 8 : (C % 4 == 0 && addr % 4 == 0) ? 4 : 2;
    plan->grid = clampGrid(((S + 7) / 8 + DPS_OS_LL_LINES_PER_BLOCK - 1) / DPS_OS_LL_LINES_PER_BLOCK,
                           L->maxb);
  } else {
    plan->path = 0;
    plan->width = (C % 16 == 0 && addr % 16 == 0) ? 16
                  : (C % 8 == 0 && addr % 8 == 0) ? 8
                  : (C % 4 == 0 && addr % 4 == 0) ? 4
                                                  : 2;
    plan->grid =
        clampGrid((S + DPS_OS_DIRECT_BYTES_PER_BLOCK - 1) / DPS_OS_DIRECT_BYTES_PER_BLOCK, L->maxb);
  }
}

/* The parts every gather shares: staging, capacity, total, grid. */
static int planGather(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                      size_t off, int64_t cap, dpsOsGatherArgs* args) {
  args->c = *c;
  args->stage = a->base + off;
  for (int r = 0; r < L->tp; ++r) args->stage_peer.p[r] = a->peer[r] + off;
  args->cap = cap;
  args->total = args->count[0] + args->count[1] + args->count[2];
  /* Each block keeps its own epoch over a fixed set of lines: the grid is a
   * function of the capacity only. */
  const int cap_blocks = L->maxb < DPS_PEER_GATHER_MAX_BLOCKS ? L->maxb : DPS_PEER_GATHER_MAX_BLOCKS;
  const uint64_t threads = (uint64_t)cap * (L->gproto == DPS_OS_PROTO_LL128 ? 8u : 1u);
  return clampGrid((threads + (uint64_t)L->gthreads - 1) / (uint64_t)L->gthreads, cap_blocks);
}

int dpsOsPlanGatherOutputs(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                           const dpsVerifyOutputs* out, const int32_t* predict,
                           const int32_t* accept_index, const int32_t* accept_length,
                           const dpsShape* sh, dpsOsGatherArgs* args) {
  memset(args, 0, sizeof *args);
  args->op = DPS_PEER_OP_GATHER_OUTPUTS;
  args->nseg = 3;
  args->in[0] = (const uint32_t*)predict;
  args->in[1] = (const uint32_t*)accept_index;
  args->in[2] = (const uint32_t*)accept_length;
  args->out[0] = (uint32_t*)out->predict;
  args->out[1] = (uint32_t*)out->accept_index;
  args->out[2] = (uint32_t*)out->accept_length;
  args->count[0] = sh->rows_per_rank;
  args->count[1] = sh->rows_per_rank;
  args->count[2] = sh->reqs;
  return planGather(L, c, a, L->off_gout, L->cap_out, args);
}

int dpsOsPlanGatherLogprobs(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                            const dpsVerifyOutputs* out, const float* in, const dpsShape* sh,
                            dpsOsGatherArgs* args) {
  memset(args, 0, sizeof *args);
  args->op = DPS_PEER_OP_GATHER_LOGPROBS;
  args->nseg = 1;
  /* one segment: the unused slots repeat it (count 0), so that the kernels'
   * segment selects never form a pointer from NULL */
  args->in[0] = args->in[1] = args->in[2] = (const uint32_t*)in;
  args->out[0] = args->out[1] = args->out[2] = (uint32_t*)out->logprobs;
  args->count[0] = sh->rows_per_rank;
  return planGather(L, c, a, L->off_glp, L->cap_lp, args);
}

int dpsOsPlanCloseExchange(const dpsOsLayout* L, const dpsPeerCommon* c, const dpsOsWindows* a,
                           const dpsOsCloseWords* w, dpsOsGatherArgs* args) {
  memset(args, 0, sizeof *args);
  args->op = DPS_PEER_OP_GATHER_LOGPROBS;
  args->nseg = 1;
  args->in[0] = args->in[1] = args->in[2] = w->in;
  args->out[0] = args->out[1] = args->out[2] = w->out;
  args->count[0] = 1;
  return planGather(L, c, a, L->off_glp, L->cap_lp, args);
}
