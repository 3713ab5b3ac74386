"""`python -m hicache_fuzz.harness.mutate ...`: the mutate command without the main CLI."""

from __future__ import annotations

import argparse
import sys

from hicache_fuzz.harness import commands_mutate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hicache-fuzz")
    commands_mutate.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["mutate", *(sys.argv[1:] if argv is None else argv)])
    return commands_mutate.run(args)


if __name__ == "__main__":
    sys.exit(main())
