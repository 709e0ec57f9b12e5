"""DpSamplingComm.verify_chain (dpsVerifyChain), tp=1 on one GPU.

The contract is dpsVerifyChain's (include/dpsampling.h, docs/api.md; the walk:
docs/sampling.md, "The walk and its outputs"): row b*N + j (request b,
position j) is drawn exactly as dpsSample draws it, with request b's
parameters at offset offset[b] + j, then each request's chain is walked.
So every output is checked against a host walk (walk_ref below, written from
that contract) over the tokens and logprobs that comm.sample draws for the
same rows with the per-request parameters expanded per row, bit for bit:
 - random logits (fp32, bf16), pad_bs 8 and 5, N 4, V 1000 and 32000, greedy
   requests beside sampled ones, per-request temperature / top-k / top-p /
   min-p / seed / offset tensors (an offset wrapping past 2^64), candidates
   made to match for 0..N-1 drafts, a later matching draft after a rejection;
 - the same with scalar parameters and a vocab_limit;
 - vocab_mask and softcap against verify_chain on the logits capped on the
   host (refs.softcap_ref: the library's fp32(c * tanh(l / c)) in double, bit
   for bit) and masked to -inf: tokens exactly, logprobs within 1e-4 (the
   reductions of another dtype may round differently), masked tokens never
   predicted, and a capless or maskless logprob would be told apart;
 - the outputs are views of persistent buffers that the other operations do
   not touch; an invalid parameter entry writes nothing and is counted; a
   CUDA graph replayed with changed inputs gives the eager outputs;
 - arguments refused with the argument named (Python-side ones without a GPU).
The host walk itself is checked on hand-made chains without torch or a GPU.
"""

import inspect
import math
import random
import struct

import pytest

import refs

try:
    import torch
except ImportError:
    torch = None

import dpsampling
from dpsampling import DpSamplingComm

gpu = pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                         reason="needs torch and a CUDA device")
BACKENDS = ["nccl", "onesided"]


# ---- the host references (no torch, no GPU) ----------------------------------------


def walk_ref(cand, tokens, N):
    """The chain walk of dpsVerifyChain's contract. cand: [pad_bs][N] ints
    (column 0 not read), tokens: the flat [pad_bs*N] tokens t (row b*N + j is
    t[b, j]). Returns (predict, accept_index, accept_length) as lists:
      accept_index[b, 0] = b*N; for i = 1..N-1 while cand[b, i] == t[b, i-1]:
      predict[b, i-1] = t[b, i-1], accept_index[b, i] = b*N + i; acc = the
      last such i (0 if none); predict[b, acc] = t[b, acc]; accept_length[b]
      = acc + 1; every other entry -1 (accept_index) or 0 (predict)."""
    pad_bs = len(cand)
    predict = [[0] * N for _ in range(pad_bs)]
    accept_index = [[-1] * N for _ in range(pad_bs)]
    accept_length = [0] * pad_bs
    for b in range(pad_bs):
        t = tokens[b * N:(b + 1) * N]
        accept_index[b][0] = b * N
        acc = 0
        for i in range(1, N):
            if cand[b][i] != t[i - 1]:
                break
            predict[b][i - 1] = t[i - 1]
            accept_index[b][i] = b * N + i
            acc = i
        predict[b][acc] = t[acc]
        accept_length[b] = acc + 1
    return predict, accept_index, accept_length


