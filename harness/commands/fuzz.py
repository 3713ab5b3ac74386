"""``hicache-fuzz fuzz``: a campaign in this process, or spread over worker processes with ``--workers``
(:mod:`hicache_fuzz.harness.campaign.parallel` runs those workers and merges their reports)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.campaign.parallel import (
    ParallelUsageError,
    accelerator_kind,
    resolve_worker_count,
    run_parallel,
    shard_job,
    visible_devices,
)
from hicache_fuzz.harness.campaign.stop import Checkpoint, StopOnSignal
from hicache_fuzz.harness.commands.common import execution_options, write_json_report
from hicache_fuzz.harness.commands.fuzz_options import add_arguments as add_arguments  # the options (cli.py)
from hicache_fuzz.harness.commands.fuzz_options import campaign_options, check_budget
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, Unavailable, UsageError

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.baseline import Baseline
    from hicache_fuzz.harness.campaign.loop import CampaignReport
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.harness.model.outcome import Result
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.pipeline.executor_base import Executor, WorkerFigures
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "corpus": "dir"}


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    if (getattr(args, "save_cases", None) or getattr(args, "where", None)) and not args.dry_run:
        raise UsageError("--save-cases and --where belong to a dry run: add --dry-run")
    if args.dry_run:  # generate and predict the campaign's cases, run nothing (commands/dry_run.py)
        from hicache_fuzz.harness.commands.dry_run import dry_run_campaign

        report = dry_run_campaign(args, seed)
        print_campaign(report)
        return finish_campaign(report, args.json)
    if args.workers != "1":
        if getattr(args, "baseline", None):
            raise UsageError("--baseline replays a campaign's failures: run it with --workers 1")
        print(f"hicache-fuzz: seed {seed}", flush=True)
        return run_parallel_fuzz(args, seed)
    return run_one_campaign(args, seed)


def run_one_campaign(args: argparse.Namespace, seed: int) -> int:
    """The fuzz subcommand with --workers 1: one campaign in this process, its cases run by one executor (in
    process, a worker process or a pool of them); the report, judged on the baseline where one is given."""
    from hicache_fuzz.harness.pipeline.setup import machine_for, probing_record, registry_for, startup_details

    launched = process_started_unix()
    # the JIT builder builds the rotating rows this seed draws (jit-warm --seed builds the same list)
    execution = dataclasses.replace(execution_options(args), menu_seed=seed)
    machine = machine_for(execution.platform)
    registry = registry_for(execution.backend_plugins)
    print(f"hicache-fuzz: seed {seed}", flush=True)
    check_budget(args)
    options = campaign_options(args, seed, machine)
    corpus = options.corpus
    assert corpus is not None  # fuzz always has a corpus folder
    journal = corpus / ".journal"
    known = options.known_signatures  # kept: with a baseline the campaign runs without them (_resolve_baseline)
    early = _launch_early(args, registry, machine, execution, journal)
    try:  # the baseline's probe (it imports sglang in a process of its own) runs while the worker starts
        baseline = _resolve_baseline(args, options, corpus)
    except BaseException:
        if early is not None:
            early.close()
        raise
    backends = _campaign_backends(args, registry, machine, early)
    probed = time.time()
    print(f"platform: {machine.description}; backends: {', '.join(b.name for b in backends)}; "
          f"shard {options.shard[0]}/{options.shard[1]}; corpus {corpus}", flush=True)
    executor = _campaign_executor(early, backends, registry, machine, execution, journal)
    report, ready, wall = _run_campaign(args, options, backends, machine, executor)
    workers = executor.worker_figures()
    if workers is not None:  # worker executors report JIT compile and worker start-up time
        report.extra.update(worker_fields(workers, backends, wall))
    report.extra["startup"] = startup_record(launched, probed, ready, report.extra.get("engine", {}),
                                             workers.hello if workers is not None else {})
    report.extra["startup"].update(probing=probing_record(), **startup_details(executor))
    if baseline is not None:
        from hicache_fuzz.harness.campaign.baseline import judge_campaign

        judge_campaign(report, baseline, known, execution.platform, list(execution.backend_plugins),
                       execution.case_timeout, corpus / ".baseline")
    _name_failure_statuses(report, known)
    print_campaign(report)
    return finish_campaign(report, args.json)


def _resolve_baseline(args: argparse.Namespace, options: CampaignOptions, corpus: Path) -> Baseline | None:
    """The --baseline to judge the campaign's failures on, probed before the campaign (a baseline that cannot run
    is exit 2 or 3); None without one. With a baseline every failure is saved (one reproducer per variant) and
    judged afterwards: the baseline decides, the known corpus only where the baseline could not replay
    (campaign/baseline.py judge_failure), so the campaign itself runs without known signatures."""
    if not getattr(args, "baseline", None):
        return None
    from hicache_fuzz.harness.campaign.baseline import resolve_baseline

    baseline = resolve_baseline(args.baseline, corpus / ".baseline")
    print(f"baseline: {baseline.describe()}", flush=True)
    options.known_signatures = {}
    return baseline


def _launch_early(args: argparse.Namespace, registry: Registry, machine: Machine, execution: ExecutionOptions,
                  journal: Path) -> Executor | None:
    """Without --backend on a GPU, the executor for every real-kernel backend, its worker launched now: its imports
    and JIT module loads (most of a GPU campaign's start-up) overlap with the parent's probes, which import sglang
    in this process too. The worker probes for itself; backends found unavailable here simply get no cases."""
    if args.backend or machine.platform.kind == "cpu":
        return None
    from hicache_fuzz.harness.pipeline.setup import executor_for, real_kernel_backends

    early = executor_for(real_kernel_backends(registry), registry, machine, execution, journal, warm_up=True)
    early.spawn_early()
    return early


def _campaign_backends(args: argparse.Namespace, registry: Registry, machine: Machine,
                       early: Executor | None) -> list[Backend]:
    """The --backend ones (each must be available), else the best present; the early executor is closed when
    probing them raises."""
    from hicache_fuzz.harness.pipeline.setup import auto_backends, available_backend

    try:
        return [available_backend(registry, n, machine) for n in args.backend] or auto_backends(registry, machine)
    except BaseException:
        if early is not None:
            early.close()
        raise


def _campaign_executor(early: Executor | None, backends: list[Backend], registry: Registry, machine: Machine,
                       execution: ExecutionOptions, journal: Path) -> Executor:
    """The early executor where every backend the campaign runs is one of its real-kernel backends, else a new
    one for `backends` (the early one closed)."""
    from hicache_fuzz.harness.pipeline.setup import executor_for, real_kernel_backends

    if early is not None and {b.name for b in backends} <= {b.name for b in real_kernel_backends(registry)}:
        return early
    if early is not None:  # no real backend is available after all: the CPU reference runs instead
        early.close()
    # warm_up: the worker compiles each backend's row-size menu up front, in parallel (JIT backends only)
    return executor_for(backends, registry, machine, execution, journal, warm_up=True)


def _run_campaign(args: argparse.Namespace, options: CampaignOptions, backends: list[Backend], machine: Machine,
                  executor: Executor) -> tuple[CampaignReport, float, float]:
    """Run the campaign on `executor` (closed afterwards) with the progress line, the report checkpoint and the
    stop signals: its report, when the executor was ready (the wall clock) and the wall seconds from its start."""
    from hicache_fuzz.harness.campaign.options import run_from_options

    progress = Progress(not args.no_progress, args.max_total_time)
    checkpoint = Checkpoint(args.json)
    stop = StopOnSignal()

    def on_result(case: Case, result: Result, report: CampaignReport) -> None:
        progress(case, result, report)
        checkpoint(report, force=result.outcome.is_failure)

    wall_started = time.perf_counter()
    try:
        executor.start()  # worker start-up and JIT warm-up happen before the campaign clock starts
        ready = time.time()
        report = run_from_options(options, backends, machine.platform, executor, on_result, stop.requested)
    finally:
        stop.restore()
        progress.close()
        executor.close()
    if stop.signal_name:
        print(f"hicache-fuzz: stopped by {stop.signal_name} after the case in flight; report complete so far",
              flush=True)
        report.extra["stopped_by"] = stop.signal_name
    return report, ready, time.perf_counter() - wall_started


def worker_fields(workers: WorkerFigures, backends: list[Backend], wall: float) -> dict[str, Any]:
    """The report's fields of a campaign whose cases ran in worker processes: JIT compile and worker start-up
    time, restarts, and the compile share of the wall seconds."""
    return {"compile_seconds": round(workers.compile_seconds, 3),
            "worker_startup_seconds": round(workers.startup_seconds, 3),
            "worker_restarts": workers.restarts, "spare_takeovers": workers.spares_used,
            "spare_startup_seconds_in_background": round(workers.background_startup_seconds, 3),
            "compiled_in_cases": compiled_in_cases(workers.compiled_in_cases),
            "prefetch_compile_seconds": round(background_compile_seconds(backends), 3),
            "wall_seconds": round(wall, 3),
            "compile_share_of_wall": round(workers.compile_seconds / wall, 4) if wall else 0.0}


def _name_failure_statuses(report: CampaignReport, known: dict[str, Any]) -> None:
    """Each unique failure as new, known (with the entry and its trigger) or pre-existing on the baseline, for
    the report (JSON ``failure_status``, in the order of ``unique_failures``); a new failure with a known
    identity names the trigger conditions its case does not meet."""
    from hicache_fuzz.harness.campaign.baseline import PRE_EXISTING, PRE_EXISTING_NOTE
    from hicache_fuzz.harness.findings.corpus import CorpusError, load_entry
    from hicache_fuzz.harness.findings.known import known_trigger, outside_triggers

    statuses: list[dict[str, Any]] = []
    for failure in report.failures:
        status: dict[str, Any] = {"signature": failure.signature}
        if failure.flaky:
            status.update(status="flaky", detail=f"ran {failure.flaky} in a fresh worker")
        elif failure.known.startswith(PRE_EXISTING_NOTE):
            status.update(status=PRE_EXISTING, detail=failure.known)
        elif failure.known:
            status.update(status="known", known=failure.known,
                          trigger=known_trigger(known, failure.signature, failure.backend, failure.known))
        else:
            status["status"] = "new"
            try:
                case = load_entry(Path(failure.file)).case if failure.file else None
            except CorpusError:
                case = None
            outside = outside_triggers(known, failure.signature, failure.backend, case) if case else {}
            if outside:
                status["known_identity_outside_trigger"] = outside
        statuses.append(status)
    if statuses:
        report.extra["failure_status"] = statuses


def process_started_unix() -> float:
    """When this process was launched (Linux: /proc's start time, so the interpreter's and the imports' seconds
    count), else now. Measured against /proc/uptime (1/100 s) rather than the boot time (whole seconds)."""
    try:
        with open("/proc/self/stat") as stat_file:
            ticks = int(stat_file.read().rpartition(")")[2].split()[19])  # field 22, starttime, after the name
        with open("/proc/uptime") as uptime_file:
            uptime = float(uptime_file.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def startup_record(launched: float, probed: float, ready: float, engine: dict[str, Any],
                   hello: dict[str, Any]) -> dict[str, Any]:
    """Where the start-up went, in seconds after the launch: the parent's probes done, the first worker ready
    (its own import, probe and JIT warm-up seconds, from its greeting), the first result recorded."""
    first = float(engine.get("first_result_unix") or 0.0)
    return {
        "launched_unix": round(launched, 3),
        "backends_probed_s": round(probed - launched, 3),
        "first_worker_ready_s": round(ready - launched, 3),
        "first_result_s": round(first - launched, 3) if first else None,
        "first_worker": dict(hello.get("startup_s") or {}),
        # builds its warm-up did not run because a record says sglang refuses them (kernels/refused_builds.py)
        "first_worker_refused_builds_replayed": int(hello.get("refused_builds_replayed") or 0),
    }


def finish_campaign(report: CampaignReport, json_path: str | None) -> int:
    """Say why a campaign stopped early on a fault, keep what the corpus could not take, write the report
    (elsewhere if it must) and choose the exit code: 1 if new failures were found, else 3 if a fault (storage,
    worker, the report's own write) cut the run short or moved its report, else 0."""
    from hicache_fuzz.harness.commands.output import flush_unsaved_reproducers

    if report.storage_error:
        print(f"hicache-fuzz: storage fault, campaign stopped: {report.storage_error}", file=sys.stderr, flush=True)
        flush_unsaved_reproducers(report.unsaved_reproducers, report.storage_error)
    if report.environment_error:
        print(f"hicache-fuzz: unavailable: campaign stopped: {report.environment_error}", file=sys.stderr,
              flush=True)
    written = write_json_report(report.to_dict(), json_path)
    if report.new_failures:
        return EXIT_FAILURES
    return EXIT_UNAVAILABLE if (report.storage_error or report.environment_error or not written) else EXIT_CLEAN


def run_parallel_fuzz(args: argparse.Namespace, seed: int) -> int:
    """The fuzz subcommand with --workers other than 1 (the seed is printed already)."""
    from hicache_fuzz.harness.campaign.options import parse_shard
    from hicache_fuzz.harness.reporting.merge import describe, merged_startup

    check_budget(args)
    parse_shard(args.shard)
    kind = accelerator_kind() if args.platform == "auto" else args.platform
    devices = visible_devices(kind)
    if kind != "cpu" and not devices:
        raise Unavailable(f"platform {kind} requested but no {kind} device is visible")
    try:
        workers = resolve_worker_count(args.workers, kind, devices)
    except ParallelUsageError as exc:
        raise UsageError(str(exc)) from None
    from hicache_fuzz.harness.pipeline.setup import machine_for

    options = campaign_options(args, seed, machine_for(kind))
    assert options.corpus is not None  # fuzz always has a corpus folder
    run_dir = options.corpus / ".parallel" / time.strftime("%Y%m%d-%H%M%S")
    base = shard_job(kind, list(args.backend), options, execution_options(args),
                     record_case_ids=args.record_case_ids, warm_up=not args.no_warm_up)
    per_device = f"{workers / len(devices):g} per GPU on {', '.join(devices)}" if devices else "on the CPU"
    print(f"platform: {kind}; {workers} workers ({per_device}); corpus {options.corpus}", flush=True)
    outcome = run_parallel(base, workers, kind, devices, run_dir)
    if outcome.merged:  # the shards' first result, counted from this process's launch (their spawn included)
        outcome.merged["startup"] = merged_startup(outcome.merged["merged_from"], process_started_unix())
    for problem in outcome.problems:
        print(f"hicache-fuzz: {problem}", file=sys.stderr)
    if outcome.merged:
        if outcome.merged.get("stopped_by"):
            print(f"hicache-fuzz: stopped by {outcome.merged['stopped_by']}: the workers ended after their cases in "
                  "flight; merged report complete so far", flush=True)
        print(describe(outcome.merged))
        if not write_json_report(outcome.merged, args.json) and outcome.exit_code == EXIT_CLEAN:
            return EXIT_UNAVAILABLE  # the report was written elsewhere (the message says where)
    return outcome.exit_code


def background_compile_seconds(backends: list[Any]) -> float:
    """Seconds this process spent building grown menu rows in the background (the backends' compile books)."""
    from hicache_fuzz.kernels.compile_books import books_of

    return sum(books.background_seconds for books in books_of(backends))


def compiled_in_cases(found: dict[str, tuple[int, float]], top: int = 40) -> list[dict[str, Any]]:
    """The JIT modules cases had to build or load themselves (outside the warm-up), costliest first: what to
    add to a backend's compile_jobs when the compile share is high."""
    rows = sorted(found.items(), key=lambda item: -item[1][1])[:top]
    return [{"module": key, "processes": count, "seconds": round(seconds, 3)} for key, (count, seconds) in rows]


class Progress:
    """The campaign's status line (harness/model/progress.py): cases, rate, failures, time left of the budget."""

    def __init__(self, enabled: bool, budget_seconds: float | None = None) -> None:
        from hicache_fuzz.harness.model.progress import ProgressLine

        self.line = ProgressLine(enabled)
        self.budget = budget_seconds

    def __call__(self, case: Case, result: Result, report: CampaignReport) -> None:
        if not self.line.enabled:
            return
        from hicache_fuzz.harness.model.progress import duration

        left = "" if self.budget is None else f"  {duration(max(0.0, self.budget - self.line.elapsed()))} left"
        self.line.update(f"{report.cases} cases  {report.cases_per_second:,.0f}/s  "
                         f"{report.failure_count} failures ({len(report.failures)} unique){left}")

    def close(self) -> None:
        self.line.close()


def prebuild_text(startup: dict[str, Any]) -> str:
    """The JIT builder's part of the start-up line. The builder may still be building when the campaign ends (a
    kernel source changed, so every module rebuilds): its totals are then None, and the line says so."""
    modules = startup.get("prebuild_modules")
    if not modules:
        return ""
    first, first_s = startup.get("prebuild_first_modules"), startup.get("prebuild_first_built_s")
    firsts = (f" (the first cases' {first} first, built {first_s:.1f} s into it)" if first and first_s is not None
              else "")
    if startup.get("prebuild_s") is not None:
        return f", JIT prebuild {modules} modules in {startup['prebuild_s']:.1f} s{firsts}"
    menu_s = startup.get("prebuild_menu_s")
    menus = f", starting menus built in {menu_s:.1f} s" if menu_s is not None else ", starting menus unfinished"
    return f", JIT prebuild of {modules} modules unfinished at the end{firsts}{menus}"


def print_campaign(report: CampaignReport) -> None:
    print(f"seed {report.seed}: {report.cases} cases in {report.seconds:.1f} s "
          f"({report.cases_per_second:,.1f} cases/s), next index {report.next_index}")
    from hicache_fuzz.harness.engine.engine_stats import summary_lines

    for line in summary_lines(report.extra):  # engine: byte-compared share, verified GB/s, stages, scale reached
        print(line)
    if "compile_seconds" in report.extra:
        extra = report.extra
        print(f"  wall {extra['wall_seconds']:.1f} s (worker start-up incl. JIT warm-up "
              f"{extra['worker_startup_seconds']:.1f} s, {extra['worker_restarts']} restarts, "
              f"{extra['spare_takeovers']} by a ready spare); JIT compile "
              f"{extra['compile_seconds']:.1f} s = {extra['compile_share_of_wall']:.0%} of the wall")
    if "startup" in report.extra:
        up = report.extra["startup"]
        worker = ", ".join(f"{k} {v:.1f}" for k, v in up["first_worker"].items())
        first = "none" if up["first_result_s"] is None else f"{up['first_result_s']:.1f} s"
        probing = up.get("probing", {})
        built = prebuild_text(up)
        standing = up.get("standing_pool") or {}
        if standing.get("first_worker"):
            worker = f"from the standing pool, {standing['workers_taken']} taken; started with {worker}"
        print(f"  start-up after launch: backends probed {up['backends_probed_s']:.1f} s "
              f"({probing.get('source', '?')}, {probing.get('seconds', 0.0):.1f} s probing){built}, first worker ready "
              f"{up['first_worker_ready_s']:.1f} s ({worker or 'in process'}), first result {first}")
    for backend, counts in sorted(report.outcomes.items()):
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"  {backend}: {listed}")
    for backend in report.backends:
        gaps = report.coverage.gaps(backend)
        if gaps and report.outcomes.get(backend):
            print(f"  coverage gaps of {backend} (never executed): {', '.join(gaps)}")
        for bucket, why in report.coverage.exemptions.get(backend, {}).items():
            print(f"  coverage of {backend}: {bucket} exempt ({why})")
    if "baseline" in report.extra:
        done = report.extra["baseline"]
        print(f"  baseline {done['baseline']}: {done['cases']} failures replayed in {done['seconds']:.1f} s"
              + (f"; {done['error']}" if done.get("error") else ""))
    if report.failures:
        from hicache_fuzz.harness.findings.trigger import describe

        new = report.new_failures
        statuses = report.extra.get("failure_status") or [{} for _ in report.failures]
        print(f"{report.failure_count} failures, {len(report.failures)} unique, {len(new)} new:")
        for failure, status in zip(report.failures, statuses, strict=True):
            print(f"  {status.get('status', 'new' if not failure.known else 'known').upper()} "
                  f"[{failure.signature}] x{failure.count} {failure.summary}")
            if "trigger" in status:
                print(f"      known: {failure.known} (trigger: {describe(status['trigger'])})")
            elif failure.known:
                print(f"      {failure.known}")
            elif failure.flaky:
                print(f"      flaky: ran {failure.flaky} in a fresh worker; reproducer: {failure.file}")
            elif failure.file:
                print(f"      reproducer: {failure.file}")
            for file, unmet in status.get("known_identity_outside_trigger", {}).items():
                print(f"      identity known from {file}, but outside its trigger ({describe(unmet)})")
    else:
        print("no failures")
