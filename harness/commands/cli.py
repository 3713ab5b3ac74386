"""The ``hicache-fuzz`` command line.

Exit codes (every subcommand): 0 clean, 1 failures found, 2 bad usage or bad input, 3 the requested
platform or backend is unavailable. The seed of every campaign is printed first, so any run can be repeated.

Subcommands live in small modules, each exposing ``add_arguments(parser)`` and ``run(args) -> int``; this
file only wires them together and owns the three core ones (backends, fuzz, replay).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from hicache_fuzz.harness.campaign.corpus import CorpusError, iter_case_files, load_entries, write_json_atomic
from hicache_fuzz.harness.campaign.loop import CampaignConfig, CampaignReport, known_failures, run_campaign
from hicache_fuzz.harness.campaign.options import (
    finite_positive_float,
    non_negative_int,
    positive_int,
)
from hicache_fuzz.harness.campaign.reproducer import judge_replay
from hicache_fuzz.harness.campaign.signature import signature
from hicache_fuzz.harness.commands.output import flush_unsaved_reproducers, os_reason, write_report
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.json_input import InputError
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.platform import Machine, PlatformUnavailable, detect, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import Executor, InProcessExecutor
from hicache_fuzz.harness.pipeline.runner import NOT_RUN
from hicache_fuzz.harness.pipeline.worker import WorkerError
from hicache_fuzz.kernels.base import Availability, Backend
from hicache_fuzz.kernels.registry import Registry, UnknownBackend, load_registry

EXIT_CLEAN, EXIT_FAILURES, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

# (name, module, help): modules expose add_arguments(parser) and run(args) -> int.
SUBCOMMAND_MODULES: list[tuple[str, str, str]] = [
    ("merge", "hicache_fuzz.harness.campaign.merge", "merge reports and corpora of workers or shards; write JUnit XML"),
    ("isa", "hicache_fuzz.harness.isa.check", "static ISA check of sglang's copy kernels (ROCm/CUDA)"),
    ("selftest", "hicache_fuzz.harness.commands.selftest", "every bug-zoo mutant must be killed; reference clean"),
    ("bench", "hicache_fuzz.harness.commands.bench", "throughput, zoo time-to-kill, kernel bandwidth"),
    ("minimize", "hicache_fuzz.harness.campaign.minimize", "shrink reproducers while keeping their failure signature"),
    ("atheris", "hicache_fuzz.harness.campaign.atheris_entry", "coverage-guided fuzzing (atheris, libFuzzer flags)"),
    ("gate", "hicache_fuzz.harness.commands.gate", "pre-merge gate: corpus replay + fixed-seed campaign + ISA checks"),
]


class UsageError(Exception):
    """Bad arguments or input: exit code 2."""


class Unavailable(Exception):
    """Requested platform or backend is not present: exit code 3."""


# ---- shared helpers --------------------------------------------------------------------------------------

def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", default="auto", choices=["auto", "cpu", "cuda", "rocm"],
                        help="platform to run on; a named platform that is absent exits 3 (default: best present)")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE:CALLABLE",
                        help="load extra backends from a callable returning Backend(s); repeatable")


def machine_for(args: argparse.Namespace) -> Machine:
    if args.platform == "auto":
        return detect()
    try:
        return require(args.platform)
    except PlatformUnavailable as exc:
        raise Unavailable(str(exc)) from None


def registry_for(args: argparse.Namespace) -> Registry:
    for spec in args.backend_plugin:
        if ":" not in spec:
            raise UsageError(f"--backend-plugin {spec!r}: expected MODULE:CALLABLE")
    try:
        return load_registry(args.backend_plugin)
    except ModuleNotFoundError as exc:
        if exc.name in {spec.partition(":")[0] for spec in args.backend_plugin}:  # a misspelt name: usage
            raise UsageError(f"--backend-plugin: {exc}") from None
        raise Unavailable(f"--backend-plugin {' '.join(args.backend_plugin)}: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:  # module:callable whose callable does not exist
        raise UsageError(f"--backend-plugin: {exc}") from None
    except Exception as exc:  # the plugin's import or factory raised: it cannot provide backends here
        raise Unavailable(f"--backend-plugin {' '.join(args.backend_plugin)}: {type(exc).__name__}: {exc}") from None


def probe(backend: Backend, machine: Machine) -> Availability:
    """backend.probe, where a probe that raises (a plugin's) is the backend being unavailable: exit 3."""
    try:
        return backend.probe(machine.platform)
    except Exception as exc:
        raise Unavailable(f"backend {backend.name}: its probe raised {type(exc).__name__}: {exc}") from None


def available_backend(registry: Registry, name: str, machine: Machine) -> Backend:
    try:
        backend = registry.get(name)
    except UnknownBackend as exc:
        raise UsageError(str(exc)) from None
    availability = probe(backend, machine)
    if not availability.available:
        raise Unavailable(f"backend {name} is unavailable on {machine.description}: {availability.reason}")
    return backend


def auto_backends(registry: Registry, machine: Machine) -> list[Backend]:
    """The best backends present: every available real-kernel backend on a GPU, else the CPU reference."""
    if machine.platform.kind != "cpu":
        real = [b for name in registry.names() if not (b := registry.get(name)).models_bug
                and name != "reference" and probe(b, machine).available]
        if real:
            return real
    return [registry.get("reference")]


def make_executor(backends: list[Backend], registry: Registry, machine: Machine, args: argparse.Namespace,
                  journal_dir: Path | None, warm_up: bool = False) -> Executor:
    isolate = getattr(args, "isolate", "auto")
    if isolate == "yes" or (isolate == "auto" and any(b.needs_isolation for b in backends)):
        from hicache_fuzz.harness.pipeline.worker import GPU_SPARE_WORKERS, WorkerExecutor

        # The journal keeps in-flight, crashed and hung cases; replay has no corpus, so it gets a fresh folder
        # (removed by close_executors). A corpus that cannot hold one is a storage fault: exit 3 with the reason.
        journal = journal_dir if journal_dir is not None else Path(tempfile.mkdtemp(prefix="hicache-fuzz-journal-"))
        if journal_dir is None:
            TEMPORARY_JOURNALS.append(journal)
        try:
            journal.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"cannot create the worker journal {journal}: {os_reason(exc)}") from None
        # On a GPU a restart costs an import of sglang plus JIT module loads: keep spare workers ready.
        spares = GPU_SPARE_WORKERS if machine.platform.kind != "cpu" else 0
        return WorkerExecutor([b.name for b in backends], args.backend_plugin, machine.platform.kind,
                              args.case_timeout, journal, warm_up=warm_up, spares=spares)
    return InProcessExecutor(registry, machine)


