"""dpsampling: batch-data-parallel sampling communication for tensor-parallel
LLM inference (Python binding of libdpsampling).

    comm = DpSamplingComm(tp_size=2, rank=r, group=(0, 1), max_pad_bs=64,
                          num_tokens_per_req=4, vocab_size=V,
                          logits_dtype=torch.bfloat16, backend="auto")
    rows = comm.swap_batch_vocab(local_logits, pad_bs=pad_bs)   # [pad_bs/tp*N, V]
    p, ai, al = comm.gather_verify_outputs(p_l, ai_l, al_l, pad_bs=pad_bs)

Everything that moves data runs in C on torch's current CUDA stream (CUDA graph
capturable); outputs are torch tensors aliasing the communicator's persistent
buffers (same data_ptr() on every call). This module only handles arguments
and the bootstrap over torch.distributed. ``import dpsampling`` needs neither
torch nor a GPU; torch is imported on first use.
"""

import numbers
import os
import sys
import threading
import warnings


def _import_extension():
    """The C extension. Its RUNPATH finds libnccl.so.2 and libcudart.so.13 of
    the nvidia-nccl-cu13 and nvidia-cuda-runtime wheels next to this package;
    when the package lives elsewhere (pip install --target, a build tree),
    load those wheels' libraries first, as torch does."""
    try:
        from . import _dpsampling
    except ImportError as e:
        if "libnccl" not in str(e) and "libcudart" not in str(e):
            raise
        import ctypes
        import importlib

        for mod, lib in (("nvidia.nccl", "libnccl.so.2"), ("nvidia.cu13", "libcudart.so.13")):
            try:
                m = importlib.import_module(mod)
                base = os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0]
                ctypes.CDLL(os.path.join(base, "lib", lib), mode=ctypes.RTLD_GLOBAL)
            except (ImportError, OSError):
                pass  # not installed: the retry below says what is missing
        try:
            from . import _dpsampling
        except ImportError as e2:
            raise ImportError(
                f"dpsampling cannot load its libraries ({e2}); install the wheels they come "
                "from: pip install 'nvidia-nccl-cu13>=2.28.9,<2.29' "
                "'nvidia-cuda-runtime>=13.0,<14' (torch's CUDA 13 builds depend on both)"
            ) from e
    return _dpsampling


_C = _import_extension()

try:  # generated at build time
    from . import _build_info as _build_info
except ImportError:  # pragma: no cover
    _build_info = None

# The version of the header the extension was built with (DPS_VERSION_CODE,
# generated from the file VERSION, the one place the version is written).
__version__ = "%d.%d.%d" % (
    _C.HEADER_VERSION // 10000,
    _C.HEADER_VERSION // 100 % 100,
    _C.HEADER_VERSION % 100,
)

__all__ = [
    "DpSamplingComm",
    "swap_batch_vocab",
    "get_global_backend",
    "resolve_backend",
    "onesided_available",
    "destroy_group_communicators",
    "release_pending",
    "create_dist_argmax_state",
    "try_create_dist_argmax_state",
    "supports_dist_argmax_shape",
    "DistArgmaxState",
    "distributed_argmax",
    "is_available",
    "build_info",
]

BACKEND_ENV = "DPSAMPLING_BACKEND"
BACKEND_ENV_ALIAS = "TOKENSPEED_DP_SAMPLING_BACKEND"

# The most ranks of argmax, topk, sample and verify_chain (DPS_SHARD_MAX_RANKS).
SHARD_MAX_RANKS = _C.SHARD_MAX_RANKS

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_NON_GROUP_MEMBER = -100  # torch.distributed.GroupMember.NON_GROUP_MEMBER


def build_info():
    """Build and runtime facts (library/NCCL versions, NCCL library path)."""
    info = {
        "version": __version__,
        "library_version": _C.version(),
        "nccl_header_version": _C.NCCL_HEADER_VERSION,
    }
    if _build_info is not None:
        info.update(
            nccl_version=_build_info.NCCL_VERSION,
            nccl_library=_build_info.NCCL_LIBRARY,
            cuda_toolkit_version=_build_info.CUDA_TOOLKIT_VERSION,
            cuda_architectures=_build_info.CUDA_ARCHITECTURES,
        )
    try:
        info["nccl_runtime_version"] = _C.nccl_version()
    except Exception:  # pragma: no cover
        pass
    return info


# --------------------------------------------------------------------------
# argument handling (no torch, no GPU)


def _int_arg(name, value, hi=_INT32_MAX):
    if isinstance(value, bool):  # an int to Python, a flag to the caller: never a count
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    if not isinstance(value, int):
        try:
            import operator

            value = operator.index(value)
        except TypeError:
            raise TypeError(
                f"{name} must be an int, got {type(value).__name__} {value!r:.80}"
            ) from None
    if value < -hi - 1 or value > hi:
        raise ValueError(f"{name}={value} is out of range")
    return value


def _limit_arg(vocab_limit):
    """vocab_limit for _select: an int >= 1 (the library checks it against V),
    or None -> 0 (the whole vocabulary)."""
    if vocab_limit is None:
        return 0
    v = _int_arg("vocab_limit", vocab_limit, _INT64_MAX)
    if v < 1:
        raise ValueError(f"vocab_limit={v} must be in [1, vocab_size]")
    return v


