/* dpsSample's kernels (interface and steps: sample_kernels.h; design:
 * docs/sampling.md).
 *
 * Everything that decides a token is a function of the full row, computed so
 * that no result depends on how the vocabulary is split or in which order
 * partial results meet: maxima and race winners (ties to the lower index),
 * counts, and masses as integers (fixed point). Masses:
 *  - the first pass cannot know the row's maximum, so it sums
 *    t = 2^(y - 16b) * 2^20 (y = score * log2 e, b = floor(y / 16)) per
 *    absolute bucket b, keeping the 4 highest buckets (Zb, sample_zsum.h): the merge adds
 *    the integer sums bucket by bucket, so Z is the same integer at every tp;
 *  - once the maximum lmax is known (the merge, the searches), a kept index
 *    weighs massTerm = 2^((l - lmax) * log2(e) / T) * 2^40, rounded down.
 * The noise is sample_rng.h's, bit for bit the host reference's. */
#include "kernels/device.cuh"
#include "kernels/sample_row.cuh"     /* constants, parameters, Zb, Hdr */
#include "kernels/sample_race.cuh"    /* the race, the first pass's visit */
#include "kernels/sample_search.cuh"  /* the exact path's searches */

namespace {

/* ---- outputs ----------------------------------------------------------------------- */
__device__ __forceinline__ void count(const dpsSampleArgs& a, int path) {
  unsigned long long* c = path == PATH_GREEDY  ? &a.s.counters->rows_greedy
                          : path == PATH_FAST ? &a.s.counters->rows_fast
                                              : &a.s.counters->rows_exact;
  atomicAdd(c, 1ull);
}

/* The logprob as (val - lmax) - lse_rel: the difference of two floats is
 * exact in double, so that a row whose maximum dwarfs its log-sum (a row of
 * -FLT_MAX masks) keeps the log-sum's few nats. */
__device__ __forceinline__ void writeToken(const dpsSampleArgs& a, long long row, uint32_t idx,
                                           float val, float lmax, double lse_rel) {
  a.tokens[row] = (int64_t)idx;
  if (a.logprobs) a.logprobs[row] = (float)(((double)val - (double)lmax) - lse_rel);
}

/* logsumexp over A less lmax, from the sum of exp(l) (T = 1): in units of
 * the maximum's own term (its y + ylo as the first pass summed it), so that
 * the term's rounding and clamp at large logits cancel: beyond about 2.3e7
 * y carries no residual and beyond 1.2e13 it is clamped, where the sum's
 * log less lmax * log2(e) was off by up to its whole rounding. NaN for a
 * +inf maximum (log_softmax's inf - inf). */
__device__ __forceinline__ double lseRel(const Hdr& h) {
  if (h.lmax == INFINITY) return NAN;
  const dpsZsScale one = dpsZsScaleOf(1.f);
  float ylo;
  const float y = dpsZsY(h.lmax, one.hi, one.lo, &ylo);
  return dpsZsLog2Rel(h.zraw.b, zFixed(h.zraw), y, ylo) * 0.6931471805599453;
}

/* Whether the row's first pass is the lean one (FirstVisit's LEAN): a race
 * row (no top-k, no top-p; min-p may be on) without logprob whose race
 * bound prunes. Its record counts no valid columns. */
__device__ __forceinline__ bool leanRow(const dpsSampleArgs& a, const RowP& q) {
  return q.T != 0.f && !(q.k > 0) && !(q.top_p < 1.f) && !a.want_logprob && Race::prunes(q.T);
}

/* Whether the row needs no more than its record's race winner under min-p
 * (the winner kept, the row all +inf-led or without a valid column): the
 * same test as decide()'s (minpKey's order is min-p's, monotone in the
 * logit). Every thread of the block computes it alike. */
__device__ __forceinline__ bool minpKeepsWinner(const Hdr& h, const RowP& q) {
  if (h.ridx == NO_INDEX || h.lmax == INFINITY) return true;
  return dpsSampleMinPKeep(h.rval, h.lmax, q.T, dpsLogDet((double)q.min_p));
}

/* ---- the decision from the merged first record (one warp) -------------------------- */
/* Draws the row when the first record proves its kept set (writes the output
 * unless `bad`), else fills *st for the searches. Returns the path. */
__device__ int decide(const dpsSampleArgs& a, long long row, const RowP& q, const Hdr& h,
                      const u64* sel, bool bad, SState* st) {
  const int lane = threadIdx.x & 31;
  const double lse_rel = a.want_logprob ? lseRel(h) : NAN;
  auto finish = [&](uint32_t idx, float val, int path) {
    if (lane == 0 && !bad) writeToken(a, row, idx, val, h.lmax, lse_rel);
    return path;
  };
  if (h.cnt == 0u) {
    if (lane == 0 && !bad) {
      a.tokens[row] = 0;
      if (a.logprobs) a.logprobs[row] = -INFINITY;
    }
    return PATH_GREEDY;
  }
  /* greedy before +inf: a greedy row counts greedy whatever it holds (the
   * token is the argmax either way, the logprob NaN) */
  if (q.T == 0.f) return finish(h.aidx, h.lmax, PATH_GREEDY);
  if (h.lmax == INFINITY) return finish(h.aidx, h.lmax, PATH_FAST); /* logprob NaN */
  /* valid columns; a lean row's record has no count (only min-p reads it
   * below: a lean row has no top-k): its valid candidates, one more when
   * they fill the list (then maybe more exist, which the min-p test below
   * takes as possible); a temperature-only row does not read the list */
  long long nA = h.cnt;
  if (leanRow(a, q) && q.min_p > 0.f) {
    const bool v0 = lane < a.cand && packedKey(sel[lane]) > KEY_NEG_INF;
    const bool v1 = lane + 32 < a.cand && packedKey(sel[lane + 32]) > KEY_NEG_INF;
    nA = __popc(__ballot_sync(0xffffffffu, v0)) + __popc(__ballot_sync(0xffffffffu, v1));
    if (nA == a.cand) ++nA;
  }
  const bool topk_on = q.k > 0 && q.k < nA, topp_on = q.top_p < 1.f, minp_on = q.min_p > 0.f;
  const float smax = dpsSampleScore(h.lmax, q.T);
  const MassScale ms = massScale(h.lmax, q.T);
  /* an infinite largest score (either sign) skips top-p, as the reference */
  const bool topp = topp_on && smax > -INFINITY && smax < INFINITY;
  SState s;
  s.round = 0;
  s.has_thr = 0;
  s.qall = 0;
  s.whole = 0u;
  s.prefix = 0u;
  s.tkey = 0u;
  s.need = 0ull;
  s.above = 0ull;
  s.P = 0ull;
  s.lmax = h.lmax;
  s.T = q.T;
  s.top_p = q.top_p;
  s.mc = ms.c;
  s.lse_rel = lse_rel;
  s.seed = q.seed;
  s.offset = q.offset;
  s.topp_after = topp;
  s.mpkey = minp_on ? minpKey(h.lmax, q.T, q.min_p) : KEY_NEG_INF + 1u;
  /* the searches stop at the dtype's last significant bit (a soft-cap's
   * values have all 32) */
  s.zb = a.xf.cap > 0.f ? 0 : a.dtype == 1 ? 16 : a.dtype == 2 ? 13 : 0;
  for (int r = 0; r < DPS_PEER_MAX_RANKS; ++r) s.quota[r] = 0u;
  auto exact = [&](int mode) {
    s.mode = mode;
    if (mode == MODE_K) s.need = (u64)q.k;
    if (lane == 0) *st = s;
    return PATH_EXACT;
  };
  if (!topk_on && !topp_on && !minp_on) {
    if (h.ridx != NO_INDEX) return finish(h.ridx, h.rval, PATH_FAST);
    return exact(MODE_RACE);
  }
  /* min-p alone: the race winner over every valid column, when min-p keeps
   * it, is the kept set's (the first pass may then have collected no
   * candidates: minpKeepsWinner) */
  if (!topk_on && !topp_on && h.ridx != NO_INDEX && orderKey(h.rval) >= s.mpkey)
    return finish(h.ridx, h.rval, PATH_FAST);
  /* the candidates: the row's best min(cand, nA), best first */
  const int ncand = (int)(nA < a.cand ? nA : a.cand);
  uint32_t ck[2], ci[2];
  float cv[2];
  bool cm[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int j = lane + 32 * u;
    const u64 p = j < ncand ? sel[j] : 0ull;
    ck[u] = packedKey(p);
    ci[u] = packedIdx(p);
    cv[u] = packedValue(p);
    cm[u] = j < ncand && ck[u] >= s.mpkey;
  }
  const int n_minp = __popc(__ballot_sync(0xffffffffu, cm[0])) +
                     __popc(__ballot_sync(0xffffffffu, cm[1]));
  /* min-p's set beyond the candidates? (it is a prefix of the order) */
  const bool minp_big = minp_on ? (n_minp == ncand && nA > ncand) : nA > ncand;
  const long long ak = topk_on ? q.k : nA;
  long long nS;
  bool known;
  if (!minp_big) {
    const long long b = minp_on ? n_minp : nA;
    nS = ak < b ? ak : b;
    known = nS <= ncand;
  } else {
    nS = ak;
    known = ak <= ncand;
  }
  /* masses of the candidates in the kept order: massTerm, exclusive prefix */
  auto prefixKeep = [&](long long n, u64 P, int* nk, bool* reached) {
    u64 t[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = lane + 32 * u;
      t[u] = j < n ? massTerm(cv[u], ms) : 0ull;
    }
    /* inclusive scan over j = lane (u = 0), then 32 + lane (u = 1) */
    u64 inc0 = t[0], inc1 = t[1];
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y0 = __shfl_up_sync(0xffffffffu, inc0, o);
      const u64 y1 = __shfl_up_sync(0xffffffffu, inc1, o);
      if (lane >= o) {
        inc0 += y0;
        inc1 += y1;
      }
    }
    const u64 tot0 = __shfl_sync(0xffffffffu, inc0, 31);
    inc1 += tot0;
    const u64 before0 = inc0 - t[0], before1 = inc1 - t[1];
    const bool k0 = lane < n && before0 < P, k1 = lane + 32 < n && before1 < P;
    *nk = __popc(__ballot_sync(0xffffffffu, k0)) + __popc(__ballot_sync(0xffffffffu, k1));
    /* reached: some candidate's mass before it is >= P (the nucleus ends here) */
    const bool r0 = lane < n && before0 >= P, r1 = lane + 32 < n && before1 >= P;
    *reached = __any_sync(0xffffffffu, r0 || r1);
  };
  auto raceCand = [&](int nk) {
    float bk = -INFINITY;
    uint32_t bi = NO_INDEX;
    float bv = -INFINITY;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = lane + 32 * u;
      if (j < nk) {
        const float k = exactKey(cv[u], q.T, q.seed, q.offset, ci[u]);
        if (raceBetter(k, ci[u], bk, bi)) {
          bk = k;
          bi = ci[u];
          bv = cv[u];
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float k2 = __shfl_down_sync(0xffffffffu, bk, o);
      const uint32_t i2 = __shfl_down_sync(0xffffffffu, bi, o);
      const float v2 = __shfl_down_sync(0xffffffffu, bv, o);
      if (raceBetter(k2, i2, bk, bi)) {
        bk = k2;
        bi = i2;
        bv = v2;
      }
    }
    bi = __shfl_sync(0xffffffffu, bi, 0);
    bv = __shfl_sync(0xffffffffu, bv, 0);
    return finish(bi, bv, PATH_FAST);
  };
  if (known) {
    int nk = (int)nS;
    if (topp) {
      u64 t[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int j = lane + 32 * u;
        t[u] = j < nS ? massTerm(cv[u], ms) : 0ull;
      }
      u64 Z = t[0] + t[1];
      for (int o = 16; o > 0; o >>= 1) Z += __shfl_xor_sync(0xffffffffu, Z, o);
      bool reached;
      prefixKeep(nS, ceilMass((double)q.top_p * (double)Z), &nk, &reached);
    }
    return raceCand(nk);
  }
  if (!topp) {
    if (topk_on && q.k > ncand) return exact(MODE_K);
    /* min-p's set is large and nothing else cuts: the whole shard's race
     * winner is the answer when min-p keeps it */
    if (h.ridx != NO_INDEX && orderKey(h.rval) >= s.mpkey) return finish(h.ridx, h.rval, PATH_FAST);
    return exact(MODE_RACE);
  }
  /* S is every valid index: Z from the first pass's buckets, in massTerm's
   * scale (2^40 at the maximum, whose y + ylo the first pass summed). Only
   * where every term that counts (y within 4 buckets of the maximum's) had
   * its residual: beyond 2^21 y is rounded to a quarter or more, 16 times
   * that in a term's log2, which massTerm's prefix would compare with a Z
   * off by as much (scores beyond about 2.3e7: the exact path's masses) */
  if (!topk_on && !minp_on && h.zs.b != ZB_NONE) {
    const dpsZsScale sc = dpsZsScaleOf(q.T);
    float ylo;
    const float ymax = dpsZsY(h.lmax, sc.hi, sc.lo, &ylo);
    if (fabs((double)ymax) + 4.0 < (double)DPS_ZACC_EXACT) {
      const u64 Zf = zFixed(h.zs);
      const double ex = dpsZsBucketRel(h.zs.b, ymax, ylo) + (double)(40 - DPS_ZACC_UNIT);
      const double ie = floor(ex);
      const double z = ldexp((double)Zf * exp2(ex - ie), (int)fmax(fmin(ie, 4000.0), -4000.0));
      const u64 P = ceilMass((double)q.top_p * z);
      int nk;
      bool reached;
      prefixKeep(ncand, P, &nk, &reached);
      if (reached) return raceCand(nk);
      return exact(MODE_P);
    }
  }
  return exact(topk_on && q.k > ncand ? MODE_K : MODE_P);
}

/* ---- records ------------------------------------------------------------------------ */
__device__ void recEmit(const dpsRecSink& k, long long row, int words, const uint32_t* w, u64 e) {
  if (k.kind == DPS_REC_PLAIN) {
    for (int i = threadIdx.x; i < words; i += blockDim.x) k.plain[row * words + i] = w[i];
    return;
  }
  const int lines = words / 2;
  const uint32_t flag = llFlag(e);
  for (int l = threadIdx.x; l < lines; l += blockDim.x) {
    const size_t off = DPS_PEER_LL_OFFSET((int)(e & 1), k.c.rank, row * lines + l, k.c.tp, k.cap);
    for (int r = 0; r < k.c.tp; ++r) stLine(k.stage_peer.p[r] + off, w[2 * l], w[2 * l + 1], flag);
  }
}

/* Every rank's record of `row` into dst[r * words + w]; false (block-uniform)
 * when a wait gave up. */
__device__ bool recFetch(const dpsRecSource& s, int tp, long long rows, long long row, int words,
                         uint32_t* dst, u64 e) {
  if (!s.ll) {
    for (int i = threadIdx.x; i < tp * words; i += blockDim.x) {
      const int r = i / words, w = i % words;
      dst[i] = s.gathered[((size_t)r * (size_t)rows + (size_t)row) * (size_t)words + w];
    }
    __syncthreads();
    return true;
  }
  const int lines = words / 2;
  const uint32_t flag = llFlag(e);
  const u64 t0 = globalTimer();
  int bad = 0;
  for (int i = threadIdx.x; i < tp * lines && !bad; i += blockDim.x) {
    const int r = i / lines, l = i % lines;
    const char* pl = s.stage + DPS_PEER_LL_OFFSET((int)(e & 1), r, row * lines + l, tp, s.cap);
    unsigned n = 0;
    uint4 v = ldLine(pl);
    while (v.y != flag || v.w != flag) {
      if ((++n & 127u) == 0 && spinExpired(s.c, t0, s.op, r, DPS_PEER_WAIT_DATA)) {
        bad = 1;
        break;
      }
      v = ldLine(pl);
    }
    dst[r * words + 2 * l] = v.x;
    dst[r * words + 2 * l + 1] = v.z;
  }
  return !__syncthreads_or(bad);
}

__device__ __forceinline__ SState* stateOf(const dpsSampleArgs& a, long long row) {
  return reinterpret_cast<SState*>((char*)a.s.state + (size_t)row * DPS_SAMPLE_STATE_BYTES);
}

__device__ __forceinline__ const char* rowPtr(const dpsSampleArgs& a, long long row) {
  const int esize = a.dtype == 0 ? 4 : 2;
  return (const char*)a.logits + (size_t)row * (size_t)a.cols * (size_t)esize;
}

/* The searches (digits D) and the race of one row on this block alone
 * (tp == 1). SEARCH false: rows without top-k, top-p or min-p (the RACE
 * kernel's), whose exact path is the race alone; the search's code left out
 * of that kernel keeps its hot pass's code generation to itself. */
template <typename X, class D, bool SEARCH = true>
__device__ void exactLocal(const dpsSampleArgs& a, long long row, SState* st, bool bad) {
  const char* rowp = rowPtr(a, row);
  const X xf = rowXform<X>(a, row);
  if constexpr (SEARCH) {
    __shared__ u64 s_bins[D::BINS], s_tot[D::BINS];
    const ArrayBins rb{s_bins, D::BINS};
    while (st->mode == MODE_K || st->mode == MODE_P) {
      histPass<D>(*st, rowp, a.dtype, 0, a.nvalid, xf, s_bins);
      searchTotals<D>(*st, rb, 1, s_tot);
      if (threadIdx.x < 32) searchMerge<D>(*st, rb, 1, s_tot);
      __syncthreads();
    }
  }
  float bk, bv;
  uint32_t bi;
  racePass(*st, rowp, a.dtype, a.col0, 0, a.nvalid, 0, xf, &bk, &bi, &bv);
  if (threadIdx.x == 0 && !bad) writeToken(a, row, bi == NO_INDEX ? 0u : bi, bv, st->lmax, st->lse_rel);
}

/* The draw of a row from its merged first record (in shared memory): the
 * fast path here; at tp == 1 the exact path on this block, or its state for
 * the exact kernel (a.exact_clusters > 0: every row's state is written, the
 * others' as done); at tp > 1 the row's state for the next steps. Nothing is
 * written when `bad`. */
template <typename X, int KERNEL>
__device__ __noinline__ void drawRow(const dpsSampleArgs& a, long long row, const RowP& q,
                                    const Hdr& h, const u64* sel, bool bad) {
  __shared__ SState s_st;
  __shared__ int s_path;
  if (threadIdx.x < 32) {
    s_st.mode = MODE_DONE;
    __syncwarp();
    const int path = decide(a, row, q, h, sel, bad, &s_st);
    if (threadIdx.x == 0) s_path = path;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (!bad) count(a, s_path);
    if (s_path != PATH_EXACT || bad) s_st.mode = MODE_DONE; /* nothing more is drawn */
    if (a.tp > 1 || a.exact_clusters > 0) {
      if (s_st.mode == MODE_DONE) stateOf(a, row)->mode = MODE_DONE;
      else *stateOf(a, row) = s_st;
      if (a.tp == 1 && s_st.mode != MODE_DONE) atomicAdd(a.s.exact_pending, 1u);
    }
  }
  __syncthreads();
  if (a.tp == 1 && a.exact_clusters == 0 && s_st.mode != MODE_DONE)
    exactLocal<X, RecordDigits, KERNEL != DPS_SAMPLE_FIRST_RACE>(a, row, &s_st, bad);
}

/* ---- the kernels --------------------------------------------------------------------- */
/* The first pass of item = row * chunks + chunk; the last chunk of a row to
 * finish merges the chunks' records and emits the row's record, or at
 * tp == 1 draws the row itself. */
template <typename X, int KERNEL>
__device__ __forceinline__ void firstItem(const dpsSampleArgs& a, long long item, u64 e,
                                          bool bad) {
  __shared__ Hdr s_hdr;
  __shared__ u64 s_sel[CAND];
  __shared__ u64 s_lists[DPS_SAMPLE_MAX_CHUNKS * CAND];
  __shared__ uint32_t s_rec[DPS_SAMPLE_MAX_WORDS];
  __shared__ int s_last;
  const long long row = item / a.chunks;
  const int chunk = (int)(item % a.chunks);
  const RowP q = rowParamsDefined(a.p, row);
  const bool greedy = q.T == 0.f;
  const bool topk_on = q.k > 0, topp_on = q.top_p < 1.f, minp_on = q.min_p > 0.f;
  const bool cand = a.cand > 0 && !greedy && (topk_on || topp_on || minp_on);
  const bool race = !greedy && !topk_on && !topp_on;
  const bool zs = !greedy && topp_on && !minp_on && !(q.k >= 1 && q.k <= CAND);
  const char* rowp = rowPtr(a, row);
  const X xf = rowXform<X>(a, row);
  long long from, to;
  chunkRange(a.nvalid, a.chunks, chunk, &from, &to);
  float tmax;
  /* race (no top-k, no top-p) and zs (top-p) never meet; a race row
   * without logprob whose bound prunes takes the lean pass (leanRow; a
   * min-p row's candidates then follow it); in the TILED kernel the candidates of rows
   * without the race come from the tile maxima. Each kernel instantiates
   * only the passes its calls may run (the RACE kernel's calls have no
   * candidates and no logprob), and its own copy of them. */
  constexpr bool TILED = KERNEL == DPS_SAMPLE_FIRST_TILED;
  constexpr bool ONLY_RACE = KERNEL == DPS_SAMPLE_FIRST_RACE;
  const bool lean = race && leanRow(a, q);
  const bool tiled = TILED && cand && !race;
  const int sel =
      lean ? 8 : (race ? 4 : 0) | (a.want_logprob ? 2 : 0) | (zs ? 1 : 0) | (tiled ? 16 : 0);
#define DPS_FIRST_VISIT(R, ZR, ZS_, L, T) \
  firstVisit<R, ZR, ZS_, L, T, KERNEL>(rowp, a.dtype, a.col0, from, to, q, xf, &s_hdr, &tmax)
  if constexpr (ONLY_RACE) { /* greedy rows, race rows without min-p */
    switch (sel) {
      case 8: DPS_FIRST_VISIT(true, false, false, true, false); break;
      case 4: DPS_FIRST_VISIT(true, false, false, false, false); break;
      default: DPS_FIRST_VISIT(false, false, false, false, false); break;
    }
  } else {
    switch (sel) {
      case 0: DPS_FIRST_VISIT(false, false, false, false, false); break;
      case 1: DPS_FIRST_VISIT(false, false, true, false, false); break;
      case 2: DPS_FIRST_VISIT(false, true, false, false, false); break;
      case 3: DPS_FIRST_VISIT(false, true, true, false, false); break;
      case 16: if constexpr (TILED) DPS_FIRST_VISIT(false, false, false, false, true); break;
      case 17: if constexpr (TILED) DPS_FIRST_VISIT(false, false, true, false, true); break;
      case 18: if constexpr (TILED) DPS_FIRST_VISIT(false, true, false, false, true); break;
      case 19: if constexpr (TILED) DPS_FIRST_VISIT(false, true, true, false, true); break;
      case 4: DPS_FIRST_VISIT(true, false, false, false, false); break;
      case 8: DPS_FIRST_VISIT(true, false, false, true, false); break;
      default: DPS_FIRST_VISIT(true, true, false, false, false); break;
    }
  }
#undef DPS_FIRST_VISIT
  /* tp == 1, a block per row: a lean min-p row whose race winner min-p
   * keeps is drawn from it (decide), so its candidates are not collected */
  const bool collect = cand && !(lean && minp_on && a.tp == 1 && a.chunks == 1 &&
                                 minpKeepsWinner(s_hdr, q));
  if (!ONLY_RACE && collect) {
    topkRangeFromMax(CAND, a.dtype, a.col0, rowp, from, to, tmax, s_sel, tiled, xf);
  } else {
    for (int j = threadIdx.x; j < CAND; j += blockDim.x) s_sel[j] = 0ull;
    __syncthreads();
  }
  const int words = DPS_SAMPLE_FIRST_WORDS(a.cand);
  if (a.chunks > 1) {
    /* this chunk's record into the partials; the last chunk merges them */
    uint32_t* part = a.s.partial + (size_t)item * DPS_SAMPLE_MAX_WORDS;
    if (threadIdx.x == 0) hdrPack(s_hdr, part);
    for (int j = threadIdx.x; j < a.cand; j += blockDim.x) {
      part[HDR + 2 * j] = (uint32_t)s_sel[j];
      part[HDR + 2 * j + 1] = (uint32_t)(s_sel[j] >> 32);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned t = atomicAdd(&a.s.tickets[row], 1u);
      s_last = t == (unsigned)a.chunks - 1u;
      if (s_last) a.s.tickets[row] = 0u;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const uint32_t* parts = a.s.partial + (size_t)row * a.chunks * DPS_SAMPLE_MAX_WORDS;
    if (threadIdx.x == 0) {
      Hdr h, t;
      hdrUnpack(parts, h);
      for (int c = 1; c < a.chunks; ++c) {
        hdrUnpack(parts + (size_t)c * DPS_SAMPLE_MAX_WORDS, t);
        hdrMerge(h, t);
      }
      s_hdr = h;
    }
    for (int i = threadIdx.x; i < a.chunks * a.cand; i += blockDim.x) {
      const uint32_t* p = parts + (size_t)(i / a.cand) * DPS_SAMPLE_MAX_WORDS + HDR + 2 * (i % a.cand);
      s_lists[i] = (u64)p[0] | ((u64)p[1] << 32);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < a.chunks * a.cand; i += blockDim.x) {
      const int place = mergePlace(s_lists, a.chunks, a.cand, i / a.cand, i % a.cand);
      if (place < a.cand) s_sel[place] = s_lists[i];
    }
    __syncthreads();
  }
  if (a.tp == 1) { /* no exchange: the draw on this block (one kernel per call) */
    drawRow<X, KERNEL>(a, row, q, s_hdr, s_sel, bad);
    return;
  }
  if (threadIdx.x == 0) hdrPack(s_hdr, s_rec);
  for (int j = threadIdx.x; j < a.cand; j += blockDim.x) {
    s_rec[HDR + 2 * j] = (uint32_t)s_sel[j];
    s_rec[HDR + 2 * j + 1] = (uint32_t)(s_sel[j] >> 32);
  }
  __syncthreads();
  recEmit(a.sink, row, words, s_rec, e);
}

/* Items of a kernel over a grid that may be capped (the onesided grid cap:
 * ranks sharing a GPU must all stay resident), one block at a time. */
#define FOR_ITEMS(i, n) for (long long i = blockIdx.x; i < (n); i += gridDim.x)

/* one block of 512 threads per SM, or four of 128 (a->threads), 128
 * registers a thread: the race's noise and its vectors in flight (at 64
 * registers the race's loop spills; even the RACE kernel alone at two
 * blocks per SM lost 40 %: docs/performance.md, session 23) */
template <typename X, int KERNEL>
__global__ void __launch_bounds__(THREADS, DPS_SAMPLE_FIRST_BLOCKS_PER_SM) firstKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const bool ll = a.sink.kind == DPS_REC_LL;
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0) return;
  /* tp == 1 draws here: whether any entry of the call is invalid, once per
   * block (block 0 records it), not once per row */
  const bool bad = a.tp == 1 && callInvalid(a, blockIdx.x == 0);
  /* the exact kernel may be scheduled once every block of ours has started
   * (it waits for our end before it reads anything): its launch overlaps our
   * last wave instead of following it */
  if (a.exact_clusters > 0) dpsPdlRelease();
  FOR_ITEMS(item, a.rows * a.chunks) {
    __syncthreads();
    firstItem<X, KERNEL>(a, item, e, bad);
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
  /* tp == 1 verify: the last block to finish walks (every row drawn by then),
   * unless the exact kernel comes next */
  if (a.walk.pad_bs > 0 && a.exact_clusters == 0) {
    const long long bad_cand = dpsWalkCheck(a.walk);
    if (dpsWalkArrive(a.walk, 1u, gridDim.x) && !bad) dpsWalkRequests(a.walk, bad_cand);
  }
}

constexpr int EXACT_CHUNKS = DPS_SAMPLE_EXACT_CHUNKS;
static_assert(EXACT_CHUNKS <= DPS_PEER_MAX_RANKS, "the chunks' tie quotas");

/* Rows [base, base + THREADS) of the call that the first pass left to the
 * exact path, in row order, as offsets from base into list[]; their count.
 * Every block computes the same list. Every thread calls. */
__device__ int exactRowsOf(const dpsSampleArgs& a, long long base, uint16_t* list) {
  __shared__ int s_warp[WARPS];
  const long long row = base + threadIdx.x;
  const bool exact = row < a.rows && stateOf(a, row)->mode != MODE_DONE;
  const unsigned ball = __ballot_sync(0xffffffffu, exact);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
  __syncthreads(); /* the previous batch's readers of s_warp and list are done */
  if (lane == 0) s_warp[w] = __popc(ball);
  __syncthreads();
  int before = 0, total = 0;
  for (int i = 0; i < nw; ++i) {
    before += i < w ? s_warp[i] : 0;
    total += s_warp[i];
  }
  if (exact) list[before + __popc(ball & ((1u << lane) - 1u))] = (uint16_t)threadIdx.x;
  __syncthreads();
  return total;
}

/* The bins of a split row's chunks where they lie: chunk r's in the shared
 * memory of block r of the cluster, at the address of this block's own. */
struct ClusterBins {
  u64* own;
  __device__ __forceinline__ u64 operator()(int r, int d) const {
    return *dpsClusterMap(&own[d], (unsigned)r);
  }
};

/* One exact row split over the EXACT_CHUNKS blocks of this cluster, a chunk
 * each, as the ranks at tp > 1 hold their shards: every block histograms its
 * chunk, reads the other blocks' bins from their shared memory (the fine
 * digits' 512 bins, a copy of all would take 32 KB) and runs the
 * same merge (integer sums: the state a single block would reach, the same
 * in every block; the tie quotas per chunk, in index order); then the race
 * over each chunk's kept set, the best into block 0, which writes the token.
 * Shared memory another block reads is rewritten only two cluster barriers
 * after that read's barrier, which the reader passes only after its read:
 * hence two copies, by round and by row parity (*parity), and every row ends
 * at a barrier after its last remote access. */
template <typename X>
__device__ void exactSplitRow(const dpsSampleArgs& a, long long row, SState& st, int* parity) {
  using D = FineDigits;
  __shared__ u64 s_bins[2][D::BINS]; /* this chunk's: read by the others */
  __shared__ u64 s_tot[D::BINS];
  __shared__ float4 s_win[2][EXACT_CHUNKS]; /* block 0: the chunks' race winners */
  const int chunk = (int)(blockIdx.x % EXACT_CHUNKS);
  const char* rowp = rowPtr(a, row);
  const X xf = rowXform<X>(a, row);
  long long from, to;
  chunkRange(a.nvalid, EXACT_CHUNKS, chunk, &from, &to);
  while (st.mode == MODE_K || st.mode == MODE_P) {
    u64* bins = s_bins[parity[0]];
    parity[0] ^= 1;
    histPass<D>(st, rowp, a.dtype, from, to, xf, bins);
    dpsClusterBarrier();
    const ClusterBins rb{bins};
    searchTotals<D>(st, rb, EXACT_CHUNKS, s_tot);
    if (threadIdx.x < 32) searchMerge<D>(st, rb, EXACT_CHUNKS, s_tot);
    __syncthreads();
  }
  float bk, bv;
  uint32_t bi;
  racePass(st, rowp, a.dtype, a.col0, from, to, chunk, xf, &bk, &bi, &bv);
  float4* win = s_win[parity[1]];
  parity[1] ^= 1;
  if (threadIdx.x == 0)
    *dpsClusterLeader(&win[chunk]) = make_float4(bk, __uint_as_float(bi), bv, 0.f);
  dpsClusterBarrier();
  if (chunk == 0 && threadIdx.x == 0) {
    /* chunks in index order, ties to the lower index as raceBetter has them */
    bk = -INFINITY;
    bi = NO_INDEX;
    bv = -INFINITY;
    for (int c = 0; c < EXACT_CHUNKS; ++c) {
      const uint32_t ci = __float_as_uint(win[c].y);
      if (raceBetter(win[c].x, ci, bk, bi)) {
        bk = win[c].x;
        bi = ci;
        bv = win[c].z;
      }
    }
    writeToken(a, row, bi == NO_INDEX ? 0u : bi, bv, st.lmax, st.lse_rel);
  }
}

/* tp == 1: the rows the first pass left to the exact path (their state's
 * mode; invalid calls left none). Few of them (at most
 * DPS_SAMPLE_EXACT_SPLIT_ROWS a cluster): each on a cluster, split over its
 * blocks (a row's time shared by EXACT_CHUNKS SMs); more: each on one block,
 * every SM busy with a row of its own. The j-th exact row in row order goes
 * to cluster (block) j modulo their number. */
template <typename X>
__global__ void __launch_bounds__(THREADS, 1) exactKernel(const __grid_constant__ dpsSampleArgs a) {
  __shared__ SState s_st;
  __shared__ uint16_t s_list[THREADS];
  __shared__ unsigned s_pending;
  const long long cluster = blockIdx.x / EXACT_CHUNKS, clusters = gridDim.x / EXACT_CHUNKS;
  dpsPdlWait();
  /* most calls have no exact row: then nothing to look for (the count only
   * grows in the first pass, so a zero is never stale), and without a walk
   * nothing to do (every block of a cluster leaves alike) */
  if (threadIdx.x == 0) s_pending = *(volatile unsigned*)a.s.exact_pending;
  __syncthreads();
  if (s_pending == 0u && a.walk.pad_bs == 0) return;
  dpsClusterArriveStarted();
  long long n = 0;
  for (long long base = 0; s_pending != 0u && base < a.rows; base += blockDim.x)
    n += exactRowsOf(a, base, s_list);
  const bool split = n <= (long long)DPS_SAMPLE_EXACT_SPLIT_ROWS * clusters;
  dpsClusterWaitStarted();
  int parity[2] = {0, 0};
  long long j = 0; /* exact rows before this batch */
  for (long long base = 0; base < a.rows && n > 0; base += blockDim.x) {
    const int m = exactRowsOf(a, base, s_list);
    for (int i = 0; i < m; ++i) {
      const long long ji = j + i;
      if (split ? ji % clusters != cluster : ji % gridDim.x != blockIdx.x) continue;
      const long long row = base + s_list[i];
      __syncthreads(); /* the last row's readers of s_st are done */
      if (threadIdx.x == 0) s_st = *stateOf(a, row);
      __syncthreads();
      if (split) exactSplitRow<X>(a, row, s_st, parity);
      else exactLocal<X, FineDigits>(a, row, &s_st, false);
    }
    j += m;
  }
  /* The last block zeroes the count (every block has read it) and, for a
   * tp == 1 verify, walks (every row drawn by then; an invalid call wrote
   * no token, and its walk writes nothing either). */
  const long long bad_cand = a.walk.pad_bs > 0 ? dpsWalkCheck(a.walk) : LLONG_MAX;
  if (dpsArriveLast(a.s.exact_arrivals, 1u, gridDim.x)) {
    if (threadIdx.x == 0) *a.s.exact_pending = 0u;
    if (a.walk.pad_bs > 0 && !callInvalid(a, false)) dpsWalkRequests(a.walk, bad_cand);
  }
}

/* The local pass of a search round or of the race (tp > 1): one block per
 * row; rows not in the step's mode move nothing. */
template <typename X>
__device__ __forceinline__ void stepItem(const dpsSampleArgs& a, long long row, u64 e) {
  __shared__ u64 s_bins[BINS];
  __shared__ uint32_t s_rec[DPS_SAMPLE_PSEARCH_WORDS];
  __shared__ SState s_st;
  if (threadIdx.x == 0) s_st = *stateOf(a, row);
  __syncthreads();
  const int want = a.step == DPS_SAMPLE_STEP_KSEARCH   ? MODE_K
                   : a.step == DPS_SAMPLE_STEP_PSEARCH ? MODE_P
                                                       : MODE_RACE;
  if (s_st.mode == want) {
    const char* rowp = rowPtr(a, row);
    const X xf = rowXform<X>(a, row);
    if (want == MODE_RACE) {
      float bk, bv;
      uint32_t bi;
      racePass(s_st, rowp, a.dtype, a.col0, 0, a.nvalid, a.rank, xf, &bk, &bi, &bv);
      if (threadIdx.x == 0) {
        s_rec[0] = __float_as_uint(bk);
        s_rec[1] = bi;
        s_rec[2] = __float_as_uint(bv);
        s_rec[3] = 0u;
      }
    } else {
      histPass<RecordDigits>(s_st, rowp, a.dtype, 0, a.nvalid, xf, s_bins);
      for (int d = threadIdx.x; d < BINS; d += blockDim.x) {
        if (want == MODE_K) {
          s_rec[d] = (uint32_t)s_bins[d];
        } else {
          s_rec[2 * d] = (uint32_t)s_bins[d];
          s_rec[2 * d + 1] = (uint32_t)(s_bins[d] >> 32);
        }
      }
    }
    __syncthreads();
    recEmit(a.sink, row, a.words, s_rec, e);
  }
}

template <typename X>
__global__ void __launch_bounds__(THREADS) stepKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const bool ll = a.sink.kind == DPS_REC_LL;
  const u64 e = ll ? beginEpoch(a.sink.c, a.sink.op) : 1;
  if (e == 0) return;
  FOR_ITEMS(row, a.rows) {
    __syncthreads();
    stepItem<X>(a, row, e);
  }
  if (ll) finishEpoch(a.sink.c, a.sink.op, e);
}

