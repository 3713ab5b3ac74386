"""The docs' examples cannot rot: every ``bash``/``sh`` code block of README.md and docs/*.md is run here, unless
the doc marks it, on the line just before the fence, with ``<!-- doc-check: gpu-only -->`` or
``<!-- doc-check: not run: REASON -->`` (an install, a GPU, a network download, a tool this machine lacks).
Untyped code blocks are synopses and sample output, not commands.

Fast variants, the one documented substitution: ``--max-total-time N`` and ``--seconds N`` become 2,
``--runs N`` at most 60, and ``/tmp/`` a fresh temporary folder. Each command (backslash continuations joined,
comments dropped) must exit 0 or 1 (1: a campaign found the failures it was pointed at, e.g. a zoo mutant),
never 2 (bad usage) or 3 (cannot run here), and print no traceback.

The blocks run in the slow tier (`-m slow`, part of .ci/run); the checks below in the quick one. Also checked:
every module the docs run with ``python -m hicache_fuzz...`` exists and runs as a script, and
every ``harness/``, ``oracles/`` and top-level ``kernels/`` source path the docs cite exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- doc-check: (gpu-only|not run: \S.*) -->$")
RUNNABLE_LANGUAGES = ("bash", "sh")
ACCEPTED_EXITS = (0, 1)
FAST = ((re.compile(r"--max-total-time \d+"), lambda m: "--max-total-time 2"),
        (re.compile(r"--seconds \d+"), lambda m: "--seconds 2"),
        (re.compile(r"--runs (\d+)"), lambda m: f"--runs {min(int(m.group(1)), 60)}"))


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    language: str
    marker: str  # "" when unmarked
    text: str

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def code_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(before)
        blocks.append(Block(doc, index + 1, opening.group(1), marker.group(1) if marker else "",
                            "\n".join(lines[index + 1:end])))
        index = end + 1
    return blocks


ALL_BLOCKS = [block for doc in DOCS for block in code_blocks(doc)]
RUN_BLOCKS = [block for block in ALL_BLOCKS if block.language in RUNNABLE_LANGUAGES and not block.marker]


def commands(text: str) -> list[str]:
    """The block's commands: continuations joined, comment lines and trailing comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(shlex.join(words) if "|" not in words else line.split("  #")[0].strip())
    return found


def fast_variant(command: str, tmp: Path) -> str:
    for pattern, replacement in FAST:
        command = pattern.sub(replacement, command)
    return command.replace("/tmp/", f"{tmp}/")


def test_the_docs_have_runnable_blocks_and_every_marker_is_well_formed() -> None:
    assert len(RUN_BLOCKS) >= 2
    stray = [block.name for block in ALL_BLOCKS if block.marker and block.language not in RUNNABLE_LANGUAGES]
    assert not stray, f"doc-check markers before blocks that are not bash/sh: {stray}"


@pytest.mark.slow  # campaigns in subprocesses, ~10-40 s a block; .ci/run's slow tier runs them
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda block: block.name)
def test_doc_block_runs(block: Block, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HICACHE_FUZZ_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    for command in commands(block.text):
        runnable = fast_variant(command, tmp_path)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", runnable], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        output = done.stdout + done.stderr
        assert done.returncode in ACCEPTED_EXITS, f"{block.name}: `{runnable}` exited {done.returncode}:\n" \
                                                  f"{output[-3000:]}"
        assert "Traceback (most recent call last)" not in output, f"{block.name}: `{runnable}`:\n{output[-3000:]}"


DOC_TEXT = {doc: doc.read_text() for doc in DOCS}
PYTHON_M = sorted({match for text in DOC_TEXT.values()
                   for match in re.findall(r"python3? -m (hicache_fuzz[\w.]*)", text)})


@pytest.mark.parametrize("module", PYTHON_M)
def test_every_documented_python_m_module_runs_as_a_script(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"the docs run `python -m {module}`, which does not exist"
    if spec.submodule_search_locations:  # a package: its __main__ runs
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{module} has no __main__"
        return
    source = Path(spec.origin).read_text()
    assert re.search(r'^if __name__ == "__main__":', source, re.M), \
        f"`python -m {module}` imports the module and does nothing: it has no __main__ block"


def test_every_cited_source_path_exists() -> None:
    cited = {(doc.relative_to(ROOT), path) for doc, text in DOC_TEXT.items()
             for path in re.findall(r"(?<![\w/.-])((?:harness|oracles)/[\w/.-]*\w|kernels/\w+\.py)", text)}
    missing = sorted(f"{doc}: {path}" for doc, path in cited if "*" not in path and not (ROOT / path).exists())
    assert not missing, "docs cite paths that do not exist:\n" + "\n".join(missing)
