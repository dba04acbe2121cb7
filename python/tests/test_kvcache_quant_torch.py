"""Quantised KV caches (int8, float8_e4m3fn, float8_e5m2; k_scale / v_scale, k_descale / v_descale),
rotary embeddings (rotary_cos / rotary_sin, both layouts) and flashattn.quantize_kv /
flashattn.kvcache_append on torch tensors: attention against a float64 reference over the
dequantised cache, appended codes equal to quantize_kv's, the NaN / saturation rules, errors."""

import os

import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch

import flashattn

HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 16
I8, E4M3, E5M2 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def dequantised(codes, scale):
    """float64 values of a cache: int8 codes * per-token scale, float8 codes * [batch, heads_kv] descale."""
    if codes.dtype == I8:
        return codes.double() * scale.double()[..., None]
    if codes.dtype in (E4M3, E5M2):
        return codes.double() * scale.double()[:, None, :, None]
    return codes.double()


def reference(q, keys, values, lengths, causal):
    """float64 attention of q [batch, seqlen_q, heads_q, d] over keys/values [batch, capacity, heads_kv, d]
    (sequence b: its first lengths[b] keys), GQA, causal bottom-right aligned."""
    group = HEADS_Q // HEADS_KV
    outs = []
    for b, length in enumerate(lengths):
        qs = q[b].double().transpose(0, 1)
        ks, vs = (x[b, :length].double().transpose(0, 1).repeat_interleave(group, 0) for x in (keys, values))
        mask = None
        if causal:
            i = torch.arange(q.shape[1])[:, None]
            mask = torch.arange(length)[None, :] <= i + length - q.shape[1]
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1))
    return torch.stack(outs)


def scales_kw(name, dtype, scale):
    if dtype == I8:
        return {name + "_scale": scale}
    return {name + "_descale": scale}


def prefilled(full, cached, dtype, capacity):
    """(cache, scale, codes_full): a [batch, capacity, heads_kv, d] cache of `dtype` holding the codes of
    full[b, :cached[b]], its scales (int8: per token, zero past the prefill; float8: the per-batch
    descale of all of full), and quantize_kv's codes of the whole of full (what the append must store)."""
    batch = full.shape[0]
    if dtype == torch.float32:
        codes_full, scale_full = full, None
    else:
        codes_full, scale_full = flashattn.quantize_kv(full, dtype, per_batch=dtype != I8)
    cache = torch.zeros(batch, capacity, HEADS_KV, HEAD_DIM, dtype=dtype)
    scale = torch.zeros(batch, capacity, HEADS_KV) if dtype == I8 else scale_full
    for b, n in enumerate(cached):
        cache[b, :n] = codes_full[b, :n]
        if dtype == I8:
            scale[b, :n] = scale_full[b, :n]
    return cache, scale, codes_full


def same_bits(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype in (E4M3, E5M2) else torch.equal(a, b)


@pytest.mark.parametrize("k_dtype, v_dtype", [(I8, I8), (E4M3, E4M3), (E5M2, E5M2), (I8, E5M2), (E4M3, torch.float32)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16])
def test_quantised_cache_matches_the_dequantised_reference(k_dtype, v_dtype, causal, q_dtype):
    batch, capacity, new, seqlen_q = 2, 40, 3, 3
    cached = [5, 29]
    full_k = randn(batch, max(cached) + new, HEADS_KV, HEAD_DIM, seed=1) * 3
    full_v = randn(batch, max(cached) + new, HEADS_KV, HEAD_DIM, seed=2)
    full_k, full_v = full_k.to(q_dtype).float(), full_v.to(q_dtype).float()  # exactly representable in q_dtype
    k_cache, k_scale, k_codes = prefilled(full_k, cached, k_dtype, capacity)
    v_cache, v_scale, v_codes = prefilled(full_v, cached, v_dtype, capacity)
    k_new = torch.stack([full_k[b, n:n + new] for b, n in enumerate(cached)]).to(q_dtype)
    v_new = torch.stack([full_v[b, n:n + new] for b, n in enumerate(cached)]).to(q_dtype)
    if k_dtype == torch.float32:
        k_cache = k_cache.to(q_dtype)
    if v_dtype == torch.float32:
        v_cache = v_cache.to(q_dtype)
    kwargs = {}
    if k_dtype != torch.float32:
        kwargs.update(scales_kw("k", k_dtype, k_scale))
    if v_dtype != torch.float32:
        kwargs.update(scales_kw("v", v_dtype, v_scale))
    q = randn(batch, seqlen_q, HEADS_Q, HEAD_DIM, seed=3, dtype=q_dtype)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cached,
                                                 causal=causal, return_softmax_lse=True, **kwargs)
    assert out.dtype == q_dtype and lse.shape == (batch, HEADS_Q, seqlen_q)
    # The appended codes (and int8 scales) are quantize_kv's for the new tokens.
    for b, n in enumerate(cached):
        if k_dtype != torch.float32:
            assert same_bits(k_cache[b, n:n + new], k_codes[b, n:n + new])
        if v_dtype != torch.float32:
            assert same_bits(v_cache[b, n:n + new], v_codes[b, n:n + new])
        if k_dtype == I8:
            assert torch.equal(k_scale[b, n:n + new], flashattn.quantize_kv(full_k, I8)[1][b, n:n + new])
    keys = dequantised(k_cache, k_scale)
    values = dequantised(v_cache, v_scale)
    expected = reference(q, keys, values, [n + new for n in cached], causal)
    tol = 2e-5 if q_dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [I8, E4M3, E5M2])
