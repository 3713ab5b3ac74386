"""The worker process's side of :mod:`hicache_fuzz.harness.pipeline.worker`: ``python -m
hicache_fuzz.harness.pipeline.worker_main --platform KIND --backend NAME ...``.

It imports the harness and the backends, probes them (its own probe is the one that counts: the parent may have
read its answer from the probe cache), optionally loads the JIT modules of their menus (``--warm-up``), greets
the parent with one ``hello`` line (probes, where its start-up went) and then answers one JSON line per case.
Its stdout is redirected to stderr before any backend is imported (sglang and nvcc print), so the protocol
channel stays clean.

A worker of the standing pool (pipeline/standing_server.py) greets its server, waits, and is handed to a campaign,
which sends ``{"op": "adopt", "log": PATH, "warm_up": BOOL, "backends": [...]}`` before any case: the worker
writes its output to that campaign's log from then on, warms up the named backends if asked, and greets again
(``"standing": true``), so the campaign reads a greeting as from a worker it started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.model.case import Case

if TYPE_CHECKING:
    from hicache_fuzz.harness.model.platform import Machine
    from hicache_fuzz.harness.pipeline.reuse import StorageReuse
    from hicache_fuzz.kernels.base import Backend
    from hicache_fuzz.kernels.registry import Registry

PROTOCOL = 1


def serve(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    channel = _Channel()  # before any backend is imported
    began = time.perf_counter()
    try:
        worker = _start_up(args, began)
    except Exception as exc:
        channel.reply({"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 2
    channel.reply(worker.hello())
    return _answer_requests(channel, worker)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hicache_fuzz.harness.pipeline.worker_main")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--backend", action="append", default=[])
    parser.add_argument("--backend-plugin", action="append", default=[])
    parser.add_argument("--warm-up", action="store_true")
    return parser.parse_args(argv)


class _Channel:
    """The protocol channel: a private copy of fd 1, one JSON line per message. fd 1 itself (and sys.stdout) then
    point at stderr, the worker's log, so that what backends print never reaches the parent's reader."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def reply(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()


@dataclass
class _Worker:
    """What the worker loaded at start-up: its machine, the backends and their JIT bookkeeping, and where the
    start-up went (for its greeting)."""

    machine: Machine
    registry: Registry
    backends: dict[str, Backend]
    books: list[Any]  # one CompileBooks per shared module cache (Backend.compile_books)
    probes: dict[str, dict[str, Any]]
    torch_threads: int
    startup_s: dict[str, float]  # the harness and torch imports, the backends' probes, the JIT warm-up
    warm_up_s: float
    refused_builds_replayed: int

    def hello(self) -> dict[str, Any]:
        return {
            "op": "hello",
            "protocol": PROTOCOL,
            "pid": os.getpid(),
            "platform": self.machine.description,
            "probes": self.probes,
            "warm_up_s": self.warm_up_s,
            "torch_threads": self.torch_threads,
            # where its start-up went (the interpreter's own start is before the harness imports)
            "startup_s": self.startup_s,
            # nvcc runs its warm-up skipped (kernels/refused_builds.py)
            "refused_builds_replayed": self.refused_builds_replayed,
        }


def _start_up(args: argparse.Namespace, began: float) -> _Worker:
    """Import the harness and the backends, probe them (the worker's own probe is the one that counts: the parent
    may have read its answer from the probe cache) and, with --warm-up, load the JIT modules of their menus."""
    from hicache_fuzz.harness.model import platform as platform_mod

    torch_threads = platform_mod.limit_torch_threads()  # before any backend starts a thread pool
    from hicache_fuzz.harness.pipeline import runner  # noqa: F401 - import cost paid up front
    from hicache_fuzz.kernels.buffers import HostMemory  # noqa: F401 - import cost paid up front
    from hicache_fuzz.kernels.registry import load_registry

    machine = platform_mod.require(args.platform)
    registry = load_registry(args.backend_plugin)
    backends = {name: registry.get(name) for name in args.backend}
    imported = time.perf_counter()
    probes = {}
    for name, backend in backends.items():
        availability = backend.probe(machine.platform)
        probes[name] = {"available": availability.available, "reason": availability.reason}
    # JIT bookkeeping, declared by the backends (Backend.compile_books); one object per shared module cache
    books = list({id(b): b for backend in backends.values() if (b := backend.compile_books()) is not None}.values())
    probed = time.perf_counter()
    warm_up_s = _warm_up(list(backends.values()), machine.platform) if args.warm_up else 0.0
    from hicache_fuzz.kernels.refused_builds import replayed_here

    return _Worker(machine, registry, backends, books, probes, torch_threads,
                   {"import": round(imported - began, 3), "probe": round(probed - imported, 3),
                    "warm_up": round(warm_up_s, 3)}, warm_up_s, replayed_here())


