#!/usr/bin/env bash
# Session 5, device call 2: (a) the 20-seed false-alarm run on clean sglang 0.5.23 (identity fix 514de07) after a short
# warm-up of the JIT cache, (b) if >= 140 s are left, the default 60-s campaign as users run it, with the bare loop.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus; $(git rev-parse --short HEAD 2>/dev/null)" > "$out/rcs.txt"
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
step warm timeout 240 hicache-fuzz fuzz --platform cuda --seed 3 --max-total-time 8 --no-progress \
  --known corpus/sglang --corpus /tmp/wc --worker-processes 1 --scale off --json /tmp/warm.json > /tmp/warm.log 2>&1
left=$(( 545 - $(el) ))
echo "false-alarms: $left s left at $(el) s" >> "$out/rcs.txt"
step false-alarms timeout --signal=TERM --kill-after=15 $(( left - 10 )) python3 -m hicache_fuzz false-alarms \
  --first-seed 1 --seeds 20 --seconds 60 --jobs 10 --start-deadline $(( left - 150 )) --known corpus/sglang \
  --out /tmp/fa --json "$out/false-alarms.json" --markdown "$out/false-alarms.md" -- --platform cuda \
  --worker-processes 1 --scale off > /tmp/fa.log 2>&1
(cd /tmp && tar czf "$out/fa.tgz" fa.log warm.log setup.log $(find fa -name '*.json' -not -path '*/.journal/*' | head -400) 2>/dev/null)
left=$(( 570 - $(el) ))
if [ "$left" -ge 120 ]; then
  step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
  launched=$(date +%s.%N)
  step campaign timeout $(( left - 15 )) hicache-fuzz fuzz --platform cuda --seed 11 --max-total-time 60 --no-progress \
    --known corpus/sglang --corpus /tmp/corpus --json "$out/campaign.json" > /tmp/campaign.log 2>&1
  cp /tmp/bare.json "$out/" 2>/dev/null
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
