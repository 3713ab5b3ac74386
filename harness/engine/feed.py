"""The campaign's case feed: cases generated ahead of execution, in batches, with the mix and the scale tier.

``run_campaign`` takes batches from a :class:`CaseFeed` and hands each to the executor in one round trip
(``run_batch``: one pipe message per batch for a worker). While a batch runs, the feed's thread generates and
validates the next one (the parent is blocked on the worker's pipe meanwhile, so generation runs in parallel
with execution). Slots are produced in campaign order (index i, every backend; then i + n ...), so a campaign
with a feed visits exactly the cases the case-at-a-time loop visited, and ``next_index`` still resumes it.

Engine options (:class:`EngineOptions`; ``auto`` resolves per platform):

* ``batch``: cases per round trip (auto: 64 where the executor has ``run_batch``, else 1);
* ``mix``: the case mix (:mod:`hicache_fuzz.harness.engine.mix`; auto: ``transfer=0.7,reject=0.28,empty=0.02``
  on a GPU, none on the CPU platform, whose campaigns keep their historical case sets);
* ``scale``: the scale tier (:mod:`hicache_fuzz.harness.engine.scale`; auto: production sizes on a GPU,
  off on the CPU; ``simulated`` runs the scaled-down tier anywhere) and its time share (default 15 %);
* ``variants``: index variants after each generated case (:mod:`hicache_fuzz.harness.engine.variants`;
  auto: 7 on a GPU, raised for a backend to its ``geometry_setup_variants``, none on the CPU platform;
  ``--variants N`` gives every backend N). A variant is a case like any other, run on the storages its case
  left behind; the slots of one index are its case and then its variants, for every backend in turn.

The command-line form of these options is harness/commands/fuzz_options.py (no torch import: fast --help).

Known crash classes. A known crash reproducer predicts which cases may crash (findings/known_crash.py: same
backend, host layout and emptiness of the index lists, and the entry's trigger met). Those cases are suspects,
and two rules follow:

* they run at the end of their batch: if one kills the worker, the cases of the batch before it keep their
  results and only it (and other suspects) are replayed alone;
* they get no index variants. A sticky crash (one that costs the worker its CUDA context, such as the AOT
  page_head ops' misaligned 8-byte loads) depends on the geometry, which every variant of a case shares, so it
  would repeat in each variant and each repeat costs a worker restart (tens of seconds on a GPU, against
  milliseconds a case): the eight slots of one such case can take a campaign's whole minute. A suspect is
  therefore run once per generated case; what it loses is index variety on the suspect geometries alone.

With the runner's device probe, the known zero-length class does not kill the worker at all (its pending error
is cleared and the case is a CRASH result with the known signature), so it costs no restart; its cases have no
index to vary anyway.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hicache_fuzz.harness.engine.campaign_case import campaign_case
from hicache_fuzz.harness.engine.defaults import AUTO_FEED_PROCESSES_MIN_CORES, DEFAULT_SCALE_SHARE
from hicache_fuzz.harness.engine.mix import DEFAULT_MIX, Mix, TransferProfile
from hicache_fuzz.harness.engine.scale import (
    PRODUCTION,
    SHAPES,
    SIMULATED,
    ScaleTargets,
    scale_case,
)
from hicache_fuzz.harness.engine.variants import index_variants
from hicache_fuzz.harness.findings.known_crash import KnownCrash, predicted_crash
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor_base import Executor
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform

DEFAULT_BATCH = 64
FIRST_CYCLE_SPACING = 8.0  # seconds between the first scale cases of each shape, whatever the tier's share
# Index variants per generated case on a GPU: the count measured best for generated cases a second
# (docs/engine.md, "Variants per case: why 7"). A pool case costs about the same whatever its variant count, so
# a higher count for the pool only buys expensive cases; a variant of the cheap backends costs a fraction of a
# generated case, and the freed worker time goes to new cases.
DEFAULT_GPU_VARIANTS = 7


@dataclass
class EngineOptions:
    batch: int | None = None  # None: auto
    mix: str = "auto"  # "auto", "none", or "transfer=0.7,reject=0.3"
    scale: str = "auto"  # "auto", "off", "production", "simulated"
    scale_share: float = DEFAULT_SCALE_SHARE
    variants: int | None = None  # None: auto
    # Which campaign indices each backend runs: "auto" (a GPU: every relative_case_cost-th index of a backend
    # whose cases cost several times a kernel case; the CPU platform: every index), "none" (every backend every
    # index), or "NAME=K,..." (those backends every K-th index, the others as auto).
    backend_every: str = "auto"
    # Batches handed to a worker pool before the campaign records the oldest one (loop.py): the pool's members
    # take the next batches while batch i is recorded or still finishing its slowest group (a scale case runs
    # about a second on the first member; a batch is a fraction of a second of work), so none waits at a
    # batch boundary; 0 runs a batch at a time.
    batches_ahead: int = 3
    # Where cases are generated: "auto" (a process of its own for a worker pool on a GPU, where the parent's
    # interpreter lock is the limit: harness/engine/feed_process.py; a thread of the campaign otherwise),
    # "process" or "thread". The slots are the same either way.
    feed: str = "auto"
    # Processes generating cases for the process feed (feed_process.py), each every N-th index; None: auto.
    feed_processes: int | None = None

    def resolved_variants(self, platform: Platform) -> int:
        if self.variants is not None:
            return max(0, self.variants)
        return 0 if platform.kind == "cpu" else DEFAULT_GPU_VARIANTS

    def resolved_variants_by_backend(self, platform: Platform, backends: Sequence[Backend]) -> dict[str, int]:
        """Variants per generated case, by backend: N for all with ``variants=N``; else the platform's default,
        raised to a backend's ``geometry_setup_variants`` where the default runs variants at all."""
        default = self.resolved_variants(platform)
        if self.variants is not None or default == 0:
            return {backend.name: default for backend in backends}
        return {backend.name: max(default, backend.geometry_setup_variants) for backend in backends}

    def resolved_backend_every(self, platform: Platform, backends: Sequence[Backend]) -> dict[str, int]:
        """K per backend: the backend runs the campaign indices i with (i // shard count) % K == 0. Auto: the
        backend's case cost over that of the campaign's cheapest backend. The schedule balances backends
        against each other, so a backend alone (the gate's per-backend campaigns), or beside backends as costly,
        runs every index: skipping indices would only change which cases it draws, and every lane of a process
        feed holds slots."""
        gpu = platform.kind != "cpu"
        cheapest = min((max(1, b.relative_case_cost) for b in backends), default=1)
        every = {b.name: (max(1, b.relative_case_cost) // cheapest if gpu and self.backend_every != "none" else 1)
                 for b in backends}
        if self.backend_every not in ("auto", "none"):
            every.update(parse_backend_every(self.backend_every))
        return every

    def resolved_feed(self, platform: Platform, executor: Executor) -> str:
        if self.feed not in ("auto", "process", "thread"):
            raise ValueError(f"feed {self.feed!r}: expected auto, process or thread")
        if self.feed != "auto":
            return self.feed
        return "process" if platform.kind != "cpu" and executor.queues_batches else "thread"

    def resolved_feed_processes(self, cores: int | None = None) -> int:
        """Feed processes for a process feed: as asked, else two where the machine has the cores for them beside a
        worker pool (AUTO_FEED_PROCESSES_MIN_CORES), else one."""
        if self.feed_processes is not None:
            return max(1, self.feed_processes)
        if cores is None:
            cores = os.cpu_count() or 1
        return 2 if cores >= AUTO_FEED_PROCESSES_MIN_CORES else 1

    def resolved_mix(self, platform: Platform) -> Mix | None:
        if self.mix == "none" or (self.mix == "auto" and platform.kind == "cpu"):
            return None
        return DEFAULT_MIX if self.mix == "auto" else Mix.parse(self.mix)

    def resolved_scale(self, platform: Platform) -> ScaleTargets | None:
        if self.scale == "off" or (self.scale == "auto" and platform.kind == "cpu") or self.scale_share <= 0:
            return None
        if self.scale == "simulated":
            return SIMULATED
        if self.scale in ("auto", "production"):
            return PRODUCTION
        raise ValueError(f"scale {self.scale!r}: expected auto, off, production or simulated")

    def resolved_batch(self, executor: Executor) -> int:
        if self.batch is not None:
            return max(1, self.batch)
        # A worker pool shares a batch among its workers: a batch per worker per round trip.
        return DEFAULT_BATCH * executor.size if executor.runs_batches else 1

    def resolve(self, platform: Platform, backends: Sequence[Backend], executor: Executor) -> EngineSettings:
        """The options for one campaign on `platform` with `backends` and `executor`, resolved once."""
        return EngineSettings(mix=self.resolved_mix(platform), batch=self.resolved_batch(executor),
                              variants=self.resolved_variants_by_backend(platform, backends),
                              every=self.resolved_backend_every(platform, backends),
                              feed=self.resolved_feed(platform, executor), scale=self.resolved_scale(platform),
                              scale_share=self.scale_share, batches_ahead=self.batches_ahead,
                              feed_processes=self.resolved_feed_processes())


@dataclass(frozen=True)
class EngineSettings:
    """EngineOptions resolved for one campaign (EngineOptions.resolve): what the loop and its feed read."""

    mix: Mix | None
    batch: int  # slots per batch
    variants: Mapping[str, int]  # index variants per generated case, by backend
    every: Mapping[str, int]  # K by backend: it runs every K-th campaign index
    feed: str  # "process" or "thread"
    scale: ScaleTargets | None  # None: no scale tier
    scale_share: float
    batches_ahead: int
    feed_processes: int  # for a process feed


def parse_backend_every(text: str) -> dict[str, int]:
    """`NAME=K,...` (K >= 1); ValueError names a bad entry."""
    out: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--backend-every {text!r}: expected auto, none or NAME=K,... with K >= 1, "
                             f"not {item.strip()!r}")
        out[name.strip()] = int(value)
    return out


