"""Menu growth: a backend's row menu grows with the campaign index (deterministically, so shards and resumed
campaigns draw the same cases), and the campaign hands each next stage to Backend.prefetch one stage early."""

from __future__ import annotations

import torch

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.kernels.registry import Registry
from hicache_fuzz.oracles.contract import Platform

GROWING = CaseSpace(row_bytes=(128,), head_dims=(), row_bytes_growth=(256, 128, 384), grow_every=10,
                    byte_budget=64 << 10, max_pools=1, attentions=(Attention.MHA, Attention.MLA), invalid_rate=0.0)


def test_rows_join_the_menu_by_index() -> None:
    assert GROWING.at_index(0).row_bytes == (128,)
    assert GROWING.at_index(9).row_bytes == (128,)
    assert GROWING.at_index(10).row_bytes == (128, 256)
    assert GROWING.at_index(25).row_bytes == (128, 256)  # 128 was on the menu already
    assert GROWING.at_index(30).row_bytes == (128, 256, 384)
    assert GROWING.at_index(10_000).row_bytes == (128, 256, 384)
    assert [GROWING.rows_of_stage(s) for s in range(5)] == [(), (256,), (), (384,), ()]
    assert CaseSpace().at_index(10_000) == CaseSpace()  # no growth configured: unchanged


def rows_drawn(indices: range) -> set[int]:
    return {p.row_bytes(c) for i in indices for p in case_for_index(7, i, GROWING).pools for c in p.components}


def test_cases_draw_grown_rows_only_once_they_have_joined() -> None:
    assert rows_drawn(range(0, 10)) == {128}
    assert rows_drawn(range(30, 130)) == {128, 256, 384}
    # case i depends on (seed, i, space) only: the same whether or not earlier cases were drawn
    assert case_for_index(7, 57, GROWING) == case_for_index(7, 57, GROWING)


class GrowingBackend(ReferenceBackend):
    name = "test-growing"

    def __init__(self) -> None:
        self.prefetched: list[tuple[int, ...]] = []

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return GROWING.narrowed(backend=self.name)

    def prefetch(self, space: CaseSpace, platform: Platform) -> None:
        self.prefetched.append(space.row_bytes)


def campaign(backend: GrowingBackend, cases: int, start: int = 0) -> dict:
    machine = Machine(Platform("cpu"), torch.device("cpu"), "cpu")
    registry = Registry({backend.name: backend})
    config = CampaignConfig([backend.name], seed=7, max_cases=cases, start_index=start)
    return run_campaign(config, [backend], machine.platform, InProcessExecutor(registry, machine)).to_dict()


def test_the_campaign_prefetches_each_stage_one_stage_ahead() -> None:
    backend = GrowingBackend()
    report = campaign(backend, 5)
    assert backend.prefetched == [(256,)]  # stage 1 starts compiling before any case can draw it
    assert report["menu_growth"] == {}
    backend = GrowingBackend()
    report = campaign(backend, 25)
    assert backend.prefetched == [(256,), (384,)]  # stage 2 adds nothing new; stage 3 is prefetched at 20
    assert report["menu_growth"] == {"test-growing": [256]}
    backend = GrowingBackend()
    campaign(backend, 3, start=100)  # a resumed campaign catches up at once
    assert backend.prefetched == [(256,), (384,)]
