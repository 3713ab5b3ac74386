"""Several worker processes behind one campaign: the batch is shared out, results come back in case order.

One worker process runs a case at a time; on a GPU most of a case's time is Python (materialize, the backend's
argument plumbing, the compare's launches), not the device, so one campaign runs several workers on the same
GPU. :class:`WorkerPool` is an executor (pipeline/executor_base.py) as :class:`WorkerExecutor` is (``run``,
``run_batch``, ``submit_batch``, ``start``, ``close``; its run and worker figures are its members' together).
``run_batch`` cuts the batch into groups of consecutive cases of one geometry (a generated case and its index
variants, which reuse storages and must stay on one worker, in order), and each member takes the next group as
soon as it is free: the members stay busy whatever a group costs. Each member keeps its own journal entries,
crash handling and replay (a lost group costs that group, replayed case by case as in WorkerExecutor); the
results are put back in case order.

Scale-tier cases (``run_batch(..., lone_first=k)``: the first k cases) run one at a time on the first member,
the one process that keeps the tier's multi-GiB arenas, while the other members take the batch's groups; the
first member joins them when its lone cases are done. As a batch of its own, a scale case of seconds would leave
the other members waiting for it.

Start-up: the first member is waited for; the others start in the background and join from the next batch on,
so cases begin as soon as one worker can run them.

One campaign parent (one feed, one set of probes, one report) instead of one per worker, which is what
``fuzz --workers`` does (a campaign per worker, merged): no extra imports of sglang in parents, no merge.

On CUDA the members are clients of one private MPS server where one can run (``gpu_sharing``, see
pipeline/gpu_sharing.py: separate contexts time-slice the GPU, which kept six workers near the rate of three).
Where a standing pool's server serves this campaign (pipeline/standing.py), the members take its ready workers
and join its MPS server instead (``pool_sharing``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.platform import usable_cores
from hicache_fuzz.harness.pipeline.executor_base import Executor, RunFigures, WorkerFigures
from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharing, contexts, start_gpu_sharing
from hicache_fuzz.harness.pipeline.prebuild import Prebuild
from hicache_fuzz.harness.pipeline.reuse import geometry_key
from hicache_fuzz.harness.pipeline.standing import server_sharing
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor

GROUP_LIMIT = 64  # cases per round trip to one member (a group longer than this is cut)
POOL_SWITCH_INTERVAL_S = 0.0005  # the interpreter's thread switch interval while a pool runs (see start)


class PendingBatch:
    """A batch queued on the pool: its results fill in as the members finish its groups."""

    def __init__(self, cases: list[Case], groups: int) -> None:
        self.cases = cases
        self.results: list[Result | None] = [None] * len(cases)
        self.failure: WorkerError | None = None
        self.harness_error: BaseException | None = None
        self._left = groups
        self._done = threading.Event()
        if groups == 0:
            self._done.set()

    def group_done(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._done.set()

    def fail(self, failure: WorkerError) -> None:
        """Mark the batch failed; its groups still queued are skipped (each still counts as done)."""
        if self.failure is None:
            self.failure = failure
        if self._left <= 0:
            self._done.set()

    def done(self) -> bool:
        """True once every group has finished (result() then returns at once)."""
        return self._done.is_set()

    def result(self) -> list[Result]:
        """Every result in case order; raises the batch's WorkerError with the results in front of the first
        missing one, or the harness error a member met."""
        self._done.wait()
        if self.harness_error is not None:
            raise self.harness_error
        if self.failure is not None:
            prefix = []
            for result in self.results:
                if result is None:
                    break
                prefix.append(result)
            raise WorkerError(str(self.failure), partial_results=prefix)
        return [r for r in self.results if r is not None]


def auto_pool_size(cpu_count: int | None = None) -> int:
    """Worker processes for one GPU campaign: two cores per worker (the worker and its share of the parent's
    feed and bookkeeping), four cores left for the parent and the spares, at most 6."""
    cores = cpu_count if cpu_count is not None else usable_cores()
    return max(1, min(6, (cores - 4) // 2))


def pool_sharing(requested: str, size: int, worker_options: dict[str, Any]) -> GpuSharing:
    """How the pool's workers share the GPU: where a standing pool's server could serve this campaign
    (pipeline/standing.py), as its workers do, since they joined its MPS server at start-up (the daemon is the
    server's, never the campaign's); `auto` follows that server's setting, `mps` needs it to be MPS. Else as
    gpu_sharing decides: a private MPS daemon of the pool, or contexts."""
    platform_kind = worker_options.get("platform_kind", "cpu")
    if platform_kind == "cuda" and size >= 2 and requested in ("auto", "mps"):
        base = worker_options.get("env")
        server = server_sharing(platform_kind, dict(os.environ if base is None else base),
                                worker_options.get("python") or sys.executable, worker_options.get("plugins", ()))
        if server is not None and server.get("mode") == "mps":
            return GpuSharing("mps", f"the standing pool's MPS server: {server.get('reason', '')}",
                              env=dict(server.get("env") or {}))
        if server is not None and requested == "auto":
            return contexts(f"as the standing pool's workers: {server.get('reason', '')}")
    return start_gpu_sharing(requested, platform_kind, size)


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


class WorkerPool(Executor):
    """`size` WorkerExecutors, each with its own journal folder, sharing batches."""

    def __init__(self, size: int, backend_names: Sequence[str], journal_dir: str | os.PathLike[str],
                 gpu_sharing: str = "contexts", **worker_options: Any) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        self.prebuild: Prebuild | None = None  # the JIT builder process the pool owns (attach_prebuild), if any
        journal = Path(journal_dir)
        # Before any member spawns: they read the sharing's environment at every spawn.
        self.sharing: GpuSharing = pool_sharing(gpu_sharing, size, worker_options)
        # Member 0 journals where a lone worker would; the others in folders beside it. With warm_up every member
        # loads (or compiles) the menus' JIT modules; with a builder (`prebuild`) none does. Either way sglang
        # builds each module once under a lock, so processes asking for it together wait for one build.
        self.members = [WorkerExecutor(backend_names, journal_dir=journal if i == 0 else journal / f"worker-{i}",
                                       sharing=self.sharing, **worker_options) for i in range(size)]
        self.log_path = self.members[0].log_path
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="hicache-fuzz-pool")
        self._starter = ThreadPoolExecutor(max_workers=size, thread_name_prefix="hicache-fuzz-pool-start")
        self._starting: list[Future[None]] = []  # background starts of members 1.. (after start())
        self.unavailable: list[str] = []  # members that could not start (the others go on)
        self._seconds_per_case: dict[str, float] = {}  # backend -> moving average (orders a batch's groups)
        # Queued work: (batch, positions) groups for any member, lone cases for the first; one serving thread
        # per started member takes them in order (submit_batch).
        self._work: deque[tuple[PendingBatch, range]] = deque()
        self._lone: deque[tuple[PendingBatch, range]] = deque()
        self._work_ready = threading.Condition()
        self._serving: set[int] = set()  # members with a serving thread
        self._closing = False
        self._broken: WorkerError | None = None  # a member could not start a worker: the pool runs nothing more
        self._switch_interval: float | None = None  # the interpreter's, restored by close()

    def attach_prebuild(self, prebuild: Prebuild | None) -> bool:
        """Own `prebuild` (closed with the pool); False when there is none."""
        self.prebuild = prebuild
        return prebuild is not None

    def warm_up_members(self) -> None:
        """Let every member warm up (no builder could start): before any has spawned."""
        for member in self.members:
            member.warm_up = True

    # ---- executor API ----------------------------------------------------------------------------------
    def run(self, case: Case) -> Result:
        return self.members[0].run(case)

    runs_lone_cases_aside = True  # run_batch(..., lone_first=k): see the module docstring
    queues_batches = True  # submit_batch queues the batch for the members and returns at once
    runs_batches = True

    def run_batch(self, cases: Sequence[Case], lone_first: int = 0) -> list[Result]:
        return self.submit_batch(cases, lone_first).result()

    def submit_batch(self, cases: Sequence[Case], lone_first: int = 0) -> PendingBatch:
        """Queue `cases` and return at once; ``result()`` waits for them. The members take a batch's groups
        after those of the batches queued before it, so a campaign that submits batch i + 1 before it records
        batch i keeps every member busy across the boundary (no member waits for a batch's last group, nor for
        the parent's recording). The first `lone_first` cases (the scale tier's) run on the first member, before
        it takes groups. Any other batch, one case long included, goes to whichever member is free: a one-case
        batch queued for the first member waited behind the scale case it was running, and so did every batch
        recorded after it (stalls of seconds)."""
        if not self._starting and self.size > 1:
            self.start()
        groups = [range(lone_first + g.start, lone_first + g.stop) for g in geometry_groups(cases[lone_first:])]
        # Longest groups first (by each backend's seconds per case so far): the batch ends when its last group
        # does, so a slow group started last would leave the other workers idle (sglang-pool's cases cost
        # several times the JIT backends' on a GPU).
        queue = sorted(groups, key=lambda g: len(g) * self._seconds_per_case.get(cases[g.start].backend, 0.0))
        with self._work_ready:
            if self._broken is not None:
                refused = PendingBatch(list(cases), 0)
                refused.fail(self._broken)
                return refused
            batch = PendingBatch(list(cases), lone_first + len(queue))
            self._lone.extend((batch, range(position, position + 1)) for position in range(lone_first))
            self._work.extend((batch, group) for group in reversed(queue))
            self._work_ready.notify_all()
        self._serve_ready_members()
        return batch

    def _serve_ready_members(self) -> None:
        """One serving thread per member that has started (members join as their start-up finishes)."""
        for member in self._ready_members():
            number = next(i for i, m in enumerate(self.members) if m is member)
            if number not in self._serving:
                self._serving.add(number)
                self._threads.submit(self._serve, member, number == 0)

    def _next_item(self, first: bool) -> tuple[PendingBatch, range] | None:
        with self._work_ready:
            while not self._closing and not self._work and not (first and self._lone):
                self._work_ready.wait()
            if self._closing:
                return None
            return (self._lone if first and self._lone else self._work).popleft()

    def _drop_queued(self, failure: WorkerError) -> None:
        """Fail every queued group (the caller holds the lock): their batches end without running them."""
        for queued, _ in (*self._lone, *self._work):
            queued.fail(failure)
            queued.group_done()
        self._lone.clear()
        self._work.clear()

    def _serve(self, member: WorkerExecutor, first: bool) -> None:
        while (item := self._next_item(first)) is not None:
            batch, group = item
            failure: WorkerError | None = None
            if batch.failure is None:
                try:
                    done = member.run_batch([batch.cases[i] for i in group])
                except WorkerError as exc:  # this member cannot start a worker: keep what it did produce
                    done, failure = exc.partial_results, exc
                except BaseException as exc:  # a harness error: the batch raises it to the campaign
                    done, failure = [], WorkerError(f"{type(exc).__name__}: {exc}")
                    batch.harness_error = exc
            else:
                done = []  # a group of a batch that already failed is not run
            with self._work_ready:
                for position, result in zip(group, done, strict=False):
                    batch.results[position] = result
                if done:
                    self._learn(batch.cases[group.start].backend, done)
                if failure is not None:
                    # The pool stops: every queued group (of this batch and of those after it) is not run, and
                    # later batches fail at once, as a lone worker that cannot start does.
                    self._broken = failure
                    self._drop_queued(failure)
                    batch.fail(failure)
                batch.group_done()
            if failure is not None:
                return

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
        # The serving threads hand each member its next group: a member idles until its thread gets the
        # interpreter lock, which the recording thread holds for up to the switch interval (5 ms by default,
        # about a group of JIT cases). A shorter interval while the pool runs bounds that wait.
        if self._switch_interval is None:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch_interval, POOL_SWITCH_INTERVAL_S))
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

    def stop_serving(self) -> None:
        """End the serving threads (after the group each is running) and wait for them."""
        with self._work_ready:
            self._closing = True
            self._work_ready.notify_all()
        self._threads.shutdown(wait=True)

    def close(self) -> None:
        with self._work_ready:
            self._closing = True
            self._drop_queued(WorkerError("the worker pool was closed before these cases ran"))
            self._work_ready.notify_all()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        for starting in self._starting:
            starting.cancel()
        for member in self.members:  # a member still starting sees its process killed and its start fail
            member.close()
        self._starter.shutdown(wait=True)
        for member in self.members:  # and anything a start that was finishing meanwhile left running
            member.close()
        self._threads.shutdown(wait=True)
        self.sharing.stop()  # after its clients are gone
        if self.prebuild is not None:
            self.prebuild.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what the campaign report reads (sums over the members) ------------------------------------------
    @property
    def size(self) -> int:
        return len(self.members)

    def run_figures(self) -> RunFigures:
        members = [member.run_figures() for member in self.members]
        stages: dict[str, float] = {}
        for figures in members:
            for stage, seconds in figures.stage_seconds.items():
                stages[stage] = stages.get(stage, 0.0) + seconds
        return RunFigures(stage_seconds=stages, batch_losses=sum(f.batch_losses for f in members),
                          cases_replayed_alone=sum(f.cases_replayed_alone for f in members),
                          storages_reused=sum(f.storages_reused for f in members), worker_processes=self.size)

    def worker_figures(self) -> WorkerFigures:
        """The members' figures summed, but for start-up: the campaign waited for the first member only (and its
        restarts); members 1.. start while cases run, so their start-up counts in the background, with every
        member's spares. The greeting is the first member's."""
        members = [member.worker_figures() for member in self.members]
        compiled: dict[str, tuple[int, float]] = {}
        for figures in members:
            for key, (count, seconds) in figures.compiled_in_cases.items():
                before = compiled.get(key, (0, 0.0))
                compiled[key] = (before[0] + count, before[1] + seconds)
        first = members[0]
        return WorkerFigures(
            compile_seconds=sum(f.compile_seconds for f in members),
            startup_seconds=first.startup_seconds,
            background_startup_seconds=(sum(f.background_startup_seconds for f in members)
                                        + sum(f.startup_seconds for f in members[1:])),
            restarts=sum(f.restarts for f in members), spares_used=sum(f.spares_used for f in members),
            compiled_in_cases=compiled, hello=first.hello, parent_imports_at_ready=first.parent_imports_at_ready,
            standing_taken=sum(f.standing_taken for f in members), first_worker_standing=first.first_worker_standing,
            standing_notes=tuple(dict.fromkeys(note for f in members for note in f.standing_notes)))
