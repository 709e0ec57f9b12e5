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
  int zb;          /* low bits of the order key constant for the dtype (bf16 16, fp16 13) */
  uint32_t prefix; /* the bits the search fixed so far */
  uint32_t tkey;   /* has_thr: kept keys are > tkey, and == tkey within quota */
  uint32_t mpkey;  /* min-p: kept keys are >= mpkey (KEY_NEG_INF + 1: off) */
  uint32_t whole;  /* tie quotas: bit r set where rank r keeps all its ties (no cut to find) */
  u64 need;        /* K: count still wanted within the prefix */
  u64 above;       /* P: mass of the kept bins above the prefix's */
  u64 P;           /* P: kept indices have a mass before them below P */
  float lmax, T, top_p;
  float mc; /* massTerm's log2(e) / T (massScale): set once, by decide() */
  double lse_rel; /* logprob: logsumexp over A less lmax (lseRel) */
  u64 seed, offset;
  uint32_t quota[DPS_PEER_MAX_RANKS];
};
static_assert(sizeof(SState) <= DPS_SAMPLE_STATE_BYTES, "state slot");

/* A row's mass scale: its maximum and log2(e) / T (rounded once; at most
 * FLT_MAX, so that the maximum's own exponent is 0 for any T). */
struct MassScale {
  float lmax, c;
};
__device__ __forceinline__ MassScale massScale(float lmax, float T) {
  const double c = 1.4426950408889634 / (double)T;
  MassScale m;
  m.lmax = lmax;
  m.c = c < 3.4028234663852886e38 ? (float)c : 3.4028234663852886e38f;
  return m;
}
/* the state's (no division in the searches' kernels) */
__device__ __forceinline__ MassScale massScale(const SState& st) {
  MassScale m;
  m.lmax = st.lmax;
  m.c = st.mc;
  return m;
}

/* A valid value's mass: 2^((x - lmax) log2(e) / T) * 2^40, rounded down.
 * x - lmax is exact for 16-bit logits (and for fp32 within a factor 2 of the
 * maximum), so the exponent's error is two roundings of a number of at most
 * 40 for any term above 2^-40 (a relative error of about 2e-6 at most) and
 * does not grow with the scores, as the difference of two rounded scores
 * l / T did; no division per element. Below 2^-126 the term is 0 either way
 * (2^-126 * 2^40 truncates to 0): the ftz form. */
__device__ __forceinline__ u64 massTerm(float x, const MassScale& m) {
  const float v = __fmul_rn(__fsub_rn(x, m.lmax), m.c);
  return __float2ull_rz(__fmul_rn(fastExp2Ftz(v), TERM_SCALE));
}

/* The mass term of the one value a key stands for (a bin of one value, the
 * ties at a threshold). */
__device__ __forceinline__ u64 keyMass(const MassScale& m, uint32_t key) {
  return massTerm(keyValue(key), m);
}
__device__ __forceinline__ u64 keyMass(const SState& st, uint32_t key) {
  return keyMass(massScale(st), key);
}

/* top_p * Z as the integer bound of the masses before a kept index: at
 * least 1 (the first index always stays), NaN and overflow clamped. */
__device__ __forceinline__ u64 ceilMass(double p) {
  if (!(p >= 1.0)) return 1ull;
  return p >= 9.2e18 ? 9200000000000000000ull : (u64)ceil(p);
}

/* The digits the searches fix round by round: FIRST bits of the order key,
 * then NEXT bits a round down to the last (fewer where 32 runs out); a
 * round's digit is bits [shift, shift + width). BINS holds any round's. */
template <int FIRST, int NEXT>
struct Digits {
  static constexpr int BINS = 1 << (FIRST > NEXT ? FIRST : NEXT);
  static_assert(BINS >= 64 && BINS % 32 == 0, "searchMerge: at least two bins a lane");
  static __device__ __forceinline__ int top(int r) { return r == 0 ? 32 : 32 - FIRST - NEXT * (r - 1); }
  static __device__ __forceinline__ void of(int r, int* shift, int* width) {
    const int hi = top(r), w = r == 0 ? FIRST : NEXT;
    const int sh = hi - w > 0 ? hi - w : 0;
    *shift = sh;
    *width = hi - sh;
  }
  /* the bits the rounds before r fixed */
  static __device__ __forceinline__ uint32_t mask(int r) {
    const int hi = top(r);
    return hi >= 32 ? 0u : ~((1u << hi) - 1u);
  }
};
/* The records' digits (tp > 1, and the first pass's own exact rows): 6 bits a
 * round, 64 bins of u64 in a step's record. */
