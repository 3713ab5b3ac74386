"""The command line answers --help and bad arguments without importing torch (ARCHITECTURE.md: cli.py only
wires; each subcommand module imports the campaign and pipeline layers inside ``run``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hicache_fuzz.harness.commands.cli import SUBCOMMANDS

PROBE = """
import sys
from hicache_fuzz.harness.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print("torch imported" if "torch" in sys.modules else "no torch", code)
"""


def _probe(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60,
                          check=False)
    return done.stdout.strip().splitlines()[-1]


def test_top_level_help_imports_no_torch() -> None:
    assert _probe("--help") == "no torch 0"


@pytest.mark.parametrize("command", [name for name, _, _ in SUBCOMMANDS])
def test_subcommand_help_and_bad_arguments_import_no_torch(command: str) -> None:
    assert _probe(command, "--help") == "no torch 0"
    assert _probe(command, "--no-such-option") == "no torch 2"


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_a_command_that_runs_still_sets_up_torch() -> None:
    assert _probe("backends", "--platform", "cpu").startswith("torch imported 0")
