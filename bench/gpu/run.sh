#!/usr/bin/env bash
# Everything GPU in one run, for a machine lent with an NVIDIA GPU (the `device` tool gives
# 15 minutes in all, so this builds, checks and times in one go and writes under $OUT).
#   OUT=/tmp/out bash bench/gpu/run.sh [quick]
# Prepared without a GPU: it has not run yet. Each step is time-boxed and independent, so a
# failing step still leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/flotilla-gpu}
mkdir -p "$OUT"
QUICK=${1:-}
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
step() { # name, timeout seconds, command...
  local name=$1 t=$2; shift 2
  log "$name"
  timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
  echo "   exit $? ($(tail -1 "$OUT/$name.txt" | cut -c1-160))" | tee -a "$OUT/summary.txt"
}
step nvidia-smi 30 nvidia-smi
step nvidia-topo 30 nvidia-smi topo -m
# Prebuilt binaries (bench/gpu/prebuild.sh, carried as target/gpu-bin) save the build.
if [ -x target/gpu-bin/flotilla ] && target/gpu-bin/flotilla --help >/dev/null 2>&1; then
  B=./target/gpu-bin/flotilla
  # 1. Correctness on the real GPU: the device crate's tests, CUDA ones included (they
  #    print "CUDA driver present" when they really ran).
  step cuda-tests 300 target/gpu-bin/devices-tests cuda --nocapture
else
  step build 420 cargo build --release -p flotilla
  B=./target/release/flotilla
  step cuda-tests 300 cargo test --release -p flotilla-devices cuda -- --nocapture
fi
grep -c "CUDA driver present" "$OUT/cuda-tests.txt" | sed 's/^/   ran on a GPU: /' | tee -a "$OUT/summary.txt"
step devices 60 $B devices
# Host <-> GPU bandwidth through Flotilla's device layer, pageable and pinned, same run.
step copy-cuda 120 $B bench copy --device cuda --mib 1024 --reps 5 --json
if [ "$QUICK" = quick ]; then N_GEMM=8192; N_CHOL=16384; else N_GEMM=16384; N_CHOL=32768; fi
# 2. GEMM and Cholesky through Flotilla: GPU alone, CPU alone (small), CPU + GPU, with traces.
for p in f32 f64; do
  step "gemm-cuda-$p" 240 $B bench gemm --n $N_GEMM --tile 4096 --devices cuda --precision $p --reps 3 --json
  step "chol-cuda-$p" 300 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision $p --reps 2 --json \
    --trace "$OUT/chol-cuda-$p.trace.json"
  step "chol-mixed-$p" 300 $B bench cholesky --n $N_CHOL --tile 2048 --devices cpu,cuda --precision $p --reps 2 --json \
    --trace "$OUT/chol-mixed-$p.trace.json"
done
# Mixed precision through Flotilla (f32 storage, TF32/bf16 products, residual reported).
for p in tf32 bf16; do
  step "gemm-cuda-$p" 240 $B bench gemm --n $N_GEMM --tile 4096 --devices cuda --precision $p --reps 3 --json
done
step chol-cuda-tf32 300 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision tf32 --reps 2 --json
# Pinned vs pageable registered data, through Flotilla (FLOTILLA_PIN_HOST=0 turns pinning off).
step chol-cuda-f32-pageable 300 env FLOTILLA_PIN_HOST=0 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision f32 --reps 2 --json
# Device collectives: two ranks on the one GPU, staged through pinned host memory,
# pipelined (default on CUDA) and in one piece.
step allreduce-cuda 200 $B bench allreduce --ranks 2 --bytes 1M,64M,256M --memory cuda --rounds 3 --json
step allreduce-cuda-onepiece 200 $B bench allreduce --ranks 2 --bytes 1M,64M,256M --memory cuda --chunk-bytes 0 --rounds 3 --json
step allreduce-host 120 $B bench allreduce --ranks 2 --bytes 1M,64M,256M --rounds 3 --json
# The training example with its gradients on the GPU (cuBLAS): same curve as on the host.
if [ -x target/gpu-bin/flotilla-train ]; then TR=target/gpu-bin/flotilla-train; else
  step build-train 300 cargo build --release -p flotilla-train; TR=target/release/flotilla-train; fi
step train-host 120 $TR --data examples/train/data/digits.csv --checkpoint-dir "$OUT/ck-host" --device host
step train-cuda 120 $TR --data examples/train/data/digits.csv --checkpoint-dir "$OUT/ck-cuda" --device cuda
step chol-cpu-f64 240 $B bench cholesky --n 8192 --tile 512 --devices cpu --precision f64 --reps 2 --json
# 3. The same operations in cuBLAS/cuSOLVER called directly (PyTorch), same sizes, same run.
cat >"$OUT/ref.py" <<PY
import json, time, torch
def t(f, reps=3):
    f(); torch.cuda.synchronize(); best = 1e9
    for _ in range(reps):
        s = time.perf_counter(); f(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - s)
    return best
dev = torch.device("cuda")
print(json.dumps({"gpu": torch.cuda.get_device_name(0)}))
for dt, name in [(torch.float32, "f32"), (torch.float64, "f64")]:
    n = $N_GEMM
    a = torch.rand(n, n, device=dev, dtype=dt); b = torch.rand(n, n, device=dev, dtype=dt)
    torch.backends.cuda.matmul.allow_tf32 = False
    s = t(lambda: a @ b)
    print(json.dumps({"ref": "cublas gemm", "precision": name, "n": n, "gflops": 2 * n**3 / s / 1e9}))
    if dt == torch.float32:
        torch.backends.cuda.matmul.allow_tf32 = True
        s = t(lambda: a @ b)
        print(json.dumps({"ref": "cublas gemm tf32", "n": n, "gflops": 2 * n**3 / s / 1e9}))
        ab, bb = a.bfloat16(), b.bfloat16()
        s = t(lambda: ab @ bb)
        print(json.dumps({"ref": "cublas gemm bf16", "n": n, "gflops": 2 * n**3 / s / 1e9}))
    del a, b
    n = $N_CHOL
    m = torch.rand(n, n, device=dev, dtype=dt); spd = m @ m.T + n * torch.eye(n, device=dev, dtype=dt); del m
    s = t(lambda: torch.linalg.cholesky(spd), reps=2)
    print(json.dumps({"ref": "cusolver potrf", "precision": name, "n": n, "gflops": n**3 / 3 / s / 1e9}))
    del spd
# Host-device bandwidth, pinned vs pageable, 1 GiB.
x = torch.empty(1 << 28, dtype=torch.float32); xp = x.pin_memory(); d = torch.empty_like(x, device=dev)
for name, h in [("pageable", x), ("pinned", xp)]:
    s = t(lambda: d.copy_(h, non_blocking=False)); print(json.dumps({"ref": "h2d", "memory": name, "gbs": 4 * (1 << 28) / s / 1e9}))
    s = t(lambda: h.copy_(d, non_blocking=False)); print(json.dumps({"ref": "d2h", "memory": name, "gbs": 4 * (1 << 28) / s / 1e9}))
PY
step reference 300 python3 "$OUT/ref.py"
log "done; results in $OUT"
