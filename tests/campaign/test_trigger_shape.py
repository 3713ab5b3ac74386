"""The host pool's shape in a trigger (findings/trigger.py): ``layout``, ``attention`` and ``host_pages``. sglang's
MLA host pool on page_first_direct takes its per-layer views along the page axis, so it refuses to be built with
fewer host pages than layers; the refusal's identity is the controller path's one for every valid input refused,
so a known entry for it must name all three conditions, and must not account for a case that misses any of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.trigger import (
    PLAIN,
    TriggerError,
    _relaxed,
    derive_trigger,
    features,
    in_trigger,
    outside_trigger,
    trigger_from_json,
)
from hicache_fuzz.harness.model.case import Attention, Case, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels.sglang_hicache_settings import DSA_CLASS, case_settings, host_pool_layers, skip_topk_layers
from hicache_fuzz.kernels.sglang_pool_calls import pool_construction
from tests.kernels._hicache_helpers import fake_sglang, hicache_case

__all__ = ["fake_sglang"]  # the fixture, used by name

SGLANG_CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "sglang"
PFD = HostLayout.PAGE_FIRST_DIRECT
INDEX_ERROR = {"attention": "mla", "host_pages": "fewer_than_layers", "layout": "page_first_direct"}


def shape(case: Case) -> tuple[str, str, str]:
    values = features(case)
    return values["layout"], values["attention"], values["host_pages"]


def dsa_case(**changes: int | str) -> Case:
    """A DSA indexer case on page_first_direct: 4 case layers of which 1 is a packed draft, index_topk_freq 2, so
    the stage's target device layers are 0, 1, 3 (owning index keys) and 2, 4 (skipping): 5 target + 1 draft."""
    knobs: dict[str, int | str] = {"pool_kind": "dsa", "io_backend": "direct", "draft_layers": 1,
                                   "index_topk_freq": 2, **changes}
    return hicache_case(Attention.MLA, PFD, page_size=1, layers=4, **knobs)


def index_error(case: Case) -> bool:
    """The refusal as sglang 0.5.23 shows it: an MLA host pool on page_first_direct with fewer pages than layers."""
    return (case.layout is PFD and any(p.attention is Attention.MLA for p in case.pools)
            and case.host_pages < host_pool_layers(case))


# ---- the features' values -----------------------------------------------------------------------------------

def test_the_vocabulary_names_the_host_pools_shape_with_its_plain_values() -> None:
    assert {k: PLAIN[k] for k in ("layout", "attention", "host_pages")} == {
        "layout": "layer_first", "attention": "mha", "host_pages": "at_least_layers"}


def test_each_case_has_its_layout_attention_and_host_pages() -> None:
    # hicache_case: 3 layers, 5 host pages unless told
    assert shape(hicache_case(Attention.MHA, HostLayout.LAYER_FIRST)) == ("layer_first", "mha", "at_least_layers")
    assert shape(hicache_case(Attention.MLA, PFD, host_pages=2, pages=1)) == (
        "page_first_direct", "mla", "fewer_than_layers")
    assert shape(hicache_case(Attention.MLA, PFD, host_pages=3)) == ("page_first_direct", "mla", "at_least_layers")
    assert shape(hicache_case(Attention.MHA_ASYM, HostLayout.PAGE_FIRST)) == (
        "page_first", "mha_asym", "at_least_layers")
    assert shape(hicache_case(Attention.MHA, HostLayout.PAGE_HEAD, host_pages=2, layers=8))[::2] == (
        "page_head", "fewer_than_layers")


def test_a_group_with_some_mla_pool_is_mla() -> None:
    pool = load_entry(SGLANG_CORPUS / "pool-base-controller-mixed-group-cuda-host-indices.json").case
    assert [p.attention for p in pool.pools] == [Attention.MHA, Attention.MLA, Attention.MHA]
    assert features(pool)["attention"] == "mla"
    assert features(pool.replace(pools=pool.pools[:1]))["attention"] == "mha"


def test_the_dsa_anchor_host_pool_holds_skipped_layers_and_drafts() -> None:
    case = dsa_case(host_pages=5)
    assert case_settings(case)[0] == DSA_CLASS and case_settings(case)[3] == 1
    assert skip_topk_layers(case) == (False, False, True, False, True)
    assert host_pool_layers(case) == 5 + 1 > case.layers
    # 5 pages: enough for the case's 4 layers, not for the anchor's 6
    assert features(case)["host_pages"] == "fewer_than_layers"
    assert features(dsa_case(host_pages=6))["host_pages"] == "at_least_layers"
    # every layer owns index keys: the anchor holds the case's layers (3 target + 1 draft)
    assert host_pool_layers(dsa_case(index_topk_freq=1)) == 4
    # the same MLA case without the DSA kind: the host pool holds the case's layers, drafts included
    assert host_pool_layers(hicache_case(Attention.MLA, PFD, layers=4, draft_layers=1)) == 4


