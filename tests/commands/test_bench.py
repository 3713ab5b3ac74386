"""Smoke test of ``hicache-fuzz bench``: a tiny budget, then the JSON's structure and nonzero counts (never a
timing assertion: this machine's speed is not the test's business; the budgets are roomy so a loaded machine still runs
every mutant's cases, which the case cap bounds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.commands import bench_bandwidth, bench_measure
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.model.case import Direction, HostLayout
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.kernels.registry import load_registry


def test_bench_cpu_writes_json_with_stages_and_zoo(tmp_path: Path) -> None:
    out, markdown = tmp_path / "bench.json", tmp_path / "bench.md"
    code = main(["bench", "--cpu", "--platform", "cpu", "--seconds", "0.3", "--zoo-seconds", "5",
                 "--zoo-max-cases", "3", "--json", str(out), "--markdown", str(markdown)])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "cpu", "targets", "spaces", "seed"}
    for name in ("small", "large"):
        pipeline = report["cpu"][name]
        assert pipeline["cases"] > 0 and pipeline["threads"] == 1
        assert set(pipeline["stage_us_per_case"]) == set(bench_measure.STAGES)
        assert sum(pipeline["outcomes"].values()) == pipeline["cases"]
    assert report["cpu"]["small"]["compared_cases"] > 0 and report["cpu"]["small"]["verified_bytes"] > 0
    zoo = report["cpu"]["zoo"]
    assert zoo["mutants"] == len(zoo["rows"]) > 0
    assert all(row["cases"] > 0 for row in zoo["rows"])
    assert {t["target"] for t in report["targets"]} >= {"CPU small cases/s on one core (per CPU second)"}
    assert "### Pipeline throughput" in markdown.read_text()


def test_bandwidth_cases_are_valid_reference_transfers() -> None:
    machine = require("cpu")
    reference = load_registry().get("reference")
    for _, pool in bench_bandwidth.BANDWIDTH_GEOMETRIES:
        case = bench_bandwidth.bandwidth_case(pool, 2, Direction.LOAD_BACK, HostLayout.PAGE_FIRST, "reference", 1)
        assert len(case.host_indices) == bench_bandwidth.BANDWIDTH_PAGES * bench_bandwidth.BANDWIDTH_PAGE_SIZE
        assert bench_bandwidth._accepted_variant(case, reference, machine) is not None
        row_bytes = sum(pool.row_bytes(c) for c in pool.components)
        assert bench_measure.moved_bytes(case) == len(case.host_indices) * 2 * row_bytes


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --gpu would measure it")
def test_bench_gpu_without_a_gpu_exits_3_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--gpu", "--json", str(out)]) == 3
    report = json.loads(out.read_text())
    assert report["gpu"]["available"] is False and report["gpu"]["reason"]
