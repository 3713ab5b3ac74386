"""Fake host pool declarations: what a device pool asks HiCache to keep (sglang's field names and helpers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, SidecarPoolSpec


@dataclass(frozen=True, kw_only=True)
class HostPoolStorageInfo:
    bytes_per_token_per_layer: int
    dtype: torch.dtype

    def page_bytes(self, page_size: int) -> int:
        return self.bytes_per_token_per_layer * page_size


@dataclass(frozen=True, kw_only=True)
class HostPoolDecl:
    pool_name: PoolName
    device_pool: Any
    indices_from_pool: PoolName | None
    layout_source: PoolName | None
    storage_info: HostPoolStorageInfo | None
    host_pool_builder: Any
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    owned_device_layers: tuple[int, ...] | None = None

    @property
    def is_primary(self) -> bool:
        return self.indices_from_pool is None

    @property
    def is_layout_root(self) -> bool:
        return self.layout_source is None

    def sidecar_spec(self) -> SidecarPoolSpec:
        if self.indices_from_pool is None:
            raise ValueError(f"{self.pool_name} is the primary pool and has no sidecar spec")
        return SidecarPoolSpec(pool_name=self.pool_name, indices_from_pool=self.indices_from_pool,
                               hit_policy=self.hit_policy)


def make_kv_pool_decl(pool: Any) -> HostPoolDecl:
    return HostPoolDecl(pool_name=PoolName.KV, device_pool=pool, indices_from_pool=None, layout_source=None,
                        storage_info=None, host_pool_builder=None)
