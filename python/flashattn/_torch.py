"""PyTorch drop-ins for FlashAttention-2's functions (flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache and the packed forms): torch.library custom ops (flashattn::forward,
flashattn::backward, flashattn::forward_kvcache, flashattn::merge_partials) with autograd and
fake (meta) implementations, so eager mode, autograd, torch.compile and gradcheck all work.
Outputs are allocated by torch (its caching allocator on GPUs) and written in place by the C
library on torch's current stream."""

import operator
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _native
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._dlpack import torch_stream
from ._errors import InvalidTypeError, InvalidValueError, NotSupportedError


def _capsule(t: Optional[Tensor]):
    # to_dlpack shares memory and strides and, unlike Tensor.__dlpack__, accepts tensors that
    # require grad (custom op implementations see the autograd-tracked tensors).
    return None if t is None else torch.utils.dlpack.to_dlpack(t)


# The fa_dtype codes of a quantised cache's element types (flashattn.h: FA_DTYPE_I8, FA_DTYPE_FP8_E4M3,
# FA_DTYPE_FP8_E5M2), passed to the binding with the cache tensors.
_FP8_CODES = {torch.float8_e4m3fn: 4, torch.float8_e5m2: 5}
_QUANT_CODES = {torch.int8: 3, **_FP8_CODES}
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _float8_dlpack() -> bool:
    """Whether this torch exports float8 tensors through DLPack (DLPack 1.1's float8 codes, torch >= 2.6);
    where it does not, a float8 cache goes as its uint8 bytes with the dtype code beside it."""
    try:
        torch.utils.dlpack.to_dlpack(torch.empty(1, dtype=torch.float8_e4m3fn))
        return True
    except Exception:  # BufferError, RuntimeError, TypeError: whatever this torch raises for an unknown dtype
        return False


_FLOAT8_DLPACK = _float8_dlpack()


def _cache_capsule(t: Tensor):
    if t.dtype in _FP8_CODES and not _FLOAT8_DLPACK:
        t = t.view(torch.uint8)
    return _capsule(t)


def _kv_quant(k_cache, v_cache, k_scale, v_scale, k_descale, v_descale):
    """_native's kv_quant argument: None for an unquantised cache without scales, else (k dtype code, v
    dtype code, k_scale, v_scale, k_descale, v_descale) with -1 for a cache that is not quantised."""
    if (k_cache.dtype not in _QUANT_CODES and v_cache.dtype not in _QUANT_CODES and k_scale is None
            and v_scale is None and k_descale is None and v_descale is None):
        return None
    return (_QUANT_CODES.get(k_cache.dtype, -1), _QUANT_CODES.get(v_cache.dtype, -1), _capsule(k_scale),
            _capsule(v_scale), _capsule(k_descale), _capsule(v_descale))


def _rotary(rotary_cos, rotary_sin, rotary_interleaved):
    return None if rotary_cos is None else (_capsule(rotary_cos), _capsule(rotary_sin), bool(rotary_interleaved))


def _options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap, bias, alibi_slopes,
             sinks, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, block_mask=None, block_q=1,
             block_k=1):
    """The option arguments of _native.forward/backward/forward_kvcache, in order."""
    varlen = None
    if cu_seqlens_q is not None:
        varlen = (_capsule(cu_seqlens_q), _capsule(cu_seqlens_k), max_seqlen_q, max_seqlen_k)
    return (softmax_scale, causal, window_left, window_right, None, dropout_p, seed, offset, _capsule(block_mask),
            block_q, block_k, softcap, _capsule(alibi_slopes), _capsule(sinks), _capsule(bias), varlen)


def _lse_shape(q: Tensor, packed: bool):
    # [batch, heads_q, seqlen_q], or FlashAttention-2's [heads_q, total_q] for a packed batch.
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


# One op for the padded [batch, seqlen, heads, head_dim] layout and the packed (varlen) one: the
# packed layout is selected by cu_seqlens_q (then q, k, v are [total_tokens, heads, head_dim]).
@torch.library.custom_op("flashattn::forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float, causal: bool,
             window_left: int, window_right: int, seed: int, offset: int, softcap: float, bias: Optional[Tensor],
             alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
             cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, block_mask: Optional[Tensor],
             block_q: int, block_k: int) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32, device=q.device)
    _native.forward(_capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), True,
                    *_options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap,
                              bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              block_mask, block_q, block_k),
                    0, torch_stream(q))
    return out, lse


@_forward.register_fake
def _forward_fake(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap, bias,
                  alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_mask, block_q,
                  block_k):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)


def _modifier_grads_like(sinks, bias, want_dbias, make):
    """dsinks ([heads_q] float32, or an empty placeholder without sinks) and dbias (the bias's
    shape and dtype when wanted, else an empty placeholder): custom ops return tensors only."""
    dsinks = make(sinks.shape, sinks.dtype) if sinks is not None else make((0,), torch.float32)
    dbias = make(bias.shape, bias.dtype) if want_dbias else make((0,), torch.float32)
    return dsinks, dbias


