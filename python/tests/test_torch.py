"""flashattn.flash_attn_func (torch.library custom op) against PyTorch's
scaled_dot_product_attention: values, gradients, masks, GQA, strides, dropout, gradcheck,
torch.compile, bad inputs."""

import os

import numpy as np
import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch
import torch.nn.functional as F

import flashattn
import reference

# Per dtype: (atol, rtol) for outputs and gradients against SDPA computed in float64.
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}


def sdpa(q, k, v, mask=None, scale=None):
    """SDPA in float64 on [B, S, H, D] tensors, with GQA by repeating k, v; mask: [Sq, Sk] bool."""
    group = q.shape[2] // k.shape[2]
    q64, k64, v64 = (x.double().transpose(1, 2) for x in (q, k, v))
    k64, v64 = k64.repeat_interleave(group, dim=1), v64.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, scale=scale).transpose(1, 2)


def inputs(batch=2, seqlen_q=40, seqlen_k=40, heads_q=4, heads_kv=4, head_dim=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, seqlen_q, heads_q, head_dim)] + [(batch, seqlen_k, heads_kv, head_dim)] * 2
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def check(q, k, v, mask=None, scale=None, **kwargs):
    dtype = q.dtype
    out = flashattn.flash_attn_func(q, k, v, softmax_scale=scale, **kwargs)
    assert out.dtype == dtype and out.shape == q.shape
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = sdpa(q64, k64, v64, mask, scale)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref.detach(), atol=atol, rtol=rtol)
    for got, want in zip((dq, dk, dv), ref_grads):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dense_matches_sdpa(dtype):
    check(*inputs(dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_square_matches_sdpa_is_causal(dtype):
    q, k, v = inputs(dtype=dtype)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(*(x.double().transpose(1, 2) for x in (q, k, v)), is_causal=True)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref.transpose(1, 2), atol=atol, rtol=rtol)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(17, 50), (50, 23)])
def test_causal_is_bottom_right_aligned(seqlen_q, seqlen_k):
    """FlashAttention-2's convention, checked with an explicit mask (SDPA's is_causal is top-left)."""
    q, k, v = inputs(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    mask = torch.from_numpy(reference.visible(seqlen_q, seqlen_k, causal=True))
    rows = mask.any(dim=1)  # rows with no visible key: flashattn gives zeros, SDPA NaN
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = sdpa(q64, k64, v64, mask)
    ref = torch.where(rows[None, :, None, None], ref, torch.zeros_like(ref))
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), torch.where(rows[None, :, None, None], dout.double(), 0.0))
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=2e-5)
    assert (out[:, ~rows] == 0).all()
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), torch.nan_to_num(want), atol=1e-4, rtol=1e-4)


def test_window_gqa_and_scale():
    q, k, v = inputs(heads_q=6, heads_kv=2, seqlen_q=30, seqlen_k=44)
    mask = torch.from_numpy(reference.visible(30, 44, causal=True, window=(8, -1)))
    check(q, k, v, mask=mask, scale=0.2, causal=True, window_size=(8, -1))


def test_non_contiguous_inputs():
    """[B, H, S, D] tensors transposed to [B, S, H, D] are used in place, as given."""
    base = inputs(heads_q=4, heads_kv=4)
    q, k, v = (x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in base)
    assert not q.is_contiguous() and q.stride(-1) == 1
    check(q, k, v, causal=False)
    out_strided = flashattn.flash_attn_func(q, k, v)
    out_packed = flashattn.flash_attn_func(*(x.contiguous() for x in (q, k, v)))
    assert torch.equal(out_strided, out_packed)
    # head_dim not contiguous: copied first, as FlashAttention-2 does.
    wide = torch.randn(2, 40, 4, 64)
    out = flashattn.flash_attn_func(wide[..., ::2], wide[..., ::2], wide[..., ::2])
    assert torch.equal(out, flashattn.flash_attn_func(*(wide[..., ::2].contiguous(),) * 3))


def test_return_attn_probs_convention():
    q, k, v = inputs()
    out, lse, probs = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None and lse.dtype == torch.float32 and lse.shape == (2, 4, 40)
    _, ref_lse = reference.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-5, rtol=2e-5)
    assert not lse.requires_grad


