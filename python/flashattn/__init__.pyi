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
def dropout_mask(seed: int, offset: int, p: float, heads_q: int, seqlen_q: int, seqlen_k: int, batch_index: int,
                 head_index: int) -> Any: ...  # numpy.ndarray of uint8, [seqlen_q, seqlen_k]
def tiling_for(sram_elements: int, head_dim: int) -> Tiling: ...
def backends() -> Dict[str, BackendStatus]: ...

# Needs PyTorch (imported on first use). Returns out, or (out, softmax_lse, None) when return_attn_probs.
def flash_attn_func(q: Any, k: Any, v: Any, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[Any] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *,
                    bias: Optional[Any] = ..., sinks: Optional[Any] = ...) -> Union[Any, Tuple[Any, Any, None]]: ...
