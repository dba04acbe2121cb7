"""flashattn on NumPy arrays against the float64 reference: masks, GQA, strides, dtypes, dropout,
errors, and the small functions."""

import numpy as np
import pytest

import flashattn
import reference

TOLERANCE = {np.float32: 2e-5, np.float16: 2e-3}


def make(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def qkv(batch=2, seqlen_q=37, seqlen_k=45, heads_q=4, heads_kv=2, head_dim=32, dtype=np.float32, seed=0):
    return (make((batch, seqlen_q, heads_q, head_dim), dtype, seed),
            make((batch, seqlen_k, heads_kv, head_dim), dtype, seed + 1),
            make((batch, seqlen_k, heads_kv, head_dim), dtype, seed + 2))


CASES = {
    "dense": {},
    "causal": {"causal": True},
    "window": {"window": (7, 3)},
    "causal-window-scale": {"causal": True, "window": (5, -1), "softmax_scale": 0.3},
    "seqlens_k": {"seqlens_k": [45, 11]},
    "block_mask": {"block_mask": np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=np.uint8),
                   "block_size": (16, 16)},
    "dropout": {"dropout_p": 0.2, "seed": 1234, "offset": 7},
    "causal-dropout-padding": {"causal": True, "dropout_p": 0.1, "seed": 99, "seqlens_k": [30, 45]},
}


def assert_close(actual, expected, dtype, name):
    tol = TOLERANCE[dtype] * max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(np.asarray(actual, dtype=np.float64) - expected).max())
    assert err <= tol, "%s: max error %g > %g" % (name, err, tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_forward_backward_against_reference(case, dtype):
    opts = CASES[case]
    q, k, v = qkv(dtype=dtype)
    dout = make(q.shape, dtype, 10)
    out, lse = flashattn.forward(q, k, v, **opts)
    assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 4, 37)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = reference.attention(q, k, v, dout, **opts)
    assert_close(out, ref_out, dtype, "out")
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    assert_close(lse[finite], ref_lse[finite], np.float32 if dtype == np.float32 else dtype, "lse")
    dq, dk, dv = flashattn.backward(q, k, v, out, dout, lse, **opts)
    for name, got, want in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
        assert got.shape == want.shape and got.dtype == dtype
        assert_close(got, want, dtype, name)


def test_strided_views_are_read_in_place():
    """A [B, H, S, D] array transposed to [B, S, H, D], and a slice of a wider head_dim buffer."""
    rng = np.random.default_rng(3)
    q_bhsd = rng.standard_normal((2, 4, 33, 16)).astype(np.float32)
    kv_wide = rng.standard_normal((2, 40, 2, 48)).astype(np.float32)
    q = q_bhsd.transpose(0, 2, 1, 3)
    k, v = kv_wide[..., :16], kv_wide[..., 16:32]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out, lse = flashattn.forward(q, k, v, causal=True)
    ref_out, _ = reference.attention(q, k, v, causal=True)
    assert_close(out, ref_out, np.float32, "out")
    out_packed, _ = flashattn.forward(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                      causal=True)
    assert np.array_equal(out, out_packed)  # same result bit for bit: strides only change addressing
    dq, dk, dv = flashattn.backward(q, k, v, out, out, lse, causal=True)
    ref = reference.attention(q, k, v, out, causal=True)
    assert_close(dq, ref[2], np.float32, "dq")
    assert_close(dk, ref[3], np.float32, "dk")


def test_read_only_inputs():
    q, k, v = qkv()
    for x in (q, k, v):
        x.flags.writeable = False
    out, _ = flashattn.forward(q, k, v)
    assert_close(out, reference.attention(q, k, v)[0], np.float32, "out")
    assert out.flags.writeable


