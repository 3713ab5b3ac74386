"""Fake Mamba host pool: sglang's constructor signature, one slot per page, page-first host tensors
``(slots, layers, 1, *state)`` for the temporal state and each conv state, per-slot backup of every layer and
per-layer load, no guard for layer ids outside the pool (as sglang's).

``FAKE_SGLANG_POOL_BUG=mamba_conv`` plants a bug: the conv state of the last layer is not backed up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang._fake_core import pairs
from sglang.srt.mem_cache.pool_host.base import HostPool, planted_bug


class MambaPoolHost(HostPool):
    io_layouts = {"kernel": ("page_first", "page_first_direct"),  # noqa: RUF012
                  "direct": ("page_first", "page_first_direct")}

    def __init__(self, buffer_info: Any, host_to_device_ratio: float, host_size: int, *, device_capacity: int,
                 pin_memory: bool = True, device: str = "cpu", allocator_type: str = "default",
                 layout: str = "layer_first", mtp_draft_buffer_infos: Sequence[Any] = ()) -> None:
        buffer_info.validate()
        if layout not in ("page_first", "page_first_direct"):
            raise AssertionError(f"Unsupported layout: {layout}")
        self.buffer_info, self.mtp_draft_buffer_infos = buffer_info, tuple(mtp_draft_buffer_infos)
        self.page_size, self.layout, self.device, self.pin_memory = 1, layout, device, pin_memory
        infos = (buffer_info, *self.mtp_draft_buffer_infos)
        self.target_layer_num = buffer_info.temporal.shape[0]
        self.layer_num = self.num_mamba_layers = self.target_layer_num + len(self.mtp_draft_buffer_infos)
        self.temporal_device_layers = [layer for info in infos for layer in info.temporal.unbind(0)]
        self.conv_device_layers = [[layer for info in infos for layer in info.conv[i].unbind(0)]
                                   for i in range(len(buffer_info.conv))]
        self.size = int(device_capacity * host_to_device_ratio)
        self.page_num = self.size // self.page_size + 1
        self.size = self.page_num * self.page_size
        L = self.layer_num
        self.temporal_buffer = torch.zeros((self.size, L, 1, *buffer_info.temporal.shape[2:]),
                                           dtype=buffer_info.temporal.dtype)
        self.conv_buffer = [torch.zeros((self.size, L, 1, *c.shape[2:]), dtype=c.dtype) for c in buffer_info.conv]
        self.kv_buffer: Any = [self.temporal_buffer, *self.conv_buffer]
        self.size_per_token = sum(t[0].numel() * t.element_size() for t in self.kv_buffer)
        self.can_use_write_back_jit = True
        self.clear()

    def _states(self) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        return [(self.temporal_buffer, self.temporal_device_layers),
                *zip(self.conv_buffer, self.conv_device_layers, strict=True)]

    def backup_from_device_all_layer(self, device_pool: Any, host_indices: torch.Tensor,
                                     device_indices: torch.Tensor, io_backend: str = "kernel") -> None:
        self._check_io(io_backend, host_indices)
        index_pairs = pairs(host_indices, device_indices)
        for state, (host, layers) in enumerate(self._states()):
            for layer in range(self.layer_num):
                if planted_bug() == "mamba_conv" and state > 0 and layer == self.layer_num - 1:
                    continue
                for h, d in index_pairs:
                    host[h, layer, 0].copy_(layers[layer][d])

    def load_to_device_per_layer(self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str = "kernel", *, is_draft: bool = False) -> None:
        self._check_io(io_backend, host_indices)
        for host, layers in self._states():
            for d, h in pairs(device_indices, host_indices):
                layers[layer_id][d].copy_(host[h, layer_id, 0])
