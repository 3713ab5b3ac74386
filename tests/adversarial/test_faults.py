"""Faults of the machine, injected: full or unwritable corpus and report paths, plugins that raise, workers
that cannot start or restart, allocations that fail. Each run must end with the documented exit code, say
why, and lose nothing it found (the failure is in the corpus, the report, a temporary file or stdout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hicache_fuzz.harness.commands.output import STDOUT_BEGIN, STDOUT_END
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from tests.adversarial.inputs import valid_case

FAILING = ["--backend-plugin", "tests._cli_plugin:backends", "--backend", "test-drops-last-page"]
REPO = Path(__file__).resolve().parents[2]


def _fallback_files(err: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"written to (\S+\.json)", err)]


def test_corpus_under_a_file_keeps_the_failure_and_stops(tmp_path: Path, cli: object,
                                                         block_after_check: Path) -> None:
    blocker = block_after_check  # a regular file appears where the corpus folder should be, after the check
    report = tmp_path / "report.json"
    ran = cli("fuzz", "--platform", "cpu", "--seed", "1", "--runs", "200", "--no-progress", *FAILING,  # type: ignore[operator]
              "--corpus", str(blocker / "corpus"), "--json", str(report))
    assert ran.code == 1, ran.err  # failures were found: that is what the exit code says first
    assert "storage fault, campaign stopped" in ran.err and "cannot write to the corpus" in ran.err
    data = json.loads(report.read_text())
    assert data["cases"] < 200  # stopped at the failure the corpus could not take
    [failure] = data["unique_failures"]
    [unsaved] = data["unsaved_reproducers"]
    assert unsaved["signature"] == failure["signature"] and unsaved["case"]["backend"] == "test-drops-last-page"
    flushed = _fallback_files(ran.err)
    assert flushed, ran.err
    try:
        assert load_entry(flushed[0]).signature == failure["signature"]  # a loadable reproducer, not a dump
    finally:
        for path in flushed:
            path.unlink()


def test_full_disk_prints_what_could_not_be_written(tmp_path: Path) -> None:
    """RLIMIT_FSIZE as a full disk: no file over 2 KB can be written, not even a temporary one; the report
    (with the failure's reproducer) comes out on stdout between markers."""
    wrapper = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048)); "
               "os.execv(sys.executable, [sys.executable, '-m', 'hicache_fuzz'] + sys.argv[1:])")
    done = subprocess.run(
        [sys.executable, "-c", wrapper, "fuzz", "--platform", "cpu", "--seed", "1", "--runs", "200", "--no-progress",
         *FAILING, "--corpus", str(tmp_path / "corpus"), "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "storage fault" in done.stderr and "it follows on stdout" in done.stderr
    printed = done.stdout.split(STDOUT_BEGIN, 1)[1].split(STDOUT_END, 1)[0]
    data = json.loads(printed)
    assert data["unique_failures"] and data["unsaved_reproducers"][0]["signature"] == \
        data["unique_failures"][0]["signature"]


def test_unwritable_json_report_goes_elsewhere_and_says_where(tmp_path: Path, cli: object,
                                                              block_after_check: Path) -> None:
    blocker = block_after_check  # checked fine at the start; under a regular file by the time it is written
    ran = cli("fuzz", "--platform", "cpu", "--seed", "2", "--runs", "30", "--no-progress",  # type: ignore[operator]
              "--corpus", str(tmp_path / "corpus"), "--json", str(blocker / "report.json"))
    assert ran.code == 3, ran.err  # a clean run whose report is not where it was asked: an environment fault
    [moved] = _fallback_files(ran.err)
    try:
        data = json.loads(moved.read_text())
        assert data["cases"] == 30 and "partial" not in data
        assert moved.stat().st_mode & 0o777 == 0o644
    finally:
        moved.unlink()


def test_reports_are_world_readable(tmp_path: Path, cli: object) -> None:
    report = tmp_path / "report.json"
    ran = cli("fuzz", "--platform", "cpu", "--seed", "2", "--runs", "5", "--no-progress",  # type: ignore[operator]
              "--corpus", str(tmp_path / "corpus"), "--json", str(report), "--record-case-ids")
    assert ran.code == 0, ran.err
    assert report.stat().st_mode & 0o777 == 0o644
    data = json.loads(report.read_text())
    assert len(data["case_ids"]) == 5 and len(set(data["case_ids"])) == 5  # --record-case-ids without --workers


@pytest.mark.parametrize(("plugin", "words"), [
    ("tests.adversarial._plugin_import_raises:backends", "dependency is broken"),
    ("tests.adversarial._bad_plugins:factory_raises", "plugin factory exploded"),
    ("tests.adversarial._bad_plugins:probe_raises", "probe could not open /dev/kfd"),
])
def test_plugin_that_raises_is_exit_3_with_the_reason(plugin: str, words: str, tmp_path: Path, cli: object) -> None:
    backend = ["--backend", "test-probe-raises"] if "probe" in plugin else []
    ran = cli("fuzz", "--platform", "cpu", "--runs", "3", "--no-progress", "--backend-plugin", plugin,  # type: ignore[operator]
              *backend, "--corpus", str(tmp_path / "corpus"))
    assert ran.code == 3, (ran.out, ran.err)
    assert words in ran.err and "Traceback" not in ran.err


def _failing_spawn(calls_that_work: int) -> object:
    real = WorkerExecutor._spawn
    calls = {"n": 0}

    def spawn(self: WorkerExecutor, warm_up: bool, role: str) -> subprocess.Popen[bytes]:
        calls["n"] += 1
        if calls["n"] <= calls_that_work:
            return real(self, warm_up, role)
        return subprocess.Popen([sys.executable, "-c", "import sys; print('no GPU for you', file=sys.stderr); "
                                 "sys.exit(7)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    return spawn


def test_worker_that_cannot_start_is_exit_3(tmp_path: Path, cli: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerExecutor, "_spawn", _failing_spawn(0))
    ran = cli("fuzz", "--platform", "cpu", "--runs", "3", "--isolate", "yes", "--no-progress",  # type: ignore[operator]
              "--corpus", str(tmp_path / "corpus"))
    assert ran.code == 3 and "worker did not start" in ran.err, ran.err


def test_worker_that_cannot_restart_stops_with_the_report_kept(tmp_path: Path, cli: object,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerExecutor, "_spawn", _failing_spawn(1))
    report = tmp_path / "report.json"
    ran = cli("fuzz", "--platform", "cpu", "--seed", "5", "--runs", "40", "--isolate", "yes", "--no-progress",  # type: ignore[operator]
              "--backend-plugin", "tests._worker_plugin:backends", "--backend", "test-abort",
              "--corpus", str(tmp_path / "corpus"), "--json", str(report))
    assert ran.code == 1, ran.err  # the crash before the failed restart is a finding
    assert "campaign stopped" in ran.err and "worker did not start" in ran.err
    data = json.loads(report.read_text())
    assert "worker did not start" in data["environment_error"]
    [crash] = data["unique_failures"]
    assert crash["outcome"] == "crash" and Path(crash["file"]).exists()


def test_crashes_that_run_clean_in_a_fresh_worker_are_flaky_not_new(tmp_path: Path, cli: object) -> None:
    """test-poison: some cases pass but poison their worker, and the next case there aborts. Each such crash runs
    clean in a fresh worker, so the campaign lists it as flaky, saves its reproducer, and exits 0 (as the gate's
    confirm phase judges a failure that passes when re-run alone)."""
    report = tmp_path / "report.json"
    ran = cli("fuzz", "--platform", "cpu", "--seed", "5", "--runs", "40", "--isolate", "yes", "--no-progress",  # type: ignore[operator]
              "--backend-plugin", "tests._worker_plugin:backends", "--backend", "test-poison",
              "--corpus", str(tmp_path / "corpus"), "--json", str(report))
    data = json.loads(report.read_text())
    assert ran.code == 0, ran.out + ran.err
    assert data["new_failure_signatures"] == [] and data["flaky_failure_signatures"]
    flaky = [f for f in data["unique_failures"] if f["flaky"]]
    assert flaky and all(f["outcome"] == "crash" and f["flaky"] == "pass" and Path(f["file"]).exists()
                         for f in flaky)
    assert {s["status"] for s in data["failure_status"]} == {"flaky"}
    assert "FLAKY" in ran.out


def test_allocation_failure_is_classified_not_a_traceback(tmp_path: Path, cli: object,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.kernels.buffers import HostMemory

    def refuse(self: HostMemory, nbytes: int, allocator: object) -> object:
        raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {nbytes} bytes")

    monkeypatch.setattr(HostMemory, "allocate", refuse)
    report = tmp_path / "report.json"
    ran = cli("fuzz", "--platform", "cpu", "--seed", "3", "--runs", "10", "--no-progress", "--isolate", "no",  # type: ignore[operator]
              "--corpus", str(tmp_path / "corpus"), "--json", str(report))
    assert ran.code == 0, ran.err
    outcomes = json.loads(report.read_text())["outcomes"]["reference"]
    assert outcomes.get("unsupported", 0) + outcomes.get("undefined", 0) + outcomes.get("rejected_as_predicted", 0) \
        == 10 and outcomes.get("unsupported", 0) > 0


def test_real_allocation_failure_in_replay_is_a_skip(tmp_path: Path) -> None:
    """A case under the size limit whose storages the allocator refuses (address space capped): exit 3."""
    case = valid_case()
    case.update(layers=4, device_rows=1 << 16, host_slots=1 << 16)
    case["pools"][0].update(heads=8, head_dim=128)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(case))
    # The cap: what the interpreter, torch and the harness map (a CUDA build of torch maps far more than a CPU
    # one, so it is measured, not assumed) plus 1 GiB; the case's storages and their copies need several GiB.
    probe = ("import torch, hicache_fuzz.harness.commands.cli, hicache_fuzz.harness.commands.replay; "
             "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmPeak:')))")
    mapped_kib = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                                    cwd=REPO, check=True).stdout.strip())
    cap = (mapped_kib << 10) + (1 << 30)
    wrapper = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
               "os.execv(sys.executable, [sys.executable, '-m', 'hicache_fuzz'] + sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", wrapper, "replay", "--isolate", "no", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 3 and "could not allocate" in done.stdout, (done.stdout, done.stderr)


def test_replay_with_isolation_leaves_no_journal(tmp_path: Path, cli: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    case = tmp_path / "case.json"
    case.write_text(json.dumps(valid_case()))
    ran = cli("replay", "--isolate", "yes", str(case))  # type: ignore[operator]
    assert ran.code == 0, ran.err
    assert not list(tmp_path.glob("hicache-fuzz-journal-*"))
