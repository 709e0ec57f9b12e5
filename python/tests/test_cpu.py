"""Torch-free tests of the Python binding (CI: no GPU, usually no torch).

Everything here must pass without torch and without a GPU; tests that need
torch use pytest.importorskip("torch").
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import dpsampling
from dpsampling import (
    DpSamplingComm,
    _onesided_available,
    _resolve_backend,
    get_global_backend,
    onesided_available,
    resolve_backend,
    swap_batch_vocab,
)

ENV = "DPSAMPLING_BACKEND"
ALIAS = "TOKENSPEED_DP_SAMPLING_BACKEND"

pytestmark = pytest.mark.usefixtures("clean_backend_env")


def _has_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _run_python(code):
    env = dict(os.environ)
    env.pop(ENV, None)
    env.pop(ALIAS, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


# ---- import ------------------------------------------------------------------


def test_import_exports():
    for name in (
        "DpSamplingComm",
        "swap_batch_vocab",
        "get_global_backend",
        "resolve_backend",
        "onesided_available",
        "is_available",
        "try_create_dist_argmax_state",
        "supports_dist_argmax_shape",
        "DistArgmaxState",
        "_resolve_backend",
        "_onesided_available",
    ):
        assert hasattr(dpsampling, name), name
    assert _resolve_backend is resolve_backend
    assert _onesided_available is onesided_available


def test_versions_agree():
    """The version is written in one file, VERSION. CMakeLists.txt reads it
    (project(), hence the generated header's DPS_VERSION_* and the build
    info), pyproject.toml reads it (scikit-build-core's regex provider), and
    __init__.py computes __version__ from the header the extension was built
    with: the file, the header, the loaded library and the package agree, and
    no other file writes a version by hand."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "VERSION")) as f:
        text = f.read()
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\n?", text)
    assert m, "VERSION must hold MAJOR.MINOR.PATCH, got %r" % text
    version = text.strip()
    code = int(m.group(1)) * 10000 + int(m.group(2)) * 100 + int(m.group(3))
    assert dpsampling.__version__ == version
    info = dpsampling.build_info()
    assert info["version"] == version
    assert info["library_version"] == code  # dpsGetVersion of the loaded library
    assert dpsampling._dpsampling.HEADER_VERSION == code  # the header it was built with
    if dpsampling._build_info is not None:
        assert dpsampling._build_info.VERSION == version  # CMake's PROJECT_VERSION
    # the readers of VERSION, and no second hand-written copy
    with open(os.path.join(root, "pyproject.toml")) as f:
        pyproject = f.read()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert re.search(r'^input = "VERSION"', pyproject, re.M)
    assert not re.search(r"^version\s*=", pyproject, re.M)
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        cmake = f.read()
    assert "project(dpsampling VERSION ${DPS_VERSION_STRING}" in cmake
    with open(os.path.join(root, "include", "dpsampling.h")) as f:
        header = f.read()
    assert not re.search(r"#define DPS_VERSION_(MAJOR|MINOR|PATCH)\b", header)
    with open(os.path.join(root, "python", "dpsampling", "__init__.py")) as f:
        assert not re.search(r'^__version__ = "\d', f.read(), re.M)


def test_import_does_not_import_torch():
    r = _run_python(
        """
        import sys
        import dpsampling
        dpsampling.resolve_backend("nccl", (0, 1))
        dpsampling.get_global_backend()
        assert "torch" not in sys.modules, "import dpsampling imported torch"
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_global_backend_is_a_singleton_with_collectives():
    b = get_global_backend()
    assert b is get_global_backend()
    assert callable(b.all_gather_into_tensor)
    assert callable(b.all_to_all_single)


# ---- backend resolution and the environment ------------------------------------


@pytest.mark.parametrize("var", [ENV, ALIAS])
def test_env_override_forces_nccl(monkeypatch, var):
    monkeypatch.setenv(var, "nccl")
    assert resolve_backend("auto", (0, 1)) == "nccl"
    assert resolve_backend("onesided", (0, 1)) == "nccl"
    assert resolve_backend("nccl", (0, 1)) == "nccl"


@pytest.mark.parametrize("var", [ENV, ALIAS])
def test_env_override_rejects_invalid_backend(monkeypatch, var):
    monkeypatch.setenv(var, "bogus")
    with pytest.raises(ValueError, match=var):
        resolve_backend("auto", (0, 1))
    with pytest.raises(ValueError, match=var):
        _resolve_backend("nccl", (0, 1))


def test_env_both_set_disagreeing(monkeypatch):
    monkeypatch.setenv(ENV, "nccl")
    monkeypatch.setenv(ALIAS, "onesided")
    with pytest.raises(ValueError) as e:
        resolve_backend("auto", (0, 1))
    assert ENV in str(e.value) and ALIAS in str(e.value)


def test_env_both_set_agreeing(monkeypatch):
    monkeypatch.setenv(ENV, "nccl")
    monkeypatch.setenv(ALIAS, "nccl")
    assert resolve_backend("onesided", (0, 1)) == "nccl"


def test_env_empty_is_ignored(monkeypatch):
    monkeypatch.setenv(ENV, "")
    assert resolve_backend("nccl", (0, 1)) == "nccl"


def _peer_access_01():
    """Ground truth of onesided_available((0, 1)) on one node: devices 0 and 1
    exist and reach each other (torch's own peer-access query)."""
    if not _has_gpu():
        return False
    import torch

    return torch.cuda.device_count() >= 2 and all(
        torch.cuda.can_device_access_peer(a, b) for a, b in ((0, 1), (1, 0)))


def test_resolve_without_env_follows_availability():
    avail = _peer_access_01()
    assert onesided_available((0, 1)) is avail
    assert resolve_backend("nccl", (0, 1)) == "nccl"
    assert resolve_backend("auto", (0, 1)) == ("onesided" if avail else "nccl")
    if not avail:
        with pytest.raises(RuntimeError, match="DPSAMPLING_BACKEND=nccl"):
            resolve_backend("onesided", (0, 1))
    else:
        assert resolve_backend("onesided", (0, 1)) == "onesided"


def test_resolve_rejects_bad_request():
    with pytest.raises(ValueError, match="bogus"):
        resolve_backend("bogus", (0, 1))
    with pytest.raises(TypeError):
        resolve_backend(2, (0, 1))


def test_env_onesided_without_gpu_is_unavailable(monkeypatch):
    if onesided_available((0, 1)):
        pytest.skip("one-sided transport is available here")
    monkeypatch.setenv(ENV, "onesided")
    with pytest.raises(RuntimeError, match="nccl"):  # the message says how to fall back
        resolve_backend("auto", (0, 1))


# ---- is_available ------------------------------------------------------------------


@pytest.mark.parametrize("architectures, sm, runs", [
    ("80-real;90-real;100", 90, True),   # the default build on an H100 / H200
    ("80-real;90-real;100", 86, True),   # sm_80 machine code runs on sm_86
    ("80-real;90-real;100", 75, False),  # below every entry
    ("80-real;90-real;100", 103, True),  # compute_100 PTX (and sm_100 code, same major)
    ("80-real;90-real;100", 120, True),  # compute_100 PTX, compiled by the driver
    ("80-real;90-real", 100, False),     # machine code of other majors, no PTX
    ("90", 100, True),                   # "90" is sm_90 and compute_90
    ("90-real", 89, False),              # machine code never runs on a lower minor
    ("90-virtual", 90, True),
    ("90-virtual", 89, False),
    ("90a-real", 90, True),
    ("90a-real", 91, False),             # arch-specific: that sm alone
    ("90a", 100, False),                 # its PTX too
    ("100f-real", 103, True),            # family: the same major
    ("100f", 120, False),
    ("86", 80, False),
    ("80,90", 90, True),                 # a comma list
    ("native", 90, True),                # nothing to compare: assumed to run
    ("all-major", 70, True),
])
def test_arch_runs(architectures, sm, runs):
    assert dpsampling._arch_runs(architectures, sm // 10, sm % 10) is runs


def test_is_available_without_a_device():
    if _has_gpu():
        pytest.skip("a GPU is present (test_select asserts it there)")
    assert dpsampling.is_available() is False


# ---- onesided_available ----------------------------------------------------------


def test_onesided_available_false_without_gpu():
    if _has_gpu():
        pytest.skip("a GPU is present")
    assert onesided_available((0, 1)) is False
    assert onesided_available((0,)) is False
    assert onesided_available(None) is False


def test_onesided_available_never_raises():
    """Invalid groups and absent devices are never available, GPU or not."""
    for bad in ("garbage", (0, 0), (), (-1, 2), object(), (10**6, 10**6 + 1)):
        assert onesided_available(bad) is False, bad


def test_onesided_on_devices_without_gpu():
    if _has_gpu():
        pytest.skip("a GPU is present")
    # no device: not available, and no error (dpsOnesidedAvailableOnDevices writes 0)
    assert dpsampling._dpsampling.onesided_available_on_devices([0, 1]) is False


# ---- configuration validation (ValueError/TypeError before any torch/GPU use) ----

GOOD = dict(
    tp_size=2,
    rank=0,
    group=(0, 1),
    max_pad_bs=8,
    num_tokens_per_req=1,
    vocab_size=64,
    logits_dtype=None,
    backend="nccl",
)


def _kw(**over):
    kw = dict(GOOD)
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(tp_size=0), "tp_size"),
        (dict(rank=2), "rank"),
        (dict(rank=-1), "rank"),
        (dict(max_pad_bs=3), "max_pad_bs"),
        (dict(max_pad_bs=0), "max_pad_bs"),
        (dict(vocab_size=63), "vocab_size"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(num_tokens_per_req=0), "num_tokens_per_req"),
        (dict(backend="bogus"), "bogus"),
        (dict(group=(0, 1, 2)), "group"),
        (dict(group=(0, 0)), "group"),
        (dict(max_pad_bs=2**40), "max_pad_bs"),
        (dict(vocab_size=2**32), "vocab_size=4294967296"),
        (dict(timeout_ms=86400001), "timeout_ms=86400001"),
    ],
)
def test_config_errors_are_value_errors(over, match):
    with pytest.raises(ValueError, match=match):
        DpSamplingComm(**_kw(**over))


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(logits_dtype="int8"), "logits_dtype='int8'"),
        (dict(logits_dtype=object()), "logits_dtype=<object"),
        (dict(logits_dtype=3), "logits_dtype=3"),
        (dict(tp_size="2"), "tp_size must be an int, got str"),
        (dict(max_pad_bs=8.0), "max_pad_bs must be an int, got float"),
        (dict(backend=1), "backend must be 'auto', 'nccl' or 'onesided', got int"),
        (dict(fallback_comm_backend=object()), "fallback_comm_backend must have"),
    ],
)
def test_type_errors(over, match):
    with pytest.raises(TypeError, match=re.escape(match)):
        DpSamplingComm(**_kw(**over))


