"""``hicache-fuzz atheris``: coverage-guided fuzzing; runs :mod:`hicache_fuzz.harness.campaign.atheris_entry`
in a child process, so that hicache_fuzz's modules are imported under atheris' instrumentation."""

from __future__ import annotations

import argparse
import subprocess
import sys

from hicache_fuzz.harness.campaign import atheris_entry
from hicache_fuzz.harness.model.exit_codes import EXIT_UNAVAILABLE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    atheris_entry.add_our_arguments(parser)
    parser.add_argument("libfuzzer_args", nargs=argparse.REMAINDER,
                        help="libFuzzer flags and corpus directories, after `--` (e.g. -- -runs=100 dir)")


def run(args: argparse.Namespace) -> int:
    reason = atheris_entry.atheris_unavailable_reason()
    if reason:
        print(f"hicache-fuzz atheris: unavailable: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    forwarded = ["--backend", args.backend, "--platform", args.platform, "--byte-budget", str(args.byte_budget)]
    for plugin in args.backend_plugin:
        forwarded += ["--backend-plugin", plugin]
    if args.corpus is not None:
        forwarded += ["--corpus", str(args.corpus)]
    libfuzzer_args = [a for a in args.libfuzzer_args if a != "--"]
    # A child process, so that hicache_fuzz's modules are imported under atheris' coverage instrumentation.
    command = [sys.executable, "-m", "hicache_fuzz.harness.campaign.atheris_entry", *forwarded, *libfuzzer_args]
    return subprocess.run(command, check=False).returncode
