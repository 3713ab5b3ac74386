"""The standing worker pool (pipeline/standing.py, pipeline/standing_server.py, commands/workers.py) on the CPU.

A server keeps ready workers; a campaign's executor takes one (its pipes passed over the Unix socket) and drives it
as its own: a crash and a hang of a handed-over worker read exactly as with a worker the campaign started; a
worker whose sources changed (a "mutant" of the fake sglang's pool_host/base.py), of another MPS server or without
the campaign's backends is refused, and the campaign starts a fresh one; the server then follows the sources;
stopping leaves no process behind. Servers run in a temporary runtime folder, in a thread of this process or, for
the command line, as a process of their own; every process they start is checked gone (and killed by its pid if
not) at the end.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.pipeline import pool as pool_module
from hicache_fuzz.harness.pipeline.gpu_sharing import MPS_ENV
from hicache_fuzz.harness.pipeline.pool import WorkerPool, pool_sharing
from hicache_fuzz.harness.pipeline.standing import (
    MPS_PIPE_ENV,
    RUNTIME_ENV,
    SWITCH_ENV,
    key_env,
    pid_alive,
    socket_path,
    take,
    worker_key,
)
from hicache_fuzz.harness.pipeline.standing_server import ServerOptions, StandingServer
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from tests.pipeline.test_worker import PLUGIN, TESTS, case

READY_TIMEOUT_S = 120.0  # workers import torch: slow on a loaded two-core machine
FAKE_SGLANG = Path(TESTS) / "fake_sglang" / "sglang"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def processes_of(runtime: Path) -> list[int]:
    """Every process whose environment names `runtime` as the standing pool's folder: what these tests started."""
    marker = f"{RUNTIME_ENV}={runtime}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0") and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def kill_strays(runtime: Path) -> list[int]:
    """Kill (by pid) what is left of the processes these tests started; the pids that were left."""
    strays = processes_of(runtime)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return strays


def describe(pids: list[int]) -> str:
    """Each process's pid, parent, state and command line: what a "processes left running" failure shows."""
    lines = []
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid} (parent {stat[1]}, state {stat[0]}): {command.strip()}")
    return "; ".join(lines)


def worker_env(*paths: Path) -> dict[str, str]:
    """The workers' environment: the test backends' plugin (and `paths`) importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), TESTS, *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "run"
    monkeypatch.setenv(RUNTIME_ENV, str(folder))
    monkeypatch.setenv(SWITCH_ENV, "on")
    yield folder
    left = processes_of(folder)
    described = describe(left)
    assert not kill_strays(folder), f"processes left running: {described}"


@pytest.fixture
def standing(runtime: Path) -> Iterator[Callable[..., StandingServer]]:
    """Start a server in a thread of this process (its workers are processes) and wait for its workers; each is
    stopped at the end, and nothing it started may outlive it."""
    started: list[tuple[StandingServer, threading.Thread]] = []

    def start(count: int = 1, env: dict[str, str] | None = None,
              backends: tuple[str, ...] = ("reference", "test-abort", "test-sleep")) -> StandingServer:
        server = StandingServer(ServerOptions("cpu", list(backends), [PLUGIN], count, env=env or worker_env(),
                                              runtime=runtime, startup_timeout_s=READY_TIMEOUT_S))
        thread = threading.Thread(target=server.serve, name="test-standing-server", daemon=True)
        thread.start()
        started.append((server, thread))
        wait_until(lambda: len(server.status()["ready"]) >= count, f"{count} standing workers")
        return server

    try:
        yield start
    finally:
        for server, thread in started:
            server.request_stop(now=True)
            thread.join(timeout=60)
            assert not thread.is_alive(), "the server did not stop"
            assert not server.socket_path.exists() and not server.log_folder.exists()


def executor(tmp_path: Path, names: list[str], env: dict[str, str], timeout: float = 30.0) -> WorkerExecutor:
    return WorkerExecutor(names, [PLUGIN], "cpu", timeout, tmp_path / "journal", env=env, startup_timeout_s=120)


def test_a_handed_over_worker_runs_crashes_and_hangs_as_a_worker_of_its_own(
        standing: Callable[..., StandingServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = standing(count=2)
    ready = {w["pid"] for w in server.status()["ready"]}
    crashing, hanging = case("test-abort", 1), case("test-sleep", 1)
    with executor(tmp_path / "standing", ["test-abort", "test-sleep"], worker_env(), timeout=3.0) as ex:
        assert ex.run(case("test-abort", 0)).outcome is Outcome.PASS
        assert ex.hello["pid"] in ready and ex.hello["standing"] is True
        assert ex.standing_taken == 1 and ex.first_standing
        assert server.status()["serving"][0]["pid"] == ex.hello["pid"]
        crashed = ex.run(crashing)
        assert ex.run(case("test-abort", 2)).outcome is Outcome.PASS  # the next worker: standing or fresh
        hung = ex.run(hanging)
        figures = ex.worker_figures()
    log = (tmp_path / "standing" / "journal" / "worker.log").read_text()
    assert "from the standing pool" in log
    monkeypatch.setenv(SWITCH_ENV, "off")  # the same cases on workers of its own
    with executor(tmp_path / "own", ["test-abort", "test-sleep"], worker_env(), timeout=3.0) as own:
        own_crashed, own_hung = own.run(crashing), own.run(hanging)
        assert own.standing_taken == 0 and not own.first_standing
    assert crashed.outcome is own_crashed.outcome is Outcome.CRASH
    assert crashed.error.splitlines()[0] == own_crashed.error.splitlines()[0] == "worker killed by signal SIGABRT"
    assert signature(crashed, crashing) == signature(own_crashed, crashing)
    assert hung.outcome is own_hung.outcome is Outcome.HANG
    assert signature(hung, hanging) == signature(own_hung, hanging)
    assert figures is not None and figures.first_worker_standing and figures.standing_taken >= 1
    wait_until(lambda: not server.status()["serving"], "the handed-over workers' ends to be reported")
    assert server.status()["handed_over"] == figures.standing_taken


def test_a_changed_sglang_source_refuses_the_ready_workers_and_the_server_follows(
        standing: Callable[..., StandingServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of pool_host/base.py must never run on a worker that imported the original."""
    site = tmp_path / "site"
    shutil.copytree(FAKE_SGLANG, site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(site))  # where this process (the campaign's side) locates sglang
    importlib.invalidate_caches()
    env = worker_env(site)
    assert worker_key(sys.executable, "cpu", [PLUGIN], env)["sglang_files"].startswith(str(site / "sglang"))
    server = standing(count=1, env=env)
    (stale,) = [w["pid"] for w in server.status()["ready"]]
    base = site / "sglang" / "srt" / "mem_cache" / "pool_host" / "base.py"
    base.write_text(base.read_text().replace("return", "return  ", 1))  # a mutant of the same meaning
    with executor(tmp_path / "mutant", ["reference"], env) as ex:
        assert ex.run(case("reference", 0)).outcome is Outcome.PASS
        assert ex.standing_taken == 0 and ex.hello["pid"] != stale
        assert any("sglang_files" in note for note in ex.standing_notes), ex.standing_notes
    # The server sees the change (at the refusal, or its next look) and replaces its worker by one of the new sources.
    wait_until(lambda: server.status()["retired"] >= 1 and len(server.status()["ready"]) == 1,
               "a worker of the new sources")
    assert not pid_alive(stale)
    with executor(tmp_path / "after", ["reference"], env) as ex:
        assert ex.run(case("reference", 0)).outcome is Outcome.PASS
        assert ex.standing_taken == 1


