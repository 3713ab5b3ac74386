"""Summary lines of the reports that the benchmark scripts collect (benchmarks/proof_run.sh, gate_cold_jit.sh).

    python benchmarks/summarize.py campaign REPORT.json [--bare BARE.json ...] [--launched UNIX_SECONDS]
    python benchmarks/summarize.py gate GATE.json
    python benchmarks/summarize.py slim REPORT.json OUT.json

``campaign``: cases, rate, the share of the bare loop's rate (the kernel-speed baseline measured in the same
call), the engine lines of the console summary, the start-up record, outcomes and failures. ``gate``: verdict,
phase seconds, campaign rows. ``slim``: the report without the per-case id list and the coverage detail, which
make up most of its bytes and which no summary reads. Exit 2 with the reason on a file that is not such a report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.engine.engine_stats import summary_lines

BULKY_KEYS = ("case_ids", "coverage")


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"summarize: cannot read {path}: {error}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"summarize: {path} is not a JSON object")
    return data


def campaign_lines(report: dict[str, Any], bare_rates: list[float], launched: float | None = None) -> list[str]:
    rate = float(report["cases_per_second"])
    share = (f"{rate / max(bare_rates):.3f} of the bare loop's {max(bare_rates)} cases/s" if bare_rates
             else "no bare loop")
    head = f"{report['cases']} cases in {report['seconds']} s = {rate} cases/s ({share}); wall " \
           f"{report.get('wall_seconds')} s"
    first = (report.get("engine") or {}).get("first_result_unix")
    if launched is not None and first:
        head += f"; first result {first - launched:.1f} s after launch"
    outcomes = report.get("outcomes", {})
    startup = ["start-up " + json.dumps(report["startup"], sort_keys=True)] if report.get("startup") else []
    return [head, *summary_lines(report), *startup,
            "cases by backend " + json.dumps({name: sum(counts.values()) for name, counts in outcomes.items()}),
            "outcomes " + json.dumps(outcomes),
            "failures " + json.dumps([[f["signature"], f["count"], bool(f.get("known"))]
                                      for f in report.get("unique_failures", [])])]


def gate_lines(report: dict[str, Any]) -> list[str]:
    verdict = report.get("verdict", {})
    lines = [f"status {verdict.get('status')} exit {verdict.get('exit_code')} cases/backend "
             f"{verdict.get('cases_per_backend')}", "phase seconds " + json.dumps(report.get("seconds", {}))]
    lines += [f"  campaign {row['backend']}: {row['status']} {row['cases']}/{row['planned_cases']} cases, "
              f"{row['seconds']} s" for row in report.get("campaign", [])]
    return lines


def slim(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key not in BULKY_KEYS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    campaign = commands.add_parser("campaign")
    campaign.add_argument("report", type=Path)
    campaign.add_argument("--bare", type=Path, action="append", default=[], help="a bare-loop JSON (repeatable)")
    campaign.add_argument("--launched", type=float, help="unix time the campaign was launched")
    gate = commands.add_parser("gate")
    gate.add_argument("report", type=Path)
    slim_parser = commands.add_parser("slim")
    slim_parser.add_argument("report", type=Path)
    slim_parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "campaign":
            bare = [float(_load(path)["cases_per_second"]) for path in args.bare if path.exists()]
            print("\n".join(campaign_lines(_load(args.report), bare, args.launched)))
        elif args.command == "gate":
            print("\n".join(gate_lines(_load(args.report))))
        else:
            args.out.write_text(json.dumps(slim(_load(args.report))) + "\n")
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError) as error:
        print(f"summarize: {args.report} is not a {args.command} report: missing or bad {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
