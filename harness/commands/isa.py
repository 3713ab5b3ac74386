"""``hicache-fuzz isa``: the stand-alone static ISA check (:mod:`hicache_fuzz.harness.isa`) as a subcommand."""

from __future__ import annotations

import argparse

# Every path this command writes, checked before it runs (cli.py, harness/model/output_paths.py).
OUTPUT_OPTIONS = {"json": "file", "markdown": "file", "keep_dir": "dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hicache_fuzz.harness.isa import check

    check.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hicache_fuzz.harness.isa import check

    return check.run(args)
