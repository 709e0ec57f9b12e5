"""Several GPUs, one process per rank, groups given as torch.distributed
ProcessGroups (the world's, and sub-groups made with new_group), as the
upstream engine passes them. Every output is checked against ground truth
built from the full tensor on every rank (the swap's rows, the gathered
verify outputs and logprobs, torch's argmax / sort of the full row), never
one backend or code path against another. The spec's own scenarios (tp=2,
groups as tuples) are test_spec.py; its ground-truth workers run here at
tp=4 and tp=8 too. Each case skips itself, saying why, when the machine has
fewer GPUs than the world size, or (onesided) when onesided_available()
returns False for the group."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import dpsampling  # noqa: E402
from dpsampling import (  # noqa: E402
    DpSamplingComm,
    create_dist_argmax_state,
    distributed_argmax,
    swap_batch_vocab,
)
from refs import argmax_ref, logit_rows, topk_ref  # noqa: E402
from test_spec import (  # noqa: E402  (the spec's runner and its ground-truth workers)
    _CountingNcclBackend,
    _run,
    _test_gather_persistent_buffer_reuse,
    _test_gather_verify_logprobs_correctness,
    _test_gather_verify_outputs_correctness,
    _test_nccl_single_allgather,
)

ALL_SIZES = [pytest.param(2, id="tp2"), pytest.param(4, id="tp4"), pytest.param(8, id="tp8")]
BIG_SIZES = [pytest.param(4, id="tp4"), pytest.param(8, id="tp8")]
BACKENDS = ["nccl", "onesided"]


def _need(world_size, backend="nccl"):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < world_size:
        pytest.skip(f"needs {world_size} GPUs, have {have}")
    group = tuple(range(world_size))
    if backend == "onesided" and not dpsampling.onesided_available(group):
        pytest.skip(f"onesided_available({group}) returned False on this machine")


# ---- ground truth, the same on every rank -------------------------------------------


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _full_logits(rows, vocab, dtype, seed, device):
    """The whole batch's logits [rows, V] (rows of every kind, refs.py)."""
    return logit_rows(rows, vocab, dtype, seed).to(device)


def _full_verify(pad_bs, n, seed, device):
    """The whole batch's predict, accept_index [pad_bs, N], accept_length
    [pad_bs] (int32) and logprobs [pad_bs, N] (fp32)."""
    g = _gen(seed)
    p = torch.randint(-(2**31), 2**31 - 1, (pad_bs, n), generator=g, dtype=torch.int32)
    ai = torch.randint(-(2**31), 2**31 - 1, (pad_bs, n), generator=g, dtype=torch.int32)
    al = torch.randint(-(2**31), 2**31 - 1, (pad_bs,), generator=g, dtype=torch.int32)
    lp = torch.randn(pad_bs, n, generator=g)
    return [t.to(device) for t in (p, ai, al, lp)]


