"""Request slots (the ``requests`` knob): the HiSparse pool's host slots held in its coordinator's request table,
granted by the pool's own ``alloc_paged_token_slots`` and freed through ``allocated_host_indices``. The oracle's
plan, the drive on the fake sglang, the four planted bugs of those two functions, and the generated variety."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_fuzz.harness.campaign.minimize import minimize, shorter_sequences
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, make_tuning
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import request_schedule_menu, request_slot_kinds
from hicache_fuzz.oracles import sequence
from tests.kernels._hicache_helpers import fake_sglang, fake_sglang_module, hicache_case, run_on_cpu

__all__ = ["fake_sglang", "fake_sglang_module"]  # the fixtures, used by name


def hisparse_case(*, page_size: int = 4, pages: int = 2, host_pages: int = 6, ops: str = "",
                  requests: str | None = "", direction: Direction = Direction.WRITE_BACK, **knobs: int | str) -> Case:
    """A HiSparse MHA layer_first case (its host pages 1, 3, ...: slot 0 is the first of the others); `requests`
    None leaves the knob out."""
    if requests is not None:
        knobs["requests"] = requests
    return hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=page_size, pages=pages,
                        host_pages=host_pages, device_pages=pages + 2, layers=2, direction=direction, ops=ops,
                        pool_kind="hisparse", **knobs)


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize(("page_size", "room"), [(1, 0), (3, 1), (2, 4)])
def test_without_entries_every_backup_is_a_request_of_its_own_and_the_transfers_are_unchanged(
        direction: Direction, page_size: int, room: int) -> None:
    """An empty ``requests`` plans the very transfers and evictions of the case without the knob: existing cases
    keep their steps, and the coordinator's calls move the same bytes."""
    for text in sequence.valid_programs(5):
        plain = hisparse_case(page_size=page_size, host_pages=4 + room, ops=text, requests=None, direction=direction)
        with_table = plain.replace(tuning=make_tuning({**dict(plain.tuning), "requests": ""}))
        assert not sequence.request_slots(plain) and sequence.request_slots(with_table)
        before = [(s.op, s.host_indices, s.device_indices) for s in sequence.plan_steps(plain)]
        after = [(sequence.EVICT if s.op == sequence.RELEASE else s.op, s.host_indices, s.device_indices)
                 for s in sequence.plan_steps(with_table) if s.op != sequence.RESERVE]
        assert after == before, text


def test_a_request_grows_by_whole_pages_and_is_granted_token_slots() -> None:
    case = hisparse_case(page_size=4, host_pages=6, ops="backup,backup,load,evict,backup,load",
                         requests="0:end:p+1,0:end-1:1,new:alloc:p-1")
    assert sequence.prologue(case)[0] == case.host_indices == (4, 5, 6, 7, 12, 13, 14, 15)
    steps = sequence.plan_steps(case)
    view = [(s.label(), s.host_indices, s.new_pages, tuple(len(row) for row in s.table[:2]), s.free) for s in steps]
    assert view == [
        ("step 0 (backup of request 0, tokens [0, 8))", (4, 5, 6, 7, 12, 13, 14, 15), 2, (8, 0), 16),
        # 5 tokens from token 8: pages up to token 16, the two it lacks from the free list (slot 0 first)
        ("step 1 (backup of request 0, tokens [8, 13))", (0, 1, 2, 3, 8), 2, (16, 0), 8),
        # one token before its end, inside its pages: nothing taken
        ("step 2 (backup of request 0, tokens [12, 13))", (8,), 0, (16, 0), 8),
        ("step 3 (load of request 0, tokens [5, 13))", (13, 14, 15, 0, 1, 2, 3, 8), 0, (16, 0), 8),
        ("step 4 (release of request 0)", (4, 5, 6, 7, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11), 0, (0, 0), 24),
        # row 0 is free again: the new request takes it
        ("step 5 (backup of request 0, tokens [0, 3))", (16, 17, 18), 1, (4, 0), 20),
        ("step 6 (load of request 0, tokens [0, 3))", (16, 17, 18), 0, (4, 0), 20),
    ]
    assert steps[1].device_indices == tuple(case.device_indices[t % 8] for t in range(8, 13))  # token t: row t mod n
    assert steps[2].table[0] == (4, 5, 6, 7, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11)
    assert [s.transfers for s in steps] == [True, True, True, True, False, True, True]


def test_a_load_back_case_reserves_its_slots_then_loads_them_and_an_empty_backup_moves_nothing() -> None:
    case = hisparse_case(page_size=3, host_pages=6, direction=Direction.LOAD_BACK, ops="backup,backup,load",
                         requests="1:0:0,0:end:1")
    assert sequence.prologue(case)[0] == case.host_indices  # granted to request 0 at step 0
    steps = sequence.plan_steps(case)
    assert [(s.op, s.request) for s in steps] == [("reserve", 0), ("load", 0), ("backup", 1), ("backup", 0),
                                                   ("load", 0)]
    assert steps[0].host_indices == steps[1].host_indices == case.host_indices and not steps[0].transfers
    assert steps[1].device_indices == case.device_indices
    assert steps[2].host_indices == () and not steps[2].transfers and steps[2].table[1] == ()
    assert steps[3].host_indices == (0,) and steps[3].new_pages == 1  # the 7th token opens a page


