#!/usr/bin/env bash
# Minimize reproducers where they fail (a GPU machine): `hicache-fuzz minimize` shrinks each one and derives its
# trigger by running relaxed cases (docs/identity.md), which a machine without the GPU cannot do. The minimized
# reproducers (with their standalone scripts) come back in $OUT/0-results.tgz, to be committed in place of the
# inputs (a corpus/sglang entry keeps its name and its "expect": "fail").
#
#   OUT=<empty folder> bash benchmarks/minimize_on_device.sh FILE...   # from the checkout root; on a GPU machine
#                                                                       # after `source .gpu-bundle/device-setup.sh`
# Environment (defaults in brackets): PLATFORM [cuda]; MAX_RUNS [4000] and MAX_SECONDS [60]: each file's budget
# (the files are minimized at once, so the wall time is about the longest one's); AOT_SRC [.aot-src]: the pinned
# sources the AOT ops are built from first, where present (docs/aot.md); PLUGIN [none]: a --backend-plugin;
# PYTHON [python3].
# Writes to $OUT (all of it packed into 0-results.tgz after every step too: benchmarks/steps.sh): rcs.txt (each
# step's exit code and seconds, then each file's minimizer line), aot.log, and per input file N (in the order
# given) minimize-N.log, minimize-N.json and minimized-N/<identity>/ (the minimized reproducer).
# Exit status: 2 without files; else that of the last failing step (0 if none).
set -u
out=${OUT:?set OUT to an empty folder for the results}
[ "$#" -gt 0 ] || { echo "usage: OUT=<folder> bash benchmarks/minimize_on_device.sh FILE..." >&2; exit 2; }
py=${PYTHON:-python3}
rcs="$out/rcs.txt"
status=0
started=$(date +%s)

# shellcheck source=benchmarks/steps.sh
source "$(dirname "$0")/steps.sh"

aot_src=${AOT_SRC:-.aot-src}
if [ -d "$aot_src" ]; then
  step aot-build timeout 300 "$py" -m hicache_fuzz.kernels.aot_build.build --src "$aot_src" --out .aot-build \
    > "$out/aot.log" 2>&1
fi
plugin=()
[ -n "${PLUGIN:-}" ] && plugin=(--backend-plugin "$PLUGIN")
minimize_all() {
  local n=0 pids=() rc=0
  for file in "$@"; do
    n=$((n + 1))
    "$py" -m hicache_fuzz minimize --platform "${PLATFORM:-cuda}" "${plugin[@]}" --max-runs "${MAX_RUNS:-4000}" \
      --max-seconds "${MAX_SECONDS:-60}" --no-progress --corpus "$out/minimized-$n" --json "$out/minimize-$n.json" \
      "$file" > "$out/minimize-$n.log" 2>&1 &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || rc=$?
  done
  return "$rc"
}
step "minimize $#" minimize_all "$@"
for log in "$out"/minimize-*.log; do
  tail -n 1 "$log" | sed "s|^|  $(basename "$log"): |" >> "$rcs"
done
pack_results
exit "$status"
