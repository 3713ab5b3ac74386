"""Every test module imports on the CPU, and every module-level import in it resolves.

A module that skips itself at import (a GPU test on a machine without one) never reaches the imports below the
skip, so a broken import there would only show on a GPU machine. The static check reads each module's top-level
imports and resolves them without running the module: the project's own (hicache_fuzz, tests, benchmarks) must
exist with every name imported from them, everything else must be the standard library or an installed dependency.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIRST_PARTY = {"hicache_fuzz", "tests", "benchmarks"}
DEPENDENCIES = {"pytest", "torch", "numpy", "hypothesis"}
NOT_MODULES = {"fake_sglang", "data"}  # the stand-in sglang package (imported as `sglang`), fixtures


def _modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py")
                  if not NOT_MODULES & set(path.relative_to(TESTS).parts) and path.name != "conftest.py")


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _top_level_imports(tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of the imports in the module body, in `if` blocks included (not in functions or
    try/except ImportError, where a missing module is handled)."""
    found: list[tuple[str, tuple[str, ...]]] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If):
            body[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def _unresolved(module: str, names: tuple[str, ...]) -> str | None:
    top = module.split(".")[0]
    if top in FIRST_PARTY:
        try:
            imported = importlib.import_module(module)
        except ImportError as error:
            return f"{module}: {error}"
        submodules = getattr(imported, "__path__", None) is not None
        missing = [name for name in names if name != "*" and not hasattr(imported, name)
                   and not (submodules and importlib.util.find_spec(f"{module}.{name}") is not None)]
        return f"{module} has no {', '.join(missing)}" if missing else None
    if top in sys.stdlib_module_names or top in DEPENDENCIES:
        return None if importlib.util.find_spec(top) is not None else f"{top} is not installed"
    return f"{module} is neither the standard library, a dependency nor this project's"


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(TESTS)))
def test_module_imports_resolve(path: Path) -> None:
    problems = [problem for module, names in _top_level_imports(ast.parse(path.read_text()))
                if (problem := _unresolved(module, names))]
    assert not problems, problems


@pytest.mark.parametrize("path", [path for path in _modules() if path.name.startswith("test_")],
                         ids=lambda path: str(path.relative_to(TESTS)))
def test_module_imports(path: Path) -> None:
    with contextlib.suppress(pytest.skip.Exception):  # a GPU module on the CPU: imports checked statically
        importlib.import_module(_dotted(path))


def test_the_static_check_catches_an_import_hidden_behind_a_skip() -> None:
    source = ("import pytest\nif True:\n    pytest.skip('no GPU', allow_module_level=True)\n"
              "from drive import smoke_cases\nfrom tests.gpu.smoke_cases import no_such_name\n")
    problems = [_unresolved(module, names) for module, names in _top_level_imports(ast.parse(source))]
    assert problems[1] and "drive" in problems[1]
    assert problems[2] and "no_such_name" in problems[2]
