"""sglang-hicache's two device-pool shapes beyond the packed per-layer pool (fake sglang on the CPU): the
layer-sharded MLA pool (``layer_shard``) and token-major device rows (``device_rows=token_major``, with packed draft
layers beside them the host pool's refusal the contract predicts), their rules in the oracle, their knobs' draws and
labels, and the planted bugs of the four mutants they reach, each caught. The layer-sharded DSA indexer:
tests/kernels/test_hicache_dsa_shard.py."""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, KVDtype, PoolSpec, make_tuning
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels import sglang_hicache_device as devices
from hicache_fuzz.kernels import sglang_hicache_drive as drive
from hicache_fuzz.kernels import sglang_hicache_objects as objects
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_hicache import SglangHicacheBackend
from hicache_fuzz.kernels.sglang_hicache_settings import (
    LAYER_SHARD_VALUES,
    PACKED,
    TOKEN_MAJOR,
    contract_entry,
    device_rows,
    device_target_layers,
    host_pool_layers,
    layer_shard,
    side_pool,
    target_rows_strided,
)
from hicache_fuzz.oracles import pool_layouts
from hicache_fuzz.oracles.contract import EntryPoint, Verdict, hicache_jit_takes_row, predict, primary_rule
from tests.kernels._hicache_helpers import AOT_ROW, JIT_ROW, SHARD_OPS, SM90, fake_sglang, hicache_case, run_on_cpu

__all__ = ["fake_sglang"]  # the fixture, used by name



def mla_case(layout: HostLayout, shard: str, *, head_dim: int = JIT_ROW, layers: int = 4, ops: str = SHARD_OPS,
             **knobs: Any) -> Case:
    case = hicache_case(Attention.MLA, layout, layers=layers, ops=ops, layer_shard=shard, start_layer=3, **knobs)
    return case.replace(pools=(PoolSpec("kv", Attention.MLA, KVDtype.BF16, 1, head_dim),))


def built_for(case: Case) -> objects.Built:
    return drive.build(drive.load_modules(), case, torch.device("cpu"))


# ---- the layer-sharded MLA pool -----------------------------------------------------------------------------------

def test_the_stage_follows_from_the_rank_its_share_and_the_remainder() -> None:
    for size, owned in itertools.product((2, 3, 4), (1, 2, 5)):
        for rank, remainder in itertools.product(range(size), range(size)):
            stage = pool_layouts.shard_stage_layers(owned, size, rank, remainder)
            start, end = pool_layouts.layer_shard_range(rank, size, stage)
            assert stage % size == remainder and end - start == owned
            # every rank's share, side by side, is the whole stage
            ranges = [pool_layouts.layer_shard_range(r, size, stage) for r in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == stage
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError):
        pool_layouts.shard_stage_layers(0, 2, 0, 0)


@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize(("layout", "io", "head_dim"), [(HostLayout.LAYER_FIRST, "kernel", JIT_ROW),
                                                        (HostLayout.LAYER_FIRST, "kernel", AOT_ROW),
                                                        (HostLayout.LAYER_FIRST, "direct", AOT_ROW),
                                                        (HostLayout.PAGE_FIRST, "kernel", JIT_ROW)])
@pytest.mark.parametrize("shard", ["2/0/0", "3/1/2", "3/2/1", "4/3/0"])
def test_a_layer_sharded_mla_pool_holds_its_rank_s_layers_compacted(fake_sglang, controller: str, layout: HostLayout,
                                                                   io: str, head_dim: int, shard: str) -> None:
    case = mla_case(layout, shard, head_dim=head_dim, io_backend=io, controller=controller, draft_layers=1)
    sharding = layer_shard(case)
    assert sharding is not None and sharding.owned == case.layers - 1
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    built = built_for(case)
    host, device = built.host_pool, built.device_pool
    assert device.layer_num == sharding.stage_layers == device_target_layers(case)
    assert host.target_layer_num == sharding.host_target_layers and host.layer_num == host_pool_layers(case)
    assert tuple(host._target_layer_indices) == tuple(range(sharding.start, sharding.start + sharding.owned))
    assert len(host._target_layer_indices) == sharding.owned


