"""Fake HostPoolGroup: an anchor pool and side pools; the facade's staged-path flag is every child's, allocation
goes to one pool (the anchor by default; an entry's reclaim callback asked once where its pool cannot grant),
side-pool transfers are granted host slots by their own pool, all or none, and sidecar transfers riding on another
take its indices.

``FAKE_SGLANG_POOL_BUG`` plants one bug of ``resolve_host_transfers``:

* ``side_host_swap``: the two index lists of a side-pool transfer swapped in the skip test (mutant bf64a954ca32);
* ``side_one_allocator``: every side-pool transfer is granted by the first side pool's allocator;
* ``side_partial_grant``: a side pool that cannot grant is skipped (its transfer left without host slots) instead
  of refusing the whole resolution;
* ``side_rollback_dropped``: a refusal returns None without giving back the grants made before it (their transfers
  are reset, the slots stay granted);
* ``side_rollback_kept``: a refusal gives those grants back but leaves their transfers holding the host slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.srt.mem_cache.pool_host.base import planted_bug


@dataclass
class PoolEntry:
    name: Any
    host_pool: Any
    device_pool: Any
    layer_mapper: Callable[[int], int | None]
    is_primary_index_anchor: bool = False
    host_evict_fn: Callable[[int], Any] | None = None
    device_evict_fn: Callable[[int], Any] | None = None
    device_alloc_fn: Callable[[int], Any] | None = None
    device_free_fn: Callable[[Any], Any] | None = None
    packed_draft_device_pools: tuple[Any, ...] = ()


class HostPoolGroup:
    def __init__(self, entries: list[PoolEntry]) -> None:
        self.entries = entries
        self.entry_map = {e.name: e for e in entries}
        anchors = [e for e in entries if e.is_primary_index_anchor]
        self.anchor_entry = anchors[0] if anchors else entries[0]
        anchor = self.anchor_entry.host_pool
        self.layout, self.page_size, self.device = anchor.layout, anchor.page_size, anchor.device
        self.size = anchor.size
        self.logical_size = anchor.size

    @property
    def can_use_write_back_jit(self) -> bool:
        return all(getattr(e.host_pool, "can_use_write_back_jit", False) for e in self.entries)

    @property
    def supports_per_pool_backup_indices(self) -> bool:
        return any(getattr(e.host_pool, "can_use_write_back_jit", False) for e in self.entries)

    def alloc(self, need_size: int, *, pool: Any = None, reclaim: Any = None, start_owner: Any = None) -> Any:
        """sglang's: from one pool, reclaiming once (the callback) before a retry."""
        entry = self.anchor_entry if pool is None else self.entry_map[pool]
        indices = entry.host_pool.alloc(need_size)
        if indices is None and reclaim is not None:
            reclaim(need_size)
            indices = entry.host_pool.alloc(need_size)
        return indices

    def free(self, indices: Any, *, pool: Any = None) -> int:
        entry = self.anchor_entry if pool is None else self.entry_map[pool]
        return int(entry.host_pool.free(indices))

    def resolve_host_transfers(self, transfers: Any, *, primary_device_indices: Any = None,
                               primary_host_indices: Any = None) -> Any:
        """sglang's (pool_host/group.py): a side-pool transfer with device rows and no host slots is granted slots
        by its own pool, in pool-name order, all or none (a refusal frees this call's grants and returns None); a
        derived transfer takes its source's indices (the anchor's, or another transfer's)."""
        if not transfers:
            return None
        allocated: list[tuple[Any, Any]] = []
        derived = []

        def rollback() -> None:
            for transfer, indices in allocated:
                if planted_bug() != "side_rollback_dropped":  # the bug: the grants made before the refusal stay
                    self.free(indices, pool=transfer.name)
                if planted_bug() != "side_rollback_kept":  # the bug: their transfers keep the given-back slots
                    transfer.host_indices = None

        sides = [e.name for e in self.entries if e is not self.anchor_entry]

        for transfer in sorted(transfers, key=lambda t: t.name):
            if transfer.indices_from_pool is not None:
                derived.append(transfer)
                continue
            if planted_bug() == "side_host_swap":  # the bug: the two index lists swapped in the skip test
                skip = transfer.device_indices is not None or transfer.host_indices is None
            else:
                skip = transfer.host_indices is not None or transfer.device_indices is None
            if skip:
                continue
            if transfer.name not in self.entry_map:
                continue
            entry = self.entry_map[transfer.name]
            pool = sides[0] if planted_bug() == "side_one_allocator" else transfer.name  # the bug: one allocator
            indices = self.alloc(len(transfer.device_indices), pool=pool, reclaim=entry.host_evict_fn)
            if indices is None and planted_bug() == "side_partial_grant":  # the bug: the refusing pool skipped
                continue
            if indices is None:
                rollback()
                return None
            transfer.host_indices = indices
            allocated.append((transfer, indices))
        for transfer in derived:
            if transfer.indices_from_pool == self.anchor_entry.name:
                transfer.host_indices = primary_host_indices
                if transfer.device_indices is None:
                    transfer.device_indices = primary_device_indices
                continue
            source = next((t for t in transfers if t.indices_from_pool is None
                           and t.name == transfer.indices_from_pool), None)
            if source is None:
                rollback()
                return None
            transfer.host_indices = source.host_indices
            if transfer.device_indices is None:
                transfer.device_indices = source.device_indices
        return transfers

    def release_transfers(self, transfers: Any) -> int:
        """Frees each independently allocated side-pool transfer's host slots once (derived ones share another's)."""
        released = 0
        for transfer in transfers or []:
            if transfer.indices_from_pool is not None or transfer.host_indices is None:
                continue
            released += self.free(transfer.host_indices, pool=transfer.name)
        return released
