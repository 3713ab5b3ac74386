"""Fake device pool infos: the Mamba state buffers and the packed page rows device pools expose (sglang's field
names, validate), the MHA pools' KV scale buffers with their layout, and the MLA pool's rows (``MLABufferInfo``:
the layers a host pool gets, by their slots in the device pool)."""

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


@dataclass(frozen=True, kw_only=True)
class MLABufferInfo:
    buffers: tuple[torch.Tensor, ...]
    data_ptrs: torch.Tensor | None
    layer_indices: tuple[int, ...]
    device_layer_num: int
    page_size: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    kv_cache_dim: int
    dtype: torch.dtype
    device: torch.device
    packed_fp8: bool = False
    scales: tuple[torch.Tensor, ...] | None = None

    def validate(self, *, layer_ids: tuple[int, ...] | None = None) -> None:
        if layer_ids is not None and len(layer_ids) != len(self.layer_indices):
            raise ValueError(f"MLA model layers={layer_ids} differ from buffer slots={self.layer_indices}")
        if len(set(self.layer_indices)) != len(self.layer_indices) or any(
                i < 0 or i >= self.device_layer_num for i in self.layer_indices):
            raise ValueError(f"MLA slots={self.layer_indices} outside device_layer_num={self.device_layer_num}")
        if len(self.buffers) != len(self.layer_indices):
            raise ValueError(f"MLA buffers={len(self.buffers)}, slots={self.layer_indices}")
        for tensor in self.buffers:
            if tensor.ndim != 3 or tensor.shape[1] != 1 or tensor.dtype != self.dtype:
                raise ValueError(f"MLA buffer {tuple(tensor.shape)} {tensor.dtype} is no (rows, 1, dim) {self.dtype}")
