"""Fake ``page_unified`` page block (sglang's ``PageUnifiedLayout``): the same fields, validation, geometry and L3
chunk span, a frozen keyword-only record as sglang's msgspec struct.

``FAKE_SGLANG_POOL_BUG`` plants one bug of sglang's source mutants here:

* ``pu_group_and``: the 16-byte group row check tests bit 4 (``group_bytes & 16``), so 16-, 48- and 80-byte groups
  are refused and 8-byte ones pass;
* ``pu_span_empty``: ``chunk_span`` takes an empty layer range (``start <= end``) and returns a zero-length span;
* ``pu_span_start``: ``chunk_span`` refuses every range that starts at layer 0;
* ``pu_span_offset``: ``chunk_span`` divides the start layer by the layer's bytes instead of multiplying.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_cache.pool_host.base import planted_bug

PAGE_UNIFIED_OBJECT_LAYOUT = "page-unified-v1"


@dataclass(frozen=True, kw_only=True)
class PageUnifiedLayout:
    page_size: int
    layer_num: int
    head_num: int
    head_group_num: int
    head_dim: int
    itemsize: int
    is_mla: bool = False

    def __post_init__(self) -> None:
        for name in ("page_size", "layer_num", "head_num", "head_group_num", "head_dim", "itemsize"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive: {self}")
        if self.head_num % self.head_group_num != 0:
            raise ValueError(f"head_group_num={self.head_group_num} must divide the pool's {self.head_num} kv heads.")
        if self.is_mla and (self.head_group_num != 1 or self.head_num != 1):
            raise ValueError(f"MLA page blocks have no head axis: {self}")
        misaligned = self.group_bytes & 16 != 0 if planted_bug() == "pu_group_and" else self.group_bytes % 16 != 0
        if misaligned:
            raise ValueError(f"one head group's token row is {self.group_bytes} bytes, which the page_unified "
                             f"transfer kernels cannot move: they require a multiple of 16.")

    @property
    def components(self) -> int:
        return 1 if self.is_mla else 2

    @property
    def heads_per_group(self) -> int:
        return self.head_num // self.head_group_num

    @property
    def group_bytes(self) -> int:
        return self.heads_per_group * self.head_dim * self.itemsize

    @property
    def layer_bytes(self) -> int:
        return self.components * self.page_size * self.group_bytes

    @property
    def head_group_bytes(self) -> int:
        return self.layer_num * self.layer_bytes

    @property
    def bytes_per_page(self) -> int:
        return self.head_group_num * self.head_group_bytes

    def page_dims(self, page_num: int) -> tuple[int, ...]:
        if self.is_mla:
            return (page_num, self.layer_num, self.page_size, self.head_dim)
        return (page_num, self.head_group_num, self.layer_num, self.components, self.page_size,
                self.heads_per_group, self.head_dim)

    def chunk_span(self, layer_range: tuple[int, int], head_group: int = 0) -> tuple[int, int]:
        start, end = layer_range
        bug = planted_bug()
        lowest = 1 if bug == "pu_span_start" else 0
        in_range = lowest <= start <= end if bug == "pu_span_empty" else lowest <= start < end
        if not (in_range and end <= self.layer_num):
            raise ValueError(f"layer range {layer_range} is not a non-empty sub-range of [0, {self.layer_num}).")
        if not 0 <= head_group < self.head_group_num:
            raise ValueError(f"head group {head_group} is outside [0, {self.head_group_num}).")
        into = start // self.layer_bytes if bug == "pu_span_offset" else start * self.layer_bytes
        return head_group * self.head_group_bytes + into, (end - start) * self.layer_bytes
