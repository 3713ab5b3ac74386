"""Crash isolation: run cases in a persistent worker process; a dead or stuck worker becomes a result.

:class:`WorkerExecutor` is an :class:`~hicache_fuzz.harness.pipeline.executor_base.Executor`, as the in-process one is.
It starts ``python -m hicache_fuzz.harness.pipeline.worker_main`` and talks JSON lines over pipes: one request line per
case, one response line per result. The worker's own stdout is redirected to its stderr before any backend
is imported (sglang and nvcc print), so the protocol channel stays clean; stderr goes to
``<journal_dir>/worker.log``.

Write-ahead journal: before a case is sent, it is written to ``<journal_dir>/inflight/<case_id>.json``.
When the result comes back the file is removed. If the worker dies (illegal address, abort, a signal, an
exit), the case moves to ``<journal_dir>/crashes/`` and the result is a CRASH; if no result comes within
``timeout_s``, the worker's process group is killed, the case moves to ``<journal_dir>/hangs/`` and the
result is a HANG. The worker is restarted lazily on the next case, so a campaign goes on. A case left in
``inflight/`` after the parent itself died is the case that was running.

Worker startup (imports, sglang's ~12 s) has its own, longer timeout (``startup_timeout_s``).

Spare workers (``spares=N``; ``fuzz`` keeps 2 on a GPU): N more workers are started in the background as soon as the
first is up, and (with ``warm_up``) load the JIT modules of the backends' menus from the on-disk cache while the
campaign runs; where the campaign's JIT builder runs (``prebuild``, pipeline/prebuild.py) no worker warms up, each
loads the modules its cases need. When a case kills the worker, the oldest spare takes over at once and a new spare
starts behind it, so a crash costs the campaign about one case instead of an import of sglang plus JIT module loads
(tens of seconds on a GPU). Crashes come in runs (the JIT backends share a case space, so case i of sglang-jit and of
sglang-jit-register is often the same crashing case): one spare is not enough, the second crash of a run would wait
for a spare still starting. Time spares spend starting while the campaign runs is reported apart
(``background_startup_seconds``), not as campaign start-up.

Under MPS (``sharing``, pipeline/gpu_sharing.py: a pool's workers on one CUDA server) a crash that may have
spread (gpu_sharing.spreads: anything but a launch the driver refused) is first taken for a fault every client
saw: the pool falls back to plain contexts, workers that were MPS clients are replaced, and a case that died in
a batch but runs clean alone is recorded as collateral, not as a CRASH (a case that also dies alone is the
CRASH, as without MPS). Spares are therefore started on plain contexts while the pool is under MPS: such a fault
reaches every client at once, and spares that were clients too would all be replaced by workers still starting
(every worker's import and probe at once, tens of seconds with nothing running), while plain ones take over as
after any crash. A worker on a plain context beside the MPS server is not its client: its own fault ends only
itself. Until a restart the GPU runs the clients in the server's context and the spares idle.

A worker that dies at a case after returning results for others is no proof against that case (an earlier case
may have corrupted the process): the case runs once more in a fresh worker, and that result is the case's
(``_death_in_fresh_worker``).

Standing workers (pipeline/standing.py): where ``hicache-fuzz workers start`` keeps ready workers for this
platform, every spawn (the first worker, spares, restarts) first asks that server for one whose key matches what a
fresh worker would run under. A worker handed over is told to write to this executor's log from then on and greets
again; from there it is driven exactly as a worker spawned here, its exit status read from the server. Without a
server, or with none it may use, the worker is spawned here as before.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import FRESH_WORKER_KEY, HISTORY_KEY, Outcome, Result
from hicache_fuzz.harness.pipeline import probe_cache
from hicache_fuzz.harness.pipeline.executor_base import Executor, RunFigures, WorkerFigures
from hicache_fuzz.harness.pipeline.gpu_sharing import Collateral, GpuSharing, spreads
from hicache_fuzz.harness.pipeline.prebuild import Prebuild
from hicache_fuzz.harness.pipeline.standing import StandingWorker, close_standing, take

LOG_TAIL_BYTES = 4000
# Cases a worker ran last, kept for a crash that does not come back in a fresh worker: the culprit is among them.
HISTORY_KEPT = 8
# Spare workers `fuzz` keeps on a GPU: runs of crashes are two or three cases long (see the module docstring).
GPU_SPARE_WORKERS = 2
# What a worker imports to run the real kernels and its parent need not: the start-up record says which of them
# the parent had imported by the first worker's greeting (the probe cache keeps sglang out of the parent).
WORKER_ONLY_PACKAGES = ("sglang", "sgl_kernel", "transformers")
STANDING_NOTES_KEPT = 5  # distinct reasons a worker was not taken from the standing pool, for the report
# A worker process: spawned here, or handed over by the standing pool's server (driven alike).
WorkerProcess: TypeAlias = "subprocess.Popen[bytes] | StandingWorker"


def worker_command(python: str, platform_kind: str, backend_names: Sequence[str], plugins: Sequence[str],
                   warm_up: bool) -> list[str]:
    """The command line of a worker process (the standing pool's server starts its workers with it too)."""
    args = [python, "-m", "hicache_fuzz.harness.pipeline.worker_main", "--platform", platform_kind]
    for name in backend_names:
        args += ["--backend", name]
    for plugin in plugins:
        args += ["--backend-plugin", plugin]
    if warm_up:
        args.append("--warm-up")
    return args


class WorkerError(RuntimeError):
    """The worker could not be started (bad backend name, platform missing): not a finding. Raised from a
    batch, it carries the results the batch did produce (`partial_results`, in case order), so a crash that
    came before the failed restart is still reported."""

    def __init__(self, *args: object, partial_results: list[Result] | None = None) -> None:
        super().__init__(*args)
        self.partial_results: list[Result] = list(partial_results or [])


class WorkerExecutor(Executor):
    """Runs cases in a persistent subprocess; crashes and hangs become CRASH / HANG results."""

    runs_batches = True

    def __init__(
        self,
        backend_names: Sequence[str],
        plugins: Sequence[str] = (),
        platform_kind: str = "cpu",
        timeout_s: float = 60.0,
        journal_dir: str | os.PathLike[str] = "worker-journal",
        startup_timeout_s: float = 300.0,
        warm_up: bool = False,
        python: str | None = None,
        env: dict[str, str] | None = None,
        spares: int = 0,
        sharing: GpuSharing | None = None,
        prebuild: Prebuild | None = None,
    ) -> None:
        self.backend_names = list(backend_names)
        self.plugins = list(plugins)
        self.platform_kind = platform_kind
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.warm_up = warm_up
        self.python = python or sys.executable
        self.env = env
        self.sharing = sharing
        self.prebuild = prebuild  # the JIT builder process this executor owns (closed with it), if any
        self._generation: dict[int, int] = {}  # pid -> sharing.generation when that worker was spawned
        self._plain: set[int] = set()  # pids spawned on a plain context while the pool was under MPS (spares)
        self.journal = Path(journal_dir)
        for sub in ("inflight", "crashes", "hangs"):
            (self.journal / sub).mkdir(parents=True, exist_ok=True)
        self.log_path = self.journal / "worker.log"
        self.spares = spares
        self._proc: WorkerProcess | None = None
        self._buffer = b""
        self._spares: list[tuple[WorkerProcess, float]] = []  # started (oldest first), hello unread
        self._early: WorkerProcess | None = None  # the first worker, spawned early, hello unread
        self.restarts = 0  # workers that took over after the first
        self.started = 0
        self.spares_used = 0  # restarts served by a spare
        self.standing_taken = 0  # workers handed over by the standing pool's server
        self.first_standing = False  # the first worker that greeted came from the standing pool
        self.standing_notes: list[str] = []  # why workers were not taken from a standing pool that was asked
        self.hello: dict[str, Any] = {}  # the worker's greeting: probes, warm-up seconds
        # WORKER_ONLY_PACKAGES this (parent) process had imported when the first worker greeted (start-up record)
        self.parent_imports_at_ready: list[str] | None = None
        self.compile_seconds = 0.0  # reported by workers: JIT compile time inside cases (and warm-up)
        # modules first needed inside a case (not by a warm-up): key -> (processes that needed it, seconds)
        self.compiled_in_cases: dict[str, tuple[int, float]] = {}
        self.startup_seconds = 0.0  # waited for workers to start (on the caller's clock)
        self.background_startup_seconds = 0.0  # spares starting while cases ran (off the caller's clock)
        self.stage_seconds: dict[str, float] = {}  # per pipeline stage, summed over batches (worker's clock)
        self.batch_seconds = 0.0  # round trips of batches (parent's clock)
        self.batch_losses = 0  # batches a worker died or hung in
        self.replayed = 0  # cases replayed alone after a lost batch, or after a death in a used worker
        # the last cases the current worker process returned results for, oldest first
        self._worker_history: deque[Case] = deque(maxlen=HISTORY_KEPT)
        self.reuse_storages = False  # batches ask the worker to reuse storages across same-geometry cases
        self.storages_reused = 0  # cases that ran on storages kept from the case before them (worker's count)

    def enable_storage_reuse(self) -> None:
        """Let batched cases of one geometry share storages in the worker (pipeline/reuse.py); cases replayed
        alone always get fresh ones."""
        self.reuse_storages = True

    # ---- public API ---------------------------------------------------------------------------------------
    def run(self, case: Case) -> Result:
        self._ensure_started()
        under_mps = self._is_mps_client()
        result = self._run_once(case)
        if not self._left_mps_after(under_mps, result.outcome, result.error or "",
                                    f"case {case.case_id} ({case.backend}) lost its worker"):
            return result
        alone = self._run_once(case)  # on a plain context now
        if alone.outcome is Outcome.CRASH:
            return alone
        self._record_collateral(case, result.error or "", alone, str((result.diff or {}).get("saved_case", "")))
        return alone

    def _run_once(self, case: Case) -> Result:
        self._ensure_started()
        history, under_mps = list(self._worker_history), self._is_mps_client()
        inflight = self.journal / "inflight" / f"{case.case_id}.json"
        inflight.write_text(case.to_json(indent=2))
        started = time.perf_counter()
        try:
            self._send({"op": "run", "case": case.to_dict()})
            reply = self._receive(self.timeout_s)
        except _WorkerDied as died:
            lost = self._lost(case, inflight, Outcome.CRASH, died.describe(), started)
            return self._death_in_fresh_worker(case, lost, history) if history and not under_mps else lost
        except _WorkerTimeout:
            self._kill()
            return self._lost(
                case, inflight, Outcome.HANG, f"no result within {self.timeout_s:g} s; worker killed", started
            )
        self._account(reply)
        if "fatal" in reply:  # a device error escaped the runner: the worker's context is unusable, it exits
            self._kill()
            return self._lost(
                case, inflight, Outcome.CRASH, f"device error escaped the case: {reply['fatal']}", started
            )
        inflight.unlink(missing_ok=True)
        if "error" in reply:  # the harness itself failed on this case (not the backend): keep it visible
            raise RuntimeError(f"worker failed on case {case.case_id}: {reply['error']}")
        self._worker_history.append(case)
        return Result.from_dict(reply["result"])

    def _death_in_fresh_worker(self, case: Case, lost: Result, history: list[Case]) -> Result:
        """A worker that died at `case` after returning results for other cases is not proof against `case`: a
        case before it may have corrupted the process (an out-of-bounds host copy that a later call trips over),
        and one bug ends a long-lived worker by SIGSEGV where, alone, it raises a CUDA error. So the case runs
        once more in a fresh worker, and what it does there names it. A device error the worker reports
        ("fatal") is the case's own launch, and a hang costs its timeout again: neither is replayed. A case that
        runs clean in the fresh worker is still reported as the crash (nothing is lost), saying so, with that
        run's outcome under FRESH_WORKER_KEY (the campaign lists it as flaky: Result.flaky) and the cases its
        worker ran just before it under HISTORY_KEY, among which is what corrupted it."""
        self._kill()
        self.replayed += 1
        alone = self._run_once(case)
        if alone.outcome in (Outcome.CRASH, Outcome.HANG):
            return alone
        return _kept_failure(case, Outcome.CRASH, lost.error or "worker died", alone.outcome, history,
                             "at this case after other cases in the same worker", lost.diff)

    def run_batch(self, cases: Sequence[Case], lone_first: int = 0) -> list[Result]:
        """Results of `cases`, in order. The first `lone_first` (the scale tier's) run first, each as a batch of
        its own, then the rest in one round trip (see _round_trip); a WorkerError from the rest carries the lone
        cases' results in front of what that round trip produced."""
        results: list[Result] = []
        for case in cases[:lone_first]:
            results += self._round_trip([case])
        rest = cases[lone_first:]
        if not lone_first:
            return self._round_trip(rest)
        if not rest:
            return results
        try:
            return results + self._round_trip(rest)
        except WorkerError as exc:  # keep the lone cases' results in front of what the batch produced
            raise WorkerError(str(exc), partial_results=results + list(exc.partial_results)) from None

    def _round_trip(self, cases: Sequence[Case]) -> list[Result]:
        """Run `cases` in one round trip; results in order. The whole batch is journaled (one JSON-lines file)
        before it is sent. If the worker dies or hangs at case k, cases before k keep their results and cases
        k.. are replayed one at a time in a fresh worker (a spare), each with its own journal entry, so the
        case that kills a worker alone is named by its own CRASH/HANG result. A case that killed the batch but
        runs clean alone is still reported as a CRASH/HANG (nothing is lost), saying it did not reproduce."""
        if len(cases) <= 1:
            return [self.run(case) for case in cases]
        self._ensure_started()
        batch_file = self.journal / "inflight" / f"batch-{cases[0].case_id}-{len(cases)}.jsonl"
        lines = [case.wire_json for case in cases]  # the journal's lines and the message's cases
        batch_file.write_text("".join(line + "\n" for line in lines))
        results: list[Result] = []
        started = time.perf_counter()
        lost: tuple[Outcome, str] | None = None
        under_mps = self._is_mps_client()
        try:
            self._send_text(f'{{"op": "batch", "reuse": {json.dumps(self.reuse_storages)}, "cases": '
                            f'[{",".join(lines)}]}}')
            while len(results) < len(cases):
                reply = self._receive(self.timeout_s)
                self._account(reply)
                if "fatal" in reply:
                    lost = (Outcome.CRASH, f"device error escaped the case: {reply['fatal']}")
                    break
                if "error" in reply:
                    batch_file.unlink(missing_ok=True)
                    failed = cases[len(results)]
                    raise RuntimeError(f"worker failed on case {failed.case_id}: {reply['error']}")
                results.append(Result.from_dict(reply["result"]))
                self._worker_history.append(cases[len(results) - 1])
            if lost is None:
                done = self._receive(self.timeout_s)
                for stage, seconds in done.get("stages", {}).items():
                    self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + float(seconds)
                self.storages_reused += int(done.get("reused", 0))
        except _WorkerDied as died:
            lost = (Outcome.CRASH, died.describe())
        except _WorkerTimeout:
            lost = (Outcome.HANG, f"no result within {self.timeout_s:g} s; worker killed")
        self.batch_seconds += time.perf_counter() - started
        if lost is None:
            batch_file.unlink(missing_ok=True)
            return results
        history = list(self._worker_history)  # before the replays restart the worker
        self._kill()
        self.batch_losses += 1
        (self.journal / "crashes").mkdir(exist_ok=True)
        batch_file.replace(self.journal / "crashes" / batch_file.name)  # the whole batch, for the record
        collateral = self._left_mps_after(under_mps, lost[0], lost[1],
                                          f"a batch at case {cases[len(results)].case_id} lost its worker")
        for number, case in enumerate(cases[len(results):]):
            try:
                alone = self._run_once(case)  # fresh worker (no longer an MPS client), own journal entry
            except WorkerError as exc:  # no worker can start: keep what the batch found, then give up
                if number == 0:
                    outcome, detail = lost
                    culprit = Result(case.case_id, case.backend, outcome)
                    culprit.error, culprit.summary = detail, f"worker died in a batch at this case: {detail}"
                    results.append(culprit)
                raise WorkerError(str(exc), partial_results=results) from None
            self.replayed += 1
            if number == 0 and collateral and alone.outcome not in (Outcome.CRASH, Outcome.HANG):
                # Died in a batch under MPS, clean alone on a context of its own: another client's fault.
                self._record_collateral(case, lost[1], alone, str(self.journal / "crashes" / batch_file.name))
            elif number == 0 and alone.outcome not in (Outcome.CRASH, Outcome.HANG):
                # It died in the batch but not alone: keep the batch's verdict, and say so.
                alone = _kept_failure(case, lost[0], lost[1], alone.outcome, history, "in a batch at this case",
                                      {"saved_batch": str(self.journal / "crashes" / batch_file.name)})
            results.append(alone)
        return results

    def run_figures(self) -> RunFigures:
        return RunFigures(stage_seconds=dict(self.stage_seconds), batch_losses=self.batch_losses,
                          cases_replayed_alone=self.replayed, storages_reused=self.storages_reused,
                          worker_processes=self.size)

    def worker_figures(self) -> WorkerFigures:
        return WorkerFigures(compile_seconds=self.compile_seconds, startup_seconds=self.startup_seconds,
                             background_startup_seconds=self.background_startup_seconds, restarts=self.restarts,
                             spares_used=self.spares_used, compiled_in_cases=dict(self.compiled_in_cases),
                             hello=self.hello, parent_imports_at_ready=self.parent_imports_at_ready,
                             standing_taken=self.standing_taken, first_worker_standing=self.first_standing,
                             standing_notes=tuple(self.standing_notes))

    def _account(self, reply: dict[str, Any]) -> None:
        self.compile_seconds += float(reply.get("compile_s", 0.0))
        for key, seconds in reply.get("compiled", {}).items():  # which modules cases had to build or load
            count, total = self.compiled_in_cases.get(key, (0, 0.0))
            self.compiled_in_cases[key] = (count + 1, total + float(seconds))

    def start(self) -> None:
        """Start the worker now (probe, warm-up) instead of at the first case, e.g. before a campaign clock."""
        self._ensure_started()

    def spawn_early(self) -> None:
        """Launch the first worker process now without waiting for it: its imports and JIT module loads then
        overlap with whatever the caller does next (the parent's own probes); the first case, or start(),
        waits for its greeting."""
        if self._proc is None and self._early is None and not self.started:
            self._early = self._spawn(self.warm_up, "first")

    def close(self) -> None:
        if self.prebuild is not None:
            self.prebuild.close()
        if self._early is not None:
            _kill_group(self._early)
            _close_streams(self._early)
            self._early = None
        spares, self._spares = self._spares, []
        for spare, _ in spares:
            _kill_group(spare)
            _close_streams(spare)
        proc = self._proc
        self._proc = None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin:
                proc.stdin.write(b'{"op": "exit"}\n')
                proc.stdin.flush()
                proc.wait(timeout=10)
        except Exception:
            pass
        if proc.poll() is None:
            _kill_group(proc)
        _close_streams(proc)

    def __enter__(self) -> WorkerExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- process management -----------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._proc is not None and self._stale(self._proc):  # an MPS client after the fall-back: replace it
            self._kill()
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:
            self._proc = None
        try:
            self._start()
        except WorkerError as exc:
            # A worker that cannot start as an MPS client (its server gone, a connection refused): the pool leaves
            # MPS and this start is tried once more on a plain context; a second failure is the worker's own.
            if self.sharing is None or not self.sharing.fall_back(f"a worker did not start as an MPS client: {exc}"):
                raise
            self._start()

    def _left_mps_after(self, under_mps: bool, outcome: Outcome, error: str, where: str) -> bool:
        """Whether a worker lost as an MPS client (`outcome`, `error`) may have been another client's fault; if
        so the pool falls back to plain contexts (the one place that decides it) and True is returned, so the
        caller replays alone and counts a clean replay as collateral."""
        if not (under_mps and outcome is Outcome.CRASH and self.sharing is not None and spreads(error)):
            return False
        self.sharing.fall_back(f"{where}: {error}")
        return True

    def _is_mps_client(self) -> bool:
        """Whether the current worker was spawned as a client of the pool's MPS server."""
        return (self.sharing is not None and self._proc is not None and self.sharing.mps
                and self._proc.pid not in self._plain
                and self._generation.get(self._proc.pid) == self.sharing.generation)

    def _stale(self, proc: WorkerProcess) -> bool:
        """A worker spawned under a sharing mode the pool has since left (an MPS client after the fall-back); one
        on a plain context never is."""
        return (self.sharing is not None and proc.pid not in self._plain
                and self._generation.get(proc.pid, 0) != self.sharing.generation)

    def _record_collateral(self, case: Case, lost: str, alone: Result, saved: str) -> None:
        assert self.sharing is not None
        self.sharing.record_collateral(Collateral(case.case_id, case.backend, lost.splitlines()[0] if lost else "",
                                                  alone.outcome.value, saved))

    def _spawn(self, warm_up: bool, role: str) -> WorkerProcess:
        plain = role == "spare" and self.sharing is not None and self.sharing.mps  # module docstring
        if self.sharing is None:
            env = dict(os.environ if self.env is None else self.env)
        else:
            env = self.sharing.plain_env(self.env) if plain else self.sharing.worker_env(self.env)
        standing = self._take_standing(env, warm_up, role)
        if standing is not None:
            if plain:
                self._plain.add(standing.pid)
            return standing
        env.setdefault("PYTHONUNBUFFERED", "1")
        args = worker_command(self.python, self.platform_kind, self.backend_names, self.plugins, warm_up)
        try:  # no log file or no process (full disk, no memory, missing interpreter): the machine, not a finding
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
            with log:
                log.write(f"\n==== worker start ({role}) {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
                )
                if self.sharing is not None:
                    self._generation[proc.pid] = self.sharing.generation
                if plain:
                    self._plain.add(proc.pid)
                return proc
        except OSError as exc:
            raise WorkerError(f"worker did not start: {exc.strerror or exc} ({exc.filename or args[0]})") from None

    def _take_standing(self, env: dict[str, str], warm_up: bool, role: str) -> StandingWorker | None:
        """A ready worker from the standing pool, told to log to this executor's log (with what it logged while it
        started) and to greet again, warmed up if `warm_up`; None when none may be taken (the reason is kept)."""
        taken = take(self.python, self.platform_kind, self.backend_names, self.plugins, env, role)
        if taken.note and taken.note not in self.standing_notes and len(self.standing_notes) < STANDING_NOTES_KEPT:
            self.standing_notes.append(taken.note)
        worker = taken.worker
        if worker is None:
            return None
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"\n==== worker start ({role}) {time.strftime('%Y-%m-%d %H:%M:%S')}: pid {worker.pid} "
                          f"from the standing pool (server pid {worker.server_pid}); the end of its start-up log "
                          f"{worker.startup_log}: ====\n".encode())
                log.write(_tail(Path(worker.startup_log)).encode() + b"\n==== handed over ====\n")
            assert worker.stdin is not None
            worker.stdin.write(json.dumps({"op": "adopt", "log": os.path.abspath(self.log_path), "warm_up": warm_up,
                                           "backends": self.backend_names}).encode() + b"\n")
            worker.stdin.flush()
        except OSError as exc:  # its pipe or our log: a fresh worker instead (its own start says what is wrong)
            note = f"a worker from the standing pool could not be adopted: {exc}"
            if note not in self.standing_notes and len(self.standing_notes) < STANDING_NOTES_KEPT:
                self.standing_notes.append(note)
            _kill_group(worker)
            _close_streams(worker)
            return None
        self.standing_taken += 1
        if self.sharing is not None:
            self._generation[worker.pid] = self.sharing.generation
        return worker

    def _start(self) -> None:
        started = time.perf_counter()
        spare_spawned: float | None = None
        early, self._early = self._early, None
        if early is not None and self._stale(early):
            _kill_group(early)
            _close_streams(early)
            early = None
        if early is not None and early.poll() is None:
            self._proc = early
        elif early is not None:
            _close_streams(early)  # it died before its greeting: start another below (its log says why)
            early = None
        while early is None and self._spares and spare_spawned is None:
            spare, spawned = self._spares.pop(0)
            if self._stale(spare):  # an MPS client spawned before the fall-back
                _kill_group(spare)
                _close_streams(spare)
            elif spare.poll() is None:
                self._proc, spare_spawned = spare, spawned
                self.spares_used += 1
            else:  # a spare that died while waiting (its log says why) is dropped
                _close_streams(spare)
        if spare_spawned is None and early is None:
            # Only the first worker compiles the menus; a restart without a spare loads modules as cases need them.
            self._proc = self._spawn(self.warm_up and not self.started, "restart" if self.started else "first")
        self._buffer = b""
        self._worker_history.clear()
        if self.started:
            self.restarts += 1
        self.started += 1
        try:
            hello = self._receive(self.startup_timeout_s)
        except (_WorkerDied, _WorkerTimeout, ValueError) as exc:  # ValueError: it printed something not JSON
            self._kill()
            detail = "startup timed out" if isinstance(exc, _WorkerTimeout) else (
                exc.describe() if isinstance(exc, _WorkerDied) else f"unreadable greeting ({exc})")
            raise WorkerError(f"worker did not start: {detail}") from None
        if not isinstance(hello, dict) or hello.get("op") != "hello":
            self._kill()
            detail = hello.get("error", hello) if isinstance(hello, dict) else hello
            raise WorkerError(f"worker did not start: {detail}")
        stale = probe_cache.contradictions(hello.get("probes") or {})
        if stale:  # the parent chose backends on a cached answer this worker's own probe contradicts
            self._kill()
            raise WorkerError("; ".join(stale))
        self.hello = hello
        if self.parent_imports_at_ready is None:  # the first greeting: what this process had imported by then
            self.parent_imports_at_ready = [name for name in WORKER_ONLY_PACKAGES if name in sys.modules]
            self.first_standing = isinstance(self._proc, StandingWorker)
        waited = time.perf_counter() - started
        self.startup_seconds += waited
        if spare_spawned is not None:
            # Its start-up and module loads ran while cases did; only the wait for its hello was on the clock.
            self.background_startup_seconds += max(0.0, started - spare_spawned)
        else:
            self.compile_seconds += float(hello.get("warm_up_s", 0.0))
        while len(self._spares) < self.spares:
            # Spares load the menus' JIT modules (compiled by now, so from the disk cache) while cases run.
            self._spares.append((self._spawn(self.warm_up, "spare"), time.perf_counter()))

    def _kill(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc)
            _close_streams(self._proc)
        self._proc = None

    def _send(self, message: dict[str, Any]) -> None:
        self._send_text(json.dumps(message))

    def _send_text(self, line: str) -> None:
        """One protocol line (JSON text without a newline)."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerDied(self._proc, self.log_path) from None

    def _receive(self, timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        # A poll object: no descriptor of its own to open and close per reply (an epoll selector has one), and
        # a reply is read per case.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _WorkerTimeout()
            if not poller.poll(max(1, math.ceil(left * 1000))):
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                proc.wait(timeout=10)
                raise _WorkerDied(proc, self.log_path)
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _lost(self, case: Case, inflight: Path, outcome: Outcome, detail: str, started: float) -> Result:
        folder = "crashes" if outcome is Outcome.CRASH else "hangs"
        saved = self.journal / folder / f"{case.case_id}.json"
        if inflight.exists():
            inflight.replace(saved)
        else:
            saved.write_text(case.to_json(indent=2))
        result = Result(case.case_id, case.backend, outcome)
        result.error = detail
        result.summary = f"worker {'died' if outcome is Outcome.CRASH else 'hung'}: {detail.splitlines()[0]}"
        result.diff = {"saved_case": str(saved)}
        result.seconds = time.perf_counter() - started
        self._kill()  # a dead worker: reap it, close its pipes, and kill what it left running (nvcc)
        return result


class _WorkerTimeout(Exception):
    pass


class _WorkerDied(Exception):
    def __init__(self, proc: WorkerProcess, log_path: Path) -> None:
        super().__init__()
        self.returncode = proc.poll()
        self.status_lost = isinstance(proc, StandingWorker) and proc.status_lost
        self.log_tail = _tail(log_path)

    def describe(self) -> str:
        code = self.returncode
        if code is None and self.status_lost:
            how = "worker closed its pipe; its exit status was lost with the standing pool's server"
        elif code is None:
            how = "worker closed its pipe"
        elif code < 0:
            try:
                how = f"worker killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"worker killed by signal {-code}"
        else:
            how = f"worker exited with status {code}"
        return how + (f"\n--- worker log tail ---\n{self.log_tail}" if self.log_tail else "")


def _kept_failure(case: Case, outcome: Outcome, detail: str, ran_alone: Outcome, history: Sequence[Case],
                  where: str, diff: dict[str, Any]) -> Result:
    """The verdict kept for a case whose worker died or hung at it (`where`) but which ran `ran_alone` in a fresh
    worker: still the crash or hang (nothing found is lost), its summary saying how it ran alone, its diff holding
    that outcome (FRESH_WORKER_KEY: the campaign lists it as flaky) and the cases the worker ran before it
    (HISTORY_KEY: what may have corrupted the worker is among them)."""
    kept = Result(case.case_id, case.backend, outcome)
    kept.error = detail
    verb = "died" if outcome is Outcome.CRASH else "hung"
    kept.summary = f"worker {verb} {where}; in a fresh worker it ran {ran_alone.value}: {detail.splitlines()[0]}"
    kept.diff = {**diff, FRESH_WORKER_KEY: ran_alone.value, HISTORY_KEY: [earlier.to_dict() for earlier in history]}
    return kept


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _close_streams(proc: WorkerProcess) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream:
            stream.close()
    close_standing(proc)  # a handed-over worker's connection to the server


def _kill_group(proc: WorkerProcess) -> None:
    """Kill the worker and anything it started (nvcc), by its own process group id."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


if __name__ == "__main__":  # the worker process's entry point lives in worker_main
    from hicache_fuzz.harness.pipeline.worker_main import serve

    sys.exit(serve())
