#!/usr/bin/env bash
# Builds Flotilla as static binaries (x86_64-unknown-linux-musl): `flotilla` and
# `flotilla-enter` need no libc or other library on the machine they run on (copy them to
# any x86-64 Linux and run).
#
#   deploy/static/build.sh            # -> target/x86_64-unknown-linux-musl/release/flotilla{,-enter}
#
# Without the CUDA and OpenCL backends: they load the vendors' libraries at run time
# (dlopen), which a static musl binary cannot do. Everything else is in: the coordinator,
# workers, process and WASM tasks, the sandbox (bubblewrap, found on the machine), the pool.
# GPU machines use the ordinary build (cargo build --release), or the .deb.
#
# Needs the target and a musl C compiler (ring's C and assembly):
#   rustup target add x86_64-unknown-linux-musl
#   apt-get install musl-tools
set -euo pipefail
cd "$(dirname "$0")/../.."
target=x86_64-unknown-linux-musl
command -v musl-gcc >/dev/null 2>&1 || { echo "musl-gcc not found: apt-get install musl-tools" >&2; exit 1; }
export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
cargo build --release --locked -p flotilla --no-default-features --features wasm --target "$target" "$@"
dir="${CARGO_TARGET_DIR:-target}/$target/release"
for b in flotilla flotilla-enter; do
  if ! file "$dir/$b" | grep -E "static(-pie)? linked" >/dev/null; then
    echo "$dir/$b is not statically linked: $(file "$dir/$b")" >&2
    exit 1
  fi
done
"$dir/flotilla" --version
echo "static binaries: $dir/flotilla $dir/flotilla-enter"
