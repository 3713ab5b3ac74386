"""The pre-merge gate: ``hicache-fuzz gate --platform rocm|cuda|cpu --budget-seconds N``.

One command a CI job runs and trusts. It does, in order:

1. **Corpus replay.** Every case and reproducer file under ``--corpus`` (default ``corpus/``; repeatable) is
   replayed on the backend it names. An entry whose backend cannot run here is *skipped* with the reason;
   an entry marked as an expected-failing regression (``"expect": "fail"``, docs/reproducers.md) counts as
   *expected* when it still fails with its recorded signature, and as a finding when it passes or fails
   differently (judged by :func:`hicache_fuzz.harness.reproducer.judge_replay`).
2. **Fixed-seed campaign.** ``--seed`` (default :data:`DEFAULT_SEED`) over every backend reachable on the
   platform: the CPU reference on ``cpu``; every available real-kernel backend on ``cuda``/``rocm``, in a
   worker process so a GPU fault becomes a CRASH result instead of killing the gate.
3. **ISA checks** (:mod:`hicache_fuzz.harness.isa`): ``rocm`` and ``cpu`` run the ROCm static check (strict
   and production flags, gfx90a + gfx942, with clang-19 and no GPU); ``cuda`` runs the SASS check. A check
   that cannot run (no compiler, no sglang source) is *skipped* with the reason, and a skipped ISA check
   keeps the gate from being green unless ``--allow-skip-isa`` is given.
4. **Reports**: JUnit XML (``--junit``), a Markdown summary for a PR comment (``--markdown``), JSON
   (``--json``); failing cases are left as reproducer files under ``--artifacts`` for CI to upload.

Determinism: the verdict depends only on the inputs (platform, seed, budget, corpus, backends, sglang), never
on the machine's speed. The budget is turned into a fixed number of cases per backend *before* anything
runs (:func:`planned_cases_per_backend`: budget x a fixed planning rate per platform / number of backends);
case ``i`` of the campaign depends only on (seed, i, backend), so the same inputs run the same cases. The
budget is then only a hard wall-clock cap: a campaign that has not finished its planned cases when the cap
is reached fails the gate loudly (``budget_exceeded``) instead of passing with fewer cases. The JSON's
``verdict`` object holds only deterministic fields (no timings); two runs with the same inputs write the
same ``verdict``.

Exit codes: 0 pass; 1 findings (a failing or unexpectedly passing corpus entry, a campaign failure, a
failing ISA check, or the campaign exceeding its budget); 2 bad usage or input (unknown backend, missing
corpus folder, malformed corpus file); 3 unavailable (the requested platform is absent, no real-kernel
backend can run on the GPU, the worker process cannot start, or an ISA check was skipped without
``--allow-skip-isa``). Findings win over 3: a gate that found a bug exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness import isa, isa_fetch
from hicache_fuzz.harness.campaign import CampaignConfig, known_failures, run_campaign
from hicache_fuzz.harness.cli import (
    EXIT_CLEAN,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    Unavailable,
    UsageError,
    auto_backends,
    available_backend,
    machine_for,
    make_executor,
    registry_for,
)
from hicache_fuzz.harness.corpus import CorpusEntry, iter_case_files, load_entry, write_json_atomic
from hicache_fuzz.harness.executor import Executor
from hicache_fuzz.harness.generate import CaseSpace
from hicache_fuzz.harness.junit import JUnitCase, write_junit
from hicache_fuzz.harness.outcome import Result
from hicache_fuzz.harness.platform import Machine
from hicache_fuzz.harness.reproducer import judge_replay, save_reproducer
from hicache_fuzz.harness.signature import signature
from hicache_fuzz.harness.worker import WorkerError
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.registry import Registry

GATE_FORMAT = "hicache-fuzz-gate"
GATE_FORMAT_VERSION = 1
# A fixed default so that a PR gate is derandomized (as Hypothesis and ClusterFuzz advise for PR CI); the
# nightly campaign is where random seeds belong.
DEFAULT_SEED = 20260610
DEFAULT_CORPUS = Path("corpus")
DEFAULT_ARTIFACTS = Path("gate-artifacts")
DEFAULT_BUDGET_SECONDS = 300.0
# Cases per second per backend used to turn --budget-seconds into a case count. Deliberately far below what
# was measured, so the planned cases finish inside the cap on a slow or busy runner: the CPU reference ran
# 69 cases/s (1000 cases in 14.5 s) on 2 cores shared with a compile job. GPU backends pay a worker start
# and a JIT compile (8-10 s) per new kernel configuration inside the campaign: 6 sglang backends x 5 cases
# took 141 s on an H200 from a cold JIT cache (0.2 cases/s), so the GPU rate assumes mostly-cold compiles.
PLANNING_CASES_PER_SECOND: dict[str, float] = {"cpu": 5.0, "cuda": 0.25, "rocm": 0.25}
# ROCm's own clang (LLVM >= 19 in ROCm 6.3+) has the AMDGPU backend; used when clang-19 is not on PATH.
ROCM_ROOT = Path("/opt/rocm")
ROCM_BUNDLED_CLANG = ROCM_ROOT / "llvm" / "bin" / "clang"
# Subfolders of --artifacts the gate owns and clears at start, so CI never uploads a previous run's files.
ARTIFACT_SUBFOLDERS = ("campaign", "replay", "isa", "worker-journal")

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
EXPECTED, UNEXPECTED_PASS = "expected", "unexpected_pass"  # replay of an entry marked "expect": "fail"
BUDGET_EXCEEDED = "budget_exceeded"  # a campaign that did not finish its planned cases within the cap
# judge_replay's labels -> the gate's replay statuses.
REPLAY_STATUS = {"PASS": PASSED, "FAIL": FAILED, "XFAIL": EXPECTED, "XPASS": UNEXPECTED_PASS,
                 "FAIL-OTHER": FAILED}


# ---- results --------------------------------------------------------------------------------------------

@dataclass
class ReplayRow:
    file: str  # as given (relative to the corpus folder's parent when that is how it was named)
    case_id: str
    backend: str
    status: str  # passed | failed | expected | unexpected_pass | skipped
    outcome: str = ""  # the Outcome value observed ("" when skipped)
    signature: str = ""
    expected: str = ""  # "fail [signature]" for an expected-failing regression ("" for a plain entry)
    reason: str = ""  # why skipped, or what went wrong, in one line
    artifact: str = ""  # reproducer written under --artifacts for a failure
    seconds: float = 0.0


@dataclass
class CampaignRow:
    backend: str
    planned_cases: int
    cases: int
    status: str  # passed | failed | budget_exceeded
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)  # one per unique NEW signature (findings)
    # failures whose signature a corpus entry marked "expect": "fail" already records (not findings)
    known_failures: list[dict[str, Any]] = field(default_factory=list)
    case_ids_sha256: str = ""  # digest of the case ids run, in order: equal digests = equal cases
    first_index: int = 0
    seconds: float = 0.0


@dataclass
class IsaRow:
    name: str  # e.g. "rocm gfx942 strict"
    platform: str
    arch: str
    strict: bool
    status: str  # passed | failed | skipped
    kernels: int = 0
    failing: int = 0
    reason: str = ""  # why skipped, or the first failures
    sglang_version: str = ""  # of the kernel sources checked
    report_json: str = ""
    seconds: float = 0.0


@dataclass
class GateReport:
    platform: str
    machine: str
    seed: int
    budget_seconds: float
    cases_per_backend: int
    command: str
    allow_skip_isa: bool
    corpus_dirs: list[str]
    replay: list[ReplayRow] = field(default_factory=list)
    campaign: list[CampaignRow] = field(default_factory=list)
    isa: list[IsaRow] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds (never in the verdict)

    # A finding is anything a human must look at; a skipped ISA check is not a finding but is not green.
    def findings(self) -> list[str]:
        lines = [f"corpus {r.file}: {r.status} ({r.reason})" for r in self.replay
                 if r.status in (FAILED, UNEXPECTED_PASS)]
        for row in self.campaign:
            if row.status == BUDGET_EXCEEDED:
                lines.append(f"campaign {row.backend}: budget exceeded after {row.cases} of "
                             f"{row.planned_cases} planned cases")
            lines.extend(f"campaign {row.backend}: [{f['signature']}] x{f['count']} {f['summary']}"
                         for f in row.failures)
        lines.extend(f"isa {r.name}: {r.reason}" for r in self.isa if r.status == FAILED)
        return lines

    def isa_skipped_unallowed(self) -> list[IsaRow]:
        return [] if self.allow_skip_isa else [r for r in self.isa if r.status == SKIPPED]

    @property
    def exit_code(self) -> int:
        if self.findings():
            return EXIT_FAILURES
        if self.isa_skipped_unallowed():
            return EXIT_UNAVAILABLE
        return EXIT_CLEAN

    @property
    def status(self) -> str:
        return {EXIT_CLEAN: "pass", EXIT_FAILURES: "fail", EXIT_UNAVAILABLE: "incomplete"}[self.exit_code]

    def verdict(self) -> dict[str, Any]:
        """Everything the pass/fail decision rests on, and nothing that depends on speed or paths run."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "platform": self.platform,
            "seed": self.seed,
            "budget_seconds": self.budget_seconds,
            "cases_per_backend": self.cases_per_backend,
            "replay": [{"file": r.file, "case_id": r.case_id, "backend": r.backend, "status": r.status,
                        "outcome": r.outcome, "signature": r.signature} for r in self.replay],
            "campaign": [{"backend": r.backend, "planned_cases": r.planned_cases, "cases": r.cases,
                          "status": r.status, "outcomes": dict(sorted(r.outcomes.items())),
                          "failure_signatures": sorted(f["signature"] for f in r.failures),
                          "known_failure_signatures": sorted(f["signature"] for f in r.known_failures),
                          "case_ids_sha256": r.case_ids_sha256} for r in self.campaign],
            "isa": [{"name": r.name, "status": r.status, "kernels": r.kernels, "failing": r.failing,
                     "sglang": r.sglang_version} for r in self.isa],
            "findings": self.findings(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": GATE_FORMAT,
            "version": GATE_FORMAT_VERSION,
            "command": self.command,
            "machine": self.machine,
            "corpus_dirs": self.corpus_dirs,
            "allow_skip_isa": self.allow_skip_isa,
            "verdict": self.verdict(),
            "replay": [asdict(r) for r in self.replay],
            "campaign": [asdict(r) for r in self.campaign],
            "isa": [asdict(r) for r in self.isa],
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
        }


