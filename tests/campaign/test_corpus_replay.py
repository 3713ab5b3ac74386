"""Replay every entry under corpus/ (seeds and regression reproducers), one test per file and backend (a seed
file lists every backend it applies to).

Entries for backends that cannot run here are skipped with the reason (no GPU, sglang missing); CPU-runnable
ones never are. An entry marked ``"expect": "fail"`` is a known, unfixed bug: it is reported as xfail when
it still fails with its recorded signature, and fails the test when it passes (fixed? flip the marker) or
fails differently (docs/reproducers.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache_fuzz.harness.findings.corpus import CorpusEntry, load_corpus
from hicache_fuzz.harness.findings.reproducer import judge_replay
from hicache_fuzz.harness.model.platform import Machine, detect
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import Registry, UnknownBackend, load_registry

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
ENTRIES = load_corpus([CORPUS]) if CORPUS.is_dir() else []


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


@pytest.fixture(scope="module")
def machine() -> Machine:
    return detect()


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e.path.relative_to(CORPUS)}[{e.case.backend}]" for e in ENTRIES])
def test_corpus_entry(entry: CorpusEntry, registry: Registry, machine: Machine) -> None:
    case = entry.case
    try:
        backend = registry.get(case.backend)
    except UnknownBackend:
        pytest.skip(f"backend {case.backend!r} is not installed here")
    availability = backend.probe(machine.platform)
    if not availability.available:
        pytest.skip(f"backend {case.backend} unavailable on {machine.description}: {availability.reason}")
    # In process: reference and zoo failures are exceptions; GPU crashes are what `hicache-fuzz replay` isolates.
    result = InProcessExecutor(registry, machine).run(case)
    verdict = judge_replay(entry.expect, entry.bug, result, case, entry.any_crash_is_its_bug)
    if verdict.ok and verdict.label == "XFAIL":
        pytest.xfail(verdict.detail)
    assert verdict.ok, f"{verdict.label}: {verdict.detail}\n{result.summary or result.error}"