using RecordDigits = Digits<DPS_SAMPLE_DIGIT_BITS, DPS_SAMPLE_DIGIT_BITS>;
static_assert(RecordDigits::BINS == BINS, "a record's bins");
/* The exact kernel's (tp == 1, nothing exchanged): the sign and the 8
 * exponent bits first, a bin per octave, where 6 bits put most of a
 * realistic row in one or two bins that the next round read again with its
 * mass terms; then 7 bits, so bf16 in two rounds (fp16 three, fp32 five). */
using FineDigits = Digits<9, 7>;

/* The order key the bits fixed so far determine once shift <= st.zb (the
 * rest of a key is constant for the dtype: zeros for a positive value,
 * ones for a negative one, whose key is the inverted float). */
__device__ __forceinline__ uint32_t keyOfPrefix(uint32_t prefix, int shift) {
  return (prefix & 0x80000000u) ? prefix : prefix | ((1u << shift) - 1u);
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

/* Whether a key (of a valid index) is in the set the searches keep so far,
 * ties at tkey aside (they need their rank among the shard's ties): the
 * state's fields in registers (the state is in shared memory, which the
 * passes' atomics may alias, so a pass would reload it per element). */
struct KeptKeys {
  uint32_t mpkey, tkey;
  bool has_thr;
  __device__ __forceinline__ explicit KeptKeys(const SState& st)
      : mpkey(st.mpkey), tkey(st.tkey), has_thr(st.has_thr != 0) {}
  __device__ __forceinline__ bool above(uint32_t key) const {
    return key >= mpkey && (!has_thr || key >= tkey);
  }
};

/* ---- histogram passes (K: counts, P: masses) over a shard ------------------------- */
/* x added to the 64-bit sum (*hi, *lo) with two 32-bit shared-memory
 * atomics: a 64-bit one is a compare-and-swap loop on sm_90, which the warps
 * of a block hitting one bin (most of a row falls into a few) serialize.
 * Every wrap of *lo is seen by the one addition that caused it, so the
 * final (hi, lo) is the exact sum whatever the order. */
__device__ __forceinline__ void sharedAdd64(uint32_t* lo, uint32_t* hi, u64 x) {
  const uint32_t xl = (uint32_t)x;
  const uint32_t old = atomicAdd(lo, xl);
  const uint32_t xh = (uint32_t)(x >> 32) + (old + xl < old ? 1u : 0u);
  if (xh != 0u) atomicAdd(hi, xh);
}

/* Each thread sums the terms of its last four bins in registers and adds a
 * sum to the block's bins only when its bin leaves those four, and at the
 * end: most of a row falls into a few bins, which every warp of the block
 * would otherwise hit with shared-memory atomics (in the first round of a
 * realistic row about three quarters of the elements changed a thread's
 * single bin, and the atomics on those few addresses set the pass's pace).
 * Integer sums, so the order does not matter. */
template <bool MASS>
struct HistVisit {
  KeptKeys kk;
  uint32_t mask, prefix, dmask;
  int shift;
  bool tie_out; /* P: ties of the top-k threshold come from the merge (their rank) */
  MassScale ms;
  uint32_t* lo; /* counts (K), low words of the masses (P) */
  uint32_t* hi; /* P: high words */
  static constexpr uint32_t NONE = 0xffffffffu;
  uint32_t c0 = NONE, c1 = NONE, c2 = NONE, c3 = NONE; /* the cached bins */
  u64 s0 = 0ull, s1 = 0ull, s2 = 0ull, s3 = 0ull;      /* and their sums */
  __device__ __forceinline__ void flushBin(uint32_t d, u64 sum) {
    if (d != NONE && sum != 0ull) {
      if (MASS) sharedAdd64(&lo[d], &hi[d], sum);
      else atomicAdd(&lo[d], (uint32_t)sum); /* a shard's count fits */
    }
  }
  __device__ __forceinline__ void add(uint32_t d, u64 t) {
    const bool h0 = d == c0, h1 = d == c1, h2 = d == c2, h3 = d == c3;
    s0 += h0 ? t : 0ull;
    s1 += h1 ? t : 0ull;
    s2 += h2 ? t : 0ull;
    s3 += h3 ? t : 0ull;
    if (!(h0 || h1 || h2 || h3)) { /* the oldest bin leaves */
      flushBin(c3, s3);
      c3 = c2;
      s3 = s2;
      c2 = c1;
      s2 = s1;
      c1 = c0;
      s1 = s0;
      c0 = d;
      s0 = t;
    }
  }
  __device__ __forceinline__ void flush() {
    flushBin(c0, s0);
    flushBin(c1, s1);
    flushBin(c2, s2);
    flushBin(c3, s3);
  }
  template <int CN>
  __device__ __forceinline__ void run(long long, const float (&v)[CN]) {
#pragma unroll
    for (int t = 0; t < CN; ++t) {
      const float x = v[t];
      const uint32_t key = orderKey(x);
      const bool in = x > -INFINITY && (key & mask) == prefix && kk.above(key) &&
                      !(tie_out && key == kk.tkey);
      if (!in) continue;
      add((key >> shift) & dmask, MASS ? massTerm(x, ms) : 1ull);
    }
  }
};

/* Vectors in flight per thread in the searches' passes (the histograms and
 * the race over the kept set). Each vector's values are visited unrolled,
 * so the loop's code grows with it: at 4 a bf16 mass round's loop was 32
 * element bodies, about 40 KB of SASS (session 30, nvdisasm), larger than an
 * SM partition's first-level instruction cache. Not yet measured. */
constexpr int SEARCH_VECS = 1;

/* The histogram of columns [from, to) of a shard for the state's current
 * round (digits D) into bins[D::BINS] (u64; counts for K). Every thread
 * calls it. */
template <class D, typename X>
__device__ void histPass(const SState& st, const char* rowp, int dtype, long long from,
                         long long to, const X& xf, u64* bins) {
  __shared__ uint32_t s_lo[D::BINS], s_hi[D::BINS];
  for (int i = threadIdx.x; i < D::BINS; i += blockDim.x) {
    s_lo[i] = 0u;
    s_hi[i] = 0u;
  }
  __syncthreads();
  int shift, width;
  D::of(st.round, &shift, &width);
  const KeptKeys kk(st);
  const uint32_t mask = D::mask(st.round), dmask = (1u << width) - 1u;
  const bool tie_out = st.mode == MODE_P && st.has_thr && !st.qall;
  /* P where the digit reaches the dtype's last bit: a bin holds one value,
   * so its mass is its count times that value's term (exact: the same
   * integer sum), and the pass counts */
  const bool counted = st.mode == MODE_P && shift <= st.zb;
  if (st.mode == MODE_P && !counted) {
    HistVisit<true> v{kk, mask, st.prefix, dmask, shift, tie_out, massScale(st), s_lo, s_hi};
    forEachElemX<SEARCH_VECS>(rowp, dtype, from, to, xf, v);
    v.flush();
  } else {
    HistVisit<false> v{kk, mask, st.prefix, dmask, shift, tie_out, massScale(st), s_lo, s_hi};
    forEachElemX<SEARCH_VECS>(rowp, dtype, from, to, xf, v);
    v.flush();
  }
  __syncthreads();
  const MassScale ms = massScale(st);
  for (int i = threadIdx.x; i < D::BINS; i += blockDim.x) {
    u64 b = ((u64)s_hi[i] << 32) | s_lo[i];
    if (counted && b != 0ull) {
      const uint32_t key = keyOfPrefix(st.prefix | ((uint32_t)i << shift), shift);
      b *= keyMass(ms, key);
    }
    bins[i] = b;
  }
  __syncthreads();
}

/* P: the top-k threshold's ties, which the histograms leave out (their rank
 * decides which are kept): their bin this round (-1: none) and the mass of
 * each; every rank's quota of them counts in that bin. */
__device__ __forceinline__ void searchTieBin(const SState& st, int shift, int nb, uint32_t mask,
                                             u64* tie_m, int* tie_d) {
  *tie_m = 0ull;
  *tie_d = -1;
  if (st.mode == MODE_P && st.has_thr && !st.qall && (st.tkey & mask) == st.prefix) {
    *tie_m = keyMass(st, st.tkey);
    *tie_d = (int)((st.tkey >> shift) & (uint32_t)(nb - 1));
  }
}

/* Every rank's bins of a round as a merge reads them: rb(r, d) is bin d of
 * rank r (of chunk r of a split row). */
struct ArrayBins { /* rank r's at p[r * stride] */
  const u64* p;
  int stride;
  __device__ __forceinline__ u64 operator()(int r, int d) const { return p[r * stride + d]; }
};

/* Bin d of rank r as the merge counts it: with r's quota of the top-k
 * threshold's ties (mass tie_m each) in their bin tie_d (searchTieBin). */
template <class RB>
__device__ __forceinline__ u64 rankBin(const SState& st, const RB& rb, int r, int d, int tie_d,
                                       u64 tie_m) {
  return rb(r, d) + (d == tie_d ? (u64)st.quota[r] * tie_m : 0ull);
}

/* The round's bins summed over the ranks into h[d], a thread per bin; every
 * thread calls (a barrier at the end). */
template <class D, class RB>
__device__ void searchTotals(const SState& st, const RB& rb, int tp, u64* h) {
  int shift, width;
  D::of(st.round, &shift, &width);
  const int nb = 1 << width;
  u64 tie_m;
  int tie_d;
  searchTieBin(st, shift, nb, D::mask(st.round), &tie_m, &tie_d);
  for (int d = threadIdx.x; d < nb; d += blockDim.x) {
    u64 s = 0ull;
    for (int r = 0; r < tp; ++r) s += rankBin(st, rb, r, d, tie_d, tie_m);
    h[d] = s;
  }
  __syncthreads();
}

/* One round of the search from every rank's bins rb and their totals h
 * (searchTotals); the 32 threads of one warp call, a lane holding the BPL
 * bins from BPL lane on and, for the tie quotas, rank lane. Moves the state
 * to its next round or mode (every lane reads the state before lane 0 and
 * the quota lanes write it). */
template <class D, class RB>
__device__ void searchMerge(SState& st, const RB& rb, int tp, const u64* h) {
  constexpr int BPL = D::BINS / 32;
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  int shift, width;
  D::of(st.round, &shift, &width);
  const int nb = 1 << width;
  const uint32_t mask = D::mask(st.round);
  u64 tie_m;
  int tie_d;
  searchTieBin(st, shift, nb, mask, &tie_m, &tie_d);
  const int d0 = BPL * lane;
  u64 hv[BPL], own = 0ull;
#pragma unroll
  for (int i = 0; i < BPL; ++i) {
    hv[i] = d0 + i < nb ? h[d0 + i] : 0ull;
    own += hv[i];
  }
  /* S(d) = sum of h[e], e >= d; Sl = S(d0) */
  u64 Sl = own;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_down_sync(full, Sl, o);
    if (lane + o < 32) Sl += y;
  }
  const u64 total = __shfl_sync(full, Sl, 0);
  /* The bin where the masses (counts) from the top reach `goal` over `base`:
   * the largest d >= 1 with base + S(d) >= goal, else 0 (S falls with d);
   * *hd = h[d], *rel = S(d + 1), the part of the bins above it. Each lane
   * finds its largest such bin; the highest lane that has one holds d. */
  auto reach = [&](u64 base, u64 goal, u64* hd, u64* rel) {
    int dl = -1;
    u64 sl = 0ull, hl = 0ull, s = Sl - own; /* S(d0 + BPL) */
#pragma unroll
    for (int i = BPL - 1; i >= 0; --i) {
      s += hv[i];
      if (dl < 0 && d0 + i >= 1 && d0 + i < nb && base + s >= goal) {
        dl = d0 + i;
        sl = s;
        hl = hv[i];
      }
    }
    const unsigned b = __ballot_sync(full, dl >= 0);
    const int src = b ? 31 - __clz((int)b) : 0;
    const int d = b ? __shfl_sync(full, dl, src) : 0;
    const u64 sd = b ? __shfl_sync(full, sl, src) : total;
    *hd = b ? __shfl_sync(full, hl, src) : __shfl_sync(full, hv[0], 0);
    *rel = sd - *hd;
    return d;
  };
  /* The first `left` of the ties by global index, rank by rank (rank r
   * holds c of them): lane r's quota, min(c, what the lower ranks left). */
  auto quotaOf = [&](u64 left, u64 c) {
    u64 before = c;
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y = __shfl_up_sync(full, before, o);
      if (lane >= o) before += y;
    }
    before -= c;
    const u64 rest = left > before ? left - before : 0ull;
    return (uint32_t)(rest < c ? rest : c);
  };
  const int r = lane;
  const bool rank = r < DPS_PEER_MAX_RANKS;
  if (st.mode == MODE_K) {
    const int round = st.round;
    u64 need = st.need;
    uint32_t prefix = st.prefix;
    bool done = false, thr = false, qall = false;
    uint32_t tkey = 0u, q = 0u, whole = 0u;
    if (round == 0 && total < need) {
      done = true; /* min-p left fewer than k: top-k keeps them all */
    } else {
      u64 hd, above;
      const int d = reach(0ull, need, &hd, &above);
      need -= above;
      prefix |= (uint32_t)d << shift;
      if (hd == need || shift <= st.zb) {
        thr = true;
        qall = hd == need;
        tkey = qall ? prefix : keyOfPrefix(prefix, shift);
        /* the first `need` ties by global index: rank by rank */
        const u64 c = rank && r < tp ? rb(r, d) : 0ull;
        q = quotaOf(need, c);
        whole = __ballot_sync(full, (u64)q == c);
        done = true;
      }
    }
    __syncwarp();
    if (thr && !qall && rank) st.quota[r] = q;
    if (lane == 0) {
      if (thr) {
        st.has_thr = 1;
        st.qall = qall;
        st.tkey = tkey;
        st.whole = whole;
      }
      if (done) {
        st.mode = st.topp_after ? MODE_P : MODE_RACE;
        st.round = 0;
        st.prefix = 0u;
        st.above = 0ull;
      } else {
        st.need = need;
        st.prefix = prefix;
        st.round = round + 1;
      }
    }
    __syncwarp();
    return;
  }
  /* MODE_P: keep an index iff the mass before it is < P */
  const u64 P = st.round == 0 ? ceilMass((double)st.top_p * (double)total) : st.P;
  u64 above = st.round == 0 ? 0ull : st.above;
  u64 hd, rel;
  const int d = reach(above, P, &hd, &rel);
  above += rel;
  const uint32_t prefix = st.prefix | ((uint32_t)d << shift);
  const bool last = above + hd <= P || shift <= st.zb;
  bool all = above + hd <= P, set = false;
  uint32_t q = 0u, tkey = 0u, whole = 0u;
  if (last) {
    const uint32_t kone = keyOfPrefix(prefix, shift);
    if (!all) { /* one key value: ties of equal mass m, by global index */
      const u64 m = keyMass(st, kone);
      if (m == 0ull) {
        all = true;
      } else {
        const u64 c = rank && r < tp ? rankBin(st, rb, r, d, tie_d, tie_m) / m : 0ull;
        q = quotaOf((P - above + m - 1ull) / m, c);
        /* in the top-k threshold's bin, c counts only the ties top-k kept */
        whole = __ballot_sync(full, (u64)q == c && (d != tie_d || ((st.whole >> r) & 1u)));
      }
    }
    /* a whole bin at or below the top-k threshold keeps all of S: the top-k
     * threshold (and its quotas) stays */
    set = !(all && st.has_thr && prefix <= st.tkey);
    tkey = all ? prefix : kone;
  }
  __syncwarp();
  if (set && !all && rank) st.quota[r] = q;
  if (lane == 0) {
    st.P = P;
    st.above = above;
    st.prefix = prefix;
    if (last) {
      if (set) {
        st.has_thr = 1;
        st.tkey = tkey;
        st.qall = all;
        st.whole = whole;
      }
      st.mode = MODE_RACE;
      st.round = 0;
    } else {
      ++st.round;
    }
  }
  __syncwarp();
}

