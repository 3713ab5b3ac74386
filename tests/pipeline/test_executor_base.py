"""The executor base (pipeline/executor_base.py): every executor derives from it, its defaults are those of an
executor that runs one case at a time in this process, each executor's figures are its own counters, and the
campaign's report fields come from the declared figures (no executor is probed for anything undeclared)."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from hicache_fuzz.harness.campaign.dry_run import MODELLED_PLATFORMS, PredictingExecutor
from hicache_fuzz.harness.commands.fuzz import worker_fields
from hicache_fuzz.harness.engine.engine_stats import EngineStats
from hicache_fuzz.harness.engine.variants import index_variant
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor, submit_batch
from hicache_fuzz.harness.pipeline.executor_base import Executor, RunFigures, SubmittedBatch, WorkerFigures
from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharing
from hicache_fuzz.harness.pipeline.pool import WorkerPool
from hicache_fuzz.harness.pipeline.setup import startup_details
from hicache_fuzz.harness.pipeline.worker import WorkerError, WorkerExecutor
from hicache_fuzz.kernels.registry import load_registry
from tests.pipeline.test_worker import case, executor

HARNESS = Path(__file__).resolve().parents[2] / "harness"
APART = ("isa", "mutate")  # the stand-alone tools run no cases
RUNNER_STAGES = {"predict", "materialize", "backend", "oracle", "compare", "classify"}


def _harness_modules() -> list[tuple[str, ast.Module]]:
    modules = []
    for path in sorted(HARNESS.rglob("*.py")):
        relative = path.relative_to(HARNESS)
        if relative.parts[0] in APART or relative.parts[0] == "_root":
            continue
        name = "hicache_fuzz.harness." + ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        modules.append((name, ast.parse(path.read_text(), str(path))))
    return modules


def test_every_executor_in_the_harness_derives_from_the_base() -> None:
    """A class that runs batches, takes submitted ones or is named an executor is an Executor."""
    found: dict[str, type] = {}
    for module_name, tree in _harness_modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or node.name == "Executor":
                continue
            methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            if methods & {"run_batch", "submit_batch"} or node.name.endswith("Executor"):
                found[node.name] = getattr(importlib.import_module(module_name), node.name)
    assert {"InProcessExecutor", "WorkerExecutor", "WorkerPool", "PredictingExecutor"} <= set(found)
    assert [name for name, cls in found.items() if not issubclass(cls, Executor)] == []


def _probed_objects(tree: ast.Module) -> list[str]:
    """The first arguments of getattr/hasattr calls that name an executor (or an early-launched one)."""
    probed = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = ast.unparse(node.args[0])
            if "executor" in target or target in ("early", "worker", "pool", "member"):
                probed.append(f"{node.func.id}({target}, ...)")
    return probed


def test_no_executor_is_probed_for_undeclared_attributes() -> None:
    """The loop, the report and the commands ask an executor only what the base declares: no getattr/hasattr on
    an executor, and no isinstance test against a concrete executor class outside the pipeline layer."""
    concrete = {"InProcessExecutor", "WorkerExecutor", "WorkerPool", "PredictingExecutor"}
    found = []
    for module_name, tree in _harness_modules():
        found += [f"{module_name}: {probe}" for probe in _probed_objects(tree)]
        if module_name.startswith("hicache_fuzz.harness.pipeline."):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2 and ast.unparse(node.args[1]) in concrete):
                found.append(f"{module_name}: {ast.unparse(node)}")
    assert found == []


class _OneByOne(Executor):
    """Only `run`: everything else is the base's."""

    def __init__(self, fail_on: str = "") -> None:
        self.ran: list[str] = []
        self.fail_on = fail_on

    def run(self, case: Case) -> Result:
        if case.case_id == self.fail_on:
            raise RuntimeError(f"harness error on {case.case_id}")
        self.ran.append(case.case_id)
        return Result(case.case_id, case.backend, Outcome.PASS)


def _cases(count: int) -> list[Case]:
    return [case("reference", seed) for seed in range(count)]


def test_the_defaults_are_those_of_one_case_at_a_time_in_this_process() -> None:
    ex = _OneByOne()
    assert (ex.runs_batches, ex.queues_batches, ex.runs_lone_cases_aside) == (False, False, False)
    assert (ex.prebuild, ex.sharing, ex.size) == (None, None, 1)
    cases = _cases(3)
    ids = [c.case_id for c in cases]
    assert [r.case_id for r in ex.run_batch(cases, lone_first=1)] == ids  # lone cases first: in order anyway
    assert ex.ran == ids
    handle = ex.submit_batch(cases)
    assert handle.done() and ex.ran == ids * 2  # run before submit_batch returned
    assert [r.case_id for r in handle.result()] == ids
    ex.spawn_early()
    ex.start()
    ex.enable_storage_reuse()
    ex.close()
    assert ex.ran == ids * 2  # nothing to launch, start or release
    assert ex.run_figures() == RunFigures(stage_seconds={}, batch_losses=0, cases_replayed_alone=0,
                                          storages_reused=0, worker_processes=1)
    assert ex.worker_figures() is None
    with pytest.raises(NotImplementedError):
        Executor().run(cases[0])


