#!/usr/bin/env bash
# Same-machine, same-moment comparison of the CPU pipeline before issue 5 (the commit before 6f6f740) and
# now: reference backend, one torch thread, consecutive campaign indices of seed 5, 20 warm-up cases, then
# SECONDS of cases per space. Usage: bash reports/bench/before_after.sh [SECONDS]   (from the checkout root)
set -euo pipefail
seconds=${1:-10}
root=$(git rev-parse --show-toplevel)
old=$(mktemp -d)
git -C "$root" archive 6f6f740^ | tar -x -C "$old"
mkdir -p "$old/pkg/hicache_fuzz"
cp -r "$old/harness/_root/." "$old/pkg/hicache_fuzz/"
for d in harness oracles kernels; do ln -s "$old/$d" "$old/pkg/hicache_fuzz/$d"; done
cat > "$old/measure.py" <<'PY'
import sys, time, torch
torch.set_num_threads(1)
from hicache_fuzz.harness.campaign.loop import campaign_case
from hicache_fuzz.harness.campaign.generate import CaseSpace
from hicache_fuzz.harness.pipeline.runner import run_case
from hicache_fuzz.kernels.reference import ReferenceBackend
from hicache_fuzz.oracles.contract import Platform
spaces = {"small": CaseSpace(byte_budget=64 << 10, layer_counts=(1, 2, 3, 4), page_counts=(1, 2, 3, 4, 8), max_pages=8),
          "large": CaseSpace(byte_budget=32 << 20, layer_counts=(4, 8), page_counts=(64, 128), max_pages=160,
                             invalid_rate=0.0),
          "default": CaseSpace()}
be, pl, dev = ReferenceBackend(), Platform("cpu"), torch.device("cpu")
seconds = float(sys.argv[1])
for name in ("small", "large", "default"):
    space = spaces[name]
    for i in range(20):
        run_case(campaign_case(5, i, be, space, pl), be, pl, dev)
    n, i, t, c = 0, 20, time.perf_counter(), time.process_time()
    while time.perf_counter() - t < seconds:
        run_case(campaign_case(5, i, be, space, pl), be, pl, dev)
        n, i = n + 1, i + 1
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(f"  {name:8s} {n:6d} cases  {n / wall:8.1f} cases/s wall  {n / cpu:8.1f} cases/CPU-s")
PY
echo "before (6f6f740^):"; (cd "$old" && PYTHONPATH="$old/pkg" python "$old/measure.py" "$seconds")
echo "after ($(git -C "$root" rev-parse --short HEAD)):"; (cd "$old" && PYTHONPATH= python "$old/measure.py" "$seconds")
rm -rf "$old"
