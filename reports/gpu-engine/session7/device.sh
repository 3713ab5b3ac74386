#!/usr/bin/env bash
# Session 7, one device call: the default GPU campaign with the two engine changes of this session (a pool that is
# handed batch i + 1 before batch i is recorded; sglang-pool on every 6th campaign index), side by side with the
# engine as it was (both off) and with the schedule alone, on a WARM JIT cache, after the bare loop.
#   carry: [".gpu-bundle"]; command: bash reports/gpu-engine/session7/device.sh
# (1) warm-up: a default 60-s campaign, seed 1, to fill the JIT cache (not compared); (2) the bare loop, 10 s;
# (3) the default campaign, seed 11; (4) the engine before this session: --batches-ahead 0 --backend-every none;
# (5) --batches-ahead 0 alone (the schedule without the look-ahead), last, if the call has time left. Each is the `fuzz` command users type, 60 s,
# scale tier on, one after another on the same machine.
set -u
out=${OUT:?}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
echo "setup rc=$? at $(el) s; $(nproc) cpus; checkout $(git rev-parse --short HEAD 2>/dev/null)" > "$out/rcs.txt"
python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
export SGLANG_JIT_CACHE_DIR=/tmp/s7-jit SGLANG_CACHE_DIR=/tmp/s7-sglang XDG_CACHE_HOME=/tmp/s7-xdg
LIMIT=${LIMIT:-560}
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
summary() {  # name json launched
  python3 - "$1" "$2" "$3" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
name, path, launched = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = json.load(open(path))
try:
    bare = json.load(open("/tmp/bare.json"))["cases_per_second"]
    share = f"{d['cases_per_second'] / bare:.3f} of the bare loop's {bare}"
except OSError:
    share = "bare loop not run yet"
print(f"== {name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s "
      f"({share}); wall {d.get('wall_seconds')} s, "
      f"first result {d['engine']['first_result_unix'] - launched:.1f} s after launch")
print("\n".join(summary_lines(d)))
print("cases by backend", {b: sum(c.values()) for b, c in d["outcomes"].items()})
print("outcomes", json.dumps(d["outcomes"]))
print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
print("engine", json.dumps({k: d["engine"].get(k) for k in ("worker_processes", "backend_every", "batches_ahead",
                                                            "batch_losses", "cases_replayed_alone")}))
PY
}
campaign() {  # name seed extra-args...
  local name=$1 seed=$2; shift 2
  local left=$(( LIMIT - $(el) ))
  if [ "$left" -lt 95 ]; then echo "$name skipped: $left s left" >> "$out/rcs.txt"; return; fi
  local launched; launched=$(date +%s.%N)
  step "$name" timeout $(( left - 8 )) hicache-fuzz fuzz --platform cuda --seed "$seed" --max-total-time 60 \
    --no-progress --known corpus/sglang --corpus "/tmp/corpus-$name" --json "/tmp/$name.json" "$@" \
    > "/tmp/$name.log" 2>&1
  [ -f "/tmp/$name.json" ] && summary "$name" "/tmp/$name.json" "$launched"
  # the report without the per-case id list and coverage detail (the call returns 8 files of 16 MiB at most)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k, None) for k in ('case_ids', 'coverage')]; json.dump(d, open(sys.argv[2], 'w'))" "/tmp/$name.json" "$out/$name.json" 2>/dev/null
  tail -c 4000 "/tmp/$name.log" >> "$out/logs.txt"
}
campaign warmup 1
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
campaign before 11 --batches-ahead 0 --backend-every none
# (6) where a worker's time goes: one backend at a time in process under cProfile (warm cache, no pool)
profile() {  # backend seconds
  local left=$(( LIMIT - $(el) ))
  if [ "$left" -lt 50 ]; then echo "profile $1 skipped: $left s left" >> "$out/rcs.txt"; return; fi
  step "profile-$1" timeout $(( left - 5 )) python3 -m cProfile -o "/tmp/prof-$1.out" -m hicache_fuzz fuzz \
    --platform cuda --isolate no --backend "$1" --seed 11 --max-total-time "$2" --no-progress --scale off \
    --corpus "/tmp/corpus-prof-$1" --json "/tmp/prof-$1.json" > "/tmp/prof-$1.log" 2>&1
  { echo "== profile $1: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['cases'], 'cases', d['cases_per_second'], 'cases/s', d.get('backend_ms_per_case'), d.get('stages'))" "/tmp/prof-$1.json" 2>&1)"
    python3 -c "import pstats,sys; s=pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(30); s.sort_stats('cumulative').print_stats(45)" "/tmp/prof-$1.out" 2>&1 | grep -v '^$' | cut -c1-170
  } >> "$out/profile.txt"
}
profile sglang-jit-register 15
profile sglang-pool 15
campaign schedule-only 11 --batches-ahead 0
echo "JIT cache $(du -sm /tmp/s7-jit 2>/dev/null | cut -f1) MB; done at $(el) s" >> "$out/rcs.txt"
rm -f "$out/warmup.json"
