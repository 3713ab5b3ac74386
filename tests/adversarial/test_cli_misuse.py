"""CLI misuse: options that make no sense are exit 2 at parse time with the option named (never a run of
nothing that exits 0); usage that asks for something absent is exit 3 with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adversarial.inputs import valid_case

# (argv, words the message must contain). Every one must exit 2 before any case runs.
MISUSE: list[tuple[list[str], str]] = [
    (["fuzz", "--runs", "0"], "--runs"),
    (["fuzz", "--runs", "-5"], "--runs"),
    (["fuzz", "--runs", "1.5"], "--runs"),
    (["fuzz", "--runs", "ten"], "--runs"),
    (["fuzz", "--max-total-time", "-1"], "--max-total-time"),
    (["fuzz", "--max-total-time", "0"], "--max-total-time"),
    (["fuzz", "--max-total-time", "nan"], "--max-total-time"),
    (["fuzz", "--max-total-time", "inf"], "--max-total-time"),
    (["fuzz", "--runs", "1", "--byte-budget", "0"], "--byte-budget"),
    (["fuzz", "--runs", "1", "--byte-budget", "-1"], "--byte-budget"),
    (["fuzz", "--runs", "1", "--start-index", "-5"], "--start-index"),
    (["fuzz", "--runs", "1", "--case-timeout", "0"], "--case-timeout"),
    (["fuzz", "--runs", "1", "--isolate", "yes", "--case-timeout", "0"], "--case-timeout"),
    (["fuzz", "--runs", "1", "--case-timeout", "-3"], "--case-timeout"),
    (["fuzz", "--runs", "1", "--case-timeout", "nan"], "--case-timeout"),
    (["fuzz", "--runs", "1", "--seed", "x"], "--seed"),
    (["fuzz", "--runs", "1", "--shard", "2/2"], "--shard"),
    (["fuzz", "--runs", "1", "--shard", "a/b"], "--shard"),
    (["fuzz", "--runs", "1", "--shard", "0/0"], "--shard"),
    (["fuzz", "--runs", "1", "--isolate", "maybe"], "--isolate"),
    (["fuzz", "--runs", "1", "--platform", "tpu"], "--platform"),
    (["fuzz", "--runs", "1", "--backend", "no-such-backend"], "no-such-backend"),
    (["fuzz"], "budget"),
    (["fuzz", "--runs", "1", "--workers", "0"], "--workers"),
    (["fuzz", "--runs", "1", "--workers", "many"], "--workers"),
    (["fuzz", "--runs", "1", "--known", "/nonexistent/known"], "--known"),
    (["fuzz", "--runs", "1", "--backend-plugin", "no_colon"], "--backend-plugin"),
    (["fuzz", "--runs", "1", "--backend-plugin", "no_such_module_xyz:f"], "no_such_module_xyz"),
    (["fuzz", "--runs", "1", "--backend-plugin", "json:no_such_attribute"], "no_such_attribute"),
    (["replay"], "paths"),
    (["replay", "/nonexistent/case.json"], "/nonexistent/case.json"),
    (["replay", "EMPTY_DIR"], "no case files"),
    (["replay", "CASE", "--case-timeout", "0"], "--case-timeout"),
    (["replay", "CASE", "--backend", "no-such-backend"], "no-such-backend"),
    (["minimize", "CASE", "--max-runs", "-1"], "--max-runs"),
    (["minimize", "CASE", "--max-runs", "0"], "--max-runs"),
    (["minimize", "CASE", "--max-seconds", "nan"], "--max-seconds"),
    (["minimize", "/nonexistent.json"], "/nonexistent.json"),
    (["gate", "--platform", "cpu", "--budget-seconds", "0"], "--budget-seconds"),
    (["gate", "--platform", "cpu", "--budget-seconds", "nan"], "--budget-seconds"),
    (["gate", "--platform", "cpu", "--cases-per-backend", "0"], "--cases-per-backend"),
    (["gate", "--platform", "cpu", "--corpus", "/nonexistent/corpus"], "/nonexistent/corpus"),
    (["gate"], "--platform"),
    (["selftest", "--platform", "cpu", "--max-cases-per-mutant", "0"], "--max-cases-per-mutant"),
    (["selftest", "--platform", "cpu", "--max-seconds-per-mutant", "-1"], "--max-seconds-per-mutant"),
    (["selftest", "--platform", "cpu", "--mutant", "no-such-mutant"], "no-such-mutant"),
    (["merge", "REPORT", "--out", "OUT", "--max-per-signature", "-1"], "--max-per-signature"),
    (["merge", "/nonexistent/report.json", "--out", "OUT"], "/nonexistent/report.json"),
    (["merge", "CASE", "--out", "OUT"], "not a campaign report"),
    (["merge", "REPORT"], "--out"),
    (["no-such-command"], "invalid choice"),
    ([], ""),
]


def _fill(argv: list[str], tmp: Path) -> list[str]:
    case = tmp / "case.json"
    case.write_text(json.dumps(valid_case()))
    report = tmp / "report.json"
    report.write_text(json.dumps({"cases": 0, "outcomes": {}, "unique_failures": []}))
    (tmp / "empty").mkdir(exist_ok=True)
    names = {"CASE": str(case), "REPORT": str(report), "OUT": str(tmp / "out"), "EMPTY_DIR": str(tmp / "empty")}
    return [names.get(arg, arg) for arg in argv]


@pytest.mark.parametrize(("argv", "words"), MISUSE, ids=[" ".join(a) or "no-arguments" for a, _ in MISUSE])
def test_misuse_is_exit_2_naming_the_option(argv: list[str], words: str, tmp_path: Path, cli: object,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a command that wrongly ran would write under tmp_path, not the checkout
    ran = cli(*_fill(argv, tmp_path))  # type: ignore[operator]
    assert ran.code == 2, (ran.code, ran.out, ran.err)
    assert "Traceback" not in ran.err
    assert words in ran.err + ran.out, ran.err
    assert "cases in" not in ran.out  # no campaign ran
    assert not (tmp_path / "fuzz-out").exists()


def test_backends_into_a_closed_pipe_has_no_traceback() -> None:
    """`hicache-fuzz backends | head -1`: the reader goes away; no BrokenPipeError traceback."""
    command = (f"{sys.executable} -m hicache_fuzz backends --platform cpu --backend-plugin tests._cli_plugin:backends"
               " | head -1")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stdout.startswith("platform:")
    assert done.returncode == 0, done.stderr


def test_replay_of_an_unavailable_backend_exits_3(tmp_path: Path, cli: object) -> None:
    case = dict(valid_case(), backend="sglang-jit")  # no GPU in the CPU test run
    path = tmp_path / "gpu-case.json"
    path.write_text(json.dumps(case))
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: sglang-jit may be available")
    ran = cli("replay", str(path))  # type: ignore[operator]
    assert ran.code == 3, (ran.out, ran.err)
    assert "SKIP" in ran.out and "cannot run here" in ran.err


def test_replay_of_a_backend_unknown_here_exits_3(tmp_path: Path, cli: object) -> None:
    path = tmp_path / "plugin-case.json"
    path.write_text(json.dumps(dict(valid_case(), backend="some-plugin-backend")))
    ran = cli("replay", str(path))  # type: ignore[operator]
    assert ran.code == 3 and "not installed" in ran.out, (ran.out, ran.err)
