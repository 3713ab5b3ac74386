"""WorkerExecutor: results come back, crashes and hangs become CRASH/HANG with the case saved, and the
worker restarts so the campaign goes on. CPU only; the misbehaving backends live in tests/_worker_plugin.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.json_input import InputError
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor

TESTS = str(Path(__file__).resolve().parents[1])  # where _worker_plugin.py lives
PLUGIN = "_worker_plugin:backends"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = TESTS + os.pathsep + e.get("PYTHONPATH", "")
    return e


def case(backend: str, seed: int) -> Case:
    return Case(
        direction=Direction.WRITE_BACK,
        scope=Scope.ALL_LAYERS,
        layout=HostLayout.LAYER_FIRST,
        pools=(PoolSpec(head_dim=8),),
        layers=2,
        page_size=1,
        device_rows=8,
        host_slots=8,
        host_indices=(0, 3),
        device_indices=(2, 5),
        backend=backend,
        seed=seed,
    )


def executor(tmp_path: Path, names: list[str], timeout: float = 30.0) -> WorkerExecutor:
    return WorkerExecutor(names, [PLUGIN], "cpu", timeout, tmp_path / "journal", env=env(), startup_timeout_s=120)


def test_results_come_back(tmp_path: Path) -> None:
    with executor(tmp_path, ["reference"]) as ex:
        for seed in range(3):
            result = ex.run(case("reference", seed))
            assert result.outcome is Outcome.PASS, result.summary
        assert ex.started == 1
    assert not list((tmp_path / "journal" / "inflight").iterdir())


def test_abort_becomes_crash_and_worker_restarts(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-abort"]) as ex:
        assert ex.run(case("test-abort", 0)).outcome is Outcome.PASS
        crashed = case("test-abort", 1)
        result = ex.run(crashed)
        assert result.outcome is Outcome.CRASH
        assert "SIGABRT" in result.error
        saved = tmp_path / "journal" / "crashes" / f"{crashed.case_id}.json"
        assert Case.from_json(saved.read_text()) == crashed
        assert ex.run(case("test-abort", 2)).outcome is Outcome.PASS  # restarted, campaign goes on
        # the worker had run a case before it died: the case ran again in a fresh worker (died there too), and
        # the next case needed another
        assert ex.restarts == 2 and ex.replayed == 1


def test_a_death_after_other_cases_is_named_by_the_case_in_a_fresh_worker(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-long-lived"]) as ex:
        # one bug, two symptoms: it aborts a worker that ran a case before it, and alone raises a CUDA error
        assert ex.run(case("test-long-lived", 0)).outcome is Outcome.PASS
        result = ex.run(case("test-long-lived", 9))
        assert result.outcome is Outcome.CRASH and "CUDA error: invalid argument" in (result.error or "")
        assert "SIGABRT" not in (result.error or "") and ex.replayed == 1
        # an innocent case after one that corrupted the process: reported (nothing lost), and said to run clean
        assert ex.run(case("test-long-lived", 7)).outcome is Outcome.PASS
        victim = ex.run(case("test-long-lived", 0))
        assert victim.outcome is Outcome.CRASH and "SIGABRT" in (victim.error or "")
        assert "in a fresh worker it ran pass" in victim.summary
        assert ex.replayed == 2
        # what its worker ran before it, the culprit last: replayable by hand
        assert [c["seed"] for c in victim.diff["worker_history"]] == [7]  # seed 9 ended the worker before
        # the first case of a fresh worker is its own evidence: not replayed
        ex._kill()
        assert ex.run(case("test-long-lived", 9)).outcome is Outcome.CRASH
        assert ex.replayed == 2


def test_a_death_in_a_batchs_replay_is_named_in_a_fresh_worker(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-long-lived"]) as ex:
        # the batch dies at case 9 (after case 1); replayed alone, case 9 raises its CUDA error and case 7
        # passes but poisons the worker, so case 2 dies there: run once more in a fresh worker, it passes
        results = ex.run_batch([case("test-long-lived", s) for s in (1, 9, 7, 2)])
        assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS, Outcome.CRASH]
        assert "CUDA error: invalid argument" in (results[1].error or "")
        assert "in a fresh worker it ran pass" in results[3].summary
        assert [c["seed"] for c in results[3].diff["worker_history"]] == [7]


def test_a_batch_lost_after_a_poisoning_case_is_flaky_with_the_culprit_in_its_history(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-poison"]) as ex:
        # seed 4 passes and poisons the worker, seed 1 then dies in the batch; alone, in a fresh worker, it passes
        results = ex.run_batch([case("test-poison", s) for s in (4, 1)])
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH]
    assert results[1].flaky and [c["seed"] for c in results[1].diff["worker_history"]] == [4]


def test_a_flaky_crashs_history_replays_the_crash_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flaky crash's reproducer holds its worker's history; written out as numbered case files, `replay`
    runs them in order in one worker and the crash comes back at the last; the last case alone passes."""
    from hicache_fuzz.harness.commands.cli import main
    from hicache_fuzz.harness.findings.history import write_history
    from hicache_fuzz.harness.findings.reproducer import save_reproducer

    with executor(tmp_path, ["test-poison"]) as ex:
        victim = ex.run_batch([case("test-poison", s) for s in (4, 1)])[1]
    saved = save_reproducer(tmp_path / "corpus", case("test-poison", 1), victim)
    folder = tmp_path / "history"
    paths = write_history(saved, folder)
    assert [p.name[:3] for p in paths] == ["00-", "01-"] and paths[-1].name.endswith(f"{victim.case_id}.json")
    monkeypatch.chdir(Path(TESTS).parent)  # the replay's worker imports the test plugin from the checkout
    replay = ["replay", "--platform", "cpu", "--isolate", "yes", "--backend-plugin", "tests._worker_plugin:backends"]
    assert main([*replay, str(folder)]) == 1  # the sequence crashes the worker at the last case
    assert main([*replay, str(paths[-1])]) == 0  # alone it passes
    with pytest.raises(InputError, match="worker_history"):
        write_history(_without_history(tmp_path), folder)


