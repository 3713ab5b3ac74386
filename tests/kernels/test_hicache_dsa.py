"""sglang-hicache's DSA indexer pool (kernels/sglang_hicache_dsa.py): the oracle's terms for it
(oracles/pool_layouts.py), the knobs that resolve to it (kernels/sglang_hicache_settings.py), and, with the fake
sglang on the CPU, the pool built through its declaration's builder beside its MLA anchor in the
HybridCacheController's group, every layout and io backend moving bytes exactly, and planted bugs in the indexer
(tail pages, compact layers) and in the anchor caught."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hicache_fuzz.harness.findings.standalone_hicache import unscripted_reason
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline.materialize import materialize
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels import sglang_hicache_tensors as tensors
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_dsa import DSA, index_format
from hicache_fuzz.kernels.sglang_hicache_settings import (
    COMPILED_ROWS,
    case_settings,
    controller_kind,
    side_pool,
    skip_topk_layers,
)
from hicache_fuzz.oracles import pool_layouts
from tests.kernels._hicache_helpers import fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name

LAYOUTS_AND_IO = [(HostLayout.LAYER_FIRST, "kernel"), (HostLayout.PAGE_FIRST, "kernel"),
                  (HostLayout.LAYER_FIRST, "direct"), (HostLayout.PAGE_FIRST_DIRECT, "direct")]


def dsa_case(layout: HostLayout = HostLayout.LAYER_FIRST, *, page_size: int = 1, **knobs: Any) -> Case:
    """A DSA case of 48-byte index rows (page_first needs page-row widths among the compiled rows: 1 x 48 is not
    one, 12 x 48 = 576 is)."""
    return hicache_case(Attention.MLA, layout, page_size=page_size, **{"pool_kind": "dsa", **knobs})


# ---- the oracle's terms -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("size", "page_size", "pages"), [(8, 1, 10), (8, 2, 5), (12, 4, 4), (64, 64, 2), (0, 3, 1)])
def test_indexer_page_num_is_sglangs_one_page_more_two_at_page_size_one(size: int, page_size: int,
                                                                         pages: int) -> None:
    assert pool_layouts.indexer_page_num(size, page_size) == pages


def test_host_shapes_and_owned_layers_in_the_oracles_terms() -> None:
    assert pool_layouts.dsa_host_shape(HostLayout.LAYER_FIRST, 3, 8, 2, 48) == (3, 5, 96)
    for layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        assert pool_layouts.dsa_host_shape(layout, 3, 8, 2, 48) == (5, 3, 1, 96)
    with pytest.raises(ValueError, match="page_head"):
        pool_layouts.dsa_host_shape(HostLayout.PAGE_HEAD, 3, 8, 2, 48)
    assert pool_layouts.owned_device_layers((False, True, False, True)) == (0, 2)
    cls = pool_layouts.pool_class(DSA)
    assert cls.modelled and DSA in pool_layouts.MODELLED and DSA not in pool_layouts.UNMODELLED
    assert cls.layouts_for("kernel") == {HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST}
    assert cls.layouts_for("direct") == {HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT}


def test_kernel_io_needs_page_rows_of_8_byte_multiples_else_the_case_is_unsupported() -> None:
    """sglang's pool raises "Unsupported IO backend: kernel" for such rows at the first transfer, after the anchor's
    share moved: no clean rejection, so the oracle does not run them (pool_layouts' DSA entry)."""
    cls = pool_layouts.pool_class(DSA)
    assert "8-byte multiples" in pool_layouts.mismatch(cls, Attention.MLA, HostLayout.LAYER_FIRST, "kernel", 0, 1,
                                                       (12,))
    assert pool_layouts.mismatch(cls, Attention.MLA, HostLayout.LAYER_FIRST, "kernel", 0, 2, (12,)) == ""
    assert pool_layouts.mismatch(cls, Attention.MLA, HostLayout.LAYER_FIRST, "direct", 0, 1, (12,)) == ""
    narrow = dsa_case().replace(pools=(PoolSpec("kv", Attention.MLA, KVDtype.FP8, 1, 12),))
    assert "8-byte multiples" in (SglangHicacheBackend().case_unsupported(narrow) or "")


@pytest.mark.parametrize("row", [5, 48, 132, 2560])
def test_index_format_gives_the_case_row_by_sglangs_byte_count(row: int) -> None:
    head_dim, block = index_format(row)
    assert head_dim + head_dim // block * 4 == row and head_dim >= 1


# ---- the knobs ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("start", "layers", "drafts", "freq", "skips"), [
    (0, 3, 0, 1, (False, False, False)),
    (0, 3, 0, 2, (False, False, True, False, True)),  # global layers 0, 1, 3 own index keys
    (5, 3, 1, 2, (False, True, False, True)),  # 5 and 7 own; the draft is not a target layer
    (2, 2, 0, 3, (True, True, False, True, True, False, True, True)),  # 4 and 7 own; the stage ends before 10
])
def test_skip_topk_layers_follow_sglangs_index_topk_freq_rule(start: int, layers: int, drafts: int, freq: int,
                                                               skips: tuple[bool, ...]) -> None:
    case = dsa_case(layers=layers, start_layer=start, draft_layers=drafts, index_topk_freq=freq)
    assert skip_topk_layers(case) == skips
    assert len(pool_layouts.owned_device_layers(skips)) == layers - drafts
    assert skip_topk_layers(hicache_case(Attention.MLA, index_topk_freq=2)) == ()  # other classes have none


