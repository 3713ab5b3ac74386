"""Signals: SIGTERM/SIGINT end single and parallel campaigns after the cases in flight, with a complete report,
the right exit code, no traceback and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", "cpu", "--seed", "4", "--max-total-time", "120",
         "--no-progress", "--corpus", str(tmp_path / "corpus"), "--json", str(report), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    return proc, report


def _wait_for_line(proc: subprocess.Popen[str], needle: str, seconds: float) -> list[str]:
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r}: {lines}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_parallel_campaign_stops_cleanly_on_a_signal(signal_number: int, tmp_path: Path) -> None:
    proc, report = _start(tmp_path, "--workers", "2", "--backend-plugin", "tests._cli_plugin:backends",
                          "--backend", "test-drops-last-page")
    head = _wait_for_line(proc, "workers started", 90)
    logs = sorted((tmp_path / "corpus" / ".parallel").glob("*/worker-*.log"))
    deadline = time.monotonic() + 90
    while not all("running cases" in log.read_text() for log in logs):  # both shards are running cases
        assert time.monotonic() < deadline, [log.read_text() for log in logs]
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal_number)
    rest, _ = proc.communicate(timeout=90)
    out = "".join(head) + rest
    assert proc.returncode == 1, out  # the plugin's failures were found (and saved)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    name = signal.Signals(signal_number).name
    assert f"stopped by {name}" in out
    data = json.loads(report.read_text())
    assert data["stopped_by"] == name and data["cases"] > 0
    assert sum(data["outcomes"]["test-drops-last-page"].values()) == data["cases"]
    for failure in data["unique_failures"]:  # nothing found is lost: every failure class has its reproducer
        assert list((tmp_path / "corpus" / failure["signature"]).glob("*.json")), failure
    shard_pids = [entry["pid"] for entry in data["merged_from"]]
    assert len(shard_pids) == 2
    time.sleep(0.5)
    assert not [pid for pid in shard_pids if _alive(pid)], "shard processes left behind"


def test_single_campaign_sigint_has_no_traceback(tmp_path: Path) -> None:
    proc, report = _start(tmp_path)
    _wait_for_line(proc, "platform:", 60)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "stopped by SIGINT" in out
    assert json.loads(report.read_text())["stopped_by"] == "SIGINT"
