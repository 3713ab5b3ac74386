"""JIT compile bookkeeping: what backends spent building or loading kernel modules, kept apart from run time.

One :class:`CompileBooks` object per family of backends that share a module cache (the sglang backends share
:data:`SGLANG_BOOKS`). A backend declares its books through ``Backend.compile_books()``; the worker, the CLI
and the parallel runner read them through that hook instead of probing modules for attributes. Importing this
module imports nothing else (no sglang, no GPU).

A module is built once across processes: sglang's own loader builds each module variant under a file lock and
publishes it by a rename, so a process that asks for a module another is building waits and then loads it; a
build sglang refuses leaves nothing on disk, so its builder records the refusal (kernels/refused_builds.py) under
:func:`module_lock`, and a process that waited on that lock replays the record instead of running nvcc again.
:func:`prebuild_jobs` lists, for the campaign's builder process (harness/pipeline/prebuild.py), every module the
backends' spaces can draw, in the order the campaign will need them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


def run_jobs(jobs: list[Callable[[], object]], workers: int | None = None,
             urgent: Callable[[], list[Callable[[], object]]] | None = None) -> float:
    """Run module builds in parallel threads (nvcc runs out of process); wall seconds. A failed build is
    remembered by the backend's memo and surfaces when a case needs that module. `urgent` is asked before each
    job is taken: the jobs it returns go to the front of the queue (it returns each job once)."""
    if not jobs:
        return 0.0
    started = time.perf_counter()
    queue = deque(jobs)
    lock = threading.Lock()

    def serve() -> None:
        while True:
            with lock:
                if urgent is not None:
                    queue.extendleft(reversed(urgent()))
                if not queue:
                    return
                job = queue.popleft()
            with contextlib.suppress(Exception):
                job()

    threads = [threading.Thread(target=serve, name=f"hicache-fuzz-build-{n}")
               for n in range(max(1, min(workers or 16, len(jobs))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


@contextlib.contextmanager
def module_lock(folder: Path, key: str) -> Iterator[None]:
    """Hold the cross-process lock of module `key` (a file in `folder`): one process builds a module while the
    others asking for it wait, then find what it left (the built module, or the recorded refusal). The kernel
    drops the lock when its holder dies, so a killed builder never blocks the others."""
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:40]
    handle = os.open(folder / f"{name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def _interleaved(per_backend: list[list[Callable[[], object]]]) -> list[Callable[[], object]]:
    """One job of each backend in turn: a batch holds cases of every backend, so each needs its first rows."""
    out: list[Callable[[], object]] = []
    for position in range(max((len(jobs) for jobs in per_backend), default=0)):
        out.extend(jobs[position] for jobs in per_backend if position < len(jobs))
    return out


def _rows_jobs(backend: Any, space: Any, platform: Any, rows: Sequence[int]) -> list[Callable[[], object]]:
    """`backend`'s module builds for exactly `rows` of its campaign space `space` (no growth stage)."""
    return list(backend.compile_jobs(space.narrowed(row_bytes=tuple(rows), row_bytes_growth=(), grow_every=0,
                                                    head_dims=space.head_dims), platform))


def row_jobs(backends: Iterable[Any], platform: Any, space: Any,
             rows: Mapping[str, Sequence[int]]) -> list[Callable[[], object]]:
    """The module builds of the named rows (backend name -> row bytes) of the available backends among `backends`,
    one backend after another in turn: what a campaign's first cases load. A handful of modules, all started at
    once by the builder's threads, so their order within a backend does not matter."""
    per_backend = []
    for backend in backends:
        wanted = tuple(dict.fromkeys(rows.get(backend.name, ())))
        if wanted and backend.probe(platform).available:
            own = backend.case_space(space.narrowed(backend=backend.name), platform)
            per_backend.append(_rows_jobs(backend, own, platform, wanted))
    return _interleaved(per_backend)


def prebuild_jobs(backends: Iterable[Any], platform: Any, space: Any) -> tuple[list[Callable[[], object]], int]:
    """Every module build the available backends' campaign spaces can draw (Backend.compile_jobs: the list
    ``jit-warm`` builds), ordered by when a campaign needs them: the rows of the starting menus first (the
    first batches draw from them), one backend after another in turn, then each growth stage in stage order.
    Returns the jobs and how many of them are the starting menus'."""
    available = [b for b in backends if b.probe(platform).available]
    spaces = [b.case_space(space.narrowed(backend=b.name), platform) for b in available]
    menus = _interleaved([_rows_jobs(b, s, platform, s.row_bytes) for b, s in zip(available, spaces, strict=True)])
    stages = max((len(s.row_bytes_growth) for s in spaces), default=0)
    grown: list[Callable[[], object]] = []
    for stage in range(stages):
        grown += _interleaved([
            _rows_jobs(b, s, platform, (s.row_bytes_growth[stage],))
            for b, s in zip(available, spaces, strict=True)
            if stage < len(s.row_bytes_growth) and s.row_bytes_growth[stage] not in s.row_bytes])
    return menus + grown, len(menus)