def test_a_campaign_of_another_mps_server_or_backend_is_refused(standing: Callable[..., StandingServer]) -> None:
    server = standing(count=1)
    env = worker_env()
    other_mps = take(sys.executable, "cpu", ["reference"], [PLUGIN], {**env, MPS_PIPE_ENV: "/nowhere/mps"}, "first")
    assert other_mps.worker is None and "/nowhere/mps" in other_mps.note
    other_backend = take(sys.executable, "cpu", ["zoo-last-page-dropped"], [PLUGIN], env, "first")
    assert other_backend.worker is None and "did not probe zoo-last-page-dropped" in other_backend.note
    other_env = take(sys.executable, "cpu", ["reference"], [PLUGIN], {**env, "SGLANG_SOME_SWITCH": "1"}, "first")
    assert other_env.worker is None and "env" in other_env.note
    status = server.status()
    assert status["refused"] == 3 and status["handed_over"] == 0 and len(status["ready"]) == 1


def test_the_key_holds_what_changes_a_worker_and_nothing_the_campaign_alone_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(TESTS)  # the plugin's module, located as the campaign's process would
    env = {"SGLANG_X": "1", "FAKE_SGLANG_POOL_BUG": "b", "HICACHE_FUZZ_TORCH_THREADS": "2", "PYTHONPATH": "p",
           "CUDA_VISIBLE_DEVICES": "0", "HOME": "/h", "CUDA_MPS_PIPE_DIRECTORY": "/m", RUNTIME_ENV: "/r",
           SWITCH_ENV: "on", "HICACHE_FUZZ_PREBUILD": "no", "HICACHE_FUZZ_PROBE_CACHE": "off"}
    assert key_env(env) == {"CUDA_VISIBLE_DEVICES": "0", "FAKE_SGLANG_POOL_BUG": "b", "HICACHE_FUZZ_TORCH_THREADS": "2",
                            "PYTHONPATH": "p", "SGLANG_X": "1"}
    key = worker_key(sys.executable, "cuda", [PLUGIN], env)
    assert key["devices"] == "0" and key["python"] == os.path.abspath(sys.executable)
    assert "_worker_plugin.py" in key["plugins"]
    assert str(Path(TESTS).parent / "harness") in key["harness"]
    assert socket_path("cuda", env, Path("/r")) == Path("/r/workers-cuda-0.sock")
    assert socket_path("cpu", env, Path("/r")) == Path("/r/workers-cpu.sock")


