"""Variety beside volume: distinct generated cases (per second) in campaign reports, the console and bench."""

from __future__ import annotations

import pytest

from hicache_fuzz.harness.campaign.dry_run import MODELLED_PLATFORMS, PredictingExecutor
from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.engine.engine_stats import EngineStats, summary_lines, variety_key
from hicache_fuzz.harness.engine.feed import EngineOptions
from hicache_fuzz.harness.engine.variants import index_variants
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.registry import load_registry

CUDA = MODELLED_PLATFORMS["cuda"]


def test_the_same_case_on_two_backends_is_one_case_of_variety() -> None:
    case = case_for_index(1, 4, CaseSpace(backend="sglang-jit", invalid_rate=0.0))
    assert variety_key(case) == variety_key(case.replace(backend="sglang-jit-register", note="elsewhere"))
    assert variety_key(case) != variety_key(case_for_index(1, 5, CaseSpace(backend="sglang-jit")))


def test_only_generated_cases_that_ran_count() -> None:
    stats = EngineStats(None)
    case = case_for_index(2, 0, CaseSpace(invalid_rate=0.0, empty_rate=0.0))
    passed = Result(case.case_id, "reference", Outcome.PASS)
    stats.add(case, passed, scale_case=False)
    stats.add(case.replace(backend="other"), passed, scale_case=False)
    for variant in index_variants(case, 3):
        stats.add(variant, passed, scale_case=False, generated=False)
    other = case_for_index(2, 1, CaseSpace())
    stats.add(other, Result(other.case_id, "reference", Outcome.UNSUPPORTED), scale_case=False)
    assert len(stats.distinct) == 1


def test_a_campaign_reports_distinct_cases_per_second_and_how_many_cases_each_became() -> None:
    registry = load_registry()
    backends = [registry.get("sglang-jit"), registry.get("sglang-jit-register")]
    executor = PredictingExecutor(backends, CUDA)
    config = CampaignConfig([b.name for b in backends], seed=3, max_cases=800, engine=EngineOptions(scale="off"),
                            dry_run=True, clock=executor.clock)
    report = run_campaign(config, backends, CUDA, executor).to_dict()
    distinct = report["distinct_cases"]
    # 7 index variants after each generated case, and the two backends draw from the same space
    assert 0 < distinct <= report["cases"] / 8
    assert report["cases_per_distinct_case"] == round(report["cases"] / distinct, 2)
    assert report["distinct_cases_per_second"] == pytest.approx(distinct / report["seconds"], rel=0.01)
    assert any(line.startswith("  variety: ") and f"{distinct:,} distinct" in line for line in summary_lines(report))


def test_bench_measures_distinct_cases_beside_cases() -> None:
    from hicache_fuzz.harness.commands.bench_measure import measure_pipeline

    machine = require("cpu")
    result = measure_pipeline("small", load_registry().get("reference"), CaseSpace(byte_budget=32 << 10), machine,
                              seconds=30.0, seed=1, max_cases=25, warm_up_cases=1)
    assert result.cases == 25 and 0 < result.distinct_cases <= result.cases
    assert result.distinct_cases_per_second > 0