# ---- planning -------------------------------------------------------------------------------------------

def planned_cases_per_backend(budget_seconds: float, platform_kind: str, backend_count: int) -> int:
    """The fixed campaign size for a budget: a pure function of the inputs, never of measured speed."""
    rate = PLANNING_CASES_PER_SECOND[platform_kind]
    return max(1, math.floor(budget_seconds * rate / max(1, backend_count)))


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

def replay_corpus(entries: list[CorpusEntry], registry: Registry, machine: Machine,
                  executor_args: argparse.Namespace, artifacts: Path) -> list[ReplayRow]:
    """Replay every entry; one executor (one worker process on a GPU) serves all runnable backends, so
    sglang is imported once rather than once per backend."""
    rows = [_replay_row(entry) for entry in entries]
    backends = sorted({r.backend for r in rows})
    skip_reasons = {name: registry.unavailable_reason(name, machine.platform) for name in backends}
    for row in rows:
        row.reason = skip_reasons[row.backend]  # stays only on the skipped rows; run rows get their own
    runnable = {name: registry.get(name) for name, reason in skip_reasons.items() if not reason}
    if not runnable:
        return rows
    journal = artifacts / "worker-journal" / "replay"
    executor = make_executor(list(runnable.values()), registry, machine, executor_args, journal)
    try:
        for entry, row in zip(entries, rows, strict=True):
            if row.backend in runnable:
                _replay_one(entry, row, executor, artifacts)
    finally:
        executor.close()
    return rows


