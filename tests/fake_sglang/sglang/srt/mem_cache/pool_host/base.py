"""Fake host KV pools: sglang's host layouts, its first-in first-out slot allocator with the double-alloc and
double-free checks, per-token backup of every layer and per-layer load with the target-layer guard.

Device rows: the pool records the row stride of strided (token-major) device buffers as sglang's
``_init_device_row_stride`` does (refusing buffers of several strides, or strided beside packed ones), turns the
staged page_first write-back off for them, and refuses the sgl_kernel ops sglang's MHA and MLA pools refuse on them
(``_require_packed_device_rows``: the per-token AOT ops where the JIT kernel does not take the row, the page_head
ops, the page_first_direct direct ops). Whether the JIT kernel takes a row is sglang's gate on an sm90 CUDA device
(``can_use_hicache_jit_kernel``, the fake hicache module).

``FAKE_SGLANG_POOL_BUG`` plants one bug for the tests to catch:

* ``page32``: for page sizes >= 32 the last token of every page is not backed up (an off-by-one);
* ``alloc_twice``: ``free`` queues the freed slots twice and ``alloc`` skips its double-alloc check, so a freed
  slot is granted twice;
* ``stride_ge``: ``_init_device_row_stride`` compares the number of strides with ``>=`` where sglang's has ``>``,
  so every strided device pool is refused at construction;
* ``stride_mixed``: ``_init_device_row_stride`` drops its check for packed buffers beside strided ones, so a pool
  over token-major target rows and packed draft rows is built (and steps the drafts' rows by the target's stride);
* ``asym_packed_rows`` (pool_host/mha.py): the asymmetric MHA pool addresses device row d of a layer at d times the
  row width from the layer's first row, whatever the view's stride, as sglang 0.5.23's does;
* ``shard_swap`` / ``shard_aot_drop`` (pool_host/mla.py): the layer-sharded MLA back-up;
* ``side_write`` (hybrid_cache_controller.py): every back-up and load also moves the group's side pools at the
  anchor's indices (beside any transfer that names them); ``mamba_conv`` (pool_host/mamba.py): the Mamba pool does
  not back up its last layer's conv state;
  ``hisparse_len_row``, ``hisparse_pages_squared``, ``hisparse_empty_int32``, ``hisparse_slot0``
  (pool_host/hisparse.py): the HiSparse request-slot allocation's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from sglang._fake_core import indices, pairs
from sglang.kernels.ops.kvcache.hicache import can_use_hicache_jit_kernel

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def planted_bug() -> str:
    return os.environ.get("FAKE_SGLANG_POOL_BUG", "")


class HostPool:
    components: tuple[str, ...] = ("k", "v")
    separate_halves = False  # K and V in tensors of their own (asymmetric widths)
    device_pool: Any = None  # the pool a class built from a device pool keeps (the DSA indexer's)
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
        self.target_layer_num = self._info_layers(buffer_info) if target_layer_num is None else target_layer_num
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
        self.device_layers = self._device_buffers(infos)
        heads, widths, dtype = self._row_geometry(buffer_info)
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
        self.token_stride_size = row_bytes[0]
        self._init_device_row_stride([b for per_layer in self.device_layers for b in per_layer])
        self.can_use_jit = can_use_hicache_jit_kernel(element_size=row_bytes[0], page_size=page_size)
        # the staged write-back reads whole device pages: packed rows only
        self.can_use_write_back_jit = (layout == "page_first" and self.device_rows_packed
                                       and all(r % 16 == 0 for r in row_bytes))
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
    def _info_layers(self, buffer_info: Any) -> int:
        return int(buffer_info.layer_num)

    def _device_buffers(self, infos: Sequence[Any]) -> list[list[torch.Tensor]]:
        """The device tensors of each component, target layers then drafts (an MHA pool's buffer info is the
        device pool itself)."""
        if len(self.components) == 2:
            return [[b for info in infos for b in info.k_buffer], [b for info in infos for b in info.v_buffer]]
        return [[b for info in infos for b in info.kv_buffer]]

    def _row_geometry(self, buffer_info: Any) -> tuple[int, list[int], torch.dtype]:
        """(heads, K and V head dims, the rows' storage dtype)."""
        dtype = getattr(buffer_info, "store_dtype", buffer_info.dtype)
        return buffer_info.head_num, [buffer_info.head_dim, getattr(buffer_info, "v_head_dim",
                                                                     buffer_info.head_dim)], dtype

    # ---- device rows (pool_host/base.py: strided device rows) -----------------------------------------
    _strided_device_row_bytes: int | None = None

    def _init_device_row_stride(self, device_buffers: Iterable[torch.Tensor]) -> None:
        buffers = list(device_buffers)
        strides = {buf.stride(0) * buf.element_size() for buf in buffers if not buf.is_contiguous()}
        if not strides:
            return
        mixed = any(buf.is_contiguous() for buf in buffers) and planted_bug() != "stride_mixed"
        several = len(strides) >= 1 if planted_bug() == "stride_ge" else len(strides) > 1
        if several or mixed:
            raise NotImplementedError(f"HiCache: the device KV buffers do not share one row stride (strided rows "
                                      f"{sorted(strides)} B, mixed with packed ones)")
        for buf in buffers:
            assert buf.stride(-1) == 1, f"HiCache needs packed device rows; got strides {buf.stride()}"
        self._strided_device_row_bytes = strides.pop()

    @property
    def device_rows_packed(self) -> bool:
        return self._strided_device_row_bytes is None

    @property
    def device_row_stride_bytes(self) -> int:
        return self._strided_device_row_bytes or self.token_stride_size

    def _require_packed_device_rows(self, kernel: str) -> None:
        if not self.device_rows_packed:
            raise NotImplementedError(f"HiCache: {kernel} steps device rows by the row width "
                                      f"({self.token_stride_size} B), but this device pool's rows are "
                                      f"{self.device_row_stride_bytes} B apart. Use the JIT HiCache kernels with a "
                                      f"layer_first or page_first host layout.")

    def _refuse_unpacked_rows(self, io_backend: str, backup: bool) -> None:
        """sglang's MHA and MLA pools: the ops of this io backend and layout that step device rows by the row width
        refuse strided rows (the JIT kernels and transfer_kv_direct take them)."""
        if self.device_rows_packed:
            return
        mla = "_mla" if len(self.components) == 1 else ""
        if io_backend == "kernel" and self.layout == "page_head":
            op = "transfer_kv_all_layer_lf_ph" if backup else "transfer_kv_per_layer_ph_lf"
        elif io_backend == "kernel" and self.can_use_jit:
            return
        elif io_backend == "kernel" and self.layout == "layer_first":
            op = f"transfer_kv_all_layer{mla}" if backup else f"transfer_kv_per_layer{mla}"
        elif io_backend == "kernel":
            op = f"transfer_kv_all_layer{mla}_lf_pf" if backup else f"transfer_kv_per_layer{mla}_pf_lf"
        elif self.layout == "page_first_direct":
            op = "transfer_kv_all_layer_direct_lf_pf" if backup else "transfer_kv_per_layer_direct_pf_lf"
        else:
            return
        self._require_packed_device_rows(op)

    # ---- layer-sharded device pools (pool_host/base.py: the owned range of a device pool split over CP ranks) ----
    def _is_device_layer_sharded(self, device_pool: Any = None) -> bool:
        device_pool = device_pool or self.device_pool
        return bool(device_pool.layer_shard_enabled)

    def _device_owned_layer_range(self, device_pool: Any = None) -> tuple[int, int]:
        device_pool = device_pool or self.device_pool
        if not self._is_device_layer_sharded(device_pool):
            return 0, device_pool.layer_num
        return device_pool._owned_local_layer_range()

    def _effective_host_layer_num(self, device_pool: Any = None) -> int:
        device_pool = device_pool or self.device_pool
        if not self._is_device_layer_sharded(device_pool):
            return int(device_pool.layer_num)
        return -(-device_pool.layer_num // device_pool.layer_shard_size)

    def _is_device_layer_owned(self, device_pool: Any, layer_id: int) -> bool:
        start, end = self._device_owned_layer_range(device_pool)
        return start <= layer_id < end

    def _host_layer_index(self, layer_id: int, device_pool: Any = None) -> int:
        start, _ = self._device_owned_layer_range(device_pool)
        return layer_id - start

    def _owned_device_layer_ids(self, device_pool: Any) -> list[int]:
        start, end = self._device_owned_layer_range(device_pool)
        return list(range(start, end))

    def _shape(self, heads: int, width: int) -> tuple[int, ...]:
        L, S, ps, P = self.layer_num, self.size, self.page_size, self.size // self.page_size
        return {"layer_first": (L, S, heads, width), "page_first": (S, L, heads, width),
                "page_first_direct": (P, L, ps, heads, width), "page_head": (P, heads, ps, L, width)}[self.layout]

    def _device_row(self, layer: torch.Tensor, row: int) -> torch.Tensor:
        """Row `row` of one device layer, as the pool's transfers address it."""
        return layer[row]

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
        self._refuse_unpacked_rows(io_backend, backup=True)
        index_pairs = pairs(host_indices, device_indices)
        ps = self.page_size
        if planted_bug() == "page32" and ps >= 32:
            index_pairs = [p for i, p in enumerate(index_pairs) if i % ps != ps - 1]
        for component, per_layer in enumerate(self.device_layers):
            for layer in range(self.layer_num):
                for h, d in index_pairs:
                    self._host_row(component, layer, h).copy_(self._device_row(per_layer[layer], d))

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str, *, is_draft: bool = False) -> None:
        if not is_draft and not self._is_target_layer(layer_id):
            return
        self._load_layer(host_indices, device_indices, layer_id, io_backend)

    def _is_target_layer(self, layer_id: int) -> bool:
        return 0 <= layer_id < self.target_layer_num

    def _load_layer(self, host_indices: torch.Tensor, device_indices: torch.Tensor, layer_id: int,
                    io_backend: str) -> None:
        self._check_io(io_backend, host_indices)
        self._refuse_unpacked_rows(io_backend, backup=False)
        for component, per_layer in enumerate(self.device_layers):
            for d, h in pairs(device_indices, host_indices):
                self._device_row(per_layer[layer_id], d).copy_(self._host_row(component, layer_id, h))

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
