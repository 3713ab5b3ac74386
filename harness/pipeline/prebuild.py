"""The campaign's JIT builder: one process that builds every module the campaign's backends can draw, before and
while the workers start, so that no worker compiles one.

A kernel change (a ``.cuh`` edit) invalidates every cached module of sglang's JIT cache. Left to the workers, each
module was built where a case first met it: inside cases (against the case timeout, so a slow build under load
could end as a HANG, kill the worker and its nvcc, and be started again by the next worker), and once more in each
restarted worker that met a refusal. The builder is launched with the campaign's first worker (``executor_for``),
imports the backends, lists their modules (``compile_books.prebuild_jobs``: the starting menus first, one backend
after another, then the growth stages) and builds them in parallel threads, one per usable core (each build is
its own nvcc process). The rows of the campaign's first cases come before all of them: the campaign generates its
first batch while its first worker starts and names their rows (``Prebuild.prioritize``, a JSON file beside the
record), so that after a kernel change the modules the first results wait for are the first built. A worker that
needs a module the builder is on waits for it on the module's lock (sglang's build lock;
``compile_books.module_lock`` for refusals) and loads the result. The workers do not warm up then: they load what
their cases need. The builder writes what it did to ``<journal>/prebuild.json`` (the first cases' modules, the
starting menus and everything: count and seconds of each), which the start-up record reads.

``python -m hicache_fuzz.harness.pipeline.prebuild --platform KIND --backend NAME ... --out FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


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
        """Build the modules of these rows (backend name -> row bytes, in the order the campaign needs them) before
        the menus. Read once, when the builder has listed its modules; a list written later changes nothing."""
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
            "prebuild_first_modules": record.get("first_modules"), "prebuild_first_s": record.get("first_seconds"),
            "prebuild_menu_modules": record.get("menu_modules"), "prebuild_menu_s": record.get("menu_seconds"),
            "prebuild_threads": record.get("threads"), "prebuild_done": bool(record.get("done"))}


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _first_rows(path: Path | None) -> dict[str, list[int]]:
    """The rows the campaign named (Prebuild.prioritize); {} when it has not (yet) or the file is not such a list."""
    if path is None:
        return {}
    try:
        rows = json.loads(path.read_text()).get("rows", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(rows, dict):
        return {}
    return {str(name): [int(row) for row in wanted if isinstance(row, int) and row > 0]
            for name, wanted in rows.items() if isinstance(wanted, list)}


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
    # Modules built here again below only load (one build per module: the backends' memo and sglang's cache).
    first = row_jobs(backends, machine.platform, space, _first_rows(args.first_rows))
    record: dict[str, Any] = {"modules": len(jobs), "menu_modules": menu_count, "first_modules": len(first),
                              "threads": threads, "import_seconds": round(time.perf_counter() - began, 3),
                              "done": False}
    _write(args.out, record)
    record["first_seconds"] = round(run_jobs(first, threads), 3)
    _write(args.out, record)
    # The starting menus, all of them before any growth stage (the first batches draw from them).
    menu_seconds = run_jobs(jobs[:menu_count], threads)
    record["menu_seconds"] = round(menu_seconds, 3)
    _write(args.out, record)
    rest = run_jobs(jobs[menu_count:], threads)
    record.update(seconds=round(menu_seconds + rest, 3), done=True)
    _write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
