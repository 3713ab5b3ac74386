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
    make_tuning,
)
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels import sglang_pool
from hicache_fuzz.kernels import sglang_pool_calls as pool_calls
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import EntryPoint, Platform, Verdict, predict

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


def mk(
    backend: str = "sglang-jit",
    *,
    direction: Direction = Direction.LOAD_BACK,
    scope: Scope = Scope.ONE_LAYER,
    layout: HostLayout = HostLayout.LAYER_FIRST,
    row: int = 256,
    dtype: KVDtype = KVDtype.BF16,
    attention: Attention = Attention.MHA,
    ps: int = 16,
    pages: int = 2,
    pools: tuple[PoolSpec, ...] | None = None,
    hidx: IndexSpec = IndexSpec(),  # noqa: B008 - frozen dataclass
    didx: IndexSpec = IndexSpec(),  # noqa: B008
    tuning: dict | None = None,
    allocator: HostAllocator = HostAllocator.PIN_MEMORY,
) -> Case:
    elems = row // dtype.itemsize
    if pools is None:
        heads = 1 if attention is Attention.MLA else 2
        pools = (PoolSpec("kv", attention, dtype, heads, elems // heads),)
    h = tuple(range(ps, ps + pages * ps))
    d = tuple(range(ps, ps + pages * ps))
    return Case(
        direction=direction,
        scope=scope,
        layout=layout,
        pools=pools,
        layers=2,
        page_size=ps,
        device_rows=(pages + 2) * ps,
        host_slots=(pages + 1) * ps,
        host_indices=h,
        device_indices=d,
        host_index=hidx,
        device_index=didx,
        host_allocator=allocator,
        backend=backend,
        tuning=make_tuning(tuning or {}),
    )


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


# ---- pools and controller placement --------------------------------------------------------------------------

CPU64 = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)
GROUP = (
    PoolSpec("kv", Attention.MHA, KVDtype.BF16, 2, 64),
    PoolSpec("side1", Attention.MLA, KVDtype.BF16, 1, 576),
    PoolSpec("side2", Attention.MHA, KVDtype.BF16, 1, 128, write_back_jit=False),
)


def pool_case(
    pools: tuple[PoolSpec, ...],
    controller: str,
    direction: Direction = Direction.WRITE_BACK,
    layout: HostLayout = HostLayout.PAGE_FIRST,
) -> Case:
    return mk(
        "sglang-pool",
        direction=direction,
        scope=Scope.ALL_LAYERS,
        layout=layout,
        pools=pools,
        hidx=CPU64,
        tuning={"controller": controller},
    )


def test_controller_placement_base_vs_hybrid() -> None:
    D, C = IndexDevice.DEVICE, IndexDevice.CPU
    assert sglang_pool.placements(pool_case(GROUP[:2], "base")) == [(C, D), (C, D)]
    assert sglang_pool.placements(pool_case(GROUP, "base")) == [(D, D)] * 3  # facade = all(children) = False
    assert sglang_pool.placements(pool_case(GROUP, "hybrid")) == [(C, D), (C, D), (D, D)]  # per pool
    assert sglang_pool.placements(pool_case(GROUP, "hybrid", Direction.LOAD_BACK)) == [(D, D)] * 3
    assert sglang_pool.placements(pool_case(GROUP[:1], "base", layout=HostLayout.LAYER_FIRST)) == [(D, D)]


def test_pool_expected_run_reproduces_the_wrong_device_class() -> None:
    paths, stop = sglang_pool.expected_run(pool_case(GROUP, "base"), H200)
    assert paths == [common.STAGED] and "CUDA host indices" in stop
    paths, stop = sglang_pool.expected_run(pool_case(GROUP, "hybrid"), H200)
    assert paths == [common.STAGED, common.STAGED, "aot:transfer_kv_all_layer_lf_pf"] and stop is None


def test_pool_paths() -> None:
    lf = pool_case(GROUP[:1], "hybrid", layout=HostLayout.LAYER_FIRST)
    assert sglang_pool.pool_paths(lf, GROUP[0], H200) == common.REGISTER  # 256 B rows: TMA needs ps % 128
    mla576 = PoolSpec("kv", Attention.MLA, KVDtype.FP8, 1, 576)
    load = pool_case((mla576,), "hybrid", Direction.LOAD_BACK)
    assert sglang_pool.pool_paths(load, mla576, A100) == "aot:transfer_kv_per_layer_mla_pf_lf"
    assert sglang_pool.pool_paths(load, mla576, MI300) == common.REGISTER


def test_pool_unsupported_when_aot_is_needed_but_missing(registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (False, "no sgl_kernel"))
    pool = registry.get("sglang-pool")
    assert "AOT op" in pool.unsupported_reason(pool_case(GROUP, "hybrid"), H200)
    assert pool.unsupported_reason(pool_case(GROUP, "base"), H200) is None  # fails before the AOT pool
    assert pool.plan(pool_case(GROUP, "base"), H200).entry is EntryPoint.REFERENCE


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


def _stand_in_pool(components: tuple[str, ...], layers: int, rows: int, row_bytes: int,
                   seed: int) -> types.SimpleNamespace:
    """What _copy_in/_copy_out read of a materialized pool: its spec's components, the case's layers and
    device rows, per-layer uint8 views of one device payload (layer-major per component), and a host payload."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    device = torch.randint(0, 256, (len(components) * layers * rows * row_bytes,), dtype=torch.uint8,
                           generator=generator)
    host = torch.randint(0, 256, (3 * rows * row_bytes,), dtype=torch.uint8, generator=generator)

    def device_layer(component: str, layer: int) -> torch.Tensor:
        start = (components.index(component) * layers + layer) * rows * row_bytes
        return device[start:start + rows * row_bytes].view(rows, row_bytes)

    return types.SimpleNamespace(spec=types.SimpleNamespace(components=components),
                                 case=types.SimpleNamespace(layers=layers, device_rows=rows),
                                 device_layer=device_layer, device=device, host=types.SimpleNamespace(payload=host))


@pytest.mark.parametrize("attention", [Attention.MHA, Attention.MLA])
def test_pool_copies_move_every_layer_byte_exactly_both_ways(attention: Attention) -> None:
    """The batched layer copies (one _foreach_copy_ a direction) put each of our device layers into sglang's
    per-layer tensor of the same component and layer, and back; and the host payload whole, both ways."""
    import torch

    components = ("kv",) if attention is Attention.MLA else ("k", "v")
    layers, rows, heads, head_dim = 5, 7, 2, 8
    row_bytes = heads * head_dim * 2  # bf16
    ours = _stand_in_pool(components, layers, rows, row_bytes, seed=1)
    ours.spec.attention = attention
    sglang_layers = {c: [torch.zeros(rows, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers)]
                     for c in components}
    device_pool = types.SimpleNamespace(kv_buffer=sglang_layers.get("kv"), k_buffer=sglang_layers.get("k"),
                                        v_buffer=sglang_layers.get("v"))
    host_pool = types.SimpleNamespace(kv_buffer=torch.zeros(3 * rows * row_bytes // 2, dtype=torch.bfloat16))

    sglang_pool._copy_in(ours, device_pool, host_pool)
    for c in components:
        for layer in range(layers):
            assert torch.equal(sglang_layers[c][layer].view(torch.uint8).view(rows, -1), ours.device_layer(c, layer))
    assert torch.equal(host_pool.kv_buffer.view(torch.uint8), ours.host.payload)

    back = _stand_in_pool(components, layers, rows, row_bytes, seed=2)  # other bytes everywhere
    back.spec.attention = attention
    sglang_pool._copy_out(back, device_pool, host_pool)
    assert torch.equal(back.device, ours.device) and torch.equal(back.host.payload, ours.host.payload)


class _GuardedHostPool:
    """sglang 0.5.23's per-layer load guard (`pool_host/mha.py`: `0 <= layer_id < target_layer_num`, else
    return), or the mutant of it that lets the layer just past the range through (`<=`); a layer that gets past
    the guard indexes the pool's per-layer lists, as sglang does."""

    def __init__(self, layers: int, off_by_one: bool = False) -> None:
        self.target_layer_num, self.off_by_one = layers, off_by_one
        self.layer_rows: list[list[int]] = [[] for _ in range(layers)]

    def load_to_device_per_layer(self, device_pool: object, host_indices: object, device_indices: object,
                                 layer_id: int, io_backend: str) -> None:
        inside = (0 <= layer_id <= self.target_layer_num) if self.off_by_one else (
            0 <= layer_id < self.target_layer_num)
        if not inside:
            return
        self.layer_rows[layer_id].append(1)  # IndexError past the end, as sglang's device_k_buffers[layer_id]


