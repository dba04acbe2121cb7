"""flashattn: exact attention with IO-aware tiling (FlashAttention) on CPU, CUDA and HIP.

Tensors are [batch, seqlen, heads, head_dim] in float32, float16 or bfloat16, from any framework
that speaks DLPack (NumPy, PyTorch, CuPy, JAX); they are read in place (strides honoured, the
head_dim stride must be 1) and outputs come back in the input's framework. The backend follows
the tensors' memory: host memory runs on the CPU backend, CUDA memory on the CUDA plugin, ROCm
memory on the HIP plugin. ``flashattn.flash_attn_func`` (needs PyTorch) is a drop-in for
FlashAttention-2's function with autograd and torch.compile support.

Example::

    out, lse = flashattn.forward(q, k, v, causal=True)
"""

import importlib
from collections import namedtuple

from . import _native
from ._dlpack import converter_for, framework_of, placement, wrap
from ._errors import (BackendFailureError, BackendUnavailableError, Error, InvalidTypeError,
                      InvalidValueError, NotSupportedError, OutOfMemoryError)

__all__ = [
    "forward", "backward", "forward_varlen", "backward_varlen", "forward_kvcache", "merge_partials", "dropout_mask",
    "tiling_for", "backends", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
    "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func", "quantize_kv", "kvcache_append",
    "Error", "InvalidValueError", "InvalidTypeError", "NotSupportedError", "OutOfMemoryError",
    "BackendUnavailableError", "BackendFailureError", "BackendStatus", "Tiling", "Gradients", "__version__",
]

#: Version of the loaded C library (fa_version_string()).
__version__ = _native.version()

BackendStatus = namedtuple("BackendStatus", ["available", "detail"])
BackendStatus.__doc__ = "available: usable now; detail: fa_context_info() when available, else why not."
Tiling = namedtuple("Tiling", ["block_rows", "block_cols"])
Tiling.__doc__ = "The paper's tile sizes Br, Bc."
Gradients = namedtuple("Gradients", ["dq", "dk", "dv", "dsinks", "dbias"])
Gradients.__doc__ = """backward(..., return_modifier_grads=True): dq, dk, dv, plus dsinks (float32 [heads_q])
and dbias (the bias's dtype and shape, each broadcast axis of size 1: summed over it), None where
sinks / bias were not given."""

# The C library's list (fa_backend_name), so a backend it gains needs no edit here.
_BACKEND_NUMBERS = {name: number for number, name in enumerate(_native.backend_names())}


def _backend_number(backend):
    try:
        return _BACKEND_NUMBERS[backend]
    except (KeyError, TypeError):
        raise InvalidValueError("backend: %r is not one of %s" % (backend, ", ".join(_BACKEND_NUMBERS)), 1) from None


def _pair(value, name):
    try:
        first, second = value
        return int(first), int(second)
    except (TypeError, ValueError):
        raise InvalidValueError("%s: %r is not a pair of ints" % (name, value), 1) from None


def _scale(softmax_scale):
    if softmax_scale is None:
        return 0.0  # the C API's 0: 1/sqrt(head_dim)
    scale = float(softmax_scale)
    if scale == 0.0:
        raise InvalidValueError("softmax_scale: 0 is not a usable scale (None means 1/sqrt(head_dim))", 1)
    return scale


def _seed(value, name):
    value = int(value)
    if not 0 <= value < 2**64:
        raise InvalidValueError("%s: %d is outside [0, 2^64)" % (name, value), 1)
    return value


def _options(causal, softmax_scale, window, seqlens_k, dropout_p, seed, offset, block_mask, block_size,
             softcap, alibi_slopes, sinks, bias, varlen=None):
    """The option arguments of _native.forward/backward/forward_kvcache, in order. varlen: None or
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for a packed batch."""
    window_left, window_right = _pair(window, "window")
    block_q, block_k = _pair(block_size, "block_size")
    if seqlens_k is not None:
        seqlens_k = [int(n) for n in (seqlens_k.tolist() if hasattr(seqlens_k, "tolist") else seqlens_k)]
    if block_mask is not None:
        import numpy

        # Host memory, one byte per block; already-uint8 contiguous host arrays are not copied.
        block_mask = numpy.ascontiguousarray(numpy.asarray(block_mask), dtype=numpy.uint8)
    return (_scale(softmax_scale), bool(causal), window_left, window_right, seqlens_k, float(dropout_p),
            _seed(seed, "seed"), _seed(offset, "offset"), block_mask, block_q, block_k, float(softcap), alibi_slopes,
            sinks, bias, varlen)


