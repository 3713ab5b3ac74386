"""Backend probes kept on disk per machine state, so a run does not import sglang only to learn what it learnt before.

Probing the sglang backends imports sglang (seconds to tens of seconds), and a campaign's worker imports it again to run
the cases. The answer depends only on the machine's state, so it is kept as plain JSON under
``${HICACHE_FUZZ_CACHE_DIR:-~/.cache/hicache-fuzz}/probes/``, one file per backend and state, and the next run
with the same state reads it instead of probing.

The state (:func:`machine_state`) is read without importing sglang: the platform and GPU (the machine's
description: name, CUDA/HIP version, capability), the GPU driver's version, torch's version and build, sglang's
and sgl_kernel's installed versions, sglang's git commit where it is a checkout, and the path, size and mtime of
every file of the sglang and sgl_kernel packages and of this harness's ``kernels/`` folder (the probes' own
code), plus the AOT build folder's, the JIT kernel sources excepted (compiled when a case needs them, never read by
a probe). That rule is pipeline/source_state.py's, shared with the standing pool's key (pipeline/standing.py). A
backend's key adds its name, its class and its module file's size and mtime (a plugin's code). Any change gives
another key, so the old entry is never read again.

An entry is trusted only as far as it can be checked: one that cannot be read, is not the JSON written here, or
whose state differs from this machine's is ignored, the backend is probed and the entry rewritten. A backend
taken as available from an entry is still confirmed where it runs: a worker probes its backends for itself, and
one that finds a cached-available backend unavailable fails the run loudly (``contradictions``, exit 3) after
removing the entry, and one that finds a cached-unavailable backend available removes that entry; in process,
the real probe runs once before the backend's first case (:func:`confirm_in_process`).
``HICACHE_FUZZ_PROBE_CACHE=off`` probes every time.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.model.json_input import InputError, read_json_file
from hicache_fuzz.harness.model.platform import Machine
from hicache_fuzz.harness.pipeline import source_state
from hicache_fuzz.kernels.base import Availability, Backend
from hicache_fuzz.kernels.registry import BrokenBackend

CACHE_ENV = "HICACHE_FUZZ_CACHE_DIR"
SWITCH_ENV = "HICACHE_FUZZ_PROBE_CACHE"
FORMAT = 1
MAX_ENTRY_BYTES = 64 * 1024
# Packages whose files the probes' answers depend on (found without importing them).
WATCHED_PACKAGES = ("sglang", "sgl_kernel")
# Kernel sources are left out of the fingerprints (source_state.KERNEL_SOURCE_SUFFIXES): no probe reads them, so
# a kernel change (what every kernel PR brings) keeps the probes' answers, and a campaign after it does not import
# sglang in its parent to probe again. A probe answer they did change would still be caught by the workers' own
# probes (contradictions).


class ProbeRaised(Exception):
    """A backend's probe raised: the backend cannot run here (the caller says so, exit 3)."""


def cache_folder() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/hicache-fuzz").expanduser() / "probes"


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "on").strip().lower() not in {"off", "0", "no", "false"}


# The one rule for "did the sources change" (pipeline/source_state.py); a name of this module so that tests can
# give the state another torch.
_torch_build = source_state.torch_build


def machine_state(machine: Machine) -> dict[str, str]:
    """What every probe's answer depends on, read without importing sglang (see the module docstring)."""
    from hicache_fuzz.kernels import sglang_common

    state = {
        "platform": f"{machine.platform.kind} {machine.platform.compute_capability}",
        "machine": machine.description,
        "driver": source_state.driver_version(),
        "torch": _torch_build(),
        "harness_kernels": source_state.files_digest(Path(sglang_common.__file__).resolve().parent),
    }
    state["aot_build"] = aot_build_state()
    for package in WATCHED_PACKAGES:
        state[package] = source_state.installed_version(package)
        state[f"{package}_files"] = source_state.package_files(package)
    state["sglang_origin"] = sglang_common.sglang_origin()  # version, folder and a checkout's git commit
    return state


def aot_build_state() -> str:
    """The AOT build folder and the fingerprint of its files (the ops a probe or a worker loads from it)."""
    from hicache_fuzz.kernels.aot_build.loader import build_dir

    aot = build_dir()
    return f"{aot} {source_state.files_digest(aot)}" if aot.is_dir() else f"{aot} (none)"


def backend_key(backend: Backend, state: dict[str, str]) -> dict[str, str]:
    """`state` plus what identifies the backend's own probe code."""
    cls = type(backend)
    module = importlib.import_module(cls.__module__)
    source = getattr(module, "__file__", None) or ""
    try:
        stat = os.stat(source)
        code = f"{source} {stat.st_size} {stat.st_mtime_ns}"
    except OSError:
        code = source
    return {**state, "backend": backend.name, "class": f"{cls.__module__}.{cls.__qualname__}", "code": code}


@dataclass
class Probed:
    """One backend's probe as a run used it: the answer, where it came from, what it cost."""

    availability: Availability
    source: str  # "cached" | "measured"
    seconds: float
    entry: Path | None = None


@dataclass
class ProbeLog:
    """The probes of this process, for the start-up record: wall seconds, each backend's source."""

    seconds: float = 0.0
    backends: dict[str, str] = field(default_factory=dict)  # name -> cached | measured

    def source(self) -> str:
        """cached (every probe read from disk), measured (none), mixed, or none (nothing probed)."""
        sources = set(self.backends.values())
        if not sources:
            return "none"
        return sources.pop() if len(sources) == 1 else "mixed"

    def record(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "source": self.source(), "backends": dict(self.backends)}


