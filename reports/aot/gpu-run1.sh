#!/bin/bash
# AOT kvcacheio build + checks on the GPU machine. Run from the checkout root: bash .aot-work/run.sh
ROOT=$PWD
source .gpu-bundle/device-setup.sh > $OUT/setup.log 2>&1
cd .aot-work/wt
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
python3 -c "import hicache_fuzz.kernels.aot_build as m, torch; print(m.__file__, torch.__version__, torch.version.cuda)" | tee $OUT/where.txt
which hicache-fuzz >> $OUT/where.txt
export HICACHE_FUZZ_AOT_BUILD=$PWD/.aot-build TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
python3 -m hicache_fuzz.kernels.aot_build.fetch_sources --check > $OUT/fetch-check.log 2>&1
echo "fetch rc=$?" | tee -a $OUT/steps.txt
start=$(date +%s)
timeout 300 python3 -m hicache_fuzz.kernels.aot_build.build --verbose > $OUT/build.log 2>&1
echo "build rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/steps.txt
cp .aot-build/build_info.json $OUT/ 2>/dev/null
nm -DC --defined-only .aot-build/hicache_fuzz_kvcacheio.so 2>&1 | grep -E "transfer_|get_device_acc" > $OUT/symbols.txt
timeout 120 hicache-fuzz backends --platform cuda --json $OUT/backends.json > $OUT/backends.txt 2>&1
echo "backends rc=$?" | tee -a $OUT/steps.txt
timeout 200 python3 -m hicache_fuzz.harness.commands.aot_smoke --json $OUT/smoke.json > $OUT/smoke.log 2>&1
echo "smoke rc=$?" | tee -a $OUT/steps.txt
tail -50 $OUT/smoke.log
timeout 110 hicache-fuzz fuzz --platform cuda --backend sglang-aot --max-total-time 50 --json $OUT/aot.json > $OUT/fuzz-aot.log 2>&1
echo "fuzz-aot rc=$?" | tee -a $OUT/steps.txt
timeout 120 hicache-fuzz fuzz --platform cuda --backend sglang-pool --max-total-time 50 --json $OUT/pool.json > $OUT/fuzz-pool.log 2>&1
echo "fuzz-pool rc=$?" | tee -a $OUT/steps.txt
tail -15 $OUT/fuzz-aot.log $OUT/fuzz-pool.log
