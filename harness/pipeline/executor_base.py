"""The executor base: what a campaign may ask of the thing that runs its cases.

Kept apart from executor.py so that every executor (in process, the worker, the worker pool, the dry run's
predictor) can derive from it without importing the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result

if TYPE_CHECKING:
    from hicache_fuzz.harness.pipeline.prebuild import Prebuild


class Executor:
    """What a campaign may ask of an executor. `run` is required; the rest are capabilities with the defaults of
    an executor that runs one case at a time in this process, which an executor that has more overrides. The
    campaign loop asks only for what is declared here."""

    # `run_batch(cases)` runs a batch in one round trip: campaigns hand it batches of DEFAULT_BATCH x size cases.
    runs_batches: bool = False
    # `submit_batch` returns before the batch has run (a queue of workers): the loop submits batches ahead.
    queues_batches: bool = False
    # `run_batch(cases, lone_first=k)` runs the first k cases (the scale tier's) aside on the first worker while
    # the other workers take the rest (run_batch below).
    runs_lone_cases_aside: bool = False
    # The JIT builder process this executor owns, if any: it builds every menu growth stage itself.
    prebuild: Prebuild | None = None

    @property
    def size(self) -> int:
        """The worker processes that share a batch."""
        return 1

    def run(self, case: Case) -> Result:
        raise NotImplementedError

    def start(self) -> None:
        """Start the worker processes now rather than at the first case (nothing to start in process)."""

    def enable_storage_reuse(self) -> None:
        """Let consecutive cases of one geometry share storages (pipeline/reuse.py), where the executor can."""

    def close(self) -> None:
        """Release what the executor holds."""
