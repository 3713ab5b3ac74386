"""--baseline: every campaign failure is replayed on a second sglang, in its own process. The plugin backend's
second refusal (int32 device indices) exists only where the imported sglang carries the planted flag: the head
here (this process), never the baseline (a copy of tests/fake_sglang put on the child's PYTHONPATH)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.corpus import iter_case_files
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry
from tests.campaign._scoped_plugin import PLANTED_FLAG, ScopedRefusal

FAKE_SGLANG = Path(__file__).resolve().parents[1] / "fake_sglang" / "sglang"
PLUGIN = ["--backend-plugin", "tests.campaign._scoped_plugin:backends", "--backend", ScopedRefusal.name]
CASES = "100"


@pytest.fixture(scope="module")
def base_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The baseline: a folder holding an unmodified copy of the fake sglang package."""
    folder = tmp_path_factory.mktemp("base")
    shutil.copytree(FAKE_SGLANG, folder / "sglang")
    return folder


@pytest.fixture(scope="module")
def known_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean backend's refusal recorded as an expected failure with no trigger: its identity is known for
    every case, so without a baseline the planted regression (same identity) would pass as known."""
    folder = tmp_path_factory.mktemp("known")
    backend = ScopedRefusal()
    registry = load_registry(["tests.campaign._scoped_plugin:backends"])
    config = CampaignConfig([backend.name], 1, max_cases=100, corpus_dir=folder,
                            space=backend.case_space(CaseSpace(backend=backend.name), Platform("cpu")))
    run_campaign(config, [backend], Platform("cpu"), InProcessExecutor(registry, require("cpu")))
    for path in iter_case_files([folder]):
        data = json.loads(path.read_text())
        data["expect"] = "fail"
        path.write_text(json.dumps(data))
    return folder


@pytest.fixture
def planted_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(**{PLANTED_FLAG: True}))


def fuzz(tmp_path: Path, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    report = tmp_path / "report.json"
    code = main(["fuzz", "--platform", "cpu", *PLUGIN, "--seed", "2", "--runs", CASES, "--no-progress",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(report), *extra])
    return code, json.loads(report.read_text())


def test_a_known_identity_the_baseline_does_not_share_is_new(planted_head: None, known_corpus: Path,
                                                             base_sglang: Path, tmp_path: Path) -> None:
    code, report = fuzz(tmp_path / "known-only", "--known", str(known_corpus))
    assert code == 0 and all(f["known"] for f in report["unique_failures"])  # the known identity hides it
    code, report = fuzz(tmp_path / "baseline", "--known", str(known_corpus), "--baseline", str(base_sglang))
    assert code == 1
    (judged,) = report["baseline"]["failures"]
    assert judged["status"] == "new" and "pass on the baseline" in judged["detail"]
    assert report["baseline"]["cases"] >= 2 and report["baseline"]["seconds"] > 0
    assert report["new_failure_signatures"] == [judged["signature"]]


def test_a_failure_the_baseline_shares_is_pre_existing(base_sglang: Path, tmp_path: Path) -> None:
    code, report = fuzz(tmp_path, "--baseline", str(base_sglang))
    assert code == 0
    (judged,) = report["baseline"]["failures"]
    assert judged["status"] == "pre-existing"
    (failure,) = report["unique_failures"]
    assert failure["known"].startswith("pre-existing on the baseline")


def gate(tmp_path: Path, corpus: Path, base: Path) -> tuple[int, dict, str, str]:  # type: ignore[type-arg]
    out = tmp_path / "gate"
    code = main(["gate", "--platform", "cpu", *PLUGIN, "--cases-per-backend", CASES, "--corpus", str(corpus),
                 "--no-isa", "--allow-skip-isa", "--no-progress", "--baseline", str(base), "--artifacts",
                 str(out), "--json", str(out / "g.json"), "--markdown", str(out / "g.md"), "--junit",
                 str(out / "g.xml")])
    return (code, json.loads((out / "g.json").read_text()), (out / "g.md").read_text(),
            (out / "g.xml").read_text())


def test_the_gate_reports_new_and_pre_existing_failures(planted_head: None, known_corpus: Path,
                                                        base_sglang: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, markdown, junit = gate(tmp_path / "head", known_corpus, base_sglang)
    assert code == 1
    (row,) = report["campaign"]
    assert [f["status"] for f in row["failures"]] == ["new"]
    assert report["baseline"]["cases"] >= 2
    assert "Baseline: sglang" in markdown and "NEW [" in junit
    monkeypatch.delitem(sys.modules, "sglang")  # the head without the regression: only the shared refusal
    code, report, markdown, junit = gate(tmp_path / "clean", known_corpus, base_sglang)
    assert code == 0
    (row,) = report["campaign"]
    assert row["failures"] == [] and [f["status"] for f in row["pre_existing"]] == ["pre-existing"]
    assert report["verdict"]["campaign"][0]["pre_existing_signatures"] == [row["pre_existing"][0]["signature"]]
    assert "### Pre-existing" in markdown and "PRE-EXISTING [" in junit


def test_an_unusable_baseline_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fuzz", "--platform", "cpu", *PLUGIN, "--runs", "1", "--no-progress", "--corpus", str(tmp_path / "c")]
    assert main([*args, "--baseline", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([*args, "--baseline", str(tmp_path / "empty")]) == 2
    assert "no sglang package in it" in capsys.readouterr().err
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert main([*args, "--baseline", str(broken)]) == 3
    assert "cannot import sglang and torch" in capsys.readouterr().err


def test_a_refused_baseline_closes_the_worker_launched_before_its_probe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """On a GPU the campaign's first worker is launched before the baseline's probe, so that both start at once;
    a baseline that is then refused must not leave that worker running."""
    from hicache_fuzz.harness.commands import fuzz

    closed: list[bool] = []
    early = types.SimpleNamespace(close=lambda: closed.append(True))
    monkeypatch.setattr(fuzz, "_launch_early", lambda *_: early)
    args = ["fuzz", "--platform", "cpu", *PLUGIN, "--runs", "1", "--no-progress", "--corpus", str(tmp_path / "c")]
    assert main([*args, "--baseline", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert closed == [True]


def test_a_baseline_interpreter_runs_the_replay(base_sglang: Path, tmp_path: Path) -> None:
    """The other form: the Python of another environment (here a wrapper whose environment has the baseline
    sglang); the harness reaches it through links, not through that environment's own installs."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={base_sglang}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    code, report = fuzz(tmp_path, "--baseline", str(python))
    assert code == 0
    assert report["baseline"]["python"] == str(python)
    assert [f["status"] for f in report["baseline"]["failures"]] == ["pre-existing"]
    assert (tmp_path / "corpus" / ".baseline" / "harness-links" / "hicache_fuzz" / "harness").is_symlink()
