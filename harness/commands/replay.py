"""``hicache-fuzz replay``: run case or reproducer files again (the replay service, printed as a table)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.common import add_common, add_isolation, execution_options, write_json_report
from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    UsageError,
    final_exit_code,
)
from hicache_fuzz.harness.model.output_paths import write_json_atomic

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.replay import Replayed

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("paths", nargs="+", type=Path, help="case or reproducer files, or directories of them")
    parser.add_argument("--backend", help="run every case on this backend instead of the one it names")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    add_isolation(parser, documented=False)


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.campaign.replay import replay_entries
    from hicache_fuzz.harness.findings.corpus import CorpusError, load_corpus
    from hicache_fuzz.harness.pipeline.setup import available_backend, machine_for, registry_for

    machine = machine_for(args.platform)
    registry = registry_for(args.backend_plugin)
    try:
        entries = load_corpus(args.paths)
    except CorpusError as exc:
        raise UsageError(str(exc)) from None
    if not entries:
        raise UsageError(f"no case files under {', '.join(map(str, args.paths))}")
    if args.backend:
        available_backend(registry, args.backend, machine)
    rows: list[dict[str, Any]] = []
    partial = _PartialReport(args.json)

    def replayed(replay: Replayed) -> None:
        rows.append(_print_row(replay))
        partial.update(rows)

    replays = replay_entries(entries, registry, machine, execution_options(args), None, args.backend or None,
                             on_replayed=replayed)
    failures = sum(1 for r in replays if r.verdict is not None and not r.verdict.ok)
    skipped = sum(1 for r in replays if r.skipped)
    print(f"{len(rows) - skipped - failures} passed, {failures} failed, {skipped} skipped")
    written = write_json_report({"results": rows}, args.json)
    if failures:
        return EXIT_FAILURES
    if skipped:  # entries that could not run here were not checked: their backend is unavailable (README)
        print(f"hicache-fuzz: unavailable: {skipped} case(s) not replayed: they cannot run here (see SKIP lines)",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    return final_exit_code(EXIT_CLEAN, written)


class _PartialReport:
    """The --json report rewritten as rows arrive (at most every few seconds), so a replay stopped by a time
    limit or a crash of this process leaves the rows it had; the complete report replaces it at the end."""

    INTERVAL_S = 5.0

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.written_at = time.monotonic()

    def update(self, rows: list[dict[str, Any]]) -> None:
        if self.path is None or time.monotonic() - self.written_at < self.INTERVAL_S:
            return
        with contextlib.suppress(OSError):  # the final write reports where the report went (write_json_report)
            write_json_atomic(Path(self.path), {"results": rows, "partial": True})
        self.written_at = time.monotonic()


def _print_row(replay: Replayed) -> dict[str, Any]:
    entry, case = replay.entry, replay.case
    row: dict[str, Any] = {"file": str(entry.path), "case_id": case.case_id, "backend": case.backend}
    if replay.skipped:
        row.update(outcome="skipped", reason=replay.skipped)
        print(f"SKIP {entry.path}: {replay.skipped}")
        return row
    assert replay.result is not None and replay.verdict is not None  # set for every entry that ran
    result = replay.result
    row.update(result.to_dict(), signature=replay.signature)
    if entry.observed is not None:
        row["observed_before"] = entry.observed.outcome.value
    row["verdict"] = replay.verdict.label
    first_line = result.summary.splitlines()[0] if result.summary else ""
    where = f" (raised at {result.raised_at})" if result.raised_at and not replay.verdict.ok else ""
    print(f"{replay.verdict.label} {entry.path} [{case.backend}] {result.outcome.value}: {first_line}{where}")
    return row
