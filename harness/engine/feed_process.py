"""The case feed in processes of its own: generation off the campaign parent's interpreter lock.

On a GPU the campaign parent has one core's worth of Python for everything: generating cases (the feed), the
worker pool's pipe traffic and result decoding (one thread per worker) and recording results. A feed thread
holds the interpreter lock for about a third of the campaign, which the pool's serving threads need to keep the
workers busy (docs/engine.md, "Keeping the workers fed"). :class:`ProcessFeed` runs the same
:class:`~hicache_fuzz.harness.engine.feed.CaseFeed` in a child process started with ``spawn`` and keeps one
batch generated ahead there; the parent only unpacks the slots. The slots are exactly those of the in-process
feed (case i is a pure function of the seed, the index and the backend's space), so campaigns, shards and
resumes are unchanged.

Generation is one core's work per feed process; a campaign whose workers consume more than one process generates
(wider spaces, longer index lists) runs ``processes`` children, each a CaseFeed over every ``processes``-th campaign
index (``lanes``), and the parent merges their slots back into campaign order, index by index. Case i is the same
whichever child draws it, so the slots are those of one in-process feed whatever the count.

The children get their inputs (backends, their spaces, the mix, the platform) from the parent over a
multiprocessing pipe, and send back slots as (backend position, index, case, last of index, variant): objects
of this project only, between the campaign's own processes (nothing read from disk). Menu growth's prefetch
stays in the parent (it compiles in the parent's background).

A child's start-up (it imports torch and the backends, and calibrates the mix, while the workers import
sglang) takes seconds. So the campaign does not wait for it: until every child says it is ready, the parent
generates whole campaign indices itself (the same CaseFeed, in this process), then tells each child the index its
lane goes on from and takes every later slot from the children.

Menu growth's ``before_index`` is called in campaign order as slots are merged (a child's batch runs ahead of the
other lanes'). If a child cannot be started, the campaign uses the in-process feed (same slots) and says so in
its report (``engine.feed``); if one dies mid-campaign, the campaign fails with its exit code (a harness error).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from hicache_fuzz.harness.engine.feed import CaseFeed, FeedClock, Slot
from hicache_fuzz.harness.engine.mix import Mix
from hicache_fuzz.harness.findings.known_crash import KnownCrash
from hicache_fuzz.harness.model.platform import limit_torch_threads
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform

START_TIMEOUT_S = 120.0  # the child imports torch and the harness before its first batch
BATCH_TIMEOUT_S = 300.0  # a batch of generation; longer means the child is stuck
CLOSE_GRACE_S = 0.5  # the campaign is over: the children get this long, together, to exit before they are killed


class FeedProcessError(RuntimeError):
    """A feed process died or stopped answering (a harness fault, not a finding)."""


PackedSlot = tuple[int, int, Any, bool, int | None, int]  # backend position, index, case, last, scale no., variant


def _feed_main(connection: Connection, settings: dict[str, Any]) -> None:
    """A child: says "ready" once its imports are done, waits for ("start", index), then generates batches of whole
    indices of its lane from that index on request ("more"), one generated ahead, until "stop". Each batch goes
    with the child's generation seconds so far and the next index it will generate."""
    backends: list[Backend] = settings["backends"]
    position = {backend.name: number for number, backend in enumerate(backends)}
    limit_torch_threads()  # a spawned child starts with torch's default, one thread per core
    try:
        connection.send("ready")
        message = connection.recv()
        if not (isinstance(message, tuple) and message[0] == "start"):
            return
        feed = CaseFeed(settings["seed"], message[1], settings["shard"], backends, settings["spaces"],
                        settings["platform"], settings["mix"], settings["batch"], None, settings["variants"],
                        settings["every"], lanes=settings["lanes"], crash_suspects=settings["crash_suspects"])
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        connection.close()
        return
    try:
        ready = _packed(feed, position)
        while connection.recv() == "more":
            connection.send((ready, feed.clock.generate_seconds, feed.next_index))
            ready = _packed(feed, position)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):  # the parent went away: so does the feed
        pass
    finally:
        feed.close()
        connection.close()


def _packed(feed: CaseFeed, position: Mapping[str, int]) -> list[PackedSlot]:
    """The next batch for the pipe. Each case's wire form and largest index are computed here and travel inside
    the pickled case: the parent, whose one core also serves every worker's pipe and records every result, then
    only copies the wire form into the batch message and reads the index for its coverage."""
    slots = feed._make(feed.batch, whole_indices=True)
    for slot in slots:
        _ = slot.case.wire_json, slot.case.largest_index
    return [(position[s.backend.name], s.index, s.case, s.last_of_index, s.scale_number, s.variant) for s in slots]


class _Child:
    """One feed process: its pipe, the slots it sent that were not merged yet, and how far its lane is received."""

    def __init__(self, context: Any, settings: dict[str, Any], lane: int) -> None:
        self.lane = lane
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_feed_main, args=(child_end, settings), daemon=True,
                                       name=f"hicache-fuzz-feed-{lane}")
        self.process.start()  # raises (OSError, pickling errors) if the child cannot be started
        child_end.close()
        self.ready = False
        self.slots: deque[PackedSlot] = deque()
        self.next_index = 0  # every index of this lane below it has been received
        self.generate_seconds = 0.0

    def died(self, exc: BaseException) -> FeedProcessError:
        self.process.join(timeout=5)
        return FeedProcessError(f"the feed process {self.lane} died (exit code {self.process.exitcode}): {exc!r}")

    def receive(self) -> None:
        """The child's next batch (it starts generating the one after at once)."""
        if not self.connection.poll(BATCH_TIMEOUT_S):
            raise FeedProcessError(f"the feed process {self.lane} sent no cases in {BATCH_TIMEOUT_S:g} s")
        try:
            packed, self.generate_seconds, self.next_index = self.connection.recv()
        except (EOFError, OSError) as exc:
            raise self.died(exc) from None
        self.connection.send("more")
        self.slots.extend(packed)

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the child is gone already
            self.connection.send("stop")

    def close(self, grace: float) -> None:
        """Wait up to `grace` seconds for the child to exit, then kill it. A child is usually blocked sending the
        batch it generated ahead into a pipe nobody reads any more, and so never reads "stop": what it holds is
        worth nothing, and waiting for it would only add to the campaign's wall time."""
        self.process.join(timeout=grace)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.connection.close()


