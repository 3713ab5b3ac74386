"""Splitting one seed's case space: shards are disjoint and together are the unsharded campaign (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache_fuzz.harness.campaign import parallel
from hicache_fuzz.harness.campaign.loop import CampaignConfig, CampaignReport, run_campaign
from hicache_fuzz.harness.commands import cli
from hicache_fuzz.harness.model import exit_codes
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.kernels.registry import load_registry

SMALL = CaseSpace(byte_budget=64 << 10)  # small cases keep the CPU campaign fast
BACKENDS = ["reference", "zoo-last-page-dropped"]  # two, so a budget can end inside an index


def campaign(cases: int | None, shard: tuple[int, int] = (0, 1), start_index: int = 0,
             backends: list[str] = BACKENDS, seed: int = 11) -> CampaignReport:
    machine = require("cpu")
    registry = load_registry()
    chosen = [registry.get(name) for name in backends]
    config = CampaignConfig(backends, seed, cases, None, None, shard, start_index, SMALL)
    return run_campaign(config, chosen, machine.platform, InProcessExecutor(registry, machine),
                        record_case_ids=True)


@pytest.mark.parametrize("total", [1, 7, 24, 25])
@pytest.mark.parametrize("shards", [2, 3])
def test_shards_partition_the_unsharded_case_set(total: int, shards: int) -> None:
    whole = campaign(total)
    parts = [campaign(parallel.shard_case_budget(total, len(BACKENDS), (k, shards)), (k, shards))
             for k in range(shards)]
    union = [case_id for part in parts for case_id in part.case_ids]
    assert len(union) == len(set(union)), "shards ran a case twice"
    assert set(union) == set(whole.case_ids)
    assert sum(p.cases for p in parts) == whole.cases == total


@pytest.mark.parametrize("first_part", [4, 5, 6])
def test_resuming_at_next_index_neither_skips_nor_repeats_an_index(first_part: int) -> None:
    whole = campaign(12, backends=["reference"])
    head = campaign(first_part, backends=["reference"])
    tail = campaign(12 - first_part, start_index=head.next_index, backends=["reference"])
    assert head.case_ids + tail.case_ids == whole.case_ids


def test_shard_budget_matches_the_unsharded_order() -> None:
    for backends in (1, 2, 3):
        for shards in (1, 2, 3, 8):
            for start in (0, 5):
                for total in range(0, 40):
                    # (index, backend) pairs of the unsharded campaign, in the order it runs them
                    pairs = [(start + i // backends, i % backends) for i in range(total)]
                    for k in range(shards):
                        expected = sum(1 for index, _ in pairs if index % shards == k)
                        assert parallel.shard_case_budget(total, backends, (k, shards), start) == expected


@pytest.mark.parametrize("total", [5, 13])
@pytest.mark.parametrize("start_index", [0, 3])
def test_workers_of_a_node_shard_run_exactly_that_shard(total: int, start_index: int) -> None:
    """--shard 1/3 --workers 2: the two workers split node shard 1/3, nothing more, nothing less."""
    node, workers = (1, 3), 2
    whole = campaign(total, node, start_index)
    parts = [campaign(parallel.worker_case_budget(total, len(BACKENDS), node, w, workers, start_index),
                      parallel.worker_shard(node, w, workers), start_index) for w in range(workers)]
    union = [case_id for part in parts for case_id in part.case_ids]
    assert len(union) == len(set(union)) == total
    assert set(union) == set(whole.case_ids)


def test_workers_are_pinned_round_robin_to_the_visible_devices() -> None:
    devices = parallel.visible_devices("cuda", {"CUDA_VISIBLE_DEVICES": "2, 3"})
    assert devices == ["2", "3"]
    assert [parallel.device_for_worker(w, devices) for w in range(5)] == ["2", "3", "2", "3", "2"]
    assert parallel.visible_devices("rocm", {"HIP_VISIBLE_DEVICES": "0,1,2"}) == ["0", "1", "2"]
    assert parallel.device_for_worker(3, []) is None
    assert parallel.pinning_env("cuda", "3") == {"CUDA_VISIBLE_DEVICES": "3"}
    assert parallel.pinning_env("rocm", "1") == {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}
    assert parallel.pinning_env("cpu", None) == {}


def test_worker_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.WORKERS_PER_GPU_ENV, "3")
    assert parallel.resolve_worker_count("auto", "cuda", ["0", "1"]) == 6
    assert parallel.resolve_worker_count("auto", "cpu", []) == parallel.cpu_count()
    assert parallel.resolve_worker_count("5", "cuda", ["0"]) == 5
    for bad in ("0", "two", "-1"):
        with pytest.raises(parallel.ParallelUsageError):
            parallel.resolve_worker_count(bad, "cuda", ["0"])
    monkeypatch.setenv(parallel.WORKERS_PER_GPU_ENV, "zero")
    with pytest.raises(parallel.ParallelUsageError):
        parallel.resolve_worker_count("auto", "cuda", ["0"])


def test_shard_job_round_trips_through_json() -> None:
    job = parallel.ShardJob(platform="cuda", backends=["a"], plugins=[], seed=1, runs_total=10, max_seconds=None,
                            corpus="c", journal="j", report="r", shard=(1, 4), device="3")
    assert parallel.ShardJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job


@pytest.mark.slow  # the long tail: deselected by default, run by .ci/run (-m slow)
def test_fuzz_workers_cli_runs_the_unsharded_case_set(tmp_path: Path) -> None:
    """End to end on the CPU: `fuzz --shard 1/2 --workers 2` spawns two workers (each with a crash-isolating
    worker process, as GPU backends get) that together run node shard 1/2, and merges their reports."""
    out = tmp_path / "merged.json"
    code = cli.main(["fuzz", "--workers", "2", "--shard", "1/2", "--runs", "9", "--seed", "11",
                     "--byte-budget", str(64 << 10),
                     "--backend", "reference", "--backend", "zoo-last-page-dropped", "--corpus",
                     str(tmp_path / "corpus"), "--json", str(out), "--record-case-ids", "--platform", "cpu",
                     "--isolate", "yes"])  # the isolating worker starts while the shard probes its backends
    merged = json.loads(out.read_text())
    assert code == (exit_codes.EXIT_FAILURES if merged["unique_failures"] else exit_codes.EXIT_CLEAN)
    assert merged["shards"] == ["1/4", "3/4"]  # node shard 1/2, split over two workers
    assert sorted(merged["case_ids"]) == sorted(campaign(9, (1, 2)).case_ids)
    assert merged["cases"] == 9
    assert all(entry["startup_seconds"] > 0 for entry in merged["merged_from"])
    assert merged["startup"]["first_result_s"] > 0  # from this process's launch to the first shard's result


