"""The KV-cache call as a serving engine makes it: ragged queries (cu_seqlens_q, cu_seqlens_k_new),
cache slots (cache_batch_idx) and left padding (cache_leftpad), the split-KV chunk size
(kv_split_tokens; num_splits in flash_attn_with_kvcache). NumPy arrays through
flashattn.forward_kvcache, torch tensors through flash_attn_with_kvcache: a ragged step against
the float64 reference, each sequence of a ragged batch against the same sequence alone (bit for
bit), slots and left padding against the same keys laid out plainly, num_splits as a chunk size,
bad tables (named, nothing written), torch.compile, fake tensors and opcheck of the ragged form."""

import os
import sys

import numpy as np
import pytest

import flashattn
import reference
from test_kvcache_numpy import HEAD_DIM, HEADS_KV, HEADS_Q, Cache, rand

# (cached, queries, new tokens) per sequence: one-token decodes, prefill chunks, a sequence that
# only appends, one with nothing cached, one that appends nothing, caches past the default split's
# 256-key chunks.
MIXED = [(700, 1, 1), (40, 9, 9), (300, 0, 5), (0, 6, 6), (1100, 3, 0), (257, 1, 1), (33, 70, 70)]
# Sequences whose new tokens are their queries (cu_seqlens_k_new None: k packed like q).
SAME = [(700, 1, 1), (40, 9, 9), (0, 6, 6), (257, 1, 1), (33, 70, 70)]
CAPACITY = 1280


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class Step:
    """One ragged serving step over a cache of CAPACITY tokens per sequence (paged when page_size)."""

    def __init__(self, seqs, page_size=None, dtype=np.float32, seed=0):
        self.seqs = seqs
        self.cached = np.array([s[0] for s in seqs], np.int32)
        self.cu_q = offsets([s[1] for s in seqs])
        self.cu_new = offsets([s[2] for s in seqs])
        self.q = rand((int(self.cu_q[-1]), HEADS_Q, HEAD_DIM), seed + 10, dtype)
        self.k = rand((int(self.cu_new[-1]), HEADS_KV, HEAD_DIM), seed + 11, dtype)
        self.v = rand((int(self.cu_new[-1]), HEADS_KV, HEAD_DIM), seed + 12, dtype)
        self.cache = Cache(len(seqs), CAPACITY, page_size, dtype, seed)

    def caches(self):
        """Fresh copies of the caches before the step."""
        return self.cache.k.copy(), self.cache.v.copy()

    def run(self, k_cache, v_cache, same_new=False, **options):
        return flashattn.forward_kvcache(self.q, k_cache, v_cache, self.cached, k=self.k, v=self.v,
                                         block_table=self.cache.block_table, cu_seqlens_q=self.cu_q,
                                         max_seqlen_q=max(s[1] for s in self.seqs),
                                         cu_seqlens_k_new=None if same_new else self.cu_new, **options)


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seqs", [MIXED, SAME], ids=["cu_seqlens_k_new", "new_packed_like_q"])
def test_ragged_step_matches_the_reference(page_size, causal, seqs):
    step = Step(seqs, page_size)
    k_cache, v_cache = step.caches()
    out, lse = step.run(k_cache, v_cache, same_new=seqs is SAME, causal=causal)
    assert out.shape == step.q.shape and lse.shape == (HEADS_Q, step.q.shape[0])
    ref_out, ref_lse, ref_k, ref_v = reference.kvcache_attention(
        step.q, step.cache.k, step.cache.v, step.cached, step.k, step.v, block_table=step.cache.block_table,
        cu_seqlens_q=step.cu_q, cu_seqlens_k_new=None if seqs is SAME else step.cu_new, causal=causal)
    assert np.array_equal(k_cache, ref_k) and np.array_equal(v_cache, ref_v)  # the append, and nothing else
    np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5)


