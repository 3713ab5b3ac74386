"""A fuzz campaign: generate -> run -> classify -> save failures, within a case and time budget.

Case ``i`` of a campaign depends only on (seed, i, the backend's case space), so a campaign can be split into
shards (``shard=(k, n)`` runs the indices i with i % n == k) and its case set is the union of its shards'.
Every failure is written to the corpus directory as soon as it is classified, before the next case runs.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.engine.campaign_case import backend_space
from hicache_fuzz.harness.engine.engine_stats import EngineStats
from hicache_fuzz.harness.engine.feed import (
    CaseFeed,
    EngineOptions,
    EngineSettings,
    ScaleTier,
    Slot,
    rows_by_backend,
)
from hicache_fuzz.harness.engine.feed_process import ProcessFeed
from hicache_fuzz.harness.engine.scheduler import BatchScheduler, Submitted
from hicache_fuzz.harness.findings.corpus import reproducer_dict
from hicache_fuzz.harness.findings.identity import identify
from hicache_fuzz.harness.findings.known import KnownMap, known_files, match_known
from hicache_fuzz.harness.findings.known_crash import KnownCrash, known_crashes
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.json_input import InputError
from hicache_fuzz.harness.model.outcome import FRESH_WORKER_KEY, Outcome, Result
from hicache_fuzz.harness.model.output_paths import write_json_atomic
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import Executor
from hicache_fuzz.harness.pipeline.runner import explain_crash
from hicache_fuzz.harness.pipeline.worker import WorkerError
from hicache_fuzz.harness.reporting.coverage import Coverage
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform


@dataclass
class CampaignConfig:
    backends: list[str]
    seed: int
    max_cases: int | None = None  # per campaign (all backends together); None = until the time budget
    max_seconds: float | None = None
    corpus_dir: Path | None = None  # failures go here; None keeps them in the report only
    shard: tuple[int, int] = (0, 1)  # (k, n): run indices i with i % n == k
    start_index: int = 0
    space: CaseSpace = field(default_factory=CaseSpace)
    stop_on_first_failure: bool = False
    # Stop at the first failure that no known entry accounts for (mutation runs: the first new bug decides a
    # mutant's verdict; known sglang bugs met on the way do not end the campaign).
    stop_on_new_failure: bool = False
    # the known, unfixed failures that apply here (findings/known.py KnownMap): a failure with one of their
    # identities, on a case within that entry's trigger, is counted and marked known, and not saved again.
    known_signatures: KnownMap = field(default_factory=dict)
    # Polled before every case; True ends the campaign as if its budget ran out (fuzz: SIGTERM/SIGINT).
    should_stop: Callable[[], bool] | None = None
    # Called on the first case of each new signature before it is saved (fuzz --minimize): returns the
    # smaller case, its result (same signature) and extra JSON fields for the reproducer file.
    minimizer: Callable[[Case, Result], tuple[Case, Result, dict[str, Any]]] | None = None
    # Batching, case mix and scale tier (harness/engine/feed.py); "auto" picks per platform.
    engine: EngineOptions = field(default_factory=EngineOptions)
    # A dry run (harness/campaign/dry_run.py): the executor predicts instead of running, nothing is compiled,
    # and the campaign's clock is the executor's modelled one.
    dry_run: bool = False
    clock: Callable[[], float] = time.perf_counter


MAX_VARIANTS_SAVED = 16  # reproducers kept per bug in one campaign: one per fine-grained variant, at most this
FIRST_BATCH_CASES = 64  # the first batch of a pool campaign (batches ahead): one member's round trip


@dataclass
class FailureClass:
    signature: str
    backend: str
    outcome: str
    count: int
    first_case_id: str
    first_index: int
    summary: str
    file: str
    known: str = ""  # the known-failure reproducer with this signature ("" = a new failure)
    variants: list[str] = field(default_factory=list)  # fine-grained keys met (identity.variant), in order
    # "" or, for a worker's crash or hang that did not come back when its case ran again in a fresh worker
    # (Result.flaky), that run's outcome. Listed and saved, never new: the gate's confirm phase calls it flaky.
    flaky: str = ""


@dataclass
class CampaignReport:
    seed: int
    shard: tuple[int, int]
    backends: list[str]
    platform: str
    cases: int = 0
    seconds: float = 0.0
    first_index: int = 0
    next_index: int = 0  # resume here
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> outcome -> count
    paths: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> path taken -> count
    failures: list[FailureClass] = field(default_factory=list)  # one per unique signature
    case_ids: list[str] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)  # what each backend really executed
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. compile seconds from backends
    stopped_early: bool = False  # should_stop ended it (a signal), not the budget
    # Faults of the machine, not findings: the campaign stops cleanly and the CLI exits 3 with the reason.
    storage_error: str = ""  # the corpus could not be written (full or read-only disk)
    environment_error: str = ""  # e.g. the worker process could not be (re)started
    # Reproducers the corpus could not take: kept here, so the report (or the terminal) still holds them.
    unsaved_reproducers: list[dict[str, Any]] = field(default_factory=list)
    menu_growth: dict[str, list[int]] = field(default_factory=dict)  # backend -> rows its menu grew by
    # throughput over time: {"t": seconds, "cases": n, "failures": n} samples (html report's chart)
    timeline: list[dict[str, float]] = field(default_factory=list)

    @property
    def failure_count(self) -> int:
        return sum(f.count for f in self.failures)

    @property
    def new_failures(self) -> list[FailureClass]:
        return [f for f in self.failures if not f.known and not f.flaky]

    @property
    def flaky_failures(self) -> list[FailureClass]:
        return [f for f in self.failures if f.flaky]

    @property
    def cases_per_second(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "shard": list(self.shard),
            "backends": self.backends,
            "platform": self.platform,
            "cases": self.cases,
            "seconds": round(self.seconds, 3),
            "cases_per_second": round(self.cases_per_second, 1),
            "stopped_early": self.stopped_early,
            "menu_growth": self.menu_growth,
            "first_index": self.first_index,
            "next_index": self.next_index,
            "outcomes": self.outcomes,
            "paths": self.paths,
            "failures_total": self.failure_count,
            "new_failure_signatures": [f.signature for f in self.new_failures],
            "flaky_failure_signatures": [f.signature for f in self.flaky_failures],
            "unique_failures": [f.__dict__ for f in self.failures],
            "case_ids": self.case_ids,
            "coverage": self.coverage.to_dict(),
            "coverage_ranges": self.coverage.ranges_dict(),
            "coverage_values": self.coverage.values_dict(),
            "coverage_summary": self.coverage.summary_dict(),
            "coverage_gaps": {b: gaps for b in self.backends if (gaps := self.coverage.gaps(b))},
            "coverage_exemptions": {b: dict(e) for b, e in sorted(self.coverage.exemptions.items())},
            **({"storage_error": self.storage_error} if self.storage_error else {}),
            **({"environment_error": self.environment_error} if self.environment_error else {}),
            **({"unsaved_reproducers": self.unsaved_reproducers} if self.unsaved_reproducers else {}),
            **({"timeline": self.timeline} if self.timeline else {}),
            **self.extra,
        }


class Timeline:
    """Samples (seconds, cases, failures) about every `every` seconds; past `limit` samples every other one is
    dropped and the interval doubles, so an hours-long campaign keeps a bounded, evenly spread list."""

    def __init__(self, started: float, every: float = 1.0, limit: int = 240,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.started, self.every, self.limit, self.clock = started, every, limit, clock
        self.samples: list[dict[str, float]] = []
        self.next_at = started + every

    def __call__(self, cases: int, failures: int, force: bool = False) -> None:
        now = self.clock()
        if not force and now < self.next_at:
            return
        self.samples.append({"t": round(now - self.started, 3), "cases": cases, "failures": failures})
        if len(self.samples) > self.limit:
            self.samples = self.samples[1::2]
            self.every *= 2
        self.next_at = now + self.every


class MenuGrowth:
    """Starts each backend's next growth stage compiling (Backend.prefetch) one stage before cases can draw
    it, and records the rows each backend's menu has grown by."""

    def __init__(self, backends: list[Backend], base_space: CaseSpace, platform: Platform, seed: int | None = None,
                 prefetch: bool = True) -> None:
        self.platform = platform
        self.prefetch = prefetch  # False: record the growth only (a dry run compiles nothing; a JIT builder
        # process, pipeline/prebuild.py, builds every stage itself)
        self.spaces = {b.name: backend_space(b, base_space, platform, seed) for b in backends}
        self.prefetched = {b.name: 0 for b in backends}  # highest stage handed to prefetch
        self.grown: dict[str, list[int]] = {b.name: [] for b in backends}
        self.stage_seen: dict[str, int] = {}

    def before(self, backend: Backend, index: int) -> None:
        space = self.spaces[backend.name]
        if not space.row_bytes_growth:
            return
        stage = space.growth_stage(index)
        if self.stage_seen.get(backend.name) == stage:  # once per stage, not per case
            return
        self.stage_seen[backend.name] = stage
        self.grown[backend.name] = [r for s in range(1, stage + 1) for r in space.rows_of_stage(s)]
        while self.prefetched[backend.name] < min(stage + 1, len(space.row_bytes_growth)):
            self.prefetched[backend.name] += 1
            rows = space.rows_of_stage(self.prefetched[backend.name])
            if rows and self.prefetch:
                backend.prefetch(space.narrowed(row_bytes=rows, row_bytes_growth=(), grow_every=0), self.platform)


