"""``hicache-fuzz fuzz --workers N``: one campaign spread over worker processes, one or more per GPU.

Worker ``k`` of ``N`` runs shard ``k/N`` of the seed's case space (the indices ``i`` with ``i % N == k``; case
``i`` depends only on the seed, ``i`` and the backend's space), so the workers never repeat each other's cases
and together run exactly the cases of the unsharded campaign. Combined with ``--shard K/M`` (one of M nodes or
CI jobs), worker ``k`` runs the indices with ``i % (M * N) == K + M * k`` (:func:`worker_shard`): together the
workers run exactly shard ``K/M``. With ``--runs R``, each worker gets the share of
``R`` that the unsharded run would have spent on its indices (:func:`shard_case_budget`); with
``--max-total-time T`` each runs for ``T`` seconds.

Flow of the parent (it never initializes CUDA itself: it only counts devices, through NVML):

1. ``prepare``: one child pinned to the first device resolves the backends (so every worker runs the same
   list even when it was chosen automatically) and compiles the JIT modules the backends' spaces can draw
   into sglang's on-disk cache (``SGLANG_JIT_CACHE_DIR``, inherited by every worker), in parallel threads.
   sglang's cache is content-addressed and publishes builds by atomic rename under a per-variant file lock,
   so even without this step workers would not corrupt it or compile one variant twice; warming it first
   keeps compiles out of the workers' measured time and does them 16 at a time instead of one per case.
2. ``shard``: ``N`` children, worker ``k`` pinned to device ``k % G`` by ``CUDA_VISIBLE_DEVICES`` (CUDA) or
   ``HIP_VISIBLE_DEVICES`` (ROCm) set in its environment before it starts, so before torch initializes.
   Each runs its shard through the usual executor (crash-isolating worker process for GPU backends), writes
   failures straight into the shared corpus (one file per case id, written atomically, so workers do not
   collide) and its report to ``<corpus>/.parallel/``.
3. The reports are merged (:mod:`hicache_fuzz.harness.reporting.merge`) into the one written by ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.campaign.stop import Checkpoint, ForwardSignals, StopOnSignal
from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Unavailable,
    UsageError,
)

if TYPE_CHECKING:  # the parent imports the campaign and pipeline layers (and torch) only when it runs
    from hicache_fuzz.harness.campaign.loop import CampaignReport
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.harness.model.outcome import Result
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions

# Workers per GPU for `--workers auto`: a second worker on a GPU ran the same cases no faster than one per GPU
# (docs/parallel.md), so it does not pay.
AUTO_WORKERS_PER_GPU = 1
WORKERS_PER_GPU_ENV = "HICACHE_FUZZ_WORKERS_PER_GPU"
VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
LOG_TAIL_LINES = 15
WORKERS_PER_CORE = 4  # the --workers cap (max_workers): a typo like 100000 must not start 100,000 processes


class ParallelUsageError(ValueError):
    """Bad --workers value or impossible worker layout; exit code 2."""


# ---- devices, without initializing CUDA --------------------------------------------------------------------

def accelerator_kind() -> str:
    """cuda, rocm or cpu: torch's build and a device count that torch takes from NVML (or amdsmi) without
    creating a CUDA context, which a parent that forks workers must not hold."""
    import torch

    if torch.cuda.device_count() == 0:
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def visible_devices(kind: str, environ: dict[str, str] | None = None) -> list[str]:
    """The device tokens this process may hand out: the parent's own *_VISIBLE_DEVICES list when set (a CI
    runner may already have given it a subset), else 0..count-1."""
    environ = dict(os.environ) if environ is None else environ
    if kind == "cpu":
        return []
    for name in (VISIBLE_DEVICES_ENV[kind], "CUDA_VISIBLE_DEVICES"):
        listed = environ.get(name)
        if listed is not None and listed.strip():
            return [token.strip() for token in listed.split(",") if token.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def pinning_env(kind: str, device: str | None) -> dict[str, str]:
    """Environment entries that make a fresh process see only `device` (nothing to pin on the CPU)."""
    if kind == "cpu" or device is None:
        return {}
    pinned = {VISIBLE_DEVICES_ENV[kind]: device}
    if kind == "rocm":
        # ROCm's torch also honours CUDA_VISIBLE_DEVICES, applied on top of HIP's list: drop an inherited one.
        pinned["CUDA_VISIBLE_DEVICES"] = "0"
    return pinned


def workers_per_gpu(environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ) if environ is None else environ
    text = environ.get(WORKERS_PER_GPU_ENV, "")
    try:
        value = int(text) if text else AUTO_WORKERS_PER_GPU
    except ValueError:
        raise ParallelUsageError(f"${WORKERS_PER_GPU_ENV}={text!r}: expected a whole number") from None
    if value < 1:
        raise ParallelUsageError(f"${WORKERS_PER_GPU_ENV}={text!r}: need at least 1")
    return value


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def resolve_worker_count(text: str, kind: str, devices: list[str]) -> int:
    if text == "auto":
        return len(devices) * workers_per_gpu() if devices else cpu_count()
    try:
        count = int(text)
    except ValueError:
        raise ParallelUsageError(f"--workers {text!r}: expected a number or auto") from None
    if count < 1:
        raise ParallelUsageError(f"--workers {text!r}: need at least 1")
    cap = max_workers(devices)
    if count > cap:
        raise ParallelUsageError(f"--workers {text}: this machine can run at most {cap} workers "
                                 f"({WORKERS_PER_CORE} per CPU core, {cpu_count()} cores"
                                 + (f"; or {workers_per_gpu()} per GPU, {len(devices)} GPUs" if devices else "") + ")")
    return count


def max_workers(devices: list[str]) -> int:
    """The most workers --workers accepts: WORKERS_PER_CORE per CPU core (each worker is a busy process; more only
    oversubscribes the cores), never fewer than --workers auto would start."""
    return max(WORKERS_PER_CORE * cpu_count(), len(devices) * workers_per_gpu() if devices else 1)


def device_for_worker(worker: int, devices: list[str]) -> str | None:
    return devices[worker % len(devices)] if devices else None


# ---- splitting a case budget -------------------------------------------------------------------------------

def _count_congruent(low: int, high: int, k: int, n: int) -> int:
    """How many i in [low, high) have i % n == k."""
    def below(x: int) -> int:  # how many in [0, x)
        return max(0, (x - k + n - 1) // n)

    return below(high) - below(low)


def shard_case_budget(total_cases: int, backend_count: int, shard: tuple[int, int], start_index: int = 0) -> int:
    """The cases shard (k, n) runs of an unsharded campaign of `total_cases` cases from `start_index`.

    The campaign runs every backend at index i before index i+1, so it covers `total_cases // B` whole indices
    from `start_index` and the first `total_cases % B` backends of the next one. A shard runs its indices in
    the same order, so with this budget the shards together run exactly the unsharded campaign's cases.
    """
    k, n = shard
    whole, partial = divmod(total_cases, backend_count)
    end = start_index + whole
    budget = backend_count * _count_congruent(start_index, end, k, n)
    if partial and end % n == k:
        budget += partial
    return budget


def worker_shard(node_shard: tuple[int, int], worker: int, workers: int) -> tuple[int, int]:
    """The campaign shard of worker `worker` of `workers` on a node (or job) that runs shard (k, n): the node's
    indices k, k+n, k+2n, ... dealt out round-robin, i.e. the i with i % (n * workers) == k + n * worker."""
    k, n = node_shard
    return k + n * worker, n * workers


def worker_case_budget(total_cases: int, backend_count: int, node_shard: tuple[int, int], worker: int,
                       workers: int, start_index: int = 0) -> int:
    """Worker `worker`'s share of a node campaign of shard `node_shard` with `--runs total_cases`.

    Number the node's own indices 0, 1, 2, ... (v for i = k + n * v): the node campaign runs them in that
    order from the first i >= start_index, and the workers split that sequence like shards of an unsharded
    campaign, so :func:`shard_case_budget` applies to the virtual indices.
    """
    k, n = node_shard
    first_virtual = max(0, -(-(start_index - k) // n))  # the first v with k + n * v >= start_index
    return shard_case_budget(total_cases, backend_count, (worker, workers), first_virtual)


# ---- jobs: what a worker process is told -------------------------------------------------------------------

@dataclass
class ShardJob:
    platform: str  # cpu, cuda or rocm: explicit, so a worker that cannot see its GPU fails instead of using the CPU
    backends: list[str]  # empty only for prepare (= choose automatically)
    plugins: list[str]
    seed: int
    runs_total: int | None  # the node campaign's --runs; each worker takes its share
    max_seconds: float | None
    corpus: str
    journal: str
    report: str  # where the worker writes its JSON report
    shard: tuple[int, int] = (0, 1)  # the node's (job's) --shard K/N; the workers split it further
    worker: int = 0
    workers: int = 1
    start_index: int = 0
    byte_budget: int | None = None
    space_overrides: dict[str, Any] = field(default_factory=dict)  # --space / --set, plain JSON
    isolate: str = "auto"
    case_timeout: float = 60.0
    stop_on_failure: bool = False
    stop_on_new_failure: bool = False
    record_case_ids: bool = False
    minimize: bool = False
    warm_up: bool = True
    known_signatures: dict[str, Any] = field(default_factory=dict)  # fuzz --known (findings/known.py KnownMap)
    device: str | None = None  # the device token the worker was pinned to, for its report

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["shard"] = list(self.shard)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardJob:
        data = dict(data)
        data["shard"] = tuple(data["shard"])
        return cls(**data)


def shard_job(kind: str, backends: list[str], options: CampaignOptions, execution: ExecutionOptions,
              record_case_ids: bool = False, warm_up: bool = True) -> ShardJob:
    """The job every worker of a node campaign starts from (run_parallel fills in worker, device, paths)."""
    return ShardJob(platform=kind, backends=list(backends), plugins=list(execution.backend_plugins),
                    seed=options.seed, runs_total=options.max_cases, max_seconds=options.max_seconds,
                    corpus=str(options.corpus), journal="", report="", shard=options.shard,
                    start_index=options.start_index, byte_budget=options.byte_budget,
                    space_overrides=dict(options.space_overrides), isolate=execution.isolate,
                    case_timeout=execution.case_timeout, stop_on_failure=options.stop_on_first_failure,
                    stop_on_new_failure=options.stop_on_new_failure,
                    record_case_ids=record_case_ids, minimize=options.minimize, warm_up=warm_up,
                    known_signatures=dict(options.known_signatures))


def _campaign_options(job: ShardJob, max_cases: int | None) -> CampaignOptions:
    """This worker's campaign: its share of the node's cases, its shard of the node's shard."""
    from hicache_fuzz.harness.campaign.options import CampaignOptions

    return CampaignOptions(job.seed, max_cases, job.max_seconds, Path(job.corpus),
                           worker_shard(job.shard, job.worker, job.workers), job.start_index, job.byte_budget,
                           job.stop_on_failure, job.known_signatures, job.minimize, job.record_case_ids,
                           space_overrides=dict(job.space_overrides),
                           stop_on_new_failure=job.stop_on_new_failure)


