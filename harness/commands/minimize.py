"""``hicache-fuzz minimize``: shrink reproducer files while keeping their failure signature
(the passes are :mod:`hicache_fuzz.harness.campaign.minimize`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.arg_types import finite_positive_float, positive_int
from hicache_fuzz.harness.commands.common import add_common, add_isolation, execution_options, write_json_report
from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    final_exit_code,
)

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.minimize import Minimized
    from hicache_fuzz.harness.findings.corpus import CorpusEntry
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.model.progress import ProgressLine
    from hicache_fuzz.harness.pipeline.executor import Executor
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

CORPUS_DEFAULT = "fuzz-out/minimized"

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "corpus": "dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("paths", nargs="+", type=Path, help="reproducer files, or directories of them")
    parser.add_argument("--corpus", default=CORPUS_DEFAULT,
                        help="minimized reproducers (JSON + repro script) go here (default: %(default)s)")
    # None: the minimizer's own budgets (imported only when the command runs)
    parser.add_argument("--max-runs", type=positive_int, default=None, help="candidate runs per case")
    parser.add_argument("--max-seconds", type=finite_positive_float, default=None, help="seconds per case")
    parser.add_argument("--in-place", action="store_true",
                        help="write each minimized reproducer over its input file (a known corpus entry keeps its "
                             "name, expect and scope; its standalone script is rewritten beside it); no --corpus")
    parser.add_argument("--json", metavar="PATH", help="write sizes before/after and ratios as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
    add_isolation(parser, documented=False)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per backend and overall: files, median minimized/original ratios of index entries and bytes, fixpoints."""
    def median(values: list[float]) -> float:
        ordered = sorted(values)
        mid = len(ordered) // 2
        return round(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2, 6)

    done = [r for r in rows if "ratio" in r]
    groups: dict[str, list[dict[str, Any]]] = {"all": done}
    for row in done:
        groups.setdefault(row["signature"].rsplit("-", 2)[0], []).append(row)
    out: dict[str, Any] = {}
    for name, members in sorted(groups.items()):
        if not members:
            continue
        out[name] = {
            "files": len(members),
            "signatures": len({m["signature"] for m in members}),
            "median_ratio_indices": median([m["ratio"]["indices"] for m in members]),
            "median_ratio_bytes": median([m["ratio"]["bytes"] for m in members]),
            "median_minimized_indices": median([m["minimized"]["indices"] for m in members]),
            "median_minimized_bytes": median([m["minimized"]["bytes"] for m in members]),
            "fixpoint": sum(1 for m in members if m["fixpoint"]),
        }
    return out


def step_text(number: int, total: int, state: Any, max_runs: int, max_seconds: float) -> str:
    """The progress line of one file: candidate runs against the budget, reductions kept, the size now, and
    the time left at most (the budget's seconds or runs, whichever runs out first; a fixpoint ends sooner)."""
    from hicache_fuzz.harness.campaign.minimize import case_size
    from hicache_fuzz.harness.model.progress import duration

    seconds = state.seconds
    by_runs = (max_runs - state.runs) * seconds / state.runs if state.runs else float("inf")
    left = max(0.0, min(max_seconds - seconds, by_runs))
    size = case_size(state.case)
    return (f"minimize {number}/{total}: {state.runs}/{max_runs} runs, {state.accepted} reductions, "
            f"indices {state.original_size.indices} -> {size.indices}, bytes {state.original_size.bytes} -> "
            f"{size.bytes}, ETA <= {duration(left)}")


@dataclass
class _Minimizing:
    """One ``minimize`` run: what every file shares, and what the files done so far left."""

    machine: Machine
    registry: Registry
    execution: ExecutionOptions
    corpus: Path  # where minimized reproducers go
    in_place: bool  # each over its input file instead
    max_runs: int
    max_seconds: float
    total: int  # files to minimize, for the progress line
    progress: ProgressLine
    executors: dict[str, Executor] = field(default_factory=dict)  # one per backend, started at its first file
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per file, as --json lists them
    not_failing: int = 0  # files that do not fail here: bad input, exit 2
    skipped: int = 0  # files whose backend cannot run here: exit 3
    written: bool = True  # False once an output went elsewhere than asked


def run(args: argparse.Namespace) -> int:
    """Exit 0: every input reproduced its failure and was minimized; 2: some input does not fail here (nothing to
    minimize); 3: some input's backend cannot run here (skipped, as replay skips it), or a write went elsewhere."""
    from hicache_fuzz.harness.campaign.minimize import DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS
    from hicache_fuzz.harness.model.progress import ProgressLine
    from hicache_fuzz.harness.pipeline.setup import close_executors, machine_for, registry_for

    if args.in_place and args.corpus != CORPUS_DEFAULT:
        raise UsageError("--in-place writes each reproducer over its input: it takes no --corpus")
    execution = execution_options(args)
    machine = machine_for(execution.platform)
    registry = registry_for(execution.backend_plugins)
    entries = _load_entries(args.paths)
    state = _Minimizing(machine, registry, execution, Path(args.corpus), args.in_place,
                        DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs,
                        DEFAULT_MAX_SECONDS if args.max_seconds is None else args.max_seconds,
                        len(entries), ProgressLine(not args.no_progress))
    try:
        for number, entry in enumerate(entries, start=1):
            _minimize_entry(state, number, entry)
    finally:
        state.progress.close()
        close_executors(list(state.executors.values()))
    written = write_json_report({"summary": summarize(state.rows), "results": state.rows}, args.json)
    return _exit_code(state, written)


