"""The cost-balanced schedule (feed.py, EngineOptions.backend_every): on a GPU a backend whose cases cost K times
a kernel case runs every K-th campaign index; its cases are those of a campaign without the schedule, resume
still moves on after an index's last slot, and 'none' or NAME=K override the default."""

from __future__ import annotations

import argparse

import pytest

from hicache_fuzz.harness.commands.fuzz_options import add_arguments, engine_options
from hicache_fuzz.harness.engine.engine_stats import summary_lines
from hicache_fuzz.harness.engine.feed import CaseFeed, EngineOptions, parse_backend_every
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.registry import load_registry

CPU = Platform("cpu")
H200 = Platform("cuda", (9, 0))


def _backends() -> tuple[Backend, Backend]:
    reference = load_registry().get("reference")

    class Costly(type(reference)):  # type: ignore[misc]
        name = "costly"
        relative_case_cost = 3

    return reference, Costly()


def _slots(feed: CaseFeed, count: int) -> list:  # type: ignore[type-arg]
    try:
        return feed.take(count)
    finally:
        feed.close()


def test_a_costly_backend_runs_every_kth_index_on_a_gpu_and_every_index_on_the_cpu() -> None:
    cheap, costly = _backends()
    assert EngineOptions().resolved_backend_every(H200, [cheap, costly]) == {"reference": 1, "costly": 3}
    assert EngineOptions().resolved_backend_every(CPU, [cheap, costly]) == {"reference": 1, "costly": 1}
    assert EngineOptions(backend_every="none").resolved_backend_every(H200, [cheap, costly]) == {
        "reference": 1, "costly": 1}
    assert EngineOptions(backend_every="reference=2").resolved_backend_every(H200, [cheap, costly]) == {
        "reference": 2, "costly": 3}


def test_auto_schedules_relative_to_the_cheapest_backend_so_a_costly_backend_alone_runs_every_index() -> None:
    cheap, costly = _backends()
    assert EngineOptions().resolved_backend_every(H200, [costly]) == {"costly": 1}
    assert EngineOptions().resolved_backend_every(H200, [cheap]) == {"reference": 1}
    assert EngineOptions(backend_every="costly=2").resolved_backend_every(H200, [costly]) == {"costly": 2}


def test_the_schedule_keeps_each_backends_cases_and_moves_resume_after_the_last_backend_that_ran() -> None:
    cheap, costly = _backends()
    spaces = {b.name: CaseSpace() for b in (cheap, costly)}
    feed = CaseFeed(9, 0, (0, 1), [cheap, costly], spaces, CPU, None, batch=40, every={"costly": 3})
    slots = _slots(feed, 40)
    by_backend: dict[str, list[int]] = {}
    for slot in slots:
        by_backend.setdefault(slot.backend.name, []).append(slot.index)
        assert slot.case == case_for_index(9, slot.index, spaces[slot.backend.name])  # the same case for index i
    assert by_backend["reference"] == list(range(len(by_backend["reference"])))
    assert by_backend["costly"] == [i for i in by_backend["reference"] if i % 3 == 0][: len(by_backend["costly"])]
    # an index's last slot is the costly backend's where it runs, else the cheap one's
    for slot in slots:
        if slot.last_of_index:
            assert slot.backend.name == ("costly" if slot.index % 3 == 0 else "reference")
    assert sorted(s.index for s in slots if s.last_of_index) == sorted(set(by_backend["reference"]))[
        : len([s for s in slots if s.last_of_index])]


def test_a_sharded_schedule_counts_the_shards_own_indices() -> None:
    cheap, costly = _backends()
    spaces = {b.name: CaseSpace() for b in (cheap, costly)}
    feed = CaseFeed(9, 1, (1, 4), [cheap, costly], spaces, CPU, None, batch=30, every={"costly": 2})
    slots = _slots(feed, 30)
    costly_indices = [s.index for s in slots if s.backend.name == "costly"]
    assert costly_indices and all(i % 4 == 1 and (i // 4) % 2 == 0 for i in costly_indices)
    assert {s.index for s in slots if s.backend.name == "reference"} >= set(costly_indices)


@pytest.mark.parametrize("bad", ["costly", "costly=0", "=3", "costly=x", "a=2,,b=3"])
def test_bad_backend_every_values_name_the_problem(bad: str) -> None:
    with pytest.raises(ValueError, match="--backend-every"):
        parse_backend_every(bad)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--backend-every"):
        engine_options(parser.parse_args(["--backend-every", bad]))
    assert engine_options(parser.parse_args(["--backend-every", "none"])).backend_every == "none"


def test_the_shipped_pool_backend_is_the_costly_one() -> None:
    """Only the pool backends declare a cost: their cases build pools (sglang-hicache also a controller) and cost
    several times a JIT case on a GPU."""
    costs = {b.name: b.relative_case_cost for b in load_registry().backends.values() if b.relative_case_cost != 1}
    assert costs == {"sglang-pool": 6, "sglang-hicache": 6}


def test_the_engine_line_names_the_backends_on_a_sparse_schedule() -> None:
    report = {
        "byte_compared_transfers": 1, "transfer_share": 1.0, "byte_compared_per_second": 1.0,
        "rejections_checked": 0, "verified_gb_per_second": 0.0, "stages": {}, "backend_ms_per_case": {},
        "engine": {"batch": 64, "variants_by_backend": {"a": 7, "sglang-pool": 7},
                   "backend_every": {"a": 1, "sglang-pool": 6}, "storages_reused": 0},
        "scale": {"largest_device_pool_rows": 0, "largest_host_byte_offset": 0,
                  "registration_chunks_of_largest_host_storage": 0, "host_register_chunk_bytes": 1 << 30,
                  "longest_transfer_tokens": 0, "max_layers": 0, "page_sizes_not_power_of_two": [],
                  "scale_cases": 0, "scale_seconds": 0.0},
    }
    assert "sglang-pool every 6th index" in summary_lines(report)[0]
    report["engine"]["backend_every"] = {"a": 1, "sglang-pool": 1}
    assert "every" not in summary_lines(report)[0]
