#!/usr/bin/env bash
# One device call (H200), from the checkout root (see README.md here):
#   source .gpu-bundle/device-setup.sh; cd .gpu-work && bash reports/gpu-engine/device.sh
# It re-installs this folder's checkout over the one device-setup.sh installed, and stops if that did not take.
# 1. bare loop (the kernel-speed baseline), 2. a warm-up campaign that fills the on-disk JIT cache (cold),
# 3. the default isolated campaign, 60 s, warm cache (the measured one), 4. the bare loop again,
# 5. a short --isolate no campaign (in process: must survive the known device errors).
set -u
out=${OUT:?}
CAMPAIGN_SECONDS=${CAMPAIGN_SECONDS:-60}
python3 -m pip uninstall -y -q hicache-fuzz > "$out/rcs" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$out/rcs" 2>&1
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs" 2>&1
grep -q "harness from $PWD/" "$out/rcs" || { echo "the checkout under test is not $PWD: stop" >> "$out/rcs"; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$out/rcs" 2>&1
timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json "$out/bare-before.json" > /dev/null 2>> "$out/rcs"
echo "bare-before rc=$?" >> "$out/rcs"
warm_started=$(date +%s)
timeout 400 hicache-fuzz fuzz --platform cuda --isolate yes --seed 3 --max-total-time ${WARM_SECONDS:-15} --no-progress \
    --known corpus/sglang --corpus /tmp/warm-corpus --json /tmp/warm.json > /tmp/warm.log 2>&1
echo "warm-up campaign rc=$? wall $(( $(date +%s) - warm_started )) s (cold JIT cache)" >> "$out/rcs"
tail -5 /tmp/warm.log >> "$out/rcs"
started=$(date +%s)
launched=$(date +%s.%N)
timeout $(( CAMPAIGN_SECONDS + 120 )) hicache-fuzz fuzz --platform cuda --isolate yes --seed 11 \
    --max-total-time "$CAMPAIGN_SECONDS" --no-progress --known corpus/sglang --corpus /tmp/corpus \
    --json "$out/campaign.json" > "$out/campaign.log" 2>&1
echo "campaign rc=$? wall $(( $(date +%s) - started )) s (warm JIT cache)" >> "$out/rcs"
timeout 60 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json "$out/bare-after.json" > /dev/null 2>> "$out/rcs"
echo "bare-after rc=$?" >> "$out/rcs"
if [ "${ISOLATE_NO_SECONDS:-20}" -gt 0 ]; then
  timeout 200 hicache-fuzz fuzz --platform cuda --isolate no --seed 11 --max-total-time "${ISOLATE_NO_SECONDS:-20}" \
      --no-progress --known corpus/sglang --corpus /tmp/corpus-inproc --json "$out/isolate-no.json" > "$out/isolate-no.log" 2>&1
  echo "isolate-no rc=$?" >> "$out/rcs"
fi
python3 - "$out" "$launched" >> "$out/rcs" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
out, launched = sys.argv[1], float(sys.argv[2])
for name in ("campaign", "isolate-no"):
    try:
        d = json.load(open(f"{out}/{name}.json"))
    except Exception as exc:
        print(name, "no report:", exc); continue
    print(f"== {name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s; wall {d.get('wall_seconds')} s, "
          f"start-up {d.get('worker_startup_seconds')} s, restarts {d.get('worker_restarts')}")
    print("\n".join(summary_lines(d)))
    print("outcomes", json.dumps(d["outcomes"]))
    print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
    if name == "campaign":
        print(f"start-up to the first case: {d['engine']['first_result_unix'] - launched:.1f} s after launch")
bare = [json.load(open(f"{out}/bare-{w}.json"))["cases_per_second"] for w in ("before", "after")
        if __import__("os").path.exists(f"{out}/bare-{w}.json")] or [0.0]
d = json.load(open(f"{out}/campaign.json"))
print(f"bare loop {bare} cases/s; campaign/bare = {d['cases_per_second'] / max(max(bare), 1e-9):.3f}")
PY
