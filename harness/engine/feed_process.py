"""The case feed in a process of its own: generation off the campaign parent's interpreter lock.

On a GPU the campaign parent has one core's worth of Python for everything: generating cases (the feed), the
worker pool's pipe traffic and result decoding (one thread per worker) and recording results. A feed thread
holds the interpreter lock for about a third of the campaign, which the pool's serving threads need to keep the
workers busy (docs/engine.md, "Keeping the workers fed"). :class:`ProcessFeed` runs the same
:class:`~hicache_fuzz.harness.engine.feed.CaseFeed` in a child process started with ``spawn`` and keeps one
batch generated ahead there; the parent only unpacks the slots. The slots are exactly those of the in-process
feed (case i is a pure function of the seed, the index and the backend's space), so campaigns, shards and
resumes are unchanged.

The child gets its inputs (backends, their spaces, the mix, the platform) from the parent over a
multiprocessing pipe, and sends back slots as (backend position, index, case, last of index, variant): objects
of this project only, between the campaign's own processes (nothing read from disk). Menu growth's prefetch
stays in the parent (it compiles in the parent's background), called in campaign order as slots arrive.

The child's start-up (it imports torch and the backends, and calibrates the mix, while the workers import
sglang) takes seconds. So the campaign does not wait for it: until the child
says it is ready, the parent generates whole campaign indices itself (the same CaseFeed, in this process), then
tells the child the next index and takes every later slot from it.

If the child cannot be started, the campaign uses the in-process feed (same slots) and says so in its report
(``engine.feed``); if it dies mid-campaign, the campaign fails with its exit code (a harness error).
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
from hicache_fuzz.harness.model.platform import limit_torch_threads
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform

START_TIMEOUT_S = 120.0  # the child imports torch and the harness before its first batch
BATCH_TIMEOUT_S = 300.0  # a batch of generation; longer means the child is stuck


class FeedProcessError(RuntimeError):
    """The feed process died or stopped answering (a harness fault, not a finding)."""


PackedSlot = tuple[int, int, Any, bool, int | None, int]  # backend position, index, case, last, scale no., variant


def _feed_main(connection: Connection, settings: dict[str, Any]) -> None:
    """The child: says "ready" once its imports are done, waits for ("start", index), then generates batches of a
    CaseFeed from that index on request ("more"), one generated ahead, until "stop"."""
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
                        settings["every"])
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        connection.close()
        return
    try:
        ready = _packed(feed, position)
        while connection.recv() == "more":
            connection.send((ready, feed.clock.generate_seconds))
            ready = _packed(feed, position)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):  # the parent went away: so does the feed
        pass
    finally:
        feed.close()
        connection.close()


def _packed(feed: CaseFeed, position: Mapping[str, int]) -> list[PackedSlot]:
    return [(position[s.backend.name], s.index, s.case, s.last_of_index, s.scale_number, s.variant)
            for s in feed._make(feed.batch)]


class ProcessFeed:
    """CaseFeed's interface (take, close, the report's fields) over a feed process."""

    def __init__(self, seed: int, start_index: int, shard: tuple[int, int], backends: list[Backend],
                 spaces: dict[str, CaseSpace], platform: Platform, mix: Mix | None, batch: int,
                 before_index: Callable[[Backend, int], None] | None = None,
                 variants: int | Mapping[str, int] = 0, every: Mapping[str, int] | None = None) -> None:
        self.backends, self.mix, self.batch, self.before_index = backends, mix, batch, before_index
        # Until the child is ready, whole indices come from this in-process feed (no thread: it runs when asked).
        # Its resolved settings and mix profiles (calibrated once, here) are the ones the report and the scale
        # tier read; the child calibrates its own from the same inputs, with the same result.
        local = CaseFeed(seed, start_index, shard, backends, spaces, platform, mix, batch, before_index, variants,
                         every)
        local.close()
        self._local: CaseFeed | None = local
        self.variants_by_backend, self.variants, self.every = local.variants_by_backend, local.variants, local.every
        self.profiles = local.profiles
        self.clock = FeedClock(calibrate_seconds=local.clock.calibrate_seconds)
        self._ready: deque[Slot] = deque()
        self.local_slots = 0  # slots generated here before the child took over (the report's engine.feed)
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        settings = {"seed": seed, "shard": shard, "backends": backends, "spaces": spaces, "platform": platform,
                    "mix": mix, "batch": batch, "variants": variants, "every": dict(self.every)}
        self._process = context.Process(target=_feed_main, args=(child_end, settings), daemon=True,
                                        name="hicache-fuzz-feed")
        self._process.start()  # raises (OSError, pickling errors) if the child cannot be started
        child_end.close()
        self._started = time.perf_counter()

    def take(self, limit: int) -> list[Slot]:
        """Up to `limit` slots in campaign order (blocks only if the feed is behind)."""
        if not self._ready:
            waited = time.perf_counter()
            self._ready.extend(self._local_batch() if self._local_in_charge() else self._receive())
            self.clock.wait_seconds += time.perf_counter() - waited
        return [self._ready.popleft() for _ in range(min(limit, len(self._ready)))]

    def _local_in_charge(self) -> bool:
        """True while the child is not ready yet; at its first "ready" the child is told where to go on from."""
        if self._local is None:
            return False
        ready = self._connection.poll(0)
        if not ready and time.perf_counter() - self._started < START_TIMEOUT_S:
            return True
        try:
            said = self._connection.recv() if ready else None
        except (EOFError, OSError) as exc:
            self._process.join(timeout=5)
            raise FeedProcessError(f"the feed process died (exit code {self._process.exitcode}): {exc!r}") from None
        if said != "ready":
            raise FeedProcessError(f"the feed process did not get ready in {START_TIMEOUT_S:g} s (said {said!r})")
        self._connection.send(("start", self._local.next_index))
        self._connection.send("more")  # the child sends its first batch as soon as it is generated
        self._local = None
        return False

    def _local_batch(self) -> list[Slot]:
        assert self._local is not None
        slots = self._local._make(self.batch, whole_indices=True)
        self.local_slots += len(slots)
        self.clock.generate_seconds += self._local.clock.generate_seconds - self._local_generated
        self._local_generated = self._local.clock.generate_seconds
        return slots

    _local_generated = 0.0

    def _receive(self) -> list[Slot]:
        timeout = BATCH_TIMEOUT_S
        if not self._connection.poll(timeout):
            raise FeedProcessError(f"the feed process sent no cases in {timeout:g} s")
        try:
            packed, generate_seconds = self._connection.recv()
        except (EOFError, OSError) as exc:
            self._process.join(timeout=5)
            raise FeedProcessError(f"the feed process died (exit code {self._process.exitcode}): {exc!r}") from None
        self._connection.send("more")  # the next batch is being generated meanwhile
        self.clock.generate_seconds = self._local_generated + generate_seconds
        slots = []
        for number, index, case, last, scale_number, variant in packed:
            backend = self.backends[number]
            if variant == 0 and self.before_index is not None:
                self.before_index(backend, index)
            slots.append(Slot(backend, index, case, last, scale_number, variant))
        return slots

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the child is gone already
            self._connection.send("stop")
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._connection.close()