@pytest.mark.parametrize("where", ["device", "host"])
def test_bytes_outside_the_rank_s_share_are_judged(fake_sglang, monkeypatch, where: str) -> None:
    """A load that writes another rank's device layer, or a back-up that writes a host layer no owned layer maps
    to, fails the case although every case storage is right."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    case = mla_case(HostLayout.LAYER_FIRST, "3/2/1")  # rank 2 owns 3 of 10 layers: 4 host target layers
    sharding = layer_shard(case)
    assert sharding is not None and sharding.host_target_layers > sharding.owned
    assert run_on_cpu(case).outcome is Outcome.PASS
    load, backup = MLATokenToKVPoolHost.load_to_device_per_layer, MLATokenToKVPoolHost.backup_from_device_all_layer

    def load_others_too(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
        if not is_draft and layer_id not in self._target_layer_indices and 0 <= layer_id < device_pool.layer_num:
            device_pool.kv_buffer[layer_id][device_indices] = 0
        load(self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft)

    def back_up_a_spare_layer_too(self, device_pool, host_indices, device_indices, io_backend):
        backup(self, device_pool, host_indices, device_indices, io_backend)
        self.kv_buffer[sharding.owned][host_indices] = 0

    if where == "device":
        monkeypatch.setattr(MLATokenToKVPoolHost, "load_to_device_per_layer", load_others_too)
    else:
        monkeypatch.setattr(MLATokenToKVPoolHost, "backup_from_device_all_layer", back_up_a_spare_layer_too)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert ("does not own it" if where == "device" else "no owned layer maps to them") in result.summary


def test_a_planted_index_swap_in_the_sharded_back_up_is_caught(fake_sglang, monkeypatch) -> None:
    """Mutant fb872783738d (mla.py:1009): the owned layers' back-ups get host and device indices swapped."""
    case = mla_case(HostLayout.LAYER_FIRST, "2/1/0")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "shard_swap")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary
    unsharded = mla_case(HostLayout.LAYER_FIRST, "")
    assert run_on_cpu(unsharded).outcome is Outcome.PASS  # the planted bug is in the layer-shard branch only


def test_a_planted_drop_of_the_sharded_aot_back_up_is_caught(fake_sglang, monkeypatch) -> None:
    """Mutant b96a64bdd457 (mla.py:873): the sharded back-up on layer_first without the JIT kernel never calls
    transfer_kv_per_layer_mla; it needs a row the JIT kernels do not take."""
    case = mla_case(HostLayout.LAYER_FIRST, "3/0/2", head_dim=AOT_ROW)
    jit = mla_case(HostLayout.LAYER_FIRST, "3/0/2", head_dim=JIT_ROW)
    assert not built_for(case).host_pool.can_use_jit and built_for(jit).host_pool.can_use_jit
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "shard_aot_drop")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.MISMATCH and result.summary.startswith("step 0 (backup)"), result.summary
    assert run_on_cpu(jit).outcome is Outcome.PASS  # the JIT one-layer kernel moves it


SM80 = Platform("cuda", (8, 0))  # no TMA: the register kernel alone decides the JIT gate


def test_the_contract_predicts_the_sharded_back_ups_sglang_refuses() -> None:
    """page_first without the JIT kernel and page_first_direct: sglang builds the pool and raises ValueError at every
    back-up; the contract rejects every sequence that backs up there and accepts loads on every layout."""
    refused = [mla_case(HostLayout.PAGE_FIRST, "2/0/1", head_dim=AOT_ROW),
               mla_case(HostLayout.PAGE_FIRST_DIRECT, "2/0/1", io_backend="direct"),
               mla_case(HostLayout.PAGE_FIRST, "2/0/1", head_dim=AOT_ROW, direction=Direction.LOAD_BACK,
                        ops="load,backup")]
    for case in refused:
        assert contract_entry(case) is EntryPoint.MLA_SHARDED
        prediction = predict(case, EntryPoint.MLA_SHARDED, SM90)
        assert prediction.verdict is Verdict.REJECT and primary_rule(prediction.reasons) == "layer-sharded-backup"
        assert "ValueError at every back-up" in prediction.reasons[0]
    moved = [mla_case(HostLayout.PAGE_FIRST, "2/0/1"), mla_case(HostLayout.LAYER_FIRST, "2/0/1", head_dim=AOT_ROW),
             mla_case(HostLayout.LAYER_FIRST, "2/0/1", io_backend="direct")]
    moved += [mla_case(layout, "2/0/1", head_dim=AOT_ROW, direction=Direction.LOAD_BACK, ops="load,load")
              for layout in (HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT)]
    for case in moved:
        assert predict(case, EntryPoint.MLA_SHARDED, SM90).verdict is Verdict.ACCEPT, case.layout
    assert contract_entry(mla_case(HostLayout.PAGE_FIRST, "")) is EntryPoint.REFERENCE


