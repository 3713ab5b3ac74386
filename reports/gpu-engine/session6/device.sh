#!/usr/bin/env bash
# Session 6, one device call: the default GPU campaign on a WARM JIT cache, side by side with the bare loop and
# with two engine settings a user can pass (more index variants per generated case; more worker processes).
#   carry: [".gpu-bundle"]; command: bash reports/gpu-engine/session6/device.sh
# (1) warm-up: a default 60-s campaign, seed 1, whose only job is to fill the JIT cache (its figures are kept but
#     not compared); (2) the bare loop, 10 s; (3) the default campaign, seed 11; (4) the same with --variants 7;
#     (5) the same with --worker-processes 10. Each campaign is the `fuzz` command users type, 60 s, scale tier on.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > "$out/setup.log" 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus; checkout $(git rev-parse --short HEAD 2>/dev/null)" > "$out/rcs.txt"
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
export SGLANG_JIT_CACHE_DIR=/tmp/s6-jit SGLANG_CACHE_DIR=/tmp/s6-sglang XDG_CACHE_HOME=/tmp/s6-xdg
LIMIT=${LIMIT:-520}
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
summary() {  # name json launched
  python3 - "$1" "$2" "$3" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
name, path, launched = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    bare = json.load(open("/tmp/bare.json"))["cases_per_second"]
    share = f"{d_rate / bare:.3f} of the bare loop's {bare}" if (d_rate := json.load(open(path))["cases_per_second"]) else ""
except OSError:
    share = "bare loop not run yet"
d = json.load(open(path))
print(f"== {name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s "
      f"({share}); wall {d.get('wall_seconds')} s, "
      f"first result {d['engine']['first_result_unix'] - launched:.1f} s after launch")
print("\n".join(summary_lines(d)))
print("outcomes", json.dumps(d["outcomes"]))
print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
PY
}
campaign() {  # name seed extra-args...
  local name=$1 seed=$2; shift 2
  local left=$(( LIMIT - $(el) ))
  if [ "$left" -lt 100 ]; then echo "$name skipped: $left s left" >> "$out/rcs.txt"; return; fi
  local launched; launched=$(date +%s.%N)
  step "$name" timeout $(( left - 10 )) hicache-fuzz fuzz --platform cuda --seed "$seed" --max-total-time 60 \
    --no-progress --known corpus/sglang --corpus "/tmp/corpus-$name" --json "$out/$name.json" "$@" \
    > "/tmp/$name.log" 2>&1
  [ -f "$out/$name.json" ] && summary "$name" "$out/$name.json" "$launched"
  tail -c 6000 "/tmp/$name.log" > "$out/$name.log"
}
campaign warmup 1
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
campaign variants7 11 --variants 7
campaign workers10 11 --worker-processes 10
echo "JIT cache $(du -sm /tmp/s6-jit 2>/dev/null | cut -f1) MB; done at $(el) s" >> "$out/rcs.txt"
