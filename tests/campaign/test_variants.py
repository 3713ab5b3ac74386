"""Index variants (engine/variants.py) and storage reuse (pipeline/reuse.py): a variant keeps what the
contract looks at, runs on the storages of the case before it, and is still checked byte for byte; a failure
on reused storages is reported as the case fails alone."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.engine.feed import CaseFeed, EngineOptions
from hicache_fuzz.harness.engine.mix import case_class
from hicache_fuzz.harness.engine.variants import VARIANT_NOTE, index_variant, relabel_pages
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.pipeline.reuse import StorageReuse, geometry_key
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.oracles.contract import EntryPoint, predict

CPU = Platform("cpu")
H200 = Platform("cuda", (9, 0))
MI300 = Platform("rocm")


def test_relabel_keeps_offsets_equalities_ranges_and_page_zero() -> None:
    rng = random.Random(1)
    values = (0, 1, 2, 3, 8, 9, 10, 11, 8, 40, 41, 47, 48, 53, -1, 10**9)  # 48.. is the partial last page
    out = relabel_pages(values, rows=50, page_size=4, rng=rng)
    assert len(out) == len(values)
    for a, b in zip(values, out, strict=True):
        if a < 4 or a >= 48:  # page 0, the partial page, negative and out-of-range values stay
            assert a == b
        else:
            assert b % 4 == a % 4 and 4 <= b < 48
    pairs = list(zip(values, out, strict=True))
    assert all((a1 == a2) == (b1 == b2) for a1, b1 in pairs for a2, b2 in pairs)  # same equalities
    assert all((a1 // 4 == a2 // 4) == (b1 // 4 == b2 // 4) for a1, b1 in pairs for a2, b2 in pairs
               if 4 <= a1 < 48 and 4 <= a2 < 48)  # same pages together


def test_variants_are_pure_and_new() -> None:
    case = next(c for i in range(50) if (c := case_for_index(3, i, CaseSpace())).n >= 8)
    first, again = index_variant(case, 1), index_variant(case, 1)
    assert first == again and first.case_id == again.case_id
    second = index_variant(case, 2)
    assert len({case.case_id, first.case_id, second.case_id}) == 3
    assert first.seed != case.seed and first.note.startswith(VARIANT_NOTE) and case.case_id in first.note
    assert geometry_key(first) == geometry_key(case)  # the same storages


def _entries() -> list[EntryPoint]:
    return list(EntryPoint)


@pytest.mark.parametrize("platform", [CPU, H200, MI300], ids=["cpu", "cuda-sm90", "rocm"])
def test_a_variant_gets_the_contract_verdict_of_its_case(platform: Platform) -> None:
    """Over generated cases of the default space, every entry point: the variant's verdict and reasons are
    the case's. (The runner predicts every variant anyway; this is what makes the mix hold for variants.)"""
    space = CaseSpace()
    checked = 0
    for index in range(120):
        case = case_for_index(11, index, space)
        variant = index_variant(case, 1 + index % 5)
        for entry in _entries():
            want, got = predict(case, entry, platform), predict(variant, entry, platform)
            assert (got.verdict, sorted(got.reasons)) == (want.verdict, sorted(want.reasons)), (case.case_id, entry)
            checked += 1
    assert checked == 120 * len(_entries())


def test_the_feed_puts_each_case_before_its_variants() -> None:
    registry = load_registry()
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    spaces = {b.name: CaseSpace() for b in backends}
    feed = CaseFeed(5, 0, (0, 1), backends, spaces, CPU, None, batch=40, variants=3)
    try:
        slots = feed.take(40)
    finally:
        feed.close()
    generated = [s for s in slots if s.variant == 0]
    for slot in generated:
        at = slots.index(slot)
        if slot.case.n and slot.case.device_indices:
            followers = slots[at + 1: at + 4]
            assert [f.variant for f in followers] == [1, 2, 3]
            assert all(f.case == index_variant(slot.case, f.variant) for f in followers)
            assert all(f.backend is slot.backend and f.index == slot.index for f in followers)
    # resume moves on only after the last variant of the index's last backend
    assert [s.last_of_index for s in slots if s.last_of_index] and all(
        s.backend is backends[-1] and (s.variant == 3 or not s.case.n) for s in slots if s.last_of_index)