def test_dropout_is_deterministic_and_seeded():
    q, k, v = qkv()
    a, _ = flashattn.forward(q, k, v, dropout_p=0.3, seed=5)
    b, _ = flashattn.forward(q, k, v, dropout_p=0.3, seed=5)
    c, _ = flashattn.forward(q, k, v, dropout_p=0.3, seed=6)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dropout_mask():
    keep = flashattn.dropout_mask(42, 3, 0.25, 4, 64, 80, 1, 2)
    assert keep.dtype == np.uint8 and keep.shape == (64, 80)
    assert set(np.unique(keep)) <= {0, 1}
    assert abs(1 - keep.mean() - 0.25) < 0.03
    assert not np.array_equal(keep, flashattn.dropout_mask(42, 3, 0.25, 4, 64, 80, 1, 3))
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.dropout_mask(42, 3, 1.5, 4, 64, 80, 1, 2)


def test_tiling_backends_version():
    assert flashattn.tiling_for(100_000, 64) == (64, 391)  # Bc = ceil(M/4d), Br = min(Bc, d)
    assert flashattn.tiling_for(0, 64) == (0, 0)
    status = flashattn.backends()
    assert set(status) == {"cpu", "cuda", "hip"}
    assert status["cpu"].available and status["cpu"].detail.startswith("cpu")
    for name in ("cuda", "hip"):
        assert status[name].available or "unavailable" in status[name].detail
    assert flashattn.__version__.count(".") == 2


def test_backend_names_come_from_the_library():
    names = flashattn._native.backend_names()
    assert names[0] == "auto" and {"cpu", "cuda", "hip"} <= set(names) and "unknown" not in names
    assert list(flashattn.backends()) == list(names[1:])  # backends() walks the same list
    assert flashattn._BACKEND_NUMBERS == {name: number for number, name in enumerate(names)}
    for name in names[:2]:  # auto and cpu run on host memory
        flashattn.forward(*qkv(), backend=name)
    for name in names[2:]:
        # The C side names the backend from its number (fa_backend_name): a misnumbered name shows.
        with pytest.raises(flashattn.InvalidValueError, match='backend: "%s" cannot run' % name):
            flashattn.forward(*qkv(), backend=name)


@pytest.mark.parametrize("backend", ["tpu", "CPU", None, 1])
def test_bad_backend_name_lists_the_library_names(backend):
    with pytest.raises(flashattn.InvalidValueError) as info:
        flashattn.forward(*qkv(), backend=backend)
    assert str(info.value) == "backend: %r is not one of %s" % (backend, ", ".join(flashattn._native.backend_names()))
    assert info.value.status_name == "FA_ERROR_INVALID_VALUE"


def test_flash_attn_func_without_torch_says_what_is_missing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails as if not installed
    monkeypatch.delitem(sys.modules, "flashattn._torch", raising=False)
    monkeypatch.delitem(flashattn.__dict__, "flash_attn_func", raising=False)  # a cached lazy import
    with pytest.raises(ImportError, match=r"flash_attn_func needs PyTorch \(pip install torch\)"):
        flashattn.flash_attn_func


def test_gpu_backend_runs_when_present():
    cuda = flashattn.backends()["cuda"]
    if not cuda.available:
        pytest.skip("no CUDA backend here: " + cuda.detail)
    cupy = pytest.importorskip("cupy")
    q, k, v = qkv()
    out, _ = flashattn.forward(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), causal=True)
    assert_close(cupy.asnumpy(out), reference.attention(q, k, v, causal=True)[0], np.float32, "out")


# ---- errors -------------------------------------------------------------------------------------

def test_bad_dtype_is_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q: dtype float64 is not supported") as info:
        flashattn.forward(q.astype(np.float64), k, v)
    assert isinstance(info.value, flashattn.Error) and info.value.status == 1
    with pytest.raises(TypeError, match="k: .* is not a DLPack tensor"):
        flashattn.forward(q, [[1.0]], v)


@pytest.mark.parametrize("mutate, message", [
    (lambda q, k, v: (q[0], k, v), "q: has 3 dimensions"),
    (lambda q, k, v: (q, k[:, :, :1], v), "v: shape .* differs from k"),
    (lambda q, k, v: (q, k[..., :16], v[..., :16]), "k: head_dim 16 differs from q's 32"),
    (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]), "q: head_dim stride is 2"),
    (lambda q, k, v: (q, np.broadcast_to(k[:1], k.shape), v), "k: stride 0 of dimension batch"),
    (lambda q, k, v: (q, k.astype(np.float16), v.astype(np.float16)), "k: dtype differs from q"),
])
def test_bad_shapes_are_value_errors(mutate, message):
    with pytest.raises(ValueError, match=message) as info:
        flashattn.forward(*mutate(*qkv()))
    assert info.value.status_name == "FA_ERROR_INVALID_VALUE"


