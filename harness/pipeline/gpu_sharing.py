"""How a worker pool's processes share one NVIDIA GPU: separate CUDA contexts, or one private MPS server.

Each worker process owns a CUDA context, and the GPU time-slices between contexts: six copies of the bare loop
at once run little faster together than one alone, so six workers add little over three and each case's waits
for the device grow with the worker count. Under NVIDIA's Multi-Process Service the clients' work runs in one
server context, concurrently, and the default campaign runs nearly twice as fast (docs/engine.md, "Sharing one
GPU between workers").

So on CUDA a pool of two or more workers (``--gpu-sharing auto``) starts a **private** MPS control daemon: its
own pipe and log folders in a temporary directory, handed only to this pool's workers through
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``. The GPU's compute mode is not touched, other processes
(the campaign parent included) keep their own contexts, and the daemon is told to quit when the pool closes.
Where ``nvidia-cuda-mps-control`` is missing or its server does not come up, the pool runs with contexts and the
report says why; ``--gpu-sharing mps`` makes that an error instead. A site that already runs MPS for this user
(``CUDA_MPS_PIPE_DIRECTORY`` set) is used as it is and never stopped.

The price is fault containment. A fatal device fault in one MPS client (an illegal address) is reported to
every client of the server, so the other workers lose their batches too. The first batch lost under MPS to
anything but a launch the driver refused for that client alone (:func:`spreads`) therefore ends MPS for the rest
of the campaign (:meth:`GpuSharing.fall_back`): workers started afterwards get plain contexts, and the lost cases
are replayed alone in them. (An illegal address in one worker costs other workers' cases, clean alone; a launch
the driver refused, like sglang's known zero-length launches, "invalid argument", leaves only its own worker's
context unusable, so it costs that worker a restart under MPS and nothing else.) A case that died in a batch
under MPS but runs clean alone is then another client's collateral, not a finding: the pool records it
(``collateral``) instead of reporting a CRASH, and keeps the batch file. A worker that cannot start as an MPS
client (its server gone) also ends MPS, and is started once more on a plain context. On ROCm there is no MPS (HIP
processes share the GPU through hardware queues), so the mode is always contexts there.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
SHARING_CHOICES = ("auto", "mps", "contexts")
SERVER_START_TIMEOUT_S = 10.0


class GpuSharingUnavailable(RuntimeError):
    """--gpu-sharing mps was asked for and cannot be had (the message says why)."""


@dataclass
class Collateral:
    """A case lost in a batch under MPS that ran clean alone: recorded, not reported as a finding."""

    case_id: str
    backend: str
    lost: str  # how the batch was lost (first line)
    alone: str  # the outcome of the case run alone
    saved_batch: str

    def to_dict(self) -> dict[str, str]:
        return {"case_id": self.case_id, "backend": self.backend, "lost": self.lost, "alone": self.alone,
                "saved_batch": self.saved_batch}


@dataclass
class GpuSharing:
    """The pool's sharing mode, shared by its members (they read ``generation`` and ``worker_env`` at every
    spawn); ``fall_back`` is the one transition, MPS -> contexts, and happens at most once."""

    mode: str  # "mps" or "contexts"
    reason: str
    env: dict[str, str] = field(default_factory=dict)  # what MPS clients get on top of the parent's environment
    generation: int = 0  # raised by fall_back: a worker spawned before it is an MPS client
    fell_back: str | None = None  # why MPS ended during the campaign
    collateral: list[Collateral] = field(default_factory=list)
    _daemon_dir: Path | None = None  # the private daemon's folder (None: no daemon of ours)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def mps(self) -> bool:
        return self.mode == "mps"

    def worker_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a worker spawned now: the base (the parent's) plus the MPS folders while MPS is on,
        or minus them after a fall-back (so a site's MPS is left too)."""
        if self.fell_back is not None:
            return self.plain_env(base)
        env = dict(os.environ if base is None else base)
        if self.mps:
            env.update(self.env)
        return env

    def plain_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a worker on a plain context whatever the mode: the base less the MPS folders (a
        pool's spares under MPS, worker.py)."""
        env = dict(os.environ if base is None else base)
        for name in MPS_ENV:
            env.pop(name, None)
        return env

    def fall_back(self, why: str) -> bool:
        """End MPS for the rest of the pool's life (a batch was lost under it); True if this call did."""
        with self._lock:
            if not self.mps:
                return False
            self.mode, self.fell_back, self.generation = "contexts", why.splitlines()[0][:300], self.generation + 1
            return True

    def record_collateral(self, entry: Collateral) -> None:
        with self._lock:
            self.collateral.append(entry)

    def stop(self) -> None:
        """Tell our private daemon to quit (its server with it) and remove its folder; a site's is left alone."""
        folder, self._daemon_dir = self._daemon_dir, None
        if folder is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _control(["quit"], _daemon_env(folder), timeout=10)
        shutil.rmtree(folder, ignore_errors=True)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason, "fell_back": self.fell_back,
                "collateral": [c.to_dict() for c in self.collateral[:50]], "collateral_count": len(self.collateral)}


