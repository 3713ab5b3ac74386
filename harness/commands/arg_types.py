"""Argument types for the command line: a budget of 0, a negative index or NaN seconds is bad usage (exit 2
at parse time, naming the option), not a run of nothing that exits 0.

argparse turns the ArgumentTypeError of a ``type=`` function into ``error: argument --runs: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path


def _integer(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (case counts, byte budgets, run budgets)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (indices; caps where 0 means "no cap")."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def finite_positive_float(text: str) -> float:
    """A finite number > 0 (seconds: time budgets, timeouts)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def finite_non_negative_float(text: str) -> float:
    """A finite number >= 0 (deadlines, where 0 means "at once")."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def unit_interval(text: str) -> float:
    """A finite number in [0, 1] (scores, shares): NaN would make every comparison false (a gate that never
    fails)."""
    value = _finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def regex(text: str) -> str:
    """A regular expression that compiles (the text is kept: callers compile it where they use it)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a valid regular expression ({exc}): {text!r}") from None
    return text


def existing_dir(text: str) -> Path:
    """A folder that exists (a source tree to read): a wrong path is bad usage, like every other wrong path."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'not a folder' if path.exists() else 'no such folder'}")
    return path


def output_path(text: str) -> Path:
    """A path the command will write (the output boundary checks it fully before the command runs): never empty,
    which ``Path("")`` would silently turn into the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (give a file or folder name)")
    return Path(text)