LOG = ProbeLog()
_trusted: dict[str, Path] = {}  # backends taken as available from an entry, not yet confirmed by a real probe
_refused: dict[str, Path] = {}  # backends taken as unavailable from an entry (a worker that finds one usable drops it)
_lock = threading.Lock()
_state: dict[str, dict[str, str]] = {}  # machine description -> its state, read once per process


def _state_for(machine: Machine) -> dict[str, str]:
    with _lock:
        if machine.description not in _state:
            _state[machine.description] = machine_state(machine)
        return _state[machine.description]


def forget_state() -> None:
    """Read the machine state again at the next probe and drop the unconfirmed cached answers (tests change the
    state within one process)."""
    with _lock:
        _state.clear()
        _trusted.clear()
        _refused.clear()


def _entry_path(key: dict[str, str]) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:40]
    return cache_folder() / f"{name}.json"


def _read(path: Path, key: dict[str, str]) -> Availability | None:
    if not path.exists():
        return None
    try:
        data = read_json_file(path, max_bytes=MAX_ENTRY_BYTES)
    except InputError:
        return None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key
            and isinstance(data.get("available"), bool) and isinstance(data.get("reason"), str)):
        return None
    return Availability(data["available"], data["reason"])


def _write(path: Path, key: dict[str, str], availability: Availability, seconds: float) -> None:
    """Atomically (a reader sees a whole entry or none); a folder that cannot be written is not an error."""
    data = {"format": FORMAT, "key": key, "available": availability.available, "reason": availability.reason,
            "probe_seconds": round(seconds, 3)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        pass


def probe(backend: Backend, machine: Machine) -> Probed:
    """`backend`'s availability on `machine`: from its entry when one matches, else probed and written.
    ProbeRaised when the probe itself raises (a plugin's)."""
    started = time.perf_counter()
    # A backend whose module failed to import answers at once, and what fixes it may lie outside the state.
    keep = enabled() and not isinstance(backend, BrokenBackend)
    key = backend_key(backend, _state_for(machine)) if keep else None
    path = _entry_path(key) if key is not None else None
    if path is not None and key is not None and (cached := _read(path, key)) is not None:
        with _lock:
            (_trusted if cached.available else _refused)[backend.name] = path
        return Probed(cached, "cached", time.perf_counter() - started, path)
    try:
        availability = backend.probe(machine.platform)
    except Exception as exc:
        raise ProbeRaised(f"{type(exc).__name__}: {exc}") from None
    seconds = time.perf_counter() - started
    if path is not None and key is not None:
        _write(path, key, availability, seconds)
    return Probed(availability, "measured", seconds, path)


def probe_all(backends: Iterable[Backend], machine: Machine,
              probe_one: Callable[[Backend, Machine], Probed] = probe) -> dict[str, Probed | ProbeRaised]:
    """Probe `backends` concurrently (each in a thread: an import or a driver call waits, the others go on);
    logs the wall time and each source in LOG. A probe that raised is returned as its ProbeRaised."""
    chosen = list(backends)
    started = time.perf_counter()

    def one(backend: Backend) -> Probed | ProbeRaised:
        try:
            return probe_one(backend, machine)
        except ProbeRaised as exc:
            return exc

    if len(chosen) <= 1:
        results = [one(b) for b in chosen]
    else:
        with ThreadPoolExecutor(max_workers=len(chosen), thread_name_prefix="hicache-fuzz-probe") as pool:
            results = list(pool.map(one, chosen))
    found = {b.name: r for b, r in zip(chosen, results, strict=True)}
    with _lock:
        LOG.seconds += time.perf_counter() - started
        for name, result in found.items():
            if isinstance(result, Probed):
                LOG.backends[name] = result.source
    return found


def contradictions(worker_probes: dict[str, Any]) -> list[str]:
    """The backends an entry said are available that a worker's own probe finds unavailable, each with the
    worker's reason; their entries are removed (the next run probes them). A backend the worker confirms is
    trusted from then on. An entry that said unavailable of a backend the worker finds available is removed
    too (this run goes on without that backend; the next one probes it)."""
    found = []
    with _lock:
        for name, probed in worker_probes.items():
            if not isinstance(probed, dict):
                continue
            refused = _refused.pop(name, None)
            if refused is not None and probed.get("available"):
                refused.unlink(missing_ok=True)
            path = _trusted.pop(name, None)
            if path is None or probed.get("available", True):
                continue
            path.unlink(missing_ok=True)
            found.append(f"backend {name}: the probe cache ({path}) said available, but the worker finds it "
                         f"unavailable: {probed.get('reason', '')} (entry removed; run again)")
    return found


def confirm_in_process(backend: Backend, machine: Machine) -> str:
    """For a backend taken as available from an entry and about to run in this process: its real probe, once.
    Returns '' when it is available, else why not (its entry is removed)."""
    with _lock:
        path = _trusted.pop(backend.name, None)
    if path is None:
        return ""
    try:
        availability = backend.probe(machine.platform)
    except Exception as exc:
        availability = Availability(False, f"its probe raised {type(exc).__name__}: {exc}")
    if availability.available:
        return ""
    path.unlink(missing_ok=True)
    return (f"backend {backend.name}: the probe cache ({path}) said available, but its probe here finds it "
            f"unavailable: {availability.reason} (entry removed; run again)")
