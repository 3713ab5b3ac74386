"""Fake MiniMax M3 NVFP4 page-row host pools: sglang's constructor signatures, one ``row_bytes`` row per (layer,
page) in ``(L, P, row)`` (layer_first) or ``(P, L, 1, row)`` (page_first, page_first_direct), transfers of whole
pages after ``prepare_transfer_indices`` turned token indices into page ids, and loads of draft layers or layer ids
outside the pool raising (as sglang's).

``FAKE_SGLANG_POOL_BUG=page_rows`` plants a bug: a back-up does not write the last page it is given.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.mem_cache.pool_host.base import HostPool, planted_bug

_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class MiniMaxM3Nvfp4IndexKPoolHost(HostPool):
    def __init__(self, buffer_info: Any, anchor_host: Any, layout: str, pin_memory: bool = True,
                 device: str = "cpu", allocator_type: str = "default", *, start_layer: int, end_layer: int) -> None:
        if layout not in _LAYOUTS:
            raise ValueError(f"MiniMax NVFP4 HiCache does not support layout {layout!r}")
        self.page_size = anchor_host.page_size
        if self.page_size != buffer_info.page_size:
            raise ValueError("MiniMax NVFP4 host/device page sizes must match")
        self._configure(buffer_info, layout, device, pin_memory, start_layer, end_layer)
        self.size, self.page_num = anchor_host.size, anchor_host.page_num
        self._allocate()

    def _configure(self, info: Any, layout: str, device: str, pin_memory: bool, start: int, end: int) -> None:
        info.validate()
        self.layout, self.device, self.pin_memory = layout, device, pin_memory
        self.start_layer, self.end_layer = start, end
        self.target_layer_num = self.layer_num = len(info.rows)
        self.row_bytes, self.device_rows = info.row_bytes, info.rows
        self.device_slots = info.num_pages * info.page_size
        self.can_use_write_back_jit = False

    def _allocate(self) -> None:
        dims = ((self.layer_num, self.page_num, self.row_bytes) if self.layout == "layer_first"
                else (self.page_num, self.layer_num, 1, self.row_bytes))
        self.kv_buffer = torch.zeros(dims, dtype=torch.uint8)
        self.size_per_token = self.layer_num * self.row_bytes // self.page_size
        self.clear()

    def _host_layer_pages(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id] if self.layout == "layer_first" else self.kv_buffer[:, layer_id, 0]

    def prepare_transfer_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 io_backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        if io_backend not in ("kernel", "direct"):
            raise ValueError(f"Unsupported IO backend: {io_backend}")
        ps = self.page_size
        if host_indices.numel() != device_indices.numel() or host_indices.numel() % ps:
            raise ValueError("MiniMax NVFP4 HiCache transfers require equal, full-page index lists.")
        pages = []
        for indices, capacity in ((host_indices.cpu(), self.size), (device_indices.cpu(), self.device_slots)):
            rows = indices.reshape(-1, ps)
            starts = rows[:, 0]
            if not ((starts % ps == 0).all() and (rows == starts[:, None] + torch.arange(ps)).all()
                    and (indices >= 0).all() and (indices < capacity).all()):
                raise ValueError("MiniMax NVFP4 HiCache requires aligned, ordered, in-range full pages.")
            pages.append(starts // ps)
        return pages[0], pages[1]

    def _copy(self, layer_id: int, host_pages: torch.Tensor, device_pages: torch.Tensor, *, load: bool) -> None:
        host, device = self._host_layer_pages(layer_id), self.device_rows[layer_id]
        for h, d in zip(host_pages.tolist(), device_pages.tolist(), strict=True):
            if load:
                device[d].copy_(host[h])
            else:
                host[h].copy_(device[d])

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        self.backup_from_device_all_layer_physical(
            device_pool, *self.prepare_transfer_indices(host_indices, device_indices, io_backend), io_backend)

    def backup_from_device_all_layer_physical(self, device_pool: Any, host_pages: torch.Tensor,
                                              device_pages: torch.Tensor, io_backend: str) -> None:
        if planted_bug() == "page_rows":
            host_pages, device_pages = host_pages[:-1], device_pages[:-1]
        for layer_id in range(self.layer_num):
            self._copy(layer_id, host_pages, device_pages, load=False)

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str, *, is_draft: bool = False) -> None:
        pages = self.prepare_transfer_indices(host_indices, device_indices, io_backend)
        self.load_to_device_per_layer_physical(device_pool, *pages, layer_id, io_backend, is_draft=is_draft)

    def load_to_device_per_layer_physical(self, device_pool: Any, host_pages: torch.Tensor,
                                          device_pages: torch.Tensor, layer_id: int, io_backend: str, *,
                                          is_draft: bool = False) -> None:
        if is_draft:
            raise ValueError("M3.1 NVFP4 HiCache supports only the base model")
        if not 0 <= layer_id < self.layer_num:
            raise ValueError("M3.1 NVFP4 HiCache layer is out of range")
        self._copy(layer_id, host_pages, device_pages, load=True)


class MiniMaxM3Nvfp4MainKVPoolHost(MiniMaxM3Nvfp4IndexKPoolHost):
    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: float, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default", *,
                 device_capacity_tokens: int, start_layer: int, end_layer: int, pool_label: str = "kv") -> None:
        if layout not in _LAYOUTS:
            raise ValueError(f"Unsupported MiniMax NVFP4 host layout: {layout}")
        if page_size != buffer_info.page_size:
            raise ValueError("MSA-v1 NVFP4 main HiCache requires matching page sizes")
        self.page_size = page_size
        self._configure(buffer_info, layout, device, pin_memory, start_layer, end_layer)
        size = (int(device_capacity_tokens * host_to_device_ratio) // page_size + 1) * page_size
        self.size, self.page_num = size, size // page_size
        self._allocate()


