"""Several worker processes behind one campaign: the batch is shared out, results come back in case order.

One worker process runs a case at a time; on a GPU most of a case's time is Python (materialize, the backend's
argument plumbing, the compare's launches), not the device, so one campaign runs several workers on the same
GPU. :class:`WorkerPool` has the executor API of :class:`WorkerExecutor` (``run``, ``run_batch``, ``start``,
``close``, the counters the campaign report reads). ``run_batch`` cuts the batch into groups of consecutive
cases of one geometry (a generated case and its index variants, which reuse storages and must stay on one
worker, in order), and each member takes the next group as soon as it is free: the members stay busy whatever a
group costs. Each member keeps its own journal entries, crash handling and replay (a lost group costs that
group, replayed case by case as in WorkerExecutor); the results are put back in case order.

Scale-tier cases (``run_batch(..., lone_first=k)``: the first k cases) run one at a time on the first member,
the one process that keeps the tier's multi-GiB arenas, while the other members take the batch's groups; the
first member joins them when its lone cases are done. Before, a scale case was a batch of its own and the other
members waited for it (stalls of 5-10 s in a 60-s H200 campaign).

Start-up: the first member is waited for; the others start in the background and join from the next batch on,
so cases begin as soon as one worker can run them.

One campaign parent (one feed, one set of probes, one report) instead of one per worker, which is what
``fuzz --workers`` does (a campaign per worker, merged): no extra imports of sglang in parents, no merge.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.pipeline.reuse import geometry_key
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor

GROUP_LIMIT = 64  # cases per round trip to one member (a group longer than this is cut)


def auto_pool_size(cpu_count: int | None = None) -> int:
    """Worker processes for one GPU campaign: two cores per worker (the worker and its share of the parent's
    feed and bookkeeping), four cores left for the parent and the spares, at most 6."""
    cores = cpu_count if cpu_count is not None else usable_cores()
    return max(1, min(6, (cores - 4) // 2))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def geometry_groups(cases: Sequence[Case], limit: int = GROUP_LIMIT) -> list[range]:
    """Positions of `cases` cut into runs of consecutive cases of one geometry, at most `limit` long."""
    groups: list[range] = []
    start = 0
    for position in range(1, len(cases) + 1):
        if (position == len(cases) or position - start >= limit
                or geometry_key(cases[position]) != geometry_key(cases[start])):
            groups.append(range(start, position))
            start = position
    return groups


class WorkerPool:
    """`size` WorkerExecutors, each with its own journal folder, sharing batches."""

    def __init__(self, size: int, backend_names: Sequence[str], journal_dir: str | os.PathLike[str],
                 **worker_options: Any) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        journal = Path(journal_dir)
        # Member 0 journals where a lone worker would; the others in folders beside it. Every member warms up
        # (compiles, or loads from the disk cache, the menus' JIT modules): sglang builds each module once
        # under a lock, so members starting together wait for one build and load it.
        self.members = [WorkerExecutor(backend_names, journal_dir=journal if i == 0 else journal / f"worker-{i}",
                                       **worker_options) for i in range(size)]
        self.log_path = self.members[0].log_path
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="hicache-fuzz-pool")
        self._starter = ThreadPoolExecutor(max_workers=size, thread_name_prefix="hicache-fuzz-pool-start")
        self._starting: list[Future[None]] = []  # background starts of members 1.. (after start())
        self.unavailable: list[str] = []  # members that could not start (the others go on)
        self._seconds_per_case: dict[str, float] = {}  # backend -> moving average (orders a batch's groups)

    # ---- executor API ----------------------------------------------------------------------------------
    def run(self, case: Case) -> Result:
        return self.members[0].run(case)

    runs_lone_cases_aside = True  # run_batch(..., lone_first=k): see the module docstring

    def run_batch(self, cases: Sequence[Case], lone_first: int = 0) -> list[Result]:
        if not self._starting and self.size > 1:
            self.start()
        if len(cases) == 1:
            # A lone case is the scale tier's (the campaign sends those alone): always the first worker, so
            # that one process, not every one, keeps the tier's multi-GiB host and device arenas.
            return self.members[0].run_batch(cases)
        groups = [range(lone_first + g.start, lone_first + g.stop) for g in geometry_groups(cases[lone_first:])]
        lone = self.members[0]
        results: list[Result | None] = [None] * len(cases)
        # Longest groups first (by each backend's seconds per case so far): the batch ends when its last group
        # does, so a slow group started last would leave the other workers idle (sglang-pool's cases cost
        # several times the JIT backends' on the H200).
        queue = sorted(groups, key=lambda g: len(g) * self._seconds_per_case.get(cases[g.start].backend, 0.0))
        lock = threading.Lock()
        failures: list[WorkerError] = []

        def serve(member: WorkerExecutor) -> None:
            if member is lone:  # the scale tier's cases first, each alone, on the first member
                for position in range(lone_first):
                    try:
                        (results[position],) = member.run_batch([cases[position]])
                    except WorkerError as exc:
                        with lock:
                            failures.append(exc)
                        return
            while True:
                with lock:
                    if not queue or failures:
                        return
                    group = queue.pop()
                try:
                    done = member.run_batch([cases[i] for i in group])
                except WorkerError as exc:  # this member cannot start a worker: keep what it did produce
                    done = exc.partial_results
                    with lock:
                        failures.append(exc)
                for position, result in zip(group, done, strict=False):
                    results[position] = result
                if done:
                    with lock:
                        self._learn(cases[group.start].backend, done)
                if failures:
                    return

        list(self._threads.map(serve, self._ready_members()))
        if failures:
            prefix = []
            for result in results:
                if result is None:
                    break
                prefix.append(result)
            raise WorkerError(str(failures[0]), partial_results=prefix)
        return [r for r in results if r is not None]

    def _learn(self, backend: str, done: Sequence[Result]) -> None:
        """Track `backend`'s seconds per case (a moving average) for ordering groups."""
        spent = sum(r.seconds for r in done) / len(done)
        before = self._seconds_per_case.get(backend)
        self._seconds_per_case[backend] = spent if before is None else 0.8 * before + 0.2 * spent

    def start(self) -> None:
        """Start the first member and wait for it; the others start in the background and take work from the
        first batch after they are ready. So cases begin as soon as one worker can run them (start-up is that
        of one worker), and the pool ramps up while they run."""
        for member in self.members:
            member.spawn_early()
        self.members[0].start()
        if not self._starting:
            self._starting = [self._starter.submit(member.start) for member in self.members[1:]]

    def _ready_members(self) -> list[WorkerExecutor]:
        ready = [self.members[0]]
        for member, starting in zip(self.members[1:], self._starting, strict=False):
            if not starting.done():
                continue
            problem = starting.exception()
            if problem is None:
                ready.append(member)
            elif str(problem) not in self.unavailable:  # it could not start: the others go on without it
                self.unavailable.append(str(problem))
        return ready

    def spawn_early(self) -> None:
        for member in self.members:
            member.spawn_early()

    def enable_storage_reuse(self) -> None:
        for member in self.members:
            member.enable_storage_reuse()

    def close(self) -> None:
        for starting in self._starting:
            starting.cancel()
        for member in self.members:  # a member still starting sees its process killed and its start fail
            member.close()
        self._starter.shutdown(wait=True)
        for member in self.members:  # and anything a start that was finishing meanwhile left running
            member.close()
        self._threads.shutdown(wait=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what the campaign report reads (sums over the members) ------------------------------------------
    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def hello(self) -> dict[str, Any]:
        return self.members[0].hello

    @property
    def stage_seconds(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for member in self.members:
            for stage, seconds in member.stage_seconds.items():
                total[stage] = total.get(stage, 0.0) + seconds
        return total

    @property
    def compiled_in_cases(self) -> dict[str, tuple[int, float]]:
        total: dict[str, tuple[int, float]] = {}
        for member in self.members:
            for key, (count, seconds) in member.compiled_in_cases.items():
                before = total.get(key, (0, 0.0))
                total[key] = (before[0] + count, before[1] + seconds)
        return total

    def _sum(self, name: str) -> Any:
        return sum(getattr(member, name) for member in self.members)

    @property
    def compile_seconds(self) -> float:
        return float(self._sum("compile_seconds"))

    @property
    def startup_seconds(self) -> float:
        """What the campaign waited for: the first member (the others start while cases run), and its restarts."""
        return self.members[0].startup_seconds

    @property
    def background_startup_seconds(self) -> float:
        """Members 1.. starting while cases ran, and every member's spares."""
        return float(self._sum("background_startup_seconds")) + sum(m.startup_seconds for m in self.members[1:])

    @property
    def restarts(self) -> int:
        return int(self._sum("restarts"))

    @property
    def spares_used(self) -> int:
        return int(self._sum("spares_used"))

    @property
    def batch_losses(self) -> int:
        return int(self._sum("batch_losses"))

    @property
    def replayed(self) -> int:
        return int(self._sum("replayed"))

    @property
    def storages_reused(self) -> int:
        return int(self._sum("storages_reused"))
