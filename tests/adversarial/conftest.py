"""Shared helpers of the adversarial suite: run the CLI in this process and collect what it said."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from hicache_fuzz.harness.commands.cli import main


@dataclass
class Ran:
    code: int
    out: str
    err: str


def error_lines(err: str) -> str:
    """The lines of `err` that state the error (not argparse's usage lines, which list every option)."""
    return "\n".join(line for line in err.splitlines() if "error" in line or "unavailable" in line)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> object:
    def run(*argv: str) -> Ran:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)
    return run


@pytest.fixture
def block_after_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A path that becomes a regular file once the command has checked its output paths: a late fault (as a
    full disk is), so a path under it fails at write time, not at the check (which refuses a path already under
    a file at once, exit 2)."""
    from hicache_fuzz.harness.commands import output

    blocker = tmp_path / "blocker"
    check = output.check_declared_outputs

    def check_then_block(*args: object, **kwargs: object) -> None:
        check(*args, **kwargs)  # type: ignore[arg-type]
        blocker.write_text("a file where a folder should be")

    monkeypatch.setattr(output, "check_declared_outputs", check_then_block)
    return blocker


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short folder (a UNIX socket path must stay under ~100 characters)."""
    folder = Path(tempfile.mkdtemp(prefix="hf-adv-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A command that blocks (a FIFO opened for reading waits for a writer forever) fails the test after 60 s
    instead of hanging the suite."""
    def expire(number: int, frame: FrameType | None) -> None:
        raise TimeoutError("the command hung")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
