"""Atheris target for the Python binding's DLPack import (python/flashattn/_native.c: take_input,
to_fa_tensor_as, check_lse, bind_int32_table, to_fa_bias, the versioned and unversioned capsules).

Each input decodes to one call of forward, _native.forward with caller outputs, backward,
forward_varlen, forward_kvcache (f32/f16/bf16, int8 or FP8 caches with their scales) or
merge_partials whose tensors come from synthetic producers: objects whose __dlpack__ builds a
capsule with ctypes over a DLManagedTensor(Versioned) pointing into a NumPy buffer of exactly the
claimed extent. One argument may be corrupted (rank, dtype, a dimension of 0, negative or past
64 bits, a zero, negative, overflowing or non-unit last stride, a misaligned byte_offset, another
device, the read-only flag on a written tensor, a DLPack version other than 1, a producer that
raises, returns no capsule or an already used one, or a capsule of another name). The check fails
(raises AssertionError, which atheris reports with its input) unless

- a clean call succeeds and its results equal python/tests/reference.py's float64 reference within
  the storage rounding of the dtype plus a small multiple of f32 eps (and the caches after an append
  equal the reference's caches);
- a corrupted call raises TypeError/ValueError/a flashattn.Error (or the producer's own exception)
  whose message names the corrupted argument, and left the caller's outputs and caches with their
  canary bytes;
- in every case each capsule the binding consumed had its deleter run exactly once, one it did not
  consume never, and the binding holds no reference to any capsule after the call.

The bytes are read in order and a missing byte reads as 0 (not atheris.FuzzedDataProvider), so the
committed corpus replays without atheris: python/tests/test_dlpack_fuzz_regressions.py calls
check_input() on every file.
Run: python fuzz/fuzz_dlpack.py [libFuzzer flags] fuzz/corpus/fuzz_dlpack
"""

import ctypes
import os
import sys

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, os.pardir, "python", "tests"))

import flashattn  # noqa: E402
from flashattn import _native  # noqa: E402
import reference  # noqa: E402
from flashattn._dlpack import Exported  # noqa: E402

# ---- DLPack ABI (dlpack.h 1.x) ---------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM = 1, 2, 3, 10
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL, KDL_E4M3, KDL_E5M2 = 0, 1, 2, 4, 6, 10, 12
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
# The deleter is a C function: the binding calls deleters while its own exception is pending, and a
# ctypes callback cannot run then. Py_IncRef(p) adds one to the 8 bytes at p, which are the struct's
# first field (the versioned struct's major version, the unversioned one's data pointer): that delta
# counts the calls, and a binding that reads the tensor after releasing it sees a data pointer off by
# one byte (refused as misaligned) or a version past 1.
_py_incref = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value

# id -> [struct, buffer, shape array, strides array, name buffer, capsule, first 8 bytes at creation].
# Every capsule stays referenced here until its check: the harness plays its destructor (an
# unconsumed capsule frees its tensor) and sees any reference the binding kept.
_ledger = {}
_next_id = [1]


def deleter_calls(ident):
    entry = _ledger[ident]
    return ctypes.c_int64.from_address(ctypes.addressof(entry[0])).value - entry[6]


def call_deleter(ident):
    ctypes.pythonapi.Py_IncRef(ctypes.c_void_p(ctypes.addressof(_ledger[ident][0])))


class ProducerError(Exception):
    """Raised by a producer's __dlpack__: the binding must pass it on unchanged."""


def make_capsule(buf, byte_start, dtype, shape, strides, byte_offset=0, device=(KDL_CPU, 0), versioned=True,
                 version=(1, 0), read_only=False, name=None):
    """A DLPack capsule over buf (a NumPy array kept alive by the ledger): data = buf's address +
    byte_start, the given dtype (code, bits, lanes), shape and strides (None = NULL)."""
    ident = _next_id[0]
    _next_id[0] += 1
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
    t = DLTensor()
    t.data = buf.ctypes.data + byte_start
    t.device = DLDevice(*device)
    t.ndim = len(shape)
    t.dtype = DLDataType(*dtype)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = None if strides_arr is None else ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = byte_offset
    if versioned:
        mt = DLManagedTensorVersioned()
        mt.version = DLPackVersion(*version)
        mt.flags = 1 if read_only else 0
        default_name = b"dltensor_versioned"
    else:
        mt = DLManagedTensor()
        default_name = b"dltensor"
    mt.deleter = ctypes.cast(_py_incref, DELETER)
    mt.manager_ctx = ident
    mt.dl_tensor = t
    name_buf = ctypes.create_string_buffer(name if name is not None else default_name)
    capsule = _capsule_new(ctypes.addressof(mt), name_buf, None)
    first = ctypes.c_int64.from_address(ctypes.addressof(mt)).value
    _ledger[ident] = [mt, buf, shape_arr, strides_arr, name_buf, capsule, first]
    return capsule, ident


