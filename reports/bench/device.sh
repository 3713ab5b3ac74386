#!/usr/bin/env bash
# One device call (the H200; `run` with carry [".gpu-bundle"]):
#   source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1 && bash reports/bench/device.sh
# bench --gpu (pipeline + kernel bandwidth + copy ceiling), a cProfile of the in-process GPU pipeline, and a
# short isolated `fuzz` campaign over every sglang backend. Each step has its own time limit; rc per step in
# $OUT/rcs. SMOKE_SECONDS sets the campaign length (default 120).
set -u
out=${OUT:?}
mkdir -p "$out/bench" "$out/smoke"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
timeout 300 hicache-fuzz bench --gpu --platform cuda --seconds 10 --zoo-seconds 0 \
    --json "$out/bench/bench-gpu.json" --markdown "$out/bench/bench-gpu.md" > "$out/bench/bench-gpu.txt" 2>&1
echo "bench rc=$?" >> "$out/rcs"
timeout 60 python reports/bench/profile_gpu.py --seconds 8 --out "$out/bench/profile.txt" > "$out/bench/profile.log" 2>&1
echo "profile rc=$?" >> "$out/rcs"
timeout $(( ${SMOKE_SECONDS:-120} + 90 )) hicache-fuzz fuzz --platform cuda --isolate yes --seed 7 \
    --max-total-time "${SMOKE_SECONDS:-120}" --no-progress --corpus "$out/smoke/corpus" \
    --json "$out/smoke/report.json" > "$out/smoke/log.txt" 2>&1
echo "smoke rc=$?" >> "$out/rcs"
du -sh "${SGLANG_JIT_CACHE_DIR:-/tmp/sglang-jit}" >> "$out/rcs" 2>&1
