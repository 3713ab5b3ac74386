#!/usr/bin/env bash
# Session 5, device call 3: (a) the CUDA gate from a cold JIT cache, alone on the machine (reports/gate/device.sh,
# its own empty cache folders, gate capped at 420 s); (b) if >= 120 s are left, the default 60-s campaign as users
# run it (pool, 3 index variants, scale tier on) on the cache the gate left, with the bare loop, side by side.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus" > "$out/rcs.txt"
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
mkdir -p /tmp/gate-out
step cold-gate env OUT=/tmp/gate-out GATE_TIMEOUT=420 bash reports/gate/device.sh > /tmp/gate-out/device.log 2>&1
cp /tmp/gate-out/rcs.txt "$out/gate-rcs.txt"; cp /tmp/gate-out/gate.json /tmp/gate-out/summary.md "$out/" 2>/dev/null
tar czf "$out/gate.tgz" -C /tmp gate-out
cold=$(ls -d /tmp/gate-cold.* | head -n 1)
left=$(( 575 - $(el) ))
if [ "$left" -ge 120 ]; then
  export SGLANG_JIT_CACHE_DIR="$cold/jit-cache" SGLANG_CACHE_DIR="$cold/sglang-cache" XDG_CACHE_HOME="$cold/xdg"
  step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
  launched=$(date +%s.%N)
  step campaign timeout $(( left - 20 )) hicache-fuzz fuzz --platform cuda --seed 11 --max-total-time 60 --no-progress \
    --known corpus/sglang --corpus /tmp/corpus --json "$out/campaign.json" > /tmp/campaign.log 2>&1
  python3 - "$out" "$launched" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
out, launched = sys.argv[1], float(sys.argv[2])
bare = json.load(open("/tmp/bare.json"))["cases_per_second"]
d = json.load(open(f"{out}/campaign.json"))
print(f"== campaign: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s "
      f"({d['cases_per_second'] / bare:.3f} of the bare loop's {bare}); wall {d.get('wall_seconds')} s, "
      f"first result {d['engine']['first_result_unix'] - launched:.1f} s after launch")
print("\n".join(summary_lines(d)))
print("outcomes", json.dumps(d["outcomes"]))
print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
PY
  tail -c 15000 /tmp/campaign.log > "$out/campaign.log"
else
  echo "campaign skipped: $left s left" >> "$out/rcs.txt"
fi
echo "done at $(el) s" >> "$out/rcs.txt"
