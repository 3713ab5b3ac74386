"""Generation over the whole legal space: ranges and edges reached, pairs covered early by the schedule,
determinism by index, the space from files and --set, and coverage that shows all of it."""

from __future__ import annotations

import argparse
import json
from itertools import combinations
from pathlib import Path

import pytest

from hicache_fuzz.harness.generation.buckets import PAGE_SIZE_BUCKETS, is_power_of_two, label_of
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.generation.pairwise import covering_array, legal_pair, pins_for_index, schedule_dims
from hicache_fuzz.harness.generation.space_file import add_space_arguments, apply_space, space_from_args
from hicache_fuzz.harness.model.case import Attention, HostLayout
from hicache_fuzz.harness.model.exit_codes import UsageError
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.reporting.coverage import Coverage, case_edges, case_values

SPACE = CaseSpace()


def test_covering_array_covers_every_legal_pair() -> None:
    dims = schedule_dims(SPACE)
    rows = covering_array(dims, 5)
    for (i, (name_a, values_a)), (j, (name_b, values_b)) in combinations(enumerate(dims), 2):
        seen = {(row[i], row[j]) for row in rows}
        for a in values_a:
            for b in values_b:
                if legal_pair(name_a, a, name_b, b):
                    assert (a, b) in seen, (name_a, a, name_b, b)
    # every row is legal in itself (no MLA page_head, no multi-head MLA)
    for row in rows:
        pins = dict(zip((n for n, _ in dims), row, strict=True))
        layout = HostLayout(pins["dls"].split("/")[1])
        assert not (pins["attention"] == Attention.MLA.value and layout is HostLayout.PAGE_HEAD)


def test_later_rounds_still_cover_every_pair() -> None:
    dims = schedule_dims(SPACE)
    size = len(covering_array(dims, 5))
    names = [n for n, _ in dims]
    rows = [pins_for_index(SPACE, 5, i) for i in range(3 * size, 4 * size)]
    for a, b in (("page_size", "row"), ("dls", "pages"), ("layers", "allocator")):
        values_a, values_b = dict(dims)[a], dict(dims)[b]
        assert {(r[a], r[b]) for r in rows} == {(x, y) for x in values_a for y in values_b}, (a, b)
    assert names[0] == "dls"


def test_case_is_a_pure_function_of_seed_index_and_space() -> None:
    first = [case_for_index(3, i, SPACE) for i in (0, 17, 400)]
    again = [case_for_index(3, i, SPACE) for i in (400, 17, 0)][::-1]
    assert [c.case_id for c in first] == [c.case_id for c in again]
    assert case_for_index(3, 17, SPACE).case_id != case_for_index(4, 17, SPACE).case_id


