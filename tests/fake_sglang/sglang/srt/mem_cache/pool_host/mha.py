"""Fake MHA host pools: the symmetric pool, the asymmetric one (K and V tensors of their own widths) and the
HiSparse one (layer_first, sized from the device pool)."""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.pool_host.base import HostPool


class MHATokenToKVPoolHost(HostPool):
    components = ("k", "v")


class AsymmetricMHATokenToKVPoolHost(MHATokenToKVPoolHost):
    separate_halves = True
    layouts = ("page_first", "page_first_direct")
    io_layouts = {"kernel": ("page_first",), "direct": ("page_first_direct",)}  # noqa: RUF012


class HiSparseMHATokenToKVPoolHost(MHATokenToKVPoolHost):
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
