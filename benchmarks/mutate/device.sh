#!/usr/bin/env bash
# A mutation run in one device call: SAMPLE sampled mutants (`mutate --sample`, seed SEED) of sglang 0.5.23's
# HiCache sources, each against (a) this harness's 60-s campaign and (b) sglang's own HiCache kernel tests, side by
# side (docs/mutate.md: arithmetic, choices; docs/bench.md: how to run it). From the checkout root:
#   carry: [".gpu-bundle", ".mutate-targets", ".aot-src"]  (+ ".mutate-out" when resuming an earlier call)
#   command: source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1; bash benchmarks/mutate/device.sh
# Planned to end LIMIT (555) s after the call's shell started; every step is under `timeout`. Resumable: finished
# mutants are in .mutate-out/mutants/<id>.json, all of .mutate-out comes back in $OUT/mutate-out.tgz (unpack it in
# the checkout, `tar xzf mutate-out.tgz`, and carry .mutate-out to resume on a fresh machine).
#
# Steps: (A) at once: sglang's staged tests on the UNMUTATED install (prerun_sglang_tests.py: which fail or skip
# on this machine -> deselected, listed in the report; compiles the tests' JIT modules 8 at a time) and a short
# campaign that compiles the campaign's JIT menu (the shared cache starts cold); (B) `hicache-fuzz mutate`:
# the baseline (both targets on the unmutated copy), then JOBS_PER_GPU mutants per GPU at once, each in its own
# private sglang copy, each mutant's two targets at the same time; (C) the report of what finished.
#
# Knobs (environment): SAMPLE (40), SEED (0), CAMPAIGN_SECONDS (60), CAMPAIGN_SEED (2026), SCALE (off: the
# campaign's scale tier; see README), JOBS_PER_GPU (5 with >= 4 GPUs, else 6), TEST_WORKERS (xdist workers of
# each mutant's test run: 4 with >= 4 GPUs, else 2), TARGETS ("campaign tests"), LIMIT (555), MUTANT_TIMEOUT (420 s:
# the campaign's limit, a hang guard only: the campaign turns a hung kernel into a failure itself), TEST_TIMEOUT
# (the tests' limit, 240 s with >= 4 GPUs, else 300: sglang's tests have no timeout of their own, so a mutant that
# hangs a kernel is a `timeout` here; a slow rebuild near the limit would be too: see README);
# START_MARGIN (180 s: no mutant starts later than this before the SIGTERM; a mutant can hold its slot
# 90-300 s under load, and one in flight at the call's end is lost);
# WARM (jit-warm: `hicache-fuzz jit-warm` builds every module of the campaign's menus into the shared cache, so
# a Python mutant's campaign compiles nothing; "campaign": a 32-run warm-up campaign);
# PRERUN_FROM (a prerun.json from an earlier call on the same machine type: its deselect list stands in for
# step A's pre-run when .mutate-out has none; the baseline still runs the tests on this machine and must pass);
# ONLY_FROM (a file of mutant ids, first word per line: `mutate --only-from`, e.g. the unfinished rest of a run
# whose .mutate-out was not kept);
# AOT_SRC (.aot-src: the pinned AOT sources, built into .aot-build when present);
# for a dry run of the plumbing without a GPU only: PLATFORM (cuda) and SGLANG_SRC (default: the installed sglang).
set -u
out=${OUT:?}
res=.mutate-out
work=/tmp/mutate-device
rm -rf "$work"; mkdir -p "$work" "$res"
LIMIT=${LIMIT:-555}
started_at=$(date +%s)
elapsed() {  # seconds since the call's shell (which sourced device-setup.sh) started; else this script + 60
  local e
  e=$(ps -o etimes= -p "$PPID" 2>/dev/null | tr -d ' ')
  if [ -n "$e" ] && [ "$e" -ge 0 ] 2>/dev/null; then echo "$e"; else echo $(( $(date +%s) - started_at + 60 )); fi
}
rcs=$out/rcs.txt
{
  echo "mutate/device.sh: started $(elapsed) s into the call; checkout $PWD ($(git rev-parse --short HEAD 2>/dev/null))"
  python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)"
  python3 -c "import importlib.util as u; s = u.find_spec('sglang'); print('sglang from', list(s.submodule_search_locations)[0] if s else 'nowhere')"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  echo "cpus $(nproc); MemTotal $(awk '/MemTotal/ {print int($2/1048576)}' /proc/meminfo) GiB"
  ls .mutate-targets/sglang-tests
} > "$rcs" 2>&1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || { echo "no GPU visible: stop" >> "$rcs"; exit 3; }
[ -f .mutate-targets/sglang-tests/test_hicache.py ] || echo "WARNING: .mutate-targets/sglang-tests is missing (carry it): the tests target will fail its baseline" >> "$rcs"
# with >= 4 GPUs the machine has cores to spare (x8: 128): 4 xdist workers per test run and a tighter test limit
if [ "$ngpu" -ge 4 ]; then jobs_default=5; tw_default=4; tt_default=240; else jobs_default=6; tw_default=2; tt_default=300; fi
JOBS_PER_GPU=${JOBS_PER_GPU:-$jobs_default}
SAMPLE=${SAMPLE:-40}
CAMPAIGN_SECONDS=${CAMPAIGN_SECONDS:-60}
TARGETS=${TARGETS:-campaign tests}
export SGLANG_TESTS_WORKERS=${TEST_WORKERS:-$tw_default}
export SGLANG_TESTS_DESELECT=$PWD/$res/prerun/deselect.txt

