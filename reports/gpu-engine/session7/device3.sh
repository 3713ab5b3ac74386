#!/usr/bin/env bash
# Session 7, third device call: the default GPU campaign of this session's engine side by side in one call with the
# engine as it was at the start of the session (commit 7b53772, from a worktree installed into /tmp/baseline-site,
# first on PYTHONPATH, which its workers inherit), after the bare loop, on a JIT cache filled first by
# `hicache-fuzz jit-warm` (every module the campaign's backends can draw, growth stages included: call 2's default
# campaign outran its warm-up's growth stages and compiled 9-10 s modules inside cases).
#   git worktree add --detach .baseline 7b53772 (then remove its reports/, tests/, docs/: not needed, 2 MB left)
#   carry: [".gpu-bundle", ".baseline"]; command: bash reports/gpu-engine/session7/device3.sh
# (1) jit-warm; (2) the bare loop, 10 s; (3) the default campaign, seed 11; (4) the baseline's default campaign,
# seed 11; (5) while time is left: the default with --batches-ahead 1, then with --worker-processes 8.
# Each is the `fuzz` command users type, 60 s, scale tier on.
set -u
out=${OUT:?}
T0=$(date +%s)
source "$(dirname "$0")/common.sh"
device_setup baseline
LIMIT=${LIMIT:-555}
step jit-warm timeout 240 python3 -m hicache_fuzz jit-warm --platform cuda > /tmp/jit-warm.log 2>&1
tail -n 3 /tmp/jit-warm.log >> "$out/rcs.txt"
step bare timeout 40 python3 -m hicache_fuzz.harness.pipeline.bare_loop --seconds 10 --json /tmp/bare.json
cat /tmp/bare.json >> "$out/rcs.txt"; echo >> "$out/rcs.txt"
campaign default 11
( export PYTHONPATH=$BASELINE_PATH; campaign baseline 11 )
campaign ahead1 11 --batches-ahead 1
campaign workers8 11 --worker-processes 8
echo "JIT cache $(du -sm /tmp/s7-jit 2>/dev/null | cut -f1) MB; done at $(el) s" >> "$out/rcs.txt"
