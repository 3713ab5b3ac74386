"""The atheris entry: bytes -> case mapping, a mutant found with a JSON reproducer written before the raise,
and the exit-3 message where atheris is missing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign import atheris_entry
from hicache_fuzz.harness.commands import atheris as atheris_command
from hicache_fuzz.harness.generation.generate import draw_case
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.space import CaseSpace

ROOT = Path(__file__).resolve().parents[2]
MISSING = atheris_entry.atheris_unavailable_reason()


@pytest.mark.skipif(MISSING is not None, reason=f"atheris missing: {MISSING}")
def test_exhausted_bytes_give_the_simplest_case() -> None:
    import atheris

    space = CaseSpace(byte_budget=1 << 16)
    case = draw_case(atheris_entry.FuzzedDataChooser(atheris.FuzzedDataProvider(b"")), space)
    assert case.direction is space.directions[0] and case.layout is space.layouts[0]
    assert len(case.pools) == 1 and case.seed == 0
    same = draw_case(atheris_entry.FuzzedDataChooser(atheris.FuzzedDataProvider(b"")), space)
    assert same == case  # the mapping is deterministic


@pytest.mark.skipif(MISSING is not None, reason=f"atheris missing: {MISSING}")
def test_mutant_found_and_written_as_json_before_the_raise(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i in range(8):  # structured-enough starting inputs: 96 bytes each
        (seeds / f"s{i}").write_bytes(bytes((i * 37 + j * 11) % 256 for j in range(96)))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "hicache_fuzz.harness.campaign.atheris_entry", "--backend", "test-drop-last-page",
         "--backend-plugin", "tests._mutants:backends", "--byte-budget", "65536", "--corpus", str(tmp_path / "corpus"),
         "-runs=3000", "-seed=1", f"-artifact_prefix={tmp_path}/", str(seeds)],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 77, done.stderr[-2000:]  # libFuzzer's exit code for an uncaught Python exception
    artifacts = list(tmp_path.glob("case-*.json"))
    assert len(artifacts) == 1 and list(tmp_path.glob("crash-*"))
    data = json.loads(artifacts[0].read_text())
    assert Case.from_dict(data["case"]).backend == "test-drop-last-page"
    assert data["observed"]["outcome"] == "mismatch"
    assert list((tmp_path / "corpus" / data["signature"]).glob("repro_*.py"))


def test_missing_atheris_exits_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(atheris_entry, "atheris_unavailable_reason", lambda: "atheris is not importable (test)")
    args = argparse.Namespace(backend="reference", backend_plugin=[], platform="auto", byte_budget=1 << 16,
                              corpus=None, libfuzzer_args=["-runs=1"])
    assert atheris_command.run(args) == 3
    assert atheris_entry.main(["-runs=1"]) == 3
    assert "not importable" in capsys.readouterr().err