def pack_mask(allowed, V):
    """The int32 words of vocab_mask from rows of allowed token sets: bit
    i % 32 of word i // 32 set = token i allowed (words as signed int32)."""
    words = (V + 31) // 32
    out = []
    for row in allowed:
        w = [0] * words
        for i in row:
            w[i // 32] |= 1 << (i % 32)
        out.append([v - 2**32 if v >= 2**31 else v for v in w])
    return out


def _i64(u):
    """A uint64 (any int, taken mod 2^64) as the int64 with its bits."""
    u %= 2**64
    return u - 2**64 if u >= 2**63 else u


def test_walk_ref_on_hand_made_chains():
    N = 4
    t = [10, 11, 12, 13]
    # every draft accepted: the bonus token is the last position's
    assert walk_ref([[99, 10, 11, 12]], t, N) == (
        [[10, 11, 12, 13]], [[0, 1, 2, 3]], [4])
    # the first draft rejected: the correction is t[b, 0]
    assert walk_ref([[99, 7, 11, 12]], t, N) == ([[10, 0, 0, 0]], [[0, -1, -1, -1]], [1])
    # a rejection in the middle: the later draft that matches is not looked at
    assert walk_ref([[99, 10, 5, 12]], t, N) == ([[10, 11, 0, 0]], [[0, 1, -1, -1]], [2])
    # a draft equal to t[b, i] (its own row) but not t[b, i-1]: rejected
    assert walk_ref([[99, 11, 12, 13]], t, N) == ([[10, 0, 0, 0]], [[0, -1, -1, -1]], [1])
    # column 0 is never compared
    assert walk_ref([[10, 10, 11, 12]], t, N) == walk_ref([[-5, 10, 11, 12]], t, N)
    # N = 1: the row's token, accept_length 1
    assert walk_ref([[3], [4]], [7, 8], 1) == ([[7], [8]], [[0], [1]], [1, 1])
    # three requests: flat indices b*N + i, token 0 accepted like any other
    cand = [[0, 10, 11, 12], [0, 0, 1, 9], [0, 9, 9, 9]]
    toks = [10, 11, 12, 13, 0, 1, 2, 3, 20, 21, 22, 23]
    assert walk_ref(cand, toks, N) == (
        [[10, 11, 12, 13], [0, 1, 2, 0], [20, 0, 0, 0]],
        [[0, 1, 2, 3], [4, 5, 6, -1], [8, -1, -1, -1]],
        [4, 3, 1])


def test_pack_mask_bits():
    assert pack_mask([[0], [31], [32], [0, 1, 33]], 40) == [
        [1, 0], [-2**31, 0], [0, 1], [3, 2]]
    assert pack_mask([[]], 1) == [[0]]
    assert pack_mask([list(range(64))], 64) == [[-1, -1]]


def test_softcap_ref_is_the_library_formula():
    # pins: dpsSampleSoftCap (src/core/sample_rng.h) on the host, whose device
    # twin test_gpu_sample_rng checks bit for bit
    pins = [(1.0, 3.0, 0x3F76EBFA), (-7.25, 3.0, 0xC03CF7AF), (5.5, 30.0, 0x40AE0DE7),
            (100.0, 30.0, 0x41EF63D1), (refs.f32(0.3), 2.5, 0x3E98DDF0),
            (refs.f32(1e-9), 3.0, 0x3089705F), (refs.f32(12.345678), refs.f32(0.7), 0x3F333333),
            (-65.0, 50.0, 0xC22C583A)]
    for l, c, bits in pins:
        got = refs.softcap_ref(l, c)
        assert struct.unpack("<I", struct.pack("<f", got))[0] == bits, (l, c, got)
    rng = random.Random(4)
    for _ in range(3000):
        x = rng.uniform(-25.0, 25.0) * rng.choice([1.0, 1e-3, 1e-6])
        assert abs(refs.tanh_det(x) - math.tanh(x)) <= 2e-15 * abs(math.tanh(x)) + 1e-300
    assert refs.softcap_ref(math.inf, 3.0) == math.inf
    assert math.isnan(refs.softcap_ref(math.nan, 3.0))
    assert refs.softcap_ref(1e30, 30.0) == 30.0
    assert refs.softcap_ref(-refs.f32(3.4e38), 30.0) == -30.0


# ---- arguments refused in Python, before any C call or torch use -------------


def _bare():
    return DpSamplingComm.__new__(DpSamplingComm)  # never created: no GPU needed


@pytest.mark.parametrize("kw, exc, match", [
    (dict(softcap=-1), ValueError, r"softcap=-1 must be None or 0 \(off\), or a positive finite"),
    (dict(softcap=-0.5), ValueError, r"softcap=-0.5"),
    (dict(softcap=math.nan), ValueError, r"softcap=nan"),
    (dict(softcap=math.inf), ValueError, r"softcap=inf"),
    (dict(softcap=1e39), ValueError, r"softcap=1e\+39"),  # inf in fp32
    (dict(softcap=1e-50), ValueError, r"softcap=1e-50"),  # 0 in fp32: would turn the cap off
    (dict(softcap="30"), TypeError, r"softcap must be None or a real number, got str"),
    (dict(softcap=True), TypeError, r"softcap must be None or a real number, got bool"),
    (dict(pad_bs=None), TypeError, r"pad_bs must be an int, got NoneType"),
    (dict(pad_bs=2.0), TypeError, r"pad_bs must be an int, got float"),
    (dict(pad_bs=2**40), ValueError, r"pad_bs=1099511627776 is out of range"),
    (dict(temperature=None), TypeError, r"temperature must be a real number"),
    (dict(temperature="0"), TypeError, r"temperature must be a number or a tensor"),
    (dict(seed=2**64), ValueError, r"seed=18446744073709551616 is out of range"),
    (dict(offset=-2**63 - 1), ValueError, r"offset=-9223372036854775809 is out of range"),
    (dict(top_k=2.5), TypeError, r"top_k must be an int or a tensor"),
    (dict(min_p=[0.1]), TypeError, r"min_p must be a number or a tensor"),
    (dict(vocab_limit=0), ValueError, r"vocab_limit=0"),
])
def test_python_side_argument_errors(kw, exc, match):
    args = dict(pad_bs=2, temperature=0.7, seed=1, offset=2)
    args.update(kw)
    with pytest.raises(exc, match=match):
        _bare().verify_chain(object(), object(), **args)


def test_logits_must_be_a_tensor():
    with pytest.raises(TypeError, match="local_logits must be a torch.Tensor, got list"):
        _bare().verify_chain([[0.0]], None, pad_bs=1, temperature=0.0, seed=0, offset=0)


def test_good_scalars_reach_the_communicator():
    """Valid scalars (softcap None, 0, a positive number, an int) pass the
    Python checks: an uncreated communicator then refuses the call."""
    class FakeTensor:
        def dim(self):
            return 2

    for softcap in (None, 0, 0.0, 30, 2.5):
        with pytest.raises(RuntimeError, match="closed"):
            _bare().verify_chain(FakeTensor(), None, pad_bs=3, temperature=0.0, seed=0,
                                 offset=0, softcap=softcap, top_k=5, top_p=0.9, min_p=0.1,
                                 vocab_limit=7, return_logprobs=True)
    with pytest.raises(RuntimeError, match="closed"):
        dpsampling._dpsampling.Comm()._verify_chain(None, None, 1, 0, 1.0, 0, 1.0, 0.0, 0, 0,
                                                     None, 0.0, False)


def test_verify_chain_signature():
    sig = inspect.signature(DpSamplingComm.verify_chain)
    assert list(sig.parameters)[:3] == ["self", "local_logits", "candidates"]
    names = ["pad_bs", "temperature", "seed", "offset", "top_k", "top_p", "min_p",
             "vocab_limit", "vocab_mask", "softcap", "return_logprobs"]
    assert list(sig.parameters)[3:] == names
    for name in names:
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    for name in ("pad_bs", "temperature", "seed", "offset"):
        assert sig.parameters[name].default is inspect.Parameter.empty, name
    for name in names[4:-1]:
        assert sig.parameters[name].default is None, name
    assert sig.parameters["return_logprobs"].default is False


# ---- GPU: helpers ------------------------------------------------------------------


def _comm(backend, V, N, dtype, max_pad_bs=8):
    return DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=max_pad_bs,
                          num_tokens_per_req=N, vocab_size=V, logits_dtype=dtype,
                          backend=backend)


