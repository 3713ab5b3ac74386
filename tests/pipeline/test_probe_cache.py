"""The probe cache (harness/pipeline/probe_cache.py): a second probe in the same machine state is read from disk,
a changed state misses, a malformed entry is ignored and rewritten, probes run concurrently, a cached 'available'
contradicted where the backend runs fails loudly, and replay probes only its cases' backends. CPU only; the
backends live in tests/_probe_plugin.py."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.replay import replay_entries
from hicache_fuzz.harness.findings.corpus import CorpusEntry
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.exit_codes import Unavailable
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.pipeline import probe_cache
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, auto_backends, probe, probing_record
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor
from hicache_fuzz.kernels.base import Availability
from hicache_fuzz.kernels.registry import Registry, load_registry

TESTS = str(Path(__file__).resolve().parents[1])  # where _probe_plugin.py lives
PLUGIN = "_probe_plugin:backends"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(probe_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(probe_cache.SWITCH_ENV, "on")
    monkeypatch.syspath_prepend(TESTS)
    probe_cache.forget_state()
    plugin = importlib.import_module("_probe_plugin")
    plugin.CALLS.clear()
    yield tmp_path / "cache" / "probes"
    probe_cache.forget_state()


def registry() -> Registry:
    return load_registry([PLUGIN])


def calls(name: str) -> int:
    return int(importlib.import_module("_probe_plugin").CALLS.get(name, 0))


def case(backend: str) -> Case:
    return Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
                pools=(PoolSpec(head_dim=8),), layers=2, page_size=1, device_rows=8, host_slots=8,
                host_indices=(0, 3), device_indices=(2, 5), backend=backend, seed=1)


def test_second_probe_hits_the_cache(cache: Path) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-count")
    first = probe_cache.probe(backend, machine)
    second = probe_cache.probe(backend, machine)
    assert (first.source, second.source) == ("measured", "cached")
    assert second.availability == first.availability == Availability(True, "counted")
    assert calls("test-probe-count") == 1
    assert len(list(cache.glob("*.json"))) == 1


def test_a_changed_machine_state_misses(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-count")
    # an sglang package on the path: a changed Python file (its mtime and size) is another state
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    module = package / "__init__.py"
    module.write_text("")
    kernel = package / "transfer.cuh"
    kernel.write_text("template <int N> struct K {};")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    probe_cache.forget_state()
    assert probe_cache.probe(backend, machine).source == "measured"
    probe_cache.forget_state()
    assert probe_cache.probe(backend, machine).source == "cached"
    # a kernel source is compiled when a case needs it, never read by a probe: a kernel change keeps the answers
    kernel.write_text("template <int N> struct K { int x; };")
    probe_cache.forget_state()
    assert probe_cache.probe(backend, machine).source == "cached"
    module.write_text("VERSION = 2\n")
    probe_cache.forget_state()
    assert probe_cache.probe(backend, machine).source == "measured"
    monkeypatch.setattr(probe_cache, "_torch_build", lambda: "another torch")
    probe_cache.forget_state()
    assert probe_cache.probe(backend, machine).source == "measured"
    assert calls("test-probe-count") == 3


def test_a_malformed_entry_is_ignored_and_rewritten(cache: Path) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-count")
    probe_cache.probe(backend, machine)
    (entry,) = cache.glob("*.json")
    for garbage in ("{not json", json.dumps({"format": 1, "key": {}, "available": True, "reason": "forged"})):
        entry.write_text(garbage)
        assert probe_cache.probe(backend, machine).source == "measured"
        assert json.loads(entry.read_text())["reason"] == "counted"
    assert probe_cache.probe(backend, machine).source == "cached"


def test_probes_run_concurrently(cache: Path) -> None:
    machine = require("cpu")
    chosen = [registry().get("test-probe-count"), registry().get("test-probe-other")]
    together = threading.Barrier(2, timeout=10)  # breaks (and the probe raises) unless both wait at once

    def waiting(backend, machine):  # type: ignore[no-untyped-def]
        together.wait()
        return probe_cache.probe(backend, machine)

    found = probe_cache.probe_all(chosen, machine, probe_one=waiting)
    assert all(isinstance(p, probe_cache.Probed) and p.availability.available for p in found.values())


def test_the_probing_record_names_the_source(cache: Path) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-other")
    probe(backend, machine)
    assert probing_record()["backends"]["test-probe-other"] == "measured"
    probe(backend, machine)
    assert probing_record()["backends"]["test-probe-other"] == "cached"


def test_a_cached_available_contradicted_by_the_worker_fails_loudly(cache: Path, tmp_path: Path) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-gated")
    probe_cache.probe(backend, machine)
    assert probe_cache.probe(backend, machine).source == "cached"  # the run trusts the entry...
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""), TEST_PROBE_CLOSED="1")
    with WorkerExecutor(["test-probe-gated"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env,
                        startup_timeout_s=120) as worker, pytest.raises(WorkerError, match="probe cache"):
        worker.start()  # ...and the worker, whose own probe says unavailable, refuses it
    assert not list(cache.glob("*.json"))  # the entry is gone: the next run probes


def test_a_cached_unavailable_that_a_worker_finds_available_is_dropped(cache: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    machine, backend = require("cpu"), registry().get("test-probe-gated")
    monkeypatch.setenv("TEST_PROBE_CLOSED", "1")
    probe_cache.probe(backend, machine)
    assert not probe_cache.probe(backend, machine).availability.available  # cached: unavailable
    monkeypatch.delenv("TEST_PROBE_CLOSED")
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with WorkerExecutor(["test-probe-gated"], [PLUGIN], "cpu", 30.0, tmp_path / "journal", env=env,
                        startup_timeout_s=120) as worker:
        worker.start()  # no error: this run simply went without the backend
    assert not list(cache.glob("*.json"))
    assert probe_cache.probe(backend, machine).source == "measured"


def test_a_cached_available_contradicted_in_process_fails_loudly(cache: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    machine, reg = require("cpu"), registry()
    probe_cache.probe(reg.get("test-probe-gated"), machine)
    assert probe_cache.probe(reg.get("test-probe-gated"), machine).source == "cached"
    monkeypatch.setenv("TEST_PROBE_CLOSED", "1")
    with pytest.raises(Unavailable, match="gate closed"):
        InProcessExecutor(reg, machine).run(case("test-probe-gated"))


def test_replay_probes_only_its_backend(cache: Path, tmp_path: Path) -> None:
    machine, reg = require("cpu"), registry()
    entry = CorpusEntry(tmp_path / "case.json", case("test-probe-count"), None, "")
    (replayed,) = replay_entries([entry], reg, machine, ExecutionOptions(platform="cpu"), None)
    assert replayed.result is not None and not replayed.skipped
    assert calls("test-probe-count") == 1
    assert calls("test-probe-other") == 0 and calls("test-probe-gated") == 0


def test_auto_backends_on_the_cpu_probe_nothing(cache: Path) -> None:
    assert [b.name for b in auto_backends(registry(), require("cpu"))] == ["reference"]
    assert not any(calls(n) for n in ("test-probe-count", "test-probe-other", "test-probe-gated"))


def test_with_a_warm_cache_the_parent_does_not_import_what_the_probe_imports(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TEST_PROBE_MARKER=str(tmp_path / "imports"), **{probe_cache.CACHE_ENV: str(tmp_path / "cache"),
                                                              probe_cache.SWITCH_ENV: "on"})
    parents = []
    for run in range(2):
        command = [sys.executable, "-m", "hicache_fuzz", "fuzz", "--platform", "cpu", "--backend-plugin", PLUGIN,
                   "--backend", "test-probe-gated", "--runs", "3", "--seed", "1", "--no-progress",
                   "--corpus", str(tmp_path / f"corpus-{run}"), "--json", str(tmp_path / f"report-{run}.json")]
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
        parents.append(str(process.pid))
    imported = (tmp_path / "imports").read_text().split()
    assert parents[0] in imported  # the first run's parent probed (and imported the module)
    assert parents[1] not in imported  # the second read the answer...
    assert len(imported) == 3  # ...and each run's worker probed for itself (run 1: parent and worker)
    startup = json.loads((tmp_path / "report-1.json").read_text())["startup"]
    assert startup["probing"]["source"] == "cached"
    assert startup["parent_imports_at_ready"] == []  # nothing of sglang's in the parent (none here at all)