def test_ragged_step_with_modifiers_matches_the_reference():
    step = Step(MIXED, 16, seed=3)
    k_cache, v_cache = step.caches()
    slopes = np.linspace(0.05, 0.4, len(MIXED) * HEADS_Q).reshape(len(MIXED), HEADS_Q).astype(np.float32)
    sinks = np.linspace(-1.0, 1.0, HEADS_Q).astype(np.float32)
    options = dict(causal=True, window=(300, 0), softcap=5.0, alibi_slopes=slopes, sinks=sinks)
    out, lse = step.run(k_cache, v_cache, **options)
    ref_out, ref_lse, _, _ = reference.kvcache_attention(
        step.q, step.cache.k, step.cache.v, step.cached, step.k, step.v, block_table=step.cache.block_table,
        cu_seqlens_q=step.cu_q, cu_seqlens_k_new=step.cu_new, **options)
    np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("kv_split_tokens", [0, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_each_sequence_of_a_ragged_batch_equals_itself_alone(page_size, kv_split_tokens, dtype):
    """The library's promise: a sequence's result does not depend on the rest of the batch. Alone
    means a padded call of batch 1 (a sequence without queries is run with one, and only its cache
    compared); the batch is also run in reverse order."""
    step = Step(MIXED, page_size, dtype)
    k_cache, v_cache = step.caches()
    out, lse = step.run(k_cache, v_cache, causal=True, kv_split_tokens=kv_split_tokens)
    order = list(reversed(range(len(MIXED))))
    reverse = Step([MIXED[b] for b in order], page_size, dtype)
    reverse.q = np.concatenate([step.q[step.cu_q[b]:step.cu_q[b + 1]] for b in order])
    reverse.k = np.concatenate([step.k[step.cu_new[b]:step.cu_new[b + 1]] for b in order])
    reverse.v = np.concatenate([step.v[step.cu_new[b]:step.cu_new[b + 1]] for b in order])
    if page_size is None:
        reverse.cache.k, reverse.cache.v = step.cache.k[order].copy(), step.cache.v[order].copy()
    else:
        reverse.cache.k, reverse.cache.v = step.caches()
        reverse.cache.block_table = step.cache.block_table[order].copy()
    rev_k, rev_v = reverse.caches()
    rev_out, rev_lse = reverse.run(rev_k, rev_v, causal=True, kv_split_tokens=kv_split_tokens)
    for b, (cached, queries, new) in enumerate(MIXED):
        if page_size is None:
            alone_k, alone_v, table = step.cache.k[b:b + 1].copy(), step.cache.v[b:b + 1].copy(), None
        else:
            (alone_k, alone_v), table = step.caches(), step.cache.block_table[b:b + 1]
        q = step.q[step.cu_q[b]:step.cu_q[b + 1]][None] if queries else rand((1, 1, HEADS_Q, HEAD_DIM), 5, dtype)
        k = step.k[step.cu_new[b]:step.cu_new[b + 1]][None] if new else None
        v = step.v[step.cu_new[b]:step.cu_new[b + 1]][None] if new else None
        alone_out, alone_lse = flashattn.forward_kvcache(q, alone_k, alone_v, [cached], k=k, v=v, block_table=table,
                                                         causal=True, kv_split_tokens=kv_split_tokens)
        rows = slice(step.cu_q[b], step.cu_q[b + 1])
        r = order.index(b)
        rev_rows = slice(reverse.cu_q[r], reverse.cu_q[r + 1])
        if queries:
            assert np.array_equal(out[rows], alone_out[0]), "sequence %d" % b
            assert np.array_equal(lse[:, rows], alone_lse[0]), "sequence %d" % b
        assert np.array_equal(rev_out[rev_rows], out[rows]) and np.array_equal(rev_lse[:, rev_rows], lse[:, rows])
        if page_size is None:
            assert np.array_equal(k_cache[b], alone_k[0]) and np.array_equal(v_cache[b], alone_v[0])
            assert np.array_equal(rev_k[r], k_cache[b]) and np.array_equal(rev_v[r], v_cache[b])
        else:
            pages = step.cache.block_table[b]
            assert np.array_equal(k_cache[pages], alone_k[pages]) and np.array_equal(v_cache[pages], alone_v[pages])
            assert np.array_equal(rev_k[pages], k_cache[pages]) and np.array_equal(rev_v[pages], v_cache[pages])


class Slots:
    """Three sequences in rows ROWS of a pool of five rows, each ignoring its first LEFTPAD
    positions, and the same keys laid out plainly: row b holds sequence b's keys from position 0."""
    ROWS, LEFTPAD, CACHED, POOL, CAPACITY = [3, 0, 4], [5, 0, 12], [20, 7, 30], 5, 96

    def __init__(self, seed=0):
        self.pool = Cache(self.POOL, self.CAPACITY, seed=seed)
        plain_k = np.zeros((3, self.CAPACITY, HEADS_KV, HEAD_DIM), np.float32)
        plain_v = np.zeros_like(plain_k)
        for b, (row, pad, cached) in enumerate(zip(self.ROWS, self.LEFTPAD, self.CACHED)):
            plain_k[b, :cached - pad] = self.pool.k[row, pad:cached]
            plain_v[b, :cached - pad] = self.pool.v[row, pad:cached]
        self.plain_k, self.plain_v = plain_k, plain_v
        self.plain_cached = [c - p for c, p in zip(self.CACHED, self.LEFTPAD)]


@pytest.mark.parametrize("kv_split_tokens", [0, 8])
@pytest.mark.parametrize("table_kind", ["array", "list"])
def test_slots_and_left_padding_equal_the_keys_laid_out_plainly(kv_split_tokens, table_kind):
    s = Slots()
    q = rand((3, 2, HEADS_Q, HEAD_DIM), 1)
    k_new, v_new = rand((3, 2, HEADS_KV, HEAD_DIM), 2), rand((3, 2, HEADS_KV, HEAD_DIM), 3)
    slopes = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    options = dict(causal=True, alibi_slopes=slopes, kv_split_tokens=kv_split_tokens)
    pool_k, pool_v = s.pool.k.copy(), s.pool.v.copy()
    rows, pads = (np.array(s.ROWS, np.int32), np.array(s.LEFTPAD, np.int32)) if table_kind == "array" else (
        s.ROWS, s.LEFTPAD)
    out, lse = flashattn.forward_kvcache(q, pool_k, pool_v, s.CACHED, k=k_new, v=v_new, cache_batch_idx=rows,
                                         cache_leftpad=pads, **options)
    plain_out, plain_lse = flashattn.forward_kvcache(q, s.plain_k, s.plain_v, s.plain_cached, k=k_new, v=v_new,
                                                     **options)
    assert np.array_equal(out, plain_out) and np.array_equal(lse, plain_lse)
    # The pool: each sequence's row gained its new tokens at cache_seqlens; nothing else moved.
    expect_k, expect_v = s.pool.k.copy(), s.pool.v.copy()
    for b, (row, cached) in enumerate(zip(s.ROWS, s.CACHED)):
        expect_k[row, cached:cached + 2], expect_v[row, cached:cached + 2] = k_new[b], v_new[b]
    assert np.array_equal(pool_k, expect_k) and np.array_equal(pool_v, expect_v)
    ref_out, ref_lse, _, _ = reference.kvcache_attention(q, s.pool.k, s.pool.v, s.CACHED, k_new, v_new,
                                                         cache_batch_idx=s.ROWS, cache_leftpad=s.LEFTPAD, causal=True,
                                                         alibi_slopes=slopes)
    np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5)


def test_ragged_queries_with_slots_and_left_padding_match_the_reference():
    s = Slots(seed=4)
    lengths_q, lengths_new = [1, 0, 5], [1, 3, 5]
    cu_q, cu_new = offsets(lengths_q), offsets(lengths_new)
    q = rand((6, HEADS_Q, HEAD_DIM), 1)
    k_new, v_new = rand((9, HEADS_KV, HEAD_DIM), 2), rand((9, HEADS_KV, HEAD_DIM), 3)
    pool_k, pool_v = s.pool.k.copy(), s.pool.v.copy()
    out, lse = flashattn.forward_kvcache(q, pool_k, pool_v, np.array(s.CACHED, np.int32), k=k_new, v=v_new,
                                         cu_seqlens_q=cu_q, max_seqlen_q=5, cu_seqlens_k_new=cu_new,
                                         cache_batch_idx=np.array(s.ROWS, np.int32), cache_leftpad=s.LEFTPAD,
                                         causal=True)
    ref_out, ref_lse, ref_k, ref_v = reference.kvcache_attention(
        q, s.pool.k, s.pool.v, s.CACHED, k_new, v_new, cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_new,
        cache_batch_idx=s.ROWS, cache_leftpad=s.LEFTPAD, causal=True)
    assert np.array_equal(pool_k, ref_k) and np.array_equal(pool_v, ref_v)
    np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5)
    # One left padding for every sequence, as an int.
    same, _ = flashattn.forward_kvcache(q, s.pool.k.copy(), s.pool.v.copy(), s.CACHED, k=k_new, v=v_new,
                                        cu_seqlens_q=cu_q, max_seqlen_q=5, cu_seqlens_k_new=cu_new,
                                        cache_batch_idx=s.ROWS, cache_leftpad=4, causal=True)
    ref_same, _, _, _ = reference.kvcache_attention(q, s.pool.k, s.pool.v, s.CACHED, k_new, v_new, cu_seqlens_q=cu_q,
                                                    cu_seqlens_k_new=cu_new, cache_batch_idx=s.ROWS, cache_leftpad=4,
                                                    causal=True)
    np.testing.assert_allclose(same, ref_same, atol=3e-5, rtol=3e-5)


