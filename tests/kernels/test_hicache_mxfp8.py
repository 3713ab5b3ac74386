"""sglang-hicache's MXFP8 pool (kernels/sglang_hicache_mxfp8.py): its scale blocks in the oracle's terms
(oracles/pool_layouts.py), the knob that resolves to it and the construction-time refusals that keep cases out of it
(kernels/sglang_hicache_settings.py), and, with the fake sglang on the CPU, the pool built over its device pool as
sglang builds it, the payload and both scale storages moving exactly through both controllers, and planted bugs in
the scale moves and in the payload caught at the step that makes them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.findings.standalone_hicache import unscripted_reason
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_mxfp8 import MXFP8
from hicache_fuzz.kernels.sglang_hicache_settings import (
    POOL_KINDS,
    case_settings,
    controller_kind,
    side_pool,
)
from hicache_fuzz.oracles import layouts, pool_layouts
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

H200 = Platform("cuda", (9, 0))
_PF = HostLayout.PAGE_FIRST


def mxfp8_case(direction: Direction = Direction.WRITE_BACK, *, heads: int = 2, head_dim: int = 32,
               dtype: KVDtype = KVDtype.BF16, layout: HostLayout = _PF, page_size: int = 128, layers: int = 2,
               ops: str = "", **knobs: int | str) -> Case:
    """An MXFP8 case: K/V rows of heads x head_dim elements (128 bytes by default), host pages 1 and 3 of 5, device
    pages 2 and 1 of 6 (hicache_case's)."""
    case = hicache_case(Attention.MHA, layout, page_size=page_size, layers=layers, direction=direction, ops=ops,
                        **{"pool_kind": "mxfp8", **knobs})
    return case.replace(pools=(PoolSpec("kv", Attention.MHA, dtype, heads, head_dim),))


# ---- the oracle's terms -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("row", "block"), [(128, 512), (256, 1024), (512, 2048), (640, 2560), (4096, 16384)])
def test_a_page_scale_block_holds_one_ue8m0_byte_per_32_elements_of_its_128_rows(row: int, block: int) -> None:
    assert pool_layouts.mxfp8_scale_page_bytes(row) == block == 128 * pool_layouts.mxfp8_scale_row_bytes(row)


def test_the_device_and_host_scale_shapes_hold_whole_blocks() -> None:
    device = pool_layouts.mxfp8_device_scale_shape(768, 4, 64)
    assert device == (6, 4, 32, 4, 2) and math.prod(device[1:]) == pool_layouts.mxfp8_scale_page_bytes(4 * 64)
    assert pool_layouts.mxfp8_host_scale_shape(640, 3, 256) == (5, 3, 1024)


def test_the_scale_blocks_are_a_page_first_direct_pool_of_the_oracles_own() -> None:
    case = mxfp8_case(layers=3, ops="backup,load")
    scales = pool_layouts.mxfp8_scale_case(case)
    spec = scales.pools[0]
    assert scales.layout is HostLayout.PAGE_FIRST_DIRECT and spec.attention is Attention.MHA
    assert spec.row_bytes("k") == spec.row_bytes("v") == 128 // 32
    assert (scales.host_indices, scales.device_indices, scales.tuning, scales.layers, scales.page_size) == (
        case.host_indices, case.device_indices, case.tuning, case.layers, case.page_size)
    # the K host tensor then the V host tensor, each (pages, layers, block): K half then V half of (2, P, L, ps, 1, D)
    assert layouts.host_shape(scales, spec) == (2, 5, 3, 128, 1, 4)
    assert layouts.host_bytes(scales, spec) == 2 * math.prod(pool_layouts.mxfp8_host_scale_shape(640, 3, 128))
    # the K device tensors layer after layer, then the V ones
    assert layouts.device_bytes(scales, spec) == 2 * 3 * math.prod(
        pool_layouts.mxfp8_device_scale_shape(768, 2, 64))
    assert pool_layouts.MXFP8_SCALE_SEMANTICS.value == "page_aligned"
    with pytest.raises(ValueError, match="page size 128"):
        pool_layouts.mxfp8_scale_case(hicache_case(Attention.MHA, page_size=2))


# ---- the class and its construction rules -------------------------------------------------------------------

def test_the_class_is_modelled_with_sglangs_construction_rules() -> None:
    cls = pool_layouts.pool_class(MXFP8)
    assert cls.modelled and MXFP8 in pool_layouts.MODELLED and MXFP8 not in pool_layouts.UNMODELLED
    assert cls.layouts_for("kernel") == {_PF} and cls.layouts_for("direct") == frozenset()
    assert not cls.drafts and cls.only_page_size == 128 and cls.row_align == 32
    assert "mxfp8" in POOL_KINDS and MXFP8 not in POOL_KINDS


@pytest.mark.parametrize(("attention", "layout", "io", "drafts", "page_size", "rows", "why"), [
    (Attention.MHA, _PF, "kernel", 0, 64, (128, 128), "exists at page size 128 only, not 64"),
    (Attention.MHA, HostLayout.LAYER_FIRST, "kernel", 0, 128, (128, 128), "does not store the layer_first layout"),
    (Attention.MHA, _PF, "direct", 0, 128, (128, 128), "with io backend direct does not store the page_first"),
    (Attention.MHA, _PF, "kernel", 1, 128, (128, 128), "packs no draft layers"),
    (Attention.MHA, _PF, "kernel", 0, 128, (48, 48), "holds rows of 32-byte multiples, not 48/48 bytes"),
    (Attention.MHA_ASYM, _PF, "kernel", 0, 128, (128, 64), "holds mha pools, not mha_asym"),
])
def test_each_construction_refusal_is_a_rule_of_the_class(attention: Attention, layout: HostLayout, io: str,
                                                          drafts: int, page_size: int, rows: tuple[int, ...],
                                                          why: str) -> None:
    cls = pool_layouts.pool_class(MXFP8)
    assert why in pool_layouts.mismatch(cls, attention, layout, io, drafts, page_size, rows)
    assert pool_layouts.mismatch(cls, Attention.MHA, _PF, "kernel", 0, 128, (128, 128)) == ""


# ---- the knob -------------------------------------------------------------------------------------------------

def test_the_knob_resolves_to_the_pool_only_where_sglang_builds_it() -> None:
    """Outside the construction rules (and the compiled widths) a case is not one of the pool's: the knob gives the
    standard class there, as every kind whose class does not fit the case."""
    assert case_settings(mxfp8_case()) == (MXFP8, "kernel", 0, 0)
    assert case_settings(mxfp8_case(io_backend="direct"))[1] == "kernel"  # page_first moves with the kernels only
    assert case_settings(mxfp8_case(heads=2, head_dim=320, dtype=KVDtype.FP8))[0] == MXFP8  # 2560-byte blocks
    assert case_settings(mxfp8_case(layers=1, draft_layers=2))[0] == MXFP8  # a one-layer case packs none
    standard = {
        "page size 64": mxfp8_case(page_size=64),
        "layer_first": mxfp8_case(layout=HostLayout.LAYER_FIRST),
        "draft layers": mxfp8_case(layers=3, draft_layers=1),
        "48-byte rows": mxfp8_case(heads=3, head_dim=16, dtype=KVDtype.FP8),
        "576-byte rows (2304-byte blocks: no compiled width)": mxfp8_case(heads=1, head_dim=576, dtype=KVDtype.FP8),
    }
    for what, case in standard.items():
        assert case_settings(case)[0] == "MHATokenToKVPoolHost", what
    asymmetric = hicache_case(Attention.MHA_ASYM, page_size=128, pool_kind="mxfp8")
    assert case_settings(asymmetric)[0] == "AsymmetricMHATokenToKVPoolHost"
    assert controller_kind(mxfp8_case(controller="base")) == "base"
    assert side_pool(mxfp8_case(side_pool="k_only")) == ""  # the pool is the group's only one
    backend = SglangHicacheBackend()
    assert backend.coverage_labels(mxfp8_case())["pool_class"] == MXFP8
    assert "replay the JSON reproducer" in (unscripted_reason(mxfp8_case()) or "")


def test_a_case_naming_the_class_outside_the_rules_is_unsupported_with_the_rule() -> None:
    backend = SglangHicacheBackend()
    assert backend.case_unsupported(mxfp8_case(pool_kind=MXFP8)) is None
    assert "exists at page size 128 only" in (backend.case_unsupported(mxfp8_case(pool_kind=MXFP8, page_size=2)) or "")
    drafted = mxfp8_case(pool_kind=MXFP8, layers=3, draft_layers=1)
    assert "packs no draft layers" in (backend.case_unsupported(drafted) or "")


def test_generated_cases_of_its_geometry_resolve_to_it_inside_the_rules_and_run_on_a_gpu_platform(
        monkeypatch) -> None:
    """The backend's space narrowed to the pool's geometry (more than its profile, MXFP8_PROFILE, narrows it: rows and
    draft layers stay drawn) shows what the knob makes of generated cases."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = load_registry().get("sglang-hicache")
    space = backend.case_space(CaseSpace(), H200).narrowed(page_sizes=(128,), layouts=(_PF,),
                                                             attentions=(Attention.MHA,))
    running = 0
    for index in range(400):
        case = case_for_index(1, index, space)
        name, io, _start, drafts = case_settings(case)
        if name != MXFP8:
            continue
        assert case.layout is _PF and case.page_size == 128 and io == "kernel" and drafts == 0
        assert case.pools[0].row_bytes("k") in (128, 256, 512, 640)
        running += backend.unsupported_reason(case, H200) is None
    assert running >= 3


def test_a_torch_without_float8_e8m0fnu_makes_the_case_unsupported(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = SglangHicacheBackend()
    assert backend.unsupported_reason(mxfp8_case(), H200) is None
    monkeypatch.delattr(torch, "float8_e8m0fnu")
    assert "float8_e8m0fnu" in (backend.unsupported_reason(mxfp8_case(), H200) or "")
    assert backend.unsupported_reason(hicache_case(), H200) is None  # other classes do not need it


# ---- driven through the fake sglang ---------------------------------------------------------------------------

@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize("direction", [Direction.WRITE_BACK, Direction.LOAD_BACK])
@pytest.mark.parametrize(("heads", "head_dim", "dtype"), [(2, 32, KVDtype.BF16), (8, 16, KVDtype.FP8),
                                                          (1, 128, KVDtype.FP32)])
def test_the_payload_and_both_scale_storages_move_exactly(fake_sglang, controller: str, direction: Direction,
                                                          heads: int, head_dim: int, dtype: KVDtype) -> None:
    case = mxfp8_case(direction, heads=heads, head_dim=head_dim, dtype=dtype, layers=3, start_layer=5,
                      ops="backup,load,evict,backup,load", controller=controller)
    assert case_settings(case) == (MXFP8, "kernel", 5, 0)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


def test_the_pool_is_built_over_sglangs_device_pool_as_sglang_builds_it(fake_sglang) -> None:
    case = mxfp8_case(heads=8, head_dim=16, dtype=KVDtype.FP8, layers=3, start_layer=2)
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    device_pool, host = built.device_pool, built.host_pool
    assert type(device_pool).__name__ == "MHATokenToKVPoolMXFP8" and type(host).__name__ == MXFP8
    assert (device_pool.head_num, device_pool.head_dim) == (1, 128)  # 16-element heads hold no whole scale block
    info = device_pool.get_device_pool_infos()[0].buffer_info
    assert info.scales.layout.value == "mxfp8_interleaved"
    assert tuple(info.scales.v[2].shape) == pool_layouts.mxfp8_device_scale_shape(case.device_rows, 1, 128)
    assert tuple(host.k_scale_host.shape) == pool_layouts.mxfp8_host_scale_shape(case.host_slots, 3, 128) == (5, 3,
                                                                                                              512)
    assert host.size == case.host_slots and host.layer_num == 3 and host.start_layer == 2
    assert built.mxfp8 is not None and built.drafts == []
    assert type(built.controller).__name__ == "HybridCacheController"


def test_sglangs_construction_refusals_are_what_the_rules_keep_out(fake_sglang) -> None:
    """The fake mirrors sglang's refusals; the rules (pool_layouts) and the knob keep every case out of them."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolMXFP8
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost, get_mha_host_pool_cls

    def device_pool(page_size: int, head_dim: int = 128) -> Any:
        return MHATokenToKVPoolMXFP8(5 * page_size, page_size, torch.float8_e4m3fn, 1, head_dim, 2, "cpu", False,
                                     start_layer=0, end_layer=2)

    info = device_pool(128).get_device_pool_infos()[0].buffer_info
    cls = get_mha_host_pool_cls(info)
    common: dict[str, Any] = {"device_capacity_tokens": 640, "start_layer": 0, "end_layer": 2}
    with pytest.raises(NotImplementedError, match="page_first"):
        cls(info, 2.0, 0, 128, "layer_first", host_token_capacity=640, **common)
    with pytest.raises(NotImplementedError, match="draft"):
        cls(info, 2.0, 0, 128, "page_first", draft_buffer_infos=(info,), host_token_capacity=640, **common)
    with pytest.raises(ValueError, match="page size"):
        cls(info, 2.0, 0, 64, "page_first", host_token_capacity=640, **common)
    with pytest.raises(ValueError, match="divisible by 32"):
        device_pool(128, head_dim=48)
    token = device_pool(64).get_device_pool_infos()[0].buffer_info  # no interleaved scales below page size 128
    assert get_mha_host_pool_cls(token) is MHATokenToKVPoolHost
    with pytest.raises(ValueError, match="scale layout 'token'"):
        MHATokenToKVPoolHost(token, 2.0, 0, 64, "page_first", host_token_capacity=320, **common)


def test_a_back_up_that_leaves_a_scale_block_out_is_caught_at_its_step(fake_sglang, monkeypatch) -> None:
    case = mxfp8_case(layers=2, ops="backup,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "mxfp8_v_scales")  # the V block of the last page stays behind
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert "step 0 (backup) [HybridCacheController.write" in result.summary
    assert f"{MXFP8} V scale host block (page 3, layer 0) byte 0 of 512, 1024 bytes differ" in result.summary


def test_a_load_that_reads_another_layers_scales_is_caught_at_its_step(fake_sglang, monkeypatch) -> None:
    case = mxfp8_case(Direction.LOAD_BACK, layers=3, ops="backup,load", controller="base")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "mxfp8_scale_layer")  # layer l's K blocks from host layer l - 1
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert "step 0 (load) [HiCacheController.load + start_loading]" in result.summary
    assert "K scale device block (page 1, layer 1)" in result.summary


def test_a_payload_bug_is_the_runners_mismatch_at_its_step(fake_sglang, monkeypatch) -> None:
    case = mxfp8_case(layers=2, ops="load,backup")
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "page32")  # the payload misses the last token of every page
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary


def test_without_step_images_the_scales_are_judged_after_the_sequence(fake_sglang, monkeypatch) -> None:
    """A sequence whose step images would pass their budget is compared at its end only, the scales too."""
    monkeypatch.setattr(drive, "STEP_IMAGE_BUDGET", 0)
    case = mxfp8_case(layers=3, ops="backup,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "mxfp8_scale_layer")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED and "step " not in result.summary, result.summary
    assert f"{MXFP8} K scale device block" in result.summary


def test_objects_of_one_geometry_are_reused_and_the_scales_judged_again(fake_sglang, monkeypatch) -> None:
    from hicache_fuzz.harness.pipeline.runner import run_case
    from tests.kernels._hicache_helpers import CPU, run_twice_on_kept_objects

    backend, second = run_twice_on_kept_objects(mxfp8_case(layers=2, ops="backup,evict,backup"))
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "mxfp8_scale_layer")
    assert run_case(second, backend, CPU, torch.device("cpu")).outcome is Outcome.WRONGLY_REJECTED
