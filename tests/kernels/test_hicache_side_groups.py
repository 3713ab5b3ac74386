"""sglang-hicache groups of two side pools and side pools that refuse their grant (``side_pool`` = ``k_only+mamba``,
``side_transfer`` = ``full``): the oracle's side allocators, one per side pool, and its plan of refused back-ups
(oracles/sequence.py, oracles/side_transfers.py); with the fake sglang on the CPU, both side pools named in every
transfer, each granted by its own allocator, and a write the group refuses given back whole; each planted bug of
those paths caught; the profile that draws them."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import (
    SIDE_BOTH,
    SIDE_GROUPS_PROFILE,
    SIDE_POOLS,
    side_pools,
    side_refusals,
    side_transfer,
)
from hicache_fuzz.oracles import sequence, side_transfers
from tests.kernels._hicache_helpers import SM90, fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

K_ONLY, MAMBA = "MHATokenToKOnlyPoolHost", "MambaPoolHost"
OPS = "backup,load,evict,backup,load,backup,load"
# step 0 holds the refusing pool's room, the program's first back-up is refused, the evict frees the room, the next
# back-up takes it, the load moves its entry
REFUSING_OPS = "backup,evict,backup,load"


def group_case(layout: HostLayout = HostLayout.PAGE_FIRST, *, page_size: int = 1, side_pool: str = SIDE_BOTH,
               transfer: str = "on", ops: str = OPS, **knobs: Any) -> Case:
    return hicache_case(Attention.MHA, layout, page_size=page_size, ops=ops, side_pool=side_pool,
                        side_transfer=transfer, **knobs)


# ---- the oracle -------------------------------------------------------------------------------------------------

def test_two_side_pools_are_granted_by_their_own_allocators() -> None:
    case = group_case()
    steps = side_transfers.side_steps(case, 2)
    n, slots = case.n, case.host_slots
    assert steps[0].host_slots == (tuple(range(n)), tuple(range(n)))  # both allocators start with every slot free
    assert steps[0].free == (slots - n, slots - n)
    assert steps[1].host_slots == (tuple(range(n, 2 * n)),) * 2
    load = steps[2]  # of the program's first back-up's entry
    assert load.op == sequence.LOAD and load.host_slots == steps[1].host_slots and load.transfers
    assert all(step.host_slots[0] == step.host_slots[1] for step in steps)  # the same requests, the same grants


def test_the_oracle_refuses_back_ups_while_the_room_is_held() -> None:
    """Pages of 1 slot, 2 tokens, 5 host slots: step 0 takes the anchor's 1, 3 and the refusing pool's room; the
    program's first back-up is granted the anchor's 0, 2 and refused, giving them back behind 4."""
    case = group_case(transfer="full", ops="backup,evict,backup,load", page_size=1)
    assert (case.n, case.host_slots) == (2, 5) and sequence.side_refusals(case)
    plan = sequence.plan_steps(case)
    assert [s.op for s in plan] == [sequence.BACKUP, sequence.REFUSED, sequence.EVICT, sequence.BACKUP, sequence.LOAD]
    assert plan[0].host_indices == (1, 3)
    assert plan[1].host_indices == (0, 2) and plan[1].free == 3 and not plan[1].transfers  # given back: 4, 0, 2
    assert plan[3].host_indices == (4, 0) and plan[4].host_indices == (4, 0)
    assert [s.op for s in sequence.transfer_steps(case)] == [sequence.BACKUP, sequence.BACKUP, sequence.LOAD]
    steps = side_transfers.side_steps(case, 2)
    assert side_transfers.held_outside(case, 2, 1) == 3 and side_transfers.held_outside(case, 2, 0) == 0
    assert steps[0].host_slots == ((0, 1), (3, 4))  # the refusing pool's room is its last n slots
    assert steps[0].free == (3, 0)
    # refused: the K-only pool's grant (2, 3) given back behind 4, the Mamba pool asked last grants nothing
    assert steps[1].host_slots == ((), ()) and steps[1].free == (3, 0) and not steps[1].transfers
    assert steps[2].host_slots == ((0, 1), (3, 4)) and steps[2].free == (5, 2)  # the evict releases both
    assert steps[3].host_slots == ((4, 2), (3, 4))  # K-only: after 4 come the rolled-back 2, 3
    assert steps[4].host_slots == steps[3].host_slots and steps[4].device_rows == plan[4].device_indices


def test_without_a_refusing_pool_nothing_is_refused_and_valid_programs_stay_valid() -> None:
    for ops in sequence.valid_programs(4):
        full = group_case(transfer="full", ops=ops)
        on = group_case(transfer="on", ops=ops)
        refused = [s for s in sequence.plan_steps(full) if s.op == sequence.REFUSED]
        assert not any(s.op == sequence.REFUSED for s in sequence.plan_steps(on))
        assert not refused or "backup" in ops
        side_transfers.side_steps(full, 2)  # the oracle's own consistency checks hold
        side_transfers.side_steps(full, 1)
    load_back = group_case(transfer="full", ops="load,backup,backup,load", direction=Direction.LOAD_BACK)
    # the anchor evicts its own entry to make room (the tree's evict_host before the write), then the write is refused
    assert [s.op for s in sequence.plan_steps(load_back)] == [sequence.LOAD, sequence.LOAD, sequence.BACKUP,
                                                              sequence.EVICT, sequence.REFUSED, sequence.LOAD]


# ---- the knobs ------------------------------------------------------------------------------------------------

def test_the_both_value_gives_each_side_pool_that_fits() -> None:
    assert side_pools(group_case()) == (K_ONLY, MAMBA)  # the group's name order: indexer, then mamba
    assert side_pools(group_case(page_size=2)) == (K_ONLY,)  # one Mamba slot per page
    assert side_pools(group_case(HostLayout.LAYER_FIRST)) == (K_ONLY,)
    assert side_pools(group_case(HostLayout.PAGE_HEAD)) == ()
    assert side_pools(group_case(controller="base")) == ()
    assert SIDE_POOLS[:6] == ("",) * 4 + ("k_only", "mamba")  # appended: the other values draw as before
    labels = SglangHicacheBackend().coverage_labels(group_case(transfer="full", ops=REFUSING_OPS))
    assert labels["side_pool"] == f"{K_ONLY}+{MAMBA}" and labels["side_transfer"] is True
    assert labels["side_refused_backup"] is True


def test_full_without_a_side_pool_is_not_run() -> None:
    backend = SglangHicacheBackend()
    reason = backend.case_unsupported(group_case(HostLayout.PAGE_HEAD, transfer="full"))
    assert reason is not None and "makes a side pool refuse back-ups" in reason
    assert backend.case_unsupported(group_case(transfer="full")) is None
    assert not side_refusals(group_case(transfer="on"))


# ---- driven through the fake sglang -------------------------------------------------------------------------------

@pytest.mark.parametrize(("layout", "io"), [(HostLayout.PAGE_FIRST, "kernel"),
                                            (HostLayout.PAGE_FIRST_DIRECT, "direct")])
@pytest.mark.parametrize("attention", [Attention.MHA, Attention.MLA])
def test_two_side_pools_move_with_their_own_grants(fake_sglang: None, layout: HostLayout, io: str,
                                                   attention: Attention) -> None:
    case = hicache_case(attention, layout, page_size=1, ops=OPS, side_pool=SIDE_BOTH, side_transfer="on",
                        io_backend=io, draft_layers=1, start_layer=2)
    assert side_transfer(case)
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    assert [type(side.host_pool).__name__ for side in built.sides] == [K_ONLY, MAMBA]
    assert [side.position for side in built.sides] == [0, 1]
    group = built.controller.mem_pool_host
    assert [type(e.host_pool).__name__ for e in group.entries][1:] == [K_ONLY, MAMBA]
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


@pytest.mark.parametrize(("layout", "page_size", "side_pool"), [
    (HostLayout.PAGE_FIRST, 1, SIDE_BOTH), (HostLayout.PAGE_FIRST_DIRECT, 1, SIDE_BOTH),
    (HostLayout.LAYER_FIRST, 2, "k_only"), (HostLayout.PAGE_FIRST, 2, "k_only"), (HostLayout.PAGE_FIRST, 1, "mamba")])
@pytest.mark.parametrize("ops", [REFUSING_OPS, "backup,backup,load,evict,backup,load", "load,backup,evict,backup"])
def test_a_side_pool_refusing_its_grant_leaves_nothing_moved_and_nothing_held(
        fake_sglang: None, layout: HostLayout, page_size: int, side_pool: str, ops: str) -> None:
    case = group_case(layout, page_size=page_size, side_pool=side_pool, transfer="full", ops=ops)
    assert side_refusals(case) and any(s.op == sequence.REFUSED for s in sequence.plan_steps(case))
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


def test_a_load_back_case_with_a_refusing_side_pool(fake_sglang: None) -> None:
    case = group_case(transfer="full", ops="load,backup,backup,load", direction=Direction.LOAD_BACK)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


# ---- planted bugs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("bug", "transfer", "caught"), [
    # a transfer moves only the first side pool it names: the second's bytes are not the oracle's
    ("side_first_only", "on", "step 0 (backup) [HybridCacheController.write granted host slots [1, 3]]: "
                              "MambaPoolHost side pool host bytes differ from the oracle's"),
    # every side pool granted by the first one's allocator: the second's grant is not its own allocator's
    ("side_one_allocator", "on", "step 0 (backup): the write's MambaPoolHost side pool transfer was granted host "
                                 "slots [2, 3] by resolve_host_transfers, the oracle's side allocator grants [0, 1]"),
    # the refusing pool skipped: the write is granted
    ("side_partial_grant", "full", "step 1 (refused): HybridCacheController.write granted host slots [0, 2] "
                                   "although the MambaPoolHost side pool's allocator has 0 free slots"),
    # the rollback frees nothing: the K-only pool's free list is short
    ("side_rollback_dropped", "full", "step 1 (refused) [HybridCacheController.write refused by the MambaPoolHost "
                                      "side pool]: the MHATokenToKOnlyPoolHost side pool's allocator has 1 free "
                                      "slots, the oracle's side allocator 3"),
    # the rollback leaves the transfer its given-back slots
    ("side_rollback_kept", "full", "the MHATokenToKOnlyPoolHost side pool's transfer kept host slots [2, 3] after "
                                   "the group refused the write"),
    # the controller keeps the anchor's grant of a refused write
    ("side_refusal_keeps_anchor", "full", "the anchor's allocator has 1 free slots after the refused write, the "
                                          "oracle's 3: the controller must give the anchor's grant back"),
])
def test_each_planted_bug_of_the_side_group_is_caught(fake_sglang: None, monkeypatch: pytest.MonkeyPatch, bug: str,
                                                      transfer: str, caught: str) -> None:
    case = group_case(transfer=transfer, ops="backup,backup,evict,backup,load" if transfer == "full" else OPS)
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", bug)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert caught in result.summary, result.summary


def test_a_lone_refusing_side_pool_has_nothing_to_roll_back(fake_sglang: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A K-only side pool alone refuses itself: nothing to roll back, the anchor's grant still given back."""
    case = group_case(HostLayout.PAGE_FIRST, page_size=2, side_pool="k_only", transfer="full",
                      ops="backup,backup,evict,backup,load")
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "side_rollback_dropped")
    assert run_on_cpu(case).outcome is Outcome.PASS  # no earlier grant to give back
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "side_refusal_keeps_anchor")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED and "give the anchor's grant back" in result.summary


