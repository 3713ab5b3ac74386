"""Test-only backends for tests/pipeline/test_worker.py: ones that abort the process, one that never returns."""

from __future__ import annotations

import os
import time

from hicache_fuzz.api import CompileBooks, ReferenceBackend

BOOKS = CompileBooks()  # the test backend's own books (one per process)


class AbortBackend(ReferenceBackend):
    name = "test-abort"
    needs_isolation = True

    def run(self, buffers):  # type: ignore[no-untyped-def]
        if buffers.case.seed % 2:
            os.abort()
        return super().run(buffers)


class SleepBackend(ReferenceBackend):
    name = "test-sleep"
    needs_isolation = True

    def run(self, buffers):  # type: ignore[no-untyped-def]
        if buffers.case.seed % 2:
            while True:
                time.sleep(1)
        return super().run(buffers)


class MpsCollateralBackend(ReferenceBackend):
    """Stands in for another MPS client's fault: seed 1 aborts its worker only while the worker is an MPS client
    (CUDA_MPS_PIPE_DIRECTORY set), seed 3 always; seed 5 is a launch the driver refuses (always)."""

    name = "test-mps-collateral"
    needs_isolation = True

    def plan(self, case, platform):  # type: ignore[no-untyped-def]
        if case.seed == 5:
            raise RuntimeError("CUDA error: invalid argument")
        return super().plan(case, platform)

    def run(self, buffers):  # type: ignore[no-untyped-def]
        seed = buffers.case.seed
        if seed == 3 or (seed == 1 and os.environ.get("CUDA_MPS_PIPE_DIRECTORY")):
            os.abort()
        return super().run(buffers)


class LongLivedBackend(ReferenceBackend):
    """Stands in for a bug that corrupts its process: seed 7 passes but poisons the process, and any later case
    in a poisoned process aborts; seed 9 aborts in a process that ran other cases before it, and alone raises a
    CUDA error (one bug, two symptoms)."""

    name = "test-long-lived"
    needs_isolation = True
    ran = 0  # cases this process has run
    poisoned = False

    def plan(self, case, platform):  # type: ignore[no-untyped-def]
        if case.seed == 9 and not LongLivedBackend.ran:  # as torch raises it at the runner's synchronize
            raise RuntimeError("CUDA error: invalid argument")
        return super().plan(case, platform)

    def run(self, buffers):  # type: ignore[no-untyped-def]
        seed = buffers.case.seed
        LongLivedBackend.ran += 1
        if LongLivedBackend.poisoned or seed == 9:
            os.abort()
        LongLivedBackend.poisoned = seed == 7
        return super().run(buffers)


class PoisonBackend(ReferenceBackend):
    """Stands in for a case that corrupts its worker without failing: a seed divisible by 4 passes but poisons the
    process, and any later case in a poisoned process aborts (in a fresh worker, every case passes)."""

    name = "test-poison"
    needs_isolation = True
    poisoned = False

    def run(self, buffers):  # type: ignore[no-untyped-def]
        if PoisonBackend.poisoned:
            os.abort()
        PoisonBackend.poisoned = buffers.case.seed % 4 == 0
        return super().run(buffers)


def backends():  # type: ignore[no-untyped-def]
    return [AbortBackend(), SleepBackend(), DeviceErrorBackend(), CompileInCaseBackend(), MpsCollateralBackend(),
            LongLivedBackend(), PoisonBackend()]


class DeviceErrorBackend(ReferenceBackend):
    """A CUDA error escaping the runner (as torch raises it at the runner's synchronize)."""

    name = "test-device-error"
    needs_isolation = True

    def plan(self, case, platform):  # type: ignore[no-untyped-def]
        if case.seed % 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().plan(case, platform)


class CompileInCaseBackend(ReferenceBackend):
    """Records a JIT module "built" inside the case, as sglang_common's factory spy does."""

    name = "test-compile"
    needs_isolation = True

    def run(self, buffers):  # type: ignore[no-untyped-def]
        key = f"fake_module(element_size={buffers.case.seed})"
        if key not in BOOKS.compiled_keys:
            BOOKS.record(key, 0.25)
        return super().run(buffers)

    def compile_books(self) -> CompileBooks:
        return BOOKS
