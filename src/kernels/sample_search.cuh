/* dpsSample's exact path: the search state every rank holds alike, the
 * histogram passes (counts for top-k, masses for top-p) and their merge,
 * and the race over the kept set of a shard (kernels/sample.cu is the only
 * includer; docs/sampling.md, "The kernels of dpsSample"). */
#ifndef DPS_SAMPLE_SEARCH_CUH_
#define DPS_SAMPLE_SEARCH_CUH_

#include "kernels/sample_race.cuh"

namespace {

/* ---- search state (identical on every rank) -------------------------------------- */
struct SState {
  int mode, round;
  int has_thr, qall, topp_after;
  uint32_t prefix; /* the bits the search fixed so far */
  uint32_t tkey;   /* has_thr: kept keys are > tkey, and == tkey within quota */
  uint32_t mpkey;  /* min-p: kept keys are >= mpkey (KEY_NEG_INF + 1: off) */
  u64 need;        /* K: count still wanted within the prefix */
  u64 above;       /* P: mass of the kept bins above the prefix's */
  u64 P;           /* P: kept indices have a mass before them below P */
  float lmax, T, top_p, smax;
  double lse;
  u64 seed, offset;
  uint32_t quota[DPS_OS_MAX_RANKS];
};
static_assert(sizeof(SState) <= DPS_SAMPLE_STATE_BYTES, "state slot");

__device__ __forceinline__ u64 massTerm(float x, float T, float smax) {
  const float d = __fmul_rn(__fsub_rn(dpsSampleScore(x, T), smax), LOG2E);
  /* below 2^-126 the term is 0 either way (2^-126 * 2^40 truncates to 0): the
   * ftz form (one instruction) gives the same integer for every d */
  return __float2ull_rz(__fmul_rn(fastExp2Ftz(d), TERM_SCALE));
}

/* top_p * Z as the integer bound of the masses before a kept index: at
 * least 1 (the first index always stays), NaN and overflow clamped. */
__device__ __forceinline__ u64 ceilMass(double p) {
  if (!(p >= 1.0)) return 1ull;
  return p >= 9.2e18 ? 9200000000000000000ull : (u64)ceil(p);
}

/* Digit of round r: bits [shift, shift + width) of the order key. */
__device__ __forceinline__ void roundDigit(int r, int* shift, int* width) {
  const int hi = 32 - DPS_SAMPLE_DIGIT_BITS * r;
  const int sh = hi - DPS_SAMPLE_DIGIT_BITS > 0 ? hi - DPS_SAMPLE_DIGIT_BITS : 0;
  *shift = sh;
  *width = hi - sh;
}
__device__ __forceinline__ uint32_t roundMask(int r) {
  const int hi = 32 - DPS_SAMPLE_DIGIT_BITS * r;
  return hi >= 32 ? 0u : ~((1u << hi) - 1u);
}

/* The smallest order key that min-p keeps ((l - lmax) / T >= log min_p is
 * monotone in l), so that the passes compare keys only. */
__device__ uint32_t minpKey(float lmax, float T, float min_p) {
  if (!(min_p > 0.f)) return KEY_NEG_INF + 1u;
  const double lm = dpsLogDet((double)min_p);
  uint32_t lo = KEY_NEG_INF + 1u, hi = orderKey(lmax);
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2u;
    if (dpsSampleMinPKeep(keyValue(mid), lmax, T, lm)) hi = mid;
    else lo = mid + 1u;
  }
  return lo;
}

/* Whether key (of a valid index) is in the set the searches keep, ties at
 * tkey aside (they need their rank among the shard's ties). */
__device__ __forceinline__ bool aboveThr(const SState& st, uint32_t key) {
  return key >= st.mpkey && (!st.has_thr || key >= st.tkey);
}

/* ---- histogram passes (K: counts, P: masses) over a shard ------------------------- */
/* Lanes that hit the same bin add their terms first (one shared-memory
 * atomic per bin and warp: most of a row falls into a few bins). */
