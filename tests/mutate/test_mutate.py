"""hicache-fuzz mutate on CPU: generation, application, targets, resumption and reports, on a synthetic
sglang tree (no compiling, no network). One test reads the real sglang 0.5.23 sources when present."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from hicache_fuzz.harness.commands.cli import main as cli_main
from hicache_fuzz.harness.mutate import sources
from hicache_fuzz.harness.mutate.mutant import Mutant
from hicache_fuzz.harness.mutate.operators import OPERATORS, generate
from hicache_fuzz.harness.mutate.workspace import Workspace, child_environment, tree_digest

CUH = "sglang/kernels/jit/csrc/kvcacheio/hicache.cuh"
PY = "sglang/kernels/ops/kvcache/hicache.py"
CUH_TEXT = """\
#pragma once
#include <cstdint>
// a comment with i < n and k_src, v_src
template <typename T, int kUnroll>
__global__ void copy_rows(const T* __restrict__ k_src, const T* __restrict__ v_src, T* k_dst, T* v_dst,
                          const int64_t* src_idx, const int64_t* dst_idx, uint32_t n, uint32_t page) {
  __shared__ int64_t slots[32];
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    slots[i % 32] = src_idx[i];
    __syncthreads();
    const auto off = static_cast<int64_t>(dst_idx[i]) * page + 1;
    k_dst[off] = k_src[slots[i % 32]];
    v_dst[off] = v_src[slots[i % 32]];
  }
  const char* msg = "i < n";
}
"""
PY_TEXT = """\
import torch

PAGE = 16


def transfer(k_src, v_src, k_dst, v_dst, src_idx, dst_idx):
    n = src_idx.numel()
    for i in range(n):
        if src_idx[i] >= 0:
            k_dst[dst_idx[i]] = k_src[src_idx[i]]
            v_dst[dst_idx[i]] = v_src[src_idx[i]]
    torch.cuda.synchronize()
    return dst_idx.to(torch.int64) % PAGE
"""
CONTROLLER_TEXT = """\
LIMIT = 3


def status_text(x):
    return x + 1


def load_pages(host_indices, device_indices):
    return host_indices[device_indices] + 1
