"""The contract model's rules, checked against the facts in docs/semantics.md (table 3.6)."""

from __future__ import annotations

import pytest

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.copy_rules import tma_rows_per_chunk
from hicache_fuzz.harness.model.jit_gate import register_tiles_row
from hicache_fuzz.oracles.contract import (
    EntryPoint,
    Platform,
    Verdict,
    predict,
)
from hicache_fuzz.oracles.transfer import Semantics

CUDA = Platform("cuda", (9, 0))
HIP = Platform("rocm", (9, 4))


def case_with(row_bytes: int = 256, **changes: object) -> Case:
    base = Case(
        direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
        pools=(PoolSpec(attention=Attention.MLA, dtype=KVDtype.FP8, heads=1, head_dim=row_bytes),), layers=2,
        page_size=4, device_rows=16, host_slots=16, host_indices=(4, 5, 6, 7), device_indices=(8, 9, 10, 11),
    )
    return base.replace(**changes)


@pytest.mark.parametrize(
    ("row", "cuda", "hip"),
    [(128, True, True), (256, True, True), (576, False, True), (656, False, False), (1152, True, True),
     (96, False, True), (64, False, True), (32, False, True), (16, False, False), (1088, False, False),
     (2064, False, False), (4096, True, True)],
)
def test_register_row_size_rules_per_platform(row: int, cuda: bool, hip: bool) -> None:
    assert register_tiles_row(row, CUDA) is cuda
    assert register_tiles_row(row, HIP) is hip


@pytest.mark.parametrize(("row", "rows"), [(128, 128), (512, 64), (576, 32), (1024, 32), (1152, 16), (4096, 8),
                                           (32768, 1)])
def test_tma_rows_per_chunk(row: int, rows: int) -> None:
    assert tma_rows_per_chunk(row) == rows


def test_register_kernel_needs_device_indices_of_one_dtype() -> None:
    ok = case_with()
    assert predict(ok, EntryPoint.JIT_REGISTER, CUDA).verdict is Verdict.ACCEPT
    cpu = ok.replace(host_index=IndexSpec(IndexDtype.INT64, IndexDevice.CPU))
    assert predict(cpu, EntryPoint.JIT_REGISTER, CUDA).verdict is Verdict.REJECT
    mixed = ok.replace(host_index=IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE))
    assert "dtypes differ" in predict(mixed, EntryPoint.JIT_REGISTER, CUDA).describe()
    assert predict(ok.replace(host_indices=(), device_indices=()), EntryPoint.JIT_REGISTER, CUDA).verdict \
        is Verdict.REJECT


def test_staged_needs_cpu_int64_host_indices_and_whole_pages() -> None:
    cpu = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)
    ok = case_with(host_index=cpu)
    prediction = predict(ok, EntryPoint.JIT_STAGED, CUDA)
    assert prediction.verdict is Verdict.ACCEPT
    assert prediction.semantics is Semantics.PAGE_RUNS
    # "Device value [cuda:0] not in the allowed options: [cpu, cuda_host]"
    assert predict(case_with(), EntryPoint.JIT_STAGED, CUDA).verdict is Verdict.REJECT
    assert predict(ok.replace(host_index=IndexSpec(IndexDtype.INT32, IndexDevice.CPU)), EntryPoint.JIT_STAGED,
                   CUDA).verdict is Verdict.REJECT
    partial = ok.replace(host_indices=(4, 5, 6), device_indices=(8, 9, 10))
    assert "whole number" in predict(partial, EntryPoint.JIT_STAGED, CUDA).describe()
    assert predict(case_with(row_bytes=72, host_index=cpu), EntryPoint.JIT_STAGED, CUDA).verdict is Verdict.REJECT


