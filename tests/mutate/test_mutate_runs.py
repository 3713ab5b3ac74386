"""hicache-fuzz mutate on CPU, runs over time: stopping, report-only, deadlines, device slots, restored modules
and timeouts, on the synthetic sglang tree (synthetic.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_fuzz.harness.mutate import sources
from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.operators import generate
from hicache_fuzz.harness.mutate.workspace import Workspace, child_environment

from .synthetic import PY, SYNC_PRESENT, all_mutants, run_mutate


def test_sigterm_kills_running_targets_and_records_nothing_for_them(tree: Path, tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out", tmp_path / "hung.pid"
    command = f"{SYNC_PRESENT} || sh -c 'echo $$ > {pid_file}; exec sleep 300'"
    process = subprocess.Popen([sys.executable, "-m", "hicache_fuzz", "mutate", "--sglang-src", str(tree),
                                "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                                "--test-cmd", command, "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the hanging mutant never started"
    time.sleep(0.3)
    hung = int(pid_file.read_text())
    process.terminate()
    assert process.wait(timeout=30) != 0
    assert _gone(hung, within=15.0), f"the hung target (pid {hung}) outlived the run"
    hanging_id = next(m.id for m in all_mutants(tree) if m.description.startswith("drop the synchronisation"))
    assert not (out / "mutants" / f"{hanging_id}.json").exists()
    assert not (out / "work" / "slot-0" / "sglang").exists()  # the private copy is removed on the way out


def _gone(pid: int, within: float) -> bool:
    """The process ended (absent, or a zombie waiting for a reaper) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