def test_kv_split_tokens_reaches_the_library():
    """Each chunk size agrees with the reference; chunks of 1 and of the whole cache round
    differently, which shows the size is the one the library used."""
    step = Step(MIXED[:5], None, seed=6)
    results = {}
    for split in (0, 1, 64, CAPACITY):
        k_cache, v_cache = step.caches()
        results[split] = step.run(k_cache, v_cache, causal=True, kv_split_tokens=split)
    ref_out, ref_lse, _, _ = reference.kvcache_attention(step.q, step.cache.k, step.cache.v, step.cached, step.k,
                                                         step.v, cu_seqlens_q=step.cu_q, cu_seqlens_k_new=step.cu_new,
                                                         causal=True)
    for split, (out, lse) in results.items():
        np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5, err_msg="kv_split_tokens=%d" % split)
        np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5, err_msg="kv_split_tokens=%d" % split)
    assert not np.array_equal(results[1][0], results[CAPACITY][0])
    with pytest.raises(ValueError, match="kv_split_tokens: -1 is negative"):
        step.run(*step.caches(), kv_split_tokens=-1)


def test_bad_tables_raise_naming_the_entry_and_write_nothing():
    s = Slots()
    pool_k, pool_v = s.pool.k.copy(), s.pool.v.copy()
    q = rand((3, 1, HEADS_Q, HEAD_DIM), 1)
    k_new = rand((3, 1, HEADS_KV, HEAD_DIM), 2)
    paged = Cache(3, 32, 8)
    paged_k, paged_v = paged.k.copy(), paged.v.copy()

    def call(**kwargs):
        options = dict(cache_seqlens=s.CACHED, k=k_new, v=k_new, cache_batch_idx=s.ROWS)
        options.update(kwargs)
        caches = (paged_k, paged_v) if options.get("block_table") is not None else (pool_k, pool_v)
        seqlens = options.pop("cache_seqlens")
        return flashattn.forward_kvcache(options.pop("q", q), *caches, seqlens, **options)

    cases = [
        (dict(cache_batch_idx=[3, 0, 5]), ValueError, r"cache_batch_idx\[2\]: slot 5 of sequence 2 is outside"),
        (dict(cache_batch_idx=[3, -1, 4]), ValueError, r"cache_batch_idx\[1\]"),
        (dict(cache_leftpad=[5, 8, 0]), ValueError, r"cache_leftpad\[1\]: 8 is outside \[0, 7\]"),
        (dict(cache_batch_idx=[3, 0]), ValueError, "cache_batch_idx: has 2 entries, expected 3"),
        (dict(cache_batch_idx=np.array(s.ROWS, np.int64)), TypeError, "cache_batch_idx: dtype int64"),
        (dict(cache_batch_idx=None), ValueError, "batch 5 differs from the 3 sequences"),
        (dict(cache_leftpad=5.5), TypeError, "cache_leftpad: float is not an int32 tensor or a sequence of ints"),
        (dict(cache_batch_idx=None, cache_leftpad=[0, 0, 0], block_table=paged.block_table), NotImplementedError,
         "cache_leftpad apply to contiguous caches only"),
        (dict(block_table=paged.block_table), NotImplementedError, "cache_batch_idx and cache_leftpad apply to"),
        (dict(kv_split_tokens=-3), ValueError, "kv_split_tokens: -3 is negative"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            call(**kwargs)
        assert np.array_equal(pool_k, s.pool.k) and np.array_equal(pool_v, s.pool.v), message
        assert np.array_equal(paged_k, paged.k) and np.array_equal(paged_v, paged.v), message
    with pytest.raises(flashattn.NotSupportedError):
        call(cache_batch_idx=None, cache_leftpad=0, block_table=paged.block_table)


def test_bad_ragged_arguments_raise_and_write_nothing():
    step = Step(MIXED[:3], None, seed=2)
    k_cache, v_cache = step.caches()
    base = dict(k=step.k, v=step.v, cu_seqlens_q=step.cu_q, cu_seqlens_k_new=step.cu_new, causal=True)
    bad_q = step.cu_q.copy()
    bad_q[1] = bad_q[2] + 1  # decreasing
    cases = [
        (dict(base, cu_seqlens_k_new=None), ValueError, "k_new: 15 rows differ from q's 10"),
        (dict(base, k=None, v=None), ValueError, "cu_seqlens_k_new: packs k and v, which are None"),
        (dict(base, cu_seqlens_q=None), ValueError, "cu_seqlens_k_new: needs cu_seqlens_q"),
        (dict(base, cu_seqlens_q=bad_q), ValueError, "cu_seqlens_q"),
        (dict(base, cu_seqlens_k_new=step.cu_new[:-1]), ValueError, r"cu_seqlens_k_new: expected shape \[4\], got \[3\]"),
        (dict(base, k=step.k[None], v=step.v[None]), ValueError, "k: has 4 dimensions, expected 3"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            flashattn.forward_kvcache(step.q, k_cache, v_cache, step.cached, **kwargs)
        assert np.array_equal(k_cache, step.cache.k) and np.array_equal(v_cache, step.cache.v), message
    with pytest.raises(ValueError, match="q: has 4 dimensions, expected 3"):
        flashattn.forward_kvcache(step.q[None], k_cache, v_cache, step.cached, cu_seqlens_q=step.cu_q)
    with pytest.raises(ValueError, match=r"cache_seqlens: has 4 entries, expected 3"):
        flashattn.forward_kvcache(step.q, k_cache, v_cache, [1, 2, 3, 4], cu_seqlens_q=step.cu_q)


def test_inputs_and_tables_are_released_exactly_once():
    s = Slots()
    pool_k, pool_v = s.pool.k.copy(), s.pool.v.copy()
    q = rand((3, HEADS_Q, HEAD_DIM), 1)
    k_new = rand((3, HEADS_KV, HEAD_DIM), 2)
    cu = np.array([0, 1, 2, 3], np.int32)
    rows, pads, seqlens = (np.array(x, np.int32) for x in (s.ROWS, s.LEFTPAD, s.CACHED))
    arrays = (q, pool_k, pool_v, k_new, cu, rows, pads, seqlens)
    before = [sys.getrefcount(x) for x in arrays]
    out, lse = flashattn.forward_kvcache(q, pool_k, pool_v, seqlens, k=k_new, v=k_new, cu_seqlens_q=cu,
                                         cu_seqlens_k_new=cu, cache_batch_idx=rows, cache_leftpad=pads)
    with pytest.raises(ValueError):  # fails inside the C call
        flashattn.forward_kvcache(q, pool_k, pool_v, seqlens, k=k_new, v=k_new, cu_seqlens_q=cu, cu_seqlens_k_new=cu,
                                  cache_batch_idx=np.array([0, 9, 1], np.int32), cache_leftpad=pads)
    with pytest.raises(TypeError):  # fails binding the last table
        flashattn.forward_kvcache(q, pool_k, pool_v, seqlens, k=k_new, v=k_new, cu_seqlens_q=cu, cu_seqlens_k_new=cu,
                                  cache_batch_idx=rows, cache_leftpad=pads.astype(np.int64))
    assert [sys.getrefcount(x) for x in arrays] == before
    assert sys.getrefcount(out) == 2 and sys.getrefcount(lse) == 2


# ---- torch ------------------------------------------------------------------------------------
def _torch():
    if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1":
        pytest.importorskip("torch")
    import torch

    return torch


def torch_step(torch, seqs, page_size=None, seed=0):
    step = Step(seqs, page_size, seed=seed)
    t = {name: torch.from_numpy(getattr(step, name).copy()) for name in ("q", "k", "v", "cached", "cu_q", "cu_new")}
    t["k_cache"], t["v_cache"] = (torch.from_numpy(x) for x in step.caches())
    t["table"] = None if page_size is None else torch.from_numpy(step.cache.block_table)
    return step, t


def with_kvcache(t, **kwargs):
    return flashattn.flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"],
                                             cache_seqlens=t["cached"], block_table=t["table"], cu_seqlens_q=t["cu_q"],
                                             cu_seqlens_k_new=t["cu_new"], **kwargs)


@pytest.mark.parametrize("page_size", [None, 16])
def test_torch_ragged_step_matches_the_reference_and_the_numpy_call(page_size):
    torch = _torch()
    step, t = torch_step(torch, MIXED, page_size)
    out, lse = with_kvcache(t, max_seqlen_q=70, causal=True, return_softmax_lse=True)
    assert out.shape == t["q"].shape and lse.shape == (HEADS_Q, t["q"].shape[0]) and lse.dtype == torch.float32
    ref_out, ref_lse, ref_k, ref_v = reference.kvcache_attention(
        step.q, step.cache.k, step.cache.v, step.cached, step.k, step.v, block_table=step.cache.block_table,
        cu_seqlens_q=step.cu_q, cu_seqlens_k_new=step.cu_new, causal=True)
    assert np.array_equal(t["k_cache"].numpy(), ref_k) and np.array_equal(t["v_cache"].numpy(), ref_v)
    np.testing.assert_allclose(out.numpy(), ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=3e-5, rtol=3e-5)
    k_cache, v_cache = step.caches()
    np_out, np_lse = step.run(k_cache, v_cache, causal=True)
    assert np.array_equal(out.numpy(), np_out) and np.array_equal(lse.numpy(), np_lse)


def test_torch_ragged_sequences_equal_themselves_alone():
    torch = _torch()
    seqs = [s for s in MIXED if s[1]]
    _, t = torch_step(torch, seqs, 16)
    k_cache, v_cache = t["k_cache"].clone(), t["v_cache"].clone()
    out, lse = with_kvcache(t, causal=True, return_softmax_lse=True)
    for b, (cached, queries, new) in enumerate(seqs):
        rows = slice(int(t["cu_q"][b]), int(t["cu_q"][b + 1]))
        new_rows = slice(int(t["cu_new"][b]), int(t["cu_new"][b + 1]))
        k = t["k"][new_rows][None] if new else None
        v = t["v"][new_rows][None] if new else None
        alone, alone_lse = flashattn.flash_attn_with_kvcache(t["q"][rows][None], k_cache, v_cache, k, v,
                                                             cache_seqlens=[cached], block_table=t["table"][b:b + 1],
                                                             causal=True, return_softmax_lse=True)
        assert torch.equal(out[rows], alone[0]) and torch.equal(lse[:, rows], alone_lse[0]), "sequence %d" % b
    assert torch.equal(k_cache, t["k_cache"]) and torch.equal(v_cache, t["v_cache"])


def test_torch_slots_and_left_padding_equal_the_keys_laid_out_plainly():
    torch = _torch()
    s = Slots(seed=2)
    q = torch.from_numpy(rand((3, 2, HEADS_Q, HEAD_DIM), 1))
    k_new = torch.from_numpy(rand((3, 2, HEADS_KV, HEAD_DIM), 2))
    pool_k, pool_v = torch.from_numpy(s.pool.k.copy()), torch.from_numpy(s.pool.v.copy())
    for rows, pads in ((torch.tensor(s.ROWS, dtype=torch.int32), torch.tensor(s.LEFTPAD, dtype=torch.int32)),
                       (s.ROWS, tuple(s.LEFTPAD))):
        out = flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, k_new, cache_seqlens=s.CACHED,
                                                cache_batch_idx=rows, cache_leftpad=pads, causal=True)
        plain = flashattn.flash_attn_with_kvcache(q, torch.from_numpy(s.plain_k), torch.from_numpy(s.plain_v), k_new,
                                                  k_new, cache_seqlens=s.plain_cached, causal=True)
        assert torch.equal(out, plain)
    for b, (row, cached) in enumerate(zip(s.ROWS, s.CACHED)):
        assert torch.equal(pool_k[row, cached:cached + 2], k_new[b])
    assert torch.equal(pool_k[[1, 2]], torch.from_numpy(s.pool.k[[1, 2]]))  # rows nobody uses


def test_num_splits_and_kv_split_tokens_as_the_chunk_size(monkeypatch):
    """num_splits as FlashAttention means it: 1 = one chunk of the whole capacity, n > 1 = chunks of
    ceil(capacity / n) keys, 0 = the library's rule; kv_split_tokens takes precedence and must agree."""
    torch = _torch()
    from flashattn import _torch as module

    contiguous = Cache(2, 100)
    k_cache, v_cache = torch.from_numpy(contiguous.k), torch.from_numpy(contiguous.v)
    paged = Cache(2, 96, 16)
    paged_k, paged_v, paged_table = (torch.from_numpy(x) for x in (paged.k, paged.v, paged.block_table))
    q = torch.from_numpy(rand((2, 1, HEADS_Q, HEAD_DIM), 1))
    seen = []
    real = module._native

    class Recorder:
        def __getattr__(self, name):
            return getattr(real, name)

        def forward_kvcache(self, *args):
            seen.append(args[12])
            return real.forward_kvcache(*args)

    monkeypatch.setattr(module, "_native", Recorder())
    cases = [((0, None), 0), ((1, None), 100), ((3, None), 34), ((7, None), 15), ((0, 50), 50), ((3, 34), 34),
             ((1, 100), 100), ((0, 0), 0)]
    results = {}
    for (num_splits, split_tokens), expect in cases:
        out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=[100, 60], num_splits=num_splits,
                                                kv_split_tokens=split_tokens)
        assert seen.pop() == expect, (num_splits, split_tokens)
        results.setdefault(expect, out)
        assert torch.equal(out, results[expect])  # the same chunk size, the same bits
    flashattn.flash_attn_with_kvcache(q, paged_k, paged_v, cache_seqlens=40, block_table=paged_table, num_splits=4)
    assert seen.pop() == 24  # capacity 6 pages x 16
    for num_splits, split_tokens, message in ((3, 50, "kv_split_tokens: 50 conflicts with num_splits=3"),
                                              (2, 0, "kv_split_tokens: 0 conflicts with num_splits=2"),
                                              (-1, None, "num_splits: -1 is negative"),
                                              (0, -5, "kv_split_tokens: -5 is negative")):
        with pytest.raises(ValueError, match=message):
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=10, num_splits=num_splits,
                                              kv_split_tokens=split_tokens)
    assert not seen


