"""Which platform this process runs on: cpu, cuda or rocm (torch's ROCm build answers through torch.cuda)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a machine is detected, so the vocabulary imports light
    import torch

PLATFORM_KINDS = ("cpu", "cuda", "rocm")
TORCH_THREADS_ENV = "HICACHE_FUZZ_TORCH_THREADS"


@dataclass(frozen=True)
class Platform:
    """What the contract needs to know about the machine. ``kind`` is cpu, cuda or rocm."""

    kind: str = "cpu"
    compute_capability: tuple[int, int] | None = None

    @property
    def is_hip(self) -> bool:
        return self.kind == "rocm"

    @property
    def has_tma(self) -> bool:
        return self.kind == "cuda" and self.compute_capability is not None and self.compute_capability >= (9, 0)


class PlatformUnavailable(RuntimeError):
    """The requested platform is not present; the message says why (exit code 3 on the CLI)."""


@dataclass(frozen=True)
class Machine:
    platform: Platform
    device: torch.device  # the accelerator, or cpu
    description: str


def detect() -> Machine:
    """The best platform present: a CUDA or ROCm GPU if torch sees one, else the CPU."""
    import torch

    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        capability = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        version = torch.version.hip if kind == "rocm" else torch.version.cuda
        return Machine(Platform(kind, capability), torch.device("cuda", index),
                       f"{name} ({kind} {version}, capability {capability[0]}.{capability[1]})")
    return Machine(Platform("cpu"), torch.device("cpu"), f"CPU (torch {torch.__version__})")


def require(kind: str) -> Machine:
    """The machine if it is of `kind`; PlatformUnavailable saying what was found otherwise."""
    import torch

    if kind not in PLATFORM_KINDS:
        raise ValueError(f"unknown platform {kind!r}; choose one of {', '.join(PLATFORM_KINDS)}")
    machine = detect()
    if kind == "cpu":
        return Machine(Platform("cpu"), torch.device("cpu"), machine.description if machine.platform.kind == "cpu"
                       else f"CPU (torch {torch.__version__}; accelerator present but not used)")
    if machine.platform.kind != kind:
        build = f"torch {torch.__version__}"
        if kind == "rocm" and not getattr(torch.version, "hip", None):
            why = f"{build} is not a ROCm build (torch.version.hip is None)"
        elif kind == "cuda" and getattr(torch.version, "hip", None):
            why = f"{build} is a ROCm build, not CUDA"
        elif not torch.cuda.is_available():
            why = f"{build} sees no GPU (torch.cuda.is_available() is False)"
        else:
            why = f"found {machine.description}"
        raise PlatformUnavailable(f"platform {kind} requested but unavailable: {why}")
    return machine


def limit_torch_threads() -> int:
    """Set this process's torch intra-op threads: 1 unless $HICACHE_FUZZ_TORCH_THREADS says otherwise; returns it.

    Every process that runs cases calls it (the CLI, each worker, the feed process). The pipeline's CPU work is
    many small tensor ops, where threads cost more than they give (measured ~20x on small cases), and parallelism
    comes from processes instead: a GPU campaign's 6-8 workers would otherwise each start one thread per core on
    the same cores (torch's default)."""
    import torch

    torch.set_num_threads(max(1, int(os.environ.get(TORCH_THREADS_ENV, "1"))))
    return int(torch.get_num_threads())


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
