#!/usr/bin/env bash
# Session 9, first device call (issue 17), side by side in one call on one H200, after a bare loop, on a JIT
# cache filled by `jit-warm` (which now also records the row sizes sglang refuses to compile):
#   default     the `fuzz` command users type, landed main + the on-disk record of refused builds
#   norecord    the same with HICACHE_FUZZ_REFUSED_BUILDS=off: every worker runs nvcc again for each refused
#               row size at its warm-up (the engine before this change; also session 7's two post-call
#               changes, never measured before: scale cases beside the queue, the early feed hand-over)
#   workers8    the default with --worker-processes 8
#   profile     a cProfile of the in-process pipeline (where a case's worker-side Python goes), time allowing
# Each campaign: 60 s, seed 11, scale tier on, --known corpus/sglang.
#   carry: [".gpu-bundle"]; command: bash reports/gpu-engine/session9/device1.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-560}
step jit-warm timeout 240 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 3 /tmp/jit-warm.log >> "$out/rcs.txt"
echo "refused-build records: $(ls /tmp/s7-jit/hicache-fuzz-refused-builds 2>/dev/null | wc -l)" >> "$out/rcs.txt"
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
( export HICACHE_FUZZ_REFUSED_BUILDS=off; campaign norecord 11 )
campaign workers8 11 --worker-processes 8
if [ $(( LIMIT - $(el) )) -ge 60 ]; then
  step profile timeout $(( LIMIT - $(el) - 5 )) bash "$here/profile_in_process.sh" "$out" 15 >> "$out/rcs.txt" 2>&1
fi
echo "done at $(el) s" >> "$out/rcs.txt"
