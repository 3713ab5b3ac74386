"""Fake pool names, hit policies and the per-pool transfer descriptor (sglang's field names)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    INDEXER = "indexer"
    DRAFT_INDEXER = "draft_indexer"


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Any = None
    device_indices: Any = None
    keys: list[str] | None = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: list[Any] | None = None
    indices_from_pool: PoolName | None = None


@dataclass(frozen=True)
class SidecarPoolSpec:
    pool_name: PoolName
    indices_from_pool: PoolName
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
