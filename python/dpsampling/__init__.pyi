# Type stub of the dpsampling package (the methods of DpSamplingComm are
# implemented in C, in dpsampling._dpsampling.Comm).
from types import TracebackType
from typing import Any, Dict, Iterable, Optional, Protocol, Tuple, Type, TypedDict, Union

import torch
import torch.distributed

__version__: str
BACKEND_ENV: str
BACKEND_ENV_ALIAS: str
SHARD_MAX_RANKS: int  # the most ranks of argmax, topk, sample, verify_chain, distributed_argmax

# A torch.distributed ProcessGroup (its global ranks; torch collectives of the
# bootstrap run over it), global ranks, one rank, or None (0..tp_size-1).
_Group = Union[None, int, Iterable[int], torch.distributed.ProcessGroup]
# torch.float32 / torch.bfloat16 / torch.float16, or one of the names
# "fp32", "float32", "float", "bf16", "bfloat16", "fp16", "float16", "half"
# (each also with a "torch." prefix).
_Dtype = Union[torch.dtype, str]

# A sample() parameter: a number for every row, or a 1-D tensor [rows] on the
# logits' device (float32; top_k int32/int64; seed/offset int64 = uint64 bits);
# for verify_chain() a tensor holds one entry per request ([pad_bs]).
# temperature, top_p, min_p: a float (or int); top_k, seed, offset: an int.
_Param = Union[float, int, torch.Tensor]
_IntParam = Union[int, torch.Tensor]

class SampleStats(TypedDict):
    rows_greedy: int
    rows_fast: int
    rows_exact: int
    invalid_calls: int
    last_invalid: Optional[str]  # the first invalid row/argument/value, when invalid_calls grew

class _Collectives(Protocol):
    def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: Any = ...
    ) -> Any: ...
    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, group: Any = ...
    ) -> Any: ...

def build_info() -> Dict[str, Any]: ...
def onesided_available(group: _Group = None) -> bool: ...
def is_available() -> bool: ...
def resolve_backend(requested: str = "auto", group: _Group = None) -> str: ...
def destroy_group_communicators() -> None: ...
def release_pending() -> int: ...
class DistArgmaxState:
    group: Tuple[int, ...]
    rank: int
    max_M: int
    dtype: _Dtype
    device: Union[None, int, str, torch.device]
    comm: Optional["DpSamplingComm"]
    def __init__(
        self, group: _Group, rank_in_group: int, max_M: int, dtype: _Dtype,
        device: Union[None, int, str, torch.device] = ...
    ) -> None: ...
    def close(self) -> None: ...

def create_dist_argmax_state(
    group: _Group, rank_in_group: int, max_M: int, dtype: Optional[_Dtype] = ...,
    device: Union[None, int, str, torch.device] = ..., skip_ping_pong: bool = ...
) -> DistArgmaxState: ...
def try_create_dist_argmax_state(
    group: _Group, rank_in_group: int, max_M: int, dtype: Optional[_Dtype] = ...,
    device: Union[None, int, str, torch.device] = ..., skip_ping_pong: bool = ...
) -> Optional[DistArgmaxState]: ...
def supports_dist_argmax_shape(vocab_per_rank: int, dtype: _Dtype, world_size: int) -> bool: ...
# -> (max [M] in the logits dtype, idx [M] int64)
def distributed_argmax(
    state: DistArgmaxState, logits: torch.Tensor, *, out_max: Optional[torch.Tensor] = ...,
    out_idx: Optional[torch.Tensor] = ...
) -> Tuple[torch.Tensor, torch.Tensor]: ...
def get_global_backend() -> _Collectives: ...
def swap_batch_vocab(
    local_logits: torch.Tensor,
    *,
    tp_size: int,
    pad_bs: int,
    num_tokens_per_req: int,
    vocab_size: int,
    group: _Group = None,
    backend: Optional[_Collectives] = None,
) -> torch.Tensor: ...