@pytest.mark.parametrize("case", [
    dsa_case(), dsa_case(index_topk_freq=3, start_layer=2), dsa_case(draft_layers=0),
    hicache_case(Attention.MLA, PFD, layers=4, draft_layers=1, io_backend="direct"),
    hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, layers=3),
], ids=["dsa", "dsa-freq3-start2", "dsa-no-draft", "mla-draft", "mla"])
def test_host_pool_layers_is_the_layer_num_the_drive_builds_the_mla_host_pool_with(fake_sglang, case: Case) -> None:
    built = drive.build(drive.load_modules(), case, torch.device("cpu"))
    mla_host = built.dsa.anchor_host if built.dsa is not None else built.host_pool
    assert type(mla_host).__name__ == "MLATokenToKVPoolHost"
    assert mla_host.layer_num == host_pool_layers(case)


def test_sglang_pool_builds_the_mla_host_pool_with_the_cases_layers() -> None:
    case = hicache_case(Attention.MLA, PFD, layers=5).replace(backend="sglang-pool", tuning=())
    kwargs = dict(pool_construction(case, case.pools[0]).host_pool.kwargs)
    assert kwargs["target_layer_num"] == case.layers == host_pool_layers(case)


# ---- relaxation ---------------------------------------------------------------------------------------------

def test_host_pages_relax_to_one_page_per_host_pool_layer_keeping_past_the_end_indices_past_it() -> None:
    case = dsa_case(host_pages=5)
    past = case.replace(host_indices=(*case.host_indices[:-1], case.host_slots + 2))
    relaxed = _relaxed(past, "host_pages")
    assert relaxed is not None and relaxed.host_slots == 6 * past.page_size
    assert relaxed.host_indices == (*past.host_indices[:-1], relaxed.host_slots + 2)
    assert features(relaxed)["host_pages"] == "at_least_layers"
    assert features(relaxed)["layout"] == "page_first_direct" and relaxed.layers == past.layers
    paged = hicache_case(Attention.MLA, PFD, page_size=4, pages=1, host_pages=2, layers=3)
    assert (relaxed := _relaxed(paged, "host_pages")) is not None and relaxed.host_slots == 12  # whole pages


def test_layout_and_attention_relax_to_layer_first_and_mha() -> None:
    case = hicache_case(Attention.MLA, PFD)
    relaxed = _relaxed(case, "layout")
    assert relaxed is not None and relaxed.layout is HostLayout.LAYER_FIRST and relaxed.pools == case.pools
    unified = hicache_case(Attention.MHA, HostLayout.PAGE_UNIFIED).replace(
        pools=(PoolSpec("kv", Attention.MHA, KVDtype.BF16, 4, 8, head_groups=2),))
    relaxed = _relaxed(unified, "layout")  # layer_first takes one head group
    assert relaxed is not None and relaxed.layout is HostLayout.LAYER_FIRST and relaxed.pools[0].head_groups == 1
    mha = _relaxed(case, "attention")
    assert mha is not None and features(mha)["attention"] == "mha"
    assert mha.pools[0].row_bytes("k") == case.pools[0].row_bytes("kv") and mha.layout is PFD


def test_an_asymmetric_pool_is_its_own_attention_and_relaxes_to_its_k_rows() -> None:
    """sglang builds AsymmetricMHATokenToKVPoolHost for MHA pools whose V rows differ from K: a failure of that
    class names it, so that the symmetric pool's next failure of the same identity is not taken for it."""
    asym = hicache_case(Attention.MHA, HostLayout.PAGE_FIRST).replace(
        pools=(PoolSpec("kv", Attention.MHA_ASYM, KVDtype.BF16, 4, 16, v_head_dim=8),))
    assert features(asym)["attention"] == "mha_asym"
    relaxed = _relaxed(asym, "attention")
    assert relaxed is not None and features(relaxed)["attention"] == "mha"
    assert relaxed.pools[0].row_bytes("v") == relaxed.pools[0].row_bytes("k") == asym.pools[0].row_bytes("k")
    trigger = {"attention": "mha_asym", "layout": "page_first"}
    assert in_trigger(trigger, asym) and outside_trigger(trigger, relaxed) == {"attention": "mha"}


