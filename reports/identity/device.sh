#!/usr/bin/env bash
# The false-alarm run of the gate issue on a GPU machine: 20 seeded 60-s `hicache-fuzz fuzz` campaigns against
# the unmodified sglang, --known corpus/sglang; how many raise a new bug identity (README.md here). One `run`
# call, from the checkout root:
#   carry: [".gpu-bundle"]
#   command: source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1; bash reports/identity/device.sh
# Every step is under `timeout`; the whole call is planned to end LIMIT (555) s after the call's shell started.
#
# One H200 (16 cores, 128 GiB, 1 GPU): a default GPU campaign's scale tier holds up to ~16 GiB of pinned host
# memory (its host arena: a 2^32-byte host pool rounded up to 8 GiB, per allocator) and up to ~32 GiB of device
# memory (a 16 GiB case and its before-copy, kept by torch's caching allocator) for the campaign's life, so at
# most 3 fit at once, and 20 x 60 s at 3 at a time do not fit one call. So:
#   phase 1: seeds 1-20, 60 s each, 10 at a time, the scale tier off (--scale off; the rest of the campaign is the
#            default), which keeps 10 campaigns within memory;
#   phase 2: seeds 21-23, 60 s each, the default campaign (scale tier on), 3 at a time, if >= 140 s are left.
# 4 or more GPUs (e.g. nvidia-h200-x8): one phase, seeds 1-20, the default campaign, 3 campaigns per GPU at most
# (pinned round robin), all 20 at once on 8 GPUs.
# Knobs: LIMIT (555), JOBS (phase 1 concurrency, 10), SEEDS (20), SECONDS_EACH (60); PLATFORM (cuda; cpu only for a
# dry run of the plumbing on a machine without a GPU, with a stand-in nvidia-smi on PATH).
set -u
out=${OUT:?}
work=/tmp/fa
rm -rf "$work"; mkdir -p "$work"
LIMIT=${LIMIT:-555}
SEEDS=${SEEDS:-20}
SECONDS_EACH=${SECONDS_EACH:-60}
started_at=$(date +%s)
# seconds since the call's shell (the parent, which sourced device-setup.sh) started; else since this script did + 60
elapsed() {
  local e
  e=$(ps -o etimes= -p "$PPID" 2>/dev/null | tr -d ' ')
  if [ -n "$e" ] && [ "$e" -ge 0 ] 2>/dev/null; then echo "$e"; else echo $(( $(date +%s) - started_at + 60 )); fi
}
rcs=$out/rcs.txt
{
  echo "identity/device.sh: started $(elapsed) s into the call; checkout $PWD ($(git rev-parse --short HEAD 2>/dev/null))"
  python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  echo "cpus $(nproc); MemTotal $(awk '/MemTotal/ {print int($2/1048576)}' /proc/meminfo) GiB"
} > "$rcs" 2>&1
grep -q "harness from $PWD/" "$rcs" || echo "WARNING: the harness is not imported from this checkout" >> "$rcs"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || { echo "no GPU visible: stop" >> "$rcs"; exit 3; }

# memory sampler: every 5 s, available host memory and GPU memory used (all GPUs summed), for the report
( while :; do
    echo "$(( $(date +%s) - started_at )) $(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{s+=$1} END {print s+0}')"
    sleep 5
  done ) > "$work/mem.txt" 2>/dev/null &
sampler=$!

pack() {
  kill "$sampler" 2>/dev/null
  {
    echo "memory: lowest MemAvailable $(awk 'NR==1||$2<m {m=$2} END {print m}' "$work/mem.txt") MiB;" \
         "highest GPU memory used $(awk '$3>m {m=$3} END {print m+0}' "$work/mem.txt") MiB (all GPUs)"
    echo "identity/device.sh: done $(elapsed) s into the call"
  } >> "$rcs"
  cp "$work/mem.txt" "$out/mem.txt" 2>/dev/null
  # per-campaign logs, reports and any reproducer, for the committed report (small: reports of 60-s campaigns)
  tar czf "$out/fa-campaigns.tgz" -C "$work" --exclude='.journal' runs 2>/dev/null
}
trap pack EXIT

phase() {  # phase NAME FIRST_SEED SEEDS JOBS START_DEADLINE KILL_AFTER GPUS [fuzz options...]
  local name=$1 first=$2 seeds=$3 jobs=$4 deadline=$5 kill_after=$6 gpus=$7
  shift 7
  echo "$name: seeds $first..$(( first + seeds - 1 )) x ${SECONDS_EACH} s, $jobs at a time, gpus $gpus, fuzz $*;" \
       "start deadline ${deadline} s, killed after ${kill_after} s; at $(elapsed) s" >> "$rcs"
  timeout --signal=TERM --kill-after=20 "$kill_after" \
    python3 -m hicache_fuzz false-alarms --first-seed "$first" --seeds "$seeds" --seconds "$SECONDS_EACH" --jobs "$jobs" \
      --gpus "$gpus" --start-deadline "$deadline" --known corpus/sglang --out "$work/runs/$name" \
      --json "$out/$name.json" --markdown "$out/$name.md" -- --platform "${PLATFORM:-cuda}" "$@" > "$work/$name.log" 2>&1
  echo "$name rc=$? at $(elapsed) s" >> "$rcs"
  tail -n 12 "$work/$name.log" >> "$rcs"
  cp "$work/$name.log" "$work/runs/$name.log" 2>/dev/null
}

if [ "$ngpu" -ge 4 ]; then
  jobs=$(( 3 * ngpu < SEEDS ? 3 * ngpu : SEEDS ))
  left=$(( LIMIT - $(elapsed) ))
  phase false-alarms 1 "$SEEDS" "$jobs" $(( left - 160 )) $(( left - 15 )) "$ngpu" --worker-processes 1
else
  left=$(( LIMIT - $(elapsed) ))
  # phase 1's campaigns start until 160 s (one campaign's wall under load, ~110-130 s, plus packing) before the
  # end; phase 2 then runs only if >= 140 s are left
  phase false-alarms 1 "$SEEDS" "${JOBS:-10}" $(( left - 160 )) $(( left - 15 )) none --scale off --worker-processes 1
  left=$(( LIMIT - $(elapsed) ))
  if [ "$left" -ge 140 ]; then
    phase false-alarms-scale $(( SEEDS + 1 )) 3 3 5 $(( left - 15 )) none --worker-processes 1
  else
    echo "false-alarms-scale: skipped, only ${left} s left" >> "$rcs"
  fi
fi
