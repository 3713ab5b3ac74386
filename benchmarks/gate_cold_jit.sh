#!/usr/bin/env bash
# The pre-merge gate from a cold JIT cache, every phase timed: what a CI runner without a kept cache pays
# (docs/gate.md, "Time"; docs/bench.md). From the checkout root, on a GPU machine after the offline set-up:
#   source .gpu-bundle/device-setup.sh && OUT=<empty folder> bash benchmarks/gate_cold_jit.sh
# Writes to $OUT: rcs.txt (environment, exit codes, outer wall times, the gate's phases, JIT cache size),
# gate.log (console), gate.json / summary.md / junit.xml (the gate's own reports, with phase seconds),
# artifacts.tgz (reproducers, ISA JSON, worker journals).
#
# Environment: PLATFORM (cuda), GATE_BUDGET (campaign budget in seconds, default 150: 6 cases per sglang
# backend at the GPU planning rate; the campaign phase is hard-capped by it), GATE_TIMEOUT (outer cap on the gate,
# default 330), GATE_ARGS (more `gate` arguments, e.g. "--no-isa"), PYTHON (python3).
set -u
out=${OUT:?set OUT to the folder whose files come back}
budget=${GATE_BUDGET:-150}
platform=${PLATFORM:-cuda}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
gate_timeout=${GATE_TIMEOUT:-330}
rcs="$out/rcs.txt"
script_started=$(date +%s.%N)
elapsed() { "$py" -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

# shellcheck source=benchmarks/steps.sh
source "$here/steps.sh"  # require_this_checkout

echo "== environment" > "$rcs"
require_this_checkout
command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$rcs" 2>&1
echo "nproc $(nproc)" >> "$rcs"
command -v nvcc > /dev/null && timeout 20 nvcc --version 2>&1 | tail -n 1 >> "$rcs"
timeout 60 "$py" -c "
import sys, torch, importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return 'absent'
print('python', sys.version.split()[0], 'torch', torch.__version__, 'sglang', version('sglang'),
      'tvm-ffi', version('apache-tvm-ffi'))" >> "$rcs" 2>&1

# A cold JIT cache: fresh, empty folders for sglang's JIT builds and anything under the XDG cache (tvm-ffi,
# torch), whatever device-setup.sh or an earlier run left elsewhere.
cold=$(mktemp -d "${TMPDIR:-/tmp}/gate-cold.XXXXXX")
export SGLANG_JIT_CACHE_DIR="$cold/jit-cache" SGLANG_CACHE_DIR="$cold/sglang-cache" XDG_CACHE_HOME="$cold/xdg"
mkdir -p "$SGLANG_JIT_CACHE_DIR" "$SGLANG_CACHE_DIR" "$XDG_CACHE_HOME"
echo "cold caches under $cold (SGLANG_JIT_CACHE_DIR, SGLANG_CACHE_DIR, XDG_CACHE_HOME): $(find "$cold" -type f | wc -l) files" >> "$rcs"

echo "== gate" >> "$rcs"
art=$(mktemp -d "${TMPDIR:-/tmp}/gate-art.XXXXXX")
gate_started=$(date +%s.%N)
# The gate as CI would run it (default corpus/, every available sglang backend, the ISA check), with a smaller
# campaign budget than the default 300 s so the whole call stays under 6 minutes; --no-fetch: no network on the
# GPU machine (nvdisasm comes with the toolkit, sglang's kernels from the installed package).
# shellcheck disable=SC2086  # GATE_ARGS is a list of arguments
timeout -s TERM -k 10 "$gate_timeout" "$py" -m hicache_fuzz gate --platform "$platform" --budget-seconds "$budget" \
    --no-fetch --artifacts "$art" --junit "$out/junit.xml" --markdown "$out/summary.md" --json "$out/gate.json" \
    ${GATE_ARGS:-} > "$out/gate.log" 2>&1
gate_rc=$?
echo "gate rc=$gate_rc wall $(elapsed "$gate_started") s (outer clock; budget $budget s, cap $gate_timeout s)" >> "$rcs"
if [ -f "$out/gate.json" ]; then
  timeout 30 "$py" "$here/summarize.py" gate "$out/gate.json" >> "$rcs" 2>&1
else  # the gate was killed before writing: the console log has the phases it reached
  echo "no gate.json" >> "$rcs"
fi

echo "== JIT cache after the cold run (what CI would keep between runs)" >> "$rcs"
du -sh "$SGLANG_JIT_CACHE_DIR" "$SGLANG_CACHE_DIR" "$XDG_CACHE_HOME" >> "$rcs" 2>&1
echo "shared objects: $(find "$cold" -name '*.so' | wc -l)" >> "$rcs"
find "$cold" -maxdepth 3 -type d | head -n 40 >> "$rcs"

tar -czf "$out/artifacts.tgz" -C "$art" . >> "$rcs" 2>&1
echo "artifacts.tgz rc=$? ($(du -sh "$out/artifacts.tgz" 2>/dev/null | cut -f1))" >> "$rcs"
echo "script wall $(elapsed "$script_started") s" >> "$rcs"
exit "$gate_rc"
