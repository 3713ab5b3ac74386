"""The standing worker pool, a campaign's side: find the server, ask for a ready worker, drive the one handed over.

A fresh worker pays for its imports (torch, sglang, the harness) and its probes before its first case: tens of
seconds on a GPU. ``hicache-fuzz workers start`` runs a server (pipeline/standing_server.py) that keeps N workers
past that point, idle, and hands one to a campaign that asks: it passes the worker's two pipe descriptors over a
Unix socket (``socket.send_fds``), so the campaign talks to it exactly as to a worker it spawned itself
(pipeline/worker.py). A worker serves one campaign and is then discarded; the server starts another.

Where the server lives: one per platform and device set, listening on
``<runtime dir>/workers-<platform>-<devices>.sock`` (:func:`socket_path`), the runtime dir being
``$HICACHE_FUZZ_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/hicache-fuzz``, else ``/tmp/hicache-fuzz-<uid>``
(:func:`runtime_dir`; made mode 0700, and refused when another user owns it or others may write to it). Both
ends check that the peer runs as the same user (``SO_PEERCRED``).

What makes a worker usable (:func:`worker_key`): the server refuses, and the campaign starts a fresh worker as it
always did, unless the key its worker was started under equals the key of the worker the campaign would start
now: the protocol, the interpreter, the working folder, the platform and device set, torch's build, the GPU
driver, sglang's and sgl_kernel's versions, the fingerprints of the harness's source folders, of the sglang and
sgl_kernel packages and of the AOT build folder (path, size and mtime of every file: the probe cache's rule,
pipeline/source_state.py, kernel sources excepted), each plugin's module file, and the environment variables that
change what a worker does (:data:`KEY_ENV_PREFIXES`, :data:`KEY_ENV_NAMES`). The server computes its workers' key
before each start and again after the greeting, and drops a worker whose sources changed in between, so a worker
that imported a file is never served to a campaign under another version of it (a mutant of
``pool_host/*.py`` included: ``mutate`` runs its campaigns on a copy of sglang, another folder, hence another
key). Besides the key, the worker's MPS server (``CUDA_MPS_PIPE_DIRECTORY``, or none) must be the one a fresh
worker of the campaign would join, and the campaign's backends must be among those the workers probed.

A handed-over worker is the server's child, not the campaign's: :class:`StandingWorker` reads its exit status
from the server (the connection that carried the descriptors stays open for that), so a crash, a hang's kill and
a signal read exactly as with a worker the campaign spawned. ``HICACHE_FUZZ_STANDING_WORKERS=off`` keeps a
process from asking.
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hicache_fuzz.harness.pipeline import source_state

RUNTIME_ENV = "HICACHE_FUZZ_RUNTIME_DIR"
SWITCH_ENV = "HICACHE_FUZZ_STANDING_WORKERS"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
PROTOCOL = 1  # of the server's socket messages
# Environment variables in a worker's key: what sglang, torch, the device runtimes, the fake sglang's planted bugs
# and the harness's own worker-side switches read. The MPS folders are compared on their own (the campaign's MPS
# server against the workers'); the rest are read by the campaign process only, or by this rule itself.
KEY_ENV_PREFIXES = ("SGLANG_", "SGL_", "HICACHE_", "FAKE_SGLANG_", "PYTORCH_", "TORCH_", "CUDA_", "NVIDIA_", "HIP_",
                    "ROCM_", "ROCR_", "HSA_", "AMD_", "TRITON_", "FLASHINFER_", "TVM_")
KEY_ENV_NAMES = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "OMP_NUM_THREADS")
NOT_IN_KEY = frozenset({"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", RUNTIME_ENV, SWITCH_ENV,
                        "HICACHE_FUZZ_PREBUILD", "HICACHE_FUZZ_PROBE_CACHE"})
DEVICE_ENV = {"cuda": ("CUDA_VISIBLE_DEVICES",),
              "rocm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
CONNECT_TIMEOUT_S = 2.0
ANSWER_TIMEOUT_S = 30.0  # the server fingerprints the sources before it answers a take
STATUS_WAIT_S = 10.0  # for the server's report of a worker that is gone
MESSAGE_BYTES = 1 << 20
# A campaign's own key is reused for this long: a pool's members ask for workers together, and each key walks the
# sglang package (thousands of files). The server checks its workers' keys afresh; only the asking side reuses.
KEY_REUSE_S = 1.0


class RuntimeDirError(OSError):
    """The runtime folder cannot be used safely (another user's, or writable by others)."""


def enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(SWITCH_ENV, "on")
    return value.strip().lower() not in {"off", "0", "no", "false"}


def runtime_dir(create: bool = False) -> Path:
    """Where the servers' sockets and logs live (see the module docstring); with `create`, made if missing.
    RuntimeDirError when it is not this user's alone."""
    chosen = os.environ.get(RUNTIME_ENV)
    if chosen:
        folder = Path(chosen).expanduser()
    elif os.environ.get("XDG_RUNTIME_DIR"):
        folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "hicache-fuzz"
    else:
        folder = Path("/tmp") / f"hicache-fuzz-{os.getuid()}"
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = folder.stat()
    except FileNotFoundError:
        return folder
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeDirError(f"the standing pool's folder {folder} is not this user's alone "
                              f"(owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); set {RUNTIME_ENV}")
    return folder


def device_set(platform_kind: str, env: Mapping[str, str]) -> str:
    """The devices a worker of `platform_kind` would see under `env`: "all", or the visible-devices list."""
    for name in DEVICE_ENV.get(platform_kind, ()):
        if env.get(name) is not None:
            return env[name] or "none"
    return "all"


def server_name(platform_kind: str, env: Mapping[str, str]) -> str:
    """`workers-<platform>[-<devices>]`: the one server of this platform and device set."""
    if platform_kind == "cpu":
        return "workers-cpu"
    devices = "".join(c if c.isalnum() or c in "-_" else "_" for c in device_set(platform_kind, env))[:40]
    return f"workers-{platform_kind}-{devices}"


def socket_path(platform_kind: str, env: Mapping[str, str], folder: Path | None = None) -> Path:
    return (folder if folder is not None else runtime_dir()) / f"{server_name(platform_kind, env)}.sock"


def key_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` in a worker's key."""
    return {name: value for name, value in sorted(env.items())
            if name not in NOT_IN_KEY and (name in KEY_ENV_NAMES or name.startswith(KEY_ENV_PREFIXES))}


def harness_folders() -> list[Path]:
    """The folders of the harness's own code (the import root maps onto them): harness/ (this module's
    grandparent, the package root's folder inside it), kernels/, oracles/."""
    import hicache_fuzz.kernels
    import hicache_fuzz.oracles

    return [Path(__file__).resolve().parents[1],
            *(Path(module.__file__ or "").resolve().parent for module in (hicache_fuzz.kernels, hicache_fuzz.oracles))]


def worker_key(python: str, platform_kind: str, plugins: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """What a worker started now by `python` with `env` would run under (see the module docstring). Packages are
    located as this process would import them; since their folders are in the key, a campaign whose path finds
    another copy gets another key."""
    from hicache_fuzz.harness.pipeline import probe_cache
    from hicache_fuzz.harness.pipeline.worker_main import PROTOCOL as WORKER_PROTOCOL

    key = {
        "protocol": f"worker {WORKER_PROTOCOL}, server {PROTOCOL}",
        "python": os.path.abspath(python),  # not resolved: a virtualenv's interpreter is a link to the base one
        "cwd": os.getcwd(),
        "platform": platform_kind,
        "devices": device_set(platform_kind, env),
        "torch": source_state.torch_build(),
        "driver": source_state.driver_version(),
        "harness": " ".join(f"{folder} {source_state.files_digest(folder)}" for folder in harness_folders()),
        "aot_build": probe_cache.aot_build_state(),
        "plugins": "; ".join(f"{spec} at {source_state.module_file(spec.partition(':')[0])}" for spec in plugins),
        "env": json.dumps(key_env(env)),
    }
    for package in probe_cache.WATCHED_PACKAGES:
        key[package] = source_state.installed_version(package)
        key[f"{package}_files"] = source_state.package_files(package)
    return key


_reused_keys: dict[str, tuple[float, dict[str, str]]] = {}
_reused_lock = threading.Lock()


def campaign_key(python: str, platform_kind: str, plugins: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """worker_key for the asking campaign, computed at most once per KEY_REUSE_S for the same inputs (the path this
    process locates packages on included). A campaign whose sources change within that second of its start-up may
    take workers of the sources it started with, as its own parent process imported them."""
    inputs = json.dumps([python, platform_kind, list(plugins), key_env(env), device_set(platform_kind, env),
                         os.getcwd(), sys.path])
    now = time.monotonic()
    with _reused_lock:
        kept = _reused_keys.get(inputs)
        if kept is not None and now - kept[0] < KEY_REUSE_S:
            return dict(kept[1])
    key = worker_key(python, platform_kind, plugins, env)
    with _reused_lock:
        _reused_keys.clear()  # one entry: a process asks under one set of inputs
        _reused_keys[inputs] = (now, key)
    return dict(key)


def differences(ours: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The fields of two keys that differ."""
    return sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))


def peer_uid(connection: socket.socket) -> int:
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def send_message(connection: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(connection, [data], list(fds))
    else:
        connection.sendall(data)


def receive_message(connection: socket.socket, timeout: float | None,
                    max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (a sequenced packet) and the descriptors that came with it; (None, []) when the peer closed
    the connection. socket.timeout when nothing came within `timeout`."""
    connection.settimeout(timeout)
    if max_fds:
        data, fds, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, max_fds)
    else:
        data, fds = connection.recv(MESSAGE_BYTES), []
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"not a message: {data[:200]!r}")
    return message, list(fds)


def connect(path: Path) -> socket.socket | None:
    """A connection to the server at `path`, or None when none answers there (or it runs as another user)."""
    if not path.exists():
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.settimeout(CONNECT_TIMEOUT_S)
        connection.connect(str(path))
        if peer_uid(connection) != os.getuid():
            raise ConnectionRefusedError(f"{path}: the server runs as another user")
    except OSError:
        connection.close()
        return None
    return connection


def ask(path: Path, message: Mapping[str, Any], timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any] | None:
    """One request, one answer ("status", "stop"); None when no server answers at `path`."""
    connection = connect(path)
    if connection is None:
        return None
    with connection:
        try:
            send_message(connection, message)
            answer, _ = receive_message(connection, timeout)
        except (OSError, ValueError):
            return None
    return answer


class StandingWorker:
    """A worker handed over by the standing pool's server, driven as a ``subprocess.Popen`` of its own is (pid,
    stdin, stdout, poll, wait): its pipes came over the socket, its exit status comes from the server, whose child
    it is. The worker was started in a session of its own, so its process group can be killed by its pid."""

    def __init__(self, connection: socket.socket, pid: int, stdin_fd: int, stdout_fd: int,
                 startup_log: str, server_pid: int) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = os.fdopen(stdin_fd, "wb")
        self.stdout: IO[bytes] | None = os.fdopen(stdout_fd, "rb")
        self.returncode: int | None = None
        self.startup_log = startup_log  # its output up to the hand-over, in the server's folder
        self.server_pid = server_pid
        self.status_lost = False  # the server went away before it reported the worker's end
        self._connection: socket.socket | None = connection
        self._pidfd = _open_pidfd(pid)

    def poll(self) -> int | None:
        """The exit status once the worker has ended (negative: the signal), else None. A worker seen gone is
        waited for until the server reports it, which it does at once."""
        if self.returncode is None and self._connection is not None:
            ready, _, _ = select.select([self._connection], [], [], 0)
            if ready or self._gone():
                self._read_status(STATUS_WAIT_S)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status (None if the server could not tell it); subprocess.TimeoutExpired as Popen raises."""
        if self.returncode is None and self._connection is not None:
            self._read_status(timeout)
        return self.returncode

    def release(self) -> None:
        """Close the connection (the server kills the worker if it still runs) and the pid descriptor."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _gone(self) -> bool:
        if self._pidfd is not None:
            ready, _, _ = select.select([self._pidfd], [], [], 0)
            return bool(ready)
        try:
            with open(f"/proc/{self.pid}/stat") as handle:
                return handle.read().rpartition(")")[2].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True

    def _read_status(self, timeout: float | None) -> None:
        assert self._connection is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and not self.status_lost:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"standing worker {self.pid}", timeout or 0.0)
            try:
                message, _ = receive_message(self._connection, left)
            except TimeoutError:
                continue
            except (OSError, ValueError):
                message = None
            if message is None:  # the server is gone: nobody can tell the status any more
                self.status_lost = True
            elif message.get("op") == "exited":
                self.returncode = int(message["returncode"])


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an older kernel or Python: /proc tells instead
        return None


@dataclass
class Taken:
    """What asking the server gave: a worker, or why none (an empty note: no server was asked)."""

    worker: StandingWorker | None = None
    note: str = ""


def take(python: str, platform_kind: str, backends: Sequence[str], plugins: Sequence[str],
         env: Mapping[str, str], role: str) -> Taken:
    """A ready worker from this platform and device set's server, when one runs and has a worker this campaign
    may use (see the module docstring); else the reason none was taken."""
    if not enabled():
        return Taken()
    try:
        path = socket_path(platform_kind, env)
    except RuntimeDirError as exc:
        return Taken(note=str(exc))
    connection = connect(path)
    if connection is None:
        return Taken()
    request = {"op": "take", "protocol": PROTOCOL, "key": campaign_key(python, platform_kind, plugins, env),
               "backends": list(backends), "mps": env.get(MPS_PIPE_ENV, ""), "role": role, "pid": os.getpid()}
    try:
        send_message(connection, request)
        answer, fds = receive_message(connection, ANSWER_TIMEOUT_S, max_fds=2)
    except (OSError, ValueError) as exc:
        connection.close()
        return Taken(note=f"the standing pool at {path} did not answer: {exc}")
    if answer is None or not answer.get("ok") or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        connection.close()
        why = (answer or {}).get("reason", "no answer")
        return Taken(note=f"no worker from the standing pool at {path}: {why}")
    worker = StandingWorker(connection, int(answer["pid"]), fds[0], fds[1], str(answer.get("log", "")),
                            int(answer.get("server_pid", 0)))
    return Taken(worker=worker)


def server_sharing(platform_kind: str, env: Mapping[str, str], python: str = sys.executable,
                   plugins: Sequence[str] = ()) -> dict[str, Any] | None:
    """The MPS setting of this platform's server, when one runs whose workers this campaign could take (its key
    is the campaign's): {"mode", "reason", "env"}; else None. A pool on CUDA joins that MPS server rather than
    starting its own (pipeline/pool.py), so that the workers it takes and those it starts share one."""
    if not enabled():
        return None
    try:
        path = socket_path(platform_kind, env)
    except RuntimeDirError:
        return None
    status = ask(path, {"op": "status", "protocol": PROTOCOL})
    if status is None or status.get("key") != campaign_key(python, platform_kind, plugins, env):
        return None
    sharing = status.get("sharing")
    return sharing if isinstance(sharing, dict) else None


def close_standing(proc: object) -> None:
    """Release what a handed-over worker holds beside its pipes (the server's connection); nothing for others."""
    if isinstance(proc, StandingWorker):
        proc.release()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def stop_waiting(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait up to `timeout` for `pids` to end; those still running."""
    deadline = time.monotonic() + timeout
    left = [pid for pid in pids if pid_alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if pid_alive(pid)]
    return left

