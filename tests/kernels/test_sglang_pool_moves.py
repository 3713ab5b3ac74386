"""CPU tests of sglang-pool: the controller's index placement, the pool paths, and the backend's own moves around
sglang's pool objects (the batched layer copies in and out, the load-back's layers just outside the pool, the round
trip of every case's tokens through the host allocator: alloc, free, a double free), on stand-in pools. sglang is
not installed here and must not be needed."""

from __future__ import annotations

import types

import pytest

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels import sglang_pool
from hicache_fuzz.kernels import sglang_pool_calls as pool_calls
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import EntryPoint, Platform

from .sglang_cases import mk

H200 = Platform("cuda", (9, 0))
A100 = Platform("cuda", (8, 0))
MI300 = Platform("rocm", (9, 4))


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    return load_registry()


# ---- pools and controller placement --------------------------------------------------------------------------

CPU64 = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)
GROUP = (
    PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 64),
    PoolSpec("side1", Attention.MLA, KVDtype.BF16, 1, 576),
    PoolSpec("side2", Attention.MHA, KVDtype.BF16, 1, 128, write_back_jit=False),
)


def pool_case(
    pools: tuple[PoolSpec, ...],
    controller: str,
    direction: Direction = Direction.WRITE_BACK,
    layout: HostLayout = HostLayout.PAGE_FIRST,
) -> Case:
    return mk(
        "sglang-pool",
        direction=direction,
        scope=Scope.ALL_LAYERS,
        layout=layout,
        pools=pools,
        hidx=CPU64,
        tuning={"controller": controller},
    )


def test_controller_placement_base_vs_hybrid() -> None:
    D, C = IndexDevice.DEVICE, IndexDevice.CPU
    assert sglang_pool.placements(pool_case(GROUP[:2], "base")) == [(C, D), (C, D)]
    assert sglang_pool.placements(pool_case(GROUP, "base")) == [(D, D)] * 3  # facade = all(children) = False
    assert sglang_pool.placements(pool_case(GROUP, "hybrid")) == [(C, D), (C, D), (D, D)]  # per pool
    assert sglang_pool.placements(pool_case(GROUP, "hybrid", Direction.LOAD_BACK)) == [(D, D)] * 3
    assert sglang_pool.placements(pool_case(GROUP[:1], "base", layout=HostLayout.LAYER_FIRST)) == [(D, D)]


def test_pool_expected_run_reproduces_the_wrong_device_class() -> None:
    paths, stop = sglang_pool.expected_run(pool_case(GROUP, "base"), H200)
    assert paths == [common.STAGED] and "CUDA host indices" in stop
    paths, stop = sglang_pool.expected_run(pool_case(GROUP, "hybrid"), H200)
    assert paths == [common.STAGED, common.STAGED, "aot:transfer_kv_all_layer_lf_pf"] and stop is None


def test_pool_paths() -> None:
    lf = pool_case(GROUP[:1], "hybrid", layout=HostLayout.LAYER_FIRST)
    assert sglang_pool.pool_paths(lf, GROUP[0], H200) == common.REGISTER  # 256 B rows: TMA needs ps % 128
    mla576 = PoolSpec("kv", Attention.MLA, KVDtype.FP8, 1, 576)
    load = pool_case((mla576,), "hybrid", Direction.LOAD_BACK)
    assert sglang_pool.pool_paths(load, mla576, A100) == "aot:transfer_kv_per_layer_mla_pf_lf"
    assert sglang_pool.pool_paths(load, mla576, MI300) == common.REGISTER


def test_pool_unsupported_when_aot_is_needed_but_missing(registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the accelerator is this machine's: probed
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (False, "no sgl_kernel"))
    pool = registry.get("sglang-pool")
    assert "AOT op" in pool.unsupported_reason(pool_case(GROUP, "hybrid"), H200)
    assert pool.unsupported_reason(pool_case(GROUP, "base"), H200) is None  # fails before the AOT pool
    assert pool.plan(pool_case(GROUP, "base"), H200).entry is EntryPoint.REFERENCE