def _replay_row(entry: CorpusEntry) -> ReplayRow:
    expected = f"fail [{entry.signature}]" if entry.expect == "fail" else ""
    return ReplayRow(str(entry.path), entry.case.case_id, entry.case.backend, SKIPPED, expected=expected)


def _replay_one(entry: CorpusEntry, row: ReplayRow, executor: Executor, artifacts: Path) -> None:
    case = entry.case
    started = time.perf_counter()
    result = executor.run(case)
    row.seconds = round(time.perf_counter() - started, 3)
    row.outcome = result.outcome.value
    row.signature = signature(result, case) if result.outcome.is_failure else ""
    # The corpus format's own judgement (docs/reproducers.md): "fail" entries must fail with their recorded
    # signature; a pass (XPASS) or a different failure needs a human, exactly like a plain entry failing.
    judged = judge_replay(entry.expect, entry.signature, result, case)
    row.status = REPLAY_STATUS[judged.label]
    row.reason = judged.detail if judged.label != "FAIL" else _first_line(result) or judged.detail
    if row.status in (FAILED, UNEXPECTED_PASS):
        row.artifact = str(save_reproducer(artifacts / "replay", case, result,
                                           {"expect": entry.expect, "gate_corpus_file": str(entry.path)}))


def _first_line(result: Result) -> str:
    text = result.summary or result.error
    return text.splitlines()[0] if text else ""