def run_campaign(config: CampaignConfig, backends: list[Backend], platform: Platform, executor: Executor,
                 on_result: Callable[[Case, Result, CampaignReport], None] | None = None,
                 record_case_ids: bool = False) -> CampaignReport:
    """Run the campaign in batches from a CaseFeed (harness/engine/feed.py), the scale tier interleaved: submit
    batches (up to the executor's queue ahead), record each as it finishes, until the budget is spent."""
    run = _CampaignRun(config, backends, platform, executor, on_result, record_case_ids)
    try:
        while True:
            if run.submit_next():
                continue  # submit the next batch before recording this one
            if run.scheduler.idle:
                break
            run.record(run.scheduler.take_finished())
        run.ended = run.clock()  # the campaign's time ends with its last result, not with the feed's teardown
    finally:
        run.feed.close()
    return run.finish()


class _CampaignRun:
    """The state of one campaign between its batches: what was submitted, what is in flight, what was recorded."""

    def __init__(self, config: CampaignConfig, backends: list[Backend], platform: Platform, executor: Executor,
                 on_result: Callable[[Case, Result, CampaignReport], None] | None, record_case_ids: bool) -> None:
        self.config, self.platform, self.executor = config, platform, executor
        self.on_result, self.record_case_ids = on_result, record_case_ids
        k, self.shards = config.shard
        self.report = report = CampaignReport(config.seed, config.shard, [b.name for b in backends], platform.kind)
        for backend in backends:
            report.coverage.exempt(backend.name, dict(backend.coverage_exemptions))
        self.outcome_counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.path_counts: dict[str, Counter[str]] = defaultdict(Counter)
        # Live views for on_result hooks (Counters are dicts); replaced by plain dicts at the end.
        report.outcomes, report.paths = self.outcome_counts, self.path_counts  # type: ignore[assignment]
        self.classes: dict[str, FailureClass] = {}
        self.clock = config.clock  # the campaign's time: the wall, or a dry run's modelled seconds
        self.started = self.clock()
        index = config.start_index
        while index % self.shards != k:
            index += 1
        report.first_index = index
        # A dry run compiles nothing; a campaign whose executor runs a JIT builder has every growth stage built
        # there (a prefetch here would only import sglang into this process).
        self.growth = MenuGrowth(backends, config.space, platform, config.seed,
                                 prefetch=not config.dry_run and executor.prebuild is None)
        settings = config.engine.resolve(platform, backends, executor)  # the options, resolved once
        crash_suspects = frozenset(known_crashes(known_files(config.known_signatures)))
        self.feed, self.feed_kind = _make_feed(config, settings, index, backends, self.growth, platform,
                                               crash_suspects)
        self.early: deque[Slot] = deque()  # slots taken from the feed before the first worker was ready
        if self.feed_kind == "process":
            if executor.prebuild is not None:
                # The JIT builder builds what the first batch loads before anything else: after a kernel change
                # the first result waits for those builds, a handful of modules (more batches would name many).
                # The first batches are generated while the worker starts.
                early = FIRST_BATCH_CASES + self.feed.batch
                self.early.extend(_take_full(self.feed, early if config.max_cases is None
                                             else min(early, config.max_cases)))
                executor.prebuild.prioritize(rows_by_backend(list(self.early)[:FIRST_BATCH_CASES]))
            executor.start()  # wait for the first worker while the feed process starts, not after it
        elif executor.prebuild is not None:
            executor.prebuild.prioritize({})  # no first batches named: the builder need not wait for them
        if self.feed.variants:  # variants run on the storages of the case before them
            executor.enable_storage_reuse()
        self.scale = None if settings.scale is None else ScaleTier(
            config.seed, backends, self.growth.spaces, platform, settings.scale, settings.scale_share,
            self.feed.profiles, shard=config.shard)
        self.stats = EngineStats(self.feed.mix)
        self.resume = (index, 0)  # (index, backend position) of the first slot not processed
        self.timeline = Timeline(self.started, clock=self.clock)
        self.failures_seen = 0
        # Batches queued ahead (engine/scheduler.py): not with a minimizer, which runs cases on the same executor
        # while it records; not for an executor that runs a batch as it is submitted (it would only run the next
        # batch before recording this one).
        ahead = settings.batches_ahead if config.minimizer is None and executor.queues_batches else 0
        self.scheduler = BatchScheduler(executor, ahead, crash_suspects)
        self.done = False  # nothing more is submitted
        self.halt = False  # nothing more is recorded either (a stop at a failure, a corpus that cannot be written)
        self.ended: float | None = None  # the clock at the last result

    def submit_next(self) -> bool:
        """Submit the next batch if the budget and the queue allow; True when another may be submitted before
        anything is recorded."""
        scheduler = self.scheduler
        if self.done or not scheduler.has_room:
            return False
        stop = _budget_spent(self.config, self.report, scheduler.submitted, self.started)
        if stop == "signal":
            self.report.stopped_early = True
        if stop:
            self.done = True
            return False
        config, feed = self.config, self.feed
        limit = feed.batch if config.max_cases is None else min(feed.batch, config.max_cases - scheduler.submitted)
        if scheduler.submitted == 0 and scheduler.ahead > 0:
            # With batches queued ahead, the first batch decides only when the first result is recorded: a short
            # one lets the campaign report (and checkpoint) while the pool's other members are still starting and
            # only the first runs cases (a full batch on one member takes seconds).
            limit = min(limit, FIRST_BATCH_CASES)
        scale_slot: Slot | None = None
        if self.scale is not None and self.report.cases and not scheduler.scale_case_running_aside and self.scale.due(
                self.clock() - self.started):
            picked = self.scale.next_case(feed.clock)
            if picked is None:
                self.scale = None  # no backend has an accepted case of any shape: the tier ends
                return True
            scale_slot = Slot(picked[0], self.resume[0], picked[1], False, picked[2])
            limit -= 1
            if scheduler.scale_aside:
                scheduler.submit_aside(scale_slot)
                scale_slot = None
        early = [self.early.popleft() for _ in range(min(limit, len(self.early)))]
        return self._submit_batch(early + _take_full(feed, limit - len(early)), scale_slot)

    def _submit_batch(self, slots: list[Slot], scale_slot: Slot | None) -> bool:
        if not slots and scale_slot is None:
            self.done = True
            return False
        ran = time.perf_counter()  # an executor without a queue runs the batch here
        room = self.scheduler.submit(slots, scale_slot)
        self.stats.execute_seconds += time.perf_counter() - ran
        return room

    def record(self, batch: Submitted) -> None:
        """Record a batch's results in slot order; a stop ends the campaign at this batch."""
        waited = time.perf_counter()
        results_in_order, order, stop_after_batch = self._results_of(batch)
        self.stats.execute_seconds += time.perf_counter() - waited
        slots, scale_slot = batch.slots, batch.scale_slot
        results: list[Result] = [Result("", "", Outcome.PASS)] * len(slots)
        for position, result in zip(order, results_in_order, strict=True):
            results[position] = result
        if scale_slot is not None and self.scale is not None and 0 in order:
            self.scale.seconds += results[0].seconds  # the scale case's own time (the batch's ran beside it)
            self.stats.scale_cases += 1
            self.stats.scale_shapes[scale_slot.case.note] = self.stats.scale_shapes.get(scale_slot.case.note, 0) + 1
            self.stats.scale_runs.append((self.clock() - self.started, results[0].seconds, scale_slot.case.note))
        recorded = time.perf_counter()
        executed = set(order)
        for position, (slot, result) in enumerate(zip(slots, results, strict=True)):
            if position not in executed:  # never ran (no worker could start): not counted, resumed later
                continue
            self._record_result(slot, result)
            if self.halt:
                break
        self.stats.record_seconds += time.perf_counter() - recorded
        # The budget running out still records the batch in flight (it ran within the campaign); a stop at a
        # failure, a corpus that cannot be written or a pool that cannot start a worker ends at this batch, as
        # without a batch ahead: the one behind it is waited for (the workers finish it) and not counted.
        if self.halt or stop_after_batch:
            self.done = True
            self.scheduler.abandon()

    def _results_of(self, batch: Submitted) -> tuple[list[Result], list[int], bool]:
        """The batch's results in execution order, that order, and whether the campaign stops after it."""
        slots, order = batch.slots, batch.order
        try:
            return batch.handle.result(), order, False
        except WorkerError as exc:  # the machine failed us (no worker can start): stop, keep the report
            first = slots[order[len(exc.partial_results)]] if len(exc.partial_results) < len(slots) else None
            self.report.environment_error = (f"case {first.case.case_id} at index {first.index}: {exc}" if first
                                             else str(exc))
            # Results the batch produced before the failed start (a crash among them) are still recorded.
            return exc.partial_results, order[: len(exc.partial_results)], True
        except OSError as exc:  # the executor's own files (the worker journal) could not be written
            first = slots[0] if slots else None
            self.report.storage_error = (f"case {first.case.case_id} at index {first.index} not run: "
                                         f"{_os_reason(exc)}" if first else _os_reason(exc))
            self.halt = True
            return [], [], False
        except Exception:
            # A harness bug: keep the cases that exposed it before the exception ends the campaign.
            for slot in slots:
                _keep_harness_error_case(self.config, slot.case)
            raise

    def _record_result(self, slot: Slot, result: Result) -> None:
        config, report = self.config, self.report
        backend, case = slot.backend, slot.case
        explain_crash(result, backend, case, self.platform)
        report.cases += 1
        if self.record_case_ids:
            report.case_ids.append(case.case_id)
        self.outcome_counts[backend.name][result.outcome.value] += 1
        report.coverage.add(case, result, backend.coverage_labels(case))
        self.stats.add(case, result, slot.scale_number is not None, generated=slot.variant == 0, index=slot.index)
        if result.path:
            self.path_counts[backend.name][result.path] += 1
        if slot.scale_number is None:
            self.resume = (slot.index + self.shards, 0) if slot.last_of_index else (slot.index, 0)
        if result.outcome.is_failure:
            self.failures_seen += 1
            new = _record_failure(config, self.classes, case, result, slot.index, report)
            if config.stop_on_first_failure or (new and config.stop_on_new_failure) or report.storage_error:
                self.halt = True  # a corpus that cannot take failures ends the campaign; what was found is kept
        self.timeline(report.cases, self.failures_seen)
        if self.on_result is not None:  # the hook sees an up-to-date report (progress line, checkpoints)
            report.seconds = self.clock() - self.started
            report.failures = list(self.classes.values())
            report.timeline = self.timeline.samples
            report.next_index = self.resume[0]
            self.on_result(case, result, report)

    def finish(self) -> CampaignReport:
        report, feed = self.report, self.feed
        report.next_index = self.resume[0]
        self.timeline(report.cases, self.failures_seen, force=True)
        report.timeline = self.timeline.samples
        report.menu_growth = {name: rows for name, rows in self.growth.grown.items() if rows}
        report.seconds = (self.clock() if self.ended is None else self.ended) - self.started
        report.outcomes = {b: dict(c) for b, c in self.outcome_counts.items()}
        report.paths = {b: dict(c) for b, c in self.path_counts.items()}
        report.failures = list(self.classes.values())
        report.extra.update(self.stats.to_dict(report.seconds, feed, self.scale, self.executor,
                                              self.scheduler.ahead, cpu_only=self.platform.kind == "cpu"))
        feed_kind = self.feed_kind
        if isinstance(feed, ProcessFeed):  # how much the campaign generated itself while the children started
            children = "" if feed.processes == 1 else f"{feed.processes} feed processes; "
            feed_kind = f"process ({children}the first {feed.local_slots} cases generated in the campaign process)"
        report.extra["engine"]["feed"] = feed_kind
        return report


