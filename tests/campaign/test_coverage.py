"""Campaign coverage: only executed cases count, gaps name the missing buckets, shards sum up."""

from __future__ import annotations

import torch

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.reporting.coverage import Coverage, case_features
from hicache_fuzz.harness.reporting.merge import merge_reports
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import Platform


def mla_case(pages: int, page_size: int) -> Case:
    n = pages * page_size
    return Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
                pools=(PoolSpec(attention=Attention.MLA, heads=1, head_dim=16),), layers=1, page_size=page_size,
                device_rows=n + page_size, host_slots=n, host_indices=tuple(range(n)),
                device_indices=tuple(range(page_size, n + page_size)),
                host_index=IndexSpec(IndexDtype.INT64, IndexDevice.CPU))


def test_features_bucket_the_staging_chunk_and_both_index_sides() -> None:
    features = case_features(mla_case(64, 1))
    assert features["pages"] == ["63-65"]
    assert features["page_size"] == ["1"]
    assert features["index_device"] == ["cpu", "device"]
    assert features["attention"] == ["mla"]


def test_unexecuted_cases_do_not_count_and_gaps_are_named() -> None:
    coverage = Coverage()
    case = mla_case(64, 16)
    coverage.add(case, Result(case.case_id, "b", Outcome.UNSUPPORTED))
    assert coverage.gaps("b") == ["attention=mha", "attention=mla", "page_size=1", "page_size=16-64",
                                  "index_dtype=int32", "index_dtype=int64", "index_device=cpu",
                                  "index_device=device", "pages=63-65", "dtype: 0 of 2 distinct (none)"]
    coverage.add(case, Result(case.case_id, "b", Outcome.PASS))
    assert "pages=63-65" not in coverage.gaps("b")
    assert "attention=mla" not in coverage.gaps("b")
    assert "attention=mha" in coverage.gaps("b")


def test_campaign_reports_coverage_and_shards_sum_to_the_whole() -> None:
    registry = load_registry()
    machine = Machine(Platform("cpu"), torch.device("cpu"), "cpu")
    backend = registry.get("reference")
    space = CaseSpace(byte_budget=64 << 10)

    def campaign(shard: tuple[int, int]) -> dict:
        config = CampaignConfig(["reference"], seed=8, max_cases=60 // shard[1], space=space, shard=shard)
        return run_campaign(config, [backend], machine.platform, InProcessExecutor(registry, machine)).to_dict()

    whole = campaign((0, 1))
    assert sum(whole["coverage"]["reference"]["direction"].values()) == sum(
        n for k, n in whole["outcomes"]["reference"].items() if k not in ("unsupported", "undefined"))
    merged = merge_reports([campaign((0, 2)), campaign((1, 2))])
    assert merged["coverage"] == whole["coverage"]


def test_two_dtypes_are_required_and_exemptions_replace_gaps() -> None:
    coverage = Coverage()
    case = mla_case(64, 16)
    coverage.add(case, Result(case.case_id, "b", Outcome.PASS))
    assert any(g.startswith("dtype: 1 of 2 distinct") for g in coverage.gaps("b"))
    coverage.exempt("b", {"attention=mha": "MLA-only backend"})
    assert "attention=mha" not in coverage.gaps("b")
    merged = Coverage.from_dicts([coverage.to_dict()], [{"b": {"attention=mha": "MLA-only backend"}}])
    assert merged.gaps("b") == coverage.gaps("b")
    assert merged.exemptions == {"b": {"attention=mha": "MLA-only backend"}}
