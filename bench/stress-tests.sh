#!/usr/bin/env bash
# Runs the cluster and collective tests N times in a row (default 20) while busy loops of
# this script's own keep every core busy: the tests must not depend on the machine's load.
# Usage: bench/stress-tests.sh [N]. Stops at the first failing pass, its log kept.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-20}"
cores="$(nproc)"
cargo test -p flotilla -p flotilla-collective --no-run --quiet
log="target/stress-tests.log"
: > "$log"
spinners=()
for _ in $(seq "$cores"); do
  ( while :; do :; done ) &
  spinners+=("$!")
done
stop() { kill "${spinners[@]}" 2>/dev/null || true; }
trap stop EXIT
for i in $(seq "$n"); do
  start=$(date +%s)
  if ! cargo test -p flotilla-collective -p flotilla --quiet \
      --test 'cluster_*' --test 'collective_*' >> "$log" 2>&1; then
    echo "pass $i of $n FAILED under load (see $log)"
    exit 1
  fi
  echo "pass $i of $n: ok in $(( $(date +%s) - start )) s under load"
done
echo "all $n passes green with $cores busy loops"