def test_the_sharded_page_first_refusal_hangs_on_the_jit_gate_of_the_row_and_page_size() -> None:
    """A 48-byte latent row: the register kernel never takes it, the TMA kernel where its chunk of 128 rows tiles
    the page. So page_first moves at page size 128 on sm90 and is refused at page size 2, or on a GPU without TMA."""
    tma_page = mla_case(HostLayout.PAGE_FIRST, "3/2/0", head_dim=AOT_ROW, page_size=128)
    assert predict(tma_page, EntryPoint.MLA_SHARDED, SM90).verdict is Verdict.ACCEPT
    assert predict(tma_page, EntryPoint.MLA_SHARDED, SM80).verdict is Verdict.REJECT
    assert predict(mla_case(HostLayout.PAGE_FIRST, "3/2/0", head_dim=JIT_ROW), EntryPoint.MLA_SHARDED,
                   SM80).verdict is Verdict.ACCEPT  # 128 bytes: the register kernel's copy round
    assert not hicache_jit_takes_row(JIT_ROW * 2, 2, Platform("cpu"))  # sglang's can_use_jit: CUDA or ROCm only


def test_the_contract_s_jit_gate_is_the_fake_sglang_s(fake_sglang) -> None:
    """The gate the contract states (hicache_jit_takes_row) answers as the one the fake sglang's pools are built
    with, for rows and page sizes on both sides of each rule."""
    from sglang.kernels.ops.kvcache.hicache import can_use_hicache_jit_kernel

    for row, page_size in itertools.product(range(8, 1300, 8), (1, 2, 3, 8, 16, 32, 64, 96, 128, 256)):
        assert hicache_jit_takes_row(row, page_size, SM90) == can_use_hicache_jit_kernel(
            element_size=row, page_size=page_size), (row, page_size)


@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize(("layout", "io", "raised"), [
    (HostLayout.PAGE_FIRST, "kernel",
     "Layer-sharded MLA HiCache backup with page_first layout requires the JIT one-layer kernel."),
    (HostLayout.PAGE_FIRST_DIRECT, "direct",
     "Layer-sharded direct HiCache backup only supports layer_first layout, got page_first_direct"),
])
def test_sharded_back_ups_sglang_refuses_are_rejected_as_predicted(fake_sglang, controller: str, layout: HostLayout,
                                                                  io: str, raised: str) -> None:
    case = mla_case(layout, "3/1/2", head_dim=AOT_ROW, io_backend=io, controller=controller, draft_layers=1)
    assert SglangHicacheBackend().transfer_unsupported(case, SM90) is None
    result = run_on_cpu(case)
    assert result.outcome is Outcome.REJECTED_AS_PREDICTED, result.summary
    assert raised in (result.error or "") and result.diff == {"bytes_changed_before_rejection": False}
    loads = mla_case(layout, "3/1/2", head_dim=AOT_ROW, io_backend=io, controller=controller, draft_layers=1,
                     direction=Direction.LOAD_BACK, ops="load,load")
    assert run_on_cpu(loads).outcome is Outcome.PASS  # loads move on every layout


def test_the_tma_kernel_moves_a_sharded_page_first_row_the_register_kernel_does_not_take(fake_sglang,
                                                                                        monkeypatch) -> None:
    """With the TMA switch at sglang's default the row moves; a process that turns it off has another gate than the
    contract's and does not run the case."""
    case = mla_case(HostLayout.PAGE_FIRST, "2/1/1", head_dim=AOT_ROW, page_size=128, pages=1, host_pages=3,
                    device_pages=3)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    monkeypatch.setenv("SGLANG_HICACHE_TMA_TRANSFER", "0")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.UNSUPPORTED and "SGLANG_HICACHE_TMA_TRANSFER off" in result.summary


