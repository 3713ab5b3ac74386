"""What the subcommands share: the --platform/--backend-plugin options and writing a JSON report.

Command modules import only light modules at the top (argparse, this one, the exit codes): the campaign and
pipeline layers import torch, so they are imported inside ``run``, and ``--help`` or a bad argument answers
at once."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_fuzz.harness.commands.arg_types import finite_positive_float

if TYPE_CHECKING:
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions

ISOLATE_CHOICES = ("auto", "yes", "no")


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", default="auto", choices=["auto", "cpu", "cuda", "rocm"],
                        help="platform to run on; a named platform that is absent exits 3 (default: best present)")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE:CALLABLE",
                        help="load extra backends from a callable returning Backend(s); repeatable")


def add_isolation(parser: argparse.ArgumentParser, documented: bool = True) -> None:
    """--isolate and --case-timeout; `documented` adds the campaign engine's --worker-processes and
    --gpu-sharing (replay and minimize run one case at a time and take only the first two)."""
    parser.add_argument("--isolate", choices=list(ISOLATE_CHOICES), default="auto",
                        help="run cases in a worker process (auto: for backends that can crash the process)")
    parser.add_argument("--case-timeout", type=finite_positive_float, default=60.0,
                        help="seconds before a case counts as a hang (default: %(default)s)")
    if documented:
        parser.add_argument("--worker-processes", type=worker_process_count, default=None, metavar="N|auto",
                            help="worker processes behind one campaign, sharing its batches (auto: on a GPU, "
                                 "one per two CPU cores beyond four, at most 6; 1 on the CPU)")
        parser.add_argument("--spare-workers", type=spare_worker_count, default=None, metavar="N|auto",
                            help="worker processes kept started to take over after a crash (auto: 2 on a GPU, "
                                 "one per pool member; 0 on the CPU)")
        parser.add_argument("--gpu-sharing", choices=["auto", "mps", "contexts"], default="auto",
                            help="how several CUDA workers share the GPU: auto runs them as clients of a private "
                                 "MPS server where nvidia-cuda-mps-control can start one, else separate contexts; "
                                 "mps makes a missing MPS an error (exit 3)")


def execution_options(args: argparse.Namespace) -> ExecutionOptions:
    """The parsed --platform, --backend-plugin, --isolate and --case-timeout (defaults where a command has none)."""
    from hicache_fuzz.harness.pipeline.setup import ExecutionOptions

    return ExecutionOptions(platform=args.platform, backend_plugins=list(args.backend_plugin),
                            isolate=getattr(args, "isolate", "auto"), case_timeout=getattr(args, "case_timeout", 60.0),
                            worker_processes=getattr(args, "worker_processes", None),
                            spare_workers=getattr(args, "spare_workers", None),
                            gpu_sharing=getattr(args, "gpu_sharing", "auto"))


def spare_worker_count(text: str) -> int | None:
    """--spare-workers: a whole number (0 or more), or auto (None)."""
    if text == "auto":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number (0 or more) or auto, not {text!r}")
    return int(text)


def worker_process_count(text: str) -> int | None:
    """--worker-processes: a positive whole number, or auto (None)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"need at least 1, got {value}")
    return value


def write_json_report(data: Any, path: str | Path | None) -> bool:
    """Write `data` as JSON to `path` when one was given (--json). A write error never loses it: it goes to a
    temporary file or stdout instead, the message says where, and False is returned (see output.py)."""
    from hicache_fuzz.harness.commands.output import write_report

    return write_report(path, data)
