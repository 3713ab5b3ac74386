"""materialize: every storage allocated with guards, filled deterministically, sources distinct from
destinations; index lists in the dtype and placement the case names."""

from __future__ import annotations

import pytest
import torch

from hicache_fuzz.harness.model.case import (
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.pipeline.materialize import index_tensor, materialize
from hicache_fuzz.kernels.buffers import GUARD_BYTES
from hicache_fuzz.oracles import layouts

CPU = torch.device("cpu")


def two_pool_case(seed: int = 1) -> Case:
    kv = PoolSpec(heads=2, head_dim=16)
    side = PoolSpec(name="side", heads=1, head_dim=8)
    return Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
                pools=(kv, side), layers=2, page_size=2, device_rows=8, host_slots=6, host_indices=(0, 1, 2, 3),
                device_indices=(2, 3, 4, 5), device_index=IndexSpec(dtype=IndexDtype.INT32), seed=seed)


def images(case: Case) -> dict[str, torch.Tensor]:
    buffers = materialize(case, CPU)
    try:
        return buffers.snapshot()
    finally:
        buffers.memory.release()


def test_every_storage_has_its_layout_size_plus_two_guards() -> None:
    case = two_pool_case()
    got = images(case)
    assert sorted(got) == ["kv/device", "kv/host", "side/device", "side/host"]
    for pool in case.pools:
        assert got[f"{pool.name}/device"].numel() == layouts.device_bytes(case, pool) + 2 * GUARD_BYTES
        assert got[f"{pool.name}/host"].numel() == layouts.host_bytes(case, pool) + 2 * GUARD_BYTES
        assert all(raw.dtype is torch.uint8 for raw in got.values())


def test_the_fill_is_deterministic_and_depends_on_the_seed() -> None:
    first, again, other = images(two_pool_case(1)), images(two_pool_case(1)), images(two_pool_case(2))
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert all(not torch.equal(first[key], other[key]) for key in first)


def test_source_and_destination_never_hold_the_same_bytes() -> None:
    got = images(two_pool_case())
    for pool in ("kv", "side"):
        device, host = got[f"{pool}/device"], got[f"{pool}/host"]
        shortest = min(device.numel(), host.numel())
        # a lost write must be visible: the destination's prior bytes differ from the source's almost everywhere
        same = (device[:shortest] == host[:shortest]).float().mean().item()
        assert same < 0.05, (pool, same)


def test_index_lists_have_the_dtype_and_placement_of_the_case() -> None:
    buffers = materialize(two_pool_case(), CPU)
    try:
        assert buffers.host_indices.dtype is torch.int64 and buffers.host_indices.tolist() == [0, 1, 2, 3]
        assert buffers.device_indices.dtype is torch.int32 and buffers.device_indices.tolist() == [2, 3, 4, 5]
    finally:
        buffers.memory.release()


def test_int32_index_values_beyond_int32_wrap_like_a_cast() -> None:
    tensor = index_tensor((2**31, -1), IndexDtype.INT32, IndexDevice.CPU, CPU, simulated=True)
    assert tensor.dtype is torch.int32 and tensor.tolist() == [-(2**31), -1]


def test_host_copies_go_a_registration_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One cudaMemcpy across two host registrations fails on CUDA (invalid argument): copies of storages are
    made in pieces of the registration chunk, from the storage's start, and still give every byte."""
    from hicache_fuzz.kernels import buffers

    pieces: list[int] = []
    original = torch.Tensor.copy_

    def spy(self: torch.Tensor, src: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        pieces.append(src.numel())
        return original(self, src, *args, **kwargs)

    monkeypatch.setattr(buffers, "register_chunk_bytes", lambda: 4096)
    raw = torch.randint(0, 256, (3 * 4096 + 100,), dtype=torch.uint8)
    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    copy = buffers.copied_to(raw, torch.device("cpu"))
    monkeypatch.undo()
    assert pieces == [4096, 4096, 4096, 100]
    assert torch.equal(copy, raw) and copy.data_ptr() != raw.data_ptr()
