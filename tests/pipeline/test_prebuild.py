"""The campaign's JIT builder (harness/pipeline/prebuild.py, kernels/compile_books.py): every module is built once
across the builder and N workers, the starting menus before the growth stages, and a restarted worker loads what
was built instead of building it again. CPU only, with the fake JIT backend of tests/_jit_plugin.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, close_executors, executor_for, startup_details
from hicache_fuzz.kernels import compile_books
from hicache_fuzz.kernels.base import Availability
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.kernels.refused_builds import RefusedBuilds
from hicache_fuzz.kernels.registry import load_registry

TESTS = str(Path(__file__).resolve().parents[1])  # where _jit_plugin.py lives
PLUGIN = "_jit_plugin:backends"


def case(seed: int) -> Case:
    return Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.LAYER_FIRST,
                pools=(PoolSpec(head_dim=8),), layers=2, page_size=1, device_rows=8, host_slots=8,
                host_indices=(0, 3), device_indices=(2, 5), backend="test-jit", seed=seed)


def log_lines(cache: Path) -> list[tuple[str, str, int]]:
    path = cache / "log"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(pid, what, int(row)) for pid, what, row in (line.split() for line in lines if line)]


@pytest.fixture
def jit_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "jit"
    cache.mkdir()
    monkeypatch.setenv("TEST_JIT_CACHE", str(cache))
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(TESTS)
    return cache


def test_each_module_is_built_once_menus_first_and_a_restart_does_not_rebuild(jit_cache: Path,
                                                                              tmp_path: Path) -> None:
    machine = require("cpu")
    registry = load_registry([PLUGIN])
    options = ExecutionOptions(platform="cpu", backend_plugins=[PLUGIN], isolate="yes", worker_processes=3,
                               prebuild="yes")
    pool = executor_for([registry.get("test-jit")], registry, machine, options, tmp_path / "journal", warm_up=True)
    try:
        results = pool.run_batch([case(seed) for seed in range(12)])  # type: ignore[attr-defined]
        assert all(r.outcome is Outcome.PASS for r in results), [r.summary for r in results]
        record = pool.prebuild.wait(120)  # type: ignore[attr-defined]
        assert record["done"] and record["modules"] == 4 and record["menu_modules"] == 2
        builds = [(pid, row) for pid, what, row in log_lines(jit_cache) if what == "build"]
        assert Counter(row for _, row in builds) == {128: 1, 256: 1, 512: 1, 1024: 1}  # once, across processes
        assert [row for _, row in builds][:2] in ([128, 256], [256, 128])  # the starting menu before growth
        fields = startup_details(pool)
        assert fields["prebuild_modules"] == 4 and fields["prebuild_done"] and fields["prebuild_s"] is not None
        # a worker that dies and is replaced loads what was built
        first = pool.members[0]  # type: ignore[attr-defined]
        before = len(builds)
        first._kill()
        assert first.run(case(0)).outcome is Outcome.PASS and first.restarts == 1
        after = log_lines(jit_cache)
        assert sum(1 for _, what, _ in after if what == "build") == before
        assert any(what == "load" and pid == str(first._proc.pid) for pid, what, _ in after)
    finally:
        close_executors([pool])


class _Recording(ReferenceBackend):
    """compile_jobs that record which row they were asked for."""

    def __init__(self, name: str, menu: tuple[int, ...], growth: tuple[int, ...], asked: list[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.menu, self.growth, self.asked = menu, growth, asked

    def probe(self, platform: Platform) -> Availability:
        return Availability(True, "")

    def case_space(self, space: CaseSpace, platform: Platform) -> CaseSpace:
        return space.narrowed(row_bytes=self.menu, row_bytes_growth=self.growth, grow_every=5)

    def compile_jobs(self, space: CaseSpace, platform: Platform) -> list:  # type: ignore[type-arg]
        return [lambda row=row: self.asked.append(f"{self.name}{row}") for row in space.row_bytes]


def test_prebuild_jobs_put_the_starting_menus_first_one_backend_after_another() -> None:
    asked: list[str] = []
    backends = [_Recording("a", (1, 2), (5,), asked), _Recording("b", (3,), (6, 7), asked)]
    jobs, menus = compile_books.prebuild_jobs(backends, Platform("cpu"), CaseSpace())
    for job in jobs:
        job()
    assert menus == 3
    assert asked == ["a1", "b3", "a2", "a5", "b6", "b7"]


def test_row_jobs_build_the_named_rows_of_available_backends_one_backend_after_another() -> None:
    asked: list[str] = []

    class Absent(_Recording):
        def probe(self, platform: Platform) -> Availability:
            return Availability(False, "not here")

    backends = [_Recording("a", (1, 2), (5,), asked), _Recording("b", (3,), (6, 7), asked),
                Absent("c", (4,), (), asked)]
    rows = {"b": [7, 3, 7], "a": [5], "c": [4], "d": [9]}
    jobs = compile_books.row_jobs(backends, Platform("cpu"), CaseSpace(), rows)
    for job in jobs:
        job()
    assert asked == ["a5", "b7", "b3"]  # a growth row too when a first case drew it; nothing of c or d


def test_jobs_named_while_the_builder_is_building_go_next() -> None:
    done: list[str] = []
    polls = []

    def urgent() -> list:  # type: ignore[type-arg]
        polls.append(1)
        return [lambda: done.append("first case")] if len(polls) == 3 else []

    compile_books.run_jobs([lambda n=n: done.append(f"menu {n}") for n in range(4)], workers=1, urgent=urgent)
    assert done == ["menu 0", "menu 1", "first case", "menu 2", "menu 3"]


def test_the_first_cases_rows_are_read_once_whenever_they_come(tmp_path: Path) -> None:
    from hicache_fuzz.harness.pipeline.prebuild import FirstCases

    path = tmp_path / "first.json"
    asked: list[dict[str, list[int]]] = []
    first = FirstCases(path, lambda rows: asked.append(rows) or [lambda: None, lambda: None], time.perf_counter())
    assert first() == [] and first.fields()["first_modules"] is None  # not named yet
    path.write_text(json.dumps({"rows": {"sglang-jit": [512, 96]}}))
    jobs = first()
    assert asked == [{"sglang-jit": [512, 96]}] and len(jobs) == 2 and first() == []  # read once
    for job in jobs:
        job()
    fields = first.fields()
    assert fields["first_modules"] == 2 and fields["first_built_s"] >= fields["first_named_s"] >= 0


def test_the_builder_builds_the_rows_the_campaign_names_before_its_menus(jit_cache: Path, tmp_path: Path) -> None:
    first_rows = tmp_path / "first.json"
    first_rows.write_text(json.dumps({"rows": {"test-jit": [1024]}}))
    record = tmp_path / "prebuild.json"
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz.harness.pipeline.prebuild", "--platform", "cpu",
                           "--backend", "test-jit", "--backend-plugin", PLUGIN, "--out", str(record),
                           "--first-rows", str(first_rows)], capture_output=True, text=True, timeout=120,
                          # one core, so one build thread: builds end in the order they were taken
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert done.returncode == 0, done.stderr
    builds = [row for _, what, row in log_lines(jit_cache) if what == "build"]
    assert builds[0] == 1024 and sorted(builds) == [128, 256, 512, 1024]  # named first, then menus and growth
    written = json.loads(record.read_text())
    assert written["first_modules"] == 1 and written["done"]
    assert written["first_built_s"] >= written["first_named_s"] >= written["import_seconds"]


def _campaign_with_builder(tmp_path: Path, max_cases: int) -> tuple[list[Case], dict[str, list[int]]]:
    """The cases a process-fed pool campaign with a JIT builder ran, and the rows it named to the builder."""
    from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
    from hicache_fuzz.harness.engine.feed import EngineOptions

    machine = require("cpu")
    registry = load_registry([PLUGIN])
    backend = registry.get("test-jit")
    options = ExecutionOptions(platform="cpu", backend_plugins=[PLUGIN], isolate="yes", worker_processes=2,
                               prebuild="yes")
    pool = executor_for([backend], registry, machine, options, tmp_path / "journal", warm_up=True)
    ran: list[Case] = []
    try:
        config = CampaignConfig(backends=["test-jit"], seed=3, space=CaseSpace(), max_cases=max_cases,
                                engine=EngineOptions(feed="process", batches_ahead=1))
        report = run_campaign(config, [backend], machine.platform, pool,
                              on_result=lambda case, result, report: ran.append(case))
        named = json.loads((tmp_path / "journal" / "prebuild-first.json").read_text())["rows"]
    finally:
        close_executors([pool])
    assert report.cases == max_cases == len(ran)
    return ran, named


def _rows_in_order(cases: list[Case]) -> list[int]:
    return list(dict.fromkeys(p.row_bytes(c) for case in cases for p in case.pools for c in p.components))


def test_a_campaign_names_its_first_batchs_rows_to_its_builder(jit_cache: Path, tmp_path: Path) -> None:
    from hicache_fuzz.harness.campaign.loop import FIRST_BATCH_CASES
    from hicache_fuzz.harness.engine.feed import DEFAULT_BATCH

    early = FIRST_BATCH_CASES + DEFAULT_BATCH * 2  # the first batch and one pool batch (two members)
    ran, named = _campaign_with_builder(tmp_path, early + 40)
    # what the first result waits for; the next batch is only generated early
    assert named == {"test-jit": _rows_in_order(ran[:FIRST_BATCH_CASES])}


def test_a_short_campaign_generates_no_more_than_it_runs_for_its_builder(jit_cache: Path, tmp_path: Path) -> None:
    ran, named = _campaign_with_builder(tmp_path, 5)  # a gate's campaign: a few cases per backend
    assert named == {"test-jit": _rows_in_order(ran)}


def test_a_refusal_is_compiled_by_one_process_and_replayed_by_one_that_waited(tmp_path: Path) -> None:
    sources = tmp_path / "sglang" / "kernels" / "ops" / "kvcache"
    sources.mkdir(parents=True)
    (sources / "hicache.py").write_text("")
    module_file = str(sources / "hicache.py")
    refusal = RuntimeError("Failed to build JIT module: error: static assertion failed with \"rows\"")
    compiled: list[str] = []
    holder_in = threading.Event()

    def holder() -> None:
        books = RefusedBuilds(module_file, tmp_path / "records", toolchain=lambda: ["t"])
        with books.building("factory", (96,)):
            holder_in.set()
            time.sleep(0.5)  # nvcc
            compiled.append("holder")
            books.record("factory", (96,), refusal)

    thread = threading.Thread(target=holder)
    thread.start()
    holder_in.wait(10)
    waiter = RefusedBuilds(module_file, tmp_path / "records", toolchain=lambda: ["t"])  # another process's
    with waiter.building("factory", (96,)):
        replayed = waiter.lookup("factory", (96,))
    thread.join()
    assert compiled == ["holder"]
    assert replayed is not None and str(replayed) == str(refusal)


def test_menu_growth_leaves_the_growth_stages_to_a_builder() -> None:
    from hicache_fuzz.harness.campaign.loop import MenuGrowth

    asked: list[str] = []

    class Prefetching(_Recording):
        def prefetch(self, space: CaseSpace, platform: Platform) -> None:
            asked.append(f"prefetch {space.row_bytes}")

    backend = Prefetching("a", (1, 2), (5, 6), [])
    with_builder = MenuGrowth([backend], CaseSpace(), Platform("cpu"), prefetch=False)
    without = MenuGrowth([backend], CaseSpace(), Platform("cpu"))
    for index in (0, 5, 10):
        with_builder.before(backend, index)
    assert asked == [] and with_builder.grown["a"] == [5, 6]  # nothing imported here; growth still recorded
    without.before(backend, 0)
    assert asked == ["prefetch (5,)"]


def test_an_unwritable_lock_folder_builds_unlocked(tmp_path: Path) -> None:
    sources = tmp_path / "sglang" / "kernels" / "ops" / "kvcache"
    sources.mkdir(parents=True)
    (sources / "hicache.py").write_text("")
    (tmp_path / "not-a-folder").write_text("")
    books = RefusedBuilds(str(sources / "hicache.py"), tmp_path / "not-a-folder" / "records", toolchain=lambda: ["t"])
    ran = []
    with books.building("factory", (96,)):
        ran.append("build")
    assert ran == ["build"]


def test_a_bad_prebuild_setting_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.harness.model.exit_codes import UsageError

    monkeypatch.setenv("HICACHE_FUZZ_PREBUILD", "sometimes")
    registry = load_registry()
    with pytest.raises(UsageError, match="HICACHE_FUZZ_PREBUILD='sometimes'"):
        executor_for([registry.get("reference")], registry, require("cpu"), ExecutionOptions(isolate="yes"),
                     tmp_path / "journal", warm_up=True)


def test_the_builder_waits_for_the_first_rows_up_to_its_deadline(tmp_path: Path) -> None:
    """A build thread cannot drop an nvcc run for the first cases' modules, so the builder starts only once they
    are named (or its deadline passes): rows named a moment later are waited for, none named is not waited for
    past the deadline, and a builder without a rows file does not wait."""
    import threading

    from hicache_fuzz.harness.pipeline.prebuild import FirstCases

    path = tmp_path / "first.json"
    first = FirstCases(path, lambda rows: [], time.perf_counter())
    writer = threading.Timer(0.3, lambda: path.write_text(json.dumps({"rows": {"test-jit": [1024]}})))
    writer.start()
    started = time.perf_counter()
    assert first.wait_until_named(30.0) and time.perf_counter() - started < 10.0
    writer.join()
    late = FirstCases(tmp_path / "never.json", lambda rows: [], time.perf_counter())
    assert not late.wait_until_named(0.2)
    assert not FirstCases(None, lambda rows: [], time.perf_counter()).wait_until_named(30.0)
