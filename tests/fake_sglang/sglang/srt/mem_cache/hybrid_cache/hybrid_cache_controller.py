"""Fake HybridCacheController: a HostPoolGroup as the host pool, allocation through the group (a write whose side
pools the group refuses gives the anchor's grant back and returns None), sidecar transfers (``extra_pools`` riding
on the KV transfer's indices) moved with the anchor's, per-pool index placement, and the packed draft layers of
every pool loaded as transfers of their own (is_draft=True) after the target's.

``FAKE_SGLANG_POOL_BUG`` plants one bug: ``side_write`` (every transfer also moves the group's side pools at the
anchor's indices), ``side_refusal_keeps_anchor`` (a write the group refuses keeps the anchor's grant allocated),
``side_first_only`` (a transfer moves only the first side-pool transfer it names)."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from sglang.srt.managers.cache_controller import HiCacheController, L2Transfer, LayerDoneCounter
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.pool_host.base import planted_bug


class HybridCacheController(HiCacheController):
    def __init__(self, token_to_kv_pool_allocator: Any, mem_pool_host: Any, page_size: int, tp_group: Any,
                 load_cache_event: threading.Event, attn_cp_group: Any = None, attn_tp_group: Any = None,
                 pp_group: Any = None, write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: str | None = None, prefetch_threshold: int = 256, model_name: str | None = None,
                 storage_backend_extra_config: dict[str, Any] | None = None,
                 transfer_layer_id_max: int | None = None, enable_storage_metrics: bool = False,
                 host_memory_mode: str = "cache") -> None:
        super().__init__(token_to_kv_pool_allocator, mem_pool_host, page_size, tp_group, load_cache_event,
                         write_policy=write_policy, io_backend=io_backend)
        # transfer ids span every pool of the group, so the counter has one event per transfer id (as sglang)
        if transfer_layer_id_max is not None and transfer_layer_id_max != self.transfer_layer_id_max:
            self.transfer_layer_id_max = transfer_layer_id_max
            self.layer_done_counter = LayerDoneCounter(self.transfer_layer_id_max)

    def write(self, device_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
              extra_pools: Any = None, flush: bool = True, start_owner: int | None = None) -> torch.Tensor | None:
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        transfers = self.mem_pool_host.resolve_host_transfers(extra_pools, primary_device_indices=device_indices,
                                                              primary_host_indices=host_indices)
        if transfers is None and extra_pools:  # a side pool refused: the anchor's grant is given back
            if planted_bug() != "side_refusal_keeps_anchor":  # the bug: the anchor's grant stays allocated
                self.mem_pool_host.free(host_indices)
            return None
        self.write_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                                pool_transfers=transfers))
        if flush:
            self.start_writing()
        return host_indices

    def _move_pool_indices(self, host_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor, *,
                           write_back_jit: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if write_back_jit and getattr(host_pool, "can_use_write_back_jit", False):
            return (host_indices.cpu() if host_indices.is_cuda else host_indices), device_indices
        return self.move_indices(host_indices, device_indices)

    def move_hybrid_indices(self, op: Any, *, write_back_jit: bool = False) -> tuple[Any, ...]:
        """Each pool's share placed by its own flag: the anchor's indices, then every sidecar transfer's."""
        group = self.mem_pool_host
        host, device = self._move_pool_indices(group.anchor_entry.host_pool, op.host_indices, op.device_indices,
                                               write_back_jit=write_back_jit)
        transfers = None
        if op.pool_transfers:
            transfers = []
            for transfer in op.pool_transfers:
                moved = self._move_pool_indices(group.entry_map[transfer.name].host_pool, transfer.host_indices,
                                                transfer.device_indices, write_back_jit=write_back_jit)
                transfers.append(replace(transfer, host_indices=moved[0], device_indices=moved[1]))
        return host, device, transfers

    def _move_op_indices(self, op: Any) -> tuple[Any, ...]:
        return self.move_hybrid_indices(op)

    def _move_write_operation(self, op: Any) -> tuple[Any, ...]:
        """sglang's placement: the group's flags first (no child JIT-capable: moved; all: kept), then per pool."""
        group = self.mem_pool_host
        if self.io_backend != "kernel" or group.layout != "page_first":
            return self.move_hybrid_indices(op)
        if not group.supports_per_pool_backup_indices:
            if not group.can_use_write_back_jit:
                return self.move_hybrid_indices(op)
            return op.host_indices, op.device_indices, op.pool_transfers
        return self.move_hybrid_indices(op, write_back_jit=True)

    def _l2_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                      pool_transfers: Any = None) -> list[L2Transfer]:
        group = self.mem_pool_host
        anchor = group.anchor_entry
        transfers = []
        if host_indices.numel() > 0:
            transfers.append(L2Transfer(anchor.host_pool, anchor.device_pool, host_indices, device_indices,
                                        anchor.layer_mapper))
        for number, transfer in enumerate(pool_transfers or []):
            if number and planted_bug() == "side_first_only":  # the bug: only the first side-pool transfer moves
                break
            if transfer.host_indices is None or transfer.device_indices is None:
                raise ValueError(f"Unresolved L2 transfer for {transfer.name}.")
            if transfer.host_indices.numel() == 0 and transfer.device_indices.numel() == 0:
                continue
            entry = group.entry_map[transfer.name]
            transfers.append(L2Transfer(entry.host_pool, entry.device_pool, transfer.host_indices,
                                        transfer.device_indices, entry.layer_mapper))
        if planted_bug() == "side_write":  # the bug: side pools move with every transfer (loads too)
            transfers += [L2Transfer(e.host_pool, e.device_pool, host_indices, device_indices, e.layer_mapper)
                          for e in group.entries if e is not anchor]
        return transfers

    def _l2_load_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                           pool_transfers: Any = None) -> list[L2Transfer]:
        transfers = self._l2_transfers(host_indices, device_indices, pool_transfers)
        by_pools = {(id(t.host_pool), id(t.device_pool)): t for t in transfers}
        for entry in self.mem_pool_host.entry_map.values():
            target = by_pools.get((id(entry.host_pool), id(entry.device_pool)))
            if target is None or target.layer_mapper is None:
                continue
            for depth, draft_pool in enumerate(entry.packed_draft_device_pools):
                host_layer = target.layer_mapper(self.transfer_layer_id_max + depth)
                if host_layer is None:
                    continue
                at = min(depth, self.transfer_layer_id_max - 1)
                transfers.append(L2Transfer(target.host_pool, draft_pool, target.host_indices, target.device_indices,
                                            lambda layer, at=at, host=host_layer: host if layer == at else None,
                                            is_draft=True))
        return transfers

    def _resolve_device_transfers(self, extra_pools: Any, kv_device_indices: torch.Tensor,
                                  kv_host_indices: torch.Tensor) -> Any:
        """sglang's: a side-pool transfer that names its host slots and device rows is taken as it is (the fake
        allocates no side-pool device rows); a derived one takes the KV transfer's indices, or its source's."""
        if not extra_pools:
            return None
        for transfer in extra_pools:
            if transfer.indices_from_pool is not None:
                continue
            if transfer.name not in self.mem_pool_host.entry_map:
                continue
            if transfer.device_indices is None and transfer.host_indices is not None:
                raise ValueError("fake sglang: side-pool device rows are not allocated here; name them")
        for transfer in extra_pools:
            if transfer.indices_from_pool is None:
                continue
            if transfer.indices_from_pool == PoolName.KV:
                transfer.host_indices = kv_host_indices
                if transfer.device_indices is None:
                    transfer.device_indices = kv_device_indices
                continue
            source = next((t for t in extra_pools if t.indices_from_pool is None
                           and t.name == transfer.indices_from_pool), None)
            if source is None:
                return None
            transfer.host_indices = source.host_indices
            if transfer.device_indices is None:
                transfer.device_indices = source.device_indices
        return extra_pools

    def load(self, host_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
             extra_pools: Any = None, *, device_indices: torch.Tensor | None = None,
             anchor_indices: torch.Tensor | None = None) -> torch.Tensor | None:
        allocator = getattr(self.mem_pool_device_allocator, "full_attn_allocator", self.mem_pool_device_allocator)
        rows = device_indices if device_indices is not None else allocator.alloc(len(host_indices))
        if rows is None:
            return None
        transfers = self._resolve_device_transfers(extra_pools, rows if anchor_indices is None else anchor_indices,
                                                   host_indices)
        self.load_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=rows,
                                               pool_transfers=transfers))
        return rows
