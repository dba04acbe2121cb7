"""Score modifiers through flashattn.flash_attn_func (softcap, alibi_slopes, bias=, sinks=) against
an independent float64 PyTorch reference with autograd: values and the gradients of q, k, v, bias
(summed over its broadcast axes by autograd) and sinks; gradcheck, torch.compile, opcheck, bad inputs."""

import os

import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch

import flashattn
import reference
from test_torch import inputs

BATCH, SEQLEN_Q, SEQLEN_K, HEADS_Q, HEADS_KV = 2, 24, 31, 4, 2


def modified_attention(q, k, v, causal=False, scale=None, softcap=0.0, alibi_slopes=None, bias=None, sinks=None):
    """Attention with the modifiers in float64, written with torch ops (the sink is an extra
    softmax column with no value), so torch autograd gives the reference gradients."""
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * torch.einsum("bqhd,bkhd->bhqk", q, k)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        distance = torch.from_numpy(reference.alibi_distance(s.shape[2], s.shape[3]))
        s = s - alibi_slopes.double().reshape(-1 if alibi_slopes.dim() == 2 else 1, s.shape[1], 1, 1) * distance
    if bias is not None:
        s = s + bias.double()
    if causal:
        visible = torch.from_numpy(reference.visible(s.shape[2], s.shape[3], causal=True))
        s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_column = sinks.double().reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        p = torch.softmax(torch.cat([s, sink_column], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def leaf(t):
    return t.detach().double().requires_grad_()


def bias_param(shape, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype).requires_grad_()


def sinks_param():
    return torch.randn(HEADS_Q, generator=torch.Generator().manual_seed(6)).requires_grad_()


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
CASES = {
    "softcap": lambda: {"softcap": 2.0},
    "alibi": lambda: {"alibi_slopes": SLOPES},
    "alibi-per-batch-causal": lambda: {"alibi_slopes": torch.stack([SLOPES, SLOPES.flip(0)]), "causal": True},
    "sinks": lambda: {"sinks": sinks_param()},
    "bias-full": lambda: {"bias": bias_param((BATCH, HEADS_Q, SEQLEN_Q, SEQLEN_K))},
    "bias-2d-bf16": lambda: {"bias": bias_param((SEQLEN_Q, SEQLEN_K), torch.bfloat16)},
    "bias-heads-only": lambda: {"bias": bias_param((1, HEADS_Q, 1, SEQLEN_K))},
    "combined-causal": lambda: {"causal": True, "softcap": 3.0, "alibi_slopes": SLOPES, "sinks": sinks_param(),
                                "bias": bias_param((BATCH, 1, SEQLEN_Q, SEQLEN_K))},
}


def check(opts, dtype=torch.float32, tolerance=2e-5):
    q, k, v = inputs(batch=BATCH, seqlen_q=SEQLEN_Q, seqlen_k=SEQLEN_K, heads_q=HEADS_Q, heads_kv=HEADS_KV,
                     dtype=dtype)
    learnable = [name for name in ("bias", "sinks") if name in opts]
    out = flashattn.flash_attn_func(q, k, v, **opts)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(11)).to(dtype)
    grads = torch.autograd.grad(out, [q, k, v] + [opts[n] for n in learnable], dout)
    ref_inputs = [leaf(x) for x in (q, k, v)]
    ref_opts = dict(opts, **{n: leaf(opts[n]) for n in learnable})
    ref = modified_attention(*ref_inputs, **ref_opts)
    ref_grads = torch.autograd.grad(ref, ref_inputs + [ref_opts[n] for n in learnable], dout.double())
    torch.testing.assert_close(out.double(), ref.detach(), atol=tolerance, rtol=tolerance)
    for name, got, want, like in zip(["dq", "dk", "dv"] + learnable, grads, ref_grads,
                                     [q, k, v] + [opts[n] for n in learnable]):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        torch.testing.assert_close(got.double(), want, atol=tolerance * 4, rtol=tolerance * 4,
                                   msg=lambda detail, name=name: "%s: %s" % (name, detail))


@pytest.mark.parametrize("case", CASES)
def test_modifier_matches_torch_reference(case):
    opts = CASES[case]()
    check(opts, tolerance=2e-2 if opts.get("bias") is not None and opts["bias"].dtype == torch.bfloat16 else 2e-5)


def test_modifiers_in_bfloat16():
    check(CASES["combined-causal"](), dtype=torch.bfloat16, tolerance=2e-2)


def test_expanded_bias_gradient_reaches_its_base():
    """A stride-0 expand of a parameter that requires grad is copied (its gradient is per element);
    autograd then sums it back onto the parameter."""
    base = bias_param((1, HEADS_Q, SEQLEN_Q, SEQLEN_K))
    expanded = base.expand(BATCH, -1, -1, -1)
    assert expanded.stride(0) == 0
    check({"bias": expanded})
    q, k, v = inputs(batch=BATCH, seqlen_q=SEQLEN_Q, seqlen_k=SEQLEN_K, heads_q=HEADS_Q, heads_kv=HEADS_KV)
    flashattn.flash_attn_func(q, k, v, bias=expanded).sum().backward()
    ref_base = leaf(base)
    modified_attention(q, k, v, bias=ref_base.expand(BATCH, -1, -1, -1)).sum().backward()
    torch.testing.assert_close(base.grad.double(), ref_base.grad, atol=1e-4, rtol=1e-4)


def test_bias_without_grad_and_non_contiguous_key_axis():
    q, k, v = inputs(batch=BATCH, seqlen_q=SEQLEN_Q, seqlen_k=SEQLEN_K, heads_q=HEADS_Q, heads_kv=HEADS_KV)
    wide = torch.randn(HEADS_Q, SEQLEN_Q, 2 * SEQLEN_K)
    strided = wide[..., ::2]  # key stride 2: copied first
    expanded = torch.randn(1, 1, SEQLEN_Q, SEQLEN_K).expand(BATCH, HEADS_Q, -1, -1)  # read in place, stride 0
    for bias in (strided, expanded):
        out = flashattn.flash_attn_func(q, k, v, bias=bias)
        assert torch.equal(out, flashattn.flash_attn_func(q, k, v, bias=bias.contiguous()))


def test_gradcheck_float32_with_bias_and_sinks():
    """float32 finite differences as in test_torch.test_gradcheck_float32 (eps 1e-3, tolerance 2e-2)."""
    q, k, v = inputs(batch=1, seqlen_q=5, seqlen_k=7, heads_q=2, heads_kv=1, head_dim=4, seed=3)
    bias = bias_param((2, 1, 7))
    sinks = torch.tensor([0.3, -0.2], requires_grad=True)

    def fn(q, k, v, bias, sinks):
        return flashattn.flash_attn_func(q, k, v, causal=True, softcap=2.0, alibi_slopes=SLOPES[:2], bias=bias,
                                         sinks=sinks)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(fn, (q, k, v, bias, sinks), eps=1e-3, atol=2e-2, rtol=2e-2)


def test_torch_compile_with_modifiers():
    q, k, v = inputs(batch=BATCH, seqlen_q=SEQLEN_Q, seqlen_k=SEQLEN_K, heads_q=HEADS_Q, heads_kv=HEADS_KV)
    bias, sinks = bias_param((HEADS_Q, SEQLEN_Q, SEQLEN_K)), sinks_param()

    def fn(q, k, v, bias, sinks):
        return flashattn.flash_attn_func(q, k, v, causal=True, softcap=4.0, alibi_slopes=SLOPES, bias=bias,
                                         sinks=sinks) * 2

    eager = fn(q, k, v, bias, sinks)
    eager_grads = torch.autograd.grad(eager.sum(), (q, bias, sinks))
    compiled = torch.compile(fn, fullgraph=True)(q, k, v, bias, sinks)
    compiled_grads = torch.autograd.grad(compiled.sum(), (q, bias, sinks))
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_opcheck_with_modifiers():
    q, k, v = inputs(seqlen_q=8, seqlen_k=8, head_dim=8)
    bias = torch.randn(1, 4, 8, 8, requires_grad=True)
    sinks = torch.randn(4, requires_grad=True)
    torch.library.opcheck(torch.ops.flashattn.forward.default,
                          (q, k, v, 0.0, 0.35, True, -1, -1, 0, 0, 2.0, bias, SLOPES, sinks, None, None, 0, 0, None, 1,
                           1))


def test_bad_modifier_inputs():
    q, k, v = inputs(batch=BATCH, seqlen_q=SEQLEN_Q, seqlen_k=SEQLEN_K, heads_q=HEADS_Q, heads_kv=HEADS_KV)
    with pytest.raises(ValueError, match=r"alibi_slopes: expected shape \[4\]"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=SLOPES[:3])
    with pytest.raises(ValueError, match=r"sinks: expected shape \[4\]"):
        flashattn.flash_attn_func(q, k, v, sinks=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="bias: dimension 1 has size 5, which does not broadcast to seqlen_q = 24"):
        flashattn.flash_attn_func(q, k, v, bias=torch.zeros(HEADS_Q, 5, SEQLEN_K))
    with pytest.raises(ValueError, match="the key axis cannot broadcast"):
        flashattn.flash_attn_func(q, k, v, bias=torch.zeros(SEQLEN_Q, 1))
    with pytest.raises(TypeError, match="bias: dtype float64 is not supported"):
        flashattn.flash_attn_func(q, k, v, bias=torch.zeros(SEQLEN_Q, SEQLEN_K, dtype=torch.float64))
    with pytest.raises(ValueError, match="softcap"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)
