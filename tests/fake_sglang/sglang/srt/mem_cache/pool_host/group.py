"""Fake HostPoolGroup: an anchor pool and side pools; the facade's staged-path flag is every child's, allocation
goes to one pool (the anchor by default), sidecar transfers riding on the anchor take its indices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class PoolEntry:
    name: Any
    host_pool: Any
    device_pool: Any
    layer_mapper: Callable[[int], int | None]
    is_primary_index_anchor: bool = False
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
        entry = self.anchor_entry if pool is None else self.entry_map[pool]
        return entry.host_pool.alloc(need_size)

    def free(self, indices: Any, *, pool: Any = None) -> int:
        entry = self.anchor_entry if pool is None else self.entry_map[pool]
        return int(entry.host_pool.free(indices))

    def resolve_host_transfers(self, transfers: Any, *, primary_device_indices: Any = None,
                               primary_host_indices: Any = None) -> Any:
        if not transfers:
            return None
        for transfer in transfers:
            if transfer.indices_from_pool != self.anchor_entry.name:
                raise ValueError("fake sglang: only sidecar transfers riding on the anchor's indices")
            transfer.host_indices = primary_host_indices
            if transfer.device_indices is None:
                transfer.device_indices = primary_device_indices
        return transfers
