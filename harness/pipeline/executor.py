"""Executors run a case through a named backend and return its Result.

:class:`InProcessExecutor` calls the runner directly: right for the CPU reference and the bug zoo, whose
failures are Python exceptions. Backends that can take the process down (real GPU kernels: illegal
addresses, aborts) go through :class:`hicache_fuzz.harness.pipeline.worker.WorkerExecutor`, which has the same two
methods and runs each case in a persistent child process.
"""

from __future__ import annotations

from typing import Protocol

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.buffers import HostMemory
from hicache_fuzz.kernels.registry import Registry


class Executor(Protocol):
    def run(self, case: Case) -> Result: ...
    def close(self) -> None: ...


class InProcessExecutor:
    def __init__(self, registry: Registry, machine: Machine) -> None:
        self.registry = registry
        self.machine = machine

    def run(self, case: Case) -> Result:
        backend = self.registry.get(case.backend)
        memory = HostMemory(simulate=self.machine.device.type == "cpu")
        return run_case(case, backend, self.machine.platform, self.machine.device, memory)

    def close(self) -> None:
        pass
