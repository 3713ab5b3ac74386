"""Fake HiCacheController: the index placement methods the standalone pool scripts call unbound."""

from __future__ import annotations

from typing import Any

import torch


class HiCacheController:
    io_backend: str
    device: Any
    mem_pool_host: Any

    def move_indices(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return host_indices.to(self.device), device_indices.to(self.device)

    def _move_op_indices(self, op: Any) -> tuple[torch.Tensor, ...]:
        return self.move_indices(op.host_indices, op.device_indices)

    def _move_write_operation(self, op: Any) -> tuple[Any, ...]:
        if self.io_backend == "kernel" and getattr(self.mem_pool_host, "can_use_write_back_jit", False):
            return op.host_indices, op.device_indices.to(self.device), op
        host_indices, device_indices = self._move_op_indices(op)
        return host_indices, device_indices, op
