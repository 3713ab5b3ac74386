#!/usr/bin/env python3
"""Put session 6's 15 results (reports/mutate/h200/summary.json; that run's .mutate-out was lost) back as
per-mutant records, <out>/mutants/<id>.json, next to the later sessions' records, so that one
`hicache-fuzz mutate --report-only` writes the report of all 40 sampled mutants.

A record is rebuilt from the summary's per-target lists (outcome, detail, seconds, log, failures; for a survivor
its entry-point cases stand in for the campaign's path counts, which give the same `entry_cases` again). The
mutant itself (offsets, diff) is regenerated from the sglang sources by id, so it is exactly what ran. Records
already in <out>/mutants are left alone. Runs nothing.

    python reports/mutate/merge_session6.py --sglang-src /tmp/sgl/whl --out /tmp/mutate-40 \
        [--summary reports/mutate/h200/summary.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hicache_fuzz.harness.mutate import sources
from hicache_fuzz.harness.mutate.runner import result_path, write_json_atomic

LISTS = {"killers": "killed", "timeouts": "timeout", "survivors": "survived", "build_errors": "build_error",
         "errors": "error"}


def records_from_summary(summary: dict, root: Path) -> dict[str, dict]:
    by_id = {m.id: m for m in sources.generate_all(root, sources.default_sources(root))}
    records: dict[str, dict] = {}
    for name, target in summary["targets"].items():
        for key, outcome in LISTS.items():
            for entry in target.get(key, []):
                mutant = by_id.get(entry["id"])
                if mutant is None:
                    sys.exit(f"merge: mutant {entry['id']} is not among the mutants of {root}")
                record = records.setdefault(entry["id"], {
                    "mutant": {**mutant.to_dict(),
                               "diff": mutant.diff((root / mutant.file).read_text(encoding="utf-8"))},
                    "device": None, "targets": {}, "target_config": summary["meta"]["targets"],
                    "merged_from": "session 6 summary"})
                record["targets"][name] = {
                    "outcome": outcome, "seconds": entry["seconds"], "returncode": None,
                    "detail": entry["detail"], "failures": entry.get("failures", []), "log": entry["log"],
                    "output_tail": "", "paths": entry.get("entry_cases", {})}
    names = set(summary["targets"])
    partial = [i for i, r in records.items() if set(r["targets"]) != names]
    if partial:
        sys.exit(f"merge: {len(partial)} mutant(s) lack a target's result: {', '.join(partial)}")
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-src", type=Path, required=True, help="the unpacked sglang the mutants came from")
    parser.add_argument("--summary", type=Path, default=Path(__file__).parent / "h200" / "summary.json")
    parser.add_argument("--out", type=Path, required=True, help="the --out folder of the combined report")
    args = parser.parse_args()
    summary = json.loads(args.summary.read_text(encoding="utf-8"))
    root = sources.find_sglang_root(args.sglang_src)
    written = kept = 0
    for mutant_id, record in records_from_summary(summary, root).items():
        if result_path(args.out, mutant_id).exists():
            kept += 1
            continue
        write_json_atomic(result_path(args.out, mutant_id), record)
        written += 1
    print(f"merge: {written} record(s) written under {args.out / 'mutants'}, {kept} already there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
