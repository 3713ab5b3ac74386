"""``hicache-fuzz merge``: merge the reports and corpora of workers, shards or CI jobs; write JUnit XML
(the merging itself is :mod:`hicache_fuzz.harness.reporting.merge`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hicache_fuzz.harness.commands.arg_types import non_negative_int, output_path
from hicache_fuzz.harness.commands.common import write_json_report
from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    final_exit_code,
)

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"out": "dir", "junit": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json",
                        help="campaign reports (fuzz --json) of the workers, shards or jobs to merge, or "
                             "folders holding them")
    parser.add_argument("--corpus", nargs="+", action="extend", default=[], type=Path, metavar="DIR",
                        help="corpus directories to merge into OUT/corpus (repeatable)")
    parser.add_argument("--out", type=output_path, required=True, metavar="DIR",
                        help="writes DIR/report.json, DIR/corpus/ and DIR/junit.xml")
    parser.add_argument("--junit", type=output_path, metavar="PATH", help="JUnit XML path (default: OUT/junit.xml)")
    parser.add_argument("--suite-name", default="hicache-fuzz",
                        help="JUnit testsuite name (default: %(default)s)")
    parser.add_argument("--max-per-signature", type=non_negative_int, default=3,
                        help="reproducers kept per failure signature, 0 for all (default: %(default)s)")
    parser.add_argument("--allow-overlap", action="store_true",
                        help="merge even if inputs ran the same cases (counts then include repeats)")


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.commands.output import write_text_report
    from hicache_fuzz.harness.model.output_paths import check_output_file
    from hicache_fuzz.harness.reporting.junit import junit_bytes
    from hicache_fuzz.harness.reporting.merge import (
        MergeError,
        describe,
        junit_cases,
        load_report,
        merge_corpora,
        merge_reports,
        point_failures_at,
        report_files,
    )

    # the files merge writes inside --out must be writable too (a FIFO named report.json is not)
    check_output_file(args.out / "report.json", "--out")
    if args.junit is None:
        check_output_file(args.out / "junit.xml", "--out")

    try:
        paths = report_files(args.reports)
        reports = [load_report(path) for path in paths]
        merged = merge_reports(reports, [str(p) for p in paths], args.allow_overlap)
        representatives = [(f["signature"], f.get("first_case_id", "")) for f in merged["unique_failures"]]
        corpus = merge_corpora(args.corpus, args.out / "corpus", args.max_per_signature, representatives)
    except MergeError as exc:
        print(f"hicache-fuzz merge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # OUT cannot take the merged corpus: report the merged report anyway
        print(f"hicache-fuzz merge: unavailable: cannot write the merged corpus under {args.out}: "
              f"{exc.strerror or exc} ({exc.filename})", file=sys.stderr)
        write_json_report(merged, args.out / "report.json")
        return EXIT_UNAVAILABLE
    point_failures_at(merged, corpus)
    merged["corpus"] = {"kept": len(corpus.kept), "duplicates": corpus.duplicates,
                        "over_cap": corpus.over_cap, "unreadable": corpus.unreadable}
    written = write_json_report(merged, args.out / "report.json")
    junit_path = args.junit or args.out / "junit.xml"
    # like the report, a JUnit file that cannot go where asked goes to a temporary file and the message says where
    junit_text = junit_bytes(args.suite_name, junit_cases(merged)).decode("utf-8")
    written = write_text_report(junit_path, junit_text, "JUnit XML", ".xml") and written
    print(describe(merged))
    print(f"corpus: {len(corpus.kept)} files kept, {corpus.duplicates} duplicates, {corpus.over_cap} over "
          f"the per-signature cap, {len(corpus.unreadable)} unreadable -> {args.out / 'corpus'}")
    for problem in corpus.unreadable:
        print(f"  skipped: {problem}", file=sys.stderr)
    for folder in corpus.missing:
        print(f"  no corpus folder {folder} (a campaign without failures writes none)", file=sys.stderr)
    print(f"report: {args.out / 'report.json'}; junit: {junit_path}")
    if corpus.unreadable:  # bad input: exit 2, after everything that could be merged was written
        print(f"hicache-fuzz merge: error: {len(corpus.unreadable)} corpus file(s) refused (listed above)",
              file=sys.stderr)
        return EXIT_USAGE
    if merged["unique_failures"]:
        return EXIT_FAILURES
    return final_exit_code(EXIT_CLEAN, written)
