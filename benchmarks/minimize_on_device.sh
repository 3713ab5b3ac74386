#!/usr/bin/env bash
# Minimize reproducers where they fail (a GPU machine): `hicache-fuzz minimize --in-place` shrinks each one and
# derives its trigger by running relaxed cases (docs/identity.md), which a machine without the GPU cannot do. Each
# file is rewritten where it lies (a corpus/sglang entry keeps its name, "expect" and "scope"; its standalone script
# is rewritten beside it), so a later step of the same device call (the false alarms) already judges by the new
# triggers, and the files come back in $OUT/0-results.tgz under their repository paths, to be unpacked at the
# checkout root and committed.
#
#   OUT=<empty folder> bash benchmarks/minimize_on_device.sh FILE...   # from the checkout root; on a GPU machine
#                                                                       # after `source .gpu-bundle/device-setup.sh`
# Environment (defaults in brackets): PLATFORM [cuda]; MAX_RUNS [4000] and MAX_SECONDS [60]: each file's budget
# (the files are minimized at once, so the wall time is about the longest one's); AOT_SRC [.aot-src]: the pinned
# sources the AOT ops are built from first, where present (docs/aot.md); PLUGIN [none]: a --backend-plugin;
# PYTHON [python3].
# Writes to $OUT (all of it packed into 0-results.tgz after every step too: benchmarks/steps.sh): rcs.txt (each
# step's exit code and seconds, then each file's minimizer line), aot.log, per input file N (in the order given)
# minimize-N.log and minimize-N.json, and minimized/<the file's path> (the rewritten file and its standalone
# script, where it has one).
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
      --max-seconds "${MAX_SECONDS:-60}" --no-progress --in-place --json "$out/minimize-$n.json" \
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
for file in "$@"; do  # the rewritten files (and standalone scripts) under their paths
  mkdir -p "$out/minimized/$(dirname "$file")"
  cp "$file" "$out/minimized/$file"
  script="${file%.json}.standalone.py"
  [ -f "$script" ] && cp "$script" "$out/minimized/$script"
done
pack_results
exit "$status"
