"""The input boundary under a fuzzer (tests/adversarial/input_boundary.py): Hypothesis always, with a bounded
budget, and atheris (coverage-guided, a bounded number of runs) where it is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adversarial.input_boundary import COMMANDS, SEEDS, check_command_line, one_input, seed_inputs

REPO = Path(__file__).resolve().parents[2]
BUDGET = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Words the parser knows, to reach past the first unknown option (values come from the strategies below).
OPTIONS = ["--platform", "--runs", "--max-total-time", "--json", "--corpus", "--mix", "--backend-every", "--set",
           "--space", "--workers", "--seed", "--shard", "--case-timeout", "--byte-budget", "--start-index",
           "--backend", "--out", "--junit", "--markdown", "--html", "--min-score", "--build-error-pattern",
           "--sglang-src", "--seeds", "--seconds", "--zoo-seconds", "--max-runs", "--max-seconds", "--artifacts",
           "--budget-seconds", "--max-per-signature", "--variants", "--batches-ahead", "--scale-share", "--", "--list"]
VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "nan", "inf", "-inf", "1e400", "", " ", "/dev/null", "/dev/zero",
                     "/nonexistent/x", ".", "..", "transfer=nan", "nope=2", "reference=0", "max_layers=" + "9" * 30,
                     "([", "auto", "none", "cpu", "1/0", "0/0", "a=b=c", "\x00", "é"]),
    st.text(max_size=30),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def test_the_seeds_pass_through_the_boundary() -> None:
    seeds = seed_inputs()
    assert len(seeds) == len(list(SEEDS.iterdir())) >= 10
    for data in seeds:
        one_input(data)


@BUDGET
@given(seed=st.sampled_from(sorted(p.name for p in SEEDS.iterdir() if p.suffix != ".argv")),
       cuts=st.lists(st.tuples(st.integers(0, 4096), st.binary(max_size=12)), max_size=4))
def test_mutated_files_are_read_or_refused(seed: str, cuts: list[tuple[int, bytes]]) -> None:
    data = (SEEDS / seed).read_bytes()
    for offset, insert in cuts:  # splice: replace a few bytes at a few places
        offset %= len(data) + 1
        data = data[:offset] + insert + data[offset + len(insert):]
    one_input(data)


@BUDGET
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_read_or_refused(data: bytes) -> None:
    one_input(data.lstrip(b"\0") or b"{")


@BUDGET
@given(command=st.sampled_from(COMMANDS),
       words=st.lists(st.one_of(st.sampled_from(OPTIONS), VALUES), max_size=8))
def test_command_lines_are_parsed_or_refused(command: str, words: list[str]) -> None:
    check_command_line([command, *words])


def test_atheris_on_the_boundary(tmp_path: Path) -> None:
    """Coverage-guided, bounded (runs and seconds); only where atheris is installed."""
    pytest.importorskip("atheris")
    for number, data in enumerate(seed_inputs()):
        (tmp_path / f"seed-{number}").write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "tests.adversarial.input_boundary", "-runs=3000",
                           "-max_total_time=30", f"-artifact_prefix={tmp_path}/", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(tmp_path.glob("crash-*")), done.stderr[-3000:]
