"""`fuzz --dry-run`: the real campaign's cases, generated and predicted without probing or running anything, in the
usual report (coverage_values, distinct cases per second, the HTML page)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.campaign.dry_run import MODELLED_PLATFORMS, PredictingExecutor, predicted_result
from hicache_fuzz.harness.campaign.loop import CampaignConfig, MenuGrowth, run_campaign
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.engine.feed import CaseFeed, EngineOptions
from hicache_fuzz.harness.generation.buckets import is_power_of_two
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_USAGE
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.setup import real_kernel_backends
from hicache_fuzz.kernels.registry import load_registry

CUDA = MODELLED_PLATFORMS["cuda"]


def _dry(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "dry.json"
    code = main(["fuzz", "--dry-run", "--no-progress", "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_the_dry_run_visits_the_slots_of_the_campaign_feed() -> None:
    """Same feed as the real campaign: mix, variants, backend schedule (the scale tier apart: it is timed)."""
    registry = load_registry()
    backends = real_kernel_backends(registry)
    engine = EngineOptions(scale="off")
    executor = PredictingExecutor(backends, CUDA)
    config = CampaignConfig([b.name for b in backends], seed=5, max_cases=600, engine=engine, dry_run=True,
                            clock=executor.clock)
    report = run_campaign(config, backends, CUDA, executor, record_case_ids=True)
    growth = MenuGrowth(backends, CaseSpace(), CUDA, 5, prefetch=False)
    feed = CaseFeed(5, 0, (0, 1), backends, growth.spaces, CUDA, engine.resolved_mix(CUDA), 64, growth.before,
                    engine.resolved_variants_by_backend(CUDA, backends), engine.resolved_backend_every(CUDA, backends))
    try:
        slots = feed._make(len(report.case_ids))
    finally:
        feed.close()
    assert report.case_ids == [slot.case.case_id for slot in slots][: len(report.case_ids)]
    assert len(report.case_ids) >= 600 and report.extra["engine"]["variants_per_case"] == 7
    assert report.extra["engine"]["backend_every"]["sglang-pool"] > 1


def test_on_the_cpu_the_dry_run_predicts_what_the_campaign_finds(tmp_path: Path) -> None:
    """The reference does what the contract says: a real CPU campaign and its dry run agree case by case."""
    code, dry = _dry(tmp_path, "--platform", "cpu", "--runs", "150", "--seed", "3", "--record-case-ids",
                     "--corpus", str(tmp_path / "corpus"))
    real_json = tmp_path / "real.json"
    real_code = main(["fuzz", "--platform", "cpu", "--runs", "150", "--seed", "3", "--record-case-ids", "--no-progress",
                      "--json", str(real_json), "--corpus", str(tmp_path / "corpus")])
    real = json.loads(real_json.read_text())
    assert code == real_code == EXIT_CLEAN
    assert dry["case_ids"] == real["case_ids"] and dry["outcomes"] == real["outcomes"]
    assert dry["coverage"] == real["coverage"] and dry["coverage_values"] == real["coverage_values"]
    assert not (tmp_path / "corpus").exists() or not any((tmp_path / "corpus").iterdir())


def test_the_dry_run_probes_nothing_and_needs_no_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = load_registry()

    def refuse(self: Any, platform: Any) -> Any:
        raise AssertionError(f"{self.name} was probed")

    for backend in real_kernel_backends(registry):
        monkeypatch.setattr(type(backend), "probe", refuse)
        monkeypatch.setattr(type(backend), "prefetch", refuse)
        monkeypatch.setattr(type(backend), "run", refuse)
    code, report = _dry(tmp_path, "--platform", "cuda", "--runs", "400", "--seed", "1")
    assert code == EXIT_CLEAN and report["dry_run"]["platform"] == "cuda"
    assert report["cases"] >= 400 and report["failures_total"] == 0
    assert set(report["coverage_values"]) == {b.name for b in real_kernel_backends(registry)}
    assert report["distinct_cases"] > 0 and report["distinct_cases_per_second"] > 0


def test_the_dry_run_cli_shows_full_page_size_ranges_and_renders_html(tmp_path: Path) -> None:
    """The issue's check, at a size a test affords, through the installed command line (a fresh process)."""
    out, page = tmp_path / "out.json", tmp_path / "out.html"
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", "cuda", "--dry-run", "--runs",
                           "4000", "--seed", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == EXIT_CLEAN, done.stderr
    assert "distinct generated cases" in done.stdout and "dry run: nothing ran" in done.stdout
    report = json.loads(out.read_text())
    for name in ("sglang-staged", "sglang-page-unified"):
        sizes = report["coverage_values"][name]["page_size"]
        assert max(sizes) >= 128 and any(not is_power_of_two(p) for p in sizes if p > 16), (name, sizes)
        assert {"layout", "direction", "scope", "dtype", "attention"} <= set(report["coverage_values"][name])
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz", "report", "--html", str(page), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_CLEAN, done.stderr
    assert 'id="values"' in page.read_text() and "nothing ran" in page.read_text()


