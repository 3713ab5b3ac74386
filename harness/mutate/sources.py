"""Where the sglang HiCache transfer sources are, which of their lines get mutants, and sampling.

Discovery never imports sglang: ``importlib.util.find_spec("sglang")`` only locates the package (its
``__init__`` does not run), or ``--sglang-src`` names a folder: the package itself, a folder holding it
(site-packages, an unpacked wheel) or a source checkout holding ``python/sglang``.

Python filter. The host-pool and controller modules are large and mostly bookkeeping, so their mutants are
restricted to the bodies of functions whose name says they move data or place indices
(:data:`PY_TRANSFER_FUNCTION`); the dispatch module ``kernels/ops/kvcache/hicache.py`` and the page_unified
layout geometry are transfer code throughout, so every function body there gets mutants. Module-level code
(imports, constants, class attributes) never does: a mutant there breaks the import rather than a transfer.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.operators import generate

KVCACHEIO_DIR = "sglang/kernels/jit/csrc/kvcacheio"
# The HiCache KV transfer kernels of kvcacheio/ (hisparse*, transfer_mamba are other features' kernels).
CUDA_FILES = ("hicache.cuh", "hicache_tma.cuh", "staged_write_back.cuh", "relayout.cuh", "page_row.cuh")
# Transfer code throughout: every function body gets mutants (the dispatch, and page_unified's layout
# geometry, whose every method computes a byte offset or a shape).
UNFILTERED_PY_FILES = ("sglang/kernels/ops/kvcache/hicache.py", "sglang/srt/mem_cache/pool_host/page_unified.py")
FILTERED_PY_FILES = (
    "sglang/srt/mem_cache/pool_host/base.py",
    "sglang/srt/mem_cache/pool_host/common.py",
    "sglang/srt/mem_cache/pool_host/mha.py",
    "sglang/srt/mem_cache/pool_host/mla.py",
    "sglang/srt/mem_cache/pool_host/group.py",
    "sglang/srt/mem_cache/pool_host/hisparse.py",
    "sglang/srt/mem_cache/pool_host/mha_mxfp8.py",
    "sglang/srt/mem_cache/pool_host/dsa.py",
    "sglang/srt/mem_cache/pool_host/page_interleave.py",
    "sglang/srt/mem_cache/pool_host/unified.py",
    "sglang/srt/managers/cache_controller.py",
    "sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py",
)
PY_TRANSFER_FUNCTION = re.compile(
    r"transfer|backup|load|write_back|copy|move|stag|page|indic|index|offset|ptr|layout|alloc|free|evict|"
    r"prefetch|flush|stride|buffer|size_per_token|rows|merge_ops|dva", re.IGNORECASE)


class SourcesMissing(Exception):
    """No sglang sources where asked (exit 3)."""


def find_sglang_root(sglang_src: Path | None) -> Path:
    """The folder that holds the ``sglang`` package directory."""
    if sglang_src is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SourcesMissing("sglang is not installed here; pass --sglang-src DIR (a source checkout, an "
                                 "unpacked wheel or site-packages)")
        return Path(next(iter(spec.submodule_search_locations))).resolve().parent
    src = sglang_src.resolve()
    for candidate in (src.parent if src.name == "sglang" else None, src, src / "python"):
        if candidate is not None and (candidate / "sglang" / "__init__.py").is_file():
            return candidate
    raise SourcesMissing(f"--sglang-src {sglang_src}: no sglang package there (looked for sglang/__init__.py "
                         f"in it, and in python/ under it)")


@dataclass(frozen=True)
class SourceFile:
    rel: str  # "sglang/..." posix, relative to the root
    language: str  # "c" or "python"
    filtered: bool  # Python: only transfer/index functions (see the module docstring)


def default_sources(root: Path) -> list[SourceFile]:
    files = [SourceFile(f"{KVCACHEIO_DIR}/{name}", "c", False) for name in CUDA_FILES]
    files += [SourceFile(rel, "python", False) for rel in UNFILTERED_PY_FILES]
    files += [SourceFile(rel, "python", True) for rel in FILTERED_PY_FILES]
    return [f for f in files if (root / f.rel).is_file()]


def python_lines(text: str, filtered: bool) -> Callable[[int], bool]:
    """Lines inside function bodies (all functions, or only those PY_TRANSFER_FUNCTION names)."""
    allowed: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            if filtered and not PY_TRANSFER_FUNCTION.search(node.name):
                continue
            first = node.body[0].lineno
            last = node.end_lineno or first
            allowed.update(range(first, last + 1))
    return allowed.__contains__


def generate_all(root: Path, sources: list[SourceFile]) -> list[Mutant]:
    """Every mutant of the given files, in a deterministic order (file list order, then source order)."""
    mutants: list[Mutant] = []
    for source in sources:
        text = (root / source.rel).read_text(encoding="utf-8")
        lines = python_lines(text, source.filtered) if source.language == "python" else None
        mutants += generate(source.rel, text, source.language, lines)
    return mutants


def select(mutants: list[Mutant], files: list[str], operators: list[str]) -> list[Mutant]:
    """Keep mutants whose file matches one of the fnmatch patterns (anchored at the start or at any folder:
    "hicache.cuh" and "pool_host/*.py" both work) and whose
    operator is listed; an empty list keeps all."""
    def file_ok(rel: str) -> bool:
        return not files or any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, "*/" + p) for p in files)
    return [m for m in mutants if file_ok(m.file) and (not operators or m.operator in operators)]


def sample(mutants: list[Mutant], count: int, seed: int) -> list[Mutant]:
    """A seeded sample spread over files first, then operators: the files are taken round-robin in a seeded
    order, one mutant each per round, and each file's mutants come from its operators in turn (each operator's
    mutants shuffled by the seed, the operators in a seeded order). So a sample of at least as many mutants as
    there are files has a mutant of every file, and within a file N mutants touch as many operators as N
    allows."""
    if count >= len(mutants):
        return list(mutants)
    rng = random.Random(seed)
    by_file: dict[str, dict[str, list[Mutant]]] = {}
    for mutant in mutants:
        by_file.setdefault(mutant.file, {}).setdefault(mutant.operator, []).append(mutant)
    queues: dict[str, list[Mutant]] = {}  # file -> its mutants in the order they are taken
    for file in sorted(by_file):
        groups = by_file[file]
        operators = sorted(groups)
        rng.shuffle(operators)
        for operator in operators:
            rng.shuffle(groups[operator])
        queue: list[Mutant] = []
        while any(groups[operator] for operator in operators):
            queue += [groups[operator].pop() for operator in operators if groups[operator]]
        queues[file] = queue
    files = sorted(queues)
    rng.shuffle(files)
    picked: list[Mutant] = []
    position = 0
    while len(picked) < count:
        picked += [queues[file][position] for file in files if position < len(queues[file])][:count - len(picked)]
        position += 1
    return picked
