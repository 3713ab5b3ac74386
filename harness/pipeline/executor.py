"""Executors run cases through a named backend and return their Results.

:class:`InProcessExecutor` calls the runner directly: right for the CPU reference and the bug zoo, whose
failures are Python exceptions. Backends that can take the process down (real GPU kernels: illegal
addresses, aborts) go through :class:`hicache_fuzz.harness.pipeline.worker.WorkerExecutor`, which runs cases in a
persistent child process, a batch per round trip. Both derive from
:class:`~hicache_fuzz.harness.pipeline.executor_base.Executor`, which declares what a campaign may ask of them.

In process on a GPU (``--isolate no``), device errors a backend raises or leaves pending are cleared after the
case and become its CRASH result (the runner probes the context after every backend call); the campaign goes
on. A sticky error (the context is lost) is also the case's CRASH result, and every later case is refused
with :class:`DeviceContextLost` naming the case that lost it: only a fresh process can go on from there.
"""

from __future__ import annotations

from collections.abc import Sequence

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.exit_codes import Unavailable
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.pipeline import probe_cache
from hicache_fuzz.harness.pipeline.executor_base import Executor, RunFigures, SubmittedBatch
from hicache_fuzz.harness.pipeline.reuse import StorageReuse
from hicache_fuzz.harness.pipeline.runner import DEVICE_CRASH_PREFIX, DeviceContextLost, run_case
from hicache_fuzz.kernels.buffers import HostMemory
from hicache_fuzz.kernels.registry import Registry


class _SubmitFailed:
    """A submission that raised: its handle raises the same error from ``result()``."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def result(self) -> list[Result]:
        raise self._error

    def done(self) -> bool:
        return True


def submit_batch(executor: Executor, cases: Sequence[Case], lone_first: int = 0) -> SubmittedBatch:
    """``executor.submit_batch(cases, lone_first)``, where a submission that raises (e.g. the first worker of a
    pool cannot start) raises from the handle's ``result()``, where ``run_batch`` would raise it. A worker pool
    queues the batch and returns at once, so the caller can submit the next batch before it records this one (the
    pool's members then never wait at a batch boundary); any other executor runs the batch before returning."""
    try:
        return executor.submit_batch(cases, lone_first)
    except Exception as exc:
        return _SubmitFailed(exc)


class InProcessExecutor(Executor):
    """Runs each case in this process, on `machine`'s device."""

    machine: Machine  # always set: the cases run on this process's device

    def __init__(self, registry: Registry, machine: Machine) -> None:
        self.registry = registry
        self.machine = machine
        self.stage_seconds: dict[str, float] = {}
        self.context_lost_by = ""  # case id whose sticky device error ended this process's usefulness
        self.reuse: StorageReuse | None = None
        self._confirmed: set[str] = set()  # backends whose cached probe answer was checked in this process

    def enable_storage_reuse(self) -> None:
        """Let consecutive cases of one geometry share storages (pipeline/reuse.py)."""
        self.reuse = StorageReuse()

    @property
    def storages_reused(self) -> int:
        return self.reuse.reused if self.reuse is not None else 0

    def run(self, case: Case) -> Result:
        if self.context_lost_by:
            raise DeviceContextLost(f"the device context was lost in case {self.context_lost_by}; "
                                    "run with --isolate yes to go on past sticky device errors")
        backend = self.registry.get(case.backend)
        if case.backend not in self._confirmed:  # an answer read from the probe cache is checked once, here
            stale = probe_cache.confirm_in_process(backend, self.machine)
            if stale:
                raise Unavailable(stale)
            self._confirmed.add(case.backend)
        memory = HostMemory(simulate=self.machine.device.type == "cpu")
        try:
            return run_case(case, backend, self.machine.platform, self.machine.device, memory, self.stage_seconds,
                            self.reuse)
        except DeviceContextLost as lost:
            if self.reuse is not None:
                self.reuse.drop()
            self.context_lost_by = case.case_id
            result = Result(case.case_id, case.backend, Outcome.CRASH)
            result.error = DEVICE_CRASH_PREFIX + str(lost)
            result.summary = f"sticky device error (context lost): {str(lost).splitlines()[0]}"
            return result

    def run_figures(self) -> RunFigures:
        return RunFigures(stage_seconds=dict(self.stage_seconds), storages_reused=self.storages_reused,
                          worker_processes=self.size)

    def close(self) -> None:
        pass
