#!/usr/bin/env bash
# Session 7, second device call: the default GPU campaign of this session's engine (pool handed batch i + 1 before
# batch i is recorded; sglang-pool every 6th index; cases generated in a feed process; fewer waits for the GPU
# per case), side by side in one call with the engine as it was at the start of the session (commit 7b53772,
# installed from a worktree of that commit into /tmp/baseline-site and run with it first on PYTHONPATH: its
# workers inherit the path), after the bare loop, on a WARM JIT cache.
#   git worktree add --detach .baseline 7b53772 (then remove its reports/, tests/, docs/: not needed, 2 MB left)
#   carry: [".gpu-bundle", ".baseline"]; command: bash reports/gpu-engine/session7/device2.sh
# (1) warm-up: a default 60-s campaign, seed 1, to fill the JIT cache (not compared); (2) the bare loop, 10 s;
# (3) the default campaign, seed 11; (4) the baseline's default campaign, seed 11; (5) while time is left, the
# default with --worker-processes 8, then with --feed thread (what the feed process is worth).
# Each is the `fuzz` command users type, 60 s.
set -u
out=${OUT:?}
T0=$(date +%s)
source "$(dirname "$0")/common.sh"
device_setup baseline
LIMIT=${LIMIT:-565}
campaign warmup 1
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
( export PYTHONPATH=$BASELINE_PATH; campaign baseline 11 )
campaign workers8 11 --worker-processes 8
campaign feed-thread 11 --feed thread
echo "JIT cache $(du -sm /tmp/s7-jit 2>/dev/null | cut -f1) MB; done at $(el) s" >> "$out/rcs.txt"
rm -f "$out/warmup.json"
