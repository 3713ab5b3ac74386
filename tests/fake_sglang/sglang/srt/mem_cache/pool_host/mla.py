"""Fake MLA host pool (sglang's MLA constructor: override_kv_cache_dim, draft infos and dcp positionally,
target_layer_num keyword-only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang.srt.mem_cache.pool_host.base import HostPool
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
        super().__init__(buffer_info, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type, device_capacity_tokens=device_capacity_tokens, start_layer=start_layer,
                         end_layer=end_layer, draft_buffer_infos=draft_buffer_infos, pool_label=pool_label,
                         host_token_capacity=host_token_capacity, target_layer_num=target_layer_num)

    def _page_unified_layout(self, heads: int, width: int, dtype: torch.dtype) -> PageUnifiedLayout:
        return PageUnifiedLayout(page_size=self.page_size, layer_num=self.layer_num, head_num=1, head_group_num=1,
                                 head_dim=width, itemsize=torch.empty((), dtype=dtype).element_size(), is_mla=True)

    def _init_page_unified(self, heads: int, width: int, dtype: torch.dtype) -> None:
        super()._init_page_unified(heads, width, dtype)
        # sglang takes one view per layer along axis 0 for every layout but page_first (mla.py,
        # _initialize_transfer_views); page_unified's axis 0 counts pages, so a pool of fewer pages than layers raises
        # IndexError there, as sglang's does
        self.data_refs = [self.kv_buffer[i] for i in range(self.layer_num)]