def test_paged_quantised_cache_and_kvcache_append_store_what_the_attention_call_stores(dtype):
    batch, page_size, pages, new = 2, 4, 5, 6
    table = torch.tensor([[4, 0, 2], [1, 3, 5]], dtype=torch.int32)
    cached = torch.tensor([3, 5], dtype=torch.int32)
    k_new, v_new = randn(batch, new, HEADS_KV, HEAD_DIM, seed=4), randn(batch, new, HEADS_KV, HEAD_DIM, seed=5)
    kw = {}
    if dtype == I8:
        kw = dict(k_scale=torch.zeros(pages + 1, page_size, HEADS_KV), v_scale=torch.zeros(pages + 1, page_size, HEADS_KV))
    else:
        kw = dict(k_descale=flashattn.quantize_kv(k_new, dtype, per_batch=True)[1],
                  v_descale=flashattn.quantize_kv(v_new, dtype, per_batch=True)[1])
    caches = [torch.zeros(pages + 1, page_size, HEADS_KV, HEAD_DIM, dtype=dtype) for _ in range(4)]
    kw2 = {name: t.clone() for name, t in kw.items()}
    q = randn(batch, 1, HEADS_Q, HEAD_DIM, seed=6)
    out = flashattn.flash_attn_with_kvcache(q, caches[0], caches[1], k_new, v_new, cache_seqlens=cached,
                                            block_table=table, causal=True, **kw)
    flashattn.kvcache_append(caches[2], caches[3], k_new, v_new, cached, block_table=table, **kw2)
    assert same_bits(caches[0], caches[2]) and same_bits(caches[1], caches[3])
    for name in kw:
        assert torch.equal(kw[name], kw2[name])
    # Gather the pages into contiguous rows and check the attention against the reference.
    gather = lambda t: t[table.long()].reshape(batch, -1, *t.shape[2:])  # noqa: E731
    if dtype == I8:
        keys, values = dequantised(gather(caches[0]), gather(kw["k_scale"])), dequantised(gather(caches[1]),
                                                                                          gather(kw["v_scale"]))
    else:
        keys, values = dequantised(gather(caches[0]), kw["k_descale"]), dequantised(gather(caches[1]), kw["v_descale"])
    expected = reference(q, keys, values, (cached + new).tolist(), True)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_quantize_kv_int8_rules():
    x = torch.tensor([[[1.0, -2.0, 0.5, 127.0]], [[0.0, 0.0, 0.0, 0.0]], [[1.0, float("nan"), 2.0, 3.0]],
                      [[1.0, float("inf"), 2.0, 3.0]], [[254.0, 1.0, -3.0, 0.0]]])  # [5 tokens, 1 head, 4]
    codes, scale = flashattn.quantize_kv(x, I8)
    assert codes.dtype == I8 and scale.dtype == torch.float32 and scale.shape == (5, 1)
    assert codes[0, 0].tolist() == [1, -2, 0, 127]  # 0.5 rounds to even
    assert scale[1, 0] == 0 and codes[1].abs().sum() == 0
    assert torch.isnan(scale[2:4]).all() and codes[2:4].abs().sum() == 0
    assert codes[4, 0].tolist() == [127, 0, -2, 0] and scale[4, 0] == torch.tensor(254.0) / 127  # 0.5, -1.5: even
    # The library stores the same codes and scales (NaN and inf rows included).
    k_cache = torch.full((1, 8, 1, 4), 9, dtype=I8)
    k_scale = torch.zeros(1, 8, 1)
    flashattn.kvcache_append(k_cache, k_cache.clone(), x[None], x[None], 0, k_scale=k_scale,
                             v_scale=torch.zeros(1, 8, 1))
    assert torch.equal(k_cache[0, :5], codes)
    torch.testing.assert_close(k_scale[0, :5], scale, equal_nan=True, atol=0, rtol=0)
    assert (k_cache[0, 5:] == 9).all()