def test_engine_variants_resolve_per_platform() -> None:
    assert EngineOptions().resolved_variants(CPU) == 0
    assert EngineOptions().resolved_variants(H200) == 7
    assert EngineOptions(variants=4).resolved_variants(CPU) == 4


def test_a_backend_with_a_per_geometry_setup_gets_more_variants_by_default() -> None:
    """A backend that pays a set-up per geometry may ask for more variants than the default
    (`geometry_setup_variants`): by default it gets them, the others the platform's default; --variants N gives
    every backend N; the CPU platform runs none. No shipped backend asks today (sglang-pool did until session
    6's measurement), so a stand-in subclass of the reference backend asks here."""
    registry = load_registry()
    reference = registry.get("reference")

    class PerGeometrySetup(type(reference)):  # type: ignore[misc]
        name = "per-geometry-setup"
        geometry_setup_variants = 15

    costly = PerGeometrySetup()
    assert costly.geometry_setup_variants > EngineOptions().resolved_variants(H200)
    assert EngineOptions().resolved_variants_by_backend(H200, [reference, costly]) == {
        "reference": 7, "per-geometry-setup": 15}
    assert EngineOptions(variants=2).resolved_variants_by_backend(H200, [reference, costly]) == {
        "reference": 2, "per-geometry-setup": 2}
    assert EngineOptions().resolved_variants_by_backend(CPU, [reference, costly]) == {
        "reference": 0, "per-geometry-setup": 0}


def test_no_shipped_backend_raises_its_variants() -> None:
    """A raised count for sglang-pool (15) measured as a slowdown (docs/engine.md); the shipped backends run the
    default."""
    assert all(backend.geometry_setup_variants == 0 for backend in load_registry().backends.values())


def test_the_feed_gives_each_backend_its_own_variant_count() -> None:
    registry = load_registry()
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    spaces = {b.name: CaseSpace() for b in backends}
    counts = {"reference": 1, "zoo-last-page-dropped": 4}
    feed = CaseFeed(5, 0, (0, 1), backends, spaces, CPU, None, batch=60, variants=counts)
    try:
        slots = feed.take(60)
    finally:
        feed.close()
    assert feed.variants == 4
    for slot in slots:
        if slot.variant == 0 and slot.case.host_indices and slot.case.device_indices:
            at = slots.index(slot)
            wanted = counts[slot.backend.name]
            followers = [f for f in slots[at + 1: at + 1 + wanted]]
            if len(followers) == wanted:  # not cut by the end of the batch
                assert [f.variant for f in followers] == list(range(1, wanted + 1)), slot.backend.name
    assert {s.variant for s in slots if s.backend.name == "reference"} == {0, 1}
    assert max(s.variant for s in slots if s.backend.name == "zoo-last-page-dropped") == 4


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_reused_storages_give_the_results_of_fresh_ones(tmp_path: Path) -> None:
    """A campaign with variants through the worker (storages reused) reports, case by case, what each case
    gives alone on fresh storages; and the worker did reuse storages (it materialized fewer than it ran)."""
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    config = CampaignConfig([b.name for b in backends], seed=21, max_cases=96,
                            engine=EngineOptions(mix="none", scale="off", variants=5))
    results: list[tuple[Case, Outcome, str]] = []
    with WorkerExecutor([b.name for b in backends], journal_dir=tmp_path) as ex:
        report = run_campaign(config, backends, machine.platform, ex,
                              on_result=lambda c, r, _: results.append((c, r.outcome, r.summary)))
        reused = ex.storages_reused
    assert report.cases == 96 and reused > 30  # most variants ran on the storages of the case before them
    assert report.to_dict()["engine"]["storages_reused"] == reused
    assert any(c.note.startswith(VARIANT_NOTE) for c, _, _ in results)
    assert any(outcome is Outcome.MISMATCH for _, outcome, _ in results)  # the zoo bug is still found
    fresh = InProcessExecutor(registry, machine)
    for case, outcome, summary in results:
        alone = fresh.run(case)
        assert alone.outcome is outcome, (case.case_id, summary, alone.summary)
        assert "reused" not in summary  # every failure held on fresh storages: no history-only note


