"""The gate's three phases: corpus replay, the fixed-seed campaign per backend, the ISA checks."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.campaign.baseline import (
    NEW,
    PRE_EXISTING,
    Baseline,
    judge_failure,
    replay_on_baseline,
    variant_files,
)
from hicache_fuzz.harness.campaign.options import CampaignOptions, run_from_options
from hicache_fuzz.harness.campaign.replay import Replayed, replay_entries, rerun_alone
from hicache_fuzz.harness.commands.gate_report import (
    BUDGET_EXCEEDED,
    FAILED,
    FLAKY,
    PASSED,
    REPLAY_STATUS,
    SKIPPED,
    UNEXPECTED_PASS,
    CampaignRow,
    GateReport,
    IsaRow,
    ReplayRow,
)
from hicache_fuzz.harness.findings.corpus import CorpusEntry, load_entry
from hicache_fuzz.harness.findings.known import KnownMap, known_trigger, outside_triggers
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.isa import check as isa
from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.model.exit_codes import Unavailable, UsageError
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.model.progress import ProgressLine, eta, eta_of_step
from hicache_fuzz.harness.pipeline.executor import Executor
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, auto_backends, available_backend, executor_for
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.registry import Registry

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.loop import CampaignReport

# Confirmation re-runs at once: each is a fresh worker importing torch and sglang (several CPU-seconds and its
# own device context), so a handful side by side, not one per core.
CONFIRM_SIDE_BY_SIDE = 4
# ROCm's own clang (LLVM >= 19 in ROCm 6.3+) has the AMDGPU backend; used when clang-19 is not on PATH.
ROCM_ROOT = Path("/opt/rocm")
ROCM_BUNDLED_CLANG = ROCM_ROOT / "llvm" / "bin" / "clang"


def campaign_backends(registry: Registry, machine: Machine, names: list[str]) -> list[Backend]:
    """--backend names, else the platform's set: the CPU reference on cpu, every real kernel on a GPU."""
    if names:
        return [available_backend(registry, name, machine) for name in names]
    backends = auto_backends(registry, machine)
    if machine.platform.kind != "cpu" and [b.name for b in backends] == ["reference"]:
        # auto_backends falls back to the reference; a GPU gate that tested no GPU kernel must not be green.
        reasons = "; ".join(f"{name}: {registry.get(name).probe(machine.platform).reason}"
                            for name in registry.names()
                            if name != "reference" and not registry.get(name).models_bug)
        raise Unavailable(f"no real-kernel backend can run on {machine.description} ({reasons or 'none installed'})")
    return backends


# ---- 1. corpus replay -----------------------------------------------------------------------------------

def replay_corpus(entries: list[CorpusEntry], registry: Registry, machine: Machine, execution: ExecutionOptions,
                  artifacts: Path, progress: ProgressLine | None = None) -> list[ReplayRow]:
    """Replay every entry (the replay service: one executor serves all runnable backends); a failing or
    unexpectedly passing entry leaves a reproducer under `artifacts`/replay."""
    journal = artifacts / "worker-journal" / "replay"
    line = progress or ProgressLine(False)
    started, done = time.perf_counter(), 0

    def on_replayed(replay: Replayed) -> None:
        nonlocal done
        done += 1
        line.update(f"[1/3] corpus replay: {done}/{len(entries)} entries ({replay.entry.path.name}), "
                    f"{eta(done, len(entries), time.perf_counter() - started)}")

    line.update(f"[1/3] corpus replay: {len(entries)} entries", force=True)
    return [_replay_row(replay, artifacts)
            for replay in replay_entries(entries, registry, machine, execution, journal, on_replayed=on_replayed)]


def _replay_row(replay: Replayed, artifacts: Path) -> ReplayRow:
    entry, case = replay.entry, replay.case
    expected = f"fail [{entry.signature}]" if entry.expect == "fail" else ""
    row = ReplayRow(str(entry.path), case.case_id, case.backend, SKIPPED, expected=expected, reason=replay.skipped)
    if replay.skipped:
        return row
    assert replay.result is not None and replay.verdict is not None  # set for every entry that ran
    result, judged = replay.result, replay.verdict
    row.seconds = replay.seconds
    row.outcome = result.outcome.value
    row.signature = replay.signature
    # The corpus format's own judgement (docs/reproducers.md): "fail" entries must fail with their recorded
    # signature; a pass (XPASS) or a different failure needs a human, exactly like a plain entry failing.
    row.status = REPLAY_STATUS[judged.label]
    row.reason = judged.detail if judged.label != "FAIL" else _first_line(result) or judged.detail
    if row.status in (FAILED, UNEXPECTED_PASS):
        row.artifact = str(save_reproducer(artifacts / "replay", case, result,
                                           {"expect": entry.expect, "gate_corpus_file": str(entry.path)}))
    return row