def test_whole_range_is_reached_with_small_cases_in_the_majority() -> None:
    cases = [case_for_index(11, i, SPACE) for i in range(1500)]
    page_sizes = {c.page_size for c in cases}
    assert any(not is_power_of_two(p) for p in page_sizes)
    assert {label_of(PAGE_SIZE_BUCKETS, p) for p in page_sizes} >= {"1", "2-8", "16-64", "128+", "npot<16", "npot16+"}
    assert max(max(p.heads for p in c.pools) for c in cases) > 8
    assert max(c.layers for c in cases) >= 100
    assert any(c.n % c.page_size for c in cases)  # partial last pages
    assert any(max(c.host_slots, c.device_rows) > 1 << 16 for c in cases)
    sizes = sorted(case_values(c)["case_bytes"] for c in cases)
    assert sizes[len(sizes) // 2] <= 1 << 20, "most cases stay small"
    edges = {e for c in cases for e in case_edges(c, case_values(c))}
    assert {"page_size=npot", "heads>8", "layers>=61", "index=2^k+1", "partial_page"} <= edges


def test_long_transfers_are_drawn() -> None:
    space = SPACE.narrowed(long_rate=1.0)
    lengths = [case_for_index(2, i, space).n for i in range(6)]
    assert max(lengths) >= 1 << 16


def test_narrowed_menu_narrows_its_range() -> None:
    narrow = SPACE.narrowed(page_sizes=(1, 16))
    assert narrow.max_page_size == 0 and narrow.narrowed(row_bytes=(128,)).head_dims == ()
    assert {case_for_index(1, i, narrow).page_size for i in range(200)} <= {1, 16, 8, 4, 2}  # fit halves sizes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_space_arguments(parser)
    return parser.parse_args(argv)


def test_space_from_toml_json_and_set(tmp_path: Path) -> None:
    toml = tmp_path / "space.toml"
    toml.write_text('[space]\nattentions = ["mla"]\nlayer_counts = [61]\npage_sizes = [12]\nlong_rate = 0\n')
    overrides = space_from_args(parse(["--space", str(toml), "--set", "page_sizes=1,12,100"]))
    assert overrides == {"attentions": ["mla"], "layer_counts": [61], "page_sizes": [1, 12, 100], "long_rate": 0.0}
    space = apply_space(CaseSpace(), overrides)
    assert space.attentions == (Attention.MLA,) and space.max_layers == 0 and space.max_page_size == 0
    cases = [case_for_index(9, i, space) for i in range(100)]
    assert {p.attention for c in cases for p in c.pools} == {Attention.MLA}
    assert {c.page_size for c in cases} <= {1, 12, 100, 6, 3, 50, 25}  # the budget fit may halve a page size
    assert 61 in {c.layers for c in cases}
    as_json = tmp_path / "space.json"
    as_json.write_text(json.dumps({"max_layers": 64}))
    assert space_from_args(parse(["--space", str(as_json)])) == {"max_layers": 64}


@pytest.mark.parametrize("text, key", [
    ("page_size = [3]\n", "page_size"),
    ("page_sizes = [0]\n", "page_sizes"),
    ("layouts = [\"diagonal\"]\n", "layouts"),
    ("tail_rate = 2.0\n", "tail_rate"),
    ("schedule = \"maybe\"\n", "schedule"),
])
def test_bad_space_file_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=repr(key)):
        space_from_args(parse(["--space", str(path)]))


def test_bad_set_and_missing_file() -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        space_from_args(parse(["--set", "page_sizes"]))
    with pytest.raises(UsageError, match="--space"):
        space_from_args(parse(["--space", "/nonexistent/space.toml"]))


def test_coverage_reports_ranges_edges_and_pairs_and_merges() -> None:
    coverage = Coverage()
    cases = [case_for_index(4, i, SPACE) for i in range(300)]
    for case in cases:
        coverage.add(case, Result(case.case_id, "reference", Outcome.PASS))
    summary = coverage.summary("reference")
    assert summary["ranges"]["page_size"] == [min(c.page_size for c in cases), max(c.page_size for c in cases)]
    assert summary["edges_reached"] and set(summary["edges_missed"]).isdisjoint(summary["edges_reached"])
    assert 0 < summary["pairs_reached"] <= summary["pairs_possible"]
    half = Coverage()
    for case in cases[:150]:
        half.add(case, Result(case.case_id, "reference", Outcome.PASS))
    other = Coverage()
    for case in cases[150:]:
        other.add(case, Result(case.case_id, "reference", Outcome.PASS))
    merged = Coverage.from_dicts([half.to_dict(), other.to_dict()], None, [half.ranges_dict(), other.ranges_dict()])
    assert merged.to_dict() == coverage.to_dict()
    assert merged.summary("reference") == summary


def test_fuzz_space_file_errors_exit_2_and_space_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hicache_fuzz.harness.commands.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("max_layer = 4\n")
    assert main(["fuzz", "--platform", "cpu", "--runs", "3", "--space", str(bad)]) == 2
    assert "'max_layer'" in capsys.readouterr().err
    report = tmp_path / "r.json"
    code = main(["fuzz", "--platform", "cpu", "--seed", "3", "--runs", "30", "--corpus", str(tmp_path / "c"),
                 "--set", "page_sizes=12", "--set", "layer_counts=61", "--set", "byte_budget=65536",
                 "--json", str(report), "--no-progress"])
    assert code == 0
    data = json.loads(report.read_text())
    assert data["space_overrides"] == {"page_sizes": [12], "layer_counts": [61], "byte_budget": 65536}
    ranges = data["coverage_ranges"]["reference"]
    assert ranges["layers"][1] <= 61 and ranges["page_size"][1] <= 12