def test_torch_bad_serving_arguments():
    torch = _torch()
    s = Slots()
    pool_k, pool_v = torch.from_numpy(s.pool.k.copy()), torch.from_numpy(s.pool.v.copy())
    q = torch.from_numpy(rand((3, 1, HEADS_Q, HEAD_DIM), 1))
    k_new = torch.from_numpy(rand((3, 1, HEADS_KV, HEAD_DIM), 2))
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\]: slot 7"):
        flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, k_new, cache_seqlens=s.CACHED,
                                          cache_batch_idx=[3, 7, 4])
    with pytest.raises(TypeError, match="cache_leftpad: dtype int64"):
        flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, k_new, cache_seqlens=s.CACHED,
                                          cache_batch_idx=s.ROWS, cache_leftpad=torch.tensor(s.LEFTPAD))
    with pytest.raises(TypeError, match="cache_batch_idx: str is not an int32 tensor"):
        flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=s.CACHED, cache_batch_idx="3")
    assert torch.equal(pool_k, torch.from_numpy(s.pool.k)) and torch.equal(pool_v, torch.from_numpy(s.pool.v))
    paged = Cache(3, 32, 8)
    with pytest.raises(NotImplementedError, match="cache_leftpad apply to contiguous caches only"):
        flashattn.flash_attn_with_kvcache(q, torch.from_numpy(paged.k), torch.from_numpy(paged.v), cache_seqlens=9,
                                          block_table=torch.from_numpy(paged.block_table), cache_leftpad=[1, 2, 3])
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q: must be an int32 tensor"):
        flashattn.flash_attn_with_kvcache(q[:, 0], pool_k, pool_v, cache_seqlens=s.CACHED, cache_batch_idx=s.ROWS,
                                          cu_seqlens_q=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="cu_seqlens_k_new: packs k and v, which are None"):
        flashattn.flash_attn_with_kvcache(q[:, 0], pool_k, pool_v, cache_seqlens=s.CACHED, cache_batch_idx=s.ROWS,
                                          cu_seqlens_q=cu, cu_seqlens_k_new=cu)
    with pytest.raises(ValueError, match="cu_seqlens_k_new: needs cu_seqlens_q"):
        flashattn.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, k_new, cache_seqlens=s.CACHED,
                                          cache_batch_idx=s.ROWS, cu_seqlens_k_new=cu)
    with pytest.raises(ValueError, match="rotary_sin: is None; give rotary_cos and rotary_sin together"):
        flashattn.flash_attn_with_kvcache(q[:, 0], pool_k, pool_v, cache_seqlens=s.CACHED, cache_batch_idx=s.ROWS,
                                          cu_seqlens_q=cu, rotary_cos=torch.zeros(1))