template <bool MASS>
struct HistVisit {
  const SState* st;
  uint32_t mask, prefix, dmask;
  int shift;
  uint32_t* cnt;
  u64* mass;
  template <int CN>
  __device__ __forceinline__ void run(long long, const float (&v)[CN]) {
    const unsigned act = __activemask();
    const unsigned lane_lt = (1u << (threadIdx.x & 31)) - 1u;
#pragma unroll
    for (int t = 0; t < CN; ++t) {
      const float x = v[t];
      const uint32_t key = orderKey(x);
      bool in = x > -INFINITY && (key & mask) == prefix && aboveThr(*st, key);
      /* P: ties of the top-k threshold come from the merge (their rank) */
      if (MASS && st->has_thr && !st->qall && key == st->tkey) in = false;
      const uint32_t d = in ? (key >> shift) & dmask : 0xffffffffu;
      const unsigned grp = __match_any_sync(act, d);
      if (!in) continue;
      const bool leader = (grp & lane_lt) == 0u;
      if (MASS) {
        /* terms <= 2^40: 20-bit halves sum without overflow over 32 lanes */
        const u64 m = massTerm(x, st->T, st->smax);
        const unsigned hi = __reduce_add_sync(grp, (unsigned)(m >> 20));
        const unsigned lo = __reduce_add_sync(grp, (unsigned)(m & 0xfffffu));
        if (leader) atomicAdd(&mass[d], ((u64)hi << 20) + (u64)lo);
      } else if (leader) {
        atomicAdd(&cnt[d], (unsigned)__popc(grp));
      }
    }
  }
};

/* The shard's histogram of the state's current round into bins[BINS] (u64;
 * counts for K). Every thread calls it. */
template <typename X>
__device__ void histPass(const SState& st, const char* rowp, int dtype, long long nvalid,
                         const X& xf, u64* bins) {
  __shared__ uint32_t s_cnt[BINS];
  for (int i = threadIdx.x; i < BINS; i += blockDim.x) {
    s_cnt[i] = 0u;
    bins[i] = 0ull;
  }
  __syncthreads();
  int shift, width;
  roundDigit(st.round, &shift, &width);
  if (st.mode == MODE_P) {
    HistVisit<true> v{&st, roundMask(st.round), st.prefix, (1u << width) - 1u, shift, s_cnt, bins};
    forEachElemX(rowp, dtype, 0, nvalid, xf, v);
  } else {
    HistVisit<false> v{&st, roundMask(st.round), st.prefix, (1u << width) - 1u, shift, s_cnt, bins};
    forEachElemX(rowp, dtype, 0, nvalid, xf, v);
  }
  __syncthreads();
  if (st.mode != MODE_P)
    for (int i = threadIdx.x; i < BINS; i += blockDim.x) bins[i] = s_cnt[i];
  __syncthreads();
}

/* One round of the search from every rank's bins (rb[r * BINS + d]); one
 * thread. Moves the state to its next round or mode. */