# ---- worker side: prepare and shard ------------------------------------------------------------------------

def prepare(job: ShardJob) -> dict[str, Any]:
    """Resolve the backends and warm sglang's JIT cache; runs in a child pinned to the first device."""
    from hicache_fuzz.harness.pipeline.setup import auto_backends, available_backend, machine_for, registry_for

    machine = machine_for(job.platform)
    registry = registry_for(job.plugins)
    if job.backends:
        backends = [available_backend(registry, name, machine) for name in job.backends]
    else:
        backends = auto_backends(registry, machine)
    warm_up_seconds = 0.0
    compiled: dict[str, float] = {}
    if job.warm_up and machine.platform.kind != "cpu":
        from hicache_fuzz.kernels.compile_books import books_of, warm_up

        warm_up_seconds = warm_up(backends, machine.platform, _campaign_options(job, None).space())
        compiled = {key: spent for books in books_of(backends) for key, spent in books.compiled_keys.items()}
    return {"backends": [b.name for b in backends], "platform": machine.description,
            "warm_up_seconds": round(warm_up_seconds, 3), "compiled_modules": compiled,
            "jit_cache": os.environ.get("SGLANG_JIT_CACHE_DIR", "~/.cache/sglang/jit (sglang's default)")}


def run_shard(job: ShardJob) -> dict[str, Any]:
    """Run one shard of the campaign in this process and return its report (as JSON data)."""
    from hicache_fuzz.harness.campaign.options import run_from_options
    from hicache_fuzz.harness.pipeline.executor import Executor, InProcessExecutor
    from hicache_fuzz.harness.pipeline.setup import available_backend, machine_for, needs_worker, registry_for
    from hicache_fuzz.harness.pipeline.worker import GPU_SPARE_WORKERS, WorkerExecutor

    # SIGTERM from the parent (itself stopped by a signal) ends the shard after its case in flight; from here
    # on, a signal during start-up ends it before its first case, with a report of 0 cases.
    stop = StopOnSignal()
    machine = machine_for(job.platform)
    registry = registry_for(job.plugins)
    isolate = needs_worker([registry.get(name) for name in job.backends], job.isolate)
    started = time.perf_counter()
    executor: Executor
    if isolate:
        # The isolating worker imports sglang (~12 s) and loads the JIT modules prepare compiled (warm_up), in
        # its own process: launch it now, so that it overlaps the probes below (which import sglang here too),
        # and wait for it before the campaign's clock, and its cases/s, start.
        executor = WorkerExecutor(job.backends, job.plugins, machine.platform.kind, job.case_timeout, job.journal,
                                  startup_timeout_s=600, warm_up=job.warm_up,
                                  spares=GPU_SPARE_WORKERS if machine.platform.kind != "cpu" else 0)
    else:
        executor = InProcessExecutor(registry, machine)
    executor.spawn_early()
    try:
        backends = [available_backend(registry, name, machine) for name in job.backends]
        executor.start()
        startup_seconds = time.perf_counter() - started
        max_cases = (None if job.runs_total is None else worker_case_budget(
            job.runs_total, len(backends), job.shard, job.worker, job.workers, job.start_index))
        print(f"shard worker {job.worker} of {job.workers}: running cases", flush=True)  # to its log
        # the shard's report is rewritten as it goes, so a parent killed by a second signal can still merge it
        checkpoint = Checkpoint(job.report)

        def on_result(case: Case, result: Result, report: CampaignReport) -> None:
            checkpoint(report, force=result.outcome.is_failure)

        report = run_from_options(_campaign_options(job, max_cases), backends, machine.platform, executor,
                                  on_result, should_stop=stop.requested)
    finally:
        stop.restore()
        executor.close()
    data = report.to_dict()
    if stop.signal_name:
        data["stopped_by"] = stop.signal_name
    data.update(device=job.device, device_description=machine.description, pid=os.getpid(),
                startup_seconds=round(startup_seconds, 3))
    workers = executor.worker_figures()
    if workers is not None:
        data.update(compile_seconds=round(workers.compile_seconds, 3), worker_restarts=workers.restarts,
                    spare_takeovers=workers.spares_used)
    return data


