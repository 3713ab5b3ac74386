"""sglang-hicache's layer-sharded DSA indexer (``layer_shard`` on a ``dsa`` case): the oracle's terms for it
(oracles/pool_layouts.py, the layer-sharded DSA section), the contract's rejections of its back-ups on layouts other
than layer_first (``EntryPoint.DSA_SHARDED``), and, with the fake sglang on the CPU, the indexer over a layer-sharded
device pool beside its layer-sharded MLA anchor, its compact host layers, the bytes outside the rank's share, and the
planted bugs of its sharded branch caught."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_dsa import DSA
from hicache_fuzz.kernels.sglang_hicache_settings import (
    DSA_SHARD_PROFILE,
    case_settings,
    contract_entry,
    dsa_index_layers,
    host_pool_layers,
    layer_shard,
    skip_topk_layers,
)
from hicache_fuzz.oracles import pool_layouts
from hicache_fuzz.oracles.contract import EntryPoint, Verdict, predict, primary_rule
from tests.kernels._hicache_helpers import AOT_ROW, JIT_ROW, SHARD_OPS, SM90, fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name



def sharded_dsa_case(layout: HostLayout = HostLayout.LAYER_FIRST, shard: str = "3/1/2", *, head_dim: int = AOT_ROW,
                     **knobs: Any) -> Case:
    """A layer-sharded DSA case: 4 layers (3 index layers of the rank and one packed draft), stage from layer 5; on
    page_first at a page size whose page row is a compiled width (1 x 128 bytes, 12 x 48)."""
    settings: dict[str, Any] = {"pool_kind": "dsa", "layer_shard": shard, "start_layer": 5, "draft_layers": 1,
                                "index_topk_freq": 2, "ops": SHARD_OPS, **knobs}
    page_size = 12 if layout is HostLayout.PAGE_FIRST and head_dim == AOT_ROW else 1
    case = hicache_case(Attention.MLA, layout, page_size=page_size, layers=4, **settings)
    return case.replace(pools=(PoolSpec("kv", Attention.MLA, KVDtype.BF16, 1, head_dim),))


def built_for(case: Case) -> Any:
    return drive.build(drive.load_modules(), case, torch.device("cpu"))


# ---- the oracle's terms -------------------------------------------------------------------------------------

@pytest.mark.parametrize("freq", [1, 2, 3, 5])
def test_index_layers_are_counted_as_sglangs_rule_marks_them(freq: int) -> None:
    for first, end in itertools.product(range(0, 12), range(0, 16)):
        counted = sum(not pool_layouts.skips_topk(layer, freq) for layer in range(first, end))
        assert pool_layouts.index_layers_in(first, end, freq) == counted, (first, end)


@pytest.mark.parametrize("freq", [1, 2, 3])
@pytest.mark.parametrize("first_layer", [0, 1, 5, 126])
def test_every_share_of_index_layers_has_a_stage_and_it_is_the_smallest(freq: int, first_layer: int) -> None:
    for size in (2, 3, 4):
        for rank, remainder, wanted in itertools.product(range(size), range(size), range(1, 7)):
            stage = pool_layouts.dsa_shard_stage_layers(wanted, size, rank, remainder, first_layer, freq)
            start, end = pool_layouts.layer_shard_range(rank, size, stage)
            assert stage % size == remainder
            assert pool_layouts.index_layers_in(first_layer + start, first_layer + end, freq) == wanted
            for smaller in range(remainder, stage, size):  # no smaller stage of the remainder has the share
                s, e = pool_layouts.layer_shard_range(rank, size, smaller)
                assert pool_layouts.index_layers_in(first_layer + s, first_layer + e, freq) != wanted or e == s


def test_the_sharded_host_layers_are_the_owned_index_layers_and_only_layer_first_backs_up() -> None:
    skips = (False, False, True, False, True, False, True, False)
    assert pool_layouts.dsa_shard_index_layers(skips, 2, 6) == (3, 5)
    assert pool_layouts.dsa_shard_index_layers(skips, 0, 2) == (0, 1)
    assert pool_layouts.dsa_shard_backup_refusal(HostLayout.LAYER_FIRST) == ""
    for layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        assert layout.value in pool_layouts.dsa_shard_backup_refusal(layout)


# ---- the knob, the entry point and the contract ---------------------------------------------------------------

def test_the_knob_shards_a_dsa_case_over_a_stage_its_index_layers_fix() -> None:
    case = sharded_dsa_case()
    shard = layer_shard(case)
    assert shard is not None and case_settings(case)[0] == DSA
    skip = skip_topk_layers(case)
    assert len(skip) == shard.stage_layers and shard.stage_layers % 3 == 2
    layers = dsa_index_layers(case)
    assert len(layers) == case.layers - 1 and all(shard.start <= layer < shard.start + shard.owned for layer in layers)
    assert all(not skip[layer] for layer in layers)
    # the anchor: ceil(L / 3) target layers and the draft
    assert host_pool_layers(case) == -(-shard.stage_layers // 3) + 1 == shard.host_target_layers + 1
    assert contract_entry(case) is EntryPoint.DSA_SHARDED
    assert contract_entry(sharded_dsa_case(shard="")) is EntryPoint.REFERENCE
    labels = SglangHicacheBackend().coverage_labels(case)
    assert labels["layer_sharded_class"] == DSA and labels["layer_shard"] == "3/1/2"


@pytest.mark.parametrize("layout", [HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT])
def test_the_contract_rejects_every_sequence_that_backs_up_off_layer_first(layout: HostLayout) -> None:
    for case in (sharded_dsa_case(layout), sharded_dsa_case(layout, direction=Direction.LOAD_BACK, ops="load,backup")):
        prediction = predict(case, EntryPoint.DSA_SHARDED, SM90)
        assert prediction.verdict is Verdict.REJECT and primary_rule(prediction.reasons) == "layer-sharded-backup"
    loads_only = sharded_dsa_case(layout, direction=Direction.LOAD_BACK, ops="load,load")
    assert predict(loads_only, EntryPoint.DSA_SHARDED, SM90).verdict is Verdict.ACCEPT
    assert predict(sharded_dsa_case(), EntryPoint.DSA_SHARDED, SM90).verdict is Verdict.ACCEPT


def test_no_transfer_rule_takes_a_sharded_dsa_case_off_the_contract() -> None:
    """The sharded MLA pool's own back-up rules (unsupported) do not apply to a DSA case: its refusals are checked."""
    backend = SglangHicacheBackend()
    for layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        case = sharded_dsa_case(layout)
        assert backend.case_unsupported(case) is None and backend.transfer_unsupported(case, SM90) is None


