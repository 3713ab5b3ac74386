"""Shared helpers of the fake sglang: index pairing (where the correct and the buggy variant differ) and
byte access to raw addresses (the pointer tables the real kernels dereference on the GPU).

The correct variant rejects unequal index lists and, for the ops that launch one block per index (the JIT
register/TMA ops and the AOT ops), an empty list. ``FAKE_SGLANG_BUG=1`` selects the buggy variant: unequal
lists are accepted (surplus indices ignored), an empty list returns silently, and the last index pair is never
moved.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import torch


def buggy() -> bool:
    return os.environ.get("FAKE_SGLANG_BUG") == "1"


def indices(tensor: torch.Tensor) -> list[int]:
    return [int(x) for x in tensor.to("cpu", torch.int64).tolist()]


def pairs(dst: torch.Tensor | Sequence[int], src: torch.Tensor | Sequence[int], *,
          empty_ok: bool = True) -> list[tuple[int, int]]:
    """(destination, source) index pairs, after the entry checks."""
    d = indices(dst) if isinstance(dst, torch.Tensor) else list(dst)
    s = indices(src) if isinstance(src, torch.Tensor) else list(src)
    if buggy():
        return list(zip(d, s, strict=False))[:-1]  # the bug: no checks, and the last pair is dropped
    if len(d) != len(s):
        raise ValueError(f"fake sglang: index lists differ in length ({len(d)} vs {len(s)})")
    if not d and not empty_ok:
        raise ValueError("fake sglang: zero-length launch")
    return list(zip(d, s, strict=True))


def at(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor aliasing `nbytes` of memory at `address` (a pointer-table entry)."""
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


def row_bytes(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Row `index` (first axis) of a typed tensor, as uint8 (one contiguous row)."""
    return tensor[index].reshape(-1).view(torch.uint8)


def copy_rows(dst_base: int, dst_stride: int, src_base: int, src_stride: int, row: int,
              index_pairs: list[tuple[int, int]]) -> None:
    for d, s in index_pairs:
        ctypes.memmove(dst_base + d * dst_stride, src_base + s * src_stride, row)


def table(pointers: torch.Tensor) -> list[int]:
    return [int(p) for p in pointers.view(torch.int64).tolist()]


def stride_bytes(tensor: torch.Tensor, axis: int = 0) -> int:
    return tensor.stride(axis) * tensor.element_size()


def page_pairs(dst: torch.Tensor, src: torch.Tensor, page_size: int) -> list[tuple[int, int]]:
    """Page-granular moves: the first index of each page and the next page_size - 1 rows."""
    d, s = indices(dst), indices(src)
    if len(d) != len(s) and not buggy():
        raise ValueError(f"fake sglang: index lists differ in length ({len(d)} vs {len(s)})")
    firsts = zip(d[::page_size], s[::page_size], strict=False)
    moves = [(a + t, b + t) for a, b in firsts for t in range(page_size)]
    return moves[:-1] if buggy() else moves  # the bug: the last row is dropped