@pytest.mark.parametrize("options, message", [
    ({"dropout_p": 1.0}, r"desc->dropout_p: 1 is outside \[0, 1\)"),
    ({"window": (-2, 0)}, "desc->window_left: -2 is below -1"),
    ({"seqlens_k": [3]}, "seqlens_k: has 1 entries, expected batch = 2"),
    ({"seqlens_k": [3, 99]}, r"desc->seqlens_k\[1\]: 99 is outside"),
    ({"block_mask": np.ones((2, 2), np.uint8)}, "desc->block_mask: 2 x 2 blocks, expected 1 x 1"),
    ({"softmax_scale": 0.0}, "softmax_scale: 0"),
    ({"backend": "cuda"}, "backend: \"cuda\" cannot run on tensors in cpu memory"),
    ({"backend": "tpu"}, "backend: 'tpu' is not one of"),
    ({"window": 3}, "window: 3 is not a pair"),
    ({"seed": -1}, "seed: -1 is outside"),
])
def test_bad_options_are_value_errors(options, message):
    with pytest.raises(ValueError, match=message):
        flashattn.forward(*qkv(), **options)


def test_nothing_written_on_failure():
    """The raw binding with caller-given outputs: a rejected call leaves them untouched."""
    q, k, v = qkv()
    out = np.full(q.shape, 7.0, np.float32)
    lse = np.full((2, 4, 37), 7.0, np.float32)
    args = (q, k, v, out, lse, True, 0.0, False, -1, -1, None, 1.5, 0, 0, None, 128, 128, 0.0, None, None, None, None,
            0, None)
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn._native.forward(*args)
    assert (out == 7.0).all() and (lse == 7.0).all()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: is read-only"):
        flashattn._native.forward(q, k, v, out, None, False, *args[6:11], 0.0, *args[12:])


def test_backward_needs_matching_lse():
    q, k, v = qkv()
    out, lse = flashattn.forward(q, k, v)
    with pytest.raises(ValueError, match="lse: expected shape"):
        flashattn.backward(q, k, v, out, out, lse[:, :2])
    with pytest.raises(TypeError, match="lse: dtype must be float32"):
        flashattn.backward(q, k, v, out, out, lse.astype(np.float16))
    with pytest.raises(ValueError, match="lse: must be contiguous"):
        flashattn.backward(q, k, v, out, out, np.ascontiguousarray(lse.transpose(0, 2, 1)).transpose(0, 2, 1))


def test_inputs_are_released_exactly_once():
    """Each consumed DLPack capsule's deleter runs once: NumPy's holds a reference to its array,
    so a missed deleter leaks a reference and a second call would free one twice."""
    import sys

    q, k, v = qkv()
    before = [sys.getrefcount(x) for x in (q, k, v)]
    out, lse = flashattn.forward(q, k, v)
    flashattn.backward(q, k, v, out, out, lse)
    with pytest.raises(ValueError):
        flashattn.forward(q, k, v, dropout_p=2.0)  # fails inside the C call
    with pytest.raises(ValueError):
        flashattn.forward(q, k[:, :, :1], v)  # fails while binding v
    assert [sys.getrefcount(x) for x in (q, k, v)] == before


def test_outputs_are_exported_once():
    pending, _ = flashattn._native.forward(*qkv(), None, None, False, 0.0, False, -1, -1, None, 0.0, 0, 0, None,
                                           128, 128, 0.0, None, None, None, None, 0, None)
    exported = flashattn._dlpack.Exported(pending, (1, 0))
    first = np.from_dlpack(exported)
    with pytest.raises(BufferError, match="already exported"):
        np.from_dlpack(exported)
    assert first.shape == (2, 37, 4, 32)
