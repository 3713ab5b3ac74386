"""Materialize: turn a case into real tensors on real memory.

Every pool gets a device storage and a host storage, each a flat uint8 tensor with ``GUARD_BYTES`` of guard
before and after the payload. The whole raw storage (guards included) is filled with an address-tagged
pattern: byte ``i`` of a storage is a hash of (case seed, pool, side, i), and since a byte position in a
storage determines its (K/V, layer, row, byte) through the layout, every misplaced byte is visible. Source
and destination storages use different salts, so a destination byte that was not written never looks like
a source byte. Backends receive typed views of the payload in sglang's shapes.

On the CPU platform "device" memory and pinned host memory are simulated by ordinary CPU tensors; the case's
logical placement is still visible to backends through ``case.host_index.device`` and friends.
"""

from __future__ import annotations

import torch

from hicache_fuzz.harness.model.case import Case, HostAllocator, IndexDevice, IndexDtype
from hicache_fuzz.harness.pipeline.fill import fill_pattern, salt
from hicache_fuzz.kernels.buffers import (
    GUARD_BYTES,
    INDEX_DTYPES,
    HostMemory,
    Materialized,
    PoolBuffers,
    Storage,
    shared_arena,
    to_device,
)
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.transfer import storage_key


def index_tensor(values: tuple[int, ...], dtype: IndexDtype, placement: IndexDevice,
                 device: torch.device, simulated: bool, memory: HostMemory | None = None) -> torch.Tensor:
    """The index list as the backend receives it. Pinned lists come from `memory` when given (its arena: no
    per-case pinned allocation), else from torch's pinned allocator."""
    # int32 lists with values beyond int32 are wrapped on purpose: that is what a caller casting them gets.
    tensor = torch.tensor(values, dtype=torch.int64).to(INDEX_DTYPES[dtype])
    if simulated or placement is IndexDevice.CPU:
        return tensor
    if placement is IndexDevice.PINNED:
        if memory is None or memory.simulate:
            return tensor.pin_memory()
        nbytes = tensor.numel() * tensor.element_size()
        pinned = memory.allocate(nbytes, HostAllocator.PIN_MEMORY).view(tensor.dtype)
        pinned.copy_(tensor)
        return pinned
    return to_device(tensor, device)


def materialize(case: Case, device: torch.device, memory: HostMemory | None = None) -> Materialized:
    """Allocate and fill every storage of `case`; `device` is the accelerator or cpu (simulated)."""
    simulated = device.type == "cpu"
    # Without a caller's HostMemory, real host memory comes from the process arena: no per-case pinned
    # allocation or registration.
    memory = memory or HostMemory(simulate=simulated, arena=None if simulated else shared_arena())
    pools: list[PoolBuffers] = []
    src_side = source_side(case)
    try:
        for number, spec in enumerate(case.pools):
            storages = {}
            for side in ("device", "host"):
                payload = (layouts.device_bytes if side == "device" else layouts.host_bytes)(case, spec)
                total = payload + 2 * GUARD_BYTES
                if side == "device" and simulated:
                    raw = memory.allocate(total, HostAllocator.PAGEABLE)  # "device" memory is host memory here
                elif side == "device":
                    raw = torch.empty(total, dtype=torch.uint8, device=device)
                else:
                    raw = memory.allocate(total, case.host_allocator)
                role = "source" if side == src_side else "destination"
                fill_pattern(raw, salt(case.seed, number, spec.name, side, role))
                storages[side] = Storage(storage_key(spec.name, side), raw, payload)
            pools.append(PoolBuffers(case, spec, storages["device"], storages["host"]))
        host_idx, dev_idx = _index_tensors(case, device, simulated, memory)
    except BaseException:
        memory.release()
        raise
    return Materialized(case, device, simulated, pools, host_idx, dev_idx, memory)


def source_side(case: Case) -> str:
    return "device" if case.direction.value == "write_back" else "host"


def rematerialize(previous: Materialized, case: Case) -> Materialized:
    """`case` on the storages of `previous` (a case of the same geometry, see pipeline/reuse.py): the source
    storages are filled afresh exactly as :func:`materialize` fills them for `case`; the destination storages
    keep what the previous case left in them (the runner compares against a copy taken before the backend
    runs, so their content need not be the fill). `previous` must not be used or released afterwards: the
    returned buffers own the storages and the host memory now."""
    src_side = source_side(case)
    pools = []
    for number, (spec, old) in enumerate(zip(case.pools, previous.pools, strict=True)):
        source = old.device if src_side == "device" else old.host
        fill_pattern(source.raw, salt(case.seed, number, spec.name, src_side, "source"))
        pools.append(PoolBuffers(case, spec, old.device, old.host))
    host_idx, dev_idx = _index_tensors(case, previous.device, previous.simulated, previous.memory)
    return Materialized(case, previous.device, previous.simulated, pools, host_idx, dev_idx, previous.memory)


def _index_tensors(case: Case, device: torch.device, simulated: bool,
                   memory: HostMemory) -> tuple[torch.Tensor, torch.Tensor]:
    host_idx = index_tensor(case.host_indices, case.host_index.dtype, case.host_index.device, device, simulated,
                            memory)
    dev_idx = index_tensor(case.device_indices, case.device_index.dtype, case.device_index.device, device,
                           simulated, memory)
    return host_idx, dev_idx

