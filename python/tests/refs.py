"""Ground truth of the selections, from the full rows on the host (shared by
test_select.py and test_world_sizes.py), with the documented rules: NaN
counts as -inf, ties go to the lower index, columns at or beyond vocab_limit
are excluded. The selection references need torch; the sampling references
below (the distribution of spec section 1 in float64, the documented noise,
a chi-square p-value) are plain Python, so that test_sample.py can check them
without torch or a GPU."""

import math
import struct

try:
    import torch
except ImportError:  # the sampling references below need no torch
    torch = None


def logit_rows(rows, vocab, dtype, seed):
    """[rows, vocab] logits on the host, the same for every seed on every
    rank, rows of every kind: ties (a few values only), NaN scattered, all
    NaN, all -inf, +inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (rows, vocab), generator=g).float() * 0.25 - 8.0
    for r in range(rows):
        kind = r % 6
        if kind == 1:
            x[r, torch.rand(vocab, generator=g) < 0.2] = float("nan")
        elif kind == 2:
            x[r] = float("nan")
        elif kind == 3:
            x[r] = float("-inf")
        elif kind == 4:
            x[r, torch.randint(0, vocab, (2,), generator=g)] = float("inf")
    return x.to(dtype)


def nan_as_neginf(x):
    x = x.float().cpu()
    return torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)


def argmax_ref(x, limit):
    """(values, indices, logsumexp) of every row over its columns below limit."""
    v = nan_as_neginf(x[:, :limit])
    idx = v.argmax(dim=-1)
    return v.gather(1, idx[:, None])[:, 0], idx, torch.logsumexp(x[:, :limit].float().cpu(), -1)


def topk_ref(x, limit, k):
    """(values, indices) of every row's k best below limit, best first."""
    vals, idx = torch.sort(nan_as_neginf(x[:, :limit]), dim=-1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]


# ---- sampling (dpsSample): spec sampling.md section 1, docs/sampling.md ------------


def f32(x):
    """x rounded to the nearest fp32 (what the library receives for a Python
    float; also fp32 arithmetic: a double result of one fp32 +, -, * or /
    rounded to fp32 is the correctly rounded fp32 result)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def sample_probs_ref(row, temperature, top_k=0, top_p=1.0, min_p=0.0, vocab_limit=None):
    """The distribution of one row, {global index: probability} in float64,
    following spec section 1 step by step: A = the indices below vocab_limit
    whose logit is neither NaN nor -inf; empty A -> token 0; T == 0 -> the
    argmax of A, lowest index on ties; (our rule) a +inf logit -> the lowest
    +inf index; else min-p (keep exp((l - l_max)/T) >= min_p), top-k (the
    first top_k in the order value descending, index ascending: exactly k),
    top-p (keep i iff the mass of S strictly before i is < top_p), and
    p_i proportional to exp(l_i/T) over what is kept. `row` is a sequence of
    floats (the logits as the kernel reads them); the float parameters are
    rounded to fp32 first, as the library receives them."""
    T, top_p, min_p = f32(temperature), f32(top_p), f32(min_p)
    limit = len(row) if vocab_limit is None else min(vocab_limit, len(row))
    A = [i for i in range(limit) if not math.isnan(row[i]) and row[i] != -math.inf]
    if not A:
        return {0: 1.0}
    lmax = max(row[i] for i in A)
    best = min(i for i in A if row[i] == lmax)
    if T == 0 or lmax == math.inf:
        return {best: 1.0}
    S = A
    if min_p > 0:
        S = [i for i in S if math.exp((row[i] - lmax) / T) >= min_p]
    order = sorted(S, key=lambda i: (-row[i], i))
    if 0 < top_k < len(order):
        order = order[:top_k]
    w = {i: math.exp((row[i] - lmax) / T) for i in order}
    if top_p < 1:
        total = math.fsum(w.values())
        kept, before = [], 0.0
        for i in order:
            if before / total >= top_p:
                break
            kept.append(i)
            before += w[i]
        order = kept
    z = math.fsum(w[i] for i in order)
    return {i: w[i] / z for i in order}


def logprob_ref(row, token, vocab_limit=None):
    """The raw log_softmax of the row at `token` over A (float64; NaN counts
    as -inf): -inf for an empty A, NaN where A holds +inf (inf - inf)."""
    limit = len(row) if vocab_limit is None else min(vocab_limit, len(row))
    A = [row[i] for i in range(limit) if not math.isnan(row[i]) and row[i] != -math.inf]
    if not A:
        return -math.inf
    m = max(A)
    if m == math.inf:
        return math.nan
    lse = m + math.log(math.fsum(math.exp(v - m) for v in A))
    v = row[token]
    return -math.inf if math.isnan(v) else v - lse


# The documented noise (docs/sampling.md, "The draw"), in plain Python: every
# step is an IEEE double operation (CPython rounds each one, never fuses), so
# it reproduces the library's bits.
_M32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """Random123's philox4x32 with 10 rounds: 4 words of (4-word ctr, 2-word key)."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & _M32
            k1 = (k1 + 0xBB67AE85) & _M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _M32, (p0 >> 32) ^ c3 ^ k1, p0 & _M32
    return c0, c1, c2, c3


