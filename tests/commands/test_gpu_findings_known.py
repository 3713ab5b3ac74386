"""The committed H200 campaigns' failures are all on record: each signature has an expected-failure
reproducer in corpus/sglang, so `fuzz --known corpus/sglang` (and the gate) treat them as known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.options import load_known_failures

ROOT = Path(__file__).resolve().parents[2]
REPORTS = [ROOT / "reports/gpu/cli-campaign/report.json", ROOT / "reports/gpu/cli-campaign-spares/report.json"]


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.parent.name)
def test_every_committed_gpu_failure_is_a_known_sglang_behaviour(report: Path) -> None:
    known = load_known_failures([ROOT / "corpus/sglang"])
    signatures = [f["signature"] for f in json.loads(report.read_text())["unique_failures"]]
    assert signatures, "the campaign's failures are the point of this check"
    assert [s for s in signatures if s not in known] == []
