"""flash_attn_with_kvcache and flashattn.merge_partials on torch tensors: contiguous and paged
caches against float64 SDPA over the cache after the append, cache_seqlens as int or tensor,
return_softmax_lse merged across cache halves, torch.compile of a decode step, opcheck, a lone
rotary table, bad inputs leaving the cache byte-identical, CUDA when present."""

import os

import numpy as np
import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch

import flashattn
from test_kvcache_numpy import HEAD_DIM, HEADS_KV, HEADS_Q, Cache


def torch_cache(batch, capacity, page_size=None, dtype=torch.float32, seed=0):
    cache = Cache(batch, capacity, page_size, seed=seed)
    k, v = (torch.from_numpy(x).to(dtype) for x in (cache.k, cache.v))
    table = None if cache.block_table is None else torch.from_numpy(cache.block_table)
    return cache, k, v, table


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def sdpa_over_cache(q, keys, values, causal):
    """float64 SDPA of q [1, seqlen_q, heads_q, d] over keys/values [length, heads_kv, d], GQA by
    repetition, causal bottom-right aligned."""
    group = HEADS_Q // HEADS_KV
    qs = q[0].double().transpose(0, 1)
    ks, vs = (x.double().transpose(0, 1).repeat_interleave(group, 0) for x in (keys, values))
    mask = None
    if causal:
        i = torch.arange(q.shape[1])[:, None]
        mask = torch.arange(keys.shape[0])[None, :] <= i + keys.shape[0] - q.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1)


def gathered(cache_tensor, table, b, length, page_size):
    if table is None:
        return cache_tensor[b, :length]
    return cache_tensor[table[b].long()].reshape(-1, HEADS_KV, HEAD_DIM)[:length]


@pytest.mark.parametrize("page_size", [None, 1, 16, 256, 7])
@pytest.mark.parametrize("seqlen_new, as_tensor", [(1, True), (4, False), (0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_kvcache_matches_sdpa_over_the_appended_cache(page_size, seqlen_new, as_tensor, dtype):
    batch, capacity = 2, 270
    _, k_cache, v_cache, table = torch_cache(batch, capacity, page_size, dtype)
    cached = 200
    seqlens = torch.full((batch,), cached, dtype=torch.int32) if as_tensor else cached
    seqlen_q = max(seqlen_new, 1)
    q = randn(batch, seqlen_q, HEADS_Q, HEAD_DIM, seed=1, dtype=dtype)
    k = randn(batch, seqlen_new, HEADS_KV, HEAD_DIM, seed=2, dtype=dtype) if seqlen_new else None
    v = randn(batch, seqlen_new, HEADS_KV, HEAD_DIM, seed=3, dtype=dtype) if seqlen_new else None
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                                 causal=True, return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (batch, HEADS_Q, seqlen_q)
    if as_tensor:
        assert (seqlens == cached).all()  # the call does not advance cache_seqlens
    length = cached + seqlen_new
    tol = 3e-5 if dtype == torch.float32 else 2e-2
    for b in range(batch):
        keys, values = (gathered(c, table, b, length, page_size) for c in (k_cache, v_cache))
        if seqlen_new:
            assert torch.equal(keys[cached:], k[b]) and torch.equal(values[cached:], v[b])
        ref = sdpa_over_cache(q[b:b + 1], keys, values, causal=True)
        torch.testing.assert_close(out[b].double(), ref, atol=tol, rtol=tol)


def test_merge_of_two_cache_halves_equals_the_whole():
    _, k_cache, v_cache, _ = torch_cache(2, 128)
    q = randn(2, 1, HEADS_Q, HEAD_DIM, seed=4)
    whole, whole_lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=128,
                                                         return_softmax_lse=True)
    parts = [flashattn.flash_attn_with_kvcache(q, k_cache[:, s], v_cache[:, s], cache_seqlens=64,
                                               return_softmax_lse=True) for s in (slice(0, 64), slice(64, 128))]
    out, lse = flashattn.merge_partials([p[0] for p in parts], [p[1] for p in parts])
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, whole, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse, whole_lse, atol=2e-6, rtol=2e-6)
    # cache_seqlens=None: every cache is full.
    assert torch.equal(flashattn.flash_attn_with_kvcache(q, k_cache, v_cache), whole)


def test_compiled_decode_step_appends_and_attends_like_eager():
    def decode(q, k_cache, v_cache, k, v, seqlens, table):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                                 causal=True)

    compiled = torch.compile(decode, fullgraph=True)
    _, k_eager, v_eager, table = torch_cache(2, 64, 16)
    k_compiled, v_compiled = k_eager.clone(), v_eager.clone()
    seqlens = torch.tensor([10, 30], dtype=torch.int32)
    for step in range(3):
        q = randn(2, 1, HEADS_Q, HEAD_DIM, seed=10 + step)
        k = randn(2, 1, HEADS_KV, HEAD_DIM, seed=20 + step)
        v = randn(2, 1, HEADS_KV, HEAD_DIM, seed=30 + step)
        want = decode(q, k_eager, v_eager, k, v, seqlens, table)
        got = compiled(q, k_compiled, v_compiled, k, v, seqlens, table)
        assert torch.equal(got, want)
        assert torch.equal(k_compiled, k_eager) and torch.equal(v_compiled, v_eager)
        seqlens += 1


