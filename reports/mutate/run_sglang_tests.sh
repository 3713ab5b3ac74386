#!/usr/bin/env bash
# The test-cmd target for sglang's own HiCache tests: pytest on the staged files, stopping at the first failure.
# A run where a test was skipped (no GPU, wrong SM) or none passed exits 1, so a baseline that tests nothing
# aborts the mutation run (exit 3) instead of letting every mutant "survive".
#   bash reports/mutate/run_sglang_tests.sh [pytest selection, relative to .mutate-targets/sglang-tests]
cd "$(dirname "$0")/../../.mutate-targets/sglang-tests" || exit 4
log=$(mktemp)
python3 -m pytest -x -q -rs -p no:cacheprovider "${@:-.}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(tail -n 3 "$log")
rm -f "$log"
if [ "$rc" -eq 0 ] && { ! grep -q " passed" <<<"$summary" || grep -q " skipped" <<<"$summary"; }; then
  echo "run_sglang_tests: no test passed or some were skipped: not a valid target run" >&2
  exit 1
fi
exit "$rc"