@pytest.mark.parametrize(("layout", "io"), [(HostLayout.PAGE_FIRST, "kernel"),
                                            (HostLayout.PAGE_FIRST_DIRECT, "direct")])
def test_a_sharded_back_up_that_no_longer_refuses_is_caught(fake_sglang, monkeypatch, layout: HostLayout,
                                                            io: str) -> None:
    case = mla_case(layout, "2/0/1", head_dim=AOT_ROW, io_backend=io)
    assert run_on_cpu(case).outcome is Outcome.REJECTED_AS_PREDICTED
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "shard_no_refusal")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_ACCEPTED, result.summary
    assert "the layer-sharded MLA back-up" in result.summary
    assert run_on_cpu(mla_case(HostLayout.LAYER_FIRST, "2/0/1", head_dim=AOT_ROW)).outcome is Outcome.PASS


def drive_without_rules(case: Case):  # type: ignore[no-untyped-def]
    """The case run with the case rules only (no transfer rule): what the fake sglang does with it."""
    from hicache_fuzz.harness.pipeline.runner import run_case
    from tests.kernels._hicache_helpers import CPU, CpuHicacheBackend

    class Unruled(CpuHicacheBackend):
        def unsupported_reason(self, case: Case, platform: Platform) -> str | None:
            return self.case_unsupported(case)

    return run_case(case, Unruled(), CPU, torch.device("cpu"))


def test_the_knob_shards_only_the_mla_host_pool_and_the_dsa_indexer() -> None:
    assert layer_shard(mla_case(HostLayout.LAYER_FIRST, "3/1/1")) is not None
    assert layer_shard(mla_case(HostLayout.LAYER_FIRST, "")) is None
    assert layer_shard(hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, layer_shard="2/0/0",
                                    pool_kind="dsa")) is not None  # tests/kernels/test_hicache_dsa_shard.py
    for other in (hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, layer_shard="2/0/0"),
                  hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, layer_shard="2/0/0", pool_kind="k_only")):
        assert layer_shard(other) is None
    # a DSA model's group has no K-only or Mamba side pool
    assert side_pool(mla_case(HostLayout.LAYER_FIRST, "2/0/0", side_pool="k_only")) == ""
    assert side_pool(mla_case(HostLayout.LAYER_FIRST, "", side_pool="k_only")) == "MHATokenToKOnlyPoolHost"
    backend = SglangHicacheBackend()
    for bad in ("1/0/0", "2/2/0", "2/0/2", "x", "2/0"):
        reason = backend.case_unsupported(mla_case(HostLayout.LAYER_FIRST, bad))
        assert reason is not None and reason.startswith("unknown layer_shard"), bad


# ---- token-major device rows --------------------------------------------------------------------------------------

def token_major_case(attention: Attention, layout: HostLayout, io: str = "kernel", head_dim: int = 0,
                     **knobs: int | str) -> Case:
    case = hicache_case(attention, layout, layers=3, ops=SHARD_OPS, io_backend=io,
                        **{"device_rows": TOKEN_MAJOR, **knobs})
    if head_dim:
        spec = case.pools[0]
        case = case.replace(pools=(PoolSpec("kv", attention, KVDtype.BF16, spec.heads, head_dim,
                                            v_head_dim=spec.v_head_dim),))
    return case


# JIT rows: MHA 2 heads x 32 bf16 = 128 bytes, MLA 64 bf16 = 128 bytes; the helpers' rows (32 and 48 bytes) are AOT
TOKEN_MAJOR_RUNS = [(Attention.MHA, HostLayout.LAYER_FIRST, "kernel", 32), (Attention.MHA, HostLayout.PAGE_FIRST,
                                                                              "kernel", 32),
                    (Attention.MHA, HostLayout.LAYER_FIRST, "direct", 0), (Attention.MLA, HostLayout.LAYER_FIRST,
                                                                           "kernel", JIT_ROW),
                    (Attention.MLA, HostLayout.PAGE_FIRST, "kernel", JIT_ROW),
                    (Attention.MLA, HostLayout.LAYER_FIRST, "direct", AOT_ROW),
                    (Attention.MHA_ASYM, HostLayout.PAGE_FIRST, "kernel", 0),
                    (Attention.MHA_ASYM, HostLayout.PAGE_FIRST_DIRECT, "direct", 0)]


