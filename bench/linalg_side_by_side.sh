#!/usr/bin/env bash
# Flotilla's tiled Cholesky and GEMM next to numpy/scipy (OpenBLAS) on the same sizes, in
# one run, alternating so both see the same machine load. JSON lines on stdout.
#   PY=/tmp/hpcvenv/bin/python bash bench/linalg_side_by_side.sh 8192 512 3
# (python with numpy, scipy, threadpoolctl: python3 -m venv /tmp/hpcvenv && /tmp/hpcvenv/bin/pip install numpy scipy threadpoolctl)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4096}; TILE=${2:-512}; REPS=${3:-3}; ROUNDS=${ROUNDS:-2}
PY=${PY:-python3}
cargo build --release -q -p flotilla
for r in $(seq "$ROUNDS"); do
  for prec in f64 f32; do
    ./target/release/flotilla bench cholesky --n "$N" --tile "$TILE" --reps "$REPS" --precision "$prec" --json
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" bench/blas_ref.py --n "$N" --reps "$REPS" --precision "$prec" --only c
  done
  ./target/release/flotilla bench gemm --n "$N" --tile "$TILE" --reps "$REPS" --no-check --json
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" bench/blas_ref.py --n "$N" --reps "$REPS" --only g
done
