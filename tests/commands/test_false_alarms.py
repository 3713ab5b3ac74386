"""`hicache-fuzz false-alarms`: N seeded campaigns, counted by whether they raised a new bug identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.cli import main


def run(tmp_path: Path, tag: str, *fuzz: str, seconds: str = "2") -> tuple[int, dict]:
    out = tmp_path / tag
    code = main(["false-alarms", "--seeds", "2", "--seconds", seconds, "--jobs", "2", "--out", str(out),
                 "--json", str(out / "summary.json"), "--markdown", str(out / "summary.md"), "--", *fuzz])
    return code, json.loads((out / "summary.json").read_text())


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_clean_reference_raises_nothing(tmp_path: Path) -> None:
    code, summary = run(tmp_path, "clean", "--platform", "cpu", "--backend", "reference")
    assert code == 0 and summary["campaigns"] == 2 and summary["campaigns_with_new_identities"] == 0
    assert summary["total_cases"] > 0 and summary["campaigns_failed_to_run"] == 0
    # concurrent campaigns run one worker each (a default GPU campaign would start a pool)
    assert summary["fuzz_args"][-2:] == ["--worker-processes", "1"]


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_crashes_that_run_clean_in_a_fresh_worker_are_counted_flaky_not_new(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])  # the campaigns' workers import the test plugin from here
    code, summary = run(tmp_path, "poison", "--platform", "cpu", "--isolate", "yes", "--backend-plugin",
                        "tests._worker_plugin:backends", "--backend", "test-poison", "--runs", "40", seconds="120")
    assert code == 0 and summary["campaigns_with_new_identities"] == 0 and summary["new_identities"] == {}
    assert summary["flaky_identities"] and all("-crash-" in bug for bug in summary["flaky_identities"])
    assert "flaky identities" in (tmp_path / "poison" / "summary.md").read_text()


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_a_bug_raises_its_identity_in_every_campaign(tmp_path: Path) -> None:
    # A case budget, not a clock: on a loaded 2-core CI machine a 2-s campaign once ran a single case, whose
    # identity was not the mismatch (40 cases meet it under both seeds; the clock is only a guard).
    code, summary = run(tmp_path, "bug", "--platform", "cpu", "--backend", "zoo-last-page-dropped", "--runs", "40",
                        seconds="120")
    assert code == 1 and summary["campaigns_with_new_identities"] == 2
    mismatch = [bug for bug in summary["new_identities"] if "-mismatch-" in bug]
    assert len(mismatch) == 1 and summary["new_identities"][mismatch[0]] == 2  # one mismatch bug, both seeds
    assert "2 of 2 campaigns raised a new identity" in (tmp_path / "bug" / "summary.md").read_text()


def test_gpus_pin_campaigns_round_robin_and_the_deadline_stops_starting(tmp_path: Path) -> None:
    out = tmp_path / "pinned"
    code = main(["false-alarms", "--seeds", "3", "--seconds", "1", "--jobs", "1", "--gpus", "1,0",
                 "--start-deadline", "0.5", "--out", str(out), "--json", str(out / "summary.json"),
                 "--markdown", str(out / "summary.md"), "--", "--platform", "cpu", "--backend", "reference"])
    summary = json.loads((out / "summary.json").read_text())
    # one at a time: the first campaign starts at once (pinned to the first listed device), and after it no
    # other starts (the deadline has passed): those seeds are listed, not counted
    assert code == 0 and summary["campaigns"] == 1 and summary["seeds_not_run"] == [2, 3]
    assert summary["runs"][0]["device"] == "1"
    assert "not counted" in (out / "summary.md").read_text()


def test_device_ids() -> None:
    import pytest

    from hicache_fuzz.harness.commands.false_alarms import device_ids
    from hicache_fuzz.harness.model.exit_codes import UsageError

    assert device_ids("none", "0,1") == []
    assert device_ids("2", None) == ["0", "1"]
    assert device_ids("2", "4,5,6") == ["4", "5"]
    assert device_ids("1,0", "4,5") == ["5", "4"]
    assert device_ids("3,1", None) == ["3", "1"]
    for bad, visible in (("0", None), ("x", None), ("3", "0,1"), ("0,2", "0,1"), ("1,a", None)):
        with pytest.raises(UsageError):
            device_ids(bad, visible)
