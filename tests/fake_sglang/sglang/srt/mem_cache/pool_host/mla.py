"""Fake MLA host pool (sglang's MLA constructor: override_kv_cache_dim, draft infos and dcp positionally,
target_layer_num keyword-only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang.srt.mem_cache.pool_host.base import HostPool
from sglang.srt.mem_cache.pool_host.hisparse import HiSparseHostPoolMixin


class MLATokenToKVPoolHost(HiSparseHostPoolMixin, HostPool):
    components = ("kv",)
    layouts = ("layer_first", "page_first", "page_first_direct")
    io_layouts = {"kernel": ("layer_first", "page_first"), "direct": ("layer_first", "page_first_direct")}  # noqa: RUF012

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default",
                 override_kv_cache_dim: int | None = None, draft_buffer_infos: Sequence[Any] = (),
                 dcp_size: int = 1, dcp_rank: int = 0, *, device_capacity_tokens: int, start_layer: int,
                 end_layer: int, target_layer_num: int, layer_shard_enabled: bool = False, pool_label: str = "kv",
                 host_token_capacity: int | None = None) -> None:
        super().__init__(buffer_info, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type, device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer, draft_buffer_infos=draft_buffer_infos, pool_label=pool_label,
                         host_token_capacity=host_token_capacity, target_layer_num=target_layer_num)
