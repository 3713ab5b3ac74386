"""Coverage.add defers the expansion of a case into counts (reporting/coverage.py): every read must see exactly
what the eager, one-case-at-a-time expansion gives, in the same key order, whenever it happens."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from itertools import combinations
from typing import Any

import pytest

from hicache_fuzz.harness.engine.variants import index_variant, index_variants
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import (
    Attention,
    Case,
    Direction,
    HostLayout,
    IndexDevice,
    IndexDtype,
    IndexSpec,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.reporting import coverage as coverage_module
from hicache_fuzz.harness.reporting.coverage import (
    EDGES,
    NOT_EXECUTED,
    PAIR_DIMENSIONS,
    TRIPLE,
    VARIANT_FIELDS,
    Coverage,
    case_edges,
    case_features,
    case_values,
    pair_name,
)

BACKENDS = ("gpu-a", "gpu-b")
OUTCOMES = (Outcome.PASS, Outcome.PASS, Outcome.REJECTED_AS_PREDICTED, Outcome.MISMATCH, Outcome.UNSUPPORTED,
            Outcome.PASS, Outcome.UNDEFINED, Outcome.CRASH)


# ---- the eager reference: what coverage.py did before the expansion was deferred ---------------------------
def eager_edges(case: Case, values: dict[str, int]) -> list[str]:
    ps, indices = case.page_size, set(case.host_indices).union(case.device_indices)
    biggest = values["max_index"]

    def near(offset: int) -> bool:
        return any((1 << k) + offset in indices for k in range(2, max(biggest, 1).bit_length() + 1))

    host_bytes = max(p.row_bytes(c) for p in case.pools for c in p.components) * case.layers * case.host_slots
    device_component = max(p.row_bytes(c) for p in case.pools for c in p.components) * case.layers * case.device_rows
    checks = {
        "page_size=1": ps == 1, "page_size=npot": not (ps > 0 and ps & (ps - 1) == 0), "page_size>=128": ps >= 128,
        "heads>8": values["heads"] > 8, "heads>=64": values["heads"] >= 64, "head_dim>=512": values["head_dim"] >= 512,
        "layers>=61": case.layers >= 61, "layers=61": case.layers == 61, "layers=126": case.layers == 126,
        "layers=128": case.layers == 128, "tokens=0": case.n == 0, "tokens>=65536": case.n >= 65536,
        "pages>=129": values["pages"] >= 129, "pool_rows>65536": max(case.host_slots, case.device_rows) > 65536,
        "index=2^k-1": near(-1), "index=2^k": near(0), "index=2^k+1": near(1),
        "index>=2^16": biggest >= 1 << 16, "partial_page": case.n % ps != 0,
        "row_bytes>32768": values["row_bytes"] > 32768, "host_bytes>=2^20": host_bytes >= 1 << 20,
        "device_component_bytes>=2^24": device_component >= 1 << 24, "pools=3": len(case.pools) >= 3,
    }
    return [name for name in EDGES if checks[name]]


def eager_increments(features: dict[str, list[str]]) -> list[tuple[str, str]]:
    increments = [(dimension, bucket) for dimension, buckets in features.items() for bucket in buckets]
    for a, b in combinations(PAIR_DIMENSIONS, 2):
        increments.extend((pair_name(a, b), f"{x}|{y}") for x in features[a] for y in features[b])
    increments.extend((pair_name(TRIPLE, "page_bytes"), f"{features[TRIPLE][0]}|{y}") for y in features["page_bytes"])
    return increments


class EagerCoverage:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.ranges: dict[str, dict[str, list[int]]] = defaultdict(dict)

    def add(self, case: Case, result: Result) -> None:
        if result.outcome in NOT_EXECUTED:
            return
        values = case_values(case)
        features = case_features(case, values)
        counts = self.counts[result.backend]
        for dimension, bucket in eager_increments(features):
            counts[dimension][bucket] += 1
        counts["edge"].update(eager_edges(case, values))
        ranges = self.ranges[result.backend]
        for dimension, value in values.items():
            span = ranges.get(dimension)
            if span is None:
                ranges[dimension] = [value, value]
            else:
                span[0], span[1] = min(span[0], value), max(span[1], value)

    def view(self, exemptions: dict[str, dict[str, str]]) -> Coverage:
        """A Coverage over these counts and ranges, for its (unchanged) read methods."""
        out = Coverage()
        out._counts, out.ranges, out.exemptions = self.counts, self.ranges, exemptions
        return out


def observed(coverage: Coverage) -> dict[str, Any]:
    """Everything a reader can see; the JSON dumps keep the key order of the live counts and ranges."""
    backends = sorted({*BACKENDS, *coverage.counts})
    return {
        "counts": json.dumps(coverage.counts), "ranges": json.dumps(coverage.ranges),
        "to_dict": coverage.to_dict(), "ranges_dict": coverage.ranges_dict(), "summary": coverage.summary_dict(),
        "gaps": {b: coverage.gaps(b) for b in backends}, "pairs": {b: coverage.pairs(b) for b in backends},
    }


# ---- cases ---------------------------------------------------------------------------------------------------
def special_cases() -> list[Case]:
    """Corners the generator rarely draws: empty sides, negative indices, indices at 2^k - 1, 2^k, 2^k + 1."""
    def case(host: tuple[int, ...], device: tuple[int, ...], page_size: int = 4) -> Case:
        return Case(direction=Direction.LOAD_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
                    pools=(PoolSpec(attention=Attention.MLA, heads=1, head_dim=16),), layers=2, page_size=page_size,
                    device_rows=3 << 16, host_slots=3 << 16, host_indices=host, device_indices=device,
                    host_index=IndexSpec(IndexDtype.INT32, IndexDevice.CPU))
    return [case((), ()), case((), (-5,)), case((-7, -3), (-2, -9)), case((-7,), ()), case((3, 5), (17, 20)),
            case((8,), (6, 10)), case((1 << 16,), (1,)), case((0, 1, 2), (127, 128, 129)),
            case((2,), ((1 << 16) + 1,)), case((1, 2, 3), (4, 5, 6), page_size=3)]


def campaign_cases(count: int = 60, variants: int = 4) -> list[Case]:
    out: list[Case] = []
    for index in range(count):
        case = case_for_index(5, index, CaseSpace())
        out.append(case)
        if case.host_indices and case.device_indices:
            out.extend(index_variants(case, variants))
    return out + special_cases()


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return campaign_cases()


def results_for(cases: list[Case]) -> list[Result]:
    return [Result(case.case_id, BACKENDS[(i // 7) % 2], OUTCOMES[i % len(OUTCOMES)]) for i, case in enumerate(cases)]


# ---- tests ---------------------------------------------------------------------------------------------------
def test_edges_match_the_eager_set_of_indices(cases: list[Case]) -> None:
    for case in cases:
        values = case_values(case)
        assert case_edges(case, values) == eager_edges(case, values), case.case_id


def test_reads_at_any_point_see_what_the_eager_expansion_gives(cases: list[Case]) -> None:
    results = results_for(cases)
    assert len(cases) > 250 and {r.outcome for r in results} >= {Outcome.PASS, Outcome.UNSUPPORTED}
    exemptions = {"gpu-b": {"attention=mha": "MLA-only"}}
    coverage, reference = Coverage(), EagerCoverage()
    coverage.exempt("gpu-b", exemptions["gpu-b"])
    reads = {0, 1, 2, 9, 10, 57, 58, 140, 141, 142, 260}
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        coverage.add(case, result)
        reference.add(case, result)
        if i in reads:
            assert observed(coverage) == observed(reference.view(exemptions)), f"after case {i}"
    assert observed(coverage) == observed(reference.view(exemptions))
    assert coverage.counts["gpu-a"]["edge"] and coverage.ranges["gpu-a"]["max_index"]


def test_one_read_at_the_end_and_automatic_flushes_match(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    results = results_for(cases)
    reference = EagerCoverage()
    for case, result in zip(cases, results, strict=True):
        reference.add(case, result)
    expected = observed(reference.view({}))
    at_end = Coverage()
    for case, result in zip(cases, results, strict=True):
        at_end.add(case, result)
    assert observed(at_end) == expected
    monkeypatch.setattr(coverage_module, "PENDING_LIMIT", 3)  # add() expands every few feature sets itself
    monkeypatch.setattr(coverage_module, "FEATURE_KEY_CACHE_LIMIT", 2)
    bounded = Coverage()
    for case, result in zip(cases, results, strict=True):
        bounded.add(case, result)
        assert all(len(tallies) < 3 for tallies in bounded._pending_features.values())
    assert observed(bounded) == expected


def test_merged_and_loaded_coverage_sums_and_keeps_adding(cases: list[Case]) -> None:
    results = results_for(cases)
    half = len(cases) // 2
    whole, first, second = Coverage(), Coverage(), Coverage()
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        whole.add(case, result)
        (first if i < half else second).add(case, result)
    # the parts are serialized with adds still pending: to_dict and ranges_dict must include them
    merged = Coverage.from_dicts([first.to_dict(), second.to_dict()], None, [first.ranges_dict(), second.ranges_dict()])
    assert merged.to_dict() == whole.to_dict()
    assert merged.summary_dict() == whole.summary_dict()
    assert {b: merged.gaps(b) for b in BACKENDS} == {b: whole.gaps(b) for b in BACKENDS}
    extra = [index_variant(case, 9) for case in cases[:40] if case.host_indices and case.device_indices]
    for case, result in zip(extra, results_for(extra), strict=True):
        merged.add(case, result)
        whole.add(case, result)
    assert merged.to_dict() == whole.to_dict()
    assert merged.ranges_dict() == whole.ranges_dict()
    assert merged.summary_dict() == whole.summary_dict()


def test_variants_are_tallied_not_expanded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    expanded: list[object] = []
    featured: list[Case] = []
    increments, features = Coverage._increments, coverage_module.case_features

    def counting_increments(self: Coverage, key: Any) -> list[tuple[str, str]]:
        expanded.append(key)
        return increments(self, key)

    def counting_features(case: Case, values: dict[str, int] | None = None) -> dict[str, list[str]]:
        featured.append(case)
        return features(case, values)

    monkeypatch.setattr(Coverage, "_increments", counting_increments)
    monkeypatch.setattr(coverage_module, "case_features", counting_features)
    base = next(c for i in range(50) if (c := case_for_index(3, i, CaseSpace())).host_indices and c.device_indices)
    group = [base, *index_variants(base, 7)]
    coverage = Coverage()
    for case in group:
        coverage.add(case, Result(case.case_id, "b", Outcome.PASS))
    assert len(featured) == 1  # the variants' features come from their geometry's, not recomputed
    assert expanded == [] and sum(coverage._pending_features["b"].values()) == len(group)
    assert len(coverage._pending_features["b"]) == 1
    assert sum(coverage.counts["b"]["direction"].values()) == len(group)
    assert len(expanded) == 1 and not coverage._pending_features  # one expansion for the eight cases
    coverage.gaps("b")
    coverage.to_dict()
    assert len(expanded) == 1  # nothing pending: reads expand nothing


def test_variants_change_only_fields_the_features_ignore(cases: list[Case]) -> None:
    """The feature cache's premise: features depend on the fields outside VARIANT_FIELDS and the list length."""
    names = {f.name for f in dataclasses.fields(Case)}
    assert names >= VARIANT_FIELDS
    for case in cases[:120]:
        if not (case.host_indices and case.device_indices):
            continue
        variant = index_variant(case, 3)
        changed = {name for name in names if getattr(case, name) != getattr(variant, name)}
        assert changed <= VARIANT_FIELDS
        moved = case.replace(host_indices=tuple(reversed(case.host_indices)), device_indices=(-1,) * len(
            case.device_indices), seed=case.seed + 1, note="elsewhere")
        assert case_features(moved) == case_features(case) == case_features(variant)
