"""argmax / topk on DpSamplingComm and the distributed_argmax drop-in (its
group a tuple, or a world-size-1 NCCL ProcessGroup), tp=1 on one GPU (tp
2..8: test_gpu_virtual_ranks scenario=select; multi-GPU: test_gpu_select,
test_world_sizes.py). Every value is checked against torch on the full row,
with the documented rules: NaN counts as -inf, ties go to the lower index,
columns at or beyond vocab_limit are excluded."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import dpsampling  # noqa: E402
from dpsampling import DpSamplingComm  # noqa: E402
from refs import argmax_ref, logit_rows, topk_ref  # noqa: E402

BACKENDS = ["nccl", "onesided"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _comm(backend, V, dtype, max_rows=64):
    return DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=max_rows,
                          num_tokens_per_req=1, vocab_size=V, logits_dtype=dtype,
                          backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("V", [1, 7, 33, 1001, 76032])
def test_argmax_topk_match_torch(backend, dtype, V):
    c = _comm(backend, V, dtype)
    try:
        for step, (rows, limit) in enumerate([(64, V), (1, V), (5, max(1, V // 2)), (33, 1)]):
            x = logit_rows(rows, V, dtype, 10 * V + step).cuda()
            val, idx, lse = c.argmax(x, vocab_limit=limit, return_logsumexp=True)
            want_val, ri, rl = argmax_ref(x, limit)
            assert torch.equal(idx.cpu(), ri), (step, idx.cpu(), ri)
            assert torch.equal(val.float().cpu(), want_val)
            assert torch.allclose(lse.cpu(), rl, rtol=1e-4, atol=1e-4, equal_nan=True)
            for k in (1, 7, 64):
                if k > limit:
                    continue
                vals, inds = c.topk(x, k, vocab_limit=limit)
                rv, ri2 = topk_ref(x, limit, k)
                assert torch.equal(inds.cpu(), ri2), (step, k)
                assert torch.equal(vals.float().cpu(), rv), (step, k)
    finally:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_with_changed_inputs(backend):
    V = 4096
    c = _comm(backend, V, torch.bfloat16)
    x = logit_rows(48, V, torch.bfloat16, 1).cuda()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        c.argmax(x)
        c.topk(x, 8)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            val, idx = c.argmax(x)
            tv, ti = c.topk(x, 8)
    for seed in (2, 3):
        x.copy_(logit_rows(48, V, torch.bfloat16, seed).cuda())
        g.replay()
        torch.cuda.synchronize()
        want_val, want_idx, _ = argmax_ref(x, V)
        assert torch.equal(idx.cpu(), want_idx) and torch.equal(val.float().cpu(), want_val)
        rv, ri = topk_ref(x, V, 8)
        assert torch.equal(ti.cpu(), ri) and torch.equal(tv.float().cpu(), rv)
    del g
    c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_tensors_and_the_values_indices_order(backend):
    """argmax returns (values, indices[, lse]) and topk (values, indices), the
    order of torch.max / torch.topk, written into out_* tensors when given."""
    V, rows = 1001, 16
    c = _comm(backend, V, torch.float16)
    x = logit_rows(rows, V, torch.float16, 5).cuda()
    ov = torch.empty(rows, dtype=torch.float16, device="cuda")
    oi = torch.empty(rows, dtype=torch.int64, device="cuda")
    ol = torch.empty(rows, dtype=torch.float32, device="cuda")
    got = c.argmax(x, return_logsumexp=True, out_value=ov, out_index=oi, out_lse=ol)
    assert got[0] is ov and got[1] is oi and got[2] is ol
    want_val, ri, rl = argmax_ref(x, V)
    assert torch.equal(oi.cpu(), ri)
    assert torch.equal(ov.float().cpu(), want_val)
    assert torch.allclose(ol.cpu(), rl, rtol=1e-4, atol=1e-4, equal_nan=True)
    tv = torch.empty(rows, 5, dtype=torch.float16, device="cuda")
    ti = torch.empty(rows, 5, dtype=torch.int64, device="cuda")
    got = c.topk(x, 5, out_values=tv, out_indices=ti)
    assert got[0] is tv and got[1] is ti
    rv, rti = topk_ref(x, V, 5)
    assert torch.equal(ti.cpu(), rti) and torch.equal(tv.float().cpu(), rv)
    c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_name_themselves(backend):
    c = _comm(backend, 64, torch.float32, max_rows=8)
    x = torch.zeros(4, 64, device="cuda")
    with pytest.raises(ValueError, match="rows=9"):
        c.argmax(torch.zeros(9, 64, device="cuda"))
    with pytest.raises(ValueError, match="logits is"):
        c.argmax(torch.zeros(4, 65, device="cuda"))
    with pytest.raises(ValueError, match="vocab_limit=65"):
        c.argmax(x, vocab_limit=65)
    with pytest.raises(ValueError, match="vocab_limit=0"):
        c.argmax(x, vocab_limit=0)
    with pytest.raises(ValueError, match="k=65"):
        c.topk(x, 65)
    with pytest.raises(ValueError, match="k=0"):
        c.topk(x, 0)
    with pytest.raises(RuntimeError, match="differs"):
        c.argmax(x.to(torch.bfloat16))
    with pytest.raises(TypeError, match="torch.int64"):
        c.argmax(x, out_index=torch.zeros(4, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="out_index must hold 4"):
        c.argmax(x, out_index=torch.zeros(3, dtype=torch.int64, device="cuda"))
    poison = torch.full((4,), 77, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError):
        c.argmax(x, vocab_limit=0, out_index=poison)
    assert torch.equal(poison.cpu(), torch.full((4,), 77, dtype=torch.int64))
    c.close()


def _check_drop_in(st, V, M, seeds=(1, 2)):
    """distributed_argmax against torch on the full rows: into out_max /
    out_idx, and into tensors of its own, for M rows and for fewer; an
    engine's idle step (no rows) gives empty outputs."""
    out_max = torch.empty(M, dtype=torch.bfloat16, device="cuda:0")
    out_idx = torch.empty(M, dtype=torch.int64, device="cuda:0")
    mx0, ix0 = dpsampling.distributed_argmax(st, torch.empty((0, V), dtype=torch.bfloat16,
                                                              device="cuda:0"))
    assert mx0.shape == (0,) and ix0.shape == (0,) and ix0.dtype == torch.int64
    assert mx0.dtype == torch.bfloat16 and ix0.device == torch.device("cuda:0")
    assert st.comm is not None  # created by the first call all the same, outside capture
    for seed, m in zip(seeds, (M, 3)):
        x = logit_rows(m, V, torch.bfloat16, seed).to("cuda:0")
        want, ri, _ = argmax_ref(x, V)
        mx, ix = dpsampling.distributed_argmax(st, x, out_max=out_max[:m], out_idx=out_idx[:m])
        assert mx.data_ptr() == out_max.data_ptr() and ix.data_ptr() == out_idx.data_ptr()
        # argmax leaves the communicator's dtype unset: no swap buffers
        assert st.comm.logits_dtype is None
        torch.cuda.synchronize(0)
        assert torch.equal(ix.cpu(), ri)
        assert torch.equal(mx.float().cpu(), want) and mx.dtype == torch.bfloat16
        x2 = logit_rows(m, V, torch.bfloat16, seed + 50)
        mx2, ix2 = dpsampling.distributed_argmax(st, x2.to("cuda:0"))
        want2, ri2, _ = argmax_ref(x2, V)
        # without out_*: new tensors, as upstream's, that a later call leaves alone
        x3 = logit_rows(m, V, torch.bfloat16, seed + 90)
        mx3, ix3 = dpsampling.distributed_argmax(st, x3.to("cuda:0"))
        torch.cuda.synchronize(0)
        assert torch.equal(ix2.cpu(), ri2) and torch.equal(mx2.float().cpu(), want2)
        assert torch.equal(ix3.cpu(), argmax_ref(x3, V)[1])
        assert ix3.data_ptr() != ix2.data_ptr() and mx3.data_ptr() != mx2.data_ptr()
    with pytest.raises(RuntimeError, match="logits dtype torch.float16 differs from the state's"):
        dpsampling.distributed_argmax(st, torch.zeros((2, V), dtype=torch.float16, device="cuda:0"))


