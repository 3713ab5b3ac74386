"""The pre-merge gate (harness/commands/gate.py): deterministic verdict, exit codes, reproducers, JUnit and Markdown.

Every run here is on the CPU with tiny cases and the ISA checks off (they compile for minutes; .ci/isa.sh
and tests/isa/test_isa.py cover them), so the whole module takes seconds. The failing backend is a plugin
mutant from tests/_gate_plugin.py.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.commands import gate
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.output_paths import write_json_atomic
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry

PLUGIN = "tests._gate_plugin:backends"
MUTANT = "gate-test-reversed"
FAST = ["--platform", "cpu", "--budget-seconds", "60", "--cases-per-backend", "4", "--byte-budget", "65536",
        "--backend-plugin", PLUGIN, "--no-isa", "--allow-skip-isa"]


def small_case(backend: str, seed: int = 1) -> Case:
    return Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
                pools=(PoolSpec(head_dim=8),), layers=2, page_size=1, device_rows=8, host_slots=8,
                host_indices=(0, 3), device_indices=(2, 5), backend=backend, seed=seed)


def write_case(folder: Path, name: str, case: Case) -> Path:
    path = folder / f"{name}.json"
    write_json_atomic(path, case.to_dict())
    return path


def known_bug_reproducer(folder: Path) -> Path:
    """A reproducer marked "expect": "fail", recorded by running the mutant for real."""
    case = small_case(MUTANT, seed=2)
    result = InProcessExecutor(load_registry([PLUGIN]), require("cpu")).run(case)
    assert result.outcome.is_failure
    return save_reproducer(folder, case, result, {"expect": "fail"}, backend_class=None)


def run_gate(tmp_path: Path, tag: str, corpus: Path, *extra: str) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path / tag
    code = main(["gate", *FAST, "--corpus", str(corpus), "--artifacts", str(out / "artifacts"),
                 "--json", str(out / "gate.json"), "--junit", str(out / "junit.xml"),
                 "--markdown", str(out / "summary.md"), *extra])
    return code, json.loads((out / "gate.json").read_text()), out


@pytest.fixture()
def clean_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    write_case(corpus, "reference-ok", small_case("reference"))
    write_case(corpus, "needs-gpu", small_case("sglang-jit"))
    known_bug_reproducer(corpus / "known-bugs")
    return corpus


def test_same_inputs_same_verdict(tmp_path: Path, clean_corpus: Path) -> None:
    first_code, first, _ = run_gate(tmp_path, "first", clean_corpus)
    second_code, second, _ = run_gate(tmp_path, "second", clean_corpus)
    assert first_code == second_code == 0
    assert first["verdict"] == second["verdict"]
    verdict = first["verdict"]
    assert verdict["status"] == "pass"
    statuses = sorted(row["status"] for row in verdict["replay"])
    assert statuses == ["expected", "passed", "skipped"]
    [campaign] = verdict["campaign"]
    assert campaign["backend"] == "reference" and campaign["cases"] == campaign["planned_cases"] == 4
    # The same cases ran, not merely the same number of cases.
    assert len(campaign["case_ids_sha256"]) == 64


def test_skipped_entry_says_why(tmp_path: Path, clean_corpus: Path) -> None:
    _, report, _ = run_gate(tmp_path, "skip", clean_corpus)
    [skipped] = [row for row in report["replay"] if row["status"] == "skipped"]
    assert skipped["backend"] == "sglang-jit" and "unavailable" in skipped["reason"]


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_absent_platform_exits_3(tmp_path: Path, platform: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        require(platform)
    except Exception:
        pass
    else:
        pytest.skip(f"{platform} is present here")
    code = main(["gate", "--platform", platform, "--budget-seconds", "10", "--corpus", str(tmp_path),
                 "--artifacts", str(tmp_path / "a"), "--json", str(tmp_path / "gate.json")])
    assert code == 3
    assert f"platform {platform} requested but unavailable" in capsys.readouterr().err
    assert not (tmp_path / "gate.json").exists()  # nothing that could be mistaken for a green report


def test_failing_corpus_entry_exits_1_and_leaves_reproducer(tmp_path: Path, clean_corpus: Path) -> None:
    write_case(clean_corpus, "mutant-must-pass", small_case(MUTANT))
    code, report, out = run_gate(tmp_path, "corpus-fail", clean_corpus)
    assert code == 1 and report["verdict"]["status"] == "fail"
    [failed] = [row for row in report["replay"] if row["status"] == "failed"]
    assert failed["outcome"] == "mismatch"
    artifact = Path(failed["artifact"])
    assert artifact.is_relative_to(out / "artifacts" / "replay")
    entry = load_entry(artifact)  # a valid reproducer that `hicache-fuzz replay` accepts
    assert entry.case == small_case(MUTANT) and entry.signature == failed["signature"]
    assert (artifact.parent / f"repro_{entry.case.case_id}.py").is_file()


def test_expected_failure_that_passes_is_reported_fixed_not_a_finding(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    path = known_bug_reproducer(corpus)
    data = json.loads(path.read_text())
    data["case"]["backend"] = "reference"  # "fixed": the same case now passes
    path.write_text(json.dumps(data))
    code, report, out = run_gate(tmp_path, "xpass", corpus)
    assert code == 0
    assert [row["status"] for row in report["replay"]] == ["fixed"]
    markdown = (out / "summary.md").read_text()
    assert "### Fixed: expected failures that no longer fail (1)" in markdown
    [case] = [c for c in ET.parse(out / "junit.xml").getroot().iter("testcase") if c.get("classname") == "gate.corpus"]
    assert case.find("failure") is None and (case.findtext("system-out") or "").startswith("FIXED")


@pytest.mark.parametrize(("scope", "status", "code"), [({"platforms": ["cpu"]}, "expected", 0),
                                                       ({"platforms": ["rocm"]}, "failed", 1),
                                                       ({"sglang": ">=0.5.23"}, "failed", 1)])
def test_an_expected_failure_applies_only_within_its_scope(tmp_path: Path, scope: dict[str, Any], status: str,
                                                           code: int) -> None:
    """Outside its scope (another platform; an sglang version range this machine, without sglang, is not in)
    an entry is an ordinary regression case: the mutant failing it is a finding there."""
    corpus = tmp_path / "corpus"
    path = known_bug_reproducer(corpus)
    data = json.loads(path.read_text())
    data["scope"] = scope
    path.write_text(json.dumps(data))
    got_code, report, _ = run_gate(tmp_path, "scoped", corpus)
    assert got_code == code and [row["status"] for row in report["replay"]] == [status]


def test_a_failure_that_passes_alone_is_flaky_not_a_finding(tmp_path: Path, clean_corpus: Path) -> None:
    code, report, out = run_gate(tmp_path, "flaky", clean_corpus, "--backend", "gate-test-flaky")
    [row] = report["campaign"]
    assert code == 0 and row["status"] == "passed" and row["failures"] == []
    assert row["flaky"] and all(f["rerun_outcome"] == "pass" for f in row["flaky"])
    markdown = (out / "summary.md").read_text()
    assert "### Flaky: failed, then passed when re-run alone" in markdown
    [case] = [c for c in ET.parse(out / "junit.xml").getroot().iter("testcase")
              if c.get("classname") == "gate.campaign"]
    assert case.find("failure") is None and "FLAKY [" in (case.findtext("system-out") or "")


@pytest.fixture()
def campaign_failure(tmp_path: Path) -> tuple[int, dict[str, Any], Path]:
    """A campaign on the mutant with a corpus that does not know its bug (one identity per bug: a corpus
    holding a reproducer of it would make every campaign failure of the mutant known)."""
    corpus = tmp_path / "corpus"
    write_case(corpus, "reference-ok", small_case("reference"))
    write_case(corpus, "needs-gpu", small_case("sglang-jit"))
    return run_gate(tmp_path, "campaign-fail", corpus, "--backend", MUTANT)


def test_campaign_failure_exits_1_and_leaves_reproducer(campaign_failure: tuple[int, dict[str, Any], Path]) -> None:
    code, report, out = campaign_failure
    assert code == 1
    [row] = report["campaign"]
    assert row["backend"] == MUTANT and row["status"] == "failed" and row["failures"]
    for failure in row["failures"]:
        reproducer = Path(failure["file"])
        assert reproducer.is_relative_to(out / "artifacts" / "campaign")
        assert load_entry(reproducer).case.backend == MUTANT


def test_junit_parses_with_right_counts(campaign_failure: tuple[int, dict[str, Any], Path]) -> None:
    _, report, out = campaign_failure
    root = ET.parse(out / "junit.xml").getroot()
    [suite] = root.iter("testsuite")
    cases = list(suite.iter("testcase"))
    # 2 corpus entries + 1 campaign backend + 6 ISA targets (rocm/cpu: gfx90a, gfx942, gfx950 x strict, default)
    assert len(cases) == int(suite.get("tests", "")) == 2 + 1 + 6
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert int(suite.get("failures", "")) == len(failures) == 1  # the campaign
    assert int(suite.get("skipped", "")) == len(skipped) == 1 + 6  # the GPU-only entry + --no-isa
    [failed] = failures
    assert failed.get("classname") == "gate.campaign"
    assert report["campaign"][0]["failures"][0]["file"] in (failed.findtext("failure") or "")


def test_markdown_has_the_summary_table(campaign_failure: tuple[int, dict[str, Any], Path]) -> None:
    _, _, out = campaign_failure
    markdown = (out / "summary.md").read_text()
    assert "## HiCache fuzz gate (cpu): **FAIL**" in markdown
    assert "| check | result | passed | failed | known | flaky | fixed | skipped | details |" in markdown
    assert f"| campaign `{MUTANT}` | FAIL |" in markdown
    assert "| corpus replay | PASS | 1 | 0 | 0 | 0 | 0 | 1 |" in markdown
    assert "### Findings" in markdown and "hicache-fuzz replay" in markdown


def test_skipped_isa_is_not_green(tmp_path: Path, clean_corpus: Path) -> None:
    args = [a for a in FAST if a != "--allow-skip-isa"]
    out = tmp_path / "no-allow"
    code = main(["gate", *args, "--corpus", str(clean_corpus), "--artifacts", str(out),
                 "--markdown", str(out / "summary.md")])
    assert code == 3
    assert "the gate is not green" in (out / "summary.md").read_text()


def test_missing_isa_toolchain_is_skipped_with_reason(tmp_path: Path, clean_corpus: Path) -> None:
    args = [a for a in FAST if a not in ("--no-isa", "--allow-skip-isa")]
    out = tmp_path / "no-clang"
    code = main(["gate", *args, "--corpus", str(clean_corpus), "--artifacts", str(out), "--json",
                 str(out / "gate.json"), "--isa-clang", str(tmp_path / "no-such-clang"), "--no-fetch",
                 "--sglang-source", str(tmp_path / "no-such-sglang")])
    report = json.loads((out / "gate.json").read_text())
    assert code == 3
    assert {row["status"] for row in report["isa"]} == {"skipped"}
    assert all("unavailable" in row["reason"] for row in report["isa"])


def test_budget_is_a_hard_cap_that_fails_loudly(tmp_path: Path, clean_corpus: Path) -> None:
    args = list(FAST)
    args[args.index("--budget-seconds") + 1] = "0.001"
    args[args.index("--cases-per-backend") + 1] = "1000"
    out = tmp_path / "budget"
    code = main(["gate", *args, "--corpus", str(clean_corpus), "--artifacts", str(out), "--json",
                 str(out / "gate.json")])
    report = json.loads((out / "gate.json").read_text())
    assert code == 1
    assert report["verdict"]["campaign"][0]["status"] == "budget_exceeded"
    assert any("budget exceeded" in line for line in report["verdict"]["findings"])


def test_missing_corpus_folder_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["gate", *FAST, "--corpus", str(tmp_path / "absent"), "--artifacts", str(tmp_path)]) == 2


def test_planned_cases_depend_only_on_inputs() -> None:
    assert gate.planned_cases_per_backend(120, "cpu", 1) == 600
    assert gate.planned_cases_per_backend(900, "rocm", 6) == 37
    assert gate.planned_cases_per_backend(0.1, "cuda", 9) == 1


def accept_as_known(failures: list[dict[str, Any]], corpus: Path) -> None:
    """What a developer does with an upstream bug they cannot fix: mark its reproducer "expect": "fail"."""
    for failure in failures:
        data = json.loads(Path(failure["file"]).read_text())
        data["expect"] = "fail"
        write_json_atomic(corpus / "known" / Path(failure["file"]).name, data)


def test_campaign_failures_already_in_the_corpus_are_known_not_findings(
        tmp_path: Path, campaign_failure: tuple[int, dict[str, Any], Path]) -> None:
    _, first, _ = campaign_failure
    corpus = tmp_path / "corpus-with-known"
    write_case(corpus, "reference-ok", small_case("reference"))
    met = first["campaign"][0]["failures"] + first["campaign"][0]["known_failures"]  # the fixture knows one
    accept_as_known(met, corpus)
    code, report, out = run_gate(tmp_path, "known", corpus, "--backend", MUTANT)
    assert code == 0, report["verdict"]["findings"]
    [row] = report["campaign"]
    assert row["status"] == "passed" and row["failures"] == []
    assert sorted(f["signature"] for f in row["known_failures"]) == sorted(f["signature"] for f in met)
    assert all(f["known"].startswith(str(corpus)) for f in row["known_failures"])
    assert "Known failures met by the campaign" in (out / "summary.md").read_text()
    assert report["verdict"]["campaign"][0]["known_failure_signatures"]


def test_fuzz_known_failures_do_not_fail_the_run_but_new_ones_do(tmp_path: Path) -> None:
    args = ["fuzz", "--platform", "cpu", "--backend-plugin", PLUGIN, "--backend", MUTANT, "--seed", "3",
            "--runs", "30", "--byte-budget", "65536", "--no-progress"]
    first_json = tmp_path / "first.json"
    assert main([*args, "--corpus", str(tmp_path / "c1"), "--json", str(first_json)]) == 1
    first = json.loads(first_json.read_text())
    assert first["new_failure_signatures"]
    known_dir = tmp_path / "known-corpus"
    accept_as_known(first["unique_failures"], known_dir)
    second_json = tmp_path / "second.json"
    assert main([*args, "--corpus", str(tmp_path / "c2"), "--json", str(second_json),
                 "--known", str(known_dir)]) == 0
    second = json.loads(second_json.read_text())
    assert second["new_failure_signatures"] == []
    assert second["failures_total"] == first["failures_total"]
    assert all(f["known"] for f in second["unique_failures"])
    assert not (tmp_path / "c2").exists() or not any((tmp_path / "c2").glob("*/*.json"))  # nothing re-saved
    assert main([*args, "--corpus", str(tmp_path / "c3"), "--known", str(tmp_path / "absent")]) == 2


def test_report_records_phase_times(campaign_failure: tuple[int, dict[str, Any], Path]) -> None:
    """Phase wall times are in the JSON and the Markdown (the CUDA gate's cold-JIT budget is judged from them);
    total is the run's wall clock, at least any one phase."""
    _, report, out = campaign_failure
    seconds = report["seconds"]
    assert {"setup", "replay", "campaign", "confirm", "isa", "total"} <= set(seconds)
    assert all(value >= 0 for value in seconds.values())
    assert seconds["total"] >= max(value for key, value in seconds.items() if key != "total")
    assert "Wall time: setup " in (out / "summary.md").read_text()


def test_a_fall_back_from_mps_and_its_collateral_are_in_the_reports() -> None:
    from hicache_fuzz.harness.commands.gate_report import GateReport, render_markdown

    report = GateReport("cuda", "test GPU", 1, 60.0, 4, "hicache-fuzz gate", True, ["corpus"])
    assert report.to_dict()["gpu_sharing"] is None and "GPU sharing" not in render_markdown(report)
    report.gpu_sharing = {"mode": "contexts", "reason": "a private MPS server for this pool's workers (/tmp/x)",
                          "fell_back": "a batch at case abc lost its worker: illegal memory access",
                          "collateral": [{"case_id": "c0ffee", "backend": "sglang-jit", "lost": "x", "alone": "pass",
                                          "saved_batch": "/tmp/b.jsonl"}], "collateral_count": 1}
    text = render_markdown(report)
    assert "MPS ended during the campaign: a batch at case abc" in text
    assert "1 case(s) died in a batch with another MPS client's fault" in text and "`c0ffee` (sglang-jit)" in text
    assert report.to_dict()["gpu_sharing"]["collateral_count"] == 1
    assert report.exit_code == 0  # collateral is not a finding
