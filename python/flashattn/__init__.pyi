from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple, TypeVar, Union

T = TypeVar("T")  # a DLPack tensor type: outputs come back in the input's framework

__version__: str

class Error(Exception):
    STATUS_NAMES: Dict[int, str]
    message: str
    status: int
    def __init__(self, message: str, status: int = ...) -> None: ...
    @property
    def status_name(self) -> str: ...

class InvalidValueError(Error, ValueError): ...
class InvalidTypeError(Error, TypeError): ...
class NotSupportedError(Error, NotImplementedError): ...
class OutOfMemoryError(Error, MemoryError): ...
class BackendUnavailableError(Error, RuntimeError): ...
class BackendFailureError(Error, RuntimeError): ...

class BackendStatus(NamedTuple):
    available: bool
    detail: str

class Tiling(NamedTuple):
    block_rows: int
    block_cols: int

class Gradients(NamedTuple):
    dq: Any
    dk: Any
    dv: Any
    dsinks: Optional[Any]
    dbias: Optional[Any]

def forward(q: T, k: T, v: T, *, causal: bool = ..., softmax_scale: Optional[float] = ...,
            window: Tuple[int, int] = ..., seqlens_k: Optional[Sequence[int]] = ..., dropout_p: float = ...,
            seed: int = ..., offset: int = ..., block_mask: Any = ..., block_size: Tuple[int, int] = ...,
            softcap: float = ..., alibi_slopes: Optional[T] = ..., sinks: Optional[T] = ..., bias: Optional[T] = ...,
            backend: str = ...) -> Tuple[T, T]: ...
def backward(q: T, k: T, v: T, out: T, dout: T, lse: T, *, causal: bool = ..., softmax_scale: Optional[float] = ...,
             window: Tuple[int, int] = ..., seqlens_k: Optional[Sequence[int]] = ..., dropout_p: float = ...,
             seed: int = ..., offset: int = ..., block_mask: Any = ..., block_size: Tuple[int, int] = ...,
             softcap: float = ..., alibi_slopes: Optional[T] = ..., sinks: Optional[T] = ..., bias: Optional[T] = ...,
             backend: str = ..., return_modifier_grads: bool = ...) -> Union[Tuple[T, T, T], Gradients]: ...
def forward_varlen(q: T, k: T, v: T, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int, *,
                   causal: bool = ..., softmax_scale: Optional[float] = ..., window: Tuple[int, int] = ...,
                   dropout_p: float = ..., seed: int = ..., offset: int = ..., block_mask: Any = ...,
                   block_size: Tuple[int, int] = ..., softcap: float = ..., alibi_slopes: Optional[T] = ...,
                   sinks: Optional[T] = ..., bias: Optional[T] = ..., backend: str = ...) -> Tuple[T, T]: ...
def backward_varlen(q: T, k: T, v: T, out: T, dout: T, lse: T, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                    max_seqlen_k: int, *, causal: bool = ..., softmax_scale: Optional[float] = ...,
                    window: Tuple[int, int] = ..., dropout_p: float = ..., seed: int = ..., offset: int = ...,
                    block_mask: Any = ..., block_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[T] = ..., sinks: Optional[T] = ..., bias: Optional[T] = ...,
                    backend: str = ..., return_modifier_grads: bool = ...) -> Union[Tuple[T, T, T], Gradients]: ...
# cache_seqlens: an int32 [batch] tensor on q's device, a sequence of ints, or one int.
def forward_kvcache(q: T, k_cache: T, v_cache: T, cache_seqlens: Union[int, Sequence[int], T], *, k: Optional[T] = ...,
                    v: Optional[T] = ..., block_table: Any = ..., causal: bool = ..., softmax_scale: Optional[float] = ...,
                    window: Tuple[int, int] = ..., softcap: float = ..., alibi_slopes: Optional[T] = ...,
                    sinks: Optional[T] = ..., bias: Optional[T] = ..., cu_seqlens_q: Any = ...,
                    max_seqlen_q: Optional[int] = ..., cu_seqlens_k_new: Any = ..., cache_batch_idx: Any = ...,
                    cache_leftpad: Any = ..., kv_split_tokens: int = ..., backend: str = ...) -> Tuple[T, T]: ...