@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize(("attention", "layout", "io", "head_dim"), TOKEN_MAJOR_RUNS)
def test_token_major_device_rows_are_moved_row_for_row(fake_sglang, controller: str, attention: Attention,
                                                      layout: HostLayout, io: str, head_dim: int) -> None:
    case = token_major_case(attention, layout, io, head_dim, controller=controller)
    assert device_rows(case) == TOKEN_MAJOR
    assert SglangHicacheBackend().transfer_unsupported(case, SM90) is None
    result = run_on_cpu(case)
    assert result.outcome is Outcome.PASS, result.summary
    built = built_for(case)
    assert type(built.device_pool).__name__.startswith("Unified")
    buffers = built.device_pool.kv_buffer if attention is Attention.MLA else built.device_pool.k_buffer
    assert not buffers[0].is_contiguous()
    assert not built.host_pool.device_rows_packed
    assert built.host_pool.device_row_stride_bytes == buffers[0].stride(0) * buffers[0].element_size()


def test_entry_padding_of_a_token_major_pool_is_judged(fake_sglang, monkeypatch) -> None:
    """3 latent rows of 48 bytes fill 144 of a 160-byte entry: a back-up that writes past a row's end lands in
    the padding (or the next layer's row), which no case storage holds."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    case = token_major_case(Attention.MLA, HostLayout.LAYER_FIRST, "direct", AOT_ROW)
    assert run_on_cpu(case).outcome is Outcome.PASS
    load = MLATokenToKVPoolHost.load_to_device_per_layer

    def load_past_the_row(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
        load(self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft)
        if layer_id == device_pool.layer_num - 1:  # the last layer's row ends where the padding begins
            last = self._device_buffer(layer_id).view(torch.uint8)  # rows 160 bytes apart, at entry byte 96
            padding = torch.as_strided(last, (last.shape[0], 16), (last.stride(0), 1), 3 * 48)
            padding[device_indices] = 0xEE

    monkeypatch.setattr(MLATokenToKVPoolHost, "load_to_device_per_layer", load_past_the_row)
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED and "entry bytes" in result.summary, result.summary


def test_a_planted_off_by_one_in_the_stride_check_is_caught(fake_sglang, monkeypatch) -> None:
    """Mutant 6dd5b555800b (base.py:322): ``len(strides) >= 1`` refuses every strided device pool at construction."""
    case = token_major_case(Attention.MHA, HostLayout.LAYER_FIRST, "direct")
    assert run_on_cpu(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "stride_ge")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED and "do not share one row stride" in (result.error or "")
    packed = hicache_case(Attention.MHA, HostLayout.LAYER_FIRST, layers=3, ops=SHARD_OPS, io_backend="direct")
    assert run_on_cpu(packed).outcome is Outcome.PASS  # packed rows never reach the check's comparison


@pytest.mark.parametrize(("attention", "layout", "io"), [
    (a, layout, io) for a in (Attention.MHA, Attention.MLA, Attention.MHA_ASYM) for io in pool_layouts.IO_BACKENDS
    for layout in sorted(pool_layouts.pool_class({Attention.MHA: "MHATokenToKVPoolHost",
                                                   Attention.MLA: "MLATokenToKVPoolHost",
                                                   Attention.MHA_ASYM: "AsymmetricMHATokenToKVPoolHost"}[a])
                         .layouts_for(io), key=lambda x: x.value)])
@pytest.mark.parametrize("jit", [True, False])
def test_the_contract_s_refusals_are_the_ones_sglang_makes(fake_sglang, attention: Attention, layout: HostLayout,
                                                           io: str, jit: bool) -> None:
    """For every class, layout, io backend and JIT availability: the oracle's rule names a refusal exactly where the
    pool refuses (NotImplementedError naming the op, before any byte moves), and the rest run."""
    head_dim = {Attention.MHA: 32 if jit else 8, Attention.MLA: JIT_ROW if jit else AOT_ROW,
                Attention.MHA_ASYM: 32 if jit else 8}[attention]
    case = token_major_case(attention, layout, io, head_dim)
    assert device_rows(case) == TOKEN_MAJOR and built_for(case).host_pool.can_use_jit is jit
    reason = SglangHicacheBackend().transfer_unsupported(case, SM90)
    result = drive_without_rules(case)
    if reason is None:
        assert result.outcome is Outcome.PASS, result.summary
    else:
        assert result.outcome is Outcome.WRONGLY_REJECTED and "NotImplementedError" in (result.error or "")
        assert result.diff == {"bytes_changed_before_rejection": False}
        op = (result.error or "").split("HiCache: ")[1].split(" ")[0]
        assert op in reason


def test_token_major_rows_resolve_to_packed_where_sglang_builds_no_unified_pool() -> None:
    assert device_rows(token_major_case(Attention.MHA, HostLayout.PAGE_FIRST)) == TOKEN_MAJOR
    # packed draft layers beside token-major target rows: built, and refused by the host pool (tests below)
    assert device_rows(token_major_case(Attention.MHA, HostLayout.PAGE_FIRST, draft_layers=1)) == TOKEN_MAJOR
    assert device_rows(token_major_case(Attention.MLA, HostLayout.PAGE_FIRST, start_layer=2)) == PACKED
    assert device_rows(token_major_case(Attention.MHA, HostLayout.PAGE_FIRST, start_layer=2)) == TOKEN_MAJOR
    assert device_rows(token_major_case(Attention.MHA, HostLayout.LAYER_FIRST, pool_kind="hisparse")) == PACKED
    assert device_rows(token_major_case(Attention.MLA, HostLayout.LAYER_FIRST, pool_kind="k_only")) == PACKED
    assert device_rows(mla_case(HostLayout.LAYER_FIRST, "2/0/0", device_rows=TOKEN_MAJOR)) == PACKED
    narrow = token_major_case(Attention.MHA, HostLayout.PAGE_FIRST).replace(
        pools=(PoolSpec("kv", Attention.MHA, KVDtype.BF16, 1, 4),))  # 8-byte rows: no unified pool
    assert device_rows(narrow) == PACKED
    unknown = token_major_case(Attention.MHA, HostLayout.PAGE_FIRST, device_rows="strided")
    assert (SglangHicacheBackend().case_unsupported(unknown) or "").startswith("unknown device_rows")


def test_outside_bytes_notice_a_changed_region() -> None:
    outside = devices.OutsideBytes()
    whole, rows = torch.zeros(6, dtype=torch.bfloat16), torch.zeros((4, 8), dtype=torch.uint8)
    outside.add("whole", whole)
    outside.add("columns", rows, torch.tensor([1, 5]))
    outside.fill_and_snapshot()
    assert outside.changed() == ""
    rows[:, 2] = 0xFF  # not one of the region's columns
    assert outside.changed() == ""
    rows[3, 5] = rows[3, 5] + 1
    assert outside.changed().startswith("columns changed (1 bytes)")


# ---- token-major target rows with packed draft layers --------------------------------------------------------------

@pytest.mark.parametrize("controller", ["hybrid", "base"])
@pytest.mark.parametrize(("attention", "layout", "io", "head_dim"), TOKEN_MAJOR_RUNS)
def test_packed_draft_rows_beside_strided_target_rows_are_rejected_as_predicted(
        fake_sglang, controller: str, attention: Attention, layout: HostLayout, io: str, head_dim: int) -> None:
    """The draft model's private (packed) pool beside the target's unified views: the host pool refuses the two row
    strides when it is built, before any byte moves, as the contract predicts."""
    case = token_major_case(attention, layout, io, head_dim, controller=controller, draft_layers=1)
    assert device_rows(case) == TOKEN_MAJOR and target_rows_strided(case)
    backend = SglangHicacheBackend()
    assert backend.case_unsupported(case) is None and backend.transfer_unsupported(case, SM90) is None
    assert backend.plan(case, SM90).entry is EntryPoint.MIXED_ROW_STRIDES
    prediction = predict(case, EntryPoint.MIXED_ROW_STRIDES, SM90)
    assert prediction.verdict is Verdict.REJECT and primary_rule(prediction.reasons) == "mixed-row-strides"
    result = run_on_cpu(case)
    assert result.outcome is Outcome.REJECTED_AS_PREDICTED, result.summary
    assert "do not share one row stride" in (result.error or "")
    assert result.diff == {"bytes_changed_before_rejection": False}
    assert backend.coverage_labels(case)["token_major_draft_layers"] is True


def test_a_contiguous_target_view_beside_packed_drafts_is_packed_rows_and_moves(fake_sglang) -> None:
    """One MLA target layer whose 64-byte row is its whole entry: the unified pool's view is contiguous, the host
    pool takes every device row as packed (the drafts' too), and the case moves."""
    case = token_major_case(Attention.MLA, HostLayout.LAYER_FIRST, "kernel", 32, draft_layers=1).replace(layers=2)
    assert device_rows(case) == TOKEN_MAJOR and not target_rows_strided(case)
    assert SglangHicacheBackend().plan(case, SM90).entry is EntryPoint.REFERENCE
    assert run_on_cpu(case).outcome is Outcome.PASS
    built = built_for(case)
    assert built.device_pool.kv_buffer[0].is_contiguous() and built.host_pool.device_rows_packed


@pytest.mark.parametrize(("attention", "head_dim"), [(Attention.MHA, 32), (Attention.MHA_ASYM, 0), (Attention.MLA, 32),
                                                     (Attention.MLA, 24), (Attention.MLA, 64)])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_oracle_knows_which_unified_views_are_strided(fake_sglang, attention: Attention, head_dim: int,
                                                          layers: int) -> None:
    case = token_major_case(attention, HostLayout.PAGE_FIRST, "kernel", head_dim).replace(layers=layers)
    pool = devices.token_major_pool(case, case.pools[0], layers, torch.bfloat16, torch.device("cpu"), 0)
    view = pool.kv_buffer[0] if attention is Attention.MLA else pool.k_buffer[0]
    assert target_rows_strided(case) is not view.is_contiguous()


def test_a_planted_drop_of_the_mixed_stride_check_is_caught(fake_sglang, monkeypatch) -> None:
    """The host pool built over strided target and packed draft rows (``or any(buf.is_contiguous() ...)`` dropped
    from sglang's check) accepts an input the contract rejects. A row the JIT kernels take: no later op refuses."""
    case = token_major_case(Attention.MHA, HostLayout.LAYER_FIRST, "kernel", 32, draft_layers=1)
    assert run_on_cpu(case).outcome is Outcome.REJECTED_AS_PREDICTED
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "stride_mixed")
    result = run_on_cpu(case)
    assert result.outcome is Outcome.WRONGLY_ACCEPTED, result.summary
    assert run_on_cpu(token_major_case(Attention.MHA, HostLayout.LAYER_FIRST, "kernel", 32)).outcome is Outcome.PASS


