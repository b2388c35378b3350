#!/usr/bin/env bash
# Scaling of the data-parallel training example (examples/train): the same training (same
# global batch, same steps, same result) with 1, 2 and 4 rank processes on this machine.
# Efficiency(N) = T(1) / (N * T(N)). Ranks meet at a rendezvous served by rank 0.
#   bash bench/train_scaling.sh [batch=1024] [steps=100] [reps=3]
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=${1:-1024}; STEPS=${2:-100}; REPS=${3:-3}
cargo build --release -q -p flotilla-train
BIN=$PWD/target/release/flotilla-train
DATA=$PWD/examples/train/data/digits.csv
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
port=$((20000 + RANDOM % 20000))
run() { # ranks -> prints seconds and the final line of rank 0
  local n=$1 t0 t1
  rm -rf "$WORK/ckpt"
  t0=$(date +%s.%N)
  if [ "$n" = 1 ]; then
    "$BIN" --data "$DATA" --batch "$BATCH" --steps "$STEPS" --checkpoint-dir "$WORK/ckpt" --checkpoint-every 0 --log "$WORK/r{rank}.log"
  else
    port=$((port + 1))
    pids=()
    for r in $(seq 0 $((n - 1))); do
      "$BIN" --data "$DATA" --batch "$BATCH" --steps "$STEPS" --checkpoint-dir "$WORK/ckpt" --checkpoint-every 0 \
        --rendezvous "127.0.0.1:$port" --rank "$r" --world-size "$n" --log "$WORK/r{rank}.log" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  fi
  t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc) $(grep '^final' "$WORK/r0.log")"
}
for rep in $(seq "$REPS"); do
  for n in 1 2 4; do
    read -r secs rest <<<"$(run "$n")"
    echo "{\"bench\":\"train_scaling\",\"ranks\":$n,\"batch\":$BATCH,\"steps\":$STEPS,\"seconds\":$secs,\"final\":\"$rest\"}"
  done
done
