#!/usr/bin/env bash
# Session 10, fourth device call (issue 17), fresh machine, the session's last 295 s of device time: does the
# built-in MPS now stay on through sglang's known zero-length launches (the launch-error rule, 5abbd21)? One
# default campaign of 45 s on a COLD JIT cache (no jit-warm: no time for it), so its cases/s is not comparable
# with the warm-cache figures; what it shows is engine.gpu_sharing and the restarts.
#   carry: [".gpu-bundle"]; command: LIMIT=200 bash reports/gpu-engine/session10/device4.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-200}
launched=$(date +%s.%N)
step cold timeout $(( LIMIT - $(el) - 10 )) python3 -m hicache_fuzz fuzz --platform cuda --seed 11 \
  --max-total-time 45 --no-progress --known corpus/sglang --corpus /tmp/corpus-cold --json /tmp/cold.json \
  > /tmp/cold.log 2>&1
[ -f /tmp/cold.json ] && summary cold /tmp/cold.json "$launched"
python3 - /tmp/cold.json >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("gpu_sharing", json.dumps(d["engine"].get("gpu_sharing")))
print("restarts", d.get("worker_restarts"), "spare takeovers", d.get("spare_takeovers"),
      "batch losses", d["engine"].get("batch_losses"), "compile s", d.get("compile_seconds"))
PY
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k, None) for k in ('case_ids', 'coverage')]; json.dump(d, open(sys.argv[2], 'w'))" /tmp/cold.json "$out/call4-cold.json" 2>/dev/null
tail -c 3000 /tmp/cold.log >> "$out/logs.txt"
echo "mps daemons left running: $(pgrep -c -f nvidia-cuda-mps-control || true)" >> "$out/rcs.txt"
echo "done at $(el) s" >> "$out/rcs.txt"
