"""`hicache-fuzz false-alarms`: N seeded campaigns, counted by whether they raised a new bug identity."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_fuzz.harness.commands.cli import main


def run(tmp_path: Path, tag: str, *fuzz: str) -> tuple[int, dict]:
    out = tmp_path / tag
    code = main(["false-alarms", "--seeds", "2", "--seconds", "2", "--jobs", "2", "--out", str(out),
                 "--json", str(out / "summary.json"), "--markdown", str(out / "summary.md"), "--", *fuzz])
    return code, json.loads((out / "summary.json").read_text())


def test_clean_reference_raises_nothing(tmp_path: Path) -> None:
    code, summary = run(tmp_path, "clean", "--platform", "cpu", "--backend", "reference")
    assert code == 0 and summary["campaigns"] == 2 and summary["campaigns_with_new_identities"] == 0
    assert summary["total_cases"] > 0 and summary["campaigns_failed_to_run"] == 0


def test_a_bug_raises_its_identity_in_every_campaign(tmp_path: Path) -> None:
    code, summary = run(tmp_path, "bug", "--platform", "cpu", "--backend", "zoo-last-page-dropped")
    assert code == 1 and summary["campaigns_with_new_identities"] == 2
    mismatch = [bug for bug in summary["new_identities"] if "-mismatch-" in bug]
    assert len(mismatch) == 1 and summary["new_identities"][mismatch[0]] == 2  # one mismatch bug, both seeds
    assert "2 of 2 campaigns raised a new identity" in (tmp_path / "bug" / "summary.md").read_text()
