#!/usr/bin/env bash
# Device call 1 (session 4): where does a GPU case's time go? Not committed; results are.
set -u
out=${OUT:?}
source .gpu-bundle/device-setup.sh > "$out/setup.log" 2>&1
echo "setup rc=$?" > "$out/rcs"
export HICACHE_BUNDLE_HOME=${HICACHE_BUNDLE_HOME:-/tmp/hicache-fuzz-bundle}
nproc >> "$out/rcs"
t0=$(date +%s)
timeout 240 hicache-fuzz fuzz --platform cuda --isolate yes --seed 3 --max-total-time 8 --no-progress \
  --known corpus/sglang --corpus /tmp/wc --json /tmp/warm.json > "$out/warm.log" 2>&1
echo "warm rc=$? $(( $(date +%s)-t0 )) s" >> "$out/rcs"
(cd "$HICACHE_BUNDLE_HOME" && tar czf "$out/jit-cache.tgz" jit-cache sglang-cache 2>>"$out/rcs"); ls -la "$out/jit-cache.tgz" >> "$out/rcs"
t0=$(date +%s)
timeout 150 python3 -m cProfile -o /tmp/prof.out -m hicache_fuzz fuzz --platform cuda --isolate no --seed 11 \
  --max-total-time 25 --scale off --no-progress --known corpus/sglang --corpus /tmp/pc --json "$out/inproc.json" > /tmp/inproc.log 2>&1
echo "inproc-profile rc=$? $(( $(date +%s)-t0 )) s" >> "$out/rcs"
tail -30 /tmp/inproc.log >> "$out/rcs"
python3 - > "$out/prof.txt" 2>&1 <<'PY'
import pstats
s = pstats.Stats("/tmp/prof.out"); s.sort_stats("cumulative").print_stats(70); s.sort_stats("tottime").print_stats(45)
s.sort_stats("cumulative").print_callees("run\\b", 30)
PY
t0=$(date +%s)
timeout 150 hicache-fuzz fuzz --platform cuda --isolate yes --seed 11 --max-total-time 30 --no-progress \
  --known corpus/sglang --corpus /tmp/c1 --json "$out/iso1.json" > /tmp/iso1.log 2>&1
echo "iso1 rc=$? $(( $(date +%s)-t0 )) s" >> "$out/rcs"; tail -30 /tmp/iso1.log >> "$out/rcs"
t0=$(date +%s)
HICACHE_FUZZ_WORKERS_PER_GPU=6 timeout 150 hicache-fuzz fuzz --platform cuda --workers auto --seed 11 --max-total-time 30 --no-progress \
  --known corpus/sglang --corpus /tmp/c6 --json "$out/iso6.json" > /tmp/iso6.log 2>&1
echo "iso6 rc=$? $(( $(date +%s)-t0 )) s" >> "$out/rcs"; tail -30 /tmp/iso6.log >> "$out/rcs"
