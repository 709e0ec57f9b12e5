"""DpSamplingComm.sample / sample_stats (dpsSample), tp=1 on one GPU.

Every value is checked against ground truth computed here from the full rows
in float64 (refs.py: the distribution of spec sampling.md section 1, the
documented noise of docs/sampling.md), never one code path of the library
against another:
 - greedy rows equal torch's argmax (lowest index on ties), logprobs equal the
   raw log_softmax, empty rows give token 0 / -inf, vocab_limit holds;
 - tokens are reproducible from (seed, offset) and equal the host's race over
   the documented Philox noise;
 - the token distribution passes a chi-square test against the float64
   reference (p > 1e-6) for each filter alone and combined, on the one-pass
   and the exact path, and a reference with a planted bug (top-k keeping k+1)
   fails it on the same draws, which shows the test can fail;
 - a CUDA graph replayed with changed parameter tensors gives the eager tokens.
The first part (the references themselves, and the arguments refused in
Python) needs neither torch nor a GPU.
"""

import inspect
import math
import random
import struct

import pytest

import refs
from refs import chisquare_test, logprob_ref, sample_probs_ref, sample_token_ref

try:
    import torch
except ImportError:
    torch = None

import dpsampling
from dpsampling import DpSamplingComm

gpu = pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                         reason="needs torch and a CUDA device")
BACKENDS = ["nccl", "onesided"]
P_MIN = 1e-6  # chi-square p-value threshold


# ---- the references (no torch, no GPU) -----------------------------------------


