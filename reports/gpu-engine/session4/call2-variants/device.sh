#!/usr/bin/env bash
# Device call 2 (session 4): the engine with index variants and storage reuse, side by side with variants off.
set -u
out=${OUT:?}
source .gpu-bundle/device-setup.sh > "$out/setup.log" 2>&1
echo "setup rc=$?" > "$out/rcs"
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s" >> "$out/rcs"; }
step warm timeout 240 hicache-fuzz fuzz --platform cuda --seed 3 --max-total-time 8 --no-progress \
  --known corpus/sglang --corpus /tmp/wc --json /tmp/warm.json > /tmp/warm.log 2>&1
tail -3 /tmp/warm.log >> "$out/rcs"
step bare-before timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json "$out/bare-before.json"
launched=$(date +%s.%N)
step campaign timeout 200 hicache-fuzz fuzz --platform cuda --isolate yes --seed 11 --max-total-time 60 --no-progress \
  --known corpus/sglang --corpus /tmp/corpus --json "$out/campaign.json" > /tmp/campaign.log 2>&1
echo "launched $launched" >> "$out/rcs"
step novar timeout 120 hicache-fuzz fuzz --platform cuda --isolate yes --seed 11 --max-total-time 20 --no-progress \
  --variants 0 --known corpus/sglang --corpus /tmp/novar --json /tmp/novar.json > /tmp/novar.log 2>&1
step bare-after timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json "$out/bare-after.json"
for d in /tmp/corpus /tmp/novar; do ls "$d" > /dev/null 2>&1 && find "$d" -name '*.json' -path '*crash*' -not -path '*/.journal/*' ; done > /tmp/crashes.txt
if [ -s /tmp/crashes.txt ]; then
  step replay-crashes timeout 120 hicache-fuzz replay $(head -6 /tmp/crashes.txt) --platform cuda > /tmp/replay.txt 2>&1
fi
step scale-inproc timeout 120 hicache-fuzz fuzz --platform cuda --isolate no --backend sglang-jit --seed 11 \
  --max-total-time 25 --scale-share 0.9 --no-progress --known corpus/sglang --corpus /tmp/scale --json /tmp/scale.json > /tmp/scale.log 2>&1
HICACHE_FUZZ_WORKERS_PER_GPU=4 step workers4 timeout 150 hicache-fuzz fuzz --platform cuda --workers auto --seed 11 \
  --max-total-time 25 --no-progress --known corpus/sglang --corpus /tmp/w4 --json /tmp/w4.json > /tmp/w4.log 2>&1
mkdir -p /tmp/art && cp /tmp/campaign.log /tmp/novar.log /tmp/scale.log /tmp/w4.log /tmp/warm.log /tmp/novar.json /tmp/scale.json /tmp/w4.json /tmp/art/ 2>/dev/null
cp /tmp/replay.txt /tmp/crashes.txt /tmp/art/ 2>/dev/null
for d in corpus novar scale w4; do [ -d /tmp/$d ] && (cd /tmp && find $d -name '*.json' -not -path '*/.journal/inflight/*' | head -40 | tar czf /tmp/art/$d-repro.tgz -T - ) ; done
for d in corpus novar scale; do tail -c 20000 /tmp/$d/.journal/worker.log > /tmp/art/$d-worker.log 2>/dev/null; done
(cd /tmp && tar czf "$out/artifacts.tgz" art)
python3 - "$out" "$launched" >> "$out/rcs" 2>&1 <<'PY'
import json, sys, os
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
out, launched = sys.argv[1], float(sys.argv[2])
for name, path in (("campaign", f"{out}/campaign.json"), ("novar", "/tmp/novar.json"), ("scale", "/tmp/scale.json"), ("w4", "/tmp/w4.json")):
    try:
        d = json.load(open(path))
    except Exception as exc:
        print(name, "no report:", exc); continue
    print(f"== {name}: {d.get('cases')} cases in {d.get('seconds')} s = {d.get('cases_per_second')} cases/s; wall {d.get('wall_seconds')} s, "
          f"start-up {d.get('worker_startup_seconds')} s, restarts {d.get('worker_restarts')}")
    print("\n".join(summary_lines(d)))
    print("outcomes", json.dumps(d.get("outcomes")))
    print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d.get("unique_failures", [])])
    if name == "campaign":
        print(f"start-up to the first case: {d['engine']['first_result_unix'] - launched:.1f} s after launch")
bare = [json.load(open(f"{out}/bare-{w}.json"))["cases_per_second"] for w in ("before", "after") if os.path.exists(f"{out}/bare-{w}.json")] or [0.0]
d = json.load(open(f"{out}/campaign.json"))
print(f"bare loop {bare} cases/s; campaign/bare = {d['cases_per_second'] / max(max(bare), 1e-9):.3f}")
PY
