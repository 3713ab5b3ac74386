"""sglang's JIT HiCache gate, written once: on a platform, does the register kernel tile a row, and does the TMA
kernel take a row at a page size (hicache.py ``_tiles_across_lanes``, ``use_hicache_tma_kernel``).

The contract (oracles/contract.py) asks it with sglang 0.5.23's constants (harness/model/copy_rules.py); the
sglang backends (kernels/sglang_common.py) ask it with the copy rounds and TMA stage read from the installed
sglang, and add the environment switch and their forcing modes. The arithmetic is copy_rules'; this module adds
what the platform decides, so copy_rules stays importable by the stand-alone ISA check.
"""

from __future__ import annotations

from collections.abc import Sequence

from hicache_fuzz.harness.model.copy_rules import (
    TMA_MAX_ROW_BYTES,
    copy_round,
    group_bytes,
    register_lanes,
    register_unroll,
    tma_rows_per_chunk,
)
from hicache_fuzz.harness.model.platform import Platform

TMA_ROW_ALIGN_BYTES = 16  # the TMA kernel's bulk copies move rows of 16-byte multiples


def register_tiles_row(row_bytes: int, platform: Platform, unroll: int | None = None,
                       rounds: Sequence[int] | None = None) -> bool:
    """``_tiles_across_lanes``: at `unroll` (sglang's default for the row when None) some copy round tiles the row
    and splits evenly across the lanes. `rounds`: the platform's copy rounds, sglang 0.5.23's when None."""
    lanes = register_lanes(unroll or register_unroll(row_bytes))
    widths = group_bytes(platform.is_hip) if rounds is None else rounds
    return bool(lanes) and copy_round(row_bytes, lanes, widths) > 0


def tma_takes_row(row_bytes: int, page_size: int | None, platform: Platform,
                  stage_bytes: int = TMA_MAX_ROW_BYTES) -> bool:
    """``use_hicache_tma_kernel`` with ``SGLANG_HICACHE_TMA_TRANSFER`` on: CUDA sm90+, rows of 16-byte multiples,
    pages that tile a chunk of ``tma_rows_per_chunk`` rows (no page size trusts the indices). The module is taken
    to build and fit the device (a module that does not is a silent fallback, B10)."""
    if not platform.has_tma or row_bytes % TMA_ROW_ALIGN_BYTES:
        return False
    return page_size is None or page_size % tma_rows_per_chunk(row_bytes, stage_bytes) == 0