def _varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    return (cu_seqlens_q, cu_seqlens_k, _count(max_seqlen_q, "max_seqlen_q"), _count(max_seqlen_k, "max_seqlen_k"))


def _count(value, name):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidValueError("%s: %r is not an int" % (name, value), 1) from None


def forward(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), seqlens_k=None, dropout_p=0.0,
            seed=0, offset=0, block_mask=None, block_size=(128, 128), softcap=0.0, alibi_slopes=None, sinks=None,
            bias=None, backend="auto"):
    """Attention forward: returns (out, lse).

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim] with
    heads_kv dividing heads_q (GQA/MQA). out has q's shape and dtype; lse is float32
    [batch, heads_q, seqlen_q], the natural-log sum of exp of the scaled visible scores.

    causal: bottom-right aligned when seqlen_q != seqlen_k. softmax_scale: None = 1/sqrt(head_dim).
    window: (left, right) sliding window, -1 = unbounded. seqlens_k: [batch] valid keys per
    sequence. dropout_p, seed, offset: dropout on P from the Philox stream (README "Dropout
    stream"). block_mask: host [rows, cols] uint8/bool, nonzero = attend, blocks of block_size
    = (block_q, block_k) tokens. backend: "auto" (follow the tensors' memory), "cpu", "cuda" or
    "hip" (must match the memory).

    Score modifiers (README "Score modifiers"), applied in this order to s = scale * q.k of the
    visible keys: softcap > 0: s = softcap * tanh(s / softcap). alibi_slopes: float32 [heads_q]
    or [batch, heads_q]: s -= slope * |i + seqlen_k - seqlen_q - j|. bias: float32/16, bfloat16,
    broadcastable to [batch, heads_q, seqlen_q, seqlen_k] (missing leading, size-1 and stride-0
    axes broadcast without a copy; the key axis must be whole and contiguous): s += bias. sinks:
    float32 [heads_q] logits: each row's softmax denominator gains exp(sink). The modifier
    tensors must be on q's device; masked keys stay masked.

    On a GPU, the call runs on the framework's current stream (torch, CuPy) and is synchronized
    before returning, because the outputs are new allocations any stream may read.
    Raises a flashattn.Error subclass (ValueError/TypeError where apt) with fa_last_error()'s
    message; nothing is returned or written on failure.
    """
    options = _options(causal, softmax_scale, window, seqlens_k, dropout_p, seed, offset, block_mask, block_size,
                       softcap, alibi_slopes, sinks, bias)
    return _run_forward(q, k, v, options, backend)


def backward(q, k, v, out, dout, lse, *, causal=False, softmax_scale=None, window=(-1, -1), seqlens_k=None,
             dropout_p=0.0, seed=0, offset=0, block_mask=None, block_size=(128, 128), softcap=0.0,
             alibi_slopes=None, sinks=None, bias=None, backend="auto", return_modifier_grads=False):
    """Attention backward by recomputation: returns (dq, dk, dv) shaped like q, k, v, or with
    return_modifier_grads a Gradients(dq, dk, dv, dsinks, dbias) namedtuple.

    out and lse must come from forward() on the same inputs with the same options (dropout
    regenerated from the same seed and offset). dk and dv sum over the query heads of a group.
    return_modifier_grads: also compute dsinks (float32 [heads_q], summed over batch and rows)
    when sinks is given and dbias (the bias's dtype; the bias's shape with each broadcast axis,
    size 1 or stride 0, of size 1 holding the sum over it) when bias is given; None otherwise.
    Without it they are not computed (dbias costs a pass of its own). Options, streams and errors
    as in forward().
    """
    options = _options(causal, softmax_scale, window, seqlens_k, dropout_p, seed, offset, block_mask, block_size,
                       softcap, alibi_slopes, sinks, bias)
    return _run_backward(q, k, v, out, dout, lse, options, backend, return_modifier_grads, sinks, bias)