def from_dlpack(x):
    """The results' converter (flashattn converts them with the from_dlpack of the first tensor's
    module, this one): a NumPy copy, bfloat16 as its uint16 bits."""
    capsule = x.__dlpack__(max_version=(1, 0))
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    versioned = _capsule_name(capsule) == b"dltensor_versioned"
    mt = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(
        get(capsule, b"dltensor_versioned" if versioned else b"dltensor"))
    t = mt.dl_tensor
    expect(t.strides is None or not t.strides, "an output with strides")
    shape = [t.shape[i] for i in range(t.ndim)]
    storage = {(KDL_FLOAT, 32): np.float32, (KDL_FLOAT, 16): np.float16, (KDL_BFLOAT, 16): np.uint16}[
        (t.dtype.code, t.dtype.bits)]
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_char * (count * np.dtype(storage).itemsize)).from_address(t.data + t.byte_offset)
    arr = np.frombuffer(bytes(raw), dtype=storage).reshape(shape)
    _capsule_set_name(capsule, b"used_dltensor_versioned" if versioned else b"used_dltensor")
    mt.deleter(ctypes.addressof(mt))
    return arr


# ---- decoding ------------------------------------------------------------------------------------


class Reader:
    """The input's bytes in order; a missing byte reads as 0."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def byte(self):
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def below(self, n):
        return self.byte() % n

    def u32(self):
        return int.from_bytes(bytes(self.byte() for _ in range(4)), "little")


class Finding(AssertionError):
    pass


def expect(cond, message):
    if not cond:
        raise Finding(message)


# DLPack dtype (code, bits) and the NumPy dtype holding its bits.
F32, F16, BF16, I8, E4M3, E5M2, I32 = ((KDL_FLOAT, 32), (KDL_FLOAT, 16), (KDL_BFLOAT, 16), (KDL_INT, 8),
                                        (KDL_E4M3, 8), (KDL_E5M2, 8), (KDL_INT, 32))
_STORAGE = {F32: np.float32, F16: np.float16, BF16: np.uint16, I8: np.int8, E4M3: np.uint8, E5M2: np.uint8,
            I32: np.int32}
# Storage rounding (half an ulp, relative) of an output of that dtype.
_ROUNDING = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}
# Nonsense or unsupported element types: none of them may be read as attention data.
_BAD_DTYPES = [(KDL_FLOAT, 64, 1), (KDL_FLOAT, 8, 1), (KDL_FLOAT, 32, 2), (KDL_FLOAT, 16, 0), (KDL_INT, 32, 1),
               (KDL_UINT, 16, 1), (KDL_BOOL, 8, 1), (KDL_BFLOAT, 32, 1), (7, 16, 1), (KDL_E4M3, 16, 1),
               (255, 32, 1), (KDL_FLOAT, 0, 1), (KDL_FLOAT, 255, 1), (KDL_INT, 8, 4), (KDL_E5M2, 8, 1),
               (KDL_INT, 8, 1)]


def fp8_table(code):
    """float64 value of every FP8 byte (E4M3 fn: no inf, 0x7f/0xff NaN; E5M2: IEEE-like)."""
    e_bits, m_bits, bias = (4, 3, 7) if code == KDL_E4M3 else (5, 2, 15)
    out = np.empty(256)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> m_bits) & ((1 << e_bits) - 1), b & ((1 << m_bits) - 1)
        if code == KDL_E4M3 and e == 15 and m == 7:
            out[b] = np.nan
        elif code == KDL_E5M2 and e == 31:
            out[b] = np.nan if m else sign * np.inf
        elif e == 0:
            out[b] = sign * m * 2.0 ** (1 - bias - m_bits)
        else:
            out[b] = sign * (1 + m / 2.0 ** m_bits) * 2.0 ** (e - bias)
    return out


_FP8 = {KDL_E4M3: fp8_table(KDL_E4M3), KDL_E5M2: fp8_table(KDL_E5M2)}
# Codes of moderate magnitude (|value| <= 2): finite and well inside both formats.
_FP8_CODES = {c: np.flatnonzero(np.abs(np.nan_to_num(t, nan=9.0)) <= 2.0).astype(np.uint8) for c, t in _FP8.items()}


def to_storage(values, dt):
    """(bits as the NumPy storage dtype, the exact float64 values those bits hold)."""
    if dt == F32:
        s = values.astype(np.float32)
        return s, s.astype(np.float64)
    if dt == F16:
        s = values.astype(np.float16)
        return s, s.astype(np.float64)
    if dt == BF16:
        bits = (values.astype(np.float32).view(np.uint32) + 0x8000) >> 16  # round half up: any bf16 will do
        s = bits.astype(np.uint16)
        return s, from_storage(s, dt)
    if dt == I32:
        s = values.astype(np.int32)
        return s, s.astype(np.float64)
    raise ValueError(dt)


def from_storage(arr, dt):
    arr = np.asarray(arr)
    if dt == BF16:
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dt in (E4M3, E5M2):
        return _FP8[dt[0]][arr]
    return arr.astype(np.float64)


class Spec:
    """One tensor argument: its logical contents, how its producer lays them out and behaves."""

    def __init__(self, name, dt, storage, kind="tensor"):
        self.name, self.dt, self.storage, self.kind = name, dt, np.ascontiguousarray(storage), kind
        self.layout = 0          # 0 NULL strides, 1 explicit compact, 2 gaps, 3 reversed outer order, 4 overlap
        self.gap = 1
        self.versioned, self.read_only, self.protocol = True, False, 0
        self.fault = None        # (kind, detail) when this argument is the corrupted one
        self.buffer = None       # the NumPy buffer, once built (outputs are read back from it)
        self.base = 0            # element index in buffer of logical element 0
        self.strides = None      # element strides of the logical layout

    # The physical layout: strides in elements and the buffer that holds exactly that extent.
    def plan(self):
        shape = self.storage.shape
        n = len(shape)
        compact = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(n)]
        if self.layout in (0, 1) or n < 2:
            strides = compact
        elif self.layout == 2:  # a gap of self.gap elements after every inner block
            strides = [1] * n
            for i in range(n - 2, -1, -1):
                strides[i] = strides[i + 1] * max(shape[i + 1], 1) + self.gap
        elif self.layout == 3:  # the outer dimensions in reverse memory order ([B, H, S, D]-style)
            order = list(range(n - 2, -1, -1)) + [n - 1]
            strides, step = [0] * n, 1
            for i in reversed(order):
                strides[i] = step
                step *= max(shape[i], 1)
        else:  # overlapping rows: the second-to-last dimension advances less than a row
            strides = list(compact)
            if n >= 2 and shape[-1] > 1:
                strides[-2] = max(1, shape[-1] // 2)
        self.strides = strides

    def build(self, canary):
        """The buffer (exactly the extent; canary elsewhere) with the contents written through the layout."""
        self.plan()
        shape, strides = self.storage.shape, self.strides
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides) if s > 0)
        if any(s == 0 for s in shape):
            extent = 1
        self.base = self.gap if self.layout in (1, 2) else 0  # leading elements: a byte_offset or a moved data
        spare = 1 if self.fault and self.fault[0] == "misaligned" else 0
        buf = np.empty(self.base + extent + spare, dtype=self.storage.dtype)
        buf.view(np.uint8)[:] = canary
        self.buffer = buf
        if self.layout == 4 and self.storage.ndim >= 2:
            # Overlapping rows hold what the layout reads: write each element, later ones win.
            view = self.view()
            view[...] = 0
            for idx in np.ndindex(*shape):
                view[idx] = self.storage[idx]
            self.storage = np.array(view)
        elif extent:
            self.view()[...] = self.storage

    def view(self):
        item = self.buffer.itemsize
        return np.lib.stride_tricks.as_strided(self.buffer[self.base:], self.storage.shape,
                                               [s * item for s in self.strides])

    def values(self):
        return from_storage(self.storage, self.dt)


_HUGE = [1 << 62, (1 << 63) - 1]
# Device types whose backend runs here: a fault never claims host memory is theirs.
_LIVE_GPU_TYPES = {t for t, b in ((KDL_CUDA, "cuda"), (KDL_ROCM, "hip")) if flashattn.backends()[b].available}


def dlpack_fields(spec):
    """(dtype, shape, strides, byte_start, byte_offset, device, version, read_only, name) of spec's
    capsule, with its fault applied."""
    item = spec.buffer.itemsize
    shape, strides = list(spec.storage.shape), list(spec.strides)
    dtype = (spec.dt[0], spec.dt[1], 1)
    explicit = spec.layout != 0
    # Where the data starts: through the data pointer or through byte_offset, the producer's choice.
    byte_start, byte_offset = (spec.base * item, 0) if spec.gap % 2 else (0, spec.base * item)
    device, version, name = (KDL_CPU, 0), (1, spec.gap % 3), None
    if spec.layout == 1:
        # Size-1 dimensions may report any stride (frameworks do; the binding must ignore it).
        for i, s in enumerate(shape):
            if s == 1:
                strides[i] = [0, -7, 1 << 40, 3][spec.gap % 4]
    fault = spec.fault
    if fault:
        kind, d = fault
        nd = len(shape)
        if kind == "ndim" and spec.kind == "bias":
            shape, strides = ([1] * (5 - nd) + shape, [1] * (5 - nd) + strides) if d % 2 else ([], [])
            explicit = True
        elif kind == "ndim":
            if d % 2 and nd > 1:
                shape, strides = shape[:-1], strides[:-1]  # a smaller claimed extent: safe
            else:
                extra = [1] * (1 + d % 3)
                shape, strides = extra + shape, [1] * len(extra) + strides
                if d % 7 == 6:
                    shape, strides = [], []
            explicit = True
        elif kind == "dtype":
            dtype = _BAD_DTYPES[d % len(_BAD_DTYPES)]
            if dtype[:2] == spec.dt and dtype[2] == 1:
                dtype = (7, 32, 1)
            if spec.kind == "cache" and dtype[1] == 8 and dtype[2] == 1 and dtype[0] in (KDL_INT, KDL_E5M2):
                dtype = (KDL_FLOAT, 64, 1)  # a cache's quantised type is no fault there
        elif kind == "dim":
            i = d % nd
            shape[i] = [0, -1, -(1 << 31), -(1 << 63), _HUGE[0], _HUGE[1]][(d // 8) % 6]
        elif kind == "stride":
            explicit = True
            sized = [i for i, s in enumerate(shape) if s > 1]
            i = sized[d % len(sized)] if sized else nd - 1
            variant = (d // 8) % 4
            if variant == 0:
                strides[i] = 0
            elif variant == 1:
                strides[i] = -strides[i] if strides[i] else -1
            elif variant == 2:
                strides[i] = _HUGE[1]
            else:
                strides[i] = strides[i] + 1 if i == nd - 1 else -1  # a last stride other than 1
            if spec.kind == "bias" and strides[i] >= 0:
                strides[i] = -1  # a zero or large stride broadcasts or steps a bias: only negative ones are wrong
        elif kind == "misaligned":
            byte_offset += 1 + d % (item - 1)
        elif kind == "device":
            device = [(KDL_CPU, 1 + d % 3), (KDL_CUDA_HOST, 0), (KDL_CUDA, 0), (KDL_ROCM, 0), (99, 0),
                      (-1, 0)][d % 6]
            if device[0] in _LIVE_GPU_TYPES:
                device = (99, 0)  # host memory must never reach a GPU backend that is there
        elif kind == "read_only":
            pass
        elif kind == "version":
            version = [(0, 1), (2, 0), (0, 0), (3, 1)][d % 4]
        elif kind == "name":
            name = [b"dltensor_other", b"tensor", b""][d % 3]
    return dtype, shape, strides if explicit else None, byte_start, byte_offset, device, version, name


class Producer:
    """A DLPack producer whose __dlpack__ builds one capsule per call, recorded in created."""

    def __init__(self, spec, created):
        self.spec, self.created = spec, created

    def _capsule(self):
        spec = self.spec
        dtype, shape, strides, start, offset, device, version, name = dlpack_fields(spec)
        read_only = spec.read_only or (spec.fault is not None and spec.fault[0] == "read_only")
        versioned = spec.versioned or (spec.fault is not None and spec.fault[0] in ("version", "read_only"))
        capsule, ident = make_capsule(spec.buffer, start, dtype, shape, strides,
                                      offset, device, versioned, version, read_only, name)
        self.created.append(ident)
        return capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        fault = self.spec.fault[0] if self.spec.fault else None
        if fault == "raises":
            raise ProducerError("producer of %s refuses" % self.spec.name)
        if fault == "not_capsule":
            return [object(), 7, "dltensor", None][self.spec.fault[1] % 4]
        capsule = self._capsule()
        if fault == "used":
            # Consumed by someone else already: renamed, its deleter called once.
            _capsule_set_name(capsule, b"used_dltensor_versioned" if self.spec.versioned else b"used_dltensor")
            call_deleter(self.created[-1])
        return capsule


class OldProducer(Producer):
    """A producer from before DLPack 1.0: __dlpack__ has no max_version (so a TypeError for it)."""

    def __dlpack__(self, stream=None):
        return Producer.__dlpack__(self, stream)


class NotTensor:
    pass


def argument(spec, created):
    """What the call gets for spec: a producer, an old-style producer, or a bare capsule."""
    if spec.fault and spec.fault[0] == "no_dlpack":
        return NotTensor()
    if spec.protocol == 2:
        return OldProducer(spec, created)
    if spec.protocol == 3 and not (spec.fault and spec.fault[0] in ("raises", "not_capsule", "used")):
        return Producer(spec, created)._capsule()
    return Producer(spec, created)


_C_NAMES = {"k_cache": ["cache->k"], "v_cache": ["cache->v"], "cache_seqlens": ["cache->cache_seqlens"],
            "k": ["k_new"], "v": ["v_new"]}

FAULTS = ["ndim", "dtype", "dim", "stride", "misaligned", "device", "read_only", "version", "name", "raises",
          "not_capsule", "used", "no_dlpack"]


def rand_values(rng, shape, amplitude=1.0):
    return rng.uniform(-amplitude, amplitude, size=shape)


def tolerance(dt, ref, scale=1.0):
    return (_ROUNDING.get(dt, 2.0 ** -24) + 256 * 2.0 ** -24 * (1 + scale)) * (1 + np.max(np.abs(ref), initial=0.0))


def close(name, got, ref, dt, scale=1.0):
    got = np.asarray(got, dtype=np.float64)
    expect(got.shape == ref.shape, "%s: shape %s, reference %s" % (name, got.shape, ref.shape))
    both_inf = np.isneginf(got) & np.isneginf(ref)
    with np.errstate(invalid="ignore"):
        err = np.where(both_inf, 0.0, np.abs(got - ref))
    tol = tolerance(dt, ref[np.isfinite(ref)], scale)
    expect(not np.isnan(err).any() and err.max(initial=0.0) <= tol,
           "%s differs from the reference by %g (tolerance %g)" % (name, np.nanmax(err, initial=np.nan), tol))


def as_f64(x, dt):
    """A result array from the package (NumPy; bf16 arrives as DLPack bfloat16 NumPy cannot hold)."""
    return from_storage(np.asarray(x), dt) if dt == BF16 else np.asarray(x, dtype=np.float64)


# ---- the calls -----------------------------------------------------------------------------------


class Case:
    def __init__(self, r):
        self.r = r
        self.seed = r.u32()
        self.rng = np.random.default_rng(self.seed)
        self.specs = []
        self.created = []
        self.canary = 0xA5

    def add(self, spec):
        self.specs.append(spec)
        return spec


def decode_common(r):
    flags = r.byte()
    dt = [F32, F16, BF16][r.below(3)]
    batch, seq_q, seq_k = 1 + r.below(2), 1 + r.below(4), 1 + r.below(5)
    heads_kv, group, head_dim = 1 + r.below(2), 1 + r.below(2), 1 + r.below(8)
    return flags, dt, batch, seq_q, seq_k, heads_kv, group, head_dim


def decorate(case, names_to_specs, fault_byte, detail_byte, layout_bytes, writable=(), overlap=True):
    """Layout and producer behaviour of every argument, then at most one fault."""
    r = case.r
    specs = list(names_to_specs)
    for spec, b in zip(specs, layout_bytes):
        spec.layout = b % 5
        if spec.kind in ("table", "lse", "vector"):
            spec.layout %= 2  # the binding takes these packed only (a bare pointer for the C API)
        elif spec.layout == 4 and (spec.name in writable or spec.kind == "out" or not overlap):
            spec.layout = 2
        spec.gap = 1 + (b >> 3) % 4
        spec.protocol = (b >> 5) & 3       # 0 versioned, 1 unversioned, 2 no max_version, 3 a bare capsule
        if spec is specs[0] and spec.protocol == 3:
            spec.protocol = 0  # the first tensor's framework converts the results: this module's from_dlpack
        spec.versioned = spec.protocol != 1
        spec.read_only = bool(b & 0x80) and spec.name not in writable
    fault = None
    if fault_byte & 1:
        spec = specs[detail_byte % len(specs)]
        kind = FAULTS[(fault_byte >> 1) % len(FAULTS)]
        if kind == "read_only" and spec.name not in writable:
            kind = "ndim"
        if kind == "misaligned" and spec.storage.itemsize == 1:
            kind = "dim"
        if kind == "stride" and not any(s > 1 for s in spec.storage.shape):
            kind = "dtype"
        spec.fault = (kind, r.byte())
        fault = spec
    return fault


def run_call(case, fn, fault, outputs=()):
    """fn() under the rules: returns its result, or None when it raised as a fault must."""
    try:
        result = fn()
        error = None
    except Exception as e:  # noqa: BLE001: judged below
        result, error = None, e
        e.__traceback__ = None  # its frames would keep the producers' capsules alive
    if fault is None:
        expect(error is None, "a clean call raised %r" % (error,))
    else:
        expect(error is not None, "the call succeeded though %s had fault %s" % (fault.name, fault.fault))
        kind = fault.fault[0]
        if kind == "raises":
            expect(isinstance(error, ProducerError), "%s raised %r, not its producer's error" % (fault.name, error))
        else:
            ok_types = (TypeError, ValueError, flashattn.Error)
            expect(isinstance(error, ok_types), "%s fault %s raised %r" % (fault.name, fault.fault, error))
            message = str(error)
            # A dimension or device that disagrees may be reported on the argument it disagrees with.
            # The C API names a cache "cache->k"; the first tensor's rank picks the layout the others must
            # have.
            names = [fault.name] + _C_NAMES.get(fault.name, [])
            named = any(n in message for n in names) or isinstance(error, flashattn.BackendUnavailableError) or (
                (kind in ("dim", "device") or (kind == "ndim" and fault is case.specs[0]))
                and any(s.name in message for s in case.specs))
            expect(named, "%s fault %s: the message does not name it: %r" % (fault.name, fault.fault, message))
        for spec in outputs:
            expect((spec.buffer.view(np.uint8) == case.canary).all() if spec.name in ("out", "lse") else
                   np.array_equal(spec.buffer.view(np.uint8), spec.pristine),
                   "%s was written by a call that failed (%s on %s)" % (spec.name, fault.fault, fault.name))
    return result, error


def check_released(case):
    """Each capsule: consumed (renamed used_*) and released once by the binding, or left as it was,
    never released, and not referenced by the binding any more."""
    for ident in case.created:
        refs = sys.getrefcount(_ledger[ident][5]) - 2  # less the ledger's and the argument's
        name = _capsule_name(_ledger[ident][5]) or b""
        calls = deleter_calls(ident)
        if name.startswith(b"used_"):
            expect(calls == 1, "capsule %d (%s): its deleter ran %d times (expected once)" % (ident, name, calls))
        else:
            expect(calls == 0, "capsule %d (%s) was not consumed, yet its deleter ran %d times" % (ident, name, calls))
            call_deleter(ident)  # its destructor's part
        expect(refs == 0, "capsule %d (%s): %d references left after the call" % (ident, name, refs))


def op_forward(case, low_level):
    r = case.r
    flags, dt, batch, sq, sk, hkv, group, d = decode_common(r)
    hq = hkv * group
    rng = case.rng
    q = case.add(Spec("q", dt, to_storage(rand_values(rng, (batch, sq, hq, d)), dt)[0]))
    k = case.add(Spec("k", dt, to_storage(rand_values(rng, (batch, sk, hkv, d)), dt)[0]))
    v = case.add(Spec("v", dt, to_storage(rand_values(rng, (batch, sk, hkv, d)), dt)[0]))
    sinks = bias = out = lse = None
    if flags & 2:
        sinks = case.add(Spec("sinks", F32, rand_values(rng, (hq,)).astype(np.float32), "vector"))
    if flags & 4:
        bshape = [(batch, hq, sq, sk), (1, hq, sq, sk), (hq, 1, sk), (sk,)][(flags >> 4) % 4]
        bias = case.add(Spec("bias", dt, to_storage(rand_values(rng, bshape), dt)[0], "bias"))
    if low_level:
        out = case.add(Spec("out", dt, np.zeros((batch, sq, hq, d), _STORAGE[dt]), "out"))
        lse = case.add(Spec("lse", F32, np.zeros((batch, hq, sq), np.float32), "lse"))
    causal = bool(flags & 8)
    writable = ("out", "lse")
    fault = decorate(case, case.specs, r.byte(), r.byte(), [r.byte() for _ in case.specs], writable)
    for spec in case.specs:
        spec.build(0x7F)
        if spec in (out, lse):
            spec.buffer.view(np.uint8)[:] = case.canary
    args = {s.name: argument(s, case.created) for s in case.specs}
    kw = dict(causal=causal, sinks=args.get("sinks"), bias=args.get("bias"))

    def call():
        if not low_level:
            return flashattn.forward(args["q"], args["k"], args["v"], **kw)
        options = flashattn._options(causal, None, (-1, -1), None, 0.0, 0, 0, None, (128, 128), 0.0, None,
                                     kw["sinks"], kw["bias"])
        return _native.forward(args["q"], args["k"], args["v"], args["out"], args["lse"], False, *options, 0, None)

    result, error = run_call(case, call, fault, [s for s in (out, lse) if s is not None])
    del args, kw
    if error is None:
        ref_out, ref_lse = reference.attention(q.values(), k.values(), v.values(), causal=causal,
                                               sinks=None if sinks is None else sinks.values(),
                                               bias=None if bias is None else bias.values())
        if low_level:
            got_out, got_lse = from_storage(out.view(), dt), lse.view().astype(np.float64)
        else:
            got_out, got_lse = as_f64(result[0], dt), np.asarray(result[1], np.float64)
        close("out", got_out, ref_out, dt)
        close("lse", got_lse, ref_lse, F32)
    del result, error


def op_backward(case):
    r = case.r
    flags, dt, batch, sq, sk, hkv, group, d = decode_common(r)
    hq = hkv * group
    rng = case.rng
    causal = bool(flags & 8)
    qv, kv_, vv, dov = (to_storage(rand_values(rng, s), dt) for s in
                        ((batch, sq, hq, d), (batch, sk, hkv, d), (batch, sk, hkv, d), (batch, sq, hq, d)))
    ref = reference.attention(qv[1], kv_[1], vv[1], dov[1], causal=causal)
    out_s, _ = to_storage(ref[0], dt)
    q = case.add(Spec("q", dt, qv[0]))
    k = case.add(Spec("k", dt, kv_[0]))
    v = case.add(Spec("v", dt, vv[0]))
    out = case.add(Spec("out", dt, out_s, "input"))
    dout = case.add(Spec("dout", dt, dov[0]))
    lse = case.add(Spec("lse", F32, ref[1].astype(np.float32), "lse"))
    # No overlapping views: out and lse were computed from the values as drawn.
    fault = decorate(case, case.specs, r.byte(), r.byte(), [r.byte() for _ in case.specs], overlap=False)
    for spec in case.specs:
        spec.build(0x7F)
    args = [argument(s, case.created) for s in case.specs]
    result, error = run_call(case, lambda: flashattn.backward(*args, causal=causal), fault)
    del args
    if error is None:
        # The reference's gradients of the stored out (the library recomputes P; out enters only D).
        ref = reference.attention(q.values(), k.values(), v.values(), dout.values(), causal=causal)
        for name, got, want in zip(("dq", "dk", "dv"), result, ref[2:]):
            close(name, as_f64(got, dt), want, dt, scale=4.0)


def op_varlen(case):
    r = case.r
    flags, dt, batch, _, _, hkv, group, d = decode_common(r)
    hq = hkv * group
    rng = case.rng
    lens_q = [r.below(4) for _ in range(batch + 1)]
    lens_k = [r.below(5) for _ in range(batch + 1)]
    lens_q[0] = max(lens_q[0], 1)
    lens_k[0] = max(lens_k[0], 1)
    nb = len(lens_q)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = case.add(Spec("q", dt, to_storage(rand_values(rng, (tq, hq, d)), dt)[0]))
    k = case.add(Spec("k", dt, to_storage(rand_values(rng, (tk, hkv, d)), dt)[0]))
    v = case.add(Spec("v", dt, to_storage(rand_values(rng, (tk, hkv, d)), dt)[0]))
    cq = case.add(Spec("cu_seqlens_q", I32, cu_q, "table"))
    ck = case.add(Spec("cu_seqlens_k", I32, cu_k, "table"))
    causal = bool(flags & 8)
    fault = decorate(case, case.specs, r.byte(), r.byte(), [r.byte() for _ in case.specs])
    for spec in case.specs:
        spec.build(0x7F)
    args = [argument(s, case.created) for s in case.specs]
    result, error = run_call(case, lambda: flashattn.forward_varlen(*args, max(lens_q), max(lens_k),
                                                                    causal=causal), fault)
    del args
    if error is None:
        ref_out, ref_lse = reference.varlen_attention(q.values(), k.values(), v.values(), cu_q, cu_k, max(lens_q),
                                                      max(lens_k), causal=causal)
        close("out", as_f64(result[0], dt), ref_out, dt)
        close("lse", np.asarray(result[1], np.float64), ref_lse, F32)


def op_kvcache(case):
    r = case.r
    flags, dt, batch, sq, _, hkv, group, d = decode_common(r)
    hq = hkv * group
    rng = case.rng
    capacity = 1 + r.below(6)
    cache_kind = r.below(4)  # 0 q's dtype, 1 int8, 2 E4M3, 3 E5M2
    append = cache_kind == 0 and bool(flags & 16)
    new = 1 + r.below(2) if append else 0
    capacity += new
    seqlens = np.array([r.below(capacity - new + 1) for _ in range(batch)], np.int32)
    q = case.add(Spec("q", dt, to_storage(rand_values(rng, (batch, sq, hq, d)), dt)[0]))
    cshape = (batch, capacity, hkv, d)
    quant = None
    scales = {}
    if cache_kind == 0:
        kc = case.add(Spec("k_cache", dt, to_storage(rand_values(rng, cshape), dt)[0], "cache"))
        vc = case.add(Spec("v_cache", dt, to_storage(rand_values(rng, cshape), dt)[0], "cache"))
    elif cache_kind == 1:
        kc = case.add(Spec("k_cache", I8, rng.integers(-127, 128, cshape).astype(np.int8), "cache"))
        vc = case.add(Spec("v_cache", I8, rng.integers(-127, 128, cshape).astype(np.int8), "cache"))
        for name in ("k_scale", "v_scale"):
            scales[name] = case.add(Spec(name, F32, rng.uniform(0.001, 0.02, cshape[:3]).astype(np.float32),
                                         "vector"))
    else:
        fp8 = E4M3 if cache_kind == 2 else E5M2
        codes = _FP8_CODES[fp8[0]]
        kc = case.add(Spec("k_cache", fp8, rng.choice(codes, cshape), "cache"))
        vc = case.add(Spec("v_cache", fp8, rng.choice(codes, cshape), "cache"))
        if flags & 32:
            for name in ("k_descale", "v_descale"):
                scales[name] = case.add(Spec(name, F32, rng.uniform(0.25, 2.0, (batch, hkv)).astype(np.float32),
                                             "vector"))
    knew = vnew = None
    if append:
        knew = case.add(Spec("k", dt, to_storage(rand_values(rng, (batch, new, hkv, d)), dt)[0]))
        vnew = case.add(Spec("v", dt, to_storage(rand_values(rng, (batch, new, hkv, d)), dt)[0]))
    cs = case.add(Spec("cache_seqlens", I32, seqlens, "table"))
    causal = bool(flags & 8)
    writable = ("k_cache", "v_cache", "k_scale", "v_scale") if append else ()
    fault = decorate(case, case.specs, r.byte(), r.byte(), [r.byte() for _ in case.specs], writable)
    for spec in case.specs:
        spec.build(0x7F)
        spec.pristine = spec.buffer.view(np.uint8).copy()
    args = {s.name: argument(s, case.created) for s in case.specs}
    if cache_kind:
        quant = (-1, -1, args.get("k_scale"), args.get("v_scale"), args.get("k_descale"), args.get("v_descale"))

    def call():
        if quant is None:
            return flashattn.forward_kvcache(args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"],
                                             k=args.get("k"), v=args.get("v"), causal=causal)
        options = flashattn._options(causal, None, (-1, -1), None, 0.0, 0, 0, None, (128, 128), 0.0, None, None, None)
        out, lse = _native.forward_kvcache(args["q"], args["k_cache"], args["v_cache"], None, None, None, None, True,
                                           args["cache_seqlens"], None, None, None, 0, quant, None, *options, 0, None)
        return from_dlpack(Exported(out, (KDL_CPU, 0))), from_dlpack(Exported(lse, (KDL_CPU, 0)))

    watched = [s for s in case.specs if s.kind == "cache" or s.name in ("k_scale", "v_scale")]
    result, error = run_call(case, call, fault, watched)
    del args, quant
    if error is None:
        if cache_kind:
            kvals, vvals = kc.values(), vc.values()
            if cache_kind == 1:
                kvals = kvals * scales["k_scale"].values()[..., None]
                vvals = vvals * scales["v_scale"].values()[..., None]
            elif "k_descale" in scales:
                kvals = kvals * scales["k_descale"].values()[:, None, :, None]
                vvals = vvals * scales["v_descale"].values()[:, None, :, None]
        else:
            kvals, vvals = kc.values(), vc.values()
        ref = reference.kvcache_attention(q.values(), kvals, vvals, seqlens.astype(np.int64),
                                          None if knew is None else knew.values(),
                                          None if vnew is None else vnew.values(), causal=causal)
        close("out", as_f64(result[0], dt), ref[0], dt)
        close("lse", np.asarray(result[1], np.float64), ref[1], F32)
        if append:
            after_k, after_v = from_storage(kc.view(), dt), from_storage(vc.view(), dt)
            expect(np.array_equal(after_k, ref[2]) and np.array_equal(after_v, ref[3]),
                   "the caches after the append differ from the reference's")


def op_merge(case):
    r = case.r
    flags, dt, batch, sq, _, heads, _, d = decode_common(r)
    rng = case.rng
    n = 1 + r.below(3)
    packed = bool(flags & 2)
    oshape = (batch * sq, heads, d) if packed else (batch, sq, heads, d)
    lshape = (heads, batch * sq) if packed else (batch, heads, sq)
    outs, lses = [], []
    for c in range(n):
        outs.append(case.add(Spec("outs[%d]" % c, dt, to_storage(rand_values(rng, oshape), dt)[0])))
    for c in range(n):
        lses.append(case.add(Spec("lses[%d]" % c, F32, rand_values(rng, lshape, 3.0).astype(np.float32), "lse")))
    fault = decorate(case, case.specs, r.byte(), r.byte(), [r.byte() for _ in case.specs])
    for spec in case.specs:
        spec.build(0x7F)
    oargs = [argument(s, case.created) for s in outs]
    largs = [argument(s, case.created) for s in lses]
    result, error = run_call(case, lambda: flashattn.merge_partials(oargs, largs), fault)
    del oargs, largs
    if error is None:
        o = np.stack([s.values() for s in outs])
        ls = np.swapaxes(np.stack([s.values() for s in lses]), -1, -2)[..., None]  # rows like o's, heads last
        m = ls.max(axis=0)
        w = np.exp(ls - m)
        ref_out = (w * o).sum(axis=0) / w.sum(axis=0)
        ref_lse = np.swapaxes((m + np.log(w.sum(axis=0)))[..., 0], -1, -2)
        close("out", as_f64(result[0], dt), ref_out, dt)
        close("lse", np.asarray(result[1], np.float64), ref_lse, F32)


OPS = [lambda c: op_forward(c, False), lambda c: op_forward(c, True), op_backward, op_varlen, op_kvcache, op_merge]


def check_input(data):
    """Decodes data into one call, runs it and checks it; raises Finding (an AssertionError) on a failure."""
    r = Reader(bytes(data))
    op = r.below(len(OPS))
    case = Case(r)
    try:
        OPS[op](case)
        # Every capsule made for this input is gone by now (the binding dropped it, or it died
        # unconsumed with its argument): its deleter must have run once.
        check_released(case)
    finally:
        _ledger.clear()


def main():
    import random

    import atheris

    def mutate(data, max_size, seed):
        # Under gcc's ASan runtime libFuzzer gets no coverage (check-python-sanitized.sh says why), so
        # it keeps one input: half the mutants are fresh random inputs, which every byte decodes.
        rng = random.Random(seed)
        if not data or rng.random() < 0.5:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(1, max(2, min(max_size, 96)))))
        return atheris.Mutate(data, max_size)

    atheris.Setup(sys.argv + ["-max_len=96", "-len_control=0"], lambda data: check_input(data),
                  custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
