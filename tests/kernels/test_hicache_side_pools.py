"""sglang-hicache side pools: a K-only index pool or a Mamba state pool beside the anchor in the hybrid
controller's HostPoolGroup, built by their own constructors; the group's flags come from every child, the anchor's
transfers are judged as ever, and a side pool no transfer names must keep its bytes (a planted bug that writes it
is caught)."""

from __future__ import annotations

import collections

import pytest
import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, HostLayout
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_hicache_drive
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import side_pool
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

SIDES = [("k_only", "MHATokenToKOnlyPoolHost", 2), ("mamba", "MambaPoolHost", 1)]


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
@pytest.mark.parametrize("attention", [Attention.MHA, Attention.MLA, Attention.MHA_ASYM])
def test_side_pool_joins_the_group_and_the_anchor_moves_exactly(fake_sglang, knob: str, name: str, page_size: int,
                                                                attention: Attention) -> None:
    case = hicache_case(attention, HostLayout.PAGE_FIRST, page_size=page_size, ops="backup,load,evict,backup,load",
                        side_pool=knob, draft_layers=1, start_layer=2)
    assert side_pool(case) == name
    built = sglang_hicache_drive.build(sglang_hicache_drive.load_modules(), case, torch.device("cpu"))
    group = built.controller.mem_pool_host
    assert [type(e.host_pool).__name__ for e in group.entries][1:] == [name]
    assert group.anchor_entry.host_pool is built.host_pool and group.entries[1].host_pool is built.sides[0].host_pool
    flags = [e.host_pool.can_use_write_back_jit for e in group.entries]
    assert group.can_use_write_back_jit == all(flags) and group.supports_per_pool_backup_indices == any(flags)
    assert run_on_cpu(case).outcome is Outcome.PASS


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
def test_a_transfer_that_writes_the_side_pool_is_caught(fake_sglang, monkeypatch, knob: str, name: str,
                                                        page_size: int) -> None:
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST_DIRECT, page_size=page_size, ops="backup",
                        side_pool=knob, io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "side_write")  # every back-up also writes the side pools
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert f"{name} side pool tensor 0 changed" in result.summary


def test_side_pools_exist_only_where_the_case_has_a_group_they_fit() -> None:
    assert side_pool(hicache_case(side_pool="k_only", controller="base")) == ""  # no group under HiCacheController
    assert side_pool(hicache_case(Attention.MHA, HostLayout.PAGE_HEAD,
                                  side_pool="k_only")) == ""  # the K-only pool has no page_head
    assert side_pool(hicache_case(page_size=2, side_pool="mamba")) == ""  # one Mamba slot per page
    assert side_pool(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST,
                                  pool_kind="hisparse", side_pool="k_only")) == ""  # anchors are the KV pools
    assert side_pool(hicache_case(side_pool="")) == ""
    unknown = hicache_case(side_pool="swa")
    assert "unknown side_pool 'swa'" in (SglangHicacheBackend().case_unsupported(unknown) or "")


def test_generated_cases_draw_every_side_pool() -> None:
    backend = load_registry().get("sglang-hicache")
    h200 = Platform("cuda", (9, 0))
    space = backend.case_space(CaseSpace(), h200)
    seen: collections.Counter[object] = collections.Counter()
    for index in range(600):
        case = case_for_index(5, index, space)
        if backend.case_unsupported(case) is None:
            seen[backend.coverage_labels(case)["side_pool"]] += 1
    assert {"none", "MHATokenToKOnlyPoolHost", "MambaPoolHost"} <= set(seen), seen