/* ---- the race over the kept set of a shard ---------------------------------------- */
/* The column of the quota-th tie (key == tkey, in the kept set) among
 * columns [from, to) of the shard in index order: ties at the threshold are
 * kept by index, so tied columns <= the result are kept; -1 for quota 0, `to`
 * when the range holds fewer. Tiles of 8 columns a thread, counted and
 * scanned in index order; stops at the quota. Every thread calls. */
template <typename X>
__device__ long long tieCutoff(const SState& st, const char* rowp, int dtype, long long from,
                               long long to, const X& xf, uint32_t quota) {
  __shared__ uint32_t s_warp[WARPS];
  __shared__ long long s_cut;
  if (quota == 0u) return -1;
  __syncthreads(); /* the previous reader of s_cut is done */
  if (threadIdx.x == 0) s_cut = to;
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
  const KeptKeys kk(st);
  uint32_t running = 0u;
  for (long long base = from; base < to; base += (long long)blockDim.x * 8) {
    const long long j0 = base + (long long)threadIdx.x * 8;
    /* the 8 loads issued together (a load behind each bounds test would
     * wait for the one before); out-of-range columns read column j0 */
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long j = j0 + u < to ? j0 + u : (j0 < to ? j0 : from);
      v[u] = xf.one(j, loadValue(rowp, j, dtype));
    }
    uint32_t m = 0u;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float x = v[u];
      const uint32_t key = orderKey(x);
      if (j0 + u < to && x > -INFINITY && key == kk.tkey && kk.above(key)) m |= 1u << u;
    }
    const uint32_t c = (uint32_t)__popc(m);
    uint32_t inc = c;
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane == 31) s_warp[w] = inc;
    __syncthreads();
    uint32_t before = 0u, total = 0u;
    for (int i = 0; i < nw; ++i) {
      before += i < w ? s_warp[i] : 0u;
      total += s_warp[i];
    }
    const uint32_t excl = running + before + inc - c;
    if (excl < quota && quota <= excl + c) { /* the quota-th tie is one of this thread's */
      uint32_t left = quota - excl;
      int u = 0;
      for (; u < 8; ++u)
        if (((m >> u) & 1u) && --left == 0u) break;
      s_cut = j0 + u;
    }
    running += total;
    __syncthreads(); /* s_warp is rewritten next; s_cut is set */
    if (running >= quota) break;
  }
  return s_cut;
}