def _dtype(name):
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _params(T, K, P, M, S, O, N=1, top_k_dtype=None):
    """Parameter tensors on the GPU from per-request lists: one entry per
    request (N = 1), or expanded to the rows of dpsVerifyChain's contract
    (row b*N + j: request b's values, offset O[b] + j mod 2^64)."""
    dev = "cuda"

    def rep(v):
        return [x for x in v for _ in range(N)]

    return dict(
        temperature=torch.tensor(rep(T), dtype=torch.float32, device=dev),
        top_k=torch.tensor(rep(K), dtype=top_k_dtype or torch.int32, device=dev),
        top_p=torch.tensor(rep(P), dtype=torch.float32, device=dev),
        min_p=torch.tensor(rep(M), dtype=torch.float32, device=dev),
        seed=torch.tensor([_i64(s) for s in rep(S)], dtype=torch.int64, device=dev),
        offset=torch.tensor([_i64(o + j) for o in O for j in range(N)], dtype=torch.int64,
                            device=dev))


def _candidates(tok, pad_bs, N, V, gen):
    """Random drafts, request b's first b % N made to match (candidates[b, i]
    = the token of row b*N + i-1), the next one made to differ, and on odd
    requests the draft after it set to its own row's predecessor token (it
    would match, but the walk has stopped). Column 0 random in [0, V)."""
    cand = [[gen.randrange(V) for _ in range(N)] for _ in range(pad_bs)]
    for b in range(pad_bs):
        m = b % N
        for i in range(1, m + 1):
            cand[b][i] = tok[b * N + i - 1]
        if m + 1 < N and cand[b][m + 1] == tok[b * N + m]:
            cand[b][m + 1] = (tok[b * N + m] + 1) % V
        if m + 2 < N and b % 2:
            cand[b][m + 2] = tok[b * N + m + 1]
    return cand