def test_a_time_budget_is_modelled_seconds(tmp_path: Path) -> None:
    code, report = _dry(tmp_path, "--platform", "cuda", "--max-total-time", "1.5", "--scale", "off", "--seed", "2",
                        "--backend", "sglang-jit")
    assert code == EXIT_CLEAN
    assert 1500 <= report["cases"] < 1500 + 64 + 8  # the batch under way when the modelled clock ran out
    assert report["seconds"] == pytest.approx(report["cases"] / report["dry_run"]["modelled_cases_per_second"],
                                              rel=0.01)


@pytest.mark.parametrize("args", [["--platform", "cuda"], ["--platform", "cuda", "--runs", "5", "--backend", "nope"]])
def test_bad_dry_runs_exit_2(tmp_path: Path, args: list[str]) -> None:
    code, _ = _dry(tmp_path, *args)
    assert code == EXIT_USAGE


def test_labels_of_a_backend_land_in_coverage_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend.coverage_labels is folded in generically, under the names the backend gives."""
    backend = load_registry().get("sglang-staged")
    monkeypatch.setattr(type(backend), "coverage_labels", lambda self, case: {"operation": f"op{case.layers % 2}"})
    executor = PredictingExecutor([backend], CUDA)
    config = CampaignConfig([backend.name], seed=1, max_cases=300, dry_run=True, clock=executor.clock)
    report = run_campaign(config, [backend], CUDA, executor)
    assert set(report.coverage.values_dict()[backend.name]["operation"]) == {"op0", "op1"}


def test_a_predicted_result_is_what_the_runner_would_decide_before_running() -> None:
    backend = load_registry().get("sglang-page-unified")
    space = backend.case_space(CaseSpace(backend=backend.name), CUDA)
    from hicache_fuzz.harness.generation.generate import case_for_index

    seen = set()
    for index in range(200):
        case = case_for_index(7, index, space)
        result = predicted_result(case, backend, CUDA)
        seen.add(result.outcome)
        if result.outcome is Outcome.PASS:
            assert result.path == result.expected_path == backend.plan(case, CUDA).path
    assert {Outcome.PASS, Outcome.REJECTED_AS_PREDICTED, Outcome.UNSUPPORTED} <= seen


def test_the_dry_run_report_states_what_its_predictions_assume(tmp_path: Path) -> None:
    """A prediction for a GPU made on this CPU machine cannot probe sgl_kernel's AOT ops: the report says it
    assumed them (sglang-hicache counts their cases as running)."""
    out = tmp_path / "dry.json"
    assert main(["fuzz", "--platform", "cuda", "--dry-run", "--runs", "50", "--seed", "2", "--backend",
                 "sglang-hicache", "--no-progress", "--json", str(out)]) == 0
    assumed = json.loads(out.read_text())["dry_run"]["assumptions"]
    assert "AOT" in " ".join(assumed["sglang-hicache"])


def test_save_cases_writes_the_matching_cases_the_dry_run_would_run(tmp_path: Path) -> None:
    """--save-cases with --where: the predicted-to-run cases of one pool class, as case files `replay` reads."""
    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.kernels.sglang_hicache_settings import case_settings

    folder = tmp_path / "dsa"
    code, report = _dry(tmp_path, "--platform", "cuda", "--backend", "sglang-hicache", "--runs", "3000", "--seed",
                        "1", "--save-cases", str(folder), "--where", "pool_class=DSAIndexerPoolHost")
    assert code == EXIT_CLEAN
    files = sorted(folder.glob("*.json"))
    saved = report["dry_run"]["saved_cases"]
    assert files and saved["saved"] == saved["matched"] == len(files)
    backend = load_registry().get("sglang-hicache")
    for path in files:
        case = Case.from_json(path.read_text())
        assert case.case_id == path.stem and case_settings(case)[0] == "DSAIndexerPoolHost"
        assert backend.unsupported_reason(case, CUDA) is None


def test_where_and_save_cases_are_refused_outside_their_dry_run(tmp_path: Path) -> None:
    assert main(["fuzz", "--platform", "cpu", "--runs", "5", "--save-cases", str(tmp_path / "x")]) == EXIT_USAGE
    where_alone = ["fuzz", "--dry-run", "--platform", "cuda", "--runs", "5", "--where", "backend=reference"]
    assert main(where_alone) == EXIT_USAGE
    code = main(["fuzz", "--dry-run", "--platform", "cuda", "--runs", "5", "--save-cases", str(tmp_path / "y"),
                 "--where", "pool_class"])
    assert code == EXIT_USAGE
