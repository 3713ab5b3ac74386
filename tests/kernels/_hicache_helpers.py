"""Shared by the sglang-hicache tests: the fake sglang imported in-process, a CPU variant of the backend that
drives it, and small hand-made cases."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

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
    make_tuning,
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import sglang_hicache_drive
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend

FAKE = Path(__file__).resolve().parents[1] / "fake_sglang"
CPU = Platform("cpu")


def _sglang_modules() -> list[str]:
    return [k for k in sys.modules if k.split(".")[0] in ("sglang", "sgl_kernel")]


def _with_fake_sglang() -> Iterator[None]:
    saved = {k: sys.modules.pop(k) for k in _sglang_modules()}
    sys.path.insert(0, str(FAKE))
    try:
        yield
    finally:
        sys.path.remove(str(FAKE))
        for k in _sglang_modules():
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture
def fake_sglang() -> Iterator[None]:
    """tests/fake_sglang importable as sglang for one test; sys.path and sys.modules as before afterwards."""
    yield from _with_fake_sglang()


@pytest.fixture(scope="module")
def fake_sglang_module() -> Iterator[None]:
    """The same for a whole module (Hypothesis tests cannot take function-scoped fixtures)."""
    yield from _with_fake_sglang()


# The device the fake sglang's JIT gate stands for (sm90 CUDA: TMA): the platform of the transfer rules that
# depend on whether the JIT kernel takes a row.
SM90 = Platform("cuda", (9, 0))
# The program of the shard and device-shape tests: two back-ups, loads and an eviction between them.
SHARD_OPS = "backup,load,evict,backup,load"
# Latent rows (elements of bf16): 24 (48 bytes), which the JIT kernels do not take at page size 2, so sgl_kernel's
# AOT ops move them; 64 (128 bytes), which the register kernel takes (and a page_first page row of 128 bytes is a
# compiled width).
AOT_ROW, JIT_ROW = 24, 64


class CpuHicacheBackend(SglangHicacheBackend):
    """sglang-hicache on the CPU with the fake sglang: the same case rules (the platform's those of the device the
    fake stands for) and drive."""

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        return self.case_unsupported(case) or self.transfer_unsupported(case, SM90)

    def sglang_modules(self) -> Any:
        return sglang_hicache_drive.load_modules()


def pool_spec(attention: Attention, dtype: KVDtype = KVDtype.BF16) -> PoolSpec:
    if attention is Attention.MLA:
        return PoolSpec("kv", attention, dtype, 1, 24)
    if attention is Attention.MHA_ASYM:
        return PoolSpec("kv", attention, dtype, 2, 8, v_head_dim=4)
    return PoolSpec("kv", attention, dtype, 2, 8)


def hicache_case(attention: Attention = Attention.MHA, layout: HostLayout = HostLayout.PAGE_FIRST, *,
                 page_size: int = 2, pages: int = 2, host_pages: int = 5, device_pages: int = 6, layers: int = 3,
                 direction: Direction = Direction.WRITE_BACK, ops: str = "", **knobs: int | str) -> Case:
    """A small valid case: host pages 1, 3, ... (every other page), device pages from page 1 on, reversed."""
    ps = page_size
    host = tuple(p * ps + t for p in range(1, 2 * pages, 2) for t in range(ps))
    device = tuple(p * ps + t for p in range(pages, 0, -1) for t in range(ps))
    tuning: dict[str, int | str | bool] = dict(knobs)
    if ops:
        tuning["ops"] = ops
    return Case(direction=direction, scope=Scope.ALL_LAYERS, layout=layout, pools=(pool_spec(attention),),
                layers=layers, page_size=ps, device_rows=device_pages * ps, host_slots=host_pages * ps,
                host_indices=host, device_indices=device, host_index=IndexSpec(IndexDtype.INT64, IndexDevice.CPU),
                device_index=IndexSpec(IndexDtype.INT64, IndexDevice.DEVICE), backend="sglang-hicache",
                tuning=make_tuning(tuning), seed=3)


def run_on_cpu(case: Case) -> Result:
    """The case run on the CPU with the fake sglang, predicted for the device the fake's JIT gate stands for (SM90:
    the contract's rules that hang on that gate, as the layer-sharded MLA pool's back-up refusals, are its)."""
    return run_case(case, CpuHicacheBackend(), SM90, torch.device("cpu"))


def run_twice_on_kept_objects(first: Case) -> tuple[CpuHicacheBackend, Case]:
    """Run `first`, then a case of the same geometry with another program and seed, on one backend; assert both pass
    and that the second reused the objects the first built. Returns the backend and the second case."""
    backend = CpuHicacheBackend()
    assert run_case(first, backend, SM90, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept is not None
    built = backend._kept[1]
    second = first.replace(tuning=make_tuning({**dict(first.tuning), "ops": "load,backup"}), seed=11)
    assert run_case(second, backend, SM90, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept[1] is built
    return backend, second