# Errors the CUDA driver returns for one client's own launch, before anything runs on the GPU: under MPS they
# cost that client its context (measured), never the other clients' (they are not GPU exceptions).
CLIENT_LOCAL_ERRORS = ("invalid argument", "invalid configuration argument", "too many resources requested",
                       "invalid device function", "no kernel image is available", "named symbol not found")


def spreads(error: str) -> bool:
    """Whether a worker lost under MPS with `error` may have taken the other clients with it: anything but a
    launch the driver refused (a signal, an illegal address, an assert, an unknown death all count)."""
    first = error.splitlines()[0] if error else ""
    return not any(text in first for text in CLIENT_LOCAL_ERRORS)


def contexts(reason: str) -> GpuSharing:
    return GpuSharing("contexts", reason)


def start_gpu_sharing(requested: str, platform_kind: str, workers: int) -> GpuSharing:
    """The sharing mode for a pool of `workers` on `platform_kind`, starting a private MPS daemon if it is
    chosen. Raises GpuSharingUnavailable only when `requested` is "mps" and MPS cannot run."""
    if requested not in SHARING_CHOICES:
        raise ValueError(f"--gpu-sharing: expected one of {', '.join(SHARING_CHOICES)}, got {requested!r}")
    if requested == "contexts":
        return contexts("asked for (--gpu-sharing contexts)")
    why_not = _why_no_mps(platform_kind, workers)
    if why_not is None and os.environ.get(MPS_ENV[0]):
        return GpuSharing("mps", f"the site's MPS server ({MPS_ENV[0]}={os.environ[MPS_ENV[0]]})")
    if why_not is None:
        sharing, why_not = _start_private_daemon()
        if sharing is not None:
            return sharing
    if requested == "mps":
        raise GpuSharingUnavailable(f"--gpu-sharing mps: {why_not}")
    return contexts(f"MPS not used: {why_not}")


def _why_no_mps(platform_kind: str, workers: int) -> str | None:
    if platform_kind != "cuda":
        return f"the {platform_kind} platform has no MPS (only CUDA does)"
    if workers < 2:
        return "one worker process has nothing to share the GPU with"
    if shutil.which(MPS_CONTROL) is None:
        return f"{MPS_CONTROL} is not on PATH"
    return None


def _start_private_daemon() -> tuple[GpuSharing | None, str]:
    folder = Path(tempfile.mkdtemp(prefix="hicache-fuzz-mps-"))
    env = _daemon_env(folder)
    for name in MPS_ENV:
        Path(env[name]).mkdir()
    try:
        started = subprocess.run([MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=10)
        if started.returncode != 0:
            raise OSError(f"{MPS_CONTROL} -d exited {started.returncode}: {(started.stderr or started.stdout).strip()}")
        # The daemon starts its server at the first client; start it now, so a server that cannot run (no
        # permission, an exclusive compute mode held elsewhere) is found here and not in the first worker.
        _control([f"start_server -uid {os.getuid()}"], env, timeout=10)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not _control(["get_server_list"], env, timeout=10).strip():
            if time.monotonic() > deadline:
                raise OSError(f"its server did not start within {SERVER_START_TIMEOUT_S:g} s"
                              f"{_log_tail(folder)}")
            time.sleep(0.1)
    except (OSError, subprocess.SubprocessError) as exc:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _control(["quit"], env, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
        return None, f"the private MPS daemon did not start ({exc})"
    client_env = {name: env[name] for name in MPS_ENV}
    sharing = GpuSharing("mps", f"a private MPS server for this pool's workers ({folder})", client_env,
                         _daemon_dir=folder)
    atexit.register(sharing.stop)  # the pool's close stops it; this covers an exit that skips the close
    return sharing, ""


def _daemon_env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[MPS_ENV[0]], env[MPS_ENV[1]] = str(folder / "pipe"), str(folder / "log")
    return env


def _control(commands: list[str], env: dict[str, str], timeout: float) -> str:
    """Send commands to the control daemon (one per line, on its stdin, as the tool expects); its answer."""
    done = subprocess.run([MPS_CONTROL], input="".join(c + "\n" for c in commands), env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done.stdout


def _log_tail(folder: Path) -> str:
    try:
        lines = (folder / "log" / "control.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "; control.log: " + " | ".join(lines[-3:]) if lines else ""
