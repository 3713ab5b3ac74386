#!/usr/bin/env bash
# The CUDA gate on one H200 from a cold JIT cache, every phase timed (reports/gate/README.md, "cold-jit/").
# From the checkout root on a fresh GPU machine, no network:
#   source .gpu-bundle/device-setup.sh && bash reports/gate/device.sh
# Writes to $OUT (6 files): rcs.txt (environment, exit codes, outer wall times, JIT cache size), gate.log
# (console), gate.json / summary.md / junit.xml (the gate's own reports, with phase seconds), artifacts.tgz
# (reproducers, ISA JSON, worker journals). Expected wall: about 5 minutes; hard cap 330 s on the gate.
#
# Environment: GATE_BUDGET (campaign budget in seconds, default 150: 6 cases per sglang backend at the GPU
# planning rate; the campaign phase is hard-capped by it), GATE_TIMEOUT (outer cap on the gate, default 330).
set -u
out=${OUT:?set OUT to the folder whose files come back}
budget=${GATE_BUDGET:-150}
gate_timeout=${GATE_TIMEOUT:-330}
rcs="$out/rcs.txt"
script_started=$(date +%s.%N)
elapsed() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

echo "== environment" > "$rcs"
timeout 20 python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$rcs" 2>&1
if ! grep -q "harness from $PWD/" "$rcs"; then
  echo "the installed hicache-fuzz is not this checkout ($PWD): stop" >> "$rcs"
  exit 3
fi
git rev-parse HEAD >> "$rcs" 2>&1 || echo "(no git here)" >> "$rcs"
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$rcs" 2>&1
echo "nproc $(nproc)" >> "$rcs"
timeout 20 nvcc --version 2>&1 | tail -n 1 >> "$rcs"
timeout 60 python3 -c "
import sys, torch, importlib.metadata as m
print('python', sys.version.split()[0], 'torch', torch.__version__, 'sglang', m.version('sglang'),
      'tvm-ffi', m.version('apache-tvm-ffi'))" >> "$rcs" 2>&1

# A cold JIT cache: fresh, empty folders for sglang's JIT builds and anything under the XDG cache (tvm-ffi,
# torch), whatever device-setup.sh or an earlier run left elsewhere.
cold=$(mktemp -d /tmp/gate-cold.XXXXXX)
export SGLANG_JIT_CACHE_DIR="$cold/jit-cache" SGLANG_CACHE_DIR="$cold/sglang-cache" XDG_CACHE_HOME="$cold/xdg"
mkdir -p "$SGLANG_JIT_CACHE_DIR" "$SGLANG_CACHE_DIR" "$XDG_CACHE_HOME"
echo "cold caches under $cold (SGLANG_JIT_CACHE_DIR, SGLANG_CACHE_DIR, XDG_CACHE_HOME): $(find "$cold" -type f | wc -l) files" >> "$rcs"

echo "== gate" >> "$rcs"
art=$(mktemp -d /tmp/gate-art.XXXXXX)
gate_started=$(date +%s.%N)
# The gate as CI would run it on CUDA (default corpus/, every available sglang backend, the SASS check), with
# a smaller campaign budget than the default 300 s so the whole call stays under 6 minutes; --no-fetch: no
# network here (nvdisasm comes with the toolkit, sglang's kernels from the installed package).
timeout -s TERM -k 10 "$gate_timeout" python3 -m hicache_fuzz gate --platform cuda --budget-seconds "$budget" \
    --no-fetch --artifacts "$art" --junit "$out/junit.xml" --markdown "$out/summary.md" --json "$out/gate.json" \
    > "$out/gate.log" 2>&1
gate_rc=$?
echo "gate rc=$gate_rc wall $(elapsed "$gate_started") s (outer clock; budget $budget s, cap $gate_timeout s)" >> "$rcs"
timeout 30 python3 - "$out/gate.json" >> "$rcs" 2>&1 <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception as error:  # the gate was killed before writing: the console log has the phases it reached
    print("no gate.json:", error)
    sys.exit(0)
verdict = report.get("verdict", {})
print("status", verdict.get("status"), "exit", verdict.get("exit_code"), "cases/backend", verdict.get("cases_per_backend"))
print("phase seconds", json.dumps(report.get("seconds", {})))
for row in report.get("campaign", []):
    print(f"  campaign {row['backend']}: {row['status']} {row['cases']}/{row['planned_cases']} cases, {row['seconds']} s")
PY

echo "== JIT cache after the cold run (what CI would keep between runs)" >> "$rcs"
du -sh "$SGLANG_JIT_CACHE_DIR" "$SGLANG_CACHE_DIR" "$XDG_CACHE_HOME" >> "$rcs" 2>&1
echo "shared objects: $(find "$cold" -name '*.so' | wc -l)" >> "$rcs"
find "$cold" -maxdepth 3 -type d | head -n 40 >> "$rcs"

tar -czf "$out/artifacts.tgz" -C "$art" . >> "$rcs" 2>&1
echo "artifacts.tgz rc=$? ($(du -sh "$out/artifacts.tgz" 2>/dev/null | cut -f1))" >> "$rcs"
echo "script wall $(elapsed "$script_started") s" >> "$rcs"
exit "$gate_rc"
