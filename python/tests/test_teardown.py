"""Teardown as an engine does it: a closed or garbage-collected communicator
whose output tensor dies inside another communicator's CUDA-graph capture
must not break that capture; memory and RSS stay flat over many cycles; the
shared NCCL communicator goes only with destroy_group_communicators(). One
GPU (tp=1); the multi-process cases need two GPUs and skip otherwise."""

import gc
import os
import resource
import warnings

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import dpsampling  # noqa: E402
from dpsampling import DpSamplingComm  # noqa: E402

BACKENDS = ["nccl", "onesided"]
PAD, N, V = 64, 4, 1024


def _comm(backend, **kw):
    args = dict(tp_size=1, rank=0, group=(0,), max_pad_bs=PAD, num_tokens_per_req=N,
                vocab_size=V, logits_dtype=torch.bfloat16, backend=backend)
    args.update(kw)
    return DpSamplingComm(**args)


def _logits(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(PAD * N, V, device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("how", ["close", "gc"])
@pytest.mark.parametrize("b2", BACKENDS)
@pytest.mark.parametrize("b1", BACKENDS)
def test_old_output_dies_inside_capture(b1, b2, how):
    a = _comm(b1)
    x = _logits(1)
    out = a.swap_batch_vocab(x, pad_bs=PAD)  # aliases a's persistent buffer
    torch.cuda.synchronize()
    assert torch.equal(out, x)  # tp=1: the swap is the identity
    if how == "close":
        a.close()
        assert a.closed
        with pytest.raises(RuntimeError, match="closed"):
            a.swap_batch_vocab(x, pad_bs=PAD)
        assert torch.equal(out, x)  # still valid after close
    else:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            del a
            gc.collect()
        assert any(issubclass(i.category, ResourceWarning) for i in w), [str(i) for i in w]
        assert torch.equal(out, x)
    c = _comm(b2)
    inp = _logits(2)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        c.swap_batch_vocab(inp, pad_bs=PAD)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            out = c.swap_batch_vocab(inp, pad_bs=PAD)  # the old `out` dies here
    for seed in (3, 4):
        inp.copy_(_logits(seed))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, inp)
    assert dpsampling.release_pending() == 0
    del g, out
    c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_refused_while_capturing(backend):
    c = _comm(backend)
    x = _logits(5)
    c.swap_batch_vocab(x, pad_bs=PAD)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            out = c.swap_batch_vocab(x, pad_bs=PAD)
            with pytest.raises(RuntimeError, match="capturing"):
                c.close()
    assert not c.closed
    x.copy_(_logits(6))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    c.close()
    assert c.closed
    c.close()  # a second close is a no-op


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("backend", BACKENDS)
def test_cycles_flat(backend):
    cycles = int(os.environ.get("DPS_TEARDOWN_CYCLES", "1000"))
    x = _logits(7)
    kept = None

    def cycle():
        nonlocal kept
        c = _comm(backend)
        out = c.swap_batch_vocab(x, pad_bs=PAD)
        c.close()
        kept = out  # the previous cycle's output dies here, after its close

    for _ in range(20):  # warm-up: NCCL's and torch's one-time allocations
        cycle()
    torch.cuda.synchronize()
    dpsampling.release_pending()
    free0 = torch.cuda.mem_get_info()[0]
    rss0 = _rss_mib()
    for _ in range(cycles):
        cycle()
    torch.cuda.synchronize()
    assert torch.equal(kept, x)
    # the last output dies inside a capture of another communicator
    c = _comm(backend)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        c.swap_batch_vocab(x, pad_bs=PAD)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            kept = c.swap_batch_vocab(x, pad_bs=PAD)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(kept, x)
    del g, kept
    c.close()
    assert dpsampling.release_pending() == 0
    torch.cuda.synchronize()
    free1 = torch.cuda.mem_get_info()[0]
    rss1 = _rss_mib()
    drop = (free0 - free1) / 2**20
    print(f"\n{backend}: {cycles} cycles: free device memory drop {drop:.1f} MiB, "
          f"RSS {rss0:.1f} -> {rss1:.1f} MiB")
    assert drop <= 64, f"device memory dropped by {drop:.1f} MiB over {cycles} cycles"
    assert rss1 - rss0 <= 64, f"RSS grew by {rss1 - rss0:.1f} MiB over {cycles} cycles"


def test_group_destroyed_only_explicitly():
    c = _comm("nccl")
    c.swap_batch_vocab(_logits(8), pad_bs=PAD)
    with pytest.raises(RuntimeError, match="still open"):
        dpsampling.destroy_group_communicators()
    c.close()
    dpsampling.destroy_group_communicators()
    # a new communicator on the same group bootstraps a new NCCL communicator
    c = _comm("onesided")
    x = _logits(9)
    out = c.swap_batch_vocab(x, pad_bs=PAD)
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    c.close()