class ProcessFeed:
    """CaseFeed's interface (take, close, the report's fields) over `processes` feed processes."""

    def __init__(self, seed: int, start_index: int, shard: tuple[int, int], backends: list[Backend],
                 spaces: dict[str, CaseSpace], platform: Platform, mix: Mix | None, batch: int,
                 before_index: Callable[[Backend, int], None] | None = None,
                 variants: int | Mapping[str, int] = 0, every: Mapping[str, int] | None = None,
                 processes: int = 1, crash_suspects: frozenset[KnownCrash] = frozenset()) -> None:
        self.backends, self.mix, self.batch, self.before_index = backends, mix, batch, before_index
        self.step = shard[1]
        # Until the children are ready, whole indices come from this in-process feed (no thread: it runs when
        # asked). Its resolved settings and mix profiles (calibrated once, here) are the ones the report and the
        # scale tier read; the children calibrate their own from the same inputs, with the same result.
        local = CaseFeed(seed, start_index, shard, backends, spaces, platform, mix, batch, before_index, variants,
                         every, crash_suspects=crash_suspects)
        local.close()
        self._local: CaseFeed | None = local
        self.variants_by_backend, self.variants, self.every = local.variants_by_backend, local.variants, local.every
        self.crash_suspects = crash_suspects
        self.profiles = local.profiles
        self.clock = FeedClock(calibrate_seconds=local.clock.calibrate_seconds)
        self._ready: deque[Slot] = deque()
        self.local_slots = 0  # slots generated here before the children took over (the report's engine.feed)
        self._local_generated = 0.0
        self._next = start_index  # the next campaign index merged from the children
        self._handover = start_index  # the index lane 0 starts at
        context = multiprocessing.get_context("spawn")
        settings = {"seed": seed, "shard": shard, "backends": backends, "spaces": spaces, "platform": platform,
                    "mix": mix, "batch": batch, "variants": variants, "every": dict(self.every),
                    "lanes": max(1, processes), "crash_suspects": crash_suspects}
        self._children: list[_Child] = []
        try:
            for lane in range(max(1, processes)):
                self._children.append(_Child(context, settings, lane))
        except BaseException:
            self.close()
            raise
        self._started = time.perf_counter()

    @property
    def processes(self) -> int:
        return len(self._children)

    def take(self, limit: int) -> list[Slot]:
        """Up to `limit` slots in campaign order (blocks only if the feed is behind)."""
        if not self._ready:
            waited = time.perf_counter()
            self._ready.extend(self._local_batch() if self._local_in_charge() else self._merged_batch())
            self.clock.wait_seconds += time.perf_counter() - waited
        return [self._ready.popleft() for _ in range(min(limit, len(self._ready)))]

    def _local_in_charge(self) -> bool:
        """True while a child is not ready yet; once all are, each is told where its lane goes on from."""
        if self._local is None:
            return False
        for child in self._children:
            if child.ready or not child.connection.poll(0):
                continue
            try:
                said = child.connection.recv()
            except (EOFError, OSError) as exc:
                raise child.died(exc) from None
            if said != "ready":
                raise FeedProcessError(f"the feed process {child.lane} said {said!r} instead of getting ready")
            child.ready = True
        waiting = [child.lane for child in self._children if not child.ready]
        if waiting and time.perf_counter() - self._started < START_TIMEOUT_S:
            return True
        if waiting:
            raise FeedProcessError(f"the feed processes {waiting} did not get ready in {START_TIMEOUT_S:g} s")
        self._handover = self._next = self._local.next_index
        for child in self._children:
            child.next_index = self._next + child.lane * self.step
            child.connection.send(("start", child.next_index))
            child.connection.send("more")  # the child sends its first batch as soon as it is generated
        self._local = None
        return False

    def _local_batch(self) -> list[Slot]:
        assert self._local is not None
        slots = self._local._make(self.batch, whole_indices=True)
        self.local_slots += len(slots)
        self.clock.generate_seconds += self._local.clock.generate_seconds - self._local_generated
        self._local_generated = self._local.clock.generate_seconds
        return slots

    def _merged_batch(self) -> list[Slot]:
        """At least a batch of slots, whole indices in campaign order, each from its lane's child."""
        slots: list[Slot] = []
        while len(slots) < self.batch:
            child = self._children[(self._next - self._handover) // self.step % len(self._children)]
            while child.next_index <= self._next:
                child.receive()
            while child.slots and child.slots[0][1] == self._next:
                number, index, case, last, scale_number, variant = child.slots.popleft()
                backend = self.backends[number]
                if variant == 0 and self.before_index is not None:
                    self.before_index(backend, index)
                slots.append(Slot(backend, index, case, last, scale_number, variant))
            self._next += self.step
        self.clock.generate_seconds = self._local_generated + sum(c.generate_seconds for c in self._children)
        return slots

    def close(self) -> None:
        for child in self._children:
            child.ask_to_stop()
        deadline = time.perf_counter() + CLOSE_GRACE_S
        for child in self._children:
            child.close(max(0.0, deadline - time.perf_counter()))