def test_pool_load_back_also_loads_the_layers_just_outside_the_pool_and_expects_nothing() -> None:
    """Every load-back case of sglang-pool also asks for layers -1 and `layers` (a draft layer, another pool's):
    sglang's guard skips them; an off-by-one guard lets `layers` through and the case fails (the survivor
    13cd2b6186b7 of the mutation run, reports/mutate/README.md)."""
    case = pool_case(GROUP[:1], "base", Direction.LOAD_BACK)
    transfers = pool_calls.pool_transfers(case)
    foreign = [("load_to_device_per_layer", -1), ("load_to_device_per_layer", case.layers)]
    assert transfers == [("load_to_device_per_layer", layer) for layer in case.moved_layers] + foreign
    guarded = _GuardedHostPool(case.layers)
    for method, layer in foreign:
        sglang_pool.transfer(guarded, method, layer, None, None, None)
    assert guarded.layer_rows == [[] for _ in range(case.layers)]
    with pytest.raises(IndexError):
        for method, layer in foreign:
            sglang_pool.transfer(_GuardedHostPool(case.layers, off_by_one=True), method, layer, None, None, None)


class _AllocatingHostPool:
    """sglang 0.5.23's HostKVCache.alloc/free bookkeeping (pool_host/base.py: free slots, released slots merged
    back when needed, `slot_used` with its double-alloc and double-free checks), or one of two mutants of it:
    `mutant`, the page check `need_size % page_size == 0` written as `need_size & page_size == 0` (refuses odd
    page counts); `free_shift`, `free` clearing `slot_used[indices - 1]` instead of `slot_used[indices]`."""

    def __init__(self, slots: int, page_size: int, mutant: bool = False, free_shift: bool = False) -> None:
        import torch

        self.page_size, self.mutant, self.free_shift = page_size, mutant, free_shift
        self.free_slots = torch.arange(slots, dtype=torch.int64)
        self.slot_used = torch.zeros(slots, dtype=torch.bool)
        self.release_slots: list[object] = []
        self.freed: list[int] = []

    def available_size(self) -> int:
        return len(self.free_slots) + sum(len(r) for r in self.release_slots)  # type: ignore[arg-type]

    def alloc(self, need_size: int) -> object:
        import torch

        ok = (need_size & self.page_size == 0) if self.mutant else (need_size % self.page_size == 0)
        assert ok, "The requested size should be a multiple of the page size."
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots):
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])  # type: ignore[list-item]
            self.release_slots = []
        granted, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        assert not self.slot_used[granted].any(), "Double-alloc detected: slots already allocated"
        self.slot_used[granted] = True
        return granted

    def free(self, indices: object) -> None:
        assert self.slot_used[indices].all(), "Double-free detected: slots not currently allocated"  # type: ignore[index]
        self.slot_used[indices - 1 if self.free_shift else indices] = False  # type: ignore[operator]
        self.release_slots.append(indices)
        self.freed += indices.tolist()  # type: ignore[attr-defined]


