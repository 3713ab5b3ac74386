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

from hicache_fuzz.harness.mutate import sources
from hicache_fuzz.harness.mutate.operators import OPERATORS, generate
from hicache_fuzz.harness.mutate.workspace import tree_digest

from .synthetic import CUH, CUH_TEXT, PY, SYNC_PRESENT, all_mutants, one_mutant, run_mutate


def test_ids_are_stable_and_depend_only_on_the_mutation(tree: Path) -> None:
    first, second = all_mutants(tree), all_mutants(tree)
    assert [m.id for m in first] == [m.id for m in second]
    assert len({m.id for m in first}) == len(first)
    moved = tree.parent / "elsewhere"
    shutil.copytree(tree, moved)
    assert [m.id for m in all_mutants(moved)] == [m.id for m in first]  # the checkout location is not in the id
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
    one_mutant(all_mutants(tree), file, operator, line, original)
    candidates = [m for m in all_mutants(tree) if m.file == file and m.operator == operator and m.line == line
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
    cuh = [m for m in all_mutants(tree) if m.file == CUH]
    assert not [m for m in cuh if m.line in (1, 2, 3, 15)], "comment, string or preprocessor line mutated"
    template_open = lines[3].index("<")
    cast_open = CUH_TEXT.index("static_cast<") + len("static_cast")
    starts = {m.start for m in cuh if m.operator == "comparison"}
    assert CUH_TEXT.index("template <") + len("template ") not in starts and template_open
    assert cast_open not in starts and cast_open + len("<int64_t") not in starts
    assert not [m for m in cuh if m.operator == "arithmetic" and m.original == "*" and m.line in (5, 6)], \
        "a pointer declaration's * taken for a multiplication"


def test_python_filter_keeps_transfer_functions_only(tree: Path) -> None:
    controller = [m for m in all_mutants(tree) if m.file.endswith("cache_controller.py")]
    assert controller and all(m.line == 9 for m in controller), [(m.line, m.description) for m in controller]
    dispatch = [m for m in all_mutants(tree) if m.file == PY]
    assert all(7 <= m.line <= 13 for m in dispatch)  # function bodies only: not `PAGE = 16`


@pytest.mark.skipif(shutil.which("patch") is None, reason="the `patch` program is not installed")
def test_every_diff_applies_and_reverts_cleanly(tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "patched"
    shutil.copytree(tree, work)
    for mutant in all_mutants(tree):
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
    mutant = all_mutants(tree)[0]
    with pytest.raises(ValueError, match="does not hold"):
        mutant.apply("x" + CUH_TEXT)


def test_sampling_is_seeded_and_spread(tree: Path) -> None:
    mutants = all_mutants(tree)
    first = sources.sample(mutants, 10, seed=3)
    assert [m.id for m in first] == [m.id for m in sources.sample(mutants, 10, seed=3)]
    assert [m.id for m in first] != [m.id for m in sources.sample(mutants, 10, seed=4)]
    assert len({m.id for m in first}) == 10
    assert {m.file for m in first} == {CUH, PY, "sglang/srt/managers/cache_controller.py"}
    assert len({m.operator for m in first}) >= 6


def test_a_sample_as_large_as_the_file_count_has_a_mutant_of_every_file(tree: Path) -> None:
    """Files first: whatever the seed, N >= files picks every file; within a file, operators in turn."""
    mutants = all_mutants(tree)
    files = {m.file for m in mutants}
    for seed in range(8):
        picked = sources.sample(mutants, len(files), seed=seed)
        assert {m.file for m in picked} == files
        per_file = [m for m in sources.sample(mutants, 4 * len(files), seed=seed) if m.file == CUH]
        operators = {m.operator for m in mutants if m.file == CUH}
        assert len({m.operator for m in per_file}) == min(len(per_file), len(operators))


def test_end_to_end_kills_one_mutant_leaves_the_install_untouched(tree: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree_digest(tree)
    monkeypatch.chdir(tmp_path)
    out = Path("out")  # relative, and the target changes directory: it must still import the private copy
    in_copy = (f'cd / && {sys.executable} -c "import os, sglang; '
               f"assert sglang.__file__.startswith(os.environ['HICACHE_MUTATE_SGLANG_ROOT'])\"")
    argv = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
            "--test-cmd", f"{in_copy} && {SYNC_PRESENT}", "--out", out]
    assert run_mutate(*argv) == 0
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
    assert run_mutate(*argv) == 0  # resumed: nothing runs again (the baseline does)
    assert {p: p.stat().st_mtime_ns for p in out.glob("mutants/*.json")} == stamps
    assert (out / "baseline.json").stat().st_mtime_ns != baseline_stamp
    baseline_stamp = (out / "baseline.json").stat().st_mtime_ns
    assert run_mutate(*argv, "--reuse-baseline") == 0
    assert (out / "baseline.json").stat().st_mtime_ns == baseline_stamp
    assert tree_digest(tree) == before


def test_a_hang_is_a_timeout_and_its_process_group_is_killed(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    code = run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", f"{SYNC_PRESENT} || (sleep 60; sleep 60)", "--timeout", "3", "--out", out)
    assert code == 0 and time.monotonic() - started < 45
    target = json.loads((out / "summary.json").read_text())["targets"]["test-cmd"]
    assert [t["description"] for t in target["timeouts"]] == ["drop the synchronisation `__syncthreads(...)`"]
    assert target["counts"]["killed"] == 0 and target["score"] > 0


def test_build_errors_are_listed_and_not_scored(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = f'{SYNC_PRESENT} || (echo "RuntimeError: Failed to build JIT module hicache"; exit 1)'
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--test-cmd", command, "--out", out) == 0
    target = json.loads((out / "summary.json").read_text())["targets"]["test-cmd"]
    assert target["counts"]["build_error"] == 1 and target["counts"]["killed"] == 0
    assert target["score"] == 0.0


def test_side_by_side_of_two_commands(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    narrowed = f'! grep -q "uint16_t" "$HICACHE_MUTATE_SGLANG_ROOT/{CUH}"'
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement",
                "--operator", "narrowing", "--test-cmd", SYNC_PRESENT, "--test-cmd", narrowed, "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    sbs = summary["side_by_side"]
    assert (sbs["a"], sbs["b"]) == ("test-cmd-1", "test-cmd-2")
    assert sbs["a_only"]["count"] == 1 and sbs["both"]["count"] == 0
    assert sbs["b_only"]["count"] == sum(1 for m in all_mutants(tree) if m.file == CUH and m.replacement == "uint16_t")
    assert sbs["a_only"]["count"] + sbs["b_only"]["count"] + sbs["neither"]["count"] == summary["mutants"]
    assert "Side by side" in (out / "summary.md").read_text()


def test_baseline_failure_exits_3(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_mutate("--sglang-src", tree, "--gpus", "0", "--sample", "2", "--test-cmd", "exit 4", "--out", out) == 3
    assert json.loads((out / "baseline.json").read_text())["passed"] is False
    assert not list(out.glob("mutants/*.json"))


def test_min_score_and_usage_and_environment_errors(tree: Path, tmp_path: Path) -> None:
    base = ["--sglang-src", tree, "--gpus", "0", "--file", "*.cuh", "--operator", "drop_statement"]
    assert run_mutate(*base, "--test-cmd", SYNC_PRESENT, "--out", tmp_path / "a", "--min-score", "0.9") == 1
    assert run_mutate(*base, "--test-cmd", SYNC_PRESENT, "--out", tmp_path / "b", "--min-score", "0.1") == 0
    assert run_mutate(*base, "--test-cmd", "true") == 2  # no --out
    assert run_mutate("--sglang-src", tree, "--file", "nothing-matches", "--list") == 2
    assert run_mutate(*base, "--test-cmd", "true", "--gpus", "two", "--out", tmp_path / "c") == 2
    assert run_mutate("--sglang-src", tmp_path / "missing", "--list") == 2  # a wrong path, like every other wrong path
    assert run_mutate("--sglang-src", tmp_path, "--list") == 3  # a folder that holds no sglang: sources missing
    assert run_mutate(*base, "--test-cmd", "true", "--out", tmp_path / "d", "--", "--workers", "2") == 2  # no campaign


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

    assert campaign_args("--jobs-per-gpu", "3")[-4:] == ["--worker-processes", "1", "--spare-workers", "0"]
    assert "--worker-processes" not in campaign_args()
    assert "--spare-workers" not in campaign_args()
    assert campaign_args("--jobs-per-gpu", "3", "--fuzz-arg=--worker-processes=2").count(
        "--worker-processes=2") == 1
    assert "--worker-processes" not in campaign_args("--jobs-per-gpu", "3", "--fuzz-arg=--worker-processes=2")
    assert "--spare-workers" not in campaign_args("--jobs-per-gpu", "3", "--fuzz-arg=--spare-workers=1")


def test_list_and_show(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_mutate("--sglang-src", tree, "--list") == 0
    listed = capsys.readouterr().out
    mutant = all_mutants(tree)[0]
    assert mutant.id in listed and f"{len(all_mutants(tree))} mutants" in listed
    assert run_mutate("--sglang-src", tree, "--show", mutant.id) == 0
    assert capsys.readouterr().out == mutant.diff((tree / mutant.file).read_text())



def _listed_ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if re.fullmatch(r"[0-9a-f]{12}", line.split(" ", 1)[0])]


def test_only_keeps_the_named_mutants_of_the_sample_in_the_order_given(tree: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_mutate("--sglang-src", tree, "--sample", "8", "--seed", "1", "--list") == 0
    sample = _listed_ids(capsys.readouterr().out)
    assert len(sample) == 8
    # a `--list` output as the id file: comments, blank lines and the trailing tables are skipped
    listing = tmp_path / "ids.txt"
    listing.write_text(f"# the rest of a run\n\n{sample[5]}  file:1  op  text\n{sample[1]}\n")
    assert run_mutate("--sglang-src", tree, "--sample", "8", "--seed", "1", "--only-from", listing,
                "--only", sample[6], "--list") == 0
    assert _listed_ids(capsys.readouterr().out) == [sample[6], sample[5], sample[1]]


def test_only_refuses_ids_outside_the_selection_and_malformed_files(tree: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert run_mutate("--sglang-src", tree, "--sample", "3", "--only", "0123456789ab", "--list") == 2
    assert "0123456789ab" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("not-an-id here\n")
    assert run_mutate("--sglang-src", tree, "--only-from", bad, "--list") == 2
    assert "bad.txt:1" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert run_mutate("--sglang-src", tree, "--only-from", empty, "--list") == 2
    assert run_mutate("--sglang-src", tree, "--only-from", tmp_path / "absent.txt", "--list") == 2

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
