#!/usr/bin/env bash
# Session 10, first device call (issue 17): is the per-case slowdown with more workers the CPU (each worker's
# torch thread pool, fixed in 5ccf39a but never run on a GPU) or the GPU (time-slicing between the processes'
# CUDA contexts)? Side by side in one call on one H200, on a JIT cache filled by `jit-warm`:
#   bare1 / bare3 / bare6   the bare loop alone, then 3 and 6 copies at once (one process each): if the sum
#                           stays near one copy's rate, the GPU's contexts are what the processes share
#   default                 the `fuzz` command users type (workers at one torch thread each)
#   threads16               the same with HICACHE_FUZZ_TORCH_THREADS=16 (what the workers ran before 5ccf39a)
#   workers8, workers3      the default with --worker-processes 8 and 3
# Each campaign: 60 s, seed 11, scale tier on, --known corpus/sglang.
#   carry: [".gpu-bundle"]; command: LIMIT=575 bash reports/gpu-engine/session10/device1.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-560}
{ echo "mps control: $(command -v nvidia-cuda-mps-control || echo absent)";
  nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv,noheader; } >> "$out/rcs.txt" 2>&1
step jit-warm timeout 240 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 3 /tmp/jit-warm.log >> "$out/rcs.txt"
step bare1 timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
bare_many() {  # n: n copies of the bare loop at once, one torch thread each; the sum of their rates
  local n=$1 i
  for i in $(seq 1 "$n"); do
    OMP_NUM_THREADS=1 timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 \
      --json "/tmp/bare$n-$i.json" > /dev/null 2>&1 &
  done
  wait
  python3 - "$n" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
n = int(sys.argv[1])
rates = [json.load(open(f"/tmp/bare{n}-{i}.json"))["cases_per_second"] for i in range(1, n + 1)]
print(f"== bare loop x{n} at once: each {rates}, sum {sum(rates):.1f} cases/s")
PY
}
step bare3 bare_many 3
step bare6 bare_many 6
campaign default 11
( export HICACHE_FUZZ_TORCH_THREADS=16; campaign threads16 11 )
campaign workers8 11 --worker-processes 8
campaign workers3 11 --worker-processes 3
echo "done at $(el) s" >> "$out/rcs.txt"
