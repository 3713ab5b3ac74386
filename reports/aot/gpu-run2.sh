#!/bin/bash
# second pass: smoke JSON, the aot/pool campaigns again with the first pass's seeds (reproducers), symbols
source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
cd .aot-work/wt
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1
export HICACHE_FUZZ_AOT_BUILD=$PWD/.aot-build TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
L=/tmp/logs; mkdir -p $L
timeout 200 python3 -m hicache_fuzz.kernels.aot_build.build > $L/build.log 2>&1
echo "build rc=$?" | tee -a $L/steps.txt
nm -DC --defined-only .aot-build/hicache_fuzz_kvcacheio.so | grep -E "transfer_|get_device_acc" > $L/symbols.txt
timeout 150 python3 -m hicache_fuzz.harness.commands.aot_smoke --json $OUT/smoke.json > $L/smoke.log 2>&1
echo "smoke rc=$?" | tee -a $L/steps.txt
timeout 80 hicache-fuzz fuzz --platform cuda --backend sglang-aot --seed 3971684408 --max-total-time 38 --json $OUT/aot.json > $L/fuzz-aot.log 2>&1
echo "fuzz-aot rc=$?" | tee -a $L/steps.txt
timeout 100 hicache-fuzz fuzz --platform cuda --backend sglang-pool --seed 2107289123 --max-total-time 40 --json $OUT/pool.json > $L/fuzz-pool.log 2>&1
echo "fuzz-pool rc=$?" | tee -a $L/steps.txt
cp /tmp/setup.log /tmp/install.log $L/
tar -czf $OUT/logs.tar.gz -C /tmp logs
tar -czf $OUT/corpus.tar.gz fuzz-out/corpus 2>/dev/null
cat $L/steps.txt; grep -E "^  (pass|mismatch|crash|wrongly|unexpected)" $L/smoke.log | awk '{print $1, $2}' | sort | uniq -c
tail -6 $L/fuzz-aot.log $L/fuzz-pool.log