TEMPORARY_JOURNALS: list[Path] = []  # made by make_executor for commands without a corpus (replay, minimize)


def close_executors(executors: list[Executor]) -> None:
    """Close the executors, then remove the temporary journals they used (nothing under /tmp is left)."""
    for executor in executors:
        executor.close()
    while TEMPORARY_JOURNALS:
        shutil.rmtree(TEMPORARY_JOURNALS.pop(), ignore_errors=True)


def background_compile_seconds() -> float:
    """Seconds this process spent building grown menu rows in the background (0 if it built none)."""
    from hicache_fuzz.kernels import sglang_common  # bookkeeping only: does not import sglang

    return sglang_common.background_seconds


def compiled_in_cases(found: dict[str, tuple[int, float]], top: int = 40) -> list[dict[str, Any]]:
    """The JIT modules cases had to build or load themselves (outside the warm-up), costliest first: what to
    add to a backend's compile_jobs when the compile share is high."""
    rows = sorted(found.items(), key=lambda item: -item[1][1])[:top]
    return [{"module": key, "processes": count, "seconds": round(seconds, 3)} for key, (count, seconds) in rows]


class Checkpoint:
    """Writes the campaign report (``"partial": true``) every `every` seconds and after each failure, so a
    campaign killed from outside (a CI time limit, the OOM killer) still leaves its counts on disk. The
    failures themselves are on disk already (saved as they are found)."""

    def __init__(self, path: str | None, every: float = 10.0) -> None:
        self.path = Path(path) if path else None
        self.every = every
        self.last = time.monotonic()

    def __call__(self, report: CampaignReport, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self.last < self.every):
            return
        self.last = now
        try:
            write_json_atomic(self.path, {**report.to_dict(), "partial": True})
        except OSError as exc:  # the final report has its own fallback; a checkpoint is not worth a campaign
            print(f"hicache-fuzz: cannot write the checkpoint {self.path} ({os_reason(exc)}); "
                  "checkpoints stop, the final report will still be written", file=sys.stderr, flush=True)
            self.path = None


