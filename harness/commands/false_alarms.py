"""``hicache-fuzz false-alarms``: how often does a campaign on an installation raise a NEW bug identity?

Runs N seeded ``hicache-fuzz fuzz`` campaigns (each its own process, exactly as a user or CI runs it) with
the same --known corpus, and counts the campaigns that raised an identity no known failure accounts for. On a
clean installation the answer must be 0: a gate that cries wolf on unmodified sglang is switched off. Against
a mutant (``--backend-plugin`` or a mutated sglang) the same command shows which identities a bug raises and
whether they are stable across seeds (the same set every time, one per bug in the common case).

Exit codes: 0 no campaign raised a new identity; 1 some did (listed); 2 bad usage; 3 a campaign could not run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.commands.arg_types import (
    finite_non_negative_float,
    finite_positive_float,
    output_path,
    positive_int,
)
from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    final_exit_code,
)

FORMAT = "hicache-fuzz-false-alarms"

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"out": "dir", "json": "file", "markdown": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=positive_int, default=20, help="number of campaigns (seeds FIRST..FIRST+N-1)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--seconds", type=finite_positive_float, default=60.0, help="each campaign's --max-total-time")
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="campaigns at once (on one GPU several fit: each is mostly host-side Python; mind "
                             "memory: a GPU campaign's scale tier holds GiBs of pinned host and device memory)")
    parser.add_argument("--gpus", default="none", metavar="none|N|LIST",
                        help="pin campaign k to one device, round robin: N (the first N visible) or a list 0,2,3; "
                             "none (default): every campaign sees what this process sees")
    parser.add_argument("--start-deadline", type=finite_non_negative_float, metavar="S",
                        help="start no campaign later than S seconds after this command began (the seeds not "
                             "started are listed as not run, not counted): keeps a time-boxed run's report whole")
    parser.add_argument("--known", action="append", default=[], type=Path, metavar="PATH",
                        help="corpus files or folders of known failures (as fuzz --known); repeatable")
    parser.add_argument("--out", type=output_path, required=True, help="folder for each campaign's report and corpus")
    parser.add_argument("--json", type=output_path, help="write the summary as JSON")
    parser.add_argument("--markdown", type=output_path, help="write the summary as Markdown")
    parser.add_argument("fuzz_args", nargs=argparse.REMAINDER,
                        help="after --: more `hicache-fuzz fuzz` options (--platform, --backend, ...)")


@dataclass
class CampaignRun:
    seed: int
    exit_code: int
    cases: int = 0
    new_identities: list[str] = field(default_factory=list)
    known_identities: list[str] = field(default_factory=list)
    flaky_identities: list[str] = field(default_factory=list)  # crashes that ran clean in a fresh worker
    seconds: float = 0.0
    report: str = ""
    error: str = ""
    device: str | None = None


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.commands.output import write_report, write_text_report

    for path in args.known:
        if not path.exists():
            raise UsageError(f"--known {path}: no such file or folder")
    devices = device_ids(args.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    extra = [a for a in args.fuzz_args if a != "--"]
    if args.jobs > 1 and not any(a.startswith("--worker-processes") for a in extra):
        # Concurrent campaigns run one worker each: a default GPU campaign starts a pool of several
        # (docs/engine.md), and --jobs of them would crowd the same cores.
        extra += ["--worker-processes", "1"]
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()

    def one(index: int) -> CampaignRun | None:
        if args.start_deadline is not None and time.perf_counter() - started > args.start_deadline:
            return None
        device = devices[index % len(devices)] if devices else None
        return run_campaign(seeds[index], args.seconds, args.known, args.out, extra, device)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(one, range(len(seeds))))
    runs = [r for r in outcomes if r is not None]
    not_run = [seed for seed, r in zip(seeds, outcomes, strict=True) if r is None]
    summary = summarize(runs, time.perf_counter() - started, args, extra)
    summary["seeds_not_run"] = not_run
    print_summary(summary)
    written = write_report(args.json, summary, "false-alarm summary")
    written = write_text_report(args.markdown, render_markdown(summary), "false-alarm summary", ".md") and written
    if any(r.exit_code == EXIT_USAGE for r in runs):
        # the options passed to fuzz (after --) are bad, e.g. an unknown backend: the campaigns' own message says
        # which (printed above); not an environment fault
        print("hicache-fuzz false-alarms: error: the campaigns refused their options (exit 2): "
              f"{next(r.error for r in runs if r.exit_code == EXIT_USAGE)}", file=sys.stderr)
        return EXIT_USAGE
    if any(r.exit_code not in (EXIT_CLEAN, EXIT_FAILURES) for r in runs):
        return EXIT_UNAVAILABLE
    if summary["campaigns_with_new_identities"]:
        return EXIT_FAILURES
    return final_exit_code(EXIT_CLEAN, written)


def device_ids(spec: str, inherited: str | None) -> list[str]:
    """The device ids campaigns are pinned to, round robin ([] = no pinning). Ids index what this process sees:
    with CUDA_VISIBLE_DEVICES=2,3 set, `--gpus 2` means 2 and 3."""
    visible = [d.strip() for d in (inherited or "").split(",") if d.strip()]
    if spec == "none":
        return []
    if spec.isdigit() and int(spec) >= 1:
        count = int(spec)
        if visible and count > len(visible):
            raise UsageError(f"--gpus {spec}: only {len(visible)} device(s) visible ({','.join(visible)})")
        return visible[:count] if visible else [str(i) for i in range(count)]
    ids = [s.strip() for s in spec.split(",") if s.strip()]
    if "," not in spec or not ids or not all(s.isdigit() for s in ids):
        raise UsageError(f"--gpus {spec}: expected none, a count >= 1 or a comma list of device ids")
    if visible and any(int(i) >= len(visible) for i in ids):
        raise UsageError(f"--gpus {spec}: only {len(visible)} device(s) visible ({','.join(visible)})")
    return [visible[int(i)] if visible else i for i in ids]


def run_campaign(seed: int, seconds: float, known: list[Path], out: Path, extra: list[str],
                 device: str | None = None) -> CampaignRun:
    """One `hicache-fuzz fuzz` process; its JSON report says which failures were new and which known."""
    folder = out / f"seed-{seed}"
    report_path = folder / "report.json"
    command = [sys.executable, "-m", "hicache_fuzz", "fuzz", "--seed", str(seed), "--max-total-time", str(seconds),
               "--corpus", str(folder / "corpus"), "--json", str(report_path), "--no-progress", *extra]
    for path in known:
        command += ["--known", str(path)]
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as log:
        env = os.environ.copy()
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device  # (ROCm's runtime honours it too)
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.seek(0)
        tail = log.read()[-2000:]
    (folder / "log.txt").write_text(tail)
    outcome = CampaignRun(seed, code, seconds=round(time.perf_counter() - started, 1), report=str(report_path),
                          device=device)
    if code not in (EXIT_CLEAN, EXIT_FAILURES) or not report_path.is_file():
        # the campaign's own last words (e.g. "error: unknown backend 'nope'; known backends: ...")
        outcome.error = tail.strip().splitlines()[-1] if tail.strip() else f"exit {code}, no report"
    if not report_path.is_file():
        return outcome
    from hicache_fuzz.harness.model.json_input import read_json_file

    report = read_json_file(report_path, max_bytes=256 << 20)
    outcome.cases = int(report.get("cases", 0))
    for failure in report.get("unique_failures", []):
        if failure.get("flaky"):
            target = outcome.flaky_identities
        else:
            target = outcome.known_identities if failure.get("known") else outcome.new_identities
        target.append(str(failure.get("signature", "")))
    return outcome


def summarize(runs: list[CampaignRun], seconds: float, args: argparse.Namespace,
              fuzz_args: list[str]) -> dict[str, Any]:
    """The run's summary; `fuzz_args` are the options every campaign was given."""
    new = Counter(identity for r in runs for identity in set(r.new_identities))
    known = Counter(identity for r in runs for identity in set(r.known_identities))
    flaky = Counter(identity for r in runs for identity in set(r.flaky_identities))
    return {
        "format": FORMAT,
        "version": 1,
        "campaigns": len(runs),
        "seconds_per_campaign": args.seconds,
        "known": [str(p) for p in args.known],
        "fuzz_args": fuzz_args,
        # A campaign's exit code says it too (fuzz --known exits 1 on a new failure only): either counts.
        "campaigns_with_new_identities": sum(1 for r in runs if r.new_identities or r.exit_code == EXIT_FAILURES),
        "campaigns_failed_to_run": sum(1 for r in runs if r.exit_code not in (EXIT_CLEAN, EXIT_FAILURES)),
        "total_cases": sum(r.cases for r in runs),
        "new_identities": dict(sorted(new.items())),  # identity -> campaigns it appeared in
        "known_identities": dict(sorted(known.items())),
        "flaky_identities": dict(sorted(flaky.items())),
        "wall_seconds": round(seconds, 1),
        "runs": [r.__dict__ for r in runs],
    }


