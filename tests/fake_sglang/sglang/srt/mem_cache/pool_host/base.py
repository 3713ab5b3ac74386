"""Fake host KV pools: sglang's host layouts, its first-in first-out slot allocator with the double-alloc and
double-free checks, per-token backup of every layer and per-layer load with the target-layer guard.

``FAKE_SGLANG_POOL_BUG`` plants one bug for the tests to catch:

* ``page32``: for page sizes >= 32 the last token of every page is not backed up (an off-by-one);
* ``alloc_twice``: ``free`` queues the freed slots twice and ``alloc`` skips its double-alloc check, so a freed
  slot is granted twice;
* ``side_write`` (hybrid_cache_controller.py): every back-up also writes the group's side pools that no transfer
  names; ``mamba_conv`` (pool_host/mamba.py): the Mamba pool does not back up its last layer's conv state;
  ``hisparse_len_row``, ``hisparse_pages_squared``, ``hisparse_empty_int32``, ``hisparse_slot0``
  (pool_host/hisparse.py): the HiSparse request-slot allocation's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from sglang._fake_core import indices, pairs

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def planted_bug() -> str:
    return os.environ.get("FAKE_SGLANG_POOL_BUG", "")


class HostPool:
    components: tuple[str, ...] = ("k", "v")
    separate_halves = False  # K and V in tensors of their own (asymmetric widths)
    layouts: tuple[str, ...] = LAYOUTS
    io_layouts: dict[str, tuple[str, ...]] = {"kernel": ("layer_first", "page_first", "page_head"),  # noqa: RUF012
                                              "direct": ("layer_first", "page_first_direct")}

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default", *,
                 device_capacity_tokens: int, start_layer: int, end_layer: int,
                 draft_buffer_infos: Sequence[Any] = (), pool_label: str = "kv",
                 host_token_capacity: int | None = None, target_layer_num: int | None = None) -> None:
        if layout not in self.layouts:
            raise ValueError(f"{type(self).__name__}: unsupported layout {layout!r}")
        infos = (buffer_info, *draft_buffer_infos)
        self.target_layer_num = buffer_info.layer_num if target_layer_num is None else target_layer_num
        self.layer_num = self.target_layer_num + len(draft_buffer_infos)
        self.page_size, self.layout, self.device, self.pin_memory = page_size, layout, device, pin_memory
        self.start_layer, self.end_layer, self.pool_label = start_layer, end_layer, pool_label
        if host_token_capacity is not None:
            if host_token_capacity <= 0 or host_token_capacity % page_size:
                raise ValueError(f"host token capacity {host_token_capacity} is not page-aligned")
            self.size = host_token_capacity
        else:
            self.size = (int(device_capacity_tokens * host_to_device_ratio) // page_size + 1) * page_size
        self.page_num = self.size // page_size
        if len(self.components) == 2:
            self.device_layers = [[b for info in infos for b in info.k_buffer],
                                  [b for info in infos for b in info.v_buffer]]
        else:
            self.device_layers = [[b for info in infos for b in info.kv_buffer]]
        heads, dtype = buffer_info.head_num, buffer_info.dtype
        widths = [buffer_info.head_dim, getattr(buffer_info, "v_head_dim", buffer_info.head_dim)]
        if layout == "page_unified":
            self._init_page_unified(heads, widths[0], dtype)
            return
        halves = [torch.zeros(self._shape(heads, widths[c]), dtype=dtype) for c in range(len(self.components))]
        if self.separate_halves:
            self.k_buffer, self.v_buffer = halves
            self.kv_buffer: Any = (self.k_buffer, self.v_buffer)
        elif len(self.components) == 2:
            self.kv_buffer = torch.stack(halves)
            self.k_buffer, self.v_buffer = self.kv_buffer[0], self.kv_buffer[1]
        else:
            self.kv_buffer = halves[0]
        self.halves = list(halves) if self.separate_halves or len(self.components) == 1 else [self.k_buffer,
                                                                                              self.v_buffer]
        self.size_per_token = sum(h[0].numel() for h in self.halves) * dtype.itemsize
        row_bytes = [heads * w * torch.empty((), dtype=dtype).element_size() for w in widths]
        self.can_use_write_back_jit = layout == "page_first" and all(r % 16 == 0 for r in row_bytes)
        self.clear()

    def _init_page_unified(self, heads: int, width: int, dtype: torch.dtype) -> None:
        """One tensor of whole page blocks in the layout's byte order (pool_host/page_unified.py); no per-component
        halves, no per-layer host views (mha.py), no staged write-back and no transfer branch in any pool."""
        layout = self._page_unified_layout(heads, width, dtype)
        self.page_unified_layout = layout
        self.kv_buffer = torch.zeros(layout.page_dims(self.page_num), dtype=dtype)
        self.halves = []
        self.size_per_token = layout.bytes_per_page // self.page_size
        self.can_use_write_back_jit = False
        self.clear()

    def _page_unified_layout(self, heads: int, width: int, dtype: torch.dtype) -> Any:
        raise ValueError(f"Unsupported layout: {self.layout}")

    def _shape(self, heads: int, width: int) -> tuple[int, ...]:
        L, S, ps, P = self.layer_num, self.size, self.page_size, self.size // self.page_size
        return {"layer_first": (L, S, heads, width), "page_first": (S, L, heads, width),
                "page_first_direct": (P, L, ps, heads, width), "page_head": (P, heads, ps, L, width)}[self.layout]

    def _host_row(self, component: int, layer: int, token: int) -> torch.Tensor:
        half, ps = self.halves[component], self.page_size
        if self.layout == "layer_first":
            return half[layer, token]
        if self.layout == "page_first":
            return half[token, layer]
        if self.layout == "page_first_direct":
            return half[token // ps, layer, token % ps]
        return half[token // ps, :, token % ps, layer]

    # ---- allocator (pool_host/base.py: free list, lazily merged released slots, used-slot flags) ------------
    def clear(self) -> None:
        self.free_slots = torch.arange(self.size, dtype=torch.int64)
        self.release_slots: list[torch.Tensor] = []
        self.num_release_slots = 0
        self.slot_used = torch.zeros(self.size, dtype=torch.bool)

    def available_size(self) -> int:
        return len(self.free_slots) + self.num_release_slots

    def alloc(self, need_size: int) -> torch.Tensor | None:
        assert need_size % self.page_size == 0, "The requested size should be a multiple of the page size."
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots) and self.num_release_slots:
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])
            self.release_slots, self.num_release_slots = [], 0
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        if planted_bug() != "alloc_twice":
            assert not self.slot_used[select].any(), "Double-alloc detected"
        self.slot_used[select] = True
        return select

    def free(self, indices_: torch.Tensor) -> int:
        cpu = indices_.cpu()
        if cpu.numel() == 0:
            return 0
        assert self.slot_used[cpu].all(), f"Double-free detected: {cpu[~self.slot_used[cpu]].tolist()}"
        self.slot_used[cpu] = False
        copies = 2 if planted_bug() == "alloc_twice" else 1
        for _ in range(copies):
            self.release_slots.append(cpu)
            self.num_release_slots += len(cpu)
        return len(cpu)

    # ---- transfers ---------------------------------------------------------------------------------------
    def prepare_transfer_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 io_backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        return host_indices, device_indices

    def _check_io(self, io_backend: str, host_indices: torch.Tensor) -> None:
        if self.layout not in self.io_layouts.get(io_backend, ()):
            raise ValueError(f"fake sglang: {type(self).__name__} moves no {self.layout!r} with io {io_backend!r}")

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        self._check_io(io_backend, host_indices)
        index_pairs = pairs(host_indices, device_indices)
        ps = self.page_size
        if planted_bug() == "page32" and ps >= 32:
            index_pairs = [p for i, p in enumerate(index_pairs) if i % ps != ps - 1]
        for component, per_layer in enumerate(self.device_layers):
            for layer in range(self.layer_num):
                for h, d in index_pairs:
                    self._host_row(component, layer, h).copy_(per_layer[layer][d])

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str, *, is_draft: bool = False) -> None:
        if not is_draft and not 0 <= layer_id < self.target_layer_num:
            return
        self._load_layer(host_indices, device_indices, layer_id, io_backend)

    def _load_layer(self, host_indices: torch.Tensor, device_indices: torch.Tensor, layer_id: int,
                    io_backend: str) -> None:
        self._check_io(io_backend, host_indices)
        for component, per_layer in enumerate(self.device_layers):
            for d, h in pairs(device_indices, host_indices):
                per_layer[layer_id][d].copy_(self._host_row(component, layer_id, h))

    def backup_from_device_all_layer_physical(self, device_pool: Any, host_indices: torch.Tensor,
                                              device_indices: torch.Tensor, io_backend: str) -> None:
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

    def load_to_device_per_layer_physical(self, device_pool: Any, host_indices: torch.Tensor,
                                          device_indices: torch.Tensor, layer_id: int, io_backend: str, *,
                                          is_draft: bool = False) -> None:
        self.load_to_device_per_layer(device_pool, host_indices, device_indices, layer_id, io_backend,
                                      is_draft=is_draft)

    def destroy(self) -> None:
        self.kv_buffer = None


def token_list(tensor: torch.Tensor) -> list[int]:
    return indices(tensor)
