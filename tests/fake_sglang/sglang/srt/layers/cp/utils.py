"""Fake ``sglang.srt.layers.cp.utils``: the contiguous layer split of context-parallel ranks (sglang's
``get_layer_shard_range``: as even as possible, the first ``total_layers % shard_size`` ranks one layer more)."""

from __future__ import annotations


def get_layer_shard_range(rank: int, shard_size: int, total_layers: int) -> tuple[int, int]:
    base = total_layers // shard_size
    rem = total_layers % shard_size
    start = rank * base + min(rank, rem)
    return start, start + base + (1 if rank < rem else 0)