/* The race over the kept set: the values outside it become -inf, which the
 * race skips; a warp with none kept skips the noise too. */
struct KeptVisit {
  KeptKeys kk;
  long long col0, cut;
  bool ties;
  Race race;
  template <int C>
  __device__ __forceinline__ void run(long long j0, const float (&v)[C]) {
    float w[C];
    bool any = false;
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const float x = v[t];
      const uint32_t key = orderKey(x);
      bool keep = x > -INFINITY && kk.above(key);
      if (ties && key == kk.tkey) keep = keep && j0 + t <= cut;
      w[t] = keep ? x : -INFINITY;
      any = any || keep;
    }
    if (__any_sync(0xffffffffu, any)) race.visit<C>((uint32_t)(col0 + j0), w);
  }
};

/* The race over the kept set within columns [from, to) of the shard; `part`
 * indexes the state's tie quotas (the rank, or the chunk of a split row).
 * The best key, its index and its logit into *bk, *bi, *bv. */
template <typename X>
__device__ void racePass(const SState& st, const char* rowp, int dtype, long long col0,
                         long long from, long long to, int part, const X& xf, float* bk,
                         uint32_t* bi, float* bv) {
  __shared__ Hdr s_h;
  const bool ties = st.has_thr && !st.qall;
  KeptVisit f{KeptKeys(st)};
  f.col0 = col0;
  f.ties = ties;
  /* a part that keeps all its ties needs no cut (before the part holding
   * the boundary, every part's quota is its count) */
  const bool cut = ties && !((st.whole >> part) & 1u);
  f.cut = cut ? tieCutoff(st, rowp, dtype, from, to, xf, st.quota[part]) : to;
  f.race.init(st.T, st.seed, st.offset);
  forEachElemWarpX<2 * SEARCH_VECS>(rowp, dtype, from, to, xf, f);
  f.race.finish();
  Hdr h;
  hdrInit(h);
  h.rkey = f.race.best.k;
  h.ridx = f.race.best.i;
  h.rval = f.race.best.v;
  blockHdrReduce<false, false>(h, &s_h);
  *bk = s_h.rkey;
  *bi = s_h.ridx;
  *bv = s_h.rval;
  __syncthreads();
}

}  // namespace

#endif /* DPS_SAMPLE_SEARCH_CUH_ */