@torch.library.custom_op("flashattn::backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dropout_p: float,
              softmax_scale: float, causal: bool, window_left: int, window_right: int, seed: int,
              offset: int, softcap: float, bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
              sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              max_seqlen_q: int, max_seqlen_k: int, block_mask: Optional[Tensor], block_q: int, block_k: int,
              want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    want_dbias = want_dbias and bias is not None
    dsinks, dbias = _modifier_grads_like(sinks, bias, want_dbias,
                                         lambda shape, dtype: torch.empty(shape, dtype=dtype, device=q.device))
    _native.backward(_capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(dout), _capsule(lse),
                     _capsule(dq), _capsule(dk), _capsule(dv), _capsule(dsinks) if sinks is not None else None,
                     _capsule(dbias) if want_dbias else None,
                     *_options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap,
                               bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               block_mask, block_q, block_k),
                     0, torch_stream(q))
    return dq, dk, dv, dsinks, dbias


@_backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, dropout_p, softmax_scale, causal, window_left, window_right, seed,
                   offset, softcap, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   block_mask, block_q, block_k, want_dbias):
    dsinks, dbias = _modifier_grads_like(sinks, bias, want_dbias and bias is not None,
                                         lambda shape, dtype: q.new_empty(shape, dtype=dtype))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks, dbias


# The forward op's arguments after q, k, v: the scalar options (up to bias), then these tensors and
# the packed-batch and block-mask arguments. Autograd returns one gradient per argument.
_N_FORWARD_ARGS = 21
_BIAS, _SINKS = 11, 13


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k = inputs[_BIAS:_BIAS + 5]
    max_seqlen_q, max_seqlen_k, block_mask, block_q, block_k = inputs[_BIAS + 5:]
    ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, block_mask)
    ctx.scalars = inputs[3:_BIAS]
    ctx.sizes = (max_seqlen_q, max_seqlen_k, block_q, block_k)
    ctx.mark_non_differentiable(lse)


def _readable(t: Tensor) -> Tensor:
    """t itself when the C API can read it in place; a contiguous copy for broadcast (stride 0)
    or non-unit head_dim strides, which autograd produces for gradients like that of sum()."""
    if t.is_contiguous():
        return t
    if t.dim() >= 3 and t.size(-1) > 1 and t.stride(-1) != 1:
        return t.contiguous()
    if any(stride <= 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
        return t.contiguous()
    return t


def _autograd_backward(ctx, dout, _dlse):
    q, k, v, out, lse, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, block_mask = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, block_q, block_k = ctx.sizes
    want_dbias = bool(ctx.needs_input_grad[_BIAS])
    dq, dk, dv, dsinks, dbias = _backward(_readable(dout), q, k, v, out, lse, *ctx.scalars, bias, alibi_slopes, sinks,
                                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_mask, block_q,
                                          block_k, want_dbias)
    grads = [dq, dk, dv] + [None] * (_N_FORWARD_ARGS - 3)
    grads[_BIAS] = dbias if want_dbias else None
    grads[_SINKS] = dsinks if sinks is not None and ctx.needs_input_grad[_SINKS] else None
    return tuple(grads)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _readable_bias(bias: Tensor) -> Tensor:
    """The bias as the C API can read it: a key axis of stride 1, and, when it needs a gradient,
    no expanded (stride-0, size > 1) axis, because its gradient is per element; size-1 axes and
    missing leading axes broadcast without a copy (their gradient is summed)."""
    if bias.dim() and bias.size(-1) > 1 and bias.stride(-1) != 1:
        return bias.contiguous()
    if bias.requires_grad and any(stride == 0 and size > 1 for stride, size in zip(bias.stride(), bias.shape)):
        return bias.contiguous()
    return bias


def _scale_for(q: Tensor, softmax_scale):
    if softmax_scale is None:
        return q.shape[-1] ** -0.5
    if softmax_scale == 0:
        raise InvalidValueError("softmax_scale: 0 is not a usable scale (None means 1/sqrt(head_dim))", 1)
    return float(softmax_scale)


def _dropout_seed(dropout_p) -> int:
    # Drawn from torch's default generator, so torch.manual_seed makes runs repeatable.
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item()) if dropout_p > 0 else 0


def _prepared_modifiers(alibi_slopes, sinks, bias):
    if bias is not None:
        bias = _readable_bias(bias)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.detach().to(torch.float32).contiguous()
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    return alibi_slopes, sinks, bias


def _host_block_mask(block_mask, block_size):
    """(mask, block_q, block_k): the block mask as a host uint8/bool tensor (it stays in host
    memory whatever q's device: the C API reads it on the host)."""
    if block_mask is None:
        return None, 1, 1
    try:
        block_q, block_k = (int(x) for x in block_size)
    except (TypeError, ValueError):
        raise InvalidValueError("block_size: %r is not a pair of ints" % (block_size,), 1) from None
    if not isinstance(block_mask, Tensor):
        block_mask = torch.as_tensor(block_mask)
    if block_mask.dtype not in (torch.uint8, torch.bool):
        raise InvalidTypeError("block_mask: dtype %s is not supported (uint8 or bool)" % block_mask.dtype, 1)
    return block_mask.detach().to("cpu").contiguous(), block_q, block_k


