#!/usr/bin/env bash
# The one device call behind reports/parallel/ (2x H200), run from the checkout's root with OUT set:
#   source .gpu-bundle/device-setup.sh && BUDGET=340 bash reports/parallel/device.sh
# 1. measure.py: prepare (JIT warm-up), 1 worker, GPUs x {1,2,4} workers on the 1-worker case set;
# 2. if time is left: the pytest fuzz suite on both GPUs (`pytest tests/fuzz -n 4`, one GPU per xdist worker),
#    then `hicache-fuzz merge` of its per-test reports into one report + JUnit.
set -u
BUDGET=${BUDGET:-340}
start=$SECONDS
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nproc > "$OUT/nproc.txt"
echo "SGLANG_JIT_CACHE_DIR=${SGLANG_JIT_CACHE_DIR:-unset}" > "$OUT/env.txt"
left=$((BUDGET - (SECONDS - start)))
timeout $((left - 60)) python reports/parallel/measure.py --out "$OUT/parallel" --seconds 30 \
    --deadline $((left - 75)) > "$OUT/measure.log" 2>&1
echo "measure exit $? after $((SECONDS - start)) s"
left=$((BUDGET - (SECONDS - start)))
if [ "$left" -gt 55 ]; then
  HICACHE_FUZZ_PLATFORM=cuda HICACHE_FUZZ_OUT="$OUT/pytest-fuzz" HICACHE_FUZZ_CHUNKS=4 \
  HICACHE_FUZZ_CASES_PER_CHUNK=60 HICACHE_FUZZ_HYPOTHESIS_ROUNDS=1 \
    timeout $((left - 12)) python -m pytest tests/fuzz -n 4 -p no:cacheprovider -q -rA \
    --junitxml="$OUT/pytest-junit.xml" > "$OUT/pytest.log" 2>&1
  echo "pytest exit $? after $((SECONDS - start)) s"
  # (the recorded run used the earlier layout, "$OUT"/pytest-fuzz/<worker>/{reports,corpus})
  python -m hicache_fuzz merge "$OUT/pytest-fuzz/reports" --corpus "$OUT/pytest-fuzz/corpus" \
    --out "$OUT/pytest-merged" > "$OUT/merge.log" 2>&1
  echo "merge exit $?"
else
  echo "no time left for the pytest run ($left s)"
fi
tail -n 4 "$OUT/measure.log"
tail -n 3 "$OUT/pytest.log" 2>/dev/null
