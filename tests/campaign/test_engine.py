"""The GPU campaign engine, on the CPU: batched worker round trips, a lost batch replayed case by case (naming
the culprit), the write-ahead batch journal, the device-error probe, the known-crash ordering, the case mix,
the simulated scale tier and the report's engine fields."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hicache_fuzz.harness.campaign.loop import CampaignConfig, run_campaign
from hicache_fuzz.harness.engine.campaign_case import backend_space
from hicache_fuzz.harness.engine.engine_stats import summary_lines
from hicache_fuzz.harness.engine.feed import CaseFeed, EngineOptions, Slot, suspects_last
from hicache_fuzz.harness.engine.mix import DEFAULT_MIX, Mix, TransferProfile, case_class, mixed_case
from hicache_fuzz.harness.engine.scale import SIMULATED, scale_case
from hicache_fuzz.harness.findings.corpus import load_entry
from hicache_fuzz.harness.findings.identity import signature
from hicache_fuzz.harness.findings.known_crash import (
    CrashFeatures,
    KnownCrash,
    crash_features,
    known_crashes,
    predicted_crash,
)
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.outcome import Outcome
from hicache_fuzz.harness.model.platform import Platform, require
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.harness.pipeline.executor import InProcessExecutor
from hicache_fuzz.harness.pipeline.fill import _fill_numpy, _hashed_words
from hicache_fuzz.harness.pipeline.runner import DeviceContextLost, check_device, device_crash
from hicache_fuzz.harness.pipeline.worker import WorkerExecutor
from hicache_fuzz.kernels.buffers import registration_ranges
from hicache_fuzz.kernels.registry import load_registry
from tests.pipeline.test_worker import PLUGIN, case, env

CORPUS = Path(__file__).parents[2] / "corpus" / "sglang"
CPU = Platform("cpu")


# ---- batches through the worker -------------------------------------------------------------------------

def test_a_batch_returns_the_results_of_single_runs(tmp_path: Path) -> None:
    cases = [case("reference", seed) for seed in range(6)]
    with WorkerExecutor(["reference"], journal_dir=tmp_path) as ex:
        batched = ex.run_batch(cases)
        alone = [ex.run(c) for c in cases]
        assert ex.stage_seconds.get("backend", 0.0) > 0  # the worker's stage clock came back with the batch
    assert [r.case_id for r in batched] == [c.case_id for c in cases]
    assert [r.outcome for r in batched] == [r.outcome for r in alone] == [Outcome.PASS] * 6
    assert not list((tmp_path / "inflight").iterdir())  # the batch journal entry is gone once answered


def test_a_lost_batch_is_replayed_alone_and_names_the_culprit(tmp_path: Path) -> None:
    # test-abort kills the worker on odd seeds: the batch dies at seed 1; seeds 0 keeps its result, 1..3 are
    # replayed one at a time in fresh workers, so 1 and 3 are the crashes and 2 passes. Seed 3 dies in the worker
    # that ran seed 2, so it runs once more in a fresh one (the fourth replay) and dies there too.
    cases = [case("test-abort", seed) for seed in range(4)]
    with WorkerExecutor(["test-abort"], plugins=[PLUGIN], journal_dir=tmp_path, env=env()) as ex:
        results = ex.run_batch(cases)
        assert ex.batch_losses == 1 and ex.replayed == 4
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.CRASH, Outcome.PASS, Outcome.CRASH]
    crashed = {p.stem for p in (tmp_path / "crashes").glob("*.json")}
    assert crashed == {cases[1].case_id, cases[3].case_id}  # the culprits, each saved alone
    journal = list((tmp_path / "crashes").glob("batch-*.jsonl"))  # the whole batch, written before launch
    assert len(journal) == 1
    assert [json.loads(line)["seed"] for line in journal[0].read_text().splitlines()] == [0, 1, 2, 3]


def test_a_hang_in_a_batch_costs_the_batch_not_the_campaign(tmp_path: Path) -> None:
    cases = [case("test-sleep", seed) for seed in (0, 1, 2)]
    with WorkerExecutor(["test-sleep"], plugins=[PLUGIN], journal_dir=tmp_path, env=env(), timeout_s=3) as ex:
        results = ex.run_batch(cases)
    assert [r.outcome for r in results] == [Outcome.PASS, Outcome.HANG, Outcome.PASS]


def test_campaign_batches_through_the_worker_and_reports_engine_fields(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    config = CampaignConfig(["reference"], seed=4, max_cases=70,
                            engine=EngineOptions(mix="transfer=0.8,reject=0.2", scale="off"))
    with WorkerExecutor(["reference"], journal_dir=tmp_path) as ex:
        report = run_campaign(config, [registry.get("reference")], machine.platform, ex)
    data = report.to_dict()
    assert data["cases"] == 70 and data["engine"]["batch"] == 64
    assert data["byte_compared_transfers"] + data["rejections_checked"] <= 70
    assert data["transfer_share"] >= 0.6
    assert data["verified_bytes"] > 0 and data["verified_gb_per_second"] > 0
    assert data["stages"]["execute"] > 0 and "worker_backend" in data["stages"]
    assert report.next_index == 70  # resumable: every index before it was run
    assert any("byte-compared transfers" in line for line in summary_lines(data))


def test_batched_campaign_visits_the_same_cases_as_case_at_a_time(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    backends = [registry.get("reference"), registry.get("zoo-last-page-dropped")]
    ids = []
    for batch in (1, 16):
        config = CampaignConfig([b.name for b in backends], seed=9, max_cases=30,
                                engine=EngineOptions(batch=batch, mix="none", scale="off"))
        report = run_campaign(config, backends, machine.platform, InProcessExecutor(registry, machine),
                              record_case_ids=True)
        ids.append(report.case_ids)
        assert report.next_index == 15
    assert ids[0] == ids[1]


# ---- device errors ---------------------------------------------------------------------------------------

class _FakeDeviceFailure:
    def __init__(self, failures: int) -> None:
        self.failures = failures

    def __call__(self, device: torch.device) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("CUDA error: invalid argument")


def test_a_pending_device_error_is_cleared_and_reported() -> None:
    assert check_device(torch.device("cpu"), None, _FakeDeviceFailure(0)) is None
    cleared = check_device(torch.device("cpu"), None, _FakeDeviceFailure(1))
    assert cleared == "RuntimeError: CUDA error: invalid argument"


def test_errors_cleared_within_the_retries_do_not_lose_the_context() -> None:
    assert check_device(torch.device("cpu"), None, _FakeDeviceFailure(3)) is not None


def test_a_sticky_device_error_loses_the_context() -> None:
    with pytest.raises(DeviceContextLost):
        check_device(torch.device("cpu"), None, _FakeDeviceFailure(4))


def test_an_in_process_crash_has_the_signature_of_the_known_worker_death() -> None:
    data = json.loads((CORPUS / "jit-register-zero-length-launch.json").read_text())
    known = Case.from_dict(data["case"])
    message = data["observed"]["error"].removeprefix("device error escaped the case: ")
    result = device_crash(known, known.backend, message)
    # What the campaign adds to a crash before naming it (pipeline/runner.py explain_crash: the plan and the
    # contract's prediction, from the sglang backend, which this CPU test cannot plan with).
    result.prediction = data["observed"]["prediction"]
    result.expected_path = data["observed"]["expected_path"]
    assert signature(result, known) == load_entry(CORPUS / "jit-register-zero-length-launch.json").bug


def test_known_crash_cases_run_last_in_their_batch() -> None:
    files = [str(p) for p in CORPUS.glob("*.json")]
    known = known_crashes(files)
    zero = Case.from_dict(json.loads((CORPUS / "jit-register-zero-length-launch.json").read_text())["case"])
    assert predicted_crash(zero, known) and crash_features(zero) in {crash.features for crash in known}
    plain = zero.replace(host_indices=(1,), device_indices=(1,))
    backend = load_registry().get("reference")
    slots = [Slot(backend, i, c, False) for i, c in enumerate([zero, plain, plain])]
    assert suspects_last(slots, known) == [1, 2, 0]


def test_a_known_crash_predicts_only_cases_within_its_trigger() -> None:
    aot = Case.from_dict(json.loads((CORPUS / "aot-page-head-12-byte-heads-misaligned-address.json").read_text())
                         ["case"])
    direct = CORPUS / "hicache-asym-token-major-page-first-direct-backup-invalid-argument.json"
    asym = Case.from_dict(json.loads(direct.read_text())["case"])
    known = known_crashes([str(CORPUS / "aot-page-head-12-byte-heads-misaligned-address.json"), str(direct)])
    assert predicted_crash(aot, known) and predicted_crash(asym, known)
    assert not predicted_crash(aot.replace(backend="sglang-jit"), known)  # another backend
    # the asymmetric entry's trigger names token-major device rows: the same layout without them is no suspect
    trigger = json.loads(direct.read_text())["trigger"]
    assert trigger.get("tuning.device_rows") == "token_major"
    plain_rows = asym.replace(tuning=tuple((k, v) for k, v in asym.tuning if k != "device_rows"))
    assert not predicted_crash(plain_rows, known)


def test_cases_a_known_crash_predicts_get_no_index_variants() -> None:
    backend = load_registry().get("reference")
    space = backend_space(backend, CaseSpace(), CPU)
    plain = CaseFeed(1, 0, (0, 1), [backend], {backend.name: space}, CPU, None, 64, variants=3)
    try:
        plain_slots = plain.take(400)
    finally:
        plain.close()
    layouts = {s.case.layout.value for s in plain_slots if s.variant == 0 and s.case.host_indices}
    suspect_layout = sorted(layouts)[0]
    crash = KnownCrash(CrashFeatures("reference", suspect_layout, False, False))
    withheld = CaseFeed(1, 0, (0, 1), [backend], {backend.name: space}, CPU, None, 64, variants=3,
                        crash_suspects=frozenset({crash}))
    try:
        slots = withheld.take(400)
    finally:
        withheld.close()
    suspects = [s for s in slots if s.case.layout.value == suspect_layout and s.case.host_indices
                and s.case.device_indices]
    others = [s for s in slots if s.case.layout.value != suspect_layout and s.case.host_indices
              and s.case.device_indices]
    assert suspects and all(s.variant == 0 and s.last_of_index for s in suspects)
    assert any(s.variant > 0 for s in others)  # the rest keep their variants
    generated, before = [s.case for s in slots if s.variant == 0], [s.case for s in plain_slots if s.variant == 0]
    assert generated[:len(before)] == before  # withholding variants changes no generated case


# ---- mix -------------------------------------------------------------------------------------------------

def test_mix_parse_rejects_bad_input() -> None:
    assert Mix.parse("transfer=3,reject=1").to_dict() == {"transfer": 0.75, "reject": 0.25}
    for bad in ("transfer", "bogus=1", "transfer=x", "transfer=-1", "transfer=0"):
        with pytest.raises(ValueError, match="--mix"):
            Mix.parse(bad)


def test_mixed_cases_are_deterministic_and_reach_the_mix() -> None:
    backend = load_registry().get("reference")
    space = backend_space(backend, CaseSpace(), CPU)
    profile = TransferProfile.calibrate(backend, space, CPU)
    cases = [mixed_case(5, i, space, backend, CPU, DEFAULT_MIX, profile) for i in range(200)]
    again = [mixed_case(5, i, space, backend, CPU, DEFAULT_MIX, profile) for i in range(200)]
    assert [c.case_id for c in cases] == [c.case_id for c in again]
    kinds = [case_class(c, backend, CPU) for c in cases]
    assert 0.6 <= kinds.count("transfer") / len(kinds) <= 0.85
    assert kinds.count("reject") >= 30  # rejections are still drawn and checked
    assert kinds.count("unsupported") == 0


# ---- scale tier (simulated) ------------------------------------------------------------------------------

def test_simulated_scale_tier_reaches_every_target(tmp_path: Path) -> None:
    registry = load_registry()
    machine = require("cpu")
    backend = registry.get("reference")
    config = CampaignConfig(["reference"], seed=2, max_cases=400,
                            engine=EngineOptions(batch=8, mix="auto", scale="simulated", scale_share=0.5))
    report = run_campaign(config, [backend], machine.platform, InProcessExecutor(registry, machine))
    scale = report.to_dict()["scale"]
    assert not report.failures
    assert scale["scale_cases"] >= 3
    assert scale["largest_device_pool_rows"] > SIMULATED.device_rows - 1
    assert scale["largest_host_byte_offset"] > SIMULATED.host_offset
    assert scale["longest_transfer_tokens"] > SIMULATED.tokens - 1
    assert scale["max_layers"] >= max(SIMULATED.layers)  # the ordinary cases may reach further (layers to 128)
    assert scale["page_sizes_not_power_of_two"]


def test_scale_cases_are_deterministic_transfers() -> None:
    backend = load_registry().get("reference")
    space = backend_space(backend, CaseSpace(), CPU)
    profile = TransferProfile.calibrate(backend, space, CPU)
    for number in range(3):
        first = scale_case(7, number, backend, space, CPU, SIMULATED, profile)
        again = scale_case(7, number, backend, space, CPU, SIMULATED, profile)
        assert first is not None and again is not None and first.case_id == again.case_id
        assert case_class(first, backend, CPU) == "transfer"


# ---- memory ----------------------------------------------------------------------------------------------

def test_registration_ranges_cover_the_buffer_in_chunks() -> None:
    assert registration_ranges(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert registration_ranges(8, 4) == [(0, 4), (4, 4)]
    assert registration_ranges(3, 4) == [(0, 3)]


def test_device_fill_arithmetic_equals_the_numpy_fill() -> None:
    n = 1000
    expected = np.empty(n, dtype=np.uint8)
    _fill_numpy(expected, 12345)
    words = _hashed_words(0, (n + 7) // 8, 12345, torch.device("cpu")).view(torch.uint8)[:n]
    assert np.array_equal(words.numpy(), expected)


def test_case_feed_overlaps_generation_with_execution() -> None:
    backend = load_registry().get("reference")
    space = backend_space(backend, CaseSpace(), CPU)
    feed = CaseFeed(1, 0, (0, 1), [backend], {backend.name: space}, CPU, None, 8)
    try:
        first = feed.take(8)
        assert [s.index for s in first] == list(range(8))
        assert feed._pending is not None  # the next batch is being generated already
        assert [s.index for s in feed.take(8)] == list(range(8, 16))
    finally:
        feed.close()


@pytest.mark.skipif(os.environ.get("CI_NO_SUBPROCESS") == "1", reason="subprocess tests disabled")
def test_worker_journal_dir_layout(tmp_path: Path) -> None:
    with WorkerExecutor(["reference"], journal_dir=tmp_path) as ex:
        ex.run_batch([case("reference", 0), case("reference", 1)])
    assert {p.name for p in tmp_path.iterdir()} >= {"inflight", "crashes", "hangs"}


def test_engine_arguments_parse_and_reject_bad_values() -> None:
    import argparse

    from hicache_fuzz.harness.commands.fuzz_options import add_arguments, engine_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = engine_options(parser.parse_args(["--mix", "transfer=0.6,reject=0.4", "--batch", "8",
                                                "--scale", "simulated"]))
    assert options.batch == 8 and options.resolved_scale(CPU) == SIMULATED
    assert options.resolved_mix(CPU) == Mix.parse("transfer=0.6,reject=0.4")
    assert EngineOptions().resolved_mix(CPU) is None and EngineOptions().resolved_scale(CPU) is None
    assert EngineOptions().resolved_mix(Platform("cuda", (9, 0))) == DEFAULT_MIX
    for bad in (["--mix", "bogus=1"], ["--batch", "0"], ["--scale-share", "1.5"]):
        with pytest.raises(ValueError):
            engine_options(parser.parse_args(bad))


def test_fuzz_command_takes_the_engine_options(tmp_path: Path) -> None:
    import subprocess
    import sys

    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "hicache_fuzz", "fuzz", "--runs", "60", "--seed", "3", "--mix",
                           "transfer=0.8,reject=0.2", "--scale", "simulated", "--batch", "16", "--no-progress",
                           "--corpus", str(tmp_path / "c"), "--json", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "scale reached:" in done.stdout and "byte-compared transfers" in done.stdout
    data = json.loads(report.read_text())
    assert data["engine"]["mix_target"] == {"transfer": 0.8, "reject": 0.2}
    assert data["scale"]["scale_cases"] >= 1
    runs = data["scale_runs"]  # each scale case with when it was recorded, how long it ran, its shape
    assert len(runs) == data["scale"]["scale_cases"]
    assert all(run["seconds"] >= 0 and run["recorded_s"] >= run["seconds"] - 1e-3 and run["shape"] for run in runs)
    bad = subprocess.run([sys.executable, "-m", "hicache_fuzz", "fuzz", "--runs", "5", "--mix", "bogus=1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--mix" in bad.stderr


def test_bench_targets_include_the_share_of_the_bare_loop() -> None:
    from hicache_fuzz.harness.commands.bench import _targets

    report = {"gpu": {"bare_loop": {"cases_per_second": 4000.0},
                      "pipelines": [{"backend": "sglang-jit", "cases_per_second": 800.0}]}}
    share = [t for t in _targets(report) if "bare loop" in t["target"]]
    assert share == [{"target": "GPU small pipeline / bare loop, same run (sglang-jit)", "goal": 0.25,
                      "measured": 0.2, "met": False}]


def test_production_scale_cases_of_every_shape_pass_the_case_rules() -> None:
    """The GPU scale tier's production shapes (a 2^24-row device pool, a host offset past 2^32, 61 layers) must
    be valid cases under the case-size rule, which counts storages rounded up to a power of two."""
    from hicache_fuzz.harness.engine.mix import TransferProfile
    from hicache_fuzz.harness.engine.scale import PRODUCTION, SHAPES, host_offset_reached, scale_case

    backend = load_registry().get("reference")
    space = backend_space(backend, CaseSpace(), CPU)
    cases = {SHAPES[n % len(SHAPES)]: scale_case(1, n, backend, space, CPU, PRODUCTION, TransferProfile(()))
             for n in range(len(SHAPES))}
    assert all(case is not None for case in cases.values()), cases
    assert cases["device_pool"] is not None and cases["device_pool"].device_rows > 1 << 24
    assert cases["host_offset"] is not None and host_offset_reached(cases["host_offset"]) > 1 << 32
    assert cases["deep"] is not None and cases["deep"].layers == 61


def test_stalls_are_the_timeline_stretches_far_under_the_mean_rate() -> None:
    from hicache_fuzz.harness.engine.engine_stats import timeline_stalls

    samples = [{"t": 0.0, "cases": 0}, {"t": 1.0, "cases": 100}, {"t": 2.0, "cases": 110}, {"t": 3.5, "cases": 111},
               {"t": 4.5, "cases": 300}, {"t": 5.5, "cases": 310}]
    # mean 100/s: 1-2 s (10/s) and 2-3.5 s (0.7/s) are one stall, 4.5-5.5 s (10/s) another
    assert timeline_stalls(samples, 100.0) == [(1.0, 3.5), (4.5, 5.5)]
    assert timeline_stalls(samples, 40.0) == [(2.0, 3.5)]  # 10/s is a quarter of 40/s: not under it
    assert timeline_stalls(samples, 0.0) == [] and timeline_stalls(samples[:1], 100.0) == []
    assert timeline_stalls([{"t": 0.0, "cases": 0}, {"t": 1.0, "cases": 24}], 100.0) == [(0.0, 1.0)]
    assert timeline_stalls([{"t": 0.0, "cases": 0}, {"t": 1.0, "cases": 25}], 100.0) == []


def test_a_stall_is_attributed_to_a_scale_case_only_where_their_times_overlap() -> None:
    from hicache_fuzz.harness.engine.engine_stats import scale_runs_in_stalls

    runs = [{"recorded_s": 10.0, "seconds": 4.0, "shape": "host_offset"}, {"recorded_s": 30.0, "seconds": 1.0,
                                                                            "shape": "deep"}]
    assert scale_runs_in_stalls(runs, [(5.0, 7.0), (12.0, 13.0), (29.5, 31.0), (40.0, 41.0)]) == 2
    assert scale_runs_in_stalls(runs, [(1.0, 6.0)]) == 0  # ends as the scale case (6 .. 10 s) starts
    assert scale_runs_in_stalls([], [(0.0, 1.0)]) == 0


def test_the_console_summary_shows_the_stalls_of_a_recorded_gpu_campaign() -> None:
    """A recorded GPU campaign's engine fields (tests/data; seed 11, before the one-case-batch fix) stalled around
    scale cases; its summary says so, where the mean rate alone hid it."""
    report = json.loads((Path(__file__).parents[2] / "tests/data/gpu-engine-campaign-stalls.json").read_text())
    line = next(line for line in summary_lines(report) if line.startswith("  stalls"))
    count = int(line.split(": ")[1].split(",")[0])
    total = float(line.split(", ")[1].split(" s")[0])
    assert count >= 3 and total >= 8.0, line
