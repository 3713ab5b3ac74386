"""sglang-hicache side-pool transfers (the ``side_transfer`` knob): a K-only or Mamba side pool named in each
transfer's ``extra_pools`` with its own host allocation (the group's ``resolve_host_transfers``), loaded from the
slots its back-up was granted, released on eviction (``release_transfers``); its bytes after every step are the
oracle's (oracles/side_transfers.py). A group that never grants the side pool its slots is caught, and so is a side
pool that moves wrong bytes."""

from __future__ import annotations

import collections

import pytest
import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Direction, HostLayout
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache_settings import side_transfer
from hicache_fuzz.oracles import sequence, side_transfers
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

SIDES = [("k_only", "MHATokenToKOnlyPoolHost", 2), ("mamba", "MambaPoolHost", 1)]
OPS = "backup,load,evict,backup,load,backup,load"


def moving_case(knob: str, page_size: int, layout: HostLayout = HostLayout.PAGE_FIRST, ops: str = OPS,
                **knobs: int | str) -> object:
    return hicache_case(Attention.MHA, layout, page_size=page_size, ops=ops, side_pool=knob, side_transfer="on",
                        **knobs)


def test_the_oracle_grants_releases_and_loads_the_side_slots() -> None:
    case = hicache_case(page_size=2, ops="backup,load,evict,backup,load", side_pool="k_only", side_transfer="on")
    steps = side_transfers.side_steps(case)
    plan = sequence.plan_steps(case)
    assert [s.op for s in steps] == [p.op for p in plan]
    n = case.n
    assert steps[0].host_slots == (tuple(range(n)),)  # step 0's back-up: the first free side slots
    assert steps[1].host_slots == (tuple(range(n, 2 * n)),)
    assert steps[2].host_slots == steps[1].host_slots and steps[2].device_rows == plan[2].device_indices  # its load
    assert steps[3].host_slots == steps[0].host_slots and steps[3].device_rows == ()  # evict: the oldest released
    load_back = hicache_case(direction=Direction.LOAD_BACK, ops="load,backup,load", side_pool="k_only",
                             side_transfer="on")
    assert [s.host_slots for s in side_transfers.side_steps(load_back)][:2] == [((),), ((),)]  # not backed up


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
@pytest.mark.parametrize("layout", [HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT])
def test_the_side_pool_moves_with_its_own_host_slots(fake_sglang: None, monkeypatch: pytest.MonkeyPatch, knob: str,
                                                     name: str, page_size: int, layout: HostLayout) -> None:
    case = moving_case(knob, page_size, layout, draft_layers=1, start_layer=2)
    assert side_transfer(case)
    checked: list[str] = []
    differs = drive.side_pools.SidePool.differs

    def counting(self: drive.side_pools.SidePool) -> str:
        checked.append(self.name)
        return differs(self)

    monkeypatch.setattr(drive.side_pools.SidePool, "differs", counting)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    transfers = sum(1 for s in sequence.plan_steps(case) if s.transfers)
    assert checked == [name] * (transfers + 1)  # after every transfer, and at the end
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    assert len(built.sides) == 1 and built.sides[0].host_pool.size == case.host_slots


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
def test_the_side_bytes_are_the_oracles_not_the_bytes_before(fake_sglang: None, knob: str, name: str,
                                                             page_size: int) -> None:
    """The oracle's side storages after a back-up differ from the filled ones: the check judges moved bytes."""
    case = moving_case(knob, page_size, ops="backup")
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    (side,) = built.sides
    side.fill_and_snapshot()
    before = side.expected_host.clone()
    for step in side_transfers.side_steps(case):
        side.apply(step)
    assert not torch.equal(before, side.expected_host)
    assert side.differs().startswith(f"{name} side pool host bytes differ from the oracle's")


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
def test_a_group_that_never_grants_the_side_pool_its_slots_is_caught(fake_sglang: None,
                                                                     monkeypatch: pytest.MonkeyPatch, knob: str,
                                                                     name: str, page_size: int) -> None:
    """``resolve_host_transfers`` testing the two index lists swapped (sglang's group.py, mutant bf64a954ca32): a
    side-pool transfer with device rows and no host slots is skipped, never granted."""
    case = moving_case(knob, page_size, ops="backup,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "side_host_swap")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert (f"step 0 (backup): the write's {name} side pool transfer was granted host slots none by "
            f"resolve_host_transfers, the oracle's side allocator grants [0, 1") in result.summary, result.summary


@pytest.mark.parametrize(("knob", "name", "page_size"), SIDES)
def test_a_side_pool_written_where_no_transfer_moves_it_is_caught_against_the_oracle(
        fake_sglang: None, monkeypatch: pytest.MonkeyPatch, knob: str, name: str, page_size: int) -> None:
    """side_write: every back-up also writes the side pools at the anchor's slots, beside the side pool's own
    transfer; the side bytes then differ from the oracle's after step 0."""
    case = moving_case(knob, page_size, HostLayout.PAGE_FIRST_DIRECT, ops="backup", io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "side_write")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert "step 0 (backup) [HybridCacheController.write granted host slots" in result.summary
    assert f"{name} side pool host bytes differ from the oracle's" in result.summary, result.summary


def test_cases_without_the_knob_keep_the_side_pool_still() -> None:
    case = hicache_case(page_size=2, ops=OPS, side_pool="k_only")
    assert not side_transfer(case)
    assert not side_transfer(hicache_case(side_pool="", side_transfer="on"))  # no side pool, nothing to move
    from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
    assert "unknown side_transfer 'yes'" in (
        SglangHicacheBackend().case_unsupported(hicache_case(side_pool="k_only", side_transfer="yes")) or "")


def test_generated_side_pool_cases_draw_both_side_transfers() -> None:
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), Platform("cuda", (9, 0)))
    seen: collections.Counter[object] = collections.Counter()
    for index in range(600):
        case = case_for_index(5, index, space)
        if backend.case_unsupported(case) is None:
            labels = backend.coverage_labels(case)
            seen[(labels["side_pool"] != "none", labels["side_transfer"])] += 1
    assert seen[(True, True)] and seen[(True, False)] and not seen[(False, True)], seen


@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
@pytest.mark.parametrize("attention", [Attention.MLA, Attention.MHA])
def test_a_k_only_side_pool_moves_beside_every_anchor_on_layer_first(fake_sglang: None, io_backend: str,
                                                                     attention: Attention) -> None:
    """layer_first under the direct io backend sorts the host slots and reorders the rows with them (move_indices),
    the side pool's by its own grant."""
    case = hicache_case(attention, HostLayout.LAYER_FIRST, page_size=2, ops=OPS, side_pool="k_only",
                        side_transfer="on", io_backend=io_backend)
    assert side_transfer(case)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
