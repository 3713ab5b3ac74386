"""Fake MLA host pool (sglang's MLA constructor: override_kv_cache_dim, draft infos and dcp positionally,
target_layer_num and layer_shard_enabled keyword-only), over sglang's ``MLABufferInfo``.

Layers as sglang's: the buffer info's ``layer_indices`` are the device slots the pool gets (every layer, or the
owned range of a layer-sharded device pool); owned slot ``layer_indices[j]`` is host layer j, packed draft i is
controller id ``device_layer_num + i`` and host layer ``target_layer_num + i``; loads of other ids return. A
layer-sharded pool (``layer_shard_enabled``) backs up one owned layer after another, then the drafts, as sglang's
layer-shard branch: the JIT one-layer kernel where it takes the row, else on layer_first sgl_kernel's
``transfer_kv_per_layer_mla`` (packed device rows only), with direct io on layer_first only; it raises ValueError
for page_first without the JIT kernel and for every other layout, and turns the staged write-back off.

``FAKE_SGLANG_POOL_BUG`` plants one bug:

* ``shard_swap``: the layer-sharded back-up hands each owned layer's copy the host and device indices swapped (the
  device rows read at the host slots, written to host slots at the device rows);
* ``shard_aot_drop``: the layer-sharded back-up on layer_first without the JIT kernel never calls
  ``transfer_kv_per_layer_mla`` (the owned layers' host rows keep their bytes);
* ``shard_no_refusal``: the layer-sharded back-up no longer refuses page_first without the JIT kernel nor
  page_first_direct: it copies the rows as on layer_first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang._fake_core import pairs
from sglang.srt.mem_cache.pool_host.base import HostPool, planted_bug
from sglang.srt.mem_cache.pool_host.hisparse import HiSparseHostPoolMixin
from sglang.srt.mem_cache.pool_host.page_unified import PageUnifiedLayout


class MLATokenToKVPoolHost(HiSparseHostPoolMixin, HostPool):
    components = ("kv",)
    layouts = ("layer_first", "page_first", "page_first_direct", "page_unified")
    io_layouts = {"kernel": ("layer_first", "page_first"), "direct": ("layer_first", "page_first_direct")}  # noqa: RUF012

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default",
                 override_kv_cache_dim: int | None = None, draft_buffer_infos: Sequence[Any] = (),
                 dcp_size: int = 1, dcp_rank: int = 0, *, device_capacity_tokens: int, start_layer: int,
                 end_layer: int, target_layer_num: int, layer_shard_enabled: bool = False, pool_label: str = "kv",
                 host_token_capacity: int | None = None) -> None:
        for index, info in enumerate((buffer_info, *draft_buffer_infos)):
            info.validate()
            if index and len(info.layer_indices) != 1:
                raise ValueError(f"MLA packed draft[{index - 1}] must contain one layer, got {info.layer_indices}")
        self._layer_shard_enabled = layer_shard_enabled
        self._device_layer_num = buffer_info.device_layer_num
        self._target_layer_indices = buffer_info.layer_indices
        self._draft_layer_num = len(draft_buffer_infos)
        slots = (*buffer_info.layer_indices,
                 *range(self._device_layer_num, self._device_layer_num + self._draft_layer_num))
        self._buffer_index_by_layer = {layer: i for i, layer in enumerate(slots)}
        self._host_layer_by_controller = dict(zip(buffer_info.layer_indices, range(len(buffer_info.layer_indices)),
                                                  strict=True))
        self._host_layer_by_controller.update({self._device_layer_num + i: target_layer_num + i
                                               for i in range(self._draft_layer_num)})
        super().__init__(buffer_info, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type, device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer, draft_buffer_infos=draft_buffer_infos, pool_label=pool_label,
                         host_token_capacity=host_token_capacity, target_layer_num=target_layer_num)
        if layer_shard_enabled:
            self.can_use_write_back_jit = False

    def _device_buffers(self, infos: Sequence[Any]) -> list[list[torch.Tensor]]:
        return [[b for info in infos for b in info.buffers]]

    def _row_geometry(self, buffer_info: Any) -> tuple[int, list[int], torch.dtype]:
        return 1, [buffer_info.kv_cache_dim], buffer_info.dtype

    def _device_buffer(self, layer_id: int) -> torch.Tensor:
        return self.device_layers[0][self._buffer_index_by_layer[layer_id]]

    def _is_target_layer(self, layer_id: int) -> bool:
        return layer_id in self._target_layer_indices

    def _load_layer(self, host_indices: torch.Tensor, device_indices: torch.Tensor, layer_id: int,
                    io_backend: str) -> None:
        host_layer, destination = self._host_layer_by_controller[layer_id], self._device_buffer(layer_id)
        self._check_io(io_backend, host_indices)
        self._refuse_unpacked_rows(io_backend, backup=False)
        for d, h in pairs(device_indices, host_indices):
            destination[d].copy_(self._host_row(0, host_layer, h))

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        if not self._layer_shard_enabled:
            super().backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)
            return
        swap = planted_bug() == "shard_swap"  # the bug: the owned layers' copies get the indices swapped
        for layer_id in self._target_layer_indices:
            self._backup_from_device_per_layer(device_indices if swap else host_indices,
                                               host_indices if swap else device_indices, layer_id, io_backend)
        for depth in range(self._draft_layer_num):
            self._backup_from_device_per_layer(host_indices, device_indices, self._device_layer_num + depth,
                                               io_backend, is_draft=True)

    def _backup_from_device_per_layer(self, host_indices: torch.Tensor, device_indices: torch.Tensor, layer_id: int,
                                      io_backend: str, *, is_draft: bool = False) -> None:
        if io_backend not in ("kernel", "direct"):
            raise ValueError(f"Layer-sharded HiCache backup does not support IO backend: {io_backend}")
        host_layer, source = self._host_layer_by_controller[layer_id], self._device_buffer(layer_id)
        if planted_bug() == "shard_no_refusal" and self.layout != "layer_first":  # the bug: no layout refused
            for h, d in pairs(host_indices, device_indices):
                self._host_row(0, host_layer, h).copy_(source[d])
            return
        if io_backend == "kernel" and self.layout not in ("layer_first", "page_first"):
            raise ValueError(f"Layer-sharded HiCache backup does not support layout: {self.layout}")
        if io_backend == "kernel" and not self.can_use_jit:
            if self.layout == "page_first":
                raise ValueError("Layer-sharded MLA HiCache backup with page_first layout requires the JIT one-layer "
                                 "kernel.")
            self._require_packed_device_rows("transfer_kv_per_layer_mla")
            if planted_bug() == "shard_aot_drop":  # the bug: transfer_kv_per_layer_mla is never called
                return
        if io_backend == "direct" and self.layout != "layer_first":
            raise ValueError(f"Layer-sharded direct HiCache backup only supports layer_first layout, got "
                             f"{self.layout}")
        for h, d in pairs(host_indices, device_indices):
            self._host_row(0, host_layer, h).copy_(source[d])

    def _page_unified_layout(self, heads: int, width: int, dtype: torch.dtype) -> PageUnifiedLayout:
        return PageUnifiedLayout(page_size=self.page_size, layer_num=self.layer_num, head_num=1, head_group_num=1,
                                 head_dim=width, itemsize=torch.empty((), dtype=dtype).element_size(), is_mla=True)

    def _init_page_unified(self, heads: int, width: int, dtype: torch.dtype) -> None:
        super()._init_page_unified(heads, width, dtype)
        # sglang takes one view per layer along axis 0 for every layout but page_first (mla.py,
        # _initialize_transfer_views); page_unified's axis 0 counts pages, so a pool of fewer pages than layers raises
        # IndexError there, as sglang's does
        self.data_refs = [self.kv_buffer[i] for i in range(self.layer_num)]