def _make_feed(config: CampaignConfig, settings: EngineSettings, index: int, backends: list[Backend],
               growth: MenuGrowth, platform: Platform,
               known_crashes: frozenset[KnownCrash]) -> tuple[CaseFeed | ProcessFeed, str]:
    """The campaign's feed and what it is ("thread", "process", or why the process feed could not start)."""
    args = (config.seed, index, config.shard, backends, growth.spaces, platform, settings.mix, settings.batch,
            growth.before, settings.variants, settings.every)
    if settings.feed == "process":
        try:
            return ProcessFeed(*args, processes=settings.feed_processes, crash_suspects=known_crashes), "process"
        except Exception as exc:  # e.g. a plugin backend that cannot be sent to another process: same slots here
            return (CaseFeed(*args, crash_suspects=known_crashes),
                    f"thread (the feed process did not start: {type(exc).__name__}: {exc})"[:300])
    return CaseFeed(*args, crash_suspects=known_crashes), "thread"


def _take_full(feed: CaseFeed | ProcessFeed, limit: int) -> list[Slot]:
    """`limit` slots, or fewer only where the feed has no more. A feed's take stops at the end of the batch it
    generated (a generated case comes with all its variants, so its batches overrun the campaign's by a few
    slots): taken once, every other campaign batch was the few slots left over. Those short batches halved
    the batches really queued ahead of the pool, and a one-slot batch once went to the first worker only."""
    slots: list[Slot] = []
    while len(slots) < limit:
        more = feed.take(limit - len(slots))
        if not more:
            break
        slots += more
    return slots


