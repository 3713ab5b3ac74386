"""The direct io backend (``--hicache-io-backend direct``) in sglang-hicache's draw and in sglang-pool's transfers:
drawn as often as ``kernel`` where a class moves the case's layout with both, replaced by the other io backend
where only that one moves it (``sglang_pool_calls.io_backend_for``, one rule for both backends), and run by
sglang-pool through the fake sglang with ``direct`` on every host pool call."""

from __future__ import annotations

import collections
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.engine.campaign_case import backend_space, campaign_case
from hicache_fuzz.harness.engine.mix import DEFAULT_MIX, TransferProfile
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec, make_tuning
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import sglang_aot, sglang_pool
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.base import Availability, Backend, Plan
from hicache_fuzz.kernels.buffers import Materialized
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import IO_BACKENDS, case_settings, operation_kinds
from hicache_fuzz.kernels.sglang_pool import SglangPoolBackend
from hicache_fuzz.kernels.sglang_pool_calls import io_backend, io_backend_for
from hicache_fuzz.oracles import pool_layouts
from hicache_fuzz.oracles.contract import Platform
from tests.kernels._hicache_helpers import fake_sglang, hicache_case

__all__ = ["fake_sglang"]  # the fixture, used by name

H200 = Platform("cuda", (9, 0))
KERNEL, DIRECT = pool_layouts.KERNEL, pool_layouts.DIRECT
LF, PF, PFD, PH = HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD
# The default campaign's seed (hicache-fuzz fuzz, the mutation runs); a costly backend runs every 6th index.
CAMPAIGN_SEED, EVERY = 2026, 6


# ---- sglang-hicache's draw -------------------------------------------------------------------------------------

def test_the_io_backend_knob_draws_kernel_and_direct_equally() -> None:
    counts = collections.Counter(IO_BACKENDS)
    assert set(counts) == set(pool_layouts.IO_BACKENDS) and counts[KERNEL] == counts[DIRECT]


def test_the_default_campaign_meets_direct_early_on_both_layouts() -> None:
    """Within the default campaign's first 400 indices (sglang-hicache runs every 6th), the cases resolved to
    direct io take both layouts that have it, and an MHA pool is loaded with direct io on layer_first (at two
    kernel draws to one, the first such load came at index 1,686)."""
    backend = SglangHicacheBackend()
    space = backend_space(backend, CaseSpace(), H200, CAMPAIGN_SEED)
    profile = TransferProfile.calibrate(backend, space, H200)
    direct_layouts: set[HostLayout] = set()
    mha_layer_first_loads = 0
    for index in range(0, 400, EVERY):
        case = campaign_case(CAMPAIGN_SEED, index, backend, space, H200, DEFAULT_MIX, profile)
        if backend.unsupported_reason(case, H200) is not None:
            continue
        name, io, _start, _drafts = case_settings(case)
        if io != DIRECT:
            continue
        direct_layouts.add(case.layout)
        mha_layer_first_loads += (name == "MHATokenToKVPoolHost" and case.layout is LF
                                  and "load" in operation_kinds(case))
    assert direct_layouts == {LF, PFD}
    assert mha_layer_first_loads >= 1


def test_layer_first_standard_cases_take_each_io_backend_about_half_the_time() -> None:
    """Over plain draws, the MHA and MLA classes' layer_first cases (both io backends move it) resolve to direct
    about half the time (a third with two kernel draws to one); page_first_direct is direct only."""
    space = SglangHicacheBackend().case_space(CaseSpace(), H200)
    io_by_layout: dict[HostLayout, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for index in range(3000):
        case = case_for_index(11, index, space)
        name, io, _start, _drafts = case_settings(case)
        if name in ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost"):
            io_by_layout[case.layout][io] += 1
    lf = io_by_layout[LF]
    assert 0.42 < lf[DIRECT] / (lf[DIRECT] + lf[KERNEL]) < 0.58, lf
    assert set(io_by_layout[PFD]) == {DIRECT} and set(io_by_layout[PF]) == set(io_by_layout[PH]) == {KERNEL}


# ---- the shared rule: a knob the class cannot take for the layout -------------------------------------------

@pytest.mark.parametrize(("layout", "wanted", "resolved"), [
    (LF, KERNEL, KERNEL), (LF, DIRECT, DIRECT),
    (PF, DIRECT, KERNEL),  # the server would turn page_first into page_first_direct; the case keeps its layout
    (PFD, KERNEL, DIRECT),  # the server's own resolution (resolve_layout_io_compatibility)
    (PH, DIRECT, KERNEL),
    (LF, "kernel_ascend", "kernel_ascend"),  # no io backend of this harness: kept, and refused by the backends
])
def test_both_backends_resolve_the_io_knob_by_one_rule(layout: HostLayout, wanted: str, resolved: str) -> None:
    mha = pool_layouts.pool_class("MHATokenToKVPoolHost")
    assert io_backend_for(mha, layout, wanted) == resolved
    hicache = hicache_case(Attention.MHA, layout, io_backend=wanted)
    assert case_settings(hicache)[1] == resolved
    assert io_backend(hicache.replace(backend="sglang-pool")) == resolved


# ---- sglang-pool -----------------------------------------------------------------------------------------------

GROUP = (PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 8), PoolSpec("side", Attention.MLA, KVDtype.BF16, 1, 24))


def pool_case(layout: HostLayout = LF, direction: Direction = Direction.LOAD_BACK, io: str = DIRECT,
              controller: str = "hybrid", pools: tuple[PoolSpec, ...] = GROUP[:1]) -> Case:
    """Two pages of 2 tokens; host pages 3 and 1 (out of order, so the direct io's move_indices sorts them and
    the device indices with them), device pages 1 and 2."""
    case = hicache_case(Attention.MHA, layout, direction=direction, host_pages=5)
    return case.replace(backend="sglang-pool", pools=pools, host_indices=(6, 7, 2, 3),
                        tuning=make_tuning({"controller": controller, "io_backend": io}))


