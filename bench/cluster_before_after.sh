#!/usr/bin/env bash
# Cluster throughput, chain latency and coordinator restart of two builds of flotilla, run
# alternately in one session so both see the same machine load, in ABBA order (a run is
# slowed by the file writeback of the run before it, so the order alternates each round):
#   bash bench/cluster_before_after.sh OLD_BINARY NEW_BINARY [ROUNDS]
# Prints one JSON line per run, tagged "before"/"after".
set -euo pipefail
old=$1 new=$2 rounds=${3:-2}
run() {
  local tag=$1 bin=$2; shift 2
  printf '{"build":"%s","result":%s}\n' "$tag" "$("$bin" bench cluster "$@" --json)"
}
for round in $(seq "$rounds"); do
  order=("before $old" "after $new")
  [ $((round % 2)) -eq 0 ] && order=("after $new" "before $old")
  for pair in "${order[@]}"; do
    set -- $pair
    tag=$1 bin=$2
    run "$tag" "$bin" --workload wasm --tasks 10000 --reps 3 --no-xargs --restarts 5
    run "$tag" "$bin" --workload true --tasks 5000 --reps 3
    run "$tag" "$bin" --workload chain --kind wasm --tasks 1000 --reps 3 --no-xargs
  done
done
