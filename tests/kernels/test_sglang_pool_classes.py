"""sglang-hicache: every modelled host pool class built by its own constructor and driven by the controller (fake
sglang on the CPU), the unmodelled ones refused with their reason, the generated variety, planted bugs caught."""

from __future__ import annotations

import collections
import importlib
import sys

import pytest
import torch

from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Direction, HostLayout, KVDtype, PoolSpec, make_tuning
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import sglang_hicache_drive
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import case_settings, controller_kind
from hicache_fuzz.oracles import pool_layouts, sequence
from tests.kernels._hicache_helpers import CPU, CpuHicacheBackend, fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

H200 = Platform("cuda", (9, 0))
KIND = {"MHATokenToKVPoolHost": "standard", "MLATokenToKVPoolHost": "standard",
        "AsymmetricMHATokenToKVPoolHost": "standard", "HiSparseMHATokenToKVPoolHost": "hisparse",
        "MHATokenToKOnlyPoolHost": "k_only", "MambaPoolHost": "mamba",
        "MiniMaxM3Nvfp4IndexKPoolHost": "nvfp4_index_k", "MiniMaxM3Nvfp4MainKVPoolHost": "nvfp4_main_kv",
        "DSAIndexerPoolHost": "dsa", "MHATokenToKVPoolMXFP8Host": "mxfp8"}
# The controller each class is driven by where the knob asks for the other one: the Mamba state pool's is
# HiCacheController, the DSA indexer's the HybridCacheController (the group beside its MLA anchor).
FORCED_CONTROLLER = {"MambaPoolHost": "base", "DSAIndexerPoolHost": "hybrid"}


def _combinations() -> list[tuple[str, HostLayout, str]]:
    out = []
    for name in pool_layouts.MODELLED:
        cls = pool_layouts.pool_class(name)
        for io in pool_layouts.IO_BACKENDS:
            out += [(name, layout, io) for layout in sorted(cls.layouts_for(io), key=lambda x: x.value)]
    return out


@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize(("name", "layout", "io"), _combinations())
def test_every_modelled_class_layout_and_io_backend_moves_bytes_exactly(fake_sglang, name: str,
                                                                        layout: HostLayout, io: str,
                                                                        controller: str) -> None:
    cls = pool_layouts.pool_class(name)
    assert cls.attention is not None
    drafts = 2 if cls.drafts else 0
    # page size 1 for one-slot pages; 8 makes the page rows of the 48-byte MLA rows 128-byte aligned; 12 makes the
    # DSA indexer's 576 bytes, a compiled row (its page_first staged write-back compiles one module per width); the
    # MXFP8 pool exists at page size 128 only
    page_size = cls.only_page_size or (1 if cls.slot_pages else 12 if name == "DSAIndexerPoolHost" else (
        8 if cls.kernel_page_row_align > 1 else 3))
    case = hicache_case(cls.attention, layout, page_size=page_size, layers=4,
                        ops="backup,load,evict,backup,load", pool_kind=KIND[name], io_backend=io, start_layer=5,
                        draft_layers=drafts, controller=controller)
    if cls.row_align > 1:  # the MXFP8 pool: rows of whole 32-element scale blocks, of a compiled width (128 bytes)
        case = case.replace(pools=(PoolSpec("kv", cls.attention, KVDtype.BF16, 2, 32),))
    assert case_settings(case) == (name, io, 5, drafts)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    built = sglang_hicache_drive.build(sglang_hicache_drive.load_modules(), case, torch.device("cpu"))
    assert type(built.host_pool).__name__ == name  # the class itself, through its own constructor
    # the Mamba host pool has no layer range of its own: its device pool holds the stage's
    assert getattr(built.host_pool, "start_layer", built.device_pool.start_layer) == 5
    assert built.host_pool.layer_num == case.layers
    assert len(built.drafts) == drafts
    # the Mamba state pool is a side pool under the hybrid controller in production: driven by HiCacheController
    assert controller_kind(case) == FORCED_CONTROLLER.get(name, controller)
    assert type(built.controller).__name__ == {"hybrid": "HybridCacheController", "base": "HiCacheController"}[
        controller_kind(case)]


@pytest.mark.parametrize("name", pool_layouts.UNMODELLED)
def test_unmodelled_classes_are_unsupported_with_their_reason(name: str) -> None:
    case = hicache_case(pool_kind=name)
    reason = SglangHicacheBackend().case_unsupported(case)
    assert reason is not None and reason.startswith(name) and pool_layouts.pool_class(name).unmodelled in reason


