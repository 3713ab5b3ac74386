"""`hicache-fuzz mutate`: mutation testing of sglang's HiCache transfer sources.

Exit codes: 0 the run finished and the score is computed (or --list / --show printed); 1 the score is below
--min-score; 2 bad usage or input; 3 environment (no sglang sources, the unmutated baseline fails).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.commands.arg_types import (
    existing_dir,
    finite_non_negative_float,
    finite_positive_float,
    output_path,
    positive_int,
    regex,
    unit_interval,
)
from hicache_fuzz.harness.mutate import report, sources
from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.operators import OPERATORS
from hicache_fuzz.harness.mutate.runner import (
    BaselineFailed,
    RunConfig,
    finished,
    result_path,
    run_all,
    write_json_atomic,
)
from hicache_fuzz.harness.mutate.targets import (
    DEFAULT_BUILD_ERROR_PATTERN,
    CampaignTarget,
    CommandTarget,
    Stopped,
    Target,
    stop_all,
)


class UsageError(Exception):
    """Exit 2."""


HELP = "mutation testing of sglang's HiCache transfer sources against a campaign or a test command"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`mutate` on an argparse subparsers object (what a CLI without a module table wires)."""
    p = subparsers.add_parser("mutate", help=HELP, description=HELP)
    add_arguments(p)
    return p

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"out": "dir"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options (the CLI's SUBCOMMAND_MODULES protocol: add_arguments + run)."""
    p.add_argument("--sglang-src", type=existing_dir, metavar="DIR",
                   help="sglang sources: the package, a folder holding it (site-packages, unpacked wheel) or a "
                        "checkout with python/sglang (default: the installed sglang, found without importing it)")
    p.add_argument("--file", action="append", default=[], metavar="PATTERN",
                   help="only mutants of files matching this fnmatch pattern or path suffix (repeatable)")
    p.add_argument("--operator", action="append", default=[], choices=OPERATORS,
                   help="only mutants of this operator (repeatable)")
    p.add_argument("--sample", type=positive_int, metavar="N",
                   help="a seeded sample of N mutants spread over files and operators (default: all)")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    p.add_argument("--only", action="append", default=[], metavar="ID",
                   help="of the selected (sampled) mutants, only this id (repeatable; with --only-from: the union); "
                        "mutants start in the order given")
    p.add_argument("--only-from", type=Path, metavar="FILE",
                   help="of the selected mutants, only the ids this file lists: the first word of each line, "
                        "blank lines and '#' comments skipped (a `--list` output works)")
    p.add_argument("--list", action="store_true", help="print the (sampled) mutants and counts; run nothing")
    p.add_argument("--show", metavar="ID", help="print the diff of one mutant; run nothing")
    p.add_argument("--target", action="append", default=[], choices=("campaign", "test-cmd"),
                   help="what each mutant runs against (repeatable: side by side); default from the options given")
    p.add_argument("--test-cmd", action="append", default=[], metavar="CMD",
                   help="a shell command; non-zero exit kills the mutant (repeatable, at most 2)")
    p.add_argument("--platform", default="auto", help="campaign platform (passed to fuzz --platform)")
    p.add_argument("--campaign-seconds", type=finite_positive_float, default=60.0, help="campaign length (default 60)")
    p.add_argument("--campaign-full", action="store_true",
                   help="run each mutant's campaign for its whole clock (default: it ends at its first new "
                        "failure, which decides the verdict; the full clock lists every identity a mutant raises)")
    p.add_argument("--campaign-seed", type=int, default=1, help="campaign seed, the same for every mutant")
    p.add_argument("--fuzz-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `hicache-fuzz fuzz` (repeatable; write --fuzz-arg=--option)")
    p.add_argument("fuzz_passthrough", nargs="*", metavar="-- FUZZ_ARG",
                   help="after `--`: more arguments for `hicache-fuzz fuzz` (same as --fuzz-arg)")
    p.add_argument("--known", action="append", default=[], metavar="PATH",
                   help="passed to fuzz --known: failures the unmutated sglang already has (e.g. corpus/sglang)")
    p.add_argument("--timeout", type=finite_positive_float, metavar="S",
                   help="per mutant and target (default: 2 x campaign + 600 s; 900 s for a test command)")
    p.add_argument("--test-cmd-timeout", type=finite_positive_float, metavar="S",
                   help="the limit for --test-cmd targets only (default: --timeout); e.g. a tight one for a test "
                        "suite that could hang under a mutant and a generous one for the campaign, whose own "
                        "--case-timeout already turns a hung kernel into a failure")
    p.add_argument("--gpus", default="auto", help="auto (all visible), N (the first N), a list 0,2,3, or 0 (no "
                                                  "device pinning): one mutant per GPU at a time")
    p.add_argument("--jobs-per-gpu", type=positive_int, default=1, metavar="K",
                   help="mutants at once on each GPU (default 1): K slots per device, each with its own private "
                        "sglang copy; the shared JIT cache is safe for concurrent builds (sglang publishes a build "
                        "by an atomic rename under a per-module lock, and keys it by source content)")
    p.add_argument("--parallel-targets", action="store_true",
                   help="run a mutant's targets at the same time (side by side: the campaign and the tests) "
                        "instead of one after the other")
    p.add_argument("--jit-cache", choices=("shared", "per-mutant"), default="shared",
                   help="sglang JIT cache: one content-addressed cache under --out (default), or a fresh one "
                        "per mutant")
    p.add_argument("--build-error-pattern", type=regex, default=DEFAULT_BUILD_ERROR_PATTERN, metavar="REGEX",
                   help="output that marks a mutant that did not build (not scored)")
    p.add_argument("--out", type=output_path, metavar="DIR",
                   help="results: mutants/<id>.json (resumable), summary.json, summary.md, junit.xml")
    p.add_argument("--min-score", type=unit_interval, metavar="X",
                   help="exit 1 when a target's score is below X (a number in [0, 1])")
    p.add_argument("--keep-workspace", action="store_true", help="keep the private sglang copies under --out")
    p.add_argument("--reuse-baseline", action="store_true",
                   help="keep a passed baseline already under --out for the same targets (resuming on the same "
                        "machine image) instead of running the unmutated copy again")
    p.add_argument("--baseline-failures", choices=("abort", "known"), default="abort",
                   help="when the unmutated campaign raises new failures: abort (exit 3, default) or known (they "
                        "become known failures of every mutant's campaign, listed in the baseline and the report; "
                        "a mutant is then killed only by a failure the unmutated sglang did not show)")
    p.add_argument("--start-deadline", type=finite_non_negative_float, metavar="S",
                   help="start no mutant later than S seconds after this command began; those running finish "
                        "and the rest stay unfinished for a rerun (a time-boxed call keeps its slots' work)")
    p.add_argument("--report-only", action="store_true",
                   help="no baseline, no runs: write the reports from the results already under --out")


def _targets(args: argparse.Namespace) -> list[Target]:
    kinds = list(dict.fromkeys(args.target)) or (["test-cmd"] if args.test_cmd else ["campaign"])
    if "test-cmd" in kinds and not args.test_cmd:
        raise UsageError("--target test-cmd needs --test-cmd CMD")
    if args.test_cmd and "test-cmd" not in kinds:
        kinds.append("test-cmd")
    if (args.fuzz_passthrough or args.fuzz_arg or args.known) and "campaign" not in kinds:
        raise UsageError("--fuzz-arg, --known and arguments after -- are for the campaign, which is not a target "
                         "here (add --target campaign)")
    if len(args.test_cmd) > 2:
        raise UsageError("at most two --test-cmd")
    if args.campaign_seconds <= 0:
        raise UsageError("--campaign-seconds must be positive")
    targets: list[Target] = []
    if "campaign" in kinds:
        fuzz_args = [*args.fuzz_arg, *args.fuzz_passthrough, *(a for path in args.known for a in ("--known", path))]
        if args.jobs_per_gpu > 1 and not any(a.startswith("--worker-processes") for a in fuzz_args):
            # Several mutants share a GPU: each campaign runs one worker (a default GPU campaign starts a pool
            # of several, docs/engine.md), or K campaigns would start K pools on the same cores.
            fuzz_args += ["--worker-processes", "1"]
        if args.jobs_per_gpu > 1 and not any(a.startswith("--spare-workers") for a in fuzz_args):
            # Each spare is one more import of torch and sglang per mutant, and the mutants' campaigns share the
            # cores: a crash restarts the one worker instead (how fast it recovers changes no verdict).
            fuzz_args += ["--spare-workers", "0"]
        targets.append(CampaignTarget("campaign", args.platform, args.campaign_seconds, args.campaign_seed,
                                      fuzz_args, args.build_error_pattern, stop_at_kill=not args.campaign_full))
    if "test-cmd" in kinds:
        for k, command in enumerate(args.test_cmd, start=1):
            name = "test-cmd" if len(args.test_cmd) == 1 else f"test-cmd-{k}"
            targets.append(CommandTarget(name, command, args.build_error_pattern))
    return targets


def _slots(spec: str, device_env: str) -> list[str | None]:
    """Device ids, one per slot, as the children's CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES. When this process
    is already restricted (that variable set), ids are taken from its list, so `2,3` stays GPUs 2 and 3."""
    inherited = [d.strip() for d in os.environ.get(device_env, "").split(",") if d.strip()]
    if spec == "auto":
        count = _visible_gpus()
        ids = inherited[:count] if inherited else [str(i) for i in range(count)]
        return list(ids) or [None]
    if "," in spec:
        ids = [s.strip() for s in spec.split(",") if s.strip()]
        if not all(s.isdigit() for s in ids):
            raise UsageError(f"--gpus {spec}: expected auto, a count or a comma list of device ids")
        return [inherited[int(i)] if inherited and int(i) < len(inherited) else i for i in ids]
    if not spec.isdigit():
        raise UsageError(f"--gpus {spec}: expected auto, a count or a comma list of device ids")
    count = int(spec)
    if inherited and count > len(inherited):
        raise UsageError(f"--gpus {spec}: only {len(inherited)} device(s) visible ({device_env}={','.join(inherited)})")
    return list(inherited[:count] if inherited else [str(i) for i in range(count)]) or [None]


def _per_gpu(slots: list[str | None], jobs: int) -> list[str | None]:
    """K slots per device, interleaved (0,1,...,0,1,...) so that the first mutants spread over the devices."""
    return [slot for _ in range(jobs) for slot in slots]


def _visible_gpus() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
        return int(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return 0


def _device_env(platform: str) -> str:
    if platform == "rocm":
        return "HIP_VISIBLE_DEVICES"
    if platform == "auto":
        try:
            import torch

            if getattr(torch.version, "hip", None):
                return "HIP_VISIBLE_DEVICES"
        except ImportError:
            pass
    return "CUDA_VISIBLE_DEVICES"


def _mutants(args: argparse.Namespace, root: Path) -> list[Mutant]:
    all_mutants = sources.select(sources.generate_all(root, sources.default_sources(root)), args.file,
                                 args.operator)
    if not all_mutants:
        raise UsageError("no mutants: no source file or operator matches the --file/--operator filters")
    chosen = all_mutants
    if args.sample is not None:
        if args.sample <= 0:
            raise UsageError("--sample must be positive")
        chosen = sources.sample(all_mutants, args.sample, args.seed)
    wanted = _only_ids(args)
    if wanted is None:
        return chosen
    # In the order given (--only first, then the file's): mutants start in that order, so a time-boxed run can
    # put the cheap ones (Python: no rebuild) first.
    by_id = {m.id: m for m in chosen}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        raise UsageError(f"--only/--only-from: {len(missing)} id(s) not among the {len(chosen)} selected mutants: "
                         + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    return [by_id[i] for i in wanted]


def _only_ids(args: argparse.Namespace) -> list[str] | None:
    """The ids --only and --only-from name, in order and without repeats; None when neither is given."""
    if not args.only and args.only_from is None:
        return None
    ids = list(args.only)
    if args.only_from is not None:
        try:
            lines = args.only_from.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--only-from {args.only_from}: cannot read it ({exc})") from exc
        for number, line in enumerate(lines, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if not re.fullmatch(r"[0-9a-f]{12}", words[0]):
                raise UsageError(f"--only-from {args.only_from}:{number}: {words[0]!r} is not a mutant id "
                                 f"(12 hex digits)")
            ids.append(words[0])
    if not ids:
        raise UsageError("--only-from: the file names no mutant id")
    return list(dict.fromkeys(ids))


def _print_list(mutants: list[Mutant]) -> None:
    by_file: dict[str, int] = {}
    by_operator: dict[str, int] = {}
    for m in mutants:
        print(f"{m.id}  {m.file}:{m.line}  {m.operator:14}  {m.description}")
        by_file[m.file] = by_file.get(m.file, 0) + 1
        by_operator[m.operator] = by_operator.get(m.operator, 0) + 1
    print(f"\n{len(mutants)} mutants")
    for name, table in (("file", by_file), ("operator", by_operator)):
        print(f"per {name}: " + json.dumps(table, indent=1))


def _baseline_accepted(out: Path) -> dict[str, Any]:
    try:
        data = json.loads((out / "baseline.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    accepted = data.get("accepted_failures") if isinstance(data, dict) and data.get("passed") else None
    return accepted if isinstance(accepted, dict) else {}


def _on_signal(signum: int, _frame: object) -> None:
    stop_all()  # kill every target's process group; their mutants stay unfinished (resumable)
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run(args)
    except Stopped:
        return 130
    except UsageError as exc:
        print(f"hicache-fuzz mutate: {exc}", file=sys.stderr)
        return 2
    except sources.SourcesMissing as exc:
        print(f"hicache-fuzz mutate: {exc}", file=sys.stderr)
        return 3
    except BaselineFailed as exc:
        print(f"hicache-fuzz mutate: baseline failed: {exc}", file=sys.stderr)
        return 3
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --start-deadline counts from here
    root = sources.find_sglang_root(args.sglang_src)
    mutants = _mutants(args, root)
    if args.show:
        match = next((m for m in sources.generate_all(root, sources.default_sources(root)) if m.id == args.show),
                     None)
        if match is None:
            raise UsageError(f"--show {args.show}: no such mutant id in {root}")
        print(match.diff((root / match.file).read_text(encoding="utf-8")), end="")
        return 0
    if args.list:
        _print_list(mutants)
        return 0
    if args.out is None:
        raise UsageError("--out DIR is required to run mutants")
    args.out = args.out.resolve()  # targets may change directory: every path handed to them is absolute
    targets = _targets(args)
    device_env = _device_env(args.platform)
    if args.jobs_per_gpu < 1:
        raise UsageError("--jobs-per-gpu must be >= 1")
    if args.test_cmd_timeout is not None and not args.test_cmd_timeout > 0:
        raise UsageError("--test-cmd-timeout must be positive")
    if args.start_deadline is not None and not args.start_deadline >= 0:
        raise UsageError("--start-deadline must be >= 0")
    slots = [None] if args.report_only else _per_gpu(_slots(args.gpus, device_env), args.jobs_per_gpu)
    meta = {"sglang_root": str(root), "sample": args.sample, "seed": args.seed,
            "targets": {t.name: t.describe() for t in targets}, "slots": slots,
            "jit_cache": args.jit_cache, "jobs_per_gpu": args.jobs_per_gpu,
            "parallel_targets": args.parallel_targets, "baseline_failures": args.baseline_failures}
    write_json_atomic(args.out / "mutants.json", [m.to_dict() for m in mutants])

    def timeout(target: Target) -> float:
        if args.test_cmd_timeout is not None and isinstance(target, CommandTarget):
            return float(args.test_cmd_timeout)
        if args.timeout is not None:
            return float(args.timeout)
        return 2 * args.campaign_seconds + 600 if isinstance(target, CampaignTarget) else 900.0

    config = RunConfig(root=root, mutants=mutants, targets=targets, out=args.out, slots=slots,
                       device_env=device_env, timeout=timeout, jit_cache=args.jit_cache,
                       keep_workspace=args.keep_workspace, reuse_baseline=args.reuse_baseline,
                       parallel_targets=args.parallel_targets, baseline_failures=args.baseline_failures,
                       start_deadline=None if args.start_deadline is None else started + args.start_deadline)
    if args.report_only:
        described = {t.name: t.describe() for t in targets}
        records = {m.id: r for m in mutants if (r := finished(args.out, m.id, described)) is not None}
        other = [m.id for m in mutants if m.id not in records and result_path(args.out, m.id).is_file()]
        if other:
            # A result made with other target options (another --jobs-per-gpu adds or drops the campaign's
            # --worker-processes 1, for instance) is not mixed in; say so rather than report it unfinished
            # without a word.
            print(f"mutate: {len(other)} result(s) under {args.out / 'mutants'} were made with other target "
                  f"options and are left out (pass the options of the run that made them): {', '.join(other[:8])}"
                  f"{' ...' if len(other) > 8 else ''}", file=sys.stderr)
    else:
        records = run_all(config, log=lambda line: print(line, flush=True))
    meta["unfinished"] = [m.id for m in mutants if m.id not in records]
    meta["baseline_accepted"] = _baseline_accepted(args.out)
    summary = report.summarize(records, [t.name for t in targets], meta)
    report.write_reports(args.out, summary)
    for name, target in summary["targets"].items():
        score = target["score"]
        print(f"{name}: score {report.pct(score)} {json.dumps(target['counts'])}")
    print(f"reports: {args.out / 'summary.md'}, {args.out / 'summary.json'}, {args.out / 'junit.xml'}")
    if args.min_score is not None:
        low = [n for n, t in summary["targets"].items() if t["score"] is not None and t["score"] < args.min_score]
        if low:
            print(f"score below --min-score {args.min_score}: {', '.join(low)}", file=sys.stderr)
            return 1
    return 0
