"""sglang-page-unified builds its host tensor through sglang's own page_unified host pool
(kernels/sglang_page_unified.py).

On the CPU, with the fake sglang (tests/fake_sglang, whose ``PageUnifiedLayout`` and MHA/MLA host pools build the
page_unified buffer as sglang's do): the kernels take the host pool's ``kv_buffer``; the layout's refusals are judged
by the contract; its L3 chunk spans are checked against the oracle's strides; and each of the four planted layout
bugs (``FAKE_SGLANG_POOL_BUG=pu_*``, the mutants 113449e8ba6a, e1e87be4f457, 74227ec3f91d, db1ed2eedb5c of
reports/mutate/sample-60-seed1-reach.md) fails a case that passes without it, in the campaign and in the standalone
script.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hicache_fuzz.harness.findings.standalone import standalone_script
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
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels import sglang_aot, sglang_pool
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels import sglang_page_unified as pu
from hicache_fuzz.kernels.sglang_page_unified import SglangPageUnifiedBackend, span_probes
from hicache_fuzz.oracles.layouts import page_unified_chunk
from tests.campaign.test_standalone import run_isolated
from tests.kernels._hicache_helpers import fake_sglang  # noqa: F401  (a fixture)
from tests.kernels.test_sglang_calls import OnTheCpu

CUDA = Platform("cuda", (9, 0))
CPU_INT64 = IndexSpec(IndexDtype.INT64, IndexDevice.CPU)


def mha(heads: int = 4, head_dim: int = 8, groups: int = 2) -> PoolSpec:
    return PoolSpec("kv", Attention.MHA, KVDtype.BF16, heads, head_dim, head_groups=groups)


MLA = PoolSpec("kv", Attention.MLA, KVDtype.BF16, 1, 24)


def pu_case(direction: Direction, pool: PoolSpec, *, layers: int = 3, page_size: int = 4) -> Case:
    """Host pages 3 and 1 (of 5) to device pages 1 and 2 (of 4: page 0 is sglang's padding), the last layer for a
    load-back, every layer for a write-back."""
    ps = page_size
    host = tuple(page * ps + t for page in (3, 1) for t in range(ps))
    device = tuple(page * ps + t for page in (1, 2) for t in range(ps))
    write = direction is Direction.WRITE_BACK
    return Case(direction=direction, scope=Scope.ALL_LAYERS if write else Scope.ONE_LAYER,
                layout=HostLayout.PAGE_UNIFIED, pools=(pool,), layers=layers, page_size=ps, device_rows=4 * ps,
                host_slots=5 * ps, host_indices=host, device_indices=device, layer=layers - 1,
                host_index=CPU_INT64 if write else IndexSpec(), backend="sglang-page-unified", seed=3)


@pytest.fixture
def fake_modules(fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # noqa: F811
    """The fake sglang as the module the backend calls, its pool modules loaded as the pool backends load them (and
    dropped after); the fake kernel module, whose calls a test may spy on."""
    fake = importlib.import_module(common.HICACHE_MODULE)
    monkeypatch.setattr(common, "hicache", lambda: fake)
    monkeypatch.setattr(sglang_aot, "aot_status", lambda: (True, "the fake sgl_kernel"))
    monkeypatch.setattr(sglang_pool, "_MODS", None)
    yield fake


def run(case: Case, backend: SglangPageUnifiedBackend | None = None) -> Result:
    return run_case(case, OnTheCpu(backend or SglangPageUnifiedBackend()), CUDA, torch.device("cpu"))


CASES = {
    "mha-load": pu_case(Direction.LOAD_BACK, mha()),
    "mha-write": pu_case(Direction.WRITE_BACK, mha()),
    "mla-load": pu_case(Direction.LOAD_BACK, MLA),
    "mla-write": pu_case(Direction.WRITE_BACK, MLA),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kernels_take_the_host_buffer_of_sglangs_own_host_pool(name: str, fake_modules: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    function = pu.SglangPageUnifiedBackend().sglang_calls(case, CUDA)[0].function
    handed: list[torch.Tensor] = []
    kernel = getattr(fake_modules, function)

    def spy(*args: Any) -> None:
        handed.append(args[-1] if case.direction is Direction.WRITE_BACK else args[-4])
        kernel(*args)

    monkeypatch.setattr(fake_modules, function, spy)
    backend = SglangPageUnifiedBackend()
    result = run(case, backend)
    assert result.outcome is Outcome.PASS, result.summary
    assert backend._kept is not None
    host_pool = backend._kept[1]["kv"]
    (host,) = handed
    assert host is host_pool.kv_buffer  # not a tensor of the harness's own
    assert tuple(host.shape) == host_pool.page_unified_layout.page_dims(case.host_pages)
    # an index variant of the same geometry runs on the same host pool; another geometry gets a new one
    variant = case.replace(host_indices=tuple(reversed(case.host_indices)), seed=4)
    assert run(variant, backend).outcome is Outcome.PASS
    assert backend._kept[1]["kv"] is host_pool
    assert run(case.replace(host_slots=6 * case.page_size), backend).outcome is Outcome.PASS
    assert backend._kept[1]["kv"] is not host_pool and host_pool.kv_buffer is None  # the old one destroyed


def test_an_unaligned_group_row_is_refused_by_sglangs_layout_as_the_contract_says(fake_modules: Any) -> None:
    case = pu_case(Direction.LOAD_BACK, mha(heads=4, head_dim=4, groups=4))  # 8-byte group rows
    result = run(case)
    assert result.outcome is Outcome.REJECTED_AS_PREDICTED, result.summary
    assert "8 bytes" in result.error and "page_unified.py" in result.raised_at
    assert result.diff == {"bytes_changed_before_rejection": False}


PLANTED = {
    # the group row check as a bit test: a 48-byte group row (three bf16 heads of 8) is refused
    "pu_group_and": (pu_case(Direction.WRITE_BACK, mha(heads=6, head_dim=8, groups=2)), "48 bytes"),
    "pu_span_empty": (CASES["mha-load"], "chunk_span((0, 0), 0) returned"),
    "pu_span_start": (CASES["mla-write"], "chunk_span((0, 3), 0) refused"),
    "pu_span_offset": (CASES["mha-write"], "chunk_span((2, 3), 1) returned"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_planted_layout_bug_fails_a_case_that_passes_without_it(bug: str, fake_modules: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    case, said = PLANTED[bug]
    assert run(case).outcome is Outcome.PASS
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", bug)
    result = run(case)
    assert result.outcome is Outcome.WRONGLY_REJECTED, result.summary
    assert said in result.error, result.error


def test_the_group_row_bug_also_accepts_a_row_the_kernels_cannot_move(fake_modules: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", "pu_group_and")
    # 8-byte group rows pass a bit-4 test; the fake's kernels move them, which the contract forbids
    result = run(pu_case(Direction.LOAD_BACK, mha(heads=4, head_dim=4, groups=4)))
    assert result.outcome is Outcome.WRONGLY_ACCEPTED, result.summary


@pytest.mark.parametrize("bug", ["pu_span_offset", "pu_span_empty"])
def test_the_standalone_script_builds_the_same_host_pool_and_catches_a_span_bug(
        bug: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "page_unified.py"
    script.write_text(standalone_script(CASES["mha-write"].to_dict()))
    assert "MHATokenToKVPoolHost(" in script.read_text() and 'host_pools["kv"].kv_buffer' in script.read_text()
    ((code, output),) = run_isolated([script], tmp_path, buggy=False).values()
    assert code == 0 and "PASS: every byte" in output, output
    monkeypatch.setenv("FAKE_SGLANG_POOL_BUG", bug)
    ((code, output),) = run_isolated([script], tmp_path, buggy=False).values()
    assert code == 1 and "chunk_span" in output, output


def sglang_chunk_span(case: Case, pool: PoolSpec, layers: tuple[int, int], group: int) -> tuple[int, int] | None:
    """sglang's rule, written out here: a page block is (group, layer, component, slot, group's row)."""
    start, end = layers
    if not (0 <= start < end <= case.layers and 0 <= group < pool.head_groups):
        return None
    group_row = pool.row_bytes(pool.components[0]) // pool.head_groups
    layer_bytes = len(pool.components) * case.page_size * group_row
    return group * case.layers * layer_bytes + start * layer_bytes, (end - start) * layer_bytes


@pytest.mark.parametrize("pool", [mha(), mha(heads=8, head_dim=16, groups=4), mha(groups=1), MLA])
@pytest.mark.parametrize("layers", [1, 2, 5])
def test_the_oracles_chunk_spans(pool: PoolSpec, layers: int) -> None:
    case = pu_case(Direction.LOAD_BACK, pool, layers=layers, page_size=3)
    probes = span_probes(case, pool)
    asked = {(probe.layers, probe.group) for probe in probes}
    assert ((0, layers), 0) in asked and ((0, 0), 0) in asked and ((0, layers), pool.head_groups) in asked
    assert layers == 1 or any(start > 0 and probe.want for probe in probes for start in probe.layers[:1])
    for probe in probes:
        assert probe.want == sglang_chunk_span(case, pool, probe.layers, probe.group), probe
    for start in range(layers + 1):
        for end in range(layers + 2):
            for group in range(pool.head_groups + 1):
                assert page_unified_chunk(case, pool, (start, end), group) == sglang_chunk_span(
                    case, pool, (start, end), group)


def test_an_mla_pool_of_fewer_pages_than_layers_is_unsupported_as_sglang_cannot_build_it(
        fake_modules: Any) -> None:
    case = pu_case(Direction.LOAD_BACK, MLA, layers=6)  # 5 host pages
    reason = SglangPageUnifiedBackend().unsupported_reason(case, CUDA)
    assert reason is not None and "IndexError" in reason
    assert SglangPageUnifiedBackend().unsupported_reason(pu_case(Direction.LOAD_BACK, MLA, layers=5), CUDA) is None
    assert SglangPageUnifiedBackend().unsupported_reason(pu_case(Direction.LOAD_BACK, mha(), layers=6), CUDA) is None
    with pytest.raises(IndexError):  # as sglang's MLATokenToKVPoolHost (mla.py, _initialize_transfer_views)
        pu.build_host_pool(case, MLA, torch.device("cpu"))


def test_an_sglang_without_page_unified_host_pools_makes_every_case_unsupported(
        fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    case = CASES["mha-load"]
    assert pu.host_pool_absent() is None and SglangPageUnifiedBackend().unsupported_reason(case, CUDA) is None
    monkeypatch.setattr(pu, "PAGE_UNIFIED_FILE", ("srt", "mem_cache", "pool_host", "absent.py"))
    pu._absent_on.cache_clear()
    try:
        reason = SglangPageUnifiedBackend().unsupported_reason(case, CUDA)
        assert reason is not None and "no page_unified host layout" in reason and "absent.py" in reason
    finally:
        pu._absent_on.cache_clear()


def test_no_sglang_here_is_no_reason_to_refuse_a_case(monkeypatch: pytest.MonkeyPatch) -> None:
    # a prediction for another machine (fuzz --dry-run on one without sglang) assumes sglang 0.5.23's pools
    monkeypatch.setattr(pu.importlib.util, "find_spec", lambda name: None)
    pu._absent_on.cache_clear()
    try:
        assert pu.host_pool_absent() is None
    finally:
        pu._absent_on.cache_clear()


def test_a_host_pool_module_without_the_layout_is_named(fake_modules: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pu.host_pool_hooks_missing() == []
    page_unified = importlib.import_module(pu.PAGE_UNIFIED_MODULE)
    monkeypatch.delattr(page_unified.PageUnifiedLayout, "chunk_span")
    assert pu.host_pool_hooks_missing() == [f"{pu.PAGE_UNIFIED_MODULE}.PageUnifiedLayout.chunk_span"]
    monkeypatch.delattr(page_unified, "PageUnifiedLayout")
    assert pu.host_pool_hooks_missing() == [f"{pu.PAGE_UNIFIED_MODULE}.PageUnifiedLayout"]
    with pytest.raises(common.SglangUnavailable, match="PageUnifiedLayout"):
        pu.build_host_pool(CASES["mha-load"], CASES["mha-load"].pools[0], torch.device("cpu"))
