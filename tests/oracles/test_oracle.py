"""Properties of the oracle: layout maps are bijections, round trips restore bytes, page-granular equals
per-token on aligned contiguous runs, and the oracle agrees with an independent loop implementation."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import (
    LAYOUTS_BY_ATTENTION,
    Attention,
    Case,
    Direction,
    HostLayout,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.contract import EntryPoint, Platform, Verdict, predict, semantics_of
from hicache_fuzz.oracles.transfer import Semantics, expected_storages, storage_key
from tests.naive_oracle import naive_expected


def pool_for(attention: Attention, layout: HostLayout) -> PoolSpec:
    if attention is Attention.MLA:
        return PoolSpec(attention=attention, dtype=KVDtype.BF16, heads=1, head_dim=12)
    if attention is Attention.MHA_ASYM:
        return PoolSpec(attention=attention, dtype=KVDtype.FP8, heads=2, head_dim=8, v_head_dim=12)
    groups = 2 if layout is HostLayout.PAGE_UNIFIED else 1
    return PoolSpec(attention=attention, dtype=KVDtype.FP16, heads=4, head_dim=3, head_groups=groups)


LAYOUT_CASES = [
    (attention, layout)
    for attention in Attention
    for layout in HostLayout
    if layout in LAYOUTS_BY_ATTENTION[attention]
]


def geometry_case(attention: Attention, layout: HostLayout, direction: Direction = Direction.WRITE_BACK,
                  host: tuple[int, ...] = (), device: tuple[int, ...] = (), scope: Scope = Scope.ALL_LAYERS,
                  layer: int = 0) -> Case:
    return Case(direction=direction, scope=scope, layout=layout, pools=(pool_for(attention, layout),), layers=3,
                page_size=4, device_rows=20, host_slots=16, host_indices=host, device_indices=device, layer=layer)


@pytest.mark.parametrize(("attention", "layout"), LAYOUT_CASES)
def test_host_map_is_a_bijection_onto_the_storage(attention: Attention, layout: HostLayout) -> None:
    case = geometry_case(attention, layout)
    pool = case.pools[0]
    tokens = torch.arange(case.host_slots)
    offsets = torch.cat([
        layouts.host_row_bytes(case, pool, c, layer, tokens).reshape(-1)
        for c in pool.components for layer in range(case.layers)
    ])
    assert offsets.numel() == layouts.host_bytes(case, pool)
    assert torch.equal(offsets.sort().values, torch.arange(layouts.host_bytes(case, pool)))


@pytest.mark.parametrize(("attention", "layout"), LAYOUT_CASES)
def test_device_map_is_a_bijection_onto_the_storage(attention: Attention, layout: HostLayout) -> None:
    case = geometry_case(attention, layout)
    pool = case.pools[0]
    rows = torch.arange(case.device_rows)
    offsets = torch.cat([
        layouts.device_row_bytes(case, pool, c, layer, rows).reshape(-1)
        for c in pool.components for layer in range(case.layers)
    ])
    assert torch.equal(offsets.sort().values, torch.arange(layouts.device_bytes(case, pool)))


def random_payloads(case: Case, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for pool in case.pools:
        for side, size in (("device", layouts.device_bytes(case, pool)), ("host", layouts.host_bytes(case, pool))):
            out[storage_key(pool.name, side)] = torch.from_numpy(rng.integers(0, 256, size, dtype=np.uint8))
    return out


@pytest.mark.parametrize(("attention", "layout"), LAYOUT_CASES)
def test_write_back_then_load_back_into_other_rows_restores_bytes(attention: Attention, layout: HostLayout) -> None:
    host_tokens = (12, 13, 14, 15, 0, 1, 2, 3)
    write = geometry_case(attention, layout, Direction.WRITE_BACK, host_tokens, (4, 5, 6, 7, 8, 9, 10, 11))
    semantics = semantics_of(EntryPoint.REFERENCE, write)
    before = random_payloads(write, np.random.default_rng(1))
    after_write = expected_storages(write, before, semantics)
    load = write.replace(direction=Direction.LOAD_BACK, device_indices=(12, 13, 14, 15, 16, 17, 18, 19))
    after_load = expected_storages(load, after_write, semantics_of(EntryPoint.REFERENCE, load))
    pool = write.pools[0]
    for component, layer in itertools.product(pool.components, range(write.layers)):
        original = layouts.device_row_bytes(write, pool, component, layer, torch.arange(4, 12))
        restored = layouts.device_row_bytes(write, pool, component, layer, torch.arange(12, 20))
        device = after_load[storage_key(pool.name, "device")]
        assert torch.equal(device[restored], before[storage_key(pool.name, "device")][original])


@pytest.mark.parametrize(("attention", "layout"), LAYOUT_CASES)
def test_page_granular_equals_per_token_on_aligned_contiguous_runs(attention: Attention, layout: HostLayout) -> None:
    case = geometry_case(attention, layout, Direction.WRITE_BACK, (8, 9, 10, 11, 0, 1, 2, 3),
                         (12, 13, 14, 15, 4, 5, 6, 7))
    before = random_payloads(case, np.random.default_rng(2))
    per_token = expected_storages(case, before, Semantics.PER_TOKEN)
    for semantics in (Semantics.PAGE_RUNS, Semantics.PAGE_ALIGNED_HOST, Semantics.PAGE_ALIGNED):
        paged = expected_storages(case, before, semantics)
        for key in before:
            assert torch.equal(paged[key], per_token[key]), (semantics, key)


def test_page_granular_differs_from_per_token_on_irregular_runs() -> None:
    # the bug class B6: only the first index of each page counts
    case = geometry_case(Attention.MHA, HostLayout.PAGE_FIRST, Direction.WRITE_BACK, (8, 10, 9, 11), (4, 5, 6, 7))
    before = random_payloads(case, np.random.default_rng(3))
    per_token = expected_storages(case, before, Semantics.PER_TOKEN)
    runs = expected_storages(case, before, Semantics.PAGE_RUNS)
    assert not torch.equal(per_token["kv/host"], runs["kv/host"])


def numpy_split(case: Case, payloads: dict[str, torch.Tensor]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    device = {p.name: payloads[storage_key(p.name, "device")].numpy().copy() for p in case.pools}
    host = {p.name: payloads[storage_key(p.name, "host")].numpy().copy() for p in case.pools}
    return device, host


def test_oracle_agrees_with_independent_loop_model_on_random_cases() -> None:
    rng = np.random.default_rng(4)
    space = CaseSpace(byte_budget=96 << 10, invalid_rate=0.0)
    checked = 0
    for index in range(300):
        case = case_for_index(11, index, space)
        entry = random.Random(index).choice([EntryPoint.REFERENCE, EntryPoint.JIT_STAGED])
        prediction = predict(case, EntryPoint.REFERENCE, Platform())
        if prediction.verdict is not Verdict.ACCEPT:
            continue
        page_runs = entry is EntryPoint.JIT_STAGED and case.layout is HostLayout.PAGE_FIRST
        if page_runs and (case.n % case.page_size or case.direction is not Direction.WRITE_BACK):
            continue
        semantics = Semantics.PAGE_RUNS if page_runs else prediction.semantics
        run_rows = {h + t for h in case.host_indices[:: case.page_size] for t in range(case.page_size)}
        if page_runs and len(run_rows) != case.n:
            continue  # overlapping runs: unspecified winner
        before = random_payloads(case, rng)
        expected = expected_storages(case, before, semantics)
        device, host = numpy_split(case, before)
        naive_expected(case, device, host, page_runs=page_runs)
        for pool in case.pools:
            assert np.array_equal(expected[storage_key(pool.name, "device")].numpy(), device[pool.name]), case.to_json()
            assert np.array_equal(expected[storage_key(pool.name, "host")].numpy(), host[pool.name]), case.to_json()
        checked += 1
    assert checked >= 200, f"only {checked} cases were valid; the generator's invalid rate drifted"


def test_one_layer_touches_only_that_layer() -> None:
    case = geometry_case(Attention.MHA, HostLayout.LAYER_FIRST, Direction.LOAD_BACK, (0, 1), (4, 5),
                         scope=Scope.ONE_LAYER, layer=2)
    before = random_payloads(case, np.random.default_rng(5))
    after = expected_storages(case, before, Semantics.PER_TOKEN)
    changed = (after["kv/device"] != before["kv/device"]).nonzero().flatten()
    pool = case.pools[0]
    allowed = torch.cat([layouts.device_row_bytes(case, pool, c, 2, torch.tensor([4, 5])).reshape(-1)
                         for c in pool.components])
    assert changed.numel() > 0
    assert bool(torch.isin(changed, allowed).all())
    assert torch.equal(after["kv/host"], before["kv/host"])
