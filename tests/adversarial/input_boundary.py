"""A fuzz target for the tool's own input boundary: the strict JSON loader (harness/model/json_input.py, the case,
reproducer, report and space-file readers on top of it) and the command-line parser with the checks that run
before any work (option types, the output boundary, --mix, --backend-every, --space/--set).

The property: whatever the bytes or the words, the answer is a value or the tool's own refusal (InputError,
UsageError, Unavailable, argparse's exit 2), never another exception. Nothing here runs a command or writes a file
other than the input itself.

Hypothesis drives it in tests/adversarial/test_input_boundary_fuzz.py; with atheris installed the same target
runs coverage-guided::

    python -m tests.adversarial.input_boundary -runs=20000 WORK_DIR

with WORK_DIR holding :func:`seed_inputs` (the test writes them there).

The seed corpus is tests/data/input-boundary/: JSON and TOML inputs as they are, and ``*.argv`` files (one word
per line) for the parser. A byte string starting with ``\\x00`` is a command line (words split on NUL); any other
is a file's content.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

# Only the light command table here: the boundary's modules are imported inside the functions, so that the
# atheris form can import them under atheris.instrument_imports (coverage of hicache_fuzz only, not torch).
from hicache_fuzz.harness.commands.cli import SUBCOMMANDS
from hicache_fuzz.harness.model.exit_codes import Unavailable, UsageError

SEEDS = Path(__file__).resolve().parents[1] / "data" / "input-boundary"
# Commands whose parser the target drives (atheris passes the rest of its line on to libFuzzer).
COMMANDS = [name for name, _, _ in SUBCOMMANDS if name != "atheris"]
# Words never handed to the parser: a plugin spec imports and calls arbitrary code by design.
FORBIDDEN = ("plugin",)


def check_file(data: bytes, folder: Path) -> None:
    """The content `data` through every reader of the input boundary: each returns or refuses (InputError or
    UsageError); any other exception is a bug of the boundary."""
    from hicache_fuzz.harness.findings.corpus import load_entries
    from hicache_fuzz.harness.generation.space_file import load_space_file
    from hicache_fuzz.harness.model.json_input import InputError, parse_json
    from hicache_fuzz.harness.reporting.merge import load_report

    with contextlib.suppress(InputError):
        parse_json(data.decode("utf-8", errors="replace"), "input")
    for name in ("input.json", "input.toml"):
        path = folder / name
        path.write_bytes(data)
        with contextlib.suppress(InputError):
            load_entries(path)
        with contextlib.suppress(InputError):
            load_report(path)
        with contextlib.suppress(UsageError):
            load_space_file(path)


def check_command_line(words: list[str]) -> None:
    """Parse `words` as a hicache-fuzz command line and run the checks that come before any work."""
    from hicache_fuzz.harness.commands.cli import build_parser
    from hicache_fuzz.harness.commands.fuzz_options import engine_options
    from hicache_fuzz.harness.commands.output import check_declared_outputs
    from hicache_fuzz.harness.generation.space_file import space_from_args
    from hicache_fuzz.harness.model.json_input import InputError

    if not words or words[0] not in COMMANDS or any(bad in word for word in words for bad in FORBIDDEN):
        return
    if "-h" in words or any(word.startswith("--h") for word in words):
        return  # --help prints and exits 0: not an input problem
    parser = build_parser(only=words[:1])
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(words)
        except SystemExit as exc:
            assert exc.code == 2, f"argparse exit {exc.code!r} for {words!r}"
            return
    with contextlib.suppress(InputError):  # OutputPathError: a bad output path, exit 2
        check_declared_outputs(args, getattr(args, "output_options", {}))
    if words[0] == "fuzz":
        with contextlib.suppress(ValueError, UsageError, Unavailable):
            engine_options(args)
        with contextlib.suppress(UsageError):
            space_from_args(args)


def one_input(data: bytes) -> None:
    """The fuzz target: a command line when `data` starts with NUL, else a file's content."""
    if data[:1] == b"\0":
        check_command_line([w.decode("utf-8", errors="replace") for w in data[1:].split(b"\0")])
        return
    with tempfile.TemporaryDirectory(prefix="hf-boundary-") as folder:
        check_file(data, Path(folder))


def seed_inputs() -> list[bytes]:
    """The committed seeds as fuzz-target inputs (``*.argv`` files become NUL-prefixed command lines)."""
    out = []
    for path in sorted(SEEDS.iterdir()):
        if path.suffix == ".argv":
            out.append(b"\0" + b"\0".join(line.encode() for line in path.read_text().splitlines()))
        else:
            out.append(path.read_bytes())
    return out


def _atheris_main() -> None:
    import atheris

    with atheris.instrument_imports(include=["hicache_fuzz"]):
        one_input(b"{}")  # imports the boundary's modules, instrumented
        one_input(b"\0fuzz")
        for command in COMMANDS:  # and every command's module
            one_input(b"\0" + command.encode())
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    _atheris_main()
