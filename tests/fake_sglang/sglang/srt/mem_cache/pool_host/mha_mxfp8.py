"""Fake MXFP8 MHA host pool: sglang's constructor signature and its construction-time refusals (the page_first layout
only, no packed draft layers, interleaved scales, host and device page sizes equal, the staged write-back for the
payload and both scale blocks), the fp8 payload moved as the MHA pool moves it, and per component one host scale
tensor ``(host pages, layers, block)`` moved whole blocks at a time, by page ids from the first token of each page
on both sides (a back-up: every layer; a load: the asked layer, none for ids outside the pool); kernel io only.

``FAKE_SGLANG_POOL_BUG`` plants one bug:

* ``mxfp8_v_scales``: a back-up leaves the V scale block of its last page out;
* ``mxfp8_scale_layer``: a load of layer l > 0 reads its K scale blocks from host layer l - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang._fake_core import pairs
from sglang.srt.mem_cache.device_pool_info import KVScaleLayout
from sglang.srt.mem_cache.pool_host.base import planted_bug
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

# The staged write-back copies rows of 16-byte multiples only (its gate in sglang).
_STAGED_ALIGN = 16


class MHATokenToKVPoolMXFP8Host(MHATokenToKVPoolHost):
    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default", *,
                 device_capacity_tokens: int, start_layer: int, end_layer: int,
                 draft_buffer_infos: Sequence[Any] = (), write_back_staging: Any = None, pool_label: str = "kv",
                 host_token_capacity: int | None = None) -> None:
        if layout != "page_first":
            raise NotImplementedError(f"fake MXFP8 host pool: page_first layout only, not {layout!r}")
        if draft_buffer_infos:
            raise NotImplementedError("fake MXFP8 host pool: no packed draft layers")
        scales = buffer_info.scales
        if scales is None or scales.layout is not KVScaleLayout.MXFP8_INTERLEAVED:
            raise NotImplementedError("fake MXFP8 host pool: interleaved (page size 128) scales only")
        super().__init__(buffer_info, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type, device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer, pool_label=pool_label, host_token_capacity=host_token_capacity)
        if page_size != buffer_info.page_size:
            raise ValueError(f"fake MXFP8 host pool: host page size {page_size} != device page size "
                             f"{buffer_info.page_size}")
        self.k_scale_device_rows = [b.view(torch.uint8).reshape(b.shape[0], -1) for b in scales.k]
        self.v_scale_device_rows = [b.view(torch.uint8).reshape(b.shape[0], -1) for b in scales.v]
        self.k_sf_page_bytes = self.k_scale_device_rows[0].shape[1]
        self.v_sf_page_bytes = self.v_scale_device_rows[0].shape[1]
        if not self.can_use_write_back_jit or self.k_sf_page_bytes % _STAGED_ALIGN or (
                self.v_sf_page_bytes % _STAGED_ALIGN):
            raise NotImplementedError("fake MXFP8 host pool: needs the staged write-back for payload and scales")
        self.k_scale_host: torch.Tensor | None = torch.zeros((self.page_num, self.layer_num, self.k_sf_page_bytes),
                                                             dtype=torch.uint8)
        self.v_scale_host: torch.Tensor | None = torch.zeros((self.page_num, self.layer_num, self.v_sf_page_bytes),
                                                             dtype=torch.uint8)

    def _page_ids(self, indices: torch.Tensor) -> list[int]:
        return [int(x) // self.page_size for x in indices[:: self.page_size].cpu().tolist()]

    def _scales(self) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        assert self.k_scale_host is not None and self.v_scale_host is not None
        return [(self.k_scale_host, self.k_scale_device_rows), (self.v_scale_host, self.v_scale_device_rows)]

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        super().backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)
        if io_backend != "kernel":
            raise NotImplementedError(f"fake MXFP8 host pool: io backend kernel only, not {io_backend!r}")
        page_pairs = pairs(self._page_ids(host_indices), self._page_ids(device_indices))
        for component, (host, device_rows) in enumerate(self._scales()):
            moved = page_pairs[:-1] if component == 1 and planted_bug() == "mxfp8_v_scales" else page_pairs
            for layer, rows in enumerate(device_rows):
                for h, d in moved:
                    host[h, layer].copy_(rows[d])

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str, *, is_draft: bool = False) -> None:
        super().load_to_device_per_layer(device_pool, host_indices, device_indices, layer_id, io_backend,
                                         is_draft=is_draft)
        if is_draft:
            raise NotImplementedError("fake MXFP8 host pool: no draft layers")
        if io_backend != "kernel":
            raise NotImplementedError(f"fake MXFP8 host pool: io backend kernel only, not {io_backend!r}")
        if not 0 <= layer_id < self.target_layer_num:
            return
        page_pairs = pairs(self._page_ids(device_indices), self._page_ids(host_indices))
        for component, (host, device_rows) in enumerate(self._scales()):
            source = layer_id - 1 if component == 0 and layer_id > 0 and planted_bug() == "mxfp8_scale_layer" else (
                layer_id)
            for d, h in page_pairs:
                device_rows[layer_id][d].copy_(host[h, source])

    def destroy(self) -> None:
        self.k_scale_host = self.v_scale_host = None
        super().destroy()
