"""One bug, one identity, whatever the seed: for every zoo mutant, what one seed's campaign saved, marked as
known, accounts for every failure another seed's campaign meets (so `fuzz --known` exits 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.corpus import iter_case_files, load_corpus
from hicache_fuzz.harness.findings.known import known_bugs
from hicache_fuzz.harness.findings.scope import Environment
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry

REGISTRY = load_registry()
ZOO = sorted(backend.name for backend in REGISTRY.zoo())
CPU = Platform("cpu")
FIRST_CASES, SECOND_CASES = 2000, 250  # the first campaign 8x longer: its rare manifestations saturate
# The default tier runs the property on two mutants whose failures are cheap to classify (a wrong rejection, a
# silent fallback: ~25 s each on 2 busy cores); every other mutant (mismatches cost a full diff each, up to
# ~150 s) runs in the slow tier (-m slow), so every mutant is still checked in CI (.ci/run).
QUICK_ZOO = ("zoo-empty-rejected", "zoo-silent-fallback")
# The CLI path needs one mutant with one identity: 300 cases of it meet that identity (measured: 133 failures).
CLI_FIRST_CASES = 300


def campaign(name: str, seed: int, cases: int, corpus: Path | None, known: dict[str, str]) -> list[str]:
    backend = REGISTRY.get(name)
    config = CampaignConfig([name], seed, max_cases=cases, corpus_dir=corpus,
                            space=backend.case_space(CaseSpace(backend=name), CPU), known_signatures=known)
    report = run_campaign(config, [backend], CPU, InProcessExecutor(REGISTRY, require("cpu")))
    return [f.signature for f in report.new_failures]


def mark_known(corpus: Path) -> None:
    for path in iter_case_files([corpus]):
        data = json.loads(path.read_text())
        data["expect"] = "fail"
        path.write_text(json.dumps(data))


# zoo-first-index-of-page rejects valid inputs through two of its own checks (duplicate destinations, host index
# out of range), depending on where its remapped runs land; the second is rare (about 1 case in 400). Both are one
# identity ("valid input rejected" on its path, docs/identity.md), so seed 2 meeting only the rare one is known.
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in QUICK_ZOO else pytest.mark.slow)
                                  for name in ZOO])
def test_one_seeds_reproducers_make_another_seeds_failures_known(name: str, tmp_path: Path) -> None:
    corpus = tmp_path / "seed-1"
    first = campaign(name, 1, FIRST_CASES, corpus, {})
    assert first, f"{name} is a zoo mutant: its campaign must fail"
    mark_known(corpus)
    known = known_bugs(load_corpus([corpus]), Environment("cpu"))
    assert set(first) <= set(known)
    new = campaign(name, 2, SECOND_CASES, None, known)
    assert new == [], f"seed 2 raised identities seed 1 never met: {new}"


def test_quick_zoo_names_zoo_mutants() -> None:
    assert set(QUICK_ZOO) <= set(ZOO)


def test_fuzz_known_from_another_seed_exits_0(tmp_path: Path) -> None:
    name = "zoo-kv-swapped-last-layer"
    common = ["fuzz", "--platform", "cpu", "--backend", name, "--no-progress"]
    first = tmp_path / "first"
    assert main([*common, "--seed", "1", "--runs", str(CLI_FIRST_CASES), "--corpus", str(first)]) == 1
    mark_known(first)
    second = tmp_path / "second"
    assert main([*common, "--seed", "2", "--runs", str(SECOND_CASES), "--corpus", str(second),
                 "--known", str(first), "--json", str(tmp_path / "second.json")]) == 0
    report = json.loads((tmp_path / "second.json").read_text())
    assert report["unique_failures"] and all(f["known"] for f in report["unique_failures"])


def test_stop_on_new_failure_ends_at_the_first_unknown_bug_and_goes_past_known_ones(tmp_path: Path) -> None:
    """fuzz --stop-on-new-failure (what a mutant's campaign runs under `mutate`): the first failure no known
    entry accounts for ends the campaign; known failures are counted and the campaign goes on."""
    name = "zoo-last-page-dropped"
    backend = REGISTRY.get(name)
    space = backend.case_space(CaseSpace(backend=name), CPU)

    def run(known: dict[str, str]):  # type: ignore[no-untyped-def]
        config = CampaignConfig([name], 3, max_cases=300, corpus_dir=tmp_path / "c", space=space,
                                known_signatures=known, stop_on_new_failure=True)
        return run_campaign(config, [backend], CPU, InProcessExecutor(REGISTRY, require("cpu")))

    known: dict[str, str] = {}
    for _ in range(10):  # the zoo bug shows a few identities (damage families); each run adds the one it met
        report = run(known)
        if not report.new_failures:
            break
        assert len(report.new_failures) == 1 and report.new_failures[0].count == 1 and report.cases < 300
        known[report.new_failures[0].signature] = "known.json"
    assert known and not report.new_failures
    assert report.cases == 300 and report.failure_count > len(known)  # went past every known failure
