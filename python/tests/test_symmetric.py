"""Symmetric memory on or off, as engines set it (one GPU, tp=1).

vLLM (vllm/env_override.py) and SGLang set NCCL_CUMEM_ENABLE=0. Then NCCL
has no symmetric memory: backend="auto" must give an nccl communicator that
works, backend="onesided" must raise naming the variable, and the process's
CUDA context must survive either way. NCCL reads the variable once per
process, so each case runs in a fresh interpreter."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    import dpsampling
    from dpsampling import DpSamplingComm

    off = sys.argv[1]  # the variable set to 0, or "" for none
    # NCCL before 2.28.7 has no symmetric support on a single-rank communicator
    single_rank_off = dpsampling._C.nccl_version() < 22807
    want_off = off or single_rank_off
    PAD, N, V = 8, 2, 1000

    def comm(backend):
        return DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=PAD,
                              num_tokens_per_req=N, vocab_size=V,
                              logits_dtype=torch.bfloat16, backend=backend)

    def check_ops(c):
        # ground truth at tp=1: the swap returns the logits, the gathers the inputs
        x = torch.randn(PAD * N, V, device="cuda").to(torch.bfloat16)
        out = c.swap_batch_vocab(x, PAD)
        assert torch.equal(out, x), "swap output differs from the logits"
        p = torch.arange(PAD * N, device="cuda", dtype=torch.int32).view(PAD, N)
        ai = p + 1000
        al = torch.arange(PAD, device="cuda", dtype=torch.int32) % (N + 1)
        po, aio, alo = c.gather_verify_outputs(p, ai, al, PAD)
        assert torch.equal(po, p) and torch.equal(aio, ai) and torch.equal(alo, al)
        lp = torch.randn(PAD, N, device="cuda")
        assert torch.equal(c.gather_verify_logprobs(lp, PAD), lp)
        torch.cuda.synchronize()

    a = comm("auto")
    want = "nccl" if want_off else "onesided"
    resolved = a.backend
    assert resolved == want, f"auto resolved {resolved}, want {want} ({off or 'nothing'} off)"
    check_ops(a)
    a.close()
    try:
        o = comm("onesided")
    except RuntimeError as e:
        assert want_off, f"onesided failed with symmetric memory on: {e}"
        cause = f"{off}=0" if off else "without a symmetric window"
        assert cause in str(e), f"the error does not say {cause!r}: {e}"
        assert "dpsUnavailable" in str(e), str(e)
    else:
        assert not want_off, f"onesided was created with symmetric memory off ({off or 'NCCL'})"
        assert o.backend == "onesided"
        check_ops(o)
        o.close()
    n = comm("nccl")
    check_ops(n)
    n.close()
    # the context is alive
    t = torch.ones(4, device="cuda")
    assert t.sum().item() == 4.0
    torch.cuda.synchronize()
    print("OK", resolved)
    """
)


@pytest.mark.parametrize("off", ["", "NCCL_CUMEM_ENABLE", "NCCL_WIN_ENABLE"])
def test_symmetric_memory_on_or_off(off):
    env = dict(os.environ)
    for var in ("NCCL_CUMEM_ENABLE", "NCCL_WIN_ENABLE", "DPSAMPLING_BACKEND",
                "TOKENSPEED_DP_SAMPLING_BACKEND"):
        env.pop(var, None)
    if off:
        env[off] = "0"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, off], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().startswith("OK "), proc.stdout
    if off:
        assert proc.stdout.strip() == "OK nccl", proc.stdout
