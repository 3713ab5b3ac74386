"""The worker process's side of :mod:`hicache_fuzz.harness.pipeline.worker`: ``python -m
hicache_fuzz.harness.pipeline.worker_main --platform KIND --backend NAME ...``.

It imports the harness and the backends, probes them (its own probe is the one that counts: the parent may have
read its answer from the probe cache), optionally loads the JIT modules of their menus (``--warm-up``), greets
the parent with one ``hello`` line (probes, where its start-up went) and then answers one JSON line per case.
Its stdout is redirected to stderr before any backend is imported (sglang and nvcc print), so the protocol
channel stays clean.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from hicache_fuzz.harness.model.case import Case

PROTOCOL = 1


def serve(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="hicache_fuzz.harness.pipeline.worker_main")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--backend", action="append", default=[])
    parser.add_argument("--backend-plugin", action="append", default=[])
    parser.add_argument("--warm-up", action="store_true")
    args = parser.parse_args(argv)

    # The protocol channel is a private copy of fd 1; fd 1 itself now points at stderr (the log).
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict[str, Any]) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    began = time.perf_counter()
    try:
        from hicache_fuzz.harness.model import platform as platform_mod

        torch_threads = platform_mod.limit_torch_threads()  # before any backend starts a thread pool
        from hicache_fuzz.harness.pipeline.reuse import StorageReuse
        from hicache_fuzz.harness.pipeline.runner import DeviceContextLost, run_case
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
        warm_up_s = 0.0
        if args.warm_up:
            warm_up_s = _warm_up(list(backends.values()), machine.platform)
        from hicache_fuzz.kernels.refused_builds import replayed_here
    except Exception as exc:
        reply({"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 2
    reply(
        {
            "op": "hello",
            "protocol": PROTOCOL,
            "pid": os.getpid(),
            "platform": machine.description,
            "probes": probes,
            "warm_up_s": warm_up_s,
            "torch_threads": torch_threads,
            # where its start-up went (the interpreter's own start is before `began`): the harness and torch
            # imports, the backends' probes (sglang's import), the JIT warm-up
            "startup_s": {"import": round(imported - began, 3), "probe": round(probed - imported, 3),
                          "warm_up": round(warm_up_s, 3)},
            "refused_builds_replayed": replayed_here(),  # nvcc runs its warm-up skipped (kernels/refused_builds.py)
        }
    )

    stages: dict[str, float] = {}
    reuse = StorageReuse()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        # "run": one case, one reply. "batch": one reply per case as it finishes, then {"op": "batch_done"};
        # a worker that dies mid-batch has answered every case before the one that killed it.
        batch = request["cases"] if request.get("op") == "batch" else [request["case"]]
        if not request.get("reuse"):
            reuse.drop()
        reused_before = reuse.reused
        for position, case_dict in enumerate(batch):
            try:
                case = Case.from_dict(case_dict)
                backend = backends.get(case.backend) or registry.get(case.backend)
                marks = [b.mark() for b in books]
                result = run_case(case, backend, machine.platform, machine.device, stage_seconds=stages,
                                  reuse=reuse if request.get("reuse") else None)
                compile_s, compiled = 0.0, {}
                for b, mark in zip(books, marks, strict=True):
                    seconds, built = b.since(mark)
                    compile_s += seconds
                    compiled.update(built)
                reply({"position": position, "result": result.to_dict(), "compile_s": compile_s,
                       "compiled": compiled})
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                reuse.drop()  # what failed may have been the kept storages themselves
                if isinstance(exc, DeviceContextLost) or _is_device_error(exc):
                    reply({"position": position, "fatal": str(exc) if isinstance(exc, DeviceContextLost)
                           else message})
                    return 3  # the CUDA/HIP context is poisoned: start afresh
                reply({"position": position, "error": message})
        if request.get("op") == "batch":
            reply({"op": "batch_done", "stages": stages, "reused": reuse.reused - reused_before})
            stages = {}
    return 0


def _is_device_error(exc: BaseException) -> bool:
    from hicache_fuzz.harness.pipeline.runner import is_device_error

    return is_device_error(exc)


def _warm_up(backends: list[Any], platform: Any) -> float:
    from hicache_fuzz.harness.model.space import CaseSpace
    from hicache_fuzz.kernels.compile_books import warm_up

    return warm_up(backends, platform, CaseSpace())


if __name__ == "__main__":
    sys.exit(serve())
