"""selftest, bench and report: a report that cannot be written where the user asked goes elsewhere, the message
says where, and the exit code is 3 (an environment problem: exit_codes.final_exit_code), as for fuzz and gate."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_FAILURES, EXIT_UNAVAILABLE, final_exit_code

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def blocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder path that stops existing after the command checked its outputs (a regular file appears where the
    folder must be: a late fault, as a full disk is), so the late-write fallback is what runs; fallbacks go to
    tmp_path. (A path already blocked when the command starts is refused at once: tests/adversarial.)"""
    from hicache_fuzz.harness.commands import output

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    check = output.check_declared_outputs

    def check_then_block(*args: object, **kwargs: object) -> None:
        check(*args, **kwargs)  # type: ignore[arg-type]
        (tmp_path / "file").write_text("")

    monkeypatch.setattr(output, "check_declared_outputs", check_then_block)
    return tmp_path / "file"


def moved_to(err: str) -> Path:
    [where] = re.findall(r"written to (\S+) instead", err)
    return Path(where)


def test_rule() -> None:
    assert final_exit_code(EXIT_CLEAN, False) == EXIT_UNAVAILABLE
    assert final_exit_code(EXIT_FAILURES, False) == EXIT_FAILURES  # findings win
    assert final_exit_code(EXIT_CLEAN, True) == EXIT_CLEAN


def test_selftest(blocked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["selftest", "--platform", "cpu", "--byte-budget", "65536", "--reference-cases", "2", "--seed", "3",
                 "--mutant", "zoo-last-page-dropped", "--max-cases-per-mutant", "200",
                 "--json", str(blocked / "selftest.json")])
    assert code == EXIT_UNAVAILABLE
    assert json.loads(moved_to(capsys.readouterr().err).read_text())["passed"]


def test_bench_markdown(blocked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--cpu", "--platform", "cpu", "--seconds", "0.2", "--zoo-seconds", "0.2",
                 "--zoo-max-cases", "1", "--json", str(tmp_path / "bench.json"),
                 "--markdown", str(blocked / "bench.md")])
    assert code == EXIT_UNAVAILABLE
    assert "### Pipeline throughput" in moved_to(capsys.readouterr().err).read_text()


def test_report_html(blocked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(ROOT / "tests" / "data" / "gate-cpu.json"), "--html", str(blocked / "gate.html")])
    assert code == EXIT_UNAVAILABLE
    assert moved_to(capsys.readouterr().err).read_text().startswith("<!DOCTYPE html>")


def test_aot_smoke_is_a_command_that_says_why_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the smoke would run")
    report = tmp_path / "smoke.json"
    assert main(["aot-smoke", "--json", str(report)]) == EXIT_UNAVAILABLE
    data = json.loads(report.read_text())
    assert not data["backends"]["sglang-aot"]["available"] and data["backends"]["sglang-aot"]["reason"]
    assert "sglang-aot: UNAVAILABLE: " in capsys.readouterr().out