class DpSamplingComm:
    group: Tuple[int, ...]
    fallback_comm_backend: Optional[_Collectives]
    def __init__(
        self,
        tp_size: int,
        rank: int,
        group: _Group = None,
        *,
        max_pad_bs: int,
        num_tokens_per_req: int = 1,
        vocab_size: int,
        logits_dtype: Optional[_Dtype] = None,
        backend: str = "auto",
        fallback_comm_backend: Optional[_Collectives] = None,
        timeout_ms: Optional[int] = None,
        device: Union[None, int, str, torch.device] = None,
    ) -> None: ...
    # Outputs are views of persistent buffers, valid until the next call of
    # the same operation.
    def swap_batch_vocab(
        self, local_logits: torch.Tensor, pad_bs: Optional[int] = None
    ) -> torch.Tensor: ...
    # the upstream component's argument names; predict, accept_index,
    # accept_length, logprobs and dtype are taken as keywords too
    def gather_verify_outputs(
        self,
        predict_local: torch.Tensor,
        accept_index_local: torch.Tensor,
        accept_length_local: torch.Tensor,
        pad_bs: Optional[int] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def gather_verify_logprobs(
        self, logprobs_local: torch.Tensor, pad_bs: Optional[int] = None
    ) -> torch.Tensor: ...
    def prepare_verify_outputs(self, logits_dtype: _Dtype) -> None: ...
    def async_error(self) -> Optional[str]: ...
    def close(self) -> None: ...
    # argmax, topk, sample: an out tensor given is written and returned; the
    # others are views of persistent buffers, valid until the next call of the
    # same operation (no allocation per call).
    # -> (values, indices), or (values, indices, lse) with return_logsumexp=True
    def argmax(
        self, local_logits: torch.Tensor, vocab_limit: Optional[int] = ...,
        return_logsumexp: bool = ..., *, out_value: Optional[torch.Tensor] = ...,
        out_index: Optional[torch.Tensor] = ..., out_lse: Optional[torch.Tensor] = ...
    ) -> Tuple[torch.Tensor, ...]: ...
    def topk(
        self, local_logits: torch.Tensor, k: int, vocab_limit: Optional[int] = ..., *,
        out_values: Optional[torch.Tensor] = ..., out_indices: Optional[torch.Tensor] = ...
    ) -> Tuple[torch.Tensor, torch.Tensor]: ...
    # -> tokens int64 [rows], or (tokens, logprobs fp32 [rows]) with return_logprobs=True
    def sample(
        self, local_logits: torch.Tensor, *, temperature: _Param, seed: _IntParam,
        offset: _IntParam, top_k: Optional[_IntParam] = ..., top_p: Optional[_Param] = ...,
        min_p: Optional[_Param] = ..., vocab_limit: Optional[int] = ...,
        return_logprobs: bool = ..., out: Optional[torch.Tensor] = ...,
        out_logprobs: Optional[torch.Tensor] = ...
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...
    # -> (predict int32 [pad_bs, N], accept_index int32 [pad_bs, N], accept_length int32
    # [pad_bs]), plus logprobs fp32 [pad_bs, N] with return_logprobs=True: views of
    # persistent buffers, valid until the next verify_chain. Parameters as sample()'s, a
    # tensor holding pad_bs entries (one per request).
    def verify_chain(
        self, local_logits: torch.Tensor, candidates: torch.Tensor, *, pad_bs: int,
        temperature: _Param, seed: _IntParam, offset: _IntParam, top_k: Optional[_IntParam] = ...,
        top_p: Optional[_Param] = ..., min_p: Optional[_Param] = ...,
        vocab_limit: Optional[int] = ..., vocab_mask: Optional[torch.Tensor] = ...,
        softcap: Optional[float] = ..., return_logprobs: bool = ...
    ) -> Tuple[torch.Tensor, ...]: ...
    def sample_stats(self) -> SampleStats: ...
    @property
    def backend(self) -> str: ...
    @property
    def requested_backend(self) -> str: ...
    @property
    def fast_path_enabled(self) -> bool: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def max_pad_bs(self) -> int: ...
    @property
    def num_tokens_per_req(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def is_initialized(self) -> bool: ...
    @property
    def cuda_device(self) -> int: ...
    @property
    def logits_dtype(self) -> Optional[torch.dtype]: ...
    @property
    def timeout_ms(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> "DpSamplingComm": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
