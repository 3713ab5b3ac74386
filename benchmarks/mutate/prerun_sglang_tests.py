#!/usr/bin/env python3
"""Run sglang's staged HiCache tests once on the UNMUTATED sglang (the installed one) and write down which of them
fail, error or skip on this machine, so the mutation run deselects exactly those (and says so in its report)
instead of aborting on a failed baseline. It also compiles the tests' JIT modules into the shared cache, several
at a time (pytest-xdist), before the mutation run starts.

    python3 benchmarks/mutate/prerun_sglang_tests.py --out DIR [--workers N] [--timeout S]

Writes DIR/prerun-junit.xml, DIR/prerun.log, DIR/deselect.txt (node ids, one a line) and DIR/prerun.json
({"passed", "failed", "errors", "skipped", "deselected": [{"node", "outcome", "message"}], "returncode"}).
Exit 0 when at least one test passed (the rest can be deselected), 1 when none did, 4 when nothing ran.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

TESTS = Path(__file__).resolve().parents[2] / ".mutate-targets" / "sglang-tests"


def node_id(case: ElementTree.Element) -> str:
    classname = case.get("classname", "")
    module, _, klass = classname.partition(".") if classname.count(".") else (classname, "", "")
    # functions: classname "test_hicache" -> test_hicache.py::name; a class: "test_x.TestY" -> test_x.py::TestY::name
    prefix = f"{module.replace('.', '/')}.py" + (f"::{klass}" if klass else "")
    return f"{prefix}::{case.get('name', '')}"


def outcomes(junit: Path) -> tuple[dict[str, int], list[dict[str, str]]]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    bad: list[dict[str, str]] = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        for tag, outcome in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                counts[outcome] += 1
                bad.append({"node": node_id(case), "outcome": outcome,
                            "message": (found.get("message") or "")[:300]})
                break
        else:
            counts["passed"] += 1
    return counts, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers (0: none)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    junit = args.out / "prerun-junit.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:hicache_fuzz",
               "-p", "no:randomly", f"--junitxml={junit}", "."]
    if args.workers > 0:
        command[3:3] = ["-p", "xdist", "-n", str(args.workers)]
    with open(args.out / "prerun.log", "w", encoding="utf-8") as log:
        try:
            code: int | None = subprocess.run(command, cwd=TESTS, stdout=log, stderr=subprocess.STDOUT,
                                              timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    if not junit.is_file():
        (args.out / "prerun.json").write_text(json.dumps({"returncode": code, "error": "no junit report"}) + "\n")
        (args.out / "deselect.txt").write_text("")
        print(f"prerun: pytest exit {code}, no junit report (see {args.out / 'prerun.log'})")
        return 4
    counts, bad = outcomes(junit)
    (args.out / "deselect.txt").write_text("".join(f"{b['node']}\n" for b in bad))
    (args.out / "prerun.json").write_text(json.dumps({"returncode": code, **counts, "deselected": bad},
                                                     indent=1) + "\n")
    print(f"prerun: pytest exit {code}; {json.dumps(counts)}; {len(bad)} test(s) to deselect")
    return 0 if counts["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