@pytest.mark.parametrize("dtype, fp8_max, max_code", [(E4M3, 448.0, 0x7E), (E5M2, 57344.0, 0x7B)])
def test_quantize_kv_fp8_saturates_and_maps_nan_like_the_library(dtype, fp8_max, max_code):
    x = torch.tensor([2.0, -2.0, float("inf"), float("-inf"), float("nan"), 1e-9, -0.0, 1.0]).reshape(1, 1, 1, 8)
    codes, descale = flashattn.quantize_kv(x, dtype, per_batch=True)
    assert descale.shape == (1, 1) and descale.item() == pytest.approx(2.0 / fp8_max)  # inf/NaN left out of the max
    bits = codes.view(torch.uint8).flatten().tolist()
    assert bits[0] == max_code and bits[1] == 0x80 | max_code
    assert bits[2] == max_code and bits[3] == 0x80 | max_code  # saturating, not inf / NaN
    assert bits[4] == 0x7F and bits[6] == 0x80
    k_cache = torch.zeros(1, 8, 1, 8, dtype=dtype)
    flashattn.kvcache_append(k_cache, k_cache.clone(), x, x, 0, k_descale=descale, v_descale=descale)
    assert same_bits(k_cache[:, :1], codes)
    # Without per_batch: one descale per kv head over everything else.
    y = randn(3, 5, HEADS_KV, HEAD_DIM, seed=7)
    codes, descale = flashattn.quantize_kv(y, dtype)
    assert descale.shape == (HEADS_KV,)
    torch.testing.assert_close(descale, y.abs().amax(dim=(0, 1, 3)) / fp8_max)
    assert codes.float().abs().amax() <= fp8_max


def rotate(x, cos, sin, positions, interleaved):
    """float64 rotary of x [batch, seqlen, heads, d] at positions [batch, seqlen]."""
    x = x.double().clone()
    half = cos.shape[1]
    c = cos.double()[positions][:, :, None, :]
    s = sin.double()[positions][:, :, None, :]
    if interleaved:
        a, b = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, b * c + a * s
    return x


def rotary_tables(max_position, rotary_dim):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().float(), angles.sin().float()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2])
def test_rotary_matches_a_torch_reference(interleaved, causal, rotary_dim):
    # seqlen_q == seqlen_new, FlashAttention-2's decode/prefill shape: query i then sits at the position of
    # new key i under causal.
    batch, capacity, new, seqlen_q = 2, 32, 3, 3
    cached = [4, 11]
    k_cache, v_cache = randn(batch, capacity, HEADS_KV, HEAD_DIM, seed=8), randn(batch, capacity, HEADS_KV, HEAD_DIM,
                                                                                 seed=9)
    before = k_cache.clone()
    k_new, v_new = randn(batch, new, HEADS_KV, HEAD_DIM, seed=10), randn(batch, new, HEADS_KV, HEAD_DIM, seed=11)
    q = randn(batch, seqlen_q, HEADS_Q, HEAD_DIM, seed=12)
    cos, sin = rotary_tables(capacity, rotary_dim)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos.double(),
                                            rotary_sin=sin.double(), cache_seqlens=cached, causal=causal,
                                            rotary_interleaved=interleaved)
    k_positions = torch.tensor(cached)[:, None] + torch.arange(new)[None, :]
    lengths = [n + new for n in cached]
    if causal:  # each query at its aligned key position
        q_positions = torch.tensor(lengths)[:, None] - seqlen_q + torch.arange(seqlen_q)[None, :]
    else:  # FlashAttention-2: every query at the first new position
        q_positions = torch.tensor(cached)[:, None].expand(batch, seqlen_q)
    rotated_k = rotate(k_new, cos, sin, k_positions, interleaved)
    for b, n in enumerate(cached):
        torch.testing.assert_close(k_cache[b, n:n + new].double(), rotated_k[b], atol=1e-6, rtol=1e-6)
        assert torch.equal(k_cache[b, :n], before[b, :n]) and torch.equal(v_cache[b, n:n + new], v_new[b])
    expected = reference(rotate(q, cos, sin, q_positions, interleaved), k_cache, v_cache, lengths, causal)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_rotary_with_an_int8_cache_quantises_the_rotated_keys():
    batch, capacity, new = 1, 16, 4
    k_new, v_new = randn(batch, new, HEADS_KV, HEAD_DIM, seed=13), randn(batch, new, HEADS_KV, HEAD_DIM, seed=14)
    cos, sin = rotary_tables(capacity, HEAD_DIM)
    k_cache, v_cache = (torch.zeros(batch, capacity, HEADS_KV, HEAD_DIM, dtype=I8) for _ in range(2))
    k_scale, v_scale = torch.zeros(batch, capacity, HEADS_KV), torch.zeros(batch, capacity, HEADS_KV)
    flashattn.kvcache_append(k_cache, v_cache, k_new, v_new, [2], rotary_cos=cos, rotary_sin=sin,
                             rotary_interleaved=False, k_scale=k_scale, v_scale=v_scale)
    rotated = rotate(k_new, cos, sin, 2 + torch.arange(new)[None, :], False)
    torch.testing.assert_close(dequantised(k_cache, k_scale)[0, 2:2 + new], rotated[0],
                               atol=float(k_scale.max()) * 0.51, rtol=0)
    assert torch.equal(v_cache[:, 2:2 + new], flashattn.quantize_kv(v_new, I8)[0])