def test_compiled_ragged_step_appends_and_attends_like_eager():
    torch = _torch()

    def serve(q, k_cache, v_cache, k, v, seqlens, cu_q, cu_new, rows, pads):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=rows,
                                                 cache_leftpad=pads, cu_seqlens_q=cu_q, max_seqlen_q=4,
                                                 cu_seqlens_k_new=cu_new, causal=True, num_splits=2,
                                                 return_softmax_lse=True)

    compiled = torch.compile(serve, fullgraph=True)
    s = Slots(seed=5)
    k_eager, v_eager = torch.from_numpy(s.pool.k.copy()), torch.from_numpy(s.pool.v.copy())
    k_compiled, v_compiled = k_eager.clone(), v_eager.clone()
    seqlens = torch.tensor(s.CACHED, dtype=torch.int32)
    rows, pads = torch.tensor(s.ROWS, dtype=torch.int32), torch.tensor(s.LEFTPAD, dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 5, 6], dtype=torch.int32)
    cu_new = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    for step in range(3):
        q = torch.from_numpy(rand((6, HEADS_Q, HEAD_DIM), 10 + step))
        k = torch.from_numpy(rand((4, HEADS_KV, HEAD_DIM), 20 + step))
        v = torch.from_numpy(rand((4, HEADS_KV, HEAD_DIM), 30 + step))
        want, want_lse = serve(q, k_eager, v_eager, k, v, seqlens, cu_q, cu_new, rows, pads)
        got, got_lse = compiled(q, k_compiled, v_compiled, k, v, seqlens, cu_q, cu_new, rows, pads)
        assert got.shape == (6, HEADS_Q, HEAD_DIM) and got_lse.shape == (HEADS_Q, 6)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
        assert torch.equal(k_compiled, k_eager) and torch.equal(v_compiled, v_eager)
        seqlens += cu_new[1:] - cu_new[:-1]


