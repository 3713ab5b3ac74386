"""A known failure must never hide a new one: a known entry accounts only for failures of its identity whose
case meets its trigger (findings/trigger.py, findings/known.py). The plugin backend refuses valid inputs in
two ways under one identity: pageable host memory (the known bug), and int32 device indices where a planted
sglang is imported (the regression)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, CampaignReport, run_campaign
from hicache_fuzz.harness.campaign.minimize import minimize
from hicache_fuzz.harness.findings.corpus import CorpusError, load_corpus, load_entry
from hicache_fuzz.harness.findings.known import KnownMap, known_bugs, match_known, recorded_trigger
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.findings.scope import Environment
from hicache_fuzz.harness.findings.standalone import DEFAULT_PLATFORM
from hicache_fuzz.harness.findings.trigger import in_trigger
from hicache_fuzz.harness.model.case import HostAllocator, IndexDevice, IndexDtype, IndexSpec
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry
from tests.campaign._scoped_plugin import PLANTED_FLAG, ScopedRefusal

CPU = Platform("cpu")
REGISTRY = load_registry(["tests.campaign._scoped_plugin:backends"])
BACKEND = ScopedRefusal()
CASES = 150
SGLANG_CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "sglang"


def campaign(seed: int, known: KnownMap, corpus: Path | None = None) -> CampaignReport:
    config = CampaignConfig([BACKEND.name], seed, max_cases=CASES, corpus_dir=corpus,
                            space=BACKEND.case_space(CaseSpace(backend=BACKEND.name), CPU), known_signatures=known)
    return run_campaign(config, [BACKEND], CPU, InProcessExecutor(REGISTRY, require("cpu")))


@pytest.fixture(scope="module")
def known_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean backend's bug, minimized and recorded as an expected failure (as `minimize` records it)."""
    found = tmp_path_factory.mktemp("found")
    report = campaign(1, {}, found)
    assert len(report.failures) == 1
    entry = load_entry(Path(report.failures[0].file))
    assert entry.observed is not None
    done = minimize(entry.case, InProcessExecutor(REGISTRY, require("cpu")).run, entry.observed)
    known = tmp_path_factory.mktemp("known")
    save_reproducer(known, done.case, done.result, {"expect": "fail", "trigger": done.trigger},
                    backend_class="tests.campaign._scoped_plugin:ScopedRefusal")
    return known


@pytest.fixture
def planted_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(**{PLANTED_FLAG: True}))


def test_the_minimizer_records_the_trigger_the_failure_needs(known_corpus: Path) -> None:
    (entry,) = load_corpus([known_corpus])
    assert entry.trigger == {"host_memory": "pageable"}  # index dtypes, devices, knobs: not needed, dropped


def test_a_known_identity_inside_the_trigger_is_known(known_corpus: Path) -> None:
    report = campaign(2, known_bugs(load_corpus([known_corpus]), Environment("cpu")))
    assert report.failures and not report.new_failures
    assert all(f.known for f in report.failures)


def test_a_known_identity_outside_the_trigger_is_new(known_corpus: Path, planted_sglang: None,
                                                      tmp_path: Path) -> None:
    (entry,) = load_corpus([known_corpus])
    report = campaign(2, known_bugs([entry], Environment("cpu")), tmp_path)
    known = [f for f in report.failures if f.known]
    new = report.new_failures
    assert [f.signature for f in known] == [entry.bug]  # pageable cases: the known bug
    assert [f.signature for f in new] == [entry.bug]  # int32 on pinned memory: same identity, new trigger
    new_case = load_entry(Path(new[0].file)).case
    assert new_case.device_index.dtype is IndexDtype.INT32
    assert new_case.host_allocator is not HostAllocator.PAGEABLE


def test_match_known_checks_the_trigger_and_accepts_a_bare_file() -> None:
    case = load_entry(SGLANG_CORPUS / "staged-unequal-index-lists-accepted.json").case
    pageable = case.replace(host_allocator=HostAllocator.PAGEABLE)
    pinned = case.replace(host_allocator=HostAllocator.HOST_REGISTER)
    known: KnownMap = {"bug": [{"file": "a.json", "trigger": {"host_memory": "pageable"}}], "other": "b.json"}
    assert match_known(known, "bug", "any", pageable) == "a.json"
    assert match_known(known, "bug", "any", pinned) == ""
    assert match_known(known, "other", "any", pinned) == "b.json"
    assert in_trigger({"host_index.dtype": "int32"}, case.replace(host_index=IndexSpec(IndexDtype.INT32)))
    assert not in_trigger({"tuning.controller": "base"}, case)


