"""Stateful sequences (oracles/sequence.py): the shadow model's steps, the programs the generator draws, the JSON
round trip, the per-step comparison naming the failing step, and shrinking to the shortest failing sequence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_fuzz.harness.campaign.minimize import minimize, shorter_sequences
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, make_tuning
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline import runner
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.kernels.sglang_hicache_settings import PROGRAMS
from hicache_fuzz.oracles import sequence
from hicache_fuzz.oracles.transfer import Semantics, apply_chunk_copies, chunk_copies
from tests.kernels._hicache_helpers import (
    CpuHicacheBackend,
    fake_sglang,
    fake_sglang_module,
    hicache_case,
    run_on_cpu,
)

__all__ = ["fake_sglang", "fake_sglang_module"]  # the fixtures, used by name


def test_step_zero_is_granted_the_case_host_indices_and_later_backups_the_other_slots() -> None:
    case = hicache_case(page_size=2, pages=2, host_pages=5, ops="backup,load,evict,load")
    steps = sequence.plan_steps(case)
    assert [(s.index, s.op) for s in steps] == [(0, "backup"), (1, "backup"), (2, "load"), (3, "evict"), (4, "load")]
    assert steps[0].host_indices == case.host_indices == (2, 3, 6, 7)
    assert steps[1].host_indices == (0, 1, 4, 5)  # the other slots, ascending
    assert steps[2].host_indices == steps[1].host_indices  # the newest entry
    assert steps[2].device_indices == sequence.reversed_pages(case.device_indices, 2) == (2, 3, 4, 5)
    assert steps[3].host_indices == case.host_indices  # the oldest entry
    assert steps[4].host_indices == steps[1].host_indices


def test_a_backup_without_room_evicts_the_oldest_entries_first_and_is_granted_them() -> None:
    case = hicache_case(page_size=1, pages=2, host_pages=4, ops="backup,backup")
    steps = sequence.plan_steps(case)
    assert [s.op for s in steps] == ["backup", "backup", "evict", "backup"]
    assert steps[2].host_indices == case.host_indices and steps[3].host_indices == case.host_indices


def test_a_load_back_case_keeps_its_slots_held() -> None:
    case = hicache_case(direction=Direction.LOAD_BACK, page_size=1, pages=2, host_pages=4, ops="evict,backup")
    assert sequence.prologue(case) == [(0, 2)]
    steps = sequence.plan_steps(case)
    assert [s.op for s in steps] == ["load", "evict", "backup"]
    assert steps[2].host_indices == (0, 2)  # never-granted slots come before evicted ones


@pytest.mark.parametrize("ops", ["load,evict,evict", "evict,load", "jump"])
def test_programs_that_cannot_run_are_refused_with_the_step(ops: str) -> None:
    with pytest.raises(sequence.SequenceError, match=r"step \d|unknown operation"):
        sequence.plan_steps(hicache_case(ops=ops))


@pytest.mark.parametrize("room", [0, 1, 6])
def test_every_generated_program_runs_on_any_geometry(room: int) -> None:
    for text in PROGRAMS:
        case = hicache_case(page_size=1, pages=2, host_pages=4 + room, ops=text)
        steps = sequence.plan_steps(case)
        assert len([s for s in steps if s.op != "evict"]) == 1 + sum(op != "evict" for op in sequence.program(case))


def test_a_sequence_case_survives_the_json_round_trip() -> None:
    case = hicache_case(ops="backup,load,evict,backup", io_backend="direct", start_layer=7, draft_layers=1,
                        layout=HostLayout.LAYER_FIRST)
    again = Case.from_json(case.to_json(indent=2))
    assert again == case and again.case_id == case.case_id
    assert sequence.program(again) == ("backup", "load", "evict", "backup")
    assert sequence.plan_steps(again) == sequence.plan_steps(case)


def _payloads(case: Case) -> dict[str, torch.Tensor]:
    raw = materialize(case, torch.device("cpu")).snapshot()
    return {k: v[GUARD_BYTES : v.numel() - GUARD_BYTES] for k, v in raw.items()}


def test_the_oracle_of_a_case_without_a_program_is_the_single_transfer() -> None:
    case = hicache_case()
    single, composed = _payloads(case), _payloads(case)
    apply_chunk_copies(case, chunk_copies(case, Semantics.PER_TOKEN), single, single)
    sequence.apply_sequence(case, composed, Semantics.PER_TOKEN)
    assert all(torch.equal(single[k], composed[k]) for k in single)
    with_load = case.replace(tuning=make_tuning({"ops": "load"}))
    loaded = _payloads(with_load)
    sequence.apply_sequence(with_load, loaded, Semantics.PER_TOKEN)
    assert torch.equal(loaded["kv/host"], single["kv/host"])
    assert not torch.equal(loaded["kv/device"], single["kv/device"])  # the load moved pages to other rows


def test_the_runner_names_the_first_step_whose_storages_differ() -> None:
    case = hicache_case(page_size=1, pages=1, host_pages=2, device_pages=2, layers=1, ops="load")
    before = materialize(case, torch.device("cpu")).snapshot()
    steps = [(s, {k: v.clone() for k, v in before.items()}) for s in sequence.transfer_steps(case)]
    recorded = [("first", {k: v.clone() for k, v in before.items()}),
                ("second", {k: v.clone() for k, v in before.items()})]
    assert runner._first_step_mismatch(case, steps, recorded, Semantics.PER_TOKEN) is None
    recorded[1][1]["kv/device"][GUARD_BYTES + 3] ^= 1
    outcome, summary, diff = runner._first_step_mismatch(case, steps, recorded, Semantics.PER_TOKEN) or (None, "", {})
    assert outcome is Outcome.MISMATCH and summary.startswith("step 1 (load) [second]")
    assert diff["failing_step"] == "step 1 (load)"
    short = runner._first_step_mismatch(case, steps, recorded[:1], Semantics.PER_TOKEN)
    assert short is not None and "recorded 1 step images" in short[1]


def test_an_allocator_granting_a_freed_slot_twice_is_caught_at_its_step(fake_sglang, monkeypatch) -> None:
    case = hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, ops="load,backup,load,evict")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "alloc_twice")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 2 (backup)")


def test_a_failing_sequence_shrinks_to_its_shortest_form(fake_sglang, monkeypatch) -> None:
    """Shortest with the same bug identity: here the load before the back-up stays, because without it the
    doubly granted slots get the bytes they already held and the damage is another (missing, not misplaced)."""
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "alloc_twice")
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="load,evict,backup,load,backup,load")
    first = run_on_cpu(case)
    assert first.outcome is Outcome.MISMATCH
    done = minimize(case, run_on_cpu, first, max_runs=120)
    assert sequence.program(done.case) == ("load", "backup")
    assert done.signature == signature(first, case) == signature(run_on_cpu(done.case), done.case)
    for shorter in shorter_sequences(done.case):  # no operation can be left out
        assert shorter is not None
        result = run_on_cpu(shorter)
        assert result.outcome is not Outcome.MISMATCH or signature(result, shorter) != done.signature


def test_the_shrinking_pass_leaves_out_operations() -> None:
    case = hicache_case(ops="backup,load,evict")
    programs = [sequence.program(c) for c in shorter_sequences(case) if c is not None]
    assert programs[0] == () and ("backup", "load") in programs and ("load", "evict") in programs
    assert all(len(p) < 3 for p in programs)
    assert list(shorter_sequences(case.replace(tuning=make_tuning({})))) == []


programs = st.lists(st.sampled_from(sequence.OPS), max_size=6).map(lambda ops: ",".join(ops))


@given(ops=programs, ps=st.integers(1, 5), pages=st.integers(1, 3), room=st.integers(0, 4),
       load_back=st.booleans())
def test_every_plan_keeps_the_allocator_invariants(ops: str, ps: int, pages: int, room: int, load_back: bool) -> None:
    """Slots are free or held, never both; a grant takes free slots only; loads and evictions touch held slots."""
    direction = Direction.LOAD_BACK if load_back else Direction.WRITE_BACK
    case = hicache_case(page_size=ps, pages=pages, host_pages=2 * pages + room, direction=direction, ops=ops)
    try:
        steps = sequence.plan_steps(case)
    except sequence.SequenceError as exc:
        assert "no backed-up entry is held" in str(exc)
        return
    free = {x for chunk in sequence.prologue(case) for x in chunk}
    held = set(range(case.host_slots)) - free
    for step in steps:
        slots = set(step.host_indices)
        assert len(slots) == len(step.host_indices) == case.n
        if step.op == "backup":
            assert slots <= free
            free -= slots
            held |= slots
        elif step.op == "evict":
            assert slots <= held
            held -= slots
            free |= slots
        else:
            assert slots <= held
        assert not held & free and held | free == set(range(case.host_slots))


@settings(max_examples=15)
@given(ops=programs, ps=st.sampled_from([1, 3, 32]), attention=st.sampled_from([Attention.MHA, Attention.MLA]))
def test_random_sequences_pass_on_the_correct_fake(fake_sglang_module: None, ops: str, ps: int,
                                                   attention: Attention) -> None:
    case = hicache_case(attention, HostLayout.PAGE_FIRST, page_size=ps, ops=ops, draft_layers=1)
    if sequence.program(case) and CpuHicacheBackend().case_unsupported(case):
        return  # a load or an evict with nothing held
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
