#!/usr/bin/env bash
# Builds, here (no GPU needed), the two binaries bench/gpu/run.sh uses, stripped, into
# target/gpu-bin/ (about 60 MB), so a device call spends its minutes measuring, not
# compiling:   bash bench/gpu/prebuild.sh
# then pass carry=["target/gpu-bin"] to the device call that runs bench/gpu/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p target/gpu-bin
cargo build --release -p flotilla -p flotilla-train
cp target/release/flotilla target/gpu-bin/flotilla
cp target/release/flotilla-train target/gpu-bin/flotilla-train
# The device crate's tests (the CUDA ones run for real where a driver is present).
test_bin=$(cargo test --release -p flotilla-devices --lib --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "flotilla_devices":
        print(m["executable"])' | tail -1)
cp "$test_bin" target/gpu-bin/devices-tests
strip target/gpu-bin/flotilla target/gpu-bin/flotilla-train target/gpu-bin/devices-tests
ls -la target/gpu-bin