def test_a_batch_that_raises_raises_from_its_handle() -> None:
    """What run_batch would raise comes out of the handle's result(), not out of the submission, also where the
    submission itself raises (a pool whose first worker cannot start)."""
    cases = _cases(3)
    ex = _OneByOne(fail_on=cases[1].case_id)
    handle = ex.submit_batch(cases)
    assert handle.done() and ex.ran == [cases[0].case_id]
    with pytest.raises(RuntimeError, match="harness error"):
        handle.result()

    class Refusing(_OneByOne):
        def submit_batch(self, cases: Sequence[Case], lone_first: int = 0) -> SubmittedBatch:
            raise WorkerError("worker did not start")

    refused = submit_batch(Refusing(), cases)
    assert refused.done()
    with pytest.raises(WorkerError, match="did not start"):
        refused.result()


def test_an_in_process_executor_reports_its_stage_clock_and_reused_storages() -> None:
    machine = require("cpu")
    ex = InProcessExecutor(load_registry(), machine)
    assert ex.machine is machine and ex.worker_figures() is None
    ex.enable_storage_reuse()
    first = case("reference", 1)
    assert ex.run(first).outcome is Outcome.PASS
    assert ex.run(index_variant(first, 1)).outcome is Outcome.PASS  # same geometry: the storages are reused
    figures = ex.run_figures()
    assert set(figures.stage_seconds) == RUNNER_STAGES and all(s >= 0 for s in figures.stage_seconds.values())
    assert figures.storages_reused == 1 and (figures.batch_losses, figures.worker_processes) == (0, 1)
    assert figures.stage_seconds is not ex.stage_seconds  # a snapshot: the report cannot change the clock


def test_a_worker_reports_its_clock_and_its_start_up(tmp_path: Path) -> None:
    with executor(tmp_path, ["reference"]) as ex:
        assert ex.worker_figures().hello == {} and ex.worker_figures().parent_imports_at_ready is None
        ex.spawn_early()
        ex.start()
        results = ex.run_batch([case("reference", seed).replace(layers=1 + seed) for seed in range(3)])
        ran, workers = ex.run_figures(), ex.worker_figures()
    assert all(r.outcome is Outcome.PASS for r in results)
    assert set(ran.stage_seconds) == RUNNER_STAGES  # the worker's own clock, sent with the batch
    assert (ran.batch_losses, ran.cases_replayed_alone, ran.worker_processes) == (0, 0, 1)
    assert workers.hello["op"] == "hello" and workers.hello["probes"]["reference"]["available"]
    assert workers.startup_seconds > 0 and (workers.restarts, workers.spares_used) == (0, 0)
    assert isinstance(workers.parent_imports_at_ready, list)


class _RoundTrips(WorkerExecutor):
    """A worker whose round trips are recorded (no process): the rest of a batch may fail to start a worker."""

    def __init__(self, tmp_path: Path, fail_rest: bool = False) -> None:
        super().__init__(["reference"], journal_dir=tmp_path)
        self.trips: list[list[str]] = []
        self.fail_rest = fail_rest

    def _round_trip(self, cases: Sequence[Case]) -> list[Result]:
        self.trips.append([c.case_id for c in cases])
        done = [Result(c.case_id, c.backend, Outcome.PASS) for c in cases]
        if self.fail_rest and len(cases) > 1:
            raise WorkerError("worker did not start", partial_results=done[:1])
        return done


def test_a_worker_runs_the_lone_cases_first_each_alone_then_the_rest_in_one_trip(tmp_path: Path) -> None:
    cases = _cases(4)
    ids = [c.case_id for c in cases]
    worker = _RoundTrips(tmp_path)
    assert [r.case_id for r in worker.run_batch(cases, lone_first=2)] == ids
    assert worker.trips == [ids[:1], ids[1:2], ids[2:]]
    worker.trips.clear()
    assert [r.case_id for r in worker.run_batch(cases)] == ids and worker.trips == [ids]
    failing = _RoundTrips(tmp_path, fail_rest=True)
    with pytest.raises(WorkerError) as raised:
        failing.run_batch(cases, lone_first=1)
    assert [r.case_id for r in raised.value.partial_results] == ids[:2]  # the lone case's result kept in front