def merge_partials(outs: Sequence[T], lses: Sequence[T], *, backend: str = ...) -> Tuple[T, T]: ...
def dropout_mask(seed: int, offset: int, p: float, heads_q: int, seqlen_q: int, seqlen_k: int, batch_index: int,
                 head_index: int) -> Any: ...  # numpy.ndarray of uint8, [seqlen_q, seqlen_k]
def tiling_for(sram_elements: int, head_dim: int) -> Tiling: ...
def backends() -> Dict[str, BackendStatus]: ...

# The PyTorch functions below need PyTorch (imported on first use). The flash_attn_*func ones return
# out, or (out, softmax_lse, None) when return_attn_probs.
def flash_attn_func(q: Any, k: Any, v: Any, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[Any] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *,
                    bias: Optional[Any] = ..., sinks: Optional[Any] = ..., block_mask: Optional[Any] = ...,
                    block_size: Tuple[int, int] = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                           causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                           alibi_slopes: Optional[Any] = ..., deterministic: bool = ..., return_attn_probs: bool = ...,
                           block_table: Optional[Any] = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
def flash_attn_qkvpacked_func(qkv: Any, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                              causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                              alibi_slopes: Optional[Any] = ..., deterministic: bool = ...,
                              return_attn_probs: bool = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
def flash_attn_kvpacked_func(q: Any, kv: Any, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                             causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                             alibi_slopes: Optional[Any] = ..., deterministic: bool = ...,
                             return_attn_probs: bool = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
def flash_attn_varlen_qkvpacked_func(qkv: Any, cu_seqlens: Any, max_seqlen: int, dropout_p: float = ...,
                                     softmax_scale: Optional[float] = ..., causal: bool = ...,
                                     window_size: Tuple[int, int] = ..., softcap: float = ...,
                                     alibi_slopes: Optional[Any] = ..., deterministic: bool = ...,
                                     return_attn_probs: bool = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
def flash_attn_varlen_kvpacked_func(q: Any, kv: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                                    max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                                    causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                                    alibi_slopes: Optional[Any] = ..., deterministic: bool = ...,
                                    return_attn_probs: bool = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
# Returns out, or (out, softmax_lse) when return_softmax_lse; k_cache and v_cache are appended to in place.
def flash_attn_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Optional[Any] = ..., v: Optional[Any] = ...,
                            rotary_cos: Optional[Any] = ..., rotary_sin: Optional[Any] = ...,
                            cache_seqlens: Optional[Union[int, Any]] = ..., cache_batch_idx: Optional[Any] = ...,
                            cache_leftpad: Optional[Any] = ..., block_table: Optional[Any] = ...,
                            softmax_scale: Optional[float] = ..., causal: bool = ...,
                            window_size: Tuple[int, int] = ..., softcap: float = ..., rotary_interleaved: bool = ...,
                            alibi_slopes: Optional[Any] = ..., num_splits: int = ...,
                            return_softmax_lse: bool = ..., *, cu_seqlens_q: Optional[Any] = ...,
                            max_seqlen_q: Optional[int] = ..., cu_seqlens_k_new: Optional[Any] = ...,
                            kv_split_tokens: Optional[int] = ..., k_scale: Optional[Any] = ...,
                            v_scale: Optional[Any] = ..., k_descale: Optional[Any] = ...,
                            v_descale: Optional[Any] = ...) -> Union[Any, Tuple[Any, Any]]: ...
# Returns (codes, scale): int8 codes with float32 scale x.shape[:-1], or float8 codes with float32 descale
# [heads_kv] ([batch, heads_kv] with per_batch).
def quantize_kv(x: Any, dtype: Any, *, per_batch: bool = ...) -> Tuple[Any, Any]: ...
# fa_kvcache_append: appends k, v to the caches in place (rotary, quantisation) without attention.
def kvcache_append(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Union[int, Sequence[int], Any], *,
                   block_table: Optional[Any] = ..., cache_batch_idx: Optional[Any] = ...,
                   cache_leftpad: Optional[Any] = ..., rotary_cos: Optional[Any] = ..., rotary_sin: Optional[Any] = ...,
                   rotary_interleaved: bool = ..., k_scale: Optional[Any] = ..., v_scale: Optional[Any] = ...,
                   k_descale: Optional[Any] = ..., v_descale: Optional[Any] = ...,
                   cu_seqlens_k_new: Optional[Any] = ...) -> None: ...
