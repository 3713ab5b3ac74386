"""JIT compile bookkeeping: what backends spent building or loading kernel modules, kept apart from run time.

One :class:`CompileBooks` object per family of backends that share a module cache (the sglang backends share
:data:`SGLANG_BOOKS`). A backend declares its books through ``Backend.compile_books()``; the worker, the CLI
and the parallel runner read them through that hook instead of probing modules for attributes. Importing this
module imports nothing else (no sglang, no GPU).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompileBooks:
    compile_seconds: float = 0.0  # first calls of JIT module factories (compiles and cache loads), summed
    compiled_keys: dict[str, float] = field(default_factory=dict)  # "factory(args)" -> seconds, in build order
    background_seconds: float = 0.0  # wall time of background (prefetch) compile batches, summed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, key: str, seconds: float) -> None:
        with self._lock:
            self.compile_seconds += seconds
            self.compiled_keys[key] = round(seconds, 3)

    def add_background(self, seconds: float) -> None:
        with self._lock:
            self.background_seconds += seconds

    def mark(self) -> tuple[float, int]:
        """A point to measure from: (compile seconds, modules known)."""
        return self.compile_seconds, len(self.compiled_keys)

    def since(self, mark: tuple[float, int]) -> tuple[float, dict[str, float]]:
        """Compile seconds and the modules built since `mark` (compiled_keys only grows, in insertion order)."""
        seconds, known = mark
        return self.compile_seconds - seconds, dict(list(self.compiled_keys.items())[known:])


SGLANG_BOOKS = CompileBooks()


def books_of(backends: Iterable[Any]) -> list[CompileBooks]:
    """The distinct books the backends declare (Backend.compile_books), in first-seen order."""
    found: dict[int, CompileBooks] = {}
    for backend in backends:
        books = backend.compile_books()
        if books is not None:
            found.setdefault(id(books), books)
    return list(found.values())


def warm_up(backends: Iterable[Any], platform: Any, space: Any, workers: int | None = None) -> float:
    """Run every module build the available backends declare for `space` (Backend.compile_jobs, on each
    backend's narrowed space) in parallel threads (nvcc runs out of process); wall seconds. A failed build is
    remembered by the backend's memo and surfaces when a case needs that module."""
    jobs: list[Callable[[], object]] = []
    for backend in backends:
        if not backend.probe(platform).available:
            continue
        jobs.extend(backend.compile_jobs(backend.case_space(space, platform), platform))
    return run_jobs(jobs, workers)


def run_jobs(jobs: list[Callable[[], object]], workers: int | None = None) -> float:
    """Run module builds in parallel threads (nvcc runs out of process); wall seconds. A failed build is
    remembered by the backend's memo and surfaces when a case needs that module."""
    if not jobs:
        return 0.0
    started = time.perf_counter()

    def run(job: Callable[[], object]) -> None:
        with contextlib.suppress(Exception):
            job()

    with ThreadPoolExecutor(max_workers=workers or min(16, len(jobs))) as pool:
        list(pool.map(run, jobs))
    return time.perf_counter() - started