def _bits(t):
    """The fp32 tensor's bits as nested lists of ints."""
    return t.detach().float().cpu().contiguous().view(torch.int32).tolist()


def _check(out, cand, tok, lp, N, with_lp):
    """out (verify_chain's) against walk_ref over the sampled tokens `tok`
    (a flat list), and its logprobs against the sampled ones `lp` (an fp32
    tensor [rows]) at every accepted entry, bit for bit; 0 elsewhere."""
    pad_bs = len(cand)
    assert len(out) == (4 if with_lp else 3)
    p, ai, al = out[:3]
    assert p.dtype == ai.dtype == al.dtype == torch.int32
    assert tuple(p.shape) == tuple(ai.shape) == (pad_bs, N) and tuple(al.shape) == (pad_bs,)
    assert p.device == ai.device == al.device == torch.device("cuda", 0)
    wp, wai, wal = walk_ref(cand, tok, N)
    assert al.cpu().tolist() == wal
    assert p.cpu().tolist() == wp
    assert ai.cpu().tolist() == wai
    if with_lp:
        got = out[3]
        assert got.dtype == torch.float32 and tuple(got.shape) == (pad_bs, N)
        gb, lb, gv = _bits(got), _bits(lp), got.cpu().tolist()
        for b in range(pad_bs):
            for j in range(N):
                if j < wal[b]:
                    assert gb[b][j] == lb[b * N + j], (b, j, gv[b][j], lp[b * N + j].item())
                else:
                    assert gv[b][j] == 0.0, (b, j, gv[b][j])
    return wal


# ---- GPU: values ----------------------------------------------------------------


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("pad_bs", [8, 5])
@pytest.mark.parametrize("V", [1000, 32000])
def test_verify_is_the_walk_over_the_sampled_tokens(backend, dtype, pad_bs, V):
    """Per-request parameter tensors (greedy requests beside sampled ones,
    every filter): the outputs equal the host walk over comm.sample's tokens
    of the same rows (request b's parameters, offset[b] + j), bit for bit."""
    N = 4
    dt = _dtype(dtype)
    c = _comm(backend, V, N, dt)
    try:
        g = torch.Generator().manual_seed(1000 * pad_bs + V)
        x = (torch.randn(pad_bs * N, V, generator=g) * 3.0).to(dt).cuda()
        gen = random.Random(7 * V + pad_bs)
        T = [0.0 if b % 3 == 0 else gen.choice([0.5, 0.8, 1.0, 1.7]) for b in range(pad_bs)]
        K = [gen.choice([0, 1, 5, 50, 200]) for _ in range(pad_bs)]
        P = [gen.choice([1.0, 0.95, 0.6]) for _ in range(pad_bs)]
        M = [gen.choice([0.0, 0.0, 0.02]) for _ in range(pad_bs)]
        S = [gen.randrange(-2**63, 2**64) for _ in range(pad_bs)]
        O = [gen.randrange(0, 2**64) for _ in range(pad_bs)]
        O[-1] = 2**64 - 2  # offset[b] + j wraps past 2^64
        kdt = torch.int32 if pad_bs == 8 else torch.int64
        tok, lp = c.sample(x, return_logprobs=True, **_params(T, K, P, M, S, O, N, kdt))
        tok, lp = tok.cpu().tolist(), lp.cpu()
        cand = _candidates(tok, pad_bs, N, V, gen)
        cand_t = torch.tensor(cand, dtype=torch.int32, device="cuda")
        req = _params(T, K, P, M, S, O, 1, kdt)
        first = None
        for with_lp in (False, True, True):
            out = c.verify_chain(x, cand_t, pad_bs=pad_bs, return_logprobs=with_lp, **req)
            wal = _check(out, cand, tok, lp, N, with_lp)
            if first is None:
                first = out
            # persistent outputs: the same buffers on every call
            assert [t.data_ptr() for t in out[:3]] == [t.data_ptr() for t in first[:3]]
        # the chains cover every accept_length 1..N (the test's own coverage)
        assert sorted(set(wal)) == list(range(1, N + 1)), wal
    finally:
        c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [0.0, 0.9])
