#!/usr/bin/env bash
# Builds the Kubernetes 1.20.2 server binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) from Debian bookworm's source package of kubernetes-client, which
# carries the whole tree with its vendored modules: where no Kubernetes distribution can be
# downloaded but Debian's archive can. Needs: curl, golang-go (1.19), make, rsync, gcc, as root
# on Debian 12. About 10 minutes on two cores. Output: $DIR/bin.
#   deploy/kubernetes/testcluster/build.sh
set -euo pipefail
DIR=${TESTCLUSTER_DIR:-/var/tmp/flotilla-testcluster}
V=1.20.5+really1.20.2
POOL=${DEBIAN_POOL:-https://deb.debian.org/debian/pool/main/k/kubernetes}
mkdir -p "$DIR/src" "$DIR/bin" "$DIR/gopath/src/k8s.io"
cd "$DIR/src"
[ -f "kubernetes_$V.orig.tar.gz" ] || curl -fsSO "$POOL/kubernetes_$V.orig.tar.gz"
echo "b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc  kubernetes_$V.orig.tar.gz" | sha256sum -c -
[ -d kubernetes-1.20.2 ] || tar xzf "kubernetes_$V.orig.tar.gz"
src=$DIR/src/kubernetes-1.20.2
# This VM grants root no CAP_SYS_RESOURCE, so no process may lower its oom_score_adj: the
# kubelet's -998 for pod sandboxes (and -997 for Guaranteed pods) made every pod fail to start
# ("can't get final child's PID from pipe"). Left at 0 here; a real node needs no such change.
sed -i 's/defaultSandboxOOMAdj int = -998/defaultSandboxOOMAdj int = 0/' "$src/pkg/kubelet/dockershim/docker_sandbox.go"
sed -i 's/guaranteedOOMScoreAdj int = -997/guaranteedOOMScoreAdj int = 0/' "$src/pkg/kubelet/qos/policy.go"
# Generated code (the OpenAPI definitions) is not in the tarball.
[ -f "$src/pkg/generated/openapi/zz_generated.openapi.go" ] || make -C "$src" generated_files
ln -sfn "$src" "$DIR/gopath/src/k8s.io/kubernetes"
cd "$DIR/gopath/src/k8s.io/kubernetes"
GOPATH=$DIR/gopath GO111MODULE=off go build -ldflags "-s -w" -o "$DIR/bin/" \
  ./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kube-scheduler ./cmd/kubelet
# The pod sandbox image, from the same tree (registry.k8s.io is not reachable either).
gcc -Os -static -o "$DIR/bin/pause" "$src/build/pause/linux/pause.c"
ls -la "$DIR/bin"
