"""Packed variable-length batches through flashattn.forward_varlen/backward_varlen on NumPy
arrays, against the float64 reference run sequence by sequence; ragged lengths including 0 and 1;
merging packed partial results; errors naming the offsets."""

import numpy as np
import pytest

import flashattn
import reference

LENS_Q = [5, 0, 1, 17, 9, 1]
LENS_K = [5, 3, 1, 20, 7, 0]
HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 32


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def packed(lens_q=LENS_Q, lens_k=LENS_K, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lens_q), HEADS_Q, HEAD_DIM)).astype(dtype)
    k = rng.standard_normal((sum(lens_k), HEADS_KV, HEAD_DIM)).astype(dtype)
    v = rng.standard_normal((sum(lens_k), HEADS_KV, HEAD_DIM)).astype(dtype)
    return q, k, v, offsets(lens_q), offsets(lens_k), max(lens_q), max(lens_k)


BATCH = len(LENS_Q)
CASES = {
    "dense": {},
    "causal": {"causal": True},
    "window": {"window": (3, 2)},
    "causal-window-scale": {"causal": True, "window": (4, -1), "softmax_scale": 0.3},
    "softcap": {"softcap": 2.0, "causal": True},
    "alibi": {"alibi_slopes": np.linspace(0.1, 0.8, HEADS_Q, dtype=np.float32), "causal": True},
    "alibi-per-sequence": {"alibi_slopes": np.linspace(0.05, 1.0, BATCH * HEADS_Q, dtype=np.float32).reshape(
        BATCH, HEADS_Q)},
    "dropout": {"dropout_p": 0.25, "seed": 77, "offset": 5, "causal": True},
    "bias": {"bias": np.random.default_rng(9).standard_normal((BATCH, HEADS_Q, 17, 20)).astype(np.float32)},
    "block_mask": {"block_mask": np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=np.uint8), "block_size": (8, 8)},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_forward_and_backward_match_the_reference(case):
    options = CASES[case]
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    out, lse = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (HEADS_Q, q.shape[0])
    dout = np.random.default_rng(3).standard_normal(q.shape).astype(np.float32)
    dq, dk, dv = flashattn.backward_varlen(q, k, v, out, dout, lse, cu_q, cu_k, max_q, max_k, **options)
    ref = reference.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, dout, **options)
    np.testing.assert_allclose(out, ref[0], atol=3e-5, rtol=3e-5)
    np.testing.assert_allclose(lse, ref[1], atol=3e-5, rtol=3e-5)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[2:]):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4, err_msg=name)


def test_numpy_packed_batch_equals_its_sequences_run_alone():
    """Sequence by sequence through forward(): bit-identical is not promised across layouts, but
    every row agrees to float32 rounding, and empty sequences produce nothing."""
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    out, _ = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    for b in range(BATCH):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.start == rows.stop or keys.start == keys.stop:
            continue
        alone, _ = flashattn.forward(q[None, rows], k[None, keys], v[None, keys], causal=True)
        np.testing.assert_allclose(out[rows], alone[0], atol=1e-6, rtol=1e-6)


def test_numpy_offsets_as_lists_and_half_precision():
    q, k, v, cu_q, cu_k, max_q, max_k = packed(dtype=np.float16)
    out, lse = flashattn.forward_varlen(q, k, v, cu_q.tolist(), cu_k.tolist(), max_q, max_k, causal=True)
    ref = reference.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref[0], atol=3e-3, rtol=3e-3)


