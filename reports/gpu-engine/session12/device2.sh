#!/usr/bin/env bash
# Session 12, second device call (issue 17), fresh machine: do the scale tier's cases stall the whole pool?
# Call 1's timeline ran 2,300-3,800 cases/s between four stalls of 2.5-3.7 s (about 12 s of 61) while the
# tier's 8 cases took 9.2 s of their own on the first member. Side by side, same seed: the default campaign
# and the same with --scale off.
#   carry: [".gpu-bundle"]; command: LIMIT=300 bash reports/gpu-engine/session12/device2.sh
set -u
out=${OUT:?}
T0=$(date +%s)
here=$(dirname "$0")
source "$here/../session7/common.sh"
device_setup
LIMIT=${LIMIT:-300}
step jit-warm timeout 200 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 2 /tmp/jit-warm.log >> "$out/rcs.txt"
campaign default 11
campaign scaleoff 11 --scale off
echo "mps daemons left running: $(pgrep -c -f nvidia-cuda-mps-control || true)" >> "$out/rcs.txt"
echo "done at $(el) s" >> "$out/rcs.txt"