def _without_history(tmp_path: Path) -> Path:
    from hicache_fuzz.harness.findings.reproducer import save_reproducer

    passing = case("test-poison", 1)
    return save_reproducer(tmp_path / "plain", passing, Result(passing.case_id, passing.backend, Outcome.CRASH))


def test_sleep_becomes_hang(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-sleep"], timeout=3.0) as ex:
        hung = case("test-sleep", 1)
        result = ex.run(hung)
        assert result.outcome is Outcome.HANG
        assert (tmp_path / "journal" / "hangs" / f"{hung.case_id}.json").exists()
        assert ex.run(case("test-sleep", 0)).outcome is Outcome.PASS


def test_write_ahead_file_exists_while_running(tmp_path: Path) -> None:
    # The case is on disk before the worker sees it: check the file a hanging case leaves in inflight/
    # by looking while it runs (the hang result then moves it).
    with executor(tmp_path, ["test-sleep"], timeout=2.0) as ex:
        hung = case("test-sleep", 3)
        ex.run(hung)
        data = json.loads((tmp_path / "journal" / "hangs" / f"{hung.case_id}.json").read_text())
        assert data["backend"] == "test-sleep"


def test_unknown_backend_fails_startup(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="unknown backend"), executor(tmp_path, ["no-such-backend"]) as ex:
        ex.run(case("reference", 0))


def test_worker_stdout_noise_does_not_break_protocol(tmp_path: Path) -> None:
    # Backends print (sglang, nvcc); the worker redirects fd 1 so the JSON channel stays clean.
    plugin = tmp_path / "noisy_plugin.py"
    plugin.write_text(
        "import os\nfrom hicache_fuzz.kernels.reference import ReferenceBackend\n"
        "class Noisy(ReferenceBackend):\n    name = 'test-noisy'\n"
        "    def run(self, buffers):\n        print('noise'); os.write(1, b'raw noise\\n')\n"
        "        return super().run(buffers)\n"
    )
    e = env()
    e["PYTHONPATH"] = str(tmp_path) + os.pathsep + e["PYTHONPATH"]
    with WorkerExecutor(["test-noisy"], ["noisy_plugin:Noisy"], "cpu", 30, tmp_path / "j", env=e) as ex:
        result = ex.run(case("test-noisy", 0))
        assert result.outcome is Outcome.UNEXPECTED_PATH or result.outcome is Outcome.PASS
    assert "noise" in (tmp_path / "j" / "worker.log").read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="signals and process groups: Linux only")
def test_close_is_idempotent(tmp_path: Path) -> None:
    ex = executor(tmp_path, ["reference"])
    ex.run(case("reference", 0))
    ex.close()
    ex.close()