def test_empty_staged_write_back_checks_nothing_but_page_unified_checks_its_group_row() -> None:
    """Zero pages launch nothing: the page_first path then accepts any index device and dtype and any row, while
    the page_unified write-back still checks its group row (sglang hicache.py:809, before its chunk loop).
    A GPU campaign met the second: an empty write-back of a 12-byte group row, rejected by sglang."""
    device64 = IndexSpec(IndexDtype.INT64, IndexDevice.DEVICE)
    empty = case_with(row_bytes=72, host_indices=(), device_indices=(), host_index=device64)
    assert predict(empty, EntryPoint.JIT_STAGED, CUDA).verdict is Verdict.ACCEPT
    unified = empty.replace(layout=HostLayout.PAGE_UNIFIED)
    prediction = predict(unified, EntryPoint.JIT_PAGE_UNIFIED, CUDA)
    assert prediction.verdict is Verdict.REJECT
    assert "not a multiple of 16" in prediction.describe()
    assert "host" not in prediction.describe()  # the index rules belong to the launch, which never comes
    aligned = case_with(row_bytes=80, host_indices=(), device_indices=(), host_index=device64,
                        layout=HostLayout.PAGE_UNIFIED)
    assert predict(aligned, EntryPoint.JIT_PAGE_UNIFIED, CUDA).verdict is Verdict.ACCEPT


def test_aot_needs_cuda_int64_indices() -> None:
    # the ROCm crash: "Destination indices must be a CUDA tensor"
    cpu_host = case_with(host_index=IndexSpec(IndexDtype.INT64, IndexDevice.CPU))
    assert predict(cpu_host, EntryPoint.AOT, HIP).verdict is Verdict.REJECT
    assert predict(case_with(), EntryPoint.AOT, HIP).verdict is Verdict.ACCEPT


def test_tma_only_on_cuda_sm90() -> None:
    assert predict(case_with(), EntryPoint.JIT_TMA, CUDA).verdict is Verdict.ACCEPT
    assert predict(case_with(), EntryPoint.JIT_TMA, HIP).verdict is Verdict.REJECT
    assert predict(case_with(), EntryPoint.JIT_TMA, Platform("cuda", (8, 0))).verdict is Verdict.REJECT
    assert predict(case_with(row_bytes=32784), EntryPoint.JIT_TMA, CUDA).verdict is Verdict.REJECT


def test_kernels_leave_out_of_range_and_duplicates_undefined_reference_rejects() -> None:
    oob = case_with(host_indices=(4, 5, 6, 16))
    assert predict(oob, EntryPoint.JIT_REGISTER, CUDA).verdict is Verdict.UNDEFINED
    assert predict(oob, EntryPoint.REFERENCE, CUDA).verdict is Verdict.REJECT
    dup = case_with(host_indices=(4, 5, 6, 4))
    assert predict(dup, EntryPoint.JIT_REGISTER, CUDA).verdict is Verdict.UNDEFINED
    assert predict(dup, EntryPoint.REFERENCE, CUDA).verdict is Verdict.REJECT
    # duplicate *sources* are fine
    assert predict(case_with(device_indices=(8, 8, 9, 9)), EntryPoint.REFERENCE, CUDA).verdict is Verdict.ACCEPT


def test_page_first_direct_is_page_granular_with_host_page_floor() -> None:
    case = case_with(layout=HostLayout.PAGE_FIRST_DIRECT, host_indices=(5, 6, 7, 8))
    prediction = predict(case, EntryPoint.REFERENCE, Platform())
    assert prediction.semantics is Semantics.PAGE_ALIGNED_HOST
    assert prediction.verdict is Verdict.ACCEPT  # host page 5 // 4 = 1, rows 4..7
    overlapping = case.replace(host_indices=(5, 6, 7, 8, 4, 5, 6, 7), device_indices=(8, 9, 10, 11, 4, 5, 6, 7))
    assert predict(overlapping, EntryPoint.REFERENCE, Platform()).verdict is Verdict.REJECT


def test_length_mismatch_rejected_everywhere() -> None:
    case = case_with(host_indices=(4, 5, 6))
    for entry in EntryPoint:
        assert predict(case, entry, CUDA).verdict is Verdict.REJECT, entry


def test_one_layer_load_back_on_page_unified_is_per_token() -> None:
    case = case_with(layout=HostLayout.PAGE_UNIFIED, direction=Direction.LOAD_BACK, scope=Scope.ONE_LAYER,
                     host_indices=(3, 9, 1, 2))
    prediction = predict(case, EntryPoint.JIT_PAGE_UNIFIED, CUDA)
    assert prediction.semantics is Semantics.PER_TOKEN
    assert prediction.verdict is Verdict.ACCEPT