def test_sum_backward_broadcast_gradient():
    q, k, v = inputs()
    flashattn.flash_attn_func(q, k, v).sum().backward()  # dout is a stride-0 expand of ones
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    sdpa(q64, k64, v64).sum().backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-4, rtol=1e-4)


def test_dropout_follows_torch_seed_and_regenerates_in_backward():
    q, k, v = inputs(seqlen_q=24, seqlen_k=24, heads_q=2, heads_kv=2, head_dim=16)
    torch.manual_seed(0)
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.3)
    torch.manual_seed(0)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.3)
    c = flashattn.flash_attn_func(q, k, v, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # The seed the op drew: replay torch's draw, then compare with the reference on that mask.
    torch.manual_seed(0)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    dout = torch.randn_like(a)
    grads = torch.autograd.grad(a, (q, k, v), dout)
    ref = reference.attention(*(x.detach().numpy() for x in (q, k, v)), dout.numpy(), dropout_p=0.3, seed=seed)
    np.testing.assert_allclose(a.detach().numpy(), ref[0], atol=3e-5, rtol=3e-5)
    for got, want in zip(grads, ref[2:]):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-4, rtol=1e-4)


def test_gradcheck_float32():
    """float32 (the C library has no float64 path): finite differences with eps = 1e-3 in float32
    carry about 1e-3 relative error, hence atol = rtol = 2e-2; a wrong gradient misses by O(1)."""
    q, k, v = inputs(batch=1, seqlen_q=5, seqlen_k=7, heads_q=2, heads_kv=1, head_dim=4, seed=3)

    def fn(q, k, v):
        return flashattn.flash_attn_func(q, k, v, causal=True)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-3, atol=2e-2, rtol=2e-2)


def test_opcheck():
    q, k, v = inputs(seqlen_q=8, seqlen_k=8, head_dim=8)
    torch.library.opcheck(torch.ops.flashattn.forward.default, (q, k, v, 0.0, 0.35, True, -1, -1, 0, 0, 0.0, None, None, None,
                                                                None, None, 0, 0, None, 1, 1))


def example_module(**kwargs):
    """examples/python/train_tiny_attention.py's layer (so the test also covers the example's code)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "train_tiny_attention.py")
    spec = importlib.util.spec_from_file_location("train_tiny_attention", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.CausalSelfAttention(32, 4, **kwargs)


def test_torch_compile_module():
    torch.manual_seed(0)
    module = example_module(dropout_p=0.0)
    x = torch.randn(2, 16, 32)
    eager = module(x)
    eager.sum().backward()
    eager_grad = module.qkv.weight.grad.clone()
    module.zero_grad()
    compiled = torch.compile(module, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(module.qkv.weight.grad, eager_grad, atol=1e-5, rtol=1e-5)


def test_torch_compile_dropout_follows_torch_seed():
    """Compiled, the seed comes from inductor's generator (not eager's draw), still fixed by
    torch.manual_seed; the backward regenerates the same mask (gradients repeat too)."""
    module = example_module(dropout_p=0.3)
    compiled = torch.compile(module, fullgraph=True)
    x = torch.randn(2, 16, 32)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        module.zero_grad()
        out = compiled(x)
        out.sum().backward()
        runs.append((out.detach(), module.qkv.weight.grad.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][0], runs[2][0])


def test_bad_inputs():
    q, k, v = inputs()
    with pytest.raises(TypeError, match="q: dtype float64 is not supported"):
        flashattn.flash_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="k: heads 3 does not divide q's heads 4"):
        flashattn.flash_attn_func(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="q: has 3 dimensions"):
        flashattn.flash_attn_func(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="v: shape"):
        flashattn.flash_attn_func(q, k, v[:, :5])
    with pytest.raises(ValueError, match="softmax_scale: 0"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=0.0)


def test_cuda_tensors_run_on_the_cuda_plugin():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not flashattn.backends()["cuda"].available:
        pytest.skip("flashattn CUDA backend unavailable: " + flashattn.backends()["cuda"].detail)
    q, k, v = (x.detach().cuda().requires_grad_() for x in inputs())
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
    torch.cuda.synchronize()
    ref = sdpa(*(x.detach().cpu() for x in (q, k, v)), torch.ones(40, 40, dtype=torch.bool).tril())
    torch.testing.assert_close(out.detach().cpu().double(), ref, atol=1e-4, rtol=1e-4)