def test_scalar_parameters_hold_for_every_request(backend, T):
    """Scalars hold for every request (row b*N + j at offset + j for every b),
    with a vocab_limit: the walk over comm.sample's tokens, bit for bit."""
    N, pad_bs, V, limit = 4, 7, 3000, 2000
    c = _comm(backend, V, N, torch.bfloat16)
    try:
        g = torch.Generator().manual_seed(5)
        x = (torch.randn(pad_bs * N, V, generator=g) * 2.0).to(torch.bfloat16).cuda()
        seed, offset = 2**64 - 5, 2**64 - 3  # offset + j wraps past 2^64
        kw = dict(temperature=T, top_k=40, top_p=0.9, min_p=0.01, vocab_limit=limit)
        rows_off = torch.tensor([_i64(offset + j) for _ in range(pad_bs) for j in range(N)],
                                dtype=torch.int64, device="cuda")
        tok, lp = c.sample(x, seed=seed, offset=rows_off, return_logprobs=True, **kw)
        tok, lp = tok.cpu().tolist(), lp.cpu()
        assert max(tok) < limit
        cand = _candidates(tok, pad_bs, N, V, random.Random(1))
        out = c.verify_chain(x, torch.tensor(cand, dtype=torch.int32, device="cuda"),
                             pad_bs=pad_bs, seed=seed, offset=offset, return_logprobs=True, **kw)
        _check(out, cand, tok, lp, N, True)
    finally:
        c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_vocab_mask_and_softcap_equal_explicit_logits(backend, dtype):
    """verify_chain(x, vocab_mask, softcap=c) equals verify_chain on an fp32
    communicator of the rows capped on the host (refs.softcap_ref, the
    library's formula bit for bit) and masked to -inf: the same tokens, the
    same walk, logprobs within 1e-4. Masked tokens are never predicted (a
    row with nothing allowed yields token 0), and the cap and the mask move
    the logprobs far more than the tolerance (the test would see either
    missing)."""
    N, pad_bs, V, cap = 4, 6, 1000, 3.0
    rows = pad_bs * N
    dt = _dtype(dtype)
    g = torch.Generator().manual_seed(77)
    x = (torch.randn(rows, V, generator=g) * 4.0).to(dt)
    gen = random.Random(9)
    allowed = [[i for i in range(V) if gen.random() < 0.6] for _ in range(rows)]
    allowed[N] = []  # request 1, position 0 (always predicted): token 0, logprob -inf
    allowed[N + 1] = [3, 999]  # reached: request 1's first draft is made to match
    raw = x.float().tolist()
    capped = [[refs.softcap_ref(v, cap) for v in row] for row in raw]
    xt = [[-math.inf] * V for _ in range(rows)]
    for r in range(rows):
        for i in allowed[r]:
            xt[r][i] = capped[r][i]
    xt = torch.tensor(xt, dtype=torch.float32)
    mask = torch.tensor(pack_mask(allowed, V), dtype=torch.int32)
    T = [0.0, 0.7, 1.0, 0.0, 1.3, 0.9]
    K = [0, 0, 20, 5, 0, 100]
    P = [1.0, 0.9, 1.0, 1.0, 0.8, 1.0]
    M = [0.0, 0.0, 0.0, 0.05, 0.0, 0.0]
    S = [11, 12, 13, 14, 15, 16]
    O = [100, 200, 300, 400, 500, 600]

    # the reference: an fp32 communicator on the explicit rows
    ref = _comm(backend, V, N, torch.float32)
    try:
        tok, lp = ref.sample(xt.cuda(), return_logprobs=True, **_params(T, K, P, M, S, O, N))
        tok, lp = tok.cpu().tolist(), lp.cpu()
        cand = _candidates(tok, pad_bs, N, V, gen)
        # drafts that are masked tokens of the row they are compared with
        cand[2][1] = next(i for i in range(V) if i not in allowed[2 * N])
        cand_t = torch.tensor(cand, dtype=torch.int32, device="cuda")
        want = ref.verify_chain(xt.cuda(), cand_t, pad_bs=pad_bs, return_logprobs=True,
                                **_params(T, K, P, M, S, O))
        want = [t.cpu() for t in want]
    finally:
        ref.close()
    wal = walk_ref(cand, tok, N)[2]
    assert want[2].tolist() == wal and want[0].tolist() == walk_ref(cand, tok, N)[0]

    c = _comm(backend, V, N, dt)
    try:
        got = c.verify_chain(x.cuda(), cand_t, pad_bs=pad_bs, vocab_mask=mask.cuda(),
                             softcap=cap, return_logprobs=True, **_params(T, K, P, M, S, O))
        got = [t.cpu() for t in got]
    finally:
        c.close()
    assert got[2].tolist() == want[2].tolist()
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()
    glp, wlp = got[3].tolist(), want[3].tolist()
    far_cap = far_mask = checked = 0
    for b in range(pad_bs):
        for j in range(N):
            r, t = b * N + j, got[0][b, j].item()
            if j >= wal[b]:
                assert glp[b][j] == 0.0
                continue
            if allowed[r]:
                assert t in allowed[r], (b, j, t)
            else:
                assert t == 0 and glp[b][j] == -math.inf == wlp[b][j]
                continue
            assert abs(glp[b][j] - wlp[b][j]) <= 1e-4, (b, j, glp[b][j], wlp[b][j])
            checked += 1
            # the same token's logprob without the cap, and without the mask
            nocap = [raw[r][i] for i in allowed[r]]
            lse = max(nocap) + math.log(math.fsum(math.exp(v - max(nocap)) for v in nocap))
            far_cap += abs((raw[r][t] - lse) - glp[b][j]) > 1e-2
            lse_all = max(capped[r]) + math.log(
                math.fsum(math.exp(v - max(capped[r])) for v in capped[r]))
            far_mask += abs((capped[r][t] - lse_all) - glp[b][j]) > 1e-2
    assert wal[1] >= 2 and got[0][1, 0].item() == 0, "the test's empty row was not reached"
    assert far_cap >= checked // 2 and far_mask >= checked // 2, (far_cap, far_mask, checked)


