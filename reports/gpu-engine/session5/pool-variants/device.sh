#!/usr/bin/env bash
# Session 5, device call 4 (short: ~280 s of device budget left): sglang-pool's per-case cost with its new
# default of 15 variants against 3, side by side (two campaigns at once, same seed, 3 workers each, scale off),
# after a 3-s warm-up campaign that compiles the backend's JIT menu.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus" > "$out/rcs.txt"
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
step warm timeout 80 hicache-fuzz fuzz --platform cuda --backend sglang-pool --seed 1 --max-total-time 3 --no-progress \
  --scale off --known corpus/sglang --corpus /tmp/wc --json /tmp/warm.json > /tmp/warm.log 2>&1
common=(--platform cuda --backend sglang-pool --seed 5 --max-total-time 30 --no-progress --scale off
        --worker-processes 3 --known corpus/sglang)
( step variants-default timeout 75 hicache-fuzz fuzz "${common[@]}" --corpus /tmp/ca --json "$out/pool-default.json" > "$out/pool-default.log" 2>&1 ) &
( step variants-3 timeout 75 hicache-fuzz fuzz "${common[@]}" --variants 3 --corpus /tmp/cb --json "$out/pool-variants3.json" > "$out/pool-variants3.log" 2>&1 ) &
wait
python3 - "$out" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
for name in ("pool-default", "pool-variants3"):
    try:
        d = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except Exception as exc:
        print(name, "no report:", exc); continue
    e = d["engine"]
    print(f"{name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s; ms/case "
          f"{d['backend_ms_per_case']}; variants {e.get('variants_by_backend')}; reused {e['storages_reused']}; "
          f"compile {d.get('compile_seconds')} s; outcomes {d['outcomes']}; new {d['new_failure_signatures']}")
PY
cp /tmp/warm.log "$out/warm.log" 2>/dev/null
echo "done at $(el) s" >> "$out/rcs.txt"
