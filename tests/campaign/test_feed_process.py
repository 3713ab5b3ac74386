"""The feed process (engine/feed_process.py): the same slots as the in-process feed, a campaign through it
visits the same cases, a feed that cannot start falls back to the thread feed and says so, and a feed process
that dies is a harness error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.engine.feed import CaseFeed, EngineOptions
from hicache_fuzz.harness.engine.feed_process import FeedProcessError, ProcessFeed
from hicache_fuzz.harness.findings.known_crash import CrashFeatures, KnownCrash
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.harness.pipeline.pool import WorkerPool
from hicache_fuzz.kernels.registry import load_registry

CPU = Platform("cpu")


def _feeds(kind: type, **extra: object) -> object:
    registry = load_registry()
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    spaces = {b.name: CaseSpace() for b in backends}
    return kind(7, 3, (1, 2), backends, spaces, CPU, None, 50, None, {"reference": 2, "zoo-last-page-dropped": 1},
                {"zoo-last-page-dropped": 2}, **extra)


def _described(feed: object, batches: int) -> list[tuple[object, ...]]:
    """The first 37 x `batches` slots (a take returns fewer at the end of a generated batch)."""
    try:
        out: list[tuple[object, ...]] = []
        while len(out) < 37 * batches:
            out += [(s.backend.name, s.index, s.case, s.last_of_index, s.variant) for s in feed.take(37)]  # type: ignore[attr-defined]
        return out[: 37 * batches]
    finally:
        feed.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("processes", [1, 3])
def test_the_feed_processes_send_the_slots_of_the_in_process_feed(processes: int) -> None:
    """Whatever the number of lanes (the shard's step is 2 and one backend runs every other index of it, so a
    lane's indices are not the schedule's), the merged slots are the in-process feed's."""
    assert _described(_feeds(ProcessFeed, processes=processes), 4) == _described(_feeds(CaseFeed), 4)


def test_the_feed_processes_withhold_the_variants_of_predicted_crashes_as_the_in_process_feed() -> None:
    suspects = frozenset({KnownCrash(CrashFeatures("reference", "page_first", False, False))})
    processes = _described(_feeds(ProcessFeed, processes=2, crash_suspects=suspects), 4)
    assert processes == _described(_feeds(CaseFeed, crash_suspects=suspects), 4)
    assert processes != _described(_feeds(CaseFeed), 4)  # some page_first case of the reference lost its variants


def test_a_lane_of_a_feed_generates_every_lanes_th_index_of_the_one_feed() -> None:
    one = _described(_feeds(CaseFeed), 20)
    lane = [(s.backend.name, s.index, s.case, s.last_of_index, s.variant)
            for s in _feeds(CaseFeed, lanes=3)._make(80, whole_indices=True)]  # type: ignore[attr-defined]
    lane_indices = sorted({slot[1] for slot in lane})  # whole indices: every slot of each
    assert lane_indices[:3] == [3, 9, 15]  # start 3, the shard's step 2, three lanes
    assert max(lane_indices) < max(slot[1] for slot in one)
    assert lane == [slot for slot in one if slot[1] in set(lane_indices)]


def _one_backend_every_other_index(kind: type, **extra: int) -> object:
    registry = load_registry()
    backends = [registry.get("reference")]
    return kind(7, 0, (1, 1), backends, {"reference": CaseSpace()}, CPU, None, 16, None, 0, {"reference": 2},
                **extra)


