"""compare: byte equality of whole raw storages (guards included) and the locator that says where they differ."""

from __future__ import annotations

import torch

from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.pipeline.compare import bytes_equal, compare_storages, storages_equal
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.oracles import layouts


def small_case() -> Case:
    pool = PoolSpec(heads=2, head_dim=16)
    return Case(direction=Direction.LOAD_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST, pools=(pool,),
                layers=2, page_size=4, device_rows=16, host_slots=12, host_indices=(4, 5, 6, 7),
                device_indices=(8, 9, 10, 11), seed=3)


def snapshot(case: Case) -> dict[str, torch.Tensor]:
    buffers = materialize(case, torch.device("cpu"))
    try:
        return buffers.snapshot()
    finally:
        buffers.memory.release()


def test_bytes_equal_compares_every_byte_words_and_tail() -> None:
    a = torch.arange(29, dtype=torch.uint8)  # 3 whole 8-byte words and a 5-byte tail
    assert bytes_equal(a, a.clone())
    for position in (0, 7, 8, 23, 24, 28):  # inside words and inside the tail
        b = a.clone()
        b[position] ^= 1
        assert not bytes_equal(a, b), position
    assert not bytes_equal(a, a[:-1])


def test_bytes_equal_is_bitwise_not_numeric() -> None:
    plus, minus = torch.tensor([0.0]).view(torch.uint8), torch.tensor([-0.0]).view(torch.uint8)
    assert not bytes_equal(plus, minus)  # equal as floats, different bytes
    nan = torch.tensor([float("nan")]).view(torch.uint8)
    assert bytes_equal(nan, nan.clone())  # NaN != NaN as floats, equal bytes


def test_equal_storages_give_an_empty_report() -> None:
    case = small_case()
    before = snapshot(case)
    after = {key: raw.clone() for key, raw in before.items()}
    assert storages_equal(before, after)
    assert compare_storages(case, before, after, {}).equal


def test_a_changed_payload_byte_is_located_by_component_layer_token_and_byte() -> None:
    case = small_case()
    pool = case.pools[0]
    expected = snapshot(case)
    actual = {key: raw.clone() for key, raw in expected.items()}
    offsets = layouts.host_row_bytes(case, pool, "v", 1, torch.tensor([6]))  # V of layer 1, host token 6
    flipped = GUARD_BYTES + int(offsets[0, 5])
    actual["kv/host"][flipped] ^= 0xFF
    addressed = {"kv/host": offsets.flatten()}
    report = compare_storages(case, expected, actual, addressed)
    assert not storages_equal(expected, actual)
    [diff] = report.storages
    assert (diff.storage, diff.differing_bytes, diff.first_offset, diff.region) == ("kv/host", 1, flipped, "payload")
    assert (diff.expected_byte ^ diff.actual_byte) == 0xFF
    assert diff.location == {"component": "v", "layer": 1, "page": 1, "token": 6, "byte": 5}
    assert diff.rows_per_layer == {"v/1": 1}
    assert not diff.outside_addressed and not report.outside_addressed


def test_a_change_outside_the_addressed_rows_or_in_a_guard_is_flagged() -> None:
    case = small_case()
    expected = snapshot(case)
    outside = {key: raw.clone() for key, raw in expected.items()}
    outside["kv/device"][GUARD_BYTES] ^= 1  # row 0, which the case never addresses
    [diff] = compare_storages(case, expected, outside, {"kv/device": torch.arange(0)}).storages
    assert diff.region == "payload" and diff.outside_addressed
    guard = {key: raw.clone() for key, raw in expected.items()}
    guard["kv/device"][-1] ^= 1
    [diff] = compare_storages(case, expected, guard, {}).storages
    assert diff.region == "guard_after" and diff.outside_addressed