def _worker_main(argv: list[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.campaign.parallel {prepare,shard} JOB.json``: writes the job's report file."""
    from hicache_fuzz.harness.pipeline.worker import WorkerError

    parser = argparse.ArgumentParser(prog="hicache_fuzz.harness.campaign.parallel")
    parser.add_argument("step", choices=["prepare", "shard"])
    parser.add_argument("job", type=Path)
    parsed = parser.parse_args(argv)
    job = ShardJob.from_dict(json.loads(parsed.job.read_text()))
    try:
        data = prepare(job) if parsed.step == "prepare" else run_shard(job)
    except UsageError as exc:
        print(f"hicache-fuzz worker: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Unavailable, WorkerError) as exc:
        print(f"hicache-fuzz worker: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    from hicache_fuzz.harness.model.output_paths import write_json_atomic

    write_json_atomic(Path(job.report), data)
    return EXIT_FAILURES if data.get("new_failure_signatures") else EXIT_CLEAN


# ---- parent side -------------------------------------------------------------------------------------------

@dataclass
class _Child:
    worker: int
    job: ShardJob
    log: Path
    process: subprocess.Popen[bytes]


def _spawn(step: str, job: ShardJob, job_file: Path, log: Path, kind: str,
           thread_count: int) -> subprocess.Popen[bytes]:
    from hicache_fuzz.harness.model.output_paths import write_json_atomic

    write_json_atomic(job_file, job.to_dict())
    env = dict(os.environ)
    env.update(pinning_env(kind, job.device))
    env.setdefault("OMP_NUM_THREADS", str(thread_count))  # N workers x all cores each would oversubscribe
    env.setdefault("PYTHONUNBUFFERED", "1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        # Its own session: the worker and what it starts (isolating worker, nvcc) can be stopped as a group.
        return subprocess.Popen([sys.executable, "-m", "hicache_fuzz.harness.campaign.parallel", step, str(job_file)],
                                stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _stop(children: list[_Child]) -> None:
    for child in children:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGTERM)
    for child in children:
        try:
            child.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()


def run_prepare_step(base: ShardJob, kind: str, devices: list[str], run_dir: Path,
                     forward: ForwardSignals | None = None) -> tuple[dict[str, Any] | None, int, str]:
    """(the prepare step's result, EXIT_CLEAN, "") or (None, exit code, what went wrong)."""
    job = dataclasses.replace(base, report=str(run_dir / "prepare.json"), device=device_for_worker(0, devices))
    log = run_dir / "prepare.log"
    process = _spawn("prepare", job, run_dir / "prepare-job.json", log, kind, cpu_count())
    if forward is not None:
        forward.add(process)
    code = process.wait()
    if forward is not None and forward.signal_name:
        return None, EXIT_UNAVAILABLE, f"stopped by {forward.signal_name} while preparing; no case ran"
    if code != EXIT_CLEAN:
        exit_code = code if code in (EXIT_USAGE, EXIT_UNAVAILABLE) else EXIT_USAGE
        return None, exit_code, f"prepare step failed (exit {code}), log {log}:\n{_log_tail(log)}"
    return json.loads((run_dir / "prepare.json").read_text()), EXIT_CLEAN, ""


@dataclass
class ParallelRun:
    merged: dict[str, Any]
    prepare: dict[str, Any]
    exit_code: int
    workers: int
    devices: list[str]
    wall_seconds: float
    problems: list[str]


def run_parallel(base: ShardJob, workers: int, kind: str, devices: list[str], run_dir: Path,
                 echo: bool = True, prepared: dict[str, Any] | None = None) -> ParallelRun:
    """Prepare once (unless `prepared`, an earlier run's prepare result, is given), run `workers` shards side
    by side, merge their reports. SIGTERM/SIGINT meanwhile: see ForwardSignals."""
    say = print if echo else (lambda *_, **__: None)
    started = time.perf_counter()
    threads = max(1, cpu_count() // workers)
    forward = ForwardSignals()
    try:
        return _run_parallel(base, workers, kind, devices, run_dir, say, prepared, forward, started, threads)
    finally:
        forward.restore()


def _run_parallel(base: ShardJob, workers: int, kind: str, devices: list[str], run_dir: Path, say: Any,
                  prepared: dict[str, Any] | None, forward: ForwardSignals, started: float,
                  threads: int) -> ParallelRun:
    from hicache_fuzz.harness.reporting.merge import merge_reports

    if prepared is None:
        prepared, code, problem = run_prepare_step(base, kind, devices, run_dir, forward)
        if prepared is None:
            return ParallelRun({}, {}, code, workers, devices, time.perf_counter() - started, [problem])
    warmed = (f"; JIT warm-up {prepared['warm_up_seconds']:.1f} s ({len(prepared['compiled_modules'])} modules)"
              f" into {prepared['jit_cache']}" if prepared["compiled_modules"] else "")
    say(f"backends: {', '.join(prepared['backends'])}{warmed}", flush=True)

    children: list[_Child] = []
    try:
        for worker in range(workers):
            job = dataclasses.replace(base, backends=prepared["backends"], worker=worker, workers=workers,
                                      device=device_for_worker(worker, devices),
                                      journal=str(run_dir / f"journal-{worker}"),
                                      report=str(run_dir / f"report-{worker}.json"))
            if job.runs_total is not None and not worker_case_budget(job.runs_total, len(job.backends), job.shard,
                                                                     worker, workers, job.start_index):
                continue  # fewer cases than workers: this one has none
            if forward.signal_name:
                break  # stopped while starting: no more workers
            log = run_dir / f"worker-{worker}.log"
            process = _spawn("shard", job, run_dir / f"job-{worker}.json", log, kind, threads)
            children.append(_Child(worker, job, log, process))
            forward.add(process)
        where = ", ".join(f"{c.worker}->{'gpu ' + c.job.device if c.job.device else 'cpu'}" for c in children)
        say(f"{len(children)} workers started ({where}); logs and reports in {run_dir}", flush=True)
        for child in children:
            child.process.wait()
    except KeyboardInterrupt:  # a second signal: the shards are killed; keep what they had written (exit 130)
        _stop(children)
        keep_partial_report(children, run_dir, workers)
        raise
    except BaseException:
        _stop(children)
        raise

    reports, sources, problems = [], [], []
    exit_code = EXIT_CLEAN
    for child in children:
        code = child.process.returncode
        report_path = Path(child.job.report)
        if code in (EXIT_CLEAN, EXIT_FAILURES) and report_path.exists():
            reports.append(json.loads(report_path.read_text()))
            sources.append(str(report_path))
            continue
        if forward.signal_name and code == -signal.SIGTERM:  # stopped while importing, before any case ran
            say(f"worker {child.worker} was stopped before its first case", flush=True)
            continue
        problems.append(f"worker {child.worker} of {workers} exited {code} without a report; "
                        f"log {child.log}:\n{_log_tail(child.log)}")
        exit_code = max(exit_code, code if code in (EXIT_USAGE, EXIT_UNAVAILABLE) else EXIT_USAGE)
    merged = merge_reports(reports, sources) if reports else {}
    if forward.signal_name and not reports and not problems:
        problems.append(f"stopped by {forward.signal_name} before any worker ran a case: no report")
    if merged:
        merged.update(workers=workers, devices=devices, warm_up=prepared,
                      wall_seconds=round(time.perf_counter() - started, 3))
        if forward.signal_name:
            merged.update(stopped_early=True, stopped_by=forward.signal_name)
        if exit_code == EXIT_CLEAN and merged["new_failure_signatures"]:
            exit_code = EXIT_FAILURES
    return ParallelRun(merged, prepared, exit_code, workers, devices, time.perf_counter() - started, problems)


def keep_partial_report(children: list[_Child], run_dir: Path, workers: int) -> Path | None:
    """After a second signal killed the shards: merge the reports they had written (their checkpoints, rewritten
    every few seconds, or their final ones) into ``run_dir/report-interrupted.json`` and say on stderr where it
    and the shards' own reports are. The failures are in the corpus already (saved as found). Returns the path
    of the merged report, None when no shard had written one (the message then names their logs)."""
    from hicache_fuzz.harness.model.json_input import MAX_REPORT_FILE_BYTES, InputError, read_json_file
    from hicache_fuzz.harness.model.output_paths import write_json_atomic
    from hicache_fuzz.harness.reporting.merge import merge_reports

    paths = [Path(child.job.report) for child in children if Path(child.job.report).is_file()]
    if not paths:
        print(f"hicache-fuzz: interrupted again: no shard had written a report yet; their logs are "
              f"{run_dir}/worker-*.log, the failures found so far are in the corpus", file=sys.stderr, flush=True)
        return None
    try:
        reports = [read_json_file(path, MAX_REPORT_FILE_BYTES) for path in paths]
        merged = merge_reports(reports, [str(p) for p in paths], True)
        merged.update(workers=workers, partial=True, stopped_early=True, stopped_by="second signal")
        target = run_dir / "report-interrupted.json"
        write_json_atomic(target, merged)
    except (InputError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"hicache-fuzz: interrupted again; the shards' reports could not be merged ({exc}); they are "
              f"{', '.join(map(str, paths))}", file=sys.stderr, flush=True)
        return None
    print(f"hicache-fuzz: interrupted again: the shards were killed; their reports so far, merged (partial): "
          f"{target}; each shard's: {', '.join(map(str, paths))}", file=sys.stderr, flush=True)
    return target


if __name__ == "__main__":
    sys.exit(_worker_main())