# ---- GPU: persistent outputs, invalid entries, graphs ------------------------------


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_are_persistent_views_that_other_calls_leave_alone(backend):
    N, V = 4, 512
    c = _comm(backend, V, N, torch.float32)
    try:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(8 * N, V, generator=g).cuda()
        cand = torch.randint(0, V, (8, N), generator=g, dtype=torch.int32).cuda()
        kw = dict(temperature=0.0, seed=0, offset=0, return_logprobs=True)
        a = c.verify_chain(x, cand, pad_bs=8, **kw)
        b = c.verify_chain(x[:5 * N], cand[:5], pad_bs=5, **kw)
        assert [tuple(t.shape) for t in b] == [(5, N), (5, N), (5,), (5, N)]
        assert [t.data_ptr() for t in a] == [t.data_ptr() for t in b]
        a = c.verify_chain(x, cand, pad_bs=8, **kw)
        keep = [t.clone() for t in a]
        # valid until the next verify_chain: the other operations do not touch them
        pl = torch.full((8, N), 7, dtype=torch.int32, device="cuda")
        al = torch.full((8,), 2, dtype=torch.int32, device="cuda")
        c.gather_verify_outputs(pl, pl, al, pad_bs=8)
        c.gather_verify_logprobs(torch.full((8, N), -3.0, device="cuda"), pad_bs=8)
        c.sample(x, temperature=1.0, seed=1, offset=1, return_logprobs=True)
        c.swap_batch_vocab(x, pad_bs=8)
        torch.cuda.synchronize()
        for t, k in zip(a, keep):
            assert torch.equal(t, k)
    finally:
        c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_parameter_entry_writes_nothing_and_is_counted(backend):
    N, pad_bs, V = 4, 4, 256
    c = _comm(backend, V, N, torch.float32)
    try:
        g = torch.Generator().manual_seed(6)
        x = torch.randn(pad_bs * N, V, generator=g).cuda()
        tok = c.sample(x, temperature=0.0, seed=0, offset=0).cpu().tolist()
        # chains that are all accepted (greedy), and ones that are not
        full = [[0] + [tok[b * N + i - 1] for i in range(1, N)] for b in range(pad_bs)]
        none = [[0] + [(tok[b * N + i - 1] + 1) % V for i in range(1, N)] for b in range(pad_bs)]
        full_t = torch.tensor(full, dtype=torch.int32, device="cuda")
        none_t = torch.tensor(none, dtype=torch.int32, device="cuda")
        out = c.verify_chain(x, none_t, pad_bs=pad_bs, temperature=0.0, seed=0, offset=0,
                             return_logprobs=True)
        assert out[2].cpu().tolist() == [1] * pad_bs
        keep = [t.clone() for t in out]
        temps = torch.zeros(pad_bs, device="cuda")
        temps[2] = -1.0
        before = c.sample_stats()
        out = c.verify_chain(x, full_t, pad_bs=pad_bs, temperature=temps, seed=0, offset=0,
                             return_logprobs=True)
        torch.cuda.synchronize()
        for t, k in zip(out, keep):
            assert torch.equal(t, k), "a call with an invalid entry wrote its outputs"
        after = c.sample_stats()
        assert after["invalid_calls"] == before["invalid_calls"] + 1
        assert "temperature" in (after["last_invalid"] or ""), after
        temps[2] = 0.0
        out = c.verify_chain(x, full_t, pad_bs=pad_bs, temperature=temps, seed=0, offset=0)
        assert out[2].cpu().tolist() == [N] * pad_bs
    finally:
        c.close()


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_with_changed_inputs(backend):
    """verify_chain captured in a CUDA graph and replayed after the logits,
    the candidates and every parameter tensor changed in place gives the
    eager call's outputs."""
    N, pad_bs, V = 4, 8, 4096
    c = _comm(backend, V, N, torch.bfloat16)
    try:
        g = torch.Generator().manual_seed(8)
        dev = "cuda"
        x = torch.empty(pad_bs * N, V, dtype=torch.bfloat16, device=dev)
        cand = torch.empty(pad_bs, N, dtype=torch.int32, device=dev)
        T, P, M = (torch.empty(pad_bs, device=dev) for _ in range(3))
        K = torch.empty(pad_bs, dtype=torch.int32, device=dev)
        S, O = (torch.empty(pad_bs, dtype=torch.int64, device=dev) for _ in range(2))
        kw = dict(pad_bs=pad_bs, temperature=T, top_k=K, top_p=P, min_p=M, seed=S, offset=O,
                  return_logprobs=True)

        def fill():
            x.copy_(torch.randn(pad_bs * N, V, generator=g).to(torch.bfloat16))
            T.copy_(torch.where(torch.rand(pad_bs, generator=g) < 0.3, 0.0,
                                0.3 + torch.rand(pad_bs, generator=g)))
            K.copy_(torch.randint(0, 90, (pad_bs,), generator=g, dtype=torch.int32))
            P.copy_(0.5 + 0.5 * torch.rand(pad_bs, generator=g))
            M.copy_(torch.where(torch.rand(pad_bs, generator=g) < 0.5, 0.0, 0.05))
            S.copy_(torch.randint(-2**62, 2**62, (pad_bs,), generator=g, dtype=torch.int64))
            O.copy_(torch.randint(-2**62, 2**62, (pad_bs,), generator=g, dtype=torch.int64))
            row_off = O.repeat_interleave(N) + torch.arange(N, device=dev).repeat(pad_bs)
            tok = c.sample(x, temperature=T.repeat_interleave(N), top_k=K.repeat_interleave(N),
                           top_p=P.repeat_interleave(N), min_p=M.repeat_interleave(N),
                           seed=S.repeat_interleave(N), offset=row_off)
            t = tok.view(pad_bs, N).to(torch.int32)
            new = torch.randint(0, V, (pad_bs, N), generator=g, dtype=torch.int32).to(dev)
            m = torch.randint(0, N, (pad_bs, 1), generator=g)
            match = (torch.arange(N).view(1, N) <= m).to(dev)
            new[:, 1:] = torch.where(match[:, 1:], t[:, :-1], new[:, 1:])
            cand.copy_(new)

        fill()
        s = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            c.verify_chain(x, cand, **kw)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=s):
                got = c.verify_chain(x, cand, **kw)
        lengths = set()
        for _ in range(3):
            fill()
            for t in got:
                t.fill_(-7)
            graph.replay()
            torch.cuda.synchronize()
            replayed = [t.clone() for t in got]
            want = c.verify_chain(x, cand, **kw)
            assert all(torch.equal(r, w) for r, w in zip(replayed, want))
            lengths |= set(replayed[2].cpu().tolist())
        assert len(lengths) > 1, lengths
        del graph
    finally:
        c.close()


