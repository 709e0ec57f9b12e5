"""Eager calls without allocation (issue 25): argmax, topk and sample write
the caller's out= tensors or the communicator's persistent outputs, and the
binding's argument parsing and dtype table.

The first part needs neither torch nor a GPU (the methods' argument parsing
runs before the communicator is looked at, and an uncreated communicator
refuses every operation); the second needs torch and a CUDA device (tp=1,
both backends) and skips otherwise.
"""

import re

import pytest

import dpsampling
from dpsampling import DpSamplingComm
from refs import argmax_ref, topk_ref

try:
    import torch
except ImportError:
    torch = None

C = dpsampling._dpsampling
gpu = pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                         reason="needs torch and a CUDA device")
BACKENDS = ["nccl", "onesided"]


# ---- no torch, no GPU ------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda c: c.swap_batch_vocab(), r"swap_batch_vocab\(\) missing required argument "
                                     r"'local_logits'"),
    (lambda c: c.swap_batch_vocab(1, 2, 3), r"swap_batch_vocab\(\) takes at most 2 arguments"),
    (lambda c: c.swap_batch_vocab(1, pad_bz=2), r"unexpected keyword argument 'pad_bz'"),
    (lambda c: c.swap_batch_vocab(1, local_logits=1), r"multiple values for argument "
                                                      r"'local_logits'"),
    (lambda c: c.gather_verify_outputs(1, 2), r"missing required argument "
                                              r"'accept_length_local' \(pos 3\)"),
    (lambda c: c.gather_verify_outputs(1, 2, 3, predict=1), r"gather_verify_outputs\(\) got both "
                                                            r"'predict_local' and its other name "
                                                            r"'predict'"),
    (lambda c: c.gather_verify_outputs(1, 2, 3, 8, 9), r"takes 5 positional arguments but 6"),
    (lambda c: c.gather_verify_outputs(*range(8)), r"takes 5 positional arguments but 9"),
    (lambda c: c.gather_verify_logprobs(pad_bs=1), r"missing required argument 'logprobs_local'"),
    (lambda c: c.gather_verify_logprobs(1, logprobs=1), r"got both 'logprobs_local' and its "
                                                        r"other name 'logprobs'"),
    (lambda c: c.prepare_verify_outputs(), r"prepare_verify_outputs\(\) missing required "
                                           r"argument 'logits_dtype'"),
    (lambda c: c.prepare_verify_outputs("bf16", dtype="bf16"), r"got both 'logits_dtype'"),
    (lambda c: c.prepare_verify_outputs("bf16", "bf16"), r"takes 2 positional arguments but 3"),
    (lambda c: c._swap_batch_vocab_new(), r"missing required argument 'local_logits'"),
    (lambda c: c._select(1, 2), r"_select\(\) takes 7 arguments \(2 given\)"),
    (lambda c: c._sample(1), r"_sample\(\) takes 10 or 11 arguments \(1 given\)"),
    (lambda c: c._verify_chain(1), r"_verify_chain\(\) takes 13 arguments \(1 given\)"),
])
def test_method_arguments_are_parsed_before_anything_else(call, match):
    """The C methods' own argument parsing (METH_FASTCALL): a wrong call is a
    TypeError naming the method and the argument, before the communicator's
    state is looked at (this one was never created)."""
    with pytest.raises(TypeError, match=match):
        call(C.Comm())


@pytest.mark.parametrize("call", [
    lambda c: c.swap_batch_vocab(object(), pad_bs=8),
    lambda c: c.gather_verify_outputs(None, None, None, 8),
    # the upstream component's keywords, and this library's before 0.5
    lambda c: c.gather_verify_outputs(predict_local=None, accept_index_local=None,
                                      accept_length_local=None, pad_bs=8),
    lambda c: c.gather_verify_outputs(predict=None, accept_index=None, accept_length=None),
    lambda c: c.gather_verify_logprobs(logprobs_local=None, pad_bs=8),
    lambda c: c.gather_verify_logprobs(logprobs=None),
    lambda c: c.prepare_verify_outputs(logits_dtype="bf16"),
    lambda c: c.prepare_verify_outputs(dtype="bf16"),
    lambda c: c.argmax(object()),
    lambda c: c.argmax(object(), 5, True, out_value=object()),
    lambda c: c.topk(object(), 3, vocab_limit=7, out_values=object()),
    lambda c: c._sample(object(), 0, 1.0, 0, 1.0, 0.0, 0, 0, None, None, True),
])
def test_every_eager_op_on_an_uncreated_comm_is_refused(call):
    """argmax and topk no longer make tensors in Python before the C call: on
    a communicator that was never created they raise the C layer's
    RuntimeError, without torch (sample() first refuses a non-tensor)."""
    c = DpSamplingComm.__new__(DpSamplingComm)
    with pytest.raises(RuntimeError, match="closed"):
        call(c)