_UINT64 = 2**64


def _tensor_or_raise(name, value, kind):
    """A sample() parameter that is not a number must be a tensor [rows]
    (dtype, shape and device are checked in C, which names them)."""
    if not hasattr(value, "data_ptr"):
        raise TypeError(f"{name} must be a number or a tensor [rows] of {kind}, got "
                        f"{type(value).__name__}")
    return value


_F32_MAX = 3.4028234663852886e38  # the greatest finite fp32
_F32_TINY = 2.0**-149  # the least positive fp32
_F32_BELOW_1 = 1.0 - 2.0**-24  # the greatest fp32 below 1


def _temperature_scalar(v):
    if not 0.0 <= v <= _F32_MAX:  # NaN fails too
        raise ValueError(f"temperature={v!r} must be finite, >= 0 and within fp32's range "
                         f"(<= {_F32_MAX!r})")
    return v  # below 2^-150 it rounds to 0 in fp32: the argmax, its limit


def _top_p_scalar(v):
    if not 0.0 < v <= 1.0:
        raise ValueError(f"top_p={v!r} must be in (0, 1]")
    return v if v >= _F32_TINY else _F32_TINY  # not 0 in fp32: the first token only


def _min_p_scalar(v):
    if not 0.0 <= v < 1.0:
        raise ValueError(f"min_p={v!r} must be in [0, 1)")
    return v if v <= _F32_BELOW_1 else _F32_BELOW_1  # not 1 in fp32


# each float parameter's range, checked on the value passed (a double), before
# the library rounds it to fp32
_FLOAT_SCALARS = {"temperature": _temperature_scalar, "top_p": _top_p_scalar,
                  "min_p": _min_p_scalar}


def _float_param(name, value, off):
    """A sample() parameter of float kind: None -> `off` (the filter off;
    refused where off is None: temperature), a real number -> float in the
    parameter's range (ValueError naming it otherwise), else a float32
    tensor [rows] (its entries are checked on the device)."""
    t = type(value)
    if t is not float:  # a float is the common case: this runs on every eager call
        if value is None and off is not None:
            return off
        if t is int or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
            try:
                value = float(value)
            except OverflowError:
                raise ValueError(f"{name}={value!r} is too large for a float") from None
        elif value is None or isinstance(value, (bool, numbers.Number)):
            raise TypeError(f"{name} must be a real number or a tensor [rows] of torch.float32, "
                            f"got {type(value).__name__} {value!r:.80}")
        else:
            return _tensor_or_raise(name, value, "torch.float32")
    return _FLOAT_SCALARS[name](value)


def _int_param(name, value, lo, hi, kind, wrap=False):
    """A sample() parameter of int kind: an integer in [lo, hi) (taken mod
    2^64 when wrap: seed, offset), else a tensor [rows] of `kind`."""
    if type(value) is int:  # the common case first: this runs on every eager call
        if not lo <= value < hi:
            raise ValueError(f"{name}={value} is out of range [{lo}, {hi})")
        return value % _UINT64 if wrap else value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
        if not lo <= value < hi:
            raise ValueError(f"{name}={value} is out of range [{lo}, {hi})")
        return value % _UINT64 if wrap else value
    if value is None or isinstance(value, (bool, numbers.Number)):
        raise TypeError(f"{name} must be an int or a tensor [rows] of {kind}, got "
                        f"{type(value).__name__} {value!r}")
    return _tensor_or_raise(name, value, kind)


def _sample_params(temperature, seed, offset, top_k, top_p, min_p):
    """sample() and verify_chain()'s parameters, each normalized by
    _float_param / _int_param (checked in this order: temperature, top_p,
    min_p, top_k, seed, offset), in the order _sample and _verify_chain take
    them: (temperature, top_k, top_p, min_p, seed, offset)."""
    temperature = _float_param("temperature", temperature, None)
    top_p = _float_param("top_p", top_p, 1.0)
    min_p = _float_param("min_p", min_p, 0.0)
    top_k = 0 if top_k is None else _int_param("top_k", top_k, -(2**63), 2**63,
                                               "torch.int32 or torch.int64")
    seed = _int_param("seed", seed, -(2**63), _UINT64, "torch.int64", wrap=True)
    offset = _int_param("offset", offset, -(2**63), _UINT64, "torch.int64", wrap=True)
    return temperature, top_k, top_p, min_p, seed, offset


def _softcap_arg(softcap):
    """verify_chain()'s softcap: None or 0 -> 0.0 (off), else a real number
    c > 0 that stays positive and finite in fp32 (the library computes
    c * tanhf(l / c) in fp32)."""
    if softcap is None:  # the common case first: this runs on every eager call
        return 0.0
    import math
    import struct

    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be None or a real number, got {type(softcap).__name__}")
    try:
        c = float(softcap)
    except OverflowError:  # an int beyond a double: not a finite fp32 either
        c = math.inf
    if c == 0:
        return 0.0
    try:  # what the library receives: c rounded to fp32
        c32 = struct.unpack("f", struct.pack("f", c))[0]
    except OverflowError:
        c32 = math.inf
    if not (c > 0 and 0 < c32 < math.inf):
        raise ValueError(f"softcap={softcap!r} must be None or 0 (off), or a positive finite "
                         "number (finite and nonzero in fp32)")
    return c