def _budget_spent(config: CampaignConfig, report: CampaignReport, submitted: int, started: float) -> str:
    """Why no further batch is submitted ("cases", "time", "signal"), or "" while the budget lasts."""
    if config.max_cases is not None and submitted >= config.max_cases:
        return "cases"
    if config.max_seconds is not None and config.clock() - started >= config.max_seconds:
        return "time"
    if config.should_stop is not None and config.should_stop():
        return "signal"
    return ""


def _record_failure(config: CampaignConfig, classes: dict[str, FailureClass], case: Case, result: Result,
                    index: int, report: CampaignReport) -> bool:
    """Count `result` under its bug identity (and save a reproducer per new variant); True if no known entry
    accounts for it."""
    identity = identify(result, case)
    sig = identity.bug
    known = match_known(config.known_signatures, sig, result.backend, case, result.outcome)
    if known:  # already in a corpus as an expected failure: count it, keep no second copy
        key = f"{sig}|known"  # apart from a new class of the same identity (a case outside the trigger)
        if key in classes:
            classes[key].count += 1
        else:
            classes[key] = FailureClass(sig, result.backend, result.outcome.value, 1, case.case_id, index,
                                        _summary(result), known, known, [identity.variant])
        return False
    if result.flaky:  # saved (nothing found is lost), counted apart, never new
        key = f"{sig}|flaky"
        if key in classes:
            classes[key].count += 1
            return False
        classes[key] = FailureClass(sig, result.backend, result.outcome.value, 1, case.case_id, index,
                                    _summary(result), "", variants=[identity.variant],
                                    flaky=str(result.diff[FRESH_WORKER_KEY]))
        if config.corpus_dir is not None:
            classes[key].file = _save(config.corpus_dir, case, result, {}, report)
        return False
    if sig in classes:
        failure = classes[sig]
        failure.count += 1
        if identity.variant not in failure.variants and len(failure.variants) < MAX_VARIANTS_SAVED:
            failure.variants.append(identity.variant)  # one example per variant of the bug, not thousands
            if config.corpus_dir is not None:
                _save(config.corpus_dir, case, result, {}, report)
        return True
    extra: dict[str, Any] = {}
    if config.minimizer is not None:
        case, result, extra = config.minimizer(case, result)
    # Counted before the write: a full disk must not make the failure vanish from the report.
    failure = FailureClass(sig, result.backend, result.outcome.value, 1, case.case_id, index, _summary(result), "",
                           variants=[identity.variant])
    classes[sig] = failure
    if config.corpus_dir is not None:
        failure.file = _save(config.corpus_dir, case, result, extra, report)
    return True


