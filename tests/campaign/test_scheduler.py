"""The campaign's batch scheduler (harness/engine/scheduler.py): look-ahead up to `ahead` batches, records in
submission order, a scale case run aside and recorded as soon as it is done, predicted known crashes last."""

from __future__ import annotations

from collections.abc import Sequence

from hicache_fuzz.harness.engine.feed import Slot
from hicache_fuzz.harness.engine.scheduler import BatchScheduler
from hicache_fuzz.harness.findings.known_crash import CrashFeatures, KnownCrash
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.kernels.reference import ReferenceBackend


class Pending:
    """A queued batch that finishes only when the test says so."""

    def __init__(self, cases: Sequence[Case], lone_first: int) -> None:
        self.cases, self.lone_first, self.finished = list(cases), lone_first, False

    def done(self) -> bool:
        return self.finished

    def result(self) -> list[Result]:
        return [Result(case.case_id, case.backend, Outcome.PASS) for case in self.cases]


class QueueingExecutor(Executor):
    queues_batches = True
    runs_lone_cases_aside = True

    def __init__(self) -> None:
        self.submitted: list[Pending] = []

    def submit_batch(self, cases: Sequence[Case], lone_first: int = 0) -> Pending:
        pending = Pending(cases, lone_first)
        self.submitted.append(pending)
        return pending


def slot(index: int, host: list[int] | None = None) -> Slot:
    body = {"schema": 1, "backend": "reference", "direction": "load_back", "scope": "all_layers",
            "layout": "layer_first", "pools": [{"name": "kv", "attention": "mha", "dtype": "bf16", "heads": 1,
                                                 "head_dim": 8}],
            "layers": 1, "page_size": 1, "device_rows": 8, "host_slots": 8, "layer": 0,
            "host_indices": [index % 8] if host is None else host, "device_indices": [index % 8] if host is None
            else [0] * len(host), "seed": index}
    return Slot(ReferenceBackend(), index, Case.from_dict(body), True)


def test_batches_queue_up_to_ahead_and_are_recorded_in_submission_order() -> None:
    executor = QueueingExecutor()
    scheduler = BatchScheduler(executor, ahead=2, known_crashes=set())
    assert scheduler.idle and scheduler.has_room
    assert scheduler.submit([slot(0)], None)
    assert scheduler.submit([slot(1)], None)
    assert not scheduler.submit([slot(2)], None)  # the third fills the queue: 1 being recorded + 2 ahead
    assert not scheduler.has_room and scheduler.submitted == 3
    executor.submitted[2].finished = True  # a later batch finishing first does not jump the queue
    assert [s.index for s in scheduler.take_finished().slots] == [0]
    assert [s.index for s in scheduler.take_finished().slots] == [1]
    assert [s.index for s in scheduler.take_finished().slots] == [2]
    assert scheduler.idle


def test_no_look_ahead_means_one_batch_at_a_time() -> None:
    scheduler = BatchScheduler(QueueingExecutor(), ahead=0, known_crashes=set())
    assert not scheduler.scale_aside  # aside needs a queue to run beside
    assert not scheduler.submit([slot(0)], None)


def test_a_scale_case_aside_is_recorded_once_done_ahead_of_older_batches() -> None:
    executor = QueueingExecutor()
    scheduler = BatchScheduler(executor, ahead=1, known_crashes=set())
    assert scheduler.scale_aside
    scale = slot(99)
    scheduler.submit([slot(0)], None)
    scheduler.submit_aside(scale)
    assert scheduler.scale_case_running_aside and executor.submitted[1].lone_first == 1
    assert [s.index for s in scheduler.take_finished().slots] == [0]  # not done yet: the queue goes first
    scheduler.submit([slot(1)], None)
    executor.submitted[1].finished = True
    assert scheduler.take_finished().scale_slot is scale
    assert not scheduler.scale_case_running_aside
    assert [s.index for s in scheduler.take_finished().slots] == [1]


def test_a_scale_case_in_a_batch_leads_it_alone() -> None:
    executor = QueueingExecutor()
    scheduler = BatchScheduler(executor, ahead=1, known_crashes=set())
    scale = slot(99)
    scheduler.submit([slot(0), slot(1)], scale)
    assert executor.submitted[0].lone_first == 1
    assert executor.submitted[0].cases[0] is scale.case
    batch = scheduler.take_finished()
    assert batch.slots[0] is scale and batch.order[0] == 0


def test_predicted_known_crashes_run_last_in_their_batch() -> None:
    executor = QueueingExecutor()
    crash = slot(5, host=[])  # an empty index list: the features of a known crash reproducer
    known = {KnownCrash(CrashFeatures("reference", "", True, True))}
    scheduler = BatchScheduler(executor, ahead=1, known_crashes=known)
    scheduler.submit([crash, slot(1), slot(2)], None)
    assert executor.submitted[0].cases[-1] is crash.case
    batch = scheduler.take_finished()
    assert batch.order == [1, 2, 0] and batch.slots[0] is crash  # slots stay in campaign order


def test_abandon_waits_for_what_is_in_flight_and_forgets_it() -> None:
    scheduler = BatchScheduler(QueueingExecutor(), ahead=2, known_crashes=set())
    scheduler.submit([slot(0)], None)
    scheduler.submit_aside(slot(99))
    scheduler.abandon()
    assert scheduler.idle and scheduler.has_room
