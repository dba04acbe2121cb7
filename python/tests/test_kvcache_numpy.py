"""KV-cache decode through flashattn.forward_kvcache on NumPy arrays: contiguous and paged caches
(page sizes 1, 7, 16, 256), appends of one and several tokens, GQA, cache_seqlens as an int, a
list and an array; the cache after the append; merge_partials of two halves equal to the whole;
bad tables raise and leave the cache byte-identical."""

import numpy as np
import pytest

import flashattn
import reference

HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 32


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class Cache:
    """A cache of `capacity` tokens per sequence, contiguous (page_size None) or paged, with the
    pages of each sequence shuffled so that a wrong table lookup shows."""

    def __init__(self, batch, capacity, page_size=None, dtype=np.float32, seed=0):
        self.batch, self.capacity, self.page_size = batch, capacity, page_size
        if page_size is None:
            shape = (batch, capacity, HEADS_KV, HEAD_DIM)
            self.block_table = None
        else:
            pages_per_seq = -(-capacity // page_size)
            num_pages = batch * pages_per_seq + 3  # spare pages nobody uses
            order = np.random.default_rng(seed + 100).permutation(num_pages)[:batch * pages_per_seq]
            self.block_table = order.reshape(batch, pages_per_seq).astype(np.int32)
            shape = (num_pages, page_size, HEADS_KV, HEAD_DIM)
        self.k = rand(shape, seed + 1, dtype)
        self.v = rand(shape, seed + 2, dtype)

    def rows(self, cache, b, length):
        """Sequence b's first `length` tokens of cache (self.k or self.v): [length, heads_kv, d]."""
        if self.block_table is None:
            return cache[b, :length]
        return cache[self.block_table[b]].reshape(-1, HEADS_KV, HEAD_DIM)[:length]


def reference_decode(q, cache, lengths, **options):
    out = np.zeros(q.shape)
    lse = np.zeros((q.shape[0], HEADS_Q, q.shape[1]))
    for b, length in enumerate(lengths):
        if length == 0:  # an empty cache: zero rows, lse -inf
            lse[b] = -np.inf
            continue
        o, l = reference.attention(q[b:b + 1], cache.rows(cache.k, b, length)[None], cache.rows(cache.v, b, length)[None],
                                   **options)
        out[b], lse[b] = o[0], l[0]
    return out, lse


@pytest.mark.parametrize("page_size", [None, 1, 7, 16, 256])
@pytest.mark.parametrize("seqlen_new", [0, 1, 5])
def test_decode_after_append_matches_the_reference(page_size, seqlen_new):
    batch, capacity, seqlen_q = 3, 300, max(seqlen_new, 1)
    cache = Cache(batch, capacity, page_size)
    cached = [17, 0, 250]
    q = rand((batch, seqlen_q, HEADS_Q, HEAD_DIM), 7)
    k_new = rand((batch, seqlen_new, HEADS_KV, HEAD_DIM), 8) if seqlen_new else None
    v_new = rand((batch, seqlen_new, HEADS_KV, HEAD_DIM), 9) if seqlen_new else None
    before_k, before_v = cache.k.copy(), cache.v.copy()
    out, lse = flashattn.forward_kvcache(q, cache.k, cache.v, np.array(cached, np.int32), k=k_new, v=v_new,
                                         block_table=cache.block_table, causal=True)
    # The append, and nothing else, changed the caches.
    expect_k, expect_v = before_k.copy(), before_v.copy()
    for b, n in enumerate(cached):
        for i in range(seqlen_new):
            for expect, new in ((expect_k, k_new), (expect_v, v_new)):
                if page_size is None:
                    expect[b, n + i] = new[b, i]
                else:
                    expect[cache.block_table[b, (n + i) // page_size], (n + i) % page_size] = new[b, i]
    assert np.array_equal(cache.k, expect_k) and np.array_equal(cache.v, expect_v)
    ref_out, ref_lse = reference_decode(q, cache, [n + seqlen_new for n in cached], causal=True)
    np.testing.assert_allclose(out, ref_out, atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("cache_seqlens", [40, np.int32(40), [40, 40], (40, 40)])
def test_cache_seqlens_as_int_or_sequence(cache_seqlens):
    cache = Cache(2, 64, 16, dtype=np.float16)
    q = rand((2, 1, HEADS_Q, HEAD_DIM), 3, np.float16)
    out, _ = flashattn.forward_kvcache(q, cache.k, cache.v, cache_seqlens, block_table=cache.block_table.tolist(),
                                       window=(8, 0), softcap=5.0)
    ref, _ = reference_decode(q, cache, [40, 40], window=(8, 0), softcap=5.0)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=3e-3, rtol=3e-3)


def test_merge_of_two_cache_halves_equals_the_whole():
    cache = Cache(2, 128)
    q = rand((2, 3, HEADS_Q, HEAD_DIM), 4)
    whole, whole_lse = flashattn.forward_kvcache(q, cache.k, cache.v, 100)
    first = flashattn.forward_kvcache(q, cache.k[:, :50], cache.v[:, :50], 50)
    second = flashattn.forward_kvcache(q, cache.k[:, 50:], cache.v[:, 50:], 50)
    out, lse = flashattn.merge_partials([first[0], second[0]], [first[1], second[1]])
    np.testing.assert_allclose(out, whole, atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(lse, whole_lse, atol=2e-6, rtol=2e-6)


def test_merge_partials_rows_without_keys():
    out_a, out_b = rand((1, 2, 1, 4), 1), rand((1, 2, 1, 4), 2)
    lse_a = np.array([[[-np.inf, 0.5]]], np.float32)
    lse_b = np.array([[[-np.inf, -np.inf]]], np.float32)
    out, lse = flashattn.merge_partials([out_a, out_b], [lse_a, lse_b])
    assert (out[0, 0] == 0).all() and lse[0, 0, 0] == -np.inf  # every part empty: zero, -inf
    np.testing.assert_array_equal(out[0, 1], out_a[0, 1])  # one part: itself
    assert lse[0, 0, 1] == np.float32(0.5)


def test_merge_partials_bad_inputs():
    out = rand((1, 2, 1, 4), 1)
    lse = np.zeros((1, 1, 2), np.float32)
    with pytest.raises(ValueError, match="lses: has 1 tensors, outs 2"):
        flashattn.merge_partials([out, out], [lse])
    with pytest.raises(ValueError, match=r"outs\[1\]: shape differs"):
        flashattn.merge_partials([out, out[:, :1]], [lse, lse])
    with pytest.raises(ValueError, match=r"lses\[1\]: expected shape \[1, 1, 2\]"):
        flashattn.merge_partials([out, out], [lse, lse[:, :, :1]])


def bad_call(cache, q, k_new, cached, table=None):
    return lambda: flashattn.forward_kvcache(q, cache.k, cache.v, cached, k=k_new, v=k_new,
                                             block_table=cache.block_table if table is None else table)


def test_bad_inputs_raise_and_leave_the_cache_untouched():
    cache = Cache(2, 32, 8)
    q = rand((2, 1, HEADS_Q, HEAD_DIM), 5)
    k_new = rand((2, 2, HEADS_KV, HEAD_DIM), 6)
    before = cache.k.copy(), cache.v.copy()
    out_of_range = cache.block_table.copy()
    out_of_range[1, 0] = cache.k.shape[0]
    negative = cache.block_table.copy()
    negative[0, 1] = -1
    cases = [
        (bad_call(cache, q, k_new, [5, 31]), ValueError, "sequence 1"),  # 31 + 2 tokens > 32
        (bad_call(cache, q, k_new, [5, 3], out_of_range), ValueError, "sequence 1"),
        (bad_call(cache, q, k_new, [9, 3], negative), ValueError, "sequence 0"),
        (bad_call(cache, q, k_new, [-1, 3]), ValueError, "sequence 0"),
        (bad_call(cache, q, k_new.astype(np.float16), [5, 3]), ValueError, "k_new: dtype differs from q"),
        (bad_call(cache, q, k_new, [5, 3, 4]), ValueError, r"cache_seqlens: has 3 entries, expected 2"),
        (bad_call(cache, q, k_new, np.array([5, 3], np.int64)), TypeError, "cache_seqlens: dtype int64"),
        (bad_call(cache, q, k_new, [5, 3], cache.block_table.astype(np.int64)), TypeError, "block_table: dtype int64"),
        (bad_call(cache, q, k_new, [5, 3], cache.block_table[:1]), ValueError, r"block_table: expected shape \[2, any\]"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
        assert np.array_equal(cache.k, before[0]) and np.array_equal(cache.v, before[1]), message
    with pytest.raises(ValueError, match="v: is None; give k and v together"):
        flashattn.forward_kvcache(q, cache.k, cache.v, 3, k=k_new, block_table=cache.block_table)


def test_read_only_caches_can_be_read_but_not_appended_to():
    cache = Cache(1, 16)
    cache.k.flags.writeable = False
    q = rand((1, 1, HEADS_Q, HEAD_DIM), 5)
    out, _ = flashattn.forward_kvcache(q, cache.k, cache.v, 10)  # no append: reading is fine
    ref, _ = reference_decode(q, cache, [10])
    np.testing.assert_allclose(out, ref, atol=3e-5, rtol=3e-5)
    k_new = rand((1, 1, HEADS_KV, HEAD_DIM), 6)
    with pytest.raises(ValueError, match="k_cache: is read-only"):
        flashattn.forward_kvcache(q, cache.k, cache.v, 10, k=k_new, v=k_new)


def test_tables_past_a_sequences_length_are_not_read():
    """Padding entries (here -1) in block-table slots a sequence does not reach are allowed."""
    cache = Cache(2, 32, 8)
    table = cache.block_table.copy()
    table[0, 2:] = -1  # sequence 0 holds 12 tokens + 1 new: pages 0 and 1 only
    q = rand((2, 1, HEADS_Q, HEAD_DIM), 5)
    k_new = rand((2, 1, HEADS_KV, HEAD_DIM), 6)
    out, _ = flashattn.forward_kvcache(q, cache.k, cache.v, [12, 20], k=k_new, v=k_new, block_table=table)
    cache.block_table = table
    ref, _ = reference_decode(q, cache, [13, 21])
    np.testing.assert_allclose(out, ref, atol=3e-5, rtol=3e-5)


def test_inputs_are_released_exactly_once():
    """Every DLPack capsule the binding consumes is released once, on success and on failure
    (NumPy's capsule holds a reference to its array: a missed release leaks it)."""
    import sys

    cache = Cache(2, 32, 8)
    q = rand((2, 1, HEADS_Q, HEAD_DIM), 5)
    k_new = rand((2, 1, HEADS_KV, HEAD_DIM), 6)
    seqlens = np.array([3, 4], np.int32)
    arrays = (q, cache.k, cache.v, k_new, seqlens, cache.block_table)
    before = [sys.getrefcount(x) for x in arrays]
    out, lse = flashattn.forward_kvcache(q, cache.k, cache.v, seqlens, k=k_new, v=k_new, block_table=cache.block_table)
    with pytest.raises(ValueError):
        flashattn.forward_kvcache(q, cache.k, cache.v, np.array([3, 40], np.int32), k=k_new, v=k_new,
                                  block_table=cache.block_table)  # fails inside the C call
    with pytest.raises(TypeError):
        flashattn.forward_kvcache(q, cache.k, cache.v, seqlens, k=k_new, v=k_new,
                                  block_table=cache.block_table.astype(np.int64))  # fails binding the table
    merged = flashattn.merge_partials([out, out], [lse, lse])
    with pytest.raises(ValueError):
        flashattn.merge_partials([out, out[:, :, :1]], [lse, lse])
    del merged
    assert [sys.getrefcount(x) for x in arrays] == before
    assert sys.getrefcount(out) == 2 and sys.getrefcount(lse) == 2
