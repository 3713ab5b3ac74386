"""Replay: run corpus entries (cases, reproducers) again and judge each against what it expects.

The one replay loop, used by ``hicache-fuzz replay`` and the gate's corpus phase. An entry whose backend
cannot run here is skipped with the reason; the runnable ones share one executor (one worker process on a
GPU), so sglang is imported once rather than once per backend. Only the entries' backends are probed (their
answers read from the probe cache where this machine state gave them before) and only they are loaded in the
worker, which is launched before the probes so that its start-up overlaps them. An entry marked
``"expect": "fail"`` passes by failing with its recorded signature
(:func:`hicache_fuzz.harness.findings.reproducer.judge_replay`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hicache_fuzz.harness.findings.corpus import CorpusEntry
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.findings.known import detect_environment, entry_applies
from hicache_fuzz.harness.findings.reproducer import ReplayVerdict, judge_replay
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.pipeline.runner import NOT_RUN, explain_crash
from hicache_fuzz.harness.pipeline.setup import (
    ExecutionOptions,
    close_executors,
    executor_for,
    needs_worker,
    unavailable_reason,
)
from hicache_fuzz.kernels.registry import Registry


@dataclass
class Replayed:
    """One entry's replay: skipped (with the reason) or run (result, signature, verdict, seconds)."""

    entry: CorpusEntry
    case: Case  # as run: the entry's case, on the --backend override when one was given
    skipped: str = ""  # why it did not run ("" when it ran)
    result: Result | None = None
    signature: str = ""  # of the result when it is a failure
    verdict: ReplayVerdict | None = None
    seconds: float = 0.0


def replay_entries(entries: list[CorpusEntry], registry: Registry, machine: Machine, options: ExecutionOptions,
                   journal_dir: Path | None, backend: str | None = None,
                   on_replayed: Callable[[Replayed], None] | None = None) -> list[Replayed]:
    """Replay `entries` in order; `backend` runs every case on that backend instead (then each must pass).
    An expected failure whose scope excludes this machine must pass here. `on_replayed` sees each entry as
    soon as it is done."""
    environment = detect_environment(machine)
    replays = [Replayed(e, e.case if backend is None else e.case.replace(backend=backend)) for e in entries]
    names = sorted({r.case.backend for r in replays})
    # Only the entries' own backends are probed (through the probe cache) and handed to the worker, which
    # probes and loads nothing else. Where they need a worker it is launched first, so its imports overlap
    # the probes here.
    installed = [registry.get(name) for name in names if name in registry.backends]
    options = dataclasses.replace(options, worker_processes=1)  # cases run one at a time: one worker serves them
    early = executor_for(installed, registry, machine, options, journal_dir) if installed else None
    if early is not None:
        early.spawn_early()
    try:
        skip_reasons = {name: unavailable_reason(registry, name, machine) for name in names}
    except BaseException:
        close_executors([early] if early is not None else [])
        raise
    runnable = [registry.get(name) for name in names if not skip_reasons[name]]
    if early is not None and runnable and (needs_worker(runnable, options.isolate)
                                           == needs_worker(installed, options.isolate)):
        executor = early  # its worker, if any, also probes the unavailable ones; their entries are skipped
    else:  # nothing runs here, or the runnable ones run in process while the others would need a worker
        close_executors([early] if early is not None else [])
        executor = executor_for(runnable, registry, machine, options, journal_dir) if runnable else None
    try:
        for replay in replays:
            replay.skipped = skip_reasons[replay.case.backend]
            if not replay.skipped and executor is not None:
                expect = "fail" if backend is None and entry_applies(replay.entry, environment) else "pass"
                run = _explained(executor.run, registry, machine)
                _replay_one(replay, run, expect)
            if on_replayed is not None:
                on_replayed(replay)
    finally:
        close_executors([executor] if executor is not None else [])
    return replays


def _explained(run: Callable[[Case], Result], registry: Registry, machine: Machine) -> Callable[[Case], Result]:
    """`run`, with crashes and hangs given the plan and prediction the dead worker could not report."""
    return lambda case: explain_crash(run(case), registry.get(case.backend), case, machine.platform)


def _replay_one(replay: Replayed, run: Callable[[Case], Result], expect: str) -> None:
    started = time.perf_counter()
    result = run(replay.case)
    replay.seconds = round(time.perf_counter() - started, 3)
    if result.summary.startswith(NOT_RUN):  # e.g. its storages could not be allocated on this machine
        replay.skipped = result.summary
        return
    replay.result = result
    replay.signature = signature(result, replay.case) if result.outcome.is_failure else ""
    replay.verdict = judge_replay(expect, replay.entry.bug, result, replay.case,
                                  replay.entry.any_crash_is_its_bug)


def rerun_alone(case: Case, registry: Registry, machine: Machine, options: ExecutionOptions) -> Result:
    """Run `case` once more, alone, in a fresh executor of its own (a fresh worker where isolation applies):
    a failure that does not come back this way is flaky (order- or state-dependent), not a finding."""
    # one case: one worker, no pool or GPU sharing, and no spare (the case runs once; a crash is its result)
    one = dataclasses.replace(options, worker_processes=1, spare_workers=0)
    executor = executor_for([registry.get(case.backend)], registry, machine, one, None)
    try:
        return explain_crash(executor.run(case), registry.get(case.backend), case, machine.platform)
    finally:
        executor.close()