def _check_packed_offsets(cu_seqlens_q, cu_seqlens_k):
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, Tensor):
            raise InvalidTypeError("%s: must be an int32 tensor (got %s)" % (name, type(t).__name__), 1)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, bias=None, sinks=None,
                    block_mask=None, block_size=(128, 128)):
    """FlashAttention-2's flash_attn_func on flashattn, for CPU, CUDA and ROCm tensors.

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim]
    (heads_kv divides heads_q), float32, float16 or bfloat16. softmax_scale: None = 1/sqrt(head_dim).
    causal: bottom-right aligned when seqlen_q != seqlen_k. window_size: (left, right), -1 =
    unbounded. Returns out [batch, seqlen_q, heads_q, head_dim], or (out, softmax_lse, None) when
    return_attn_probs (softmax_lse float32 [batch, heads_q, seqlen_q]; attention probabilities
    are never materialised, hence None).

    Score modifiers, in this order on s = softmax_scale * q.k (README "Score modifiers"):
    softcap > 0: s = softcap * tanh(s / softcap) (Gemma 2). alibi_slopes: [heads_q] or
    [batch, heads_q] (cast to float32; not differentiable): s -= slope * |i + seqlen_k - seqlen_q
    - j|. bias (keyword): float32/float16/bfloat16, broadcastable to [batch, heads_q, seqlen_q,
    seqlen_k] with the key axis whole; s += bias; differentiable, its gradient summed over the
    broadcast axes (size-1 axes are read without a copy; an expanded, stride-0 bias that requires
    grad, or one whose last dimension is not contiguous, is copied first). sinks (keyword):
    [heads_q] logits (cast to float32; differentiable): each row's softmax denominator gains
    exp(sink). Masked keys stay masked.

    block_mask (keyword): block-sparse attention (the paper's Algorithm 5): a uint8/bool
    [ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)] matrix, nonzero = the block attends,
    with block_size = (block_q, block_k) tokens per block (any positive sizes); combined with
    causal and window. It is read in host memory (copied there if it lives on a GPU).

    Dropout: when dropout_p > 0 a seed is drawn from torch's default generator, so
    torch.manual_seed makes runs repeatable; the backward regenerates the same mask. Under
    torch.compile the draw comes from inductor's generator: repeatable, but not eager's seed.
    deterministic: accepted for compatibility; the backward is always deterministic.
    Inputs are read in place with their strides; one whose last dimension is not contiguous is
    copied first (as FlashAttention-2 does). Differentiable in q, k, v, bias and sinks.
    """
    window_left, window_right = window_size
    alibi_slopes, sinks, bias = _prepared_modifiers(alibi_slopes, sinks, bias)
    block_mask, block_q, block_k = _host_block_mask(block_mask, block_size)
    out, lse = _forward(_readable(q), _readable(k), _readable(v), float(dropout_p), _scale_for(q, softmax_scale),
                        bool(causal), int(window_left), int(window_right), _dropout_seed(dropout_p), 0, float(softcap),
                        bias, alibi_slopes, sinks, None, None, 0, 0, block_mask, block_q, block_k)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """FlashAttention-2's flash_attn_varlen_func: attention over a packed batch of sequences of
    different lengths (padding-free training), with autograd in q, k and v.

    q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim], the sequences one after
    another. cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] tensors on q's device, the offsets of
    each sequence (first 0, non-decreasing; a sequence may be empty). max_seqlen_q, max_seqlen_k:
    ints bounding the lengths. Returns out [total_q, heads_q, head_dim], or (out, softmax_lse,
    None) with return_attn_probs (softmax_lse float32 [heads_q, total_q]).

    Causal and window_size align bottom-right within each sequence. softcap, alibi_slopes
    ([heads_q] or [batch, heads_q]) and dropout as in flash_attn_func; dropout draws the padded
    layout's elements, so flashattn.dropout_mask(seed, 0, p, heads_q, max_seqlen_q, max_seqlen_k,
    b, h) is sequence b's mask. deterministic: accepted; the backward is always deterministic.
    block_table (paged keys/values) raises NotImplementedError: use flash_attn_with_kvcache.
    The offsets are read on the device (no host synchronisation); on a GPU, offsets that break
    the rules make the call write nothing and the next synchronising flashattn call raise.
    """
    if block_table is not None:
        raise NotSupportedError("block_table: paged keys and values in flash_attn_varlen_func are not supported; "
                                "decode over a paged cache with flash_attn_with_kvcache", 2)
    _check_packed_offsets(cu_seqlens_q, cu_seqlens_k)
    window_left, window_right = window_size
    alibi_slopes, _, _ = _prepared_modifiers(alibi_slopes, None, None)
    out, lse = _forward(_readable(q), _readable(k), _readable(v), float(dropout_p), _scale_for(q, softmax_scale),
                        bool(causal), int(window_left), int(window_right), _dropout_seed(dropout_p), 0, float(softcap),
                        None, alibi_slopes, None, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                        None, 1, 1)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with q, k, v stacked: qkv [batch, seqlen, 3, heads, head_dim], read in place
    (views, no copy). The gradient flows into qkv."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with k, v stacked: kv [batch, seqlen_k, 2, heads_kv, head_dim], read in place."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with q, k, v stacked: qkv [total, 3, heads, head_dim], one set of offsets."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with k, v stacked: kv [total_k, 2, heads_kv, head_dim]."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


