"""The package builds without setuptools deprecation warnings (a deprecated form is a future build break), and
every documented ``python -m`` entry point answers --help (a module without a main exits 0 and does nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# setuptools' deprecation notices: the warning classes and the banner of a data folder it would stop installing
DEPRECATION_MARKERS = ("DeprecationWarning", "Package would be ignored", "is absent from the `packages`")


@pytest.mark.network  # the isolated build environment installs setuptools from the index
@pytest.mark.slow
def test_wheel_builds_without_deprecation_warnings(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-v", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    flagged = [line for line in output.splitlines() if any(marker in line for marker in DEPRECATION_MARKERS)]
    assert flagged == [], "\n".join(flagged)
    wheel = next(tmp_path.glob("hicache_fuzz-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for data_file in ("hicache_fuzz/kernels/aot_build/csrc/register.cc",
                      "hicache_fuzz/kernels/aot_build/csrc/include/utils.h",
                      "hicache_fuzz/kernels/aot_build/sgl_kernel_standin/sgl_kernel/kvcacheio.py",
                      "hicache_fuzz/kernels/aot_build/sources.json"):
        assert data_file in names


# Every module the docs run with `python -m` (tests/test_docs_commands.py checks that the docs name no other).
PYTHON_M_MODULES = (
    "hicache_fuzz",
    "hicache_fuzz.harness.commands.envcheck",
    "hicache_fuzz.harness.commands.report",
    "hicache_fuzz.harness.isa.check",
    "hicache_fuzz.harness.isa.fetch",
    "hicache_fuzz.harness.pipeline.bare_loop",
    "hicache_fuzz.harness.findings.standalone",
    "hicache_fuzz.kernels.aot_build.fetch_sources",
    "hicache_fuzz.kernels.aot_build.build",
)


@pytest.mark.parametrize("module", PYTHON_M_MODULES)
def test_python_m_entry_point_answers_help(module: str) -> None:
    completed = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                               timeout=120, check=False, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout.lower(), f"{module} --help printed no usage: {completed.stdout[:500]!r}"


def test_python_m_report_renders_a_page(tmp_path: Path) -> None:
    from hicache_fuzz.harness.commands.cli import main

    report = tmp_path / "report.json"
    assert main(["fuzz", "--platform", "cpu", "--backend", "reference", "--runs", "20", "--no-progress",
                 "--json", str(report)]) == 0
    page = tmp_path / "page.html"
    completed = subprocess.run([sys.executable, "-m", "hicache_fuzz.harness.commands.report", str(report),
                                "--html", str(page)], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize("command", ["replay", "minimize"])
def test_replay_and_minimize_explain_isolation_options(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hicache_fuzz.harness.commands.cli import main

    assert main([command, "--help"]) == 0  # the CLI turns argparse's exit into its return code
    text = " ".join(capsys.readouterr().out.split())
    assert "--isolate {auto,yes,no} run cases in a worker process" in text
    assert "--case-timeout CASE_TIMEOUT seconds before a case counts as a hang" in text