def test_knobs_resolve_to_what_the_case_can_have_and_the_rest_is_unsupported() -> None:
    backend = SglangHicacheBackend()
    asym_layer_first = hicache_case(Attention.MHA_ASYM, HostLayout.LAYER_FIRST)
    assert "does not store the layer_first layout" in (backend.case_unsupported(asym_layer_first) or "")
    # io backends: the preferred one where the class moves the layout with it, else the other one
    assert case_settings(hicache_case(io_backend="direct"))[1] == "kernel"  # MHA page_first: kernel only
    assert case_settings(hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT))[1] == "direct"
    assert case_settings(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, io_backend="direct"))[1] == "direct"
    # pool kinds: their class where the case can have it, the standard one otherwise
    assert case_settings(hicache_case(Attention.MHA_ASYM, pool_kind="hisparse"))[0] == (
        "AsymmetricMHATokenToKVPoolHost")
    assert case_settings(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, pool_kind="hisparse"))[0] == (
        "HiSparseMHATokenToKVPoolHost")
    assert case_settings(hicache_case(Attention.MHA, pool_kind="k_only"))[0] == "MHATokenToKVPoolHost"
    assert case_settings(hicache_case(Attention.MLA, pool_kind="k_only"))[0] == "MHATokenToKOnlyPoolHost"
    # the Mamba state pool: two components, page_first or page_first_direct, one slot per page
    assert case_settings(hicache_case(Attention.MHA_ASYM, page_size=1, pool_kind="mamba"))[0] == "MambaPoolHost"
    assert case_settings(hicache_case(Attention.MHA, page_size=1, pool_kind="mamba"))[0] == "MambaPoolHost"
    assert case_settings(hicache_case(Attention.MHA, page_size=2, pool_kind="mamba"))[0] == "MHATokenToKVPoolHost"
    assert case_settings(hicache_case(Attention.MLA, page_size=1, pool_kind="mamba"))[0] == "MLATokenToKVPoolHost"
    assert case_settings(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=1, pool_kind="mamba"))[0] == (
        "MHATokenToKVPoolHost")
    mamba_page_size_two = pool_layouts.mismatch(pool_layouts.pool_class("MambaPoolHost"), Attention.MHA,
                                                HostLayout.PAGE_FIRST, "kernel", 0, 2)
    assert "page size 1" in mamba_page_size_two
    assert "unknown io_backend" in (backend.case_unsupported(hicache_case(io_backend="gds")) or "")
    assert backend.unsupported_reason(hicache_case(), Platform("cpu")) == "sglang's kernels need a CUDA or ROCm device"


@pytest.mark.parametrize(("host_slots", "device_pages", "page_size"), [(4, 6, 1), (12, 2, 3), (48, 9, 48),
                                                                        (256, 3, 128), (255, 7, 5)])
def test_hisparse_pool_gets_the_case_host_capacity_from_its_ratio(fake_sglang, host_slots: int, device_pages: int,
                                                                   page_size: int) -> None:
    case = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, page_size=page_size, pages=1,
                        host_pages=host_slots // page_size, device_pages=device_pages, layers=1, pool_kind="hisparse")
    built = sglang_hicache_drive.build(sglang_hicache_drive.load_modules(), case, torch.device("cpu"))
    assert built.host_pool.size == case.host_slots


def test_generated_cases_cover_the_pool_dimensions_without_sglang() -> None:
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), H200)
    values: dict[str, collections.Counter[object]] = collections.defaultdict(collections.Counter)
    multi_step_ops: set[str] = set()
    page_sizes = set()
    for index in range(300):
        case = case_for_index(11, index, space)
        labels = backend.coverage_labels(case)
        for dimension, value in labels.items():
            values[dimension][value] += 1
        if labels["sequence_length"] > 1:
            multi_step_ops.update(str(labels["operation"]).split("+"))
        if backend.case_unsupported(case) is None:
            page_sizes.add(case.page_size)
    assert len(values["pool_class"]) >= 8
    assert set(values["io_backend"]) == {"kernel", "direct"}
    assert set(values["start_layer_nonzero"]) == {True, False}
    assert set(values["draft_layer"]) == {True, False}
    assert set(values["controller"]) == {"hybrid", "base"}
    # release and reserve: the HiSparse profile's cases hold their slots in the coordinator's request table
    assert multi_step_ops == {"backup", "load", "evict", "release", "reserve"}
    assert any(ps >= 32 and ps & (ps - 1) for ps in page_sizes)  # non-powers of two past 32 run
    assert not [m for m in sys.modules if m.split(".")[0] == "sglang"]  # generation never imports sglang


def test_a_planted_off_by_one_for_page_sizes_from_32_is_caught(fake_sglang, monkeypatch) -> None:
    case = hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT, page_size=33, pages=2, host_pages=4,
                        device_pages=3, layers=2, io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "page32")
    assert run_on_cpu(case).outcome is Outcome.MISMATCH
    small = hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT, page_size=31, pages=2, host_pages=4,
                         device_pages=3, layers=2, io_backend="direct")
    assert run_on_cpu(small).outcome is Outcome.PASS  # the planted bug needs page size >= 32