def test_a_backup_without_room_releases_the_oldest_other_requests_then_keeps_to_its_pages() -> None:
    case = hisparse_case(page_size=2, pages=2, host_pages=4, ops="backup,backup,backup",
                         requests="new:0:n,1:end:n,1:end-1:n")
    steps = sequence.plan_steps(case)
    assert [(s.op, s.request) for s in steps] == [("backup", 0), ("backup", 1), ("release", 0), ("backup", 1),
                                                   ("backup", 1)]
    assert steps[3].start == 4 and steps[3].host_indices == case.host_indices  # request 0's slots, released
    # request 1 holds all 8 slots: from token 7, only the one token its pages still take
    assert (steps[4].start, steps[4].host_indices, steps[4].new_pages, steps[4].free) == (7, (7,), 0, 0)


@pytest.mark.parametrize(("requests", "match"), [("0:end", "is not <request>:<start>:<count>"),
                                                  ("9:end:1", "row 0..6"), ("0:n:1", "start 'n'"),
                                                  ("0:end:alloc", "count 'alloc'"), ("0:end:p*2", "count 'p\\*2'")])
def test_malformed_entries_are_refused_with_their_field(requests: str, match: str) -> None:
    with pytest.raises(sequence.SequenceError, match=match):
        sequence.plan_steps(hisparse_case(ops="backup", requests=requests))


def test_the_requests_knob_belongs_to_the_hisparse_pool() -> None:
    backend = SglangHicacheBackend()
    assert backend.case_unsupported(hisparse_case(ops="backup", requests="0:end:1")) is None
    other = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST, ops="backup", requests="")
    assert "HiSparse coordinator's request table" in (backend.case_unsupported(other) or "")
    assert "tuning.requests" in (backend.case_unsupported(hisparse_case(ops="backup", requests="x")) or "")


def test_a_request_slot_case_survives_the_json_round_trip() -> None:
    case = hisparse_case(ops="backup,evict,backup", requests="0:end-1:p+1,new:0:0")
    again = Case.from_json(case.to_json(indent=2))
    assert again == case and sequence.plan_steps(again) == sequence.plan_steps(case)


REQUEST_CASES = {
    "extend-release-reuse": hisparse_case(page_size=4, host_pages=6, ops="backup,backup,load,evict,backup,load",
                                          requests="0:end:p+1,0:end-1:1,new:alloc:p-1", start_layer=2),
    "load-back-two-requests": hisparse_case(page_size=3, host_pages=6, direction=Direction.LOAD_BACK,
                                            ops="backup,load,backup,backup,evict,load",
                                            requests="0:end:1,1:0:0,1:0:n"),
    "page-size-one": hisparse_case(page_size=1, pages=3, host_pages=7, ops="backup,backup,evict,load",
                                   requests="0:end:2,new:0:n-1"),
    "no-room": hisparse_case(page_size=2, pages=2, host_pages=4, ops="backup,backup,backup,load",
                             requests="new:0:n,1:end:n,1:end-1:n"),
}


@pytest.mark.parametrize("name", sorted(REQUEST_CASES))
def test_request_slot_sequences_move_bytes_exactly_on_the_fake(fake_sglang, name: str) -> None:
    result = run_on_cpu(REQUEST_CASES[name])
    assert result.outcome is Outcome.PASS, result.summary


