"""Seeded campaigns as tests: chunk k of HICACHE_FUZZ_CHUNKS runs shard k of the seed's case space.

Collection depends only on the environment (never on random values or on which backends probe available), so
every xdist worker collects the same test ids. A failing test names the seed, the shard, every failure class
and the reproducer to replay; each test also writes its campaign report for ``hicache-fuzz merge``.
"""

from __future__ import annotations

import os

import pytest

from hicache_fuzz.harness.campaign.loop import CampaignConfig, CampaignReport, run_campaign
from hicache_fuzz.harness.model.output_paths import write_json_atomic
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import Executor

from .conftest import FuzzTarget

SEED = int(os.environ.get("HICACHE_FUZZ_SEED", "20260"))
CHUNKS = int(os.environ.get("HICACHE_FUZZ_CHUNKS", "16"))


def cases_per_chunk(target: FuzzTarget) -> int:
    default = "24" if target.machine.platform.kind == "cpu" else "400"
    return int(os.environ.get("HICACHE_FUZZ_CASES_PER_CHUNK", default))


def describe_failures(report: CampaignReport) -> str:
    lines = [f"seed {report.seed}, shard {report.shard[0]}/{report.shard[1]}: {report.failure_count} failing "
             f"cases of {report.cases}, {len(report.failures)} signatures"]
    for failure in report.failures:
        lines.append(f"  [{failure.signature}] x{failure.count} {failure.outcome}: {failure.summary}")
        if failure.file:
            lines.append(f"      replay: hicache-fuzz replay {failure.file}")
    lines.append(f"  rerun: HICACHE_FUZZ_SEED={report.seed} HICACHE_FUZZ_CHUNKS={report.shard[1]} pytest "
                 f"'tests/fuzz/test_seeded_campaign.py::test_seeded_campaign[{report.shard[0]}]'")
    return "\n".join(lines)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeded_campaign(chunk: int, fuzz_target: FuzzTarget, fuzz_executor: Executor) -> None:
    space = CaseSpace() if fuzz_target.byte_budget is None else CaseSpace(byte_budget=fuzz_target.byte_budget)
    config = CampaignConfig([b.name for b in fuzz_target.backends], SEED, cases_per_chunk(fuzz_target), None,
                            fuzz_target.corpus, (chunk, CHUNKS), 0, space)
    report = run_campaign(config, fuzz_target.backends, fuzz_target.machine.platform, fuzz_executor)
    write_json_atomic(fuzz_target.reports / f"seeded-{SEED}-{chunk}-of-{CHUNKS}.json", report.to_dict())
    assert report.cases == config.max_cases
    assert not report.failures, describe_failures(report)
