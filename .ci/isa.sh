#!/usr/bin/env bash
# Static ISA check of sglang's HiCache copy kernels (docs/isa.md), as CI runs it.
#
# Idempotent: installs clang-19 from Debian and the ziglang wheel (clang 22, the only clang >= 20 this Debian
# can run; gfx950 needs LLVM >= 20) from PyPI when missing, fetches (once, into the user cache) Debian trixie's
# HIP headers + ROCm device libraries, clang 22's HIP wrapper headers (trixie) and ROCm 7.0 device libraries
# (sid), tvm-ffi's headers and the sglang 0.5.23 wheel, then runs (each target with the newest clang for it)
#   1. ROCm, --strict, gfx90a + gfx942 + gfx950          (must pass; a target without compiler exits 3: fails)
#   2. ROCm, production flags, gfx90a + gfx942 + gfx950  (must pass)
#   3. self-test: --strict on the scalarized mutant (must FAIL, or the check is dead)
#   4. CUDA sm_90a with nvcc + nvdisasm, when nvcc is present (must pass)
# Reports go to $ISA_REPORT_DIR (default reports/isa/ci). Exits non-zero if any step does not behave.
#
# Environment: PYTHON (default python3), SGLANG_VERSION (default 0.5.23), ISA_SGLANG_SOURCE (check this
# wheel/folder instead of the downloaded one), ISA_REPORT_DIR, ISA_SKIP_CUDA=1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
REPORT_DIR=${ISA_REPORT_DIR:-reports/isa/ci}
mkdir -p "$REPORT_DIR"

log() { printf '[isa.sh] %s\n' "$*"; }

# --- toolchain -------------------------------------------------------------------------------------------
if ! command -v clang-19 >/dev/null 2>&1; then
  log "installing clang-19 (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends clang-19 >/dev/null
fi
log "$(clang-19 --version | head -n 1)"
ZIGLANG_REQUIREMENT=ziglang==0.17.0  # embeds clang 22.1.8 (harness/isa/fetch.py ZIGLANG_REQUIREMENT)
if ! "$PYTHON" -c "import ziglang" >/dev/null 2>&1; then
  log "installing $ZIGLANG_REQUIREMENT from PyPI (clang 22 for gfx950)"
  "$PYTHON" -m pip install --quiet "$ZIGLANG_REQUIREMENT" \
    || log "could not install $ZIGLANG_REQUIREMENT: gfx950 will be reported SKIPPED and steps 1-3 exit 3"
fi

# --- the harness itself ----------------------------------------------------------------------------------
if ! "$PYTHON" -c "import hicache_fuzz.harness.isa.check" >/dev/null 2>&1; then
  log "hicache_fuzz is not importable; installing this checkout (editable, no dependencies)"
  "$PYTHON" -m pip install --quiet --no-deps -e .
fi
if command -v hicache-fuzz >/dev/null 2>&1 && hicache-fuzz isa --help >/dev/null 2>&1; then
  ISA=(hicache-fuzz isa)
else
  ISA=("$PYTHON" -m hicache_fuzz.harness.isa.check)
fi
CACHE_DIR=$("$PYTHON" -c "from hicache_fuzz.harness.isa import fetch as isa_fetch; print(isa_fetch.default_cache_dir())")

# --- headers, device libraries, sglang -------------------------------------------------------------------
# Fetches everything the ROCm check needs plus the sglang wheel; a no-op when the cache has them.
"$PYTHON" -m hicache_fuzz.harness.isa.fetch "$CACHE_DIR"
if [[ -n "${ISA_SGLANG_SOURCE:-}" ]]; then
  SGLANG_SOURCE=$ISA_SGLANG_SOURCE
else
  SGLANG_SOURCE=$("$PYTHON" -c "
import pathlib, sys
from hicache_fuzz.harness.isa import fetch as isa_fetch
print(isa_fetch.fetch_sglang_archive(pathlib.Path(sys.argv[1]), sys.argv[2]))" "$CACHE_DIR" "$SGLANG_VERSION")
fi
log "sglang source: $SGLANG_SOURCE"

failures=()
run_step() {  # run_step NAME EXPECTED_EXIT ARGS...
  local name=$1 expected=$2 rc=0
  shift 2
  log "step $name: ${ISA[*]} $*"
  local started=$SECONDS
  "${ISA[@]}" "$@" --sglang-source "$SGLANG_SOURCE" --cache-dir "$CACHE_DIR" \
    --json "$REPORT_DIR/$name.json" --markdown "$REPORT_DIR/$name.md" || rc=$?
  log "step $name: exit $rc (expected $expected), $((SECONDS - started)) s"
  if [[ $rc -ne $expected ]]; then
    failures+=("$name: exit $rc, expected $expected")
  fi
}

run_step rocm-strict 0 --platform rocm --strict
run_step rocm-default 0 --platform rocm
# The strict check has to catch a load_nc/store_nc scalarized into 32-bit builtins, which the default
# optimizer re-merges into dwordx4; exit 1 (check failed) is the expected, healthy outcome here.
run_step rocm-strict-mutant-scalarized 1 --platform rocm --strict --mutant rocm-scalarized \
  --module hicache-e256-u4 --module hicache-e1024-u2

if [[ "${ISA_SKIP_CUDA:-0}" == 1 ]]; then
  log "CUDA check skipped (ISA_SKIP_CUDA=1)"
elif command -v nvcc >/dev/null 2>&1 || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
  run_step cuda 0 --platform cuda
else
  log "CUDA check skipped: nvcc not found (install the CUDA toolkit or pip install nvidia-cuda-nvcc)"
fi

if ((${#failures[@]})); then
  log "FAILED:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
log "all ISA steps behaved as expected; reports in $REPORT_DIR"