def test_the_sglang_corpus_triggers_are_the_derived_ones() -> None:
    """Each committed expected failure stores the trigger the harness derives from it, none written by hand."""
    entries = load_corpus([SGLANG_CORPUS])
    for entry in entries:
        data = json.loads(entry.path.read_text())
        assert "trigger" in data, entry.path
        derived = recorded_trigger(entry, REGISTRY.get(entry.case.backend), DEFAULT_PLATFORM)
        assert entry.trigger == derived, entry.path
    pool = next(e for e in entries if e.case.backend == "sglang-pool")
    # a valid input refused, which cannot be run here: every non-plain feature of how the inputs are handed over
    # stays, the host pool's shape (which nothing tried) does not
    assert pool.trigger == {"host_index.device": "cpu", "host_pool_group": "mixed", "tuning.controller": "base"}
    staged = next(e for e in entries if e.path.name == "staged-unequal-index-lists-accepted.json")
    # an identity the contract decides: the relaxed layout (layer_first) plans another path, so page_first stays
    assert staged.trigger == {"layout": "page_first"}
    # the hybrid controller or a group whose pools agree: the same identity there is a new bug
    assert not in_trigger(pool.trigger, pool.case.replace(tuning=(("controller", "hybrid"),)))
    assert not in_trigger(pool.trigger, pool.case.replace(pools=pool.case.pools[:2]))


def test_a_malformed_trigger_is_named(tmp_path: Path) -> None:
    data = json.loads((SGLANG_CORPUS / "staged-unequal-index-lists-accepted.json").read_text())
    data["trigger"] = {"colour": "blue"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CorpusError, match=r"reproducer\.trigger: unknown feature 'colour'"):
        load_entry(path)


def test_the_gate_names_the_known_entry_and_its_trigger(known_corpus: Path, tmp_path: Path) -> None:
    from hicache_fuzz.harness.commands.cli import main

    out = tmp_path / "gate"
    code = main(["gate", "--platform", "cpu", "--backend-plugin", "tests.campaign._scoped_plugin:backends",
                 "--backend", BACKEND.name, "--cases-per-backend", str(CASES), "--corpus", str(known_corpus),
                 "--no-isa", "--allow-skip-isa", "--no-progress", "--artifacts", str(out), "--json",
                 str(out / "g.json"), "--markdown", str(out / "g.md"), "--junit", str(out / "g.xml")])
    assert code == 0
    (row,) = json.loads((out / "g.json").read_text())["campaign"]
    assert row["failures"] == [] and [f["status"] for f in row["known_failures"]] == ["known"]
    assert row["known_failures"][0]["trigger"] == {"host_memory": "pageable"}
    assert "trigger host_memory=pageable" in (out / "g.md").read_text()
    assert "(trigger host_memory=pageable)" in (out / "g.xml").read_text()


def test_every_recorded_case_is_within_its_own_trigger() -> None:
    for entry in load_corpus([SGLANG_CORPUS]):
        assert in_trigger(entry.trigger, entry.case), entry.path


