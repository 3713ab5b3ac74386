#!/usr/bin/env bash
# The GPU engine's proof run: campaigns of the `fuzz` command users type, bracketed by the bare loop (the
# kernel-speed baseline: sglang's JIT load-back and a whole-pool byte compare, nothing else) measured in the same
# call, so each campaign's rate has a baseline from the same machine and minute (docs/bench.md, docs/engine.md).
#
#   OUT=<empty folder> bash benchmarks/proof_run.sh        # from the checkout root; on a GPU machine after
#                                                          # `source .gpu-bundle/device-setup.sh`
# Environment (defaults in brackets):
#   PLATFORM [cuda]; SEEDS ["11"]: one campaign per seed, in order; CAMPAIGN_SECONDS [60];
#   BARE_SECONDS [10]: the bare loop before and after (0 skips it: it needs CUDA and sglang);
#   JIT_WARM [1]: `hicache-fuzz jit-warm` first, so the campaigns run on a warm JIT cache (0 skips it);
#   FUZZ_ARGS [""]: more `fuzz` arguments for every campaign (e.g. "--isolate no", "--variants 7");
#   KNOWN [corpus/sglang]: the known-failure corpus; PYTHON [python3];
#   BASELINE [""]: another hicache-fuzz to run beside this checkout, e.g. the previous default: a wheel (built with
#   `pip wheel --no-deps` at its commit; installed into a private folder) or a folder it is installed in
#   (`pip install --no-deps --target`). It runs the same campaigns after this checkout's, with its own `jit-warm`,
#   inside the same bare-loop brackets; BASELINE_KNOWN [$KNOWN]: its known-failure corpus.
# Writes to $OUT (all of it packed into 0-results.tgz after every step too: benchmarks/steps.sh):
# rcs.txt (each step's exit code and seconds, then each campaign's summary), bare-before.json,
# bare-after.json, campaign-<seed>.json (without case ids and coverage), campaign-<seed>.log (its console tail),
# and with a baseline baseline-campaign-<seed>.json and .log.
# Exit status: 3 if the installed hicache-fuzz is not this checkout (or the baseline does not import from its folder),
# else that of the last failing step (0 if none).
set -u
out=${OUT:?set OUT to an empty folder for the results}
py=${PYTHON:-python3}
platform=${PLATFORM:-cuda}
seconds=${CAMPAIGN_SECONDS:-60}
bare_seconds=${BARE_SECONDS:-10}
here=$(cd "$(dirname "$0")" && pwd)
rcs="$out/rcs.txt"
work=$(mktemp -d "${TMPDIR:-/tmp}/proof-run.XXXXXX")
status=0
started=$(date +%s)
# The summaries are this checkout's, also for the baseline's reports: the baseline runs with its own folder first
# on PYTHONPATH, and an older harness may lack what summarize.py imports.
own_pythonpath=${PYTHONPATH:-}

# shellcheck source=benchmarks/steps.sh
source "$(dirname "$0")/steps.sh"

: > "$rcs"
require_this_checkout
echo "nproc $(nproc)" >> "$rcs"
command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv >> "$rcs" 2>&1

if [ "${JIT_WARM:-1}" = 1 ]; then
  step jit-warm timeout 400 "$py" -m hicache_fuzz jit-warm --platform "$platform" > "$work/jit-warm.log" 2>&1
  tail -n 2 "$work/jit-warm.log" >> "$rcs"
fi
bare() {  # bare NAME
  [ "$bare_seconds" = 0 ] && return
  step "bare-$1" timeout $(( bare_seconds + 120 )) "$py" -m hicache_fuzz.harness.pipeline.bare_loop \
    --seconds "$bare_seconds" --json "$out/bare-$1.json" > /dev/null 2>> "$rcs"
}
campaigns() {  # campaigns LABEL KNOWN: one campaign per seed with the hicache-fuzz the environment imports
  local label=$1 known=$2 seed launched
  for seed in ${SEEDS:-11}; do
    launched=$(date +%s.%N)
    # shellcheck disable=SC2086  # FUZZ_ARGS is a list of arguments
    step "${label}campaign-$seed" timeout $(( seconds + 300 )) "$py" -m hicache_fuzz fuzz --platform "$platform" \
      --seed "$seed" --max-total-time "$seconds" --no-progress --known "$known" --corpus "$work/${label}corpus-$seed" \
      --json "$work/${label}campaign-$seed.json" ${FUZZ_ARGS:-} > "$work/${label}campaign-$seed.log" 2>&1
    tail -c 4000 "$work/${label}campaign-$seed.log" > "$out/${label}campaign-$seed.log"
    if [ -f "$work/${label}campaign-$seed.json" ]; then
      echo "== ${label:+${label%-} }campaign seed $seed" >> "$rcs"
      PYTHONPATH="$own_pythonpath" "$py" "$here/summarize.py" campaign "$work/${label}campaign-$seed.json" \
        --bare "$out/bare-before.json" --launched "$launched" >> "$rcs" 2>&1
      PYTHONPATH="$own_pythonpath" "$py" "$here/summarize.py" slim "$work/${label}campaign-$seed.json" \
        "$out/${label}campaign-$seed.json" >> "$rcs" 2>&1
    fi
  done
}
bare before
campaigns "" "${KNOWN:-corpus/sglang}"
if [ -n "${BASELINE:-}" ]; then
  if [ -d "$BASELINE" ]; then
    site=$(cd "$BASELINE" && pwd)
  else
    site="$work/baseline-site"
    step baseline-install "$py" -m pip install --quiet --no-deps --no-index --disable-pip-version-check \
      --target "$site" "$BASELINE" >> "$rcs" 2>&1
  fi
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$py" -c \
    "import hicache_fuzz.harness as h; print('baseline harness from', h.__file__)" >> "$rcs" 2>&1
  if ! grep -q "baseline harness from $site/" "$rcs"; then
    echo "the baseline does not import from its own folder $site: stop" >> "$rcs"
    exit 3
  fi
  (
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    if [ "${JIT_WARM:-1}" = 1 ]; then
      step baseline-jit-warm timeout 400 "$py" -m hicache_fuzz jit-warm --platform "$platform" \
        > "$work/baseline-jit-warm.log" 2>&1
      tail -n 2 "$work/baseline-jit-warm.log" >> "$rcs"
    fi
    campaigns baseline- "${BASELINE_KNOWN:-${KNOWN:-corpus/sglang}}"
    exit "$status"
  ) || status=$?
fi
bare after
echo "done at $(( $(date +%s) - started )) s, status $status" >> "$rcs"
rm -rf "$work"
pack_results
exit "$status"
