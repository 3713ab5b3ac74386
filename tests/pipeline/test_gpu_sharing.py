"""GPU sharing (pipeline/gpu_sharing.py) on the CPU: the private MPS daemon's life against a stand-in for
nvidia-cuda-mps-control, the reasons MPS is not used, and the fall-back when a batch is lost under MPS (a case
that dies only as an MPS client is collateral, one that dies alone is the CRASH)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline import gpu_sharing
from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharing, GpuSharingUnavailable, start_gpu_sharing
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor
from tests.pipeline.test_worker import PLUGIN, case, env

# A stand-in control tool: `-d` records the start; commands on stdin record themselves; get_server_list
# prints a pid once start_server was sent (unless NO_SERVER is set).
FAKE_CONTROL = """#!/bin/sh
log="$CUDA_MPS_LOG_DIRECTORY/calls"
if [ "$1" = "-d" ]; then echo daemon >> "$log"; exit ${DAEMON_RC:-0}; fi
while read -r line; do
  echo "$line" >> "$log"
  case "$line" in
    start_server*) [ -z "$NO_SERVER" ] && touch "$CUDA_MPS_LOG_DIRECTORY/server" ;;
    get_server_list) [ -f "$CUDA_MPS_LOG_DIRECTORY/server" ] && echo 4242 ;;
  esac
