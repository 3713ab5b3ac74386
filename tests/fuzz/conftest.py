"""The fuzz suites under pytest-xdist: one GPU per xdist worker, backends by platform, never a silent skip.

GPU pinning. This file is imported by each xdist worker before any test touches CUDA; at import it sets
``CUDA_VISIBLE_DEVICES`` (CUDA) or ``HIP_VISIBLE_DEVICES`` (ROCm) to device ``k % G`` for worker ``gwk``, so
torch, the worker's crash-isolating child process and sglang's kernels all see one device. Devices are counted
through NVML (torch.cuda.device_count does not create a context). If CUDA was already initialized when this
file was imported, the environment no longer applies: the ``fuzz_machine`` fixture then selects the worker's
device with ``torch.cuda.set_device`` instead.

``pytest tests/fuzz -n auto`` starts GPUs x workers-per-GPU workers on a GPU machine (see
:data:`hicache_fuzz.harness.campaign.parallel.AUTO_WORKERS_PER_GPU`, override with HICACHE_FUZZ_WORKERS_PER_GPU) and
pytest-xdist's usual CPU count elsewhere; ``-n N`` overrides it.

Environment:

* HICACHE_FUZZ_PLATFORM: cpu, cuda, rocm or auto (default). A named GPU platform that is absent fails every
  test with the reason; it is never skipped.
* HICACHE_FUZZ_BACKENDS: comma-separated backend names (default: the real-kernel backends on a GPU, the CPU
  reference otherwise). A named backend that is unavailable fails with its probe's reason.
* HICACHE_FUZZ_SEED (default 20260), HICACHE_FUZZ_CHUNKS (seed-space shards = tests, default 16),
  HICACHE_FUZZ_CASES_PER_CHUNK (default 24 on the CPU, 400 on a GPU), HICACHE_FUZZ_BYTE_BUDGET (bytes per
  case; default 64 KiB on the CPU, the generator's default on a GPU).
* HICACHE_FUZZ_OUT: where corpora (failures) and per-test reports go (default: pytest's tmp dir). Merge them
  with ``hicache-fuzz merge $HICACHE_FUZZ_OUT/reports --corpus $HICACHE_FUZZ_OUT/corpus --out DIR`` (each holds
  a folder per xdist worker), which writes one JUnit file with a testcase per backend x failure
  signature (Hypothesis adds nothing to pytest's JUnit under xdist).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
import torch  # importing torch does not initialize CUDA; the pinning below must happen before that

from hicache_fuzz.harness.campaign import parallel
from hicache_fuzz.harness.model.platform import Machine, PlatformUnavailable, detect, require
from hicache_fuzz.harness.pipeline.executor import Executor, InProcessExecutor
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.registry import Registry, UnknownBackend, load_registry

PLATFORM_ENV = "HICACHE_FUZZ_PLATFORM"
BACKENDS_ENV = "HICACHE_FUZZ_BACKENDS"
OUT_ENV = "HICACHE_FUZZ_OUT"


def requested_platform() -> str:
    value = os.environ.get(PLATFORM_ENV, "auto").strip().lower() or "auto"
    return value


def xdist_worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in an xdist worker, "" otherwise


def _worker_index(worker: str) -> int:
    match = re.fullmatch(r"gw(\d+)", worker)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class Pinning:
    kind: str  # cuda, rocm or cpu
    device: str | None  # the device token this worker was given (None: not pinned)
    devices: tuple[str, ...]  # the tokens there were to hand out
    applied_before_cuda_init: bool


def _pin_this_worker() -> Pinning:
    requested = requested_platform()
    kind = parallel.accelerator_kind() if requested in ("auto", "") else requested
    if kind not in parallel.VISIBLE_DEVICES_ENV:
        return Pinning("cpu", None, (), True)
    devices = tuple(parallel.visible_devices(kind))
    worker = xdist_worker()
    if not worker or not devices:
        return Pinning(kind, None, devices, True)
    device = parallel.device_for_worker(_worker_index(worker), list(devices))
    os.environ.update(parallel.pinning_env(kind, device))
    return Pinning(kind, device, devices, not torch.cuda.is_initialized())


PINNING = _pin_this_worker()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` on a GPU machine: GPUs x workers per GPU; elsewhere xdist's default (None)."""
    if PINNING.kind == "cpu" or not PINNING.devices:
        return None
    return len(PINNING.devices) * parallel.workers_per_gpu()


