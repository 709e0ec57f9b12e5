"""pytest configuration for the Python binding's tests.

test_spec.py is the upstream spec (it imports torch at module level and needs
2 GPUs); without torch it cannot even be collected, so skip collecting it.
Fixtures shared by the test modules (none imports torch unless used).
"""

import importlib.util

import pytest

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore.append("test_spec.py")


@pytest.fixture
def clean_backend_env(monkeypatch):
    """Neither backend override variable set."""
    monkeypatch.delenv("DPSAMPLING_BACKEND", raising=False)
    monkeypatch.delenv("TOKENSPEED_DP_SAMPLING_BACKEND", raising=False)


def _world_of_one(backend):
    """A real torch.distributed world of this one process (a ProcessGroup)."""
    import torch.distributed as dist

    dist.init_process_group(backend, world_size=1, rank=0, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def gloo_world1():
    yield from _world_of_one("gloo")


@pytest.fixture
def nccl_world1():
    yield from _world_of_one("nccl")