def _first_line(result: Result) -> str:
    text = result.summary or result.error
    return text.splitlines()[0] if text else ""


# ---- 2. fixed-seed campaign -----------------------------------------------------------------------------

def run_gate_campaign(backends: list[Backend], registry: Registry, machine: Machine, campaign: CampaignOptions,
                      budget_seconds: float, execution: ExecutionOptions, artifacts: Path,
                      progress: ProgressLine | None = None,
                      timings: dict[str, float] | None = None,
                      sharing_out: list[dict[str, Any]] | None = None,
                      executor: Executor | None = None) -> list[CampaignRow]:
    """One campaign per backend, each exactly `campaign.max_cases` cases; the budget is a hard cap on all.
    Failures whose signatures are in `campaign.known_signatures` (signature -> corpus file of an expected
    failure) are listed apart and are not findings: a known, unfixed sglang bug must not block every merge,
    a new one must. `executor` (campaign_executor's, its workers perhaps already starting) is closed here."""
    rows: list[CampaignRow] = []
    cases_per_backend = campaign.max_cases or 0
    line = progress or ProgressLine(False)
    line.update(f"[2/3] campaign: starting the executor for {len(backends)} backend(s)", force=True)
    if executor is None:
        executor = campaign_executor(backends, registry, machine, execution, artifacts)
    started = time.perf_counter()
    planned = cases_per_backend * len(backends)
    try:
        for number, backend in enumerate(backends, start=1):
            remaining = budget_seconds - (time.perf_counter() - started)
            if remaining <= 0:
                rows.append(CampaignRow(backend.name, cases_per_backend, 0, BUDGET_EXCEEDED))
                continue
            before = cases_per_backend * (number - 1)

            def on_result(_case: object, _result: object, so_far: CampaignReport, number: int = number,
                          name: str = backend.name, before: int = before) -> None:
                elapsed = time.perf_counter() - started
                line.update(f"[2/3] campaign {name} ({number}/{len(backends)}): {so_far.cases}/{cases_per_backend} "
                            f"cases, {so_far.failure_count} failures, {eta(before + so_far.cases, planned, elapsed)} "
                            f"(cap {budget_seconds - elapsed:.0f} s)")

            report = run_from_options(dataclasses.replace(campaign, max_seconds=remaining), [backend],
                                      machine.platform, executor, on_result)
            failures = [{**f.__dict__, "status": "new", **_outside(campaign.known_signatures, f.signature, f.backend,
                                                                   f.file)} for f in report.new_failures]
            known_found = [{**f.__dict__, "status": "known",
                            "trigger": known_trigger(campaign.known_signatures, f.signature, f.backend, f.known)}
                           for f in report.failures if f.known]
            status = PASSED
            if report.cases < cases_per_backend:
                status = BUDGET_EXCEEDED
            elif failures:
                status = FAILED
            digest = hashlib.sha256("\n".join(report.case_ids).encode()).hexdigest()
            # crashes the worker pool already ran again in a fresh worker, clean there: what confirm calls flaky
            flaky = [{**f.__dict__, "rerun_outcome": f.flaky} for f in report.flaky_failures]
            rows.append(CampaignRow(backend.name, cases_per_backend, report.cases, status,
                                    dict(sorted(report.outcomes.get(backend.name, {}).items())), failures,
                                    known_found, digest, report.first_index, round(report.seconds, 3), flaky))
    finally:
        workers = executor.worker_figures()
        if timings is not None and workers is not None:
            # Parts of the campaign phase (worker executors only): JIT compiles inside cases and waiting for
            # workers to start; what a cold JIT cache costs, and what a kept cache saves.
            timings["campaign_jit_compile"] = workers.compile_seconds
            timings["campaign_worker_startup"] = workers.startup_seconds
        executor.close()
        if sharing_out is not None and executor.sharing is not None:
            sharing_out.append(executor.sharing.to_dict())  # after close: the daemon's end is part of the record
    return rows


def _outside(known: KnownMap, bug: str, backend: str, file: str) -> dict[str, Any]:
    """For a new failure whose identity a known entry has: the trigger conditions its case does not meet."""
    outside = outside_triggers(known, bug, backend, load_entry(Path(file)).case) if file else {}
    return {"known_identity_outside_trigger": outside} if outside else {}


