"""``hicache-fuzz minimize``: shrink reproducer files while keeping their failure signature
(the passes are :mod:`hicache_fuzz.harness.campaign.minimize`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.arg_types import finite_positive_float, positive_int
from hicache_fuzz.harness.commands.common import add_common, add_isolation, execution_options, write_json_report
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, UsageError

if TYPE_CHECKING:
    from hicache_fuzz.harness.pipeline.executor import Executor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("paths", nargs="+", type=Path, help="reproducer files, or directories of them")
    parser.add_argument("--corpus", default="fuzz-out/minimized",
                        help="minimized reproducers (JSON + repro script) go here (default: %(default)s)")
    # None: the minimizer's own budgets (imported only when the command runs)
    parser.add_argument("--max-runs", type=positive_int, default=None, help="candidate runs per case")
    parser.add_argument("--max-seconds", type=finite_positive_float, default=None, help="seconds per case")
    parser.add_argument("--json", metavar="PATH", help="write sizes before/after and ratios as JSON")
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


def run(args: argparse.Namespace) -> int:
    """Exit 0: every input reproduced its failure and was minimized; 1: some input no longer fails."""
    from hicache_fuzz.harness.campaign.corpus import CorpusError, load_corpus
    from hicache_fuzz.harness.campaign.minimize import DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS, NotFailing, minimize
    from hicache_fuzz.harness.campaign.reproducer import save_reproducer
    from hicache_fuzz.harness.pipeline.setup import (
        available_backend,
        close_executors,
        executor_for,
        machine_for,
        registry_for,
    )

    max_runs = DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs
    max_seconds = DEFAULT_MAX_SECONDS if args.max_seconds is None else args.max_seconds
    execution = execution_options(args)
    machine = machine_for(execution.platform)
    registry = registry_for(execution.backend_plugins)
    try:
        entries = load_corpus(args.paths)
    except CorpusError as exc:
        raise UsageError(str(exc)) from None
    if not entries:
        raise UsageError(f"no reproducer files under {', '.join(map(str, args.paths))}")
    corpus = Path(args.corpus)
    rows: list[dict[str, Any]] = []
    not_failing = 0
    executors: dict[str, Executor] = {}
    try:
        for entry in entries:
            backend = available_backend(registry, entry.case.backend, machine)
            if backend.name not in executors:
                executors[backend.name] = executor_for([backend], registry, machine, execution, None)
            executor = executors[backend.name]
            try:
                done = minimize(entry.case, executor.run, max_runs=max_runs, max_seconds=max_seconds)
            except NotFailing as exc:
                not_failing += 1
                print(f"SKIP {entry.path}: {exc}")
                rows.append({"file": str(entry.path), "skipped": str(exc)})
                continue
            report = done.to_dict()
            extra: dict[str, Any] = {"minimized": report}
            if entry.expect == "fail":
                extra["expect"] = "fail"
            spec = f"{type(backend).__module__}:{type(backend).__qualname__}"
            out = save_reproducer(corpus, done.case, done.result, extra, backend_class=spec)
            rows.append({"file": str(entry.path), "output": str(out), **report})
            print(f"{entry.path} [{done.signature}]: indices {done.original_size.indices} -> "
                  f"{done.size.indices}, bytes {done.original_size.bytes} -> {done.size.bytes} "
                  f"({done.runs} runs, {done.seconds:.1f} s{'' if done.fixpoint else ', budget spent'}) -> {out}")
    finally:
        close_executors(list(executors.values()))
    written = write_json_report({"summary": summarize(rows), "results": rows}, args.json)
    if not_failing:
        return EXIT_FAILURES
    return EXIT_CLEAN if written else EXIT_UNAVAILABLE
