"""Test-only JIT backend for tests/pipeline/test_prebuild.py. Its "modules" are marker files in $TEST_JIT_CACHE,
built (a sleep) under compile_books.module_lock and published by a rename, as sglang's loader builds under its
build lock; every build and load is logged with the process id, so a test sees who built what, in which order."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from hicache_fuzz.kernels import compile_books
from hicache_fuzz.kernels.base import Availability
from hicache_fuzz.kernels.reference import ReferenceBackend

MENU = (128, 256)
GROWTH = (512, 1024)
BUILD_SECONDS = 0.4
_loaded: set[int] = set()
_lock = threading.Lock()


def _log(what: str, row: int) -> None:
    with open(Path(os.environ["TEST_JIT_CACHE"]) / "log", "a") as log:
        log.write(f"{os.getpid()} {what} {row}\n")


def module(row: int) -> None:
    """Load module `row`, building it first when no process has (one build across processes)."""
    with _lock:
        if row in _loaded:
            return
    folder = Path(os.environ["TEST_JIT_CACHE"])
    with compile_books.module_lock(folder / "locks", f"fake({row})"):
        built = folder / f"module-{row}"
        if built.exists():
            _log("load", row)
        else:
            time.sleep(BUILD_SECONDS)
            staging = folder / f".staging-{row}-{os.getpid()}"
            staging.write_text("built")
            os.replace(staging, built)
            _log("build", row)
    with _lock:
        _loaded.add(row)


class FakeJitBackend(ReferenceBackend):
    name = "test-jit"
    needs_isolation = True

    def probe(self, platform):  # type: ignore[no-untyped-def]
        return Availability(True, "fake JIT")

    def case_space(self, space, platform):  # type: ignore[no-untyped-def]
        return space.narrowed(row_bytes=MENU, row_bytes_growth=GROWTH, grow_every=10)

    def compile_jobs(self, space, platform):  # type: ignore[no-untyped-def]
        return [lambda row=row: module(row) for row in space.row_bytes]

    def run(self, buffers):  # type: ignore[no-untyped-def]
        module(MENU[buffers.case.seed % len(MENU)])  # the module this case needs (by its seed)
        return super().run(buffers)


def backends():  # type: ignore[no-untyped-def]
    return [FakeJitBackend()]
