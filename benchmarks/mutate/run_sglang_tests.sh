#!/usr/bin/env bash
# The test-cmd target for sglang's own HiCache tests: pytest on the staged files, stopping at the first failure.
# A run where a test was skipped (no GPU, wrong SM) or none passed exits 1, so a baseline that tests nothing
# aborts the mutation run (exit 3) instead of letting every mutant "survive".
#   bash benchmarks/mutate/run_sglang_tests.sh [pytest selection, relative to .mutate-targets/sglang-tests]
# Environment:
#   SGLANG_TESTS_WORKERS (default 0): pytest-xdist workers (-n N); with N > 0 the JIT modules a mutant rebuilds
#     compile N at a time instead of one after the other (the tests compile lazily, one module per new shape)
#   SGLANG_TESTS_DESELECT: a file of test node ids (one a line) that fail or skip on the UNMUTATED sglang on this
#     machine (written by prerun_sglang_tests.py); they are deselected, and the report lists them
cd "$(dirname "$0")/../../.mutate-targets/sglang-tests" || exit 4
args=(-x -q -rs -p no:cacheprovider -p no:hicache_fuzz -p no:randomly)
if [ "${SGLANG_TESTS_WORKERS:-0}" -gt 0 ]; then
  args+=(-p xdist -n "$SGLANG_TESTS_WORKERS")
fi
if [ -n "${SGLANG_TESTS_DESELECT:-}" ] && [ -s "$SGLANG_TESTS_DESELECT" ]; then
  while IFS= read -r node; do
    [ -n "$node" ] && args+=(--deselect "$node")
  done < "$SGLANG_TESTS_DESELECT"
fi
log=$(mktemp)
python3 -m pytest "${args[@]}" "${@:-.}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(tail -n 3 "$log")
rm -f "$log"
if [ "$rc" -eq 0 ] && { ! grep -q " passed" <<<"$summary" || grep -q " skipped" <<<"$summary"; }; then
  echo "run_sglang_tests: no test passed or some were skipped: not a valid target run" >&2
  exit 1
fi
exit "$rc"
