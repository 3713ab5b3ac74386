# Sourced by the benchmark scripts (benchmarks/*.sh): `step NAME COMMAND...` runs the command and appends
# "NAME rc=N S s (at T s)" to "$rcs"; a failing step's exit code is kept in "$status" (the script's exit status).
# The sourcing script sets rcs, status and started (its start, date +%s) first.
step() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  "$@"
  rc=$?
  [ "$rc" -eq 0 ] || status=$rc
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - started )) s)" >> "$rcs"
}