def _stand_in_pool(components: tuple[str, ...], layers: int, rows: int, row_bytes: int,
                   seed: int) -> types.SimpleNamespace:
    """What _copy_in/_copy_out read of a materialized pool: its spec's components, the case's layers and
    device rows, per-layer uint8 views of one device payload (layer-major per component), and a host payload."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    device = torch.randint(0, 256, (len(components) * layers * rows * row_bytes,), dtype=torch.uint8,
                           generator=generator)
    host = torch.randint(0, 256, (3 * rows * row_bytes,), dtype=torch.uint8, generator=generator)

    def device_layer(component: str, layer: int) -> torch.Tensor:
        start = (components.index(component) * layers + layer) * rows * row_bytes
        return device[start:start + rows * row_bytes].view(rows, row_bytes)

    return types.SimpleNamespace(spec=types.SimpleNamespace(components=components),
                                 case=types.SimpleNamespace(layers=layers, device_rows=rows),
                                 device_layer=device_layer, device=device, host=types.SimpleNamespace(payload=host))


@pytest.mark.parametrize("attention", [Attention.MHA, Attention.MLA])
def test_pool_copies_move_every_layer_byte_exactly_both_ways(attention: Attention) -> None:
    """The batched layer copies (one _foreach_copy_ a direction) put each of our device layers into sglang's
    per-layer tensor of the same component and layer, and back; and the host payload whole, both ways."""
    import torch

    components = ("kv",) if attention is Attention.MLA else ("k", "v")
    layers, rows, heads, head_dim = 5, 7, 2, 8
    row_bytes = heads * head_dim * 2  # bf16
    ours = _stand_in_pool(components, layers, rows, row_bytes, seed=1)
    ours.spec.attention = attention
    sglang_layers = {c: [torch.zeros(rows, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers)]
                     for c in components}
    device_pool = types.SimpleNamespace(kv_buffer=sglang_layers.get("kv"), k_buffer=sglang_layers.get("k"),
                                        v_buffer=sglang_layers.get("v"))
    host_pool = types.SimpleNamespace(kv_buffer=torch.zeros(3 * rows * row_bytes // 2, dtype=torch.bfloat16))

    sglang_pool._copy_in(ours, device_pool, host_pool)
    for c in components:
        for layer in range(layers):
            assert torch.equal(sglang_layers[c][layer].view(torch.uint8).view(rows, -1), ours.device_layer(c, layer))
    assert torch.equal(host_pool.kv_buffer.view(torch.uint8), ours.host.payload)

    back = _stand_in_pool(components, layers, rows, row_bytes, seed=2)  # other bytes everywhere
    back.spec.attention = attention
    sglang_pool._copy_out(back, device_pool, host_pool)
    assert torch.equal(back.device, ours.device) and torch.equal(back.host.payload, ours.host.payload)


class _GuardedHostPool:
    """sglang 0.5.23's per-layer load guard (`pool_host/mha.py`: `0 <= layer_id < target_layer_num`, else
    return), or the mutant of it that lets the layer just past the range through (`<=`); a layer that gets past
    the guard indexes the pool's per-layer lists, as sglang does."""

    def __init__(self, layers: int, off_by_one: bool = False) -> None:
        self.target_layer_num, self.off_by_one = layers, off_by_one
        self.layer_rows: list[list[int]] = [[] for _ in range(layers)]

    def load_to_device_per_layer(self, device_pool: object, host_indices: object, device_indices: object,
                                 layer_id: int, io_backend: str) -> None:
        inside = (0 <= layer_id <= self.target_layer_num) if self.off_by_one else (
            0 <= layer_id < self.target_layer_num)
        if not inside:
            return
        self.layer_rows[layer_id].append(1)  # IndexError past the end, as sglang's device_k_buffers[layer_id]


def test_pool_load_back_also_loads_the_layers_just_outside_the_pool_and_expects_nothing() -> None:
    """Every load-back case of sglang-pool also asks for layers -1 and `layers` (a draft layer, another pool's):
    sglang's guard skips them; an off-by-one guard lets `layers` through and the case fails (the survivor
    13cd2b6186b7 of the mutation run, reports/mutate/README.md)."""
    case = pool_case(GROUP[:1], "base", Direction.LOAD_BACK)
    transfers = pool_calls.pool_transfers(case)
    foreign = [("load_to_device_per_layer", -1), ("load_to_device_per_layer", case.layers)]
    assert transfers == [("load_to_device_per_layer", layer) for layer in case.moved_layers] + foreign
    guarded = _GuardedHostPool(case.layers)
    for method, layer in foreign:
        sglang_pool.transfer(guarded, method, layer, None, None, None)
    assert guarded.layer_rows == [[] for _ in range(case.layers)]
    with pytest.raises(IndexError):
        for method, layer in foreign:
            sglang_pool.transfer(_GuardedHostPool(case.layers, off_by_one=True), method, layer, None, None, None)