@dataclass
class Slot:
    backend: Backend
    index: int  # campaign index; scale cases carry the index of the slot they were run before
    case: Case
    last_of_index: bool  # the index's last slot (last backend, last variant): resume after it moves on
    scale_number: int | None = None  # set for scale-tier cases
    variant: int = 0  # 0: the generated case; k > 0: its index variant k


def rows_by_backend(slots: Iterable[Slot]) -> dict[str, list[int]]:
    """The row sizes (bytes) the cases of `slots` move, by backend, in the order they first appear: the JIT
    modules those cases load (pipeline/prebuild.py builds them first)."""
    rows: dict[str, dict[int, None]] = {}
    for slot in slots:
        wanted = rows.setdefault(slot.backend.name, {})
        for pool in slot.case.pools:
            for component in pool.components:
                wanted[pool.row_bytes(component)] = None
    return {name: list(wanted) for name, wanted in rows.items()}


def suspects_last(slots: list[Slot], known: Collection[KnownCrash]) -> list[int]:
    """Execution order of `slots` (positions): predicted known crashes last, otherwise campaign order."""
    if not known:
        return list(range(len(slots)))
    return sorted(range(len(slots)), key=lambda i: predicted_crash(slots[i].case, known))


@dataclass
class FeedClock:
    generate_seconds: float = 0.0  # the feed thread generating and validating cases
    wait_seconds: float = 0.0  # the campaign waiting for the feed (generation not hidden behind execution)
    scale_generate_seconds: float = 0.0
    calibrate_seconds: float = 0.0