def _same_bits(a, b):
    """Bit-for-bit equal (NaN included) and of one shape and dtype."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _shard(full, rank, tp):
    vl = full.shape[1] // tp
    return full[:, rank * vl:(rank + 1) * vl].contiguous()


def _check_swap_and_gathers(comm, rank, tp, pad_bs, n, vocab, dtype, seed, device, pg=None):
    """One swap and both gathers at pad_bs, each against the full tensors;
    with pg, the free function swap_batch_vocab over the same group too."""
    full = _full_logits(pad_bs * n, vocab, dtype, seed, device)
    local = _shard(full, rank, tp)
    reqs = pad_bs // tp
    mine = full[rank * reqs * n:(rank + 1) * reqs * n]
    out = comm.swap_batch_vocab(local, pad_bs=pad_bs)
    assert _same_bits(out, mine)
    if pg is not None:
        free = swap_batch_vocab(local, tp_size=tp, pad_bs=pad_bs, num_tokens_per_req=n,
                                vocab_size=vocab, group=pg)
        assert _same_bits(free, mine)
    p, ai, al, lp = _full_verify(pad_bs, n, seed, device)
    sl = slice(rank * reqs, (rank + 1) * reqs)
    gp, gai, gal = comm.gather_verify_outputs(p[sl].contiguous(), ai[sl].contiguous(),
                                              al[sl].contiguous(), pad_bs=pad_bs)
    assert torch.equal(gp, p) and torch.equal(gai, ai) and torch.equal(gal, al)
    glp = comm.gather_verify_logprobs(lp[sl].contiguous(), pad_bs=pad_bs)
    assert torch.equal(glp, lp)


# ---- workers (run on every rank by the spec's _run) ---------------------------------


def _w_swap_gathers(rank, world_size, device, group, *, n, dtype, backend):
    pg = dist.group.WORLD
    tp, vocab = world_size, 1001 * world_size  # an odd vocab slice
    comm = DpSamplingComm(tp_size=tp, rank=rank, group=pg, max_pad_bs=4 * tp,
                          num_tokens_per_req=n, vocab_size=vocab, logits_dtype=dtype,
                          backend=backend)
    assert comm.group == tuple(range(tp)) and comm.backend == backend
    for step, pad_bs in enumerate((4 * tp, tp, 2 * tp)):  # pad_bs changing between calls
        _check_swap_and_gathers(comm, rank, tp, pad_bs, n, vocab, dtype, 10 + step, device,
                                pg if backend == "nccl" else None)
    comm.close()


def _w_graph(rank, world_size, device, group, *, backend):
    """swap, both gathers and argmax captured once, replayed with new inputs
    copied into the same buffers; every replay against that step's truth."""
    pg = dist.group.WORLD
    tp, n, vocab, dtype = world_size, 2, 64 * world_size, torch.float32
    pad_bs = 2 * tp
    reqs, rows = pad_bs // tp, pad_bs * n
    comm = DpSamplingComm(tp_size=tp, rank=rank, group=pg, max_pad_bs=pad_bs,
                          num_tokens_per_req=n, vocab_size=vocab, logits_dtype=dtype,
                          backend=backend)
    x = torch.empty(rows, vocab // tp, dtype=dtype, device=device)
    p = torch.empty(reqs, n, dtype=torch.int32, device=device)
    ai, al = torch.empty_like(p), torch.empty(reqs, dtype=torch.int32, device=device)
    lp = torch.empty(reqs, n, dtype=torch.float32, device=device)
    sl = slice(rank * reqs, (rank + 1) * reqs)

    def fill(step):
        full = _full_logits(rows, vocab, dtype, 100 + step, device)
        fp, fai, fal, flp = _full_verify(pad_bs, n, 100 + step, device)
        x.copy_(_shard(full, rank, tp))
        p.copy_(fp[sl])
        ai.copy_(fai[sl])
        al.copy_(fal[sl])
        lp.copy_(flp[sl])
        return full, (fp, fai, fal, flp)

    def ops():
        return (comm.swap_batch_vocab(x, pad_bs=pad_bs),
                *comm.gather_verify_outputs(p, ai, al, pad_bs=pad_bs),
                comm.gather_verify_logprobs(lp, pad_bs=pad_bs),
                *comm.argmax(x))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fill(0)
        ops()  # the first swap allocates: outside capture
    torch.cuda.synchronize(device)
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = ops()
    torch.cuda.synchronize(device)
    dist.barrier()
    for step in range(1, 5):
        with torch.cuda.stream(side):
            full, (fp, fai, fal, flp) = fill(step)
            graph.replay()
        torch.cuda.synchronize(device)
        swapped, gp, gai, gal, glp, val, idx = outs
        assert _same_bits(swapped, full[rank * reqs * n:(rank + 1) * reqs * n]), step
        assert torch.equal(gp, fp) and torch.equal(gai, fai) and torch.equal(gal, fal), step
        assert torch.equal(glp, flp), step
        want_val, want_idx, _ = argmax_ref(full, vocab)
        assert torch.equal(idx.cpu(), want_idx) and torch.equal(val.float().cpu(), want_val), step
        dist.barrier()
    del graph
    comm.close()


def _w_onesided_lazy(rank, world_size, device, group, *, dtype):
    """Dtype unset at creation: prepare then gather (no swap yet), the first
    swap with the prepared dtype, a later prepare(fp32) keeps it, another
    dtype's swap is refused; every output against the full tensors."""
    pg = dist.group.WORLD
    tp, n, vocab, pad_bs = world_size, 4, 8 * world_size, 2 * world_size
    comm = DpSamplingComm(tp_size=tp, rank=rank, group=pg, max_pad_bs=pad_bs,
                          num_tokens_per_req=n, vocab_size=vocab, logits_dtype=None,
                          backend="onesided")
    assert comm.logits_dtype is None and comm.is_initialized is False
    comm.prepare_verify_outputs(dtype)
    assert comm.is_initialized is True
    reqs = pad_bs // tp
    sl = slice(rank * reqs, (rank + 1) * reqs)
    fp, fai, fal, _ = _full_verify(pad_bs, n, 7, device)
    gp, gai, gal = comm.gather_verify_outputs(fp[sl].contiguous(), fai[sl].contiguous(),
                                              fal[sl].contiguous(), pad_bs=pad_bs)
    assert torch.equal(gp, fp) and torch.equal(gai, fai) and torch.equal(gal, fal)
    _check_swap_and_gathers(comm, rank, tp, pad_bs, n, vocab, dtype, 8, device)
    comm.prepare_verify_outputs(torch.float32)  # the communicator keeps its dtype
    assert comm.logits_dtype == dtype
    _check_swap_and_gathers(comm, rank, tp, pad_bs, n, vocab, dtype, 9, device)
    other = _full_logits(pad_bs * n, vocab, torch.float32, 9, device)
    with pytest.raises(RuntimeError, match="differs"):
        comm.swap_batch_vocab(_shard(other, rank, tp), pad_bs=pad_bs)
    comm.close()


def _w_select_drop_in(rank, world_size, device, group, *, backend):
    """The drop-in first (its creation bootstraps the group over the given
    ProcessGroup, on `device` while the caller's current device is another),
    then argmax / top-k on the shards; all against the full rows."""
    pg = dist.group.WORLD
    tp, vocab, rows = world_size, 1001 * world_size, 24
    dtype = torch.bfloat16
    other = (rank + 1) % world_size
    with pytest.raises(ValueError, match=f"rank_in_group={other} but this process is rank {rank}"):
        create_dist_argmax_state(group=pg, rank_in_group=other, max_M=rows, dtype=dtype)
    torch.cuda.set_device(other)
    try:
        st = create_dist_argmax_state(group=pg, rank_in_group=dist.get_rank(pg), max_M=rows,
                                      dtype=dtype, device=device, skip_ping_pong=True)
        full = _full_logits(rows, vocab, dtype, 1, device)
        mx, ix = distributed_argmax(st, _shard(full, rank, tp))
        assert torch.cuda.current_device() == other, "creation changed the current device"
        assert st.comm.cuda_device == device.index and st.comm.group == tuple(range(tp))
        torch.cuda.synchronize(device)
    finally:
        torch.cuda.set_device(device)
    want_val, want_idx, want_lse = argmax_ref(full, vocab)
    assert torch.equal(ix.cpu(), want_idx) and torch.equal(mx.float().cpu(), want_val)
    assert mx.dtype == dtype
    st.close()

    comm = DpSamplingComm(tp_size=tp, rank=rank, group=pg, max_pad_bs=rows, vocab_size=vocab,
                          logits_dtype=dtype, backend=backend)
    for step, (r, limit) in enumerate(((rows, vocab), (5, vocab - 1), (rows, vocab // tp + 3))):
        full = _full_logits(r, vocab, dtype, 20 + step, device)
        shard = _shard(full, rank, tp)
        val, idx, lse = comm.argmax(shard, vocab_limit=limit, return_logsumexp=True)
        want_val, want_idx, want_lse = argmax_ref(full, limit)
        assert torch.equal(idx.cpu(), want_idx), step
        assert torch.equal(val.float().cpu(), want_val), step
        assert torch.allclose(lse.cpu(), want_lse, rtol=1e-4, atol=1e-4, equal_nan=True), step
        vals, inds = comm.topk(shard, 7, vocab_limit=limit)
        rv, ri = topk_ref(full, limit, 7)
        assert torch.equal(inds.cpu(), ri) and torch.equal(vals.float().cpu(), rv), step
    comm.close()


def _w_sub_groups(rank, world_size, device, group, *, backend):
    """Pairs of ranks as sub-groups (new_group): each pair's communicator and
    drop-in over its own ProcessGroup, bootstrapped over it; each pair's
    values from its own full tensor."""
    pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world_size // 2)]
    sub, seed = pairs[rank // 2], 1000 + rank // 2
    me = dist.get_rank(sub)
    tp, n, vocab, pad_bs = 2, 2, 2 * 500, 4
    comm = DpSamplingComm(tp_size=tp, rank=me, group=sub, max_pad_bs=pad_bs,
                          num_tokens_per_req=n, vocab_size=vocab, logits_dtype=torch.float16,
                          backend=backend)
    assert comm.group == (rank - me, rank - me + 1)
    _check_swap_and_gathers(comm, me, tp, pad_bs, n, vocab, torch.float16, seed, device, sub)
    comm.close()
    st = create_dist_argmax_state(group=sub, rank_in_group=me, max_M=6, dtype=torch.float16,
                                  device=device)
    full = _full_logits(6, vocab, torch.float16, seed, device)
    mx, ix = distributed_argmax(st, _shard(full, me, tp))
    want_val, want_idx, _ = argmax_ref(full, vocab)
    assert torch.equal(ix.cpu(), want_idx) and torch.equal(mx.float().cpu(), want_val)
    st.close()


# ---- cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", ALL_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 4], ids=["decode", "verify"])
def test_swap_and_gathers(world_size, backend, dtype, n):
    _need(world_size, backend)
    _run(world_size, _w_swap_gathers, n=n, dtype=dtype, backend=backend)


@pytest.mark.parametrize("world_size", ALL_SIZES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_onesided_lazy_dtype(world_size, dtype):
    _need(world_size, "onesided")
    _run(world_size, _w_onesided_lazy, dtype=dtype)


class _CountingCollectives(_CountingNcclBackend):
    """The spec's counting backend over the library's collectives, counting
    the all-to-all too: what an engine passes as the free function's
    backend."""

    def __init__(self):
        super().__init__(dpsampling.get_global_backend())
        self.all_to_all_calls = 0

    def all_to_all_single(self, output, input, group):
        self.all_to_all_calls += 1
        return self._inner.all_to_all_single(output, input, group)


def _w_engine_calls(rank, world_size, device, group, *, backend):
    """The upstream engine's own calls (tokenspeed f4d8ec6e,
    sampling/logits_layout.py and sampling/backends/flashinfer.py): created
    with logits_dtype=None and device=, the swap with pad_bs=, then per verify
    step prepare_verify_outputs(dtype), gather_verify_outputs with the
    *_local keywords and gather_verify_logprobs; the free swap with a
    collectives object as backend=. Every output against the full tensors."""
    pg = dist.group.WORLD
    tp, n, vocab, pad_bs = world_size, 4, 96 * world_size, 2 * world_size
    other = (rank + 1) % world_size  # at tp > 1 the caller's current device is another
    torch.cuda.set_device(other)
    try:
        comm = DpSamplingComm(tp_size=tp, rank=rank, group=pg, max_pad_bs=pad_bs,
                              num_tokens_per_req=n, vocab_size=vocab, logits_dtype=None,
                              backend=backend, device=device)
        assert torch.cuda.current_device() == other, "the creation changed the current device"
    finally:
        torch.cuda.set_device(device)
    assert comm.cuda_device == device.index
    # the engine refuses to re-create a comm for a new vocab once this is True:
    # upstream's meaning, the one-sided state exists (never on nccl)
    assert comm.is_initialized is False
    reqs = pad_bs // tp
    full = _full_logits(pad_bs * n, vocab, torch.bfloat16, 21, device)
    mine = full[rank * reqs * n:(rank + 1) * reqs * n]
    assert _same_bits(comm.swap_batch_vocab(_shard(full, rank, tp), pad_bs=pad_bs), mine)
    sl = slice(rank * reqs, (rank + 1) * reqs)
    for step in range(2):
        p, ai, al, lp = _full_verify(pad_bs, n, 22 + step, device)
        if step == 0:  # as the engine calls them
            comm.prepare_verify_outputs(torch.bfloat16)
        else:  # every argument by its upstream keyword
            comm.prepare_verify_outputs(logits_dtype=torch.bfloat16)
        gp, gai, gal = comm.gather_verify_outputs(predict_local=p[sl].contiguous(),
                                                  accept_index_local=ai[sl].contiguous(),
                                                  accept_length_local=al[sl].contiguous(),
                                                  pad_bs=pad_bs)
        assert torch.equal(gp, p) and torch.equal(gai, ai) and torch.equal(gal, al)
        glp = (comm.gather_verify_logprobs(lp[sl].contiguous(), pad_bs=pad_bs) if step == 0 else
               comm.gather_verify_logprobs(logprobs_local=lp[sl].contiguous(), pad_bs=pad_bs))
        assert torch.equal(glp, lp)
    assert comm.is_initialized is (comm.backend == "onesided")
    comm.close()
    assert comm.is_initialized is False
    coll = _CountingCollectives()
    free = swap_batch_vocab(_shard(full, rank, tp), tp_size=tp, pad_bs=pad_bs,
                            num_tokens_per_req=n, vocab_size=vocab, group=pg, backend=coll)
    assert _same_bits(free, mine)
    if tp > 1:  # the exchange went through the object (the free function runs nccl)
        calls = coll.all_to_all_calls + coll.all_gather_calls
        assert calls >= 1, calls


# (scenario, worker, world sizes): sub-groups are pairs of ranks, so 4 and up
SCENARIOS = [
    pytest.param(worker, w, id=f"{name}-tp{w}")
    for name, worker, sizes in (("graph_replay", _w_graph, (2, 4, 8)),
                                ("select_drop_in", _w_select_drop_in, (2, 4, 8)),
                                ("sub_groups", _w_sub_groups, (4, 8)),
                                ("engine_calls", _w_engine_calls, (1, 2, 4, 8)))
    for w in sizes
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("worker,world_size", SCENARIOS)
def test_scenario(worker, world_size, backend):
    _need(world_size, backend)
    _run(world_size, worker, backend=backend)


@pytest.mark.parametrize("world_size", BIG_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 4])
def test_spec_gathers(world_size, backend, n):
    _need(world_size, backend)
    _run(world_size, _test_gather_verify_outputs_correctness, pad_bs=2 * world_size, n=n,
         backend=backend)
    _run(world_size, _test_gather_persistent_buffer_reuse, pad_bs=world_size, n=n,
         backend=backend)


@pytest.mark.parametrize("world_size", BIG_SIZES)
def test_spec_logprobs_and_single_allgather(world_size):
    _need(world_size)
    _run(world_size, _test_gather_verify_logprobs_correctness, pad_bs=2 * world_size, n=4)
    _run(world_size, _test_nccl_single_allgather, pad_bs=2 * world_size, n=4)
