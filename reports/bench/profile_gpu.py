"""Profile the in-process GPU pipeline (cProfile), to see where a case's time goes.

Usage (on the GPU machine): python reports/bench/profile_gpu.py --seconds 6 --out $OUT/profile.txt
Profiles each backend of --backend (default sglang-jit, sglang-pool) on the bench's small space and on the
campaign's default space, both without zero-length transfers (see harness/bench.GPU_SMALL_SPACE).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from hicache_fuzz.harness.commands.bench import GPU_SMALL_SPACE, measure_pipeline
from hicache_fuzz.harness.campaign.generate import CaseSpace
from hicache_fuzz.harness.model.platform import require
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_backends import warm_up_backends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--backend", action="append")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    machine = require("cuda")
    registry = load_registry()
    backends = [registry.get(name) for name in args.backend or ("sglang-jit", "sglang-pool")]
    spaces = {"small": GPU_SMALL_SPACE, "default": CaseSpace(empty_rate=0.0)}
    for space in spaces.values():
        warm_up_backends(backends, machine.platform, space)
    text = io.StringIO()
    for backend in backends:
        for space_name, space in spaces.items():
            profile = cProfile.Profile()
            profile.enable()
            result = measure_pipeline(space_name, backend, space, machine, args.seconds, seed=5, skip_empty=True)
            profile.disable()
            text.write(f"==== {backend.name} {space_name}: {result.cases} cases in {result.wall_seconds:.1f} s = "
                       f"{result.cases_per_second:.0f} cases/s; stages (us/case) {result.stage_us_per_case}; "
                       f"outcomes {result.outcomes}; errors {result.errors[:3]}\n")
            stats = pstats.Stats(profile, stream=text)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(30)
            with open(args.out, "w") as f:
                f.write(text.getvalue())


if __name__ == "__main__":
    main()
