"""The scale tier: production-size cases interleaved into every GPU campaign.

Default cases stay under 8 MiB, where 16/32-bit offset overflows, registration-chunk boundaries and big grids
never show. The scale tier spends a share of the campaign's time (default 15 %) on cases at production sizes:

* ``device_pool``: a device pool of more than 2^24 rows per layer (so also past 2^16), and a transfer of more
  than 65,536 tokens whose device rows are spread over the whole pool, the last page included;
* ``host_offset``: 126 layers and a host pool whose byte offsets pass 2^32 (so also 2^31), with host pages
  spread over the whole pool, the last page included; the host storage spans several cudaHostRegister chunks
  (the harness registers in 1 GiB chunks, see kernels/buffers.py);
* ``deep``: 61 layers, a device pool past 2^16 rows, and a page size that is not a power of two where the
  backend's contract accepts one (else a power of two).

Scale case ``j`` depends only on (seed, j, the backend's space): shape ``j % 3``, its knobs (direction, scope,
index placement, allocator) from the backend's :class:`TransferProfile`, so it is a transfer the contract
accepts and every byte of it is compared. It runs through the same pipeline as any case: every storage is filled
and every byte of every storage (guards included) is compared on the device. The expensive parts are paid once:
host buffers come from the process's host arena (pinned / registered once per size class and reused), device
storages from torch's caching allocator, and large host storages are filled by hashing on the device and
copying down (harness/pipeline/fill.py), so a scale case costs about two passes of its bytes over PCIe.

On the CPU platform :data:`SIMULATED` scales every target down (the same code path, test-sized arenas).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from hicache_fuzz.harness.engine.mix import TransferProfile, candidate, case_class
from hicache_fuzz.harness.model.case import Case, CaseError, Scope
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.contract import Platform

SHAPES = ("device_pool", "host_offset", "deep")


@dataclass(frozen=True)
class ScaleTargets:
    device_rows: int  # rows per device layer of the device_pool shape (production: past 2^24)
    mid_device_rows: int  # the deep shape's pool (production: past 2^16)
    host_offset: int  # byte offset the host_offset shape's transfer passes (production: 2^32)
    tokens: int  # transfer length of the device_pool shape (production: past 65,536)
    deep_tokens: int  # transfer length of the deep shapes (layers x tokens bounds the oracle's index arrays)
    layers: tuple[int, int] = (126, 61)  # host_offset shape, deep shape
    page_sizes: tuple[int, ...] = (48, 24, 12, 3, 16, 64)  # non-powers of two first
    max_row_bytes: int = 256  # the device_pool shape's rows (2^24 rows x 256 B x 2 = 8 GiB per storage)


PRODUCTION = ScaleTargets(device_rows=(1 << 24) + 4096, mid_device_rows=(1 << 16) + 2048, host_offset=1 << 32,
                          tokens=(1 << 16) + 4096, deep_tokens=2048)
SIMULATED = ScaleTargets(device_rows=(1 << 12) + 96, mid_device_rows=(1 << 9) + 48, host_offset=1 << 22,
                         tokens=(1 << 10) + 96, deep_tokens=96, layers=(9, 5))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _spread(count: int, available: int, rng: random.Random) -> list[int]:
    """`count` distinct ids from [1, available) spread over the whole range, the last one included."""
    count = min(count, available - 1)
    ids = {available - 1}
    ids.update(int(x) for x in np.linspace(1, available - 1, num=count, dtype=np.int64))
    spare = [i for i in range(1, min(available, 4 * count + 2)) if i not in ids]
    rng.shuffle(spare)
    while len(ids) < count and spare:
        ids.add(spare.pop())
    ordered = sorted(ids)
    return ordered[::-1] if rng.random() < 0.5 else ordered


def _geometry(base: Case, shape: str, targets: ScaleTargets, page_size: int, rng: random.Random) -> Case:
    ps = page_size
    per_token_layer = sum(p.row_bytes(c) for p in base.pools for c in p.components)
    if shape == "device_pool":
        layers = 1 if base.scope is Scope.ALL_LAYERS else 2
        pages = -(-targets.tokens // ps) + 1
        device_rows = _round_up(targets.device_rows, ps) + ps
        host_slots = (pages + 1) * ps
    elif shape == "host_offset":
        layers = targets.layers[0]
        pages = max(4, targets.deep_tokens // ps // 4)
        host_slots = _round_up(-(-targets.host_offset // (layers * per_token_layer)), ps) + 2 * ps
        device_rows = (pages + 2) * ps
    else:
        layers = targets.layers[1]
        pages = max(2, targets.deep_tokens // ps)
        device_rows = _round_up(targets.mid_device_rows, ps) + ps
        host_slots = (pages + 3) * ps
    host_pages = _spread(pages, host_slots // ps, rng) if shape == "host_offset" else list(
        range(host_slots // ps - 1, host_slots // ps - 1 - pages, -1))
    device_pages = _spread(pages, device_rows // ps, rng)
    pages = min(len(host_pages), len(device_pages))
    host = tuple(p * ps + t for p in host_pages[:pages] for t in range(ps))
    device = tuple(p * ps + t for p in device_pages[:pages] for t in range(ps))
    layer = layers - 1 if base.scope is Scope.ONE_LAYER else 0
    return base.replace(layers=layers, page_size=ps, device_rows=device_rows, host_slots=host_slots, layer=layer,
                        host_indices=host, device_indices=device, note=f"scale tier: {shape}")


def scale_case(seed: int, number: int, backend: Backend, space: CaseSpace, platform: Platform,
               targets: ScaleTargets, profile: TransferProfile) -> Case | None:
    """Scale case `number` of `backend` (None if no candidate of its shape is a transfer the contract accepts)."""
    shape = SHAPES[number % len(SHAPES)]
    rng = random.Random(f"hicache-fuzz-scale:{seed}:{number}")
    small = space.narrowed(max_pools=1, byte_budget=1 << 20, page_sizes=(1,), layer_counts=(1,))
    if shape != "host_offset":  # pools of 2^16..2^24 rows per layer: narrow rows keep the case under its limit
        rows = tuple(r for r in space.row_bytes if r <= targets.max_row_bytes) or space.row_bytes[:1]
        small = small.narrowed(row_bytes=rows, row_bytes_growth=(), grow_every=0)
    page_sizes = list(targets.page_sizes) if shape == "deep" else [targets.page_sizes[-2], targets.page_sizes[-1]]
    for attempt in range(12):
        knobs = profile.space_for(small, seed, -1 - number * 16 - attempt)
        base = candidate(seed, -1 - number, attempt, knobs)
        if not base.pools:
            continue
        for page_size in page_sizes:
            try:
                case = _geometry(base, shape, targets, page_size, rng)
            except CaseError:  # over the case size limit with this pool: the next candidate
                continue
            if case_class(case, backend, platform) == "transfer":
                return case
    return None


@dataclass
class ScaleReach:
    """The largest sizes a campaign's byte-compared transfers reached."""

    device_rows: int = 0
    host_offset: int = 0  # largest host byte offset a transfer touched (end of the row, exclusive)
    host_storage_bytes: int = 0
    tokens: int = 0
    layers: int = 0
    page_sizes_not_power_of_two: set[int] = field(default_factory=set)
    scale_cases: int = 0
    scale_seconds: float = 0.0
    shapes: dict[str, int] = field(default_factory=dict)

    def add(self, case: Case) -> None:
        self.device_rows = max(self.device_rows, case.device_rows)
        self.tokens = max(self.tokens, len(case.host_indices))
        self.layers = max(self.layers, case.layers)
        if case.page_size & (case.page_size - 1):
            self.page_sizes_not_power_of_two.add(case.page_size)
        host_bytes = sum(layouts.host_bytes(case, p) for p in case.pools)
        self.host_storage_bytes = max(self.host_storage_bytes, host_bytes)
        if host_bytes > self.host_offset:  # only then can this case raise the offset reached
            self.host_offset = max(self.host_offset, host_offset_reached(case))

    def to_dict(self, register_chunk_bytes: int) -> dict[str, object]:
        return {
            "largest_device_pool_rows": self.device_rows,
            "largest_host_byte_offset": self.host_offset,
            "host_offset_past_2_31": self.host_offset > 1 << 31,
            "host_offset_past_2_32": self.host_offset > 1 << 32,
            "largest_host_storage_bytes": self.host_storage_bytes,
            "host_register_chunk_bytes": register_chunk_bytes,
            "registration_chunks_of_largest_host_storage": math.ceil(self.host_storage_bytes / register_chunk_bytes)
            if register_chunk_bytes else 0,
            "longest_transfer_tokens": self.tokens,
            "max_layers": self.layers,
            "page_sizes_not_power_of_two": sorted(self.page_sizes_not_power_of_two),
            "scale_cases": self.scale_cases,
            "scale_seconds": round(self.scale_seconds, 3),
            "scale_shapes": dict(self.shapes),
        }


def host_offset_reached(case: Case) -> int:
    """One past the largest host byte offset (in the payload) the case's host indices address."""
    tokens = np.asarray(case.host_indices, dtype=np.int64)
    if tokens.size == 0:
        return 0
    tokens = tokens[(tokens >= 0) & (tokens < case.host_slots)]
    if tokens.size == 0:
        return 0
    layers = np.asarray(case.moved_layers, dtype=np.int64)
    reached = 0
    for pool in case.pools:
        for component in pool.components:
            starts, width = layouts.host_row_chunks(case, pool, component, layers, tokens)
            reached = max(reached, int(starts.max()) + width)
    return reached