def _save(corpus_dir: Path, case: Case, result: Result, extra: dict[str, Any], report: CampaignReport) -> str:
    """Write the reproducer; if the corpus cannot take it (full, read-only, not a folder), keep it in the report
    instead, note why, and return "" (the campaign then stops)."""
    try:
        return str(save_reproducer(corpus_dir, case, result, extra))
    except (OSError, InputError) as exc:
        report.storage_error = report.storage_error or f"cannot write to the corpus {corpus_dir}: {_os_reason(exc)}"
        report.unsaved_reproducers.append({**reproducer_dict(case, result), **extra})
        return ""


def _os_reason(exc: Exception) -> str:
    return f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)


def _keep_harness_error_case(config: CampaignConfig, case: Case) -> None:
    """Save the case that exposed a harness bug; if even that write fails, print it (the bug's traceback
    follows either way)."""
    if config.corpus_dir is None:
        return
    try:
        write_json_atomic(config.corpus_dir / "harness-error" / f"{case.case_id}.json", case.to_dict())
    except OSError as exc:
        print(f"hicache-fuzz: could not save the case of a harness error ({_os_reason(exc)}); the case:\n"
              f"{case.to_json()}", file=sys.stderr)


def _summary(result: Result) -> str:
    return result.summary.splitlines()[0][:300] if result.summary else result.error[:300]