def test_storage_reuse_takes_kept_storages_only_for_the_same_geometry() -> None:
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("reference")
    reuse = StorageReuse()
    case = next(c for i in range(50) if (c := case_for_index(8, i, CaseSpace())).n >= 4)
    other = next(c for i in range(50, 100) if geometry_key(c := case_for_index(8, i, CaseSpace()))
                 != geometry_key(case))
    # The same case again (another backend's turn at index i has the same seed): its sources would repeat
    # bytes a destination may hold, hiding a skipped write, so it gets fresh storages.
    for c in (case, index_variant(case, 1), index_variant(case, 2), case, other):
        assert run_case(c, backend, CPU, machine.device, reuse=reuse).outcome in (
            Outcome.PASS, Outcome.REJECTED_AS_PREDICTED)
    assert (reuse.fresh, reuse.reused) == (3, 2)
    reuse.drop()


def test_a_failure_on_reused_storages_is_the_result_of_the_case_alone() -> None:
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("zoo-last-page-dropped")
    space = backend.case_space(CaseSpace(), CPU)
    reuse = StorageReuse()
    for index in range(200):
        case = case_for_index(2, index, space).replace(backend=backend.name)
        if case_class(case, backend, CPU) != "transfer":
            continue
        variant = index_variant(case, 1)
        run_case(case, backend, CPU, machine.device, reuse=reuse)
        on_reused = run_case(variant, backend, CPU, machine.device, reuse=reuse)
        alone = run_case(variant, backend, CPU, machine.device)
        if alone.outcome is Outcome.MISMATCH:
            assert reuse.reused >= 1
            assert on_reused.outcome is Outcome.MISMATCH and on_reused.diff == alone.diff
            return
    pytest.fail("no transfer of the zoo mutant failed in 200 indices")


def test_scale_tier_shards_draw_different_scale_cases() -> None:
    from hicache_fuzz.harness.engine.feed import FeedClock, ScaleTier
    from hicache_fuzz.harness.engine.mix import TransferProfile
    from hicache_fuzz.harness.engine.scale import SIMULATED

    registry = load_registry()
    backend = registry.get("reference")
    spaces = {backend.name: backend.case_space(CaseSpace(), CPU)}
    profiles = {backend.name: TransferProfile.calibrate(backend, spaces[backend.name], CPU)}
    drawn = []
    for shard in ((0, 2), (1, 2)):
        tier = ScaleTier(3, [backend], spaces, CPU, SIMULATED, 0.5, profiles, shard=shard)
        picked = [tier.next_case(FeedClock()) for _ in range(2)]
        drawn.append([p[2] for p in picked if p is not None])
    assert drawn == [[0, 2], [1, 3]]


def test_the_first_cycle_of_scale_shapes_runs_whatever_the_share() -> None:
    from hicache_fuzz.harness.engine.feed import FIRST_CYCLE_SPACING, ScaleTier
    from hicache_fuzz.harness.engine.scale import SHAPES, SIMULATED

    tier = ScaleTier(1, [], {}, CPU, SIMULATED, 0.15, {})
    tier.seconds = 1000.0  # far over its share
    due = []
    for drawn in range(len(SHAPES) + 1):
        tier.number = drawn
        due.append((tier.due(FIRST_CYCLE_SPACING * (drawn + 1) - 0.1), tier.due(FIRST_CYCLE_SPACING * (drawn + 1))))
    assert due == [(False, True)] * len(SHAPES) + [(False, False)]


def test_the_report_line_names_backends_with_their_own_variant_count() -> None:
    from hicache_fuzz.harness.engine.engine_stats import _variants_text

    assert _variants_text({"variants_per_case": 3, "variants_by_backend": {"a": 3, "b": 3}}) == "3"
    assert _variants_text({"variants_per_case": 15, "variants_by_backend": {
        "sglang-jit": 3, "sglang-pool": 15, "sglang-tma": 3}}) == "3 (sglang-pool 15)"
    assert _variants_text({"variants_per_case": 4}) == "4"  # a report from before the per-backend counts
