"""The case model: JSON round trip, stable ids, validation errors that name the field."""

from __future__ import annotations

import json

import pytest

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    CaseError,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.model.space import CaseSpace


def small_case(**changes: object) -> Case:
    base = Case(
        direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
        pools=(PoolSpec(heads=2, head_dim=8),), layers=2, page_size=4, device_rows=16, host_slots=16,
        host_indices=(4, 5, 6, 7), device_indices=(8, 9, 10, 11),
    )
    return base.replace(**changes)


def test_round_trip_preserves_everything_and_id() -> None:
    for index in range(50):
        case = case_for_index(3, index, CaseSpace())
        again = Case.from_json(case.to_json())
        assert again == case
        assert again.case_id == case.case_id


def test_id_ignores_note_but_not_data() -> None:
    case = small_case()
    assert case.replace(note="hello").case_id == case.case_id
    assert case.replace(seed=1).case_id != case.case_id
    assert case.replace(host_index=IndexSpec(IndexDtype.INT32, IndexDevice.CPU)).case_id != case.case_id


def test_case_for_index_is_deterministic_and_index_independent() -> None:
    space = CaseSpace()
    assert case_for_index(9, 17, space) == case_for_index(9, 17, space)
    assert case_for_index(9, 17, space) != case_for_index(9, 18, space)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(layers=0), "case.layers"),
        (lambda d: d.update(host_slots=10), "case.host_slots"),
        (lambda d: d.update(layer=5), "case.layer"),
        (lambda d: d.update(direction="sideways"), "case.direction"),
        (lambda d: d["pools"][0].update(heads=-1), "case.pools[0].heads"),
        (lambda d: d["pools"][0].update(attention="mla"), "case.pools[0].heads"),
        (lambda d: d["pools"][0].update(dtype="int4"), "case.pools[0].dtype"),
        (lambda d: d.update(host_indices=[1, "x"]), "case.host_indices[1]"),
        (lambda d: d.update(host_indices="1,2"), "case.host_indices"),
        (lambda d: d.update(schema=99), "case.schema"),
        (lambda d: d.update(surprise=1), "unknown field"),
        (lambda d: d.pop("layout"), "case.layout: missing"),
        (lambda d: d.update(tuning={"unroll": [1]}), "case.tuning.unroll"),
        (lambda d: d["host_index"].update(device="gpu"), "case.host_index.device"),
    ],
)
def test_malformed_case_names_the_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(small_case().to_json())
    mutate(data)
    with pytest.raises(CaseError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Case.from_dict(data)


def test_impossible_layout_for_attention_is_rejected() -> None:
    with pytest.raises(CaseError, match="page_head does not exist for mla"):
        small_case(layout=HostLayout.PAGE_HEAD, pools=(PoolSpec(attention=Attention.MLA, heads=1, head_dim=64),))


def test_an_asymmetric_pool_needs_v_rows_unlike_k() -> None:
    """sglang builds AsymmetricMHATokenToKVPoolHost only where head_dim != v_head_dim: equal dims are an mha pool
    (and the minimizer, shrinking both, must not make one)."""
    with pytest.raises(CaseError, match="equals head_dim=8: that is an mha pool"):
        small_case(layout=HostLayout.PAGE_FIRST,
                   pools=(PoolSpec(attention=Attention.MHA_ASYM, heads=1, head_dim=8, v_head_dim=8),))
    small_case(layout=HostLayout.PAGE_FIRST,
               pools=(PoolSpec(attention=Attention.MHA_ASYM, heads=1, head_dim=8, v_head_dim=16),))


def test_case_too_large_is_rejected() -> None:
    with pytest.raises(CaseError, match="over the"):
        small_case(host_slots=1 << 24, page_size=1, pools=(PoolSpec(heads=8, head_dim=128, dtype=KVDtype.FP32),))


def test_not_json_is_a_clear_error() -> None:
    with pytest.raises(CaseError, match="not valid JSON"):
        Case.from_json("{nope")
    with pytest.raises(CaseError, match="expected a JSON object"):
        Case.from_json("[1, 2]")


def test_tuning_sorted_and_queryable() -> None:
    case = small_case(tuning=make_tuning({"unroll": 2, "block_quota": 4}))
    assert case.tuning_value("unroll") == 2
    assert case.tuning_value("missing", 7) == 7
    with pytest.raises(CaseError, match=r"case\.tuning"):
        small_case(tuning=(("b", 1), ("a", 2)))