def _run_forward(q, k, v, options, backend):
    """_native.forward with outputs allocated by the binding: (out, lse) in q's framework."""
    device, stream = placement(q)
    out, lse = _native.forward(q, k, v, None, None, True, *options, _backend_number(backend), stream)
    convert = converter_for(q)
    return wrap(convert, out, device), wrap(convert, lse, device)


def _run_backward(q, k, v, out, dout, lse, options, backend, return_modifier_grads, sinks, bias):
    """_native.backward with gradients allocated by the binding, in q's framework: (dq, dk, dv), or
    with return_modifier_grads Gradients (dsinks/dbias computed when sinks/bias are given)."""
    device, stream = placement(q)
    want_dsinks = True if return_modifier_grads and sinks is not None else None
    want_dbias = True if return_modifier_grads and bias is not None else None
    grads = _native.backward(q, k, v, out, dout, lse, None, None, None, want_dsinks, want_dbias, *options,
                             _backend_number(backend), stream)
    convert = converter_for(q)
    grads = [None if g is None else wrap(convert, g, device) for g in grads]
    return Gradients(*grads) if return_modifier_grads else tuple(grads[:3])


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                   softmax_scale=None, window=(-1, -1), dropout_p=0.0, seed=0, offset=0, block_mask=None,
                   block_size=(128, 128), softcap=0.0, alibi_slopes=None, sinks=None, bias=None, backend="auto"):
    """Attention forward over a packed batch of sequences of different lengths: returns (out, lse).

    q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim], the sequences one after
    another (no padding). cu_seqlens_q, cu_seqlens_k: batch + 1 int32 offsets, non-decreasing,
    first 0: sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (lengths may be 0). They are an int32 tensor on
    q's device or, as a convenience, a sequence of ints (copied to the device per call).
    max_seqlen_q, max_seqlen_k: upper bounds of the lengths (they index dropout and bias).
    out: [total_q, heads_q, head_dim]; lse: float32 [heads_q, total_q] (FlashAttention-2's layout).

    Causal and window align bottom-right within each sequence. Dropout draws the element of the
    padded [batch, heads_q, max_seqlen_q, max_seqlen_k] layout, so a packed batch equals the same
    batch padded (README "Dropout stream"). alibi_slopes: [heads_q] or [batch, heads_q]; bias:
    broadcastable to [batch, heads_q, max_seqlen_q, max_seqlen_k], indexed from each sequence's
    first row and key; block_mask: [ceil(max_seqlen_q / block_q), ceil(max_seqlen_k / block_k)],
    applied to each sequence from its first row and key. Other options and errors as forward().
    On a GPU, offsets that break the rules are found on the device: the call writes nothing and
    raises InvalidValueError naming them.
    """
    options = _options(causal, softmax_scale, window, None, dropout_p, seed, offset, block_mask, block_size,
                       softcap, alibi_slopes, sinks, bias,
                       _varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    return _run_forward(q, k, v, options, backend)


def backward_varlen(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                    causal=False, softmax_scale=None, window=(-1, -1), dropout_p=0.0, seed=0, offset=0,
                    block_mask=None, block_size=(128, 128), softcap=0.0, alibi_slopes=None, sinks=None, bias=None,
                    backend="auto", return_modifier_grads=False):
    """Backward of forward_varlen() by recomputation: returns (dq, dk, dv) shaped like q, k, v
    (packed), or with return_modifier_grads a Gradients namedtuple as backward() does. out and
    lse ([heads_q, total_q]) come from forward_varlen() with the same offsets and options."""
    options = _options(causal, softmax_scale, window, None, dropout_p, seed, offset, block_mask, block_size,
                       softcap, alibi_slopes, sinks, bias,
                       _varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    return _run_backward(q, k, v, out, dout, lse, options, backend, return_modifier_grads, sinks, bias)


def _host_table(table, device):
    """A block table given as nested lists: an int32 NumPy array when the call runs on the host."""
    if table is None or hasattr(table, "__dlpack__") or device[0] not in (1, 3):
        return table
    import numpy

    return numpy.ascontiguousarray(numpy.asarray(table), dtype=numpy.int32)


def forward_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, block_table=None, causal=False,
                    softmax_scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, bias=None,
                    cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k_new=None, cache_batch_idx=None,
                    cache_leftpad=None, kv_split_tokens=0, backend="auto"):
    """Attention of new queries against a KV cache, after appending new keys/values to it: returns
    (out, lse).

    q: [batch, seqlen_q, heads_q, head_dim]. k_cache, v_cache: contiguous [batch, capacity,
    heads_kv, head_dim], or paged [num_pages, page_size, heads_kv, head_dim] (any page_size >= 1)
    with block_table int32 [batch, max_pages_per_seq] naming each sequence's pages in order.
    cache_seqlens: tokens already in each sequence's cache: an int32 [batch] tensor on q's
    device, a sequence of ints, or one int for every sequence.
    k, v: None, or [batch, seqlen_new, heads_kv, head_dim]: written into the caches in place at
    positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending (the caches
    must be writable; cache_seqlens is not changed: advance it yourself). JAX arrays are
    immutable, so with JAX caches k and v must be None (append with .at[].set() first).
    q attends to the first cache_seqlens[b] + seqlen_new keys of sequence b; causal is
    bottom-right aligned (the last query sees the whole cache). out: q's shape; lse: float32
    [batch, heads_q, seqlen_q]. bias: broadcastable to [batch, heads_q, seqlen_q, capacity]
    (capacity = max_pages_per_seq * page_size when paged). Other options as forward(); no dropout.

    Ragged queries (a serving step mixing prefill chunks and one-token decodes): with
    cu_seqlens_q, int32 [batch + 1] offsets (first 0, non-decreasing), q and out are packed
    [total_q, heads_q, head_dim], sequence b's queries rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    (0 rows allowed), and lse is [heads_q, total_q]; batch = len(cu_seqlens_q) - 1.
    max_seqlen_q bounds the query lengths (None: total_q); it sizes a bias, [batch, heads_q,
    max_seqlen_q, capacity], indexed from each sequence's first row. k and v are then packed
    [total_new, heads_kv, head_dim] by cu_seqlens_k_new (int32 [batch + 1]), or by cu_seqlens_q
    when cu_seqlens_k_new is None (then total_new = total_q); without k and v, cu_seqlens_k_new
    must be None. Each sequence's queries align at the end of its own keys (causal, window,
    ALiBi).

    cache_batch_idx: int32 [batch]: sequence b reads and appends row cache_batch_idx[b] of a
    contiguous cache (which may then have any number of rows; sequences that append need distinct
    rows). cache_leftpad: int32 [batch] (or one int for every sequence): sequence b ignores the
    first cache_leftpad[b] positions of its row (at most cache_seqlens[b]); its keys are positions
    cache_leftpad[b] .. cache_seqlens[b] + seqlen_new - 1, key j at position cache_leftpad[b] + j
    (causal alignment, ALiBi and the bias's key index count from there). Both are a tensor on q's
    device or a sequence of ints, for contiguous caches only (with block_table:
    NotSupportedError).

    kv_split_tokens: the key-chunk size of the split over long caches (0 = the library's rule:
    1024 keys, more for very long sequences, from each sequence's own length). Chunks are merged by
    lse in a fixed order, so results are bit-identical across runs and thread counts and a
    sequence's result does not depend on the other sequences of the batch; a different chunk size
    may change the last bits.

    A length, page or slot check that fails raises InvalidValueError naming the sequence or the
    table entry, and nothing is written: the caches stay byte-identical.
    """
    device, stream = placement(q)
    if k is not None and framework_of(k_cache) in ("jax", "jaxlib"):
        raise NotSupportedError("k: JAX arrays are immutable, so new keys cannot be appended to k_cache in place; "
                                "write them with k_cache.at[...].set(...) and call with k=None, v=None", 2)
    options = _options(causal, softmax_scale, window, None, 0.0, 0, 0, None, (128, 128), softcap, alibi_slopes,
                       sinks, bias, _ragged(q, k, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new))
    out, lse = _native.forward_kvcache(q, k_cache, v_cache, k, v, None, None, True, cache_seqlens,
                                       _host_table(block_table, device), cache_batch_idx, cache_leftpad,
                                       _count(kv_split_tokens, "kv_split_tokens"), None, None, *options,
                                       _backend_number(backend),
                                       stream)
    convert = converter_for(q)
    return wrap(convert, out, device), wrap(convert, lse, device)


def _ragged(q, k, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new):
    """The varlen option of a KV-cache call: None, or (cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q,
    the bound of the new tokens' lengths: k's rows, which no sequence exceeds)."""
    if cu_seqlens_q is None:
        if cu_seqlens_k_new is not None:
            raise InvalidValueError("cu_seqlens_k_new: needs cu_seqlens_q (new tokens are packed only with ragged "
                                    "queries)", 1)
        return None
    total_q = q.shape[0]
    max_q = total_q if max_seqlen_q is None else _count(max_seqlen_q, "max_seqlen_q")
    max_new = k.shape[0] if cu_seqlens_k_new is not None and k is not None else 0
    return (cu_seqlens_q, cu_seqlens_k_new, max_q, max_new)


def merge_partials(outs, lses, *, backend="auto"):
    """Exact merge of partial attention results over disjoint key sets: returns (out, lse).

    outs: n >= 1 outputs of the same queries, each [batch, seqlen, heads, head_dim] with lses
    float32 [batch, heads, seqlen] (forward()'s layout), or packed [total, heads, head_dim] with
    lses [heads, total] (forward_varlen()'s). Each row is merged by lse over the parts in the
    order given, in float32: deterministic, whatever the thread count. A part whose lse is -inf
    contributes nothing; a row that is -inf in every part stays zero with lse -inf. PyTorch
    tensors go through the flashattn::merge_partials op (torch.compile can trace it).
    """
    outs, lses = list(outs), list(lses)
    if outs and framework_of(outs[0]) == "torch":
        from ._torch import merge_partials as torch_merge

        return torch_merge(outs, lses)
    device, stream = placement(outs[0]) if outs else ((1, 0), None)
    out, lse = _native.merge_partials(outs, lses, None, None, True, _backend_number(backend), stream)
    convert = converter_for(outs[0])
    return wrap(convert, out, device), wrap(convert, lse, device)


def dropout_mask(seed, offset, p, heads_q, seqlen_q, seqlen_k, batch_index, head_index):
    """The dropout keep mask (1 = kept) of one (batch, query head) pair: a NumPy uint8 array
    [seqlen_q, seqlen_k], the same stream every backend draws."""
    import numpy

    capsule = _native.dropout_mask(_seed(seed, "seed"), _seed(offset, "offset"), float(p), int(heads_q),
                                   int(seqlen_q), int(seqlen_k), int(batch_index), int(head_index))
    return wrap(numpy.from_dlpack, capsule, (1, 0))


def tiling_for(sram_elements, head_dim):
    """The paper's tiles for an on-chip memory of sram_elements: Bc = ceil(M/4d),
    Br = min(Bc, d); (0, 0) for non-positive arguments."""
    return Tiling(*_native.tiling_for(int(sram_elements), int(head_dim)))


def backends():
    """{"cpu": BackendStatus, "cuda": ..., "hip": ...}: which backends run here, and why not."""
    return {name: BackendStatus(available, detail) for name, available, detail in _native.backends()}


# The PyTorch functions, imported only when used, so the package works without PyTorch.
_TORCH_FUNCTIONS = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func",
                    "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
                    "quantize_kv", "kvcache_append")


def __getattr__(name):
    if name in _TORCH_FUNCTIONS:
        try:
            _torch = importlib.import_module("flashattn._torch")
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise ModuleNotFoundError("flashattn.%s needs PyTorch (pip install torch)" % name, name="torch") from e

        function = getattr(_torch, name)
        globals()[name] = function
        return function
    raise AttributeError("module 'flashattn' has no attribute %r" % name)