def _message_names(msg):
    """The dtypes and names a dtype error message lists."""
    head, _, names = msg.partition("one of the names")
    return re.findall(r"torch\.\w+", head), re.findall(r"'([a-z0-9]+)'", names)


def test_dtype_names_come_from_one_table():
    """The names the binding lists in its dtype message are exactly the names
    it accepts (both come from one table): each listed name, bare and with the
    'torch.' prefix, maps to the code of the dtype it names."""
    with pytest.raises(TypeError) as e:
        C.dtype_code("int8")
    types, names = _message_names(str(e.value))
    assert types == ["torch.float32", "torch.bfloat16", "torch.float16"], str(e.value)
    assert sorted(names) == sorted(["fp32", "float32", "float", "bf16", "bfloat16", "fp16",
                                    "float16", "half"]), str(e.value)
    want = {"f": C.FLOAT32, "b": C.BFLOAT16, "h": C.FLOAT16}
    for n in names:
        kind = "b" if "b" in n else ("h" if n in ("fp16", "float16", "half") else "f")
        assert C.dtype_code(n) == want[kind], n
        assert C.dtype_code("torch." + n) == want[kind], n
    for t in types:
        assert C.dtype_code(t) in want.values(), t
    for bad in ("int32", "torch.int64", "uint8", "fp8", ""):
        with pytest.raises(TypeError, match="is not a supported logits dtype"):
            C.dtype_code(bad)


# ---- torch and one GPU -----------------------------------------------------------


def _comm(backend, V=1000, dtype=None, max_rows=16, n=1):
    dtype = torch.float32 if dtype is None else dtype
    return DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=max_rows,
                          num_tokens_per_req=n, vocab_size=V, logits_dtype=dtype,
                          backend=backend)


