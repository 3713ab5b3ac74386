"""Fake host pool: layer_first or page_first host tensor, per-token backup and per-layer load."""

from __future__ import annotations

from typing import Any

import torch

from sglang._fake_core import pairs


class HostPool:
    components: tuple[str, ...] = ("k", "v")

    def __init__(self, device_pool: Any, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 *, pin_memory: bool, device: str, device_capacity_tokens: int, start_layer: int, end_layer: int,
                 pool_label: str, host_token_capacity: int, target_layer_num: int | None = None) -> None:
        self.layout, self.page_size = layout, page_size
        layers, slots = device_pool.layer_num, host_token_capacity
        per_component = (layers, slots) if layout == "layer_first" else (slots, layers)
        shape = (*per_component, device_pool.head_num, device_pool.head_dim)
        if len(self.components) == 2:
            shape = (2, *shape)
        self.kv_buffer = torch.zeros(shape, dtype=device_pool.dtype)
        self.can_use_write_back_jit = layout == "page_first" and device_pool.row_bytes % 16 == 0

    def _host_rows(self, component: int, layer: int) -> torch.Tensor:
        whole = self.kv_buffer[component] if len(self.components) == 2 else self.kv_buffer
        return whole[layer] if self.layout == "layer_first" else whole[:, layer]

    def _device_layers(self, device_pool: Any) -> list[list[torch.Tensor]]:
        if len(self.components) == 2:
            return [device_pool.k_buffer, device_pool.v_buffer]
        return [device_pool.kv_buffer]

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str) -> None:
        index_pairs = pairs(host_indices, device_indices)
        for component, per_layer in enumerate(self._device_layers(device_pool)):
            for layer, device in enumerate(per_layer):
                host = self._host_rows(component, layer)
                for h, d in index_pairs:
                    host[h].view(torch.uint8).copy_(device[d].view(torch.uint8))

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str) -> None:
        index_pairs = pairs(device_indices, host_indices)
        for component, per_layer in enumerate(self._device_layers(device_pool)):
            host = self._host_rows(component, layer_id)
            for d, h in index_pairs:
                per_layer[layer_id][d].view(torch.uint8).copy_(host[h].view(torch.uint8))