/* The merge of a step (tp > 1): one block per row. */
/* false when a wait gave up (the communicator failed). */
__device__ __forceinline__ bool mergeItem(const dpsSampleArgs& a, long long row, u64 e,
                                          bool bad) {
  __shared__ uint32_t s_rec[DPS_PEER_MAX_RANKS * DPS_SAMPLE_MAX_WORDS];
  __shared__ u64 s_lists[DPS_PEER_MAX_RANKS * CAND];
  __shared__ u64 s_sel[CAND];
  __shared__ u64 s_bins[DPS_PEER_MAX_RANKS * BINS], s_tot[BINS];
  __shared__ Hdr s_hdr;
  __shared__ SState s_st;
  const int tp = a.tp;
  if (a.step == DPS_SAMPLE_STEP_FIRST) {
    if (!recFetch(a.src, tp, a.rows, row, a.words, s_rec, e)) return false;
    if (threadIdx.x == 0) {
      Hdr h, t;
      hdrUnpack(s_rec, h);
      for (int r = 1; r < tp; ++r) {
        hdrUnpack(s_rec + r * a.words, t);
        hdrMerge(h, t);
      }
      s_hdr = h;
    }
    for (int i = threadIdx.x; i < tp * a.cand; i += blockDim.x) {
      const uint32_t* p = s_rec + (i / a.cand) * a.words + HDR + 2 * (i % a.cand);
      s_lists[i] = (u64)p[0] | ((u64)p[1] << 32);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < tp * a.cand; i += blockDim.x) {
      const int place = mergePlace(s_lists, tp, a.cand, i / a.cand, i % a.cand);
      if (place < a.cand) s_sel[place] = s_lists[i];
    }
    __syncthreads();
    /* tp > 1: no exact pass here, no reads */
    drawRow<NoXform, DPS_SAMPLE_FIRST_ANY>(a, row, rowParamsDefined(a.p, row), s_hdr, s_sel, bad);
    return true;
  }
  if (threadIdx.x == 0) s_st = *stateOf(a, row);
  __syncthreads();
  const int want = a.step == DPS_SAMPLE_STEP_KSEARCH   ? MODE_K
                   : a.step == DPS_SAMPLE_STEP_PSEARCH ? MODE_P
                                                       : MODE_RACE;
  if (s_st.mode != want) return true;
  if (!recFetch(a.src, tp, a.rows, row, a.words, s_rec, e)) return false;
  if (want == MODE_RACE) {
    if (threadIdx.x == 0) {
      float bk = -INFINITY, bv = -INFINITY;
      uint32_t bi = NO_INDEX;
      for (int r = 0; r < tp; ++r) {
        const uint32_t* w = s_rec + r * a.words;
        if (raceBetter(__uint_as_float(w[0]), w[1], bk, bi)) {
          bk = __uint_as_float(w[0]);
          bi = w[1];
          bv = __uint_as_float(w[2]);
        }
      }
      if (!bad) writeToken(a, row, bi == NO_INDEX ? 0u : bi, bv, s_st.lmax, s_st.lse_rel);
      s_st.mode = MODE_DONE;
      *stateOf(a, row) = s_st;
    }
    return true;
  }
  for (int i = threadIdx.x; i < tp * BINS; i += blockDim.x) {
    const int r = i / BINS, d = i % BINS;
    const uint32_t* w = s_rec + r * a.words;
    s_bins[i] = want == MODE_K ? (u64)w[d] : ((u64)w[2 * d] | ((u64)w[2 * d + 1] << 32));
  }
  __syncthreads();
  const ArrayBins rb{s_bins, BINS};
  searchTotals<RecordDigits>(s_st, rb, tp, s_tot);
  if (threadIdx.x < 32) searchMerge<RecordDigits>(s_st, rb, tp, s_tot);
  if (threadIdx.x == 0) *stateOf(a, row) = s_st; /* lane 0 wrote it last */
  return true;
}