# Each planted bug mirrors one of sglang's mutants in pool_host/hisparse.py (reports/mutate, gap 1), with the case
# that reaches it and the words of its failure.
PLANTED = {
    # the new allocated length written to row r - 1 (row 0: the last row)
    "hisparse_len_row": ("extend-release-reuse", "step 0 (backup of request 0, tokens [0, 8))",
                         "req_to_host_pool_allocated_len is [0, 0, 0, 0, 0, 0, 8], the oracle's [8, 0, 0, 0, 0, 0, 0]"),
    # page_size^2 too many slots asked for (equivalent at page size 1)
    "hisparse_pages_squared": ("extend-release-reuse", "RuntimeError", "alloc failed"),
    # an empty grant of the wrong dtype (the load-back case's second back-up asks for no tokens)
    "hisparse_empty_int32": ("load-back-two-requests", "step 3 (backup of request 1, tokens [0, 0))",
                             "returned torch.int32"),
    # host slot 0 never freed (the released request holds it)
    "hisparse_slot0": ("extend-release-reuse", "step 4 (release of request 0)",
                       "the first difference at position 8: 1, the oracle's 0"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_planted_request_slot_bug_is_caught(fake_sglang, monkeypatch, bug: str) -> None:
    name, where, words = PLANTED[bug]
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", bug)
    result = run_on_cpu(REQUEST_CASES[name])
    assert result.outcome is not Outcome.PASS
    assert where in result.summary and words in result.summary, result.summary
    without_table = REQUEST_CASES[name].replace(
        tuning=tuple((k, v) for k, v in REQUEST_CASES[name].tuning if k != "requests"))
    assert run_on_cpu(without_table).outcome is Outcome.PASS  # the controller's write never calls them


def test_the_pages_squared_bug_needs_pages_of_more_than_one_slot(fake_sglang, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "hisparse_pages_squared")
    result = run_on_cpu(REQUEST_CASES["page-size-one"])
    assert result.outcome is Outcome.PASS, result.summary


_ENTRY = st.tuples(st.sampled_from(["new", "0", "1", "2"]),
                   st.sampled_from(["end", "end-1", "end+1", "end+5", "alloc", "alloc-1", "0", "3"]),
                   st.sampled_from(["0", "1", "2", "p-1", "p", "p+1", "n", "n-1", "n+3", "7"])).map(":".join)


@settings(max_examples=60, deadline=None)
@given(page_size=st.integers(1, 5), pages=st.integers(1, 3), room=st.integers(0, 4),
       direction=st.sampled_from(list(Direction)), ops=st.sampled_from(sequence.valid_programs(4)),
       entries=st.lists(_ENTRY, max_size=5))
def test_any_schedule_passes_on_the_correct_fake(fake_sglang_module, page_size: int, pages: int, room: int,
                                                 direction: Direction, ops: str, entries: list[str]) -> None:
    case = hisparse_case(page_size=page_size, pages=pages, host_pages=2 * pages + room, direction=direction, ops=ops,
                         requests=",".join(entries))
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, (case.tuning, result.summary)


def test_generated_hisparse_cases_hold_their_slots_in_the_request_table() -> None:
    """The HiSparse profile's cases carry a ``requests`` value: across a few thousand indices their grants take
    first and further pages, stay within a request's pages, start inside pages and ask for no tokens, at page sizes
    above 1, and requests are released and reserved."""
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), Platform("cuda", (9, 0)))
    kinds: set[str] = set()
    operations: set[str] = set()
    large_pages = 0
    for index in range(3000):
        case = case_for_index(3, index, space)
        if not sequence.request_slots(case) or backend.case_unsupported(case):
            continue
        labels = backend.coverage_labels(case)
        assert labels["pool_class"] == "HiSparseMHATokenToKVPoolHost"
        kinds.update(request_slot_kinds(case))
        operations.update(str(labels["operation"]).split("+"))
        large_pages += case.page_size > 1 and "more_pages" in str(labels["request_slots"])
    assert kinds == {"empty", "first_pages", "more_pages", "in_pages", "unaligned_start"}
    assert operations == {"backup", "load", "release", "reserve"}
    assert large_pages >= 5
    assert len(set(request_schedule_menu(3))) > 200


def test_request_slot_cases_reuse_the_objects_of_their_geometry(fake_sglang) -> None:
    """The request table is made per run: two schedules on one geometry share sglang's objects and both pass."""
    from hicache_fuzz.harness.pipeline.runner import run_case
    from tests.kernels._hicache_helpers import CPU, CpuHicacheBackend

    backend = CpuHicacheBackend()
    first = REQUEST_CASES["extend-release-reuse"]
    assert run_case(first, backend, CPU, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept is not None
    built = backend._kept[1]
    second = first.replace(tuning=make_tuning({**dict(first.tuning), "requests": "new:end:1,0:alloc:p"}))
    assert run_case(second, backend, CPU, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept[1] is built


def test_leaving_a_backup_out_takes_its_entry_with_it() -> None:
    case = hisparse_case(ops="backup,load,backup,evict", requests="0:end:1,new:0:p")
    candidates = {(c.tuning_value("ops"), c.tuning_value("requests")) for c in shorter_sequences(case) if c}
    assert {("", ""), ("load,backup,evict", "new:0:p"), ("backup,load,evict", "0:end:1"),
            ("backup,load,backup", "0:end:1,new:0:p")} <= candidates


def test_a_failing_request_slot_sequence_shrinks_to_what_the_bug_needs(fake_sglang, monkeypatch) -> None:
    """Slot 0 never freed needs a request holding it and its release: the case's own back-up, once the shrunk
    case's host indices hold slot 0, and one evict."""
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "hisparse_slot0")
    case = REQUEST_CASES["extend-release-reuse"]
    first = run_on_cpu(case)
    done = minimize(case, run_on_cpu, first, max_runs=120)
    assert sequence.program(done.case) == ("evict",) and 0 in done.case.host_indices
    assert done.signature == signature(first, case)
    assert "release of request 0" in run_on_cpu(done.case).summary
