"""``hicache-fuzz selftest``: does the campaign catch every bug in the zoo, and leave the reference clean?

For each zoo mutant (every registered backend with ``models_bug`` set, plugins included) a campaign with
the default generator runs until its first failure or the per-mutant budget; the mutant is "killed" when a
failure is found. The killing case is then replayed on the reference, which must not fail on it, so a kill
is the mutant's bug and not a harness problem. Finally the reference itself runs ``--reference-cases``
cases and must be clean. Exit 0 only if every mutant is killed and the reference is clean, else 1.

Time-to-kill (cases and seconds to the first failure) is reported per mutant, with the median and the
worst, because it measures how well the generator's bias reaches each bug class.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.arg_types import finite_positive_float, non_negative_int, output_path, positive_int
from hicache_fuzz.harness.commands.common import add_common, add_isolation, execution_options, write_json_report
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, UsageError, final_exit_code

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.loop import CampaignReport
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.pipeline.executor import Executor
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

DEFAULT_SEED = 20260
# CPU throughput is ~3-200 cases/s depending on case size, machine load and harness version. The rarest zoo
# classes fire in about 1.5% of default cases (~65 cases expected; worst seen 304), so 3000 cases / 300 s
# leaves a wide margin even at the low end.
DEFAULT_MAX_CASES_PER_MUTANT = 3000
DEFAULT_MAX_SECONDS_PER_MUTANT = 300.0
DEFAULT_REFERENCE_CASES = 1000


@dataclass
class MutantRow:
    mutant: str
    bug_class: str  # the part of models_bug before the first colon, e.g. "B4"
    models_bug: str
    killed: bool
    cases: int  # cases run, up to and including the killing one
    seconds: float
    outcome: str = ""  # of the killing case
    signature: str = ""
    summary: str = ""
    kill_index: int = -1  # campaign index of the killing case
    kill_case_id: str = ""
    reference_on_kill_case: str = ""  # the reference's outcome on the killing case (must not be a failure)
    note: str = ""

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "corpus": "dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="campaign seed (default: %(default)s)")
    parser.add_argument("--max-cases-per-mutant", type=positive_int, default=DEFAULT_MAX_CASES_PER_MUTANT,
                        help="give up on a mutant after this many cases (default: %(default)s)")
    parser.add_argument("--max-seconds-per-mutant", type=finite_positive_float, default=DEFAULT_MAX_SECONDS_PER_MUTANT,
                        help="give up on a mutant after this many seconds (default: %(default)s)")
    parser.add_argument("--reference-cases", type=non_negative_int, default=DEFAULT_REFERENCE_CASES,
                        help="the reference must be clean over this many cases (default: %(default)s)")
    parser.add_argument("--mutant", action="append", default=[], metavar="NAME",
                        help="run only this zoo mutant (repeatable; default: every registered mutant)")
    parser.add_argument("--byte-budget", type=positive_int, help="largest case in bytes (default: the generator's)")
    parser.add_argument("--corpus", type=output_path, help="save the killing cases here as reproducers")
    parser.add_argument("--json", metavar="PATH", help="write the table and summary as JSON")
    add_isolation(parser)


def _bug_class(models_bug: str) -> str:
    head, sep, _ = models_bug.partition(":")
    return head.strip() if sep and len(head) <= 16 else models_bug[:16]


def _mutants(registry: Registry, names: list[str]) -> list[Backend]:
    zoo = sorted(registry.zoo(), key=lambda b: b.name)
    if not names:
        return zoo
    by_name = {b.name: b for b in zoo}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UsageError(f"not zoo mutants: {', '.join(unknown)}; known: {', '.join(sorted(by_name))}")
    return [by_name[n] for n in names]


def _run_mutant(mutant: Backend, options: CampaignOptions, machine: Machine, executor: Executor,
                reference_executor: Executor) -> MutantRow:
    from hicache_fuzz.harness.campaign.options import run_from_options
    from hicache_fuzz.harness.engine.campaign_case import backend_space, campaign_case

    row = MutantRow(mutant.name, _bug_class(mutant.models_bug), mutant.models_bug, False, 0, 0.0)
    availability = mutant.probe(machine.platform)
    if not availability.available:
        row.note = f"unavailable: {availability.reason}"
        return row
    report = run_from_options(options, [mutant], machine.platform, executor)
    row.cases, row.seconds = report.cases, report.seconds
    if not report.failures:
        row.note = f"survived {report.cases} cases in {report.seconds:.1f} s"
        return row
    failure = report.failures[0]
    row.killed = True
    row.outcome, row.signature, row.summary = failure.outcome, failure.signature, failure.summary
    row.kill_index, row.kill_case_id = failure.first_index, failure.first_case_id
    # Replay the killing case on the reference: if the reference fails on it too, the kill says nothing
    # about the mutant's bug.
    platform = machine.platform
    space = backend_space(mutant, options.space(), platform, options.seed)
    mix = options.engine.resolved_mix(platform)
    case = campaign_case(options.seed, failure.first_index, mutant, space, platform, mix)
    reference_result = reference_executor.run(case.replace(backend="reference"))
    row.reference_on_kill_case = reference_result.outcome.value
    if reference_result.outcome.is_failure:
        row.killed = False
        row.note = f"the reference fails on the killing case too ({reference_result.summary[:200]})"
    return row


def _print_row(row: MutantRow, width: int) -> None:
    killed = "yes" if row.killed else "NO"
    detail = f"{row.outcome} {row.signature}" if row.killed else row.note
    print(f"  {row.mutant:<{width}}  {killed:<6} {row.cases:>6} {row.seconds:>8.2f}  {row.bug_class:<8} {detail}",
          flush=True)


@dataclass
class SelftestOptions:
    """What the selftest runs: the seed, the budget per mutant, which mutants, the reference's case count."""

    seed: int = DEFAULT_SEED
    max_cases_per_mutant: int = DEFAULT_MAX_CASES_PER_MUTANT
    max_seconds_per_mutant: float = DEFAULT_MAX_SECONDS_PER_MUTANT
    reference_cases: int = DEFAULT_REFERENCE_CASES
    mutants: list[str] = field(default_factory=list)  # empty: every registered mutant
    byte_budget: int | None = None
    corpus: Path | None = None  # save the killing cases here as reproducers