# ---- the knobs' draws ---------------------------------------------------------------------------------------------

def test_both_knobs_are_drawn_over_their_legal_ranges_and_labelled() -> None:
    """Over a dry run's cases for an sm90 GPU: every legal layer_shard triple is drawn, and cases predicted to run
    have every shard size, a rank owning fewer layers than the host holds and one owning as many, and token-major
    rows of every standard class."""
    backend = load_registry().get("sglang-hicache")
    h200 = Platform("cuda", (9, 0))
    space = backend.case_space(CaseSpace(), h200)
    drawn: set[object] = set()
    labels: dict[str, collections.Counter[object]] = collections.defaultdict(collections.Counter)
    token_major_classes = set()
    for index in range(3000):
        case = case_for_index(5, index, space)
        drawn.add(case.tuning_value("layer_shard"))
        if backend.case_unsupported(case) is None and backend.transfer_unsupported(case, h200) is None:
            for name, value in backend.coverage_labels(case).items():
                labels[name][value] += 1
            if device_rows(case) == TOKEN_MAJOR:
                token_major_classes.add(backend.coverage_labels(case)["pool_class"])
    assert drawn == {"", *LAYER_SHARD_VALUES}
    sizes = {str(v).split("/")[0] for v in labels["layer_shard"] if v != "none"}
    assert sizes == {"2", "3", "4"}
    assert set(labels["layer_shard_unwritten_host_layers"]) == {True, False}
    assert set(labels["device_rows"]) == {PACKED, TOKEN_MAJOR}
    assert token_major_classes == {"MHATokenToKVPoolHost", "MLATokenToKVPoolHost", "AsymmetricMHATokenToKVPoolHost"}


