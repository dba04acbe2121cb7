"""DLPack glue in Python: where a tensor lives, which stream to compute on, and how to hand an
output capsule back to the framework the input came from."""

import sys

import numpy

from . import _native

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM = 1, 2, 3, 10


class Exported:
    """An output made by the C extension, handed to a framework's from_dlpack once, as a
    versioned (DLPack >= 1.0, writable) or unversioned capsule, whichever the consumer asks for."""

    __slots__ = ("_pending", "_device")

    def __init__(self, pending, device):
        self._pending = pending
        self._device = device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # stream: outputs are synchronized before they get here. dl_device/copy: the memory is
        # already on its device, and a framework asking for a copy makes its own.
        return _native.export(self._pending, max_version is not None and max_version[0] >= 1)

    def __dlpack_device__(self):
        return self._device


def framework_of(x):
    """The top-level module of x's type: "torch", "numpy", "cupy", "jax" or "jaxlib", ..."""
    return type(x).__module__.partition(".")[0]


def torch_stream(t):
    """DLPack stream number of torch's current stream on t's device; None on the CPU."""
    if t.device.type == "cpu":
        return None
    import torch  # loaded already: t is a torch tensor

    stream = torch.cuda.current_stream(t.device).cuda_stream
    # DLPack: CUDA's legacy default stream is 1 (0 is not allowed); ROCm's default stream is 0.
    return stream if (stream or torch.version.hip) else 1


def placement(x):
    """(DLPack device, stream) for a call on x: stream is None on the CPU; on a GPU it is the
    framework's current stream (torch, CuPy) or the default stream."""
    if not hasattr(x, "__dlpack_device__"):
        return (KDL_CPU, 0), None  # a bare capsule or a non-tensor: the C extension says what is wrong
    device = tuple(x.__dlpack_device__())
    if device[0] in (KDL_CPU, KDL_CUDA_HOST):
        return device, None
    root = framework_of(x)
    if root == "torch":
        return device, torch_stream(x)
    if root == "cupy":
        stream = sys.modules["cupy"].cuda.get_current_stream().ptr
        return device, stream if (stream or device[0] == KDL_ROCM) else 1
    return device, (0 if device[0] == KDL_ROCM else 1)


def _jax_from_dlpack(obj):
    import jax.dlpack

    return jax.dlpack.from_dlpack(obj)


_CONVERTERS = {"numpy": numpy.from_dlpack, "jax": _jax_from_dlpack, "jaxlib": _jax_from_dlpack}


def converter_for(x):
    """The from_dlpack of x's framework (NumPy for anything without one)."""
    root = framework_of(x)
    convert = _CONVERTERS.get(root)
    if convert is None:
        module = sys.modules.get(root)
        convert = getattr(module, "from_dlpack", None) or numpy.from_dlpack
        _CONVERTERS[root] = convert
    return convert


def wrap(convert, capsule, device):
    return convert(Exported(capsule, device))