def test_distributed_argmax_drop_in():
    # the upstream engine asks is_available() before creating the state; the
    # device this suite runs on is one the build has code for
    assert dpsampling.is_available() is True
    V, M = 5000, 16
    st = dpsampling.create_dist_argmax_state((0,), 0, M, torch.bfloat16, skip_ping_pong=True)
    _check_drop_in(st, V, M)
    st.close()


@pytest.mark.parametrize("caller", [0, 1], ids=["current_device", "other_current_device"])
def test_drop_in_with_a_process_group(nccl_world1, caller):
    """The upstream engine's call: group=<its ProcessGroup>, rank_in_group,
    device; values against torch on the full rows; the caller's current
    device unchanged by the creation on cuda:0 (also when it is cuda:1)."""
    if caller >= torch.cuda.device_count():
        pytest.skip(f"needs {caller + 1} GPUs to create on cuda:0 from cuda:{caller}, have "
                    f"{torch.cuda.device_count()}")
    V, M = 4096, 16
    torch.cuda.set_device(caller)
    try:
        with pytest.raises(ValueError, match="rank_in_group=1 but this process is rank 0"):
            dpsampling.create_dist_argmax_state(group=nccl_world1, rank_in_group=1, max_M=M,
                                                dtype=torch.bfloat16)
        st = dpsampling.create_dist_argmax_state(
            group=nccl_world1, rank_in_group=0, max_M=M, dtype=torch.bfloat16,
            device=torch.device("cuda", 0), skip_ping_pong=True)
        assert st.group == (0,)
        _check_drop_in(st, V, M, seeds=(3, 4))
        assert torch.cuda.current_device() == caller, "creation changed the current device"
        assert st.comm.cuda_device == 0 and st.comm.group == (0,)
        st.close()
        assert torch.cuda.current_device() == caller
    finally:
        torch.cuda.set_device(0)
