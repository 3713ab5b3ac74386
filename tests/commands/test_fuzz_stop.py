"""`fuzz` stopped from outside: SIGTERM ends the campaign after the case in flight with a complete report,
and a campaign that is killed outright leaves its last checkpoint (a partial report) on disk."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def start_fuzz(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", "cpu", "--seed", "4", "--max-total-time",
         "120", "--no-progress", "--corpus", str(tmp_path / "corpus"), "--json", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, report


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.2)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_ends_the_campaign_with_a_complete_report(tmp_path: Path) -> None:
    proc, report = start_fuzz(tmp_path)
    wait_for(report, 60)  # the first checkpoint: the campaign is running
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped by SIGTERM" in out
    data = json.loads(report.read_text())
    assert "partial" not in data
    assert data["stopped_early"] is True and data["stopped_by"] == "SIGTERM"
    assert data["cases"] > 0 and data["seconds"] < 100
    assert sum(data["outcomes"]["reference"].values()) == data["cases"]


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_killed_campaign_leaves_a_partial_report(tmp_path: Path) -> None:
    proc, report = start_fuzz(tmp_path)
    wait_for(report, 60)
    proc.kill()
    proc.communicate(timeout=60)
    data = json.loads(report.read_text())
    assert data["partial"] is True
    assert data["cases"] > 0
    assert sum(data["outcomes"]["reference"].values()) == data["cases"]
