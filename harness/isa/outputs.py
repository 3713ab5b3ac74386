"""What ``hicache-fuzz isa`` leaves once its targets are checked: the closing lines on stdout, and the
``--json`` and ``--markdown`` reports."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

from hicache_fuzz.harness.isa.render import render_markdown
from hicache_fuzz.harness.isa.symbols import IsaReport
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN


def print_verdict(reports: Sequence[IsaReport]) -> None:
    """The closing lines: the skipped targets and why, every failure, or the pass with its kernel count."""
    passed = all(report.passed for report in reports) and bool(reports)
    skipped = [report for report in reports if report.skipped]
    failed = [report for report in reports if not report.passed and not report.skipped]
    if skipped and not failed:
        print(f"isa: NOT CHECKED: {len(skipped)} of {len(reports)} targets skipped (no compiler for them)")
        for report in skipped:
            print(f"  {report.platform}/{report.arch}: {report.skipped}")
    elif not passed:
        print("isa: FAIL")
        for report in reports:
            for failure in report.failures():
                print(f"  {failure}")
    else:
        total = sum(len(report.kernels) for report in reports)
        print(f"isa: PASS ({total} kernel instantiations over {len(reports)} targets)")


def command_of(args: argparse.Namespace) -> str:
    """The command line the reports name."""
    own_argv = getattr(args, "argv", None)  # set by main(); under hicache-fuzz's CLI sys.argv has "isa"
    return (
        "hicache-fuzz isa " + " ".join(own_argv)
        if own_argv is not None
        else "hicache-fuzz " + " ".join(sys.argv[1:])
    )


def write_reports(args: argparse.Namespace, reports: Sequence[IsaReport], exit_code: int) -> None:
    """``--json`` (every report, the verdict and the exit code) and ``--markdown``, when asked for."""
    command = command_of(args)
    if args.json:
        document = {
            "tool": "hicache-fuzz isa",
            "command": command,
            "passed": exit_code == EXIT_CLEAN,  # exit 0 exactly when every target was checked and passed
            "exit_code": exit_code,
            "skipped_targets": [f"{report.platform}/{report.arch}" for report in reports if report.skipped],
            "reports": [report.to_json() for report in reports],
        }
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.markdown).write_text(render_markdown(reports, command))
