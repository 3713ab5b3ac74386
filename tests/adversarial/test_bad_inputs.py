"""Every malformed input file, given to every command that reads files, is an exit 2 whose message names the
file and the problem: no traceback, no hang (a FIFO), no write outside the output folder (merge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adversarial.inputs import BadInput, bad_inputs, valid_case, valid_reproducer

INPUTS = bad_inputs()
# Commands that take the bad file itself, and commands that find it in a folder.
FILE_COMMANDS = ["replay", "minimize", "fuzz-known"]
FOLDER_COMMANDS = ["replay-folder", "gate-corpus", "merge-corpus"]
EMPTY_REPORT = {"cases": 0, "outcomes": {}, "unique_failures": []}


def _argv(command: str, target: Path, work: Path) -> list[str]:
    return {
        "replay": ["replay", str(target)],
        "replay-folder": ["replay", str(target)],
        "minimize": ["minimize", str(target), "--corpus", str(work / "min")],
        "fuzz-known": ["fuzz", "--runs", "1", "--no-progress", "--known", str(target), "--corpus", str(work / "c")],
        "gate-corpus": ["gate", "--platform", "cpu", "--no-isa", "--corpus", str(target), "--artifacts",
                        str(work / "art")],
        "merge-corpus": ["merge", str(work / "report.json"), "--corpus", str(target), "--out", str(work / "out")],
    }[command]


def _place(bad: BadInput, command: str, work: Path) -> tuple[Path, Path]:
    """Write the bad input; returns (the path given to the command, the bad file's path)."""
    folder = work / "in"
    folder.mkdir()
    (folder / "good.json").write_text(json.dumps(valid_case()))  # a good neighbour must not hide the bad one
    bad_path = folder / "bad.json"
    bad.write(bad_path)
    (work / "report.json").write_text(json.dumps(EMPTY_REPORT))
    return (folder if command in FOLDER_COMMANDS else bad_path), bad_path


CASES = [(bad, command) for bad in INPUTS for command in FILE_COMMANDS + FOLDER_COMMANDS
         # a folder named bad.json given by name is a folder to read, not a bad file
         if not (bad.name == "kind:directory-named-json" and command in FILE_COMMANDS)]


@pytest.mark.parametrize(("bad", "command"), CASES, ids=[f"{b.name}-{c}" for b, c in CASES])
def test_bad_input_is_exit_2_naming_file_and_problem(bad: BadInput, command: str, short_tmp: Path,
                                                     cli: object) -> None:
    target, bad_path = _place(bad, command, short_tmp)
    ran = cli(*_argv(command, target, short_tmp))  # type: ignore[operator]
    assert ran.code == 2, (ran.code, ran.out, ran.err)
    assert "Traceback" not in ran.err
    message = ran.err.lower()
    assert str(bad_path).lower() in message or bad_path.name in message, ran.err
    for word in bad.expected:
        assert word.lower() in message, (word, ran.err)


def test_every_generated_input_differs() -> None:
    assert len({b.name for b in INPUTS}) == len(INPUTS) >= 80


@pytest.mark.parametrize("signature", ["/tmp/x/ESCAPED", "../../X", "../escaped", "a/../../b"])
def test_merge_never_writes_outside_out(signature: str, short_tmp: Path, cli: object) -> None:
    corpus = short_tmp / "corpus" / "deep" / "er"
    corpus.mkdir(parents=True)
    (corpus / "r.json").write_text(json.dumps({**valid_reproducer(), "signature": signature}))
    (short_tmp / "report.json").write_text(json.dumps(EMPTY_REPORT))
    before = {p for p in Path("/tmp/x").rglob("*")} if Path("/tmp/x").exists() else set()
    out = short_tmp / "corpus" / "deep" / "er" / "out"
    ran = cli("merge", str(short_tmp / "report.json"), "--corpus", str(short_tmp / "corpus"),  # type: ignore[operator]
              "--out", str(out))
    assert ran.code == 2 and "signature" in ran.err, ran.err
    written = {p for p in short_tmp.rglob("*") if p.is_file()} - {short_tmp / "report.json", corpus / "r.json"}
    assert all(out in p.parents for p in written), written
    after = {p for p in Path("/tmp/x").rglob("*")} if Path("/tmp/x").exists() else set()
    assert after == before


def test_layer_true_is_not_saved_as_a_finding_by_minimize(short_tmp: Path, cli: object) -> None:
    case = valid_case()
    case["layer"] = True
    path = short_tmp / "c.json"
    path.write_text(json.dumps(case))
    ran = cli("minimize", str(path), "--corpus", str(short_tmp / "min"))  # type: ignore[operator]
    assert ran.code == 2 and "case.layer" in ran.err
    assert not (short_tmp / "min").exists()


def test_both_case_shapes_load(short_tmp: Path, cli: object) -> None:
    """"backend": NAME and "backends": [NAME, ...] are both accepted; the list runs once per backend."""
    one = short_tmp / "one.json"
    one.write_text(json.dumps(valid_case()))
    several = dict(valid_case())
    del several["backend"]
    several["backends"] = ["reference", "zoo-first-index-of-page"]
    many = short_tmp / "many.json"
    many.write_text(json.dumps(several))
    from hicache_fuzz.harness.findings.corpus import load_entries

    assert [e.case.backend for e in load_entries(one)] == ["reference"]
    assert [e.case.backend for e in load_entries(many)] == ["reference", "zoo-first-index-of-page"]