def _load_entries(paths: list[Path]) -> list[CorpusEntry]:
    """The reproducers under `paths`; none, or a malformed one, is exit 2."""
    from hicache_fuzz.harness.findings.corpus import CorpusError, load_corpus

    try:
        entries = load_corpus(paths)
    except CorpusError as exc:
        raise UsageError(str(exc)) from None
    if not entries:
        raise UsageError(f"no reproducer files under {', '.join(map(str, paths))}")
    return entries


def _minimize_entry(state: _Minimizing, number: int, entry: CorpusEntry) -> None:
    """Minimize file `number`, or count it as skipped (its backend cannot run here) or as not failing."""
    from hicache_fuzz.harness.campaign.minimize import NotFailing, minimize
    from hicache_fuzz.harness.pipeline.setup import available_backend, executor_for

    # a backend unknown or unavailable here is skipped and counted, as replay does (exit 3 at the end)
    reason = state.registry.unavailable_reason(entry.case.backend, state.machine.platform)
    if reason:
        state.skipped += 1
        state.progress.print(f"SKIP {entry.path}: {reason}")
        state.rows.append({"file": str(entry.path), "skipped": reason})
        return
    backend = available_backend(state.registry, entry.case.backend, state.machine)
    if backend.name not in state.executors:
        state.executors[backend.name] = executor_for([backend], state.registry, state.machine, state.execution, None)
    executor = state.executors[backend.name]

    def on_step(step: Any) -> None:
        state.progress.update(step_text(number, state.total, step, state.max_runs, state.max_seconds))

    state.progress.update(f"minimize {number}/{state.total}: running {entry.path.name}", force=True)
    try:
        done = minimize(entry.case, executor.run, max_runs=state.max_runs, max_seconds=state.max_seconds,
                        on_step=on_step)
    except NotFailing as exc:
        state.not_failing += 1
        state.progress.print(f"SKIP {entry.path}: {exc}")
        state.rows.append({"file": str(entry.path), "skipped": str(exc)})
        return
    _keep(state, entry, backend, done)


def _keep(state: _Minimizing, entry: CorpusEntry, backend: Backend, done: Minimized) -> None:
    """Save the minimized reproducer (elsewhere if the corpus cannot be written: never lost) and report it."""
    from hicache_fuzz.harness.commands.output import os_reason, write_fallback
    from hicache_fuzz.harness.findings.corpus import reproducer_dict
    from hicache_fuzz.harness.findings.reproducer import save_reproducer, save_reproducer_over

    report = done.to_dict()
    extra: dict[str, Any] = {"minimized": report, "trigger": done.trigger}
    if entry.expect == "fail":
        extra["expect"] = "fail"
    spec = f"{type(backend).__module__}:{type(backend).__qualname__}"
    try:
        if state.in_place:
            out = save_reproducer_over(entry.path, done.case, done.result, extra)
        else:
            out = save_reproducer(state.corpus, done.case, done.result, extra, backend_class=spec)
    except OSError as exc:  # the disk filled up after the check: the minimized case is not lost
        saved = write_fallback(reproducer_dict(done.case, done.result) | extra, "minimized reproducer")
        state.progress.print(f"hicache-fuzz minimize: cannot write to {state.corpus}: {os_reason(exc)}; "
                             f"the minimized reproducer of {entry.path} went to {saved or 'nowhere (see stdout)'}")
        if saved is None:
            print(json.dumps(reproducer_dict(done.case, done.result) | extra, sort_keys=True))
        state.written = False
        out = saved or state.corpus
    state.rows.append({"file": str(entry.path), "output": str(out), **report})
    state.progress.print(f"{entry.path} [{done.signature}]: indices {done.original_size.indices} -> "
                         f"{done.size.indices}, bytes {done.original_size.bytes} -> {done.size.bytes} "
                         f"({done.runs} runs, {done.seconds:.1f} s"
                         f"{'' if done.fixpoint else ', budget spent'}) -> {out}")


def _exit_code(state: _Minimizing, json_written: bool) -> int:
    if state.not_failing:
        # nothing to shrink is not a finding: the file is not a failing reproducer here (bad input, named above)
        print(f"hicache-fuzz minimize: error: {state.not_failing} file(s) do not fail here, nothing to minimize (see "
              "the SKIP lines)", file=sys.stderr)
        return EXIT_USAGE
    if state.skipped:
        print(f"hicache-fuzz: unavailable: {state.skipped} file(s) not minimized: their backend cannot run here (see "
              "the SKIP lines)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return final_exit_code(EXIT_CLEAN, json_written and state.written)