@dataclass
class FuzzTarget:
    """What the fuzz tests run against, resolved once per xdist worker."""

    machine: Machine
    backends: list[Backend]
    registry: Registry
    byte_budget: int | None
    corpus: Path  # <out>/corpus/<xdist worker>: this worker's failures
    reports: Path  # <out>/reports/<xdist worker>: its campaign reports
    journal: Path  # <out>/journal/<xdist worker>: its crash-isolation journal


def _fail(message: str) -> NoReturn:
    pytest.fail(f"{message} [{PLATFORM_ENV}={requested_platform()}, {BACKENDS_ENV}="
                f"{os.environ.get(BACKENDS_ENV, '')!r}]", pytrace=False)


@pytest.fixture(scope="session")
def fuzz_machine() -> Machine:
    requested = requested_platform()
    if PINNING.device is not None and not PINNING.applied_before_cuda_init and torch.cuda.device_count() > 1:
        # CUDA was up before this file pinned the worker: choose its device explicitly instead.
        torch.cuda.set_device(list(PINNING.devices).index(PINNING.device))
    try:
        return detect() if requested == "auto" else require(requested)
    except (PlatformUnavailable, ValueError) as exc:
        _fail(str(exc))


def _backend_names() -> list[str]:
    listed = os.environ.get(BACKENDS_ENV, "")
    return [name.strip() for name in listed.split(",") if name.strip()]


@pytest.fixture(scope="session")
def fuzz_target(fuzz_machine: Machine, tmp_path_factory: pytest.TempPathFactory) -> FuzzTarget:
    registry = load_registry()
    platform = fuzz_machine.platform
    names = _backend_names()
    backends: list[Backend] = []
    if names:
        for name in names:
            try:
                backend = registry.get(name)
            except UnknownBackend as exc:
                _fail(f"unknown backend: {exc}")
            availability = backend.probe(platform)
            if not availability.available:
                _fail(f"backend {name} is unavailable on {fuzz_machine.description}: {availability.reason}")
            backends.append(backend)
    elif platform.kind == "cpu":
        backends = [registry.get("reference")]
    else:
        real = [registry.get(n) for n in registry.names() if n != "reference" and not registry.get(n).models_bug]
        backends = [b for b in real if b.probe(platform).available]
        if not backends:
            reasons = "; ".join(f"{b.name}: {b.probe(platform).reason}" for b in real)
            _fail(f"no real-kernel backend can run on {fuzz_machine.description} (a GPU run of the fuzz suite "
                  f"must not quietly test only the CPU reference): {reasons}")
    budget_text = os.environ.get("HICACHE_FUZZ_BYTE_BUDGET", "")
    byte_budget = int(budget_text) if budget_text else (64 << 10 if platform.kind == "cpu" else None)
    base = Path(os.environ[OUT_ENV]) if os.environ.get(OUT_ENV) else tmp_path_factory.getbasetemp() / "fuzz"
    worker = xdist_worker() or "main"
    # One folder per kind, then per worker, so `hicache-fuzz merge OUT/reports --corpus OUT/corpus` needs no
    # shell glob (tox runs commands without a shell).
    return FuzzTarget(fuzz_machine, backends, registry, byte_budget, base / "corpus" / worker,
                      base / "reports" / worker, base / "journal" / worker)


@pytest.fixture(scope="session")
def fuzz_executor(fuzz_target: FuzzTarget) -> Iterator[Executor]:
    """Crash isolation for backends that can take the process down: one persistent worker per xdist worker."""
    machine, registry = fuzz_target.machine, fuzz_target.registry
    executor: Executor
    if any(b.needs_isolation for b in fuzz_target.backends):
        executor = WorkerExecutor(
            [b.name for b in fuzz_target.backends], (), machine.platform.kind,
            float(os.environ.get("HICACHE_FUZZ_CASE_TIMEOUT", "90")), fuzz_target.journal,
            # Load (or, on a cold cache, compile) the backends' JIT menu in 16 threads at startup: a first call
            # per module inside a case costs about 0.5 s even from sglang's cache (build-key hashing), which
            # held a GPU test run at 2.4 cases/s. sglang's per-variant build lock keeps xdist workers from
            # compiling one module twice.
            startup_timeout_s=600, warm_up=True)
    else:
        executor = InProcessExecutor(registry, machine)
    yield executor
    executor.close()