done
exit 0
"""


@pytest.fixture
def fake_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / gpu_sharing.MPS_CONTROL
    tool.write_text(FAKE_CONTROL)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    for name in gpu_sharing.MPS_ENV:
        monkeypatch.delenv(name, raising=False)
    return folder


def test_auto_on_cuda_starts_a_private_daemon_and_stops_it(fake_control: Path) -> None:
    sharing = start_gpu_sharing("auto", "cuda", 6)
    assert sharing.mps, sharing.reason
    pipe, log = (Path(sharing.env[name]) for name in gpu_sharing.MPS_ENV)
    assert pipe.is_dir() and log.is_dir() and "hicache-fuzz-mps-" in str(pipe)
    worker_env = sharing.worker_env({"KEEP": "1"})
    assert worker_env["KEEP"] == "1" and worker_env[gpu_sharing.MPS_ENV[0]] == str(pipe)
    calls = (log / "calls").read_text().split("\n")
    assert calls[0] == "daemon" and calls[1].startswith("start_server -uid ") and "get_server_list" in calls
    folder = pipe.parent
    sharing.stop()
    assert not folder.exists()  # quit was sent (to the daemon of that folder), and the folder removed
    sharing.stop()  # idempotent


def test_mps_is_not_used_where_it_cannot_help_or_run(fake_control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "rocm platform has no MPS" in start_gpu_sharing("auto", "rocm", 6).reason
    assert "one worker process" in start_gpu_sharing("auto", "cuda", 1).reason
    assert start_gpu_sharing("contexts", "cuda", 6).mode == "contexts"
    monkeypatch.setenv("NO_SERVER", "1")
    monkeypatch.setattr(gpu_sharing, "SERVER_START_TIMEOUT_S", 0.3)
    failed = start_gpu_sharing("auto", "cuda", 6)
    assert failed.mode == "contexts" and "server did not start" in failed.reason
    with pytest.raises(GpuSharingUnavailable, match="server did not start"):
        start_gpu_sharing("mps", "cuda", 6)
    monkeypatch.delenv("NO_SERVER")
    monkeypatch.setenv("DAEMON_RC", "3")
    assert "exited 3" in start_gpu_sharing("auto", "cuda", 6).reason
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not on PATH" in start_gpu_sharing("auto", "cuda", 6).reason
    with pytest.raises(GpuSharingUnavailable, match="not on PATH"):
        start_gpu_sharing("mps", "cuda", 6)
    with pytest.raises(ValueError, match="--gpu-sharing"):
        start_gpu_sharing("always", "cuda", 6)


def test_a_sites_mps_is_used_as_it_is(fake_control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_sharing.MPS_ENV[0], "/site/pipe")
    sharing = start_gpu_sharing("auto", "cuda", 6)
    assert sharing.mps and "site" in sharing.reason and not sharing.env
    sharing.stop()  # nothing of ours to stop
    assert sharing.fall_back("a batch was lost")
    assert gpu_sharing.MPS_ENV[0] not in sharing.worker_env()  # fallen back: the site's server is left too


def test_fall_back_happens_once_and_changes_the_workers_environment() -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: "/x"})
    assert sharing.worker_env({})[gpu_sharing.MPS_ENV[0]] == "/x"
    assert sharing.fall_back("first\nsecond line") and not sharing.fall_back("again")
    assert sharing.fell_back == "first" and sharing.generation == 1
    assert gpu_sharing.MPS_ENV[0] not in sharing.worker_env({gpu_sharing.MPS_ENV[0]: "/x"})
    assert sharing.to_dict()["mode"] == "contexts"


def test_only_a_launch_the_driver_refused_is_taken_for_a_client_local_loss() -> None:
    assert not gpu_sharing.spreads("device error escaped the case: RuntimeError: Failed at hicache.cuh:474: "
                                   "CUDA error: invalid argument\nmore")
    assert not gpu_sharing.spreads("CUDA error: invalid configuration argument")
    assert gpu_sharing.spreads("device error escaped the case: AcceleratorError: CUDA error: an illegal memory "
                               "access was encountered")
    assert gpu_sharing.spreads("worker killed by signal SIGABRT\n--- worker log tail ---\ninvalid argument")
    assert gpu_sharing.spreads("")


def mps_executor(tmp_path: Path, sharing: GpuSharing) -> WorkerExecutor:
    return WorkerExecutor(["test-mps-collateral"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                          startup_timeout_s=120, sharing=sharing)


def test_a_batch_lost_under_mps_to_a_case_clean_alone_is_collateral(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    cases = [case("test-mps-collateral", seed) for seed in (0, 1, 2)]
    with mps_executor(tmp_path, sharing) as ex:
        results = ex.run_batch(cases)
        assert ex.batch_losses == 1
        after = ex.run(case("test-mps-collateral", 1))  # a plain context now: it runs clean
    assert [r.outcome for r in results] == [Outcome.PASS] * 3  # seed 1 was the other client's collateral
    assert sharing.mode == "contexts" and sharing.fell_back and "lost its worker" in sharing.fell_back
    assert [c.case_id for c in sharing.collateral] == [cases[1].case_id]
    assert Path(sharing.collateral[0].saved_batch).exists()  # the batch is kept for the record
    assert after.outcome is Outcome.PASS


def test_a_case_that_dies_alone_too_is_still_the_crash(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with mps_executor(tmp_path, sharing) as ex:
        results = ex.run_batch([case("test-mps-collateral", seed) for seed in (0, 3, 2)])
        lone = ex.run(case("test-mps-collateral", 3))
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS]
    assert lone.outcome is Outcome.CRASH and not sharing.collateral and sharing.fell_back


def test_a_lone_case_lost_under_mps_is_run_again_on_a_context(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with mps_executor(tmp_path, sharing) as ex:
        result = ex.run(case("test-mps-collateral", 1))
    assert result.outcome is Outcome.PASS and len(sharing.collateral) == 1 and sharing.mode == "contexts"


def test_a_launch_the_driver_refused_costs_its_worker_only(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with mps_executor(tmp_path, sharing) as ex:
        results = ex.run_batch([case("test-mps-collateral", seed) for seed in (0, 5, 2)])
        lone = ex.run(case("test-mps-collateral", 5))
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS]
    assert lone.outcome is Outcome.CRASH and "invalid argument" in (lone.error or "")
    assert sharing.mps and sharing.fell_back is None and not sharing.collateral


def test_a_worker_that_cannot_start_as_an_mps_client_starts_on_a_context(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with WorkerExecutor(["test-mps-startup"], ["_mps_startup_plugin:backends"], "cpu", 30.0, tmp_path / "journal",
                        env=env(), startup_timeout_s=120, sharing=sharing) as ex:
        result = ex.run(case("test-mps-startup", 0))
    assert result.outcome is Outcome.PASS
    assert sharing.mode == "contexts" and "did not start as an MPS client" in (sharing.fell_back or "")


def test_a_worker_that_cannot_start_on_a_context_either_is_an_error(tmp_path: Path) -> None:
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with WorkerExecutor(["no-such-backend"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, sharing=sharing) as ex, pytest.raises(WorkerError):
        ex.run(case("no-such-backend", 0))
    assert sharing.mode == "contexts"  # it left MPS on the way, then the plain start failed as well


def test_under_mps_the_spare_is_a_plain_context_and_takes_over_after_the_fall_back(tmp_path: Path) -> None:
    """A fault that spreads reaches every MPS client at once: a spare that was a client too would be replaced by
    a worker still starting. A plain-context spare takes over at once, and runs what aborts MPS clients."""
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with WorkerExecutor(["test-mps-collateral"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, sharing=sharing, spares=1) as ex:
        results = ex.run_batch([case("test-mps-collateral", seed) for seed in (0, 1, 2)])
        assert sharing.mode == "contexts" and ex.spares_used == 1  # the spare was not replaced as stale
        assert ex.run(case("test-mps-collateral", 1)).outcome is Outcome.PASS
    assert [r.outcome for r in results] == [Outcome.PASS] * 3 and len(sharing.collateral) == 1


def test_a_plain_spare_that_took_over_under_mps_is_not_a_client(tmp_path: Path) -> None:
    """After a launch the driver refused (its worker only), the plain spare runs on: the pool stays under MPS,
    and that worker's own crash is not taken for another client's fault."""
    sharing = GpuSharing("mps", "test", {gpu_sharing.MPS_ENV[0]: str(tmp_path / "no-such-pipe")})
    with WorkerExecutor(["test-mps-collateral"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env(),
                        startup_timeout_s=120, sharing=sharing, spares=1) as ex:
        refused = ex.run_batch([case("test-mps-collateral", seed) for seed in (0, 5, 2)])
        used = ex.spares_used
        crash = ex.run(case("test-mps-collateral", 3))  # aborts on any context
    assert [r.outcome for r in refused] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS]
    assert crash.outcome is Outcome.CRASH and sharing.mps and sharing.fell_back is None
    assert used >= 1 and not sharing.collateral
