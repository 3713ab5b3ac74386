"""The bug zoo: every mutant is caught by a case of its bug class, and only by its bug class.

Each mutant gets a hand-written case that exercises its bug (it must fail there, and the reference must pass
the same case, so the failure is the bug and not the harness), and where the bug class has an edge, a case
just outside it that the mutant must pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import zoo
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import Platform

CPU = Platform("cpu")
DEVICE = torch.device("cpu")
MHA_256 = PoolSpec(name="kv", attention=Attention.MHA, dtype=KVDtype.BF16, heads=2, head_dim=64)  # 256-byte rows


def tokens(pages: list[int], page_size: int) -> tuple[int, ...]:
    return tuple(p * page_size + t for p in pages for t in range(page_size))


def make_case(*, host_pages: list[int] | None = None, device_pages: list[int] | None = None, page_size: int = 4,
              host_slots: int = 32, device_rows: int = 40, **changes: object) -> Case:
    """A small valid page_first all-layer write-back of two pages; keyword arguments override fields."""
    fields: dict[str, object] = dict(
        direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST, pools=(MHA_256,),
        layers=2, page_size=page_size, device_rows=device_rows, host_slots=host_slots,
        host_indices=tokens(host_pages if host_pages is not None else [2, 0], page_size),
        device_indices=tokens(device_pages if device_pages is not None else [3, 5], page_size), seed=7,
    )
    fields.update(changes)
    return Case(**fields)


def run(backend: Backend, case: Case) -> Outcome:
    return run_case(case.replace(backend=backend.name), backend, CPU, DEVICE).outcome


@dataclass(frozen=True)
class ZooCheck:
    mutant: type[Backend]
    kill: Case  # a case of the bug class: the mutant must fail it
    kill_outcome: Outcome
    spared: tuple[Case, ...] = ()  # cases just outside the bug class: the mutant must pass them


LONG = 64  # pages: one full staging chunk
MLA_64 = PoolSpec(name="kv", attention=Attention.MLA, dtype=KVDtype.FP8, heads=1, head_dim=64)

CHECKS = [
    ZooCheck(zoo.CpuIndicesRejected,
             make_case(host_index=IndexSpec(IndexDtype.INT64, IndexDevice.CPU)), Outcome.WRONGLY_REJECTED,
             (make_case(),)),
    ZooCheck(zoo.StagingChunkOffByOne,
             make_case(page_size=1, layers=1, host_slots=LONG, device_rows=LONG + 1,
                       host_pages=list(range(LONG)), device_pages=list(range(1, LONG + 1))), Outcome.MISMATCH,
             (make_case(page_size=1, layers=1, host_slots=LONG, device_rows=LONG + 1,
                        host_pages=list(range(LONG - 1)), device_pages=list(range(1, LONG))),
              make_case(page_size=1, layers=1, host_slots=LONG, device_rows=LONG + 1,
                        host_pages=list(range(LONG)), device_pages=list(range(1, LONG + 1)),
                        direction=Direction.LOAD_BACK))),
    ZooCheck(zoo.FirstIndexOfPage,
             make_case(host_indices=(8, 10, 9, 11, 0, 1, 2, 3)), Outcome.MISMATCH,
             (make_case(), make_case(host_indices=(8, 10, 9, 11, 0, 1, 2, 3), layout=HostLayout.LAYER_FIRST))),
    # 2 layers x 2048 slots x 256 bytes: each K/V half is 1 MiB, so every V row lies past the 1 MiB wrap.
    ZooCheck(zoo.OffsetWrap32,
             make_case(layout=HostLayout.LAYER_FIRST, host_slots=2048, host_pages=[511, 1]), Outcome.MISMATCH,
             (make_case(layout=HostLayout.LAYER_FIRST),)),
    ZooCheck(zoo.PageHeadWholeWords,  # 12-byte heads: the last 4 bytes of each head are skipped
             make_case(layout=HostLayout.PAGE_HEAD, pools=(PoolSpec(heads=2, head_dim=6),)), Outcome.MISMATCH,
             (make_case(layout=HostLayout.PAGE_HEAD),
              make_case(layout=HostLayout.LAYER_FIRST, pools=(PoolSpec(heads=2, head_dim=6),)))),
    ZooCheck(zoo.WritesPastPages, make_case(), Outcome.MISMATCH,
             # the row after the last page is past the end of both pools: nothing extra to write
             (make_case(host_pages=[7], device_pages=[9]),)),
    ZooCheck(zoo.KVSwappedLastLayer, make_case(), Outcome.MISMATCH,
             (make_case(pools=(MLA_64,)), make_case(scope=Scope.ONE_LAYER, layer=0))),
    ZooCheck(zoo.LastPageDropped, make_case(), Outcome.MISMATCH,
             (make_case(host_indices=(), device_indices=()),)),
    ZooCheck(zoo.Int32DestinationReadAsInt64,
             make_case(host_index=IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE)), Outcome.WRONGLY_REJECTED,
             (make_case(host_index=IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE),
                        device_index=IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE)),
              make_case(device_index=IndexSpec(IndexDtype.INT32, IndexDevice.DEVICE)))),
    ZooCheck(zoo.PageFirstStride, make_case(), Outcome.MISMATCH,
             (make_case(layers=1), make_case(layout=HostLayout.LAYER_FIRST))),
    ZooCheck(zoo.SilentFallback,  # 96-byte rows are not a multiple of 128
             make_case(pools=(PoolSpec(heads=1, head_dim=48),)), Outcome.UNEXPECTED_PATH, (make_case(),)),
    ZooCheck(zoo.EmptyTransferRejected, make_case(host_indices=(), device_indices=()), Outcome.WRONGLY_REJECTED,
             (make_case(),)),
    # 2 layers x 512 slots x 256 bytes = 256 KiB per K/V half: the V half is in the second registration.
    ZooCheck(zoo.HostRegisterChunkAlias,
             make_case(host_slots=512, host_pages=[127, 1], host_allocator=HostAllocator.HOST_REGISTER),
             Outcome.MISMATCH,
             (make_case(host_slots=512, host_pages=[127, 1], host_allocator=HostAllocator.PIN_MEMORY),
              make_case(host_slots=512, host_pages=[127, 1], host_allocator=HostAllocator.HOST_REGISTER,
                        layout=HostLayout.LAYER_FIRST))),
    ZooCheck(zoo.LoadFromWrongLayer, make_case(direction=Direction.LOAD_BACK), Outcome.MISMATCH,
             (make_case(), make_case(direction=Direction.LOAD_BACK, layers=1))),
    ZooCheck(zoo.SortedHostUnpermutedDevice, make_case(layout=HostLayout.LAYER_FIRST), Outcome.MISMATCH,
             (make_case(layout=HostLayout.LAYER_FIRST, host_pages=[0, 2]), make_case())),
    ZooCheck(zoo.RowTailTruncated,  # GLM: 512 fp8 bytes + 16 scale bytes
             make_case(pools=(PoolSpec(attention=Attention.MLA, dtype=KVDtype.FP8, heads=1, head_dim=528),)),
             Outcome.MISMATCH,
             (make_case(pools=(PoolSpec(attention=Attention.MLA, dtype=KVDtype.FP8, heads=1, head_dim=512),)),)),
    ZooCheck(zoo.PoolGroupCapabilityMismatch,
             make_case(pools=(MHA_256, PoolSpec(name="side1", heads=1, head_dim=64, write_back_jit=False))),
             Outcome.WRONGLY_REJECTED,
             (make_case(pools=(MHA_256, PoolSpec(name="side1", heads=1, head_dim=64))),
              make_case(pools=(MHA_256, PoolSpec(name="side1", heads=1, head_dim=64, write_back_jit=False)),
                        direction=Direction.LOAD_BACK))),
]


def test_every_mutant_has_a_check() -> None:
    assert {c.mutant for c in CHECKS} == set(zoo.BACKENDS)
    assert len(zoo.BACKENDS) >= 15


@pytest.mark.parametrize("mutant", zoo.BACKENDS, ids=lambda cls: cls.name)
def test_mutant_is_documented(mutant: type[Backend]) -> None:
    assert mutant.name.startswith("zoo-")
    assert mutant.models_bug and mutant.models_bug[0] == "B" and ":" in mutant.models_bug
    assert mutant.__doc__ and mutant.description
    assert issubclass(mutant, ReferenceBackend)


def test_zoo_is_registered_and_names_are_unique() -> None:
    registry = load_registry()
    names = {b.name for b in registry.zoo()}
    assert {cls.name for cls in zoo.BACKENDS} <= names
    assert len({cls.name for cls in zoo.BACKENDS}) == len(zoo.BACKENDS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.mutant.name)
def test_mutant_is_killed_by_its_bug_class_only(check: ZooCheck) -> None:
    mutant = check.mutant()
    assert run(ReferenceBackend(), check.kill) is Outcome.PASS, "the killing case must be valid for the reference"
    assert run(mutant, check.kill) is check.kill_outcome
    for spared in check.spared:
        assert run(ReferenceBackend(), spared) is Outcome.PASS
        assert run(mutant, spared) is Outcome.PASS, f"flagged outside its bug class: {spared}"