"""
SYNC_PRESENT = f'grep -q "__syncthreads();" "$HICACHE_MUTATE_SGLANG_ROOT/{CUH}"'


def _mutants(root: Path) -> list[Mutant]:
    return sources.generate_all(root, sources.default_sources(root))


def _one(mutants: list[Mutant], file: str, operator: str, line: int, original: str) -> Mutant:
    found = [m for m in mutants if m.file == file and m.operator == operator and m.line == line
             and m.original == original]
    assert found, f"no {operator} mutant of {original!r} on {file}:{line}"
    return found[0]


def _run(*argv: str | Path) -> int:
    return cli_main(["mutate", *(str(a) for a in argv)])


def test_ids_are_stable_and_depend_only_on_the_mutation(tree: Path) -> None:
    first, second = _mutants(tree), _mutants(tree)
    assert [m.id for m in first] == [m.id for m in second]
    assert len({m.id for m in first}) == len(first)
    moved = tree.parent / "elsewhere"
    shutil.copytree(tree, moved)
    assert [m.id for m in _mutants(moved)] == [m.id for m in first]  # the checkout location is not in the id
    assert {m.operator for m in first} == set(OPERATORS)


@pytest.mark.parametrize(("file", "operator", "line", "original", "removed", "added"), [
    (CUH, "comparison", 8, "<", "i < n;", "i <= n;"),
    (CUH, "arithmetic", 11, "*", "]) * page", "]) / page"),
    (CUH, "constant", 7, "32", "slots[32]", "slots[33]"),
    (CUH, "narrowing", 8, "uint32_t", "for (uint32_t i", "for (uint16_t i"),
    (CUH, "mod_and", 9, "%", "slots[i % 32]", "slots[i & 32]"),
    (CUH, "swap_pair", 12, "k_dst[off] = k_src", "k_dst[off] = k_src[", "k_src[off] = k_dst["),
    (CUH, "drop_statement", 10, "__syncthreads();", "__syncthreads();", "    ;"),
    (CUH, "drop_statement", 12, "k_dst[off] = k_src[slots[i % 32]];", "k_dst[off] = k_src", "    ;"),
    (CUH, "index_reuse", 9, "i", "= src_idx[i];", "= src_idx[i - 1];"),
    (PY, "comparison", 9, ">=", "src_idx[i] >= 0", "src_idx[i] > 0"),
    (PY, "narrowing", 13, "int64", "torch.int64", "torch.int32"),
    (PY, "mod_and", 13, "%", "% PAGE", "& PAGE"),
    (PY, "drop_statement", 12, "torch.cuda.synchronize()", "torch.cuda.synchronize()", "    pass"),
    (PY, "swap_pair", 10, "dst_idx[i]] = k_src[src_idx", "k_dst[dst_idx[i]] = k_src[src_idx[i]]",
     "k_dst[src_idx[i]] = k_src[dst_idx[i]]"),
])
def test_each_operator_produces_the_expected_diff(tree: Path, file: str, operator: str, line: int, original: str,
                                                  removed: str, added: str) -> None:
    text = (tree / file).read_text()
    _one(_mutants(tree), file, operator, line, original)
    candidates = [m for m in _mutants(tree) if m.file == file and m.operator == operator and m.line == line
                  and m.original == original and added.strip() in m.diff(text)]
    assert len(candidates) == 1, [m.description for m in candidates]
    diff = candidates[0].diff(text)
    minus = [d for d in diff.splitlines() if d.startswith("-") and not d.startswith("---")]
    plus = [d for d in diff.splitlines() if d.startswith("+") and not d.startswith("+++")]
    assert len(minus) == 1 and removed in minus[0], diff
    assert len(plus) == 1 and added in plus[0], diff
    assert diff.startswith(f"--- a/{file}\n+++ b/{file}\n")


def test_comments_strings_preprocessor_and_templates_are_not_mutated(tree: Path) -> None:
    lines = CUH_TEXT.splitlines()
    cuh = [m for m in _mutants(tree) if m.file == CUH]
    assert not [m for m in cuh if m.line in (1, 2, 3, 15)], "comment, string or preprocessor line mutated"
    template_open = lines[3].index("<")
    cast_open = CUH_TEXT.index("static_cast<") + len("static_cast")
    starts = {m.start for m in cuh if m.operator == "comparison"}
    assert CUH_TEXT.index("template <") + len("template ") not in starts and template_open
    assert cast_open not in starts and cast_open + len("<int64_t") not in starts
    assert not [m for m in cuh if m.operator == "arithmetic" and m.original == "*" and m.line in (5, 6)], \
        "a pointer declaration's * taken for a multiplication"


def test_python_filter_keeps_transfer_functions_only(tree: Path) -> None:
    controller = [m for m in _mutants(tree) if m.file.endswith("cache_controller.py")]
    assert controller and all(m.line == 9 for m in controller), [(m.line, m.description) for m in controller]
    dispatch = [m for m in _mutants(tree) if m.file == PY]
    assert all(7 <= m.line <= 13 for m in dispatch)  # function bodies only: not `PAGE = 16`


@pytest.mark.skipif(shutil.which("patch") is None, reason="the `patch` program is not installed")
def test_every_diff_applies_and_reverts_cleanly(tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "patched"
    shutil.copytree(tree, work)
    for mutant in _mutants(tree):
        original = (tree / mutant.file).read_text()
        diff = mutant.diff(original)
        forward = subprocess.run(["patch", "-p1", "--forward", "--silent"], cwd=work, input=diff, text=True,
                                 capture_output=True)
        assert forward.returncode == 0, (mutant.id, forward.stdout, forward.stderr)
        assert (work / mutant.file).read_text() == mutant.apply(original)
        reverse = subprocess.run(["patch", "-p1", "-R", "--silent"], cwd=work, input=diff, text=True,
                                 capture_output=True)
        assert reverse.returncode == 0, (mutant.id, reverse.stdout, reverse.stderr)
        assert (work / mutant.file).read_text() == original


def test_apply_refuses_a_changed_source(tree: Path) -> None:
    mutant = _mutants(tree)[0]
    with pytest.raises(ValueError, match="does not hold"):
        mutant.apply("x" + CUH_TEXT)


def test_sampling_is_seeded_and_spread(tree: Path) -> None:
    mutants = _mutants(tree)
    first = sources.sample(mutants, 10, seed=3)
    assert [m.id for m in first] == [m.id for m in sources.sample(mutants, 10, seed=3)]
    assert [m.id for m in first] != [m.id for m in sources.sample(mutants, 10, seed=4)]
    assert len({m.id for m in first}) == 10
    assert {m.file for m in first} == {CUH, PY, "sglang/srt/managers/cache_controller.py"}
    assert len({m.operator for m in first}) >= 6


def test_end_to_end_kills_one_mutant_leaves_the_install_untouched(tree: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree_digest(tree)
    monkeypatch.chdir(tmp_path)
    out = Path("out")  # relative, and the target changes directory: it must still import the private copy
    in_copy = (f'cd / && {sys.executable} -c "import os, sglang; '
               f"assert sglang.__file__.startswith(os.environ['HICACHE_MUTATE_SGLANG_ROOT'])\"")
    argv = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", f"{in_copy} && {SYNC_PRESENT}", "--out", out]
    assert _run(*argv) == 0
    assert tree_digest(tree) == before
    summary = json.loads((out / "summary.json").read_text())
    target = summary["targets"]["test-cmd"]
    assert [k["description"] for k in target["killers"]] == ["drop the synchronisation `__syncthreads(...)`"]
    assert target["counts"]["survived"] == summary["mutants"] - 1 >= 2
    assert all(s["diff"].startswith(f"--- a/{CUH}") for s in target["survivors"])
    assert target["score"] == pytest.approx(1 / summary["mutants"])
    assert "### Survivors" in (out / "summary.md").read_text()
    suite = ElementTree.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == str(target["counts"]["survived"])
    assert len(list(out.glob("mutants/*.json"))) == summary["mutants"]

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("mutants/*.json")}
    baseline_stamp = (out / "baseline.json").stat().st_mtime_ns
    assert _run(*argv) == 0  # resumed: nothing runs again (the baseline does)
    assert {p: p.stat().st_mtime_ns for p in out.glob("mutants/*.json")} == stamps
    assert (out / "baseline.json").stat().st_mtime_ns != baseline_stamp
    baseline_stamp = (out / "baseline.json").stat().st_mtime_ns
    assert _run(*argv, "--reuse-baseline") == 0
    assert (out / "baseline.json").stat().st_mtime_ns == baseline_stamp
    assert tree_digest(tree) == before


def test_a_hang_is_a_timeout_and_its_process_group_is_killed(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    code = _run("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", f"{SYNC_PRESENT} || (sleep 60; sleep 60)", "--timeout", "3", "--out", out)
    assert code == 0 and time.monotonic() - started < 45
    target = json.loads((out / "summary.json").read_text())["targets"]["test-cmd"]
    assert [t["description"] for t in target["timeouts"]] == ["drop the synchronisation `__syncthreads(...)`"]
    assert target["counts"]["killed"] == 0 and target["score"] > 0


def test_build_errors_are_listed_and_not_scored(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = f'{SYNC_PRESENT} || (echo "RuntimeError: Failed to build JIT module hicache"; exit 1)'
    assert _run("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", command, "--out", out) == 0
    target = json.loads((out / "summary.json").read_text())["targets"]["test-cmd"]
    assert target["counts"]["build_error"] == 1 and target["counts"]["killed"] == 0
    assert target["score"] == 0.0


def test_side_by_side_of_two_commands(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    narrowed = f'! grep -q "uint16_t" "$HICACHE_MUTATE_SGLANG_ROOT/{CUH}"'
    assert _run("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--operator", "narrowing", "--test-cmd", SYNC_PRESENT, "--test-cmd", narrowed, "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    sbs = summary["side_by_side"]
    assert (sbs["a"], sbs["b"]) == ("test-cmd-1", "test-cmd-2")
    assert sbs["a_only"]["count"] == 1 and sbs["both"]["count"] == 0
    assert sbs["b_only"]["count"] == sum(1 for m in _mutants(tree) if m.file == CUH and m.replacement == "uint16_t")
    assert sbs["a_only"]["count"] + sbs["b_only"]["count"] + sbs["neither"]["count"] == summary["mutants"]
    assert "Side by side" in (out / "summary.md").read_text()


def test_baseline_failure_exits_3(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run("--sglang-src", tree, "--gpus", "0", "--sample", "2", "--test-cmd", "exit 4", "--out", out) == 3
    assert json.loads((out / "baseline.json").read_text())["passed"] is False
    assert not list(out.glob("mutants/*.json"))


def test_min_score_and_usage_and_environment_errors(tree: Path, tmp_path: Path) -> None:
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement"]
    assert _run(*base, "--test-cmd", SYNC_PRESENT, "--out", tmp_path / "a", "--min-score", "0.9") == 1
    assert _run(*base, "--test-cmd", SYNC_PRESENT, "--out", tmp_path / "b", "--min-score", "0.1") == 0
    assert _run(*base, "--test-cmd", "true") == 2  # no --out
    assert _run("--sglang-src", tree, "--file", "nothing-matches", "--list") == 2
    assert _run(*base, "--test-cmd", "true", "--gpus", "two", "--out", tmp_path / "c") == 2
    assert _run("--sglang-src", tmp_path / "missing", "--list") == 2  # a wrong path, like every other wrong path
    assert _run("--sglang-src", tmp_path, "--list") == 3  # a folder that holds no sglang: sources missing
    assert _run(*base, "--test-cmd", "true", "--out", tmp_path / "d", "--", "--workers", "2") == 2  # no campaign


def test_fuzz_arguments_reach_the_campaign_command() -> None:
    import argparse

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    parser = argparse.ArgumentParser()
    commands_mutate.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mutate", "--fuzz-arg=--isolate", "--fuzz-arg", "yes", "--known", "corpus/sglang",
                              "--campaign-seconds", "20", "--", "--workers", "2"])
    (campaign,) = commands_mutate._targets(args)
    assert isinstance(campaign, commands_mutate.CampaignTarget)
    command = campaign.command(Path("r.json"), Path("c"))
    assert command[1:4] == ["-m", "hicache_fuzz", "fuzz"]
    assert command[command.index("--max-total-time") + 1] == "20.0"
    tail = command[command.index("--corpus") + 2:]
    assert tail == ["--stop-on-new-failure", "--isolate", "yes", "--workers", "2", "--known", "corpus/sglang"]


def test_a_mutants_campaign_stops_at_its_first_new_failure_and_the_baseline_never_does() -> None:
    """The first new failure decides a mutant's verdict, so its campaign ends there (cores for the other
    mutants); the unmutated baseline runs its whole clock, or a failure of clean sglang it stopped before
    would later count as a kill. --campaign-full runs every mutant's whole clock too."""
    import argparse

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    parser = argparse.ArgumentParser()
    commands_mutate.add_parser(parser.add_subparsers(dest="command"))
    (campaign,) = commands_mutate._targets(parser.parse_args(["mutate"]))
    assert isinstance(campaign, commands_mutate.CampaignTarget)
    assert "--stop-on-new-failure" in campaign.command(Path("r.json"), Path("c"))
    assert "--stop-on-new-failure" not in campaign.command(Path("r.json"), Path("c"), baseline=True)
    assert campaign.describe()["stop_at_kill"] is True
    (full,) = commands_mutate._targets(parser.parse_args(["mutate", "--campaign-full"]))
    assert isinstance(full, commands_mutate.CampaignTarget)
    assert "--stop-on-new-failure" not in full.command(Path("r.json"), Path("c"))
    assert full.describe()["stop_at_kill"] is False


