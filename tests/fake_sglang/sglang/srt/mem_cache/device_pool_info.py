"""Fake device pool infos: the Mamba state buffers a device Mamba pool exposes (sglang's field names, validate)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class MambaStateBufferInfo:
    temporal: torch.Tensor
    conv: tuple[torch.Tensor, ...]
    extra_checkpoint_buffers: tuple[torch.Tensor, ...] = ()

    def validate(self, *, layer_ids: tuple[int, ...] | None = None) -> None:
        if self.temporal.ndim < 2 or not self.conv:
            raise ValueError("Mamba temporal requires [layer, checkpoint, ...] and conv buffers")
        for index, buffer in enumerate(self.conv):
            if buffer.shape[:2] != self.temporal.shape[:2]:
                raise ValueError(f"Mamba conv[{index}] must start with the temporal layer/checkpoint axes")