def _bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _from_bits(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def log_det(x):
    """dpsLogDet: the library's deterministic natural log (fdlibm's
    reduction, a degree-8 polynomial by Estrin's scheme), bit for bit."""
    b = _bits(x)
    if x != x or (b >> 63):
        return -math.inf if x == 0 else math.nan
    if x == 0:
        return -math.inf
    if b >= 0x7FF0000000000000:
        return x
    e = 0
    if b < 0x0010000000000000:
        b = _bits(x * 18014398509481984.0)
        e = -54
    frac = b & 0x000FFFFFFFFFFFFF
    up = 1 if frac >= 0x6A09E667F3BCD else 0
    e += (b >> 52) - 1023 + up
    m = _from_bits(frac | ((1023 - up) << 52))
    f = (m - 1.0) / (m + 1.0)
    s = f * f
    s2 = s * s
    s4 = s2 * s2
    q1 = 0.66666666666666663 + 0.40000000000000002 * s
    q2 = 0.28571428571428571 + 0.22222222222222222 * s
    q3 = 0.18181818181818182 + 0.15384615384615385 * s
    q4 = 0.13333333333333333 + 0.11764705882352941 * s
    r1 = q1 + s2 * q2
    r2 = q3 + s2 * q4
    p = r1 + s4 * r2
    tail = (f * s) * p
    de = float(e)
    small = ((de * 1.90821492927058770002e-10) + tail) + 2.0 * f
    return de * 6.93147180369123816490e-01 + small


GROUP = 8  # indices per group (g = index >> 3, t = index & 7)


def _sample_philox(seed, offset, q, d):
    """P(q, d): the Philox4x32-10 call of counter q in stream d (0: the
    indices' words, 1: the groups'): counter (q lo, q hi | d << 31, offset
    lo, offset hi), key (seed lo, seed hi)."""
    key = (seed & _M32, (seed >> 32) & _M32)
    ctr = (q & _M32, (q >> 32) | (d << 31), offset & _M32, (offset >> 32) & _M32)
    return philox4x32_10(ctr, key)


def sample_group_call(index):
    """(q, r): the group word of index's group g = index >> 3 is word r =
    (g >> 5) & 3 of stream 1's call q = ((g >> 7) << 5) | (g & 31) (the
    groups g, g + 32, g + 64, g + 96 of an aligned run of 128 share it)."""
    g = index >> 3
    return ((g >> 7) << 5) | (g & 31), (g >> 5) & 3


def sample_group_word(seed, offset, index):
    """w of (seed, offset, global index): the word of index's group, the
    mapping of docs/sampling.md. seed and offset are uint64, index int64 >= 0."""
    q, r = sample_group_call(index)
    return _sample_philox(seed, offset, q, 1)[r]


def sample_index_bits(seed, offset, index):
    """x of (seed, offset, global index): word index & 3 of stream 0's call
    q = index >> 2 (one call serves 4 indices)."""
    return _sample_philox(seed, offset, index >> 2, 0)[index & 3]


def sample_exp(x):
    """-log(U), U = (x + 0.5) 2^-32 (exact in double): Exp(1), in [2^-33, 22.87]."""
    return -log_det((x + 0.5) * 2.3283064365386962890625e-10)


def sample_group_min(w):
    """Emin of a group word w: -log(Um) / 8 with Um = ((w >> 3) + 0.5) 2^-29
    (exact): Exp(8), in [1.16e-10, 2.60]. The group's minimum sits at its
    position w & 7."""
    return -log_det(((w >> 3) + 0.5) * 1.862645149230957031e-09) * 0.125


def sample_exp_noise(seed, offset, index, w=None):
    """E of (seed, offset, index): Emin at the group's position (index & 7 ==
    w & 7), Emin + (-log U(x)) elsewhere (one double add). w: the group's
    word when the caller has it already."""
    if w is None:
        w = sample_group_word(seed, offset, index)
    emin = sample_group_min(w)
    if index & 7 == w & 7:
        return emin
    return emin + sample_exp(sample_index_bits(seed, offset, index))


def sample_gumbel(seed, offset, index, w=None):
    """G = -log(E), standard Gumbel, with the deterministic log: in [-3.24, 22.87]."""
    return -log_det(sample_exp_noise(seed, offset, index, w))


def sample_token_ref(row, kept, temperature, seed, offset):
    """The token the race draws over `kept` (from sample_probs_ref): the
    index with the largest fp32 key fp32(fp32(l/T) + G), ties to the lower
    index; a one-token support is that token (greedy, empty row, +inf)."""
    if len(kept) == 1:
        return next(iter(kept))
    T = f32(temperature)
    seed, offset = seed % 2**64, offset % 2**64
    calls = {}  # stream 1's calls, each once (4 groups' words)
    token, best = None, None
    for i in sorted(kept):
        q, r = sample_group_call(i)
        if q not in calls:
            calls[q] = _sample_philox(seed, offset, q, 1)
        key = f32(f32(row[i] / T) + sample_gumbel(seed, offset, i, calls[q][r]))
        if best is None or key > best:
            token, best = i, key
    return token


# ---- chi-square, without scipy ----------------------------------------------------


def _gamma_q(a, x):
    """The regularized upper incomplete gamma Q(a, x) (Numerical Recipes'
    gser / gcf)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:  # series for P
        term = total = 1.0 / a
        ap = a
        for _ in range(100000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    tiny = 1e-300  # continued fraction for Q (modified Lentz)
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi2_sf(x, dof):
    """P(X >= x) for X chi-square with dof degrees of freedom."""
    return _gamma_q(dof / 2.0, x / 2.0)


def chisquare_test(counts, probs, min_expected=5.0):
    """(p-value, draws outside the support) of observed counts
    {index: count} against probabilities {index: p}. Bins expected below
    min_expected are pooled into one; the draws of indices without
    probability are returned apart (any is a failure of its own)."""
    n = sum(counts.values())
    outside = sum(c for i, c in counts.items() if probs.get(i, 0.0) == 0.0)
    stat, dof = 0.0, -1
    pool_e = pool_o = 0.0
    for i, p in probs.items():
        e, o = n * p, counts.get(i, 0)
        if e < min_expected:
            pool_e += e
            pool_o += o
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / pool_e
        dof += 1
    if dof < 1:
        return 1.0, outside
    return chi2_sf(stat, dof), outside


# ---- the soft-cap (docs/sampling.md, "The soft-cap") ------------------------------


def expm1_det(y):
    """dpsExpm1Det (0 <= y < 44): fdlibm's reduction by ln2, a degree-13
    Horner polynomial, bit for bit (each step one IEEE double operation)."""
    ln2_hi = 6.93147180369123816490e-01
    ln2_lo = 1.90821492927058770002e-10
    k = int(y * 1.4426950408889634 + 0.5)
    dk = float(k)
    r = (y - dk * ln2_hi) - dk * ln2_lo
    q = 1.6059043836821613e-10
    for c in (2.08767569878681e-09, 2.505210838544172e-08, 2.7557319223985888e-07,
              2.7557319223985893e-06, 2.4801587301587302e-05, 1.9841269841269841e-04,
              1.3888888888888889e-03, 8.3333333333333332e-03, 4.1666666666666664e-02,
              1.6666666666666666e-01, 0.5):
        q = c + r * q
    em = r + (r * r) * q
    if k == 0:
        return em
    t = _from_bits((1023 + k) << 52)
    return (t - 1.0) + t * em


def tanh_det(x):
    """dpsTanhDet: x below 2^-27, sign(x) E / (E + 2) with E = expm1(2|x|)
    below 22, sign(x) beyond; bit for bit."""
    if x != x:
        return x
    ax = abs(x)
    if ax < 7.450580596923828125e-09:
        return x
    t = 1.0
    if ax < 22.0:
        e = expm1_det(2.0 * ax)
        t = e / (e + 2.0)
    return -t if _bits(x) >> 63 else t


def softcap_ref(logit, cap):
    """dpsSampleSoftCap: fp32(c * tanh(l / c)), the quotient and the product
    in double, one rounding to fp32 at the end; NaN and +-inf unchanged.
    `logit` and `cap` are fp32 values (as Python floats)."""
    if logit != logit or logit in (math.inf, -math.inf):
        return logit
    return f32(cap * tanh_det(logit / cap))
