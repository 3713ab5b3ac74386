"""Throughput of `fuzz --workers` on a multi-GPU machine, and a check that split runs equal the unsharded run.

Usage (on the GPU machine, after `source .gpu-bundle/device-setup.sh`):
    python reports/parallel/measure.py --out $OUT/parallel --seconds 40 --deadline 320

1. prepare once: resolve the backends, compile the JIT menu into SGLANG_JIT_CACHE_DIR (counted: .so files).
2. 1 worker for --seconds: its case set is by construction the first R cases of the unsharded campaign.
3. GPUs x {1, 2, 4} workers with --runs R: each must run exactly the 1-worker case set (compared by case id),
   and its throughput is the sum of the workers' rates (cases / campaign seconds, after their startup).
4. The cache's .so count after all runs: workers loaded from the cache and compiled nothing new.
Stages that would not finish before --deadline (seconds since start) are skipped and listed.
Writes <out>/measure.json (incrementally) and the runs' logs and reports under <out>/runs/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from hicache_fuzz.harness.campaign.corpus import write_json_atomic
from hicache_fuzz.harness.campaign.parallel import (
    ShardJob,
    accelerator_kind,
    run_parallel,
    run_prepare_step,
    visible_devices,
)


def jit_cache_modules() -> int:
    root = Path(os.path.expanduser(os.environ.get("SGLANG_JIT_CACHE_DIR", "~/.cache/sglang/jit")))
    return sum(1 for _ in root.rglob("*.so")) if root.exists() else 0


def summarize(run: Any, label: str, reference_ids: set[str] | None) -> dict[str, Any]:
    merged = run.merged
    entries = merged.get("merged_from", [])
    row: dict[str, Any] = {
        "label": label, "workers": run.workers, "exit_code": run.exit_code, "problems": run.problems,
        "cases": merged.get("cases", 0),
        # the sum of the workers' rates: the aggregate throughput of workers running side by side
        "cases_per_second": merged.get("cases_per_second", 0.0),
        # the same work / the slowest worker's campaign time: penalizes a worker that drew a crash (restart)
        "cases_per_second_makespan": round(merged.get("cases", 0) / max(merged.get("seconds", 0.0), 1e-9), 1),
        "campaign_seconds_max": merged.get("seconds", 0.0), "wall_seconds": round(run.wall_seconds, 1),
        "worker_restarts": sum(int(e.get("worker_restarts") or 0) for e in entries),
        "outcomes": merged.get("outcomes", {}), "unique_failures": len(merged.get("unique_failures", [])),
        "per_worker": [{key: e.get(key) for key in ("shard", "device", "cases", "seconds", "cases_per_second",
                                                    "startup_seconds", "compile_seconds", "worker_restarts")}
                       for e in entries],
        "failure_signatures": sorted(f["signature"] for f in merged.get("unique_failures", [])),
    }
    ids = merged.get("case_ids", [])
    row["distinct_case_ids"] = len(set(ids))
    row["repeated_case_ids"] = len(ids) - len(set(ids))
    if reference_ids is not None:
        row["case_set_equals_1_worker"] = set(ids) == reference_ids
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=40.0, help="1-worker campaign length")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--per-gpu", default="1,2,4", help="workers per GPU to measure")
    parser.add_argument("--backend", action="append", default=[])
    parser.add_argument("--deadline", type=float, default=320.0)
    args = parser.parse_args()
    begun = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    kind = accelerator_kind()
    devices = visible_devices(kind)
    result: dict[str, Any] = {"kind": kind, "devices": devices, "seed": args.seed, "cpu_count": os.cpu_count(),
                              "command": "python reports/parallel/measure.py " + " ".join(
                                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                  if k not in ("out", "backend")),
                              "runs": [], "skipped": []}

    def save() -> None:
        result["elapsed_seconds"] = round(time.perf_counter() - begun, 1)
        write_json_atomic(out / "measure.json", result)

    base = ShardJob(platform=kind, backends=list(args.backend), plugins=[], seed=args.seed, runs_total=None,
                    max_seconds=args.seconds, corpus="", journal="", report="", case_timeout=90.0,
                    record_case_ids=True)
    result["jit_cache_modules_before"] = jit_cache_modules()
    started = time.perf_counter()
    prepared, code, problem = run_prepare_step(base, kind, devices, out / "runs")
    result["prepare"] = prepared or {"exit_code": code, "problem": problem}
    result["prepare_wall_seconds"] = round(time.perf_counter() - started, 1)
    result["jit_cache_modules_after_prepare"] = jit_cache_modules()
    save()
    if prepared is None:
        return
    first = run_parallel(dataclasses.replace(base, corpus=str(out / "runs" / "w1" / "corpus")), 1, kind, devices,
                         out / "runs" / "w1", prepared=prepared)
    result["runs"].append(summarize(first, "1 worker (time budget)", None))
    save()
    if not first.merged:
        return
    reference_ids = set(first.merged["case_ids"])
    total = int(first.merged["cases"])
    rate = max(float(first.merged["cases_per_second"]), 1e-6)
    for per_gpu in (int(x) for x in args.per_gpu.split(",")):
        workers = per_gpu * max(1, len(devices))
        expected = total / (rate * workers) + 25.0  # startup of a wave of workers, then the cases
        if time.perf_counter() - begun + expected > args.deadline:
            result["skipped"].append(f"{workers} workers: would end after the deadline")
            save()
            continue
        run_dir = out / "runs" / f"w{workers}"
        job = dataclasses.replace(base, runs_total=total, max_seconds=3 * args.seconds,
                                  corpus=str(run_dir / "corpus"))
        run = run_parallel(job, workers, kind, devices, run_dir, prepared=prepared)
        result["runs"].append(summarize(run, f"{workers} workers ({per_gpu} per GPU), --runs {total}",
                                        reference_ids))
        save()
    result["jit_cache_modules_at_end"] = jit_cache_modules()
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "prepare"}, indent=1)[:6000])


if __name__ == "__main__":
    main()
