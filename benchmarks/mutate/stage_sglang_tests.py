#!/usr/bin/env python3
"""Stage sglang's own HiCache kernel tests into .mutate-targets/sglang-tests/ (an ignored folder that travels
to the GPU machine inside the checkout), and check that what they import exists in the sglang they will run
against, so a test written for another sglang version is reported here rather than on the GPU.

The sglang 0.5.23 wheel ships no kernel tests; they live in sglang's source repository under
test/registered/jit/ (e.g. test_hicache*.py). Point --from at a checkout of that repository (or at a folder
holding the test files); nothing is downloaded.

    python benchmarks/mutate/stage_sglang_tests.py --from ~/src/sglang [--sglang-src DIR] [--pattern GLOB]...
    echo .mutate-targets/ >> .git/info/exclude
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
import sys
from pathlib import Path

DEFAULT_PATTERNS = ("test_hicache*.py",)
SEARCH_DIRS = ("test/registered/jit", "python/sglang/jit_kernel/tests", ".")


def sglang_package(given: Path | None) -> Path:
    if given is not None:
        for candidate in (given, given / "sglang", given / "python" / "sglang"):
            if (candidate / "__init__.py").is_file() and candidate.name == "sglang":
                return candidate
        sys.exit(f"stage: no sglang package at {given}")
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("stage: sglang is not installed; pass --sglang-src")
    return Path(next(iter(spec.submodule_search_locations)))


def module_file(module: str, package: Path) -> Path | None:
    rel = Path(*module.split(".")[1:])
    return next((p for p in (package / rel.with_suffix(".py"), package / rel / "__init__.py") if p.is_file()), None)


def defined_names(path: Path, package: Path, depth: int = 0) -> set[str]:
    """Top-level names a module defines or imports, following `from sglang.x import *` a few levels."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name)
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang.") and depth < 3:
                    star = module_file(node.module or "", package)
                    if star is not None:
                        names |= defined_names(star, package, depth + 1)
    return names


def missing_imports(test: Path, package: Path) -> list[str]:
    """`from sglang.x import name` lines whose module file or top-level name does not exist in `package`."""
    problems = []
    for node in ast.walk(ast.parse(test.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("sglang."):
            continue
        module = module_file(node.module or "", package)
        if module is None:
            problems.append(f"{node.module} (no such module)")
            continue
        defined = defined_names(module, package)
        problems += [f"{node.module}.{a.name}" for a in node.names if a.name not in defined and a.name != "*"]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, required=True,
                        help="sglang source checkout, or a folder holding the test files")
    parser.add_argument("--sglang-src", type=Path, help="the sglang the tests must match (default: installed)")
    parser.add_argument("--pattern", action="append", help=f"test file globs (default: {DEFAULT_PATTERNS})")
    parser.add_argument("--dest", type=Path, default=Path(".mutate-targets/sglang-tests"))
    parser.add_argument("--no-adapter", action="store_true",
                        help="do not add sglang_tests_conftest.py (ours) as conftest.py: the tests that build host "
                             "pools with the pre-0.5.23 constructor then fail on 0.5.23")
    args = parser.parse_args()
    package = sglang_package(args.sglang_src)
    found: dict[str, Path] = {}
    for folder in SEARCH_DIRS:
        for pattern in args.pattern or DEFAULT_PATTERNS:
            for path in sorted((args.source / folder).glob(pattern)):
                found.setdefault(path.name, path)
    if not found:
        print(f"stage: no {args.pattern or DEFAULT_PATTERNS} under {args.source} ({', '.join(SEARCH_DIRS)})",
              file=sys.stderr)
        return 3
    args.dest.mkdir(parents=True, exist_ok=True)
    # Its own (empty) pytest config, so the checkout's pyproject.toml options do not apply to sglang's tests.
    (args.dest / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    adapter = Path(__file__).with_name("sglang_tests_conftest.py")
    if args.no_adapter:
        (args.dest / "conftest.py").unlink(missing_ok=True)
    else:
        shutil.copy2(adapter, args.dest / "conftest.py")
        print(f"staged {args.dest / 'conftest.py'} (hicache-fuzz's host-pool constructor adapter, not sglang's)")
    status = 0
    for name, path in sorted(found.items()):
        problems = missing_imports(path, package)
        if problems:
            print(f"skip {name}: imports missing from {package}: {', '.join(problems)}", file=sys.stderr)
            status = 1
            continue
        shutil.copy2(path, args.dest / name)
        print(f"staged {args.dest / name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
