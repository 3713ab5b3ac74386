"""The minimizer: shrinks failing cases, keeps the signature (not merely "still fails"), respects its budget,
keeps out-of-range indices out of range; and `fuzz --minimize` saves minimized reproducers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign.minimize import NotFailing, case_size, minimize
from hicache_fuzz.harness.commands.cli import main
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Case, Direction, HostLayout, PoolSpec, Scope
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.reference import ReferenceBackend
from tests._mutants import DropLastPage, cpu_run

PLUGIN = "tests._mutants:backends"


def big_case(**changes: object) -> Case:
    base = Case(direction=Direction.WRITE_BACK, scope=Scope.ALL_LAYERS, layout=HostLayout.PAGE_FIRST,
                pools=(PoolSpec(heads=4, head_dim=64), PoolSpec(name="side1", heads=2, head_dim=32)), layers=4,
                page_size=16, device_rows=16 * 12, host_slots=16 * 10,
                host_indices=tuple(p * 16 + t for p in (7, 2, 5, 3, 9) for t in range(16)),
                device_indices=tuple(p * 16 + t for p in (4, 9, 1, 6, 2) for t in range(16)),
                backend="test-drop-last-page", seed=1234)
    return base.replace(**changes)


def test_drop_last_page_shrinks_to_two_tiny_pages() -> None:
    case = big_case()
    run = cpu_run(DropLastPage())
    original = run(case)
    assert original.outcome is Outcome.MISMATCH
    done = minimize(case, run, original)
    assert done.fixpoint
    assert signature(done.result, done.case) == signature(original, case)
    # A last-page bug needs two pages to be a last-page bug; everything else goes.
    assert done.size.indices == 4 and done.case.page_size == 1 and done.case.layers == 1
    assert len(done.case.pools) == 1 and done.size.bytes < case_size(case).bytes / 1000
    assert done.case.host_indices == (0, 1)
    report = done.to_dict()
    assert report["ratio"]["indices"] < 0.05 and report["original"]["indices"] == 160


def fake_run(error_for: dict[bool, str], predicate: Callable[[Case], bool]) -> Callable[[Case], Result]:
    """A run function without torch: WRONGLY_REJECTED with one of two errors depending on a predicate."""
    def run(case: Case) -> Result:
        message = error_for[predicate(case)]
        return Result(case.case_id, case.backend, Outcome.WRONGLY_REJECTED, error=message)

    return run


def test_signature_is_kept_not_just_failure() -> None:
    # One layer fails too, but with another error: the minimizer must not cross over to that other bug.
    run = fake_run({True: "RuntimeError: layer loop bound", False: "RuntimeError: something else"},
                   lambda c: c.layers >= 2)
    done = minimize(big_case(), run)
    assert done.case.layers == 2
    assert done.size.indices == 2  # one token per side: the fake bug does not care about pages


def test_a_trigger_keeps_a_feature_whose_relaxed_case_another_check_refuses() -> None:
    """page_first refused with one error, and every other layout with another error of the same path (one
    identity: a valid input refused): the layout is a condition of the trigger, not dropped as unneeded."""
    run = fake_run({True: "IndexError: index 1 is out of bounds", False: "ValueError: host pool too small"},
                   lambda c: c.layout is HostLayout.PAGE_FIRST)
    done = minimize(big_case(backend="test-refuses"), run)
    assert done.trigger == {"layout": "page_first"}
    # a path that refuses every layout with the same check: the layout is not needed
    done = minimize(big_case(backend="test-refuses"), fake_run({True: "IndexError: x", False: "IndexError: x"},
                                                                lambda c: True))
    assert done.trigger == {}


def test_out_of_range_index_keeps_its_distance_from_the_bound() -> None:
    # "Accepts host index == host_slots" stays exactly one past the end while pools and pages shrink.
    case = big_case()
    host = list(case.host_indices)
    host[40] = case.host_slots
    case = case.replace(host_indices=tuple(host))
    run = fake_run({True: "RuntimeError: one past the end", False: "RuntimeError: other"},
                   lambda c: c.host_slots in c.host_indices)
    done = minimize(case, run)
    assert done.case.host_slots in done.case.host_indices
    assert done.case.host_slots < case.host_slots and done.size.indices <= 2


def test_budget_is_respected() -> None:
    run = cpu_run(DropLastPage())
    done = minimize(big_case(), run, max_runs=3)
    assert done.runs <= 3 and not done.fixpoint
    assert signature(done.result, done.case) == signature(run(big_case()), big_case())


def test_a_budget_cut_shrink_still_tries_each_knob_for_the_trigger() -> None:
    """A page_first refusal whose case carries knobs it does not need, on a budget far too small to shrink 160
    indices: the shrinking stops with a run left per knob, so the knobs are tried and only the layout stays."""
    knobs = (("controller", "base"), ("draft_layers", "1"), ("pool_kind", "hisparse"), ("start_layer", "7"))
    case = big_case(backend="test-refuses", tuning=knobs)
    run = fake_run({True: "IndexError: index 1 is out of bounds", False: "ValueError: host pool too small"},
                   lambda c: c.layout is HostLayout.PAGE_FIRST)
    done = minimize(case, run, max_runs=12)
    assert done.runs <= 12 and not done.fixpoint and done.case.tuning == knobs  # cut short before the defaults
    assert done.trigger == {"layout": "page_first"}


def test_passing_case_is_refused() -> None:
    with pytest.raises(NotFailing):
        minimize(big_case(backend="reference"), cpu_run(ReferenceBackend()))


def test_fuzz_minimize_saves_minimized_reproducers_and_dedups(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    report = tmp_path / "report.json"
    code = main(["fuzz", "--backend-plugin", PLUGIN, "--backend", "test-drop-last-page", "--seed", "3",
                 "--runs", "25", "--byte-budget", "65536", "--minimize", "--corpus", str(corpus),
                 "--json", str(report), "--isolate", "no", "--no-progress"])
    assert code == 1
    data = json.loads(report.read_text())
    unique = data["unique_failures"]
    assert data["failures_total"] > len(unique) >= 1  # repeats merged by signature
    first = json.loads(Path(unique[0]["file"]).read_text())
    assert first["minimized"]["minimized"]["indices"] <= first["minimized"]["original"]["indices"]
    assert first["signature"] == unique[0]["signature"] == Path(unique[0]["file"]).parent.name
    saved = Path(unique[0]["file"])
    assert (saved.parent / f"repro_{saved.stem}.py").exists()
    out = capsys.readouterr().out
    assert "unique" in out


def test_minimize_subcommand(tmp_path: Path) -> None:
    space = CaseSpace(byte_budget=1 << 16, backend="test-drop-last-page")
    run = cpu_run(DropLastPage())
    case = next(c for i in range(200) if run(c := case_for_index(5, i, space)).outcome.is_failure)
    from hicache_fuzz.harness.findings.reproducer import save_reproducer

    source = save_reproducer(tmp_path / "in", case, run(case))
    out_json = tmp_path / "min.json"
    code = main(["minimize", "--backend-plugin", PLUGIN, str(source), "--corpus", str(tmp_path / "out"),
                 "--json", str(out_json), "--isolate", "no"])
    assert code == 0
    row = json.loads(out_json.read_text())["results"][0]
    assert row["minimized"]["bytes"] <= row["original"]["bytes"]
    assert Path(row["output"]).exists() and Path(row["output"]).parent.name == row["signature"]


def test_minimize_in_place_rewrites_a_known_entry_keeping_its_name_expect_and_scope(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-minimizing a known corpus entry where it fails (a GPU machine, for sglang's): the file keeps its name,
    its "expect" and "scope", and gets the smaller case, the minimizer's report and the trigger derived by
    running."""
    space = CaseSpace(byte_budget=1 << 16, backend="test-drop-last-page")
    run = cpu_run(DropLastPage())
    case = next(c for i in range(200) if run(c := case_for_index(5, i, space)).outcome.is_failure)
    from hicache_fuzz.harness.findings.reproducer import save_reproducer

    saved = save_reproducer(tmp_path / "in", case.replace(note="a known bug, kept"), run(case),
                            {"expect": "fail", "scope": {"platforms": ["cpu"]}})
    entry = tmp_path / "known-last-page-dropped.json"
    entry.write_text(saved.read_text())
    monkeypatch.chdir(tmp_path)  # where the default --corpus would go
    code = main(["minimize", "--backend-plugin", PLUGIN, str(entry), "--in-place", "--isolate", "no",
                 "--no-progress"])
    assert code == 0
    data = json.loads(entry.read_text())
    assert data["expect"] == "fail" and data["scope"] == {"platforms": ["cpu"]}
    assert data["case"]["note"] == "a known bug, kept"
    assert data["minimized"]["minimized"]["indices"] < data["minimized"]["original"]["indices"]
    assert "trigger" in data and data["signature"] == data["minimized"]["signature"]
    assert len(data["case"]["host_indices"]) < len(case.host_indices)
    assert not (tmp_path / "fuzz-out").exists()
    # it is not a corpus folder: --corpus beside --in-place is bad usage
    assert main(["minimize", "--backend-plugin", PLUGIN, str(entry), "--in-place", "--corpus",
                 str(tmp_path / "x"), "--isolate", "no"]) == 2