class CaseFeed:
    """Campaign-ordered slots, generated one batch ahead in a background thread."""

    def __init__(self, seed: int, start_index: int, shard: tuple[int, int], backends: list[Backend],
                 spaces: dict[str, CaseSpace], platform: Platform, mix: Mix | None, batch: int,
                 before_index: Any = None, variants: int | Mapping[str, int] = 0,
                 every: Mapping[str, int] | None = None, lanes: int = 1,
                 crash_suspects: frozenset[KnownCrash] = frozenset()) -> None:
        self.seed, self.step = seed, shard[1]
        self.crash_suspects = crash_suspects  # cases these predict get no index variants (module doc)
        # A feed that is one of `lanes` feed processes generates every lanes-th index of its shard from
        # start_index on (feed_process.py); the schedule (every) still counts the shard's indices.
        self.lanes = lanes
        # backend name -> K: the backend runs the indices i with (i // step) % K == 0 (EngineOptions.backend_every)
        self.every = {backend.name: max(1, (every or {}).get(backend.name, 1)) for backend in backends}
        # variants by backend name (an int: the same for every backend); `variants` is the most any gets
        self.variants_by_backend = (dict(variants) if isinstance(variants, Mapping)
                                    else {backend.name: variants for backend in backends})
        self.variants = max(self.variants_by_backend.values(), default=0)
        self.backends, self.spaces, self.platform, self.mix, self.batch = backends, spaces, platform, mix, batch
        self.before_index = before_index  # MenuGrowth.before(backend, index), called in campaign order
        self.clock = FeedClock()
        started = time.perf_counter()
        self.profiles = {b.name: TransferProfile.calibrate(b, spaces[b.name], platform) for b in backends}
        self.clock.calibrate_seconds = time.perf_counter() - started
        self._index, self._position = start_index, 0
        self._ready: deque[Slot] = deque()
        self._pending: Future[list[Slot]] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hicache-fuzz-feed")
        self._lock = threading.Lock()

    def _make(self, count: int, whole_indices: bool = False) -> list[Slot]:
        """Slots for at least `count` cases (a generated case comes with all its variants); with
        `whole_indices`, up to the end of an index (every backend of the last index), so that another feed can
        go on from ``next_index``."""
        started = time.perf_counter()
        out: list[Slot] = []
        # A lane of a process feed may hold no slot at all: with two lanes and every backend running every
        # other index (a one-backend campaign given an even `every` explicitly), one lane's indices are never
        # run. So a whole-index batch also ends after this many of its indices, possibly empty; its next_index
        # moves on.
        scan_end = self._index + max(1, count) * max(self.every.values(), default=1) * self.step * self.lanes
        while len(out) < count or (whole_indices and self._position != 0):
            if whole_indices and self._position == 0 and self._index >= scan_end:
                break
            backend = self.backends[self._position]
            index = self._index
            runs_here = self._runs_at(index)
            if backend not in runs_here:
                self._advance(backend is self.backends[-1])
                continue
            if self.before_index is not None:
                self.before_index(backend, index)
            space = self.spaces[backend.name]
            case = campaign_case(self.seed, index, backend, space, self.platform, self.mix,
                                 self.profiles[backend.name])
            last = backend is runs_here[-1]  # the index's last slot comes from its last backend that runs it
            varied = bool(case.host_indices and case.device_indices) and (
                not self.crash_suspects or not predicted_crash(case, self.crash_suspects))
            variants = self.variants_by_backend.get(backend.name, 0) if varied else 0
            out.append(Slot(backend, index, case, last and not variants))
            for number, variant in enumerate(index_variants(case, variants), start=1):
                out.append(Slot(backend, index, variant, last and number == variants, variant=number))
            self._advance(backend is self.backends[-1])
        self.clock.generate_seconds += time.perf_counter() - started
        return out

    def _runs_at(self, index: int) -> list[Backend]:
        """The backends that run campaign index `index` (every backend runs index 0 of its schedule)."""
        ordinal = index // self.step
        return [b for b in self.backends if ordinal % self.every[b.name] == 0]

    def _advance(self, was_last_backend: bool) -> None:
        self._position += 1
        if was_last_backend:
            self._position = 0
            self._index += self.step * self.lanes

    def take(self, limit: int) -> list[Slot]:
        """Up to `limit` slots in campaign order (blocks only if the feed is behind)."""
        if not self._ready and self.batch == 1:  # nothing to overlap with (in process): no look-ahead
            waited = time.perf_counter()
            self._ready.extend(self._make(1))
            self.clock.wait_seconds += time.perf_counter() - waited
        if not self._ready:
            if self._pending is None:
                self._pending = self._thread.submit(self._make, self.batch)
            waited = time.perf_counter()
            self._ready.extend(self._pending.result())
            self.clock.wait_seconds += time.perf_counter() - waited
            self._pending = self._thread.submit(self._make, self.batch)  # next batch while this one runs
        return [self._ready.popleft() for _ in range(min(limit, len(self._ready)))]

    @property
    def next_index(self) -> int:
        """The index the next generated slot belongs to (at an index boundary after _make(whole_indices))."""
        return self._index

    def next_unconsumed(self) -> tuple[int, int] | None:
        """(index, backend position) of the first slot generated but not taken, if any."""
        if self._ready:
            slot = self._ready[0]
            return slot.index, self.backends.index(slot.backend)
        return None

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