def test_the_default_mix_draws_both_new_configurations(tmp_path: Path) -> None:
    """A dry run of the backend under the GPU campaign's default mix: its cases include layer-sharded DSA indexers
    (layer_first ones byte-compared, others rejections), layer-sharded MLA pools (the same, the refusals on page_first
    and page_first_direct) and token-major target rows with packed draft layers (the host pool's refusal), in
    coverage_values as in the saved cases."""
    registry_backend = SglangHicacheBackend()
    cuda = Platform("cuda", (9, 0))
    seen = {}
    for where in ("layer_sharded_class=DSAIndexerPoolHost", "layer_sharded_class=MLATokenToKVPoolHost",
                  "token_major_draft_layers=true"):
        folder, out = tmp_path / where.replace("=", "_"), tmp_path / f"{where.replace('=', '_')}.json"
        assert main(["fuzz", "--platform", "cuda", "--dry-run", "--backend", "sglang-hicache", "--runs", "1000",
                     "--seed", "1", "--no-progress", "--json", str(out), "--save-cases", str(folder),
                     "--where", where]) == 0
        report = json.loads(out.read_text())
        values = report["coverage_values"]["sglang-hicache"]
        assert {"DSAIndexerPoolHost", "MLATokenToKVPoolHost"} <= set(values["layer_sharded_class"])
        assert True in values["token_major_draft_layers"]
        assert report["outcomes"]["sglang-hicache"]["rejected_as_predicted"] > 0
        cases = [Case.from_json(path.read_text()) for path in folder.glob("*.json")]
        seen[where] = {(c.layout, predict(c, registry_backend.plan(c, cuda).entry, cuda).verdict) for c in cases}
    dsa = seen["layer_sharded_class=DSAIndexerPoolHost"]
    assert (HostLayout.LAYER_FIRST, Verdict.ACCEPT) in dsa and any(v is Verdict.REJECT for _, v in dsa)
    mla = seen["layer_sharded_class=MLATokenToKVPoolHost"]
    assert {(HostLayout.LAYER_FIRST, Verdict.ACCEPT), (HostLayout.PAGE_FIRST, Verdict.REJECT),
            (HostLayout.PAGE_FIRST_DIRECT, Verdict.REJECT)} <= mla
    assert any(v is Verdict.REJECT for _, v in seen["token_major_draft_layers=true"])


