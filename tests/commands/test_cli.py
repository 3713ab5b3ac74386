"""The CLI contract: subcommands, exit codes 0/1/2/3, the printed seed, failures on disk before the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.cli import main

PLUGIN = "tests._cli_plugin:backends"


def test_backends_lists_reference(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["backends", "--json", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "available" in out
    data = json.loads((tmp_path / "b.json").read_text())
    assert any(row["name"] == "reference" and row["available"] for row in data["backends"])


def test_fuzz_reference_is_clean_and_prints_seed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code = main(["fuzz", "--platform", "cpu", "--seed", "42", "--runs", "40", "--byte-budget", "65536",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(report), "--no-progress"])
    assert code == 0
    assert "seed 42" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["cases"] == 40 and data["seed"] == 42 and data["failures_total"] == 0
    assert sum(data["outcomes"]["reference"].values()) == 40


def test_fuzz_finds_and_saves_a_failure(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    code = main(["fuzz", "--platform", "cpu", "--backend-plugin", PLUGIN, "--backend", "test-drops-last-page",
                 "--seed", "1", "--runs", "30", "--byte-budget", "65536", "--corpus", str(corpus), "--no-progress"])
    assert code == 1
    files = list(corpus.rglob("*.json"))
    assert files, "the failure was not written to the corpus"
    # the saved reproducer replays to the same failure
    assert main(["replay", "--platform", "cpu", "--backend-plugin", PLUGIN, str(files[0])]) == 1
    # and the reference is clean on it
    assert main(["replay", "--platform", "cpu", "--backend", "reference", str(files[0])]) == 0


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["fuzz", "--platform", "cpu", "--backend", "no-such-backend", "--runs", "1"], 2),
        (["fuzz", "--platform", "cpu", "--runs", "1", "--shard", "3/2"], 2),
        (["fuzz", "--platform", "cpu"], 2),
        (["fuzz", "--platform", "rocm", "--runs", "1"], 3),
        (["fuzz", "--platform", "cuda", "--runs", "1"], 3),
        (["backends", "--backend-plugin", "nonexistent_module_xyz:f"], 2),
        ([], 2),
    ],
)
def test_exit_codes(argv: list[str], code: int, tmp_path: Path) -> None:
    assert main(argv) == code


def test_replay_of_malformed_file_is_a_clear_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1, "direction": "write_back"}')
    assert main(["replay", "--platform", "cpu", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    bad.write_text("not json at all")
    assert main(["replay", "--platform", "cpu", str(bad)]) == 2


def test_python_dash_m_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz", "backends", "--platform", "cpu"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "reference" in done.stdout


def test_replay_keeps_a_partial_json_report_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay stopped by a time limit keeps the rows it had (the report is rewritten as rows arrive)."""
    from hicache_fuzz.harness.commands import replay

    report = tmp_path / "replay.json"
    partial = replay._PartialReport(str(report))
    partial.update([{"case_id": "a"}])
    assert not report.exists()  # not yet: at most one write per interval
    monkeypatch.setattr(replay._PartialReport, "INTERVAL_S", 0.0)
    partial.update([{"case_id": "a"}, {"case_id": "b"}])
    assert json.loads(report.read_text()) == {"results": [{"case_id": "a"}, {"case_id": "b"}], "partial": True}
    replay._PartialReport(None).update([{"case_id": "c"}])  # no --json: nothing written anywhere
