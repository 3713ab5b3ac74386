"""Reproducers: JSON + standalone script, replay and its expectations, signatures and dedup."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.identity import normalize_error, signature, signature_key
from hicache_fuzz.harness.findings.reproducer import judge_replay, save_reproducer
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.kernels.reference import ReferenceBackend
from tests._mutants import DeviceRowOffByOne, DropLastPage, cpu_run

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests._mutants:backends"
DROP_CLASS = "tests._mutants:DropLastPage"


def two_page_case(backend: str = "test-drop-last-page", **changes: object) -> Case:
    case = Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
                pools=(PoolSpec(heads=1, head_dim=8),), layers=2, page_size=4, device_rows=16, host_slots=12,
                host_indices=tuple(range(0, 8)), device_indices=tuple(range(4, 12)), backend=backend)
    return case.replace(**changes)


def run_script(script: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    case = two_page_case()
    return save_reproducer(tmp_path_factory.mktemp("corpus"), case, cpu_run(DropLastPage())(case),
                           backend_class=DROP_CLASS)


def test_layout_and_json_fields(saved: Path) -> None:
    data = json.loads(saved.read_text())
    assert saved.parent.name == data["signature"]
    assert saved.name == f"{Case.from_dict(data['case']).case_id}.json"
    assert data["signature_key"] == "test-drop-last-page|mismatch|missing"  # path | outcome | damage family
    assert data["variant"].startswith(data["signature"] + ".")
    assert (saved.parent / f"repro_{saved.stem}.py").exists()
    assert load_entry(saved).expect == "pass"


def test_script_embeds_the_case_as_json_and_reproduces(saved: Path) -> None:
    script = saved.parent / f"repro_{saved.stem}.py"
    text = script.read_text()
    embedded = re.search(r'CASE_JSON = r"""\n(.*?)\n"""', text, re.S)
    assert embedded is not None
    assert Case.from_dict(json.loads(embedded.group(1))) == load_entry(saved).case
    assert "pickle" not in text and "eval(" not in text
    done = run_script(script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAIL ") and "same as recorded" in done.stdout


def test_plugin_backend_without_class_asks_for_the_plugin(tmp_path: Path) -> None:
    case = two_page_case()
    path = save_reproducer(tmp_path, case, cpu_run(DropLastPage())(case))
    done = run_script(path.parent / f"repro_{path.stem}.py")
    assert done.returncode == 3 and "--backend-plugin" in done.stdout


def test_script_passes_when_the_backend_is_correct(tmp_path: Path) -> None:
    case = two_page_case()
    path = save_reproducer(tmp_path, case, cpu_run(DropLastPage())(case))
    fixed = path.parent / f"repro_{path.stem}.py"
    # Same case on the reference (a "fixed" backend): the script says PASS and exits 0.
    text = fixed.read_text().replace('"backend": "test-drop-last-page"', '"backend": "reference"')
    text = re.sub(r"BACKEND_CLASS = .*", "BACKEND_CLASS = 'hicache_fuzz.kernels.reference:ReferenceBackend'", text)
    fixed.write_text(text)
    done = run_script(fixed)
    assert done.returncode == 0 and done.stdout.startswith("PASS "), done.stdout + done.stderr


def test_replay_honours_expect_fail(tmp_path: Path) -> None:
    case = two_page_case()
    path = save_reproducer(tmp_path / "corpus", case, cpu_run(DropLastPage())(case))
    replay = ["replay", "--backend-plugin", PLUGIN, "--isolate", "no", str(tmp_path / "corpus")]
    assert main(replay) == 1  # an unmarked failure fails the replay
    data = json.loads(path.read_text())
    data["expect"] = "fail"
    path.write_text(json.dumps(data))
    assert main(replay) == 0  # known bug, same signature: expected
    data["case"]["backend"] = "reference"
    path.write_text(json.dumps(data))
    assert main(replay) == 1  # marked fail but passes (fixed?): needs a look


def test_judge_replay_verdicts() -> None:
    case = two_page_case()
    failing = cpu_run(DropLastPage())(case)
    sig = signature(failing, case)
    passing = Result(case.case_id, "reference", Outcome.PASS)
    assert judge_replay("pass", "", passing, case).label == "PASS"
    assert judge_replay("pass", "", failing, case).label == "FAIL"
    assert judge_replay("fail", sig, failing, case).ok
    assert judge_replay("fail", "other-signature", failing, case).label == "FAIL-OTHER"
    assert judge_replay("fail", sig, passing, case).label == "XPASS"


def test_same_bug_on_other_geometry_merges_different_bugs_split() -> None:
    drop = cpu_run(DropLastPage())
    a, b = two_page_case(), two_page_case(layers=3, page_size=2, host_indices=(4, 5, 0, 1), device_indices=(2, 3, 6, 7))
    assert signature(drop(a), a) == signature(drop(b), b)
    load = two_page_case(backend="test-device-off-by-one", direction=Direction.LOAD_BACK)
    shifted = cpu_run(DeviceRowOffByOne())(load)
    assert shifted.outcome.is_failure
    assert signature(shifted, load) != signature(drop(a), a)
    assert signature_key(drop(a), a).endswith("|missing")  # the dropped page was never written


def test_normalize_error_strips_numbers_addresses_paths() -> None:
    a = normalize_error("RuntimeError: host index 4097 out of range at 0x7f00aa in /tmp/x/y.cu")
    b = normalize_error("RuntimeError: host index 12 out of range at 0x1 in /home/z/w.cu\nsecond line")
    assert a == b == "RuntimeError: host index N out of range at ADDR in PATH"


def test_reference_is_clean_on_the_reproducer_case() -> None:
    case = two_page_case(backend="reference")
    assert cpu_run(ReferenceBackend())(case).outcome is Outcome.PASS


BLOCKER = "import runpy, sys; sys.modules.update({{name: None for name in {names!r}}}); " \
          "sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')"


@pytest.mark.parametrize(("blocked", "named"), [(("hicache_fuzz",), "hicache_fuzz is not importable"),
                                                (("torch",), "torch is not importable"),
                                                (("tests",), "the backend's module tests._mutants is not importable")])
def test_script_without_its_dependencies_exits_3_with_one_line(saved: Path, blocked: tuple[str, ...],
                                                                named: str) -> None:
    """The docstring promises 3 ("cannot run here"), not 1 ("bug present"), and one line, no traceback."""
    script = saved.parent / f"repro_{saved.stem}.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", BLOCKER.format(names=blocked), str(script)], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"SKIP {saved.stem}: cannot run here: {named}"), lines


def test_a_run_derived_crash_entry_replayed_with_another_crash_symptom_is_its_bug() -> None:
    """The rule of findings/known_crash.py for the corpus replay: an entry whose crash trigger was derived by
    running reproduces its bug with any crash; an entry without one needs its own identity."""
    path = ROOT / "corpus" / "sglang"
    derived = load_entry(path / "hicache-asym-token-major-page-first-direct-backup-invalid-argument.json")
    recorded = load_entry(path / "aot-page-head-12-byte-heads-misaligned-address.json")
    assert derived.any_crash_is_its_bug and not recorded.any_crash_is_its_bug
    segfault = Result(derived.case.case_id, derived.case.backend, Outcome.CRASH,
                      error="worker killed by signal SIGSEGV", summary="worker died")
    verdict = judge_replay("fail", derived.bug, segfault, derived.case, derived.any_crash_is_its_bug)
    assert verdict.ok and verdict.label == "XFAIL" and "another symptom" in verdict.detail
    other = Result(recorded.case.case_id, recorded.case.backend, Outcome.CRASH,
                   error="worker killed by signal SIGSEGV")
    assert judge_replay("fail", recorded.bug, other, recorded.case,
                        recorded.any_crash_is_its_bug).label == "FAIL-OTHER"
    mismatch = Result(derived.case.case_id, derived.case.backend, Outcome.MISMATCH)
    assert judge_replay("fail", derived.bug, mismatch, derived.case, True).label == "FAIL-OTHER"