def test_device_error_escaping_the_runner_becomes_crash(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-device-error"]) as ex:
        bad = case("test-device-error", 1)
        result = ex.run(bad)
        assert result.outcome is Outcome.CRASH
        assert "CUDA error" in result.error
        assert (tmp_path / "journal" / "crashes" / f"{bad.case_id}.json").exists()
        assert ex.run(case("test-device-error", 0)).outcome is Outcome.PASS
        assert ex.restarts == 1


def test_spare_worker_takes_over_after_a_crash(tmp_path: Path) -> None:
    with WorkerExecutor(["test-abort"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, spares=1) as ex:
        assert ex.run(case("test-abort", 0)).outcome is Outcome.PASS
        first_pid = ex.hello["pid"]
        # the greeting says where the worker's start-up went (the report's start-up record shows it)
        assert set(ex.hello["startup_s"]) == {"import", "probe", "warm_up"}
        assert all(seconds >= 0 for seconds in ex.hello["startup_s"].values())
        # one torch intra-op thread per worker: the workers of a pool share the cores (they never set it before)
        assert ex.hello["torch_threads"] == 1
        crashed = case("test-abort", 1)
        assert ex.run(crashed).outcome is Outcome.CRASH
        assert (tmp_path / "journal" / "crashes" / f"{crashed.case_id}.json").exists()
        assert ex.run(case("test-abort", 2)).outcome is Outcome.PASS
        # the crash's replay in a fresh worker took the spare, the next case the spare started behind it
        assert ex.spares_used == 2 and ex.restarts == 2
        assert ex.hello["pid"] != first_pid
        assert len(ex._spares) == 1
        spare = ex._spares[0][0]
        assert spare.poll() is None  # a new spare waits behind the new worker
    assert spare.poll() is not None  # close() stops the spares too


def test_dead_spare_is_replaced_by_a_fresh_start(tmp_path: Path) -> None:
    with WorkerExecutor(["test-abort"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, spares=1) as ex:
        assert ex.run(case("test-abort", 0)).outcome is Outcome.PASS
        assert len(ex._spares) == 1
        ex._spares[0][0].kill()
        ex._spares[0][0].wait()
        assert ex.run(case("test-abort", 1)).outcome is Outcome.CRASH
        assert ex.run(case("test-abort", 2)).outcome is Outcome.PASS
        # the crash's replay started afresh (its spare was dead); the next case took the spare started after it
        assert ex.spares_used == 1 and ex.restarts == 2


def test_two_spares_serve_two_crashes_in_a_row(tmp_path: Path) -> None:
    with WorkerExecutor(["test-abort"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, spares=2) as ex:
        assert ex.run(case("test-abort", 0)).outcome is Outcome.PASS
        assert ex.run(case("test-abort", 1)).outcome is Outcome.CRASH
        assert ex.run(case("test-abort", 1)).outcome is Outcome.CRASH
        assert ex.run(case("test-abort", 2)).outcome is Outcome.PASS
        # three restarts, each served by a spare: the first crash's replay in a fresh worker, the second crash
        # (the first case of its worker, so not replayed), the next case
        assert ex.spares_used == 3 and ex.restarts == 3 and len(ex._spares) == 2


def test_modules_built_inside_cases_are_attributed(tmp_path: Path) -> None:
    with executor(tmp_path, ["test-compile"]) as ex:
        for seed in (1, 2, 1):
            assert ex.run(case("test-compile", seed)).outcome is Outcome.PASS
        assert ex.compiled_in_cases == {"fake_module(element_size=1)": (1, 0.25),
                                        "fake_module(element_size=2)": (1, 0.25)}
        assert ex.compile_seconds == 0.5


def test_a_worker_spawned_early_serves_the_first_case_and_closes_cleanly(tmp_path: Path) -> None:
    """fuzz launches the worker before its own probes (start-up overlaps); the first case uses that worker."""
    with WorkerExecutor(["reference"], journal_dir=tmp_path) as ex:
        ex.spawn_early()
        assert ex.started == 0  # launched, greeting not yet read
        assert ex.run(case("reference", 1)).outcome is Outcome.PASS
        assert (ex.started, ex.restarts) == (1, 0)
    unused = WorkerExecutor(["reference"], journal_dir=tmp_path / "unused")
    unused.spawn_early()
    early = unused._early
    assert early is not None
    unused.close()  # never used: killed, not left running
    assert early.poll() is not None
