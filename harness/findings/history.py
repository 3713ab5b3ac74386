"""A flaky crash's worker history as case files, to find what corrupted the worker.

A worker's crash or hang whose case runs clean in a fresh worker is flaky (model/outcome.py ``Result.flaky``):
an earlier case of that worker corrupted it. Its reproducer keeps the cases the worker ran just before it
(``observed.diff.worker_history``, pipeline/worker.py). :func:`write_history` writes them, then the crashed case,
as numbered case files; ``hicache-fuzz replay --isolate yes FOLDER`` runs a folder's files in name order, one at a
time in one worker, so it replays the sequence, and dropping files from the folder narrows it to the culprit.

``python -m hicache_fuzz.harness.findings.history REPRODUCER FOLDER``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hicache_fuzz.harness.findings.corpus import CorpusError, load_entry
from hicache_fuzz.harness.model.case import Case, CaseError
from hicache_fuzz.harness.model.json_input import InputError
from hicache_fuzz.harness.model.outcome import HISTORY_KEY
from hicache_fuzz.harness.model.output_paths import write_text_atomic


def write_history(reproducer: Path, folder: Path) -> list[Path]:
    """Write ``NN-<case id>.json`` into `folder`: the reproducer's worker history (oldest first), then its own
    case last; returns the paths in replay order. InputError where the file holds no worker history."""
    entry = load_entry(reproducer)
    history = entry.observed.diff.get(HISTORY_KEY) if entry.observed is not None else None
    if not isinstance(history, list) or not history:
        raise InputError(f"{reproducer}: no {HISTORY_KEY} (only a crash that ran clean in a fresh worker has one)")
    try:
        cases = [Case.from_dict(item) for item in history]
    except (CaseError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{reproducer}: {HISTORY_KEY}: not a list of cases ({exc})") from None
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, case in enumerate([*cases, entry.case]):
        path = folder / f"{number:02d}-{case.case_id}.json"
        write_text_atomic(path, case.to_json(indent=2))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache_fuzz.harness.findings.history",
                                     description="a flaky crash's worker history as case files, in replay order")
    parser.add_argument("reproducer", type=Path)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        paths = write_history(args.reproducer, args.folder)
    except (InputError, CorpusError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(paths)} cases in {args.folder}; replay them in order in one worker: "
          f"hicache-fuzz replay --isolate yes {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
