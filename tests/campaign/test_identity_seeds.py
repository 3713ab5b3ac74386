"""One bug, one name, whichever way a case shows it: zoo-int32-dst-as-int64 reads int32 destination indices
through an int64 pointer. Where the fused values fall outside the pool the reference's own bounds check refuses
the (valid) input; where they happen to land inside, the rows go to the wrong places. Seed 1's campaign met
only the first, seed 2's also the second: keyed on the outcome, that was a new identity on seed 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.findings.corpus import iter_case_files, load_corpus
from hicache_fuzz.harness.findings.identity import identify
from hicache_fuzz.harness.findings.known import known_bugs
from hicache_fuzz.harness.findings.scope import Environment
from hicache_fuzz.harness.model.case import (
    Case,
    Direction,
    HostLayout,
    IndexDtype,
    IndexSpec,
    PoolSpec,
    Scope,
)
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry

REGISTRY = load_registry()
CPU = Platform("cpu")
NAME = "zoo-int32-dst-as-int64"


def write_back(host_indices: tuple[int, ...], host_slots: int) -> Case:
    """A one-layer write-back with int32 host (destination) indices and int64 device (source) indices."""
    return Case(Direction.WRITE_BACK, Scope.ONE_LAYER, HostLayout.LAYER_FIRST, (PoolSpec(),), layers=2,
                page_size=1, device_rows=8, host_slots=host_slots, host_indices=host_indices,
                device_indices=tuple(range(4, 4 + len(host_indices))), host_index=IndexSpec(IndexDtype.INT32),
                device_index=IndexSpec(IndexDtype.INT64), backend=NAME)


def test_the_mutants_refusal_and_its_misplaced_write_are_one_bug() -> None:
    run = InProcessExecutor(REGISTRY, require("cpu")).run
    refused_case = write_back((1, 2), 4)  # reads 1 + 2 * 2**32: outside the host pool
    misplaced_case = write_back((2, 0, 1), 3)  # reads 2, 1, 0: a valid permutation, the rows land elsewhere
    refused, misplaced = run(refused_case), run(misplaced_case)
    assert refused.outcome is Outcome.WRONGLY_REJECTED and "out of range" in refused.error
    assert misplaced.outcome is Outcome.MISMATCH
    one, other = identify(refused, refused_case), identify(misplaced, misplaced_case)
    assert one.bug == other.bug and one.bug_key == f"{NAME}|mismatch|misplaced"
    assert one.variant != other.variant  # how each case showed it stays in the variant


def campaign(name: str, seed: int, cases: int, corpus: Path | None, known: dict) -> list[str]:  # type: ignore[type-arg]
    backend = REGISTRY.get(name)
    config = CampaignConfig([name], seed, max_cases=cases, corpus_dir=corpus,
                            space=backend.case_space(CaseSpace(backend=name), CPU), known_signatures=known)
    report = run_campaign(config, [backend], CPU, InProcessExecutor(REGISTRY, require("cpu")))
    return [f.signature for f in report.new_failures]


@pytest.mark.parametrize("name", ["zoo-cpu-indices-rejected", "zoo-kv-swapped-last-layer", "zoo-last-page-dropped"])
def test_other_mutants_keep_one_name_across_seeds(name: str, tmp_path: Path) -> None:
    assert campaign(name, 1, 300, tmp_path, {})
    for path in iter_case_files([tmp_path]):
        path.write_text(path.read_text().replace('"format":', '"expect": "fail", "format":', 1))
    known = known_bugs(load_corpus([tmp_path]), Environment("cpu"))
    assert campaign(name, 2, 100, None, known) == []
