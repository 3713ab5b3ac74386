"""``hicache-fuzz fuzz --dry-run``: the campaign ``fuzz`` would run on the platform named, generated and predicted
here, nothing run (harness/campaign/dry_run.py). Any machine: the backends are not probed, sglang is not
imported, no GPU is needed; ``--platform cuda`` models an H200, ``rocm`` an MI300, ``auto`` this machine."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_fuzz.harness.model.exit_codes import UsageError

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.loop import CampaignReport


def dry_run_campaign(args: argparse.Namespace, seed: int) -> CampaignReport:
    """The report of the dry run the parsed fuzz arguments ask for (fuzz prints and writes it)."""
    from hicache_fuzz.harness.campaign.dry_run import (
        MODELLED_CASES_PER_SECOND,
        MODELLED_PLATFORMS,
        MODELLED_SCALE_CASE_SECONDS,
        CaseSaver,
        PredictingExecutor,
    )
    from hicache_fuzz.harness.campaign.loop import run_campaign
    from hicache_fuzz.harness.campaign.options import CampaignOptions, parse_shard
    from hicache_fuzz.harness.commands.fuzz_options import engine_options
    from hicache_fuzz.harness.generation.space_file import space_from_args
    from hicache_fuzz.harness.model.platform import detect
    from hicache_fuzz.harness.pipeline.setup import real_kernel_backends, registry_for
    from hicache_fuzz.kernels.registry import UnknownBackend

    if args.where and not args.save_cases:
        raise UsageError("--where picks the cases --save-cases writes: give --save-cases DIR")
    if args.runs is None and args.max_total_time is None:
        raise UsageError("give a budget: --runs N and/or --max-total-time SECONDS (modelled seconds in a dry run)")
    platform = detect().platform if args.platform == "auto" else MODELLED_PLATFORMS[args.platform]
    registry = registry_for(args.backend_plugin)
    try:
        backends = [registry.get(name) for name in args.backend]
    except UnknownBackend as exc:
        raise UsageError(str(exc)) from None
    if not backends:  # what `fuzz` picks on that platform when every backend is available
        backends = real_kernel_backends(registry) if platform.kind != "cpu" else [registry.get("reference")]
    try:
        engine = engine_options(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if engine.feed == "auto":  # as a GPU campaign's worker pool has it; the slots are the same either way
        engine.feed = "process"
    options = CampaignOptions(seed, args.runs, args.max_total_time, None, parse_shard(args.shard), args.start_index,
                              args.byte_budget, engine=engine, space_overrides=space_from_args(args),
                              record_case_ids=args.record_case_ids)
    saver = CaseSaver(Path(args.save_cases), parse_where(args.where)) if args.save_cases else None
    executor = PredictingExecutor(backends, platform, saver)
    config = options.config([b.name for b in backends], executor)
    config.dry_run, config.clock = True, executor.clock
    capability = platform.compute_capability
    modelled = platform.kind + (f" (capability {capability[0]}.{capability[1]})" if capability else "")
    print(f"hicache-fuzz: seed {seed}; dry run on a modelled {modelled}; backends: "
          f"{', '.join(b.name for b in backends)} (not probed, nothing runs)", flush=True)
    started = time.perf_counter()
    report = run_campaign(config, backends, platform, executor, record_case_ids=args.record_case_ids)
    if options.space_overrides:
        report.extra["space_overrides"] = dict(options.space_overrides)
    wall = time.perf_counter() - started
    report.extra["dry_run"] = {
        "platform": platform.kind,
        "compute_capability": list(capability) if capability else None,
        "modelled_cases_per_second": MODELLED_CASES_PER_SECOND,
        "modelled_scale_case_seconds": MODELLED_SCALE_CASE_SECONDS,
        "wall_seconds": round(wall, 3),
        "generated_per_wall_second": round(report.cases / wall, 1) if wall > 0 else 0.0,
        # every backend is taken as available on the modelled platform (nothing is probed), and what else each assumes
        "assumptions": {b.name: list(b.prediction_assumptions(platform)) for b in backends
                        if b.prediction_assumptions(platform)},
    }
    if saver is not None:
        report.extra["dry_run"]["saved_cases"] = {"folder": str(saver.folder), "where": saver.where,
                                                  "matched": saver.matched, "saved": saver.saved}
        print(f"saved {saver.saved} of {saver.matched} matching cases to {saver.folder}"
              + (" (the cap)" if saver.saved < saver.matched else ""), flush=True)
    return report


def parse_where(items: list[str] | None) -> dict[str, str]:
    """--where LABEL=VALUE (repeatable) as a mapping; UsageError names a malformed one."""
    where: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--where {item!r}: expected LABEL=VALUE, e.g. pool_class=DSAIndexerPoolHost")
        where[key.strip()] = value.strip()
    return where

