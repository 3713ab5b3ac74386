# Source this on the GPU machine (no network needed), from the root of the hicache-fuzz checkout:
#     source .gpu-bundle/device-setup.sh
# It installs the bundle's wheels into $HICACHE_BUNDLE_HOME/site (default /tmp/hicache-fuzz-bundle; never into
# the image's site-packages, so the image's torch and everything else stay as they are), puts that folder and
# the sgl_kernel stand-in on PYTHONPATH, keeps sglang's JIT build caches under $HICACHE_BUNDLE_HOME too (outside
# the bundle, so compiled kernels survive copying a fresh bundle over the old one), installs this checkout
# editable without dependencies and runs the pre-check. Copied by docs/gpu/make-bundle.sh; docs/gpu.md explains it.
hicache_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hicache_home=${HICACHE_BUNDLE_HOME:-${TMPDIR:-/tmp}/hicache-fuzz-bundle}
hicache_python=${PYTHON:-python3}
if ! "$hicache_python" -c 'import torch' 2>/dev/null; then
  echo "device-setup: $hicache_python has no torch: the bundle keeps the machine's torch and brings none" >&2
  return 3 2>/dev/null || exit 3
fi
"$hicache_python" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
  --target "$hicache_home/site" --upgrade "$hicache_bundle"/wheels/*.whl || { echo "device-setup: wheel install failed" >&2; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=$hicache_home/site:$hicache_bundle/sgl_kernel_stub${PYTHONPATH:+:$PYTHONPATH}
export SGLANG_JIT_CACHE_DIR=${SGLANG_JIT_CACHE_DIR:-$hicache_home/jit-cache}
export SGLANG_CACHE_DIR=${SGLANG_CACHE_DIR:-$hicache_home/sglang-cache}
export PYTHONUNBUFFERED=1
if [ -f pyproject.toml ] && grep -q '^name = "hicache-fuzz"' pyproject.toml; then
  "$hicache_python" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . \
    || echo "device-setup: the editable install of this checkout failed (the image needs setuptools>=68, and wheel where setuptools < 70.1)" >&2
else
  echo "device-setup: not at the root of the hicache-fuzz checkout; skipped its install" >&2
fi
"$hicache_python" -c 'import torch; print("device-setup: torch", torch.__version__, "sees", torch.cuda.device_count(), "GPU(s)")'
"$hicache_python" -m hicache_fuzz.harness.commands.envcheck --platform "$("$hicache_python" -c 'import torch; print("rocm" if torch.version.hip else "cuda")')" --sglang