# ---- generation -------------------------------------------------------------------------------------------------

def test_the_profile_draws_refusing_side_pools_and_groups_of_two() -> None:
    backend = load_registry().get("sglang-hicache")
    space = SIDE_GROUPS_PROFILE.applied_to(backend.case_space(CaseSpace(), SM90))
    seen: collections.Counter[tuple[str, bool]] = collections.Counter()
    for index in range(300):
        case = case_for_index(3, index, space)
        assert backend.case_unsupported(case) is None or "makes a side pool refuse" not in (
            backend.case_unsupported(case) or "")
        if backend.case_unsupported(case) is None:
            labels = backend.coverage_labels(case)
            seen[(str(labels["side_pool"]), bool(labels["side_refused_backup"]))] += 1
    assert seen[(f"{K_ONLY}+{MAMBA}", True)] and seen[(K_ONLY, True)], seen


def test_the_default_mix_draws_both_side_pools_and_their_refusals(tmp_path: Path) -> None:
    """A dry run of the backend under the GPU campaign's default mix: groups of both side pools, moving and still,
    and refused back-ups, in coverage_values as in the saved cases."""
    out, folder = tmp_path / "run.json", tmp_path / "cases"
    assert main(["fuzz", "--platform", "cuda", "--dry-run", "--backend", "sglang-hicache", "--runs", "3000",
                 "--seed", "1", "--no-progress", "--json", str(out), "--save-cases", str(folder),
                 "--where", "side_transfer=true"]) == 0
    values = json.loads(out.read_text())["coverage_values"]["sglang-hicache"]
    assert f"{K_ONLY}+{MAMBA}" in values["side_pool"] and True in values["side_refused_backup"]
    backend = SglangHicacheBackend()
    cases = [Case.from_json(path.read_text()) for path in folder.glob("*.json")]
    kinds = {(side_pools(c), side_refusals(c), backend.coverage_labels(c)["side_refused_backup"]) for c in cases}
    assert ((K_ONLY, MAMBA), True, False) in kinds and ((K_ONLY,), True, True) in kinds, kinds
    assert any(not refusing for _, refusing, _ in kinds), kinds  # side pools moving without refusals too


def test_the_standalone_script_leaves_side_groups_and_refusals_to_the_json_reproducer() -> None:
    from hicache_fuzz.harness.findings.standalone_hicache import unscripted_reason

    assert "a group of 2 side pools" in (unscripted_reason(group_case()) or "")
    assert "refuses back-ups" in (unscripted_reason(group_case(page_size=2, side_pool="k_only", transfer="full"))
                                  or "")
    assert unscripted_reason(group_case(page_size=2, side_pool="k_only")) is None  # one side pool: scripted
