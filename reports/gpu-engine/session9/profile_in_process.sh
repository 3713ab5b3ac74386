#!/usr/bin/env bash
# A cProfile of the in-process campaign on one GPU (`fuzz --isolate no`, the JIT backends and the staged one):
# where a case's worker-side Python goes (run_case's callees), without the pool's processes in the way.
# Usage (on the GPU machine, after device-setup): bash profile_in_process.sh OUT_DIR SECONDS
set -u
dir=${1:?}; secs=${2:-20}
python3 -m cProfile -o "$dir/inproc.prof" -m hicache_fuzz fuzz --platform cuda --isolate no --seed 11 \
  --max-total-time "$secs" --no-progress --scale off --known corpus/sglang --corpus /tmp/corpus-prof \
  --backend sglang-jit --backend sglang-jit-tma --backend sglang-staged --backend sglang-page-unified \
  --json /tmp/prof.json > "$dir/inproc.log" 2>&1
echo "profile rc=$?"
python3 - "$dir/inproc.prof" > "$dir/inproc-stats.txt" 2>&1 <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("tottime").print_stats(45)
s.sort_stats("cumulative").print_stats(60)
s.print_callees("runner.py:.*\\(_run\\)")
PY
tail -n 25 "$dir/inproc.log"