def test_load_back_cases_and_foreign_layer_loads_move_nothing_else(fake_sglang) -> None:
    case = hicache_case(Attention.MHA, HostLayout.PAGE_HEAD, direction=Direction.LOAD_BACK, ops="load,backup,load",
                        draft_layers=1)
    assert run_on_cpu(case).outcome is Outcome.PASS


def test_backend_is_registered_and_plans_the_reference_contract() -> None:
    backend = load_registry().get("sglang-hicache")
    assert isinstance(backend, SglangHicacheBackend) and not isinstance(backend, CpuHicacheBackend)
    direct = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, io_backend="direct")
    assert backend.plan(direct, H200).path == "hicache-controller:direct"


def test_objects_of_one_geometry_are_reused_with_a_fresh_allocator(fake_sglang) -> None:
    backend = CpuHicacheBackend()
    first = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, ops="backup,backup,evict", start_layer=2)
    assert run_case(first, backend, CPU, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept is not None
    built = backend._kept[1]
    knobs = make_tuning({**dict(first.tuning), "ops": "load,backup"})  # same geometry and knobs, other steps
    second = first.replace(host_indices=sequence.reversed_pages(first.host_indices, first.page_size), tuning=knobs,
                           seed=9)
    assert run_case(second, backend, CPU, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept[1] is built
    other = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, ops="backup", start_layer=3)
    assert run_case(other, backend, CPU, torch.device("cpu")).outcome is Outcome.PASS
    assert backend._kept[1] is not built


@pytest.mark.parametrize("controller", ["hybrid", "base"])
def test_draft_layers_not_loaded_fail_the_case(fake_sglang, monkeypatch, controller: str) -> None:
    """A load that leaves the packed draft layers out (the hybrid controller's draft transfers, or the base
    controller's draft pass) is a mismatch: the oracle expects every layer loaded."""
    from hicache_fuzz.kernels import sglang_hicache_drive as drive

    case = hicache_case(Attention.MLA, HostLayout.PAGE_FIRST, layers=3, draft_layers=2, ops="load",
                        controller=controller)
    assert run_on_cpu(case).outcome is Outcome.PASS
    build = drive.build

    def without_drafts(mods, case, device):  # type: ignore[no-untyped-def]
        built = build(mods, case, device)
        for entry in getattr(built.controller.mem_pool_host, "entries", ()):
            entry.packed_draft_device_pools = ()
        return built

    monkeypatch.setattr(drive, "build", without_drafts)
    monkeypatch.setattr(drive, "_draft_and_foreign_loads", lambda *args: None)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 1 (load)")


def test_the_base_controllers_draft_pass_runs_on_the_forward_streams_stand_in(fake_sglang, monkeypatch) -> None:
    """The draft pass's loads (packed draft layers, foreign layer ids) run inside the forward stream's stand-in,
    never on the legacy default stream, where sgl_kernel's page_first_direct op fails (cudaMemcpyBatchAsync)."""
    import contextlib

    from hicache_fuzz.kernels import sglang_hicache_drive as drive

    base = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    inside, seen = [False], []
    forward_stream = drive.forward_stream

    @contextlib.contextmanager
    def recorded_stream(built, device):  # type: ignore[no-untyped-def]
        with forward_stream(built, device):
            inside[0] = True
            try:
                yield
            finally:
                inside[0] = False

    load = base.HostPool.load_to_device_per_layer

    def recorded_load(self, *args, is_draft: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        if is_draft:
            seen.append(inside[0])
        return load(self, *args, is_draft=is_draft, **kwargs)

    monkeypatch.setattr(drive, "forward_stream", recorded_stream)
    monkeypatch.setattr(base.HostPool, "load_to_device_per_layer", recorded_load)
    case = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST_DIRECT, layers=3, draft_layers=1, ops="load",
                        controller="base", io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    assert seen and all(seen)


@pytest.mark.parametrize("layout", [HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT])
def test_mamba_state_pool_is_built_by_its_constructor_and_a_planted_bug_is_caught(fake_sglang, monkeypatch,
                                                                                  layout: HostLayout) -> None:
    case = hicache_case(Attention.MHA_ASYM, layout, page_size=1, pages=3, host_pages=7, device_pages=9, layers=3,
                        ops="backup,evict,load", pool_kind="mamba", draft_layers=1, start_layer=4)
    built = sglang_hicache_drive.build(sglang_hicache_drive.load_modules(), case, torch.device("cpu"))
    assert type(built.host_pool).__name__ == "MambaPoolHost" and built.host_pool.size == case.host_slots
    assert built.host_pool.num_mamba_layers == case.layers and len(built.drafts) == 1
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "mamba_conv")  # the last layer's conv state is not backed up
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary


def test_mamba_kernel_io_needs_16_byte_state_rows() -> None:
    backend = SglangHicacheBackend()
    aligned = hicache_case(Attention.MHA_ASYM, page_size=1, pool_kind="mamba")  # rows of 32 and 16 bytes
    assert backend.case_unsupported(aligned) is None
    narrow = aligned.replace(pools=(PoolSpec("kv", Attention.MHA_ASYM, KVDtype.BF16, 2, 8, v_head_dim=3),))
    assert "16-byte multiples" in (backend.case_unsupported(narrow) or "")
    direct = narrow.replace(layout=HostLayout.PAGE_FIRST_DIRECT, tuning=make_tuning(
        {**dict(narrow.tuning), "io_backend": "direct"}))
    assert backend.case_unsupported(direct) is None  # the direct io backend has no such rule


def test_aot_ops_are_probed_here_and_assumed_for_a_modelled_accelerator(monkeypatch) -> None:
    """A prediction for a CUDA machine made on a machine without one (fuzz --dry-run) cannot probe sgl_kernel's
    AOT ops and assumes the production set-up; where the accelerator is this machine's, the probe decides."""
    from hicache_fuzz.kernels import sglang_pool

    backend = SglangHicacheBackend()
    direct = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, io_backend="direct")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sglang_pool.aot_state(H200) == (True, sglang_pool.AOT_ASSUMED)
    assert backend.unsupported_reason(direct, H200) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sglang_pool, "aot_available", lambda: (False, "no sgl_kernel"))
    assert "unavailable here (no sgl_kernel)" in (backend.unsupported_reason(direct, H200) or "")


