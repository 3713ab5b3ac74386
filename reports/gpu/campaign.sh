#!/usr/bin/env bash
# The H200 measurements of issues 5 and 6 in one device call (`run` with carry [".gpu-bundle"]):
#   source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1 && bash reports/gpu/campaign.sh
# 1. `hicache-fuzz fuzz` over every sglang backend present, crash-isolated, on a cold JIT cache (so the
#    compile share is the real one), 300 s of campaign clock;
# 2. `hicache-fuzz bench --gpu` (small-case pipeline, kernel bandwidth, pinned copy ceiling);
# 3. with the time left (the call's limit is 600 s), a cProfile of the in-process pipeline.
# Everything is packed into $OUT/results.tgz after each step (the device tool returns few files, none deep).
set -u
out=${OUT:?}
res=/tmp/results
mkdir -p "$res/campaign" "$res/bench" "$res/profile"
nvidia-smi > "$res/nvidia-smi.txt" 2>&1
pack() { tar czf "$out/results.tgz" -C "$res" . ; }
trap pack EXIT
timeout ${CAMPAIGN_TIMEOUT:-390} hicache-fuzz fuzz --platform cuda --isolate yes --seed ${SEED:-2026} \
    --max-total-time ${CAMPAIGN_SECONDS:-300} --no-progress --corpus "$res/campaign/corpus" \
    --json "$res/campaign/report.json" > "$res/campaign/log.txt" 2>&1
echo "campaign rc=$? at ${SECONDS}s" >> "$res/rcs"
pack
timeout ${BENCH_TIMEOUT:-150} hicache-fuzz bench --gpu --platform cuda --seconds 10 --zoo-seconds 0 --repeats 10 \
    --json "$res/bench/bench-gpu.json" --markdown "$res/bench/bench-gpu.md" > "$res/bench/bench-gpu.txt" 2>&1
echo "bench rc=$? at ${SECONDS}s" >> "$res/rcs"
pack
left=$(( ${CALL_LIMIT:-560} - SECONDS ))
if [ "$left" -gt 30 ]; then
  timeout "$left" python reports/bench/profile_gpu.py --seconds 4 --out "$res/profile/profile.txt" \
      > "$res/profile/log.txt" 2>&1
  echo "profile rc=$? at ${SECONDS}s" >> "$res/rcs"
fi
