"""Fake MHA host pools: the symmetric pool, the asymmetric one (K and V tensors of their own widths) and the
HiSparse one (layer_first, sized from the device pool); sglang's choice of the MHA host pool class for a device
pool's buffer info (the MXFP8 pool for interleaved scales), and the MHA pools' refusal of other scale layouts."""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.mem_cache.pool_host.base import LAYOUTS, HostPool, planted_bug
from sglang.srt.mem_cache.pool_host.hisparse import HiSparseHostPoolMixin
from sglang.srt.mem_cache.pool_host.page_unified import PageUnifiedLayout


class MHATokenToKVPoolHost(HostPool):
    components = ("k", "v")
    layouts = (*LAYOUTS, "page_unified")

    def __init__(self, buffer_info: Any, *args: Any, head_group_num: int = 1, **kwargs: Any) -> None:
        scales = getattr(buffer_info, "scales", None)
        if scales is not None and scales.layout.value != "mxfp8_interleaved":
            raise ValueError(f"MHA host transfers do not support KV scale layout {scales.layout.value!r}.")
        self.head_group_num = head_group_num
        super().__init__(buffer_info, *args, **kwargs)

    def _page_unified_layout(self, heads: int, width: int, dtype: torch.dtype) -> PageUnifiedLayout:
        return PageUnifiedLayout(page_size=self.page_size, layer_num=self.layer_num, head_num=heads,
                                 head_group_num=self.head_group_num, head_dim=width,
                                 itemsize=torch.empty((), dtype=dtype).element_size())


class AsymmetricMHATokenToKVPoolHost(MHATokenToKVPoolHost):
    separate_halves = True
    layouts = ("page_first", "page_first_direct")
    io_layouts = {"kernel": ("page_first",), "direct": ("page_first_direct",)}  # noqa: RUF012

    def _refuse_unpacked_rows(self, io_backend: str, backup: bool) -> None:
        """Nothing: sglang's asymmetric pool has no packed-rows check (its transfers move the rows here, the
        contract's semantics)."""

    def _device_row(self, layer: torch.Tensor, row: int) -> torch.Tensor:
        """The contract's row; under the planted bug ``asym_packed_rows`` the row sglang 0.5.23's pool addresses on
        token-major (strided) rows: its per-token AOT ops (``transfer_kv_per_layer_mla_pf_lf``,
        ``transfer_kv_all_layer_mla_lf_pf``) step device rows by the row width from the layer's first row, not by
        the view's stride (its direct ops size their copies by the stride instead, and fail on the GPU)."""
        if planted_bug() != "asym_packed_rows":
            return layer[row]
        width = layer[0].numel()
        return torch.as_strided(layer, layer[0].shape, layer[0].stride(), layer.storage_offset() + row * width)


class HiSparseMHATokenToKVPoolHost(HiSparseHostPoolMixin, MHATokenToKVPoolHost):
    io_layouts = {"kernel": ("layer_first",)}  # noqa: RUF012

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, page_size: int, *,
                 device_capacity_tokens: int, start_layer: int, end_layer: int) -> None:
        super().__init__(buffer_info, host_to_device_ratio, 0, page_size, "layer_first",
                         device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer)

    def load_to_device_per_layer(self, device_pool: Any, host_indices: Any, device_indices: Any, layer_id: int,
                                 io_backend: str, *, is_draft: bool = False) -> None:
        """Global layer ids of the device pool's stage, no guard for others (as sglang's HiSparse pool)."""
        if io_backend != "kernel" or is_draft:
            raise ValueError("HiSparse host transfers require the kernel backend")
        super().load_to_device_per_layer(device_pool, host_indices, device_indices,
                                         layer_id - device_pool.start_layer, io_backend)


class MHATokenToKOnlyPoolHost(HostPool):
    """K rows only, sized from its anchor host pool; no guard for layer ids outside the pool (as sglang's)."""

    components = ("k",)
    io_layouts = {"kernel": ("layer_first", "page_first"),  # noqa: RUF012
                  "direct": ("layer_first", "page_first_direct")}

    def __init__(self, device_pool: Any, anchor_host: Any, layout: str, pin_memory: bool = True,
                 device: str = "cpu", allocator_type: str = "default") -> None:
        if layout not in ("layer_first", "page_first", "page_first_direct"):
            raise ValueError(f"Unsupported layout: {layout}")
        self.device_pool, self.layout, self.device, self.pin_memory = device_pool, layout, device, pin_memory
        self.page_size, self.size, self.page_num = anchor_host.page_size, anchor_host.size, anchor_host.page_num
        self.layer_num = self.target_layer_num = device_pool.layer_num
        self.start_layer, self.end_layer = device_pool.start_layer, device_pool.end_layer
        self.device_layers = [list(device_pool.k_buffer)]
        self.k_buffer = torch.zeros(self._shape(device_pool.head_num, device_pool.head_dim), dtype=device_pool.dtype)
        self.kv_buffer = self.k_buffer
        self.halves = [self.k_buffer]
        self.size_per_token = self.k_buffer[0].numel() * self.k_buffer.element_size()
        self.can_use_write_back_jit = False
        self.clear()

    def load_to_device_per_layer(self, device_pool: Any, host_indices: Any, device_indices: Any, layer_id: int,
                                 io_backend: str, *, is_draft: bool = False) -> None:
        self._load_layer(host_indices, device_indices, layer_id, io_backend)


def get_mha_host_pool_cls(buffer_info: Any) -> type:
    scales = getattr(buffer_info, "scales", None)
    if scales is not None and scales.layout.value == "mxfp8_interleaved":
        if buffer_info.head_dim != buffer_info.v_head_dim:
            raise NotImplementedError("MXFP8 HiCache does not support asymmetric K/V head dimensions yet.")
        from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host

        return MHATokenToKVPoolMXFP8Host
    if buffer_info.head_dim != buffer_info.v_head_dim:
        return AsymmetricMHATokenToKVPoolHost
    return MHATokenToKVPoolHost