def _is_process_group(group):
    """Whether `group` is a torch.distributed ProcessGroup (without importing
    torch: a caller that holds one has imported it)."""
    if "torch" not in sys.modules:
        return False
    try:
        from torch.distributed import ProcessGroup
    except ImportError:  # a torch built without torch.distributed
        return False
    return isinstance(group, ProcessGroup)


def _process_group_ranks(pg):
    """The global ranks of a ProcessGroup, in the order of its group ranks."""
    import torch.distributed as dist

    try:
        return tuple(dist.get_process_group_ranks(pg))
    except (KeyError, ValueError, RuntimeError) as e:  # KeyError: not in torch's registry
        why = "" if isinstance(e, KeyError) else f": {e}"
        raise ValueError(
            f"group={pg!r} is a ProcessGroup that torch.distributed does not know (destroyed, "
            f"or of another world{why}); pass a live one or a tuple of global ranks"
        ) from None


def _normalize_group(group, tp_size=None):
    """tuple of global ranks: a torch.distributed ProcessGroup gives its ranks
    (get_process_group_ranks), a tuple or list is taken as global ranks, an
    int is one rank; None -> (0, ..., tp_size-1) (or the world)."""
    if _is_process_group(group):
        group = _process_group_ranks(group)
    if group is None:
        if tp_size is None:
            dist = _dist_if_initialized()
            if dist is None:
                raise ValueError("group=None needs tp_size or an initialized torch.distributed")
            tp_size = dist.get_world_size()
        return tuple(range(tp_size))
    if isinstance(group, numbers.Integral):  # one rank: an int, or numpy's
        group = (group,)
    try:
        g = tuple(_int_arg("group rank", r) for r in group)
    except TypeError as e:
        raise TypeError(
            "group must be a torch.distributed ProcessGroup, a tuple of global ranks or an int, "
            f"got {type(group).__name__} {group!r:.80} ({e})"
        ) from None
    if len(g) == 0:
        raise ValueError("group must not be empty")
    if len(set(g)) != len(g) or min(g) < 0:
        hint = ""
        if g == (_NON_GROUP_MEMBER,):
            hint = (f" ({_NON_GROUP_MEMBER} is what torch.distributed.new_group returns to a "
                    "process outside the group: this process is not in it)")
        raise ValueError(f"group={g} must hold distinct non-negative global ranks{hint}")
    if tp_size is not None and len(g) != tp_size:
        raise ValueError(f"group={g} has {len(g)} ranks but tp_size={tp_size}")
    return g


def _group_args(group, tp_size=None):
    """(the tuple of global ranks, the group as torch collectives and
    callbacks get it: the ProcessGroup when one was given, else the tuple)."""
    ranks = _normalize_group(group, tp_size)
    return ranks, (group if _is_process_group(group) else ranks)


def _backend_code(backend):
    if not isinstance(backend, str):
        raise TypeError(
            f"backend must be 'auto', 'nccl' or 'onesided', got {type(backend).__name__}"
        )
    return _C.parse_backend(backend)  # ValueError


_TORCH_MISSING = (
    "dpsampling needs PyTorch for tensors and communicators, and it is not installed: "
    "pip install 'dpsampling[torch]' (or a CUDA 13 build of torch, e.g. "
    "pip install torch --index-url https://download.pytorch.org/whl/cu130)"
)


def _torch():
    try:
        import torch  # lazily: torch is a run-time dependency only
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(_TORCH_MISSING, name="torch") from None
    return torch


def _dist_if_initialized():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        import torch.distributed as dist
    except Exception:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


# --------------------------------------------------------------------------
# backend resolution


