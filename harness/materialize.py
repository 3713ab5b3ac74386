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

import hashlib
import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hicache_fuzz.harness.case import Case, HostAllocator, IndexDevice, IndexDtype, KVDtype, PoolSpec
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.transfer import storage_key

GUARD_BYTES = 256  # a multiple of every alignment a kernel may assume (16-byte vectors, 128-byte rounds)

TORCH_DTYPES = {
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP16: torch.float16,
    KVDtype.FP32: torch.float32,
    KVDtype.FP8: torch.uint8,  # sglang stores fp8 KV as uint8
}
INDEX_DTYPES = {IndexDtype.INT32: torch.int32, IndexDtype.INT64: torch.int64}


def _salt(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def fill_pattern(raw: torch.Tensor, salt: int) -> None:
    """Fill `raw` (uint8, any device) in place with a hash of (salt, position).

    Each 8-byte word at word position w gets splitmix64(w ^ salt) in wrapping int64 arithmetic, so the bytes
    are identical on every device and machine, and every byte depends on where it is. CPU memory (pageable
    or pinned) is filled with numpy, whose per-call cost is a fraction of torch's; small device storages are
    filled on the host and copied over in one transfer; large ones are hashed on the device.
    """
    n = raw.numel()
    if raw.device.type == "cpu":
        _fill_numpy(raw.numpy(), salt)
        return
    if n <= SMALL_DEVICE_FILL_BYTES:
        arena = shared_arena()
        staging = arena.take(n, HostAllocator.PIN_MEMORY)
        try:
            _fill_numpy(staging[:n].numpy(), salt)
            raw.copy_(staging[:n])  # synchronous from pinned memory: the staging buffer is free when it returns
        finally:
            arena.give(staging, HostAllocator.PIN_MEMORY)
        return
    words_total = (n + 7) // 8
    chunk = 1 << 22  # words per step: bounds the int64 temporaries to 32 MiB
    for first_word in range(0, words_total, chunk):
        words = min(chunk, words_total - first_word)
        x = torch.arange(first_word, first_word + words, dtype=torch.int64, device=raw.device) ^ salt
        x = x * SPLITMIX_MULTIPLIER_1
        x = x ^ (x >> 31)
        x = x * SPLITMIX_MULTIPLIER_2
        x = x ^ (x >> 29)
        start = first_word * 8
        count = min(words * 8, n - start)
        raw[start : start + count] = x.view(torch.uint8)[:count]


SPLITMIX_MULTIPLIER_1 = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
SPLITMIX_MULTIPLIER_2 = -4658895280553007687  # 0xBF58476D1CE4E5B9
SMALL_DEVICE_FILL_BYTES = 1 << 20


def _fill_numpy(out: np.ndarray, salt: int) -> None:
    """fill_pattern's arithmetic on a uint8 numpy array: numpy int64 arrays wrap on overflow and shift right
    arithmetically, exactly like torch's int64, so both forms give the same bytes. Whole words are hashed in
    place in `out` (viewed as int64, little-endian like torch's view), in cache-sized steps."""
    if out.size <= FILL_STEP_WORDS * 8:  # one step: hash into a scratch block and copy (fewest numpy calls)
        x = np.arange((out.size + 7) // 8, dtype=np.int64)
        x ^= np.int64(salt)
        x *= SPLITMIX_MULTIPLIER_1
        x ^= x >> 31
        x *= SPLITMIX_MULTIPLIER_2
        x ^= x >> 29
        out[:] = x.view(np.uint8)[: out.size]
        return
    whole_words = out.size // 8
    words = out[: whole_words * 8].view(np.int64)
    scratch = np.empty(min(whole_words, FILL_STEP_WORDS), dtype=np.int64)
    for first in range(0, whole_words, FILL_STEP_WORDS):
        last = min(first + FILL_STEP_WORDS, whole_words)
        _splitmix_in_place(words[first:last], first, salt, scratch[: last - first])
    tail = out.size - whole_words * 8
    if tail:
        last_word = np.empty(1, dtype=np.int64)
        _splitmix_in_place(last_word, whole_words, salt, np.empty(1, dtype=np.int64))
        out[whole_words * 8 :] = last_word.view(np.uint8)[:tail]


FILL_STEP_WORDS = 1 << 16  # 512 KiB per step: the word block and its scratch stay in cache


def _splitmix_in_place(x: np.ndarray, first_word: int, salt: int, scratch: np.ndarray) -> None:
    x[:] = np.arange(first_word, first_word + x.size, dtype=np.int64)
    x ^= np.int64(salt)
    x *= SPLITMIX_MULTIPLIER_1
    np.right_shift(x, 31, out=scratch)
    x ^= scratch
    x *= SPLITMIX_MULTIPLIER_2
    np.right_shift(x, 29, out=scratch)
    x ^= scratch


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
        region = mmap.mmap(-1, max(nbytes, 1))
        tensor = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)
        cudart = torch.cuda.cudart()
        status = cudart.cudaHostRegister(tensor.data_ptr(), nbytes, 0)
        if int(status) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with status {int(status)}")

        def unregister(ptr: int = tensor.data_ptr(), keep: object = (region, tensor)) -> None:
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

    def storages(self) -> list[Storage]:
        return [s for p in self.pools for s in (p.device, p.host)]

    def snapshot(self) -> dict[str, torch.Tensor]:
        """CPU copies of every raw storage (guards included), keyed by storage key."""
        if self.device.type != "cpu":
            torch.cuda.synchronize(self.device)
        return {s.key: s.raw.to("cpu", copy=True) for s in self.storages()}

    def snapshot_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Copies of every raw storage (guards included) on `device`, keyed by storage key: the "before"
        image the oracle starts from (a copy, since backends write the storages in place). CPU copies come
        from this case's host memory and share its lifetime (until release)."""
        if device.type != "cpu" or self.memory.arena is None:
            return {s.key: s.raw.to(device, copy=True) for s in self.storages()}
        copies = {}
        for s in self.storages():
            copy = self.memory.allocate(s.raw.numel(), HostAllocator.PAGEABLE)
            copy.copy_(s.raw)
            copies[s.key] = copy
        return copies

    def current_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Every raw storage as it is now, on `device`: the storage itself where it already lives there
        (valid until release), a copy otherwise. The caller synchronizes the device first."""
        return {s.key: s.raw if s.raw.device == device else s.raw.to(device) for s in self.storages()}

    def release(self) -> None:
        self.pools.clear()
        self.memory.release()


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
    return tensor.to(device)


def materialize(case: Case, device: torch.device, memory: HostMemory | None = None) -> Materialized:
    """Allocate and fill every storage of `case`; `device` is the accelerator or cpu (simulated)."""
    simulated = device.type == "cpu"
    # Without a caller's HostMemory, real host memory comes from the process arena: no per-case pinned
    # allocation or registration.
    memory = memory or HostMemory(simulate=simulated, arena=None if simulated else shared_arena())
    pools: list[PoolBuffers] = []
    src_side = "device" if case.direction.value == "write_back" else "host"
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
                fill_pattern(raw, _salt(case.seed, number, spec.name, side, role))
                storages[side] = Storage(storage_key(spec.name, side), raw, payload)
            pools.append(PoolBuffers(case, spec, storages["device"], storages["host"]))
        host_idx = index_tensor(case.host_indices, case.host_index.dtype, case.host_index.device, device, simulated,
                                memory)
        dev_idx = index_tensor(case.device_indices, case.device_index.dtype, case.device_index.device, device,
                               simulated, memory)
    except BaseException:
        memory.release()
        raise
    return Materialized(case, device, simulated, pools, host_idx, dev_idx, memory)

