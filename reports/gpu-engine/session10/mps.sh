#!/usr/bin/env bash
# Session 10, second device call (issue 17), on the machine call 1 left warm: the same bare-loop x6 and default
# campaign, with every process a client of one CUDA MPS server (a private control daemon: its own pipe and log
# folders, so only the processes given them share it; the GPU's compute mode is not changed).
#   command: LIMIT=300 bash reports/gpu-engine/session10/mps.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-300}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hf-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hf-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
step mps-start nvidia-cuda-mps-control -d
sleep 1
bare_many() {
  local n=$1 i
  for i in $(seq 1 "$n"); do
    timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json "/tmp/mbare$n-$i.json" > "/tmp/mbare$n-$i.log" 2>&1 &
  done
  wait
  python3 - "$n" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
n = int(sys.argv[1])
rates = [json.load(open(f"/tmp/mbare{n}-{i}.json"))["cases_per_second"] for i in range(1, n + 1)]
print(f"== MPS: bare loop x{n} at once: each {rates}, sum {sum(rates):.1f} cases/s")
PY
}
step mbare1 bare_many 1
step mbare6 bare_many 6
tail -n 3 /tmp/mbare6-1.log >> "$out/rcs.txt"
campaign mps_default 11
echo quit | nvidia-cuda-mps-control
cat /tmp/hf-mps/log/control.log 2>/dev/null | tail -n 5 >> "$out/rcs.txt"
echo "done at $(el) s" >> "$out/rcs.txt"
