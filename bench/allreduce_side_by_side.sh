#!/usr/bin/env bash
# Flotilla's allreduce (f32 sum, 2 rank processes) next to OpenMPI's MPI_Allreduce on the same
# sizes and transports, alternating so both see the same machine load, plus memcpy bandwidth
# for the ratio. Needs OpenMPI (apt-get install openmpi-bin libopenmpi-dev) and gcc.
#   bash bench/allreduce_side_by_side.sh [rounds=3]
# Prints Flotilla's JSON lines and OpenMPI's RESULT lines (busbw = algbw * 2(n-1)/n, GB = 1e9 B).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
HPC=bench/anchors
cargo build --release -q -p flotilla
BIN=/tmp/flotilla_mpi_allreduce
mpicc -O2 "$HPC/mpi_allreduce.c" -o "$BIN"
gcc -O2 -pthread "$HPC/memcpy_bw.c" -o /tmp/flotilla_memcpy_bw
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca pml ob1"
/tmp/flotilla_memcpy_bw 1 5
for r in $(seq "$ROUNDS"); do
  ./target/release/flotilla bench allreduce --ranks 2 --transport shm --bytes 4KiB,1MiB,64MiB,256MiB --rounds 5 --json
  $MPI --mca btl self,vader "$BIN" 5 | sed "s/^allreduce/RESULT mpi_allreduce transport=shm(vader) round=$r/"
  ./target/release/flotilla bench allreduce --ranks 2 --transport tcp --bytes 4KiB,1MiB,64MiB,256MiB --rounds 5 --json
  $MPI --mca btl self,tcp "$BIN" 5 | sed "s/^allreduce/RESULT mpi_allreduce transport=tcp-loopback round=$r/"
done
