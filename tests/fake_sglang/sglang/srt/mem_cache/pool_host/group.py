"""Fake HostPoolGroup: the facade's staged-path flag is every child's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class PoolEntry:
    name: str
    host_pool: Any
    device_pool: Any
    layer_mapper: Callable[[int], int]
    is_primary_index_anchor: bool = False


class HostPoolGroup:
    def __init__(self, entries: list[PoolEntry]) -> None:
        self.entries = entries
        self.layout = entries[0].host_pool.layout

    @property
    def can_use_write_back_jit(self) -> bool:
        return all(getattr(e.host_pool, "can_use_write_back_jit", False) for e in self.entries)