def test_numpy_modifier_gradients():
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    sinks = np.linspace(-1, 1, HEADS_Q).astype(np.float32)
    out, lse = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, sinks=sinks, causal=True)
    grads = flashattn.backward_varlen(q, k, v, out, out, lse, cu_q, cu_k, max_q, max_k, sinks=sinks, causal=True,
                                      return_modifier_grads=True)
    assert grads.dsinks.shape == (HEADS_Q,) and grads.dbias is None
    # dsinks sums the sink's gradient over every sequence's rows: the reference, sequence by sequence.
    want = np.zeros(HEADS_Q)
    for b in range(BATCH):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.start == rows.stop or keys.start == keys.stop:  # no rows, or no keys: no sink gradient
            continue
        ref = reference.attention(q[None, rows], k[None, keys], v[None, keys], out[None, rows], causal=True,
                                  sinks=sinks, return_modifier_grads=True)
        want += ref[5]
    np.testing.assert_allclose(grads.dsinks, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("cu_q, cu_k, message", [
    (np.array([0, 3, 2, 7], np.int32), np.array([0, 4, 5, 9], np.int32), "cu_seqlens_q"),
    (np.array([0, 3, 3, 7], np.int32), np.array([0, 4, 5, 10], np.int32), "cu_seqlens_k"),
    (np.array([1, 3, 3, 7], np.int32), np.array([0, 4, 5, 9], np.int32), "cu_seqlens_q"),
    (np.array([0, 3, 3, 7], np.int64), np.array([0, 4, 5, 9], np.int32), r"cu_seqlens_q: dtype int64"),
    (np.array([0, 3, 3, 7], np.int32), np.array([0, 4, 9], np.int32), r"cu_seqlens_k: expected shape \[4\]"),
    (np.array([], np.int32), np.array([0], np.int32), "cu_seqlens_q: is empty"),
])
def test_numpy_bad_offsets_raise_naming_them(cu_q, cu_k, message):
    q, k, v, _, _, _, _ = packed([3, 0, 4], [4, 1, 4])
    with pytest.raises((ValueError, TypeError), match=message):
        flashattn.forward_varlen(q, k, v, cu_q, cu_k, 4, 4)


def test_numpy_bad_max_seqlen_and_layout():
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q - 1, max_k)
    with pytest.raises(ValueError, match=r"q: has 4 dimensions, expected 3 \[total_tokens, heads, head_dim\]"):
        flashattn.forward_varlen(q[None], k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match="max_seqlen_k: 'x' is not an int"):
        flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, "x")
    out, lse = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match=r"lse: expected shape \[4, 33\] \(heads_q, total_q\)"):
        flashattn.backward_varlen(q, k, v, out, out, lse[:, :5], cu_q, cu_k, max_q, max_k)


def test_numpy_merge_partials_of_packed_key_halves_equals_the_whole():
    """Non-causal attention over two disjoint key halves of every sequence, merged by lse."""
    lens = [6, 1, 9]
    q, k, v, cu_q, cu_k, max_q, max_k = packed(lens, [8, 2, 10])
    whole, whole_lse = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    halves = []
    for first in (True, False):
        keys = [np.arange(cu_k[b], cu_k[b + 1])[: (cu_k[b + 1] - cu_k[b]) // 2] if first
                else np.arange(cu_k[b], cu_k[b + 1])[(cu_k[b + 1] - cu_k[b]) // 2:] for b in range(3)]
        index = np.concatenate(keys)
        halves.append(flashattn.forward_varlen(q, k[index], v[index], cu_q, offsets([len(x) for x in keys]), max_q,
                                               max_k))
    out, lse = flashattn.merge_partials([h[0] for h in halves], [h[1] for h in halves])
    np.testing.assert_allclose(out, whole, atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(lse, whole_lse, atol=2e-6, rtol=2e-6)


def test_inputs_are_released_exactly_once():
    import sys

    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    arrays = (q, k, v, cu_q, cu_k)
    before = [sys.getrefcount(x) for x in arrays]
    out, lse = flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    flashattn.backward_varlen(q, k, v, out, out, lse, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError):
        flashattn.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=2.0)  # fails inside the C call
    with pytest.raises(TypeError):
        flashattn.forward_varlen(q, k, v, cu_q, cu_k.astype(np.int64), max_q, max_k)  # fails binding cu_seqlens_k
    assert [sys.getrefcount(x) for x in arrays] == before