# ---- KV cache ---------------------------------------------------------------------------------
def _runs_eagerly(*tensors) -> bool:
    """True when calling an op's body directly does what the dispatcher would: plain tensors, no
    tracing (torch.compile, jit), no dispatch or function modes (fake tensors, profilers' modes),
    no functorch transforms, nothing that needs autograd. Decode steps take this path: the custom
    op's dispatch costs tens of microseconds per call, more than the rest of the call's Python."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or _get_current_dispatch_mode() is not None
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or (grad and t.requires_grad)):
            return False
    return True


def _forward_kvcache_body(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                          cache_seqlens: Optional[Tensor], cache_seqlens_int: int, block_table: Optional[Tensor],
                          softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
                          alibi_slopes: Optional[Tensor], want_lse: bool, cu_seqlens_q: Optional[Tensor] = None,
                          cu_seqlens_k_new: Optional[Tensor] = None, max_seqlen_q: int = 0, max_seqlen_k_new: int = 0,
                          cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                          kv_split_tokens: int = 0, k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None,
                          k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                          rotary_cos: Optional[Tensor] = None, rotary_sin: Optional[Tensor] = None,
                          rotary_interleaved: bool = False) -> Tuple[Tensor, Tensor]:
    # The arguments from cu_seqlens_q on default to a plain call: calls of the op written before they
    # existed still work.
    packed = cu_seqlens_q is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, packed) if want_lse else (0,), dtype=torch.float32, device=q.device)
    _native.forward_kvcache(_capsule(q), _cache_capsule(k_cache), _cache_capsule(v_cache), _capsule(k), _capsule(v),
                            _capsule(out), _capsule(lse) if want_lse else None, False,
                            _capsule(cache_seqlens) if cache_seqlens is not None else cache_seqlens_int,
                            _capsule(block_table), _capsule(cache_batch_idx), _capsule(cache_leftpad), kv_split_tokens,
                            _kv_quant(k_cache, v_cache, k_scale, v_scale, k_descale, v_descale),
                            _rotary(rotary_cos, rotary_sin, rotary_interleaved),
                            *_kvcache_options(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                                              cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, max_seqlen_k_new),
                            0, torch_stream(q))
    return out, lse


def _kvcache_options(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, cu_seqlens_q,
                     cu_seqlens_k_new, max_seqlen_q, max_seqlen_k_new):
    """_native.forward_kvcache's options: those of _options, with the ragged-query offsets (the new
    tokens' may be None: packed like q)."""
    options = _options(0.0, softmax_scale, causal, window_left, window_right, 0, 0, softcap, None, alibi_slopes, None)
    if cu_seqlens_q is None:
        return options
    return options[:-1] + ((_capsule(cu_seqlens_q), _capsule(cu_seqlens_k_new), max_seqlen_q, max_seqlen_k_new),)


_forward_kvcache = torch.library.custom_op("flashattn::forward_kvcache", _forward_kvcache_body,
                                           mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))


@_forward_kvcache.register_fake
def _forward_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlens_int, block_table, softmax_scale,
                          causal, window_left, window_right, softcap, alibi_slopes, want_lse, cu_seqlens_q=None,
                          cu_seqlens_k_new=None, max_seqlen_q=0, max_seqlen_k_new=0, cache_batch_idx=None,
                          cache_leftpad=None, kv_split_tokens=0, k_scale=None, v_scale=None, k_descale=None,
                          v_descale=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    lse_shape = _lse_shape(q, cu_seqlens_q is not None) if want_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


