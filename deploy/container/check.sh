#!/usr/bin/env bash
# Builds the image's runtime files (the Containerfile's `base` stage) with binaries built
# outside it, and runs the result as the Kubernetes manifests run it (smoke.sh). CI runs it
# with the binaries its tests have just run:
#   deploy/container/check.sh --bin-dir target/debug
# The Containerfile's builder stage (cargo build --release inside the image) is not run here:
# it is a cold release build (about 15 minutes on two cores); BENCHMARKS.md records a full
# build of the image.
#
# Needs root, Debian's docker.io (dockerd with BuildKit) and, unless DEBIAN_IMAGE names a
# debian:bookworm-slim to build from (a mirror), debootstrap: Docker Hub is not reachable where
# CI runs, so the base is made from Debian's archive (DEBIAN_MIRROR, default deb.debian.org).
# If no daemon answers, it starts a dockerd of its own (its own socket and data root) and
# stops it, by PID, at exit; everything it made is removed.
set -euo pipefail

bin_dir=target/debug
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
for b in flotilla flotilla-enter; do
  [ -x "$bin_dir/$b" ] || { echo "check.sh: no $bin_dir/$b (build it first)" >&2; exit 1; }
done

# Debian's client has BuildKit built in; a newer client without the buildx plugin has not.
docker=docker
[ -x /usr/bin/docker ] && docker=/usr/bin/docker
export DOCKER_BUILDKIT=1

scratch=$(mktemp -d)
dockerd_pid=""
base="" image=""
cleanup() {
  local rc=$?
  [ -n "$image" ] && "$docker" rmi -f "$image" >/dev/null 2>&1
  [ -n "$base" ] && "$docker" rmi -f "$base" >/dev/null 2>&1
  if [ -n "$dockerd_pid" ]; then
    kill "$dockerd_pid" 2>/dev/null || true
    wait "$dockerd_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT

if ! "$docker" info >/dev/null 2>&1; then
  echo "== starting a dockerd of this check's own"
  mkdir -p "$scratch/data" "$scratch/exec"
  dockerd --data-root "$scratch/data" --exec-root "$scratch/exec" \
    --pidfile "$scratch/dockerd.pid" -H "unix://$scratch/docker.sock" \
    >"$scratch/dockerd.log" 2>&1 &
  dockerd_pid=$!
  export DOCKER_HOST="unix://$scratch/docker.sock"
  for _ in $(seq 1 120); do
    "$docker" info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || { cat "$scratch/dockerd.log" >&2; exit 1; }
    sleep 0.5
  done
  "$docker" info >/dev/null 2>&1 || { tail -20 "$scratch/dockerd.log" >&2; exit 1; }
fi

tag=$$
if [ -z "${DEBIAN_IMAGE:-}" ]; then
  echo "== debian:bookworm-slim's stand-in, from Debian's archive (debootstrap)"
  root="$scratch/rootfs"
  debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$scratch/debootstrap.log" 2>&1 || { tail -20 "$scratch/debootstrap.log" >&2; exit 1; }
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: ${DEBIAN_MIRROR:-http://deb.debian.org/debian}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  DEBIAN_IMAGE=flotilla-check/debian:bookworm-slim-$tag
  tar -C "$root" -c . | "$docker" import - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$root"
  base_debian=$DEBIAN_IMAGE
fi

echo "== the Containerfile's base stage"
base=flotilla-check/base:$tag
"$docker" build --target base --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" -t "$base" \
  -f "$repo/Containerfile" "$repo"
[ -n "${base_debian:-}" ] && "$docker" rmi -f "$base_debian" >/dev/null

echo "== with the binaries of $bin_dir"
mkdir -p "$scratch/bin"
cp "$bin_dir/flotilla" "$bin_dir/flotilla-enter" "$scratch/bin/"
printf 'FROM %s\nCOPY flotilla flotilla-enter /usr/local/bin/\n' "$base" >"$scratch/bin/Containerfile"
image=flotilla-check/flotilla:$tag
"$docker" build -q -t "$image" -f "$scratch/bin/Containerfile" "$scratch/bin" >/dev/null

ENGINE=$docker bash "$here/smoke.sh" "$image"
