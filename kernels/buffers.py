"""The buffers a backend sees: raw storages with guard bytes, typed views in sglang's shapes, and the host
memory they live in (pinned, registered or pageable; simulated on the CPU platform).

Every pool gets a device storage and a host storage, each a flat uint8 tensor with ``GUARD_BYTES`` of guard
before and after the payload. Backends receive typed views of the payload in sglang's shapes. On the CPU
platform "device" memory and pinned host memory are simulated by ordinary CPU tensors; the case's logical
placement is still visible to backends through ``case.host_index.device`` and friends.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hicache_fuzz.harness.model.case import Case, HostAllocator, IndexDtype, KVDtype, PoolSpec
from hicache_fuzz.oracles import layouts

GUARD_BYTES = 256  # a multiple of every alignment a kernel may assume (16-byte vectors, 128-byte rounds)

TORCH_DTYPES = {
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP16: torch.float16,
    KVDtype.FP32: torch.float32,
    KVDtype.FP8: torch.uint8,  # sglang stores fp8 KV as uint8
}
INDEX_DTYPES = {IndexDtype.INT32: torch.int32, IndexDtype.INT64: torch.int64}


# ---- memory -------------------------------------------------------------------------------------------

class HostArena:
    """Host buffers kept across cases, by allocator and power-of-two capacity, so a campaign pays for pinned
    allocation and cudaHostRegister once per size class instead of once per case. A buffer is handed to
    one HostMemory at a time and comes back when that HostMemory is released."""

    def __init__(self) -> None:
        self._free: dict[tuple[HostAllocator, int], list[torch.Tensor]] = {}
        self._lock = threading.Lock()  # cases run one at a time per process, but threads may share the arena
        self._registered = HostMemory(simulate=False)  # owns the registrations; never released

    def take(self, nbytes: int, allocator: HostAllocator) -> torch.Tensor:
        capacity = 1 << max(12, (max(nbytes, 1) - 1).bit_length())
        with self._lock:
            free = self._free.get((allocator, capacity))
            if free:
                return free.pop()
        return self._registered.allocate(capacity, allocator)

    def give(self, buffer: torch.Tensor, allocator: HostAllocator) -> None:
        with self._lock:
            self._free.setdefault((allocator, buffer.numel()), []).append(buffer)


REGISTER_CHUNK_ENV = "SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB"  # sglang 0.5.23's knob (pool_host/common.py)


def register_chunk_bytes() -> int:
    """Bytes per cudaHostRegister call for host_register storages: sglang's chunk limit rule (whole GiB, at least
    1), from its environment variable; unset, the harness uses 1 GiB (sglang's default is 256 GiB): the
    smallest chunk a deployment can configure, so every storage past 1 GiB spans several registrations."""
    import os

    try:
        gib = int(os.environ.get(REGISTER_CHUNK_ENV, "1"))
    except ValueError:
        gib = 1
    return max(gib, 1) << 30


def registration_ranges(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, size) of each registration of an `nbytes` buffer in `chunk`-byte pieces, the last one shorter."""
    return [(offset, min(chunk, nbytes - offset)) for offset in range(0, max(nbytes, 1), chunk)]


def copied_to(raw: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of the flat storage `raw` on `device`, made in pieces that never cross a host registration.

    A host_register storage is registered in chunks (registration_ranges, from the start of its buffer, which is
    where storages begin); one cudaMemcpy whose host range spans two registrations fails with "invalid
    argument" (cudaErrorInvalidValue: a host pool of several GB in 1 GiB registrations), so
    copies between host and device go a chunk at a time. Kernels are not affected: they address the memory
    through its device mapping, which is contiguous."""
    out = torch.empty(raw.numel(), dtype=raw.dtype, device=device)
    step = register_chunk_bytes() // max(raw.element_size(), 1)
    # To a GPU the copy is queued on the current stream and not waited for: whatever reads `out` next on the
    # device runs after it, and a caller that needs it complete on the host synchronizes (snapshot_on). Each
    # wait costs a round trip through the GPU's time slices when several processes share it (a case's wall time
    # grows severalfold with six workers), so the per-case path waits as few times as it can.
    non_blocking = device.type != "cpu"
    for start in range(0, raw.numel(), step):
        out[start : start + step].copy_(raw[start : start + step], non_blocking=non_blocking)
    return out


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor (indices, pointer tables) copied to the GPU `device` without waiting: staged in pinned
    memory from torch's caching host allocator, which keeps the block until the copy has run, then queued on
    the current stream. (A copy from pageable memory makes the host wait for the stream.) A CPU `device` takes
    the tensor as it is: there is nothing to stage."""
    if device.type == "cpu":
        return values
    return values.pin_memory().to(device, non_blocking=True)


_SHARED_ARENA: HostArena | None = None
ARENA_MIN_SIMULATED_BYTES = 1 << 18


def shared_arena() -> HostArena:
    """The process's host arena (created on first use; lives as long as the process)."""
    global _SHARED_ARENA
    if _SHARED_ARENA is None:
        _SHARED_ARENA = HostArena()
    return _SHARED_ARENA


class HostMemory:
    """Allocates host storages with the case's allocator and frees what needs freeing (registrations).

    ``simulate`` (the CPU platform) makes every allocator plain pageable memory. With an ``arena`` the
    buffers come from it and go back to it on release (the data is overwritten by the next fill). Simulated
    memory always uses the process arena: fresh multi-MiB allocations are page-faulted in on first touch,
    which costs more than filling them.
    """

    def __init__(self, simulate: bool, arena: HostArena | None = None) -> None:
        self.simulate = simulate
        self.arena = shared_arena() if arena is None and simulate else arena
        self._cleanups: list[Callable[[], None]] = []

    def allocate(self, nbytes: int, allocator: HostAllocator) -> torch.Tensor:
        # Small simulated buffers skip the arena: malloc recycles them without page faults, and cheaper.
        if self.arena is not None and (not self.simulate or nbytes >= ARENA_MIN_SIMULATED_BYTES):
            arena = self.arena
            kind = HostAllocator.PAGEABLE if self.simulate else allocator
            buffer = arena.take(nbytes, kind)
            self._cleanups.append(lambda: arena.give(buffer, kind))
            return buffer[:nbytes]
        if self.simulate:
            return torch.empty(nbytes, dtype=torch.uint8)
        if allocator is HostAllocator.PAGEABLE:
            return torch.empty(nbytes, dtype=torch.uint8)
        if allocator is HostAllocator.PIN_MEMORY:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self._mmap_registered(nbytes)

    def _mmap_registered(self, nbytes: int) -> torch.Tensor:
        # What sglang does in production (pool_host/common.py alloc_with_host_register): an mmap-backed
        # tensor, then cudaHostRegister (hipHostRegister on ROCm). Its device alias may differ from the VA.
        # Like sglang's _cuda_host_register, it registers in chunks (see registration_ranges), so large
        # storages span several registrations, and a row may straddle two of them.
        region = mmap.mmap(-1, max(nbytes, 1))
        tensor = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)
        cudart = torch.cuda.cudart()
        base = tensor.data_ptr()
        registered: list[int] = []
        for offset, size in registration_ranges(nbytes, register_chunk_bytes()):
            status = cudart.cudaHostRegister(base + offset, size, 0)
            if int(status) != 0:
                for ptr in registered:
                    cudart.cudaHostUnregister(ptr)
                raise RuntimeError(f"cudaHostRegister of {size} bytes at offset {offset} (of {nbytes}) failed "
                                   f"with status {int(status)}")
            registered.append(base + offset)

        def unregister(ptrs: tuple[int, ...] = tuple(registered), keep: object = (region, tensor)) -> None:
            for ptr in reversed(ptrs):
                cudart.cudaHostUnregister(ptr)

        self._cleanups.append(unregister)
        return tensor

    def release(self) -> None:
        while self._cleanups:
            self._cleanups.pop()()


# ---- materialized buffers --------------------------------------------------------------------------------

@dataclass
class Storage:
    key: str  # "<pool>/device" or "<pool>/host"
    raw: torch.Tensor  # uint8: guard | payload | guard
    payload_bytes: int

    @property
    def payload(self) -> torch.Tensor:
        return self.raw[GUARD_BYTES : GUARD_BYTES + self.payload_bytes]


@dataclass
class PoolBuffers:
    case: Case
    spec: PoolSpec
    device: Storage
    host: Storage

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.spec.dtype]

    def device_layer(self, component: str, layer: int) -> torch.Tensor:
        """uint8 view (device_rows, row_bytes) of one device layer."""
        E = self.spec.row_bytes(component)
        start = layouts.device_base(self.case, self.spec, component) + layer * self.case.device_rows * E
        return self.device.payload[start : start + self.case.device_rows * E].view(self.case.device_rows, E)

    def device_layer_typed(self, component: str, layer: int) -> torch.Tensor:
        """Typed view (device_rows, heads, head_dim) of one device layer, as sglang's pools hold it."""
        heads = self.spec.heads
        return self.device_layer(component, layer).view(self.torch_dtype).view(self.case.device_rows, heads, -1)

    def host_component(self, component: str) -> torch.Tensor:
        """uint8 flat view of one component's host half (layouts with separate K and V halves)."""
        start = layouts.host_base(self.case, self.spec, component)
        return self.host.payload[start : start + layouts.host_component_bytes(self.case, self.spec, component)]

    def host_typed(self) -> torch.Tensor:
        """The whole host tensor in sglang's shape (MHA: (2, ...) K/V leading axis; MLA: no K/V axis)."""
        return self.host.payload.view(self.torch_dtype).view(layouts.host_shape(self.case, self.spec))

    def host_component_typed(self, component: str) -> torch.Tensor:
        shape = layouts.host_component_shape(self.case, self.spec, component)
        return self.host_component(component).view(self.torch_dtype).view(shape)


