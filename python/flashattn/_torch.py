"""PyTorch drop-in for FlashAttention-2's flash_attn_func: a torch.library custom op
(flashattn::forward, flashattn::backward) with autograd and fake (meta) implementations, so
eager mode, autograd, torch.compile and gradcheck all work. Outputs are allocated by torch (its
caching allocator on GPUs) and written in place by the C library on torch's current stream."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native
from ._dlpack import torch_stream
from ._errors import InvalidValueError

_BLOCK_DEFAULT = 128  # block_size, unused: the op takes no block mask


def _capsule(t: Optional[Tensor]):
    # to_dlpack shares memory and strides and, unlike Tensor.__dlpack__, accepts tensors that
    # require grad (custom op implementations see the autograd-tracked tensors).
    return None if t is None else torch.utils.dlpack.to_dlpack(t)


def _options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap, bias, alibi_slopes,
             sinks):
    return (softmax_scale, causal, window_left, window_right, None, dropout_p, seed, offset, None,
            _BLOCK_DEFAULT, _BLOCK_DEFAULT, softcap, _capsule(alibi_slopes), _capsule(sinks), _capsule(bias))


@torch.library.custom_op("flashattn::forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float, causal: bool,
             window_left: int, window_right: int, seed: int, offset: int, softcap: float, bias: Optional[Tensor],
             alibi_slopes: Optional[Tensor], sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    _native.forward(_capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), True,
                    *_options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap,
                              bias, alibi_slopes, sinks),
                    0, torch_stream(q))
    return out, lse


@_forward.register_fake
def _forward_fake(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap, bias,
                  alibi_slopes, sinks):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


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
              sinks: Optional[Tensor], want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    want_dbias = want_dbias and bias is not None
    dsinks, dbias = _modifier_grads_like(sinks, bias, want_dbias,
                                         lambda shape, dtype: torch.empty(shape, dtype=dtype, device=q.device))
    _native.backward(_capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(dout), _capsule(lse),
                     _capsule(dq), _capsule(dk), _capsule(dv), _capsule(dsinks) if sinks is not None else None,
                     _capsule(dbias) if want_dbias else None,
                     *_options(dropout_p, softmax_scale, causal, window_left, window_right, seed, offset, softcap,
                               bias, alibi_slopes, sinks),
                     0, torch_stream(q))
    return dq, dk, dv, dsinks, dbias


@_backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, dropout_p, softmax_scale, causal, window_left, window_right, seed,
                   offset, softcap, bias, alibi_slopes, sinks, want_dbias):
    dsinks, dbias = _modifier_grads_like(sinks, bias, want_dbias and bias is not None,
                                         lambda shape, dtype: q.new_empty(shape, dtype=dtype))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks, dbias


# Positions of the forward op's arguments (autograd returns one gradient per argument).
_N_FORWARD_ARGS = 14
_BIAS, _SINKS = 11, 13


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    out, lse = output
    bias, alibi_slopes, sinks = inputs[_BIAS:]
    ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, sinks)
    ctx.options = options[:_BIAS - 3]
    ctx.mark_non_differentiable(lse)


def _readable(t: Tensor) -> Tensor:
    """t itself when the C API can read it in place; a contiguous copy for broadcast (stride 0)
    or non-unit head_dim strides, which autograd produces for gradients like that of sum()."""
    if t.dim() == 4 and t.size(-1) > 1 and t.stride(-1) != 1:
        return t.contiguous()
    if any(stride <= 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
        return t.contiguous()
    return t


def _autograd_backward(ctx, dout, _dlse):
    q, k, v, out, lse, bias, alibi_slopes, sinks = ctx.saved_tensors
    want_dbias = bool(ctx.needs_input_grad[_BIAS])
    dq, dk, dv, dsinks, dbias = _backward(_readable(dout), q, k, v, out, lse, *ctx.options, bias, alibi_slopes,
                                          sinks, want_dbias)
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


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=True, return_attn_probs=False, *, bias=None, sinks=None):
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

    Dropout: when dropout_p > 0 a seed is drawn from torch's default generator, so
    torch.manual_seed makes runs repeatable; the backward regenerates the same mask. Under
    torch.compile the draw comes from inductor's generator: repeatable, but not eager's seed.
    deterministic: accepted for compatibility; the backward is always deterministic.
    Inputs are read in place with their strides; one whose last dimension is not contiguous is
    copied first (as FlashAttention-2 does). Differentiable in q, k, v, bias and sinks.
    """
    window_left, window_right = window_size
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif softmax_scale == 0:
        raise InvalidValueError("softmax_scale: 0 is not a usable scale (None means 1/sqrt(head_dim))", 1)
    seed = 0
    if dropout_p > 0:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    if bias is not None:
        bias = _readable_bias(bias)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.detach().to(torch.float32).contiguous()
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    out, lse = _forward(_readable(q), _readable(k), _readable(v), float(dropout_p), float(softmax_scale),
                        bool(causal), int(window_left), int(window_right), seed, 0, float(softcap), bias,
                        alibi_slopes, sinks)
    return (out, lse, None) if return_attn_probs else out
