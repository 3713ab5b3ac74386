"""Fake HiCacheController: sglang's constructor signature and the methods the harness drives (write, load,
start_writing, start_loading, evict_host, and the index placement the standalone pool scripts call unbound).
Transfers run at once on the CPU as L2 transfers (pool, device pool, indices, layer mapper, draft flag) through
the host pool's prepare_transfer_indices and *_physical methods, as sglang's L2 transfer engine calls them; the
acks carry an event whose synchronize() returns at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch


class _DoneEvent:
    def synchronize(self) -> None:
        return None


class L2Transfer(NamedTuple):
    host_pool: Any
    device_pool: Any
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    layer_mapper: Callable[[int], int | None] | None = None
    is_draft: bool = False


def _prepared(transfers: list[L2Transfer], io_backend: str) -> list[L2Transfer]:
    out = []
    for t in transfers:
        host, device = t.host_pool.prepare_transfer_indices(t.host_indices, t.device_indices, io_backend)
        out.append(t._replace(host_indices=host, device_indices=device))
    return out


def submit_device_to_host(transfers: list[L2Transfer], io_backend: str) -> None:
    for t in _prepared(transfers, io_backend):
        t.host_pool.backup_from_device_all_layer_physical(t.device_pool, t.host_indices, t.device_indices,
                                                          io_backend)


def submit_host_to_device(transfers: list[L2Transfer], io_backend: str, transfer_layer_id_max: int) -> None:
    prepared = _prepared(transfers, io_backend)
    for layer_id in range(transfer_layer_id_max):
        for t in prepared:
            local = t.layer_mapper(layer_id) if t.layer_mapper is not None else layer_id
            if local is None:
                continue
            t.host_pool.load_to_device_per_layer_physical(t.device_pool, t.host_indices, t.device_indices, local,
                                                          io_backend, is_draft=t.is_draft)


def _pool_transfers(ops: list[SimpleNamespace]) -> list[Any] | None:
    """The queued operations' side-pool transfers, one after another (sglang merges those of one pool)."""
    return [t for op in ops for t in (op.pool_transfers or [])] or None


class HiCacheController:
    io_backend: str
    device: Any
    mem_pool_host: Any

    def __init__(self, token_to_kv_pool_allocator: Any, mem_pool_host: Any, page_size: int, tp_group: Any,
                 load_cache_event: threading.Event, attn_cp_group: Any = None, attn_tp_group: Any = None,
                 pp_group: Any = None, write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: str | None = None, prefetch_threshold: int = 256, model_name: str | None = None,
                 storage_backend_extra_config: dict[str, Any] | None = None, enable_storage_metrics: bool = False,
                 host_memory_mode: str = "cache") -> None:
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.mem_pool_host, self.page_size, self.io_backend = mem_pool_host, page_size, io_backend
        self.device = self.mem_pool_device.device
        self.transfer_layer_id_max = self.mem_pool_device.layer_num
        self.mem_pool_device.register_layer_transfer_counter(SimpleNamespace(num_layers=self.transfer_layer_id_max))
        if write_policy not in ("write_through", "write_through_selective", "write_back"):
            raise ValueError(f"Invalid write policy: {write_policy}")
        self.write_queue: list[SimpleNamespace] = []
        self.load_queue: list[SimpleNamespace] = []
        self.ack_write_queue: list[SimpleNamespace] = []
        self.ack_load_queue: list[SimpleNamespace] = []

    def write(self, device_indices: torch.Tensor, priority: int | None = None, node_id: int = -1,
              extra_pools: Any = None) -> torch.Tensor | None:
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.write_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                                pool_transfers=None))
        self.start_writing()
        return host_indices

    def start_writing(self) -> None:
        if not self.write_queue:
            return
        op = SimpleNamespace(host_indices=torch.cat([o.host_indices for o in self.write_queue]),
                             device_indices=torch.cat([o.device_indices for o in self.write_queue]),
                             pool_transfers=_pool_transfers(self.write_queue))
        host_indices, device_indices, transfers = self._move_write_operation(op)
        self.write_queue.clear()
        submit_device_to_host(self._l2_transfers(host_indices, device_indices, transfers), self.io_backend)
        self.ack_write_queue.append(SimpleNamespace(finish_event=_DoneEvent()))

    def _l2_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                      pool_transfers: Any = None) -> list[L2Transfer]:
        return [L2Transfer(self.mem_pool_host, self.mem_pool_device, host_indices, device_indices)]

    def _l2_load_transfers(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                           pool_transfers: Any = None) -> list[L2Transfer]:
        return self._l2_transfers(host_indices, device_indices, pool_transfers)

    def load(self, host_indices: torch.Tensor, priority: int | None = None, node_id: int = -1) -> torch.Tensor | None:
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.load_queue.append(SimpleNamespace(host_indices=host_indices, device_indices=device_indices,
                                               pool_transfers=None))
        return device_indices

    def start_loading(self) -> int:
        if not self.load_queue:
            return -1
        op = SimpleNamespace(host_indices=torch.cat([o.host_indices for o in self.load_queue]),
                             device_indices=torch.cat([o.device_indices for o in self.load_queue]),
                             pool_transfers=_pool_transfers(self.load_queue))
        host_indices, device_indices, transfers = self._move_op_indices(op)
        self.load_queue.clear()
        submit_host_to_device(self._l2_load_transfers(host_indices, device_indices, transfers), self.io_backend,
                              self.transfer_layer_id_max)
        self.ack_load_queue.append(SimpleNamespace(finish_event=_DoneEvent()))
        return 0

    def evict_host(self, host_indices: torch.Tensor, backup_only: bool = True) -> int:
        if not backup_only:
            raise ValueError("Other eviction policies are not supported yet.")
        self.mem_pool_host.free(host_indices)
        return len(host_indices)

    def move_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.io_backend == "direct":
            layout = self.mem_pool_host.layout
            if layout == "layer_first":
                host_indices, order = host_indices.sort()
                return host_indices, device_indices.cpu().index_select(0, order)
            if layout == "page_first_direct":
                return host_indices, device_indices.cpu()
            raise ValueError(f"Unsupported layout {layout!r} for io backend 'direct'")
        return host_indices.to(self.device), device_indices

    def _move_op_indices(self, op: Any) -> tuple[Any, ...]:
        return (*self.move_indices(op.host_indices, op.device_indices), None)

    def _move_write_operation(self, op: Any) -> tuple[Any, ...]:
        if (self.io_backend == "kernel" and self.mem_pool_host.layout == "page_first"
                and getattr(self.mem_pool_host, "can_use_write_back_jit", False)):
            return op.host_indices, op.device_indices.to(self.device), op
        return self._move_op_indices(op)