def test_env_invalid_rejected_at_construction(monkeypatch):
    monkeypatch.setenv(ALIAS, "bogus")
    with pytest.raises(ValueError, match=ALIAS):
        DpSamplingComm(**_kw())


def test_validation_does_not_touch_torch():
    r = _run_python(
        """
        import sys
        import pytest
        from dpsampling import DpSamplingComm, swap_batch_vocab
        good = dict(tp_size=2, rank=0, group=(0, 1), max_pad_bs=8,
                    num_tokens_per_req=1, vocab_size=64, backend="auto")
        for over in (dict(tp_size=0), dict(max_pad_bs=3), dict(vocab_size=63),
                     dict(num_tokens_per_req=0), dict(rank=5)):
            kw = dict(good); kw.update(over)
            with pytest.raises(ValueError):
                DpSamplingComm(**kw)
        with pytest.raises(TypeError):
            DpSamplingComm(**dict(good, logits_dtype="int64"))
        with pytest.raises(ValueError, match="pad_bs"):
            swap_batch_vocab(None, tp_size=2, pad_bs=3, num_tokens_per_req=1,
                             vocab_size=64, group=(0, 1))
        with pytest.raises(TypeError):
            swap_batch_vocab(object(), tp_size=2, pad_bs=8, num_tokens_per_req=1,
                             vocab_size=64, group=(0, 1))
        assert "torch" not in sys.modules, "validation imported torch"
        print("ok")
        """
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout


def test_dtype_names():
    C = dpsampling._dpsampling
    assert C.dtype_code(None) == C.DTYPE_UNSET
    assert C.dtype_code("fp32") == C.FLOAT32
    assert C.dtype_code("torch.bfloat16") == C.BFLOAT16
    assert C.dtype_code("float16") == C.FLOAT16
    with pytest.raises(TypeError):
        C.dtype_code(None, "dtype", False)


def test_config_check_direct():
    C = dpsampling._dpsampling
    C.config_check(2, 1, 8, 4, 64, C.DTYPE_UNSET, C.BACKEND_AUTO)
    with pytest.raises(ValueError, match="vocab_size=63"):
        C.config_check(2, 1, 8, 4, 63, C.DTYPE_UNSET, C.BACKEND_AUTO)


def test_config_limits_at_and_past():
    """vocab_size below 2^32 and timeout_ms up to one day (86400000 ms, the
    bound of DPSAMPLING_TIMEOUT_MS too): the limit passes, one past fails
    naming the argument and its value."""
    C = dpsampling._dpsampling
    C.config_check(2, 1, 8, 4, 2**32 - 2, C.DTYPE_UNSET, C.BACKEND_AUTO)  # largest even
    with pytest.raises(ValueError, match="vocab_size=4294967296"):
        C.config_check(2, 1, 8, 4, 2**32, C.DTYPE_UNSET, C.BACKEND_AUTO)
    C.config_check(2, 1, 8, 4, 64, C.DTYPE_UNSET, C.BACKEND_AUTO, 86400000)
    with pytest.raises(ValueError, match="timeout_ms=86400001"):
        C.config_check(2, 1, 8, 4, 64, C.DTYPE_UNSET, C.BACKEND_AUTO, 86400001)


# ---- with torch (still no GPU needed) ---------------------------------------------


def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    C = dpsampling._dpsampling
    assert C.dtype_code(torch.float32) == C.FLOAT32
    assert C.dtype_code(torch.bfloat16) == C.BFLOAT16
    assert C.dtype_code(torch.float16) == C.FLOAT16
    for bad in (torch.int32, torch.float64, torch.uint8):
        with pytest.raises(TypeError):
            C.dtype_code(bad)
        with pytest.raises(TypeError):
            DpSamplingComm(**_kw(logits_dtype=bad))


def test_no_gpu_construction_is_runtime_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        DpSamplingComm(**_kw(tp_size=1, rank=0, group=(0,), max_pad_bs=8, vocab_size=64))


def test_free_function_rejects_integer_logits():
    torch = pytest.importorskip("torch")
    x = torch.zeros(8, 32, dtype=torch.int32)
    with pytest.raises(TypeError, match="local_logits.dtype"):
        swap_batch_vocab(x, tp_size=2, pad_bs=8, num_tokens_per_req=1, vocab_size=64, group=(0, 1))


# ---- the hand-written DLPack ABI, checked with any CPU consumer ---------------------


class _CapsuleHolder:
    def __init__(self, cap):
        self._cap = cap

    def __dlpack__(self, *args, **kwargs):
        return self._cap

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def _deleted():
    return dpsampling._dpsampling._test_host_deleted()


def test_dlpack_abi_with_numpy():
    np = pytest.importorskip("numpy")
    C = dpsampling._dpsampling
    before = _deleted()
    a = np.from_dlpack(_CapsuleHolder(C._test_host_capsule(3, 5)))
    assert a.shape == (3, 5) and a.dtype == np.float32
    assert a.strides == (20, 4)
    assert a[2, 4] == 14.0 and a.sum() == sum(range(15))
    b = np.from_dlpack(_CapsuleHolder(C._test_host_capsule(7, 0)))
    assert b.shape == (7,) and b.dtype == np.int32 and list(b) == list(range(7))
    del a, b
    import gc

    gc.collect()
    assert _deleted() == before + 2


def test_dlpack_unconsumed_capsule_is_freed():
    C = dpsampling._dpsampling
    before = _deleted()
    cap = C._test_host_capsule(2, 2)
    del cap
    assert _deleted() == before + 1


def test_dlpack_abi_with_torch():
    torch = pytest.importorskip("torch")
    C = dpsampling._dpsampling
    before = _deleted()
    t = torch.from_dlpack(C._test_host_capsule(4, 6))
    assert t.shape == (4, 6) and t.dtype == torch.float32 and t.stride() == (6, 1)
    assert t[3, 5].item() == 23.0
    u = torch.utils.dlpack.from_dlpack(C._test_host_capsule(5, 0))
    assert u.dtype == torch.int32 and u.tolist() == list(range(5))
    del t, u
    assert _deleted() == before + 2


def test_onesided_available_on_devices_rejects_bad_ordinals():
    from dpsampling import _dpsampling as C

    for bad in ([-1], [2**32], [0, 2**40]):
        with pytest.raises(ValueError, match="is not a device ordinal"):
            C.onesided_available_on_devices(bad)


# ---- GIL released around library calls: per-thread errors, closed objects ------------


def test_error_message_after_gil_release_is_this_threads():
    """onesided_available_on_devices runs the library without the GIL; its
    argument error must still come back with its own message (dpsGetLastError
    is per thread, read after the GIL is back) while other threads fail
    different calls at the same time."""
    import threading

    C = dpsampling._dpsampling
    n_threads, rounds = 8, 200
    barrier = threading.Barrier(n_threads)
    failures = []

    def worker(i):
        barrier.wait()
        for _ in range(rounds):
            try:
                if i % 2 == 0:
                    with pytest.raises(ValueError) as e:
                        C.onesided_available_on_devices([])  # count=0, GIL released
                    msg = str(e.value)
                    assert "dpsOnesidedAvailableOnDevices" in msg and "count=0" in msg, msg
                    assert "[dpsInvalidArgument]" in msg, msg
                else:
                    vocab = 63 + 2 * i  # odd: not a multiple of tp_size=2
                    with pytest.raises(ValueError) as e:
                        C.config_check(2, 0, 8, 1, vocab, C.DTYPE_UNSET, C.BACKEND_AUTO)
                    assert f"vocab_size={vocab}" in str(e.value), str(e.value)
            except BaseException as exc:  # collected: pytest.raises/asserts in threads
                failures.append(f"thread {i}: {exc!r}")
                return

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not failures, failures[:5]


def test_uncreated_comm_is_closed_everywhere():
    """A Comm that was never created (or was closed) refuses every operation
    with RuntimeError and closes idempotently; nothing needs a GPU."""
    C = dpsampling._dpsampling
    c = C.Comm()
    assert c.closed is True
    assert c.is_initialized is False
    for call in (
        lambda: c.swap_batch_vocab(None),
        lambda: c._swap_batch_vocab_new(None, 8),
        lambda: c.gather_verify_outputs(None, None, None),
        lambda: c.gather_verify_logprobs(None),
        lambda: c.prepare_verify_outputs("fp32"),
        lambda: c._set_collectives(None, (0,)),
        lambda: c.async_error(),
        lambda: c.backend,
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    c.close()
    c.close()
    assert c.closed is True
    with pytest.raises(RuntimeError, match="NcclGroup is not initialized"):
        c._create(C.NcclGroup.__new__(C.NcclGroup), 1, 0, 8, 1, 64, C.DTYPE_UNSET,
                  C.BACKEND_NCCL, 0)
    assert c.closed is True
    del c


# ---- signatures, stub and messages (issue 16) ---------------------------------------


def test_required_arguments_in_signature():
    import inspect

    sig = inspect.signature(DpSamplingComm)
    for name in ("max_pad_bs", "vocab_size"):
        p = sig.parameters[name]
        assert p.default is inspect.Parameter.empty, name
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
    assert sig.parameters["timeout_ms"].default is None
    with pytest.raises(TypeError, match="max_pad_bs"):
        DpSamplingComm(tp_size=2, rank=0, group=(0, 1), vocab_size=64)


def test_c_method_signatures():
    import inspect

    assert str(inspect.signature(DpSamplingComm.swap_batch_vocab)) == "(self, /, local_logits, pad_bs=None)"
    assert str(inspect.signature(DpSamplingComm.gather_verify_outputs)) == (
        "(self, /, predict_local, accept_index_local, accept_length_local, pad_bs=None)")
    assert str(inspect.signature(DpSamplingComm.prepare_verify_outputs)) == "(self, /, logits_dtype)"
    sig = inspect.signature(DpSamplingComm)
    assert sig.parameters["device"].default is None
    assert sig.parameters["device"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(dpsampling.swap_batch_vocab).parameters["backend"].default is None
    assert "timeout_ms" in str(inspect.signature(dpsampling._dpsampling.config_check))


def test_stub_and_py_typed_installed():
    d = os.path.dirname(dpsampling.__file__)
    assert os.path.exists(os.path.join(d, "py.typed"))
    assert os.path.exists(os.path.join(d, "__init__.pyi"))


def test_timeout_ms_checked():
    with pytest.raises(ValueError, match="timeout_ms"):
        DpSamplingComm(**_kw(timeout_ms=-1))
    with pytest.raises(TypeError, match="timeout_ms"):
        DpSamplingComm(**_kw(timeout_ms="5"))


def test_dtype_message_lists_names():
    with pytest.raises(TypeError) as e:
        DpSamplingComm(**_kw(logits_dtype="int8"))
    for name in ("torch.bfloat16", "'bf16'", "'fp32'", "'half'"):
        assert name in str(e.value), name


def test_missing_torch_says_what_to_install():
    r = _run_python(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        from dpsampling import DpSamplingComm
        try:
            DpSamplingComm(tp_size=1, rank=0, group=(0,), max_pad_bs=8, vocab_size=64)
        except ModuleNotFoundError as e:
            print("MSG", e)
        """
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pip install 'dpsampling[torch]'" in r.stdout, r.stdout


@pytest.mark.parametrize("k", [-1, 0, -64])
def test_topk_refuses_k_below_one(k):
    # before any tensor or device work: a k < 0 must not reach the binding's
    # argmax path (its _select takes k < 0 for argmax)
    c = dpsampling.DpSamplingComm.__new__(dpsampling.DpSamplingComm)
    with pytest.raises(ValueError, match=rf"k={k} must be >= 1"):
        c.topk(object(), k)


class _FakeComm:
    """What _install_fallback needs of a communicator: _set_collectives,
    answering as the binding does (None: installed; a str: the backend
    uses no collectives, nothing installed)."""

    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def _set_collectives(self, backend, group):
        self.calls.append((backend, group))
        return self.answer


class _Gather:
    def all_gather_into_tensor(self, output, input, group=None):
        raise AssertionError("never called here")


def test_fallback_refused_by_a_backend_without_collectives_warns():
    """fallback_comm_backend on a communicator whose backend uses no
    collectives (onesided) is not silently ignored: a RuntimeWarning names
    the backend and the attribute becomes None."""
    from dpsampling import _install_fallback

    msg = ("dpsCommSetCollectives: the communicator runs the onesided backend, which uses no "
           "collectives")
    comm = _FakeComm(msg)
    fb = _Gather()
    with pytest.warns(RuntimeWarning, match="fallback_comm_backend is not used: .*onesided"):
        kept = _install_fallback(comm, fb, (0, 1))
    assert kept is None
    assert comm.calls == [(fb, (0, 1))]


@pytest.mark.parametrize("backend", [object(), _Gather()])
def test_free_swap_backend_needs_both_collectives(backend):
    """swap_batch_vocab(backend=...) takes a collectives object, as the
    upstream function does; one without all_to_all_single and
    all_gather_into_tensor is a TypeError naming it, before any GPU use."""
    import types

    x = types.SimpleNamespace(dtype="bf16")
    with pytest.raises(TypeError, match=r"backend must have all_to_all_single\(output, input, "
                                        r"group\) and all_gather_into_tensor"):
        dpsampling.swap_batch_vocab(x, tp_size=1, pad_bs=8, num_tokens_per_req=1,
                                    vocab_size=64, group=(0,), backend=backend)


def test_dist_argmax_checks_before_any_communicator():
    """create_dist_argmax_state refuses a dtype the library has no kernels
    for at creation (it was taken, then refused at every call); the first
    call refuses what is not a 2-D tensor of the state's dtype before it
    creates a communicator from the shape."""
    import types

    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="dtype='int8' is not a supported logits dtype"):
        dpsampling.DistArgmaxState((0,), 0, 8, "int8")
    st = dpsampling.DistArgmaxState((0,), 0, 8, "bf16")
    assert dpsampling.SHARD_MAX_RANKS == 8
    with pytest.raises(TypeError, match="logits must be a torch.Tensor, got list"):
        dpsampling.distributed_argmax(st, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"logits must be 2-D \[M, V/tp\], got shape \(16,\)"):
        dpsampling.distributed_argmax(st, np.zeros(16))
    with pytest.raises(TypeError, match="logits.dtype="):
        dpsampling.distributed_argmax(st, np.zeros((2, 16), dtype=np.float32))
    host = types.SimpleNamespace(ndim=2, shape=(2, 16), dtype="bf16",
                                 device=types.SimpleNamespace(type="cpu"))
    with pytest.raises(ValueError, match="logits must be on a CUDA device"):
        dpsampling.distributed_argmax(st, host)
    assert st.comm is None


@pytest.mark.parametrize("vocab_per_rank, dtype, world_size, fits", [
    (4096, "bf16", 2, True),
    (19008, "fp16", 8, True),     # 152064 over 8 ranks
    (1, "fp32", 1, True),         # any width: no alignment or minimum here
    (1000, "bf16", 3, True),
    (1431655765, "bf16", 3, True),  # 2^32 - 1 columns in all: the largest vocabulary
    (2**31, "bf16", 2, False),    # 2^32 columns
    (0, "bf16", 2, False),
    (4096, "int8", 2, False),     # no kernels for it
    (4096, "bf16", 9, False),     # above SHARD_MAX_RANKS
    (4096, "bf16", 0, False),
    (4096.0, "bf16", 2, False),   # not an int
])
def test_supports_dist_argmax_shape(vocab_per_rank, dtype, world_size, fits):
    assert dpsampling.supports_dist_argmax_shape(vocab_per_rank, dtype, world_size) is fits


def test_try_create_dist_argmax_state_is_create():
    """Ours needs no NVLink multicast, so the newer upstream's
    try_create_dist_argmax_state always gives a state (no communicator
    yet), and bad arguments raise as create_dist_argmax_state's do."""
    st = dpsampling.try_create_dist_argmax_state((0,), 0, 8, "bf16", None, True)
    assert isinstance(st, dpsampling.DistArgmaxState) and st.comm is None
    assert st.max_M == 8 and st.group == (0,)
    with pytest.raises(ValueError, match="max_M=0 must be >= 1"):
        dpsampling.try_create_dist_argmax_state((0,), 0, 0, "bf16")


def test_messages_name_the_value():
    """A refused argument's message names its value, not only its type;
    numpy's ints count as ints everywhere, a group of one included."""
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="max_pad_bs must be an int, got float 8.0"):
        dpsampling._int_arg("max_pad_bs", 8.0)
    with pytest.raises(TypeError, match=r"got list \[True\] \(group rank must be an int, got "
                                        r"bool True\)"):
        dpsampling._normalize_group([True])
    assert dpsampling._normalize_group(np.int64(3)) == (3,)
    assert dpsampling._normalize_group([np.int32(0), 1]) == (0, 1)
    with pytest.raises(ValueError, match="softcap=.* must be None or 0 \\(off\\), or a positive"):
        dpsampling._softcap_arg(10**400)  # was OverflowError
    with pytest.raises(TypeError, match=r"temperature must be a real number .* got complex 1j"):
        dpsampling._float_param("temperature", 1j, None)


def test_free_swap_checks_the_tensor_before_any_communicator():
    """The free swap refuses a tensor of the wrong shape or off the GPU
    with ValueError naming it, before a communicator is made or replaced
    (the cache stays as it was)."""
    import types

    before = dict(dpsampling._free_comms)

    def x(shape, kind="cuda"):
        return types.SimpleNamespace(dtype="bf16", shape=shape,
                                     device=types.SimpleNamespace(type=kind, index=0))

    args = dict(tp_size=2, pad_bs=4, num_tokens_per_req=2, vocab_size=64, group=(0, 1))
    with pytest.raises(ValueError, match=r"local_logits shape \(8, 16\) != expected "
                                         r"\[pad_bs\*N, V/tp\] = \[8, 32\]"):
        swap_batch_vocab(x((8, 16)), **args)
    with pytest.raises(ValueError, match=r"shape \(4, 32\) != expected"):
        swap_batch_vocab(x((4, 32)), **args)  # pad_bs rows, not pad_bs*N
    with pytest.raises(ValueError, match="must be on a CUDA device, got"):
        swap_batch_vocab(x((8, 32), "cpu"), **args)
    with pytest.raises(ValueError, match="vocab_size=65 must be divisible by tp_size=2"):
        swap_batch_vocab(x((8, 32)), **dict(args, vocab_size=65))
    assert dpsampling._free_comms == before


def test_fallback_installed_without_warning(recwarn):
    from dpsampling import _install_fallback

    comm = _FakeComm(None)
    fb = _Gather()
    assert _install_fallback(comm, fb, (0, 1)) is fb
    assert comm.calls == [(fb, (0, 1))]
    # None and the library's defaults are never installed (nothing to warn about)
    assert _install_fallback(comm, None, (0, 1)) is None
    assert _install_fallback(comm, get_global_backend(), (0, 1)) is get_global_backend()
    assert len(comm.calls) == 1
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# ---- argmax, topk, sample, verify_chain: C methods (issue 25, host time) ----------


def test_shard_methods_are_the_extensions():
    """The four methods are the extension's (no Python frame per eager call),
    with the signatures the Python methods had."""
    import inspect

    C = dpsampling._dpsampling
    want = {
        "argmax": "(self, /, local_logits, vocab_limit=None, return_logsumexp=False, *, "
                  "out_value=None, out_index=None, out_lse=None)",
        "topk": "(self, /, local_logits, k, vocab_limit=None, *, out_values=None, "
                "out_indices=None)",
        "sample": "(self, /, local_logits, *, temperature, seed, offset, top_k=None, top_p=None, "
                  "min_p=None, vocab_limit=None, return_logprobs=False, out=None, "
                  "out_logprobs=None)",
        "verify_chain": "(self, /, local_logits, candidates, *, pad_bs, temperature, seed, "
                        "offset, top_k=None, top_p=None, min_p=None, vocab_limit=None, "
                        "vocab_mask=None, softcap=None, return_logprobs=False)",
    }
    for name, sig in want.items():
        assert getattr(DpSamplingComm, name) is getattr(C.Comm, name), name
        assert str(inspect.signature(getattr(DpSamplingComm, name))) == sig, name
        assert getattr(DpSamplingComm, name).__doc__, name


class _Duck:
    """Not a torch tensor, but it has dim(): the package lets it through to
    the binding (which then reads its attributes)."""

    def dim(self):
        return 2


def test_shard_methods_check_arguments_before_the_state():
    """As before: the arguments' errors first (naming them), then the
    communicator's state (an uncreated one: 'closed')."""
    c = DpSamplingComm.__new__(DpSamplingComm)
    x = _Duck()
    with pytest.raises(TypeError, match="temperature must be a real number"):
        c.sample(x, temperature=None, seed=0, offset=0)
    with pytest.raises(ValueError, match=r"seed=18446744073709551616 is out of range"):
        c.sample(x, temperature=0.5, seed=2**64, offset=0)
    with pytest.raises(TypeError, match="local_logits must be a torch.Tensor, got object"):
        c.sample(object(), temperature=0.5, seed=0, offset=0)
    with pytest.raises(ValueError, match="out_logprobs is given but return_logprobs=False"):
        c.sample(x, temperature=0.5, seed=0, offset=0, out_logprobs=x)
    with pytest.raises(TypeError, match="positional"):
        c.sample(x, 0.5, 0, 0)
    with pytest.raises(TypeError, match="missing required argument 'temperature'"):
        c.sample(x, seed=0, offset=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'temp'"):
        c.sample(x, temp=0.5, seed=0, offset=0)
    with pytest.raises(ValueError, match=r"vocab_limit=0 must be in \[1, vocab_size\]"):
        c.argmax(x, 0)
    with pytest.raises(TypeError, match="vocab_limit must be an int"):
        c.topk(x, 4, "all")
    # bool is an int to Python; as a count or a limit it is a mistake
    with pytest.raises(TypeError, match="k must be an int, got bool"):
        c.topk(x, True)
    with pytest.raises(TypeError, match="vocab_limit must be an int, got bool"):
        c.argmax(x, True)
    with pytest.raises(TypeError, match="pad_bs must be an int, got bool"):
        c.verify_chain(x, x, pad_bs=True, temperature=0.0, seed=0, offset=0)
    with pytest.raises(ValueError, match="k=2147483648 is out of range"):
        c.topk(x, 2**31)
    with pytest.raises(ValueError, match=r"k=-\d+ must be >= 1"):
        c.topk(x, -(2**70))
    with pytest.raises(TypeError, match="pad_bs must be an int"):
        c.verify_chain(x, x, pad_bs="8", temperature=0.0, seed=0, offset=0)
    with pytest.raises(ValueError, match="softcap=-1 must be None or 0"):
        c.verify_chain(x, x, pad_bs=8, temperature=0.0, seed=0, offset=0, softcap=-1)
    for call in (
        lambda: c.argmax(x),
        lambda: c.argmax(x, 5, True),
        lambda: c.topk(x, 4),
        lambda: c.topk(x, 3, vocab_limit=7),
        lambda: c.sample(x, temperature=0.7, seed=-1, offset=2**63, top_k=50, top_p=0.9),
        lambda: c.verify_chain(x, x, pad_bs=8, temperature=0.0, seed=1, offset=2, softcap=30.0),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def _outcome(fn, **kw):
    try:
        return ("ok", fn(**kw))
    except Exception as e:  # noqa: BLE001 - the type and message are compared
        return (type(e), str(e))


def _same(a, b):
    if a[0] != "ok" or b[0] != "ok":
        return a == b
    if len(a[1]) != len(b[1]):
        return False
    for x, y in zip(a[1], b[1]):
        if isinstance(x, float) or isinstance(y, float):
            if not (float(x) == float(y) or (x != x and y != y)):
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


_BIG = 2**2000
_FLOATS = [0.7, 0, 1, -1.5, float("nan"), float("inf"), _BIG, True, "x", None,
           # the ends of the ranges, and values that fp32 would take out of them
           1e-50, 2.0**-149, 1 - 2.0**-24, 1 - 1e-8, 1 + 1e-8, 3.4028234663852886e38, 1e39]
_INTS = [0, 1, 50, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, True, 1.5,
         None, "x"]
_LIMITS = [None, 1, 7, 0, -5, 2**63 - 1, 2**63, True, "x", 2.0]


def _sample_cases():
    base = dict(temperature=0.7, seed=1, offset=2)
    cases = [dict(base)]
    for v in _FLOATS:
        cases += [dict(base, temperature=v), dict(base, top_p=v), dict(base, min_p=v)]
    for v in _INTS:
        cases += [dict(base, top_k=v), dict(base, seed=v), dict(base, offset=v)]
    for v in _LIMITS:
        cases.append(dict(base, vocab_limit=v))
    for rl, ol in ((False, None), (True, None), (False, 1), (True, 1), (0, 1), (1, None)):
        cases.append(dict(base, return_logprobs=rl, out_logprobs=ol))
    cases.append(dict(base, temperature=None, seed=2**64))  # the first bad one is named
    cases.append(dict(base, seed="x", vocab_limit=0))
    return cases


def test_sample_arguments_as_the_package_normalizes_them():
    """The extension's sample() takes the common types itself and hands the
    rest to dpsampling._sample_args: for every kind of value, what reaches
    the library (or the error raised) is what the package's normalization
    gives."""
    C = dpsampling._dpsampling
    x = _Duck()
    for kw in _sample_cases():
        py = dict(top_k=None, top_p=None, min_p=None, vocab_limit=None, return_logprobs=False,
                  out_logprobs=None)
        py.update(kw)
        want = _outcome(dpsampling._sample_args, local_logits=x, **py)
        got = _outcome(C._test_sample_args, local_logits=x, **kw)
        assert _same(got, want), (kw, got, want)


def test_verify_arguments_as_the_package_normalizes_them():
    C = dpsampling._dpsampling
    x = _Duck()
    base = dict(pad_bs=8, temperature=0.0, seed=1, offset=2)
    cases = [dict(base)]
    for v in (8, -5, 2**31 - 1, 2**31, -(2**31), "8", True, 8.0):
        cases.append(dict(base, pad_bs=v))
    for v in (None, 0, 0.0, 30.0, -1, True, float("inf"), 1e-50, "x"):
        cases.append(dict(base, softcap=v))
    for kw in _sample_cases():
        kw = dict(kw)
        kw.pop("out_logprobs", None)
        cases.append(dict(base, **kw))
    for kw in cases:
        py = dict(top_k=None, top_p=None, min_p=None, vocab_limit=None, softcap=None,
                  return_logprobs=False)
        py.update(kw)
        want = _outcome(dpsampling._verify_args, local_logits=x, **py)
        got = _outcome(C._test_verify_args, local_logits=x, candidates=x, **kw)
        assert _same(got, want), (kw, got, want)