def test_cases_without_the_knobs_replay_as_before() -> None:
    """A case file written before the knobs (no layer_shard, no device_rows) is the same case: packed rows, no
    shard, its id unchanged by the knobs' defaults."""
    case = hicache_case(Attention.MLA, HostLayout.LAYER_FIRST, ops=SHARD_OPS)
    assert "layer_shard" not in dict(case.tuning) and "device_rows" not in dict(case.tuning)
    assert layer_shard(case) is None and device_rows(case) == PACKED
    assert SglangHicacheBackend().transfer_unsupported(case, SM90) is None
    assert Case.from_dict(case.to_dict()).case_id == case.case_id
    explicit = case.replace(tuning=make_tuning({**dict(case.tuning), "layer_shard": "", "device_rows": PACKED}))
    assert drive.objects_key(explicit, torch.device("cpu")) != drive.objects_key(case, torch.device("cpu"))


def test_the_standalone_script_leaves_sharded_pools_and_refused_drafts_to_the_json_reproducer() -> None:
    """Token-major rows get a script (tests/kernels/test_hicache_standalone.py), but not beside packed draft layers
    the host pool must refuse."""
    from hicache_fuzz.harness.findings.standalone_hicache import unscripted_reason

    assert unscripted_reason(mla_case(HostLayout.LAYER_FIRST, "")) is None
    assert "layer-sharded" in (unscripted_reason(mla_case(HostLayout.LAYER_FIRST, "2/1/1")) or "")
    assert unscripted_reason(token_major_case(Attention.MHA, HostLayout.PAGE_FIRST)) is None
    drafts = token_major_case(Attention.MHA, HostLayout.PAGE_FIRST, draft_layers=1)
    assert "token-major target rows beside packed draft layers" in (unscripted_reason(drafts) or "")