def _rotary_tables(rotary_cos, rotary_sin):
    """rotary_cos and rotary_sin as the C API reads them: float32, contiguous (FlashAttention-2 allows
    them in q's dtype); both or neither."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise InvalidValueError("%s: is None; give rotary_cos and rotary_sin together"
                                % ("rotary_cos" if rotary_cos is None else "rotary_sin"), 1)
    if rotary_cos is None:
        return None, None
    tables = []
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise InvalidTypeError("%s: must be a float tensor [max_position, rotary_dim / 2] (got %s)"
                                   % (name, t.dtype if isinstance(t, Tensor) else type(t).__name__), 1)
        if t.dim() != 2:
            raise InvalidValueError("%s: has shape %s, expected 2 dimensions [max_position, rotary_dim / 2]"
                                    % (name, list(t.shape)), 1)
        tables.append(t.detach().to(torch.float32).contiguous())
    if tables[0].shape != tables[1].shape:
        raise InvalidValueError("rotary_sin: has shape %s, rotary_cos %s; they must match"
                                % (list(tables[1].shape), list(tables[0].shape)), 1)
    return tables[0], tables[1]


def _descale(t, name):
    """An FP8 descale (FlashAttention-3's k_descale / v_descale) as float32, contiguous; None = 1."""
    if t is None:
        return None
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise InvalidTypeError("%s: must be a float32 tensor [batch, heads_kv] (got %s)"
                               % (name, t.dtype if isinstance(t, Tensor) else type(t).__name__), 1)
    return t.detach().to(torch.float32).contiguous()


def _int32_table(table, name, device):
    """A per-sequence table given as a list or tuple of ints: an int32 tensor on q's device."""
    if table is None or isinstance(table, Tensor):
        return table
    if isinstance(table, (list, tuple)):
        return torch.tensor(table, dtype=torch.int32, device=device)
    raise InvalidTypeError("%s: %s is not an int32 tensor or a sequence of ints" % (name, type(table).__name__), 1)


def _split_tokens(num_splits, kv_split_tokens, capacity):
    """desc->kv_split_tokens from FlashAttention's num_splits (0: the library's rule; 1: no split, one
    chunk of the whole capacity; n > 1: chunks of ceil(capacity / n) keys) or kv_split_tokens, which
    takes precedence; both given must agree."""
    num_splits = operator.index(num_splits)
    if num_splits < 0:
        raise InvalidValueError("num_splits: %d is negative (0 = the library's split)" % num_splits, 1)
    from_splits = 0 if num_splits == 0 else -(-capacity // num_splits)
    if kv_split_tokens is None:
        return from_splits
    kv_split_tokens = operator.index(kv_split_tokens)
    if kv_split_tokens < 0:
        raise InvalidValueError("kv_split_tokens: %d is negative (0 = the library's split)" % kv_split_tokens, 1)
    if num_splits != 0 and kv_split_tokens != from_splits:
        raise InvalidValueError("kv_split_tokens: %d conflicts with num_splits=%d (chunks of %d keys of a %d-key "
                                "cache); give one of them" % (kv_split_tokens, num_splits, from_splits, capacity), 1)
    return kv_split_tokens


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *, cu_seqlens_q=None,
                            max_seqlen_q=None, cu_seqlens_k_new=None, kv_split_tokens=None, k_scale=None,
                            v_scale=None, k_descale=None, v_descale=None):
    """FlashAttention-2's flash_attn_with_kvcache (with FlashAttention-3's ragged queries): decode
    (or prefill a chunk) against a KV cache, appending the new keys and values to it in place first.

    q: [batch, seqlen_q, heads_q, head_dim]. k_cache, v_cache: [batch, capacity, heads_kv,
    head_dim], or paged [num_pages, page_size, heads_kv, head_dim] (any page_size >= 1) with
    block_table int32 [batch, max_pages_per_seq]. cache_seqlens: the tokens already cached per
    sequence: an int32 [batch] tensor, an int or a list of ints (None: every cache is full,
    capacity tokens; then k and v must be None). k, v: None or [batch, seqlen_new, heads_kv, head_dim], written into
    k_cache/v_cache at cache_seqlens[b] .. + seqlen_new - 1 (the op mutates k_cache and v_cache;
    cache_seqlens is not advanced). q then attends to the first cache_seqlens[b] + seqlen_new
    keys; causal is bottom-right aligned. softcap, alibi_slopes and window_size as in
    flash_attn_func. Returns out [batch, seqlen_q, heads_q, head_dim], or (out, softmax_lse)
    with return_softmax_lse (float32 [batch, heads_q, seqlen_q]; merge partial results with
    flashattn.merge_partials).

    cache_batch_idx: int32 [batch] (tensor or list): sequence b reads and appends row
    cache_batch_idx[b] of k_cache/v_cache, which may have any number of rows (sequences that
    append need distinct rows). cache_leftpad: int32 [batch] (tensor or list): sequence b ignores
    the first cache_leftpad[b] positions of its row (at most cache_seqlens[b]); its keys are
    positions cache_leftpad[b] .. cache_seqlens[b] + seqlen_new - 1, and causal, window and ALiBi
    count from cache_leftpad[b]. Both for contiguous caches only (with block_table they raise
    NotImplementedError).

    Ragged queries (keywords, FlashAttention-3's names): cu_seqlens_q, int32 [batch + 1] offsets
    on q's device, packs q [total_q, heads_q, head_dim]: sequence b's queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] (0 rows allowed), each aligned at the end of its own keys.
    max_seqlen_q bounds their lengths (None: total_q). k and v are then packed [total_new,
    heads_kv, head_dim] by cu_seqlens_k_new (int32 [batch + 1]), or by cu_seqlens_q when it is
    None. Returns out [total_q, heads_q, head_dim] and softmax_lse float32 [heads_q, total_q];
    cache_seqlens, block_table, cache_batch_idx and cache_leftpad have one row per sequence.

    num_splits: FlashAttention's split-KV count, as a key-chunk size: 0 = the library's rule
    (1024 keys, more for very long sequences, from each sequence's own length); 1 = no split (one
    chunk of the whole capacity); n > 1 = chunks of ceil(capacity / n) keys, so a full cache is
    split into n chunks and shorter sequences into fewer (capacity = k_cache.shape[1], times
    block_table.shape[1] when paged). kv_split_tokens (keyword): the chunk size itself (0 = the
    library's rule); it takes precedence over num_splits, and the two given together must agree
    (else ValueError). Partial results are merged by lse in a fixed order: results are
    bit-identical across runs and a sequence's result does not depend on the rest of the batch;
    another chunk size may change the last bits.

    Quantised caches (CPU; GPU backends raise NotImplementedError): k_cache and v_cache may each be
    torch.int8, torch.float8_e4m3fn or torch.float8_e5m2 (k int8 with v float8 is fine); q, k and v
    stay float32/float16/bfloat16. New tokens are quantised as they are appended and attention is
    the attention over the dequantised cache. int8: k_scale / v_scale (keywords, required) float32
    shaped like the cache without its last dimension ([batch, capacity, heads_kv], or [num_pages,
    page_size, heads_kv] when paged), contiguous: value = code * scale per (token, kv head);
    appended tokens' scales are written in place like the cache (scale = max|x| / 127, codes
    round-to-even clamped to +-127; a row with NaN/inf gets scale NaN and codes 0).
    float8: k_descale / v_descale (keywords, FlashAttention-3's) float32 [batch, heads_kv], finite and
    positive, None = 1: value = float(code) * descale; an appended x is stored as the saturating
    round-to-even conversion of x / descale (NaN -> 0x7F). Scales for a cache of another dtype
    raise ValueError naming them. flashattn.quantize_kv quantises a prefill by the same rules.

    rotary_cos, rotary_sin: [max_position, rotary_dim / 2] (any float dtype; used as float32,
    rotary_dim = 2 * rotary_cos.shape[1] <= head_dim, even): the new keys are rotated before they
    are stored (and quantised) and q is rotated, as FlashAttention-2 does. rotary_interleaved: True =
    GPT-J pairs (x[2f], x[2f + 1]), False = GPT-NeoX halves (x[f], x[f + rotary_dim / 2]). New token
    t of sequence b is at position cache_seqlens[b] - cache_leftpad[b] + t; query i is at
    cache_seqlens[b] - cache_leftpad[b] + i when causal or a window is set, else every query is at
    cache_seqlens[b] - cache_leftpad[b] (FlashAttention-2's rule). A position at or past max_position raises
    ValueError.

    Nothing is written on failure (a bad page index, slot or left padding, or a cache too small,
    raises and leaves the caches byte-identical; on a GPU the check runs on the device and the
    next synchronising flashattn call raises).
    """
    rotary_cos, rotary_sin = _rotary_tables(rotary_cos, rotary_sin)
    k_descale, v_descale = _descale(k_descale, "k_descale"), _descale(v_descale, "v_descale")
    if (k is None) != (v is None):
        raise InvalidValueError("%s: is None; give k and v together" % ("k" if k is None else "v"), 1)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    split_tokens = _split_tokens(num_splits, kv_split_tokens, capacity)
    if cu_seqlens_q is not None:
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k_new", cu_seqlens_k_new)):
            if t is not None and not isinstance(t, Tensor):
                raise InvalidTypeError("%s: must be an int32 tensor (got %s)" % (name, type(t).__name__), 1)
        if cu_seqlens_k_new is not None:
            if k is None:
                raise InvalidValueError("cu_seqlens_k_new: packs k and v, which are None (leave it None)", 1)
        batch = cu_seqlens_q.shape[0] - 1
        max_seqlen_q = q.shape[0] if max_seqlen_q is None else int(max_seqlen_q)
        max_seqlen_k_new = k.shape[0] if cu_seqlens_k_new is not None else 0  # no sequence appends more
    else:
        if cu_seqlens_k_new is not None:
            raise InvalidValueError("cu_seqlens_k_new: needs cu_seqlens_q (new tokens are packed only with ragged "
                                    "queries)", 1)
        batch, max_seqlen_q, max_seqlen_k_new = q.shape[0], 0, 0
    cache_seqlens_int = 0
    if cache_seqlens is None:
        if k is not None:
            raise InvalidValueError("cache_seqlens: is None, but appending k and v needs the cached lengths", 1)
        cache_seqlens_int = int(capacity)
    elif isinstance(cache_seqlens, (list, tuple)):
        cache_seqlens = torch.tensor(cache_seqlens, dtype=torch.int32, device=q.device)
    elif not isinstance(cache_seqlens, Tensor):
        try:
            cache_seqlens_int = operator.index(cache_seqlens)
        except TypeError:
            raise InvalidTypeError("cache_seqlens: %s is not an int, a sequence of ints or an int32 tensor"
                                   % type(cache_seqlens).__name__, 1) from None
        cache_seqlens = None
    if cache_seqlens is None and q.device.type != "cpu":
        # A device tensor filled on the stream: the binding would otherwise copy the int to the
        # device and synchronise.
        cache_seqlens = torch.full((batch,), cache_seqlens_int, dtype=torch.int32, device=q.device)
    cache_batch_idx = _int32_table(cache_batch_idx, "cache_batch_idx", q.device)
    cache_leftpad = _int32_table(cache_leftpad, "cache_leftpad", q.device)
    window_left, window_right = window_size
    alibi_slopes, _, _ = _prepared_modifiers(alibi_slopes, None, None)
    if k is not None:
        k, v = _readable(k), _readable(v)
    args = (_readable(q), k_cache, v_cache, k, v, cache_seqlens, cache_seqlens_int, block_table,
            _scale_for(q, softmax_scale), bool(causal), int(window_left), int(window_right), float(softcap), alibi_slopes,
            bool(return_softmax_lse), cu_seqlens_q, cu_seqlens_k_new, int(max_seqlen_q), int(max_seqlen_k_new),
            cache_batch_idx, cache_leftpad, int(split_tokens), k_scale, v_scale, k_descale, v_descale, rotary_cos,
            rotary_sin, bool(rotary_interleaved))
    if _runs_eagerly(q, k_cache, v_cache, k, v, cache_seqlens, block_table, alibi_slopes, cu_seqlens_q,
                     cu_seqlens_k_new, cache_batch_idx, cache_leftpad, k_scale, v_scale, k_descale, v_descale,
                     rotary_cos, rotary_sin):
        out, lse = _forward_kvcache_body(*args)
        if k is not None:
            # as the op's in-place write would
            torch.autograd.graph.increment_version(tuple(t for t in (k_cache, v_cache, k_scale, v_scale)
                                                         if t is not None))
    else:
        out, lse = _forward_kvcache(*args)
    return (out, lse) if return_softmax_lse else out


def _cache_lengths(cache_seqlens, batch, capacity, device):
    """(tensor or None, int): cache_seqlens as flash_attn_with_kvcache takes it (an int32 tensor, a list
    of ints or an int) in the op's two arguments."""
    if isinstance(cache_seqlens, (list, tuple)):
        return torch.tensor(cache_seqlens, dtype=torch.int32, device=device), 0
    if isinstance(cache_seqlens, Tensor):
        return cache_seqlens, 0
    try:
        n = operator.index(cache_seqlens)
    except TypeError:
        raise InvalidTypeError("cache_seqlens: %s is not an int, a sequence of ints or an int32 tensor"
                               % type(cache_seqlens).__name__, 1) from None
    if device.type != "cpu":
        return torch.full((batch,), n, dtype=torch.int32, device=device), 0
    return None, n


def _kvcache_append_body(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: Optional[Tensor],
                         cache_seqlens_int: int, block_table: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                         cache_leftpad: Optional[Tensor], cu_seqlens_k_new: Optional[Tensor],
                         k_scale: Optional[Tensor], v_scale: Optional[Tensor], k_descale: Optional[Tensor],
                         v_descale: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                         rotary_interleaved: bool) -> None:
    _native.kvcache_append(_cache_capsule(k_cache), _cache_capsule(v_cache), _capsule(k), _capsule(v),
                           _capsule(cache_seqlens) if cache_seqlens is not None else cache_seqlens_int,
                           _capsule(block_table), _capsule(cache_batch_idx), _capsule(cache_leftpad),
                           _capsule(cu_seqlens_k_new), _kv_quant(k_cache, v_cache, k_scale, v_scale, k_descale, v_descale),
                           _rotary(rotary_cos, rotary_sin, rotary_interleaved), 0, torch_stream(k))


_kvcache_append = torch.library.custom_op("flashattn::kvcache_append", _kvcache_append_body,
                                          mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))


