#!/usr/bin/env bash
# Session 10, third device call (issue 17), fresh machine: the pool's built-in MPS (`--gpu-sharing auto`, the
# default: a private MPS daemon for the campaign's workers) against separate contexts, side by side, and a real
# illegal-address fault under MPS (fault_plugin.py) to see the fall-back and the collateral record on hardware.
#   default    the `fuzz` command users type (auto: MPS)
#   contexts   the same with --gpu-sharing contexts (the engine before this change)
#   fault      30 s of sglang-jit-register + test-mps-fault (one case writes to an illegal address), scale off
#   carry: [".gpu-bundle"]; command: LIMIT=575 bash reports/gpu-engine/session10/device3.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-560}
step jit-warm timeout 240 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 2 /tmp/jit-warm.log >> "$out/rcs.txt"
step bare1 timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
campaign contexts 11 --gpu-sharing contexts
left=$(( LIMIT - $(el) ))
if [ "$left" -ge 75 ]; then
  launched=$(date +%s.%N)
  step fault env PYTHONPATH="$here:${PYTHONPATH:-}" FAULT_MARK=/tmp/fault-mark timeout $(( left - 8 )) \
    python3 -m hicache_fuzz fuzz --platform cuda --seed 5 --max-total-time 30 --no-progress --scale off \
    --backend-plugin fault_plugin:backends --backend test-mps-fault --backend sglang-jit-register \
    --known corpus/sglang --corpus /tmp/corpus-fault --json /tmp/fault.json > /tmp/fault.log 2>&1
  echo "fault case: $(cat /tmp/fault-mark 2>/dev/null)" >> "$out/rcs.txt"
  [ -f /tmp/fault.json ] && summary fault /tmp/fault.json "$launched"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k, None) for k in ('case_ids', 'coverage')]; json.dump(d, open(sys.argv[2], 'w'))" /tmp/fault.json "$out/fault.json" 2>/dev/null
  tail -c 6000 /tmp/fault.log >> "$out/logs.txt"
  ls /tmp/corpus-fault >> "$out/rcs.txt" 2>&1
fi
echo "mps daemons left running: $(pgrep -c -f nvidia-cuda-mps-control || true)" >> "$out/rcs.txt"
echo "done at $(el) s" >> "$out/rcs.txt"