__global__ void __launch_bounds__(MERGE_THREADS) mergeKernel(const __grid_constant__ dpsSampleArgs a) {
  dpsPdlWait();
  const u64 e = dpsRecMergeEpoch(a.src);
  if (e == 0) return;
  const bool bad = callInvalid(a, blockIdx.x == 0 && a.step == DPS_SAMPLE_STEP_FIRST);
  FOR_ITEMS(row, a.rows) {
    __syncthreads();
    if (!mergeItem(a, row, e, bad)) return;
  }
}

/* ---- dpsVerifyChain's chain walk ----------------------------------------------- */
constexpr int WALK_THREADS = 256;

/* tp > 1: one block after the last merge; nothing is written for an
 * invalid call (a parameter: the first pass counted it; a candidate: counted
 * by the walk). */
__global__ void __launch_bounds__(WALK_THREADS) walkKernel(const __grid_constant__ dpsSampleArgs a,
                                                           const __grid_constant__ dpsVerifyWalkArgs w) {
  dpsPdlWait();
  const long long bad = dpsWalkCheck(w);
  if (!callInvalid(a, false)) dpsWalkRequests(w, bad);
}

}  // namespace

static unsigned capped(long long items, int cap) {
  return (unsigned)(cap > 0 && items > cap ? cap : items);
}

