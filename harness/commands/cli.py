"""The ``hicache-fuzz`` command line: wiring only.

Exit codes (every subcommand, :mod:`hicache_fuzz.harness.model.exit_codes`): 0 clean, 1 failures found, 2 bad
usage or bad input, 3 the requested platform or backend is unavailable. The seed of every campaign is
printed first, so any run can be repeated.

Each subcommand is a small module exposing ``add_arguments(parser)`` and ``run(args) -> int``. Only the
module of the subcommand being run is imported, so ``hicache-fuzz --help`` and argument errors answer
without importing torch. A new subcommand is one module under ``harness/commands/`` and one row below.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from hicache_fuzz.harness.model.exit_codes import (
    EXIT_CLEAN,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Unavailable,
    UsageError,
)

_COMMANDS = "hicache_fuzz.harness.commands"
# (name, module, help), in the order `--help` lists them.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("backends", f"{_COMMANDS}.backends", "list backends, whether they can run here, and why not"),
    ("fuzz", f"{_COMMANDS}.fuzz", "run a fuzz campaign"),
    ("replay", f"{_COMMANDS}.replay", "replay case or reproducer files"),
    ("merge", f"{_COMMANDS}.merge", "merge reports and corpora of workers or shards; write JUnit XML"),
    ("isa", f"{_COMMANDS}.isa", "static ISA check of sglang's copy kernels (ROCm/CUDA)"),
    ("selftest", f"{_COMMANDS}.selftest", "every bug-zoo mutant must be killed; reference clean"),
    ("bench", f"{_COMMANDS}.bench", "throughput, zoo time-to-kill, kernel bandwidth"),
    ("minimize", f"{_COMMANDS}.minimize", "shrink reproducers while keeping their failure signature"),
    ("atheris", f"{_COMMANDS}.atheris", "coverage-guided fuzzing (atheris, libFuzzer flags)"),
    ("gate", f"{_COMMANDS}.gate", "pre-merge gate: corpus replay + fixed-seed campaign + ISA checks"),
    ("false-alarms", f"{_COMMANDS}.false_alarms", "N seeded campaigns: how many raise a new bug identity"),
    ("mutate", f"{_COMMANDS}.mutate", "mutation testing of sglang's HiCache sources against a campaign or tests"),
    ("report", f"{_COMMANDS}.report", "render a campaign or gate JSON report as a self-contained HTML page"),
    ("jit-warm", f"{_COMMANDS}.jit_warm", "build every JIT module a campaign can draw into sglang's on-disk cache"),
    ("workers", f"{_COMMANDS}.workers", "keep ready workers for campaigns: start, status or stop a standing pool"),
    ("aot-smoke", f"{_COMMANDS}.aot_smoke", "every AOT sgl_kernel.kvcacheio op once, byte-compared (docs/aot.md)"),
]

RunCommand = Callable[[argparse.Namespace], int]


def build_parser(only: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just those subcommands get their options (and their modules imported)."""
    parser = argparse.ArgumentParser(
        prog="hicache-fuzz",
        description="Differential testing and fuzzing of SGLang's HiCache KV-cache transfer kernels. "
                    "Exit codes: 0 clean, 1 failures found, 2 bad usage or input, 3 platform/backend unavailable.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in SUBCOMMANDS:
        command = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name not in only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            command.set_defaults(run=_broken(module_name, exc))
            continue
        module.add_arguments(command)
        # OUTPUT_OPTIONS (argparse dest -> "file" | "dir"): every path the command writes, checked before it runs
        command.set_defaults(run=module.run, output_options=getattr(module, "OUTPUT_OPTIONS", {}))
    return parser


def _chosen_command(argv: Sequence[str]) -> list[str]:
    """The subcommand named on the command line (the first word not starting with a dash), if any."""
    return [word for word in argv if not word.startswith("-")][:1]


def _broken(module_name: str, exc: ImportError) -> RunCommand:
    def run(args: argparse.Namespace) -> int:
        raise Unavailable(f"{module_name} failed to import: {exc}")
    return run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=_chosen_command(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for bad usage (its message names the option), 0 for --help
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else 0)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    from hicache_fuzz.harness.commands.output import check_declared_outputs
    from hicache_fuzz.harness.model.json_input import InputError
    from hicache_fuzz.harness.model.platform import limit_torch_threads
    from hicache_fuzz.harness.pipeline.worker import WorkerError

    limit_torch_threads()
    try:
        check_declared_outputs(args, getattr(args, "output_options", {}))
        return int(args.run(args))
    except (UsageError, InputError) as exc:  # InputError: CaseError, CorpusError, MergeError, ...
        print(f"hicache-fuzz: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Unavailable, WorkerError) as exc:
        print(f"hicache-fuzz: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except BrokenPipeError:
        # The reader of our output went away (`hicache-fuzz backends | head`): not an error of ours. Point
        # stdout at /dev/null so that the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLEAN
    except KeyboardInterrupt:  # a second SIGINT, or one outside a campaign: stop without a traceback
        print("hicache-fuzz: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
