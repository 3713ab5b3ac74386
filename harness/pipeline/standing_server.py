"""The standing worker pool's server: N workers kept ready for campaigns of one platform and device set.

``hicache-fuzz workers start`` (commands/workers.py) runs :class:`StandingServer`. It starts workers as a campaign
does (pipeline/worker.py's command line, in sessions of their own), reads each one's greeting (imports done,
backends probed) and keeps it idle. A campaign that asks (pipeline/standing.py) gets the oldest ready worker whose
key is the campaign's: the server sends the worker's stdin and stdout descriptors over the Unix socket, closes its
own copies and starts a replacement. The connection stays open until the worker ends, and the server, its parent,
sends the exit status over it (a signal as a negative number, as ``Popen.returncode`` has it); a campaign that
closes the connection, or dies, leaves the worker to the server, which kills its process group. A worker serves
one campaign; none is ever taken back.

Sources: the key of the workers (standing.worker_key) is computed before each start and again after the greeting
(a worker whose sources changed while it imported them is dropped), and every ``KEY_CHECK_S`` while idle: when the
sources changed, the ready workers are stopped and new ones started, so a kernel developer's next campaign after an
edit of sglang's or the harness's Python finds workers of the new sources.

MPS (CUDA): the server owns the MPS daemon of its workers (pipeline/gpu_sharing.py's private daemon, or a site's),
since a worker joins MPS when it makes its CUDA context, at start-up. A pool that takes its workers joins that MPS
server for the workers it starts itself (pipeline/pool.py), and a campaign whose workers would join another MPS
server, or none, is refused. Under MPS a fatal fault of one client reaches every client of the server, the idle
workers and other campaigns' workers included; each campaign's own fall-back (gpu_sharing) then replays its lost
cases on plain contexts, as it does within one campaign. The daemon is stopped when the server exits, after the
last worker it handed over has ended.

Stopping (``workers stop``, SIGTERM, SIGINT): the socket is removed at once and idle workers are stopped; the
server exits when the workers it handed over have ended with their campaigns, and reaps every worker it started
before it does (``workers stop`` returning means none is left). ``--now`` (or a second signal)
kills those too, which their campaigns record as crashes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.pipeline.gpu_sharing import GpuSharing, start_gpu_sharing
from hicache_fuzz.harness.pipeline.standing import (
    MPS_PIPE_ENV,
    PROTOCOL,
    differences,
    peer_uid,
    receive_message,
    runtime_dir,
    send_message,
    server_name,
    worker_key,
)
from hicache_fuzz.harness.pipeline.worker import worker_command

KEY_CHECK_S = 5.0  # how often an idle server fingerprints the sources again
MAX_START_FAILURES = 3  # workers in a row that did not start: the server stops starting more (status says why)
ACCEPT_POLL_S = 0.2  # how soon the accept loop sees a stop
WATCH_POLL_S = 0.05  # how often a handed-over worker is polled where no pid descriptor is available
ERROR_TAIL_BYTES = 2000


class ServerRunning(RuntimeError):
    """Another server already serves this platform and device set."""


@dataclass
class ServerOptions:
    platform_kind: str
    backends: list[str]  # the backends every worker imports and probes; a campaign's must be among them
    plugins: list[str] = field(default_factory=list)
    count: int = 1  # workers kept ready or starting
    gpu_sharing: str = "auto"  # auto | mps | contexts (pipeline/gpu_sharing.py)
    runtime: Path | None = None  # standing.runtime_dir() when None
    python: str = sys.executable
    env: dict[str, str] | None = None  # the workers' environment (this process's when None)
    startup_timeout_s: float = 600.0


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    key: dict[str, str]
    log: Path
    spawned: float  # monotonic
    ready_at: float = 0.0
    campaign_pid: int = 0
    taken_at: float = 0.0


class StandingServer:
    """See the module docstring. ``serve()`` blocks until stopped; ``request_stop`` may come from any thread."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.base_env = dict(os.environ if options.env is None else options.env)
        self.runtime = options.runtime if options.runtime is not None else runtime_dir(create=True)
        self.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = server_name(options.platform_kind, self.base_env)
        self.socket_path = self.runtime / f"{name}.sock"
        self.log_folder = self.runtime / f"{name}-logs"  # the workers' start-up logs
        self._lock_file = self.runtime / f"{name}.lock"
        self._lock_fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ServerRunning(f"a standing worker server already runs at {self.socket_path}") from None
        try:
            # The workers join MPS at start-up, so the daemon is the server's (see the module docstring); the pool
            # it serves has two or more workers, whatever this server's count.
            self.sharing: GpuSharing = start_gpu_sharing(options.gpu_sharing, options.platform_kind,
                                                         max(2, options.count))
        except BaseException:
            self._release_lock()
            raise
        self.worker_env = self.sharing.worker_env(self.base_env)
        self.worker_env.setdefault("PYTHONUNBUFFERED", "1")
        self.mps_pipe = self.worker_env.get(MPS_PIPE_ENV, "")
        self.log_folder.mkdir(mode=0o700, exist_ok=True)
        self.key = self._current_key()
        self.ready: list[_Worker] = []
        self.starting: list[_Worker] = []
        self.serving: dict[int, _Worker] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._stop_now = False
        self._check_sources = False  # a campaign was refused on its key: fingerprint the sources now
        self._signals = 0
        self._spawned = 0
        self._readers: list[threading.Thread] = []  # each reads a starting worker's greeting
        self._started: list[_Worker] = []  # every worker not yet known to be reaped: none outlives the server
        self.handed_over = 0
        self.refused = 0
        self.retired = 0  # ready workers stopped because their sources changed, or found dead while idle
        self.start_failures = 0  # in a row
        self.last_refusal = ""
        self.last_start_error = ""
        self.started_unix = time.time()

    # ---- life ---------------------------------------------------------------------------------------------
    def serve(self, install_signal_handlers: bool = False) -> None:
        """Listen, keep the workers ready, hand them over; return once stopped and every worker has ended."""
        if install_signal_handlers:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, self._on_signal)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.socket_path.unlink(missing_ok=True)  # a dead server's: the lock says none runs
            listener.bind(str(self.socket_path))
            os.chmod(self.socket_path, 0o600)
            listener.listen(16)
            listener.settimeout(ACCEPT_POLL_S)
            filler = threading.Thread(target=self._fill, name="standing-fill", daemon=True)
            filler.start()
            while not self._stopping:
                if self._signals:
                    self.request_stop(now=self._signals > 1)
                    continue
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=self._handle, args=(connection,), name="standing-conn", daemon=True).start()
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
            self.request_stop(now=self._stop_now)
            self._shutdown()

    def request_stop(self, now: bool = False) -> None:
        """Stop taking requests and stop the idle workers; with `now`, kill the handed-over ones too."""
        with self._cond:
            self._stopping = True
            self._stop_now = self._stop_now or now
            ready, starting = self.ready, self.starting
            self.ready, self.starting = [], []
            serving = list(self.serving.values()) if self._stop_now else []
            self._cond.notify_all()
        for worker in ready:
            _end(worker)
        for worker in starting:  # its reader sees it end and closes its pipes
            _kill_group(worker.proc)
        for worker in serving:  # their watchers report the kill to the campaigns
            _kill_group(worker.proc)

    def _on_signal(self, number: int, frame: object) -> None:
        self._signals += 1  # acted on by the accept loop or the shutdown's wait

    def _shutdown(self) -> None:
        with self._cond:
            while self.serving:
                if self._signals > 1 and not self._stop_now:
                    self.request_stop(now=True)
                self._cond.wait(0.2)
            readers = list(self._readers)
        for reader in readers:  # the starting workers were killed: their readers close their pipes
            reader.join(timeout=15)
        with self._cond:  # no worker starts once stopping: the list is final
            started, self._started = self._started, []
        for worker in started:  # whatever a reader or watcher has not reaped yet is killed and reaped here
            if worker.proc.poll() is None:
                _kill_group(worker.proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=30)
        self.sharing.stop()  # after its last client
        shutil.rmtree(self.log_folder, ignore_errors=True)
        self._release_lock()

    def _release_lock(self) -> None:
        # The file stays: removing it would let a server that opened it before the removal and one that creates
        # it afresh both hold "the" lock.
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    # ---- keeping workers ready ----------------------------------------------------------------------------
    def _current_key(self) -> dict[str, str]:
        return worker_key(self.options.python, self.options.platform_kind, self.options.plugins, self.base_env)

    def _fill(self) -> None:
        """Keep `count` workers ready or starting; fingerprint the sources every KEY_CHECK_S and replace the ready
        workers when they changed."""
        checked = time.monotonic()
        while True:
            with self._cond:
                if self._stopping:
                    return
                dead = [w for w in self.ready if w.proc.poll() is not None]
                for worker in dead:
                    self.ready.remove(worker)
                    self.retired += 1
                wanted = self.options.count - len(self.ready) - len(self.starting)
                if self.start_failures >= MAX_START_FAILURES:
                    wanted = 0
            for worker in dead:
                _end(worker)
            if wanted <= 0 and (self._check_sources or time.monotonic() - checked >= KEY_CHECK_S):
                checked, self._check_sources = time.monotonic(), False
                self._follow_sources(self._current_key())
                continue
            for _ in range(max(0, wanted)):
                self._spawn()
            with self._cond:
                if not self._stopping:
                    self._cond.wait(KEY_CHECK_S)

    def _follow_sources(self, key: dict[str, str]) -> None:
        """Take `key` as the sources' now; ready workers of other sources are stopped (the filler replaces them)."""
        with self._cond:
            self.key = key
            stale = [w for w in self.ready if w.key != key]
            for worker in stale:
                self.ready.remove(worker)
            self.retired += len(stale)
            self._cond.notify_all()
        for worker in stale:
            _end(worker)

    def _spawn(self) -> None:
        try:
            key = self._current_key()
        except Exception as exc:  # the sources cannot be read (a package folder gone mid-walk): try again later
            with self._cond:
                self.start_failures += 1
                self.last_start_error = f"the workers' sources could not be fingerprinted: {type(exc).__name__}: {exc}"
            return
        if key != self.key:
            self._follow_sources(key)
        args = worker_command(self.options.python, self.options.platform_kind, self.options.backends,
                              self.options.plugins, warm_up=False)
        with self._cond:
            if self._stopping:
                return
            self._spawned += 1
            log = self.log_folder / f"worker-{self._spawned}.log"
            try:
                with open(log, "wb") as handle:
                    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle,
                                            env=self.worker_env, start_new_session=True)
            except OSError as exc:
                self.start_failures += 1
                self.last_start_error = f"a worker did not start: {exc.strerror or exc} ({exc.filename or args[0]})"
                return
            worker = _Worker(proc, key, log, time.monotonic())
            self.starting.append(worker)
            self._started = [w for w in self._started if w.proc.returncode is None] + [worker]
            reader = threading.Thread(target=self._await_greeting, args=(worker,), name="standing-start", daemon=True)
            # Started under the lock: a stop that comes next must find it joinable.
            reader.start()
            self._readers = [r for r in self._readers if r.is_alive()] + [reader]

    def _await_greeting(self, worker: _Worker) -> None:
        """Ready once it greets and its sources are still those it was started under; else dropped."""
        hello, error = _read_greeting(worker.proc, self.options.startup_timeout_s)
        try:
            same_sources = hello is not None and self._current_key() == worker.key
        except Exception:  # unreadable sources: not known to be the same
            same_sources = False
        with self._cond:
            stopped = worker not in self.starting  # the server is stopping
            if not stopped:
                self.starting.remove(worker)
                if hello is not None and same_sources and not self._stopping:
                    worker.ready_at = time.monotonic()
                    self.ready.append(worker)
                    self.start_failures = 0
                    self._cond.notify_all()
                    return
                if hello is None:
                    self.start_failures += 1
                    self.last_start_error = f"{error}; log {worker.log}: {_tail(worker.log)}"
                else:  # its sources changed while it imported them
                    self.retired += 1
            self._cond.notify_all()
        _end(worker, keep_log=hello is None and not stopped)

    # ---- requests -----------------------------------------------------------------------------------------
    def _handle(self, connection: socket.socket) -> None:
        with connection:
            try:
                if peer_uid(connection) != os.getuid():
                    return
                message, _ = receive_message(connection, 30.0)
            except (OSError, ValueError):
                return
            if message is None:
                return
            op = message.get("op")
            with contextlib.suppress(OSError):
                if op == "status":
                    send_message(connection, self.status())
                elif op == "stop":
                    now = bool(message.get("now"))
                    send_message(connection, {"stopping": True, "pid": os.getpid(), "now": now,
                                              "serving": sorted(self.serving)})
                    self.request_stop(now=now)
                elif op == "take":
                    self._take(connection, message)
                else:
                    send_message(connection, {"ok": False, "reason": f"unknown request {op!r}"})

    def _refusal(self, message: dict[str, Any]) -> str:
        """Why no worker of this server may serve the campaign that asked ("" if one may)."""
        if message.get("protocol") != PROTOCOL:
            return f"protocol {message.get('protocol')!r}, this server speaks {PROTOCOL}"
        if self._stopping:
            return "the server is stopping"
        if str(message.get("mps", "")) != self.mps_pipe:
            theirs = message.get("mps") or "no MPS"
            return (f"the campaign's workers would join {theirs}, this server's workers "
                    f"{self.mps_pipe or 'no MPS'} (docs/engine.md, the standing pool and MPS)")
        backends = message.get("backends")
        missing = sorted(set(backends if isinstance(backends, list) else []) - set(self.options.backends))
        if missing:
            return f"the workers did not probe {', '.join(missing)} (workers start --backend)"
        return ""

    def _take(self, connection: socket.socket, message: dict[str, Any]) -> None:
        reason = self._refusal(message)
        key = message.get("key")
        worker: _Worker | None = None
        with self._cond:
            if not reason:
                alive = [w for w in self.ready if w.proc.poll() is None]
                matching = [w for w in alive if w.key == key]
                if matching:
                    worker = matching[0]
                    self.ready.remove(worker)
                    worker.campaign_pid, worker.taken_at = int(message.get("pid") or 0), time.monotonic()
                    self.serving[worker.proc.pid] = worker
                    self.handed_over += 1
                elif alive or self.key != key:
                    fields = differences(key if isinstance(key, dict) else {}, alive[0].key if alive else self.key)
                    reason = f"the campaign's worker would run under another {', '.join(fields)} than this server's"
                    self._check_sources = True  # perhaps the sources changed since the workers started
                else:
                    reason = f"no worker ready yet ({len(self.starting)} starting)"
            if reason:
                self.refused += 1
                self.last_refusal = reason
            self._cond.notify_all()  # the filler starts a replacement, or looks at the sources now
        if worker is None:
            send_message(connection, {"ok": False, "reason": reason})
            return
        assert worker.proc.stdin is not None and worker.proc.stdout is not None
        try:
            send_message(connection, {"ok": True, "pid": worker.proc.pid, "log": str(worker.log),
                                      "server_pid": os.getpid()},
                         fds=[worker.proc.stdin.fileno(), worker.proc.stdout.fileno()])
        except OSError:
            _kill_group(worker.proc)
        finally:
            # The campaign holds the pipes now: closing ours lets the worker see its end when the campaign closes.
            with contextlib.suppress(OSError):
                worker.proc.stdin.close()
            worker.proc.stdout.close()
        self._watch(connection, worker)

    def _watch(self, connection: socket.socket, worker: _Worker) -> None:
        """Until the worker ends: report its exit status to the campaign; kill it if the campaign goes away."""
        proc = worker.proc
        pidfd = _open_pidfd(proc.pid)
        campaign_gone = False
        try:
            while (code := proc.poll()) is None:
                waits: list[Any] = ([] if campaign_gone else [connection]) + ([pidfd] if pidfd is not None else [])
                readable, _, _ = select.select(waits, [], [], 1.0 if pidfd is not None else WATCH_POLL_S)
                if connection in readable:
                    try:
                        data = connection.recv(1 << 16)
                    except OSError:
                        data = b""
                    if not data:  # the campaign closed its end or died: nobody drives the worker any more
                        campaign_gone = True
                        _kill_group(proc)
            with contextlib.suppress(OSError):
                send_message(connection, {"op": "exited", "returncode": code})
        finally:
            if pidfd is not None:
                os.close(pidfd)
            with self._cond:
                self.serving.pop(proc.pid, None)
                self._cond.notify_all()
            worker.log.unlink(missing_ok=True)  # the campaign copied its end into its own log

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._cond:
            return {
                "op": "status", "protocol": PROTOCOL, "pid": os.getpid(), "socket": str(self.socket_path),
                "log_folder": str(self.log_folder), "platform": self.options.platform_kind,
                "count": self.options.count, "backends": list(self.options.backends),
                "plugins": list(self.options.plugins), "python": self.options.python,
                "ready": [{"pid": w.proc.pid, "idle_s": round(now - w.ready_at, 1)} for w in self.ready],
                "starting": [{"pid": w.proc.pid, "for_s": round(now - w.spawned, 1)} for w in self.starting],
                "serving": [{"pid": w.proc.pid, "campaign_pid": w.campaign_pid, "for_s": round(now - w.taken_at, 1)}
                            for w in self.serving.values()],
                "handed_over": self.handed_over, "refused": self.refused, "last_refusal": self.last_refusal,
                "retired": self.retired, "start_failures": self.start_failures,
                "last_start_error": self.last_start_error, "stopping": self._stopping,
                "up_s": round(time.time() - self.started_unix, 1),
                "sharing": {"mode": self.sharing.mode, "reason": self.sharing.reason, "env": dict(self.sharing.env)},
                "key": dict(self.key),
            }


def _read_greeting(proc: subprocess.Popen[bytes], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """The worker's greeting (read from its stdout without reading past it), or None and why not."""
    import json

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"no greeting within {timeout:g} s"
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            return None, f"the worker ended (status {proc.returncode}) before its greeting"
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    try:
        hello = json.loads(line)
    except ValueError:
        return None, f"an unreadable greeting: {line[:200]!r}"
    if not isinstance(hello, dict) or hello.get("op") != "hello" or rest:
        detail = hello.get("error", hello) if isinstance(hello, dict) else hello
        return None, f"the worker did not start: {detail}"
    return hello, ""


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _end(worker: _Worker, keep_log: bool = False) -> None:
    """Kill an idle worker (and anything it started), reap it, close its pipes."""
    _kill_group(worker.proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(timeout=10)
    for stream in (worker.proc.stdin, worker.proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if not keep_log:
        worker.log.unlink(missing_ok=True)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - ERROR_TAIL_BYTES))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""