( while :; do
    echo "$(( $(date +%s) - started_at )) $(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{s+=$1} END {print s+0}') $(cut -d' ' -f1 /proc/loadavg)"
    sleep 5
  done ) > "$work/mem.txt" 2>/dev/null &
sampler=$!

pack() {
  kill "$sampler" 2>/dev/null
  {
    echo "memory: lowest MemAvailable $(awk 'NR==1||$2<m {m=$2} END {print m}' "$work/mem.txt") MiB;" \
         "highest GPU memory used $(awk '$3>m {m=$3} END {print m+0}' "$work/mem.txt") MiB (all GPUs);" \
         "highest 1-min load $(awk '$4>m {m=$4} END {print m+0}' "$work/mem.txt")"
    echo "mutate/device.sh: done $(elapsed) s into the call"
  } >> "$rcs"
  cp "$work/mem.txt" "$out/mem.txt" 2>/dev/null
  cp "$res"/summary.md "$res"/summary.json "$res"/junit.xml "$out"/ 2>/dev/null
  tar czf "$out/mutate-out.tgz" --exclude="$res/work" --exclude="$res/jit-cache" "$res" 2>/dev/null
}
trap pack EXIT

# (A) the tests on the unmutated install (once: a resumed call keeps the first call's deselect list) and the
# campaign's JIT menu, at once
if [ ! -f "$res/prerun/prerun.json" ] && [ -n "${PRERUN_FROM:-}" ]; then
  mkdir -p "$res/prerun"
  python3 - "$PRERUN_FROM" "$res/prerun" >> "$rcs" 2>&1 <<'PY'
import json, shutil, sys
from pathlib import Path
source, folder = Path(sys.argv[1]), Path(sys.argv[2])
data = json.loads(source.read_text())
nodes = [entry["node"] for entry in data.get("deselected", [])]
(folder / "deselect.txt").write_text("".join(f"{node}\n" for node in nodes))
shutil.copy(source, folder / "prerun.json")
print(f"prerun: taken from {source} ({len(nodes)} deselected: {', '.join(nodes)})")
PY
fi
if [ ! -f "$res/prerun/prerun.json" ]; then
  timeout --kill-after=20 240 python3 benchmarks/mutate/prerun_sglang_tests.py --out "$res/prerun" \
      --workers $(( $(nproc) / 2 < 8 ? $(nproc) / 2 : 8 )) --timeout 220 > "$work/prerun.out" 2>&1 &
  prerun=$!
else
  prerun=
  echo "prerun: kept from an earlier call ($res/prerun/prerun.json)" >> "$rcs"
fi
# the AOT ops the host pools fall back to (docs/aot.md), built from the pinned sources when they are carried: on a
# machine whose sgl_kernel does not load, the pool classes and the io backend that need them are otherwise
# unsupported, and the mutants of their modules unreachable; built beside step A, waited for before step B
aot=
if [ -d "${AOT_SRC:-.aot-src}" ]; then
  timeout --kill-after=20 300 python3 -m hicache_fuzz.kernels.aot_build.build --src "${AOT_SRC:-.aot-src}" \
      --out .aot-build > "$work/aot.log" 2>&1 &
  aot=$!
  export HICACHE_FUZZ_AOT_BUILD=$PWD/.aot-build