def test_report_only_reports_finished_mutants_without_running(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", SYNC_PRESENT, "--out", out]
    assert run_mutate(*base) == 0
    first = json.loads((out / "summary.json").read_text())
    removed = sorted(out.glob("mutants/*.json"))[0]
    removed.unlink()
    (out / "summary.json").unlink()
    assert run_mutate(*base, "--report-only") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["meta"]["unfinished"] == [removed.stem]
    assert again["mutants"] == first["mutants"] - 1
    assert not list(out.glob("mutants/*.json")) or removed not in list(out.glob("mutants/*.json"))


def test_report_only_names_results_made_with_other_target_options(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored result whose target options differ is left out of the report, and named on stderr: a report step
    that lacks an option of the run (e.g. --jobs-per-gpu) must not report 0 finished mutants without a word."""
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement", "--out", out]
    assert run_mutate(*base, "--test-cmd", SYNC_PRESENT) == 0
    stored = sorted(p.stem for p in out.glob("mutants/*.json"))
    assert stored
    capsys.readouterr()
    assert run_mutate(*base, "--test-cmd", SYNC_PRESENT + " # another command", "--report-only") == 0
    err = capsys.readouterr().err
    assert f"{len(stored)} result(s)" in err and "other target options" in err
    assert all(mutant_id in err for mutant_id in stored[:8])
    again = json.loads((out / "summary.json").read_text())
    assert sorted(again["meta"]["unfinished"]) == stored


def test_start_deadline_starts_no_mutant_after_it_and_a_rerun_finishes_them(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--start-deadline 0: the baseline runs, no mutant starts, all stay unfinished and are named as such; the
    rerun without it runs them all (the time-boxed device call keeps what its slots finished)."""
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", SYNC_PRESENT, "--out", out]
    capsys.readouterr()
    assert run_mutate(*base, "--start-deadline", "0") == 0
    printed = capsys.readouterr().out
    first = json.loads((out / "summary.json").read_text())
    assert first["mutants"] == 0 and first["meta"]["unfinished"]
    assert f"{len(first['meta']['unfinished'])} mutant(s) not started before --start-deadline" in printed
    assert not list(out.glob("mutants/*.json"))
    assert run_mutate(*base, "--reuse-baseline") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["mutants"] == len(first["meta"]["unfinished"]) and not again["meta"]["unfinished"]
    assert run_mutate(*base, "--start-deadline", "-1") == 2


def test_two_slots_pin_one_device_each_and_share_the_work(tree: Path, tmp_path: Path) -> None:
    out, seen = tmp_path / "out", tmp_path / "seen"
    seen.mkdir()
    command = f'echo "$CUDA_VISIBLE_DEVICES" > {seen}/"$HICACHE_MUTANT_ID"; sleep 0.3; {SYNC_PRESENT}'
    assert run_mutate("--sglang-src", tree, "--gpus", "0,1", "--platform", "cuda", "--file", "*.cuh",
                "--test-cmd", command, "--out", out) == 0
    records = [json.loads(p.read_text()) for p in out.glob("mutants/*.json")]
    assert {r["device"] for r in records} == {"0", "1"}
    for record in records:
        assert (seen / record["mutant"]["id"]).read_text().strip() == record["device"]
    assert not (out / "work" / "slot-1" / "sglang").exists()


def test_restored_module_never_runs_the_mutants_byte_code(tree: Path, tmp_path: Path) -> None:
    """A same-size mutant (`%` -> `&`) restored within the same second must not leave its .pyc behind."""
    rel = "sglang/pagemath.py"
    (tree / rel).write_text("def page_of(index):\n    return index % 16\n")
    mutant = next(m for m in generate(rel, (tree / rel).read_text(), "python") if m.operator == "mod_and")
    assert len(mutant.replacement) == len(mutant.original)
    workspace = Workspace(tree, tmp_path / "slot")
    env = child_environment(workspace.root)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the case at stake: targets that do write byte-code
    probe = [sys.executable, "-c", "from sglang.pagemath import page_of; print(page_of(17))"]

    def page_of_17() -> str:
        return subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert page_of_17() == "1"
    with workspace.applied(mutant):
        assert page_of_17() == "16"  # 17 & 16
    assert page_of_17() == "1"
    assert list((workspace.root / "sglang" / "__pycache__").glob("pagemath.*.pyc")), "no byte-code was written"
    assert (workspace.root / rel).read_bytes() == (tree / rel).read_bytes()


def test_campaign_survivors_carry_the_cases_that_reached_their_kernels() -> None:
    from hicache_fuzz.harness.mutate import report
    from hicache_fuzz.harness.mutate.targets import _paths_run

    paths = _paths_run({"paths": {"sglang-jit": {"jit-register": 127, "jit-tma": 59},
                                  "sglang-pool": {"jit-register+jit-tma": 9, "jit-staged": 94},
                                  "reference": {"oracle": 1000}}})
    assert paths == {"jit-register": 127, "jit-tma": 59, "jit-register+jit-tma": 9, "jit-staged": 94}
    assert report.entry_cases(f"{sources.KVCACHEIO_DIR}/hicache_tma.cuh", paths) == {"jit-tma": 59,
                                                                                    "jit-register+jit-tma": 9}
    assert report.entry_cases(f"{sources.KVCACHEIO_DIR}/relayout.cuh", paths) == {"jit-staged": 94}
    assert sum(report.entry_cases(f"{sources.KVCACHEIO_DIR}/page_row.cuh", paths).values()) == 0
    assert report.entry_cases(PY, {**paths, "none": 5}) == paths  # the dispatch is in front of every path
    mutant = Mutant(f"{sources.KVCACHEIO_DIR}/page_row.cuh", "constant", 3, 10, 11, "1", "2", "constant 1 -> 2")
    record = {"mutant": {**mutant.to_dict(), "diff": "--- a\n+++ b\n"},
              "targets": {"campaign": {"outcome": "survived", "seconds": 1.0, "returncode": 0, "detail": "",
                                       "failures": [], "log": "", "output_tail": "", "paths": paths}}}
    summary = report.summarize({mutant.id: record}, ["campaign"], {})
    assert summary["targets"]["campaign"]["survivors"][0]["entry_cases"] == {}
    assert "never reached" in report.markdown(summary)


def test_cli_module_protocol_add_arguments_and_run(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What harness/cli.py's SUBCOMMAND_MODULES table does with a module: add_arguments(parser) + run(args)."""
    import argparse

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    parser = argparse.ArgumentParser(prog="hicache-fuzz")
    command = parser.add_subparsers(dest="command").add_parser("mutate")
    commands_mutate.add_arguments(command)
    command.set_defaults(run=commands_mutate.run)
    args = parser.parse_args(["mutate", "--sglang-src", str(tree), "--operator", "narrowing", "--list"])
    assert args.run(args) == 0
    assert f"{sum(1 for m in all_mutants(tree) if m.operator == 'narrowing')} mutants" in capsys.readouterr().out


def test_timeout_also_kills_descendants_in_their_own_session(tree: Path, tmp_path: Path) -> None:
    """The campaign's workers start their own session; a timeout must not orphan them."""
    out, pid_file = tmp_path / "out", tmp_path / "worker.pid"
    spawn = (f"{sys.executable} -c \"import subprocess, time; "
             f"p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
             f"open('{pid_file}', 'w').write(str(p.pid)); time.sleep(300)\"")
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", f"{SYNC_PRESENT} || {spawn}", "--timeout", "3", "--out", out) == 0
    assert pid_file.exists()
    assert _gone(int(pid_file.read_text()), within=15.0), "a worker in its own session outlived the timeout"


def test_device_slots_respect_an_inherited_visibility_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.harness.commands import mutate as commands_mutate

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert commands_mutate._slots("2", "CUDA_VISIBLE_DEVICES") == ["2", "3"]
    assert commands_mutate._slots("1,0", "CUDA_VISIBLE_DEVICES") == ["3", "2"]
    with pytest.raises(commands_mutate.UsageError):
        commands_mutate._slots("3", "CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert commands_mutate._slots("2", "CUDA_VISIBLE_DEVICES") == ["0", "1"]
    assert commands_mutate._slots("0", "CUDA_VISIBLE_DEVICES") == [None]


def test_template_brackets_are_not_comparisons() -> None:
    snippet = """\
template <typename T, int64_t kElementSize, bool kIsMLA = false>
struct S {
  using Package = details::PackageType<kGroupBytes / kLanesPerWorker>;
  using Element = std::decay_t<decltype(vec.data[0])>;
  void f(T* p, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<T>(i);
    RuntimeCheck(n > 0 && n <= kMax, "bad n");
    auto x = n < kA ? 1 : 2;
  }
};
"""
    found = sorted((m.line, m.original) for m in generate("x.cuh", snippet, "c") if m.operator == "comparison")
    assert found == [(6, "<"), (7, "<="), (7, ">"), (8, "<")]


# Mutant e0d98c28a365 (reports/mutate/README.md): the unmutated campaign's known rejection and the mutant's, one
# identity ("a valid input this path rejects"), two variants (the error texts differ).
_KNOWN_REJECTION = "jit-staged-wrongly_rejected-ed0f6f73b4"


def _campaign_report(variant: str, first_index: int = 6, backend: str = "sglang-pool",
                     known: str | None = "corpus/sglang/pool-base-controller-mixed-group-cuda-host-indices.json"
                     ) -> dict[str, object]:
    return {"cases": 320, "backends": ["sglang-pool"],
            "unique_failures": [{"signature": _KNOWN_REJECTION, "backend": backend, "outcome": "wrongly_rejected",
                                 "count": 8, "first_case_id": "c", "first_index": first_index, "file": "f",
                                 "summary": "valid input rejected", "known": known,
                                 "variants": [f"{_KNOWN_REJECTION}.{variant}"]}]}


def test_a_known_failure_class_with_a_variant_the_unmutated_run_never_showed_is_a_kill() -> None:
    from hicache_fuzz.harness.mutate.targets import baseline_failure_variants, masked_by_known

    unmutated = baseline_failure_variants(_campaign_report("96d487"))
    assert masked_by_known(_campaign_report("96d487"), unmutated, 22225) == []  # the same variant: known
    (masked,) = masked_by_known(_campaign_report("d528f0"), unmutated, 22225)
    assert masked["new_variants"] == [f"{_KNOWN_REJECTION}.d528f0"]
    # not the mutant's doing, or not provably so: a case past the unmutated run's last, a non-sglang
    # backend, a failure that is new anyway (the ordinary kill), no baseline report
    assert masked_by_known(_campaign_report("d528f0", first_index=22225), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0", backend="reference"), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0", known=None), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0"), None, 22225) == []


def test_the_campaign_target_kills_a_mutant_hidden_behind_a_known_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.harness.mutate import targets
    from hicache_fuzz.harness.mutate.targets import CampaignTarget, ProcessRun, baseline_failure_variants

    def fake_fuzz(variant: str) -> None:
        def run(command: list[str], env: dict[str, str], timeout: float, log_path: Path,
                cwd: Path | None = None) -> ProcessRun:
            report = Path(command[command.index("--json") + 1])
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps(_campaign_report(variant)))
            return ProcessRun(0, 1.0, "1 failures, 1 unique, 0 new")  # fuzz exits 0: the failure is known
        monkeypatch.setattr(targets, "run_process", run)

    campaign = CampaignTarget("campaign", "cuda", 60.0, 2026, [])
    campaign.baseline_variants = baseline_failure_variants(_campaign_report("96d487"))
    campaign.baseline_cases = 22225
    fake_fuzz("96d487")
    assert campaign.run({}, tmp_path / "same", 100.0).outcome == "survived"
    fake_fuzz("d528f0")
    result = campaign.run({}, tmp_path / "masked", 100.0)
    assert result.outcome == "killed" and "masked by --known" in result.detail
    assert result.failures[0]["new_variants"] == [f"{_KNOWN_REJECTION}.d528f0"]