def judge_on_baseline(report: GateReport, baseline: Baseline, known: KnownMap, execution: ExecutionOptions,
                      artifacts: Path) -> None:
    """Re-judge the campaign's failures (found without the known corpus, each variant saved) on the baseline
    sglang (campaign/baseline.py judge_failure): failures it shares are pre-existing, not findings; failures it
    does not share are new findings even where a known entry matches; the known corpus decides only where the
    baseline could not replay."""
    files = {id(f): variant_files(f.get("file", ""), f.get("variants", []))
             for row in report.campaign for f in row.failures}
    replay = replay_on_baseline(baseline, [file for group in files.values() for file in group], execution.platform,
                                list(execution.backend_plugins), execution.case_timeout, artifacts / "baseline")
    for row in report.campaign:
        sorted_out: dict[str, list[dict[str, Any]]] = {NEW: [], "known": [], PRE_EXISTING: []}
        for failure in row.failures:
            status, detail, known_file = judge_failure(replay, files[id(failure)], failure["signature"],
                                                       failure["backend"], known, str(failure.get("outcome", "")))
            judged = {**failure, "status": status, "baseline_detail": detail}
            if known_file:
                judged.update(known=known_file,
                              trigger=known_trigger(known, failure["signature"], failure["backend"], known_file))
            sorted_out[status].append(judged)
        row.failures, row.pre_existing = sorted_out[NEW], sorted_out[PRE_EXISTING]
        row.known_failures = [*row.known_failures, *sorted_out["known"]]
        if row.status == FAILED and not row.failures:
            row.status = PASSED
    report.baseline = replay.to_dict()


# ---- 3. ISA checks --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IsaTarget:
    platform: str
    arch: str
    strict: bool

    @property
    def name(self) -> str:
        return f"{self.platform} {self.arch}{' strict' if self.strict else ''}"


def isa_targets(platform_kind: str) -> list[IsaTarget]:
    """cuda: the SASS check; rocm and cpu: the ROCm static check, strict (catches a scalarized load_nc
    that the optimizer re-merges) and with production flags."""
    if platform_kind == "cuda":
        return [IsaTarget(isa.PLATFORM_CUDA, arch, False) for arch in isa.DEFAULT_ARCHES[isa.PLATFORM_CUDA]]
    return [IsaTarget(isa.PLATFORM_ROCM, arch, strict) for strict in (True, False)
            for arch in isa.DEFAULT_ARCHES[isa.PLATFORM_ROCM]]


def resolve_isa_source(explicit: str | None, cache_dir: Path, allow_fetch: bool) -> isa.SglangSource:
    """sglang's kernels: --sglang-source, else the installed sglang, else the cached or fetched wheel."""
    if explicit:
        return isa.resolve_sglang_source(explicit, cache_dir)
    try:
        return isa.resolve_sglang_source(None, cache_dir)
    except isa.SourceUnavailable as not_installed:
        archive = isa_fetch.find_cached_sglang_archive(cache_dir, isa_fetch.DEFAULT_SGLANG_VERSION)
        if archive is None and not allow_fetch:
            raise not_installed
        if archive is None:
            try:
                archive = isa_fetch.fetch_sglang_archive(cache_dir)
            except isa_fetch.FetchError as error:
                raise isa.SourceUnavailable(f"{not_installed}; fetching it failed: {error}") from error
        return isa.resolve_sglang_source(archive, cache_dir)


