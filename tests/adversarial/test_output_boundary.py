"""The output boundary (harness/model/output_paths.py): every path a command writes is checked before any work
starts, and a write replaces nothing but a regular file.

Each case runs a command with one output option pointed at something it must not write (a device node, a FIFO,
a directory where a file is expected or a file where a folder is expected, an empty path, a path under a regular
file): exit 2 at once naming the option, no traceback, the device node or FIFO untouched, nothing written in the
working folder. The device node is a private one made with os.mknod in a temporary folder (a clone of the null
device, run as root), or a FIFO standing in for it otherwise: never the machine's /dev/null.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hicache_fuzz.harness.model.output_paths import (
    OutputPathError,
    check_output_dir,
    check_output_file,
    write_bytes_atomic,
    write_json_atomic,
)
from hicache_fuzz.harness.reporting.junit import write_junit
from tests.adversarial.conftest import error_lines
from tests.adversarial.inputs import valid_case, valid_reproducer

CPU_FUZZ = ["fuzz", "--platform", "cpu", "--runs", "3", "--no-progress"]
SELFTEST = ["selftest", "--platform", "cpu", "--mutant", "zoo-last-page-dropped", "--reference-cases", "1"]
# (command line without the option, option, "file" or "dir"): every output option of every command
OUTPUTS: list[tuple[list[str], str, str]] = [
    ([*CPU_FUZZ, "--corpus", "OUT/c"], "--json", "file"),
    (CPU_FUZZ, "--corpus", "dir"),
    (["replay", "CASE"], "--json", "file"),
    (["minimize", "REPRO", "--corpus", "OUT/m"], "--json", "file"),
    (["minimize", "REPRO"], "--corpus", "dir"),
    (SELFTEST, "--json", "file"),
    (SELFTEST, "--corpus", "dir"),
    (["bench", "--cpu", "--platform", "cpu", "--seconds", "0.1", "--zoo-seconds", "0"], "--json", "file"),
    (["bench", "--cpu", "--platform", "cpu", "--seconds", "0.1", "--zoo-seconds", "0"], "--markdown", "file"),
    (["backends", "--platform", "cpu"], "--json", "file"),
    (["aot-smoke"], "--json", "file"),
    (["merge", "REPORT", "--out", "OUT/merged"], "--junit", "file"),
    (["merge", "REPORT"], "--out", "dir"),
    (["report", "REPORT"], "--html", "file"),
    (["false-alarms", "--seeds", "1", "--seconds", "1", "--out", "OUT/fa"], "--json", "file"),
    (["false-alarms", "--seeds", "1", "--seconds", "1", "--out", "OUT/fa"], "--markdown", "file"),
    (["false-alarms", "--seeds", "1", "--seconds", "1"], "--out", "dir"),
    (["mutate", "--list"], "--out", "dir"),
    (["gate", "--platform", "cpu", "--budget-seconds", "5"], "--json", "file"),
    (["gate", "--platform", "cpu", "--budget-seconds", "5"], "--markdown", "file"),
    (["gate", "--platform", "cpu", "--budget-seconds", "5"], "--junit", "file"),
    (["gate", "--platform", "cpu", "--budget-seconds", "5"], "--artifacts", "dir"),
    (["isa", "--platform", "cuda"], "--json", "file"),
    (["isa", "--platform", "cuda"], "--markdown", "file"),
    (["isa", "--platform", "cuda"], "--keep-dir", "dir"),
]
BAD_FILE_TARGETS = ("device", "fifo", "directory", "empty", "under-a-file")
BAD_DIR_TARGETS = ("device", "fifo", "regular-file", "empty", "under-a-file")


def make_device_node(path: Path) -> None:
    """A private character device (the null device's numbers) when root, else a FIFO standing in for it."""
    if os.geteuid() == 0:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        os.mkfifo(path)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def workdir(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working folder with the inputs the commands read; the command runs in it (so a stray default output
    would land here and be seen)."""
    (short_tmp / "case.json").write_text(json.dumps(valid_case()))
    (short_tmp / "repro.json").write_text(json.dumps(valid_reproducer()))
    (short_tmp / "report.json").write_text(json.dumps({"cases": 0, "outcomes": {}, "unique_failures": []}))
    (short_tmp / "a-file").write_text("a regular file")
    (short_tmp / "a-dir").mkdir()
    (short_tmp / "OUT").mkdir()
    make_device_node(short_tmp / "node")
    os.mkfifo(short_tmp / "fifo")
    monkeypatch.chdir(short_tmp)
    yield short_tmp


def _target(kind: str, root: Path) -> str:
    return {"device": str(root / "node"), "fifo": str(root / "fifo"), "directory": str(root / "a-dir"),
            "regular-file": str(root / "a-file"), "empty": "", "under-a-file": str(root / "a-file" / "sub")}[kind]


def _cases() -> list[tuple[list[str], str, str]]:
    out = []
    for argv, option, kind in OUTPUTS:
        for bad in BAD_FILE_TARGETS if kind == "file" else BAD_DIR_TARGETS:
            out.append((argv, option, bad))
    return out


@pytest.mark.parametrize(("argv", "option", "bad"), _cases(),
                         ids=[f"{a[0]}-{o}-{b}" for a, o, b in _cases()])
def test_a_bad_output_path_is_exit_2_at_once(argv: list[str], option: str, bad: str, workdir: Path,
                                            cli: object, no_hang: None) -> None:
    names = {"CASE": str(workdir / "case.json"), "REPRO": str(workdir / "repro.json"),
             "REPORT": str(workdir / "report.json")}
    line = [names.get(a, a.replace("OUT/", f"{workdir}/OUT/")) for a in argv] + [option, _target(bad, workdir)]
    node_before, fifo_before = os.lstat(workdir / "node"), os.lstat(workdir / "fifo")
    tree_before = _tree(workdir)
    ran = cli(*line)  # type: ignore[operator]
    assert ran.code == 2, (ran.code, ran.out[-2000:], ran.err[-2000:])
    assert "Traceback" not in ran.err + ran.out
    assert option in error_lines(ran.err), ran.err
    for path, before in ((workdir / "node", node_before), (workdir / "fifo", fifo_before)):
        after = os.lstat(path)
        assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    assert _tree(workdir) == tree_before  # nothing written: the command stopped before any work


def test_merge_checks_the_files_it_writes_inside_out(workdir: Path, cli: object) -> None:
    out = workdir / "OUT" / "merged"
    out.mkdir()
    make_device_node(out / "report.json")
    before = os.lstat(out / "report.json")
    ran = cli("merge", str(workdir / "report.json"), "--out", str(out))  # type: ignore[operator]
    assert ran.code == 2 and "--out" in error_lines(ran.err) and "Traceback" not in ran.err, ran.err
    after = os.lstat(out / "report.json")
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_merge_relocates_an_unwritable_junit_file_like_its_report(workdir: Path, cli: object,
                                                                  block_after_check: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(workdir / "OUT"))
    junit = block_after_check / "junit.xml"  # checked fine; under a regular file by the time it is written
    ran = cli("merge", str(workdir / "report.json"), "--out", str(workdir / "OUT" / "m"),  # type: ignore[operator]
              "--junit", str(junit))
    assert ran.code == 3, (ran.out, ran.err)
    [moved] = [line.split(" written to ")[1].split(" instead")[0] for line in ran.err.splitlines()
               if "JUnit XML" in line and " written to " in line]
    assert Path(moved).read_text().startswith("<?xml") and "<testsuite" in Path(moved).read_text()
    assert (workdir / "OUT" / "m" / "report.json").is_file()


def test_fuzz_with_an_empty_corpus_path_does_not_use_the_current_folder(workdir: Path, cli: object) -> None:
    ran = cli("fuzz", "--platform", "cpu", "--runs", "3", "--no-progress", "--corpus", "")  # type: ignore[operator]
    assert ran.code == 2 and "--corpus" in error_lines(ran.err), ran.err
    assert not (workdir / ".parallel").exists()


# ---- the rule itself -------------------------------------------------------------------------------------------

def test_a_write_never_replaces_a_device_node_or_fifo(short_tmp: Path) -> None:
    node, fifo = short_tmp / "node", short_tmp / "fifo"
    make_device_node(node)
    os.mkfifo(fifo)
    for path in (node, fifo):
        before = os.lstat(path)
        with pytest.raises(OSError, match="only a regular file is ever replaced"):
            write_json_atomic(path, {"x": 1})
        with pytest.raises(OSError, match="only a regular file is ever replaced"):
            write_junit(path, "suite", [])
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert sorted(p.name for p in short_tmp.iterdir()) == ["fifo", "node"]  # no temporary file left behind


def test_a_symlink_is_followed_and_its_target_rewritten(short_tmp: Path) -> None:
    real = short_tmp / "real.json"
    real.write_text("{}")
    link = short_tmp / "link.json"
    link.symlink_to(real)
    write_bytes_atomic(link, b'{"a": 1}\n')
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
    make_device_node(short_tmp / "node")
    (short_tmp / "to-node").symlink_to(short_tmp / "node")
    with pytest.raises(OutputPathError, match="only a regular file"):
        check_output_file(short_tmp / "to-node", "--json")
    with pytest.raises(OSError):
        write_bytes_atomic(short_tmp / "to-node", b"x")


def test_an_unwritable_folder_is_refused(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as root, chmod cannot make a folder unwritable: os.access stands in for a read-only mount."""
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(OutputPathError, match="not writable"):
        check_output_file(short_tmp / "report.json", "--json")
    with pytest.raises(OutputPathError, match="not writable"):
        check_output_dir(short_tmp, "--out")


def test_good_paths_pass(short_tmp: Path) -> None:
    assert check_output_file(short_tmp / "new" / "deeper" / "r.json", "--json") is not None
    (short_tmp / "old.json").write_text("{}")
    assert check_output_file(short_tmp / "old.json", "--json") is not None
    assert check_output_dir(short_tmp, "--out") is not None
    assert check_output_dir(short_tmp / "new" / "folder", "--out") is not None
    assert check_output_file(None, "--json") is None