def test_errors_name_the_argument_and_leave_the_cache_untouched():
    q = randn(1, 1, HEADS_Q, HEAD_DIM)
    k = randn(1, 1, HEADS_KV, HEAD_DIM, seed=1)
    i8 = torch.zeros(1, 8, HEADS_KV, HEAD_DIM, dtype=I8)
    f32 = randn(1, 8, HEADS_KV, HEAD_DIM, seed=2)
    scale = torch.zeros(1, 8, HEADS_KV)
    with pytest.raises(ValueError, match="k_scale"):
        flashattn.flash_attn_with_kvcache(q, i8, f32, k, k, cache_seqlens=2)
    with pytest.raises(ValueError, match="k_descale"):
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k, cache_seqlens=2,
                                          k_descale=torch.ones(1, HEADS_KV))
    with pytest.raises(ValueError, match="k_scale: expected shape"):
        flashattn.flash_attn_with_kvcache(q, i8, f32, k, k, cache_seqlens=2, k_scale=torch.zeros(1, 8))
    with pytest.raises(TypeError, match="k_descale"):
        flashattn.flash_attn_with_kvcache(q, f32, f32, cache_seqlens=2, k_descale=[1.0])
    cos, sin = rotary_tables(8, HEAD_DIM)
    with pytest.raises(ValueError, match="rotary_cos: has shape"):
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k, cache_seqlens=2, rotary_cos=cos[0],
                                          rotary_sin=sin[0])
    with pytest.raises(ValueError, match="rotary_sin"):
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k, cache_seqlens=2, rotary_cos=cos,
                                          rotary_sin=sin[:, :2])
    with pytest.raises(ValueError, match="rotary_sin: is None"):
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k, cache_seqlens=2, rotary_cos=cos)
    wide_cos, wide_sin = rotary_tables(8, 2 * HEAD_DIM)
    with pytest.raises(ValueError, match="rotary"):
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k, cache_seqlens=2, rotary_cos=wide_cos,
                                          rotary_sin=wide_sin)
    with pytest.raises(ValueError, match="sequence 0"):  # position 7 + 1 past max_position 8
        flashattn.flash_attn_with_kvcache(q, f32, f32.clone(), k, k.clone(), cache_seqlens=7, rotary_cos=cos[:7],
                                          rotary_sin=sin[:7])
    with pytest.raises(TypeError, match="dtype"):
        flashattn.quantize_kv(f32, torch.float16)
    with pytest.raises(ValueError, match="per_batch"):
        flashattn.quantize_kv(f32[0], E4M3, per_batch=True)
    assert (i8 == 0).all() and (scale == 0).all()


def test_opcheck_and_compile_with_a_quantised_cache():
    q = randn(2, 1, HEADS_Q, HEAD_DIM)
    k = randn(2, 2, HEADS_KV, HEAD_DIM, seed=1)
    k_cache = torch.zeros(2, 8, HEADS_KV, HEAD_DIM, dtype=I8)
    v_cache = torch.zeros(2, 8, HEADS_KV, HEAD_DIM, dtype=E4M3)
    k_scale = torch.zeros(2, 8, HEADS_KV)
    descale = torch.full((2, HEADS_KV), 0.01)
    cos, sin = rotary_tables(8, HEAD_DIM)
    # opcheck's schema test multiplies the tensors, which torch does not do for float8 on the CPU: int8 here.
    torch.library.opcheck(torch.ops.flashattn.forward_kvcache.default,
                          (q, k_cache, k_cache.clone(), k, k, torch.tensor([3, 5], dtype=torch.int32), 0, None, 0.25, True, -1,
                           -1, 0.0, None, True, None, None, 0, 0, None, None, 0, k_scale, k_scale.clone(), None, None, cos,
                           sin, True))

    def step(q, k_cache, v_cache, k, k_scale):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, cache_seqlens=3, k_scale=k_scale,
                                                 v_descale=descale, rotary_cos=cos, rotary_sin=sin, causal=True)

    caches = [t.clone() for t in (k_cache, v_cache, k_scale)]
    eager = step(q, k_cache, v_cache, k, k_scale)
    compiled = torch.compile(step, fullgraph=True)(q, *caches[:2], k, caches[2])
    assert torch.equal(eager, compiled)
    assert torch.equal(k_cache, caches[0]) and same_bits(v_cache, caches[1]) and torch.equal(k_scale, caches[2])
