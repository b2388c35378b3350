#!/usr/bin/env bash
# Everything GPU in one run, for a machine lent with an NVIDIA GPU (the `device` tool gives
# 15 minutes in all, start included), writing under $OUT:
#   bash bench/gpu/prebuild.sh            # here, without a GPU: binaries into target/gpu-bin
#   run(command="OUT=$OUT BUDGET_S=540 bash bench/gpu/run.sh quick", carry=["target/gpu-bin"])
# N_GEMM and N_CHOL override the sizes; ONLY (a regex of step names) runs those steps alone:
#   ONLY='cuda-tests|reference|gemm-cuda-.*' N_GEMM=16384 bash bench/gpu/run.sh
# First run on an H200 on 2026-12-04 (figures in BENCHMARKS.md, section GPU). Steps run in order of importance (correctness,
# then the figures the issue names against cuBLAS/cuSOLVER in the same run, then the rest);
# each is time-boxed and independent, so a failing step still leaves the others' results,
# and once BUDGET_S seconds have passed the remaining steps are skipped (listed as such).
set -uo pipefail
cd "$(dirname "$0")/../.."
# Results go to a work folder; after every step its summary is copied to $OUT and the whole
# folder packed into $OUT/results.tgz (the device tool brings back at most 8 files), so a run
# stopped at its limit still leaves everything done so far.
OUT=${OUT:-/tmp/flotilla-gpu}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/flotilla-gpu-work.XXXX)
QUICK=${1:-}
BUDGET_S=${BUDGET_S:-900}
pack() { cp "$W/summary.txt" "$OUT/summary.txt" 2>/dev/null; tar czf "$OUT/results.tgz" -C "$W" . 2>/dev/null; }
log() { echo "== $*" | tee -a "$W/summary.txt"; }
step() { # name, timeout seconds, command...
  local name=$1 t=$2; shift 2
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ ^($ONLY)$ ]]; then return; fi
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -le 10 ]; then log "$name: skipped (budget spent)"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  log "$name (at ${SECONDS}s)"
  timeout "$t" "$@" >"$W/$name.txt" 2>&1
  echo "   exit $? ($(tail -1 "$W/$name.txt" | cut -c1-160))" | tee -a "$W/summary.txt"
  pack
}

# cudarc opens cuBLAS, cuSOLVER and NVRTC by name (libcublas.so, .so.12, ...). An image with
# CUDA 13 may hold them only as .so.13, in the toolkit or in Python's nvidia-* packages: put
# every such folder on the library path, and link the unversioned names to what is there.
LIBS=$W/cudalibs
mkdir -p "$LIBS"
dirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu 2>/dev/null)
py_nv=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null)
for d in $py_nv; do [ -d "$d/lib" ] && dirs="$dirs $d/lib"; [ -d "$d/lib64" ] && dirs="$dirs $d/lib64"; done
for lib in cublas cublasLt cusolver nvrtc cusparse nvJitLink; do
  for d in $dirs; do
    f=$(ls "$d"/lib$lib.so "$d"/lib$lib.so.[0-9]* 2>/dev/null | head -1)
    if [ -n "$f" ]; then ln -sf "$f" "$LIBS/lib$lib.so"; echo "lib$lib: $f" >>"$W/libs.txt"; break; fi
  done
done
export LD_LIBRARY_PATH=$LIBS:$(echo $dirs | tr ' ' ':')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$W/libs.txt"
if [ "$QUICK" = quick ]; then N_GEMM=${N_GEMM:-8192}; N_CHOL=${N_CHOL:-16384}; else N_GEMM=${N_GEMM:-16384}; N_CHOL=${N_CHOL:-32768}; fi

# 1. What the machine is, and correctness on the real GPU.
step nvidia-smi 30 nvidia-smi
step nvidia-topo 30 nvidia-smi topo -m
if [ -x target/gpu-bin/flotilla ] && target/gpu-bin/flotilla --help >/dev/null 2>&1; then
  B=./target/gpu-bin/flotilla
  # The device crate's tests, CUDA ones included (they print "CUDA driver present" when
  # they really ran on a GPU).
  step cuda-tests 240 target/gpu-bin/devices-tests cuda --nocapture
else
  step build 420 cargo build --release -p flotilla -p flotilla-train
  B=./target/release/flotilla
  step cuda-tests 240 cargo test --release -p flotilla-devices cuda -- --nocapture