def test_a_pool_on_cuda_joins_the_standing_pool_s_mps_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPS daemon belongs to the server: a pool that may take its workers joins it and never stops it."""
    server_env = {MPS_ENV[0]: "/srv/pipe", MPS_ENV[1]: "/srv/log"}
    answer: dict[str, object] = {"mode": "mps", "reason": "a private MPS server", "env": server_env}
    monkeypatch.setattr(pool_module, "server_sharing", lambda *args: answer)
    for requested in ("auto", "mps"):
        sharing = pool_sharing(requested, 2, {"platform_kind": "cuda"})
        assert sharing.mps and sharing.env == server_env and "standing pool" in sharing.reason
        assert sharing.worker_env({})[MPS_PIPE_ENV] == "/srv/pipe"
        sharing.stop()  # not the pool's daemon: nothing to stop
    assert pool_sharing("contexts", 2, {"platform_kind": "cuda"}).mode == "contexts"
    answer.update(mode="contexts", reason="asked for (--gpu-sharing contexts)", env={})
    follows = pool_sharing("auto", 2, {"platform_kind": "cuda"})
    assert follows.mode == "contexts" and "standing pool" in follows.reason


def test_a_pool_takes_its_members_from_the_standing_pool(standing: Callable[..., StandingServer],
                                                         tmp_path: Path) -> None:
    standing(count=2)
    cases = [case("reference", seed).replace(layers=1 + seed % 3) for seed in range(6)]
    with WorkerPool(2, ["reference"], tmp_path, plugins=[PLUGIN], env=worker_env()) as pool:
        pool.start()
        wait_until(lambda: len(pool._ready_members()) == 2, "the second member")
        results = pool.run_batch(cases)
        figures = pool.worker_figures()
    assert [r.outcome for r in results] == [Outcome.PASS] * len(cases)
    assert figures.standing_taken == 2 and figures.first_worker_standing


def run_cli(*words: str, env: dict[str, str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hicache_fuzz", *words], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_workers_options_that_belong_to_another_action_are_bad_usage(runtime: Path) -> None:
    from hicache_fuzz.harness.commands.cli import main

    for words in (["status", "--count", "2"], ["stop", "--backend", "reference"], ["start", "--now"],
                  ["stop", "--json", "x.json"], ["status", "--foreground"]):
        assert main(["workers", *words, "--platform", "cpu"]) == 2, words
    assert main(["workers", "status", "--platform", "cpu"]) == 3  # no server here
    assert main(["workers", "stop", "--platform", "cpu"]) == 0  # nothing to stop


@pytest.mark.slow  # three commands and two campaigns in processes of their own (~30 s on two cores)
def test_workers_start_a_campaign_takes_them_and_stop_leaves_nothing(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    env = {**worker_env(), RUNTIME_ENV: str(runtime), SWITCH_ENV: "on"}
    plugin = ["--backend-plugin", PLUGIN]
    # seed 1: the third case's seed is odd, so test-abort kills its worker there
    campaign = ["fuzz", "--platform", "cpu", *plugin, "--backend", "test-abort", "--runs", "4", "--seed", "1",
                "--no-progress"]
    try:
        started = run_cli("workers", "start", "--platform", "cpu", "--count", "2", *plugin, "--backend", "reference",
                          "--backend", "test-abort", "--wait", str(READY_TIMEOUT_S), env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "2 ready of 2" in started.stdout
        status = run_cli("workers", "status", "--platform", "cpu", "--json", str(tmp_path / "status.json"), env=env)
        assert status.returncode == 0, status.stderr
        server = json.loads((tmp_path / "status.json").read_text())
        assert Path(server["socket"]) == runtime / "workers-cpu.sock"
        taking = run_cli(*campaign, "--corpus", str(tmp_path / "c1"), "--json", str(tmp_path / "standing.json"),
                         env=env)
        own = run_cli(*campaign, "--corpus", str(tmp_path / "c2"), "--json", str(tmp_path / "own.json"),
                      env={**env, SWITCH_ENV: "off"})
        assert taking.returncode == own.returncode == 1, taking.stdout + taking.stderr + own.stdout + own.stderr
        assert "from the standing pool" in taking.stdout
        reports = [json.loads((tmp_path / name).read_text()) for name in ("standing.json", "own.json")]
        assert reports[0]["startup"]["standing_pool"]["first_worker"] is True
        assert reports[0]["startup"]["standing_pool"]["workers_taken"] >= 1
        assert reports[1]["startup"]["standing_pool"] == {"first_worker": False, "workers_taken": 0, "not_taken": []}
        failures = [sorted((f["signature"], f["count"]) for f in report["unique_failures"]) for report in reports]
        assert failures[0] == failures[1] and failures[0], failures
        assert all("-crash-" in name for name, _ in failures[0])
        stopped = run_cli("workers", "stop", "--platform", "cpu", env=env, timeout=120)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not pid_alive(server["pid"]) and not (runtime / "workers-cpu.sock").exists()
        left = processes_of(runtime)
        assert left == [], describe(left)
        assert run_cli("workers", "status", "--platform", "cpu", env=env).returncode == 3
    finally:
        described = describe(processes_of(runtime))
        assert not kill_strays(runtime), f"processes left running: {described}"
