"""Argument types for the command line: a budget of 0, a negative index or NaN seconds is bad usage (exit 2
at parse time, naming the option), not a run of nothing that exits 0.

argparse turns the ArgumentTypeError of a ``type=`` function into ``error: argument --runs: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import math


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