def run_isa_checks(platform_kind: str, args: argparse.Namespace, artifacts: Path,
                   progress: ProgressLine | None = None) -> list[IsaRow]:
    targets = isa_targets(platform_kind)
    line = progress or ProgressLine(False)
    rows = [IsaRow(t.name, t.platform, t.arch, t.strict, SKIPPED) for t in targets]
    if args.no_isa:
        for row in rows:
            row.reason = "disabled by --no-isa"
        return rows
    cache_dir = Path(args.isa_cache_dir) if args.isa_cache_dir else isa_fetch.default_cache_dir()
    allow_fetch = not args.no_fetch
    if not allow_fetch:
        isa_fetch.report_offline(cache_dir, targets[0].platform, "gate --offline")
    isa_fetch.set_progress(lambda text: line.update(f"[3/3] ISA: {text}", force=True))
    try:
        line.update("[3/3] ISA: locating sglang's kernel sources and the toolchain", force=True)
        source = resolve_isa_source(args.sglang_source, cache_dir, allow_fetch)
        if targets[0].platform == isa.PLATFORM_ROCM:
            hip_include, device_libs = _rocm_install(platform_kind)
            # Every usable clang; each target takes the newest that supports it (gfx950 needs LLVM >= 20).
            rocm_tools, rocm_notes = isa.find_rocm_toolchains(
                cache_dir, allow_fetch, _rocm_clang(args, platform_kind), hip_include, (), device_libs)
            cuda_tools = None
        else:
            rocm_tools, rocm_notes = [], []
            cuda_tools = isa.find_cuda_toolchain(cache_dir, allow_fetch)
    except (isa.ToolchainUnavailable, isa.SourceUnavailable) as error:
        for row in rows:
            row.reason = f"ISA toolchain or sglang source unavailable: {error}"
        return rows
    except isa.BadInput as error:
        raise UsageError(str(error)) from None
    finally:
        isa_fetch.set_progress(None)
    out_dir = artifacts / "isa"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, (target, row) in enumerate(zip(targets, rows, strict=True), start=1):
        target_started = time.perf_counter()

        def on_module(text: str, number: int = number, name: str = target.name,
                      target_started: float = target_started) -> None:
            left = eta_of_step(number - 1, len(targets), target_started, started, time.perf_counter())
            line.update(f"[3/3] ISA {number}/{len(targets)} {name}: {text}, {left}", force=True)

        on_module("compiling")
        if target.platform == isa.PLATFORM_ROCM:
            try:
                arch_tools = isa.pick_rocm_toolchain(target.arch, rocm_tools, rocm_notes)
            except isa.ToolchainUnavailable as error:
                row.reason = f"not checked: {error}"  # stays SKIPPED: the gate is not green without it
                continue
            report = isa.check_rocm(source, target.arch, target.strict, toolchain=arch_tools,
                                    cache_dir=cache_dir, progress=on_module)
        else:
            report = isa.check_cuda(source, target.arch, toolchain=cuda_tools, cache_dir=cache_dir,
                                    progress=on_module)
        row.kernels = sum(1 for kernel in report.kernels if kernel.symbol)
        row.failing = sum(1 for kernel in report.kernels if not kernel.passed)
        row.status = PASSED if report.passed else FAILED
        row.reason = "" if report.passed else "; ".join(report.failures()[:3])
        row.seconds = report.seconds
        row.sglang_version = report.sglang_version
        json_path = out_dir / f"{target.name.replace(' ', '-')}.json"
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        row.report_json = str(json_path)
    return rows


def _rocm_install(platform_kind: str) -> tuple[list[str], str | None]:
    """On a ROCm machine, its own HIP headers and device libraries (no Debian download); elsewhere none.

    Not verified on a ROCm install here (no AMD machine): the committed ISA reports use Debian's HIP 5.7
    headers, which is what the cpu gate uses.
    """
    if platform_kind != "rocm" or not (ROCM_ROOT / "include" / "hip" / "hip_runtime.h").is_file():
        return [], None
    candidates = [ROCM_ROOT / "amdgcn" / "bitcode", *sorted(ROCM_ROOT.glob("lib/llvm/lib/clang/*/lib/amdgcn/bitcode"))]
    device_libs = next((str(folder) for folder in candidates if (folder / "ockl.bc").is_file()), None)
    return ([str(ROCM_ROOT / "include")], device_libs) if device_libs else ([], None)


def _rocm_clang(args: argparse.Namespace, platform_kind: str) -> str | None:
    if args.isa_clang:
        return str(args.isa_clang)
    if platform_kind == "rocm" and not shutil.which("clang-19") and ROCM_BUNDLED_CLANG.is_file():
        return str(ROCM_BUNDLED_CLANG)
    return None  # isa's default: clang-19


def campaign_executor(backends: list[Backend], registry: Registry, machine: Machine, execution: ExecutionOptions,
                      artifacts: Path) -> Executor:
    """The executor of the gate's fixed-seed campaigns (one for all backends), journaling under `artifacts`."""
    return executor_for(backends, registry, machine, execution, artifacts / "worker-journal" / "campaign")


