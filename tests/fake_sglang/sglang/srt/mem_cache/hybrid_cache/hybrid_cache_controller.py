"""Fake HybridCacheController: a HostPoolGroup as the host pool, allocation through the group, per-pool index
placement, and the packed draft layers loaded as transfers of their own (is_draft=True) after the target's."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import torch

from sglang.srt.managers.cache_controller import HiCacheController, L2Transfer
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
        if transfer_layer_id_max is not None:
            self.transfer_layer_id_max = transfer_layer_id_max

    def write(self, device_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
              extra_pools: Any = None, flush: bool = True, start_owner: int | None = None) -> torch.Tensor | None:
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.write_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                                pool_transfers=None))
        if flush:
            self.start_writing()
        return host_indices

    def _move_op_indices(self, op: Any) -> tuple[Any, ...]:
        return (*self.move_indices(op.host_indices, op.device_indices), None)

    def _move_write_operation(self, op: Any) -> tuple[Any, ...]:
        """sglang's placement: the group's flags first (no child JIT-capable: moved; all: kept), then per pool."""
        group = self.mem_pool_host
        if self.io_backend != "kernel" or group.layout != "page_first":
            return self._move_op_indices(op)
        if not group.supports_per_pool_backup_indices:
            if not group.can_use_write_back_jit:
                return self._move_op_indices(op)
            return op.host_indices, op.device_indices, None
        if group.anchor_entry.host_pool.can_use_write_back_jit:
            host = op.host_indices.cpu() if op.host_indices.is_cuda else op.host_indices
            return host, op.device_indices, None
        return self._move_op_indices(op)

    def _l2_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                      pool_transfers: Any = None) -> list[L2Transfer]:
        anchor = self.mem_pool_host.anchor_entry
        transfers = [L2Transfer(anchor.host_pool, anchor.device_pool, host_indices, device_indices,
                                anchor.layer_mapper)]
        if planted_bug() == "side_write":  # the bug: side pools no transfer names are backed up too
            transfers += [L2Transfer(e.host_pool, e.device_pool, host_indices, device_indices, e.layer_mapper)
                          for e in self.mem_pool_host.entries if e is not anchor]
        return transfers

    def _l2_load_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                           pool_transfers: Any = None) -> list[L2Transfer]:
        transfers = self._l2_transfers(host_indices, device_indices, pool_transfers)
        target = transfers[0]
        anchor = self.mem_pool_host.anchor_entry
        for depth, draft_pool in enumerate(anchor.packed_draft_device_pools):
            host_layer = target.layer_mapper(self.transfer_layer_id_max + depth)
            if host_layer is None:
                continue
            at = min(depth, self.transfer_layer_id_max - 1)
            transfers.append(L2Transfer(target.host_pool, draft_pool, host_indices, device_indices,
                                        lambda layer, at=at, host=host_layer: host if layer == at else None,
                                        is_draft=True))
        return transfers

    def load(self, host_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
             extra_pools: Any = None, *, device_indices: torch.Tensor | None = None,
             anchor_indices: torch.Tensor | None = None) -> torch.Tensor | None:
        allocator = getattr(self.mem_pool_device_allocator, "full_attn_allocator", self.mem_pool_device_allocator)
        rows = device_indices if device_indices is not None else allocator.alloc(len(host_indices))
        if rows is None:
            return None
        self.load_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=rows, pool_transfers=None))
        return rows