def test_fake_tensors_give_the_ragged_shapes():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(11, HEADS_Q, HEAD_DIM)
        k_cache = torch.empty(4, 64, HEADS_KV, HEAD_DIM)
        k = torch.empty(5, HEADS_KV, HEAD_DIM)
        cu_q = torch.empty(4, dtype=torch.int32)
        cu_new = torch.empty(4, dtype=torch.int32)
        seqlens = torch.empty(3, dtype=torch.int32)
        rows = torch.empty(3, dtype=torch.int32)
        out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, k_cache, k, k, cache_seqlens=seqlens,
                                                     cache_batch_idx=rows, cache_leftpad=rows, cu_seqlens_q=cu_q,
                                                     max_seqlen_q=6, cu_seqlens_k_new=cu_new, causal=True,
                                                     return_softmax_lse=True)
        assert out.shape == (11, HEADS_Q, HEAD_DIM) and lse.shape == (HEADS_Q, 11) and lse.dtype == torch.float32
        out = flashattn.flash_attn_with_kvcache(q, k_cache, k_cache, cache_seqlens=seqlens, cu_seqlens_q=cu_q,
                                                cache_batch_idx=rows)
        assert out.shape == (11, HEADS_Q, HEAD_DIM)


def test_opcheck_ragged_kvcache_with_slots():
    torch = _torch()
    s = Slots(seed=7)
    k_cache, v_cache = torch.from_numpy(s.pool.k.copy()), torch.from_numpy(s.pool.v.copy())
    q = torch.from_numpy(rand((4, HEADS_Q, HEAD_DIM), 1))
    k = torch.from_numpy(rand((3, HEADS_KV, HEAD_DIM), 2))
    i32 = dict(dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashattn.forward_kvcache.default,
                          (q, k_cache, v_cache, k, k, torch.tensor(s.CACHED, **i32), 0, None, 0.25, True, -1, -1, 0.0,
                           None, True, torch.tensor([0, 2, 2, 4], **i32), torch.tensor([0, 1, 2, 3], **i32), 2, 3,
                           torch.tensor(s.ROWS, **i32), torch.tensor(s.LEFTPAD, **i32), 16))