def confirm_failures(report: GateReport, registry: Registry, machine: Machine, execution: ExecutionOptions) -> None:
    """Re-run every failing corpus entry and every new campaign bug once, alone in a fresh worker (the same
    identity logic as the phases that found them): what passes then is flaky, listed apart, not a finding.
    The re-runs go side by side, each in a worker of its own: on a GPU each pays a worker's start-up, and a
    change that breaks a kernel fails many entries at once."""
    files = [row.artifact for row in report.replay if row.status == FAILED and row.artifact]
    files += [str(f["file"]) for row in report.campaign for f in row.failures if f.get("file")]
    reruns = _rerun_alone_side_by_side(sorted(set(files)), registry, machine, execution)
    for row in report.replay:
        if row.status != FAILED or not row.artifact:
            continue
        rerun = reruns[row.artifact]
        if not rerun.outcome.is_failure:
            row.status, row.reason = FLAKY, f"{row.reason}; passed when re-run alone ({rerun.outcome.value})"
    for campaign_row in report.campaign:
        confirmed = []
        for failure in campaign_row.failures:
            file = failure.get("file")
            rerun = reruns[str(file)] if file else None
            if rerun is not None and not rerun.outcome.is_failure:
                campaign_row.flaky.append({**failure, "rerun_outcome": rerun.outcome.value})
            else:
                confirmed.append(failure)
        campaign_row.failures = confirmed
        if campaign_row.status == FAILED and not confirmed:
            campaign_row.status = PASSED


def _rerun_alone_side_by_side(files: list[str], registry: Registry, machine: Machine,
                              execution: ExecutionOptions) -> dict[str, Result]:
    """rerun_alone of each reproducer file's case, up to CONFIRM_SIDE_BY_SIDE at once on a GPU (one worker
    process each), one at a time on the CPU (in this process, where threads would only share its lock and a
    backend's own state); file -> result."""
    if not files:
        return {}
    at_once = CONFIRM_SIDE_BY_SIDE if machine.platform.kind != "cpu" else 1
    with ThreadPoolExecutor(max_workers=min(len(files), at_once)) as threads:
        results = threads.map(lambda file: rerun_alone(load_entry(Path(file)).case, registry, machine, execution),
                              files)
        return dict(zip(files, results, strict=True))


def run_fuzz_phases(report: GateReport, entries: list[CorpusEntry], backends: list[Backend], registry: Registry,
                     machine: Machine, campaign: CampaignOptions, budget_seconds: float,
                     execution: ExecutionOptions, artifacts: Path, progress: ProgressLine | None = None,
                     baseline: Baseline | None = None, known: KnownMap | None = None) -> None:
    """Phases 1 and 2: corpus replay, then the fixed-seed campaign; results go into `report`. With `baseline`,
    the campaign runs without its known corpus and its failures are judged on the baseline, `known` deciding
    only those the baseline could not replay (judge_on_baseline)."""
    line = progress or ProgressLine(False)
    # The campaign's workers start now, while the corpus replays in its own: a GPU worker's start-up (torch,
    # sglang, its probe and warm-up) is paid once, beside the replay, instead of after it.
    executor = campaign_executor(backends, registry, machine, execution, artifacts)
    try:
        executor.spawn_early()
        phase_started = time.perf_counter()
        report.replay = replay_corpus(entries, registry, machine, execution, artifacts, line)
    except BaseException:
        executor.close()
        raise
    report.seconds["replay"] = time.perf_counter() - phase_started
    replay_counts = Counter(r.status for r in report.replay)
    line.print(f"[1/3] corpus replay: {dict(sorted(replay_counts.items()))} in {report.seconds['replay']:.1f} s")

    phase_started = time.perf_counter()
    campaign_parts: dict[str, float] = {}
    sharing: list[dict[str, Any]] = []
    report.campaign = run_gate_campaign(backends, registry, machine, campaign, budget_seconds, execution,
                                        artifacts, line, campaign_parts, sharing, executor)
    report.gpu_sharing = sharing[0] if sharing else None
    report.seconds["campaign"] = time.perf_counter() - phase_started
    report.seconds.update(campaign_parts)
    phase_started = time.perf_counter()
    line.update("[2/3] campaign: re-running new failures alone to confirm them", force=True)
    confirm_failures(report, registry, machine, execution)
    report.seconds["confirm"] = time.perf_counter() - phase_started
    if baseline is not None:
        phase_started = time.perf_counter()
        line.update(f"[2/3] campaign: replaying its failures on the baseline {baseline.describe()}", force=True)
        judge_on_baseline(report, baseline, known or {}, execution, artifacts)
        report.seconds["baseline"] = time.perf_counter() - phase_started
    line.clear()
    for row in report.campaign:
        print(f"[2/3] campaign {row.backend}: {row.status}, {row.cases}/{row.planned_cases} cases, "
              f"{len(row.failures)} new bugs, {len(row.known_failures)} known, {len(row.flaky)} flaky, "
              f"{len(row.pre_existing)} pre-existing on the baseline, "
              f"{row.seconds:.1f} s", flush=True)
