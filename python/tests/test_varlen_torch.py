"""flash_attn_varlen_func and the packed forms (flash_attn_qkvpacked_func, ...) on torch tensors:
per-sequence float64 SDPA and the NumPy reference (modifiers, dropout through
flashattn.dropout_mask), gradcheck, opcheck, torch.compile, block masks in flash_attn_func,
errors, CUDA tensors when a GPU is present."""

import os

import numpy as np
import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch

import flashattn
import reference
from test_varlen_numpy import BATCH, HEADS_Q, LENS_K, LENS_Q, packed

TORCH_TOLERANCE = {torch.float32: 3e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def torch_packed(dtype=torch.float32, lens_q=LENS_Q, lens_k=LENS_K, seed=0):
    q, k, v, cu_q, cu_k, max_q, max_k = packed(lens_q, lens_k, seed=seed)
    tensors = [torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v)]
    return tensors + [torch.from_numpy(cu_q), torch.from_numpy(cu_k), max_q, max_k]


def sdpa_per_sequence(q, k, v, cu_q, cu_k, causal=False, window=(-1, -1)):
    """torch's SDPA in float64 per sequence (GQA by repeating k, v; bottom-right masks)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu_q) - 1):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        len_q, len_k = rows.stop - rows.start, keys.stop - keys.start
        if len_q == 0:
            continue
        vis = torch.from_numpy(reference.visible(len_q, len_k, causal, window))
        qs = q[rows].double().transpose(0, 1)
        ks, vs = (x[keys].double().transpose(0, 1).repeat_interleave(group, 0) for x in (k, v))
        scores = (qs @ ks.transpose(1, 2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~vis, float("-inf"))
        p = torch.softmax(scores, -1).nan_to_num(0.0)  # rows with no visible key: zeros
        out[rows] = (p @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (3, -1)), (False, (2, 4))])
def test_varlen_func_matches_per_sequence_sdpa(dtype, causal, window):
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed(dtype)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window)
    assert out.shape == q.shape and out.dtype == dtype
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = sdpa_per_sequence(q64, k64, v64, cu_q, cu_k, causal, window)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    tol = TORCH_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref.detach(), atol=tol, rtol=tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=tol * 8, rtol=tol * 8)


@pytest.mark.parametrize("options", [
    {"softcap": 3.0, "causal": True},
    {"alibi_slopes": torch.linspace(0.1, 0.9, HEADS_Q)},
    {"dropout_p": 0.2, "causal": True},
])
def test_varlen_func_modifiers_and_dropout_match_the_reference(options):
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed()
    torch.manual_seed(11)
    out, lse, probs = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True,
                                                       **options)
    assert probs is None and lse.shape == (HEADS_Q, q.shape[0]) and not lse.requires_grad
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_options = {"causal": options.get("causal", False), "softcap": options.get("softcap", 0.0)}
    if "alibi_slopes" in options:
        ref_options["alibi_slopes"] = options["alibi_slopes"].numpy()
    if options.get("dropout_p"):
        torch.manual_seed(11)  # replay the op's seed draw
        ref_options.update(dropout_p=options["dropout_p"], seed=int(torch.randint(0, 2**62, (), dtype=torch.int64)))
    ref = reference.varlen_attention(*(x.detach().numpy() for x in (q, k, v)), cu_q.numpy(), cu_k.numpy(), max_q,
                                     max_k, dout.numpy(), **ref_options)
    np.testing.assert_allclose(out.detach().numpy(), ref[0], atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse.numpy(), ref[1], atol=3e-5, rtol=3e-5)
    for got, want in zip(grads, ref[2:]):
        np.testing.assert_allclose(got.numpy(), want, atol=2e-4, rtol=2e-4)


def test_varlen_gradcheck_float32():
    """float32 (the C library has no float64 path): eps = 1e-3 finite differences carry about 1e-3
    relative error, hence atol = rtol = 2e-2; a wrong gradient misses by O(1)."""
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed(lens_q=[3, 0, 1, 2], lens_k=[4, 2, 1, 2])
    q, k, v = (x.detach()[:, :, :4].contiguous().requires_grad_() for x in (q, k, v))

    def fn(q, k, v):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-3, atol=2e-2, rtol=2e-2)


def test_varlen_opcheck():
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed(lens_q=[3, 0, 5], lens_k=[4, 2, 5])
    torch.library.opcheck(torch.ops.flashattn.forward.default,
                          (q, k, v, 0.0, 0.35, True, -1, -1, 0, 0, 0.0, None, None, None, cu_q, cu_k, max_q, max_k,
                           None, 1, 1))


def test_varlen_torch_compile_fullgraph():
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed()

    def step(q, k, v):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True).square().sum()

    eager = step(q, k, v)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    compiled = torch.compile(step, fullgraph=True)(q, k, v)
    compiled_grads = torch.autograd.grad(compiled, (q, k, v))
    torch.testing.assert_close(compiled, eager)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want)


def test_packed_forms_equal_the_separate_calls():
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 12, 3, 4, 16, generator=gen, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    want = flashattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(out, want)
    (grad,) = torch.autograd.grad(out.sum(), qkv)
    assert grad.shape == qkv.shape and grad.abs().sum() > 0
    q = torch.randn(2, 5, 4, 16, generator=gen)
    kv = torch.randn(2, 12, 2, 2, 16, generator=gen)
    assert torch.equal(flashattn.flash_attn_kvpacked_func(q, kv), flashattn.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1]))
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    qkv = torch.randn(10, 3, 4, 16, generator=gen)
    assert torch.equal(flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, causal=True),
                       flashattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 7, 7, causal=True))
    q = torch.randn(10, 4, 16, generator=gen)
    kv = torch.randn(12, 2, 2, 16, generator=gen)
    cu_k = torch.tensor([0, 5, 6, 12], dtype=torch.int32)
    assert torch.equal(flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 7, 6),
                       flashattn.flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu, cu_k, 7, 6))


def test_flash_attn_func_block_mask():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 20, 2, 16, generator=gen, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    out = flashattn.flash_attn_func(q, k, v, causal=True, block_mask=mask, block_size=(8, 7))
    dout = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference.attention(*(x.detach().numpy() for x in (q, k, v)), dout.numpy(), causal=True,
                              block_mask=mask.numpy(), block_size=(8, 7))
    np.testing.assert_allclose(out.detach().numpy(), ref[0], atol=3e-5, rtol=3e-5)
    for got, want in zip(grads, ref[2:]):
        np.testing.assert_allclose(got.numpy(), want, atol=2e-4, rtol=2e-4)
    compiled = torch.compile(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, block_mask=mask,
                                                                       block_size=(8, 7)), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), out)


def test_varlen_func_bad_inputs():
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed()
    with pytest.raises(NotImplementedError, match="block_table: paged keys and values"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, block_table=torch.zeros(1, 1,
                                                                                                   dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens_q: must be an int32 tensor"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q.tolist(), cu_k, max_q, max_k)
    with pytest.raises(TypeError, match="cu_seqlens_k: dtype int64 is not supported"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k.long(), max_q, max_k)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q.flip(0).contiguous(), cu_k, max_q, max_k)
    with pytest.raises(TypeError, match="block_mask: dtype"):
        flashattn.flash_attn_func(q[None], k[None], v[None], block_mask=torch.ones(1, 1, dtype=torch.float32))


def test_varlen_cuda_tensors_run_on_the_cuda_plugin():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not flashattn.backends()["cuda"].available:
        pytest.skip("flashattn CUDA backend unavailable: " + flashattn.backends()["cuda"].detail)
    q, k, v, cu_q, cu_k, max_q, max_k = torch_packed(torch.float16)
    qc, kc, vc = (x.detach().cuda().requires_grad_() for x in (q, k, v))
    out = flashattn.flash_attn_varlen_func(qc, kc, vc, cu_q.cuda(), cu_k.cuda(), max_q, max_k, causal=True)
    out.float().sum().backward()
    torch.cuda.synchronize()
    ref = sdpa_per_sequence(q.detach(), k.detach(), v.detach(), cu_q, cu_k, causal=True)
    torch.testing.assert_close(out.detach().cpu().double(), ref, atol=3e-3, rtol=3e-3)
    assert qc.grad is not None and torch.isfinite(qc.grad).all()
