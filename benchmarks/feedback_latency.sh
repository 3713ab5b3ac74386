#!/usr/bin/env bash
# What a kernel developer waits for (issue "fast feedback"): the first result of the `fuzz` command users type on a
# warm JIT cache with fresh workers and with the standing worker pool, the first result after a one-line change of
# a kernel source (`.cuh`), and the warm gate's time, all in one call on one machine (docs/bench.md).
#
#   OUT=<empty folder> bash benchmarks/feedback_latency.sh   # from the checkout root; on a GPU machine after
#                                                            # `source .gpu-bundle/device-setup.sh`
# Environment (defaults in brackets):
#   PLATFORM [cuda]; SEED [7]; CAMPAIGN_SECONDS [30]: each campaign's budget (the first result comes long before
#   it); KNOWN [corpus/sglang]; JIT_WARM [1]: `hicache-fuzz jit-warm` first (0 skips it, and with it the probe
#   cache's refill: jit-warm probes through the cache, whose key has the mtimes of sglang's and this checkout's
#   files, which a device call's fresh copy and the bundle's re-install change), WARM_LIMIT [300] s;
#   CUH [hicache.cuh]: the kernel source under sglang's `kernels/jit/csrc` that gets one appended comment line (a
#   content change: sglang's JIT keys its builds on the sources' contents, so every module including it is
#   rebuilt); GATE [1]: `gate --platform PLATFORM --no-fetch` last, with the standing pool (0 skips it),
#   GATE_LIMIT [200] s, GATE_ARGS [""]: more `gate` arguments; PYTHON [python3].
# Steps: jit-warm; fuzz with fresh workers (HICACHE_FUZZ_STANDING_WORKERS=off); `workers start`; fuzz taking
# standing workers; the `.cuh` line appended; fuzz again (standing workers: a kernel edit keeps them usable); the
# line removed (the original file restored byte for byte); gate; `workers stop`.
# Writes to $OUT (all of it packed into 0-results.tgz after every step too: benchmarks/steps.sh): rcs.txt (each
# step's exit code and seconds, then each campaign's summary with its start-up line), fresh.json, standing.json,
# cuh.json (the campaign reports without case ids and coverage), their .log consoles, workers.log, gate.json,
# gate.log.
# Exit status: 3 if the installed hicache-fuzz is not this checkout or the kernel source is not found, else that of
# the last failing step (0 if none).
set -u
out=${OUT:?set OUT to an empty folder for the results}
py=${PYTHON:-python3}
platform=${PLATFORM:-cuda}
seed=${SEED:-7}
seconds=${CAMPAIGN_SECONDS:-30}
known=${KNOWN:-corpus/sglang}
here=$(cd "$(dirname "$0")" && pwd)
rcs="$out/rcs.txt"
work=$(mktemp -d "${TMPDIR:-/tmp}/feedback.XXXXXX")
status=0
started=$(date +%s)

# shellcheck source=benchmarks/steps.sh
source "$here/steps.sh"

: > "$rcs"
require_this_checkout
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  >> "$rcs" 2>&1
# sglang's kernel source, located without importing sglang (an import is part of what is measured)
cuh=$("$py" -c "
import importlib.util, sys
from pathlib import Path
spec = importlib.util.find_spec('sglang')
hits = sorted(Path(spec.origin).parent.glob('kernels/jit/csrc/**/' + sys.argv[1])) if spec and spec.origin else []
print(hits[0] if hits else '')" "${CUH:-hicache.cuh}")
if [ -z "$cuh" ] || [ ! -w "$cuh" ]; then
  echo "no writable ${CUH:-hicache.cuh} under sglang's kernels/jit/csrc: stop" >> "$rcs"
  exit 3
fi
echo "kernel source changed in the .cuh step: $cuh" >> "$rcs"

campaign() {  # campaign NAME [env...]: one `fuzz` of the seed, its report slimmed to NAME.json, its summary in rcs
  local name=$1 launched rc
  shift
  launched=$(date +%s.%N)
  env "$@" "$py" -m hicache_fuzz fuzz --platform "$platform" --seed "$seed" --max-total-time "$seconds" \
    --known "$known" --corpus "$work/$name-corpus" --json "$work/$name.json" --no-progress > "$out/$name.log" 2>&1
  rc=$?
  if [ -f "$work/$name.json" ]; then
    "$py" "$here/summarize.py" slim "$work/$name.json" "$out/$name.json"
    { echo "== $name"; "$py" "$here/summarize.py" campaign "$work/$name.json" --launched "$launched"; } >> "$rcs" 2>&1
  fi
  return "$rc"
}

wait_for_ready_workers() {  # the server refills after each campaign; the next one should find ready workers
  local tries=0
  while [ "$tries" -lt 60 ]; do
    "$py" -m hicache_fuzz workers status --platform "$platform" --json "$work/status.json" > /dev/null 2>&1
    "$py" -c "
import json, sys
status = json.load(open(sys.argv[1]))
sys.exit(0 if status.get('ready') and not status.get('starting') else 1)" "$work/status.json" \
      2> /dev/null && return 0
    sleep 2
    tries=$((tries + 1))
  done
  return 1
}

if [ "${JIT_WARM:-1}" != 0 ]; then
  step jit-warm timeout "${WARM_LIMIT:-300}" "$py" -m hicache_fuzz jit-warm --platform "$platform" \
    > "$out/jit-warm.log" 2>&1
  tail -n 1 "$out/jit-warm.log" | sed 's/^/  /' >> "$rcs"
fi
step fresh campaign fresh HICACHE_FUZZ_STANDING_WORKERS=off
step workers-start "$py" -m hicache_fuzz workers start --platform "$platform" > "$out/workers.log" 2>&1
step standing campaign standing
cp "$cuh" "$work/original.cuh"
restore_cuh() { cp "$work/original.cuh" "$cuh"; }
trap restore_cuh EXIT
echo "// hicache-fuzz benchmarks/feedback_latency.sh: a one-line kernel change, $(date -u +%FT%TZ)" >> "$cuh"
step workers-ready wait_for_ready_workers
step cuh-change campaign cuh
restore_cuh
cmp -s "$work/original.cuh" "$cuh" && echo "kernel source restored" >> "$rcs"
if [ "${GATE:-1}" != 0 ]; then
  step workers-ready wait_for_ready_workers
  # shellcheck disable=SC2086  # GATE_ARGS is a list of words
  step gate timeout "${GATE_LIMIT:-200}" "$py" -m hicache_fuzz gate --platform "$platform" --no-fetch \
    ${GATE_ARGS:-} --json "$work/gate.json" > "$out/gate.log" 2>&1
  if [ -f "$work/gate.json" ]; then
    cp "$work/gate.json" "$out/gate.json"
    { echo "== gate"; "$py" "$here/summarize.py" gate "$work/gate.json"; } >> "$rcs" 2>&1
  fi
fi
step workers-stop "$py" -m hicache_fuzz workers stop --platform "$platform" >> "$out/workers.log" 2>&1
pack_results
exit "$status"
