# Shared by session 7's device scripts (sourced after they set out, T0 and LIMIT): the step clock, the summary
# lines of a campaign report, and one 60-s `fuzz` campaign of the command users type. Factored out of the three
# scripts after the calls (each ran them inline, identical but for `hicache-fuzz` vs `python3 -m hicache_fuzz`,
# the same entry point, and call 1's engine line, which had no "feed" key yet).
el() { echo $(( $(date +%s) - T0 )); }
step() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name rc=$? $(( $(date +%s)-t0 )) s (at $(el) s)" >> "$out/rcs.txt"; }
summary() {  # name json launched
  python3 - "$1" "$2" "$3" >> "$out/rcs.txt" 2>&1 <<'PY'
import json, sys
from hicache_fuzz.harness.campaign.engine_stats import summary_lines
name, path, launched = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = json.load(open(path))
try:
    bare = json.load(open("/tmp/bare.json"))["cases_per_second"]
    share = f"{d['cases_per_second'] / bare:.3f} of the bare loop's {bare}"
except OSError:
    share = "bare loop not run yet"
print(f"== {name}: {d['cases']} cases in {d['seconds']} s = {d['cases_per_second']} cases/s "
      f"({share}); wall {d.get('wall_seconds')} s, "
      f"first result {d['engine']['first_result_unix'] - launched:.1f} s after launch")
print("\n".join(summary_lines(d)))
print("cases by backend", {b: sum(c.values()) for b, c in d["outcomes"].items()})
print("outcomes", json.dumps(d["outcomes"]))
print("failures", [(f["signature"], f["count"], bool(f["known"])) for f in d["unique_failures"]])
print("engine", json.dumps({k: d["engine"].get(k) for k in ("worker_processes", "backend_every", "batches_ahead",
                                                            "feed", "batch_losses", "cases_replayed_alone")}))
PY
}
campaign() {  # name seed extra-args...
  local name=$1 seed=$2; shift 2
  local left=$(( LIMIT - $(el) ))
  if [ "$left" -lt 95 ]; then echo "$name skipped: $left s left" >> "$out/rcs.txt"; return; fi
  local launched; launched=$(date +%s.%N)
  step "$name" timeout $(( left - 8 )) python3 -m hicache_fuzz fuzz --platform cuda --seed "$seed" --max-total-time 60 \
    --no-progress --known corpus/sglang --corpus "/tmp/corpus-$name" --json "/tmp/$name.json" "$@" \
    > "/tmp/$name.log" 2>&1
  [ -f "/tmp/$name.json" ] && summary "$name" "/tmp/$name.json" "$launched"
  # the report without the per-case id list and coverage detail (the call returns 8 files of 16 MiB at most)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k, None) for k in ('case_ids', 'coverage')]; json.dump(d, open(sys.argv[2], 'w'))" "/tmp/$name.json" "$out/$name.json" 2>/dev/null
  tail -c 4000 "/tmp/$name.log" >> "$out/logs.txt"
}
# The bundle, the cache folders and the harness under test; "baseline" also installs the worktree of commit
# 7b53772 (.baseline, carried) into /tmp/baseline-site: BASELINE_PATH puts it first on PYTHONPATH.
device_setup() {
  source .gpu-bundle/device-setup.sh > /tmp/setup.log 2>&1
  echo "setup rc=$? at $(el) s; $(nproc) cpus; checkout $(git rev-parse --short HEAD 2>/dev/null)" > "$out/rcs.txt"
  if [ "${1:-}" = baseline ]; then
    python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/baseline-site ./.baseline \
      > /tmp/baseline-install.log 2>&1
    echo "baseline install rc=$? at $(el) s" >> "$out/rcs.txt"
    BASELINE_PATH=/tmp/baseline-site:${PYTHONPATH:-}
    PYTHONPATH=$BASELINE_PATH python3 -c "import hicache_fuzz.harness as h; print('baseline harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
  fi
  python3 -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$out/rcs.txt" 2>&1
  export SGLANG_JIT_CACHE_DIR=/tmp/s7-jit SGLANG_CACHE_DIR=/tmp/s7-sglang XDG_CACHE_HOME=/tmp/s7-xdg
}