def test_every_pool_case_round_trips_its_token_count_through_the_host_allocator() -> None:
    """sglang's allocator grants the case's pages and gets them back; the page-check mutant refuses an odd page
    count, which fails the case (valid input rejected) instead of going unseen."""
    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    pages = case.n // case.page_size
    good = _AllocatingHostPool(case.host_slots, case.page_size)
    sglang_pool._allocator_round_trip(case, good)
    # the case's slots, then the whole pool (the second free of the case's slots was refused: not recorded)
    assert sorted(good.freed) == sorted(list(range(case.n)) + list(range(case.host_slots)))
    assert good.available_size() == case.host_slots and not good.slot_used.any()
    if pages % 2 and case.page_size > 1 and case.n & case.page_size == 0:
        with pytest.raises(AssertionError, match="multiple of the page size"):
            sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size, True))

    class Refusing(_AllocatingHostPool):
        def alloc(self, need_size: int) -> object:
            return None

    with pytest.raises(AssertionError, match="refused"):
        sglang_pool._allocator_round_trip(case, Refusing(case.host_slots, case.page_size))

    class Repeating(_AllocatingHostPool):
        def alloc(self, need_size: int) -> object:
            import torch

            return torch.zeros(need_size, dtype=torch.int64)

        def free(self, indices: object) -> None:
            pass

    if case.n > 1:
        with pytest.raises(AssertionError, match="granted"):
            sglang_pool._allocator_round_trip(case, Repeating(case.host_slots, case.page_size))


def test_the_page_check_mutant_refuses_an_odd_page_count_for_power_of_two_page_sizes() -> None:
    """What the round trip relies on: for page size 16, 3 pages (48 tokens) pass sglang's check and fail the
    mutant's (48 & 16 == 16)."""
    import dataclasses

    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    case = dataclasses.replace(case, page_size=16, host_slots=64, device_rows=80,
                               host_indices=tuple(range(48)), device_indices=tuple(range(16, 64)))
    sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, 16))
    with pytest.raises(AssertionError, match="multiple of the page size"):
        sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, 16, mutant=True))


def test_the_pool_round_trip_sees_a_free_that_leaves_a_slot_marked_used() -> None:
    """The survivor e579ef60fefe of the mutation run (reports/mutate/README.md): `free` clears
    `slot_used[indices - 1]`, so the last slot it frees stays marked used (and the slot before the first is
    cleared). Freeing twice is still refused for a run of slots, so only granting the whole pool again shows it:
    sglang's double-alloc check fires."""
    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    assert case.n > 0
    sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size))
    with pytest.raises(AssertionError, match="Double-alloc"):
        sglang_pool._allocator_round_trip(case, _AllocatingHostPool(case.host_slots, case.page_size, free_shift=True))


def test_the_pool_round_trip_fails_an_allocator_that_takes_a_second_free() -> None:
    class Forgiving(_AllocatingHostPool):
        def free(self, indices: object) -> None:
            self.slot_used[indices] = False  # type: ignore[index]
            self.release_slots = [r for r in self.release_slots if r is not indices] + [indices]

    case = pool_case(GROUP[:1], "base", Direction.WRITE_BACK)
    with pytest.raises(AssertionError, match="second free"):
        sglang_pool._allocator_round_trip(case, Forgiving(case.host_slots, case.page_size))