# ---- 2. fixed-seed campaign -----------------------------------------------------------------------------

def run_gate_campaign(backends: list[Backend], registry: Registry, machine: Machine, seed: int,
                      cases_per_backend: int, budget_seconds: float, space: CaseSpace,
                      executor_args: argparse.Namespace, artifacts: Path,
                      known: dict[str, str] | None = None) -> list[CampaignRow]:
    """One campaign per backend, each exactly `cases_per_backend` cases; the budget is a hard cap on all.
    Failures whose signatures are in `known` (signature -> corpus file of an expected failure) are listed
    apart and are not findings: a known, unfixed sglang bug must not block every merge, a new one must."""
    rows: list[CampaignRow] = []
    journal = artifacts / "worker-journal" / "campaign"
    executor = make_executor(backends, registry, machine, executor_args, journal)
    started = time.perf_counter()
    try:
        for backend in backends:
            remaining = budget_seconds - (time.perf_counter() - started)
            if remaining <= 0:
                rows.append(CampaignRow(backend.name, cases_per_backend, 0, BUDGET_EXCEEDED))
                continue
            config = CampaignConfig([backend.name], seed, max_cases=cases_per_backend, max_seconds=remaining,
                                    corpus_dir=artifacts / "campaign", space=space,
                                    known_signatures=dict(known or {}))
            report = run_campaign(config, [backend], machine.platform, executor, record_case_ids=True)
            failures = [dict(f.__dict__) for f in report.new_failures]
            known_found = [dict(f.__dict__) for f in report.failures if f.known]
            status = PASSED
            if report.cases < cases_per_backend:
                status = BUDGET_EXCEEDED
            elif failures:
                status = FAILED
            digest = hashlib.sha256("\n".join(report.case_ids).encode()).hexdigest()
            rows.append(CampaignRow(backend.name, cases_per_backend, report.cases, status,
                                    dict(sorted(report.outcomes.get(backend.name, {}).items())), failures,
                                    known_found, digest, report.first_index, round(report.seconds, 3)))
    finally:
        executor.close()
    return rows


# ---- 3. ISA checks --------------------------------------------------------------------------------------

@dataclass(frozen=True)
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


