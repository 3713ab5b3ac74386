"""``hicache-fuzz report REPORT.json --html OUT.html``: render a campaign (``fuzz --json``) or gate
(``gate --json``) report as one self-contained HTML page (harness/campaign/html_report.py).

Exit codes: 0 written; 2 bad input (missing or unreadable file, not JSON, not a hicache-fuzz report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report", type=Path, metavar="REPORT.json")
    parser.add_argument("--html", type=Path, required=True, metavar="OUT.html", help="where to write the page")
    parser.add_argument("--corpus", type=Path, action="append", default=[], metavar="DIR",
                        help="link failures whose reproducer is not on this machine to the reproducer with the "
                             "same signature under DIR (e.g. corpus/sglang); repeatable")


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.campaign.html_report import report_kind, write_html
    from hicache_fuzz.harness.model.json_input import MAX_REPORT_FILE_BYTES, InputError, read_json_file

    try:
        data = read_json_file(Path(args.report), MAX_REPORT_FILE_BYTES)
    except InputError as exc:
        print(f"hicache-fuzz report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        kind = report_kind(data)
    except ValueError as exc:
        print(f"hicache-fuzz report: {args.report}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for folder in args.corpus:
        if not folder.is_dir():
            print(f"hicache-fuzz report: --corpus {folder}: no such folder", file=sys.stderr)
            return EXIT_USAGE
    out = write_html(data, args.html, args.corpus)
    print(f"wrote {kind} report {out}")
    return EXIT_CLEAN
