"""The worker pool (pipeline/pool.py): several workers behind one campaign, results in case order, a crash
costing its group only, geometry groups kept on one worker, and the campaign report's counters."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import FIRST_BATCH_CASES, CampaignConfig, run_campaign
from hicache_fuzz.harness.commands.common import spare_worker_count, worker_process_count
from hicache_fuzz.harness.engine.feed import EngineOptions
from hicache_fuzz.harness.engine.variants import index_variant
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.harness.pipeline.pool import WorkerPool, auto_pool_size, geometry_groups
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
from hicache_fuzz.kernels.registry import load_registry
from tests.pipeline.test_worker import PLUGIN, case, env


def test_groups_are_runs_of_one_geometry_cut_at_the_limit() -> None:
    a = case("reference", 1)
    b = a.replace(layers=3)
    cases = [a, index_variant(a, 1), index_variant(a, 2), b, index_variant(b, 1), a]
    assert geometry_groups(cases) == [range(0, 3), range(3, 5), range(5, 6)]
    assert geometry_groups(cases, limit=2) == [range(0, 2), range(2, 3), range(3, 5), range(5, 6)]
    assert geometry_groups([]) == []


def test_a_pool_returns_the_results_of_one_worker_in_case_order(tmp_path: Path) -> None:
    cases = [case("reference", seed).replace(layers=1 + seed % 3) for seed in range(12)]
    with WorkerPool(3, ["reference"], tmp_path) as pool:
        results = pool.run_batch(cases)
        used = [m.started for m in pool.members]
    assert [r.case_id for r in results] == [c.case_id for c in cases]
    assert all(r.outcome is Outcome.PASS for r in results)
    assert sum(used) >= 2  # the batch was shared out
    assert not list((tmp_path / "inflight").iterdir())


def test_a_crash_in_a_pool_costs_its_group_and_is_named(tmp_path: Path) -> None:
    # test-abort kills its worker on odd seeds; each case is its own geometry group here.
    cases = [case("test-abort", seed).replace(layers=1 + seed) for seed in range(4)]
    with WorkerPool(2, ["test-abort"], tmp_path, plugins=[PLUGIN], env=env()) as pool:
        results = pool.run_batch(cases)
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS, Outcome.CRASH]
    crashed = {p.stem for p in tmp_path.rglob("crashes/*.json")}
    assert crashed == {cases[1].case_id, cases[3].case_id}


def test_a_campaign_runs_through_a_pool_with_variants(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    config = CampaignConfig([b.name for b in backends], seed=13, max_cases=120,
                            engine=EngineOptions(mix="none", scale="off", variants=7))
    with WorkerPool(2, [b.name for b in backends], tmp_path) as pool:
        report = run_campaign(config, backends, machine.platform, pool)
    data = report.to_dict()
    assert data["cases"] == 120
    assert data["engine"]["worker_processes"] == 2 and data["engine"]["batch"] == 128
    assert data["engine"]["storages_reused"] > 40
    assert data["failures_total"] > 0  # the zoo bug is found through the pool too


def test_pool_size_options() -> None:
    assert auto_pool_size(16) == 6 and auto_pool_size(10) == 3 and auto_pool_size(2) == 1
    assert ExecutionOptions().resolved_worker_processes("cpu") == 1
    assert ExecutionOptions(worker_processes=3).resolved_worker_processes("cuda") == 3
    assert worker_process_count("auto") is None and worker_process_count("4") == 4
    for bad in ("0", "-2", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_process_count(bad)


def test_spare_worker_options_reach_the_executor(tmp_path: Path) -> None:
    """--spare-workers N|auto: auto keeps the platform's default; a number, 0 included, is what the executor
    gets (a campaign's single worker or each pool member, at most one per member)."""
    from hicache_fuzz.harness.pipeline.setup import executor_for
    from hicache_fuzz.harness.pipeline.worker import WorkerExecutor

    assert spare_worker_count("auto") is None and spare_worker_count("0") == 0 and spare_worker_count("3") == 3
    for bad in ("-1", "some", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            spare_worker_count(bad)
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference")]
    for asked, expected in ((None, 0), (0, 0), (2, 2)):
        options = ExecutionOptions(platform="cpu", isolate="yes", worker_processes=1, spare_workers=asked)
        executor = executor_for(backends, registry, machine, options, tmp_path / f"one-{asked}")
        try:
            assert isinstance(executor, WorkerExecutor) and executor.spares == expected
        finally:
            executor.close()
    pool = executor_for(backends, registry, machine, ExecutionOptions(platform="cpu", isolate="yes",
                                                                      worker_processes=2, spare_workers=2),
                        tmp_path / "pool")
    try:
        assert isinstance(pool, WorkerPool) and [member.spares for member in pool.members] == [1, 1]
    finally:
        pool.close()


def test_a_pool_starts_with_one_worker_and_ramps_up(tmp_path: Path) -> None:
    """Cases begin once the first worker is up; the others join later batches as they become ready."""
    import time

    cases = [case("reference", seed).replace(layers=1 + seed % 4) for seed in range(8)]
    with WorkerPool(3, ["reference"], tmp_path) as pool:
        pool.start()
        assert pool.members[0].started == 1  # waited for
        deadline = time.monotonic() + 120
        while len(pool._ready_members()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(pool._ready_members()) == 3 and not pool.unavailable
        assert all(r.outcome is Outcome.PASS for r in pool.run_batch(cases))
    early = WorkerPool(2, ["reference"], tmp_path / "closed-early")
    early.start()
    early.close()  # closing while the second member may still be starting leaves nothing running
    assert all(m._proc is None and m._early is None for m in early.members)


class _RecordingMember:
    """Stands in for a WorkerExecutor: records the groups it is given, passes every case."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seen: list[str] = []
        self.seconds = seconds

    def run_batch(self, cases: list[Case]) -> list[Result]:
        self.seen.append(cases[0].backend)
        return [Result(c.case_id, c.backend, Outcome.PASS, seconds=self.seconds[c.backend]) for c in cases]


def test_a_batch_runs_its_slowest_groups_first(tmp_path: Path) -> None:
    """The batch ends with its last group: groups of the backend measured slowest go first."""
    pool = WorkerPool(2, ["reference"], tmp_path)
    member = _RecordingMember({"slow": 0.02, "fast": 0.001})
    pool.members = [member]  # type: ignore[list-item]
    pool._starting = [object()]  # type: ignore[list-item]  # started: no worker processes in this test
    cases = [case("fast", 1).replace(layers=1 + i) for i in range(3)] + [case("slow", 1).replace(layers=9)]
    pool.run_batch(cases)  # nothing known yet: case order, last group first
    member.seen.clear()
    results = pool.run_batch(cases)
    assert member.seen[0] == "slow"
    assert [r.case_id for r in results] == [c.case_id for c in cases]
    pool.stop_serving()


class _SlowFirstMember(_RecordingMember):
    """A stand-in member whose cases of backend "scale" take a while; records when each case started."""

    def __init__(self, name: str, log: list[tuple[str, str, float]]) -> None:
        super().__init__({"scale": 0.0, "fast": 0.0})
        self.name, self.log = name, log

    def run_batch(self, cases: list[Case]) -> list[Result]:
        import time

        for c in cases:
            self.log.append((self.name, c.backend, time.monotonic()))
            if c.backend == "scale":
                time.sleep(0.3)
        return super().run_batch(cases)


def test_a_scale_case_runs_on_the_first_worker_while_the_others_take_the_batch(tmp_path: Path) -> None:
    """run_batch(cases, lone_first=1): the scale tier's case runs alone on the first member (the one that keeps
    the tier's arenas); the second member works through the batch meanwhile instead of waiting for it."""
    pool = WorkerPool(2, ["reference"], tmp_path)
    log: list[tuple[str, str, float]] = []
    first, second = _SlowFirstMember("first", log), _SlowFirstMember("second", log)
    pool.members = [first, second]  # type: ignore[list-item]
    pool._starting = [_Done()]  # type: ignore[list-item]  # both "started": no worker processes in this test
    cases = [case("scale", 1).replace(layers=7)] + [case("fast", 1).replace(layers=1 + i) for i in range(4)]
    results = pool.run_batch(cases, lone_first=1)
    pool.stop_serving()
    assert [r.case_id for r in results] == [c.case_id for c in cases]
    assert first.seen[0] == "scale" and "scale" not in second.seen
    scale_started = next(t for name, backend, t in log if backend == "scale")
    during = [t for name, backend, t in log if name == "second" and scale_started <= t < scale_started + 0.3]
    assert during, "the second worker took groups while the scale case ran"


def test_a_one_case_batch_behind_a_scale_case_goes_to_a_free_member(tmp_path: Path) -> None:
    """Only the scale tier's cases are the first member's: a batch of one ordinary case, queued while that member
    runs a scale case, is taken by the other member at once. (It once counted as lone: it waited for the scale
    case, and the campaign, which records in order, stalled behind it for seconds.)"""
    import time

    pool = WorkerPool(2, ["reference"], tmp_path)
    log: list[tuple[str, str, float]] = []
    first, second = _SlowFirstMember("first", log), _SlowFirstMember("second", log)
    pool.members = [first, second]  # type: ignore[list-item]
    pool._starting = [_Done()]  # type: ignore[list-item]
    scale = pool.submit_batch([case("scale", 1).replace(layers=7)], lone_first=1)
    time.sleep(0.05)  # the first member has taken the scale case
    single = pool.submit_batch([case("fast", 1).replace(layers=1)])
    waited = time.monotonic()
    results = single.result()
    took = time.monotonic() - waited
    scale.result()
    pool.stop_serving()
    assert results[0].outcome is Outcome.PASS
    assert "fast" in second.seen and "fast" not in first.seen
    assert took < 0.2, f"the one-case batch waited {took:.2f} s for the scale case"


class _Done:
    """A finished start-up future (WorkerPool._ready_members reads .done() and .exception())."""

    def done(self) -> bool:
        return True

    def exception(self) -> None:
        return None


def test_a_campaign_with_the_scale_tier_runs_through_a_pool(tmp_path: Path) -> None:
    """Scale cases lead their batch (lone_first); every case is recorded once, in order, and the tier is
    counted."""
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("reference")
    config = CampaignConfig(["reference"], seed=2, max_cases=300,
                            engine=EngineOptions(batch=16, mix="auto", scale="simulated", scale_share=0.5))
    with WorkerPool(2, ["reference"], tmp_path) as pool:
        report = run_campaign(config, [backend], machine.platform, pool, record_case_ids=True)
    data = report.to_dict()
    assert report.cases == 300 and len(report.case_ids) == 300 and not report.failures
    assert data["scale"]["scale_cases"] >= 2


def test_a_pool_takes_the_next_batch_while_the_caller_records_this_one(tmp_path: Path) -> None:
    """submit_batch queues and returns: a member that is done with batch 1 takes batch 2's groups while batch 1's
    slow group still runs on the other member (no member waits at the batch boundary)."""
    pool = WorkerPool(2, ["reference"], tmp_path)
    log: list[tuple[str, str, float]] = []
    first, second = _SlowFirstMember("first", log), _SlowFirstMember("second", log)
    pool.members = [first, second]  # type: ignore[list-item]
    pool._starting = [_Done()]  # type: ignore[list-item]
    batch1 = [case("scale", 1).replace(layers=7), case("fast", 1).replace(layers=1)]
    batch2 = [case("fast", 2).replace(layers=2 + i) for i in range(3)]
    import time

    submitted = time.monotonic()
    pending1, pending2 = pool.submit_batch(batch1), pool.submit_batch(batch2)
    assert time.monotonic() - submitted < 0.25  # queued, not run, before returning
    results1, results2 = pending1.result(), pending2.result()
    pool.stop_serving()
    assert [r.case_id for r in results1] == [c.case_id for c in batch1]
    assert [r.case_id for r in results2] == [c.case_id for c in batch2]
    slow_started = next(t for _, backend, t in log if backend == "scale")
    # batch 1's fast case and batch 2's cases ran while batch 1's slow case did (on the other member)
    during = [t for _, backend, t in log if backend == "fast" and slow_started <= t < slow_started + 0.3]
    assert len(during) >= 2


class _BrokenMember(_RecordingMember):
    def run_batch(self, cases: list[Case]) -> list[Result]:
        from hicache_fuzz.harness.pipeline.worker import WorkerError

        raise WorkerError("worker did not start: no GPU left", partial_results=[])


def test_a_pool_that_cannot_start_a_worker_fails_the_batch_behind_too(tmp_path: Path) -> None:
    from hicache_fuzz.harness.pipeline.worker import WorkerError

    pool = WorkerPool(1, ["reference"], tmp_path)
    pool.members = [_BrokenMember({})]  # type: ignore[list-item]
    pool._starting = [object()]  # type: ignore[list-item]
    pending1 = pool.submit_batch([case("fast", 1).replace(layers=1 + i) for i in range(2)])
    pending2 = pool.submit_batch([case("fast", 2).replace(layers=4)])
    for pending in (pending1, pending2):
        with pytest.raises(WorkerError, match="no GPU left") as raised:
            pending.result()
        assert raised.value.partial_results == []
    with pytest.raises(WorkerError, match="no GPU left"):
        pool.submit_batch([case("fast", 3)]).result()  # refused at once, not queued for nobody
    pool.stop_serving()


def test_a_pool_campaign_that_stops_at_its_first_failure_ends_there(tmp_path: Path) -> None:
    """With a batch in flight ahead, a stop at the first failure still ends the report at that case."""
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("zoo-last-page-dropped")
    config = CampaignConfig([backend.name], seed=4, max_cases=400, stop_on_first_failure=True,
                            engine=EngineOptions(batch=8, mix="none", scale="off"))
    with WorkerPool(2, [backend.name], tmp_path) as pool:
        report = run_campaign(config, [backend], machine.platform, pool, record_case_ids=True)
    assert len(report.failures) == 1
    assert report.case_ids[-1] == report.failures[0].first_case_id
    assert report.cases == len(report.case_ids) < 400


def test_a_running_pool_shortens_the_thread_switch_interval_and_restores_it(tmp_path: Path) -> None:
    import sys

    from hicache_fuzz.harness.pipeline.pool import POOL_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    with WorkerPool(2, ["reference"], tmp_path) as pool:
        pool.run_batch([case("reference", seed).replace(layers=1 + seed) for seed in range(3)])
        assert sys.getswitchinterval() == pytest.approx(min(before, POOL_SWITCH_INTERVAL_S))
    assert sys.getswitchinterval() == pytest.approx(before)


class _QueueingExecutor(Executor):
    """A stand-in pool: batches finish at once, except a lone (scale) case, which finishes only after three more
    batches were submitted behind it (as a slow scale case on the first member would)."""

    runs_lone_cases_aside = True
    queues_batches = True
    runs_batches = True
    size = 2

    def __init__(self) -> None:
        self.submitted = 0
        self.lone_at: list[int] = []
        self.stalls = 0  # result() asked of a batch whose slow case had not finished: the caller would wait
        self.sizes: list[int] = []  # cases per submitted batch

    def run(self, case: Case) -> Result:
        return Result(case.case_id, case.backend, Outcome.PASS)

    def run_batch(self, cases: list[Case], lone_first: int = 0) -> list[Result]:
        return [self.run(c) for c in cases]

    def submit_batch(self, cases: list[Case], lone_first: int = 0) -> object:
        self.submitted += 1
        self.sizes.append(len(cases))
        results = self.run_batch(cases)
        executor, since = self, self.submitted

        class Handle:
            def done(self) -> bool:
                return not lone_first or executor.submitted >= since + 3

            def result(self) -> list[Result]:
                executor.stalls += not self.done()
                return results

        if lone_first:
            self.lone_at.append(since)
        return Handle()

    def close(self) -> None:
        pass


def test_a_scale_case_runs_beside_the_queue_and_is_recorded_when_it_is_done() -> None:
    """With a pool and batches ahead, a scale case is submitted on its own: the batches submitted behind it are
    recorded before it is (nothing waits for it); every case is still counted once."""
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("reference")
    config = CampaignConfig(["reference"], seed=2, max_cases=400,
                            engine=EngineOptions(batch=16, mix="auto", scale="simulated", scale_share=0.9,
                                                 feed="thread"))
    executor = _QueueingExecutor()
    recorded: list[str] = []
    report = run_campaign(config, [backend], machine.platform, executor,
                          on_result=lambda case, result, report: recorded.append(case.note), record_case_ids=True)
    assert report.cases == len(report.case_ids) == len(set(report.case_ids)) == 400
    assert len(executor.lone_at) >= 3 and report.extra["scale"]["scale_cases"] == len(executor.lone_at)
    # The campaign waited for an unfinished scale case at most once: at its end, with nothing else in flight (a
    # scale case queued inside a batch would be waited for every time).
    assert executor.stalls <= 1
    first_scale = next(i for i, note in enumerate(recorded) if note.startswith("scale tier"))
    assert recorded[first_scale + 1:], "cases submitted after the scale case were recorded after it too"


def test_every_batch_of_a_pool_campaign_is_full_where_the_feed_runs_over() -> None:
    """With index variants the feed generates whole cases with their variants, so its batches overrun the
    campaign's by a few slots; the campaign tops each batch up from the next one instead of submitting the few
    left over as a batch of their own (which halved the batches queued ahead and made one-slot batches)."""
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    config = CampaignConfig([b.name for b in backends], seed=9, max_cases=1000,
                            engine=EngineOptions(batch=50, mix="auto", scale="off", variants=7, feed="thread"))
    executor = _QueueingExecutor()
    report = run_campaign(config, backends, machine.platform, executor,
                          record_case_ids=True)
    assert executor.sizes[0] == min(FIRST_BATCH_CASES, 50) and sum(executor.sizes) == report.cases == 1000
    assert set(executor.sizes[1:]) == {50}, executor.sizes


def test_a_pool_campaign_starts_with_a_short_batch_and_visits_the_same_cases() -> None:
    """The first batch of a campaign with batches ahead is one round trip long (its first result is recorded
    while the other members start); the batches after it are full, and the cases are those of a campaign that
    runs one case at a time (case i depends on the seed and i only)."""
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("reference")

    def config() -> CampaignConfig:
        return CampaignConfig(["reference"], seed=5, max_cases=300,
                              engine=EngineOptions(batch=128, mix="auto", scale="off", feed="thread"))

    executor = _QueueingExecutor()
    pooled = run_campaign(config(), [backend], machine.platform, executor,
                          record_case_ids=True)
    assert executor.sizes[0] == FIRST_BATCH_CASES and max(executor.sizes) == 128
    assert sum(executor.sizes) == pooled.cases == 300
    alone = run_campaign(config(), [backend], machine.platform, InProcessExecutor(registry, machine),
                         record_case_ids=True)
    assert pooled.case_ids == alone.case_ids