/* The kernels' instances with the transform when the call has one. */
static bool hasXform(const dpsSampleArgs* a) { return a->xf.mask != NULL || a->xf.cap > 0.f; }

template <typename X>
static cudaError_t launchFirst(const dpsSampleArgs* a, cudaStream_t stream) {
  auto k = a->first == DPS_SAMPLE_FIRST_RACE    ? firstKernel<X, DPS_SAMPLE_FIRST_RACE>
           : a->first == DPS_SAMPLE_FIRST_TILED ? firstKernel<X, DPS_SAMPLE_FIRST_TILED>
                                                : firstKernel<X, DPS_SAMPLE_FIRST_ANY>;
  return dpsLaunch(k, dim3(capped(a->rows * a->chunks, a->sink.max_blocks)), dim3(a->threads),
                   stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchSampleLocal(const dpsSampleArgs* a, cudaStream_t stream) {
  if (a->step == DPS_SAMPLE_STEP_FIRST)
    return hasXform(a) ? launchFirst<LogitXform>(a, stream) : launchFirst<NoXform>(a, stream);
  return dpsLaunch(hasXform(a) ? stepKernel<LogitXform> : stepKernel<NoXform>,
                   dim3(capped(a->rows, a->sink.max_blocks)), dim3(THREADS), stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchSampleExact(const dpsSampleArgs* a, cudaStream_t stream) {
  const dim3 grid((unsigned)a->exact_clusters * EXACT_CHUNKS);
  return dpsLaunchCluster(hasXform(a) ? exactKernel<LogitXform> : exactKernel<NoXform>, grid,
                          dim3(THREADS), (unsigned)EXACT_CHUNKS, stream, a->pdl, *a);
}

/* Clusters of the exact kernel resident at once (the smaller of its two
 * instances'); 0 where clusters are unavailable (pre-sm_90 device code). */
extern "C" cudaError_t dpsSampleExactClusters(int* clusters) {
  *clusters = 0;
  const cudaError_t before = cudaPeekAtLastError();
  int usable = 0, least = -1;
  cudaError_t e = dpsClustersUsable((const void*)exactKernel<NoXform>, &usable);
  const void* const k[] = {(const void*)exactKernel<NoXform>, (const void*)exactKernel<LogitXform>};
  for (int i = 0; i < 2 && e == cudaSuccess && usable; ++i) {
    int n = 0;
    e = dpsMaxActiveClusters(k[i], EXACT_CHUNKS, THREADS, EXACT_CHUNKS, &n);
    if (e == cudaSuccess && (least < 0 || n < least)) least = n;
  }
  if (e != cudaSuccess) dpsForgetOwnError(before);
  else if (usable) *clusters = least;
  return e;
}

extern "C" cudaError_t dpsLaunchSampleMerge(const dpsSampleArgs* a, cudaStream_t stream) {
  return dpsLaunch(mergeKernel, dim3(capped(a->rows, a->src.max_blocks)), dim3(MERGE_THREADS),
                   stream, a->pdl, *a);
}

extern "C" cudaError_t dpsLaunchVerifyWalk(const dpsSampleArgs* a, const dpsVerifyWalkArgs* w,
                                           cudaStream_t stream) {
  return dpsLaunch(walkKernel, dim3(1), dim3(WALK_THREADS), stream, a->pdl, *a, *w);
}

extern "C" cudaError_t dpsPreloadSampleKernels(void) {
#define DPS_FIRST_KERNELS(X)                                        \
  (const void*)firstKernel<X, DPS_SAMPLE_FIRST_ANY>,                \
      (const void*)firstKernel<X, DPS_SAMPLE_FIRST_TILED>,          \
      (const void*)firstKernel<X, DPS_SAMPLE_FIRST_RACE>
  const void* const k[] = {DPS_FIRST_KERNELS(NoXform), DPS_FIRST_KERNELS(LogitXform),
                           (const void*)stepKernel<NoXform>, (const void*)stepKernel<LogitXform>,
                           (const void*)exactKernel<NoXform>, (const void*)exactKernel<LogitXform>,
                           (const void*)mergeKernel, (const void*)walkKernel};
#undef DPS_FIRST_KERNELS
  return dpsPreload(k, (int)(sizeof k / sizeof k[0]));
}