def run_isa_checks(platform_kind: str, args: argparse.Namespace, artifacts: Path) -> list[IsaRow]:
    targets = isa_targets(platform_kind)
    rows = [IsaRow(t.name, t.platform, t.arch, t.strict, SKIPPED) for t in targets]
    if args.no_isa:
        for row in rows:
            row.reason = "disabled by --no-isa"
        return rows
    cache_dir = Path(args.isa_cache_dir) if args.isa_cache_dir else isa_fetch.default_cache_dir()
    allow_fetch = not args.no_fetch
    try:
        source = resolve_isa_source(args.sglang_source, cache_dir, allow_fetch)
        if targets[0].platform == isa.PLATFORM_ROCM:
            hip_include, device_libs = _rocm_install(platform_kind)
            rocm_tools = isa.find_rocm_toolchain(cache_dir, allow_fetch, _rocm_clang(args, platform_kind),
                                                 hip_include, (), device_libs)
            cuda_tools = None
        else:
            rocm_tools = None
            cuda_tools = isa.find_cuda_toolchain(cache_dir, allow_fetch)
    except (isa.ToolchainUnavailable, isa.SourceUnavailable) as error:
        for row in rows:
            row.reason = f"ISA toolchain or sglang source unavailable: {error}"
        return rows
    except isa.BadInput as error:
        raise UsageError(str(error)) from None
    out_dir = artifacts / "isa"
    out_dir.mkdir(parents=True, exist_ok=True)
    for target, row in zip(targets, rows, strict=True):
        if target.platform == isa.PLATFORM_ROCM:
            report = isa.check_rocm(source, target.arch, target.strict, toolchain=rocm_tools,
                                    cache_dir=cache_dir)
        else:
            report = isa.check_cuda(source, target.arch, toolchain=cuda_tools, cache_dir=cache_dir)
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


# ---- 4. reports -----------------------------------------------------------------------------------------

