#!/usr/bin/env bash
# Session 9, first device call (issue 17): the default GPU campaign of landed main (session 7's two post-call
# changes, never measured: scale cases beside the pool's queue, the campaign generating while the feed process
# starts) after a bare loop in the same call, on a cache filled by `jit-warm`; a cProfile of the in-process
# pipeline (where a case's worker-side Python goes); then the default with 8 worker processes.
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
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
step profile timeout 60 bash "$here/profile_in_process.sh" "$out" 20 >> "$out/rcs.txt" 2>&1
campaign workers8 11 --worker-processes 8
campaign variants15 11 --variants 15
echo "done at $(el) s" >> "$out/rcs.txt"