def test_the_refusal_derives_exactly_the_three_conditions() -> None:
    """Run by the refusal's rule, each condition's relaxation loses the failure; the index device and the knobs
    (not plain in a sglang-hicache case) do not."""
    case = dsa_case(host_pages=2, pages=1)
    assert index_error(case)
    # not run: the handed-over inputs' non-plain features only; the shape, which nothing tried, stays out
    unrun = derive_trigger(case)
    assert {"host_index.device", "tuning.pool_kind"} <= set(unrun) and not set(unrun) & set(INDEX_ERROR)
    assert derive_trigger(case, index_error) == INDEX_ERROR
    # a failure that needs none of them drops each one
    assert derive_trigger(case, lambda c: True) == {}
    # 5 pages are too few only for the DSA anchor's 6 layers: the DSA kind and its top-k stride are needed too
    assert derive_trigger(dsa_case(host_pages=5), index_error) == {
        **INDEX_ERROR, "tuning.index_topk_freq": "2", "tuning.pool_kind": "dsa"}


# ---- matching -----------------------------------------------------------------------------------------------

def test_the_refusals_trigger_accounts_only_for_mla_page_first_direct_with_too_few_pages() -> None:
    few = hicache_case(Attention.MLA, PFD, host_pages=2, pages=1)
    assert in_trigger(INDEX_ERROR, few) and in_trigger(INDEX_ERROR, dsa_case(host_pages=5))
    assert outside_trigger(INDEX_ERROR, few) == {}
    enough = hicache_case(Attention.MLA, PFD, host_pages=3)
    mha = hicache_case(Attention.MHA, PFD, host_pages=2, pages=1)
    layer_first = hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, host_pages=2, pages=1)
    assert not in_trigger(INDEX_ERROR, enough) and not in_trigger(INDEX_ERROR, dsa_case(host_pages=6))
    assert not in_trigger(INDEX_ERROR, mha) and not in_trigger(INDEX_ERROR, layer_first)
    assert outside_trigger(INDEX_ERROR, enough) == {"host_pages": "at_least_layers"}
    assert outside_trigger(INDEX_ERROR, mha) == {"attention": "mha"}
    assert outside_trigger(INDEX_ERROR, layer_first) == {"layout": "layer_first"}


def test_a_stored_trigger_may_name_the_shape_features() -> None:
    assert trigger_from_json({"layout": "page_first_direct", "host_pages": "fewer_than_layers", "attention": "mla"},
                             "t") == INDEX_ERROR
    with pytest.raises(TriggerError, match="unknown feature 'pages'"):
        trigger_from_json({"pages": "few"}, "t")


def test_a_trigger_the_minimizer_derived_by_running_is_kept_as_recorded(tmp_path: Path) -> None:
    """A minimized reproducer (its report under "minimized") keeps the trigger its run derived, shape included; one
    whose own case misses a condition is refused with the condition named."""
    from hicache_fuzz.harness.findings.known import recorded_trigger
    from hicache_fuzz.harness.findings.reproducer import save_reproducer
    from hicache_fuzz.harness.model.outcome import Outcome, Result
    from hicache_fuzz.kernels.registry import load_registry
    from hicache_fuzz.oracles.contract import Platform

    case = dsa_case(host_pages=2, pages=1)
    refused = Result(case.case_id, case.backend, Outcome.WRONGLY_REJECTED, path="hicache-controller:direct",
                     error="IndexError: index 2 is out of bounds for dimension 0 with size 2")
    backend, platform = load_registry().get(case.backend), Platform("cuda", (9, 0))
    plain = load_entry(save_reproducer(tmp_path / "plain", case, refused, {"expect": "fail"}))
    assert not plain.trigger_run and not set(recorded_trigger(plain, backend, platform)) & set(INDEX_ERROR)
    ran = {"expect": "fail", "minimized": {"runs": 9}, "trigger": INDEX_ERROR}
    entry = load_entry(save_reproducer(tmp_path / "ran", case, refused, ran))
    assert entry.trigger_run and recorded_trigger(entry, backend, platform) == INDEX_ERROR
    wrong = load_entry(save_reproducer(tmp_path / "wrong", case, refused, {**ran, "trigger": {"layout": "page_head"}}))
    with pytest.raises(ValueError, match=r"not met by its own case.*layout=page_first_direct"):
        recorded_trigger(wrong, backend, platform)