@dataclass
class Materialized:
    case: Case
    device: torch.device  # where "device" memory lives (cpu when simulated)
    simulated: bool
    pools: list[PoolBuffers]
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    memory: HostMemory = field(repr=False)
    #: raw storage images a backend records after each transfer of a sequence case (oracles/sequence.py), in
    #: order, labelled with the step; the runner compares each with the oracle's image of that step
    step_images: list[tuple[str, dict[str, torch.Tensor]]] = field(default_factory=list, repr=False)

    def storages(self) -> list[Storage]:
        return [s for p in self.pools for s in (p.device, p.host)]

    def snapshot(self) -> dict[str, torch.Tensor]:
        """CPU copies of every raw storage (guards included), keyed by storage key."""
        if self.device.type != "cpu":
            torch.cuda.synchronize(self.device)
        return {s.key: copied_to(s.raw, torch.device("cpu")) for s in self.storages()}

    def snapshot_on(self, device: torch.device, scratch: HostMemory | None = None) -> dict[str, torch.Tensor]:
        """Copies of every raw storage (guards included) on `device`, keyed by storage key: the "before"
        image the oracle starts from (a copy, since backends write the storages in place). CPU copies come
        from `scratch` (default: this case's host memory) and share its lifetime (until release)."""
        memory = scratch or self.memory
        if device.type != "cpu":
            # Queued copies; one wait for all of them, so the "before" image is complete before any backend
            # code runs (a backend may write a host storage from the CPU).
            copies = {s.key: copied_to(s.raw, device) for s in self.storages()}
            torch.cuda.current_stream(device).synchronize()
            return copies
        if memory.arena is None:
            return {s.key: copied_to(s.raw, device) for s in self.storages()}
        copies = {}
        for s in self.storages():
            copy = memory.allocate(s.raw.numel(), HostAllocator.PAGEABLE)
            copy.copy_(s.raw)
            copies[s.key] = copy
        return copies

    def current_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Every raw storage as it is now, on `device`: the storage itself where it already lives there
        (valid until release), a copy otherwise (queued on the current stream, after the backend's work).
        The caller synchronizes the device first (the runner's probe)."""
        return {s.key: s.raw if s.raw.device == device else copied_to(s.raw, device) for s in self.storages()}

    def release(self) -> None:
        self.pools.clear()
        self.memory.release()