@_kvcache_append.register_fake
def _kvcache_append_fake(k_cache, v_cache, k, v, cache_seqlens, cache_seqlens_int, block_table, cache_batch_idx,
                         cache_leftpad, cu_seqlens_k_new, k_scale, v_scale, k_descale, v_descale, rotary_cos,
                         rotary_sin, rotary_interleaved):
    return None


def kvcache_append(k_cache, v_cache, k, v, cache_seqlens, *, block_table=None, cache_batch_idx=None,
                   cache_leftpad=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True, k_scale=None,
                   v_scale=None, k_descale=None, v_descale=None, cu_seqlens_k_new=None):
    """fa_kvcache_append: write k and v into the caches in place at cache_seqlens[b] .. + seqlen_new - 1
    exactly as flash_attn_with_kvcache appends (rotary on the keys, quantisation for an int8/float8
    cache, block_table, cache_batch_idx, cache_leftpad), without attention: for a prefill computed
    elsewhere. k, v: [batch, seqlen_new, heads_kv, head_dim] float32/float16/bfloat16 (the cache's
    dtype when it is not quantised), or packed [total_new, heads_kv, head_dim] by cu_seqlens_k_new
    (int32 [batch + 1]). cache_seqlens: an int32 [batch] tensor, a list of ints or an int; it is not
    advanced. Keywords as flash_attn_with_kvcache's (k_scale / v_scale are written in place for int8
    caches). Returns None; nothing is written on failure. Runs as the op flashattn::kvcache_append.
    """
    if cu_seqlens_k_new is not None and not isinstance(cu_seqlens_k_new, Tensor):
        raise InvalidTypeError("cu_seqlens_k_new: must be an int32 tensor (got %s)" % type(cu_seqlens_k_new).__name__,
                               1)
    batch = cu_seqlens_k_new.shape[0] - 1 if cu_seqlens_k_new is not None else k.shape[0]
    seqlens, seqlens_int = _cache_lengths(cache_seqlens, batch, 0, k.device)
    rotary_cos, rotary_sin = _rotary_tables(rotary_cos, rotary_sin)
    k_descale, v_descale = _descale(k_descale, "k_descale"), _descale(v_descale, "v_descale")
    args = (k_cache, v_cache, _readable(k), _readable(v), seqlens, seqlens_int, block_table,
            _int32_table(cache_batch_idx, "cache_batch_idx", k.device),
            _int32_table(cache_leftpad, "cache_leftpad", k.device), cu_seqlens_k_new, k_scale, v_scale, k_descale,
            v_descale, rotary_cos, rotary_sin, bool(rotary_interleaved))
    if _runs_eagerly(*(a for a in args if isinstance(a, Tensor))):
        _kvcache_append_body(*args)
        torch.autograd.graph.increment_version(tuple(t for t in (k_cache, v_cache, k_scale, v_scale) if t is not None))
    else:
        _kvcache_append(*args)