def test_mutants_sharing_a_gpu_run_one_worker_each() -> None:
    """A default GPU campaign starts a pool of workers; K mutants per GPU get one worker each, unless asked."""
    import argparse

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    parser = argparse.ArgumentParser()
    commands_mutate.add_parser(parser.add_subparsers(dest="command"))

    def campaign_args(*extra: str) -> list[str]:
        (campaign,) = commands_mutate._targets(parser.parse_args(["mutate", *extra]))
        assert isinstance(campaign, commands_mutate.CampaignTarget)
        return campaign.fuzz_args

    assert campaign_args("--jobs-per-gpu", "3")[-2:] == ["--worker-processes", "1"]
    assert "--worker-processes" not in campaign_args()
    assert campaign_args("--jobs-per-gpu", "3", "--fuzz-arg=--worker-processes=2").count(
        "--worker-processes=2") == 1
    assert "--worker-processes" not in campaign_args("--jobs-per-gpu", "3", "--fuzz-arg=--worker-processes=2")


def test_list_and_show(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--sglang-src", tree, "--list") == 0
    listed = capsys.readouterr().out
    mutant = _mutants(tree)[0]
    assert mutant.id in listed and f"{len(_mutants(tree))} mutants" in listed
    assert _run("--sglang-src", tree, "--show", mutant.id) == 0
    assert capsys.readouterr().out == mutant.diff((tree / mutant.file).read_text())



def _listed_ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if re.fullmatch(r"[0-9a-f]{12}", line.split(" ", 1)[0])]


