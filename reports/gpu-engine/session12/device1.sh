#!/usr/bin/env bash
# Session 12, first device call (issue 17), fresh machine: the proof run of the landed engine (a62f281) with the
# built-in MPS and the launch-error rule, warm JIT cache. Two 60-s default campaigns (the `fuzz` command users
# type, seeds 11 and 12) bracketed by the bare loop, so each campaign's share has a baseline from the same call.
#   carry: [".gpu-bundle"]; command: LIMIT=420 bash reports/gpu-engine/session12/device1.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-420}
step jit-warm timeout 240 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 2 /tmp/jit-warm.log >> "$out/rcs.txt"
step bare1 timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
campaign default12 12
step bare2 timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare2.json
cat /tmp/bare2.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
echo "mps daemons left running: $(pgrep -c -f nvidia-cuda-mps-control || true)" >> "$out/rcs.txt"
echo "done at $(el) s" >> "$out/rcs.txt"