def test_philox_matches_random123_kat_and_the_library_pins():
    kat = [  # Random123 kat_vectors, "philox4x32 10": ctr, key, expected
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in kat:
        assert refs.philox4x32_10(ctr, key) == want
    # tests/cpu/test_sample_ref.c's pins: (seed, offset, index, w, x, bits of G),
    # computed by this file's refs (the mapping written out in plain Python)
    # and equal to the C header's. Indices 0..3 of (0, 0) share the index
    # stream's call q = 0, whose counter and key are all zeros: their x are
    # the first KAT vector's words, in order. 0x7, 0x102 and (0xDEADBEEFCAFEBABE,
    # 7) 0x1869E sit at their group's position (w & 7 == index & 7: G =
    # -log(Emin)); 0x100, 0x200, 0x300 take words 1..3 of group 0's call
    # (groups 32, 64, 96), 0x400 the next run's first call (q = 32); the
    # others reach both words of seed, offset and q.
    pins = [
        (0x0, 0x0, 0x0, 0xA2B20CCF, 0x6627E8D5, 0x3F9991A39EBD1D03),
        (0x0, 0x0, 0x1, 0xA2B20CCF, 0xE169C58D, 0x3FFB17EA0E6230B8),
        (0x0, 0x0, 0x2, 0xA2B20CCF, 0xBC57AC4C, 0x3FF0302DE2F2B368),
        (0x0, 0x0, 0x3, 0xA2B20CCF, 0x9B00DBD8, 0x3FE2A56AF046A9D8),
        (0x0, 0x0, 0x4, 0xA2B20CCF, 0xF8E4CCA4, 0x4003BD0828D5A9D6),
        (0x0, 0x0, 0x7, 0xA2B20CCF, 0x097EFF67, 0x4006F716EC2BBFBF),
        (0x0, 0x0, 0x8, 0x4D789CC1, 0x04FAA329, 0xBFF688BEFF289113),
        (0x0, 0x0, 0x100, 0x51408772, 0x2464D502, 0xBFE7A768DFD396AF),
        (0x0, 0x0, 0x102, 0x51408772, 0x24AD2063, 0x3FFF1168BCCC81FE),
        (0x0, 0x0, 0x200, 0x94FCF7EF, 0xDDF3C327, 0x3FF8F105D55F529A),
        (0x0, 0x0, 0x300, 0xB688835A, 0x3D1B5B8E, 0xBFD8DDED449652E2),
        (0x0, 0x0, 0x400, 0xF7FF595C, 0xC2972A5A, 0x3FF477BF5E584F4C),
        (0x1, 0x0, 0x0, 0x34A4D61D, 0xE3E80670, 0x3FF2895B0E767714),
        (0x0, 0x1, 0x0, 0xBD7F559E, 0x844515E1, 0x3FD70433FAF78A9B),
        (0x123456789ABCDEF, 0x2A, 0x2517F, 0x235F0496, 0x52FF57F6, 0xBFD452F9E3AB89B0),
        (0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x5CE0CC3D, 0x69DA1AC1,
         0xBF841E6439F4726E),
        (0x3039, 0x100000000, 0x100000007, 0x53D4EBB5, 0xC26AC628, 0x3FEC2A40F5C62B88),
        (0xDEADBEEFCAFEBABE, 0x7, 0x1869F, 0x05169C7E, 0x82CC2DF8, 0xBFC32445FEBF5328),
        (0xDEADBEEFCAFEBABE, 0x7, 0x1869E, 0x05169C7E, 0x6D8712C3, 0x3FE6D776FC557551),
        (0x2A, 0x3, 0x123456789ABC, 0x06B4EAF6, 0x691BB0B5, 0xBFD2FD8D7BD8B05B),
    ]
    kat0 = kat[0][2]
    for i in range(4):  # x of indices 0..3 at (0, 0): the KAT words
        assert pins[i][4] == kat0[i]
    at_pos = 0
    for seed, offset, index, w, x, g_bits in pins:
        assert refs.sample_group_word(seed, offset, index) == w
        assert refs.sample_index_bits(seed, offset, index) == x
        assert refs._bits(refs.sample_gumbel(seed, offset, index)) == g_bits
        if index & 7 == w & 7:  # the group's position: E = Emin, G = -log(Emin)
            at_pos += 1
            assert refs.sample_gumbel(seed, offset, index) == -refs.log_det(
                refs.sample_group_min(w))
    assert at_pos == 3
    # the group word written out from the raw Philox: group 0x20 (index
    # 0x100) is word 1 of stream 1's call q = 0, as group 0's is word 0
    g_call = refs.philox4x32_10((0, 1 << 31, 0, 0), (0, 0))
    assert (g_call[0], g_call[1]) == (pins[0][3], pins[7][3])
    assert (g_call[2], g_call[3]) == (pins[9][3], pins[10][3])


def test_noise_follows_the_documented_ranges():
    """The noise against libm and its ranges: -log(U(x)) within a few double
    ulps of -math.log(U) and in [2^-33, 22.874] (33 ln 2 = 22.8739); Emin =
    -log(Um) / 8 in [1.16e-10, 2.60] (30 ln 2 / 8 = 2.59930); G = -log(E) in
    [-3.24, 22.87], the extremes at the largest E (Emin and -log U both
    largest) and at the smallest Emin (a group's position)."""
    rng = random.Random(3)
    for x in [0, 1, 2, 7, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF8, 0xFFFFFFFE, 0xFFFFFFFF] + [
            rng.getrandbits(32) for _ in range(2000)]:
        u = (x + 0.5) * 2.0**-32
        e = refs.sample_exp(x)
        assert abs(e - (-math.log(u))) <= 4e-15 * -math.log(u)
        assert 2.0**-33 <= e <= 22.874
        um = ((x >> 3) + 0.5) * 2.0**-29
        emin = refs.sample_group_min(x)
        assert abs(emin - (-math.log(um) / 8)) <= 4e-15 * (-math.log(um) / 8)
        assert 1.16e-10 < emin < 2.6
    emin_hi, emin_lo = refs.sample_group_min(0), refs.sample_group_min(0xFFFFFFFF)
    assert 2.5993 < emin_hi < 2.5994 and 1.164e-10 < emin_lo < 1.165e-10
    e_hi = emin_hi + refs.sample_exp(0)
    assert 25.47 < e_hi < 25.48
    g_lo, g_hi = -refs.log_det(e_hi), -refs.log_det(emin_lo)
    assert -3.238 < g_lo < -3.237 and 22.87 < g_hi < 22.88
    assert g_hi - g_lo < 26.2
    # over a few groups: the group's largest G sits at pos = w & 7, it is
    # -log(Emin), and the group's other G are below it
    for seed, offset, group in [(5, 6, 0), (5, 6, 1), (5, 6, 33), (0xFEED, 2**40, 2**35 + 7)]:
        w = refs.sample_group_word(seed, offset, group * 8)
        g = [refs.sample_gumbel(seed, offset, group * 8 + t) for t in range(8)]
        assert all(refs.sample_group_word(seed, offset, group * 8 + t) == w for t in range(8))
        assert max(range(8), key=lambda t: g[t]) == w & 7
        assert g[w & 7] == -refs.log_det(refs.sample_group_min(w))
        assert sum(v == g[w & 7] for v in g) == 1


def test_log_det_is_a_log():
    rng = random.Random(1)
    for _ in range(2000):
        x = math.ldexp(rng.random() + 0.5, rng.randint(-1070, 1020))
        assert abs(refs.log_det(x) - math.log(x)) <= 4e-16 * max(1.0, abs(math.log(x)))
    assert refs.log_det(0.0) == -math.inf and math.isnan(refs.log_det(-1.0))


def test_chi2_sf_known_values():
    assert abs(refs.chi2_sf(3.841458820694124, 1) - 0.05) < 1e-12
    for x in (0.5, 3.0, 40.0):
        assert abs(refs.chi2_sf(x, 2) - math.exp(-x / 2)) < 1e-14
    assert abs(refs.chi2_sf(5.0, 10) - 0.8911780189141512) < 1e-10
    assert abs(refs.chi2_sf(18.307038053275146, 10) - 0.05) < 1e-10
    assert refs.chi2_sf(200.0, 10) < 1e-30
    # the test's own power: a count off by 10 % in a bin of 10 % fails at 1e5 draws
    n = 100000
    probs = {i: 0.1 for i in range(10)}
    counts = {i: n // 10 for i in range(10)}
    assert chisquare_test(counts, probs)[0] > 0.99
    counts[0] += n // 100
    counts[1] -= n // 100
    assert chisquare_test(counts, probs)[0] < P_MIN
    assert chisquare_test({0: 5, 11: 1}, {0: 1.0})[1] == 1  # outside the support


def test_probs_ref_follows_the_spec_rules():
    inf = math.inf
    row = [1.0, 3.0, 3.0, 2.0, -inf, math.nan, 0.5, 3.0]
    assert sample_probs_ref(row, 0.0) == {1: 1.0}  # greedy, lowest index on ties
    assert sample_probs_ref(row, 0.0, vocab_limit=1) == {0: 1.0}
    assert sample_probs_ref([-inf, math.nan, -inf], 1.0, top_k=2) == {0: 1.0}  # empty A
    assert sample_probs_ref([0.0, 9.0, 1.0], 1.0, vocab_limit=1) == {0: 1.0}
    assert sample_probs_ref([0.0, inf, inf], 1.0) == {1: 1.0}
    # top-k keeps exactly k: the tie at 3.0 is cut by index
    assert set(sample_probs_ref(row, 1.0, top_k=2)) == {1, 2}
    assert set(sample_probs_ref(row, 1.0, top_k=3)) == {1, 2, 7}
    assert set(sample_probs_ref(row, 1.0, top_k=0)) == {0, 1, 2, 3, 6, 7}
    # top-p: masses before i < top_p; the first always stays
    p = sample_probs_ref([0.0, 0.0, 0.0, 0.0], 1.0, top_p=0.5)
    assert set(p) == {0, 1} and abs(p[0] - 0.5) < 1e-15
    assert set(sample_probs_ref([0.0, 0.0, 0.0, 0.0], 1.0, top_p=0.5001)) == {0, 1, 2}
    assert set(sample_probs_ref([5.0, 0.0], 1.0, top_p=1e-6)) == {0}
    # min-p: exp((l - l_max)/T) >= min_p
    m = math.log(0.25)
    assert set(sample_probs_ref([0.0, m + 1e-6, m - 1e-6], 1.0, min_p=0.25)) == {0, 1}
    assert set(sample_probs_ref([0.0, 2 * m + 1e-6, 2 * m - 1e-6], 2.0, min_p=0.25)) == {0, 1}
    # temperature: p proportional to exp(l / T)
    p = sample_probs_ref([0.0, 1.0], 0.5)
    assert abs(p[1] / p[0] - math.exp(2.0)) < 1e-12
    assert abs(logprob_ref([0.0, 0.0, -inf], 1) - math.log(0.5)) < 1e-15
    assert logprob_ref([-inf, math.nan], 0) == -inf and math.isnan(logprob_ref([inf, 0.0], 0))


def test_host_race_draws_the_distribution():
    """The host race over the documented noise is itself a sampler of p:
    a cheap check that sample_token_ref (used for the exact token test) is
    the race, not any deterministic pick."""
    row = [0.0, 1.0, -0.5, 0.25]
    probs = sample_probs_ref(row, 0.9)
    counts = {}
    for off in range(4000):
        t = sample_token_ref(row, probs, 0.9, 12345, off)
        counts[t] = counts.get(t, 0) + 1
    assert chisquare_test(counts, probs)[0] > P_MIN


# ---- arguments refused in Python, before any C call or torch use -------------


def _bare():
    return DpSamplingComm.__new__(DpSamplingComm)  # never created: no GPU needed


@pytest.mark.parametrize("kw, exc, match", [
    (dict(seed=2**64), ValueError, r"seed=18446744073709551616 is out of range"),
    (dict(seed=-2**63 - 1), ValueError, r"seed=-9223372036854775809 is out of range"),
    (dict(offset=2**64), ValueError, r"offset=18446744073709551616"),
    (dict(seed=1.0), TypeError, r"seed must be an int or a tensor \[rows\] of torch.int64"),
    (dict(offset="3"), TypeError, r"offset must be a number or a tensor"),
    (dict(seed=None), TypeError, r"seed must be an int"),
    (dict(temperature=None), TypeError, r"temperature must be a real number"),
    (dict(temperature=True), TypeError, r"temperature must be a real number"),
    (dict(temperature="0.7"), TypeError, r"temperature must be a number or a tensor"),
    (dict(top_k=2.5), TypeError, r"top_k must be an int or a tensor \[rows\] of torch.int32 "
                                 r"or torch.int64, got float"),
    (dict(top_k=2**63), ValueError, r"top_k=9223372036854775808 is out of range"),
    (dict(top_p=1j), TypeError, r"top_p must be a real number"),
    (dict(min_p=[0.1]), TypeError, r"min_p must be a number or a tensor \[rows\] of "
                                   r"torch.float32, got list"),
    (dict(vocab_limit=0), ValueError, r"vocab_limit=0"),
    (dict(out_logprobs=object()), ValueError, r"return_logprobs=False"),
    # the float parameters' ranges, on the value passed (before fp32 rounding)
    (dict(temperature=-1.0), ValueError, r"temperature=-1.0 must be finite, >= 0"),
    (dict(temperature=math.nan), ValueError, r"temperature=nan must be finite"),
    (dict(temperature=math.inf), ValueError, r"temperature=inf must be finite"),
    (dict(temperature=1e39), ValueError, r"temperature=1e\+39 must be .* within fp32's range"),
    (dict(temperature=10**400), ValueError, r"temperature=1000.* is too large for a float"),
    (dict(top_p=0), ValueError, r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1 + 1e-8), ValueError, r"top_p=1.00000001 must be in \(0, 1\]"),
    (dict(top_p=math.nan), ValueError, r"top_p=nan must be in"),
    (dict(min_p=1.0), ValueError, r"min_p=1.0 must be in \[0, 1\)"),
    (dict(min_p=-1e-30), ValueError, r"min_p=-1e-30 must be in \[0, 1\)"),
    (dict(min_p=10**400), ValueError, r"min_p=1000.* is too large for a float"),
])
def test_python_side_argument_errors(kw, exc, match):
    args = dict(temperature=0.7, seed=1, offset=2)
    args.update(kw)
    with pytest.raises(exc, match=match):
        _bare().sample(object(), **args)


def test_float_scalars_in_range_keep_their_meaning_in_fp32():
    """A value inside the spec's range stays inside it once rounded to the
    fp32 the library takes: top_p below the least positive fp32 keeps the
    first token only (not 0, refused), min_p just below 1 stays below 1 (not
    1, refused); a tiny temperature rounds to 0, the argmax (its limit)."""
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # noqa: E731
    fp = dpsampling._float_param
    assert fp("top_p", 1e-50, 1.0) == 2.0**-149 and f32(2.0**-149) > 0
    assert fp("top_p", 2.0**-140, 1.0) == 2.0**-140 and fp("top_p", 1, 1.0) == 1.0
    assert fp("min_p", 1 - 1e-8, 0.0) == 1 - 2.0**-24 and f32(1 - 2.0**-24) < 1
    assert fp("min_p", 0.5, 0.0) == 0.5 and fp("min_p", 0, 0.0) == 0.0
    assert fp("temperature", 1e-50, None) == 1e-50 and f32(1e-50) == 0.0
    assert fp("temperature", 3.4028234663852886e38, None) == 3.4028234663852886e38
    assert fp("top_p", None, 1.0) == 1.0 and fp("min_p", None, 0.0) == 0.0


def test_logits_must_be_a_tensor():
    with pytest.raises(TypeError, match="local_logits must be a torch.Tensor, got list"):
        _bare().sample([[0.0]], temperature=1.0, seed=0, offset=0)


def test_uncreated_comm_refuses_sample_and_stats():
    c = dpsampling._dpsampling.Comm()
    with pytest.raises(RuntimeError, match="closed"):
        c._sample(None, 0, 1.0, 0, 1.0, 0.0, 0, 0, None, None)
    with pytest.raises(RuntimeError, match="closed"):
        c.sample_stats()


def test_sample_signature():
    sig = inspect.signature(DpSamplingComm.sample)
    names = ["temperature", "seed", "offset", "top_k", "top_p", "min_p", "vocab_limit",
             "return_logprobs", "out", "out_logprobs"]
    for name in names:
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    for name in ("temperature", "seed", "offset"):
        assert sig.parameters[name].default is inspect.Parameter.empty, name
    assert str(inspect.signature(DpSamplingComm.sample_stats)) == "(self, /)"


# ---- GPU: helpers ------------------------------------------------------------------


def _comm(backend, V, dtype=None, max_rows=64):
    return DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=max_rows,
                          num_tokens_per_req=1, vocab_size=V,
                          logits_dtype=dtype or torch.float32, backend=backend)