def _allocations():
    """How many blocks torch's caching allocator has handed out so far."""
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_outputs_are_the_same_tensors_and_right(backend):
    V, rows = 1000, 12
    with _comm(backend, V, torch.bfloat16) as c:
        x = torch.randn(rows, V, device="cuda").to(torch.bfloat16)
        v1, i1, l1 = c.argmax(x, return_logsumexp=True)
        assert torch.equal(i1.cpu(), argmax_ref(x.cpu(), V)[1])
        assert v1.dtype == torch.bfloat16 and i1.dtype == torch.int64 and l1.dtype == torch.float32
        assert v1.shape == (rows,) and i1.shape == (rows,) and l1.shape == (rows,)
        v2, i2 = c.argmax(x)
        assert v2 is v1 and i2 is i1, "argmax without out= must return its persistent outputs"
        tv, ti = c.topk(x, 5)
        assert tv.shape == (rows, 5) and ti.shape == (rows, 5) and ti.dtype == torch.int64
        assert torch.equal(ti.cpu(), topk_ref(x.cpu(), V, 5)[1])
        tv2, ti2 = c.topk(x, 5)
        assert tv2 is tv and ti2 is ti
        tv3, ti3 = c.topk(x[:3], 7)  # other rows and k: views of the same buffers
        assert ti3.shape == (3, 7) and tv3.shape == (3, 7)
        assert torch.equal(ti3.cpu(), topk_ref(x[:3].cpu(), V, 7)[1])
        tok, lp = c.sample(x, temperature=0.0, seed=0, offset=0, return_logprobs=True)
        assert torch.equal(tok.cpu(), i1.cpu()) and lp.shape == (rows,)
        tok2 = c.sample(x, temperature=0.0, seed=0, offset=0)
        assert tok2 is tok


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_beyond_the_view_cache_are_right(backend):
    """The binding caches output views for sizes below 65536 only: larger
    batches get a new view each call, of the same persistent buffers."""
    V, big = 64, 65536 + 4
    with _comm(backend, V, max_rows=big) as c:
        for seed in (1, 2):
            x = torch.randn(big, V, generator=torch.Generator().manual_seed(seed)).cuda()
            v, i = c.argmax(x)
            assert i.shape == (big,) and v.shape == (big,)
            assert torch.equal(i.cpu(), argmax_ref(x.cpu(), V)[1]), seed
            assert c.argmax(x)[1] is not i  # beyond the cache: a new view each call
            tok = c.sample(x, temperature=0.0, seed=0, offset=0)
            assert tok.shape == (big,) and torch.equal(tok.cpu(), i.cpu()), seed
            small = c.argmax(x[:12])[1]  # a cached size between two uncached calls
            assert torch.equal(small.cpu(), argmax_ref(x[:12].cpu(), V)[1])
            assert c.argmax(x[:12])[1] is small
            full = c.swap_batch_vocab(x)
            assert full.shape == (big, V) and torch.equal(full, x), seed


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_calls_allocate_nothing(backend):
    """After the first call of each op, further eager calls (with or without
    out=) hand out no new block from torch's allocator."""
    V, rows = 512, 8
    with _comm(backend, V, torch.float32, max_rows=rows) as c:
        x = torch.randn(rows, V, device="cuda")
        p = torch.zeros(rows, 1, dtype=torch.int32, device="cuda")
        al = torch.ones(rows, dtype=torch.int32, device="cuda")
        lpin = torch.zeros(rows, 1, device="cuda")
        cand = torch.zeros(rows, 1, dtype=torch.int32, device="cuda")
        oi = torch.empty(rows, dtype=torch.int64, device="cuda")
        ops = [
            lambda: c.swap_batch_vocab(x, pad_bs=rows),
            lambda: c.gather_verify_outputs(p, p, al, pad_bs=rows),
            lambda: c.gather_verify_logprobs(lpin, pad_bs=rows),
            lambda: c.argmax(x, return_logsumexp=True),
            lambda: c.argmax(x, out_index=oi),
            lambda: c.topk(x, 4),
            lambda: c.sample(x, temperature=0.7, seed=1, offset=2, top_k=20,
                             return_logprobs=True),
            lambda: c.verify_chain(x, cand, pad_bs=rows, temperature=0.0, seed=0, offset=0),
        ]
        for op in ops:
            op()
        torch.cuda.synchronize()
        before = _allocations()
        for _ in range(5):
            for op in ops:
                op()
        torch.cuda.synchronize()
        assert _allocations() == before, "an eager call allocated"


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_out_is_what_is_returned_and_is_checked(backend):
    V, rows = 256, 6
    with _comm(backend, V, torch.float16) as c:
        x = torch.randn(rows, V, device="cuda").half()
        dev = dict(device="cuda")
        ov = torch.empty(rows, dtype=torch.float16, **dev)
        oi = torch.empty(rows, dtype=torch.int64, **dev)
        got = c.argmax(x, out_value=ov, out_index=oi)
        assert got[0] is ov and got[1] is oi
        got = c.argmax(x, out_index=oi)  # one given, one persistent
        assert got[1] is oi and got[0] is not ov and got[0].shape == (rows,)
        tv = torch.empty(rows, 3, dtype=torch.float16, **dev)
        ti = torch.empty(rows, 3, dtype=torch.int64, **dev)
        got = c.topk(x, 3, out_values=tv, out_indices=ti)
        assert got[0] is tv and got[1] is ti
        tok = torch.empty(rows, dtype=torch.int64, **dev)
        lp = torch.empty(rows, dtype=torch.float32, **dev)
        got = c.sample(x, temperature=1.0, seed=3, offset=4, out=tok, out_logprobs=lp,
                       return_logprobs=True)
        assert got[0] is tok and got[1] is lp
        assert c.sample(x, temperature=1.0, seed=3, offset=4, out=tok) is tok

        bad = [
            # (call, exception, message naming the argument)
            (lambda: c.argmax(x, out_index=torch.empty(rows, dtype=torch.int32, **dev)),
             TypeError, r"out_index must be torch.int64"),
            (lambda: c.argmax(x, out_value=torch.empty(rows, dtype=torch.float32, **dev)),
             TypeError, r"out_value must be torch.float16"),
            (lambda: c.argmax(x, out_index=torch.empty(rows + 1, dtype=torch.int64, **dev)),
             ValueError, r"out_index must hold 6 elements"),
            (lambda: c.argmax(x, out_index=torch.empty(rows, dtype=torch.int64)),
             ValueError, r"out_index must be a CUDA tensor"),
            (lambda: c.argmax(x, None, True, out_lse=torch.empty(2, rows, **dev)[:, 0]),
             ValueError, r"out_lse must be contiguous"),
            (lambda: c.topk(x, 3, out_indices=torch.empty(rows, 4, dtype=torch.int64, **dev)),
             ValueError, r"out_indices must hold 18 elements"),
            (lambda: c.topk(x, 3, out_values=torch.empty(rows, 3, dtype=torch.float16)),
             ValueError, r"out_values must be a CUDA tensor"),
            (lambda: c.sample(x, temperature=1.0, seed=0, offset=0,
                              out=torch.empty(rows, dtype=torch.int32, **dev)),
             TypeError, r"out must be torch.int64"),
            (lambda: c.sample(x, temperature=1.0, seed=0, offset=0,
                              out=torch.empty(rows - 1, dtype=torch.int64, **dev)),
             ValueError, r"out must hold 6 elements"),
            (lambda: c.sample(x, temperature=1.0, seed=0, offset=0, return_logprobs=True,
                              out_logprobs=torch.empty(rows, **dev).cpu()),
             ValueError, r"out_logprobs must be a CUDA tensor"),
        ]
        if torch.cuda.device_count() > 1:
            bad.append((lambda: c.argmax(x, out_index=torch.empty(rows, dtype=torch.int64,
                                                                  device="cuda:1")),
                        ValueError, r"out_index is on cuda:1"))
        poison = torch.full((rows,), 77, dtype=torch.int64, **dev)
        for call, exc, match in bad:
            with pytest.raises(exc, match=match):
                call()
        with pytest.raises(ValueError):  # a refused call writes nothing
            c.argmax(x, vocab_limit=V + 1, out_index=poison)
        assert poison.cpu().tolist() == [77] * rows