class _AllocatingHostPool:
    """sglang 0.5.23's HostKVCache.alloc/free bookkeeping (pool_host/base.py: free slots, released slots merged
    back when needed, `slot_used` with its double-alloc and double-free checks), or one of two mutants of it:
    `mutant`, the page check `need_size % page_size == 0` written as `need_size & page_size == 0` (refuses odd
    page counts); `free_shift`, `free` clearing `slot_used[indices - 1]` instead of `slot_used[indices]`."""

    def __init__(self, slots: int, page_size: int, mutant: bool = False, free_shift: bool = False) -> None:
        import torch

        self.page_size, self.mutant, self.free_shift = page_size, mutant, free_shift
        self.free_slots = torch.arange(slots, dtype=torch.int64)
        self.slot_used = torch.zeros(slots, dtype=torch.bool)
        self.release_slots: list[object] = []
        self.freed: list[int] = []

    def available_size(self) -> int:
        return len(self.free_slots) + sum(len(r) for r in self.release_slots)  # type: ignore[arg-type]

    def alloc(self, need_size: int) -> object:
        import torch

        ok = (need_size & self.page_size == 0) if self.mutant else (need_size % self.page_size == 0)
        assert ok, "The requested size should be a multiple of the page size."
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots):
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])  # type: ignore[list-item]
            self.release_slots = []
        granted, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        assert not self.slot_used[granted].any(), "Double-alloc detected: slots already allocated"
        self.slot_used[granted] = True
        return granted

    def free(self, indices: object) -> None:
        assert self.slot_used[indices].all(), "Double-free detected: slots not currently allocated"  # type: ignore[index]
        self.slot_used[indices - 1 if self.free_shift else indices] = False  # type: ignore[operator]
        self.release_slots.append(indices)
        self.freed += indices.tolist()  # type: ignore[attr-defined]


def test_every_pool_case_round_trips_its_token_count_through_the_host_allocator() -> None:
    """sglang's allocator grants the case's pages and gets them back; the page-check mutant refuses an odd page
    count, which fails the case (valid input rejected) instead of going unseen."""
    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    pages = case.n // case.page_size
    good = _AllocatingHostPool(case.host_slots, case.page_size)
    sglang_pool._allocator_round_trip(case, good)
    # the case's slots, then the whole pool (the second free of the case's slots was refused: not recorded)
    assert sorted(good.freed) == sorted(list(range(case.n)) + list(range(case.host_slots)))
    assert good.available_size() == case.host_slots and not good.slot_used.any()
    if pages % 2 and case.page_size > 1 and case.n & case.page_size == 0:
        with pytest.raises(AssertionError, match="multiple of the page size"):
            sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size, True))

    class Refusing(_AllocatingHostPool):
        def alloc(self, need_size: int) -> object:
            return None

    with pytest.raises(AssertionError, match="refused"):
        sglang_pool._allocator_round_trip(case, Refusing(case.host_slots, case.page_size))

    class Repeating(_AllocatingHostPool):
        def alloc(self, need_size: int) -> object:
            import torch

            return torch.zeros(need_size, dtype=torch.int64)

        def free(self, indices: object) -> None:
            pass

    if case.n > 1:
        with pytest.raises(AssertionError, match="granted"):
            sglang_pool._allocator_round_trip(case, Repeating(case.host_slots, case.page_size))


def test_the_page_check_mutant_refuses_an_odd_page_count_for_power_of_two_page_sizes() -> None:
    """What the round trip relies on: for page size 16, 3 pages (48 tokens) pass sglang's check and fail the
    mutant's (48 & 16 == 16)."""
    import dataclasses

    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    case = dataclasses.replace(case, page_size=16, host_slots=64, device_rows=80,
                               host_indices=tuple(range(48)), device_indices=tuple(range(16, 64)))
    sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, 16))
    with pytest.raises(AssertionError, match="multiple of the page size"):
        sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, 16, mutant=True))


def test_the_pool_round_trip_sees_a_free_that_leaves_a_slot_marked_used() -> None:
    """The survivor e579ef60fefe of the mutation run (reports/mutate/README.md): `free` clears
    `slot_used[indices - 1]`, so the last slot it frees stays marked used (and the slot before the first is
    cleared). Freeing twice is still refused for a run of slots, so only granting the whole pool again shows it:
    sglang's double-alloc check fires."""
    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    assert case.n > 0
    sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size))
    with pytest.raises(AssertionError, match="Double-alloc"):
        sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size, free_shift=True))


def test_the_pool_round_trip_fails_an_allocator_that_takes_a_second_free() -> None:
    class Forgiving(_AllocatingHostPool):
        def free(self, indices: object) -> None:
            self.slot_used[indices] = False  # type: ignore[index]
            self.release_slots = [r for r in self.release_slots if r is not indices] + [indices]

    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    with pytest.raises(AssertionError, match="second free"):
        sglang_pool._allocator_round_trip(case, Forgiving(case.host_slots, case.page_size))
