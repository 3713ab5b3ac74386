"""The gate's confirmation re-runs (gate_phases.confirm_failures): on a GPU they run side by side, each in a
worker of its own, and every failure still gets the re-run of its own case; on the CPU one at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from hicache_fuzz.harness.commands import gate_phases
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.reproducer import save_reproducer
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import Machine, Platform
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions
from hicache_fuzz.kernels.registry import load_registry
from tests.commands.test_gate import small_case


def _reproducers(folder: Path, count: int) -> list[str]:
    files = []
    for seed in range(1, count + 1):
        case = small_case("reference", seed)
        result = Result(case.case_id, case.backend, Outcome.MISMATCH)
        files.append(str(save_reproducer(folder, case, result, {})))
    return files


@pytest.mark.parametrize(("kind", "most_at_once"), [("cuda", gate_phases.CONFIRM_SIDE_BY_SIDE), ("cpu", 1)])
def test_confirmations_run_side_by_side_on_a_gpu_and_each_gets_its_own_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, most_at_once: int) -> None:
    files = _reproducers(tmp_path, 9)
    running, peak, lock = [0], [0], threading.Lock()

    def fake_rerun(case: Case, *_: object) -> Result:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return Result(case.case_id, case.backend, Outcome.PASS if case.seed % 2 else Outcome.MISMATCH)

    monkeypatch.setattr(gate_phases, "rerun_alone", fake_rerun)
    machine = Machine(Platform(kind), torch.device("cpu"), kind)
    results = gate_phases._rerun_alone_side_by_side(files, load_registry(), machine, ExecutionOptions())
    assert peak[0] == most_at_once
    assert list(results) == files
    for file, result in results.items():
        case = load_entry(Path(file)).case
        assert result.case_id == case.case_id
        assert result.outcome is (Outcome.PASS if case.seed % 2 else Outcome.MISMATCH)
