"""Where a run gets its machine, its backends and the executor that runs their cases.

Every command that runs cases (fuzz, a parallel shard, replay, minimize, gate, selftest, bench) resolves
them here, from :class:`ExecutionOptions`, so "a named platform that is absent exits 3", "an unknown backend
is bad usage" and "which backends need a worker process" are decided in one place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_fuzz.harness.model.exit_codes import Unavailable, UsageError
from hicache_fuzz.harness.model.platform import Machine, PlatformUnavailable, detect, require
from hicache_fuzz.harness.pipeline import probe_cache
from hicache_fuzz.harness.pipeline.executor import Executor, InProcessExecutor
from hicache_fuzz.kernels.base import Availability, Backend
from hicache_fuzz.kernels.registry import Registry, UnknownBackend, load_registry

if TYPE_CHECKING:
    from hicache_fuzz.harness.pipeline.prebuild import Prebuild

PREBUILD_ENV = "HICACHE_FUZZ_PREBUILD"
PREBUILD_CHOICES = ("auto", "yes", "no")


@dataclass
class ExecutionOptions:
    """How cases run: on which platform, with which extra backends, in a worker process or not."""

    platform: str = "auto"  # auto | cpu | cuda | rocm
    backend_plugins: list[str] = field(default_factory=list)  # MODULE:CALLABLE specs
    isolate: str = "auto"  # auto (for backends that can crash the process) | yes | no
    case_timeout: float = 60.0  # seconds before a case in a worker counts as a hang
    worker_processes: int | None = None  # worker processes behind one campaign (None: auto, pipeline/pool.py)
    # workers kept started to take over after a crash (None: auto, GPU_SPARE_WORKERS on a GPU, none on the CPU);
    # each is an import of torch and sglang, so campaigns run many at once (mutate) keep none
    spare_workers: int | None = None
    gpu_sharing: str = "auto"  # how a pool's workers share a CUDA GPU: auto | mps | contexts (gpu_sharing.py)
    # a builder process for the JIT modules (pipeline/prebuild.py) where the workers would warm up: auto (on a
    # GPU) | yes | no; $HICACHE_FUZZ_PREBUILD sets it (e.g. to measure a campaign without the builder)
    prebuild: str = field(default_factory=lambda: os.environ.get(PREBUILD_ENV, "auto").strip().lower() or "auto")
    # the campaign seed whose sample of the rotating JIT rows the builder builds (CaseSpace.menu_seed; None: every
    # row of every menu, a superset of what any seed draws)
    menu_seed: int | None = None

    def resolved_worker_processes(self, platform_kind: str) -> int:
        """auto: a pool sized by the CPU count on a GPU (pool.auto_pool_size), one worker on the CPU."""
        if self.worker_processes is not None:
            return max(1, self.worker_processes)
        if platform_kind == "cpu":
            return 1
        from hicache_fuzz.harness.pipeline.pool import auto_pool_size

        return auto_pool_size()


def machine_for(platform: str) -> Machine:
    """The best machine present for "auto", else the named platform (Unavailable when it is absent)."""
    if platform == "auto":
        return detect()
    try:
        return require(platform)
    except PlatformUnavailable as exc:
        raise Unavailable(str(exc)) from None


def registry_for(backend_plugins: list[str]) -> Registry:
    """Built-in backends plus the plugins': a malformed or misspelt spec is bad usage (exit 2); a plugin whose
    import or factory raises cannot provide backends here (exit 3, with its words)."""
    for spec in backend_plugins:
        if ":" not in spec:
            raise UsageError(f"--backend-plugin {spec!r}: expected MODULE:CALLABLE")
    named = " ".join(backend_plugins)
    try:
        return load_registry(backend_plugins)
    except ModuleNotFoundError as exc:
        if exc.name in {spec.partition(":")[0] for spec in backend_plugins}:  # the module itself: a typo
            raise UsageError(f"--backend-plugin: {exc}") from None
        raise Unavailable(f"--backend-plugin {named}: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:  # MODULE:CALLABLE whose callable does not exist
        raise UsageError(f"--backend-plugin: {exc}") from None
    except Exception as exc:  # the plugin's import or factory raised
        raise Unavailable(f"--backend-plugin {named}: {type(exc).__name__}: {exc}") from None


def probe(backend: Backend, machine: Machine) -> Availability:
    """backend.probe, read from the probe cache when this machine state answered it before (probe_cache.py),
    where a probe that raises (a plugin's) means the backend is unavailable: exit 3."""
    return probe_many([backend], machine)[backend.name]


def probe_many(backends: list[Backend], machine: Machine) -> dict[str, Availability]:
    """Each backend's availability, probed concurrently (or read from the probe cache); a probe that raises is
    Unavailable (exit 3)."""
    found = probe_cache.probe_all(backends, machine)
    answers: dict[str, Availability] = {}
    for name, probed in found.items():
        if isinstance(probed, probe_cache.ProbeRaised):
            raise Unavailable(f"backend {name}: its probe raised {probed}")
        answers[name] = probed.availability
    return answers


def unavailable_reason(registry: Registry, name: str, machine: Machine) -> str:
    """Why backend `name` cannot run here ("" if it can), through the probe cache: what replay skips on."""
    if name not in registry.backends:
        return f"backend {name!r} is not installed here"
    found = probe_cache.probe_all([registry.get(name)], machine)[name]
    if isinstance(found, probe_cache.ProbeRaised):
        return f"backend {name} unavailable: its probe raised {found}"
    return "" if found.availability.available else f"backend {name} unavailable: {found.availability.reason}"


def available_backend(registry: Registry, name: str, machine: Machine) -> Backend:
    """The backend called `name`: UsageError when no backend has that name, Unavailable when it cannot run."""
    try:
        backend = registry.get(name)
    except UnknownBackend as exc:
        raise UsageError(str(exc)) from None
    availability = probe(backend, machine)
    if not availability.available:
        raise Unavailable(f"backend {name} is unavailable on {machine.description}: {availability.reason}")
    return backend


def real_kernel_backends(registry: Registry) -> list[Backend]:
    """Every registered backend of real kernels (not the reference, not the bug zoo), available or not."""
    return [b for name in registry.names() if not (b := registry.get(name)).models_bug and name != "reference"]


def auto_backends(registry: Registry, machine: Machine) -> list[Backend]:
    """The best backends present: every available real-kernel backend on a GPU, else the CPU reference."""
    if machine.platform.kind != "cpu":
        candidates = real_kernel_backends(registry)
        answers = probe_many(candidates, machine)
        real = [b for b in candidates if answers[b.name].available]
        if real:
            return real
    return [registry.get("reference")]


def startup_details(executor: Executor) -> dict[str, object]:
    """The executor's part of the start-up record: the JIT builder's (pipeline/prebuild.py), which of the packages
    the workers import this process had imported when its first worker was ready (none is the aim), and whether
    the workers came from a standing pool (how many, and why not where one was asked)."""
    from hicache_fuzz.harness.pipeline.prebuild import startup_fields

    details: dict[str, object] = dict(startup_fields(executor.prebuild))
    workers = executor.worker_figures()
    if workers is not None and workers.parent_imports_at_ready is not None:
        details["parent_imports_at_ready"] = workers.parent_imports_at_ready
    if workers is not None:  # whether the workers came ready from a standing pool (pipeline/standing.py)
        details["standing_pool"] = {"first_worker": workers.first_worker_standing,
                                    "workers_taken": workers.standing_taken,
                                    "not_taken": list(workers.standing_notes)}
    return details


def probing_record() -> dict[str, object]:
    """This process's probes for the start-up record: wall seconds, source (cached, measured, mixed, none) and
    each backend's source."""
    return probe_cache.LOG.record()


def needs_worker(backends: list[Backend], isolate: str) -> bool:
    return isolate == "yes" or (isolate == "auto" and any(b.needs_isolation for b in backends))


def executor_for(backends: list[Backend], registry: Registry, machine: Machine, options: ExecutionOptions,
                 journal_dir: Path | None, warm_up: bool = False) -> Executor:
    """In this process, or in a crash-isolating worker process when `options.isolate` asks for one."""
    if needs_worker(backends, options.isolate):
        from hicache_fuzz.harness.pipeline.worker import GPU_SPARE_WORKERS, WorkerExecutor

        # The journal keeps in-flight, crashed and hung cases; replay has no corpus, so it gets a fresh folder
        # (removed by close_executors). A corpus that cannot hold one is a storage fault: exit 3 with the reason.
        journal = journal_dir if journal_dir is not None else Path(tempfile.mkdtemp(prefix="hicache-fuzz-journal-"))
        if journal_dir is None:
            TEMPORARY_JOURNALS.append(journal)
        try:
            journal.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"cannot create the worker journal {journal}: {exc.strerror or exc}") from None
        # On a GPU a restart costs an import of sglang plus JIT module loads: keep spare workers ready.
        spares = options.spare_workers
        if spares is None:
            spares = GPU_SPARE_WORKERS if machine.platform.kind != "cpu" else 0
        size = options.resolved_worker_processes(machine.platform.kind)
        if options.prebuild not in PREBUILD_CHOICES:
            raise UsageError(f"{PREBUILD_ENV}={options.prebuild!r}: expected one of {', '.join(PREBUILD_CHOICES)}")
        # One process builds the modules (all cores), the workers load them: no worker warms up or compiles.
        prebuild = warm_up and (options.prebuild == "yes"
                                or (options.prebuild == "auto" and machine.platform.kind != "cpu"))
        if size > 1:  # several workers behind one campaign: one spare each is enough (the others go on)
            from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharingUnavailable
            from hicache_fuzz.harness.pipeline.pool import WorkerPool

            try:
                pool = WorkerPool(size, [b.name for b in backends], journal, gpu_sharing=options.gpu_sharing,
                                  plugins=options.backend_plugins, platform_kind=machine.platform.kind,
                                  timeout_s=options.case_timeout, warm_up=warm_up and not prebuild,
                                  spares=min(spares, 1))
            except GpuSharingUnavailable as exc:
                raise Unavailable(str(exc)) from None
            # After the pool's GPU sharing has started, in this process's environment, as this process queries the
            # device: not an MPS client, so an MPS fall-back (which replaces the clients) cannot cost its builds.
            if prebuild and not pool.attach_prebuild(_builder(backends, options, machine, journal)):
                pool.warm_up_members()
            return pool
        builder = _builder(backends, options, machine, journal) if prebuild else None
        return WorkerExecutor([b.name for b in backends], options.backend_plugins, machine.platform.kind,
                              options.case_timeout, journal, warm_up=warm_up and builder is None, spares=spares,
                              prebuild=builder)
    return InProcessExecutor(registry, machine)


def _builder(backends: list[Backend], options: ExecutionOptions, machine: Machine, journal: Path) -> Prebuild | None:
    """The campaign's JIT builder process, or None when it cannot start (no memory, no log file): then the
    workers warm up instead."""
    from hicache_fuzz.harness.pipeline.prebuild import Prebuild

    try:
        return Prebuild([b.name for b in backends], options.backend_plugins, machine.platform.kind, journal,
                        menu_seed=options.menu_seed)
    except OSError:
        return None


TEMPORARY_JOURNALS: list[Path] = []  # made by executor_for for runs without a corpus (replay, minimize)


def close_executors(executors: list[Executor]) -> None:
    """Close the executors, then remove the temporary journals they used (nothing is left under /tmp)."""
    try:
        for executor in executors:
            executor.close()
    finally:
        while TEMPORARY_JOURNALS:
            shutil.rmtree(TEMPORARY_JOURNALS.pop(), ignore_errors=True)
