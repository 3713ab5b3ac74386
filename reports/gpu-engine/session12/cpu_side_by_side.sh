#!/usr/bin/env bash
# Session 12, CPU (2 cores, no GPU): the committed loop.py + pool.py (git stash) against the working tree with
# the one-case-batch and top-up fixes, same command: 60-s campaigns, 2 workers, production scale and scale off.
set -u
cd /work/main
run() { # tag scale
  rm -rf /tmp/side/c-$1-$2; mkdir -p /tmp/side
  timeout 300 /work/venv-eng/bin/python -m hicache_fuzz fuzz --platform cpu --isolate yes --worker-processes 2 --scale $2 --variants 7 --mix auto --seed 11 --max-total-time 60 --no-progress --corpus /tmp/side/c-$1-$2 --json /tmp/side/$1-$2.json > /tmp/side/$1-$2.log 2>&1
  echo "$1 scale=$2 rc=$? $(grep -E 'cases in' /tmp/side/$1-$2.log)"
}
git stash push -q harness/pipeline/pool.py harness/campaign/loop.py
run before production; run before off
git stash pop -q
run after production; run after off