def test_dsa_knob_resolves_where_the_case_fits_and_is_always_under_the_hybrid_controller() -> None:
    backend = SglangHicacheBackend()
    assert case_settings(dsa_case())[0] == DSA
    assert case_settings(dsa_case(HostLayout.PAGE_FIRST_DIRECT, io_backend="kernel"))[:2] == (DSA, "direct")
    assert case_settings(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, pool_kind="dsa"))[0] == (
        "MHATokenToKVPoolHost")
    # page_first only where the staged write-back's page-row width is a compiled row
    assert 48 not in COMPILED_ROWS and 12 * 48 in COMPILED_ROWS
    assert case_settings(dsa_case(HostLayout.PAGE_FIRST))[0] == "MLATokenToKVPoolHost"
    assert case_settings(dsa_case(HostLayout.PAGE_FIRST, page_size=12))[0] == DSA
    assert controller_kind(dsa_case(controller="base")) == "hybrid"
    assert side_pool(dsa_case(side_pool="k_only")) == ""  # its group is the anchor and the indexer
    bad = dsa_case(index_topk_freq=0)
    assert "index_topk_freq 0 is not a positive integer" in (backend.case_unsupported(bad) or "")
    labels = backend.coverage_labels(dsa_case(layers=3, index_topk_freq=2))
    assert labels["pool_class"] == DSA and labels["controller"] == "hybrid" and labels["skipped_index_layers"]
    assert not backend.coverage_labels(dsa_case(layers=3))["skipped_index_layers"]
    assert "replay the JSON reproducer" in (unscripted_reason(dsa_case()) or "")


# ---- driven through the fake sglang -------------------------------------------------------------------------

@pytest.mark.parametrize(("layout", "io"), LAYOUTS_AND_IO)
@pytest.mark.parametrize("freq", [1, 2, 3])
@pytest.mark.parametrize("page_size", [1, 12])
@pytest.mark.parametrize("direction", [Direction.WRITE_BACK, Direction.LOAD_BACK])
def test_every_layout_and_io_backend_moves_bytes_exactly(fake_sglang, layout: HostLayout, io: str, freq: int,
                                                         page_size: int, direction: Direction) -> None:
    if layout is HostLayout.PAGE_FIRST and page_size == 1:
        page_size = 12  # 48-byte page rows are no compiled row
    case = dsa_case(layout, page_size=page_size, layers=4, direction=direction, ops="backup,load,evict,backup,load",
                    io_backend=io, start_layer=5, draft_layers=1, index_topk_freq=freq)
    assert case_settings(case) == (DSA, io, 5, 1)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


