"""What a mutant runs against: the harness's own fuzz campaign, or any test command.

Every target runs in its own process group with a wall-clock limit; on timeout the whole group is killed
(SIGTERM, then SIGKILL), so a mutant that hangs a kernel never outlives its slot. Outcomes:

* ``killed``: the target noticed (campaign: a new failure on an sglang backend; command: non-zero exit);
* ``survived``: it did not;
* ``timeout``: the limit ran out (a hang caused by the mutant: scored as killed, listed apart);
* ``build_error``: the mutated source did not build or import (sglang's JIT raised "Failed to build JIT
  module", a Python syntax error, an sglang backend vanished); left out of the score;
* ``error``: the target itself misbehaved (usage error, missing environment); left out of the score.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_BUILD_ERROR_PATTERN = (r"Failed to build JIT module|ninja: build stopped|nvcc fatal|\.cuh\(\d+\): error|"
                               r"\.cuh:\d+:\d+: error|SyntaxError|IndentationError")
OUTCOMES = ("killed", "timeout", "survived", "build_error", "error")
_TAIL_CHARS = 4000


@dataclass
class TargetResult:
    outcome: str
    seconds: float
    returncode: int | None
    detail: str = ""
    failures: list[dict[str, Any]] = field(default_factory=list)  # campaign: the new sglang failure classes
    log: str = ""  # where the full output is
    output_tail: str = ""
    paths: dict[str, int] = field(default_factory=dict)  # campaign: implementation path -> cases, all backends

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Stopped(Exception):
    """The run is being stopped (SIGTERM/SIGINT): a target's result must not be recorded."""


_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


def stop_all() -> None:
    """Kill the process group of every running target and refuse new ones (on SIGTERM/SIGINT)."""
    _stopping.set()
    with _live_lock:
        running = list(_live)
    # All at once: with --jobs-per-gpu, dozens of targets run; one grace period after another would outlast the
    # caller's own time limit (and leave targets that started their own session orphaned).
    threads = [threading.Thread(target=_kill_group, args=(process,), daemon=True) for process in running]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30.0)


def stopping() -> bool:
    return _stopping.is_set()


@dataclass
class ProcessRun:
    returncode: int | None  # None: killed on timeout
    seconds: float
    output: str