def test_fuzz_reports_each_failures_status(known_corpus: Path, planted_sglang: None, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from hicache_fuzz.harness.commands.cli import main

    report_path = tmp_path / "report.json"
    code = main(["fuzz", "--platform", "cpu", "--backend-plugin", "tests.campaign._scoped_plugin:backends",
                 "--backend", BACKEND.name, "--seed", "2", "--runs", str(CASES), "--no-progress", "--corpus",
                 str(tmp_path / "corpus"), "--known", str(known_corpus), "--json", str(report_path)])
    assert code == 1
    statuses = {s["status"]: s for s in json.loads(report_path.read_text())["failure_status"]}
    assert sorted(statuses) == ["known", "new"]
    assert statuses["known"]["trigger"] == {"host_memory": "pageable"}
    (unmet,) = statuses["new"]["known_identity_outside_trigger"].values()
    assert unmet == {"host_memory": "pinned"}
    out = capsys.readouterr().out
    assert "but outside its trigger (host_memory=pinned)" in out and "(trigger: host_memory=pageable)" in out


def test_the_gate_calls_a_known_identity_outside_its_trigger_new(known_corpus: Path, planted_sglang: None,
                                                                  tmp_path: Path) -> None:
    from hicache_fuzz.harness.commands.cli import main

    out = tmp_path / "gate"
    code = main(["gate", "--platform", "cpu", "--backend-plugin", "tests.campaign._scoped_plugin:backends",
                 "--backend", BACKEND.name, "--cases-per-backend", str(CASES), "--corpus", str(known_corpus),
                 "--no-isa", "--allow-skip-isa", "--no-progress", "--artifacts", str(out), "--json",
                 str(out / "g.json"), "--markdown", str(out / "g.md")])
    assert code == 1
    (row,) = json.loads((out / "g.json").read_text())["campaign"]
    (new,) = row["failures"]
    assert new["status"] == "new" and [f["status"] for f in row["known_failures"]] == ["known"]
    assert list(new["known_identity_outside_trigger"].values()) == [{"host_memory": "pinned"}]
    assert "(outside its trigger: host_memory=pinned; identity known from" in (out / "g.md").read_text()


def test_the_minimize_command_records_the_trigger(tmp_path: Path) -> None:
    from hicache_fuzz.harness.commands.cli import main

    found = tmp_path / "found"
    report = campaign(1, {}, found)
    out = tmp_path / "minimized"
    assert main(["minimize", report.failures[0].file, "--platform", "cpu", "--backend-plugin",
                 "tests.campaign._scoped_plugin:backends", "--corpus", str(out), "--no-progress"]) == 0
    (written,) = [p for p in out.rglob("*.json")]
    assert json.loads(written.read_text())["trigger"] == {"host_memory": "pageable"}


def test_a_crash_inside_a_run_derived_crash_trigger_is_known_whatever_its_symptom() -> None:
    """One sglang bug, two crash symptoms: the asymmetric page_first_direct back-up from token-major rows ends the
    two-index reproducer with "CUDA error: invalid argument" and a larger case with the worker killed by SIGSEGV.
    Their identities differ (the error is part of a crash's cause); the entry's run-derived trigger makes the
    second known, for crashes only."""
    path = SGLANG_CORPUS / "hicache-asym-token-major-page-first-direct-backup-invalid-argument.json"
    entry = load_entry(path)
    assert entry.trigger_run and entry.trigger.get("attention") == "mha_asym"
    known = known_bugs([entry], Environment("cuda", "sm90", "0.5.23"))
    larger = entry.case.replace(page_size=2, device_rows=134, host_slots=132,
                                host_indices=tuple(range(130)), device_indices=tuple(range(2, 132)))
    other_symptom = "sglang-hicache-crash-446dba58cb"  # "worker killed by signal SIGSEGV"
    assert other_symptom != entry.bug
    assert match_known(known, other_symptom, "sglang-hicache", larger, Outcome.CRASH) == str(path)
    # not for another outcome with that geometry, nor outside the trigger (CUDA host indices)
    assert match_known(known, "sglang-hicache-mismatch-0000000000", "sglang-hicache", larger, Outcome.MISMATCH) == ""
    cuda_host = larger.replace(host_index=IndexSpec(IndexDtype.INT64, IndexDevice.DEVICE))
    assert match_known(known, other_symptom, "sglang-hicache", cuda_host, Outcome.CRASH) == ""


def test_a_crash_entry_without_a_run_derived_trigger_vouches_for_its_own_symptom_only() -> None:
    """The AOT page_head crash was recorded without a minimizer run (empty trigger): another crash on the same
    geometry is new unless it has the entry's identity."""
    path = SGLANG_CORPUS / "aot-page-head-12-byte-heads-misaligned-address.json"
    entry = load_entry(path)
    assert not entry.trigger_run
    known = known_bugs([entry], Environment("cuda", "sm90", "0.5.23"))
    assert match_known(known, entry.bug, entry.case.backend, entry.case, Outcome.CRASH) == str(path)
    assert match_known(known, "sglang-aot-crash-0000000000", entry.case.backend, entry.case, Outcome.CRASH) == ""
