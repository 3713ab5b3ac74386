"""A CPU campaign's console summary: no GPU-only figures (host registration chunks, index variants, reused
storages) and a short page-size list (the JSON report keeps the whole list)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.engine.engine_stats import SIZES_SHOWN, summary_lines


def test_a_cpu_campaign_prints_no_gpu_lines_and_a_short_size_list(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "report.json"
    assert main(["fuzz", "--platform", "cpu", "--seed", "3", "--runs", "400", "--no-progress",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    assert "registration chunks" not in out and "index variants" not in out and "reused storages" not in out
    report = json.loads(report_path.read_text())
    sizes = report["scale"]["page_sizes_not_power_of_two"]
    assert len(sizes) > SIZES_SHOWN  # 400 cases draw more; the JSON keeps them all
    line = next(line for line in out.splitlines() if "page sizes not a power of two" in line)
    shown = line.split("page sizes not a power of two", 1)[1].split(";")[0]
    assert shown.strip().startswith(f"{len(sizes)} (")
    assert len(re.findall(r"\d+", shown)) == SIZES_SHOWN + 2  # the count, the first few, the largest

    report["engine"]["cpu_only"] = False  # the same report as a GPU run prints it
    gpu_text = "\n".join(summary_lines(report))
    assert "registration chunks" in gpu_text and "index variants" in gpu_text
