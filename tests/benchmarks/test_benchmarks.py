"""The maintained benchmark scripts (benchmarks/, docs/bench.md) on the CPU: their plumbing, not their figures.

The GPU runs use the same scripts with PLATFORM=cuda; here each runs end to end on the CPU reference with the
smallest settings (no bare loop, no JIT warm-up: both need CUDA and sglang), and must produce its files and
summary lines. The summarizer is checked on recorded reports (tests/data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks import standalone_scripts, summarize

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
BENCHMARKS = ROOT / "benchmarks"


def _run(script: str, out: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PLATFORM": "cpu",
                   "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(BENCHMARKS / script), *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script", sorted(str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*.sh")))
def test_shell_scripts_parse(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_proof_run_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = _run("proof_run.sh", out, tmp_path, BARE_SECONDS="0", JIT_WARM="0", CAMPAIGN_SECONDS="2", SEEDS="5 6",
                FUZZ_ARGS="--backend reference")
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    for seed in (5, 6):
        assert f"campaign-{seed} rc=0" in rcs and f"== campaign seed {seed}" in rcs
        report = json.loads((out / f"campaign-{seed}.json").read_text())
        assert report["seed"] == seed and report["cases"] > 0 and not set(summarize.BULKY_KEYS) & set(report)
    assert "cases/s (no bare loop)" in rcs and "  engine: " in rcs


def test_gate_cold_jit_on_the_cpu(tmp_path: Path) -> None:
    out, empty = tmp_path / "out", tmp_path / "empty-corpus"
    out.mkdir()
    empty.mkdir()
    done = _run("gate_cold_jit.sh", out, tmp_path, GATE_BUDGET="20",
                GATE_ARGS=f"--corpus {empty} --cases-per-backend 3 --no-isa --allow-skip-isa --backend reference")
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    assert "status pass exit 0 cases/backend 3" in rcs and "campaign reference: passed 3/3 cases" in rcs
    assert {"gate.json", "summary.md", "junit.xml", "gate.log", "artifacts.tgz"} <= {p.name for p in out.iterdir()}


def test_feedback_latency_on_the_cpu(tmp_path: Path) -> None:
    """Fresh, standing and after-a-kernel-edit campaigns and the gate, against a stand-in sglang folder that holds
    only the kernel source the script edits: the edit is made for the third campaign and undone byte for byte."""
    out, empty, fake = tmp_path / "out", tmp_path / "empty-corpus", tmp_path / "fake-sglang"
    out.mkdir()
    empty.mkdir()
    kernel = fake / "sglang" / "kernels" / "jit" / "csrc" / "kvcacheio" / "hicache.cuh"
    kernel.parent.mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    kernel.write_text("// the kernel\n")
    done = _run("feedback_latency.sh", out, tmp_path, JIT_WARM="0", CAMPAIGN_SECONDS="2", PYTHONPATH=str(fake),
                HICACHE_FUZZ_RUNTIME_DIR=str(tmp_path / "runtime"),
                GATE_ARGS=f"--corpus {empty} --cases-per-backend 3 --no-isa --allow-skip-isa --backend reference")
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    for name in ("fresh", "standing", "cuh"):
        assert f"{name if name != 'cuh' else 'cuh-change'} rc=0" in rcs and f"== {name}\n" in rcs
        assert json.loads((out / f"{name}.json").read_text())["cases"] > 0
    assert f"kernel source changed in the .cuh step: {kernel}" in rcs and "kernel source restored" in rcs
    assert kernel.read_text() == "// the kernel\n"
    assert "status pass exit 0 cases/backend 3" in rcs and "workers-stop rc=0" in rcs


def test_feedback_latency_refuses_without_the_kernel_source(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = _run("feedback_latency.sh", out, tmp_path, PYTHONPATH=str(tmp_path / "nothing"), CUH="no-such.cuh")
    assert done.returncode == 3
    assert "no writable no-such.cuh under sglang's kernels/jit/csrc: stop" in (out / "rcs.txt").read_text()


def test_campaign_summary_of_a_recorded_gpu_campaign(tmp_path: Path) -> None:
    report = json.loads((DATA / "gpu-engine-campaign-stalls.json").read_text())
    lines = summarize.campaign_lines(report, [4000.0, 5000.0])
    rate = report["cases_per_second"]
    assert lines[0].startswith(f"{report['cases']} cases in {report['seconds']} s = {rate} cases/s ")
    assert f"{rate / 5000.0:.3f} of the bare loop's 5000.0 cases/s" in lines[0]
    assert any(line.startswith("  stalls") for line in lines)


def test_gate_summary_and_slim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert summarize.main(["gate", str(DATA / "gate-cpu.json")]) == 0
    assert capsys.readouterr().out.startswith("status pass exit 0")
    slim = tmp_path / "slim.json"
    assert summarize.main(["slim", str(DATA / "gpu-campaign.json"), str(slim)]) == 0
    assert "case_ids" in json.loads((DATA / "gpu-campaign.json").read_text())
    assert not set(summarize.BULKY_KEYS) & set(json.loads(slim.read_text()))


@pytest.mark.parametrize(("content", "message"), [("{", "cannot read"), ("[1]", "not a JSON object"),
                                                  ('{"cases": 1}', "not a campaign report")])
def test_bad_report_exits_2(tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert summarize.main(["campaign", str(bad)]) == 2
    assert message in capsys.readouterr().err


def test_standalone_scripts_writes_a_passing_and_a_broken_script_per_kind(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "standalone_scripts.py"), str(tmp_path / "s")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = {p.name for p in (tmp_path / "s").iterdir()}
    kinds = {name.removesuffix(".py") for name in names if not name.endswith(".broken.py")}
    assert len(kinds) >= 10 and names == {f"{k}.py" for k in kinds} | {f"{k}.broken.py" for k in kinds}
    for kind in kinds:
        whole, broken = ((tmp_path / "s" / f"{kind}{suffix}").read_text() for suffix in (".py", ".broken.py"))
        assert "def test_" in whole and whole != broken
    assert standalone_scripts.main([]) == 2  # no folder: usage error


def _installed_copy(site: Path) -> None:
    """This checkout laid out as `pip install --target` lays out the package (pyproject's package-dir mapping)."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "harness" / "_root", site / "hicache_fuzz", ignore=ignore)
    for folder in ("harness", "oracles", "kernels"):
        shutil.copytree(ROOT / folder, site / "hicache_fuzz" / folder, ignore=ignore)


@pytest.mark.slow
def test_proof_run_beside_a_baseline_on_the_cpu(tmp_path: Path) -> None:
    """BASELINE: the same campaigns with another installed hicache-fuzz, after this checkout's, its import checked."""
    out, site = tmp_path / "out", tmp_path / "baseline-site"
    out.mkdir()
    _installed_copy(site)
    # The baseline's summary lines differ from ours, as an older harness's may (or it may lack them): the
    # summaries in rcs.txt must come from this checkout's harness all the same.
    with (site / "hicache_fuzz" / "harness" / "engine" / "engine_stats.py").open("a") as stats:
        stats.write("\n\ndef summary_lines(report):\n    return ['summary by the baseline harness']\n")
    done = _run("proof_run.sh", out, tmp_path, BARE_SECONDS="0", JIT_WARM="0", CAMPAIGN_SECONDS="2", SEEDS="5",
                FUZZ_ARGS="--backend reference", BASELINE=str(site))
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    assert f"baseline harness from {site}/hicache_fuzz/harness/__init__.py" in rcs
    assert "campaign-5 rc=0" in rcs and "baseline-campaign-5 rc=0" in rcs
    assert "== campaign seed 5" in rcs and "== baseline campaign seed 5" in rcs
    ours, theirs = (json.loads((out / name).read_text()) for name in ("campaign-5.json", "baseline-campaign-5.json"))
    assert ours["seed"] == theirs["seed"] == 5 and theirs["cases"] > 0
    assert "summary by the baseline harness" not in rcs
    baseline_summary = rcs.split("== baseline campaign seed 5\n")[1]
    assert baseline_summary.startswith(f"{theirs['cases']} cases in "), baseline_summary


@pytest.mark.slow
def test_proof_run_stops_on_a_baseline_that_imports_from_elsewhere(tmp_path: Path) -> None:
    out, empty = tmp_path / "out", tmp_path / "not-a-site"
    out.mkdir()
    empty.mkdir()
    done = _run("proof_run.sh", out, tmp_path, BARE_SECONDS="0", JIT_WARM="0", CAMPAIGN_SECONDS="1", SEEDS="5",
                FUZZ_ARGS="--backend reference", BASELINE=str(empty))
    assert done.returncode == 3
    assert "does not import from its own folder" in (out / "rcs.txt").read_text()


@pytest.mark.parametrize("fa_first", ["0", "1"])
def test_class_check_on_the_cpu(tmp_path: Path, fa_first: str) -> None:
    """The plumbing with the reference backend: cases saved by the dry run, replayed, outcomes counted, false alarms
    (after the selections, or before them with FA_FIRST=1)."""
    out = tmp_path / "out"
    out.mkdir()
    done = _run("class_check.sh", out, tmp_path, BACKEND="reference", WHERE="backend=reference", RUNS="40",
                AOT_SRC=str(tmp_path / "absent"), FA_SEEDS="1", FA_SECONDS="2", FA_JOBS="1", REPLAY_CASES="25",
                JIT_WARM="0", FA_FIRST=fa_first)  # the reference backend builds nothing: jit-warm exits 3 for it
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    assert "selection 1: backend=reference: 40 cases saved" in rcs and "replayed: 25" in rcs
    outcomes = dict(item.rsplit(" ", 1) for item in rcs.split("outcomes: ")[1].splitlines()[0].split(", "))
    assert sum(map(int, outcomes.values())) == 25 and set(outcomes) <= {"pass", "rejected_as_predicted"}
    assert "aot-build" not in rcs and "jit-warm" not in rcs and "false-alarms rc=0" in rcs
    assert (rcs.index("false-alarms rc=") < rcs.index("selection 1:")) == (fa_first == "1")
    written = {p.name for p in out.iterdir()}
    assert {"replay-1.json", "replay-1.log", "fa.json", "fa.md", "fa.log", "fa-corpus.tgz"} <= written
    # everything in one archive that sorts first (a device call brings back only the first few files by name)
    assert min(written) == "0-results.tgz"
    with tarfile.open(out / "0-results.tgz") as packed:
        assert {Path(name).name for name in packed.getnames()} >= written - {"0-results.tgz"}


def test_minimize_on_device_on_the_cpu(tmp_path: Path) -> None:
    """The plumbing with a planted bug (tests/_mutants.py): two known (expect fail) reproducers minimized at once,
    each rewritten where it lies (name and expect kept), and each under its path in the archive that comes back
    from a device."""
    from hicache_fuzz.harness.findings.reproducer import save_reproducer
    from hicache_fuzz.harness.generation.generate import case_for_index
    from hicache_fuzz.harness.model.space import CaseSpace
    from tests._mutants import DropLastPage, cpu_run

    space = CaseSpace(byte_budget=1 << 16, backend="test-drop-last-page")
    run = cpu_run(DropLastPage())
    failing = [c for i in range(200) if run(c := case_for_index(5, i, space)).outcome.is_failure][:2]
    files = [save_reproducer(tmp_path / f"in-{n}", case, run(case), {"expect": "fail"})
             for n, case in enumerate(failing)]
    originals = [json.loads(path.read_text()) for path in files]
    out = tmp_path / "out"
    out.mkdir()
    done = _run("minimize_on_device.sh", out, tmp_path, *map(str, files), PLUGIN="tests._mutants:backends",
                AOT_SRC=str(tmp_path / "absent"), MAX_RUNS="200", MAX_SECONDS="30")
    rcs = (out / "rcs.txt").read_text()
    assert done.returncode == 0, rcs + done.stderr
    assert "minimize 2 rc=0" in rcs and "aot-build" not in rcs
    for n, (path, original) in enumerate(zip(files, originals, strict=True), start=1):
        assert json.loads((out / f"minimize-{n}.json").read_text())["results"]
        rewritten = json.loads(path.read_text())
        assert rewritten["expect"] == "fail" and "minimized" in rewritten and "minimized" not in original
        assert len(rewritten["case"]["host_indices"]) < len(original["case"]["host_indices"])
        assert json.loads((out / "minimized" / str(path).lstrip("/")).read_text()) == rewritten
    with tarfile.open(out / "0-results.tgz") as packed:
        names = packed.getnames()
    assert any(name.startswith("./minimized/") and name.endswith(files[1].name) for name in names)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run("minimize_on_device.sh", empty, tmp_path).returncode == 2
