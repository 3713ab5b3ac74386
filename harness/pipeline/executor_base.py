"""The executor base: everything a campaign or a command may ask of the thing that runs its cases.

Kept apart from executor.py so that every executor (in process, the worker, the worker pool, the dry run's
predictor) can derive from it without importing the others. The campaign loop, the engine report and the commands
ask an executor only what :class:`Executor` declares; each default is the honest answer of an executor that runs
one case at a time in this process, and an executor that can do more overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result

if TYPE_CHECKING:
    from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharing
    from hicache_fuzz.harness.pipeline.prebuild import Prebuild


@dataclass(frozen=True)
class RunFigures:
    """What an executor counted over the cases it ran: its part of a campaign's engine report
    (engine/engine_stats.py)."""

    # seconds per runner stage (pipeline/runner.py: predict, materialize, backend, oracle, compare, classify),
    # summed over the cases whose stages were clocked; empty where no stage is clocked
    stage_seconds: dict[str, float] = field(default_factory=dict)
    batch_losses: int = 0  # batches a worker died or hung in
    cases_replayed_alone: int = 0  # run again alone: after a lost batch, or a death in a worker that ran others
    storages_reused: int = 0  # cases that ran on storages kept from the case before them (pipeline/reuse.py)
    worker_processes: int = 1  # processes that share a batch


@dataclass(frozen=True)
class WorkerFigures:
    """What running the cases in worker processes cost (pipeline/worker.py): JIT compiles, start-ups, restarts,
    and the serving worker's greeting. Only an executor with worker processes has them."""

    compile_seconds: float = 0.0  # JIT compiles inside cases and warm-ups, on the workers' clocks
    startup_seconds: float = 0.0  # waited for workers to start, on the caller's clock
    background_startup_seconds: float = 0.0  # workers starting while cases ran, off the caller's clock
    restarts: int = 0  # workers that took over after the first
    spares_used: int = 0  # restarts served by a spare that was already up
    # JIT modules first needed inside a case (not by a warm-up): key -> (processes that needed it, seconds)
    compiled_in_cases: dict[str, tuple[int, float]] = field(default_factory=dict)
    hello: dict[str, Any] = field(default_factory=dict)  # the serving worker's greeting ({} before any greeted)
    # the worker-only packages this process had imported when the first worker greeted (None before it did)
    parent_imports_at_ready: list[str] | None = None
    standing_taken: int = 0  # workers handed over by the standing pool's server (pipeline/standing.py)
    first_worker_standing: bool = False  # the first worker that greeted was one of them
    standing_notes: tuple[str, ...] = ()  # why workers were not taken from a standing pool that was asked


class SubmittedBatch(Protocol):
    """A batch handed to an executor: ``result()`` gives its results in case order, or raises what running it
    raised; ``done()`` says whether ``result()`` would return at once."""

    def result(self) -> list[Result]: ...
    def done(self) -> bool: ...


class FinishedBatch:
    """A batch run at submission (executors that run one batch at a time): its results or its exception."""

    def __init__(self, executor: Executor, cases: Sequence[Case], lone_first: int) -> None:
        self._results: list[Result] = []
        self._error: BaseException | None = None
        try:
            self._results = executor.run_batch(cases, lone_first)
        except Exception as exc:
            self._error = exc

    def result(self) -> list[Result]:
        if self._error is not None:
            raise self._error
        return self._results

    def done(self) -> bool:
        return True


class Executor:
    """What a campaign may ask of an executor. `run` is required; everything else has the default of an executor
    that runs one case at a time in this process, which an executor that has more overrides. The campaign loop,
    the engine report and the commands ask for nothing that is not declared here."""

    # `run_batch(cases)` runs a batch in one round trip: campaigns hand it batches of DEFAULT_BATCH x size cases.
    runs_batches: bool = False
    # `submit_batch` returns before the batch has run (a queue of workers): the loop submits batches ahead.
    queues_batches: bool = False
    # `run_batch(cases, lone_first=k)` runs the first k cases (the scale tier's) aside on the first worker while
    # the other workers take the rest.
    runs_lone_cases_aside: bool = False
    # The JIT builder process this executor owns, if any: it builds every menu growth stage itself.
    prebuild: Prebuild | None = None
    # How the worker processes share one GPU (pipeline/gpu_sharing.py): a worker pool's, or a worker's given one.
    sharing: GpuSharing | None = None

    @property
    def size(self) -> int:
        """The worker processes that share a batch."""
        return 1

    def run(self, case: Case) -> Result:
        raise NotImplementedError

    def run_batch(self, cases: Sequence[Case], lone_first: int = 0) -> list[Result]:
        """The results of `cases`, in case order. The first `lone_first` are the scale tier's, which an executor
        with several workers runs apart from the rest; here every case runs on its own, in order."""
        return [self.run(case) for case in cases]

    def submit_batch(self, cases: Sequence[Case], lone_first: int = 0) -> SubmittedBatch:
        """Hand `cases` over: the handle's ``result()`` gives what ``run_batch`` would, or raises what it would.
        An executor that queues batches returns at once; here the batch runs before this returns."""
        return FinishedBatch(self, cases, lone_first)

    def spawn_early(self) -> None:
        """Launch the worker processes now without waiting for them, so that their start-up overlaps what the
        caller does next; ``start`` or the first case waits for them (nothing to launch in process)."""

    def start(self) -> None:
        """Start the worker processes now rather than at the first case (nothing to start in process)."""

    def enable_storage_reuse(self) -> None:
        """Let consecutive cases of one geometry share storages (pipeline/reuse.py), where the executor can."""

    def run_figures(self) -> RunFigures:
        """What this executor counted over the cases it ran so far (nothing is counted here)."""
        return RunFigures(worker_processes=self.size)

    def worker_figures(self) -> WorkerFigures | None:
        """What its worker processes cost so far; None for an executor without worker processes."""
        return None

    def close(self) -> None:
        """Release what the executor holds."""
