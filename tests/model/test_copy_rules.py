"""sglang's copy-round rules, written once (harness/model/copy_rules.py, the JIT gate on a platform in
harness/model/jit_gate.py) for the contract, the sglang backends and the ISA check."""

from __future__ import annotations

import pytest

from hicache_fuzz.harness.isa import check as isa
from hicache_fuzz.harness.model import copy_rules, jit_gate
from hicache_fuzz.harness.model.platform import Platform


@pytest.mark.parametrize(("row", "lanes", "rounds", "expected"), [
    (1152, 8, copy_rules.CUDA_GROUP_BYTES, 128),  # 9 rounds of 128 B, 16 B per lane
    (576, 8, copy_rules.CUDA_GROUP_BYTES, 0),  # 576 is not a multiple of 128
    (576, 8, copy_rules.HIP_GROUP_BYTES, 64),  # HIP falls back to 64-byte rounds, 8 B per lane
    (48, 4, copy_rules.HIP_GROUP_BYTES, 16),  # 16-byte rounds, 4 B per lane
    (48, 8, copy_rules.HIP_GROUP_BYTES, 0),  # 2 B per lane is no package
])
def test_copy_round(row: int, lanes: int, rounds: tuple[int, ...], expected: int) -> None:
    assert copy_rules.copy_round(row, lanes, rounds) == expected


def test_contract_and_isa_apply_the_same_rule() -> None:
    for is_hip, platform in ((False, Platform("cuda", (9, 0))), (True, Platform("rocm"))):
        for row in range(16, 2049, 16):
            for unroll in (1, 2, 4):
                lanes = copy_rules.register_lanes(unroll)
                isa_round = isa.pick_group_bytes(isa.PLATFORM_ROCM if is_hip else isa.PLATFORM_CUDA, row, lanes)
                assert jit_gate.register_tiles_row(row, platform, unroll) == (isa_round > 0), (row, unroll)


@pytest.mark.parametrize(("unroll", "lanes"), [(1, 32), (4, 8), (32, 1), (0, 0), (3, 0), (64, 0)])
def test_register_lanes(unroll: int, lanes: int) -> None:
    assert copy_rules.register_lanes(unroll) == lanes


@pytest.mark.parametrize(("row", "rows"), [(1, 128), (256, 128), (1152, 16), (32768, 1), (65536, 1)])
def test_tma_rows_per_chunk(row: int, rows: int) -> None:
    assert copy_rules.tma_rows_per_chunk(row) == rows
