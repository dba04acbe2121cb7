"""fuzz/fuzz_dlpack.py's committed inputs (fuzz/corpus/fuzz_dlpack, fuzz/regressions/fuzz_dlpack)
replayed through its check, without atheris: synthetic DLPack producers (ctypes capsules, faulty
fields and producers) against the binding, with the reference, canary and release checks."""

import functools
import importlib.util
import os
import sys

import pytest

_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
_inputs = sorted(os.path.join(d, name) for d in (os.path.join(_root, "fuzz", sub, "fuzz_dlpack")
                                                 for sub in ("corpus", "regressions"))
                 if os.path.isdir(d) for name in os.listdir(d))


@functools.lru_cache(maxsize=None)
def _harness():
    spec = importlib.util.spec_from_file_location("fuzz_dlpack", os.path.join(_root, "fuzz", "fuzz_dlpack.py"))
    module = importlib.util.module_from_spec(spec)
    # Registered: flashattn converts results with the from_dlpack of the producers' module.
    sys.modules["fuzz_dlpack"] = module
    spec.loader.exec_module(module)
    return module


def test_inputs_exist():
    assert len(_inputs) >= 5


@pytest.mark.parametrize("path", _inputs, ids=[os.path.basename(p) for p in _inputs])
def test_input(path):
    with open(path, "rb") as f:
        _harness().check_input(f.read())
