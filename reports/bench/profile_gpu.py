"""Profile the in-process GPU pipeline on small cases (cProfile), to see where a case's time goes.

Usage (on the GPU machine): python reports/bench/profile_gpu.py --seconds 8 --out $OUT/profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from hicache_fuzz.harness.bench import SMALL_SPACE, measure_pipeline
from hicache_fuzz.harness.platform import require
from hicache_fuzz.kernels.registry import load_registry
from hicache_fuzz.kernels.sglang_backends import warm_up_backends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--backend", default="sglang-jit")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    machine = require("cuda")
    backend = load_registry().get(args.backend)
    warm_up_backends([backend], machine.platform, SMALL_SPACE)
    profile = cProfile.Profile()
    profile.enable()
    result = measure_pipeline("small", backend, SMALL_SPACE, machine, args.seconds, seed=5)
    profile.disable()
    text = io.StringIO()
    text.write(f"{result.cases} cases in {result.wall_seconds:.1f} s = {result.cases_per_second:.0f} cases/s; "
               f"stages (us/case) {result.stage_us_per_case}; outcomes {result.outcomes}\n\n")
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    with open(args.out, "w") as f:
        f.write(text.getvalue())


if __name__ == "__main__":
    main()