# ---- driven through the fake sglang -------------------------------------------------------------------------

@pytest.mark.parametrize(("io", "head_dim"), [("kernel", AOT_ROW), ("kernel", JIT_ROW), ("direct", AOT_ROW)])
@pytest.mark.parametrize("freq", [1, 2, 3])
@pytest.mark.parametrize("shard", ["2/0/0", "3/1/2", "4/3/1", "3/2/0"])
@pytest.mark.parametrize("direction", [Direction.WRITE_BACK, Direction.LOAD_BACK])
def test_a_sharded_indexer_moves_its_rank_s_index_layers_exactly(fake_sglang, io: str, head_dim: int, freq: int,
                                                                 shard: str, direction: Direction) -> None:
    case = sharded_dsa_case(shard=shard, head_dim=head_dim, io_backend=io, index_topk_freq=freq, direction=direction)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary


def test_the_indexer_keeps_the_owned_index_layers_beside_a_sharded_anchor(fake_sglang) -> None:
    case = sharded_dsa_case(shard="3/2/0")
    shard = layer_shard(case)
    assert shard is not None
    built = built_for(case)
    group, host = built.dsa, built.host_pool
    assert group is not None and type(host).__name__ == DSA
    device = built.device_pool
    assert device.layer_shard_enabled and device._owned_local_layer_range() == (shard.start, shard.start + shard.owned)
    assert device.layer_num == shard.stage_layers
    assert tuple(host._live) == dsa_index_layers(case) == group.layers
    assert host.layer_num == case.layers and host.target_layer_num == case.layers - 1
    assert tuple(host.index_k_with_scale_buffer.shape) == pool_layouts.dsa_host_shape(
        case.layout, case.layers, case.host_slots, 1, 2 * AOT_ROW)
    anchor = group.anchor_host
    assert anchor._layer_shard_enabled and anchor.target_layer_num == shard.host_target_layers
    assert tuple(anchor._target_layer_indices) == tuple(range(shard.start, shard.start + shard.owned))
    assert built.controller.transfer_layer_id_max == shard.stage_layers


@pytest.mark.parametrize(("layout", "io", "head_dim", "raised"), [
    # the anchor backs up with the JIT kernel, then the indexer refuses
    (HostLayout.PAGE_FIRST, "kernel", JIT_ROW, "Layer-sharded DSA indexer HiCache backup with page_first"),
    # the anchor refuses first (its page_first back-up needs the JIT kernel)
    (HostLayout.PAGE_FIRST, "kernel", AOT_ROW, "Layer-sharded MLA HiCache backup with page_first"),
    (HostLayout.PAGE_FIRST_DIRECT, "direct", AOT_ROW, "Layer-sharded direct HiCache backup only supports"),
])
def test_back_ups_off_layer_first_are_rejected_as_predicted(fake_sglang, layout: HostLayout, io: str, head_dim: int,
                                                            raised: str) -> None:
    case = sharded_dsa_case(layout, head_dim=head_dim, io_backend=io)
    assert case_settings(case)[:2] == (DSA, io)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.REJECTED_AS_PREDICTED, result.summary
    assert raised in (result.error or "") and result.diff == {"bytes_changed_before_rejection": False}
    loads = sharded_dsa_case(layout, head_dim=head_dim, io_backend=io, direction=Direction.LOAD_BACK,
                             ops="load,load")
    assert run_on_cpu(loads).outcome is Outcome.PASS  # loads move on every layout


