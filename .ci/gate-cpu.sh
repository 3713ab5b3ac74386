#!/usr/bin/env bash
# The CPU pre-merge gate as CI runs it (docs/gate.md): corpus replay, the fixed-seed campaign on the CPU
# reference, and the static ROCm ISA check (clang-19 / clang 22 for gfx950, no GPU). Exit code is the gate's:
#   0 pass, 1 findings, 2 usage, 3 unavailable (e.g. an ISA check could not run).
#
# Budget: GATE_BUDGET_SECONDS (default 120) bounds the fixed-seed campaign on the reference (a hard cap of 120 s);
# the ISA check compiles ~2-3 min on 2 cores when its listing cache is cold and runs no compiler when it is
# warm (listings keyed by kernel sources, compiler and flags, under ${HICACHE_FUZZ_CACHE_DIR:-~/.cache/hicache-fuzz}/isa:
# keep that folder between CI runs). The first run downloads ~643 MB into the same folder and says so on stderr;
# GATE_EXTRA_ARGS=--offline uses only what the cache holds. Whole script: under 5 minutes.
#
# Outputs go to GATE_REPORT_DIR (default $TMPDIR/hicache-fuzz-gate-cpu, so a local run leaves the checkout
# clean): summary.md (PR comment), junit.xml, gate.json, artifacts/ (reproducers of failing cases, ISA
# reports) for CI to upload.
# Environment: PYTHON (default python3), GATE_BUDGET_SECONDS, GATE_REPORT_DIR, GATE_SEED (default: the
# gate's fixed seed), GATE_EXTRA_ARGS (appended, e.g. "--allow-skip-isa" where clang-19 cannot be had).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
BUDGET=${GATE_BUDGET_SECONDS:-120}
OUT=${GATE_REPORT_DIR:-${TMPDIR:-/tmp}/hicache-fuzz-gate-cpu}
mkdir -p "$OUT"

log() { printf '[gate-cpu.sh] %s\n' "$*"; }

# The ROCm ISA check needs clang-19; without it the gate reports the check as skipped and is not green.
if ! command -v clang-19 >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
  log "installing clang-19 (Debian) for the ROCm ISA check"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends clang-19 >/dev/null \
    || log "clang-19 could not be installed; the gate will report the ISA check as skipped"
fi

# gfx950 needs clang >= 20: the ziglang wheel's clang 22 (docs/isa.md); without it gfx950 is skipped, not green.
if ! "$PYTHON" -c "import ziglang" >/dev/null 2>&1; then
  log "installing ziglang==0.17.0 (clang 22) for the gfx950 ISA check"
  "$PYTHON" -m pip install --quiet ziglang==0.17.0 || log "ziglang not installable; gfx950 will be reported skipped"
fi

if ! "$PYTHON" -c "import hicache_fuzz.harness.commands.gate" >/dev/null 2>&1; then
  log "hicache_fuzz is not importable; installing this checkout (editable)"
  "$PYTHON" -m pip install --quiet -e .
fi

seed_args=()
if [[ -n "${GATE_SEED:-}" ]]; then seed_args=(--seed "$GATE_SEED"); fi
# shellcheck disable=SC2206  # GATE_EXTRA_ARGS is split on purpose
extra_args=(${GATE_EXTRA_ARGS:-})

started=$SECONDS
rc=0
"$PYTHON" -m hicache_fuzz gate --platform cpu --budget-seconds "$BUDGET" "${seed_args[@]}" \
  --artifacts "$OUT/artifacts" --junit "$OUT/junit.xml" --markdown "$OUT/summary.md" --json "$OUT/gate.json" \
  "${extra_args[@]}" || rc=$?
log "gate exit $rc in $((SECONDS - started)) s; summary: $OUT/summary.md, JUnit: $OUT/junit.xml"
exit "$rc"