@dataclass
class ScaleTier:
    """Scale-tier cases, run whenever the tier's share of the campaign's time allows."""

    seed: int
    backends: list[Backend]
    spaces: dict[str, CaseSpace]
    platform: Platform
    targets: ScaleTargets
    share: float
    profiles: dict[str, TransferProfile]
    number: int = 0  # scale cases drawn so far by this shard
    shard: tuple[int, int] = (0, 1)  # (k, n): shard k draws scale case numbers k, k + n, ... (no two shards alike)
    seconds: float = 0.0  # time spent on scale cases (execution)
    skipped: list[str] = field(default_factory=list)  # "backend/shape" with no accepted candidate

    def due(self, elapsed: float) -> bool:
        """A scale case is due when the tier is under its share of the elapsed time, and in any case for each
        shape of the first cycle (one every FIRST_CYCLE_SPACING seconds): so every campaign of a minute
        reaches every shape (the largest device pool, the host offset past 2^32, the deep pools with a page
        size that is not a power of two) even when contention makes scale cases slow."""
        if self.seconds <= self.share * elapsed:
            return True
        return self.number < len(SHAPES) and elapsed >= FIRST_CYCLE_SPACING * (self.number + 1)

    def next_case(self, clock: FeedClock) -> tuple[Backend, Case, int] | None:
        started = time.perf_counter()
        try:
            for _ in range(3 * len(self.backends)):
                number = self.shard[0] + self.number * self.shard[1]
                self.number += 1
                backend = self.backends[(number // 3) % len(self.backends)]
                case = scale_case(self.seed, number, backend, self.spaces[backend.name], self.platform,
                                  self.targets, self.profiles[backend.name])
                if case is not None:
                    return backend, case, number
                self.skipped.append(f"{backend.name}/{number % 3}")
            return None
        finally:
            clock.scale_generate_seconds += time.perf_counter() - started