def render_markdown(report: GateReport) -> str:
    """A summary for a PR comment: verdict, one table row per check, then findings and skips."""
    verdict_word = {"pass": "PASS", "fail": "FAIL", "incomplete": "INCOMPLETE"}[report.status]
    lines = [f"## HiCache fuzz gate ({report.platform}): **{verdict_word}**", ""]
    lines += [f"`{report.command}`", "",
              f"seed {report.seed}, budget {report.budget_seconds:g} s -> {report.cases_per_backend} cases "
              f"per backend, exit code {report.exit_code}; {report.machine}", ""]
    lines += ["| check | result | passed | failed | expected | skipped | details |",
              "|---|---|---|---|---|---|---|"]
    counts = Counter(r.status for r in report.replay)
    replay_failed = counts[FAILED] + counts[UNEXPECTED_PASS]
    replay_result = "FAIL" if replay_failed else ("PASS" if report.replay else "EMPTY")
    lines.append(f"| corpus replay | {replay_result} | {counts[PASSED]} | {replay_failed} "
                 f"| {counts[EXPECTED]} | {counts[SKIPPED]} "
                 f"| {len(report.replay)} entries from {', '.join(report.corpus_dirs)} |")
    for row in report.campaign:
        result = {PASSED: "PASS", FAILED: "FAIL", BUDGET_EXCEEDED: "FAIL (budget exceeded)"}[row.status]
        failing_cases = sum(f["count"] for f in row.failures)
        known_cases = sum(f["count"] for f in row.known_failures)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items())) or "no cases"
        lines.append(f"| campaign `{row.backend}` | {result} | {row.cases - failing_cases - known_cases} "
                     f"| {failing_cases} | {known_cases} | {row.planned_cases - row.cases} "
                     f"| {row.cases}/{row.planned_cases} cases: {outcomes}; "
                     f"{len(row.failures)} new unique failures, {len(row.known_failures)} known |")
    for isa_row in report.isa:
        result = {PASSED: "PASS", FAILED: "FAIL", SKIPPED: "SKIPPED"}[isa_row.status]
        detail = (_one_line(isa_row.reason, 160) if isa_row.status == SKIPPED
                  else f"sglang {isa_row.sglang_version}: {isa_row.kernels} kernel instantiations, "
                       f"{isa_row.failing} failing")
        lines.append(f"| ISA {isa_row.name} | {result} | {int(isa_row.status == PASSED)} "
                     f"| {int(isa_row.status == FAILED)} | 0 | {int(isa_row.status == SKIPPED)} | {detail} |")
    timing = ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in report.seconds.items())
    lines += ["", f"Wall time: {timing}."]
    findings = report.findings()
    if findings:
        lines += ["", "### Findings", ""]
        lines += [f"- {_one_line(line, 300)}" for line in findings]
        reproducers = [r.artifact for r in report.replay if r.artifact]
        reproducers += [f["file"] for row in report.campaign for f in row.failures if f.get("file")]
        if reproducers:
            lines += ["", "Reproducers (uploaded as artifacts; rerun with `hicache-fuzz replay FILE`):", ""]
            lines += [f"- `{path}`" for path in reproducers]
    skipped = [r for r in report.replay if r.status == SKIPPED]
    unallowed = report.isa_skipped_unallowed()
    if skipped or any(r.status == SKIPPED for r in report.isa):
        lines += ["", "### Skipped", ""]
        # Grouped by reason: a GPU-only seed corpus on a CPU runner is ~150 entries with one reason.
        by_reason = Counter(r.reason for r in skipped)
        lines += [f"- {count} corpus entr{'y' if count == 1 else 'ies'}: {_one_line(reason, 200)}"
                  for reason, count in sorted(by_reason.items())]
        lines += [f"- ISA {r.name}: {_one_line(r.reason, 200)}" for r in report.isa if r.status == SKIPPED]
        if unallowed:
            lines += ["", f"{len(unallowed)} ISA check(s) skipped without `--allow-skip-isa`: "
                          "the gate is not green."]
    known = [(row.backend, f) for row in report.campaign for f in row.known_failures]
    if known:
        lines += ["", f"<details><summary>Known failures met by the campaign ({len(known)})</summary>", ""]
        lines += [f"- [{backend}] `{f['signature']}` x{f['count']}: known from `{f['known']}`" for backend, f in known]
        lines += ["", "</details>"]
    expected = [r for r in report.replay if r.status == EXPECTED]
    if expected:
        lines += ["", f"<details><summary>Expected failures reproduced ({len(expected)})</summary>", ""]
        lines += [f"- `{r.file}` [{r.backend}]: {r.signature}" for r in expected]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.replace("|", "\\|")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def junit_cases(report: GateReport) -> list[JUnitCase]:
    """One JUnit case per corpus entry, per campaign backend and per ISA target."""
    cases: list[JUnitCase] = []
    for row in report.replay:
        failed = row.status in (FAILED, UNEXPECTED_PASS)
        cases.append(JUnitCase(
            name=row.file, classname="gate.corpus", seconds=row.seconds,
            failure_message=f"{row.status}: {row.reason}" if failed else None,
            failure_text=f"reproducer: {row.artifact}\nrerun: hicache-fuzz replay {row.artifact}" if failed
            else "",
            skipped_message=row.reason if row.status == SKIPPED else None,
            system_out=row.reason if row.status == EXPECTED else "",
            properties={"backend": row.backend, "status": row.status, "outcome": row.outcome}))
    for campaign_row in report.campaign:
        message: str | None = None
        if campaign_row.status == BUDGET_EXCEEDED:
            message = (f"budget exceeded: {campaign_row.cases} of {campaign_row.planned_cases} planned cases "
                       f"ran within --budget-seconds {report.budget_seconds:g}")
        elif campaign_row.failures:
            message = f"{len(campaign_row.failures)} unique failures in {campaign_row.cases} cases"
        text = "\n".join(f"[{f['signature']}] x{f['count']} {f['summary']}\n    reproducer: {f['file']}"
                         for f in campaign_row.failures)
        cases.append(JUnitCase(
            name=f"{campaign_row.backend} seed {report.seed}", classname="gate.campaign",
            seconds=campaign_row.seconds, failure_message=message, failure_text=text,
            system_out="\n".join(f"known failure [{f['signature']}] x{f['count']}: {f['known']}"
                                 for f in campaign_row.known_failures),
            properties={"cases": str(campaign_row.cases), "planned_cases": str(campaign_row.planned_cases),
                        "case_ids_sha256": campaign_row.case_ids_sha256}))
    for isa_row in report.isa:
        cases.append(JUnitCase(
            name=isa_row.name, classname="gate.isa", seconds=isa_row.seconds,
            failure_message=isa_row.reason if isa_row.status == FAILED else None,
            failure_text=f"report: {isa_row.report_json}" if isa_row.status == FAILED else "",
            skipped_message=isa_row.reason if isa_row.status == SKIPPED else None,
            system_out=f"{isa_row.kernels} kernel instantiations, {isa_row.failing} failing"
            if isa_row.status != SKIPPED else ""))
    return cases


