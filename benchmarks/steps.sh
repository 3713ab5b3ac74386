# Sourced by the benchmark scripts (benchmarks/*.sh): `step NAME COMMAND...` runs the command and appends
# "NAME rc=N S s (at T s)" to "$rcs"; a failing step's exit code is kept in "$status" (the script's exit status).
# The sourcing script sets out (its output folder), rcs, status and started (its start, date +%s) first.
# After every step the whole of "$out" is packed into "$out/0-results.tgz", which sorts first: a device call brings
# back only the first few files of its output folder by name, and a call cut by its time limit keeps what the steps
# before the cut wrote.
step() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  "$@"
  rc=$?
  [ "$rc" -eq 0 ] || status=$rc
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - started )) s)" >> "$rcs"
  pack_results
}

pack_results() {
  tar czf "$out/.0-results.tgz" -C "$out" --exclude ./0-results.tgz --exclude ./.0-results.tgz . 2>/dev/null
  mv -f "$out/.0-results.tgz" "$out/0-results.tgz"
}

# `require_this_checkout`: the installed hicache-fuzz must import from this checkout (the working folder), or the
# script would measure another copy. Appends where it imports from and the commit to "$rcs"; exits 3 if it is not
# this checkout. Needs py and rcs.
require_this_checkout() {
  timeout 20 "$py" -c "import hicache_fuzz.harness as h; print('harness from', h.__file__)" >> "$rcs" 2>&1
  if ! grep -q "harness from $PWD/" "$rcs"; then
    echo "the installed hicache-fuzz is not this checkout ($PWD): stop" >> "$rcs"
    exit 3
  fi
  git rev-parse HEAD >> "$rcs" 2>&1 || echo "(no git here)" >> "$rcs"
}
