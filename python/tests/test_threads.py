"""One process driving both GPUs with one thread per rank (threads_check.py):
no library call that may block (lazy first swap = collective prepare, destroy)
holds the GIL, and the busy guard refuses re-entrant and cross-thread use of a
communicator while a call is in progress. A hang is a failure."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("backend,extra", [("nccl", []), ("onesided", ["--no-busy"])])
def test_one_thread_per_rank(backend, extra):
    cmd = [sys.executable, os.path.join(HERE, "threads_check.py"), backend, *extra]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"threads_check.py {backend} hung: {e.stdout!r}")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert f"RESULT {backend} joined errors=0 bad=0" in p.stdout, p.stdout[-4000:]