class FakeSglangPool(Backend):
    """sglang-pool's own run() on CPU storages, the fake sglang the module it calls (which records no path: the
    plan's path is checked on its own)."""

    name = "sglang-pool"

    def __init__(self) -> None:
        self.inner = SglangPoolBackend()

    def probe(self, platform: Platform) -> Availability:
        return Availability(True, "the fake sglang on the CPU")

    def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
        return None

    def plan(self, case: Case, platform: Platform) -> Plan:
        return Plan(self.inner.plan(case, platform).entry, "none")

    def run(self, buffers: Materialized) -> str:
        self.inner.run(buffers)
        return "none"


@pytest.fixture
def io_calls(fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, str, str]]]:
    """The fake sglang's pool modules loaded by sglang-pool; yields (layout, io backend, host index device, device
    index device) of every transfer call a fake host pool receives."""
    monkeypatch.setattr(common, "hicache", lambda: importlib.import_module(common.HICACHE_MODULE))
    monkeypatch.setattr(sglang_aot, "aot_status", lambda: (True, "the fake sgl_kernel"))
    monkeypatch.setattr(sglang_pool, "_MODS", None)
    base = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    calls: list[tuple[str, str, str, str]] = []

    def recorded(method: Any) -> Any:
        def call(self: Any, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor,
                 *rest: Any, **kwargs: Any) -> Any:
            calls.append((self.layout, rest[-1], host_indices.device.type, device_indices.device.type))
            return method(self, device_pool, host_indices, device_indices, *rest, **kwargs)
        return call

    for name in ("backup_from_device_all_layer", "load_to_device_per_layer"):
        monkeypatch.setattr(base.HostPool, name, recorded(getattr(base.HostPool, name)))
    yield calls


@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize("direction", [Direction.WRITE_BACK, Direction.LOAD_BACK])
@pytest.mark.parametrize("pools", [GROUP[:1], GROUP[1:], GROUP], ids=["mha", "mla", "group"])
def test_a_direct_pool_case_moves_its_bytes_with_direct_io(io_calls: list[tuple[str, str, str, str]],
                                                           controller: str, direction: Direction,
                                                           pools: tuple[PoolSpec, ...]) -> None:
    case = pool_case(direction=direction, controller=controller, pools=pools)
    result = run_case(case, FakeSglangPool(), H200, torch.device("cpu"))
    assert result.outcome is Outcome.PASS, result.summary
    # the controller's move_indices keeps both index lists on the CPU for direct io
    assert io_calls and set(io_calls) == {("layer_first", DIRECT, "cpu", "cpu")}
    assert SglangPoolBackend().plan(case, H200).path == "aot:transfer_kv_direct"
    assert SglangPoolBackend().coverage_labels(case)["io_backend"] == DIRECT


def test_a_page_first_pool_case_takes_kernel_io_whatever_the_knob(io_calls: list[tuple[str, str, str, str]]) -> None:
    """The fake's page_first pools refuse direct io, as sglang's do ("Unsupported layout")."""
    case = pool_case(PF, Direction.WRITE_BACK)
    assert run_case(case, FakeSglangPool(), H200, torch.device("cpu")).outcome is Outcome.PASS
    assert {io for _layout, io, _h, _d in io_calls} == {KERNEL}
    assert SglangPoolBackend().coverage_labels(case)["io_backend"] == KERNEL
    assert not SglangPoolBackend().plan(case, H200).path.startswith("aot:transfer_kv_direct")


def test_a_pool_case_of_an_unknown_io_backend_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (True, "assumed"))
    reason = SglangPoolBackend().unsupported_reason(pool_case(io="kernel_ascend"), H200)
    assert reason == "unknown io_backend 'kernel_ascend'"


def test_a_direct_pool_case_is_unsupported_where_the_aot_ops_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the accelerator is this machine's: probed
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (False, "no sgl_kernel"))
    backend = SglangPoolBackend()
    reason = backend.unsupported_reason(pool_case(), H200)
    assert reason == "reaches the AOT op transfer_kv_direct, unavailable here (no sgl_kernel)"
    jit_rows = (PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 64),)  # 256-byte rows: the JIT register kernel
    assert backend.unsupported_reason(pool_case(io=KERNEL, pools=jit_rows), H200) is None


def test_sglang_pool_draws_direct_on_layer_first_about_half_the_time() -> None:
    space = SglangPoolBackend().case_space(CaseSpace(), H200)
    io_by_layout: dict[HostLayout, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for index in range(2000):
        case = case_for_index(7, index, space)
        io_by_layout[case.layout][io_backend(case)] += 1
    lf = io_by_layout[LF]
    assert 0.42 < lf[DIRECT] / (lf[DIRECT] + lf[KERNEL]) < 0.58, lf
    assert set(io_by_layout[PF]) == {KERNEL}


def test_a_prediction_assumes_the_aot_ops_for_a_pool_case_that_reaches_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """sglang-pool's direct-io cases reach sgl_kernel's AOT ops. A prediction for a CUDA machine made without one
    (fuzz --dry-run) runs them, as sglang-hicache's, and says it assumed the ops; on the accelerator itself the
    probe decides."""
    backend, case = SglangPoolBackend(), pool_case()
    assert backend.plan(case, H200).path == "aot:transfer_kv_direct"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend.unsupported_reason(case, H200) is None
    assert backend.prediction_assumptions(H200) == (f"sgl_kernel's AOT ops: {sglang_pool.AOT_ASSUMED}",)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (False, "no sgl_kernel"))
    assert backend.prediction_assumptions(H200) == ()