# ---- CLI ------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", required=True, choices=["cpu", "cuda", "rocm"],
                        help="the platform gated; absent -> exit 3 with the reason")
    parser.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET_SECONDS,
                        help="campaign budget: sets the fixed case count per backend and is a hard "
                             "wall-clock cap (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="campaign seed (default: %(default)s)")
    parser.add_argument("--cases-per-backend", type=int, default=None,
                        help="override the case count derived from the budget (the budget stays the cap)")
    parser.add_argument("--corpus", action="append", type=Path, default=None, metavar="DIR",
                        help="corpus folder to replay, repeatable (default: corpus/)")
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="campaign these backends instead of the platform's default set; repeatable")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE:CALLABLE",
                        help="load extra backends from a callable returning Backend(s); repeatable")
    parser.add_argument("--byte-budget", type=int, default=None, help="largest campaign case in bytes")
    parser.add_argument("--case-timeout", type=float, default=120.0,
                        help="seconds before a case in a worker counts as a hang (default: %(default)s)")
    parser.add_argument("--no-isa", action="store_true",
                        help="do not run the ISA checks (they count as skipped)")
    parser.add_argument("--allow-skip-isa", action="store_true",
                        help="a skipped ISA check does not keep the gate from passing")
    parser.add_argument("--sglang-source", default=None, metavar="PATH",
                        help="sglang wheel/sdist/folder for the ISA checks "
                             "(default: the installed sglang, else the cached or fetched wheel)")
    parser.add_argument("--isa-clang", default=None, metavar="PATH",
                        help="clang for the ROCm ISA check "
                             "(default: clang-19; on rocm also /opt/rocm/llvm/bin/clang)")
    parser.add_argument("--isa-cache-dir", default=None, metavar="DIR",
                        help="cache of fetched ISA headers and tools")
    parser.add_argument("--no-fetch", action="store_true", help="never download headers, tools or sglang")
    parser.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, metavar="DIR",
                        help="reproducers of failing cases, ISA reports, worker logs (default: %(default)s)")
    parser.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write a Markdown summary (PR comment)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the full report as JSON")