fi
grep -c "CUDA driver present" "$W/cuda-tests.txt" 2>/dev/null | sed 's/^/   ran on a GPU: /' | tee -a "$W/summary.txt"
step devices 60 $B devices

# 2. The references: cuBLAS / cuSOLVER called directly (PyTorch), same sizes, same run.
cat >"$W/ref.py" <<PY
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
step reference 240 python3 "$W/ref.py"

# 3. The headline figures through Flotilla (GPU alone; CPU + GPU; traces).
step gemm-cuda-f32 180 $B bench gemm --n $N_GEMM --tile 4096 --devices cuda --precision f32 --reps 3 --json
step chol-cuda-f64 240 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision f64 --reps 2 --json \
  --trace "$W/chol-cuda-f64.trace.json"
step chol-mixed-f64 240 $B bench cholesky --n $N_CHOL --tile 2048 --devices cpu,cuda --precision f64 --reps 2 --json \
  --trace "$W/chol-mixed-f64.trace.json"
step chol-cuda-f64-tile4096 240 $B bench cholesky --n $N_CHOL --tile 4096 --devices cuda --precision f64 --reps 2 --json
# The tile chosen by the benchmark itself (each GPU candidate timed once, in a fresh home).
step chol-cuda-f64-auto 240 env FLOTILLA_HOME="$W/home" $B bench cholesky --n $N_CHOL --devices cuda --precision f64 --reps 2 --json
step gemm-cuda-f32-auto 180 env FLOTILLA_HOME="$W/home" $B bench gemm --n $N_GEMM --devices cuda --precision f32 --reps 3 --json
step copy-cuda 120 $B bench copy --device cuda --mib 1024 --reps 5 --json
for p in tf32 bf16 f64; do
  step "gemm-cuda-$p" 180 $B bench gemm --n $N_GEMM --tile 4096 --devices cuda --precision $p --reps 3 --json
done
step chol-cuda-f32 240 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision f32 --reps 2 --json
step chol-cuda-tf32 240 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision tf32 --reps 2 --json

# 4. The rest: pinned vs pageable registered data (FLOTILLA_PIN_HOST=0), CPU + GPU in f32,
#    device collectives (two ranks on the one GPU, pipelined and in one piece, next to host
#    memory), the training example on the GPU, the CPU alone.
step chol-cuda-f32-pageable 240 env FLOTILLA_PIN_HOST=0 $B bench cholesky --n $N_CHOL --tile 2048 --devices cuda --precision f32 --reps 2 --json
step chol-mixed-f32 240 $B bench cholesky --n $N_CHOL --tile 2048 --devices cpu,cuda --precision f32 --reps 2 --json \
  --trace "$W/chol-mixed-f32.trace.json"
step allreduce-cuda 150 $B bench allreduce --ranks 2 --bytes 1MiB,64MiB,256MiB --memory cuda --rounds 3 --json
step allreduce-cuda-onepiece 150 $B bench allreduce --ranks 2 --bytes 1MiB,64MiB,256MiB --memory cuda --chunk-bytes 0 --rounds 3 --json
step allreduce-host 90 $B bench allreduce --ranks 2 --bytes 1MiB,64MiB,256MiB --rounds 3 --json
if [ -x target/gpu-bin/flotilla-train ]; then TR=target/gpu-bin/flotilla-train; else TR=target/release/flotilla-train; fi
step train-host 90 $TR --data examples/train/data/digits.csv --checkpoint-dir "$W/ck-host" --device host
step train-cuda 90 $TR --data examples/train/data/digits.csv --checkpoint-dir "$W/ck-cuda" --device cuda
# The sweep example (tasks with a CPU and a GPU variant) with points big enough for a GPU:
# on the CPU alone, then with the GPU too (the scheduler learns both variants' times).
step sweep-cpu 180 env SWEEP_ENSEMBLE=262144 $B run examples/sweep/job.toml --gpus none
step sweep-cpu-gpu 180 env SWEEP_ENSEMBLE=262144 $B run examples/sweep/job.toml --gpus all
step chol-cpu-f64 180 $B bench cholesky --n 8192 --tile 512 --devices cpu --precision f64 --reps 2 --json
log "done at ${SECONDS}s; results in $OUT/results.tgz"
pack