def _answer_requests(channel: _Channel, worker: _Worker) -> int:
    """Answer the parent's requests until it asks the worker to exit (0) or a case leaves the device context
    unusable (3: start afresh). "run": one case, one reply. "batch": one reply per case as it finishes, then
    {"op": "batch_done"} with the batch's stage clock; a worker that dies mid-batch has answered every case
    before the one that killed it."""
    from hicache_fuzz.harness.pipeline.reuse import StorageReuse

    stages: dict[str, float] = {}  # per runner stage, since the last batch_done
    reuse = StorageReuse()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        if request.get("op") == "adopt":
            if not _adopt(channel, worker, request):
                return 2
            continue
        batch = request["cases"] if request.get("op") == "batch" else [request["case"]]
        reusing = bool(request.get("reuse"))
        if not reusing:
            reuse.drop()
        reused_before = reuse.reused
        for position, case_dict in enumerate(batch):
            if not _answer_case(channel, worker, position, case_dict, reuse, reusing, stages):
                return 3  # the CUDA/HIP context is poisoned: start afresh
        if request.get("op") == "batch":
            channel.reply({"op": "batch_done", "stages": stages, "reused": reuse.reused - reused_before})
            stages.clear()
    return 0


def _adopt(channel: _Channel, worker: _Worker, request: dict[str, Any]) -> bool:
    """Taken over by a campaign (a standing worker): its log from now on, the warm-up it asks for, a new greeting.
    False when the log cannot be opened (the reply says why, and the worker exits)."""
    try:
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except (OSError, KeyError) as exc:
        channel.reply({"op": "failed", "error": f"cannot write the campaign's worker log: {exc}"})
        return False
    sys.stderr.flush()
    os.dup2(log, 2)
    os.dup2(log, 1)  # fd 1 is the log too (_Channel): what backends print stays off the protocol channel
    os.close(log)
    if request.get("warm_up") and not worker.warm_up_s:
        chosen = [worker.backends[name] for name in request.get("backends", []) if name in worker.backends]
        worker.warm_up_s = _warm_up(chosen, worker.machine.platform)
        worker.startup_s["warm_up"] = round(worker.warm_up_s, 3)
        from hicache_fuzz.kernels.refused_builds import replayed_here

        worker.refused_builds_replayed = replayed_here()
    channel.reply({**worker.hello(), "standing": True})
    return True


def _answer_case(channel: _Channel, worker: _Worker, position: int, case_dict: dict[str, Any],
                 reuse: StorageReuse, reusing: bool, stages: dict[str, float]) -> bool:
    """Run one case and reply with its result and the JIT modules it built or loaded, or with the error that kept
    it from a result. False when the device context is lost (the reply says so as "fatal")."""
    from hicache_fuzz.harness.pipeline.runner import DeviceContextLost, run_case

    try:
        case = Case.from_dict(case_dict)
        backend = worker.backends.get(case.backend) or worker.registry.get(case.backend)
        marks = [b.mark() for b in worker.books]
        result = run_case(case, backend, worker.machine.platform, worker.machine.device, stage_seconds=stages,
                          reuse=reuse if reusing else None)
        compile_s, compiled = 0.0, {}
        for b, mark in zip(worker.books, marks, strict=True):
            seconds, built = b.since(mark)
            compile_s += seconds
            compiled.update(built)
        channel.reply({"position": position, "result": result.to_dict(), "compile_s": compile_s,
                       "compiled": compiled})
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        reuse.drop()  # what failed may have been the kept storages themselves
        if isinstance(exc, DeviceContextLost) or _is_device_error(exc):
            channel.reply({"position": position, "fatal": str(exc) if isinstance(exc, DeviceContextLost)
                           else message})
            return False
        channel.reply({"position": position, "error": message})
    return True


def _is_device_error(exc: BaseException) -> bool:
    from hicache_fuzz.harness.pipeline.runner import is_device_error

    return is_device_error(exc)


def _warm_up(backends: list[Any], platform: Any) -> float:
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.kernels.compile_books import warm_up

    return warm_up(backends, platform, CaseSpace())


if __name__ == "__main__":
    sys.exit(serve())
