"""The type stubs (flashattn/__init__.pyi, installed with the package) name every public function
with the parameters, in order, that the implementation has."""

import ast
import inspect
import os

import pytest

import flashattn


def stub_functions():
    path = os.path.join(os.path.dirname(flashattn.__file__), "__init__.pyi")
    tree = ast.parse(open(path).read())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def parameter_names(node):
    args = node.args
    return [a.arg for a in args.posonlyargs + args.args], [a.arg for a in args.kwonlyargs]


def test_every_public_function_has_a_stub():
    stubs = stub_functions()
    functions = [name for name in flashattn.__all__ if name[0].islower() and name != "__version__"]
    assert sorted(set(functions) - set(stubs)) == []


@pytest.mark.parametrize("name", sorted(stub_functions()))
def test_stub_parameters_match_the_implementation(name):
    if name.startswith("flash_attn_"):
        pytest.importorskip("torch") if os.environ.get("FLASHATTN_REQUIRE_TORCH") != "1" else None
    function = getattr(flashattn, name)
    signature = inspect.signature(function)
    positional = [p.name for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p.name for p in signature.parameters.values() if p.kind == p.KEYWORD_ONLY]
    assert parameter_names(stub_functions()[name]) == (positional, keyword)