def command_line(args: argparse.Namespace) -> str:
    """The gate's inputs as a command line (outputs left out): what to run to get the same verdict."""
    parts = ["hicache-fuzz gate", f"--platform {args.platform}", f"--budget-seconds {args.budget_seconds:g}",
             f"--seed {args.seed}"]
    if args.cases_per_backend is not None:
        parts.append(f"--cases-per-backend {args.cases_per_backend}")
    parts += [f"--corpus {path}" for path in args.corpus or []]
    parts += [f"--backend {name}" for name in args.backend]
    parts += [f"--backend-plugin {spec}" for spec in args.backend_plugin]
    if args.byte_budget is not None:
        parts.append(f"--byte-budget {args.byte_budget}")
    for flag in ("no_isa", "allow_skip_isa"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(parts)


def _run_fuzz_phases(report: GateReport, entries: list[CorpusEntry], backends: list[Backend], registry: Registry,
                     machine: Machine, args: argparse.Namespace, cases_per_backend: int, space: CaseSpace,
                     executor_args: argparse.Namespace, artifacts: Path) -> None:
    """Phases 1 and 2: corpus replay, then the fixed-seed campaign; results go into `report`."""
    phase_started = time.perf_counter()
    report.replay = replay_corpus(entries, registry, machine, executor_args, artifacts)
    report.seconds["replay"] = time.perf_counter() - phase_started
    replay_counts = Counter(r.status for r in report.replay)
    print(f"[1/3] corpus replay: {dict(sorted(replay_counts.items()))} in {report.seconds['replay']:.1f} s",
          flush=True)

    phase_started = time.perf_counter()
    report.campaign = run_gate_campaign(backends, registry, machine, args.seed, cases_per_backend,
                                        args.budget_seconds, space, executor_args, artifacts,
                                        known_failures(entries))
    report.seconds["campaign"] = time.perf_counter() - phase_started
    for row in report.campaign:
        print(f"[2/3] campaign {row.backend}: {row.status}, {row.cases}/{row.planned_cases} cases, "
              f"{len(row.failures)} new unique failures, {len(row.known_failures)} known, {row.seconds:.1f} s",
              flush=True)


def run(args: argparse.Namespace) -> int:
    if args.budget_seconds <= 0:
        raise UsageError("--budget-seconds must be positive")
    if args.cases_per_backend is not None and args.cases_per_backend < 1:
        raise UsageError("--cases-per-backend must be >= 1")
    print(f"hicache-fuzz gate: seed {args.seed}", flush=True)
    machine = machine_for(args)  # Unavailable (exit 3) for an absent platform, before any work
    registry = registry_for(args)
    corpus_dirs = args.corpus or [DEFAULT_CORPUS]
    for folder in args.corpus or []:
        if not folder.exists():
            raise UsageError(f"corpus folder {folder} does not exist")
    # The default corpus/ may be absent (git keeps no empty folders); the report then shows 0 entries.
    entries = [load_entry(path) for path in iter_case_files(d for d in corpus_dirs if d.exists())]
    backends = campaign_backends(registry, machine, args.backend)
    cases_per_backend = args.cases_per_backend or planned_cases_per_backend(
        args.budget_seconds, machine.platform.kind, len(backends))
    space = CaseSpace() if args.byte_budget is None else CaseSpace(byte_budget=args.byte_budget)
    # Real kernels always run in a worker on a GPU, whatever they declare: a fault must not end the gate.
    executor_args = argparse.Namespace(isolate="yes" if machine.platform.kind != "cpu" else "auto",
                                       case_timeout=args.case_timeout, backend_plugin=args.backend_plugin)
    artifacts: Path = args.artifacts
    for sub in ARTIFACT_SUBFOLDERS:
        shutil.rmtree(artifacts / sub, ignore_errors=True)
    artifacts.mkdir(parents=True, exist_ok=True)

    report = GateReport(machine.platform.kind, machine.description, args.seed, args.budget_seconds,
                        cases_per_backend, command_line(args), args.allow_skip_isa,
                        [str(folder) for folder in corpus_dirs])
    print(f"platform: {machine.description}; corpus: {len(entries)} entries; campaign: "
          f"{', '.join(b.name for b in backends)} x {cases_per_backend} cases", flush=True)

    try:
        _run_fuzz_phases(report, entries, backends, registry, machine, args, cases_per_backend, space,
                         executor_args, artifacts)
    except WorkerError as error:  # a worker that cannot start is the platform failing us, not a finding
        raise Unavailable(f"worker process could not start: {error}") from None

    phase_started = time.perf_counter()
    report.isa = run_isa_checks(machine.platform.kind, args, artifacts)
    report.seconds["isa"] = time.perf_counter() - phase_started
    for isa_row in report.isa:
        print(f"[3/3] ISA {isa_row.name}: {isa_row.status} {_one_line(isa_row.reason, 200)}", flush=True)
    report.seconds["total"] = sum(report.seconds.values())

    if args.json:
        write_json_atomic(args.json, report.to_dict())
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(render_markdown(report))
    if args.junit:
        write_junit(args.junit, f"hicache-fuzz gate ({report.platform})", junit_cases(report))
    for line in report.findings():
        print(f"FINDING {_one_line(line, 300)}")
    for skipped_row in report.isa_skipped_unallowed():
        print(f"NOT GREEN: ISA {skipped_row.name} skipped ({_one_line(skipped_row.reason, 200)}); "
              "pass --allow-skip-isa to accept")
    print(f"gate: {report.status.upper()} (exit {report.exit_code}) in {report.seconds['total']:.1f} s",
          flush=True)
    return report.exit_code