def test_a_lane_that_holds_no_slot_ends_its_batch_empty_and_moves_on() -> None:
    """Two lanes, one backend running every other index: lane 1 holds only indices that never run. Its batch
    must end (empty, its next index further on) rather than scan for ever: this hung a one-backend gate."""
    import threading

    lane = _one_backend_every_other_index(CaseFeed, lanes=2)
    lane._index = 1  # type: ignore[attr-defined]  # lane 1 of a feed that starts at 0
    made: list[object] = []
    # In a thread, so that the scan that never ends fails the test instead of hanging it.
    maker = threading.Thread(target=lambda: made.append(lane._make(16, whole_indices=True)),  # type: ignore[attr-defined]
                             daemon=True)
    maker.start()
    maker.join(timeout=30)
    assert made == [[]], "the lane's batch did not end"
    assert lane.next_index > 1  # type: ignore[attr-defined]
    lane.close()  # type: ignore[attr-defined]


def test_two_feed_processes_serve_a_backend_that_runs_every_other_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The merged slots are the in-process feed's, past the hand-over to the children (taken long enough that
    the children are asked); a lane without slots used to block the merge until the batch timeout."""
    from hicache_fuzz.harness.engine import feed_process

    monkeypatch.setattr(feed_process, "BATCH_TIMEOUT_S", 30.0)
    processes = _one_backend_every_other_index(ProcessFeed, processes=2)
    try:
        taken: list[tuple[object, ...]] = []
        while processes._local is not None or len(taken) < 200:  # type: ignore[attr-defined]
            taken += [(s.index, s.case) for s in processes.take(16)]  # type: ignore[attr-defined]
    finally:
        processes.close()  # type: ignore[attr-defined]
    one = _one_backend_every_other_index(CaseFeed)
    expected: list[tuple[object, ...]] = []
    while len(expected) < len(taken):
        expected += [(s.index, s.case) for s in one.take(16)]  # type: ignore[attr-defined]
    one.close()  # type: ignore[attr-defined]
    assert taken == expected[: len(taken)]
    assert {index % 2 for index, _ in taken} == {0}


def test_feed_processes_auto_takes_two_where_the_machine_has_the_cores() -> None:
    assert EngineOptions().resolved_feed_processes(cores=16) == 2
    assert EngineOptions().resolved_feed_processes(cores=2) == 1
    assert EngineOptions(feed_processes=3).resolved_feed_processes(cores=2) == 3


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_a_campaign_through_the_feed_process_runs_the_cases_of_the_thread_feed(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    ids = {}
    for kind, processes in (("process", 1), ("process", 2), ("thread", 1)):
        config = CampaignConfig([b.name for b in backends], seed=21, max_cases=150,
                                engine=EngineOptions(batch=24, mix="auto", scale="off", variants=3, feed=kind,
                                                     feed_processes=processes))
        with WorkerPool(2, [b.name for b in backends], tmp_path / f"{kind}{processes}") as pool:
            report = run_campaign(config, backends, machine.platform, pool, record_case_ids=True)
        assert report.extra["engine"]["feed"].startswith(kind)
        assert ("2 feed processes" in report.extra["engine"]["feed"]) == (kind == "process" and processes == 2)
        ids[kind, processes] = report.case_ids
    assert ids["process", 1] == ids["process", 2] == ids["thread", 1] and len(ids["thread", 1]) == 150


def test_auto_uses_the_process_feed_for_a_pool_on_a_gpu_only() -> None:
    class Pool(Executor):
        queues_batches = True

    assert EngineOptions().resolved_feed(Platform("cuda", (9, 0)), Pool()) == "process"
    assert EngineOptions().resolved_feed(Platform("rocm"), Pool()) == "process"
    assert EngineOptions().resolved_feed(Platform("cuda", (9, 0)), Executor()) == "thread"
    assert EngineOptions().resolved_feed(CPU, Pool()) == "thread"
    with pytest.raises(ValueError, match="feed 'x'"):
        EngineOptions(feed="x").resolved_feed(CPU, Pool())


def test_a_feed_process_that_cannot_start_falls_back_to_the_thread_feed(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    reference = registry.get("reference")

    class Unsendable(type(reference)):  # type: ignore[misc]  # a class defined here cannot be pickled by name
        name = "reference"

    backends = [Unsendable()]
    config = CampaignConfig(["reference"], seed=3, max_cases=40,
                            engine=EngineOptions(batch=8, mix="none", scale="off", feed="process"))
    with WorkerPool(2, ["reference"], tmp_path) as pool:
        report = run_campaign(config, backends, machine.platform, pool, record_case_ids=True)
    assert report.cases == 40
    assert report.extra["engine"]["feed"].startswith("thread (the feed process did not start:")


def test_a_feed_process_that_dies_is_named() -> None:
    feed = _feeds(ProcessFeed, processes=2)
    assert isinstance(feed, ProcessFeed)
    try:
        feed.take(10)
        feed._children[1].process.kill()
        feed._children[1].process.join(timeout=10)
        with pytest.raises(FeedProcessError, match=r"feed process 1 died|feed process 1 sent no cases"):
            for _ in range(10):
                feed.take(50)
    finally:
        feed.close()


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_the_campaign_generates_whole_indices_itself_until_the_feed_process_is_ready() -> None:
    """Before the child says it is ready, take() serves whole indices from the in-process feed; the child then
    goes on from the next index, and the slots are those of one in-process feed all along."""
    feed = _feeds(ProcessFeed)
    assert isinstance(feed, ProcessFeed)
    first = feed.take(37)  # the child is still importing: generated here
    assert feed.local_slots >= 37
    import time

    deadline = time.monotonic() + 60
    while not feed._children[0].connection.poll(0) and time.monotonic() < deadline:
        time.sleep(0.05)
    rest = list(first)
    try:
        while len(rest) < 37 * 7:
            rest += feed.take(37)
    finally:
        feed.close()
    described = [(s.backend.name, s.index, s.case, s.last_of_index, s.variant) for s in rest][: 37 * 7]
    assert described == _described(_feeds(CaseFeed), 7)
    assert 0 < feed.local_slots < len(described), "the child took over"


def test_closing_the_feed_does_not_wait_for_children_blocked_on_a_batch_nobody_reads() -> None:
    """Each child has been asked for its next batch and sends it into a pipe the parent no longer reads, so it never
    reads "stop": close() kills it after a short grace instead of waiting (a campaign's wall time, not its work)."""
    import time

    registry = load_registry()
    backends = [registry.get("reference")]
    # batches of 2,000 slots: far more than a pipe's buffer holds, as a GPU campaign's are
    feed = ProcessFeed(7, 0, (0, 1), backends, {"reference": CaseSpace()}, CPU, None, 2000, None, 3, None,
                       processes=2)
    deadline = time.monotonic() + 60
    while feed._local is not None and time.monotonic() < deadline:
        feed.take(2000)  # until the children have taken over (each then has a batch requested)
    for _ in range(3):
        feed.take(2000)
    assert feed._local is None, "the children took over"
    time.sleep(1.0)  # each child generates its requested batch and blocks sending it
    started = time.monotonic()
    feed.close()
    assert time.monotonic() - started < 3.0
    assert all(not child.process.is_alive() for child in feed._children)


def test_a_feed_process_sends_each_case_with_its_wire_form_and_largest_index_already_computed() -> None:
    """What the parent would otherwise compute per case on its one core (the wire JSON for the workers, the
    largest index for coverage) travels inside the pickled case, and equals what the case would compute."""
    import json
    import pickle

    from hicache_fuzz.harness.engine.feed_process import _packed

    feed = _feeds(CaseFeed)
    try:
        packed = pickle.loads(pickle.dumps(_packed(feed, {"reference": 0, "zoo-last-page-dropped": 1})))
    finally:
        feed.close()  # type: ignore[attr-defined]
    assert packed
    for _, _, case, *_ in packed:
        assert {"wire_json", "largest_index"} <= set(vars(case))
        assert case.wire_json == json.dumps(case.to_dict()) == case.to_json()
        assert case.largest_index == max([0, *case.host_indices, *case.device_indices])