def test_a_pool_sums_its_members_figures_but_waited_only_for_the_first(tmp_path: Path) -> None:
    with WorkerPool(2, ["reference"], tmp_path) as pool:
        first, second = pool.members
        first.stage_seconds, second.stage_seconds = {"backend": 1.0}, {"backend": 2.0, "compare": 0.5}
        first.batch_losses, second.batch_losses, second.replayed, first.storages_reused = 1, 2, 3, 4
        first.compile_seconds, second.compile_seconds = 1.25, 2.5
        first.startup_seconds, second.startup_seconds = 3.0, 5.0
        first.background_startup_seconds, second.background_startup_seconds = 0.5, 0.25
        first.restarts, second.spares_used = 1, 1
        first.compiled_in_cases, second.compiled_in_cases = {"m": (1, 0.5)}, {"m": (2, 1.0), "n": (1, 0.25)}
        first.hello, second.hello = {"pid": 1}, {"pid": 2}
        first.parent_imports_at_ready = []
        ran, workers = pool.run_figures(), pool.worker_figures()
    assert ran == RunFigures(stage_seconds={"backend": 3.0, "compare": 0.5}, batch_losses=3, cases_replayed_alone=3,
                             storages_reused=4, worker_processes=2)
    assert workers == WorkerFigures(compile_seconds=3.75, startup_seconds=3.0,
                                    background_startup_seconds=0.75 + 5.0, restarts=1, spares_used=1,
                                    compiled_in_cases={"m": (3, 1.5), "n": (1, 0.25)}, hello={"pid": 1},
                                    parent_imports_at_ready=[])
    assert pool.sharing is not None and pool.sharing.mode == "contexts"  # the cpu platform has no MPS


def test_the_dry_run_predictor_counts_nothing_and_has_no_workers() -> None:
    registry = load_registry()
    ex = PredictingExecutor([registry.get("reference")], MODELLED_PLATFORMS["cpu"])
    assert ex.runs_batches and ex.runs_lone_cases_aside and not ex.queues_batches
    results = ex.run_batch(_cases(2), lone_first=1)
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.PASS]
    assert ex.run_figures() == RunFigures() and ex.worker_figures() is None


class _Figured(Executor):
    """Reports chosen figures: the report must show exactly these."""

    def __init__(self, ran: RunFigures, workers: WorkerFigures | None) -> None:
        self._ran, self._workers = ran, workers
        self.sharing = GpuSharing("contexts", "chosen for the test")

    def run_figures(self) -> RunFigures:
        return self._ran

    def worker_figures(self) -> WorkerFigures | None:
        return self._workers


def test_the_engine_report_takes_the_executor_fields_from_its_figures() -> None:
    ex = _Figured(RunFigures(stage_seconds={"backend": 1.5}, batch_losses=2, cases_replayed_alone=7,
                             storages_reused=11, worker_processes=3), None)
    clock = SimpleNamespace(generate_seconds=0.0, wait_seconds=0.0, calibrate_seconds=0.0,
                            scale_generate_seconds=0.0)
    report = EngineStats(mix=None).to_dict(1.0, SimpleNamespace(clock=clock, batch=64), None, ex, cpu_only=True)
    engine = report["engine"]
    assert (engine["batch_losses"], engine["cases_replayed_alone"], engine["storages_reused"],
            engine["worker_processes"]) == (2, 7, 11, 3)
    assert report["stages"]["worker_backend"] == 1.5
    assert engine["gpu_sharing"]["reason"] == "chosen for the test" and engine["cpu_only"] is True
    ex.sharing = None
    engine = EngineStats(mix=None).to_dict(1.0, SimpleNamespace(clock=clock, batch=64), None, ex)["engine"]
    assert engine["gpu_sharing"] is None and engine["cpu_only"] is False


def test_the_campaign_report_takes_the_worker_fields_from_worker_figures() -> None:
    workers = WorkerFigures(compile_seconds=1.0, startup_seconds=2.0, background_startup_seconds=0.5, restarts=3,
                            spares_used=2, compiled_in_cases={"m": (2, 0.75)}, hello={"pid": 7},
                            parent_imports_at_ready=["sglang"], standing_taken=2, first_worker_standing=True,
                            standing_notes=("no worker ready yet",))
    fields = worker_fields(workers, [], wall=4.0)
    assert fields["compile_seconds"] == 1.0 and fields["worker_startup_seconds"] == 2.0
    assert (fields["worker_restarts"], fields["spare_takeovers"]) == (3, 2)
    assert fields["spare_startup_seconds_in_background"] == 0.5 and fields["compile_share_of_wall"] == 0.25
    assert fields["compiled_in_cases"] == [{"module": "m", "processes": 2, "seconds": 0.75}]
    assert startup_details(_Figured(RunFigures(), workers)) == {
        "parent_imports_at_ready": ["sglang"],
        "standing_pool": {"first_worker": True, "workers_taken": 2, "not_taken": ["no worker ready yet"]}}
    assert startup_details(_Figured(RunFigures(), None)) == {}  # no workers, no builder: nothing to add


@pytest.mark.parametrize("isolate", ["no", "yes"])
def test_a_cpu_campaign_reports_cpu_only_in_process_and_in_workers(tmp_path: Path, isolate: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """cpu_only follows the campaign's platform, not where its cases run: a CPU campaign in worker processes
    has no index variants or host registration to report either."""
    import json

    from hicache_fuzz.harness.commands.cli import main

    out = tmp_path / "report.json"
    main(["fuzz", "--platform", "cpu", "--seed", "3", "--runs", "30", "--isolate", isolate, "--no-progress",
          "--corpus", str(tmp_path / "corpus"), "--json", str(out)])
    assert json.loads(out.read_text())["engine"]["cpu_only"] is True
    console = capsys.readouterr().out
    assert "variety:" in console and "index variants" not in console and "registration chunks" not in console