class StopOnSignal:
    """SIGTERM (what `timeout` and CI runners send) and SIGINT end the campaign after the case in flight,
    and the final report is written as usual. A second signal falls back to the default behaviour."""

    def __init__(self) -> None:
        self.signal_name = ""
        self._previous: dict[int, Any] = {}
        for number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handler, budgets still apply
                self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, frame: object) -> None:
        self.signal_name = signal.Signals(number).name
        self.restore()

    def requested(self) -> bool:
        return bool(self.signal_name)

    def restore(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


class Progress:
    """One self-overwriting status line on a terminal; silent otherwise."""

    def __init__(self, enabled: bool, every: float = 0.25) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.every = every
        self.last = 0.0

    def __call__(self, case: Case, result: Result, report: CampaignReport) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every:
            return
        self.last = now
        sys.stderr.write(f"\r{report.cases} cases  {report.cases_per_second:,.0f}/s  "
                         f"{report.failure_count} failures ({len(report.failures)} unique)  ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def print_json_or_write(data: Any, path: str | Path | None) -> bool:
    """Write a computed result; never lose it (output.write_report). False if it went elsewhere."""
    return write_report(path, data)


# ---- backends ---------------------------------------------------------------------------------------------

def add_backends_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def run_backends(args: argparse.Namespace) -> int:
    machine = machine_for(args)
    registry = registry_for(args)
    rows = []
    for name in registry.names():
        backend = registry.get(name)
        try:
            availability = backend.probe(machine.platform)
        except Exception as exc:  # listed, with the reason; commands that need the backend exit 3
            availability = Availability(False, f"its probe raised {type(exc).__name__}: {exc}")
        rows.append({"name": name, "available": availability.available, "reason": availability.reason,
                     "models_bug": backend.models_bug, "description": backend.description})
    print(f"platform: {machine.description}")
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        state = "available  " if row["available"] else "unavailable"
        detail = row["reason"] if not row["models_bug"] else f"zoo mutant: {row['models_bug']}"
        print(f"  {row['name']:<{width}}  {state}  {detail}")
    written = print_json_or_write({"platform": machine.description, "backends": rows}, args.json)
    return EXIT_CLEAN if written else EXIT_UNAVAILABLE


# ---- fuzz -------------------------------------------------------------------------------------------------

def add_fuzz_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="backend to fuzz (repeatable); default: the best backends present")
    parser.add_argument("--seed", type=int, help="campaign seed (default: random; always printed)")
    parser.add_argument("--runs", type=positive_int, help="stop after this many cases")
    parser.add_argument("--max-total-time", type=finite_positive_float, help="stop after this many seconds")
    parser.add_argument("--corpus", default="fuzz-out/corpus", help="failures are written here (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="write the campaign report as JSON")
    parser.add_argument("--shard", default="0/1", metavar="K/N", help="run shard K of N of the seed's case space")
    parser.add_argument("--start-index", type=non_negative_int, default=0,
                        help="first case index (resume a campaign)")
    parser.add_argument("--byte-budget", type=positive_int, help="largest case in bytes (all storages)")
    parser.add_argument("--isolate", choices=["auto", "yes", "no"], default="auto",
                        help="run cases in a worker process (auto: for backends that can crash the process)")
    parser.add_argument("--case-timeout", type=finite_positive_float, default=60.0,
                        help="seconds before a case counts as a hang")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failure")
    parser.add_argument("--known", action="append", default=[], type=Path, metavar="PATH",
                        help="corpus files or folders whose expected failures (\"expect\": \"fail\") are known: "
                             "failures with their signatures are counted and marked known, and only new ones "
                             "make the exit status 1 (repeatable; e.g. corpus/sglang)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
    from hicache_fuzz.harness.campaign.parallel import add_worker_arguments  # --workers (one process per GPU or more)

    add_worker_arguments(parser)
    parser.add_argument("--minimize", action="store_true",
                        help="minimize the first case of each new failure signature before saving it")


def parse_shard(text: str) -> tuple[int, int]:
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected K/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= k < n):
        raise UsageError(f"--shard {text!r}: need 0 <= K < N")
    return k, n


def run_fuzz(args: argparse.Namespace) -> int:
    if getattr(args, "workers", "1") != "1":
        from hicache_fuzz.harness.campaign.parallel import run_parallel_fuzz

        return run_parallel_fuzz(args)
    machine = machine_for(args)
    registry = registry_for(args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"hicache-fuzz: seed {seed}", flush=True)
    if args.runs is None and args.max_total_time is None:
        raise UsageError("give a budget: --runs N and/or --max-total-time SECONDS")
    backends = [available_backend(registry, n, machine) for n in args.backend] or auto_backends(registry, machine)
    shard = parse_shard(args.shard)
    space = CaseSpace() if args.byte_budget is None else CaseSpace(byte_budget=args.byte_budget)
    corpus = Path(args.corpus)
    print(f"platform: {machine.description}; backends: {', '.join(b.name for b in backends)}; "
          f"shard {shard[0]}/{shard[1]}; corpus {corpus}", flush=True)
    config = CampaignConfig([b.name for b in backends], seed, args.runs, args.max_total_time, corpus, shard,
                            args.start_index, space, args.stop_on_failure,
                            known_signatures=load_known_failures(args.known))
    # warm_up: the worker compiles each backend's row-size menu up front, in parallel (JIT backends only)
    executor = make_executor(backends, registry, machine, args, corpus / ".journal", warm_up=True)
    if args.minimize:
        from hicache_fuzz.harness.campaign.minimize import campaign_minimizer

        config.minimizer = campaign_minimizer(executor)
    progress = Progress(not args.no_progress)
    checkpoint = Checkpoint(args.json)
    stop = StopOnSignal()
    config.should_stop = stop.requested

    def on_result(case: Case, result: Result, report: CampaignReport) -> None:
        progress(case, result, report)
        checkpoint(report, force=result.outcome.is_failure)

    wall_started = time.perf_counter()
    try:
        start = getattr(executor, "start", None)
        if start is not None:  # worker start-up and JIT warm-up happen before the campaign clock starts
            start()
        report = run_campaign(config, backends, machine.platform, executor, on_result,
                              record_case_ids=args.record_case_ids)
    finally:
        stop.restore()
        progress.close()
        executor.close()
    if stop.signal_name:
        print(f"hicache-fuzz: stopped by {stop.signal_name} after the case in flight; report complete so far",
              flush=True)
        report.extra["stopped_by"] = stop.signal_name
    if hasattr(executor, "compile_seconds"):  # worker executors report JIT compile and worker start-up time
        wall = time.perf_counter() - wall_started
        report.extra.update(compile_seconds=round(executor.compile_seconds, 3),
                            worker_startup_seconds=round(executor.startup_seconds, 3),
                            worker_restarts=executor.restarts, spare_takeovers=executor.spares_used,
                            spare_startup_seconds_in_background=round(executor.background_startup_seconds, 3),
                            compiled_in_cases=compiled_in_cases(executor.compiled_in_cases),
                            prefetch_compile_seconds=round(background_compile_seconds(), 3),
                            wall_seconds=round(wall, 3),
                            compile_share_of_wall=round(executor.compile_seconds / wall, 4) if wall else 0.0)
    print_campaign(report)
    return finish_campaign(report, args.json)


def finish_campaign(report: CampaignReport, json_path: str | None) -> int:
    """Say why a campaign stopped early on a fault, keep what the corpus could not take, write the report
    (elsewhere if it must) and choose the exit code: 1 if new failures were found, else 3 if a fault (storage,
    worker, the report's own write) cut the run short or moved its report, else 0."""
    if report.storage_error:
        print(f"hicache-fuzz: storage fault, campaign stopped: {report.storage_error}", file=sys.stderr, flush=True)
        flush_unsaved_reproducers(report.unsaved_reproducers, report.storage_error)
    if report.environment_error:
        print(f"hicache-fuzz: unavailable: campaign stopped: {report.environment_error}", file=sys.stderr,
              flush=True)
    written = print_json_or_write(report.to_dict(), json_path)
    if report.new_failures:
        return EXIT_FAILURES
    return EXIT_UNAVAILABLE if (report.storage_error or report.environment_error or not written) else EXIT_CLEAN


def load_known_failures(paths: list[Path]) -> dict[str, str]:
    """signature -> file of every expected-failure entry under `paths` (fuzz --known)."""
    for path in paths:
        if not os.path.lexists(path):
            raise UsageError(f"--known {path}: no such file or folder")
    return known_failures(entry for p in iter_case_files(paths) for entry in load_entries(p))


def print_campaign(report: CampaignReport) -> None:
    print(f"seed {report.seed}: {report.cases} cases in {report.seconds:.1f} s "
          f"({report.cases_per_second:,.1f} cases/s), next index {report.next_index}")
    if "compile_seconds" in report.extra:
        extra = report.extra
        print(f"  wall {extra['wall_seconds']:.1f} s (worker start-up incl. JIT warm-up "
              f"{extra['worker_startup_seconds']:.1f} s, {extra['worker_restarts']} restarts, "
              f"{extra['spare_takeovers']} by a ready spare); JIT compile "
              f"{extra['compile_seconds']:.1f} s = {extra['compile_share_of_wall']:.0%} of the wall")
    for backend, counts in sorted(report.outcomes.items()):
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"  {backend}: {listed}")
    for backend in report.backends:
        gaps = report.coverage.gaps(backend)
        if gaps and report.outcomes.get(backend):
            print(f"  coverage gaps of {backend} (never executed): {', '.join(gaps)}")
        for bucket, why in report.coverage.exemptions.get(backend, {}).items():
            print(f"  coverage of {backend}: {bucket} exempt ({why})")
    if report.failures:
        new = report.new_failures
        print(f"{report.failure_count} failures, {len(report.failures)} unique, {len(new)} new:")
        for failure in report.failures:
            print(f"  [{failure.signature}] x{failure.count} {failure.summary}")
            if failure.known:
                print(f"      known: {failure.known}")
            elif failure.file:
                print(f"      reproducer: {failure.file}")
    else:
        print("no failures")


# ---- replay -----------------------------------------------------------------------------------------------

def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("paths", nargs="+", type=Path, help="case or reproducer files, or directories of them")
    parser.add_argument("--backend", help="run every case on this backend instead of the one it names")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--isolate", choices=["auto", "yes", "no"], default="auto")
    parser.add_argument("--case-timeout", type=finite_positive_float, default=60.0)


def run_replay(args: argparse.Namespace) -> int:
    machine = machine_for(args)
    registry = registry_for(args)
    entries = []
    try:
        for path in iter_case_files(args.paths):
            entries.extend(load_entries(path))
    except CorpusError as exc:
        raise UsageError(str(exc)) from None
    if not entries:
        raise UsageError(f"no case files under {', '.join(map(str, args.paths))}")
    if args.backend:
        available_backend(registry, args.backend, machine)
    rows: list[dict[str, Any]] = []
    failures = 0
    executors: dict[str, Executor] = {}
    try:
        for entry in entries:
            case = entry.case if not args.backend else entry.case.replace(backend=args.backend)
            row: dict[str, Any] = {"file": str(entry.path), "case_id": case.case_id, "backend": case.backend}
            skip = registry.unavailable_reason(case.backend, machine.platform)
            if skip:
                row.update(outcome="skipped", reason=skip)
                print(f"SKIP {entry.path}: {skip}")
                rows.append(row)
                continue
            backend = registry.get(case.backend)
            if case.backend not in executors:
                executors[case.backend] = make_executor([backend], registry, machine, args, None)
            result = executors[case.backend].run(case)
            if result.summary.startswith(NOT_RUN):  # e.g. its storages could not be allocated here
                row.update(outcome="skipped", reason=result.summary)
                print(f"SKIP {entry.path}: {result.summary}")
                rows.append(row)
                continue
            row.update(result.to_dict(), signature=signature(result, case) if result.outcome.is_failure else "")
            if entry.observed is not None:
                row["observed_before"] = entry.observed.outcome.value
            # An entry marked "expect": "fail" (a known bug) passes the replay by failing with its signature.
            judged = judge_replay(entry.expect if not args.backend else "pass", entry.signature, result, case)
            verdict = judged.label
            row["verdict"] = judged.label
            failures += not judged.ok
            first_line = result.summary.splitlines()[0] if result.summary else ""
            print(f"{verdict} {entry.path} [{case.backend}] {result.outcome.value}: {first_line}")
            rows.append(row)
    finally:
        close_executors(list(executors.values()))
    skipped = sum(1 for r in rows if r.get("outcome") == "skipped")
    print(f"{len(rows) - skipped - failures} passed, {failures} failed, {skipped} skipped")
    written = print_json_or_write({"results": rows}, args.json)
    if failures:
        return EXIT_FAILURES
    if skipped:  # cases that could not run here were not checked: the backend is unavailable (README)
        print(f"hicache-fuzz: unavailable: {skipped} case(s) not replayed: they cannot run here (see SKIP lines)",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_CLEAN if written else EXIT_UNAVAILABLE


# ---- wiring -----------------------------------------------------------------------------------------------

CORE_COMMANDS = [
    ("backends", add_backends_arguments, run_backends, "list backends, whether they can run here, and why not"),
    ("fuzz", add_fuzz_arguments, run_fuzz, "run a fuzz campaign"),
    ("replay", add_replay_arguments, run_replay, "replay case or reproducer files"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hicache-fuzz",
        description="Differential testing and fuzzing of SGLang's HiCache KV-cache transfer kernels. "
                    "Exit codes: 0 clean, 1 failures found, 2 bad usage or input, 3 platform/backend unavailable.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add_arguments, run, help_text in CORE_COMMANDS:
        command = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command)
        command.set_defaults(run=run)
    for name, module_name, help_text in SUBCOMMAND_MODULES:
        command = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            command.set_defaults(run=_broken(module_name, exc))
            continue
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def _broken(module_name: str, exc: ImportError) -> Any:
    def run(args: argparse.Namespace) -> int:
        raise Unavailable(f"{module_name} failed to import: {exc}")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for bad usage (its message names the option), 0 for --help
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    # The pipeline's CPU work is many small tensor ops, where intra-op threads cost more than they give
    # (measured ~20x on small cases); parallelism comes from worker processes instead.
    torch.set_num_threads(int(os.environ.get("HICACHE_FUZZ_TORCH_THREADS", "1")))
    try:
        return int(args.run(args))
    except (UsageError, InputError) as exc:  # InputError: CaseError, CorpusError, MergeError, ...
        print(f"hicache-fuzz: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Unavailable, WorkerError) as exc:
        print(f"hicache-fuzz: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except BrokenPipeError:
        # The reader of our output went away (`hicache-fuzz backends | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLEAN
    except KeyboardInterrupt:  # a second SIGINT, or one outside a campaign: stop without a traceback
        print("hicache-fuzz: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())


