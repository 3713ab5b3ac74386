"""CPU tests of the sglang backends: registry listing, probes without a GPU or sglang, path planning,
platform rules, unsupported reasons, controller index placement and the spying machinery.

sglang is not installed here and must not be needed; GPU runs live in tests/gpu/.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

import pytest

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import (
    Attention,
    Direction,
    HostAllocator,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    KVDtype,
    Scope,
    make_tuning,
)
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import EntryPoint, Platform, Verdict, hicache_jit_takes_row, predict

from .sglang_cases import mk

CPU = Platform("cpu")
H200 = Platform("cuda", (9, 0))
A100 = Platform("cuda", (8, 0))
MI300 = Platform("rocm", (9, 4))
NAMES = [
    "sglang-aot",
    "sglang-jit",
    "sglang-jit-register",
    "sglang-jit-tma",
    "sglang-page-unified",
    "sglang-pool",
    "sglang-staged",
]


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    return load_registry()


def test_sglang_is_not_imported_by_listing(registry) -> None:  # type: ignore[no-untyped-def]
    assert set(NAMES) <= set(registry.names())
    assert "sglang" not in sys.modules


@pytest.mark.parametrize("name", NAMES)
def test_probe_says_why_unavailable_on_cpu(registry, name: str) -> None:  # type: ignore[no-untyped-def]
    availability = registry.get(name).probe(CPU)
    assert not availability.available
    assert availability.reason  # shown by `hicache-fuzz backends`


def test_probe_without_sglang_names_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "gpu_reason", lambda platform: None)  # pretend a GPU is there
    monkeypatch.setattr(common, "_hicache", None)
    monkeypatch.setattr(common, "_import_error", None)
    monkeypatch.setitem(sys.modules, common.HICACHE_MODULE, None)  # import fails
    availability = common.probe_sglang(H200)
    assert not availability.available
    assert "cannot import sglang.kernels.ops.kvcache.hicache" in availability.reason


@pytest.fixture
def fresh_aot_loader(tmp_path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """No AOT build (an empty build folder) and no cached loader state, before and after the test."""
    from hicache_fuzz.kernels.aot_build import loader

    monkeypatch.setenv(loader.BUILD_ENV, str(tmp_path))
    loader.reset_for_tests()
    yield
    loader.reset_for_tests()


def test_aot_probe_reports_missing_sgl_kernel(monkeypatch: pytest.MonkeyPatch, fresh_aot_loader) -> None:  # type: ignore[no-untyped-def]
    from hicache_fuzz.kernels import sglang_aot

    monkeypatch.setitem(sys.modules, "sgl_kernel", None)
    ok, why = sglang_aot.aot_status()
    assert not ok and "sgl_kernel does not load" in why and "no AOT build in" in why


def test_aot_probe_recognises_the_stand_in(monkeypatch: pytest.MonkeyPatch, fresh_aot_loader) -> None:  # type: ignore[no-untyped-def]
    from hicache_fuzz.kernels import sglang_aot

    class Placeholder:
        def __call__(self, *a: object) -> None:
            raise NotImplementedError

    pkg = types.ModuleType("sgl_kernel")
    pkg.__file__ = "/x/sgl_kernel_stub/sgl_kernel/__init__.py"
    sub = types.ModuleType("sgl_kernel.kvcacheio")
    sub.transfer_kv_per_layer = Placeholder()  # type: ignore[attr-defined]
    pkg.kvcacheio = sub  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sgl_kernel", pkg)
    monkeypatch.setitem(sys.modules, "sgl_kernel.kvcacheio", sub)
    ok, why = sglang_aot.aot_status()
    assert not ok and "import-only sgl_kernel stand-in" in why and "no AOT build in" in why


# ---- platform rules ------------------------------------------------------------------------------------------


def test_rules_fall_back_to_contract_constants() -> None:
    assert common.platform_rules(H200).group_bytes == (128,)
    assert common.platform_rules(MI300).group_bytes == (128, 64, 32, 16)
    assert common.platform_rules(MI300).block_quota == 32
    assert common.platform_rules(H200).block_quota == 2


@pytest.mark.parametrize(
    ("row", "cuda", "hip"),
    [
        (128, True, True),
        (576, False, True),
        (656, False, False),
        (96, False, True),
        (1152, True, True),
        (1040, False, False),
    ],
)
def test_register_row_rule(row: int, cuda: bool, hip: bool) -> None:
    assert common.register_row_ok(row, H200) is cuda
    assert common.register_row_ok(row, MI300) is hip


def test_tma_gate() -> None:
    assert common.tma_selected(1024, 32, H200)  # rows_per_chunk(1024) = 32
    assert not common.tma_selected(1024, 16, H200)  # page-size rule
    assert common.tma_selected(1024, None, H200)  # no page size: trusts the indices
    assert not common.tma_selected(1024, 32, A100)  # sm80
    assert not common.tma_selected(1024, 32, MI300)  # HIP
    assert not common.tma_selected(520, None, H200)  # row % 16
    assert not common.tma_selected(1024, 32, H200, "off")
    assert common.tma_selected(576, 32, H200, "on")


def test_tma_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(common.TMA_ENV, "0")
    assert not common.tma_selected(1024, 32, H200)
    assert common.tma_selected(1024, 32, H200, "on")


@pytest.mark.parametrize("platform", [H200, A100, MI300])
def test_backends_and_contract_ask_one_jit_gate(platform: Platform) -> None:
    """With sglang's constants at the contract's, the backends' gate (TMA switch on) answers as the contract's."""
    assert common.platform_rules(platform).source == "fallback"
    for row in range(8, 4113, 8):
        for page_size in (1, 3, 8, 16, 64, 128):
            jit = common.tma_selected(row, page_size, platform, "on") or common.register_row_ok(row, platform)
            assert jit == hicache_jit_takes_row(row, page_size, platform), (row, page_size)


# ---- planning ------------------------------------------------------------------------------------------------


def test_jit_plans(registry) -> None:  # type: ignore[no-untyped-def]
    jit, reg, tma = registry.get("sglang-jit"), registry.get("sglang-jit-register"), registry.get("sglang-jit-tma")
    c = mk(row=1024, ps=32)
    assert jit.plan(c, H200).path == common.TMA and jit.plan(c, H200).entry is EntryPoint.JIT_TMA
    assert reg.plan(c, H200).path == common.REGISTER
    assert jit.plan(c, MI300).path == common.REGISTER
    c16 = mk(row=1024, ps=16)
    assert jit.plan(c16, H200).path == common.REGISTER  # page-size rule
    assert tma.plan(c16.replace(tuning=make_tuning({"tma_page_size": False})), H200).path == common.TMA
    mla = mk(row=576, attention=Attention.MLA, dtype=KVDtype.FP8, ps=32)
    assert predict(mla, reg.plan(mla, H200).entry, H200).verdict is Verdict.REJECT  # 576 B: no CUDA register
    assert predict(mla, jit.plan(mla, H200).entry, H200).verdict is Verdict.ACCEPT  # TMA takes it
    assert predict(mla, reg.plan(mla, MI300).entry, MI300).verdict is Verdict.ACCEPT  # HIP 64-byte rounds


def test_unsupported_reasons(registry) -> None:  # type: ignore[no-untyped-def]
    jit = registry.get("sglang-jit")
    assert "CUDA or ROCm" in jit.unsupported_reason(mk(), CPU)
    assert jit.unsupported_reason(mk(), H200) is None
    assert "pageable" in jit.unsupported_reason(mk(allocator=HostAllocator.PAGEABLE), H200)
    assert "page_head" in jit.unsupported_reason(mk(layout=HostLayout.PAGE_HEAD), H200)
    assert "TMA needs" in registry.get("sglang-jit-tma").unsupported_reason(mk(), A100)
    staged = registry.get("sglang-staged")
    w = mk(
        "sglang-staged",
        direction=Direction.WRITE_BACK,
        scope=Scope.ALL_LAYERS,
        layout=HostLayout.PAGE_FIRST,
        hidx=IndexSpec(IndexDtype.INT64, IndexDevice.CPU),
    )
    assert staged.unsupported_reason(w, H200) is None
    assert staged.plan(w, H200).path == common.STAGED
    assert staged.plan(w.replace(host_indices=(), device_indices=()), H200).path == "none"
    pu = registry.get("sglang-page-unified")
    partial = mk(
        "sglang-page-unified", direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_UNIFIED
    )
    partial = partial.replace(host_indices=partial.host_indices[:-1], device_indices=partial.device_indices[:-1])
    assert "partial page" in pu.unsupported_reason(partial, H200)


def test_aot_plan_names_the_op(registry) -> None:  # type: ignore[no-untyped-def]
    aot = registry.get("sglang-aot")
    assert aot.plan(mk(layout=HostLayout.PAGE_FIRST), H200).path == "aot:transfer_kv_per_layer_pf_lf"
    w = mk(
        direction=Direction.WRITE_BACK,
        scope=Scope.ALL_LAYERS,
        attention=Attention.MLA,
        row=576,
        dtype=KVDtype.FP8,
        layout=HostLayout.PAGE_FIRST,
    )
    assert aot.plan(w, H200).path == "aot:transfer_kv_all_layer_mla_lf_pf"
    assert "divides by zero" in aot.unsupported_reason(mk().replace(host_indices=(), device_indices=()), H200)


def test_generated_cases_plan_without_sglang(registry) -> None:  # type: ignore[no-untyped-def]
    for name in NAMES:
        backend = registry.get(name)
        space = backend.case_space(CaseSpace().narrowed(backend=name), H200)
        for i in range(40):
            case = case_for_index(7, i, space)
            if backend.unsupported_reason(case, H200) is None:
                plan = backend.plan(case, H200)
                predict(case, plan.entry, H200)


# ---- spying --------------------------------------------------------------------------------------------------


def test_spies_record_launches_and_memoize_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("fake_hicache")
    calls = {"register": 0}

    class Module:
        def launch_one(self, *a: object) -> str:
            return "ran"

        def fits_device(self, *a: object) -> bool:
            return True

    def _jit_hicache_module(**kw: object) -> Module:
        calls["register"] += 1
        if kw["element_size"] == 96:
            raise RuntimeError("nvcc failed")
        return Module()

    fake._jit_hicache_module = _jit_hicache_module  # type: ignore[attr-defined]
    fake._jit_hicache_tma_module = lambda **kw: Module()  # type: ignore[attr-defined]
    gate_calls = []

    def use_hicache_tma_kernel(**kw: object) -> bool:
        gate_calls.append(kw)
        return True

    fake.use_hicache_tma_kernel = use_hicache_tma_kernel  # type: ignore[attr-defined]
    common._install_jit_spies(fake)
    with common.recording() as events:
        fake._jit_hicache_module(element_size=128, unroll=4, block_quota=2).launch_one()
        fake._jit_hicache_module(element_size=128, unroll=4, block_quota=2).fits_device()
    assert events == [common.REGISTER] and calls["register"] == 1
    for _ in range(2):
        with pytest.raises(RuntimeError, match="nvcc"):
            fake._jit_hicache_module(element_size=96, unroll=4, block_quota=2)
    assert calls["register"] == 2  # the failure was memoized
    with common.tma_forced("off"):
        assert fake.use_hicache_tma_kernel(element_size=1024, block_quota=4, page_size=None) is False
    assert gate_calls == []
    assert common.path_of(["a", "b", "a"]) == "a+b" and common.path_of([]) == "none"


def test_concurrent_first_calls_build_a_module_once() -> None:
    """Warm-up threads of several backends ask for the same module at once: one build, the others wait."""
    import threading
    import time

    fake = types.ModuleType("fake_hicache_concurrent")
    calls: list[int] = []

    def _jit_hicache_module(**kw: object) -> object:
        calls.append(int(kw["element_size"]))  # type: ignore[call-overload]
        time.sleep(0.2)
        if kw["element_size"] == 96:
            raise RuntimeError("nvcc failed")
        return object()

    fake._jit_hicache_module = _jit_hicache_module  # type: ignore[attr-defined]
    fake._jit_hicache_tma_module = lambda **kw: object()  # type: ignore[attr-defined]
    fake.use_hicache_tma_kernel = lambda **kw: False  # type: ignore[attr-defined]
    common._install_jit_spies(fake)

    def build(row: int) -> None:
        with contextlib.suppress(RuntimeError):
            fake._jit_hicache_module(element_size=row, unroll=4, block_quota=2)

    threads = [threading.Thread(target=build, args=(row,)) for row in (128, 96) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(calls) == [96, 128]


def test_aot_spy_wraps_imported_ops() -> None:
    mod = types.ModuleType("fake_pool_module")
    mod.transfer_kv_per_layer = lambda **kw: "done"  # type: ignore[attr-defined]
    common.spy_aot_ops(mod)
    with common.recording() as events:
        assert mod.transfer_kv_per_layer() == "done"
    assert events == ["aot:transfer_kv_per_layer"]


def test_warm_up_skips_unavailable_backends() -> None:
    backends_module = importlib.import_module("hicache_fuzz.kernels.sglang_backends")
    assert backends_module.warm_up(CaseSpace(), CPU) == 0.0
