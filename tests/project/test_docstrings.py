"""The examples in the package's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import gputrace

PACKAGE = pkgutil.walk_packages(gputrace.__path__, "gputrace.")
MODULES = [
    *sorted(m.name for m in PACKAGE if not m.name.endswith("__main__")),
    "tests.cupti_fake",  # a test double outside the package, whose docstring teaches by example
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
