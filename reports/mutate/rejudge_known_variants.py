#!/usr/bin/env python3
"""Re-judge the campaign verdicts of a finished mutation run with the "masked by a known identity" rule
(`harness/mutate/targets.py: masked_by_known`), which was added after session 8's calls had run: a mutant's
campaign whose KNOWN failure classes show a variant the unmutated campaign never showed is a kill.

Reads <out>/mutants/*.json and the stored campaign reports <out>/runs/<id>/campaign.json (and the baseline's);
runs nothing. Prints, and with --json writes, the verdicts the rule changes.

    python reports/mutate/rejudge_known_variants.py --out .mutate-out [--json reports/mutate/h200-s8/rejudged.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hicache_fuzz.harness.mutate.targets import baseline_failure_variants, masked_by_known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the mutation run's --out folder")
    parser.add_argument("--target", default="campaign", help="the campaign target's name (default campaign)")
    parser.add_argument("--json", type=Path, help="write the re-judged verdicts here")
    args = parser.parse_args()
    baseline_report = args.out / "runs" / "baseline" / f"{args.target}.json"
    try:
        unmutated = json.loads(baseline_report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        sys.exit(f"rejudge: no unmutated campaign report at {baseline_report} ({exc})")
    variants, cases = baseline_failure_variants(unmutated), int(unmutated.get("cases", 0))
    rows = []
    for path in sorted((args.out / "mutants").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        mutant_id = record["mutant"]["id"]
        as_run = record["targets"][args.target]["outcome"]
        report_path = args.out / "runs" / mutant_id / f"{args.target}.json"
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rows.append({"id": mutant_id, "as_run": as_run, "rejudged": as_run, "why": "no stored report"})
            continue
        masked = masked_by_known(report, variants, cases) if as_run == "survived" else []
        rows.append({"id": mutant_id, "as_run": as_run, "rejudged": "killed" if masked else as_run,
                     "masked": [{k: f.get(k) for k in ("signature", "known", "first_index", "new_variants",
                                                       "summary")} for f in masked]})
    for row in rows:
        flag = "  <- changed" if row["rejudged"] != row["as_run"] else ""
        print(f"{row['id']}  {row['as_run']:9} -> {row['rejudged']:9}{flag}")
        for failure in row.get("masked", []):
            print(f"    {failure['signature']} (known: {failure['known']}), new variants {failure['new_variants']}: "
                  f"{str(failure['summary'])[:160]}")
    if args.json:
        args.json.write_text(json.dumps({"baseline_cases": cases, "mutants": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