@gpu
def test_rows_out_of_range_are_refused_without_allocating():
    """rows above max_pad_bs*N: the library's refusal, not an allocation of a
    persistent buffer that large."""
    with _comm("nccl", 64, torch.float32, max_rows=4) as c:
        x = torch.zeros(5, 64, device="cuda")
        before = torch.cuda.memory_allocated()
        with pytest.raises(ValueError, match="rows=5"):
            c.argmax(x)
        with pytest.raises(ValueError, match="rows=5"):
            c.sample(x, temperature=0.0, seed=0, offset=0)
        assert torch.cuda.memory_allocated() == before


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_outputs_outlive_close(backend):
    """A persistent output handed out stays a valid tensor after close()."""
    c = _comm(backend, 128, torch.float32)
    x = torch.randn(4, 128, device="cuda")
    _, idx = c.argmax(x)
    c.close()
    assert torch.equal(idx.cpu(), argmax_ref(x.cpu(), 128)[1])


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_persistent_outputs_never_move(backend):
    """A graph captured with the persistent topk outputs keeps writing the
    views it returned, also after eager calls with another k and other rows
    (the buffer is allocated once at its largest size)."""
    V, rows = 512, 8
    with _comm(backend, V, torch.float32, max_rows=rows) as c:
        x = torch.randn(rows, V, device="cuda")
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            c.topk(x, 4)  # the first call allocates, outside the capture
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                tv, ti = c.topk(x, 4)
        base = ti.data_ptr()
        c.topk(x[:2], 64)  # the largest k, other rows: the same buffer
        for seed in (1, 2):
            x.copy_(torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)).cuda())
            g.replay()
            torch.cuda.synchronize()
            want_v, want_i = topk_ref(x.cpu(), V, 4)
            assert torch.equal(ti.cpu(), want_i) and torch.equal(tv.cpu(), want_v), seed
        assert c.topk(x, 4)[1].data_ptr() == base
        del g


