import os

import pytest

import flashattn

# The suite tests the installed package: a flashattn imported from the source tree (which has no
# built extension) would mean the wheel is not what is being tested.
_source_tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_report_header(config):
    return "flashattn %s from %s" % (flashattn.__version__, os.path.dirname(flashattn.__file__))


def pytest_configure(config):
    if os.path.abspath(flashattn.__file__).startswith(_source_tree + os.sep):
        raise pytest.UsageError("flashattn was imported from the source tree, not the installed package")
