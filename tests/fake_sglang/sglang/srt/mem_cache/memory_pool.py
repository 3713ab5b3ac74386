"""Fake device KV pools: per-layer buffers of size + page_size rows (rows [0, page_size) are padding)."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class MHATokenToKVPool:
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int,
                 device: str, enable_memory_saver: bool, enable_alt_stream: bool = True) -> None:
        shape = (size + page_size, head_num, head_dim)
        self.dtype, self.layer_num, self.head_num, self.head_dim = dtype, layer_num, head_num, head_dim
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.row_bytes = head_num * head_dim * self.k_buffer[0].element_size()

    def get_device_pool_infos(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(buffer_info=self)]


class MLATokenToKVPool:
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str, enable_memory_saver: bool) -> None:
        width = kv_lora_rank + qk_rope_head_dim
        self.dtype, self.layer_num, self.head_num, self.head_dim = dtype, layer_num, 1, width
        self.kv_buffer = [torch.zeros((size + page_size, 1, width), dtype=dtype, device=device)
                          for _ in range(layer_num)]
        self.row_bytes = width * self.kv_buffer[0].element_size()

    def get_device_pool_infos(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(buffer_info=self)]