@pytest.fixture(params=[True, False], ids=["exchange-api", "methods"])
def tensor_path(request):
    """Tensor arguments read through torch's DLPack C exchange API, or
    through the tensor's methods (the path of torch before 2.10 and of
    tensor subclasses); the previous setting is restored after."""
    was = C._tensor_fast_path()[0]
    state = C._tensor_fast_path(request.param)
    if request.param and hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert state[0] and state[1] >= (1, 3), f"torch has the exchange API, unused: {state}"
    yield request.param
    C._tensor_fast_path(was)


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_arguments_read_either_way(backend, tensor_path):
    """Where a tensor argument starts, its shape and whether it is
    row-major, as torch says, on both paths: views at an offset into a
    larger tensor give their own values back (tp = 1: the gathers return
    their input), a transposed [8, 1] is row-major (a size-1 dim's stride
    does not count), a column slice and a transpose are not, and a CPU
    tensor, a wrong rank or dtype are refused by name."""
    rows, V = 8, 64
    with _comm(backend, V, torch.float32, max_rows=rows) as c:
        base = torch.randn(3 * rows, V, device="cuda")
        x = base[rows:2 * rows]  # starts rows*V elements in
        assert torch.equal(c.swap_batch_vocab(x, pad_bs=rows), x)
        big = torch.randn(4 * rows, device="cuda")
        lp = big[5:5 + rows].view(rows, 1)
        assert torch.equal(c.gather_verify_logprobs(lp, pad_bs=rows), lp)
        tcol = torch.randn(1, rows, device="cuda").t()  # [8, 1], strides (1, 8)
        assert tcol.is_contiguous()
        assert torch.equal(c.gather_verify_logprobs(tcol, pad_bs=rows), tcol)
        ints = torch.arange(6 * rows, dtype=torch.int32, device="cuda") % rows
        ints[5 * rows:] = 1
        p, ai = ints[rows:2 * rows].view(rows, 1), ints[3 * rows:4 * rows].flip(0).view(rows, 1)
        al = ints[5 * rows:6 * rows]
        gp, gai, gal = c.gather_verify_outputs(p, ai, al, pad_bs=rows)
        assert torch.equal(gp, p) and torch.equal(gai, ai) and torch.equal(gal, al)
        oi = torch.empty(2 * rows, dtype=torch.int64, device="cuda")[rows:]
        assert c.argmax(x, out_index=oi)[1] is oi
        assert torch.equal(oi.cpu(), argmax_ref(x.cpu(), V)[1])
        seeds = torch.arange(2 * rows, dtype=torch.int64, device="cuda")[rows:]
        tok = c.sample(x, temperature=0.0, seed=seeds, offset=0)
        assert torch.equal(tok.cpu(), argmax_ref(x.cpu(), V)[1])
        # top_k as int32 and as int64 (the second dtype a parameter may take): top_k = 1 is
        # the argmax whatever the temperature
        k1 = torch.ones(rows, dtype=torch.int32, device="cuda")
        for k in (k1, k1.long()):
            tok = c.sample(x, temperature=1.0, top_k=k, seed=seeds, offset=0)
            assert torch.equal(tok.cpu(), argmax_ref(x.cpu(), V)[1])
        bad = [
            (lambda: c.gather_verify_logprobs(torch.randn(rows, 3, device="cuda")[:, 1:2],
                                              pad_bs=rows),
             ValueError, r"logprobs must be contiguous"),
            (lambda: c.swap_batch_vocab(torch.randn(V, rows, device="cuda").t(), pad_bs=rows),
             ValueError, r"local_logits must be contiguous"),
            (lambda: c.swap_batch_vocab(x.cpu(), pad_bs=rows),
             ValueError, r"local_logits must be a CUDA tensor on cuda:0"),
            (lambda: c.gather_verify_logprobs(lp.view(-1), pad_bs=rows),
             ValueError, r"logprobs must be 2-D, got shape torch.Size\(\[8\]\)"),
            (lambda: c.gather_verify_outputs(p, ai.long(), al, pad_bs=rows),
             TypeError, r"accept_index must be torch.int32"),
            (lambda: c.sample(x, temperature=0.0, seed=seeds[:-1], offset=0),
             ValueError, r"seed has shape \[7\] but local_logits has 8 rows"),
            (lambda: c.sample(x, temperature=0.0, seed=seeds.view(1, rows), offset=0),
             ValueError, r"seed must be 1-D"),
            (lambda: c.swap_batch_vocab(x.double(), pad_bs=rows),
             TypeError, r"local_logits dtype torch.float64 is not supported"),
            (lambda: c.sample(x, temperature=torch.ones(rows, device="cuda", dtype=torch.float64),
                              seed=seeds, offset=0),
             TypeError, r"temperature must be a Python number or a torch.float32 tensor"),
            (lambda: c.sample(x, temperature=1.0, top_k=k1.short(), seed=seeds, offset=0),
             TypeError, r"top_k must be a Python number or a torch.int32 or torch.int64 tensor"),
            (lambda: c.sample(x, temperature=0.0, seed=seeds.int(), offset=0),
             TypeError, r"seed must be a Python number or a torch.int64 tensor"),
        ]
        for call, exc, match in bad:
            with pytest.raises(exc, match=match):
                call()


@gpu
def test_ops_queue_on_torchs_current_stream(tensor_path):
    """The stream the operations are queued on is torch's current stream,
    read either way: the default stream, a side stream under
    torch.cuda.stream, a graph's capturing stream."""
    dev = torch.cuda.current_device()
    assert C._current_stream(dev) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert C._current_stream(dev) == side.cuda_stream
    assert side.cuda_stream != torch.cuda.default_stream().cuda_stream
    g, x = torch.cuda.CUDAGraph(), torch.zeros(1, device="cuda")
    with torch.cuda.graph(g):
        x += 1
        assert C._current_stream(dev) == torch.cuda.current_stream().cuda_stream
        assert C._current_stream(dev) != torch.cuda.default_stream().cuda_stream
    assert C._current_stream(dev) == torch.cuda.default_stream().cuda_stream
