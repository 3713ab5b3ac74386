"""Small deliberately broken backends for the reproducer/minimizer tests (load with
``--backend-plugin _mutants:backends`` and ``tests/`` on PYTHONPATH, or import directly).

Each overrides one step of the reference backend, like the bug zoo does, so the tests do not depend on
kernels/zoo.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache_fuzz.api import Backend, Case, Platform, ReferenceBackend
from hicache_fuzz.harness.model.outcome import Result  # cpu_run, a test helper, uses the harness itself
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.buffers import HostMemory


class DropLastPage(ReferenceBackend):
    """Forgets the last page of every transfer of two or more pages (a loop bound off by one page)."""

    name = "test-drop-last-page"
    models_bug = "the last page of a multi-page transfer is not copied"

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        ps = case.page_size
        if len(host) >= 2 * ps:
            return host[:-ps], device[:-ps]
        return host, device


class DeviceRowOffByOne(ReferenceBackend):
    """Load-back writes device row d+1 instead of d when d is the last row of its page."""

    name = "test-device-off-by-one"
    models_bug = "load-back misplaces the last row of each device page"

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        if case.direction.value != "load_back" or case.page_size < 2:
            return host, device
        shifted = [d + 1 if d % case.page_size == case.page_size - 1 and d + 1 < case.device_rows else d
                   for d in device]
        return host, shifted


def backends() -> list[Backend]:
    return [DropLastPage(), DeviceRowOffByOne()]


def cpu_run(backend: Backend) -> Callable[[Case], Result]:
    """run(case) -> Result on the CPU platform, in process (what the minimizer and Hypothesis call)."""
    def run(case: Case) -> Result:
        return run_case(case, backend, Platform("cpu"), torch.device("cpu"), HostMemory(simulate=True))

    return run
