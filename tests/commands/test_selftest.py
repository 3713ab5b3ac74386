"""``hicache-fuzz selftest`` end to end, with small budgets: exit codes, the table, the JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.commands.cli import main

FAST_MUTANTS = ["zoo-cpu-indices-rejected", "zoo-silent-fallback", "zoo-last-page-dropped", "zoo-row-tail-truncated"]
SMALL = ["--platform", "cpu", "--byte-budget", "65536", "--reference-cases", "5", "--seed", "3"]


def test_selftest_passes_when_every_mutant_is_killed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "selftest.json"
    args = ["selftest", *SMALL, "--max-cases-per-mutant", "200", "--json", str(report)]
    for name in FAST_MUTANTS:
        args += ["--mutant", name]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "seed 3" in out and "killed 4/4" in out and "median" in out and "worst" in out
    assert "selftest passed" in out
    data = json.loads(report.read_text())
    assert data["passed"] and data["exit_code"] == 0 and data["seed"] == 3
    assert [row["mutant"] for row in data["mutants"]] == FAST_MUTANTS
    for row in data["mutants"]:
        assert row["killed"] and row["cases"] >= 1 and row["signature"] and row["bug_class"].startswith("B")
        assert row["reference_on_kill_case"] in ("pass", "rejected_as_predicted")
    assert data["summary"]["killed"] == 4 and data["summary"]["worst_cases_to_kill"] <= 200
    assert data["reference"]["clean"] and data["reference"]["cases"] == 5


def test_selftest_fails_when_a_mutant_survives(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "selftest.json"
    code = main(["selftest", *SMALL, "--backend-plugin", "tests._selftest_plugin:lookalike",
                 "--mutant", "test-zoo-lookalike", "--mutant", "zoo-cpu-indices-rejected",
                 "--max-cases-per-mutant", "15", "--json", str(report)])
    assert code == 1
    out = capsys.readouterr().out
    assert "SURVIVED: test-zoo-lookalike" in out and "selftest FAILED" in out
    data = json.loads(report.read_text())
    rows = {row["mutant"]: row for row in data["mutants"]}
    assert not rows["test-zoo-lookalike"]["killed"] and rows["test-zoo-lookalike"]["cases"] == 15
    assert rows["zoo-cpu-indices-rejected"]["killed"]
    assert data["summary"]["survivors"] == ["test-zoo-lookalike"] and not data["passed"]


def test_selftest_fails_when_the_reference_is_not_clean(tmp_path: Path) -> None:
    report = tmp_path / "selftest.json"
    code = main(["selftest", "--platform", "cpu", "--byte-budget", "65536", "--seed", "3",
                 "--backend-plugin", "tests._selftest_plugin:broken_reference", "--mutant", "zoo-silent-fallback",
                 "--max-cases-per-mutant", "50", "--reference-cases", "30", "--json", str(report)])
    assert code == 1
    assert not json.loads(report.read_text())["reference"]["clean"]


def test_selftest_usage_exit_code() -> None:
    assert main(["selftest", "--platform", "cpu", "--mutant", "no-such-mutant"]) == 2
    assert main(["selftest", "--platform", "cpu", "--max-cases-per-mutant", "0"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present, so no platform is absent to ask for")
def test_selftest_unavailable_platform_exit_code() -> None:
    platform = "rocm" if not getattr(torch.version, "hip", None) else "cuda"
    assert main(["selftest", "--platform", platform, "--mutant", "zoo-empty-rejected"]) == 3
