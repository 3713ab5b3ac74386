"""Fake pool names."""

from enum import Enum


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    INDEXER = "indexer"
