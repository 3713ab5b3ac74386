"""Writing what a command computed, so that a late write error never loses it.

Every output path is checked before the command starts (:func:`check_declared_outputs`, the rules in
harness/model/output_paths.py: exit 2 naming the option). A campaign may still run for hours before its report
is written; if the disk then fills up, or the folder was replaced meanwhile, the report goes to a fresh file in
the temporary directory instead and the message says where (and why); if even that fails, the JSON is printed
on stdout between marker lines. The caller learns whether the report reached the path that was asked for
(exit 3 when nothing else failed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.output_paths import write_json_atomic

STDOUT_BEGIN = "---- hicache-fuzz report (could not be written to a file) ----"
STDOUT_END = "---- end of hicache-fuzz report ----"


def os_reason(exc: OSError) -> str:
    return f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")


def write_report(path: Path | str | None, data: Any, what: str = "report") -> bool:
    """Write `data` as JSON to `path` (nothing when `path` is None); True if it landed there. Otherwise it is
    written elsewhere (see the module docstring), the reason and the place are printed on stderr, and False
    is returned."""
    if path is None or path == "":
        return True
    target = Path(path)
    try:
        write_json_atomic(target, data)
        return True
    except OSError as exc:
        reason = os_reason(exc)
    fallback = write_fallback(data, what)
    if fallback is not None:
        print(f"hicache-fuzz: could not write the {what} to {target}: {reason}; written to {fallback} instead",
              file=sys.stderr, flush=True)
    else:
        print(f"hicache-fuzz: could not write the {what} to {target} ({reason}) nor to a temporary file; "
              f"it follows on stdout", file=sys.stderr, flush=True)
        print(STDOUT_BEGIN)
        print(json.dumps(data, indent=2, sort_keys=True))
        print(STDOUT_END, flush=True)
    return False


def write_text_report(path: Path | str | None, text: str, what: str, suffix: str) -> bool:
    """Like :func:`write_report` for a text report (HTML, Markdown): True if it landed at `path`; otherwise it is
    written to a temporary file (or, failing that, printed on stdout), the message says where and why, and False
    is returned (the command then exits 3 unless it found something: exit_codes.final_exit_code)."""
    if path is None or path == "":
        return True
    from hicache_fuzz.harness.model.output_paths import write_text_atomic

    target = Path(path)
    try:
        write_text_atomic(target, text)
        return True
    except OSError as exc:
        reason = os_reason(exc)
    try:
        fd, name = tempfile.mkstemp(prefix=f"hicache-fuzz-{what.replace(' ', '-')}-", suffix=suffix)
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"hicache-fuzz: could not write the {what} to {target}: {reason}; written to {name} instead",
              file=sys.stderr, flush=True)
    except OSError:
        print(f"hicache-fuzz: could not write the {what} to {target} ({reason}) nor to a temporary file; "
              f"it follows on stdout", file=sys.stderr, flush=True)
        print(STDOUT_BEGIN)
        print(text)
        print(STDOUT_END, flush=True)
    return False


def check_declared_outputs(args: argparse.Namespace, outputs: Mapping[str, str]) -> None:
    """Check every output path a command declares (``OUTPUT_OPTIONS``: argparse dest -> "file" or "dir")
    before it does any work: OutputPathError (exit 2) names the option (harness/model/output_paths.py)."""
    from hicache_fuzz.harness.model.output_paths import check_output_dir, check_output_file

    for dest, kind in outputs.items():
        values = getattr(args, dest, None)
        option = "--" + dest.replace("_", "-")
        for value in values if isinstance(values, list) else [values]:
            (check_output_dir if kind == "dir" else check_output_file)(value, option)


def write_fallback(data: Any, what: str) -> Path | None:
    """`data` as JSON in a fresh temporary file (mode 0644); its path, or None when even that cannot be written."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"hicache-fuzz-{what.replace(' ', '-')}-", suffix=".json")
    except OSError:
        return None
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        return Path(name)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name)
        return None


def flush_unsaved_reproducers(reproducers: list[dict[str, Any]], reason: str) -> None:
    """Failures the corpus could not take (kept in memory by the campaign): tell the user, write each to the
    temporary directory if it can, print it otherwise. They are in the report too."""
    if not reproducers:
        return
    print(f"hicache-fuzz: {len(reproducers)} failure reproducer(s) could not be saved to the corpus ({reason}); "
          "they are in the report under unsaved_reproducers", file=sys.stderr, flush=True)
    for data in reproducers:
        fallback = write_fallback(data, "reproducer")
        if fallback is not None:
            print(f"  {data.get('signature', '?')}: written to {fallback}", file=sys.stderr, flush=True)
        else:
            print(f"  {data.get('signature', '?')}: {json.dumps(data, sort_keys=True)}", flush=True)
