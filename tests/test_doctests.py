"""Run the doctest examples of every module under pipeline/ (docstring examples are tested code)."""

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "pipeline"


def modules_with_examples() -> list[str]:
    """Dotted names of pipeline modules whose source holds a ``>>>`` prompt (found without importing)."""
    names = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_the_cache_module_is_among_them():
    assert "pipeline.core.cache" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.attempted > 0, f"{name} has '>>>' in its source but no doctest example was collected"
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in {name}"