fi
platform=${PLATFORM:-cuda}
if [ "${WARM:-jit-warm}" = campaign ]; then
  warm_args=(--platform "$platform" --seed 1 --runs 32 --no-progress --known corpus/sglang --corpus "$work/warm-corpus"
             --json "$work/warm.json")
  [ "${SCALE:-off}" = off ] && warm_args+=(--scale off)
  timeout --kill-after=20 240 python3 -m hicache_fuzz fuzz "${warm_args[@]}" > "$work/warm.log" 2>&1
  echo "JIT warm-up campaign rc=$? at $(elapsed) s" >> "$rcs"
else
  timeout --kill-after=20 240 python3 -m hicache_fuzz jit-warm --platform "$platform" > "$work/warm.log" 2>&1
  echo "jit-warm rc=$? at $(elapsed) s: $(tail -n 1 "$work/warm.log")" >> "$rcs"
fi
if [ -n "$prerun" ]; then
  wait "$prerun"
  echo "prerun rc=$? at $(elapsed) s: $(tail -n 1 "$work/prerun.out")" >> "$rcs"
fi
if [ -n "$aot" ]; then
  wait "$aot"
  echo "aot-build rc=$? at $(elapsed) s: $(tail -n 1 "$work/aot.log")" >> "$rcs"
fi
passed=$(python3 -c "import json; print(json.load(open('$res/prerun/prerun.json')).get('passed', 0))" 2>/dev/null || echo 0)
if [ "$passed" -eq 0 ] && [ "$TARGETS" != campaign ]; then
  echo "no sglang test passed on the unmutated install (see $res/prerun/prerun.log in the tgz): campaign target only" >> "$rcs"
  TARGETS=campaign
fi

# (B) the mutation run
select=(--file hicache.cuh --file hicache_tma.cuh --file staged_write_back.cuh --file relayout.cuh
        --file ops/kvcache/hicache.py --file 'pool_host/*.py' --file managers/cache_controller.py
        --sample "$SAMPLE" --seed "${SEED:-0}")
[ -n "${SGLANG_SRC:-}" ] && select+=(--sglang-src "$SGLANG_SRC")
[ -n "${ONLY_FROM:-}" ] && select+=(--only-from "$ONLY_FROM")
targets=()
case " $TARGETS " in *" campaign "*)
  targets+=(--target campaign --platform "$platform" --campaign-seconds "$CAMPAIGN_SECONDS"
            --campaign-seed "${CAMPAIGN_SEED:-2026}" --known corpus/sglang --baseline-failures known)
  [ "${SCALE:-off}" = off ] && targets+=(--fuzz-arg=--scale=off);;
esac
case " $TARGETS " in *" tests "*)
  targets+=(--target test-cmd --test-cmd "bash benchmarks/mutate/run_sglang_tests.sh");;
esac
left=$(( LIMIT - $(elapsed) ))
echo "mutate: $SAMPLE mutants, targets [$TARGETS], $ngpu GPU(s) x $JOBS_PER_GPU, campaign ${CAMPAIGN_SECONDS} s" \
     "(scale ${SCALE:-off}), test workers $SGLANG_TESTS_WORKERS, test limit ${TEST_TIMEOUT:-$tt_default} s;" \
     "$(( left - 40 )) s before SIGTERM, at $(elapsed) s" >> "$rcs"
timeout --signal=TERM --kill-after=25 $(( left - 40 )) \
  python3 -m hicache_fuzz mutate "${select[@]}" "${targets[@]}" --parallel-targets \
    --timeout "${MUTANT_TIMEOUT:-420}" --test-cmd-timeout "${TEST_TIMEOUT:-$tt_default}" --gpus auto --jobs-per-gpu "$JOBS_PER_GPU" --reuse-baseline \
    --start-deadline $(( left - 40 - ${START_MARGIN:-180} > 0 ? left - 40 - ${START_MARGIN:-180} : 0 )) \
    --out "$res" > "$work/mutate.log" 2>&1
echo "mutate rc=$? at $(elapsed) s" >> "$rcs"

# (C) a call cut by the time limit leaves no summary: write it from what finished (no baseline, nothing runs);
# the same --jobs-per-gpu, which decides the campaign's --worker-processes and so the stored target options
timeout 60 python3 -m hicache_fuzz mutate "${select[@]}" "${targets[@]}" --jobs-per-gpu "$JOBS_PER_GPU" --out "$res" --report-only \
    >> "$work/mutate.log" 2>&1
echo "report rc=$? at $(elapsed) s" >> "$rcs"
cp "$work/mutate.log" "$out/mutate.log"
cp "$work/warm.log" "$work/prerun.out" "$res/" 2>/dev/null