def test_the_indexer_s_own_refusal_on_page_first_direct(fake_sglang, monkeypatch) -> None:
    """The anchor refuses page_first_direct back-ups first; with the anchor's let through, the indexer's refusal is
    sglang's own words."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    monkeypatch.setattr(MLATokenToKVPoolHost, "backup_from_device_all_layer", lambda *args, **kwargs: None)
    result = run_on_cpu(sharded_dsa_case(HostLayout.PAGE_FIRST_DIRECT, io_backend="direct"))
    assert result.outcome is Outcome.REJECTED_AS_PREDICTED
    assert "Layer-sharded direct DSA indexer backup only supports layer_first layout" in (result.error or "")


# ---- planted bugs -------------------------------------------------------------------------------------------

def test_a_sharded_back_up_without_its_draft_layers_is_caught(fake_sglang, monkeypatch) -> None:
    case = sharded_dsa_case()
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "dsa_shard_drafts")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary
    assert run_on_cpu(sharded_dsa_case(shard="")).outcome is Outcome.PASS  # the sharded branch only


def test_index_layers_taken_from_the_first_rank_s_range_are_caught(fake_sglang, monkeypatch) -> None:
    case = sharded_dsa_case(shard="3/2/0")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "dsa_shard_range")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary
    assert run_on_cpu(sharded_dsa_case(shard="3/0/0")).outcome is Outcome.PASS  # rank 0's range starts at 0


def test_a_sharded_back_up_that_no_longer_refuses_page_first_is_caught(fake_sglang, monkeypatch) -> None:
    """With a row the JIT kernel takes, the anchor backs up page_first and the indexer's refusal is the only one."""
    case = sharded_dsa_case(HostLayout.PAGE_FIRST, head_dim=JIT_ROW)
    assert run_on_cpu(case).outcome is Outcome.REJECTED_AS_PREDICTED
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "dsa_shard_page_first")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_ACCEPTED, result.summary
    assert "layer-sharded DSA indexer backs up layer_first only" in result.summary


def test_the_sharded_anchor_is_judged_over_the_rank_s_share(fake_sglang, monkeypatch) -> None:
    """The MLA anchor's sharded back-up with its indices swapped (mutant fb872783738d) fails a DSA case too."""
    case = sharded_dsa_case(ops="backup")
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "shard_swap")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED
    assert "the MLA anchor's host bytes differ from the oracle's after the sequence" in result.summary


@pytest.mark.parametrize("where", ["indexer", "anchor"])
def test_a_load_into_another_rank_s_layer_is_caught(fake_sglang, monkeypatch, where: str) -> None:
    """Bytes no case storage holds: the other ranks' index buffers and anchor rows must keep theirs."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    case = sharded_dsa_case(shard="3/1/2", index_topk_freq=1)
    shard = layer_shard(case)
    assert shard is not None and run_on_cpu(case).outcome is Outcome.PASS
    cls: Any = DSAIndexerPoolHost if where == "indexer" else MLATokenToKVPoolHost
    load = cls.load_to_device_per_layer
    other = shard.start - 1  # the last layer of rank 0, an index layer at freq 1

    def load_another_layer_too(self, device_pool, host_indices, device_indices, layer_id, io_backend, *,
                               is_draft=False):
        load(self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft)
        if layer_id == other and not is_draft:
            buffers = device_pool.index_k_with_scale_buffer if where == "indexer" else device_pool.kv_buffer
            buffers[layer_id].view(torch.uint8)[device_indices] = 0xEE

    monkeypatch.setattr(cls, "load_to_device_per_layer", load_another_layer_too)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert "(rank 1 of 3 does not own it) changed" in result.summary


# ---- generation ---------------------------------------------------------------------------------------------

def test_the_profile_draws_dsa_cases_with_the_knob_set() -> None:
    from hicache_fuzz.harness.generation.generate import case_for_index
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.kernels.registry import load_registry

    backend = load_registry().get("sglang-hicache")
    space = DSA_SHARD_PROFILE.applied_to(backend.case_space(CaseSpace(), SM90))
    entries = set()
    for index in range(300):
        case = case_for_index(3, index, space)
        if backend.case_unsupported(case) is None and layer_shard(case) is not None:
            entries.add((case_settings(case)[0], case.layout, predict(case, contract_entry(case), SM90).verdict))
    assert {(DSA, HostLayout.LAYER_FIRST, Verdict.ACCEPT), (DSA, HostLayout.PAGE_FIRST_DIRECT, Verdict.REJECT)} <= (
        entries)


def test_an_fp8_sharded_case_moves_exactly(fake_sglang) -> None:
    """The other ranks' anchor rows are judged as bytes, whatever the KV dtype."""
    case = sharded_dsa_case()
    case = case.replace(pools=(PoolSpec("kv", Attention.MLA, KVDtype.FP8, 1, 2 * AOT_ROW),))
    assert run_on_cpu(case).outcome is Outcome.PASS


def test_objects_of_one_sharded_geometry_are_reused_and_judged_again(fake_sglang) -> None:
    from tests.kernels._hicache_helpers import run_twice_on_kept_objects

    run_twice_on_kept_objects(sharded_dsa_case(shard="4/3/1", ops="backup,evict,backup"))
