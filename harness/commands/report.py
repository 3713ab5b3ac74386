"""``hicache-fuzz report REPORT.json --html OUT.html``: render a campaign (``fuzz --json``) or gate
(``gate --json``) report as one self-contained HTML page (harness/reporting/html_report.py).

Also ``python -m hicache_fuzz.harness.commands.report REPORT.json --html OUT.html`` (the same options).

Exit codes: 0 written; 2 bad input (missing or unreadable file, not JSON, not a hicache-fuzz report); 3 the page
could not be written where asked (it went to a temporary file, or stdout, and the message says where).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hicache_fuzz.harness.commands.arg_types import output_path
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_USAGE, final_exit_code

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"html": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report", type=Path, metavar="REPORT.json")
    parser.add_argument("--html", type=output_path, required=True, metavar="OUT.html", help="where to write the page")
    parser.add_argument("--corpus", type=Path, action="append", default=[], metavar="DIR",
                        help="link failures whose reproducer is not on this machine to the reproducer with the "
                             "same signature under DIR (e.g. corpus/sglang); repeatable")


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.commands.output import write_text_report
    from hicache_fuzz.harness.model.json_input import MAX_REPORT_FILE_BYTES, InputError, read_json_file
    from hicache_fuzz.harness.reporting.html_report import render_html, report_kind, signature_files

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
    out = Path(args.html)
    # links are relative to the folder asked for, also when the page has to go elsewhere
    page = render_html(data, out.parent.resolve(), signature_files(args.corpus))
    written = write_text_report(out, page, f"{kind} page", ".html")
    if written:
        print(f"wrote {kind} report {out}")
    return final_exit_code(EXIT_CLEAN, written)


def main(argv: list[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.commands.report``: the same as ``hicache-fuzz report``."""
    parser = argparse.ArgumentParser(prog="hicache-fuzz report", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
