"""The campaign's JIT builder: one process that builds every module the campaign's backends can draw, before and
while the workers start, so that no worker compiles one.

A kernel change (a ``.cuh`` edit) invalidates every cached module of sglang's JIT cache. Left to the workers, each
module was built where a case first met it: inside cases (against the case timeout, so a slow build under load
could end as a HANG, kill the worker and its nvcc, and be started again by the next worker), and once more in each
restarted worker that met a refusal. The builder is launched with the campaign's first worker (``executor_for``),
imports the backends, lists their modules (``compile_books.prebuild_jobs``: the starting menus first, one backend
after another, then the growth stages) and builds them in parallel threads, one per usable core (each build is
its own nvcc process). The rows of the campaign's first cases jump the queue: the campaign generates its first
batches while its first worker starts and names their rows (``Prebuild.prioritize``, a JSON file beside the
record), and the builder's threads take those modules next, so that after a kernel change the modules the first
results wait for are built first. A thread busy with an nvcc run cannot be interrupted, so the builder waits a
few seconds for those rows before it starts on its menus (``FIRST_ROWS_WAIT_S``; a campaign that names none says
so at once). A worker that needs a module the builder is on waits for it on the module's lock (sglang's build
lock; ``compile_books.module_lock`` for refusals) and loads the result. The workers do not warm up then: they load
what their cases need. The builder writes what it did to ``<journal>/prebuild.json`` (the
starting menus and everything: count and seconds; the first cases' modules: count, and the builder's seconds when
their rows were named and when their builds ended), which the start-up record reads.

``python -m hicache_fuzz.harness.pipeline.prebuild --platform KIND --backend NAME ... --out FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Builder seconds (from its launch) it waits for the campaign to name its first cases' rows before building its
# menus (FirstCases.wait_until_named). A campaign on a warm probe cache names them within a few seconds of its own
# launch, which is the builder's; one that probes first names them later, and the builder then starts without them.
FIRST_ROWS_WAIT_S = 10.0


class Prebuild:
    """The parent's handle on the builder process: started at once; its record read when asked."""

    def __init__(self, backend_names: Sequence[str], plugins: Sequence[str], platform_kind: str, journal: Path,
                 env: dict[str, str] | None = None, python: str | None = None, menu_seed: int | None = None) -> None:
        self.record_path = journal / "prebuild.json"
        self.record_path.unlink(missing_ok=True)
        self.first_rows_path = journal / "prebuild-first.json"
        self.first_rows_path.unlink(missing_ok=True)
        args = [python or sys.executable, "-m", "hicache_fuzz.harness.pipeline.prebuild", "--platform", platform_kind,
                "--out", str(self.record_path), "--first-rows", str(self.first_rows_path)]
        for name in backend_names:
            args += ["--backend", name]
        for plugin in plugins:
            args += ["--backend-plugin", plugin]
        if menu_seed is not None:
            args += ["--menu-seed", str(menu_seed)]
        self.started = time.perf_counter()
        with open(journal / "prebuild.log", "ab") as log:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env=dict(os.environ if env is None else env))

    def prioritize(self, rows: Mapping[str, Sequence[int]]) -> None:
        """Build the modules of these rows (backend name -> row bytes) next: the builder's threads look for the list
        before each build they take and read it once; a list written after the builder has finished changes
        nothing."""
        _write(self.first_rows_path, {"rows": {name: [int(row) for row in wanted] for name, wanted in rows.items()}})

    def record(self) -> dict[str, Any]:
        """What the builder has written so far ({} before it has listed its modules)."""
        try:
            data = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait up to `timeout` s for the builder to finish; its record."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        return self.record()

    def close(self) -> None:
        """Stop the builder (builds still running are lost; the next process that needs them builds them)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None


def startup_fields(prebuild: Prebuild | None) -> dict[str, Any]:
    """The builder's part of the start-up record: modules and seconds of the starting menus and of everything
    (None while unfinished), and where from (the builder's own clock)."""
    if prebuild is None:
        return {}
    record = prebuild.record()
    return {"prebuild_modules": record.get("modules"), "prebuild_s": record.get("seconds"),
            "prebuild_first_modules": record.get("first_modules"),
            "prebuild_first_named_s": record.get("first_named_s"),
            "prebuild_first_built_s": record.get("first_built_s"),
            "prebuild_menu_modules": record.get("menu_modules"), "prebuild_menu_s": record.get("menu_seconds"),
            "prebuild_threads": record.get("threads"), "prebuild_done": bool(record.get("done"))}


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _first_rows(path: Path | None) -> dict[str, list[int]] | None:
    """The rows the campaign named (Prebuild.prioritize); None while it has not, {} for a file not such a list."""
    if path is None or not path.exists():
        return None
    try:
        rows = json.loads(path.read_text()).get("rows", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(rows, dict):
        return {}
    return {str(name): [int(row) for row in wanted if isinstance(row, int) and row > 0]
            for name, wanted in rows.items() if isinstance(wanted, list)}


class FirstCases:
    """The modules of the campaign's first cases, handed to the build queue once their rows are named, whenever
    that is (the campaign names them while its first worker starts; the builder may have started building
    before): ``run_jobs(..., urgent=first_cases)``. Records when the rows came and when their builds ended."""

    def __init__(self, path: Path | None, jobs_of: Callable[[dict[str, list[int]]], list[Callable[[], object]]],
                 began: float) -> None:
        self.path, self.jobs_of, self.began = path, jobs_of, began
        self.modules: int | None = None  # None: not named yet
        self.named_s: float | None = None  # builder seconds when the rows were read
        self.built_s: float | None = None  # builder seconds when the last of their builds ended
        self._left = 0
        self._lock = threading.Lock()

    def __call__(self) -> list[Callable[[], object]]:
        if self.modules is not None:
            return []
        rows = _first_rows(self.path)
        if rows is None:
            return []
        jobs = self.jobs_of(rows)
        self.modules, self.named_s, self._left = len(jobs), self._now(), len(jobs)
        if not jobs:
            self.built_s = self.named_s
        return [self._counted(job) for job in jobs]

    def wait_until_named(self, deadline_s: float, poll_s: float = 0.05) -> bool:
        """Wait until the campaign has named its rows or `deadline_s` builder seconds have passed; whether they
        are named. A build thread takes the named modules only when it is free, and after a kernel change each
        menu build it took first is an nvcc run of tens of seconds, so the builder does not start before the
        rows come (the campaign names them in its first seconds) or the deadline passes."""
        if self.path is None:
            return False
        while _first_rows(self.path) is None:
            if time.perf_counter() - self.began >= deadline_s:
                return False
            time.sleep(poll_s)
        return True

    def _counted(self, job: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            try:
                return job()
            finally:
                with self._lock:
                    self._left -= 1
                    if self._left == 0:
                        self.built_s = self._now()
        return run

    def _now(self) -> float:
        return round(time.perf_counter() - self.began, 3)

    def fields(self) -> dict[str, Any]:
        return {"first_modules": self.modules, "first_named_s": self.named_s, "first_built_s": self.built_s}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hicache_fuzz.harness.pipeline.prebuild")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--backend", action="append", default=[])
    parser.add_argument("--backend-plugin", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--menu-seed", type=int, default=None)
    parser.add_argument("--first-rows", type=Path, default=None)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    from hicache_fuzz.harness.model import platform as platform_mod
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.kernels.compile_books import prebuild_jobs, row_jobs, run_jobs
    from hicache_fuzz.kernels.registry import load_registry

    platform_mod.limit_torch_threads()
    machine = platform_mod.require(args.platform)
    registry = load_registry(args.backend_plugin)
    backends = [registry.get(name) for name in args.backend]
    space = CaseSpace(menu_seed=args.menu_seed)
    jobs, menu_count = prebuild_jobs(backends, machine.platform, space)
    threads = platform_mod.usable_cores()
    # Modules built again after the first cases' only load (one build per module: the backends' memo and sglang's
    # cache), so the first cases' jobs may simply go first.
    first = FirstCases(args.first_rows, lambda rows: row_jobs(backends, machine.platform, space, rows), began)
    record: dict[str, Any] = {"modules": len(jobs), "menu_modules": menu_count, "threads": threads,
                              "import_seconds": round(time.perf_counter() - began, 3), "done": False}
    _write(args.out, record)
    first.wait_until_named(FIRST_ROWS_WAIT_S)
    # The starting menus, all of them before any growth stage (the first batches draw from them).
    menu_seconds = run_jobs(jobs[:menu_count], threads, urgent=first)
    record.update(menu_seconds=round(menu_seconds, 3), **first.fields())
    _write(args.out, record)
    rest = run_jobs(jobs[menu_count:], threads, urgent=first)
    record.update(seconds=round(menu_seconds + rest, 3), done=True, **first.fields())
    _write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