def test_only_keeps_the_named_mutants_of_the_sample_in_the_order_given(tree: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--sglang-src", tree, "--sample", "8", "--seed", "1", "--list") == 0
    sample = _listed_ids(capsys.readouterr().out)
    assert len(sample) == 8
    # a `--list` output as the id file: comments, blank lines and the trailing tables are skipped
    listing = tmp_path / "ids.txt"
    listing.write_text(f"# the rest of a run\n\n{sample[5]}  file:1  op  text\n{sample[1]}\n")
    assert _run("--sglang-src", tree, "--sample", "8", "--seed", "1", "--only-from", listing,
                "--only", sample[6], "--list") == 0
    assert _listed_ids(capsys.readouterr().out) == [sample[6], sample[5], sample[1]]


def test_only_refuses_ids_outside_the_selection_and_malformed_files(tree: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--sglang-src", tree, "--sample", "3", "--only", "0123456789ab", "--list") == 2
    assert "0123456789ab" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("not-an-id here\n")
    assert _run("--sglang-src", tree, "--only-from", bad, "--list") == 2
    assert "bad.txt:1" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert _run("--sglang-src", tree, "--only-from", empty, "--list") == 2
    assert _run("--sglang-src", tree, "--only-from", tmp_path / "absent.txt", "--list") == 2

def _real_sglang_root() -> Path:
    given = os.environ.get("HICACHE_FUZZ_SGLANG_SRC")
    try:
        root = sources.find_sglang_root(Path(given) if given else None)
    except sources.SourcesMissing as exc:
        pytest.skip(f"real sglang sources not present: {exc} (or set HICACHE_FUZZ_SGLANG_SRC)")
    if not (root / sources.KVCACHEIO_DIR / "hicache.cuh").is_file():
        pytest.skip(f"{root} has no {sources.KVCACHEIO_DIR}/hicache.cuh (not sglang 0.5.23's layout)")
    return root


def test_real_sglang_sources_give_mutants_per_file_with_stable_ids() -> None:
    root = _real_sglang_root()
    files = sources.default_sources(root)
    first = sources.generate_all(root, files)
    assert [m.id for m in first] == [m.id for m in sources.generate_all(root, files)]
    per_file = {f.rel: sum(1 for m in first if m.file == f.rel) for f in files}
    assert all(count > 0 for count in per_file.values()), per_file
    assert len(per_file) >= 6
    for mutant in first:
        text = (root / mutant.file).read_text()
        assert mutant.apply(text) != text
    assert generate(CUH, CUH_TEXT, "c")  # the synthetic fixture keeps working next to the real sources


def test_sigterm_kills_running_targets_and_records_nothing_for_them(tree: Path, tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out", tmp_path / "hung.pid"
    command = f"{SYNC_PRESENT} || sh -c 'echo $$ > {pid_file}; exec sleep 300'"
    process = subprocess.Popen([sys.executable, "-m", "hicache_fuzz", "mutate", "--sglang-src", str(tree),
                                "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                                "--test-cmd", command, "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the hanging mutant never started"
    time.sleep(0.3)
    hung = int(pid_file.read_text())
    process.terminate()
    assert process.wait(timeout=30) != 0
    assert _gone(hung, within=15.0), f"the hung target (pid {hung}) outlived the run"
    hanging_id = next(m.id for m in _mutants(tree) if m.description.startswith("drop the synchronisation"))
    assert not (out / "mutants" / f"{hanging_id}.json").exists()
    assert not (out / "work" / "slot-0" / "sglang").exists()  # the private copy is removed on the way out


def _gone(pid: int, within: float) -> bool:
    """The process ended (absent, or a zombie waiting for a reaper) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


def test_report_only_reports_finished_mutants_without_running(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", SYNC_PRESENT, "--out", out]
    assert _run(*base) == 0
    first = json.loads((out / "summary.json").read_text())
    removed = sorted(out.glob("mutants/*.json"))[0]
    removed.unlink()
    (out / "summary.json").unlink()
    assert _run(*base, "--report-only") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["meta"]["unfinished"] == [removed.stem]
    assert again["mutants"] == first["mutants"] - 1
    assert not list(out.glob("mutants/*.json")) or removed not in list(out.glob("mutants/*.json"))


def test_report_only_names_results_made_with_other_target_options(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored result whose target options differ is left out of the report, and named on stderr: a report step
    that lacks an option of the run (e.g. --jobs-per-gpu) must not report 0 finished mutants without a word."""
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement", "--out", out]
    assert _run(*base, "--test-cmd", SYNC_PRESENT) == 0
    stored = sorted(p.stem for p in out.glob("mutants/*.json"))
    assert stored
    capsys.readouterr()
    assert _run(*base, "--test-cmd", SYNC_PRESENT + " # another command", "--report-only") == 0
    err = capsys.readouterr().err
    assert f"{len(stored)} result(s)" in err and "other target options" in err
    assert all(mutant_id in err for mutant_id in stored[:8])
    again = json.loads((out / "summary.json").read_text())
    assert sorted(again["meta"]["unfinished"]) == stored


def test_start_deadline_starts_no_mutant_after_it_and_a_rerun_finishes_them(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--start-deadline 0: the baseline runs, no mutant starts, all stay unfinished and are named as such; the
    rerun without it runs them all (the time-boxed device call keeps what its slots finished)."""
    out = tmp_path / "out"
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", SYNC_PRESENT, "--out", out]
    capsys.readouterr()
    assert _run(*base, "--start-deadline", "0") == 0
    printed = capsys.readouterr().out
    first = json.loads((out / "summary.json").read_text())
    assert first["mutants"] == 0 and first["meta"]["unfinished"]
    assert f"{len(first['meta']['unfinished'])} mutant(s) not started before --start-deadline" in printed
    assert not list(out.glob("mutants/*.json"))
    assert _run(*base, "--reuse-baseline") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["mutants"] == len(first["meta"]["unfinished"]) and not again["meta"]["unfinished"]
    assert _run(*base, "--start-deadline", "-1") == 2


def test_two_slots_pin_one_device_each_and_share_the_work(tree: Path, tmp_path: Path) -> None:
    out, seen = tmp_path / "out", tmp_path / "seen"
    seen.mkdir()
    command = f'echo "$CUDA_VISIBLE_DEVICES" > {seen}/"$HICACHE_MUTANT_ID"; sleep 0.3; {SYNC_PRESENT}'
    assert _run("--sglang-src", tree, "--gpus", "0,1", "--platform", "cuda", "--file", "*.cuh",
                "--test-cmd", command, "--out", out) == 0
    records = [json.loads(p.read_text()) for p in out.glob("mutants/*.json")]
    assert {r["device"] for r in records} == {"0", "1"}
    for record in records:
        assert (seen / record["mutant"]["id"]).read_text().strip() == record["device"]
    assert not (out / "work" / "slot-1" / "sglang").exists()


def test_restored_module_never_runs_the_mutants_byte_code(tree: Path, tmp_path: Path) -> None:
    """A same-size mutant (`%` -> `&`) restored within the same second must not leave its .pyc behind."""
    rel = "sglang/pagemath.py"
    (tree / rel).write_text("def page_of(index):\n    return index % 16\n")
    mutant = next(m for m in generate(rel, (tree / rel).read_text(), "python") if m.operator == "mod_and")
    assert len(mutant.replacement) == len(mutant.original)
    workspace = Workspace(tree, tmp_path / "slot")
    env = child_environment(workspace.root)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the case at stake: targets that do write byte-code
    probe = [sys.executable, "-c", "from sglang.pagemath import page_of; print(page_of(17))"]

    def page_of_17() -> str:
        return subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert page_of_17() == "1"
    with workspace.applied(mutant):
        assert page_of_17() == "16"  # 17 & 16
    assert page_of_17() == "1"
    assert list((workspace.root / "sglang" / "__pycache__").glob("pagemath.*.pyc")), "no byte-code was written"
    assert (workspace.root / rel).read_bytes() == (tree / rel).read_bytes()


def test_campaign_survivors_carry_the_cases_that_reached_their_kernels() -> None:
    from hicache_fuzz.harness.mutate import report
    from hicache_fuzz.harness.mutate.targets import _paths_run

    paths = _paths_run({"paths": {"sglang-jit": {"jit-register": 127, "jit-tma": 59},
                                  "sglang-pool": {"jit-register+jit-tma": 9, "jit-staged": 94},
                                  "reference": {"oracle": 1000}}})
    assert paths == {"jit-register": 127, "jit-tma": 59, "jit-register+jit-tma": 9, "jit-staged": 94}
    assert report.entry_cases(f"{sources.KVCACHEIO_DIR}/hicache_tma.cuh", paths) == {"jit-tma": 59,
                                                                                    "jit-register+jit-tma": 9}
    assert report.entry_cases(f"{sources.KVCACHEIO_DIR}/relayout.cuh", paths) == {"jit-staged": 94}
    assert sum(report.entry_cases(f"{sources.KVCACHEIO_DIR}/page_row.cuh", paths).values()) == 0
    assert report.entry_cases(PY, {**paths, "none": 5}) == paths  # the dispatch is in front of every path
    mutant = Mutant(f"{sources.KVCACHEIO_DIR}/page_row.cuh", "constant", 3, 10, 11, "1", "2", "constant 1 -> 2")
    record = {"mutant": {**mutant.to_dict(), "diff": "--- a\n+++ b\n"},
              "targets": {"campaign": {"outcome": "survived", "seconds": 1.0, "returncode": 0, "detail": "",
                                       "failures": [], "log": "", "output_tail": "", "paths": paths}}}
    summary = report.summarize({mutant.id: record}, ["campaign"], {})
    assert summary["targets"]["campaign"]["survivors"][0]["entry_cases"] == {}
    assert "never reached" in report.markdown(summary)


def test_cli_module_protocol_add_arguments_and_run(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What harness/cli.py's SUBCOMMAND_MODULES table does with a module: add_arguments(parser) + run(args)."""
    import argparse

    from hicache_fuzz.harness.commands import mutate as commands_mutate

    parser = argparse.ArgumentParser(prog="hicache-fuzz")
    command = parser.add_subparsers(dest="command").add_parser("mutate")
    commands_mutate.add_arguments(command)
    command.set_defaults(run=commands_mutate.run)
    args = parser.parse_args(["mutate", "--sglang-src", str(tree), "--operator", "narrowing", "--list"])
    assert args.run(args) == 0
    assert f"{sum(1 for m in _mutants(tree) if m.operator == 'narrowing')} mutants" in capsys.readouterr().out


def test_timeout_also_kills_descendants_in_their_own_session(tree: Path, tmp_path: Path) -> None:
    """The campaign's workers start their own session; a timeout must not orphan them."""
    out, pid_file = tmp_path / "out", tmp_path / "worker.pid"
    spawn = (f"{sys.executable} -c \"import subprocess, time; "
             f"p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
             f"open('{pid_file}', 'w').write(str(p.pid)); time.sleep(300)\"")
    assert _run("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", f"{SYNC_PRESENT} || {spawn}", "--timeout", "3", "--out", out) == 0
    assert pid_file.exists()
    assert _gone(int(pid_file.read_text()), within=15.0), "a worker in its own session outlived the timeout"


def test_device_slots_respect_an_inherited_visibility_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.harness.commands import mutate as commands_mutate

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert commands_mutate._slots("2", "CUDA_VISIBLE_DEVICES") == ["2", "3"]
    assert commands_mutate._slots("1,0", "CUDA_VISIBLE_DEVICES") == ["3", "2"]
    with pytest.raises(commands_mutate.UsageError):
        commands_mutate._slots("3", "CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert commands_mutate._slots("2", "CUDA_VISIBLE_DEVICES") == ["0", "1"]
    assert commands_mutate._slots("0", "CUDA_VISIBLE_DEVICES") == [None]


def test_template_brackets_are_not_comparisons() -> None:
    snippet = """\
template <typename T, int64_t kElementSize, bool kIsMLA = false>
struct S {
  using Package = details::PackageType<kGroupBytes / kLanesPerWorker>;
  using Element = std::decay_t<decltype(vec.data[0])>;
  void f(T* p, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<T>(i);
    RuntimeCheck(n > 0 && n <= kMax, "bad n");
    auto x = n < kA ? 1 : 2;
  }
};
"""
    found = sorted((m.line, m.original) for m in generate("x.cuh", snippet, "c") if m.operator == "comparison")
    assert found == [(6, "<"), (7, "<="), (7, ">"), (8, "<")]


# Mutant e0d98c28a365 (reports/mutate/README.md): the unmutated campaign's known rejection and the mutant's, one
# identity ("a valid input this path rejects"), two variants (the error texts differ).
_KNOWN_REJECTION = "jit-staged-wrongly_rejected-ed0f6f73b4"


def _campaign_report(variant: str, first_index: int = 6, backend: str = "sglang-pool",
                     known: str | None = "corpus/sglang/pool-base-controller-mixed-group-cuda-host-indices.json"
                     ) -> dict[str, object]:
    return {"cases": 320, "backends": ["sglang-pool"],
            "unique_failures": [{"signature": _KNOWN_REJECTION, "backend": backend, "outcome": "wrongly_rejected",
                                 "count": 8, "first_case_id": "c", "first_index": first_index, "file": "f",
                                 "summary": "valid input rejected", "known": known,
                                 "variants": [f"{_KNOWN_REJECTION}.{variant}"]}]}


def test_a_known_failure_class_with_a_variant_the_unmutated_run_never_showed_is_a_kill() -> None:
    from hicache_fuzz.harness.mutate.targets import baseline_failure_variants, masked_by_known

    unmutated = baseline_failure_variants(_campaign_report("96d487"))
    assert masked_by_known(_campaign_report("96d487"), unmutated, 22225) == []  # the same variant: known
    (masked,) = masked_by_known(_campaign_report("d528f0"), unmutated, 22225)
    assert masked["new_variants"] == [f"{_KNOWN_REJECTION}.d528f0"]
    # not the mutant's doing, or not provably so: a case past the unmutated run's last, a non-sglang
    # backend, a failure that is new anyway (the ordinary kill), no baseline report
    assert masked_by_known(_campaign_report("d528f0", first_index=22225), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0", backend="reference"), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0", known=None), unmutated, 22225) == []
    assert masked_by_known(_campaign_report("d528f0"), None, 22225) == []


def test_the_campaign_target_kills_a_mutant_hidden_behind_a_known_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_fuzz.harness.mutate import targets
    from hicache_fuzz.harness.mutate.targets import CampaignTarget, ProcessRun, baseline_failure_variants

    def fake_fuzz(variant: str) -> None:
        def run(command: list[str], env: dict[str, str], timeout: float, log_path: Path,
                cwd: Path | None = None) -> ProcessRun:
            report = Path(command[command.index("--json") + 1])
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps(_campaign_report(variant)))
            return ProcessRun(0, 1.0, "1 failures, 1 unique, 0 new")  # fuzz exits 0: the failure is known
        monkeypatch.setattr(targets, "run_process", run)

    campaign = CampaignTarget("campaign", "cuda", 60.0, 2026, [])
    campaign.baseline_variants = baseline_failure_variants(_campaign_report("96d487"))
    campaign.baseline_cases = 22225
    fake_fuzz("96d487")
    assert campaign.run({}, tmp_path / "same", 100.0).outcome == "survived"
    fake_fuzz("d528f0")
    result = campaign.run({}, tmp_path / "masked", 100.0)
    assert result.outcome == "killed" and "masked by --known" in result.detail
    assert result.failures[0]["new_variants"] == [f"{_KNOWN_REJECTION}.d528f0"]
