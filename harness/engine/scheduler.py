"""What a campaign has in flight on its executor, and in which order it hands cases over.

Two rules live here and nowhere else:

* **Look-ahead.** An executor that queues batches (a worker pool) takes batch i + 1 while batch i is recorded:
  up to ``ahead`` batches wait in the queue beyond the one being recorded. Results are still recorded in
  submission order, so a campaign's records do not depend on which worker finished first.
* **Scale aside.** A scale case (seconds, not milliseconds) queued in a batch would hold back every batch behind
  it while the pool's other members ran dry. Where the executor runs lone cases beside its queue, a scale case is
  submitted on its own and recorded as soon as it is done, one at a time; elsewhere it leads its batch and runs
  alone on the first member (``lone_first``).

Within a batch, cases whose crash a known entry predicts run last, so the crash (and the worker restart it costs)
takes no other case of the batch down with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from dataclasses import dataclass

from hicache_fuzz.harness.engine.feed import Slot, suspects_last
from hicache_fuzz.harness.findings.known_crash import KnownCrash
from hicache_fuzz.harness.pipeline.executor import Executor, SubmittedBatch, submit_batch


@dataclass
class Submitted:
    """A batch handed to the executor and not yet recorded."""

    slots: list[Slot]
    order: list[int]  # execution order (positions into slots)
    scale_slot: Slot | None  # the scale case leading the batch (slots[0]), if any
    handle: SubmittedBatch


class BatchScheduler:
    """The batches a campaign has submitted and not yet recorded, in the order they are to be recorded."""

    def __init__(self, executor: Executor, ahead: int, known_crashes: Collection[KnownCrash]) -> None:
        self.executor = executor
        self.ahead = ahead  # batches queued beyond the one being recorded (0: one at a time)
        self.known_crashes = known_crashes
        self.scale_aside = ahead > 0 and executor.runs_lone_cases_aside
        self.in_flight: list[Submitted] = []
        self.aside: list[Submitted] = []  # at most one scale case run beside the queue
        self.submitted = 0  # cases handed over so far (recorded or in flight)

    @property
    def has_room(self) -> bool:
        """Whether another batch may be submitted before the oldest is recorded."""
        return len(self.in_flight) <= self.ahead

    @property
    def idle(self) -> bool:
        return not self.in_flight and not self.aside

    @property
    def scale_case_running_aside(self) -> bool:
        return bool(self.aside)

    def submit_aside(self, scale_slot: Slot) -> None:
        """Run one scale case beside the queue (only where ``scale_aside``)."""
        self.submitted += 1
        handle = submit_batch(self.executor, [scale_slot.case], lone_first=1)
        self.aside.append(Submitted([scale_slot], [0], scale_slot, handle))

    def submit(self, slots: list[Slot], scale_slot: Slot | None) -> bool:
        """Hand a batch over, the scale case (if any) first and alone, suspected crashes last; True while there is
        room for another before anything is recorded. An executor without a queue runs the batch here."""
        order = suspects_last(slots, self.known_crashes)
        if scale_slot is not None:
            slots = [scale_slot, *slots]
            order = [0, *(position + 1 for position in order)]
        self.submitted += len(slots)
        handle = submit_batch(self.executor, [slots[i].case for i in order], lone_first=int(scale_slot is not None))
        self.in_flight.append(Submitted(slots, order, scale_slot, handle))
        return self.has_room

    def take_finished(self) -> Submitted:
        """A scale case run aside once it is done, else the oldest batch in flight (waited for when recorded)."""
        finished = [i for i, pending in enumerate(self.aside) if pending.handle.done()]
        if finished or not self.in_flight:
            return self.aside.pop(finished[0] if finished else 0)
        return self.in_flight.pop(0)

    def abandon(self) -> None:
        """Wait for everything still submitted (the workers finish it) and forget it: it is not recorded."""
        for pending in (*self.in_flight, *self.aside):
            with contextlib.suppress(Exception):
                pending.handle.result()
        self.in_flight.clear()
        self.aside.clear()
