"""The start-up record of a `fuzz` report: seconds from the process's launch to the parent's probes, the first
worker's greeting (with the worker's own import / probe / warm-up split) and the first result."""

from __future__ import annotations

import time

from hicache_fuzz.harness.commands.fuzz import process_started_unix, startup_record


def test_the_launch_time_is_this_process_start_not_now() -> None:
    launched = process_started_unix()
    now = time.time()
    assert launched <= now + 0.01
    # the test process has been running for a while (interpreter, pytest, imports): earlier than now, within a day
    assert now - 86400 < launched < now


def test_startup_record_counts_from_the_launch() -> None:
    hello = {"startup_s": {"import": 3.0, "probe": 12.0, "warm_up": 4.5}, "refused_builds_replayed": 3}
    record = startup_record(100.0, 112.5, 121.0, {"first_result_unix": 125.25}, hello)
    assert record == {"launched_unix": 100.0, "backends_probed_s": 12.5, "first_worker_ready_s": 21.0,
                      "first_result_s": 25.25, "first_worker": {"import": 3.0, "probe": 12.0, "warm_up": 4.5},
                      "first_worker_refused_builds_replayed": 3}


def test_startup_record_without_a_result_or_a_worker() -> None:
    record = startup_record(100.0, 101.0, 101.0, {}, {})
    assert record["first_result_s"] is None
    assert record["first_worker"] == {} and record["first_worker_refused_builds_replayed"] == 0


def test_the_start_up_line_names_a_builder_that_had_not_finished() -> None:
    """A kernel source change rebuilds every module: the campaign can end before the builder does."""
    from hicache_fuzz.harness.commands.fuzz import prebuild_text

    assert prebuild_text({"prebuild_modules": 233, "prebuild_s": 1.13}) == ", JIT prebuild 233 modules in 1.1 s"
    unfinished = prebuild_text({"prebuild_modules": 233, "prebuild_s": None, "prebuild_menu_s": None})
    assert "unfinished" in unfinished and "233" in unfinished
    assert "menus built in 40.5 s" in prebuild_text({"prebuild_modules": 9, "prebuild_s": None,
                                                     "prebuild_menu_s": 40.5})
    assert prebuild_text({"prebuild_modules": 0}) == ""
    assert prebuild_text({"prebuild_modules": 233, "prebuild_s": 90.0, "prebuild_first_modules": 9,
                          "prebuild_first_built_s": 12.25}) == (
        ", JIT prebuild 233 modules in 90.0 s (the first cases' 9 first, built 12.2 s into it)")
