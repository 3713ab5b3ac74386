"""Fake device pool infos: the Mamba state buffers and the packed page rows device pools expose (sglang's field
names, validate), and the MHA pools' KV scale buffers with their layout."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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


@dataclass(frozen=True, kw_only=True)
class PageRowBufferInfo:
    slab: torch.Tensor
    rows: tuple[torch.Tensor, ...]
    row_bytes: int
    page_size: int
    num_pages: int

    def validate(self, *, layer_ids: tuple[int, ...] | None = None) -> None:
        expected = (len(self.rows), self.num_pages, self.row_bytes)
        if tuple(self.slab.shape) != expected or self.slab.dtype != torch.uint8 or not self.slab.is_contiguous():
            raise ValueError(f"Page rows: slab shape={tuple(self.slab.shape)}, expected contiguous uint8 {expected}")
        for layer, row in enumerate(self.rows):
            if row.data_ptr() != self.slab[layer].data_ptr():
                raise ValueError(f"Page rows: rows[{layer}] is not slab[{layer}]")


class KVScaleLayout(Enum):
    TOKEN = "token"
    MXFP8_INTERLEAVED = "mxfp8_interleaved"


@dataclass(frozen=True, kw_only=True)
class KVScaleBuffers:
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    layout: KVScaleLayout
