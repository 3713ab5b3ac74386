"""pytest plugin: hicache-fuzz's fixtures, markers, campaign and corpus replay inside any test tree.

Registered as the ``pytest11`` entry point ``hicache_fuzz``, so it is active wherever hicache-fuzz is installed
(``pytest -p hicache_fuzz`` loads it explicitly, e.g. with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``). Without its
options it only adds fixtures and markers; nothing heavy (torch, sglang) is imported until a fixture, a marked
test or one of the options needs it, so ``pytest --help`` stays fast.

Options (group "hicache-fuzz"):
  --hicache-fuzz-seconds N       add one test item: a fuzz campaign of N seconds on the best platform; it fails
                                 listing each new failure's signature and reproducer paths
  --hicache-fuzz-corpus DIR      add one test item per reproducer/case file under DIR (repeatable); entries
                                 marked "expect": "fail" are xfail(strict): a known bug that reproduces is
                                 xfailed, a fixed one fails as XPASS(strict), a different failure fails
  --hicache-fuzz-backend NAME    backends of the campaign and default backend of hicache_case_runner (repeatable)
  --hicache-fuzz-platform P      auto (default), cpu, cuda or rocm
  --hicache-fuzz-seed N          campaign seed (default 0)
Markers: hicache_fuzz_gpu (skip without a CUDA/ROCm GPU), hicache_fuzz_sglang (skip unless sglang's HiCache
module imports), hicache_fuzz_backend(name) (the backend hicache_case_runner uses in that test).
Fixtures: hicache_platform, hicache_backend, hicache_case_runner.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # only for annotations: importing these pulls in torch
    from hicache_fuzz.harness.findings.corpus import CorpusEntry
    from hicache_fuzz.harness.model.case import Case
    from hicache_fuzz.harness.model.outcome import Result
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.pipeline.executor import Executor
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

GPU_MARK = "hicache_fuzz_gpu"
SGLANG_MARK = "hicache_fuzz_sglang"
BACKEND_MARK = "hicache_fuzz_backend"
MARKERS = {
    GPU_MARK: "the test needs a CUDA or ROCm GPU (skipped with the reason otherwise)",
    SGLANG_MARK: "the test needs sglang's HiCache kernels importable on a GPU (skipped with the reason otherwise)",
    BACKEND_MARK: "hicache_fuzz_backend(name): the backend hicache_case_runner runs cases on in this test",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hicache-fuzz", "hicache-fuzz: byte-exact fuzzing of sglang's HiCache KV transfers")
    group.addoption("--hicache-fuzz-seconds", type=float, default=None, metavar="N",
                    help="add a test item running a fuzz campaign for N seconds on the best platform")
    group.addoption("--hicache-fuzz-corpus", action="append", default=[], metavar="DIR",
                    help="replay every reproducer under DIR as one test each (expect:fail entries: xfail strict)")
    group.addoption("--hicache-fuzz-backend", action="append", default=[], metavar="NAME",
                    help="backend(s) for the campaign and hicache_case_runner (default: the best present)")
    group.addoption("--hicache-fuzz-platform", default="auto", choices=["auto", "cpu", "cuda", "rocm"],
                    help="platform for the fixtures, campaign and replay (default: the best present)")
    group.addoption("--hicache-fuzz-seed", type=int, default=0, metavar="N", help="campaign seed (default 0)")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_STATE] = _State(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close()


# ---- session state: built on first use ------------------------------------------------------------------

class _State:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._machine: Machine | None = None
        self._registry: Registry | None = None
        self._executors: dict[str, Executor] = {}
        self._workdir: Path | None = None

    @property
    def workdir(self) -> Path:
        """Where failures, worker journals and the campaign report go (created on first use only)."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="hicache-fuzz-pytest-"))
        return self._workdir

    def machine(self) -> Machine:
        if self._machine is None:
            from hicache_fuzz.harness.model.platform import PlatformUnavailable, detect, require

            kind = self.config.getoption("--hicache-fuzz-platform")
            try:
                self._machine = detect() if kind == "auto" else require(kind)
            except PlatformUnavailable as exc:
                pytest.skip(str(exc))
        return self._machine

    def registry(self) -> Registry:
        if self._registry is None:
            from hicache_fuzz.kernels.registry import load_registry

            self._registry = load_registry()
        return self._registry

    def backend(self, name: str) -> Backend:
        """The named backend if it runs here; skips the test with the reason otherwise."""
        from hicache_fuzz.kernels.registry import UnknownBackend

        try:
            backend = self.registry().get(name)
        except UnknownBackend as exc:
            raise pytest.UsageError(str(exc)) from None
        machine = self.machine()
        availability = backend.probe(machine.platform)
        if not availability.available:
            pytest.skip(f"backend {name} unavailable on {machine.description}: {availability.reason}")
        return backend

    def executor(self, backend: Backend) -> Executor:
        """In process for the CPU; a crash-isolating worker for backends that can take the process down."""
        key = backend.name if backend.needs_isolation and self.machine().platform.kind != "cpu" else ""
        if key not in self._executors:
            if key:
                from hicache_fuzz.harness.pipeline.worker import WorkerExecutor

                self._executors[key] = WorkerExecutor([backend.name], [], self.machine().platform.kind, 120.0,
                                                      self.workdir / f"journal-{key}")
            else:
                from hicache_fuzz.harness.pipeline.executor import InProcessExecutor

                self._executors[key] = InProcessExecutor(self.registry(), self.machine())
        return self._executors[key]

    def close(self) -> None:
        for executor in self._executors.values():
            executor.close()
        self._executors.clear()


_STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


# ---- markers --------------------------------------------------------------------------------------------

def pytest_runtest_setup(item: pytest.Item) -> None:
    wants_gpu = item.get_closest_marker(GPU_MARK) is not None
    wants_sglang = item.get_closest_marker(SGLANG_MARK) is not None
    if not (wants_gpu or wants_sglang):
        return
    machine = _state(item.config).machine()
    if machine.platform.kind == "cpu":
        pytest.skip(f"needs a CUDA or ROCm GPU; running on {machine.description}")
    if wants_sglang:
        from hicache_fuzz.kernels.sglang_common import probe_sglang

        availability = probe_sglang(machine.platform)
        if not availability.available:
            pytest.skip(f"sglang's HiCache kernels unavailable: {availability.reason}")


# ---- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def hicache_platform(pytestconfig: pytest.Config) -> Machine:
    """The machine the fixtures run on (platform, device, description): --hicache-fuzz-platform, else the best."""
    return _state(pytestconfig).machine()


@pytest.fixture
def hicache_backend(pytestconfig: pytest.Config) -> Callable[[str], Backend]:
    """hicache_backend(name) -> the backend, probed here; the test is skipped with the reason if it cannot run."""
    return _state(pytestconfig).backend


@pytest.fixture
def hicache_case_runner(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Callable[..., Result]:
    """run(case, backend=None) -> Result: a Case, case dict or case/reproducer file through the real pipeline
    (materialize, contract, backend, whole-storage byte compare); fails the test on any failing outcome, with
    the diff summary and the reproducer written for it. The backend is the argument, else the test's
    hicache_fuzz_backend marker, else --hicache-fuzz-backend, else the case's own."""
    state = _state(pytestconfig)
    marker = request.node.get_closest_marker(BACKEND_MARK)
    configured = pytestconfig.getoption("--hicache-fuzz-backend")
    default = marker.args[0] if marker is not None else (configured[0] if configured else None)

    def run(case: Case | Mapping[str, Any] | str | Path, backend: str | None = None) -> Result:
        from hicache_fuzz.harness.findings.reproducer import save_reproducer

        name = backend or default
        the_case = _as_case(case, name)
        if name is not None and name != the_case.backend:
            the_case = the_case.replace(backend=name)
        result = state.executor(state.backend(the_case.backend)).run(the_case)
        if result.outcome.is_failure:
            saved = save_reproducer(state.workdir / "failures", the_case, result)
            pytest.fail(f"{the_case.backend} {result.outcome.value} on case {the_case.case_id}: "
                        f"{result.summary or result.error}\nreproducer: {saved}", pytrace=False)
        return result

    return run


def _as_case(case: Any, backend: str | None = None) -> Case:
    """The case to run. A file that lists several backends (a committed seed) gives its entry for `backend`;
    a backend it does not list runs the same case; with no backend named, such a file is ambiguous."""
    from hicache_fuzz.harness.findings.corpus import load_entries
    from hicache_fuzz.harness.model.case import Case

    if isinstance(case, Case):
        return case
    if isinstance(case, (str, Path)):
        entries = load_entries(Path(case))
        if len(entries) == 1:
            return entries[0].case
        listed = [entry.case.backend for entry in entries]
        if backend is None:
            raise ValueError(f"{case}: lists {len(entries)} backends ({', '.join(listed)}); name one with "
                             "backend=, the hicache_fuzz_backend marker or --hicache-fuzz-backend")
        return entries[listed.index(backend) if backend in listed else 0].case
    if isinstance(case, Mapping):
        return Case.from_dict(case.get("case", case) if isinstance(case.get("case"), Mapping) else case)
    raise TypeError(f"expected a Case, a case dict or a file path, got {type(case).__name__}")


# ---- added items: the campaign and the corpus replay -------------------------------------------------------

class KnownBugReproduced(Exception):
    """An expect:fail corpus entry failed with its recorded signature (reported as xfailed)."""


class HicacheFailure(Exception):
    """A failing added item; the message is the whole report (no Python traceback)."""


class _HicacheItem(pytest.Item):
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, HicacheFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


class CampaignItem(_HicacheItem):
    def runtest(self) -> None:
        from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
        from hicache_fuzz.harness.findings.corpus import load_corpus
        from hicache_fuzz.harness.findings.known import detect_environment, known_bugs

        state = _state(self.config)
        machine = state.machine()
        names = self.config.getoption("--hicache-fuzz-backend")
        if names:
            backends = [state.backend(name) for name in names]
        else:
            from hicache_fuzz.harness.pipeline.setup import auto_backends

            backends = auto_backends(state.registry(), machine)
        corpora = [Path(d) for d in self.config.getoption("--hicache-fuzz-corpus")]
        known = known_bugs(load_corpus(corpora), detect_environment(machine))
        out = state.workdir / "campaign"
        config = CampaignConfig(backends=[b.name for b in backends], seed=self.config.getoption("--hicache-fuzz-seed"),
                                max_seconds=self.config.getoption("--hicache-fuzz-seconds"),
                                corpus_dir=out / "corpus", known_signatures=known)
        executor = state.executor(backends[0]) if len(backends) == 1 else _shared_executor(state, backends)
        report = run_campaign(config, backends, machine.platform, executor)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True))
        self.user_properties.append(("hicache_fuzz_report", str(out / "report.json")))
        if report.new_failures:
            lines = [f"hicache-fuzz campaign (seed {config.seed}, {report.cases} cases on "
                     f"{', '.join(config.backends)}, {machine.description}): "
                     f"{len(report.new_failures)} new failure signature(s); report {out / 'report.json'}"]
            for failure in report.new_failures:
                script = Path(failure.file).with_name(Path(failure.file).stem + ".standalone.py")
                lines.append(f"  {failure.signature} x{failure.count}: {failure.summary}")
                lines.append(f"    reproducer {failure.file}")
                if script.exists():
                    lines.append(f"    standalone {script}")
            raise HicacheFailure("\n".join(lines))