@pytest.mark.parametrize(("kind", "name"), [("nvfp4_index_k", "MiniMaxM3Nvfp4IndexKPoolHost"),
                                            ("nvfp4_main_kv", "MiniMaxM3Nvfp4MainKVPoolHost")])
def test_nvfp4_page_row_pools_are_built_by_their_constructors_and_a_planted_bug_is_caught(
        fake_sglang, monkeypatch, kind: str, name: str) -> None:
    case = hicache_case(Attention.MLA, HostLayout.PAGE_FIRST_DIRECT, page_size=16, pages=2, host_pages=5,
                        device_pages=7, layers=3, ops="backup,load,evict,backup", pool_kind=kind, start_layer=2)
    built = sglang_hicache_drive.build(sglang_hicache_drive.load_modules(), case, torch.device("cpu"))
    assert type(built.host_pool).__name__ == name and built.host_pool.size == case.host_slots
    assert built.host_pool.row_bytes == 16 * 48 and built.device_pool.info.num_pages == 7
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "page_rows")  # a back-up leaves its last page out
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary
    backend = SglangHicacheBackend()
    # page_first stores its pages in the oracle's page_first_direct order, and the page_row kernel needs
    # 128-byte-aligned page rows
    assert case_settings(case.replace(layout=HostLayout.PAGE_FIRST))[0] == "MLATokenToKVPoolHost"
    narrow = hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, page_size=3, pool_kind=kind)
    assert "page rows of 128-byte multiples" in (backend.case_unsupported(narrow) or "")
    direct = narrow.replace(tuning=make_tuning({**dict(narrow.tuning), "io_backend": "direct"}))
    assert backend.case_unsupported(direct) is None


def test_generated_cases_run_every_modelled_class_on_a_gpu_platform(monkeypatch) -> None:
    """Cases predicted to run (the platform's rules, AOT ops assumed where the GPU is not this machine's) reach
    every modelled class (MXFP8's one shape through its space profile) and both io backends."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), H200)
    classes, io_backends = set(), set()
    for index in range(2000):
        case = case_for_index(1, index, space)
        if backend.unsupported_reason(case, H200) is None:
            labels = backend.coverage_labels(case)
            classes.add(labels["pool_class"])
            io_backends.add(labels["io_backend"])
    assert classes == set(pool_layouts.MODELLED)
    assert len(classes) >= 8
    assert io_backends == {"kernel", "direct"}


def test_compile_jobs_build_the_mamba_and_page_row_modules(fake_sglang, monkeypatch) -> None:
    from hicache_fuzz.kernels import sglang_pool

    monkeypatch.setattr(sglang_pool.SglangPoolBackend, "compile_jobs", lambda self, space, platform: [])
    backend = SglangHicacheBackend()
    space = backend.case_space(CaseSpace(), H200)
    for job in backend.compile_jobs(space, H200):
        job()
    from sglang.kernels.ops.kvcache import nvfp4_hicache
    from sglang.kernels.ops.mamba import transfer_mamba

    assert transfer_mamba.BUILDS == ["transfer_mamba"] and nvfp4_hicache.BUILDS == ["page_row"]
    assert len(backend.compile_jobs(space, Platform("rocm", (9, 4)))) == 1  # no page_row kernel on ROCm
