"""Score modifiers (softcap, ALiBi, sinks, bias) through flashattn.forward/backward on NumPy
arrays against the float64 reference: each alone and combined, forward and backward with dsinks
and dbias (return_modifier_grads), the bias's broadcasts, and bad inputs."""

import sys

import numpy as np
import pytest

import flashattn
import reference
from test_numpy import assert_close, make, qkv

BATCH, SEQLEN_Q, SEQLEN_K, HEADS_Q = 2, 37, 45, 4


def slopes(shape=(HEADS_Q,)):
    return np.random.default_rng(7).uniform(0.05, 0.5, shape).astype(np.float32)


def sink_logits():
    return make((HEADS_Q,), np.float32, 8)


def bias_of(shape, dtype=np.float32):
    return make(shape, dtype, 9)


FULL_BIAS = (BATCH, HEADS_Q, SEQLEN_Q, SEQLEN_K)
CASES = {
    "softcap": lambda: {"softcap": 2.0},
    "alibi": lambda: {"alibi_slopes": slopes()},
    "alibi-per-batch": lambda: {"alibi_slopes": slopes((BATCH, HEADS_Q)), "causal": True},
    "sinks": lambda: {"sinks": sink_logits()},
    "sinks-empty-rows": lambda: {"sinks": sink_logits(), "seqlens_k": [45, 0]},  # lse = sink, out = 0
    "bias": lambda: {"bias": bias_of(FULL_BIAS)},
    "bias-f16-no-batch": lambda: {"bias": bias_of(FULL_BIAS[1:], np.float16)},
    "bias-rows-broadcast": lambda: {"bias": bias_of((BATCH, 1, 1, SEQLEN_K))},
    "bias-stride-0": lambda: {"bias": np.broadcast_to(bias_of((1, HEADS_Q, SEQLEN_Q, SEQLEN_K)), FULL_BIAS)},
    "combined": lambda: {"causal": True, "softcap": 3.0, "alibi_slopes": slopes(), "sinks": sink_logits(),
                         "bias": bias_of((BATCH, 1, SEQLEN_Q, SEQLEN_K)), "seqlens_k": [40, 45],
                         "dropout_p": 0.1, "seed": 3},
}


