"""The bounds-check rule (contract.BOUNDS_CHECKS), for every entry point that checks a side: an index exactly at that
side's bound must be rejected, on an unchecked side it is undefined; the generator puts such indices where every
entry point reads them, and the runner checks the rejection like any other."""

from __future__ import annotations

import random

import pytest
import torch

from hicache_fuzz.harness.engine.campaign_case import backend_space
from hicache_fuzz.harness.generation.generate import RandomChooser, _inject_violation, case_for_index, draw_case
from hicache_fuzz.harness.model.case import INDEX_LIMIT, Case, Direction, IndexDtype
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import (
    BOUNDS_CHECKS,
    INT32_MAX,
    EntryPoint,
    Platform,
    Side,
    Verdict,
    boundary_indices,
    bounds_checked,
    predict,
    primary_rule,
    rules_of,
)

CPU = Platform("cpu")
H200 = Platform("cuda", (9, 0))
CHECKED = [(entry, direction, side) for entry, check in BOUNDS_CHECKS.items() for direction in Direction
           for side in sorted(check.sides(direction))]


def test_every_entry_point_says_which_sides_it_checks() -> None:
    assert set(BOUNDS_CHECKS) == set(EntryPoint)
    assert bounds_checked(EntryPoint.REFERENCE, Direction.LOAD_BACK) == frozenset(Side)
    assert bounds_checked(EntryPoint.JIT_PAGE_UNIFIED, Direction.WRITE_BACK) == {Side.HOST}
    assert bounds_checked(EntryPoint.JIT_PAGE_UNIFIED, Direction.LOAD_BACK) == frozenset()
    assert bounds_checked(EntryPoint.JIT_STAGED, Direction.WRITE_BACK) == frozenset()


def test_boundary_indices_are_the_edges_the_dtype_holds() -> None:
    assert boundary_indices(96, IndexDtype.INT32) == (96, 97, -1, INT32_MAX)
    assert boundary_indices(96, IndexDtype.INT64) == (96, 97, -1, INT32_MAX, INDEX_LIMIT - 1)


def _accepted_case(entry: EntryPoint, direction: Direction) -> tuple[Case, Platform]:
    """A generated case some registered backend sends to `entry` moving in `direction`, accepted as it is."""
    registry = load_registry()
    for name in registry.names():
        backend = registry.get(name)
        if backend.models_bug:
            continue
        for platform in (CPU, H200):
            space = backend_space(backend, CaseSpace(), platform, seed=0).narrowed(invalid_rate=0.0, empty_rate=0.0,
                                                                                  directions=(direction,))
            for number in range(300):
                case = draw_case(RandomChooser(random.Random(f"bounds:{name}:{number}")), space)
                if backend.unsupported_reason(case, platform) is not None or not case.host_indices:
                    continue
                if (backend.plan(case, platform).entry is entry
                        and predict(case, entry, platform).verdict is Verdict.ACCEPT):
                    return case, platform
    raise AssertionError(f"no registered backend sends an accepted {direction.value} case to {entry.value}")


def _with_index(case: Case, side: Side, value: int) -> Case:
    values = list(case.host_indices if side is Side.HOST else case.device_indices)
    values[0] = value
    return case.replace(**{f"{side.value}_indices": tuple(values)})


@pytest.mark.parametrize(("entry", "direction", "side"), CHECKED,
                         ids=[f"{e.value}-{d.value}-{s.value}" for e, d, s in CHECKED])
def test_an_index_at_a_checked_bound_is_rejected_and_at_an_unchecked_one_undefined(
        entry: EntryPoint, direction: Direction, side: Side) -> None:
    case, platform = _accepted_case(entry, direction)
    checked = bounds_checked(entry, direction)
    for each in Side:
        spec = case.host_index if each is Side.HOST else case.device_index
        size = case.host_slots if each is Side.HOST else case.device_rows
        for value in boundary_indices(size, spec.dtype):
            prediction = predict(_with_index(case, each, value), entry, platform)
            if each in checked:
                assert prediction.verdict is Verdict.REJECT, (each, value, prediction)
                assert primary_rule(prediction.reasons) == "index-out-of-range"
            else:
                assert prediction.verdict is Verdict.UNDEFINED, (each, value, prediction)
        # the first row of the last page is in range: the check is exactly at the bound
        inside = predict(_with_index(case, each, size - case.page_size), entry, platform)
        assert "index-out-of-range" not in rules_of(inside.reasons)


def test_the_generator_puts_boundary_indices_where_every_entry_point_reads_them() -> None:
    space = CaseSpace(invalid_rate=0.0, empty_rate=0.0, byte_budget=64 << 10)
    seen: set[int] = set()
    for number in range(400):
        rng = random.Random(f"bound-injection:{number}")
        case = draw_case(RandomChooser(rng), space)
        hurt = _inject_violation(RandomChooser(rng), case)
        for side, before, after, size, spec in (
                ("host", case.host_indices, hurt.host_indices, case.host_slots, case.host_index),
                ("device", case.device_indices, hurt.device_indices, case.device_rows, case.device_index)):
            changed = [i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
            if len(before) == len(after) and len(changed) == 1 and after[changed[0]] in boundary_indices(
                    size, spec.dtype) and after[changed[0]] not in (size, size + 1, size + case.page_size, -1):
                assert changed[0] % case.page_size == 0 or len(before) < case.page_size, side
                seen.add(after[changed[0]])
    assert seen == {INT32_MAX, INDEX_LIMIT - 1}


def test_page_unified_write_back_campaign_cases_reach_the_host_bound() -> None:
    """The checked side gets boundary indices in a campaign, and they are predicted rejections."""
    backend = load_registry().get("sglang-page-unified")
    space = backend_space(backend, CaseSpace(), H200, seed=1).narrowed(directions=(Direction.WRITE_BACK,),
                                                                        invalid_rate=1.0)
    rejected = 0
    for index in range(400):
        case = case_for_index(1, index, space)
        if backend.unsupported_reason(case, H200) is not None:
            continue
        pages = case.host_indices[::case.page_size]
        if not any(p >= case.host_slots or p < 0 for p in pages):
            continue
        prediction = predict(case, backend.plan(case, H200).entry, H200)
        assert prediction.verdict is Verdict.REJECT
        rejected += 1
    assert rejected >= 10


def test_the_reference_rejects_every_boundary_index_as_predicted() -> None:
    """The runner checks such a rejection like any other: refused, storages unchanged."""
    case, _ = _accepted_case(EntryPoint.REFERENCE, Direction.LOAD_BACK)
    for side in Side:
        spec = case.host_index if side is Side.HOST else case.device_index
        size = case.host_slots if side is Side.HOST else case.device_rows
        for value in boundary_indices(size, spec.dtype):
            result = run_case(_with_index(case, side, value), ReferenceBackend(), CPU, torch.device("cpu"))
            assert result.outcome is Outcome.REJECTED_AS_PREDICTED, (side, value, result.summary)