__device__ void searchMerge(SState& st, const u64* rb, int tp) {
  int shift, width;
  roundDigit(st.round, &shift, &width);
  const int nb = 1 << width;
  const uint32_t mask = roundMask(st.round);
  /* P: the ties of the top-k threshold, per rank */
  u64 tie_m = 0ull;
  int tie_d = -1;
  if (st.mode == MODE_P && st.has_thr && !st.qall && (st.tkey & mask) == st.prefix) {
    tie_m = massTerm(keyValue(st.tkey), st.T, st.smax);
    tie_d = (int)((st.tkey >> shift) & (uint32_t)(nb - 1));
  }
  auto bin = [&](int r, int d) -> u64 {
    u64 v = rb[r * BINS + d];
    if (d == tie_d) v += (u64)st.quota[r] * tie_m;
    return v;
  };
  u64 h[BINS];
  u64 total = 0ull;
  for (int d = 0; d < nb; ++d) {
    u64 s = 0ull;
    for (int r = 0; r < tp; ++r) s += bin(r, d);
    h[d] = s;
    total += s;
  }
  bool done = false;
  if (st.mode == MODE_K) {
    if (st.round == 0 && total < st.need) {
      done = true; /* min-p left fewer than k: top-k keeps them all */
    } else {
      u64 above = 0ull;
      int d = nb - 1;
      while (d > 0 && above + h[d] < st.need) above += h[--d + 1];
      st.need -= above;
      st.prefix |= (uint32_t)d << shift;
      if (h[d] == st.need || shift == 0) {
        st.has_thr = 1;
        st.tkey = st.prefix;
        st.qall = h[d] == st.need;
        if (!st.qall) { /* the first `need` ties by global index: rank by rank */
          u64 left = st.need;
          for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) {
            const u64 c = r < tp ? rb[r * BINS + d] : 0ull;
            st.quota[r] = (uint32_t)(left < c ? left : c);
            left -= st.quota[r];
          }
        }
        done = true;
      }
    }
    if (done) {
      st.mode = st.topp_after ? MODE_P : MODE_RACE;
      st.round = 0;
      st.prefix = 0u;
      st.above = 0ull;
      return;
    }
    ++st.round;
    return;
  }
  /* MODE_P: keep an index iff the mass before it is < P */
  if (st.round == 0) {
    st.P = ceilMass((double)st.top_p * (double)total);
    st.above = 0ull;
  }
  u64 above = st.above;
  int d = nb - 1;
  while (d > 0 && above + h[d] < st.P) above += h[--d + 1];
  st.above = above;
  st.prefix |= (uint32_t)d << shift;
  if (above + h[d] <= st.P || shift == 0) {
    uint32_t q[DPS_OS_MAX_RANKS];
    bool all = above + h[d] <= st.P;
    if (!all) { /* one key value: ties of equal mass m, by global index */
      const u64 m = massTerm(keyValue(st.prefix), st.T, st.smax);
      if (m == 0ull) {
        all = true;
      } else {
        u64 left = (st.P - above + m - 1ull) / m;
        for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) {
          const u64 c = r < tp ? bin(r, d) / m : 0ull;
          q[r] = (uint32_t)(left < c ? left : c);
          left -= q[r];
        }
      }
    }
    /* a whole bin at or below the top-k threshold keeps all of S: the top-k
     * threshold (and its quotas) stays */
    if (!(all && st.has_thr && st.prefix <= st.tkey)) {
      st.has_thr = 1;
      st.tkey = st.prefix;
      st.qall = all;
      if (!all)
        for (int r = 0; r < DPS_OS_MAX_RANKS; ++r) st.quota[r] = q[r];
    }
    st.mode = MODE_RACE;
    st.round = 0;
    return;
  }
  ++st.round;
}

/* ---- the race over the kept set of a shard (index order: ties need rank) ---------- */
template <typename X>
__device__ void racePass(const SState& st, const char* rowp, int dtype, long long col0,
                         long long nvalid, int rank, const X& xf, float* bk,
                         uint32_t* bi, float* bv) {
  __shared__ int s_warp[WARPS];
  __shared__ Hdr s_h;
  Race race;
  race.init(st.T, st.seed, st.offset);
  const bool ties = st.has_thr && !st.qall;
  const uint32_t quota = ties ? st.quota[rank] : 0u;
  uint32_t running = 0u;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (long long base = 0; base < nvalid; base += blockDim.x) {
    const long long j = base + threadIdx.x;
    const float x = j < nvalid ? noNan(xf.one(j, loadValue(rowp, j, dtype))) : -INFINITY;
    const uint32_t key = orderKey(x);
    const bool in = x > -INFINITY && aboveThr(st, key);
    const bool tied = ties && in && key == st.tkey;
    bool keep = in && !tied;
    if (ties) {
      const unsigned bal = __ballot_sync(0xffffffffu, tied);
      if (lane == 0) s_warp[w] = __popc(bal);
      __syncthreads();
      uint32_t before = 0u, total = 0u;
      for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
        before += i < w ? (uint32_t)s_warp[i] : 0u;
        total += (uint32_t)s_warp[i];
      }
      const uint32_t pos = running + before + (uint32_t)__popc(bal & ((1u << lane) - 1u));
      keep = keep || (tied && pos < quota);
      running += total;
      __syncthreads();
    }
    const float v[1] = {keep ? x : -INFINITY};
    race.visit<1>((uint32_t)(col0 + j), v); /* the loop's trip count is the block's */
  }
  race.finish();
  Hdr h;
  hdrInit(h);
  h.rkey = race.best.k;
  h.ridx = race.best.i;
  h.rval = race.best.v;
  blockHdrReduce<false, false>(h, &s_h);
  *bk = s_h.rkey;
  *bi = s_h.ridx;
  *bv = s_h.rval;
  __syncthreads();
}

}  // namespace

#endif /* DPS_SAMPLE_SEARCH_CUH_ */