def run(args: argparse.Namespace) -> int:
    options = SelftestOptions(args.seed, args.max_cases_per_mutant, args.max_seconds_per_mutant,
                              args.reference_cases, list(args.mutant), args.byte_budget, args.corpus)
    report = run_selftest(options, execution_options(args))
    written = write_json_report(report, args.json)  # elsewhere if it must (the message says where): exit 3
    return final_exit_code(int(report["exit_code"]), written)


@dataclass
class _Selftest:
    """What the selftest's campaigns share: the machine, the backends and the two campaigns' options."""

    machine: Machine
    registry: Registry
    execution: ExecutionOptions
    mutants: list[Backend]
    reference: Backend
    mutant_campaign: CampaignOptions  # per mutant, up to its first failure
    reference_campaign: CampaignOptions  # the reference's own, which must be clean


def run_selftest(options: SelftestOptions, execution: ExecutionOptions) -> dict[str, Any]:
    """Run the selftest, printing its table as it goes; returns the report (what --json writes)."""
    _check_options(options)
    selftest = _set_up(options, execution)
    width = _print_header(options, selftest)
    rows, reference_report = _run_campaigns(selftest, width)
    summary = _kill_summary(rows)
    _print_kills(rows, summary)
    reference_clean = reference_report is None or not reference_report.failures
    reference_data = _reference_data(reference_report)
    ok = not summary["survivors"] and reference_clean
    exit_code = EXIT_CLEAN if ok else EXIT_FAILURES
    print("selftest passed" if ok else "selftest FAILED", flush=True)
    return {
        "seed": options.seed,
        "platform": selftest.machine.description,
        "command": "hicache-fuzz " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["selftest"] else "",
        "budget": {"max_cases_per_mutant": options.max_cases_per_mutant,
                   "max_seconds_per_mutant": options.max_seconds_per_mutant,
                   "reference_cases": options.reference_cases,
                   "byte_budget": selftest.mutant_campaign.space().byte_budget},
        "mutants": [asdict(r) for r in rows],
        "summary": summary,
        "reference": reference_data,
        "passed": ok,
        "exit_code": exit_code,
    }


def _check_options(options: SelftestOptions) -> None:
    for option in ("max_cases_per_mutant", "max_seconds_per_mutant"):
        if getattr(options, option) <= 0:
            raise UsageError(f"--{option.replace('_', '-')} must be positive")
    if options.reference_cases < 0:
        raise UsageError("--reference-cases must be >= 0")


def _set_up(options: SelftestOptions, execution: ExecutionOptions) -> _Selftest:
    """The machine, the mutants (none registered is exit 2), the reference and the campaigns' options."""
    from hicache_fuzz.harness.campaign.options import CampaignOptions
    from hicache_fuzz.harness.pipeline.setup import machine_for, registry_for

    machine = machine_for(execution.platform)
    registry = registry_for(execution.backend_plugins)
    mutants = _mutants(registry, options.mutants)
    if not mutants:
        raise UsageError("no zoo mutants are registered (backends with models_bug set)")
    mutant_campaign = CampaignOptions(options.seed, options.max_cases_per_mutant, options.max_seconds_per_mutant,
                                      options.corpus, byte_budget=options.byte_budget, stop_on_first_failure=True)
    reference_campaign = CampaignOptions(options.seed, options.reference_cases, None, options.corpus,
                                         byte_budget=options.byte_budget)
    return _Selftest(machine, registry, execution, mutants, registry.get("reference"), mutant_campaign,
                     reference_campaign)


