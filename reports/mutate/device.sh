#!/usr/bin/env bash
# One device call of the mutation run (issue 14's done-criterion). From the checkout root, in a `run` call with
#   carry: [".gpu-bundle", ".mutate-targets", ".mutate-out"]
#   command: source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1; bash reports/mutate/device.sh
# Resumable: finished mutants are in .mutate-out/mutants/<id>.json; $OUT/mutate-out.tgz brings them back (unpack it
# in the checkout before the next call so a fresh machine resumes too; a passed baseline is reused).
# Knobs (environment):
#   SAMPLE (40), SEED (0): the seeded sample of mutants
#   CAMPAIGN_SECONDS (60), CAMPAIGN_SEED (2026: the seed of the committed H200 campaigns, whose failures
#     corpus/sglang all knows, so the unmutated baseline is clean)
#   MUTANT_TIMEOUT (420 s per mutant and target)
#   LIMIT (470 s for the mutation run, leaving the 600-s call for setup, reports and packing; then SIGTERM:
#     the mutants in flight are dropped and rerun next time)
#   TARGETS ("campaign tests"), TESTS (pytest selection for sglang's own tests, relative to
#     .mutate-targets/sglang-tests; default: all staged files)
set -u
out=${OUT:?}
res=.mutate-out
mkdir -p "$res"
pack() {
  tar czf "$out/mutate-out.tgz" --exclude="$res/work" --exclude="$res/jit-cache" "$res"
  cp "$res"/summary.md "$res"/summary.json "$res"/junit.xml "$out"/ 2>/dev/null
  nvidia-smi --query-gpu=index,name --format=csv > "$out/gpus.csv" 2>&1
}
trap pack EXIT
targets=()
case " ${TARGETS:-campaign tests} " in *" campaign "*) targets+=(--target campaign);; esac
case " ${TARGETS:-campaign tests} " in
  *" tests "*) targets+=(--target test-cmd --test-cmd "bash reports/mutate/run_sglang_tests.sh ${TESTS:-.}");;
esac
timeout --signal=TERM --kill-after=30 "${LIMIT:-470}" \
  python3 -m hicache_fuzz.harness.mutate \
    --file hicache.cuh --file hicache_tma.cuh --file staged_write_back.cuh --file relayout.cuh \
    --file ops/kvcache/hicache.py --file 'pool_host/*.py' \
    --sample "${SAMPLE:-40}" --seed "${SEED:-0}" \
    "${targets[@]}" --platform cuda --campaign-seconds "${CAMPAIGN_SECONDS:-60}" --campaign-seed "${CAMPAIGN_SEED:-2026}" \
    --known corpus/sglang --timeout "${MUTANT_TIMEOUT:-420}" --gpus auto --reuse-baseline --out "$res" > "$out/mutate.log" 2>&1
echo "mutate rc=$? after ${SECONDS}s" >> "$out/mutate.log"
# A call cut by LIMIT leaves no summary: write it from what finished (no baseline, nothing runs).
python3 -m hicache_fuzz.harness.mutate \
    --file hicache.cuh --file hicache_tma.cuh --file staged_write_back.cuh --file relayout.cuh \
    --file ops/kvcache/hicache.py --file 'pool_host/*.py' \
    --sample "${SAMPLE:-40}" --seed "${SEED:-0}" \
    "${targets[@]}" --platform cuda --campaign-seconds "${CAMPAIGN_SECONDS:-60}" --campaign-seed "${CAMPAIGN_SEED:-2026}" \
    --known corpus/sglang --out "$res" --report-only >> "$out/mutate.log" 2>&1