def onesided_available(group=None):
    """Quick local check: can the one-sided transport run on this group?

    Uses dpsOnesidedAvailableOnDevices over the CUDA devices of the group's
    ranks on this node (peer access between every pair, and neither
    NCCL_CUMEM_ENABLE nor NCCL_WIN_ENABLE set to 0). False without torch,
    without a GPU, or when a rank is on another node; never raises. Creation
    decides with NCCL's LSA team, which is authoritative.
    """
    try:
        try:
            torch = _torch()
        except Exception:
            return False
        if not torch.cuda.is_available():
            return False
        ndev = torch.cuda.device_count()
        g = _normalize_group(group)
        dist = _dist_if_initialized()
        if dist is not None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE") or 0) or ndev
            node = dist.get_rank() // local
            if any(r // local != node for r in g):
                return False
            devices = [r % local for r in g]
        else:
            devices = list(g)
        if any(d >= ndev for d in devices):
            return False
        return bool(_C.onesided_available_on_devices(devices))
    except Exception:
        return False


def _arch_runs(architectures, major, minor):
    """Whether a build for CMAKE_CUDA_ARCHITECTURES `architectures` (e.g.
    "80-real;90-real;100") has device code that runs on an sm_<major><minor>
    device: machine code of the same major at or below its minor ("a":
    that sm alone), or PTX ("NN", "NN-virtual") at or below it, which the
    driver compiles ("a": that sm alone; "f": the same major). An entry that
    names no number ("native", "all") counts as running."""
    sm = 10 * major + minor
    for entry in str(architectures).replace(",", ";").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        num, _, kind = entry.partition("-")
        suffix = num[-1:] if num[-1:] in ("a", "f") else ""
        num = num[: len(num) - len(suffix)]
        if not num.isdigit():
            return True
        nn = int(num)
        same = nn // 10 == major and nn % 10 <= minor
        if suffix == "a":
            same = nn == sm
        if kind != "virtual" and same:
            return True
        ptx = nn == sm if suffix == "a" else nn <= sm and (suffix != "f" or nn // 10 == major)
        if kind != "real" and ptx:
            return True
    return False


def is_available():
    """Whether the communicator and distributed_argmax can run here: torch
    sees a CUDA device (the current one) and this build has device code for
    its architecture. The upstream engine asks this (as the upstream argmax
    module's is_available) before create_dist_argmax_state. Never raises."""
    try:
        torch = _torch()
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability()
    except Exception:
        return False
    architectures = getattr(_build_info, "CUDA_ARCHITECTURES", "")
    return not architectures or _arch_runs(architectures, major, minor)


def resolve_backend(requested="auto", group=None):
    """The backend a communicator of `group` would use: 'nccl' or 'onesided'.

    DPSAMPLING_BACKEND (alias TOKENSPEED_DP_SAMPLING_BACKEND) overrides
    `requested`; an invalid value raises ValueError naming the variable.
    'onesided' when it is not available raises RuntimeError.
    """
    _backend_code(requested)
    # Validate the environment first; when it forces nccl no probing is needed.
    first = _C.resolve_backend(requested, True)
    if first == "nccl":
        return first
    return _C.resolve_backend(requested, onesided_available(group))


_resolve_backend = resolve_backend
_onesided_available = onesided_available


# --------------------------------------------------------------------------
# bootstrap: one library-owned NCCL communicator per group

_lock = threading.RLock()
_groups = {}  # tuple of global ranks -> _C.NcclGroup
_process_groups = {}  # tuple -> torch ProcessGroup made here (sub-groups given as tuples)


def _rank_in_group(group):
    """This process's index in `group` (torch.distributed decides)."""
    dist = _dist_if_initialized()
    if dist is None:
        if len(group) == 1:
            return 0
        raise RuntimeError(
            f"dpsampling: group={group} spans {len(group)} ranks but torch.distributed is not "
            "initialized; call torch.distributed.init_process_group first"
        )
    me = dist.get_rank()
    if me not in group:
        raise ValueError(f"this process (global rank {me}) is not in group={group}")
    return group.index(me)


def _process_group(dist, group):
    """The ProcessGroup of a tuple of global ranks for the bootstrap's
    broadcast: the default group, or one made once (dist.new_group) and kept.
    A group given as a ProcessGroup is used as given instead (_group_nccl)."""
    if group == tuple(range(dist.get_world_size())):
        return None  # the default group
    pg = _process_groups.get(group)
    if pg is None:
        try:
            pg = dist.new_group(list(group), use_local_synchronization=True)
        except TypeError:  # older torch
            pg = dist.new_group(list(group))
        _process_groups[group] = pg
    return pg


def _warn_nccl_mismatch():
    """The one-sided backend reads NCCL's device-API structures, so the NCCL
    that runs (torch's, when torch loaded libnccl.so.2 first) must be the one
    the extension was built against. Say so once instead of misbehaving."""
    try:
        built, running = _C.NCCL_HEADER_VERSION, _C.nccl_version()
    except Exception:  # diagnostics only: never block a bootstrap
        return
    if built != running:
        import warnings

        warnings.warn(
            f"dpsampling was built against NCCL {built} but NCCL {running} is loaded "
            "(torch's, most likely); rebuild it against that one (pip install . does so "
            "when the nvidia-nccl package is installed) or use backend='nccl'",
            RuntimeWarning,
            stacklevel=3,
        )


def _group_nccl(group=None):
    """The group's shared NCCL communicator (collective over the group the
    first time: rank 0 makes the id, torch.distributed broadcasts it, over
    `group` itself when it is a ProcessGroup)."""
    pg = group if _is_process_group(group) else None
    group = _normalize_group(group)
    g = _groups.get(group)
    if g is not None:
        return g
    with _lock:
        g = _groups.get(group)
        if g is not None:
            return g
        torch = _torch()
        _warn_nccl_mismatch()
        me = _rank_in_group(group)
        device = torch.cuda.current_device()
        if len(group) == 1:
            uid = _C.get_unique_id()
        else:
            import torch.distributed as dist

            obj = [_C.get_unique_id() if me == 0 else None]
            if pg is None:
                pg = _process_group(dist, group)
            dist.broadcast_object_list(obj, src=group[0], group=pg)
            uid = obj[0]
            if not isinstance(uid, bytes) or len(uid) != _C.UNIQUE_ID_BYTES:
                raise RuntimeError("dpsampling: bootstrap broadcast returned a malformed id")
        g = _C.NcclGroup(uid, len(group), me, device)
        _groups[group] = g
        return g


def destroy_group_communicators():
    """Close the free function's communicators and destroy the cached
    per-group NCCL communicators. Collective: call it on every rank together,
    after every DpSamplingComm on those groups was closed (RuntimeError
    otherwise, naming how many are open; nothing is destroyed then). Tensors
    returned earlier stay valid: they keep their buffers, not the NCCL
    communicator. This is the only place those NCCL communicators are
    destroyed: never from a finalizer or a tensor's deleter."""
    with _lock:
        for comm in list(_free_comms.values()):
            comm.close()
        _free_comms.clear()
        open_groups = {grp: g.open_users() for grp, g in _groups.items() if g.open_users()}
        if open_groups:
            raise RuntimeError(
                "destroy_group_communicators: DpSamplingComm(s) still open on "
                + ", ".join(f"group={grp} ({n})" for grp, n in open_groups.items())
                + "; close() them first (nothing was destroyed)"
            )
        for g in _groups.values():
            g.destroy()
        _groups.clear()
    _C.release_pending()


def release_pending():
    """Free the buffers of every communicator that was closed (or collected)
    and whose last tensor is gone, once its own work has finished. The
    library also does this at every creation and close(); call it outside
    CUDA-graph capture on this thread. Returns how many still wait for their
    work."""
    return _C.release_pending()


_C._set_group_registry(_groups, _group_nccl)


def get_global_backend():
    """The library's default collectives: an object (in C) whose
    all_gather_into_tensor(output, input, group) / all_to_all_single(output,
    input, group) run NCCL on the group's shared communicator on torch's
    current stream. Passing it (or None) as fallback_comm_backend keeps the
    C collectives with no Python in the call path."""
    return _C.global_backend


def _install_fallback(comm, fallback, given):
    """Installs fallback_comm_backend as comm's collectives (the nccl
    backend's). A backend that uses no collectives (onesided) refuses it:
    then a RuntimeWarning says so, naming the backend, and the object is not
    kept. Returns what comm.fallback_comm_backend holds."""
    if fallback is None or fallback is _C.global_backend:
        return fallback  # the library's defaults: nothing to install
    why = comm._set_collectives(fallback, given)
    if why is None:
        return fallback
    warnings.warn(f"fallback_comm_backend is not used: {why}", RuntimeWarning, stacklevel=3)
    return None


def _device_arg(torch, device):
    """The index of the CUDA device that `device` names: None (the current
    device), an int, a str such as "cuda:1" or a torch.device ("cuda" alone:
    the current one). ValueError naming the value otherwise."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, bool):
        raise ValueError(f"device={device!r} is not a device")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={device!r} is not a device") from None
    if d.type != "cuda":
        raise ValueError(f"device={device!r} must be a CUDA device")
    index = torch.cuda.current_device() if d.index is None else d.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device={device!r}: there is no cuda:{index} ({count} visible)")
    return index


# --------------------------------------------------------------------------
# the communicator


class DpSamplingComm(_C.Comm):
    """One dpsampling communicator over `group`: a torch.distributed
    ProcessGroup (its ranks; the bootstrap broadcasts over it), a tuple of
    global ranks, or None for (0, ..., tp_size-1). `self.group` is the tuple.

    Collective: every rank of the group constructs it with the same arguments.
    max_pad_bs and vocab_size are required (keyword-only, like every argument
    after group). timeout_ms: how long a one-sided kernel waits for a peer
    before the communicator fails with a timeout; None (or 0) takes
    DPSAMPLING_TIMEOUT_MS from the environment, else 5000.
    fallback_comm_backend: the nccl backend's collectives (an object with
    all_gather_into_tensor(output, input, group) and optionally
    all_to_all_single); a backend that uses none (onesided) refuses it with a
    RuntimeWarning, and self.fallback_comm_backend is then None.
    device: the CUDA device (None: the current one; an int, "cuda:i" or a
    torch.device); the calls use it whatever the current device is then.
    Methods (implemented in C): swap_batch_vocab(local_logits, pad_bs=),
    gather_verify_outputs(predict_local, accept_index_local,
    accept_length_local, pad_bs=), gather_verify_logprobs(logprobs_local,
    pad_bs=), prepare_verify_outputs(logits_dtype) (the upstream component's
    names; predict, accept_index, accept_length, logprobs and dtype are taken
    as keywords too),
    argmax, topk, sample (a token per row from the vocab shards),
    verify_chain (the whole speculative verify from the vocab shards),
    sample_stats(), close(). Outputs alias persistent buffers valid until the
    next call of the same operation (argmax, topk and sample: unless out
    tensors are given, which are written and returned).
    """

    def __init__(
        self,
        tp_size,
        rank,
        group=None,
        *,
        max_pad_bs,
        num_tokens_per_req=1,
        vocab_size,
        logits_dtype=None,
        backend="auto",
        fallback_comm_backend=None,
        timeout_ms=None,
        device=None,
    ):
        tp_size = _int_arg("tp_size", tp_size)
        rank = _int_arg("rank", rank)
        max_pad_bs = _int_arg("max_pad_bs", max_pad_bs)
        num_tokens_per_req = _int_arg("num_tokens_per_req", num_tokens_per_req)
        vocab_size = _int_arg("vocab_size", vocab_size, _INT64_MAX)
        timeout_ms = 0 if timeout_ms is None else _int_arg("timeout_ms", timeout_ms)
        dtype_code = _C.dtype_code(logits_dtype, "logits_dtype", True)  # TypeError
        backend_code = _backend_code(backend)  # ValueError
        # the configuration, in dpsCommConfig_t's order (config_check and _create)
        config = (tp_size, rank, max_pad_bs, num_tokens_per_req, vocab_size, dtype_code,
                  backend_code)
        # Configuration rules and the environment override: ValueError before
        # any torch or GPU use.
        _C.config_check(*config, timeout_ms)
        _C.resolve_backend(backend, True)
        group, given = _group_args(group, tp_size)
        if fallback_comm_backend is not None and not callable(
            getattr(fallback_comm_backend, "all_gather_into_tensor", None)
        ):
            raise TypeError(
                "fallback_comm_backend must have all_gather_into_tensor(output, input, group)"
            )

        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("DpSamplingComm needs a CUDA device (torch.cuda.is_available() is False)")
        device = _device_arg(torch, device)
        me = _rank_in_group(group)
        if me != rank:
            raise ValueError(
                f"rank={rank} but this process is rank {me} of group={group} in torch.distributed"
            )
        with torch.cuda.device(device):  # the group's NCCL communicator is made on it
            nccl_group = _group_nccl(given)
            if nccl_group.device != device:
                raise RuntimeError(
                    f"group={group} was bootstrapped on cuda:{nccl_group.device}, not on "
                    f"device=cuda:{device}"
                )
            self._create(nccl_group, *config, device, timeout_ms)
        self.group = group
        self.fallback_comm_backend = _install_fallback(self, fallback_comm_backend, given)

    def __repr__(self):
        if self.closed:
            return "DpSamplingComm(closed)"
        return (
            f"DpSamplingComm(tp_size={self.tp_size}, rank={self.rank}, group={self.group}, "
            f"max_pad_bs={self.max_pad_bs}, num_tokens_per_req={self.num_tokens_per_req}, "
            f"vocab_size={self.vocab_size}, backend={self.backend!r}, device=cuda:{self.cuda_device})"
        )

    # argmax, topk, sample and verify_chain are the extension's methods
    # (Comm): their common argument types are taken in C, everything else
    # goes through _int_arg, _limit_arg, _sample_args and _verify_args
    # (registered below), which raise this module's errors. So an eager call
    # runs no Python frame of ours.

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# --------------------------------------------------------------------------
# the methods' arguments beyond their common types (the extension calls these,
# in the order of its checks; registered with _set_arg_helpers below)


def _sample_args(local_logits, temperature, seed, offset, top_k, top_p, min_p, vocab_limit,
                 return_logprobs, out_logprobs):
    """sample()'s arguments: (vocab_limit, temperature, top_k, top_p, min_p,
    seed, offset, want_logprobs), or the error naming the first bad one."""
    params = _sample_params(temperature, seed, offset, top_k, top_p, min_p)
    limit = 0 if vocab_limit is None else _limit_arg(vocab_limit)
    if out_logprobs is not None and not return_logprobs:
        raise ValueError("out_logprobs is given but return_logprobs=False; pass "
                         "return_logprobs=True to have the logprobs written")
    if not hasattr(local_logits, "dim"):
        raise TypeError(f"local_logits must be a torch.Tensor, got "
                        f"{type(local_logits).__name__}")
    return (limit, *params, bool(return_logprobs))


def _verify_args(local_logits, pad_bs, temperature, seed, offset, top_k, top_p, min_p,
                 vocab_limit, softcap, return_logprobs):
    """verify_chain()'s arguments: (pad_bs, vocab_limit, temperature, top_k,
    top_p, min_p, seed, offset, softcap, want_logprobs), or the error naming
    the first bad one."""
    if type(pad_bs) is not int or not -_INT32_MAX <= pad_bs <= _INT32_MAX:
        pad_bs = _int_arg("pad_bs", pad_bs)  # TypeError / ValueError naming pad_bs
    params = _sample_params(temperature, seed, offset, top_k, top_p, min_p)
    limit = 0 if vocab_limit is None else _limit_arg(vocab_limit)
    softcap = _softcap_arg(softcap)
    if not hasattr(local_logits, "dim"):
        raise TypeError(f"local_logits must be a torch.Tensor, got "
                        f"{type(local_logits).__name__}")
    return (pad_bs, limit, *params, softcap, bool(return_logprobs))


_C._set_arg_helpers({"int_arg": _int_arg, "limit": _limit_arg, "sample": _sample_args,
                     "verify_chain": _verify_args})


# --------------------------------------------------------------------------
# free function

_free_comms = {}  # (group, N, V, dtype, device) -> DpSamplingComm (nccl)


def swap_batch_vocab(
    local_logits, *, tp_size, pad_bs, num_tokens_per_req, vocab_size, group=None, backend=None
):
    """[pad_bs*N, V/tp] -> a NEW tensor [pad_bs/tp*N, V] (the caller may keep it).

    Same result as DpSamplingComm.swap_batch_vocab, over the nccl backend
    (unless DPSAMPLING_BACKEND says otherwise). backend: the collectives to
    run the exchange with, as the upstream function takes them (an object
    with all_to_all_single(output, input, group) and
    all_gather_into_tensor(output, input, group): DpSamplingComm's
    fallback_comm_backend); None: the library's NCCL. The tensor's shape and
    device are checked first (ValueError), before any communicator is made
    or replaced. Uses a cached communicator per (group, N, V, dtype, the
    tensor's device), recreated when
    pad_bs exceeds its max_pad_bs or another backend object comes (so pass
    one long-lived object, as engines do), and copies its persistent output
    into a fresh tensor on torch's current stream. Collective: every rank of
    the group calls it.
    """
    tp_size = _int_arg("tp_size", tp_size)
    pad_bs = _int_arg("pad_bs", pad_bs)
    num_tokens_per_req = _int_arg("num_tokens_per_req", num_tokens_per_req)
    vocab_size = _int_arg("vocab_size", vocab_size, _INT64_MAX)
    if tp_size < 1 or pad_bs < 1 or pad_bs % tp_size != 0:
        raise ValueError(f"pad_bs={pad_bs} must be a positive multiple of tp_size={tp_size}")
    group, given = _group_args(group, tp_size)
    dtype = getattr(local_logits, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"local_logits must be a torch.Tensor, got {type(local_logits).__name__}"
        )
    _C.dtype_code(dtype, "local_logits.dtype", False)  # TypeError
    if backend is _C.global_backend:
        backend = None
    if backend is not None and not all(
        callable(getattr(backend, m, None)) for m in ("all_to_all_single", "all_gather_into_tensor")
    ):
        raise TypeError(
            "backend must have all_to_all_single(output, input, group) and "
            f"all_gather_into_tensor(output, input, group), got {type(backend).__name__}"
        )
    if vocab_size % tp_size != 0:
        raise ValueError(f"vocab_size={vocab_size} must be divisible by tp_size={tp_size}")
    want = (pad_bs * num_tokens_per_req, vocab_size // tp_size)
    shape = tuple(getattr(local_logits, "shape", ()))
    if shape != want:
        raise ValueError(
            f"local_logits shape {shape} != expected [pad_bs*N, V/tp] = "
            f"{list(want)} (pad_bs={pad_bs}, N={num_tokens_per_req}, V/tp={want[1]})"
        )
    if local_logits.device.type != "cuda":
        raise ValueError(f"local_logits must be on a CUDA device, got {local_logits.device}")
    device = local_logits.device.index
    key = (group, num_tokens_per_req, vocab_size, dtype, device)
    comm = _free_comms.get(key)
    if comm is None or comm.max_pad_bs < pad_bs or comm._free_backend is not backend:
        with _lock:
            old = _free_comms.get(key)
            max_pad_bs = max(pad_bs, old.max_pad_bs if old is not None else 0)
            comm = DpSamplingComm(
                tp_size=tp_size,
                rank=_rank_in_group(group),
                group=given,
                max_pad_bs=max_pad_bs,
                num_tokens_per_req=num_tokens_per_req,
                vocab_size=vocab_size,
                logits_dtype=dtype,
                backend="nccl",
                fallback_comm_backend=backend,
                device=device,
            )
            comm._free_backend = backend  # the object asked for (kept even if refused)
            _free_comms[key] = comm
            if old is not None:
                old.close()
    return comm._swap_batch_vocab_new(local_logits, pad_bs)


# --------------------------------------------------------------------------
# drop-in for the upstream engine's distributed argmax


class DistArgmaxState:
    """State of distributed_argmax: a DpSamplingComm over `group` (a
    torch.distributed ProcessGroup, a tuple of global ranks or an int),
    created at the first call (when the shard width, hence V, is known;
    collective, outside CUDA-graph capture) on `device` (None: the current
    one); the caller's current device is left as it was. Needs no NVLink
    multicast and runs at any tp up to SHARD_MAX_RANKS (8), tp=1 included.
    The communicator leaves its logits dtype unset (argmax does not fix
    it), so it holds no swap buffers, only small ones (records, scratch)."""

    def __init__(self, group, rank_in_group, max_M, dtype, device=None):
        self.group, self._group_arg = _group_args(group)
        self.rank = _int_arg("rank_in_group", rank_in_group)
        me = _rank_in_group(self.group)
        if self.rank != me:
            raise ValueError(
                f"rank_in_group={self.rank} but this process is rank {me} of group={self.group} "
                "(global ranks)"
            )
        self.max_M = _int_arg("max_M", max_M)
        if self.max_M < 1:
            raise ValueError(f"max_M={self.max_M} must be >= 1")
        if len(self.group) > SHARD_MAX_RANKS:
            raise ValueError(
                f"group={self.group} has {len(self.group)} ranks; distributed_argmax supports at "
                f"most {SHARD_MAX_RANKS}"
            )
        if dtype is None:  # as create_dist_argmax_state: upstream's default
            dtype = _torch().bfloat16
        self._dtype_code = _C.dtype_code(dtype, "dtype", False)  # TypeError
        self._dtype_seen = None  # the last logits dtype found to be `dtype`
        self.dtype = dtype
        self.device = device
        self.comm = None

    def _check_logits(self, logits):
        """logits is a 2-D tensor of the state's dtype: checked here, before
        anything is created from its shape (the communicator leaves its own
        dtype unset, so that it allocates no swap buffers)."""
        ndim = getattr(logits, "ndim", None)
        if not isinstance(ndim, int) or not hasattr(logits, "dtype"):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if ndim != 2:
            raise ValueError(f"logits must be 2-D [M, V/tp], got shape {tuple(logits.shape)}")
        if logits.dtype is not self._dtype_seen:
            if _C.dtype_code(logits.dtype, "logits.dtype", False) != self._dtype_code:
                raise RuntimeError(
                    f"distributed_argmax: logits dtype {logits.dtype} differs from the state's "
                    f"dtype {self.dtype}"
                )
            self._dtype_seen = logits.dtype
        device = getattr(logits, "device", None)
        if getattr(device, "type", None) != "cuda":
            raise ValueError(f"logits must be on a CUDA device, got {device}")

    def _comm_for(self, logits):
        if self.comm is None:
            tp = len(self.group)
            self.comm = DpSamplingComm(
                tp, self.rank, self._group_arg, max_pad_bs=-(-self.max_M // tp) * tp,
                num_tokens_per_req=1, vocab_size=logits.shape[1] * tp,
                logits_dtype=None, device=self.device)
        return self.comm

    def close(self):
        """Collective: closes the communicator (if one was created)."""
        if self.comm is not None:
            self.comm.close()
            self.comm = None


def create_dist_argmax_state(group, rank_in_group, max_M, dtype=None, device=None,
                             skip_ping_pong=False):
    """Drop-in for the upstream engine's create_dist_argmax_state. The
    arguments mean the same: group is the engine's torch.distributed
    ProcessGroup (or a tuple of global ranks), rank_in_group this process's
    index in it (checked: ValueError naming both when it differs); dtype
    None is torch.bfloat16, upstream's default; skip_ping_pong is accepted and has no effect (the exchange
    double-buffers itself)."""
    del skip_ping_pong
    if dtype is None:
        dtype = _torch().bfloat16
    return DistArgmaxState(group, rank_in_group, max_M, dtype, device)


def try_create_dist_argmax_state(group, rank_in_group, max_M, dtype=None, device=None,
                                 skip_ping_pong=False):
    """Drop-in for the newer upstream engine's try_create_dist_argmax_state,
    which returns None where its kernel cannot run (no NVLink multicast).
    Ours needs none, so this is create_dist_argmax_state: a state, or the
    same exceptions for bad arguments."""
    return create_dist_argmax_state(group, rank_in_group, max_M, dtype, device, skip_ping_pong)


def supports_dist_argmax_shape(vocab_per_rank, dtype, world_size):
    """Drop-in for the newer upstream engine's supports_dist_argmax_shape:
    whether distributed_argmax takes shards of vocab_per_rank columns of
    `dtype` over world_size ranks, from the configuration alone (no GPU,
    nothing collective): a logits dtype (fp32, bf16, fp16), 1 <= world_size
    <= SHARD_MAX_RANKS, vocab_per_rank >= 1 and world_size * vocab_per_rank
    a vocabulary the library takes. Any width works (no alignment or
    minimum). Never raises."""
    try:
        _C.dtype_code(dtype, "dtype", False)
        tp, v = _int_arg("world_size", world_size), _int_arg("vocab_per_rank", vocab_per_rank)
        if not 1 <= tp <= SHARD_MAX_RANKS or v < 1:
            return False
        _C.config_check(tp, 0, tp, 1, tp * v, _C.DTYPE_UNSET, _C.BACKEND_NCCL, 0)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return False
    return True


def distributed_argmax(state, logits, *, out_max=None, out_idx=None):
    """Drop-in for the upstream engine's distributed_argmax: logits is this
    rank's [M, V/tp] shard (M <= max_M); returns (max [M] in the logits
    dtype, idx [M] int64 global vocab indices), the same on every rank.
    out_max / out_idx are written in place when given (no extra kernel);
    an output not given is a new tensor (torch.empty on the logits' device,
    as upstream), which the caller may keep across calls. M = 0 (an idle
    step of the engine, on every rank of the group alike) returns empty
    outputs with no kernel and no exchange (the first such call outside
    capture still creates the communicator, as a call with rows would)."""
    state._check_logits(logits)
    rows = logits.shape[0]
    # an empty call outside capture creates the communicator too (every rank
    # is here), so that a warm-up of idle steps does not leave it to a capture
    if rows != 0 or (state.comm is None and not _torch().cuda.is_current_stream_capturing()):
        state._comm_for(logits)
    if out_max is None or out_idx is None:
        torch = _torch()
        if out_max is None:
            out_max = torch.empty((rows,), dtype=logits.dtype, device=logits.device)
        if out_idx is None:
            out_idx = torch.empty((rows,), dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out_max, out_idx
    return state.comm.argmax(logits, out_value=out_max, out_index=out_idx)


# Skip NCCL/CUDA teardown from finalizers at interpreter exit (peers may be
# gone); the process is ending anyway.
import atexit as _atexit  # noqa: E402

_atexit.register(_C._shutdown)