def test_opcheck_kvcache_and_merge():
    _, k_cache, v_cache, table = torch_cache(2, 32, 8)
    q = randn(2, 2, HEADS_Q, HEAD_DIM, seed=5)
    k = randn(2, 2, HEADS_KV, HEAD_DIM, seed=6)
    torch.library.opcheck(torch.ops.flashattn.forward_kvcache.default,
                          (q, k_cache, v_cache, k, k, torch.tensor([3, 9], dtype=torch.int32), 0, table, 0.25, True, -1,
                           -1, 0.0, None, True))
    parts = [randn(2, 3, 4, 8, seed=s) for s in (1, 2)]
    lses = [randn(2, 4, 3, seed=s) for s in (3, 4)]
    torch.library.opcheck(torch.ops.flashattn.merge_partials.default, (parts, lses))


@pytest.mark.parametrize("name, other", [("rotary_cos", "rotary_sin"), ("rotary_sin", "rotary_cos")])
def test_a_lone_rotary_table_raises_naming_the_missing_one(name, other):
    _, k_cache, v_cache, _ = torch_cache(1, 16)
    q = randn(1, 1, HEADS_Q, HEAD_DIM)
    with pytest.raises(ValueError, match=other + ": is None"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, **{name: torch.zeros(1)})


def test_bad_inputs_raise_and_leave_the_cache_untouched():
    _, k_cache, v_cache, table = torch_cache(2, 32, 8)
    before = k_cache.clone(), v_cache.clone()
    q = randn(2, 1, HEADS_Q, HEAD_DIM)
    k = randn(2, 2, HEADS_KV, HEAD_DIM, seed=1)
    out_of_range = table.clone()
    out_of_range[0, 0] = 1000  # the page sequence 0 writes to
    cases = [
        (dict(cache_seqlens=torch.tensor([31, 2], dtype=torch.int32), block_table=table), ValueError, "sequence 0"),
        (dict(cache_seqlens=torch.tensor([3, 2], dtype=torch.int32), block_table=out_of_range), ValueError,
         "sequence 0"),
        (dict(cache_seqlens=3, block_table=table.long()), TypeError, "block_table: dtype int64"),
        (dict(cache_seqlens=None, block_table=table), ValueError, "cache_seqlens: is None"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, **kwargs)
        assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1]), message
    with pytest.raises(ValueError, match="k_new: dtype differs from q"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k.half(), k.half(), cache_seqlens=3, block_table=table)
    with pytest.raises(ValueError, match="v: is None"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, cache_seqlens=3, block_table=table)
    with pytest.raises(ValueError, match="num_splits: -1 is negative"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=3, block_table=table, num_splits=-1)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_with_kvcache_on_cuda_tensors():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not flashattn.backends()["cuda"].available:
        pytest.skip("flashattn CUDA backend unavailable: " + flashattn.backends()["cuda"].detail)
    _, k_cache, v_cache, table = torch_cache(2, 64, 16, torch.float16)
    q = randn(2, 1, HEADS_Q, HEAD_DIM, dtype=torch.float16)
    k = randn(2, 1, HEADS_KV, HEAD_DIM, seed=1, dtype=torch.float16)
    want = flashattn.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, k, cache_seqlens=20,
                                             block_table=table, causal=True)
    kc, vc = k_cache.cuda(), v_cache.cuda()
    got = flashattn.flash_attn_with_kvcache(q.cuda(), kc, vc, k.cuda(), k.cuda(), cache_seqlens=20,
                                            block_table=table.cuda(), causal=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
    assert torch.equal(kc.cpu()[table[0, 20 // 16]][20 % 16], k[0, 0])


def test_cache_seqlens_as_a_list_and_bad_kinds():
    _, k_cache, v_cache, table = torch_cache(2, 32, 8)
    q = randn(2, 1, HEADS_Q, HEAD_DIM)
    want = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32),
                                             block_table=table)
    assert torch.equal(flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=[5, 9], block_table=table),
                       want)
    for bad in ("5", 5.5):
        with pytest.raises(TypeError, match="cache_seqlens: %s is not an int" % type(bad).__name__):
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=bad, block_table=table)


def test_eager_calls_skip_the_dispatcher_but_not_its_effects():
    """Plain eager calls run the op's body directly (decode-step overhead); under a dispatch mode
    the op itself runs, with the same result; either way the caches' version counters move."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    _, k_cache, v_cache, table = torch_cache(2, 32, 8)
    k_copy, v_copy = k_cache.clone(), v_cache.clone()
    q = randn(2, 1, HEADS_Q, HEAD_DIM)
    k = randn(2, 1, HEADS_KV, HEAD_DIM, seed=1)
    version = k_cache._version
    eager = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, cache_seqlens=[4, 9], block_table=table)
    assert k_cache._version > version
    with Record() as record:
        traced = flashattn.flash_attn_with_kvcache(q, k_copy, v_copy, k, k, cache_seqlens=[4, 9], block_table=table)
    assert "flashattn.forward_kvcache.default" in record.ops
    assert torch.equal(traced, eager) and torch.equal(k_copy, k_cache) and torch.equal(v_copy, v_cache)
