#!/usr/bin/env bash
# The 5-minute campaign of issue 6, one device call (the H200; `run` with carry [".gpu-bundle"]):
#   source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1 && bash reports/gpu/campaign.sh
# 1. `hicache-fuzz fuzz` over every sglang backend present, crash-isolated, on a cold JIT cache (so the
#    compile share is the real one); 2. (time permitting) a cProfile of the in-process pipeline.
# Everything is packed into $OUT/results.tgz (the device tool returns only a few files, none deep).
set -u
out=${OUT:?}
res=/tmp/results
mkdir -p "$res/campaign" "$res/profile"
nvidia-smi > "$res/nvidia-smi.txt" 2>&1
pack() { tar czf "$out/results.tgz" -C "$res" . ; }
trap pack EXIT
timeout ${CAMPAIGN_TIMEOUT:-440} hicache-fuzz fuzz --platform cuda --isolate yes --seed ${SEED:-2026} \
    --max-total-time ${SECONDS_BUDGET:-300} --no-progress --corpus "$res/campaign/corpus" \
    --json "$res/campaign/report.json" > "$res/campaign/log.txt" 2>&1
echo "campaign rc=$?" >> "$res/rcs"
pack
timeout ${PROFILE_TIMEOUT:-100} python reports/bench/profile_gpu.py --seconds 5 --out "$res/profile/profile.txt" \
    > "$res/profile/log.txt" 2>&1
echo "profile rc=$?" >> "$res/rcs"
