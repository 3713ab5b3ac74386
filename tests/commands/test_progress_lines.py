"""The progress line of minimize, gate and isa on a (fake) terminal, and nothing with --no-progress or when stderr
is not a terminal; the gate names where its artifacts go at start and end."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.isa import check as isa_check
from hicache_fuzz.harness.isa import fetch as isa_fetch
from hicache_fuzz.harness.isa.symbols import IsaReport
from hicache_fuzz.harness.model import progress
from hicache_fuzz.harness.model.space import CaseSpace
from tests._mutants import DropLastPage, cpu_run
from tests.commands.test_gate import FAST, small_case, write_case


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Terminal:
    """stderr as a fake terminal, every update drawn. Installed from the test body: pytest's output capture
    re-installs its own sys.stderr between fixture set-up and the test call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.stream = FakeTTY()
        monkeypatch.setattr(progress, "REFRESH_SECONDS", 0.0)

    def __enter__(self) -> FakeTTY:
        self.monkeypatch.setattr(sys, "stderr", self.stream)
        return self.stream

    def __exit__(self, *_: object) -> None:
        self.monkeypatch.setattr(sys, "stderr", sys.__stderr__)


@pytest.fixture()
def terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    return Terminal(monkeypatch)


def failing_reproducer(folder: Path) -> Path:
    space = CaseSpace(byte_budget=1 << 16, backend="test-drop-last-page")
    run = cpu_run(DropLastPage())
    case = next(c for i in range(200) if run(c := case_for_index(5, i, space)).outcome.is_failure)
    return save_reproducer(folder, case, run(case))


def minimize_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["minimize", "--backend-plugin", "tests._mutants:backends", str(failing_reproducer(tmp_path / "in")),
            "--corpus", str(tmp_path / "out"), "--isolate", "no", "--max-runs", "30", *extra]


def test_minimize_shows_runs_reductions_and_eta(tmp_path: Path, terminal: Terminal) -> None:
    args = minimize_args(tmp_path)
    with terminal as tty:
        assert main(args) == 0
    drawn = tty.getvalue()
    assert "\rminimize 1/1: running" in drawn
    assert "runs, " in drawn and " reductions, indices " in drawn and "ETA <= " in drawn and "/30 runs" in drawn


def test_minimize_no_progress_prints_nothing_on_stderr(tmp_path: Path, terminal: Terminal) -> None:
    args = minimize_args(tmp_path, "--no-progress")
    with terminal as tty:
        assert main(args) == 0
    assert tty.getvalue() == ""


def test_minimize_silent_when_stderr_is_not_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args, plain = minimize_args(tmp_path), io.StringIO()
    monkeypatch.setattr(progress, "REFRESH_SECONDS", 0.0)
    monkeypatch.setattr(sys, "stderr", plain)
    assert main(args) == 0
    monkeypatch.undo()
    assert "\r" not in plain.getvalue()


def run_gate(tmp_path: Path, *extra: str) -> int:
    corpus = tmp_path / "corpus"
    write_case(corpus, "reference-ok", small_case("reference"))
    return main(["gate", *FAST, "--corpus", str(corpus), "--artifacts", str(tmp_path / "artifacts"),
                 "--json", str(tmp_path / "gate.json"), *extra])


def test_gate_shows_its_phases_and_where_the_artifacts_go(tmp_path: Path, terminal: Terminal,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with terminal as tty:
        assert run_gate(tmp_path) == 0
    drawn = tty.getvalue()
    assert "\r[1/3] corpus replay: 1/1 entries" in drawn and "ETA" in drawn
    assert "\r[2/3] campaign reference (1/1): " in drawn and "/4 cases" in drawn
    out = capsys.readouterr().out
    artifacts = str((tmp_path / "artifacts").resolve())
    start, end = out.split("[1/3]", 1)[0], out.rsplit("[2/3]", 1)[1]
    assert f"artifacts: {artifacts}" in start and f"--json {tmp_path / 'gate.json'}" in start
    assert f"files under {artifacts}" in end and f"--json {tmp_path / 'gate.json'}" in end


def test_gate_no_progress(tmp_path: Path, terminal: Terminal) -> None:
    with terminal as tty:
        assert run_gate(tmp_path, "--no-progress") == 0
    assert "\r" not in tty.getvalue()


def fake_isa(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command path of `hicache-fuzz isa` with the compiler replaced: sources, toolchain and the per-target
    check are stand-ins that report progress the way the real check does."""
    monkeypatch.setattr(isa_check, "resolve_sglang_source", lambda *_: "sglang")
    monkeypatch.setattr(isa_check, "find_rocm_toolchain", lambda *_, **__: "clang")

    def check_rocm(source: Any, arch: str, strict: bool, **options: Any) -> IsaReport:
        for done in (1, 2):
            options["progress"](f"{done}/2 modules compiled and checked")
        return IsaReport("rocm", arch, strict, "sglang", "0.5.23", "", "clang", [])

    monkeypatch.setattr(isa_check, "check_rocm", check_rocm)


def test_isa_shows_targets_and_modules(monkeypatch: pytest.MonkeyPatch, terminal: Terminal) -> None:
    fake_isa(monkeypatch)
    with terminal as tty:
        main(["isa", "--platform", "rocm", "--arch", "gfx90a", "--arch", "gfx942"])
    drawn = tty.getvalue()
    assert "\risa: target 1/2 gfx90a: 2/2 modules compiled and checked" in drawn
    assert "\risa: target 2/2 gfx942: compiling, ETA" in drawn


def test_isa_no_progress(monkeypatch: pytest.MonkeyPatch, terminal: Terminal) -> None:
    fake_isa(monkeypatch)
    with terminal as tty:
        main(["isa", "--platform", "rocm", "--arch", "gfx90a", "--no-progress"])
    assert tty.getvalue() == ""


def test_isa_fetch_steps_are_reported() -> None:
    seen: list[str] = []
    isa_fetch.set_progress(seen.append)
    try:
        isa_fetch._run([sys.executable, "-c", "pass"], "downloading x from PyPI")
    finally:
        isa_fetch.set_progress(None)
    assert seen == ["downloading x from PyPI (0 fetch steps done)",
                    "downloading x from PyPI: done (1 fetch steps done)"]


def test_fuzz_shows_counts_and_time_left(tmp_path: Path, terminal: Terminal) -> None:
    args = ["fuzz", "--platform", "cpu", "--seed", "1", "--runs", "20", "--max-total-time", "600", "--byte-budget",
            "65536", "--corpus", str(tmp_path / "corpus")]
    with terminal as tty:
        assert main(args) == 0
        drawn = tty.getvalue()
        assert main([*args, "--no-progress"]) == 0
    assert "\r20 cases  " in drawn and " failures (0 unique)" in drawn and " left  [" in drawn
    assert drawn.endswith("\r")  # cleared before the summary
    assert tty.getvalue() == drawn  # --no-progress: nothing more