def _print_header(options: SelftestOptions, selftest: _Selftest) -> int:
    """The seed, the budgets and the table's heading; returns the width of the mutant column."""
    print(f"hicache-fuzz selftest: seed {options.seed}", flush=True)
    print(f"platform: {selftest.machine.description}; {len(selftest.mutants)} mutants; budget per mutant "
          f"{options.max_cases_per_mutant} cases / {options.max_seconds_per_mutant:g} s; reference "
          f"{options.reference_cases} cases", flush=True)
    width = max(len(m.name) for m in selftest.mutants)
    print(f"  {'mutant':<{width}}  {'killed':<6} {'cases':>6} {'seconds':>8}  {'class':<8} outcome / signature")
    return width


def _run_campaigns(selftest: _Selftest, width: int) -> tuple[list[MutantRow], CampaignReport | None]:
    """Each mutant's campaign, its row printed as it ends, then the reference's own (None for 0 cases)."""
    from hicache_fuzz.harness.campaign.options import run_from_options
    from hicache_fuzz.harness.pipeline.setup import executor_for

    registry, machine, execution = selftest.registry, selftest.machine, selftest.execution
    # Worker executors (--isolate) journal the case in flight; selftest keeps no journal beyond the run.
    journals = tempfile.TemporaryDirectory(prefix="hicache-fuzz-selftest-")
    reference_executor = executor_for([selftest.reference], registry, machine, execution,
                                      Path(journals.name) / "reference")
    rows: list[MutantRow] = []
    try:
        for mutant in selftest.mutants:
            executor = executor_for([mutant], registry, machine, execution, Path(journals.name) / mutant.name)
            try:
                row = _run_mutant(mutant, selftest.mutant_campaign, machine, executor, reference_executor)
            finally:
                executor.close()
            rows.append(row)
            _print_row(row, width)

        reference_report = run_from_options(selftest.reference_campaign, [selftest.reference], machine.platform,
                                            reference_executor) if selftest.reference_campaign.max_cases else None
    finally:
        reference_executor.close()
        journals.cleanup()
    return rows, reference_report


def _kill_summary(rows: list[MutantRow]) -> dict[str, Any]:
    """How many mutants were killed, the survivors, and the time (and cases) to kill: median and worst."""
    killed = [r for r in rows if r.killed]
    summary: dict[str, Any] = {"mutants": len(rows), "killed": len(killed),
                               "survivors": [r.mutant for r in rows if not r.killed]}
    if killed:
        seconds = [r.seconds for r in killed]
        cases = [r.cases for r in killed]
        worst = max(killed, key=lambda r: r.seconds)
        summary.update(median_seconds_to_kill=round(statistics.median(seconds), 3),
                       worst_seconds_to_kill=round(worst.seconds, 3), worst_mutant=worst.mutant,
                       median_cases_to_kill=statistics.median(cases), worst_cases_to_kill=max(cases),
                       total_seconds=round(sum(r.seconds for r in rows), 3))
    return summary


def _print_kills(rows: list[MutantRow], summary: dict[str, Any]) -> None:
    print(f"killed {summary['killed']}/{len(rows)}", end="")
    if summary["killed"]:
        print(f"; time to kill: median {summary['median_seconds_to_kill']:.2f} s "
              f"({summary['median_cases_to_kill']:g} cases), worst {summary['worst_seconds_to_kill']:.2f} s "
              f"({summary['worst_mutant']}); worst case count {summary['worst_cases_to_kill']}", end="")
    print()
    if summary["survivors"]:
        print(f"SURVIVED: {', '.join(summary['survivors'])}")


def _reference_data(reference_report: CampaignReport | None) -> dict[str, Any]:
    """The reference's campaign as the report gives it, its lines printed (nothing when it ran no case)."""
    if reference_report is None:
        return {"cases": 0, "clean": True}
    reference_clean = not reference_report.failures
    state = "clean" if reference_clean else f"NOT CLEAN ({reference_report.failure_count} failures)"
    print(f"reference: {reference_report.cases} cases in {reference_report.seconds:.1f} s, {state}")
    for failure in reference_report.failures:
        print(f"  [{failure.signature}] {failure.summary}")
    return {"cases": reference_report.cases, "seconds": round(reference_report.seconds, 3),
            "clean": reference_clean, "outcomes": reference_report.outcomes.get("reference", {}),
            "failures": [f.__dict__ for f in reference_report.failures]}
