"""The one progress line (harness/model/progress.py): drawn only on a terminal and when enabled, redrawn in
place, cleared before permanent output."""

from __future__ import annotations

import io

from hicache_fuzz.harness.model.progress import ProgressLine, duration, eta


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_draws_in_place_on_a_terminal_with_elapsed_time() -> None:
    stream, clock = FakeTTY(), Clock()
    line = ProgressLine(stream=stream, clock=clock)
    line.update("10 cases")
    clock.now += 65
    line.update("20 cases")
    text = stream.getvalue()
    assert text.startswith("\r10 cases  [0s]") and "\r20 cases  [1m05s]" in text
    line.close()
    assert stream.getvalue().endswith("\r")  # cleared: the next output starts on a clean line


def test_throttled_unless_forced() -> None:
    stream, clock = FakeTTY(), Clock()
    line = ProgressLine(stream=stream, every=1.0, clock=clock)
    line.update("a")
    line.update("b")  # within the interval: skipped
    line.update("c", force=True)
    assert "b" not in stream.getvalue() and "\rc" in stream.getvalue()


def test_a_shorter_line_erases_the_longer_one() -> None:
    stream = FakeTTY()
    line = ProgressLine(stream=stream, every=0)
    line.update("a long status line")
    line.update("short")
    last = stream.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("short") and len(last) >= len("a long status line  [0s]")


def test_silent_when_disabled_or_not_a_terminal() -> None:
    for line, stream in ((ProgressLine(False, stream=(s := FakeTTY())), s),
                         (ProgressLine(True, stream=(p := io.StringIO())), p)):
        line.update("x", force=True)
        line.print("permanent")  # still printed on stdout, nothing on the stream
        line.close()
        assert stream.getvalue() == "" and not line.enabled


def test_durations_and_eta() -> None:
    assert [duration(s) for s in (0, 59.4, 61, 3600 + 120)] == ["0s", "59s", "1m01s", "1h02m"]
    assert duration(float("nan")) == "?"
    assert eta(0, 10, 5) == "ETA ?"
    assert eta(5, 10, 10) == "ETA 10s"


def test_eta_of_a_step_in_progress() -> None:
    from hicache_fuzz.harness.model.progress import eta_of_step

    assert eta_of_step(0, 4, 0.0, 0.0, 5.0) == "ETA ?"
    # 2 steps done in 20 s (10 s each), the third has run 4 s: 6 s left of it plus 10 s for the fourth
    assert eta_of_step(2, 4, 20.0, 0.0, 24.0) == "ETA 16s"
