"""Fake unified KV pool (--enable-unified-memory): one uint8 buffer shared by sub-pools, each slot's entry holding
every layer's rows (MHA: K_0 V_0 K_1 V_1 ...; MLA: the latent rows), rows laid out in 16-byte units (other rows
refused) and the entry rounded up to 32 bytes; the MHA and MLA device pools over it hand out per-layer views
``(slots, heads, dim)`` whose rows are one entry apart. Sglang's constructor signatures and checks (one grow-up and
one grow-down end pool, a first allocatable slot past the reserved page 0 of every sub-pool, the unified MLA pool's
store dtype and its lack of a layer range)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

ENTRY_ALIGN_BYTES = 32
ROW_ALIGN_BYTES = 16


def _store_dtype_for(kv_cache_dtype: torch.dtype) -> torch.dtype:
    return torch.uint8 if kv_cache_dtype in (torch.float8_e5m2, torch.float8_e4m3fn) else kv_cache_dtype


def _align(num_bytes: int, unit: int) -> int:
    return -(-num_bytes // unit) * unit


def _check_row_alignment(sub_pool: str, **row_bytes: int) -> None:
    for part, nbytes in row_bytes.items():
        if nbytes % ROW_ALIGN_BYTES:
            raise ValueError(f"--enable-unified-memory needs every per-rank KV row to be a multiple of "
                             f"{ROW_ALIGN_BYTES} bytes; sub-pool {sub_pool!r} has a {nbytes}-byte {part} row.")


@dataclass(frozen=True, kw_only=True)
class MHASubPoolSpec:
    name: str
    layer_num: int
    grow_direction: str
    head_num: int
    head_dim: int
    store_dtype: torch.dtype
    kv_cache_dtype: torch.dtype | None = None
    v_head_dim: int | None = None
    draft_region: Any = None

    def __post_init__(self) -> None:
        assert self.grow_direction in ("up", "down", "float") and self.layer_num > 0
        if self.kv_cache_dtype is None:
            object.__setattr__(self, "kv_cache_dtype", self.store_dtype)
        assert self.store_dtype == _store_dtype_for(self.kv_cache_dtype), "store dtype does not match kv cache dtype"
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)

    def k_row_bytes(self) -> int:
        return self.head_num * self.head_dim * self.store_dtype.itemsize

    def v_row_bytes(self) -> int:
        assert self.v_head_dim is not None
        return self.head_num * self.v_head_dim * self.store_dtype.itemsize

    def entry_bytes(self) -> int:
        return _align(self.layer_num * (self.k_row_bytes() + self.v_row_bytes()), ENTRY_ALIGN_BYTES)

    def views(self, raw: torch.Tensor, slots: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        _check_row_alignment(self.name, K=self.k_row_bytes(), V=self.v_row_bytes())
        assert self.v_head_dim is not None
        stride = self.k_row_bytes() + self.v_row_bytes()
        k = [_view(raw, self.store_dtype, slots, (self.head_num, self.head_dim), self.entry_bytes(), layer * stride)
             for layer in range(self.layer_num)]
        v = [_view(raw, self.store_dtype, slots, (self.head_num, self.v_head_dim), self.entry_bytes(),
                   layer * stride + self.k_row_bytes()) for layer in range(self.layer_num)]
        return k, v


@dataclass(frozen=True, kw_only=True)
class MLASubPoolSpec:
    name: str
    layer_num: int
    grow_direction: str
    kv_lora_rank: int
    qk_rope_head_dim: int
    store_dtype: torch.dtype
    draft_region: Any = None

    def __post_init__(self) -> None:
        assert self.grow_direction in ("up", "down", "float") and self.layer_num > 0
        assert self.kv_lora_rank > 0, f"kv_lora_rank must be positive; got {self.kv_lora_rank}"
        assert self.qk_rope_head_dim > 0, f"qk_rope_head_dim must be positive; got {self.qk_rope_head_dim}"

    @property
    def kv_cache_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def row_bytes(self) -> int:
        return self.kv_cache_dim * self.store_dtype.itemsize

    def entry_bytes(self) -> int:
        return _align(self.layer_num * self.row_bytes(), ENTRY_ALIGN_BYTES)

    def views(self, raw: torch.Tensor, slots: int) -> list[torch.Tensor]:
        _check_row_alignment(self.name, latent=self.row_bytes())
        return [_view(raw, self.store_dtype, slots, (1, self.kv_cache_dim), self.entry_bytes(),
                      layer * self.row_bytes()) for layer in range(self.layer_num)]


def _view(raw: torch.Tensor, dtype: torch.dtype, slots: int, row_shape: tuple[int, ...], entry_bytes: int,
          offset_bytes: int) -> torch.Tensor:
    itemsize = dtype.itemsize
    inner = 1
    strides: list[int] = []
    for size in reversed(row_shape):
        strides.insert(0, inner)
        inner *= size
    return torch.as_strided(raw.view(dtype), (slots, *row_shape), (entry_bytes // itemsize, *strides),
                            offset_bytes // itemsize)


class UnifiedKVPool:
    def __init__(self, *, total_bytes: int, sub_pool_specs: list[Any], device: str, enable_memory_saver: bool,
                 page_size: int = 1, post_capture_active: bool = False, bs1_floor_terms: Any = None,
                 fused_draft: Any = None) -> None:
        assert len(sub_pool_specs) >= 2, f"UnifiedKVPool needs >= 2 sub-pools; got {len(sub_pool_specs)}"
        directions = [s.grow_direction for s in sub_pool_specs]
        assert directions.count("up") == 1 and directions.count("down") == 1, (
            f"UnifiedKVPool needs exactly one grow-up and one grow-down END sub-pool; got directions {directions}")
        self.device, self.total_bytes, self._page_size = device, total_bytes, page_size
        self._specs = {s.name: s for s in sub_pool_specs}
        reserved_floor = max([max(s.entry_bytes() for s in sub_pool_specs)]
                             + [page_size * s.entry_bytes() for s in sub_pool_specs])
        self._raw = torch.zeros(total_bytes, dtype=torch.uint8, device=device)
        self._max_slots: dict[str, int] = {}
        self._views: dict[str, Any] = {}
        for spec in sub_pool_specs:
            max_slots = total_bytes // spec.entry_bytes()
            if max_slots <= -(-reserved_floor // spec.entry_bytes()):
                raise RuntimeError(f"UnifiedKVPool: sub-pool {spec.name!r} fits only {max_slots} slots in "
                                   f"{total_bytes} bytes. Increase total_bytes.")
            self._max_slots[spec.name] = max_slots
            self._views[spec.name] = spec.views(self._raw, max_slots // page_size * page_size)

    def max_slots(self, name: str) -> int:
        return self._max_slots[name]

    def mha_spec(self, name: str) -> MHASubPoolSpec:
        spec = self._specs[name]
        assert isinstance(spec, MHASubPoolSpec)
        return spec

    def mla_spec(self, name: str) -> MLASubPoolSpec:
        spec = self._specs[name]
        assert isinstance(spec, MLASubPoolSpec)
        return spec

    def mha_views_for(self, name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        self.mha_spec(name)
        return self._views[name]  # type: ignore[no-any-return]

    def mla_views_for(self, name: str) -> list[torch.Tensor]:
        self.mla_spec(name)
        return self._views[name]  # type: ignore[no-any-return]


class UnifiedMHATokenToKVPool(MHATokenToKVPool):
    def __init__(self, *, unified_buffer: UnifiedKVPool, sub_pool_name: str, page_size: int = 1,
                 start_layer: int | None = None, end_layer: int | None = None, enable_alt_stream: bool = True) -> None:
        spec = unified_buffer.mha_spec(sub_pool_name)
        self._k_views, self._v_views = unified_buffer.mha_views_for(sub_pool_name)
        rows = unified_buffer.max_slots(sub_pool_name) // page_size * page_size
        assert spec.kv_cache_dtype is not None and spec.v_head_dim is not None
        super().__init__(rows - page_size, page_size, spec.kv_cache_dtype, spec.head_num, spec.head_dim,
                         spec.layer_num, unified_buffer.device, False, v_head_dim=spec.v_head_dim,
                         start_layer=start_layer, end_layer=end_layer, enable_alt_stream=enable_alt_stream)
        self.store_dtype = spec.store_dtype

    def _create_buffers(self) -> None:
        self.k_buffer, self.v_buffer = self._k_views, self._v_views


class UnifiedMLATokenToKVPool(MLATokenToKVPool):
    def __init__(self, *, unified_buffer: UnifiedKVPool, sub_pool_name: str, kv_cache_dtype: torch.dtype,
                 page_size: int = 1) -> None:
        spec = unified_buffer.mla_spec(sub_pool_name)
        assert spec.store_dtype == _store_dtype_for(kv_cache_dtype), "store dtype does not match kv cache dtype"
        self._kv_views = unified_buffer.mla_views_for(sub_pool_name)
        rows = unified_buffer.max_slots(sub_pool_name) // page_size * page_size
        self._store = spec.store_dtype
        super().__init__(rows - page_size, page_size, kv_cache_dtype, spec.kv_lora_rank, spec.qk_rope_head_dim,
                         spec.layer_num, unified_buffer.device, False)

    def _create_buffers(self) -> None:
        self.store_dtype = self._store
        self.kv_buffer = self._kv_views