def run_process(command: list[str] | str, env: dict[str, str], timeout: float, log_path: Path,
                cwd: Path | None = None) -> ProcessRun:
    """Run in a new session (its own process group); kill the group on timeout. Output goes to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        with _live_lock:
            if _stopping.is_set():
                raise Stopped()
            process = subprocess.Popen(command, shell=isinstance(command, str), env=env, cwd=cwd, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            _live.add(process)
        try:
            returncode: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
            _kill_group(process)
        finally:
            with _live_lock:
                _live.discard(process)
    if _stopping.is_set():
        raise Stopped()
    seconds = time.monotonic() - started
    return ProcessRun(returncode, seconds, log_path.read_text(encoding="utf-8", errors="replace"))


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc), including those that started their own session: the
    campaign's crash-isolation workers do, so killing the target's process group alone would orphan them
    (and a worker stuck in a hung kernel would hold the slot's GPU)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def _signal(pids: list[int], groups: list[int], sig: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the target's process group and every descendant (then SIGKILL after a grace period): the fuzz
    campaign uses the grace to end its case in flight, write its report and stop its workers."""
    descendants = _descendants(process.pid)
    own = os.getpgrp()  # never our own group (a descendant could only be in it by joining it on purpose)
    groups = sorted({process.pid, *(g for g in map(_process_group, descendants) if g > 0)} - {own})
    _signal(descendants, groups, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)
    descendants = sorted(set(descendants) | set(_descendants(process.pid)))
    _signal(descendants, groups, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


def _process_group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return -1


class CommandTarget:
    """Any command (run through the shell): non-zero exit kills the mutant."""

    def __init__(self, name: str, command: str, build_pattern: str = DEFAULT_BUILD_ERROR_PATTERN) -> None:
        self.name = name
        self.command = command
        self.build_pattern = re.compile(build_pattern)

    def describe(self) -> dict[str, Any]:
        return {"kind": "test-cmd", "command": self.command}

    def run(self, env: dict[str, str], run_dir: Path, timeout: float, baseline: bool = False) -> TargetResult:
        done = run_process(self.command, env, timeout, run_dir / f"{self.name}.log", cwd=Path.cwd())
        tail = done.output[-_TAIL_CHARS:]
        log = str(run_dir / f"{self.name}.log")
        if done.returncode is None:
            return TargetResult("timeout", done.seconds, None, f"no exit within {timeout:.0f} s", log=log,
                                output_tail=tail)
        if done.returncode == 0:
            return TargetResult("survived", done.seconds, 0, "exit 0", log=log, output_tail=tail)
        build = self.build_pattern.search(done.output)
        if build:
            return TargetResult("build_error", done.seconds, done.returncode, f"build failure: {build.group()}",
                                log=log, output_tail=tail)
        return TargetResult("killed", done.seconds, done.returncode, f"exit {done.returncode}", log=log,
                            output_tail=tail)


class CampaignTarget:
    """`hicache-fuzz fuzz` on the mutated sglang: killed = exit 1 with a new failure on an sglang backend."""

    def __init__(self, name: str, platform: str, seconds: float, seed: int, fuzz_args: list[str],
                 build_pattern: str = DEFAULT_BUILD_ERROR_PATTERN, stop_at_kill: bool = True) -> None:
        self.name = name
        # A mutant's campaign ends at its first new failure (fuzz --stop-on-new-failure): that failure decides
        # the verdict, and the rest of the clock would only burn the cores other mutants need. The unmutated
        # baseline always runs its whole clock: every failure clean sglang shows must be found there.
        self.stop_at_kill = stop_at_kill
        self.platform = platform
        self.seconds = seconds
        self.seed = seed
        self.fuzz_args = fuzz_args
        self.build_pattern = re.compile(build_pattern)
        self.baseline_backends: set[str] | None = None  # sglang backends the unmutated run had
        # The unmutated run's failures ({signature: its variants}) and its case count: a KNOWN failure class
        # that shows a variant the unmutated run never did is the mutant's doing (see masked_by_known)
        self.baseline_variants: dict[str, set[str]] | None = None
        self.baseline_cases = 0
        self.extra_known: list[Path] = []  # the unmutated run's own failures, when accepted (--baseline-failures)

    def describe(self) -> dict[str, Any]:
        return {"kind": "campaign", "platform": self.platform, "seconds": self.seconds, "seed": self.seed,
                "fuzz_args": self.fuzz_args, "stop_at_kill": self.stop_at_kill}

    def command(self, report: Path, corpus: Path, baseline: bool = False) -> list[str]:
        stop = ["--stop-on-new-failure"] if self.stop_at_kill and not baseline else []
        return [sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", self.platform,
                "--max-total-time", str(self.seconds), "--seed", str(self.seed), "--json", str(report),
                "--corpus", str(corpus), *stop, *self.fuzz_args,
                *(a for path in self.extra_known for a in ("--known", str(path)))]

    def run(self, env: dict[str, str], run_dir: Path, timeout: float, baseline: bool = False) -> TargetResult:
        result = self._run(env, run_dir, timeout, baseline)
        result.paths = _paths_run(read_report(run_dir / f"{self.name}.json")) if result.outcome != "timeout" else {}
        return result

    def _run(self, env: dict[str, str], run_dir: Path, timeout: float, baseline: bool) -> TargetResult:
        report_path = run_dir / f"{self.name}.json"
        report_path.unlink(missing_ok=True)
        done = run_process(self.command(report_path, run_dir / f"{self.name}-corpus", baseline), env, timeout,
                           run_dir / f"{self.name}.log")
        log = str(run_dir / f"{self.name}.log")
        tail = done.output[-_TAIL_CHARS:]
        if done.returncode is None:
            return TargetResult("timeout", done.seconds, None, f"no exit within {timeout:.0f} s", log=log,
                                output_tail=tail)
        report = read_report(report_path)
        backends = {b for b in report.get("backends", []) if b.startswith("sglang")}
        new = [f for f in report.get("unique_failures", []) if not f.get("known")]
        sglang_failures = [f for f in new if str(f.get("backend", "")).startswith("sglang")]
        kept = [_kept(f) for f in sglang_failures]
        if done.returncode not in (0, 1) or not report:
            why = f"fuzz exited {done.returncode}" + ("" if report else " without a JSON report")
            build = self.build_pattern.search(done.output)
            outcome = "build_error" if build else "error"
            return TargetResult(outcome, done.seconds, done.returncode, why, log=log, output_tail=tail)
        build_texts = [str(f.get("summary", "")) for f in sglang_failures]
        build = next((m for m in map(self.build_pattern.search, build_texts) if m), None)
        if build is not None:
            return TargetResult("build_error", done.seconds, done.returncode, f"build failure: {build.group()}",
                                kept, log, tail)
        missing = sorted((self.baseline_backends or set()) - backends)
        if missing:
            return TargetResult("build_error", done.seconds, done.returncode,
                                f"sglang backend(s) unavailable under this mutant: {', '.join(missing)}",
                                kept, log, tail)
        if done.returncode == 1 and sglang_failures:
            first = sglang_failures[0]
            return TargetResult("killed", done.seconds, 1,
                                f"{len(sglang_failures)} new failure class(es), first {first.get('signature')}",
                                kept, log, tail)
        masked = masked_by_known(report, self.baseline_variants, self.baseline_cases)
        if masked:
            first = masked[0]
            kept = [{**_kept(f), "masked_by_known": f.get("known"), "new_variants": f["new_variants"]}
                    for f in masked]
            return TargetResult("killed", done.seconds, done.returncode,
                                f"{len(masked)} known failure class(es) with variants the unmutated run never "
                                f"showed, first {first.get('signature')} (masked by --known {first.get('known')})",
                                kept, log, tail)
        if done.returncode == 1:
            return TargetResult("error", done.seconds, 1, "exit 1 without a new failure on an sglang backend",
                                kept, log, tail)
        return TargetResult("survived", done.seconds, 0, f"{report.get('cases', 0)} cases, no new failure",
                            kept, log, tail)


def _kept(failure: dict[str, Any]) -> dict[str, Any]:
    """What a mutant's record keeps of one campaign failure."""
    return {k: failure.get(k) for k in ("signature", "backend", "outcome", "count", "first_case_id", "file",
                                        "summary")}


def masked_by_known(report: dict[str, Any], baseline_variants: dict[str, set[str]] | None,
                    baseline_cases: int) -> list[dict[str, Any]]:
    """Known failures on an sglang backend that show a variant the unmutated run did not, each with
    ``new_variants``.

    A bug identity deliberately folds some differences into one bug (every valid input a path rejects is one
    bug, whatever check fired), so a mutant that makes a path reject valid input in a new way can land on
    the identity of a known bug and pass as "known" (mutant e0d98c28a365: an empty MLA staging buffer made
    the staged write-back reject its input at another check, under the identity of sglang's known
    CUDA-host-index rejection). Each identity keeps a variant per distinct cause detail (the error text of a
    rejection, the damage classes of a mismatch). The mutant's campaign draws the same cases as the unmutated
    one (same seed), so a variant the unmutated run never showed comes from the mutant. Only failures first
    seen at a case index the unmutated run also reached count: a later case may show a variant of its own."""
    if baseline_variants is None:
        return []
    masked = []
    for failure in report.get("unique_failures", []):
        if not failure.get("known") or not str(failure.get("backend", "")).startswith("sglang"):
            continue
        first_index = failure.get("first_index")
        if not isinstance(first_index, int) or first_index >= baseline_cases:
            continue
        new = sorted(set(failure.get("variants") or []) - baseline_variants.get(str(failure.get("signature")), set()))
        if new:
            masked.append({**failure, "new_variants": new})
    return masked


def baseline_failure_variants(report: dict[str, Any]) -> dict[str, set[str]]:
    """{signature: variants} of every failure an unmutated campaign's report lists."""
    return {str(f.get("signature")): set(f.get("variants") or []) for f in report.get("unique_failures", [])}


def _paths_run(report: dict[str, Any]) -> dict[str, int]:
    """Cases per implementation path (the campaign's spied `jit-register`, `jit-tma`, `jit-staged`, ...), summed
    over the sglang backends: which kernels the campaign actually drove."""
    totals: dict[str, int] = {}
    for backend, paths in (report.get("paths") or {}).items():
        if str(backend).startswith("sglang") and isinstance(paths, dict):
            for path, count in paths.items():
                totals[str(path)] = totals.get(str(path), 0) + int(count)
    return totals


def read_report(path: Path) -> dict[str, Any]:
    """A JSON report as a dict; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


Target = CommandTarget | CampaignTarget