def _rows_as_lists(x):
    return x.float().cpu().double().tolist()


def _check_logprobs(got, rows, tokens, limit=None):
    for r, (row, t, lp) in enumerate(zip(rows, tokens, got)):
        want = logprob_ref(row, t, limit)
        if math.isnan(want) or math.isinf(want):
            assert (math.isnan(lp) and math.isnan(want)) or lp == want, (r, lp, want)
        else:
            assert abs(lp - want) <= 1e-4, (r, t, lp, want)


# ---- GPU: values ----------------------------------------------------------------


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("V", [7, 1001, 32000])
def test_greedy_rows_and_logprobs_match_the_full_rows(backend, dtype, V):
    """T = 0: torch's argmax of the row (NaN as -inf, first index on ties),
    token 0 for an empty row; the logprob is log_softmax of the raw row at
    the token (float64 reference), -inf for an empty row, NaN beside +inf."""
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    c = _comm(backend, V, dt)
    try:
        for step, (rows, limit) in enumerate([(64, V), (5, max(1, V // 2)), (3, 1)]):
            x = refs.logit_rows(rows, V, dt, 7 * V + step).cuda()
            tok, lp = c.sample(x, temperature=0.0, seed=step, offset=0, vocab_limit=limit,
                               top_k=3, top_p=0.5, min_p=0.5, return_logprobs=True)
            _, want_idx, _ = refs.argmax_ref(x, limit)
            assert tok.dtype == torch.int64 and lp.dtype == torch.float32
            assert torch.equal(tok.cpu(), want_idx), (step, tok.cpu(), want_idx)
            _check_logprobs(lp.cpu().tolist(), _rows_as_lists(x), tok.cpu().tolist(), limit)
    finally:
        c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_rows_tokens_in_the_kept_set_and_raw_logprobs(backend):
    """Per-row temperatures (0 = greedy beside sampled rows): a greedy row is
    the argmax, a sampled one lies in its kept set; logprobs are raw."""
    V, R = 1001, 64
    c = _comm(backend, V)
    x = refs.logit_rows(R, V, torch.float32, 3).cuda()
    rows = _rows_as_lists(x)
    temps = torch.tensor([0.0 if r % 3 == 0 else 0.5 + r / 64 for r in range(R)],
                         device="cuda")
    offs = torch.arange(R, dtype=torch.int64, device="cuda") * 1000 + 17
    for k, p, m in ((0, 1.0, 0.0), (20, 0.9, 0.0), (0, 1.0, 0.2), (4, 0.6, 0.1)):
        tok, lp = c.sample(x, temperature=temps, seed=99, offset=offs, top_k=k, top_p=p,
                           min_p=m, return_logprobs=True)
        tok = tok.cpu().tolist()
        for r in range(R):
            T = float(temps[r])
            if not _unambiguous(rows[r], T, k, p, m):
                continue
            kept = sample_probs_ref(rows[r], T, k, p, m)
            assert tok[r] in kept, (r, tok[r], sorted(kept))
        _check_logprobs(lp.cpu().tolist(), rows, tok)
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_rows_and_vocab_limit(backend):
    V, R = 4096, 512
    c = _comm(backend, V, max_rows=R)
    x = torch.randn(R, V, device="cuda")
    x[:, :100] -= 30.0  # the columns below the limit lie far below the others
    x[0] = float("-inf")
    x[1] = float("nan")
    x[2, :100] = float("-inf")  # finite only beyond the limit: empty
    offs = torch.arange(R, dtype=torch.int64, device="cuda")
    for T in (0.0, 1.0, 3.0):
        tok, lp = c.sample(x, temperature=T, seed=5, offset=offs, vocab_limit=100,
                           return_logprobs=True)
        tok, lp = tok.cpu(), lp.cpu()
        assert tok[:3].tolist() == [0, 0, 0] and lp[:3].tolist() == [-math.inf] * 3
        assert int(tok.max()) < 100, "a token at or beyond vocab_limit"
        _check_logprobs(lp.tolist()[3:8], _rows_as_lists(x[3:8]), tok.tolist()[3:8], 100)
    tok = c.sample(x, temperature=0.0, seed=0, offset=0, vocab_limit=100)
    assert torch.equal(tok.cpu(), refs.argmax_ref(x, 100)[1])
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_and_offset(backend):
    """The same (seed, offset) gives the same token, in any call and at any
    position of the batch; offsets vary it; Python ints are taken mod 2^64,
    tensors' int64 bits are the uint64 values."""
    V, R = 1000, 256
    c = _comm(backend, V, max_rows=R)
    x = torch.zeros(R, V, device="cuda")  # a flat row: every token equally likely
    a = c.sample(x, temperature=1.0, seed=42, offset=7).cpu()
    assert len(set(a.tolist())) == 1, "the same row with the same seed/offset must agree"
    assert torch.equal(c.sample(x, temperature=1.0, seed=42, offset=7).cpu(), a)
    offs = torch.arange(R, dtype=torch.int64, device="cuda") + 7
    b = c.sample(x, temperature=1.0, seed=42, offset=offs).cpu()
    assert b[0] == a[0]
    assert len(set(b.tolist())) > 150, "different offsets must give varying tokens"
    for r in (1, 100, 255):  # the row's own (seed, offset) decides, not its place
        one = c.sample(x[:1], temperature=1.0, seed=42, offset=7 + r).cpu()
        assert one[0] == b[r]
    seeds = torch.arange(R, dtype=torch.int64, device="cuda")
    assert len(set(c.sample(x, temperature=1.0, seed=seeds, offset=7).cpu().tolist())) > 150
    # uint64 as Python ints and as int64 bits
    m1 = c.sample(x, temperature=1.0, seed=-1, offset=-2).cpu()
    assert torch.equal(c.sample(x, temperature=1.0, seed=2**64 - 1, offset=2**64 - 2).cpu(), m1)
    full = torch.full((R,), -1, dtype=torch.int64, device="cuda")
    assert torch.equal(c.sample(x, temperature=1.0, seed=full, offset=full - 1).cpu(), m1)
    top = c.sample(x, temperature=1.0, seed=2**63, offset=0).cpu()
    low = torch.full((R,), -2**63, dtype=torch.int64, device="cuda")
    assert torch.equal(c.sample(x, temperature=1.0, seed=low, offset=0).cpu(), top)
    c.close()


def _unambiguous(row, T, k, p, m):
    """Whether the kept set stays the same when top_p and min_p move a bit
    (a row at a boundary may be decided differently by fp32 arithmetic,
    which the spec allows)."""
    kept = set(sample_probs_ref(row, T, k, p, m))
    for dp, dm in ((1e-4, 0), (-1e-4, 0), (0, 1e-4), (0, -1e-4)):
        pp = min(1.0, p + dp) if p < 1 else p
        mm = max(0.0, m + dm) if m > 0 else m
        if set(sample_probs_ref(row, T, k, pp, mm)) != kept:
            return False
    return True


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_are_the_documented_race(backend):
    """Each token equals the host's race over the documented noise
    (Philox4x32-10 keyed by seed, counting over (offset, index); the fp32
    keys of docs/sampling.md) on the float64 reference's kept set."""
    V, R = 1000, 48
    c = _comm(backend, V)
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(R, V, generator=g) * 2.0).cuda()
    rows = _rows_as_lists(x)
    gen = random.Random(3)
    T = [0.0 if r == 0 else gen.choice([0.3, 0.7, 1.0, 1.7]) for r in range(R)]
    K = [gen.choice([0, 1, 5, 50, 64, 200]) for _ in range(R)]
    P = [gen.choice([1.0, 0.5, 0.9, 0.99]) for _ in range(R)]
    M = [gen.choice([0.0, 0.01, 0.1]) for _ in range(R)]
    S = [gen.randrange(-2**63, 2**63) for _ in range(R)]
    O = [gen.randrange(-2**63, 2**63) for _ in range(R)]
    dev = dict(device="cuda")
    tok = c.sample(x, temperature=torch.tensor(T, **dev),
                   top_k=torch.tensor(K, dtype=torch.int32, **dev),
                   top_p=torch.tensor(P, **dev), min_p=torch.tensor(M, **dev),
                   seed=torch.tensor(S, dtype=torch.int64, **dev),
                   offset=torch.tensor(O, dtype=torch.int64, **dev)).cpu().tolist()
    checked = 0
    for r in range(R):
        if not _unambiguous(rows[r], T[r], K[r], P[r], M[r]):
            continue
        kept = sample_probs_ref(rows[r], T[r], K[r], P[r], M[r])
        want = sample_token_ref(rows[r], kept, T[r], S[r], O[r])
        assert tok[r] == want, (r, T[r], K[r], P[r], M[r], tok[r], want)
        checked += 1
    assert checked >= R - 4
    c.close()


# ---- GPU: the distribution ----------------------------------------------------------

DIST_V = 1024
DIST_ROWS = 8192
DIST_CALLS = 128  # 8192 x 128 = 1,048,576 draws per case
SMALL = dict(zip([200, 3, 17, 1023, 65, 64, 128, 0, 99, 150, 31, 7],
                 [3.0, 2.625, 2.5, 2.25, 2.0, 2.0, 1.5, 1.25, 0.75, 0.0, -0.75, -1.5]))


def _wide():
    """200 finite values (multiples of 1/64, ties among them) spread over
    the vocabulary: kept sets beyond DPS_SAMPLE_CANDIDATES (the exact path)."""
    g = random.Random(2024)
    return {(i * 5 + 1) % DIST_V: round(g.gauss(0.0, 0.6) * 64) / 64 for i in range(200)}


# (id, the row's finite values, T, parameters, passed as tensors, dtype, path)
CASES = [
    ("temperature", SMALL, 0.7, {}, False, "fp32", "fast"),
    ("top_k", SMALL, 0.7, dict(top_k=5), False, "fp32", "fast"),
    ("top_p", SMALL, 0.7, dict(top_p=0.8), False, "fp32", "fast"),
    ("min_p", SMALL, 0.7, dict(min_p=0.05), False, "fp32", "fast"),
    ("combined", SMALL, 0.7, dict(top_k=5, top_p=0.8, min_p=0.05), False, "fp32", "fast"),
    ("combined_tensors", SMALL, 0.7, dict(top_k=5, top_p=0.8, min_p=0.05), True, "fp32", "fast"),
    ("combined_bf16", SMALL, 0.7, dict(top_k=5, top_p=0.8, min_p=0.05), True, "bf16", "fast"),
    ("exact_top_k", "wide", 1.0, dict(top_k=100), False, "fp32", "exact"),
    ("exact_top_p", "wide", 1.0, dict(top_p=0.95), True, "fp32", "exact"),
]


def _draw_counts(c, values, T, params, as_tensors, dtype):
    """Counts of DIST_ROWS * DIST_CALLS draws of one row (repeated on every
    row; every draw its own offset), and the row as the kernel reads it."""
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    row = torch.full((DIST_V,), float("-inf"))
    for i, v in values.items():
        row[i] = v
    x = row.to(dt).cuda().expand(DIST_ROWS, DIST_V).contiguous()
    R = DIST_ROWS
    kw = dict(params)
    if as_tensors:
        kw = {k: torch.full((R,), v, dtype=torch.int64 if k == "top_k" else torch.float32,
                            device="cuda") for k, v in params.items()}
        kw["temperature"] = torch.full((R,), T, device="cuda")
        kw["seed"] = torch.full((R,), 1234567, dtype=torch.int64, device="cuda")
    else:
        kw["temperature"] = T
        kw["seed"] = 1234567
    counts = torch.zeros(DIST_V, dtype=torch.int64, device="cuda")
    out = torch.empty(R, dtype=torch.int64, device="cuda")
    base = torch.arange(R, dtype=torch.int64, device="cuda")
    for call in range(DIST_CALLS):
        c.sample(x, offset=base + call * R, out=out, **kw)
        counts += torch.bincount(out, minlength=DIST_V)
    counts = counts.cpu().tolist()
    return {i: n for i, n in enumerate(counts) if n}, x[0].double().cpu().tolist()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_token_distribution_chi_square(backend, case):
    name, values, T, params, as_tensors, dtype, path = case
    if values == "wide":
        values = _wide()
    c = _comm(backend, DIST_V, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype],
              max_rows=DIST_ROWS)
    try:
        before = c.sample_stats()
        counts, row = _draw_counts(c, values, T, params, as_tensors, dtype)
        after = c.sample_stats()
    finally:
        c.close()
    k, p, m = params.get("top_k", 0), params.get("top_p", 1.0), params.get("min_p", 0.0)
    assert _unambiguous(row, T, k, p, m), "the test's row sits on a filter boundary"
    probs = sample_probs_ref(row, T, k, p, m)
    pvalue, outside = chisquare_test(counts, probs)
    n = DIST_ROWS * DIST_CALLS
    assert sum(counts.values()) == n
    assert outside == 0, f"{outside} draws outside the kept set {sorted(probs)}: {counts}"
    assert pvalue > P_MIN, (name, pvalue, counts, probs)
    # the path counters: every draw on the expected path, none invalid
    d = {key: after[key] - before[key] for key in ("rows_greedy", "rows_fast", "rows_exact",
                                                   "invalid_calls")}
    assert d["rows_" + path] == n and d["invalid_calls"] == 0, d
    assert d["rows_greedy"] + d["rows_fast"] + d["rows_exact"] == n, d
    if name == "top_k":
        # planted bug: a reference whose top-k keeps k+1 (here: also the index
        # tied with the k-th value, as vLLM would) must fail on the same draws
        bad = sample_probs_ref(row, T, k + 1, p, m)
        assert set(bad) != set(probs)
        bad_p, _ = chisquare_test(counts, bad)
        assert bad_p < P_MIN, f"the chi-square test cannot see a top-k off by one ({bad_p})"


# ---- GPU: graphs, errors, stats ------------------------------------------------------


def _fill_params(R, g, T, K, P, M, S, O):
    T.copy_(torch.where(torch.rand(R, generator=g) < 0.2, 0.0,
                        0.3 + 1.5 * torch.rand(R, generator=g)))
    K.copy_(torch.randint(-1, 90, (R,), generator=g, dtype=torch.int32))
    P.copy_(torch.where(torch.rand(R, generator=g) < 0.3, 1.0,
                        0.2 + 0.79 * torch.rand(R, generator=g)))
    M.copy_(torch.where(torch.rand(R, generator=g) < 0.5, 0.0,
                        0.2 * torch.rand(R, generator=g)))
    S.copy_(torch.randint(-2**62, 2**62, (R,), generator=g, dtype=torch.int64))
    O.copy_(torch.randint(-2**62, 2**62, (R,), generator=g, dtype=torch.int64))


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_with_changed_parameter_tensors(backend):
    V, R = 4096, 64
    c = _comm(backend, V, torch.bfloat16)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(R, V, generator=g).to(torch.bfloat16).cuda()
    T = torch.empty(R, device="cuda")
    K = torch.empty(R, dtype=torch.int32, device="cuda")
    P, M = torch.empty(R, device="cuda"), torch.empty(R, device="cuda")
    S = torch.empty(R, dtype=torch.int64, device="cuda")
    O = torch.empty(R, dtype=torch.int64, device="cuda")
    _fill_params(R, g, T, K, P, M, S, O)
    tok = torch.empty(R, dtype=torch.int64, device="cuda")
    lp = torch.empty(R, dtype=torch.float32, device="cuda")
    kw = dict(temperature=T, top_k=K, top_p=P, min_p=M, seed=S, offset=O)
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        c.sample(x, out=tok, out_logprobs=lp, return_logprobs=True, **kw)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            got = c.sample(x, out=tok, out_logprobs=lp, return_logprobs=True, **kw)
    assert got[0] is tok and got[1] is lp
    for _ in range(3):
        _fill_params(R, g, T, K, P, M, S, O)
        x.copy_(torch.randn(R, V, generator=g).to(torch.bfloat16).cuda())
        tok.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want_tok, want_lp = c.sample(x, return_logprobs=True, **kw)
        assert torch.equal(tok.cpu(), want_tok.cpu())
        assert torch.equal(lp.cpu(), want_lp.cpu())
        greedy = (T == 0).cpu()
        assert torch.equal(tok.cpu()[greedy], refs.argmax_ref(x, V)[1][greedy])
    del graph
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_scalars_raise_naming_the_argument(backend):
    R = 4
    c = _comm(backend, 64, max_rows=8)
    x = torch.zeros(R, 64, device="cuda")
    out = torch.full((R,), 77, dtype=torch.int64, device="cuda")
    lp = torch.full((R,), 5.0, device="cuda")
    bad = [("temperature", dict(temperature=-1.0)), ("temperature", dict(temperature=math.nan)),
           ("temperature", dict(temperature=math.inf)),
           ("temperature", dict(temperature=1e39)),  # inf in fp32
           ("top_p", dict(top_p=0.0)), ("top_p", dict(top_p=-0.5)), ("top_p", dict(top_p=1.5)),
           ("top_p", dict(top_p=math.nan)), ("min_p", dict(min_p=1.0)),
           ("min_p", dict(min_p=-0.1)), ("min_p", dict(min_p=math.nan))]
    for name, kw in bad:
        args = dict(temperature=1.0, seed=0, offset=0)
        args.update(kw)
        with pytest.raises(ValueError, match=name):
            c.sample(x, out=out, out_logprobs=lp, return_logprobs=True, **args)
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [77] * R and lp.cpu().tolist() == [5.0] * R
    with pytest.raises(ValueError, match="vocab_limit=65"):
        c.sample(x, temperature=1.0, seed=0, offset=0, vocab_limit=65)
    c.sample(x, temperature=1.0, seed=0, offset=0, top_p=1.0, min_p=0.0, top_k=-5, out=out)
    torch.cuda.synchronize()
    assert all(0 <= t < 64 for t in out.cpu().tolist())
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_parameter_tensors_name_themselves(backend):
    R = 4
    c = _comm(backend, 64, max_rows=8)
    x = torch.zeros(R, 64, device="cuda")
    f32 = dict(dtype=torch.float32, device="cuda")
    i64 = dict(dtype=torch.int64, device="cuda")
    ok = dict(temperature=torch.ones(R, **f32), top_k=torch.zeros(R, **i64),
              top_p=torch.ones(R, **f32), min_p=torch.zeros(R, **f32),
              seed=torch.zeros(R, **i64), offset=torch.zeros(R, **i64))
    c.sample(x, **ok)
    c.sample(x, **dict(ok, top_k=torch.zeros(R, dtype=torch.int32, device="cuda")))
    for name, t in ok.items():
        cases = [
            (TypeError, rf"{name} must be .*torch\.(float32|int32|int64).*got torch\.(float64|"
                        r"int16|float32)",
             t.to(torch.float64 if t.dtype == torch.float32 else
                  (torch.int16 if name == "top_k" else torch.float32))),
            (ValueError, rf"{name} has shape \[{R + 1}\] but local_logits has {R} rows",
             torch.cat([t, t[:1]])),
            (ValueError, rf"{name} must be 1-D", t[None, :]),
            (ValueError, rf"{name} must be a CUDA tensor", t.cpu()),
            (ValueError, rf"{name} must be contiguous", torch.stack([t, t], 1)[:, 0]),
        ]
        if name in ("seed", "offset"):
            cases.append((TypeError, rf"{name} must be .*torch\.int64.*got torch\.int32",
                          t.to(torch.int32)))
        if torch.cuda.device_count() > 1:
            cases.append((ValueError, rf"{name} is on cuda:1", t.to("cuda:1")))
        for exc, match, bad in cases:
            with pytest.raises(exc, match=match):
                c.sample(x, **dict(ok, **{name: bad}))
    with pytest.raises(TypeError, match=r"out must be torch.int64"):
        c.sample(x, temperature=1.0, seed=0, offset=0, out=torch.empty(R, **f32))
    with pytest.raises(ValueError, match=r"out_logprobs must hold 4"):
        c.sample(x, temperature=1.0, seed=0, offset=0, return_logprobs=True,
                 out_logprobs=torch.empty(R + 1, **f32))
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_tensor_entries_write_nothing_and_are_reported(backend):
    """An invalid entry of a parameter tensor is found on the device: the
    call writes nothing, and sample_stats() counts it and names the row,
    the argument and (through the library's message) the value."""
    R = 8
    c = _comm(backend, 64, max_rows=8)
    x = torch.randn(R, 64, device="cuda")
    s0 = c.sample_stats()
    assert s0["last_invalid"] is None and set(s0) == {
        "rows_greedy", "rows_fast", "rows_exact", "invalid_calls", "last_invalid"}
    for name, row, value in (("temperature", 3, -1.0), ("top_p", 5, 0.0), ("min_p", 2, 1.0),
                             ("temperature", 6, math.nan)):
        t = torch.full((R,), {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0}[name],
                       device="cuda")
        t[row] = value
        out = torch.full((R,), 77, dtype=torch.int64, device="cuda")
        lp = torch.full((R,), 5.0, device="cuda")
        kw = dict(temperature=1.0, seed=0, offset=0)
        kw[name] = t
        before = c.sample_stats()
        c.sample(x, out=out, out_logprobs=lp, return_logprobs=True, **kw)
        torch.cuda.synchronize()
        assert out.cpu().tolist() == [77] * R and lp.cpu().tolist() == [5.0] * R
        after = c.sample_stats()
        assert after["invalid_calls"] == before["invalid_calls"] + 1
        msg = after["last_invalid"]
        assert msg is not None and name in msg and str(row) in msg, msg
        assert c.sample_stats()["last_invalid"] is None  # reported once
    tok = c.sample(x, temperature=0.0, seed=0, offset=0)  # the communicator still works
    assert torch.equal(tok.cpu(), refs.argmax_ref(x, 64)[1])
    c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_stats_count_rows_by_path(backend):
    V, R = 4096, 16
    c = _comm(backend, V, max_rows=R)
    x = torch.randn(R, V, device="cuda")
    x[0] = float("-inf")  # nothing valid: counted as greedy
    flat = torch.zeros(R, V, device="cuda")

    def delta(fn):
        b = c.sample_stats()
        fn()
        a = c.sample_stats()
        return tuple(a[k] - b[k] for k in ("rows_greedy", "rows_fast", "rows_exact",
                                            "invalid_calls"))

    assert delta(lambda: c.sample(x[1:], temperature=0.0, seed=0, offset=0)) == (R - 1, 0, 0, 0)
    assert delta(lambda: c.sample(x[1:], temperature=1.0, seed=0, offset=0, top_k=5)) == (
        0, R - 1, 0, 0)
    assert delta(lambda: c.sample(flat, temperature=1.0, seed=0, offset=0, top_k=1000)) == (
        0, 0, R, 0)
    assert delta(lambda: c.sample(x[:1], temperature=1.0, seed=0, offset=0))[0] == 1
    c.close()
