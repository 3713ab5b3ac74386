#!/usr/bin/env bash
# Build the offline bundle for a GPU machine without network (docs/gpu.md, "A GPU machine without network").
#
# Run it on any machine that reaches PyPI, from anywhere inside this checkout:
#     bash docs/gpu/make-bundle.sh [--python 3.12] [--arch x86_64] [--out DIR] [--baseline REV] [EXTRA_REQUIREMENT...]
# It writes DIR (default: .gpu-bundle at the checkout's root, git-ignored through .git/info/exclude):
#     wheels/          sglang 0.5.23 and the wheels of docs/gpu/bundle-wheels.txt, for that Python and arch
#     sgl_kernel_stub/ the import-only sgl_kernel stand-in (docs/gpu/sgl_kernel_stub)
#     device-setup.sh  to source on the GPU machine, from the checkout's root
#     MANIFEST.txt     what was bundled, for which Python and arch
#     baseline/        with --baseline REV: a wheel of this harness at commit REV and its corpus/sglang
#                      (corpus-sglang/), for benchmarks/proof_run.sh's BASELINE and BASELINE_KNOWN
# Carry DIR (and the checkout) to the GPU machine, then there: `source .gpu-bundle/device-setup.sh`.
# torch is never bundled: the GPU machine's own CUDA or ROCm build stays. EXTRA_REQUIREMENT arguments
# (e.g. transformers==5.19.0 for an image without it) are downloaded the same way.
set -euo pipefail

python_version=3.12
arch=x86_64
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
out=$root/.gpu-bundle
baseline=""
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --python) python_version=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "make-bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done

if [ -n "$baseline" ] && ! git -C "$root" rev-parse --quiet --verify "$baseline^{commit}" > /dev/null; then
  echo "make-bundle.sh: --baseline $baseline is not a commit of $root" >&2
  exit 2
fi

# The wheel list: one pinned requirement per line, comments and blank lines skipped.
mapfile -t wheels < <(grep -v '^[[:space:]]*\(#\|$\)' "$here/bundle-wheels.txt")
echo "make-bundle.sh: ${#wheels[@]} requirements from docs/gpu/bundle-wheels.txt${extra[*]:+ + ${extra[*]}}; Python $python_version, $arch"

# Binary wheels must match the GPU machine: ask pip for that Python and every manylinux tag it may accept.
platform_args=(--only-binary=:all: --implementation cp --python-version "$python_version")
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
           manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  platform_args+=(--platform "${tag}_${arch}")
done

rm -rf "$out"
mkdir -p "$out/wheels"
python3 -m pip download --quiet --disable-pip-version-check --no-deps "${platform_args[@]}" \
  --dest "$out/wheels" "${wheels[@]}" "${extra[@]}"
cp -r "$here/sgl_kernel_stub" "$out/sgl_kernel_stub"
if [ -n "$baseline" ]; then
  # The harness as it was at REV (its files as committed, not this working tree), built as a pure-Python wheel.
  source_dir=$(mktemp -d)
  trap 'rm -rf "$source_dir"' EXIT
  git -C "$root" archive "$baseline" | tar -x -C "$source_dir"
  mkdir -p "$out/baseline"
  python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$out/baseline" "$source_dir"
  if [ -d "$source_dir/corpus/sglang" ]; then cp -r "$source_dir/corpus/sglang" "$out/baseline/corpus-sglang"; fi
  echo "make-bundle.sh: baseline $(git -C "$root" rev-parse --short "$baseline"): $(cd "$out/baseline" && ls ./*.whl | sed 's#^\./##')"
fi
cp "$here/device-setup.sh" "$out/device-setup.sh"
{
  echo "python $python_version, arch $arch, built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" rev-parse --short HEAD)"
  (cd "$out/wheels" && ls -1 ./*.whl | sed 's#^\./##')
} > "$out/MANIFEST.txt"
case $out in
  "$root"/*) rel=${out#"$root"}; grep -qxF "$rel/" "$root/.git/info/exclude" 2>/dev/null \
               || echo "$rel/" >> "$(git -C "$root" rev-parse --git-path info/exclude)" ;;
esac
echo "make-bundle.sh: $(ls "$out/wheels" | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
