"""hicache-fuzz merge: reports summed and failures merged by signature, overlaps refused, corpora deduplicated."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.commands import cli
from hicache_fuzz.harness.model import exit_codes
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.reporting.merge import (
    MergeError,
    corpus_files,
    describe,
    merge_corpora,
    merge_reports,
    merged_startup,
    report_files,
)
from hicache_fuzz.kernels.registry import load_registry

SMALL = CaseSpace(byte_budget=64 << 10)
MUTANTS = ["zoo-last-page-dropped", "zoo-row-tail-truncated"]  # fail often, with a few signatures


def failure(signature: str, count: int, first_index: int, backend: str = "b") -> dict[str, Any]:
    return {"signature": signature, "backend": backend, "outcome": "mismatch", "count": count,
            "first_case_id": f"case{first_index}", "first_index": first_index, "summary": f"{signature} differs",
            "file": f"corpus/{signature}/case{first_index}.json"}


def report(shard: str, cases: int, seconds: float, first: int, nxt: int, failures: list[dict[str, Any]],
           seed: int = 7, backends: tuple[str, ...] = ("b",)) -> dict[str, Any]:
    k, n = (int(x) for x in shard.split("/"))
    return {"seed": seed, "shard": [k, n], "backends": list(backends), "platform": "cpu", "cases": cases,
            "seconds": seconds, "cases_per_second": round(cases / seconds, 1), "first_index": first,
            "next_index": nxt, "outcomes": {"b": {"pass": cases - sum(f["count"] for f in failures),
                                                  "mismatch": sum(f["count"] for f in failures)}},
            "paths": {"b": {"reference": cases}}, "failures_total": sum(f["count"] for f in failures),
            "unique_failures": failures, "case_ids": [], "compile_seconds": 1.5}


def test_counts_sum_and_failures_merge_by_signature() -> None:
    a = report("0/2", 100, 10.0, 0, 200, [failure("s1", 3, 8), failure("s2", 1, 40)])
    b = report("1/2", 90, 9.0, 1, 181, [failure("s1", 2, 5), failure("s3", 4, 7)])
    merged = merge_reports([a, b], ["a.json", "b.json"])
    assert merged["cases"] == 190
    assert merged["outcomes"] == {"b": {"pass": 190 - 10, "mismatch": 10}}
    assert merged["cases_per_second"] == pytest.approx(20.0)
    assert merged["seconds"] == 10.0
    assert merged["shards"] == ["0/2", "1/2"]
    assert merged["seed"] == 7 and merged["next_index"] is None
    by_signature = {f["signature"]: f for f in merged["unique_failures"]}
    assert {s: f["count"] for s, f in by_signature.items()} == {"s1": 5, "s2": 1, "s3": 4}
    assert by_signature["s1"]["first_index"] == 5  # the earliest occurrence represents the class
    assert merged["failures_total"] == 10
    assert [e["source"] for e in merged["merged_from"]] == ["a.json", "b.json"]
    assert merged["merged_from"][0]["compile_seconds"] == 1.5  # per-input extras are kept, not summed
    assert merge_reports([b, a])["unique_failures"] == merged["unique_failures"]


def test_merged_reports_merge_again() -> None:
    parts = [report(f"{k}/4", 10, 1.0, k, 40 + k, [failure("s", 1, k)]) for k in range(4)]
    flat = merge_reports(parts, ["0", "1", "2", "3"])
    nested = merge_reports([merge_reports(parts[:2], ["0", "1"]), merge_reports(parts[2:], ["2", "3"])], ["x", "y"])
    for key in ("cases", "outcomes", "unique_failures", "shards", "cases_per_second", "merged_from"):
        assert nested[key] == flat[key], key


def test_the_merged_start_up_is_the_first_result_of_any_campaign_after_the_earliest_launch() -> None:
    a = report("0/2", 10, 1.0, 0, 20, [])
    b = report("1/2", 10, 1.0, 1, 21, [])
    a.update(startup={"launched_unix": 1000.0, "first_result_s": 9.0}, engine={"first_result_unix": 1009.0})
    b.update(startup={"launched_unix": 1002.0, "first_result_s": 5.0}, engine={"first_result_unix": 1007.0})
    merged = merge_reports([a, b])
    assert merged["startup"] == {"launched_unix": 1000.0, "first_result_s": 7.0, "campaigns": 2}
    assert merged["merged_from"][1]["startup"]["first_result_s"] == 5.0  # each campaign's own record is kept
    assert merge_reports([merged])["startup"] == merged["startup"]  # and merges again
    assert merged_startup(merged["merged_from"], launched_unix=995.0)["first_result_s"] == 12.0
    assert merge_reports([report("0/1", 1, 1.0, 0, 1, [])])["startup"] is None  # no launch recorded: unknown
    assert "first result 7.0 s after launch" in describe(merged)


@pytest.mark.parametrize(("first", "second", "overlap"), [
    (("0/1", 0, 100), ("0/1", 0, 100), True),  # two jobs that forgot --shard
    (("0/2", 0, 100), ("1/2", 1, 101), False),
    (("0/2", 0, 100), ("0/4", 0, 100), True),  # index 0, 4, 8, ... in both
    (("1/2", 1, 101), ("0/4", 0, 100), False),  # odd vs multiples of 4
    (("0/1", 0, 50), ("0/1", 50, 100), False),  # a resumed campaign
])
def test_overlapping_inputs_are_refused(first: tuple[str, int, int], second: tuple[str, int, int],
                                        overlap: bool) -> None:
    a = report(first[0], 10, 1.0, first[1], first[2], [])
    b = report(second[0], 10, 1.0, second[1], second[2], [])
    if overlap:
        with pytest.raises(MergeError, match="ran the same cases"):
            merge_reports([a, b])
        assert merge_reports([a, b], allow_overlap=True)["overlaps"]
    else:
        assert merge_reports([a, b])["overlaps"] == []


def test_other_seeds_and_other_backends_do_not_overlap() -> None:
    a = report("0/1", 10, 1.0, 0, 100, [])
    assert merge_reports([a, report("0/1", 10, 1.0, 0, 100, [], seed=8)])["seed"] is None
    merge_reports([a, report("0/1", 10, 1.0, 0, 100, [], backends=("other",))])


def failing_campaign(tmp_path: Path, shard: tuple[int, int], cases: int) -> dict[str, Any]:
    machine = require("cpu")
    registry = load_registry()
    backends = [registry.get(name) for name in MUTANTS]
    corpus = tmp_path / f"corpus-{shard[0]}-of-{shard[1]}"
    config = CampaignConfig(MUTANTS, 5, cases, None, corpus, shard, 0, SMALL)
    result = run_campaign(config, backends, machine.platform, InProcessExecutor(registry, machine),
                          record_case_ids=True)
    path = tmp_path / f"report-{shard[0]}-of-{shard[1]}.json"
    path.write_text(json.dumps(result.to_dict()))
    return result.to_dict()


def test_two_real_shards_merge_to_the_unsharded_findings(tmp_path: Path) -> None:
    whole = failing_campaign(tmp_path, (0, 1), 40)
    for k in range(2):
        failing_campaign(tmp_path, (k, 2), 20)
    assert whole["unique_failures"], "the mutants should fail within 40 cases"
    reports = [str(tmp_path / f"report-{k}-of-2.json") for k in range(2)]
    corpora = [str(tmp_path / f"corpus-{k}-of-2") for k in range(2)]
    out = tmp_path / "merged"
    code = cli.main(["merge", *reports, "--corpus", *corpora, "--out", str(out), "--max-per-signature", "0"])
    assert code == exit_codes.EXIT_FAILURES
    merged = json.loads((out / "report.json").read_text())
    assert sorted(merged["case_ids"]) == sorted(whole["case_ids"])
    assert merged["outcomes"] == whole["outcomes"]
    assert {f["signature"]: f["count"] for f in merged["unique_failures"]} == \
        {f["signature"]: f["count"] for f in whole["unique_failures"]}
    for failure_class in merged["unique_failures"]:  # reproducers now point into the merged corpus
        assert Path(failure_class["file"]).is_relative_to(out / "corpus"), failure_class["file"]
        assert Path(failure_class["file"]).exists()
    shard_files = sorted(p.relative_to(c) for c in map(Path, corpora) for p in corpus_files([Path(c)]))
    assert sorted(p.relative_to(out / "corpus") for p in corpus_files([out / "corpus"])) == shard_files
    suites = ET.parse(out / "junit.xml").getroot()
    assert int(suites.get("failures", "0")) == len(merged["unique_failures"])


def test_corpus_merge_deduplicates_caps_and_skips_journals(tmp_path: Path) -> None:
    failing_campaign(tmp_path, (0, 1), 30)
    corpus = tmp_path / "corpus-0-of-1"
    files = corpus_files([corpus])
    assert files
    copy = tmp_path / "copy"
    for path in files:  # a second corpus holding the same reproducers, plus a journal that is not corpus
        target = copy / path.relative_to(corpus)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    (copy / ".journal" / "crashes").mkdir(parents=True)
    (copy / ".journal" / "crashes" / "x.json").write_text("{not json")
    merged = merge_corpora([corpus, copy], tmp_path / "out")
    assert len(merged.kept) == len(files) and merged.duplicates == len(files) and not merged.unreadable
    capped = merge_corpora([corpus], tmp_path / "capped", max_per_signature=1)
    signatures = {p.parent.name for p in files}
    assert len(capped.kept) == len(signatures)
    assert capped.over_cap == len(files) - len(signatures)


def test_bad_input_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert cli.main(["merge", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o")]) == exit_codes.EXIT_USAGE
    assert cli.main(["merge", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == exit_codes.EXIT_USAGE
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report("0/1", 5, 1.0, 0, 5, [])))
    assert cli.main(["merge", str(good), str(good), "--out", str(tmp_path / "o")]) == exit_codes.EXIT_USAGE
    assert cli.main(["merge", str(good), "--out", str(tmp_path / "o")]) == exit_codes.EXIT_CLEAN
    # a clean campaign never creates its corpus folder: not an error
    assert cli.main(["merge", str(good), "--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 0


def test_report_folders_are_searched_without_a_shell_glob(tmp_path: Path) -> None:
    """tox runs commands without a shell: `merge OUT/reports` finds the per-worker reports itself."""
    for worker, shard in (("gw0", "0/2"), ("gw1", "1/2")):
        folder = tmp_path / "reports" / worker
        folder.mkdir(parents=True)
        (folder / "r.json").write_text(json.dumps(report(shard, 5, 1.0, int(shard[0]), 11, [])))
    (tmp_path / "reports" / "gw1" / "not-a-report.json").write_text(json.dumps({"case": {}}))
    hidden = tmp_path / "reports" / ".old"
    hidden.mkdir()
    (hidden / "r.json").write_text(json.dumps(report("0/2", 5, 1.0, 0, 11, [])))  # would overlap gw0
    assert [p.parent.name for p in report_files([tmp_path / "reports"])] == ["gw0", "gw1"]
    assert cli.main(["merge", str(tmp_path / "reports"), "--out", str(tmp_path / "o")]) == exit_codes.EXIT_CLEAN
    assert json.loads((tmp_path / "o" / "report.json").read_text())["cases"] == 10
