"""The pre-merge gate: ``hicache-fuzz gate --platform rocm|cuda|cpu --budget-seconds N``.

One command a CI job runs and trusts. It does, in order:

1. **Corpus replay.** Every case and reproducer file under ``--corpus`` (default ``corpus/``; repeatable) is
   replayed on the backend it names. An entry whose backend cannot run here is *skipped* with the reason;
   an entry marked as an expected-failing regression (``"expect": "fail"``, docs/reproducers.md) counts as
   *expected* when it still fails with its recorded signature, and as a finding when it passes or fails
   differently (judged by :func:`hicache_fuzz.harness.findings.reproducer.judge_replay`).
2. **Fixed-seed campaign.** ``--seed`` (default :data:`DEFAULT_SEED`) over every backend reachable on the
   platform: the CPU reference on ``cpu``; every available real-kernel backend on ``cuda``/``rocm``, in a
   worker process so a GPU fault becomes a CRASH result instead of killing the gate.
3. **ISA checks** (:mod:`hicache_fuzz.harness.isa.check`): ``rocm`` and ``cpu`` run the ROCm static check (strict
   and production flags, gfx90a + gfx942 + gfx950, each with the newest clang for it, no GPU); ``cuda`` runs the
   SASS check. A check that cannot run (no compiler, no sglang source) is *skipped* with the reason, and a
   skipped ISA check keeps the gate from being green unless ``--allow-skip-isa`` is given.
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
import dataclasses
import math
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_fuzz.harness.commands.arg_types import finite_positive_float, output_path, positive_int
from hicache_fuzz.harness.commands.common import write_json_report
from hicache_fuzz.harness.commands.gate_report import GateReport, junit_cases, one_line, render_markdown
from hicache_fuzz.harness.generation.space_file import add_space_arguments, space_from_args
from hicache_fuzz.harness.model.exit_codes import Unavailable, UsageError, final_exit_code
from hicache_fuzz.harness.reporting.junit import write_junit

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.baseline import Baseline
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.findings.corpus import CorpusEntry
    from hicache_fuzz.harness.findings.known import KnownMap
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

# A fixed default so that a PR gate is derandomized (as Hypothesis and ClusterFuzz advise for PR CI); the nightly
# campaign is where random seeds belong.
DEFAULT_SEED = 20260610
DEFAULT_CORPUS = Path("corpus")
DEFAULT_ARTIFACTS = Path("gate-artifacts")
DEFAULT_BUDGET_SECONDS = 300.0
# Cases per second per backend used to turn --budget-seconds into a case count. Deliberately far below what
# was measured, so the planned cases finish inside the cap on a slow or busy runner: the CPU reference ran
# 69 cases/s (1000 cases in 14.5 s) on 2 cores shared with a compile job. GPU backends pay a worker start
# and a JIT compile (seconds) per new kernel configuration inside the campaign: from a cold JIT cache the sglang
# backends run well under one case a second (docs/gate.md, "Time"), so the GPU rate assumes mostly-cold compiles.
PLANNING_CASES_PER_SECOND: dict[str, float] = {"cpu": 5.0, "cuda": 0.25, "rocm": 0.25}
# Subfolders of --artifacts the gate owns and clears at start, so CI never uploads a previous run's files.
ARTIFACT_SUBFOLDERS = ("campaign", "replay", "isa", "worker-journal", "baseline")


def planned_cases_per_backend(budget_seconds: float, platform_kind: str, backend_count: int) -> int:
    """The fixed campaign size for a budget: a pure function of the inputs, never of measured speed."""
    rate = PLANNING_CASES_PER_SECOND[platform_kind]
    return max(1, math.floor(budget_seconds * rate / max(1, backend_count)))

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "markdown": "file", "junit": "file", "artifacts": "dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", required=True, choices=["cpu", "cuda", "rocm"],
                        help="the platform gated; absent -> exit 3 with the reason")
    parser.add_argument("--budget-seconds", type=finite_positive_float, default=DEFAULT_BUDGET_SECONDS,
                        help="campaign budget: sets the fixed case count per backend and is a hard "
                             "wall-clock cap (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="campaign seed (default: %(default)s)")
    parser.add_argument("--cases-per-backend", type=positive_int, default=None,
                        help="override the case count derived from the budget (the budget stays the cap)")
    parser.add_argument("--corpus", action="append", type=Path, default=None, metavar="DIR",
                        help="corpus folder to replay, repeatable (default: corpus/)")
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="campaign these backends instead of the platform's default set; repeatable")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE:CALLABLE",
                        help="load extra backends from a callable returning Backend(s); repeatable")
    parser.add_argument("--byte-budget", type=positive_int, default=None, help="largest campaign case in bytes")
    add_space_arguments(parser)
    parser.add_argument("--case-timeout", type=finite_positive_float, default=120.0,
                        help="seconds before a case in a worker counts as a hang (default: %(default)s)")
    parser.add_argument("--no-isa", action="store_true",
                        help="do not run the ISA checks (they count as skipped)")
    parser.add_argument("--allow-skip-isa", action="store_true",
                        help="a skipped ISA check does not keep the gate from passing")
    parser.add_argument("--sglang-source", default=None, metavar="PATH",
                        help="sglang wheel/sdist/folder for the ISA checks "
                             "(default: the installed sglang, else the cached or fetched wheel)")
    parser.add_argument("--isa-clang", default=None, metavar="PATH",
                        help="clang for the ROCm ISA check (default: per target the newest that supports it: "
                             "clang-N, the ziglang wheel's clang 22; on rocm also /opt/rocm/llvm/bin/clang)")
    parser.add_argument("--isa-cache-dir", default=None, metavar="DIR",
                        help="cache of fetched ISA headers and tools")
    parser.add_argument("--offline", "--no-fetch", dest="no_fetch", action="store_true",
                        help="download nothing (ISA headers, tools, sglang's wheel): use only the ISA cache and name "
                             "what is missing; targets that need it are reported skipped")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="the base sglang of a PR gate (a folder holding the sglang package, or the Python of "
                             "another environment with sglang installed): every campaign failure is replayed "
                             "there; failures it shares are pre-existing, not findings, and known ones it does not "
                             "share are new (docs/gate.md)")
    parser.add_argument("--artifacts", type=output_path, default=DEFAULT_ARTIFACTS, metavar="DIR",
                        help="reproducers of failing cases, ISA reports, worker logs (default: %(default)s)")
    parser.add_argument("--junit", type=output_path, metavar="PATH", help="write JUnit XML")
    parser.add_argument("--markdown", type=output_path, metavar="PATH", help="write a Markdown summary (PR comment)")
    parser.add_argument("--json", type=output_path, metavar="PATH", help="write the full report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")


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
    if getattr(args, "space", None) is not None:
        parts.append(f"--space {args.space}")
    parts += [f"--set {item}" for item in getattr(args, "space_set", [])]
    if getattr(args, "baseline", None):
        parts.append(f"--baseline {args.baseline}")
    for flag in ("no_isa", "allow_skip_isa"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(parts)


@dataclasses.dataclass
class _GateSetup:
    """What the gate runs, settled before its first phase: the platform, the corpus, the campaign, the
    baseline and where artifacts go."""

    machine: Machine
    registry: Registry
    corpus_dirs: list[Path]
    entries: list[CorpusEntry]
    backends: list[Backend]
    cases_per_backend: int
    campaign: CampaignOptions
    execution: ExecutionOptions
    artifacts: Path
    baseline: Baseline | None
    # The corpus's expected failures. With --baseline the campaign runs without them (`campaign` carries none,
    # so every failure is saved) and they are applied when its failures are judged on the baseline.
    known: KnownMap


def run(args: argparse.Namespace) -> int:
    run_started = time.perf_counter()
    _check_counts(args)
    print(f"hicache-fuzz gate: seed {args.seed}", flush=True)
    setup = _set_up(args)
    report = GateReport(setup.machine.platform.kind, setup.machine.description, args.seed, args.budget_seconds,
                        setup.cases_per_backend, command_line(args), args.allow_skip_isa,
                        [str(folder) for folder in setup.corpus_dirs])
    # Phase times (never in the verdict): setup = imports, platform probe, corpus load, before the phases.
    report.seconds["setup"] = time.perf_counter() - run_started
    print(f"platform: {setup.machine.description}; corpus: {len(setup.entries)} entries; campaign: "
          f"{', '.join(b.name for b in setup.backends)} x {setup.cases_per_backend} cases", flush=True)
    print(f"artifacts: {setup.artifacts.resolve()} ({', '.join(ARTIFACT_SUBFOLDERS)}); reports: "
          f"{_outputs(args)}", flush=True)
    _run_phases(args, setup, report)
    for isa_row in report.isa:
        print(f"[3/3] ISA {isa_row.name}: {isa_row.status} {one_line(isa_row.reason, 200)}", flush=True)
    # Wall clock of the whole run; campaign_* entries are parts of the campaign phase, not added again.
    report.seconds["total"] = time.perf_counter() - run_started
    written = _write_reports(args, report)
    _print_closing(args, report, setup.artifacts)
    # green, but an output is not where it was asked (the message says where): exit 3; findings still win
    return final_exit_code(report.exit_code, written)


def _check_counts(args: argparse.Namespace) -> None:
    if args.budget_seconds <= 0:
        raise UsageError("--budget-seconds must be positive")
    if args.cases_per_backend is not None and args.cases_per_backend < 1:
        raise UsageError("--cases-per-backend must be >= 1")


def _set_up(args: argparse.Namespace) -> _GateSetup:
    """The platform, corpus, campaign and baseline, each checked before any phase runs: an absent platform
    is exit 3, a missing corpus folder or a bad baseline exit 2 or 3. Clears the gate's artifact folders."""
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.commands.gate_phases import campaign_backends
    from hicache_fuzz.harness.findings.known import detect_environment, known_bugs
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, machine_for, registry_for

    machine = machine_for(args.platform)  # Unavailable (exit 3) for an absent platform, before any work
    registry = registry_for(args.backend_plugin)
    corpus_dirs, entries = _load_corpus(args)
    environment = detect_environment(machine)
    backends = campaign_backends(registry, machine, args.backend)
    cases_per_backend = args.cases_per_backend or planned_cases_per_backend(
        args.budget_seconds, machine.platform.kind, len(backends))
    campaign = CampaignOptions(args.seed, cases_per_backend, corpus=args.artifacts / "campaign",
                               byte_budget=args.byte_budget, known_signatures=known_bugs(entries, environment),
                               record_case_ids=True, space_overrides=space_from_args(args))
    # Real kernels always run in a worker on a GPU, whatever they declare: a fault must not end the gate.
    execution = ExecutionOptions(args.platform, list(args.backend_plugin),
                                 isolate="yes" if machine.platform.kind != "cpu" else "auto",
                                 case_timeout=args.case_timeout)
    artifacts: Path = args.artifacts
    for sub in ARTIFACT_SUBFOLDERS:
        shutil.rmtree(artifacts / sub, ignore_errors=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    baseline = _resolve_baseline(args, artifacts)
    known = campaign.known_signatures
    if baseline is not None:  # every failure saved per variant, then judged on the baseline (gate_phases.py)
        campaign = dataclasses.replace(campaign, known_signatures={})
    return _GateSetup(machine, registry, corpus_dirs, entries, backends, cases_per_backend, campaign, execution,
                     artifacts, baseline, known)


def _load_corpus(args: argparse.Namespace) -> tuple[list[Path], list[CorpusEntry]]:
    """The corpus folders replayed and their entries; a --corpus folder that does not exist is exit 2."""
    from hicache_fuzz.harness.findings.corpus import load_corpus

    corpus_dirs = args.corpus or [DEFAULT_CORPUS]
    for folder in args.corpus or []:
        if not folder.exists():
            raise UsageError(f"corpus folder {folder} does not exist")
    # The default corpus/ may be absent (git keeps no empty folders); the report then shows 0 entries.
    return corpus_dirs, load_corpus(d for d in corpus_dirs if d.exists())


def _resolve_baseline(args: argparse.Namespace, artifacts: Path) -> Baseline | None:
    if not getattr(args, "baseline", None):
        return None
    # probed before any work: a baseline that cannot run is exit 2 or 3
    from hicache_fuzz.harness.campaign.baseline import resolve_baseline

    baseline = resolve_baseline(args.baseline, artifacts / "baseline")
    print(f"baseline: {baseline.describe()}", flush=True)
    return baseline


def _run_phases(args: argparse.Namespace, setup: _GateSetup, report: GateReport) -> None:
    """Corpus replay and campaign, then the ISA checks, under one progress line; results go into `report`."""
    from hicache_fuzz.harness.commands.gate_phases import run_fuzz_phases, run_isa_checks
    from hicache_fuzz.harness.model.progress import ProgressLine
    from hicache_fuzz.harness.pipeline.worker import WorkerError

    progress = ProgressLine(not args.no_progress)
    try:
        run_fuzz_phases(report, setup.entries, setup.backends, setup.registry, setup.machine, setup.campaign,
                        args.budget_seconds, setup.execution, setup.artifacts, progress, setup.baseline, setup.known)
        phase_started = time.perf_counter()
        report.isa = run_isa_checks(setup.machine.platform.kind, args, setup.artifacts, progress)
        report.seconds["isa"] = time.perf_counter() - phase_started
    except WorkerError as error:  # a worker that cannot start is the platform failing us, not a finding
        raise Unavailable(f"worker process could not start: {error}") from None
    finally:
        progress.close()


def _write_reports(args: argparse.Namespace, report: GateReport) -> bool:
    """--json, --markdown and --junit; False when one could not be written where it was asked."""
    written = write_json_report(report.to_dict(), args.json)  # elsewhere if it must: never lost
    try:
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(render_markdown(report))
        if args.junit:
            write_junit(args.junit, f"hicache-fuzz gate ({report.platform})", junit_cases(report))
    except OSError as exc:
        print(f"hicache-fuzz gate: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        written = False
    return written


def _print_closing(args: argparse.Namespace, report: GateReport, artifacts: Path) -> None:
    """The findings, the skips that keep the gate from being green, what was left under --artifacts, the verdict."""
    for line in report.findings():
        print(f"FINDING {one_line(line, 300)}")
    for skipped_row in report.isa_skipped_unallowed():
        print(f"NOT GREEN: ISA {skipped_row.name} skipped ({one_line(skipped_row.reason, 200)}); "
              "pass --allow-skip-isa to accept")
    kept = sorted(str(path.relative_to(artifacts)) for path in artifacts.rglob("*") if path.is_file())
    print(f"artifacts: {len(kept)} files under {artifacts.resolve()}"
          + (f" (e.g. {', '.join(kept[:3])})" if kept else "") + f"; reports: {_outputs(args)}", flush=True)
    print(f"gate: {report.status.upper()} (exit {report.exit_code}) in {report.seconds['total']:.1f} s",
          flush=True)


def _outputs(args: argparse.Namespace) -> str:
    named = [f"{flag} {path}" for flag, path in (("--json", args.json), ("--junit", args.junit),
                                                 ("--markdown", args.markdown)) if path]
    return ", ".join(named) or "none asked (--json/--junit/--markdown)"