# ---- GPU: arguments ----------------------------------------------------------------


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_raise_naming_the_argument(backend):
    N, pad_bs, V = 4, 3, 100  # vocab_mask: ceil(100/32) = 4 words per row
    c = _comm(backend, V, N, torch.float32, max_pad_bs=4)
    try:
        dev = "cuda"
        x = torch.randn(pad_bs * N, V, device=dev)
        cand = torch.zeros(pad_bs, N, dtype=torch.int32, device=dev)
        mask = torch.tensor(pack_mask([range(V)] * (pad_bs * N), V), dtype=torch.int32,
                            device=dev)
        base = dict(pad_bs=pad_bs, temperature=1.0, seed=0, offset=0)
        out = c.verify_chain(x, cand, vocab_mask=mask, softcap=30.0, return_logprobs=True, **base)
        keep = [t.clone() for t in out]
        i32 = dict(dtype=torch.int32, device=dev)
        cases = [
            # candidates
            (TypeError, r"candidates must be torch\.int32, got torch\.int64", {},
             dict(candidates=cand.long())),
            (TypeError, r"candidates must be a torch\.Tensor, got list", {},
             dict(candidates=cand.tolist())),
            (ValueError, r"candidates has shape \[3, 5\] but must be \[pad_bs, "
                         r"num_tokens_per_req\] = \[3, 4\]", {},
             dict(candidates=torch.zeros(pad_bs, N + 1, **i32))),
            (ValueError, r"candidates has shape \[4, 4\]", {},
             dict(candidates=torch.zeros(pad_bs + 1, N, **i32))),
            (ValueError, r"candidates must be 2-D, got shape", {},
             dict(candidates=cand.view(-1))),
            (ValueError, r"candidates must be a CUDA tensor", {}, dict(candidates=cand.cpu())),
            (ValueError, r"candidates must be contiguous",
             {}, dict(candidates=torch.zeros(N, pad_bs, **i32).t())),
            # the rows and pad_bs
            (ValueError, r"local_logits has 11 rows but pad_bs\*num_tokens_per_req = 3\*4 = 12",
             {}, dict(local_logits=x[:11])),
            (ValueError, r"local_logits has 12 rows but pad_bs\*num_tokens_per_req = 2\*4 = 8",
             dict(pad_bs=2), {}),
            (ValueError, r"pad_bs=5 must be in \[1, max_pad_bs=4\]", dict(pad_bs=5), {}),
            (ValueError, r"pad_bs=0 must be a positive int", dict(pad_bs=0), {}),
            (ValueError, r"local_logits must be a CUDA tensor", {}, dict(local_logits=x.cpu())),
            (TypeError, r"local_logits dtype torch\.float64 is not supported", {},
             dict(local_logits=x.double())),
            # vocab_mask
            (ValueError, r"vocab_mask has shape \[12, 5\] but must be "
                         r"\[pad_bs\*num_tokens_per_req, ceil\(vocab_size/32\)\] = \[12, 4\]",
             dict(vocab_mask=torch.zeros(pad_bs * N, 5, **i32)), {}),
            (ValueError, r"vocab_mask has shape \[3, 4\]",
             dict(vocab_mask=torch.zeros(pad_bs, 4, **i32)), {}),
            (TypeError, r"vocab_mask must be torch\.int32, got torch\.uint8",
             dict(vocab_mask=torch.zeros(pad_bs * N, 16, dtype=torch.uint8, device=dev)), {}),
            (ValueError, r"vocab_mask must be 2-D", dict(vocab_mask=mask.view(-1)), {}),
            (ValueError, r"vocab_mask must be a CUDA tensor", dict(vocab_mask=mask.cpu()), {}),
            # parameter tensors: one entry per request
            (ValueError, r"temperature has shape \[12\] but pad_bs=3 \(one value per request\)",
             dict(temperature=torch.ones(pad_bs * N, device=dev)), {}),
            (ValueError, r"offset has shape \[2\] but pad_bs=3",
             dict(offset=torch.zeros(2, dtype=torch.int64, device=dev)), {}),
            (TypeError, r"top_k must be a Python number or a torch\.int32 or torch\.int64 tensor "
                        r"\[pad_bs\], got torch\.float32",
             dict(top_k=torch.ones(pad_bs, device=dev)), {}),
            (TypeError, r"seed must be .*torch\.int64.*got torch\.int32",
             dict(seed=torch.zeros(pad_bs, **i32)), {}),
            (ValueError, r"min_p must be a CUDA tensor", dict(min_p=torch.zeros(pad_bs)), {}),
            # scalars
            (ValueError, r"softcap=-1", dict(softcap=-1.0), {}),
            (ValueError, r"softcap=nan", dict(softcap=math.nan), {}),
            (ValueError, r"softcap=inf", dict(softcap=math.inf), {}),
            (ValueError, r"temperature", dict(temperature=-1.0), {}),
            (ValueError, r"top_p", dict(top_p=0.0), {}),
            (ValueError, r"min_p", dict(min_p=1.0), {}),
            (ValueError, r"vocab_limit", dict(vocab_limit=V + 1), {}),
        ]
        for exc, match, kw, pos in cases:
            args = dict(base, **kw)
            with pytest.raises(exc, match=match):
                c.verify_chain(pos.get("local_logits", x), pos.get("candidates", cand), **args)
        torch.cuda.synchronize()
        for t, k in zip(out, keep):  # nothing was written
            assert torch.equal(t, k)
    finally:
        c.close()
