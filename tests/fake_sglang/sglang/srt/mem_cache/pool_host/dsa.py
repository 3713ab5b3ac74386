"""Fake DSA indexer host pool: sglang's declaration (``make_dsa_indexer_pool_decl``: indices and layout from KV,
owned layers from ``skip_topk_layers``), builder and constructor; host tensors ``(L, P', page_bytes)`` (layer_first)
or ``(P', L, 1, page_bytes)`` (page_first, page_first_direct) with ``P' = (size + page_size + 1) // page_size``;
compact host layers (the device pool's owned layers that own index keys, then one per packed draft pool); whole
pages moved by page ids taken from the first token of each page; kernel io only for page rows of 8-byte multiples
("Unsupported IO backend" otherwise); the layouts each io backend moves, as sglang's.

Over a layer-sharded device pool (``layer_shard_enabled``: the owned range is ``_owned_local_layer_range()``, as
sglang's base pool reads it) the host layers are the owned range's index layers only, and a back-up goes layer by
layer as sglang's sharded branch: each owned index layer, then each packed draft, on layer_first only (the kernel
io's per-layer op, or transfer_kv_direct); on page_first and page_first_direct it raises sglang's ValueError.

``FAKE_SGLANG_POOL_BUG`` plants one bug:

* ``dsa_tail``: a back-up also writes the first page past the anchor's capacity (never addressed);
* ``dsa_layers``: a load of target device layer l reads host layer l where there is one, not l's compact host
  layer (its rank among the layers that own index keys);
* ``dsa_shard_range``: the live layers are taken from ``range(owned_end - owned_start)`` (the owned range's start
  dropped), so a rank other than the first keeps and moves the first ranks' layers;
* ``dsa_shard_drafts``: the layer-sharded back-up leaves the packed draft layers out;
* ``dsa_shard_page_first``: the layer-sharded kernel back-up moves page_first layers (as a per-layer LF->PF kernel
  would) instead of raising.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang._fake_core import pairs
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.mem_cache.pool_host.base import HostPool, planted_bug
from sglang.srt.mem_cache.pool_host.host_pool_decl import HostPoolDecl, HostPoolStorageInfo


def dsa_indexer_bytes_per_token_per_layer(*, index_head_dim: int, quant_block_size: int) -> int:
    return index_head_dim + index_head_dim // quant_block_size * 4


class DSAIndexerHostPoolBuilder:
    def validate(self, *, decl: HostPoolDecl, transfer_page_size: int,
                 packed_draft_device_pools: tuple[Any, ...]) -> None:
        target = (decl.device_pool.index_head_dim, decl.device_pool.quant_block_size)
        for draft in packed_draft_device_pools:
            if (draft.index_head_dim, draft.quant_block_size) != target:
                raise ValueError(f"{decl.pool_name}: packed index key format differs from target")

    def build(self, *, decl: HostPoolDecl, anchor_host: Any, allocator_type: str,
              packed_draft_device_pools: tuple[Any, ...]) -> DSAIndexerPoolHost:
        return DSAIndexerPoolHost(decl=decl, anchor_host=anchor_host,
                                  packed_draft_device_pools=packed_draft_device_pools, allocator_type=allocator_type)


def make_dsa_indexer_pool_decl(pool: Any, *, name: PoolName = PoolName.INDEXER) -> HostPoolDecl:
    page_bytes = pool.index_page_size * dsa_indexer_bytes_per_token_per_layer(
        index_head_dim=pool.index_head_dim, quant_block_size=pool.quant_block_size)
    assert page_bytes % pool.page_size == 0
    return HostPoolDecl(pool_name=name, device_pool=pool, indices_from_pool=PoolName.KV, layout_source=PoolName.KV,
                        storage_info=HostPoolStorageInfo(bytes_per_token_per_layer=page_bytes // pool.page_size,
                                                         dtype=DSATokenToKVPool.index_k_with_scale_buffer_dtype),
                        host_pool_builder=DSAIndexerHostPoolBuilder(),
                        owned_device_layers=tuple(i for i, skip in enumerate(pool.skip_topk_layers) if not skip))


class DSAIndexerPoolHost(HostPool):
    def __init__(self, decl: HostPoolDecl, anchor_host: Any, *, packed_draft_device_pools: tuple[Any, ...] = (),
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default",
                 is_dummy: bool = False) -> None:
        device_pool = decl.device_pool
        assert decl.storage_info is not None
        self.decl, self.device_pool = decl, device_pool
        self.page_size, self.layout, self.device = anchor_host.page_size, anchor_host.layout, device
        self.pin_memory, self.start_layer, self.end_layer = pin_memory, device_pool.start_layer, device_pool.end_layer
        owned_start, owned_end = self._device_owned_layer_range()
        owned_range = (range(owned_end - owned_start) if planted_bug() == "dsa_shard_range"
                       else range(owned_start, owned_end))
        declared = decl.owned_device_layers
        self._live = [layer for layer in owned_range if declared is None or layer in declared]
        self._host_layer = {layer: i for i, layer in enumerate(self._live)}
        self.target_layer_num = len(self._live)
        self.mtp_draft_device_pools = tuple(packed_draft_device_pools)
        self.layer_num = self.target_layer_num + len(self.mtp_draft_device_pools)
        self.size, self.page_num = anchor_host.size, anchor_host.page_num
        self.indexer_page_stride_size = decl.storage_info.page_bytes(self.page_size)
        self.indexer_page_num = (self.size + self.page_size + 1) // self.page_size
        self.size_per_token = decl.storage_info.bytes_per_token_per_layer * self.layer_num
        self.device_buffers = [device_pool.index_k_with_scale_buffer[layer] for layer in self._live] + [
            buffer for pool in self.mtp_draft_device_pools for buffer in pool.index_k_with_scale_buffer]
        if self.layout == "layer_first":
            dims: tuple[int, ...] = (self.layer_num, self.indexer_page_num, self.indexer_page_stride_size)
        elif self.layout in ("page_first", "page_first_direct"):
            dims = (self.indexer_page_num, self.layer_num, 1, self.indexer_page_stride_size)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.index_k_with_scale_buffer = torch.zeros(dims, dtype=decl.storage_info.dtype)
        self.can_use_write_back_jit = self.layout == "page_first" and self.indexer_page_stride_size % 16 == 0
        self.clear()

    def _is_device_layer_owned(self, device_pool: Any, layer_id: int) -> bool:
        return layer_id in self._host_layer

    def _host_layer_index(self, layer_id: int, device_pool: Any = None) -> int:
        return self._host_layer[layer_id]

    def _owned_device_layer_ids(self, device_pool: Any) -> list[int]:
        return list(self._live)

    def _draft_host_layer(self, layer_id: int) -> int:
        return self.target_layer_num + (layer_id - self.device_pool.layer_num)

    def _host_pages(self, host_layer: int) -> torch.Tensor:
        buffer = self.index_k_with_scale_buffer
        return buffer[host_layer] if self.layout == "layer_first" else buffer[:, host_layer, 0]

    def _page_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if host_indices.numel() % self.page_size:
            raise ValueError("Index buffer transfer expects page-aligned indices for DSA.")
        ps = self.page_size
        return host_indices.reshape(-1, ps)[:, 0] // ps, device_indices.reshape(-1, ps)[:, 0] // ps

    def _check_io(self, io_backend: str) -> None:
        if io_backend == "kernel" and self.indexer_page_stride_size % 8 == 0:
            layouts: tuple[str, ...] = ("layer_first", "page_first")
        elif io_backend == "direct":
            layouts = ("layer_first", "page_first_direct")
        else:
            raise ValueError(f"Unsupported IO backend: {io_backend}")
        if self.layout not in layouts:
            raise ValueError(f"Unsupported layout: {self.layout}")

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str, *, is_draft: bool = False) -> None:
        if not is_draft and not self._is_device_layer_owned(device_pool, layer_id):
            return
        host_layer = self._draft_host_layer(layer_id) if is_draft else self._host_layer_index(layer_id)
        if planted_bug() == "dsa_layers" and not is_draft and layer_id < self.layer_num:
            host_layer = layer_id
        host_pages, device_pages = self._page_indices(host_indices, device_indices)
        self._check_io(io_backend)
        source, destination = self._host_pages(host_layer), device_pool.index_k_with_scale_buffer[
            0 if is_draft else layer_id]
        for d, h in pairs(device_pages, host_pages):
            destination[d].copy_(source[h])

    def _backup_from_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                      device_indices: torch.Tensor, layer_id: int, io_backend: str, *,
                                      is_draft: bool = False) -> None:
        """sglang's layer-sharded back-up of one layer (pool_host/dsa.py): layer_first only, sglang's errors else."""
        host_layer = self._draft_host_layer(layer_id) if is_draft else self._host_layer_index(layer_id)
        host_pages, device_pages = self._page_indices(host_indices, device_indices)
        if io_backend == "kernel" and self.indexer_page_stride_size % 8 == 0:
            if self.layout == "page_first" and planted_bug() != "dsa_shard_page_first":
                raise ValueError("Layer-sharded DSA indexer HiCache backup with page_first layout is not supported "
                                 "without a per-layer LF->PF kernel.")
            if self.layout not in ("layer_first", "page_first"):
                raise ValueError(f"Unsupported layout: {self.layout}")
        elif io_backend == "direct":
            if self.layout != "layer_first":
                raise ValueError(f"Layer-sharded direct DSA indexer backup only supports layer_first layout, got "
                                 f"{self.layout}")
        else:
            raise ValueError(f"Unsupported IO backend: {io_backend}")
        source = device_pool.index_k_with_scale_buffer[0 if is_draft else layer_id]
        destination = self._host_pages(host_layer)
        for h, d in pairs(host_pages, device_pages):
            destination[h].copy_(source[d])

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        if self._is_device_layer_sharded(device_pool):
            for layer_id in self._owned_device_layer_ids(device_pool):
                self._backup_from_device_per_layer(device_pool, host_indices, device_indices, layer_id, io_backend)
            if planted_bug() == "dsa_shard_drafts":  # the bug: the packed draft layers are left out
                return
            for depth, draft_pool in enumerate(self.mtp_draft_device_pools):
                self._backup_from_device_per_layer(draft_pool, host_indices, device_indices,
                                                   self.device_pool.layer_num + depth, io_backend, is_draft=True)
            return
        host_pages, device_pages = self._page_indices(host_indices, device_indices)
        self._check_io(io_backend)
        index_pairs = pairs(host_pages, device_pages)
        if planted_bug() == "dsa_tail":
            index_pairs.append((self.page_num, int(device_pages[0])))
        for host_layer, source in enumerate(self.device_buffers):
            destination = self._host_pages(host_layer)
            for h, d in index_pairs:
                destination[h].copy_(source[d])

    def destroy(self) -> None:
        self.index_k_with_scale_buffer = None