def test_the_indexer_is_built_by_its_declarations_builder_beside_its_mla_anchor(fake_sglang) -> None:
    case = dsa_case(HostLayout.PAGE_FIRST_DIRECT, layers=4, start_layer=0, draft_layers=1, index_topk_freq=2,
                    io_backend="direct")
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    host, device, group = built.host_pool, built.device_pool, built.dsa
    assert group is not None and type(host).__name__ == DSA and host.size == case.host_slots
    # target device layers 0, 1, 3 own index keys (2 and 4 reuse top-k), then one packed draft layer
    assert device.skip_topk_layers == [False, False, True, False, True] and device.layer_num == 5
    assert [b.shape[0] for b in device.index_k_with_scale_buffer] == [7, 7, 0, 7, 0]  # 6 device rows + 1 page
    assert host.layer_num == case.layers == 4
    assert tuple(host.index_k_with_scale_buffer.shape) == pool_layouts.dsa_host_shape(
        case.layout, 4, case.host_slots, 1, 48) == (7, 4, 1, 48)
    entries = built.controller.mem_pool_host.entries
    assert [(e.name.value, type(e.host_pool).__name__) for e in entries] == [("kv", "MLATokenToKVPoolHost"),
                                                                             ("indexer", DSA)]
    assert entries[0].host_pool is group.anchor_host and entries[0].device_pool is group.anchor_device
    assert entries[1].device_pool is device and entries[1].packed_draft_device_pools == tuple(built.drafts)
    assert group.anchor_host.layer_num == 6  # every target layer of the stage, then the draft
    assert type(built.controller).__name__ == "HybridCacheController"
    assert built.controller.transfer_layer_id_max == 5


def test_page_first_host_rows_are_read_from_the_page_major_tensor(fake_sglang) -> None:
    """The case's page_first row (layer l, slot t) is sglang's page t // ps, layer l, row t % ps."""
    case = dsa_case(HostLayout.PAGE_FIRST, page_size=12, layers=2, host_pages=3, device_pages=3)
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    buffers = materialize(case, torch.device("cpu"))
    try:
        tensors.copy_in(buffers.pools[0], built)
        ours = buffers.pools[0].host.payload.view(case.host_slots, case.layers, 48)
        theirs = built.host_pool.index_k_with_scale_buffer
        for layer, slot in ((0, 0), (1, 13), (0, 35), (1, 24)):
            assert torch.equal(theirs[slot // 12, layer, 0, (slot % 12) * 48 : (slot % 12 + 1) * 48],
                               ours[slot, layer])
    finally:
        buffers.release()


@pytest.mark.parametrize("layout", [HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT])
def test_a_write_past_the_case_pages_is_caught(fake_sglang, monkeypatch, layout: HostLayout) -> None:
    case = dsa_case(layout, page_size=3, ops="backup", io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "dsa_tail")  # every back-up also writes the first tail page
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert f"{DSA} host pages from 5 (past the case's pages, never addressed) changed" in result.summary


def test_a_load_that_ignores_the_compact_host_layers_is_caught(fake_sglang, monkeypatch) -> None:
    case = dsa_case(layers=4, draft_layers=1, index_topk_freq=2, ops="backup,load")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "dsa_layers")  # device layer 3 loaded from host layer 3 (the draft)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 2 (load)"), result.summary


def test_the_mla_anchor_is_judged_by_the_oracle_too(fake_sglang, monkeypatch) -> None:
    case = dsa_case(HostLayout.LAYER_FIRST, page_size=32, layers=2, ops="backup", io_backend="direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "page32")  # the KV pools miss the last token of every page
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert "the MLA anchor's host bytes differ from the oracle's after the sequence" in result.summary


def test_objects_of_one_geometry_are_reused_and_judged_again(fake_sglang) -> None:
    from tests.kernels._hicache_helpers import run_twice_on_kept_objects

    run_twice_on_kept_objects(dsa_case(layers=3, index_topk_freq=2, ops="backup,evict,backup", draft_layers=1))