def _shared_executor(state: _State, backends: list[Backend]) -> Executor:
    isolate = [b for b in backends if b.needs_isolation and state.machine().platform.kind != "cpu"]
    if not isolate:
        return state.executor(backends[0])
    from hicache_fuzz.harness.pipeline.worker import WorkerExecutor

    executor = WorkerExecutor([b.name for b in backends], [], state.machine().platform.kind, 120.0,
                              state.workdir / "journal-campaign")
    state._executors["campaign"] = executor
    return executor


class ReplayItem(_HicacheItem):
    def __init__(self, *, entry: CorpusEntry, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.case_file = entry.path

    def runtest(self) -> None:
        from hicache_fuzz.harness.findings.reproducer import judge_replay

        state = _state(self.config)
        entry = self.entry
        result = state.executor(state.backend(entry.case.backend)).run(entry.case)
        verdict = judge_replay(entry.expect, entry.bug, result, entry.case, entry.any_crash_is_its_bug)
        if verdict.label == "XFAIL":
            raise KnownBugReproduced(verdict.detail)
        if entry.expect == "fail" and verdict.label == "XPASS":
            return  # xfail(strict) turns this pass into a failure: the known bug no longer reproduces
        if not verdict.ok:
            raise HicacheFailure(f"{verdict.label}: {verdict.detail}\n{result.summary or result.error}\n"
                                 f"reproducer: {self.case_file}")


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so the added items can be selected like others
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = config.getoption("--hicache-fuzz-seconds")
    if seconds is not None:
        if seconds <= 0:
            raise pytest.UsageError(f"--hicache-fuzz-seconds must be positive, got {seconds}")
        items.append(CampaignItem.from_parent(session, name=f"hicache_fuzz_campaign[{seconds:g}s]"))
    corpora = config.getoption("--hicache-fuzz-corpus")
    if not corpora:
        return
    from hicache_fuzz.harness.findings.corpus import CorpusError, iter_case_files, load_entries

    for directory in map(Path, corpora):
        if not directory.exists():
            raise pytest.UsageError(f"--hicache-fuzz-corpus: {directory}: no such file or directory")
        for path in iter_case_files([directory]):
            try:
                entries = load_entries(path)
            except CorpusError as exc:
                raise pytest.UsageError(f"--hicache-fuzz-corpus: {exc}") from None
            relative = path.relative_to(directory) if directory.is_dir() else Path(path.name)
            for entry in entries:  # a seed file lists every backend it applies to: one item each
                label = f"{relative}" if len(entries) == 1 else f"{relative}:{entry.case.backend}"
                item = ReplayItem.from_parent(session, name=f"hicache_fuzz_replay[{label}]", entry=entry)
                if entry.expect == "fail":
                    item.add_marker(pytest.mark.xfail(strict=True, raises=KnownBugReproduced,
                                                      reason=f"known bug {entry.bug or '(no signature)'}"))
                items.append(item)
