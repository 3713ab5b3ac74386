"""The slowest ordinary cases of a campaign are named in its report and on the console (a batch waits for its
slowest group, so one slow case stalls the pool; the report must say which)."""

from __future__ import annotations

from hicache_fuzz.harness.engine.engine_stats import SLOWEST_KEPT, EngineStats, summary_lines
from hicache_fuzz.harness.engine.scale import ScaleReach
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.outcome import Outcome, Result
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor_base import Executor


class _Clock:
    generate_seconds = wait_seconds = calibrate_seconds = scale_generate_seconds = 0.0


class _Feed:
    clock = _Clock()
    batch = 64


def test_the_report_keeps_the_slowest_ordinary_cases_longest_first() -> None:
    stats = EngineStats(None)
    timings = [0.002, 9.5, 0.003, 0.4, 12.25, 0.001, 0.7, 0.05, 3.0]
    for index, seconds in enumerate(timings):
        case = case_for_index(3, index, CaseSpace(invalid_rate=0.0))
        stats.add(case, Result(case.case_id, "reference", Outcome.PASS, seconds=seconds), scale_case=False,
                  index=index)
    scale = case_for_index(3, 99, CaseSpace())
    stats.add(scale, Result(scale.case_id, "reference", Outcome.PASS, seconds=60.0), scale_case=True, index=99)
    report = stats.to_dict(10.0, _Feed(), None, Executor())  # the base: an executor that counted nothing
    slowest = report["slowest_cases"]
    assert [row["seconds"] for row in slowest] == sorted(timings, reverse=True)[:SLOWEST_KEPT]
    assert slowest[0]["index"] == 4
    assert slowest[0]["case_id"] == case_for_index(3, 4, CaseSpace(invalid_rate=0.0)).case_id
    assert all(row["index"] != 99 for row in slowest), "scale cases are slow by design and reported apart"
    report.update(cases_per_second=1.0, timeline=[])
    line = next(text for text in summary_lines(report) if "slowest cases" in text)
    assert "12.25 s reference" in line and "(index 4)" in line
    assert isinstance(stats.reach, ScaleReach)
