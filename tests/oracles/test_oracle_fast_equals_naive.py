"""The optimized oracle (chunk copies moved as words, numpy on the CPU) equals a naive per-byte oracle.

The naive oracle below is the original one: per (layer, component), one int64 offset per byte from the
byte-form layout maps, then ``expected[dst_bytes] = before[src_bytes]``. Several hundred generated cases
(every layout, MHA/MLA/asymmetric, page-granular semantics, multi-pool, one and all layers) must give
byte-identical storages, so the word-wise fast path and its byte-level fallback are both covered.
"""

from __future__ import annotations

import pytest
import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Case, Direction
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.fill import fill_pattern
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.contract import EntryPoint, Platform, Verdict, predict
from hicache_fuzz.oracles.transfer import (
    Semantics,
    chunk_copies,
    expected_storages,
    storage_key,
    token_pairs,
)

SPACES = {
    "small": CaseSpace(byte_budget=64 << 10, max_pages=8, invalid_rate=0.0),
    "default": CaseSpace(byte_budget=1 << 20, invalid_rate=0.0),
    "odd-rows": CaseSpace(byte_budget=256 << 10, row_bytes=(24, 12, 48, 96, 528, 656, 2064), invalid_rate=0.0),
}
CASES_PER_SPACE = 120


def naive_expected(case: Case, before: dict[str, torch.Tensor], semantics: Semantics) -> dict[str, torch.Tensor]:
    expected = {key: value.clone() for key, value in before.items()}
    host_tokens, device_rows = token_pairs(case, semantics)
    write_back = case.direction is Direction.WRITE_BACK
    for pool in case.pools:
        device = before[storage_key(pool.name, "device")]
        host = before[storage_key(pool.name, "host")]
        for layer in case.moved_layers:
            for component in pool.components:
                host_bytes = layouts.host_row_bytes(case, pool, component, layer, host_tokens).reshape(-1)
                device_bytes = layouts.device_row_bytes(case, pool, component, layer, device_rows).reshape(-1)
                if write_back:
                    expected[storage_key(pool.name, "host")][host_bytes] = device[device_bytes]
                else:
                    expected[storage_key(pool.name, "device")][device_bytes] = host[host_bytes]
    return expected


def filled_payloads(case: Case) -> dict[str, torch.Tensor]:
    out = {}
    for number, pool in enumerate(case.pools):
        for side, size in (("device", layouts.device_bytes(case, pool)), ("host", layouts.host_bytes(case, pool))):
            payload = torch.empty(size, dtype=torch.uint8)
            fill_pattern(payload, hash((case.seed, number, side)) & 0x7FFFFFFF)
            out[storage_key(pool.name, side)] = payload
    return out


@pytest.mark.parametrize("space_name", sorted(SPACES))
def test_fast_oracle_equals_naive_per_byte_oracle(space_name: str) -> None:
    space = SPACES[space_name]
    compared = 0
    for index in range(CASES_PER_SPACE * 2):
        case = case_for_index(11, index, space)
        prediction = predict(case, EntryPoint.REFERENCE, Platform("cpu"))
        if prediction.verdict is not Verdict.ACCEPT:
            continue
        before = filled_payloads(case)
        fast = expected_storages(case, before, prediction.semantics)
        naive = naive_expected(case, before, prediction.semantics)
        for key in naive:
            assert torch.equal(fast[key], naive[key]), f"{key} differs for case {case.to_json()}"
        compared += 1
        if compared >= CASES_PER_SPACE:
            break
    assert compared >= CASES_PER_SPACE // 2


@pytest.mark.parametrize("semantics", list(Semantics))
def test_every_semantics_matches_on_page_granular_cases(semantics: Semantics) -> None:
    space = CaseSpace(byte_budget=256 << 10, page_sizes=(4, 16), page_counts=(2, 3, 4), invalid_rate=0.0)
    checked = 0
    for index in range(200):
        case = case_for_index(3, index, space)
        h, d = token_pairs(case, semantics)
        if h.numel() == 0 or int(h.max()) >= case.host_slots or int(d.max()) >= case.device_rows:
            continue
        destinations = h if case.direction is Direction.WRITE_BACK else d
        if destinations.unique().numel() != destinations.numel() or int(h.min()) < 0 or int(d.min()) < 0:
            continue
        before = filled_payloads(case)
        fast = expected_storages(case, before, semantics)
        naive = naive_expected(case, before, semantics)
        assert all(torch.equal(fast[k], naive[k]) for k in naive), case.to_json()
        checked += 1
    assert checked > 20


def test_misaligned_pool_base_falls_back_to_narrower_words() -> None:
    # An asymmetric pool's V half starts after layers*rows*E_k bytes, which need not be a multiple of E_v: the
    # oracle must then move narrower words (down to bytes) and still equal the naive form.
    from hicache_fuzz.harness.model.case import Attention, HostLayout, KVDtype, PoolSpec, Scope

    pool = PoolSpec(attention=Attention.MHA_ASYM, dtype=KVDtype.FP8, heads=1, head_dim=12, v_head_dim=20)
    case = Case(direction=Direction.LOAD_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST, pools=(pool,),
                layers=3, page_size=1, device_rows=7, host_slots=5, host_indices=(4, 0, 2), device_indices=(1, 6, 3))
    before = filled_payloads(case)
    fast = expected_storages(case, before, Semantics.PER_TOKEN)
    naive = naive_expected(case, before, Semantics.PER_TOKEN)
    assert all(torch.equal(fast[k], naive[k]) for k in naive)
    widths = {c.width for c in chunk_copies(case, Semantics.PER_TOKEN)}
    assert widths == {12, 20}
