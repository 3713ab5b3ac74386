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
source "$(dirname "$0")/common.sh"
device_setup
LIMIT=${LIMIT:-560}
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
