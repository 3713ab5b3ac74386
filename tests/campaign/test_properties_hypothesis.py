"""Properties over Hypothesis-drawn cases: the reference is clean; a broken mutant is found and shrunk small.

Profiles (tests/conftest.py): `ci` is derandomized, `nightly` runs 10**4 examples (HYPOTHESIS_PROFILE=nightly).
"""

from __future__ import annotations

from hypothesis import example, given, settings

from hicache_fuzz.harness.campaign.strategies import cases, find_and_minimize, page_patterns, pool_specs
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.reference import ReferenceBackend
from tests._mutants import DropLastPage, cpu_run

SMALL = CaseSpace(byte_budget=1 << 16, max_pages=70)
run_reference = cpu_run(ReferenceBackend())

# Pinned regressions (Hypothesis' database is a cache, @example is the record): a zero-length transfer and a
# page_first_direct load-back whose host indices start mid-page (the page-aligned host semantics).
ZERO_LENGTH = Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
                   pools=(PoolSpec(),), layers=1, page_size=1, device_rows=2, host_slots=1, host_indices=(),
                   device_indices=())
MID_PAGE_DIRECT = Case(direction=Direction.LOAD_BACK, scope=Scope.ONE_LAYER, layout=HostLayout.PAGE_FIRST_DIRECT,
                       pools=(PoolSpec(heads=2, head_dim=32),), layers=2, page_size=4, device_rows=12, host_slots=8,
                       host_indices=(5, 6, 7, 4), device_indices=(4, 5, 6, 7), layer=1)


@given(cases(SMALL))
@example(ZERO_LENGTH)
@example(MID_PAGE_DIRECT)
def test_reference_is_clean(case: Case) -> None:
    result = run_reference(case)
    assert result.outcome in (Outcome.PASS, Outcome.REJECTED_AS_PREDICTED), result.summary or result.error


@given(pool_specs(), page_patterns(available=8, count=3))
@settings(max_examples=10)
def test_small_strategies_compose(pool: PoolSpec, pages: list[int]) -> None:
    assert pool.row_bytes(pool.components[0]) in (128, 256, 576, 656)
    assert len(set(pages)) == 3 and all(0 <= p < 8 for p in pages)


def test_broken_mutant_is_found_and_shrunk_small() -> None:
    # A narrow space keeps the search (and Hypothesis' own shrinking) to a few dozen runs.
    space = CaseSpace(byte_budget=1 << 13, max_pages=16, page_counts=(1, 2, 3, 4, 5), backend="test-drop-last-page")
    done = find_and_minimize(cpu_run(DropLastPage()), space, max_examples=200, max_runs=200, max_seconds=30)
    assert done is not None, "Hypothesis did not find the dropped last page"
    assert done.result.outcome.is_failure
    # Hypothesis shrinks toward one plain pool; the domain passes then take pages, rows and pools down.
    assert done.size.indices <= 4 and done.case.layers == 1 and len(done.case.pools) == 1
    assert done.size.bytes <= 64
