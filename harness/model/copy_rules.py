"""sglang's copy-round rules for its JIT copy kernels, written once: the constants of hicache.py (copy rounds,
block quotas, the TMA stage), the copy round that tiles a row across lanes, the default unroll, and how many rows
a TMA chunk holds.

Used by the JIT gate (harness/model/jit_gate.py: which kernel takes a row on a platform), the input contract
(oracles/contract.py), the sglang backends (kernels/sglang_common.py, with the constants read from the installed
sglang when there is one) and the stand-alone ISA check (harness/isa), which is why this module imports nothing
but the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence

WARP_LANES = 32  # the logical copy group of the register kernel (hicache.py)
# Copy-round widths pick_group_bytes() tries, widest first (hicache.py GROUP_BYTES): CUDA copies 128-byte
# rounds only; HIP also 64/32/16 bytes.
CUDA_GROUP_BYTES: tuple[int, ...] = (128,)
HIP_GROUP_BYTES: tuple[int, ...] = (128, 64, 32, 16)
PACKAGE_BYTES: tuple[int, ...] = (4, 8, 16)  # what one lane moves per access
TMA_MAX_ROW_BYTES = 32768  # the TMA kernel's stage: rows per chunk x row bytes stays within it
TMA_MAX_ROWS_PER_CHUNK = 128
# Blocks per SM the register kernel is launched with by default (hicache.py DEFAULT_BLOCK_QUOTA), and the TMA
# kernel's (hicache.py TMA_BLOCK_QUOTA; CUDA only).
CUDA_BLOCK_QUOTA = 2
HIP_BLOCK_QUOTA = 32
TMA_BLOCK_QUOTA = 4


def group_bytes(is_hip: bool) -> tuple[int, ...]:
    return HIP_GROUP_BYTES if is_hip else CUDA_GROUP_BYTES


def block_quota(is_hip: bool) -> int:
    return HIP_BLOCK_QUOTA if is_hip else CUDA_BLOCK_QUOTA


def register_unroll(row_bytes: int) -> int:
    """sglang's default unroll for a row size (hicache.py:216-224)."""
    return 4 if row_bytes <= 512 else 2 if row_bytes <= 1024 else 1


def copy_round(row_bytes: int, lanes: int, rounds: Sequence[int]) -> int:
    """The row-tiling rule (sglang's ``_tiles_across_lanes`` / ``pick_group_bytes``): the widest copy round
    that tiles the row and splits evenly across `lanes` lanes into 4/8/16-byte packages; 0 when none does."""
    for width in rounds:
        if width % lanes == 0 and row_bytes % width == 0 and width // lanes in PACKAGE_BYTES:
            return width
    return 0


def register_lanes(unroll: int) -> int:
    """Lanes per copied row for an unroll (0 for an unroll the kernel does not support)."""
    return WARP_LANES // unroll if 0 < unroll <= WARP_LANES and WARP_LANES % unroll == 0 else 0


def tma_rows_per_chunk(row_bytes: int, stage_bytes: int = TMA_MAX_ROW_BYTES) -> int:
    """Largest power of two <= min(stage_bytes // row_bytes, 128), at least 1 (hicache.py:114-119)."""
    limit = max(1, min(stage_bytes // max(row_bytes, 1), TMA_MAX_ROWS_PER_CHUNK))
    rows = 1
    while rows * 2 <= limit:
        rows *= 2
    return rows
