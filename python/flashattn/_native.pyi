# The C extension's raw interface; use the functions of the flashattn package instead.
from typing import Any, List, Optional, Sequence, Tuple

# varlen: None or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k): a packed batch, tensors
# [total_tokens, heads, head_dim] and lse [heads_q, total_q].
def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, want_lse: bool, softmax_scale: float, causal: bool,
            window_left: int, window_right: int, seqlens_k: Optional[Sequence[int]], dropout_p: float, seed: int,
            offset: int, block_mask: Any, block_q: int, block_k: int, softcap: float, alibi_slopes: Any, sinks: Any,
            bias: Any, varlen: Optional[Tuple[Any, Any, int, int]], backend: int,
            stream: Optional[int]) -> Tuple[Any, Any]: ...
# dsinks, dbias: None (not computed), True (allocated here) or a tensor to write into.
def backward(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, dq: Any, dk: Any, dv: Any, dsinks: Any,
             dbias: Any, softmax_scale: float, causal: bool, window_left: int, window_right: int,
             seqlens_k: Optional[Sequence[int]], dropout_p: float, seed: int, offset: int, block_mask: Any,
             block_q: int, block_k: int, softcap: float, alibi_slopes: Any, sinks: Any, bias: Any,
             varlen: Optional[Tuple[Any, Any, int, int]], backend: int,
             stream: Optional[int]) -> Tuple[Any, Any, Any, Any, Any]: ...
# k, v: None or the tokens to append; cache_seqlens: int32 tensor, sequence of ints or int;
# cache_batch_idx, cache_leftpad: None, an int32 tensor or a sequence of ints (cache_leftpad also an
# int); kv_split_tokens: the split-KV chunk size (0 = the library's rule). The options as forward's;
# varlen: None or ragged queries (cu_seqlens_q, cu_seqlens_k_new or None, max_seqlen_q, max_seqlen_k_new).
def forward_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any, v: Any, out: Any, lse: Any, want_lse: bool,
                    cache_seqlens: Any, block_table: Any, cache_batch_idx: Any, cache_leftpad: Any,
                    kv_split_tokens: int, kv_quant: Optional[Tuple[int, int, Any, Any, Any, Any]],
                    rotary: Optional[Tuple[Any, Any, bool]], softmax_scale: float, causal: bool, window_left: int,
                    window_right: int, seqlens_k: None, dropout_p: float, seed: int, offset: int, block_mask: None,
                    block_q: int, block_k: int, softcap: float, alibi_slopes: Any, sinks: Any, bias: Any,
                    varlen: Optional[Tuple[Any, Any, int, int]], backend: int,
                    stream: Optional[int]) -> Tuple[Any, Any]: ...
# kv_quant: None or (k_dtype, v_dtype, k_scale, v_scale, k_descale, v_descale): the caches' fa_dtype codes
# (-1: the tensor's own; 3 int8, 4 float8_e4m3fn, 5 float8_e5m2, given as that dtype or its uint8 bytes) and
# fa_kv_scales' float32 tensors or None. rotary: None or (cos, sin, interleaved), float32 [max_position,
# rotary_dim / 2]. fa_kvcache_append: k, v [batch, seqlen_new, heads_kv, head_dim], or packed by
# cu_seqlens_k_new.
def kvcache_append(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any,
                   cache_batch_idx: Any, cache_leftpad: Any, cu_seqlens_k_new: Any,
                   kv_quant: Optional[Tuple[int, int, Any, Any, Any, Any]], rotary: Optional[Tuple[Any, Any, bool]],
                   backend: int, stream: Optional[int]) -> None: ...
def merge_partials(outs: Sequence[Any], lses: Sequence[Any], out: Any, lse_out: Any, want_lse: bool, backend: int,
                   stream: Optional[int]) -> Tuple[Any, Any]: ...
def dropout_mask(seed: int, offset: int, p: float, heads_q: int, seqlen_q: int, seqlen_k: int, batch_index: int,
                 head_index: int) -> Any: ...
def tiling_for(sram_elements: int, head_dim: int) -> Tuple[int, int]: ...
# fa_backend_name(n) for n = 0, 1, ... up to the first "unknown": the index is the fa_backend value.
def backend_names() -> Tuple[str, ...]: ...
def backends() -> List[Tuple[str, bool, str]]: ...
def version() -> str: ...
