"""``hicache-fuzz workers start|status|stop``: the standing worker pool (pipeline/standing.py).

``start`` runs a server in the background (``--foreground``: in this process) that keeps ``--count`` workers of
this platform and device set ready: torch, sglang and the harness imported, every backend probed. ``fuzz``,
``gate``, ``replay`` and every command that starts workers take ready ones from it when its workers run what their
own would (same sources, interpreter, folder, environment, MPS server) and start fresh ones otherwise, as without
a server. ``status`` says what the server holds; ``stop`` ends it (idle workers at once, the ones handed to
campaigns when those end, or at once with ``--now``).

The server listens on ``<runtime dir>/workers-<platform>[-<devices>].sock`` (``$HICACHE_FUZZ_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/hicache-fuzz``, else ``/tmp/hicache-fuzz-<uid>``) and logs to the ``.log`` beside it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.commands.arg_types import finite_non_negative_float
from hicache_fuzz.harness.commands.common import add_common, worker_process_count
from hicache_fuzz.harness.model.exit_codes import EXIT_CLEAN, EXIT_UNAVAILABLE, Unavailable, UsageError

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file"}
ACTIONS = ("start", "status", "stop")
START_WAIT_S = 600.0
STOP_WAIT_S = 30.0
LISTEN_TIMEOUT_S = 120.0  # for a background server to answer (it imports torch first)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=ACTIONS,
                        help="start a server of ready workers, show its status, or stop it")
    add_common(parser)
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="start: a backend every worker imports and probes, repeatable (default: every installed "
                             "backend); a campaign's backends must be among them")
    parser.add_argument("--count", type=worker_process_count, default=None, metavar="N|auto",
                        help="start: workers kept ready (auto: the worker processes of one campaign here, as "
                             "fuzz --worker-processes auto)")
    parser.add_argument("--gpu-sharing", choices=["auto", "mps", "contexts"], default="auto",
                        help="start: on CUDA the workers are clients of an MPS server the server owns (auto, where "
                             "nvidia-cuda-mps-control can start one; mps: exit 3 where not) or use contexts")
    parser.add_argument("--foreground", action="store_true",
                        help="start: serve in this process until stopped (SIGTERM/SIGINT) instead of in the background")
    parser.add_argument("--wait", type=finite_non_negative_float, default=None, metavar="S",
                        help=f"start: seconds to wait for every worker to be ready (default {START_WAIT_S:g}; 0: "
                             f"until the server listens); stop: for the server to exit (default {STOP_WAIT_S:g})")
    parser.add_argument("--now", action="store_true",
                        help="stop: also kill the workers campaigns are using (they record crashes)")
    parser.add_argument("--json", default=None, metavar="PATH", help="status: the server's status as JSON")


def run(args: argparse.Namespace) -> int:
    if args.action != "start" and (args.backend or args.count is not None or args.foreground):
        raise UsageError(f"workers {args.action}: --backend, --count and --foreground belong to workers start")
    if args.now and args.action != "stop":
        raise UsageError("--now belongs to workers stop")
    if args.json and args.action != "status":
        raise UsageError("--json belongs to workers status")
    if args.action == "start":
        return start(args)
    path = _socket(_platform_kind(args.platform))
    if args.action == "status":
        return status(path, args.json)
    return stop(path, args.now, STOP_WAIT_S if args.wait is None else args.wait)


def _platform_kind(platform: str) -> str:
    if platform != "auto":
        return platform
    from hicache_fuzz.harness.campaign.parallel import accelerator_kind

    return accelerator_kind()


def _socket(platform_kind: str) -> Path:
    from hicache_fuzz.harness.pipeline.standing import RuntimeDirError, socket_path

    try:
        return socket_path(platform_kind, dict(os.environ))
    except RuntimeDirError as exc:
        raise Unavailable(str(exc)) from None


def start(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions, machine_for, registry_for
    from hicache_fuzz.harness.pipeline.standing import PROTOCOL, ask

    machine = machine_for(args.platform)
    kind = machine.platform.kind
    registry = registry_for(args.backend_plugin)
    unknown = [name for name in args.backend if name not in registry.backends]
    if unknown:
        raise UsageError(f"--backend: unknown backend(s) {', '.join(unknown)}; "
                         f"installed: {', '.join(registry.names())}")
    backends = list(dict.fromkeys(args.backend)) or registry.names()
    count = args.count if args.count is not None else ExecutionOptions().resolved_worker_processes(kind)
    path = _socket(kind)
    running = ask(path, {"op": "status", "protocol": PROTOCOL})
    if running is not None:
        print(f"hicache-fuzz: a standing worker server already runs for {kind} at {path} (pid {running['pid']})")
        _print_status(running)
        return EXIT_CLEAN
    if args.foreground:
        return _serve(kind, backends, args.backend_plugin, count, args.gpu_sharing)
    wait = START_WAIT_S if args.wait is None else args.wait
    return _start_in_background(args, kind, backends, count, path, wait)


def _serve(kind: str, backends: list[str], plugins: list[str], count: int, gpu_sharing: str) -> int:
    from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharingUnavailable
    from hicache_fuzz.harness.pipeline.standing import RuntimeDirError
    from hicache_fuzz.harness.pipeline.standing_server import ServerOptions, ServerRunning, StandingServer

    try:
        server = StandingServer(ServerOptions(kind, backends, list(plugins), count, gpu_sharing))
    except (ServerRunning, GpuSharingUnavailable, RuntimeDirError) as exc:
        raise Unavailable(str(exc)) from None
    except OSError as exc:
        raise Unavailable(f"the standing worker server cannot start: {exc}") from None
    print(f"hicache-fuzz: standing workers for {kind} at {server.socket_path} (pid {os.getpid()}): {count} kept "
          f"ready, backends {', '.join(backends)}; GPU sharing: {server.sharing.mode} ({server.sharing.reason})",
          flush=True)
    try:
        server.serve(install_signal_handlers=True)
    except OSError as exc:
        raise Unavailable(f"the standing worker server stopped: {exc}") from None
    print(f"hicache-fuzz: standing workers for {kind} stopped ({server.handed_over} handed over)", flush=True)
    return EXIT_CLEAN


def _start_in_background(args: argparse.Namespace, kind: str, backends: list[str], count: int, path: Path,
                         wait: float) -> int:
    """Start the server as a process of its own session, logging beside its socket; wait until it listens and
    then, up to `wait` seconds, until its workers are ready."""
    from hicache_fuzz.harness.pipeline.standing import PROTOCOL, ask, runtime_dir

    runtime_dir(create=True)
    log_path = path.with_suffix(".log")
    command = [sys.executable, "-m", "hicache_fuzz", "workers", "start", "--foreground", "--platform", kind,
               "--count", str(count), "--gpu-sharing", args.gpu_sharing]
    for name in backends:
        command += ["--backend", name]
    for plugin in args.backend_plugin:
        command += ["--backend-plugin", plugin]
    try:
        with open(log_path, "ab") as log:
            server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True)
    except OSError as exc:
        raise Unavailable(f"the standing worker server did not start: {exc}") from None
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    answer: dict[str, Any] | None = None
    while answer is None:
        if server.poll() is not None:
            raise Unavailable(f"the standing worker server exited with status {server.returncode}; its log "
                              f"{log_path}:\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            raise Unavailable(f"the standing worker server (pid {server.pid}) did not listen within "
                              f"{LISTEN_TIMEOUT_S:g} s; its log {log_path}")
        time.sleep(0.1)
        answer = ask(path, {"op": "status", "protocol": PROTOCOL})
    print(f"hicache-fuzz: standing worker server for {kind} at {path} (pid {server.pid}, log {log_path})",
          flush=True)
    deadline = time.monotonic() + wait
    while wait and len(answer["ready"]) < answer["count"] and time.monotonic() < deadline:
        if answer["start_failures"] >= 3:
            raise Unavailable(f"its workers do not start: {answer['last_start_error']}")
        time.sleep(0.2)
        answer = ask(path, {"op": "status", "protocol": PROTOCOL}) or answer
    _print_status(answer)
    return EXIT_CLEAN


def status(path: Path, json_path: str | None) -> int:
    from hicache_fuzz.harness.commands.common import write_json_report
    from hicache_fuzz.harness.pipeline.standing import PROTOCOL, ask

    answer = ask(path, {"op": "status", "protocol": PROTOCOL})
    if answer is None:
        print(f"hicache-fuzz: no standing worker server at {path}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    _print_status(answer)
    return EXIT_CLEAN if write_json_report(answer, json_path) else EXIT_UNAVAILABLE


def stop(path: Path, now: bool, wait: float) -> int:
    from hicache_fuzz.harness.pipeline.standing import ask, stop_waiting

    answer = ask(path, {"op": "stop", "now": now})
    if answer is None:
        print(f"hicache-fuzz: no standing worker server at {path}")
        return EXIT_CLEAN
    pid = int(answer["pid"])
    serving = answer.get("serving") or []
    if stop_waiting([pid], wait):
        print(f"hicache-fuzz: the standing worker server (pid {pid}) stopped its idle workers; it exits when the "
              f"{len(serving)} workers campaigns are using have ended (workers stop --now kills them)")
    else:
        print(f"hicache-fuzz: the standing worker server (pid {pid}) stopped")
    return EXIT_CLEAN


def _print_status(answer: dict[str, Any]) -> None:
    sharing = answer.get("sharing") or {}
    print(f"  pid {answer['pid']}, up {answer['up_s']:.0f} s, {answer['platform']} "
          f"(devices {answer['key'].get('devices', '?')}), socket {answer['socket']}")
    print(f"  workers: {len(answer['ready'])} ready of {answer['count']}, {len(answer['starting'])} starting, "
          f"{len(answer['serving'])} serving campaigns; {answer['handed_over']} handed over, {answer['refused']} "
          f"requests refused, {answer['retired']} retired" + (" (stopping)" if answer["stopping"] else ""))
    print(f"  backends: {', '.join(answer['backends'])}; GPU sharing: {sharing.get('mode')} ({sharing.get('reason')})")
    if answer.get("last_refusal"):
        print(f"  last refusal: {answer['last_refusal']}")
    if answer.get("last_start_error"):
        print(f"  last start failure: {answer['last_start_error'].splitlines()[0]}")


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return ""
