"""The spec's scenarios at tp=4 and tp=8 (the spec file itself stays as
upstream wrote it, tp=2 only). Each case skips itself, saying why, when the
machine has fewer GPUs than the world size; the one-sided cases also skip
when the transport is unavailable on the group."""

import pytest

torch = pytest.importorskip("torch")

from test_spec import (  # noqa: E402  (the spec's own workers and runner)
    _onesided_available_for_test,
    _run,
    _test_gather_persistent_buffer_reuse,
    _test_gather_verify_logprobs_correctness,
    _test_gather_verify_outputs_correctness,
    _test_nccl_single_allgather,
    _test_onesided_gather_lazy_init_without_swap,
    _test_onesided_matches_nccl,
    _test_onesided_prepare_after_swap_keeps_comm_dtype,
    _test_swap_and_gather_cuda_graph_replay,
    _test_swap_parity_with_free_function,
)

WORLD_SIZES = [pytest.param(4, id="tp4"), pytest.param(8, id="tp8")]
BACKENDS = ["nccl", "onesided"]


def _skip_unless_onesided(world_size, backend="onesided"):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < world_size:
        pytest.skip(f"needs {world_size} GPUs, have {have}")
    if backend == "onesided" and not _onesided_available_for_test(tuple(range(world_size))):
        pytest.skip("one-sided dp-sampling backend is not available")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_rank,n", [(1, 1), (2, 4)], ids=["decode", "verify"])
def test_swap_parity(world_size, backend, dtype, per_rank, n):
    _skip_unless_onesided(world_size, backend)
    _run(world_size, _test_swap_parity_with_free_function, pad_bs=per_rank * world_size, n=n,
         vocab=16 * world_size, dtype=dtype, backend=backend)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 4])
def test_gather_verify_outputs(world_size, backend, n):
    _skip_unless_onesided(world_size, backend)
    _run(world_size, _test_gather_verify_outputs_correctness, pad_bs=2 * world_size, n=n,
         backend=backend)
    _run(world_size, _test_gather_persistent_buffer_reuse, pad_bs=world_size, n=n,
         backend=backend)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_logprobs_and_single_allgather(world_size):
    _run(world_size, _test_gather_verify_logprobs_correctness, pad_bs=2 * world_size, n=4)
    _run(world_size, _test_nccl_single_allgather, pad_bs=2 * world_size, n=4)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay(world_size, backend):
    _skip_unless_onesided(world_size, backend)
    _run(world_size, _test_swap_and_gather_cuda_graph_replay, pad_bs=world_size, n=2,
         vocab=8 * world_size, backend=backend)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_onesided_lazy_and_dtype_lock(world_size):
    _skip_unless_onesided(world_size)
    _run(world_size, _test_onesided_matches_nccl, pad_bs=2 * world_size, n=4,
         vocab=8 * world_size, dtype=torch.bfloat16)
    _run(world_size, _test_onesided_gather_lazy_init_without_swap, pad_bs=2 * world_size, n=4,
         dtype=torch.bfloat16)
    _run(world_size, _test_onesided_prepare_after_swap_keeps_comm_dtype, pad_bs=2 * world_size,
         n=4, vocab=8 * world_size, dtype=torch.float16)
