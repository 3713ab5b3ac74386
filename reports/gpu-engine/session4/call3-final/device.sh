#!/usr/bin/env bash
# Device call 3 (session 4): the engine as users run it (measured alone, with the old engine side by side), then
# the 20-seed false-alarm run on clean sglang, with the page-unified standalone proof in the background.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus" > "$out/rcs"
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs" 2>&1
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs"; }
step warm timeout 200 hicache-fuzz fuzz --platform cuda --seed 3 --max-total-time 8 --no-progress \
  --known corpus/sglang --corpus /tmp/wc --json /tmp/warm.json > /tmp/warm.log 2>&1
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
launched=$(date +%s.%N)
step campaign timeout 150 hicache-fuzz fuzz --platform cuda --seed 11 --max-total-time 60 --no-progress \
  --known corpus/sglang --corpus /tmp/corpus --json /tmp/campaign.json > /tmp/campaign.log 2>&1
launched_old=$(date +%s.%N)
step old-engine timeout 100 hicache-fuzz fuzz --platform cuda --seed 11 --max-total-time 30 --no-progress \
  --worker-processes 1 --variants 0 --known corpus/sglang --corpus /tmp/old --json /tmp/old.json > /tmp/old.log 2>&1
mkdir -p /tmp/standalone-out
( OUT=/tmp/standalone-out timeout 200 bash reports/standalone/device.sh > /tmp/standalone.log 2>&1; echo "standalone rc=$? (at $(el) s)" >> "$out/rcs" ) &
standalone=$!
left=$(( 575 - $(el) ))
echo "false-alarms: $left s left at $(el) s" >> "$out/rcs"
step false-alarms timeout --signal=TERM --kill-after=15 $(( left - 20 )) python3 -m hicache_fuzz false-alarms \
  --first-seed 1 --seeds 20 --seconds 60 --jobs 10 --start-deadline $(( left - 130 )) --known corpus/sglang \
  --out /tmp/fa --json /tmp/false-alarms.json --markdown /tmp/false-alarms.md -- --platform cuda \
  --worker-processes 1 --scale off > /tmp/fa.log 2>&1
wait $standalone 2>/dev/null
mkdir -p /tmp/art
cp /tmp/warm.log /tmp/campaign.log /tmp/old.log /tmp/fa.log /tmp/standalone.log /tmp/old.json /tmp/bare.json /tmp/setup.log /tmp/art/ 2>/dev/null
cp -r /tmp/standalone-out /tmp/art/standalone 2>/dev/null
(cd /tmp && find corpus fa -name '*.json' -not -path '*/.journal/inflight/*' 2>/dev/null | head -300 | tar czf /tmp/art/repro.tgz -T - 2>/dev/null)
tail -c 20000 /tmp/corpus/.journal/worker.log > /tmp/art/campaign-worker.log 2>/dev/null
(cd /tmp && tar czf "$out/art.tgz" art)
cp /tmp/campaign.json /tmp/false-alarms.json /tmp/false-alarms.md "$out/" 2>/dev/null
python3 - "$out" "$launched" "$launched_old" >> "$out/rcs" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
out, launched, launched_old = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
bare = json.load(open("/tmp/bare.json"))["cases_per_second"]
for name, path, t in (("campaign", f"{out}/campaign.json", launched), ("old-engine", "/tmp/old.json", launched_old)):
    try:
        d = json.load(open(path))
    except Exception as exc:
        print(name, "no report:", exc); continue
    print(f"== {name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s "
          f"({d['cases_per_second'] / bare:.3f} of the bare loop's {bare}); wall {d.get('wall_seconds')} s, "
          f"start-up {d.get('worker_startup_seconds')} s, restarts {d.get('worker_restarts')}; "
          f"first result {d['engine']['first_result_unix'] - t:.1f} s after launch")
    print("\n".join(summary_lines(d)))
    print("outcomes", json.dumps(d["outcomes"]))
    print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
try:
    fa = json.load(open("/tmp/false-alarms.json"))
    print("false alarms:", {k: v for k, v in fa.items() if k not in ("campaigns",)})
except Exception as exc:
    print("false alarms: no summary:", exc)
PY
echo "done at $(el) s" >> "$out/rcs"
