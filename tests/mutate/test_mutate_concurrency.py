"""hicache-fuzz mutate on one GPU, several mutants at once (--jobs-per-gpu), a mutant's targets at once
(--parallel-targets), and an unmutated campaign's own failures made known (--baseline-failures known). CPU only:
the targets are shell commands (or a campaign target whose run is replaced), no compiling."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.mutate import runner, sources
from hicache_fuzz.harness.mutate.targets import CampaignTarget, TargetResult
from hicache_fuzz.harness.mutate.workspace import tree_digest

from .synthetic import CUH, SYNC_PRESENT, run_mutate

# Each target writes "<mutant> <slot root> <start> <end>" so a test can see which ran at the same time.
STAMP = ('s=$(python3 -c "import time; print(time.time())"); sleep {sleep}; '
         'e=$(python3 -c "import time; print(time.time())"); '
         'echo "$HICACHE_MUTANT_ID $HICACHE_MUTATE_SGLANG_ROOT ${{CUDA_VISIBLE_DEVICES:--}} $s $e" >> {log}')


def _intervals(log: Path) -> list[tuple[str, str, str, float, float]]:
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(r[0], r[1], r[2], float(r[3]), float(r[4])) for r in rows]


def _overlap(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[3] < b[4] and b[3] < a[4]


def test_jobs_per_gpu_runs_mutants_of_one_device_at_once_each_in_its_own_copy(tree: Path, tmp_path: Path) -> None:
    before = tree_digest(tree)
    out, log = tmp_path / "out", tmp_path / "stamps.txt"
    command = f'{STAMP.format(sleep=1.0, log=log)}; {SYNC_PRESENT}'
    assert run_mutate("--sglang-src", tree, "--gpus", "1", "--jobs-per-gpu", "3", "--platform", "cuda",
                "--file", "*.cuh", "--operator", "drop_statement", "--operator", "mod_and",
                "--test-cmd", command, "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["slots"] == ["0", "0", "0"] and summary["meta"]["jobs_per_gpu"] == 3
    runs = [r for r in _intervals(log) if r[0] != "baseline"]
    assert len(runs) == summary["mutants"] >= 3
    assert {r[2] for r in runs} == {"0"}  # all on device 0
    assert len({r[1] for r in runs}) == 3  # three private copies: slot-0, slot-1, slot-2
    # at least two mutants of the one device ran at the same time, never two in one copy at once
    assert any(_overlap(a, b) for i, a in enumerate(runs) for b in runs[i + 1:])
    for i, a in enumerate(runs):
        assert not any(_overlap(a, b) and a[1] == b[1] for b in runs[i + 1:]), "one copy held two mutants at once"
    target = summary["targets"]["test-cmd"]
    assert target["counts"]["killed"] == 1  # the dropped __syncthreads(), as with one slot
    assert tree_digest(tree) == before
    assert not any((out / "work").glob("slot-*/sglang"))


def test_jobs_per_gpu_with_two_devices_interleaves_and_resumes(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--sglang-src", tree, "--gpus", "0,1", "--jobs-per-gpu", "2", "--platform", "cuda", "--file", "*.cuh",
            "--operator", "drop_statement", "--test-cmd", SYNC_PRESENT, "--out", out]
    assert run_mutate(*argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["slots"] == ["0", "1", "0", "1"]
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("mutants/*.json")}
    assert run_mutate(*argv, "--reuse-baseline") == 0  # resumed: every mutant is finished, nothing runs again
    assert {p: p.stat().st_mtime_ns for p in out.glob("mutants/*.json")} == stamps
    assert run_mutate(*argv[:-2], "--jobs-per-gpu", "0", "--out", out) == 2


def test_parallel_targets_run_side_by_side_at_the_same_time(tree: Path, tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "stamps.txt"
    first = f'{STAMP.format(sleep=1.0, log=log)}; {SYNC_PRESENT}'
    second = f'{STAMP.format(sleep=1.0, log=log)}; ! grep -q "uint16_t" "$HICACHE_MUTATE_SGLANG_ROOT/{CUH}"'
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", first, "--test-cmd", second, "--parallel-targets", "--out", out) == 0
    runs = _intervals(log)
    by_mutant: dict[str, list[tuple[str, str, str, float, float]]] = {}
    for row in runs:
        by_mutant.setdefault(row[0], []).append(row)
    assert all(len(rows) == 2 and _overlap(rows[0], rows[1]) for rows in by_mutant.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["side_by_side"]["a_only"]["count"] == 1  # the same verdicts as one after the other


class FakeCampaign(CampaignTarget):
    """A campaign target whose unmutated run fails with one new sglang failure (written to its corpus as a
    campaign would), and whose mutant runs record the fuzz command they would have run."""

    def __init__(self) -> None:
        super().__init__("campaign", "cuda", 60.0, 2026, ["--known", "corpus/sglang"])
        self.commands: list[list[str]] = []

    def run(self, env: dict[str, str], run_dir: Path, timeout: float, baseline: bool = False) -> TargetResult:
        assert baseline == (run_dir.name == "baseline")  # the runner says which run is the baseline
        failure = {"signature": "sglang-staged-wrongly_accepted-0123456789", "backend": "sglang-staged"}
        if run_dir.name == "baseline":
            case = run_dir / "campaign-corpus" / failure["signature"] / "c-1.json"
            case.parent.mkdir(parents=True, exist_ok=True)
            case.write_text(json.dumps({"signature": failure["signature"], "expect": "pass", "case": {}}))
            (run_dir / "campaign-corpus" / ".journal").mkdir(exist_ok=True)
            (run_dir / "campaign-corpus" / ".journal" / "x.json").write_text("{}")
            return TargetResult("killed", 1.0, 1, "1 new failure class(es)", [failure], str(run_dir / "c.log"))
        self.commands.append(self.command(run_dir / "campaign.json", run_dir / "campaign-corpus"))
        return TargetResult("survived", 1.0, 0, "no new failure", log=str(run_dir / "c.log"))


def _config(tree: Path, out: Path, target: FakeCampaign, policy: str, reuse: bool = False) -> runner.RunConfig:
    mutants = sources.select(sources.generate_all(tree, sources.default_sources(tree)), ["*.cuh"],
                             ["drop_statement"])
    return runner.RunConfig(root=tree, mutants=mutants, targets=[target], out=out, slots=[None],
                            device_env="CUDA_VISIBLE_DEVICES", timeout=lambda _t: 60.0, baseline_failures=policy,
                            reuse_baseline=reuse)


def test_baseline_failures_abort_by_default_and_become_known_on_request(tree: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_sglang_backends", lambda _report: set())
    with pytest.raises(runner.BaselineFailed):
        runner.run_all(_config(tree, tmp_path / "abort", FakeCampaign(), "abort"), log=lambda _line: None)

    out, target = tmp_path / "known", FakeCampaign()
    records = runner.run_all(_config(tree, out, target, "known"), log=lambda _line: None)
    assert records and all(r["targets"]["campaign"]["outcome"] == "survived" for r in records.values())
    known = out / "baseline-known" / "campaign"
    copied = json.loads((known / "sglang-staged-wrongly_accepted-0123456789" / "c-1.json").read_text())
    assert copied["expect"] == "fail" and not (known / ".journal").exists()
    for command in target.commands:  # every mutant's campaign knows the unmutated run's failure
        assert command[-4:] == ["--known", "corpus/sglang", "--known", str(known)]
    baseline = json.loads((out / "baseline.json").read_text())
    assert baseline["passed"] and baseline["accepted_failures"]["campaign"]["known"] == str(known)

    # resumed with the stored baseline: the accepted failures apply again (nothing else reruns)
    for path in out.glob("mutants/*.json"):
        path.unlink()
    again = FakeCampaign()
    runner.run_all(_config(tree, out, again, "known", reuse=True), log=lambda _line: None)
    assert again.commands and all(c[-2:] == ["--known", str(known)] for c in again.commands)


def test_baseline_failures_option_reaches_the_report(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "baseline.json").write_text(json.dumps({
        "passed": True, "accepted_failures": {"campaign": {"known": "k", "failures": [{"signature": "sig-a"}]}}}))
    assert run_mutate("--sglang-src", tree, "--file", "*.cuh", "--operator", "drop_statement", "--test-cmd", "true",
                "--out", out, "--report-only") == 0
    assert "`sig-a`" in (out / "summary.md").read_text()


def test_test_cmd_timeout_applies_to_test_commands_only(tree: Path, tmp_path: Path) -> None:
    import time

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    out = tmp_path / "out"
    started = time.monotonic()
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", f"{SYNC_PRESENT} || sleep 120", "--timeout", "600", "--test-cmd-timeout", "2",
                "--out", out) == 0
    assert time.monotonic() - started < 60
    target = json.loads((out / "summary.json").read_text())["targets"]["test-cmd"]
    assert [t["description"] for t in target["timeouts"]] == ["drop the synchronisation `__syncthreads(...)`"]
    assert run_mutate("--sglang-src", tree, "--test-cmd", "true", "--test-cmd-timeout", "0", "--out", out) == 2
    import argparse

    parser = argparse.ArgumentParser()
    commands_mutate.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mutate", "--test-cmd", "true", "--test-cmd-timeout", "5", "--timeout", "50"])
    assert args.test_cmd_timeout == 5.0 and args.timeout == 50.0


def test_sigterm_stops_all_slots_at_once(tree: Path, tmp_path: Path) -> None:
    """Targets that ignore SIGTERM get SIGKILL after one grace period, all slots together (not one grace each)."""
    import subprocess
    import time

    out, started_dir = tmp_path / "out", tmp_path / "started"
    started_dir.mkdir()
    stubborn = f"touch {started_dir}/$HICACHE_MUTANT_ID; trap '' TERM; sleep 300"
    command = f"if [ \"$HICACHE_MUTANT_ID\" = baseline ]; then true; else {stubborn}; fi"
    process = subprocess.Popen([sys.executable, "-m", "hicache_fuzz", "mutate", "--sglang-src", str(tree),
                                "--gpus", "1", "--jobs-per-gpu", "3", "--platform", "cuda", "--file", "*.cuh",
                                "--operator", "drop_statement", "--test-cmd", command, "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(started_dir.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(started_dir.iterdir())) == 3, "three slots never ran at once"
    stopping = time.monotonic()
    process.terminate()
    assert process.wait(timeout=60) != 0
    assert time.monotonic() - stopping < 25  # one 10-s grace (then SIGKILL), not three in a row
    assert not list(out.glob("mutants/*.json"))


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_accepted_baseline_failures_load_as_known_in_a_real_campaign(tmp_path: Path) -> None:
    """The copied reproducers pass the strict corpus loader and make the same bug known to `fuzz --known`."""
    import subprocess

    def fuzz(seed: int, corpus: Path, *extra: str) -> int:
        return subprocess.run([sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", "cpu", "--backend",
                               "zoo-last-page-dropped", "--seed", str(seed), "--max-total-time", "2", "--no-progress",
                               "--corpus", str(corpus), *extra], capture_output=True, text=True).returncode

    assert fuzz(1, tmp_path / "runs" / "baseline" / "campaign-corpus") == 1  # the "unmutated" run's own bug
    known = runner.accept_baseline_failures(tmp_path, "campaign")
    assert known is not None
    assert fuzz(2, tmp_path / "other", "--known", str(known)) == 0  # known now, under another seed too