def test_torch_eager_ragged_calls_skip_the_dispatcher_but_not_its_effects():
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    _, t = torch_step(torch, MIXED[:4], None, seed=9)
    copy = dict(t, k_cache=t["k_cache"].clone(), v_cache=t["v_cache"].clone())
    version = t["k_cache"]._version
    eager = with_kvcache(t, causal=True, cache_leftpad=[0, 3, 0, 0])
    assert t["k_cache"]._version > version
    with Record() as record:
        traced = with_kvcache(copy, causal=True, cache_leftpad=[0, 3, 0, 0])
    assert "flashattn.forward_kvcache.default" in record.ops
    assert torch.equal(traced, eager) and torch.equal(copy["k_cache"], t["k_cache"])


def test_torch_ragged_step_on_cuda_tensors():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not flashattn.backends()["cuda"].available:
        pytest.skip("flashattn CUDA backend unavailable: " + flashattn.backends()["cuda"].detail)
    s = Slots(seed=8)
    q = torch.from_numpy(rand((4, HEADS_Q, HEAD_DIM), 1)).half()
    k = torch.from_numpy(rand((3, HEADS_KV, HEAD_DIM), 2)).half()
    pool_k, pool_v = torch.from_numpy(s.pool.k).half(), torch.from_numpy(s.pool.v).half()
    cu_q, cu_new = torch.tensor([0, 2, 2, 4], dtype=torch.int32), torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    options = dict(cache_seqlens=s.CACHED, cache_batch_idx=s.ROWS, cache_leftpad=s.LEFTPAD, causal=True,
                   return_softmax_lse=True)
    want, want_lse = flashattn.flash_attn_with_kvcache(q, pool_k.clone(), pool_v.clone(), k, k, cu_seqlens_q=cu_q,
                                                       cu_seqlens_k_new=cu_new, **options)
    kc, vc = pool_k.cuda(), pool_v.cuda()
    got, got_lse = flashattn.flash_attn_with_kvcache(q.cuda(), kc, vc, k.cuda(), k.cuda(), cu_seqlens_q=cu_q.cuda(),
                                                     cu_seqlens_k_new=cu_new.cuda(), **options)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got_lse.cpu(), want_lse, atol=2e-3, rtol=2e-3)
    assert torch.equal(kc.cpu()[s.ROWS[0], s.CACHED[0]], k[0])