def reduce_like(full, bias):
    """dbias per element [B, H, Sq, Sk] summed over the bias's broadcast axes (missing, size 1 or
    stride 0): the shape backward(return_modifier_grads=True) gives."""
    padded_shape = (1,) * (4 - bias.ndim) + bias.shape
    padded_strides = (0,) * (4 - bias.ndim) + bias.strides
    axes = tuple(a for a in range(3) if padded_shape[a] == 1 or padded_strides[a] == 0)
    summed = full.sum(axis=axes, keepdims=True)
    return summed.reshape([1 if (a + 4 - bias.ndim) in axes else n for a, n in enumerate(bias.shape)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_modifier_against_reference(case, dtype):
    opts = CASES[case]()
    q, k, v = qkv(dtype=dtype)
    dout = make(q.shape, dtype, 10)
    out, lse = flashattn.forward(q, k, v, **opts)
    ref_out, ref_lse, *ref_grads, ref_dsinks, ref_dbias = reference.attention(q, k, v, dout, **opts,
                                                                              return_modifier_grads=True)
    assert_close(out, ref_out, dtype, "out")
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    assert_close(lse[finite], ref_lse[finite], dtype, "lse")
    grads = flashattn.backward(q, k, v, out, dout, lse, **opts, return_modifier_grads=True)
    assert isinstance(grads, flashattn.Gradients)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert got.dtype == dtype
        assert_close(got, want, dtype, name)
    if "sinks" in opts:
        assert grads.dsinks.dtype == np.float32 and grads.dsinks.shape == (HEADS_Q,)
        assert_close(grads.dsinks, ref_dsinks, dtype, "dsinks")
    else:
        assert grads.dsinks is None
    if "bias" in opts:
        bias = opts["bias"]
        want = reduce_like(ref_dbias, bias)
        assert grads.dbias.dtype == bias.dtype and grads.dbias.shape == want.shape
        assert_close(grads.dbias, want, bias.dtype.type if bias.dtype == np.float16 else dtype, "dbias")
    else:
        assert grads.dbias is None
    plain = flashattn.backward(q, k, v, out, dout, lse, **opts)  # without the flag: (dq, dk, dv) as before
    assert type(plain) is tuple and len(plain) == 3 and np.array_equal(plain[0], grads.dq)


def test_reference_modifier_gradients_by_finite_differences():
    """The reference's hand-written dsinks/dbias/dq (softcap) against central differences of
    sum(out * dout), so the library is compared with a checked oracle."""
    q, k, v = qkv(batch=1, seqlen_q=5, seqlen_k=6, heads_q=2, heads_kv=1, head_dim=4)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    dout = make(q.shape, np.float64, 4)
    opts = {"causal": True, "softcap": 1.5, "alibi_slopes": slopes((2,)), "sinks": make((2,), np.float64, 5),
            "bias": make((1, 2, 5, 6), np.float64, 6)}
    _, _, dq, _, _, dsinks, dbias = reference.attention(q, k, v, dout, **opts, return_modifier_grads=True)

    def loss(**changed):
        args = {"q": q, **opts, **changed}
        return (reference.attention(args.pop("q"), k, v, **args)[0] * dout).sum()

    eps = 1e-6
    for name, value, grad in (("sinks", opts["sinks"], dsinks), ("bias", opts["bias"], dbias),
                              ("q", q, dq)):
        for index in [(0,) * value.ndim, tuple(n - 1 for n in value.shape)]:
            up, down = value.copy(), value.copy()
            up[index] += eps
            down[index] -= eps
            numeric = (loss(**{name: up}) - loss(**{name: down})) / (2 * eps)
            assert abs(numeric - grad[index]) < 1e-6 * max(1.0, abs(numeric)), (name, index, numeric, grad[index])


@pytest.mark.parametrize("options, error, message", [
    ({"alibi_slopes": np.ones(3, np.float32)}, ValueError, r"alibi_slopes: expected shape \[4\] \(heads_q\) or \[2, 4\]"),
    ({"alibi_slopes": np.ones(4, np.float64)}, TypeError, "alibi_slopes: dtype float64 is not supported"),
    ({"alibi_slopes": np.ones((4, 2), np.float32).T}, ValueError, "alibi_slopes: must be contiguous"),
    ({"sinks": np.ones((1, 4), np.float32)}, ValueError, r"sinks: expected shape \[4\] \(heads_q\)"),
    ({"sinks": np.ones(4, np.float16)}, TypeError, "sinks: dtype float16"),
    ({"bias": np.ones((2, 4, 37, 44), np.float32)}, ValueError, "bias: dimension 3 has size 44, which does not "
                                                                "broadcast to seqlen_k = 45"),
    ({"bias": np.ones((37, 1), np.float32)}, ValueError, "the key axis cannot broadcast"),
    ({"bias": np.ones((3, 37, 45), np.float32)}, ValueError, "bias: dimension 0 has size 3, which does not broadcast "
                                                             "to heads_q = 4"),
    ({"bias": np.ones((37, 90), np.float32)[:, ::2]}, ValueError, "bias: key-axis stride is 2; it must be 1"),
    ({"bias": np.ones((37, 45), np.int32)}, TypeError, "bias: dtype int32 is not supported"),
    ({"bias": np.ones((1, 2, 4, 37, 45), np.float32)}, ValueError, "bias: has 5 dimensions"),
    ({"softcap": -1.0}, ValueError, "softcap"),
])
def test_bad_modifiers(options, error, message):
    q, k, v = qkv()
    with pytest.raises(error, match=message) as info:
        flashattn.forward(q, k, v, **options)
    assert info.value.status == 1


def test_bad_modifier_grad_outputs_write_nothing_and_leak_nothing():
    q, k, v = qkv()
    sinks, bias = sink_logits(), bias_of((HEADS_Q, SEQLEN_Q, SEQLEN_K))
    out, lse = flashattn.forward(q, k, v, sinks=sinks, bias=bias)
    dsinks = np.full(HEADS_Q, 7.0, np.float32)
    dbias = np.full((HEADS_Q, SEQLEN_Q, SEQLEN_K), 7.0, np.float32)
    options = (0.0, False, -1, -1, None, 0.0, 0, 0, None, 128, 128, 0.0, None, sinks, bias, None, 0, None)
    before = [sys.getrefcount(x) for x in (q, sinks, bias, dsinks, dbias)]
    with pytest.raises(ValueError, match=r"dsinks: expected shape \[4\]"):
        flashattn._native.backward(q, k, v, out, out, lse, None, None, None, dsinks[:2], dbias, *options)
    with pytest.raises(ValueError, match="dbias: needs bias"):
        flashattn._native.backward(q, k, v, out, out, lse, None, None, None, dsinks, dbias, *options[:14], None,
                                   *options[15:])
    with pytest.raises(ValueError, match="dsinks: needs sinks"):
        flashattn._native.backward(q, k, v, out, out, lse, None, None, None, dsinks, None, *options[:13], None,
                                   *options[14:])
    assert (dsinks == 7.0).all() and (dbias == 7.0).all()
    assert [sys.getrefcount(x) for x in (q, sinks, bias, dsinks, dbias)] == before
    # Caller-given outputs are written in place (the torch op's path).
    assert flashattn._native.backward(q, k, v, out, out, lse, None, None, None, dsinks, dbias, *options)[3:] == (None,
                                                                                                              None)
    grads = flashattn.backward(q, k, v, out, out, lse, sinks=sinks, bias=bias, return_modifier_grads=True)
    assert np.array_equal(dsinks, grads.dsinks) and np.array_equal(dbias, grads.dbias)
