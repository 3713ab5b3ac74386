"""Fake pool-entry builder: a layer mapper that skips transfer ids outside [0, transfer_layer_id_max) or unmapped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.mem_cache.pool_host.group import PoolEntry


def build_pool_entry(*, name: Any, host_pool: Any, device_pool: Any, layer_mapping: dict[int, int],
                     transfer_layer_id_max: int, is_anchor: bool = False,
                     host_evict_fn: Callable[[int], Any] | None = None,
                     device_evict_fn: Callable[[int], Any] | None = None,
                     device_alloc_fn: Callable[[int], Any] | None = None,
                     device_free_fn: Callable[[Any], Any] | None = None,
                     packed_draft_device_pools: tuple[Any, ...] = ()) -> PoolEntry:
    def mapper(layer_id: int) -> int | None:
        if not 0 <= layer_id < transfer_layer_id_max:
            return None
        return layer_mapping.get(layer_id)

    return PoolEntry(name=name, host_pool=host_pool, device_pool=device_pool, layer_mapper=mapper,
                     is_primary_index_anchor=is_anchor, host_evict_fn=host_evict_fn,
                     device_evict_fn=device_evict_fn, device_alloc_fn=device_alloc_fn,
                     device_free_fn=device_free_fn, packed_draft_device_pools=packed_draft_device_pools)