def quantize_kv(x, dtype, *, per_batch=False):
    """Quantise keys or values for a quantised KV cache by the library's rules (the codes and scales
    flash_attn_with_kvcache and kvcache_append store when they append): returns (codes, scales).

    x: float tensor [..., heads_kv, head_dim] (e.g. [batch, seqlen, heads_kv, head_dim]), read as
    float32. dtype:
      - torch.int8: codes int8 of x's shape and scale float32 x.shape[:-1] (one per token and kv
        head, flash_attn_with_kvcache's k_scale / v_scale layout): scale = max|x| / 127 over the
        last dimension (0 for an all-zero row), codes = x / scale rounded to nearest even, clamped to
        [-127, 127]; a row holding NaN or inf gets scale NaN and codes 0. value = codes * scale.
      - torch.float8_e4m3fn / torch.float8_e5m2: codes of that dtype and descale float32 [heads_kv]
        (FlashAttention-3's k_descale / v_descale, one per kv head): descale = max|x| over every
        dimension but the head axis (x.shape[-2]) / the format's largest finite (448 for e4m3fn,
        57344 for e5m2), 1 where that max is 0; NaN and inf elements are left out of the max. With
        per_batch=True and a 4-D x [batch, seqlen, heads_kv, head_dim], descale is [batch, heads_kv]
        (the max per sequence and head): the shape flash_attn_with_kvcache takes. codes = x /
        descale converted with round to nearest even, saturating at +-max (torch's own conversion
        does not saturate e4m3fn: it is clamped first), NaN -> 0x7F. value = float(codes) * descale.
    Pass a [heads_kv] descale to flash_attn_with_kvcache as descale.expand(batch, heads_kv).
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise InvalidTypeError("x: must be a float tensor [..., heads_kv, head_dim] (got %s)"
                               % (x.dtype if isinstance(x, Tensor) else type(x).__name__), 1)
    if x.dim() < 2:
        raise InvalidValueError("x: has %d dimensions, expected [..., heads_kv, head_dim]" % x.dim(), 1)
    xf = x.detach().to(torch.float32)
    if dtype == torch.int8:
        if per_batch:
            raise InvalidValueError("per_batch: applies to float8 descales (int8 scales are per token already)", 1)
        absmax = xf.abs().amax(-1)  # NaN and inf rows give NaN / inf
        usable = torch.isfinite(absmax) & (absmax > 0)
        scale = torch.where(torch.isfinite(absmax), absmax / 127, torch.full_like(absmax, float("nan")))
        divisor = torch.where(usable, scale, torch.ones_like(scale)).unsqueeze(-1)
        codes = torch.round(xf / divisor).clamp_(-127, 127)
        codes = torch.where(usable.unsqueeze(-1), codes, torch.zeros_like(codes))
        return codes.to(torch.int8), scale
    if dtype not in _FP8_MAX:
        raise InvalidTypeError("dtype: %s is not a quantised cache dtype (torch.int8, torch.float8_e4m3fn or "
                               "torch.float8_e5m2)" % (dtype,), 1)
    fp8_max = _FP8_MAX[dtype]
    magnitude = xf.abs()
    magnitude = torch.where(torch.isfinite(magnitude), magnitude, torch.zeros_like(magnitude))
    if per_batch:
        if x.dim() != 4:
            raise InvalidValueError("per_batch: needs a 4-D x [batch, seqlen, heads_kv, head_dim] (got %d dimensions)"
                                    % x.dim(), 1)
        absmax = magnitude.amax(dim=(1, 3))  # [batch, heads_kv]
        shape = (x.shape[0], 1, x.shape[2], 1)
    else:
        absmax = magnitude.transpose(-2, 0).reshape(x.shape[-2], -1).amax(-1) if x.numel() else \
            torch.zeros(x.shape[-2], dtype=torch.float32, device=x.device)
        shape = (x.shape[-2], 1)
    descale = torch.where(absmax > 0, absmax / fp8_max, torch.ones_like(absmax))
    codes = (xf / descale.reshape(shape)).clamp(-fp8_max, fp8_max).to(dtype)
    return codes, descale


# ---- merging partial results ----------------------------------------------------------------
@torch.library.custom_op("flashattn::merge_partials", mutates_args=())
def _merge_partials(outs: List[Tensor], lses: List[Tensor]) -> Tuple[Tensor, Tensor]:
    first = outs[0]
    out = torch.empty(first.shape, dtype=first.dtype, device=first.device)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=first.device)
    _native.merge_partials([_capsule(t) for t in outs], [_capsule(t) for t in lses], _capsule(out), _capsule(lse),
                           True, 0, torch_stream(first))
    return out, lse


@_merge_partials.register_fake
def _merge_partials_fake(outs, lses):
    return outs[0].new_empty(outs[0].shape), lses[0].new_empty(lses[0].shape, dtype=torch.float32)


def merge_partials(outs, lses):
    """flashattn.merge_partials for torch tensors, as the op flashattn::merge_partials."""
    outs, lses = list(outs), list(lses)
    if not outs:
        raise InvalidValueError("outs: has 0 tensors; merging needs at least one", 1)
    if len(lses) != len(outs):
        raise InvalidValueError("lses: has %d tensors, outs %d; give one lse per partial output" % (len(lses), len(outs)),
                                1)
    return _merge_partials([_readable(t) for t in outs], lses)