def print_summary(summary: dict[str, Any]) -> None:
    if summary.get("seeds_not_run"):
        print(f"not started before --start-deadline (not counted): seeds {summary['seeds_not_run']}")
    print(f"{summary['campaigns']} campaigns x {summary['seconds_per_campaign']:g} s, "
          f"{summary['total_cases']} cases: {summary['campaigns_with_new_identities']} raised a new identity, "
          f"{summary['campaigns_failed_to_run']} failed to run")
    for run_row in summary["runs"]:
        if run_row["exit_code"] not in (EXIT_CLEAN, EXIT_FAILURES):
            print(f"  FAILED seed {run_row['seed']} (exit {run_row['exit_code']}): {run_row['error'] or 'see its log'}")
    for identity, count in summary["new_identities"].items():
        print(f"  NEW   {identity}: in {count} campaign(s)")
    for identity, count in summary["known_identities"].items():
        print(f"  known {identity}: in {count} campaign(s)")
    for identity, count in summary.get("flaky_identities", {}).items():
        print(f"  flaky {identity}: in {count} campaign(s) (ran clean in a fresh worker)")


def render_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# False-alarm run: {summary['campaigns_with_new_identities']} of {summary['campaigns']} campaigns "
             "raised a new identity", "",
             f"{summary['campaigns']} campaigns x {summary['seconds_per_campaign']:g} s, "
             f"{summary['total_cases']} cases, known from {', '.join(summary['known']) or 'nothing'}; "
             f"fuzz options `{' '.join(summary['fuzz_args'])}`; {summary['wall_seconds']:g} s wall."
             + (f" Seeds not started before the deadline (not counted): {summary['seeds_not_run']}."
                if summary.get("seeds_not_run") else ""), "",
             "| seed | exit | cases | new identities | known identities | flaky identities |",
             "|---|---|---|---|---|---|"]
    for run_row in summary["runs"]:
        lines.append(f"| {run_row['seed']} | {run_row['exit_code']} | {run_row['cases']} "
                     f"| {', '.join(run_row['new_identities']) or '-'} | {len(run_row['known_identities'])} "
                     f"| {', '.join(run_row.get('flaky_identities', [])) or '-'} |")
    return "\n".join(lines) + "\n"
