"""The progress line of every long-running command (fuzz, minimize, gate, isa): one self-overwriting status
line on a terminal with live counts, elapsed time and an ETA, and nothing at all otherwise.

It writes only when enabled (``--no-progress`` turns it off) and its stream (stderr by default) is a TTY, so
logs, pipes and CI output never get carriage returns. Standard library only: the stand-alone ISA tool imports
it too (tests/test_layers.py).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

REFRESH_SECONDS = 0.25  # the shortest interval between two redraws (a forced update is drawn at once)


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def eta(done: float, total: float, elapsed: float) -> str:
    """`ETA 1m05s` from the rate so far (`ETA ?` before the first unit is done)."""
    if done <= 0 or total <= 0 or elapsed <= 0:
        return "ETA ?"
    return f"ETA {duration(max(0.0, (total - done) * elapsed / done))}"


def eta_of_step(steps_done: int, steps: int, step_started: float, started: float, now: float) -> str:
    """ETA while step `steps_done + 1` of `steps` runs (targets, backends): the mean of the finished steps, less
    what the running one has already taken (`ETA ?` until one step has finished)."""
    if steps_done <= 0:
        return "ETA ?"
    mean = (step_started - started) / steps_done
    return f"ETA {duration(max(0.0, (steps - steps_done) * mean - (now - step_started)))}"


class ProgressLine:
    """One status line on `stream` (stderr), redrawn at most every `every` seconds (REFRESH_SECONDS); silent
    when disabled or when the stream is not a terminal."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and _is_tty(self.stream)
        self.every = REFRESH_SECONDS if every is None else every
        self.clock = clock
        self.started = clock()
        self._last = -math.inf
        self._width = 0  # characters of the line on screen (0: nothing to clear)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def update(self, text: str, force: bool = False) -> None:
        """Show `text` (with the elapsed time appended) in place of the previous line."""
        if not self.enabled:
            return
        now = self.clock()
        if not force and now - self._last < self.every:
            return
        self._last = now
        line = f"{text}  [{duration(now - self.started)}]"
        self.stream.write("\r" + line + " " * max(0, self._width - len(line)))
        self.stream.flush()
        self._width = len(line)

    def clear(self) -> None:
        """Erase the line (before a permanent message, so the two do not share a line)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
            self._last = -math.inf

    def print(self, text: str) -> None:
        """A permanent line on stdout, the status line cleared first."""
        self.clear()
        print(text, flush=True)

    def close(self) -> None:
        self.clear()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or exotic stream
        return False
