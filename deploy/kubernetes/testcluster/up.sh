#!/usr/bin/env bash
# Starts a one-node Kubernetes 1.20 on this machine, as root: etcd (Debian's etcd-server), the
# binaries of build.sh, Docker (Debian's docker.io, already running) through the kubelet's
# dockershim, Debian's CNI bridge plugin, and dnsmasq as a stand-in for CoreDNS (dns.py writes
# the Services' and StatefulSet pods' names for it). Also a registry on 127.0.0.1:5000
# (Debian's docker-registry) to push images to. Writes $DIR/kubeconfig.
#   apt-get install etcd-server containernetworking-plugins dnsmasq-base docker-registry
#   deploy/kubernetes/testcluster/up.sh && export KUBECONFIG=$DIR/kubeconfig
# AUTHORIZATION_MODE=RBAC enforces the manifests' Roles (the cluster's own parts use the
# admin token, of group system:masters); the default, AlwaysAllow, allows every request.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${TESTCLUSTER_DIR:-/var/tmp/flotilla-testcluster}
B=$DIR/bin
NODE_IP=${NODE_IP:-$(ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
export KUBECONFIG=$DIR/kubeconfig
mkdir -p "$DIR"/{logs,etcd,kubelet,cni,dns,registry} "$DIR"/pv/state-{0,1,2}
start() { local name=$1; shift; (nohup "$@" >"$DIR/logs/$name.log" 2>&1 & echo $! >"$DIR/logs/$name.pid"); }

[ -f "$DIR/sa.key" ] || { openssl genrsa -out "$DIR/sa.key" 2048 && openssl rsa -in "$DIR/sa.key" -pubout -out "$DIR/sa.pub"; } 2>/dev/null
# The aggregation layer (for the External metrics API of an autoscaler's adapter): a
# front-proxy CA and the client certificate the API server presents to extension servers.
[ -f "$DIR/front-proxy-ca.crt" ] || {
  openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj /CN=front-proxy-ca \
    -keyout "$DIR/front-proxy-ca.key" -out "$DIR/front-proxy-ca.crt"
  openssl req -newkey rsa:2048 -nodes -subj /CN=front-proxy-client \
    -keyout "$DIR/front-proxy-client.key" -out "$DIR/front-proxy-client.csr"
  openssl x509 -req -in "$DIR/front-proxy-client.csr" -CA "$DIR/front-proxy-ca.crt" \
    -CAkey "$DIR/front-proxy-ca.key" -CAcreateserial -days 365 -out "$DIR/front-proxy-client.crt"
} 2>/dev/null
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,system:masters" >"$DIR/tokens.csv"
chmod 600 "$DIR/tokens.csv"
cat >"$DIR/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
contexts: [{name: local, context: {cluster: local, user: admin}}]
users: [{name: admin, user: {token: "$token"}}]
current-context: local
KC
chmod 600 "$DIR/kubeconfig"
cp "$here/cni.conflist" "$DIR/cni/10-pods.conflist"
printf 'version: 0.1\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "127.0.0.1:5000"}\n' \
  "$DIR/registry" >"$DIR/registry.yml"
# The kubelet's dockershim wants its sandbox image present.
docker image inspect localhost/k8s/pause:3.2 >/dev/null 2>&1 ||
  tar -C "$B" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - localhost/k8s/pause:3.2

sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
start registry docker-registry serve "$DIR/registry.yml"
start etcd etcd --name node1 --data-dir "$DIR/etcd" --listen-client-urls http://127.0.0.1:2379 \
  --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380
sleep 2
start apiserver "$B/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --token-auth-file="$DIR/tokens.csv" --secure-port=6443 --cert-dir="$DIR/apiserver-certs" \
  --advertise-address="$NODE_IP" --kubelet-preferred-address-types=InternalIP \
  --service-cluster-ip-range=10.96.0.0/16 --authorization-mode="${AUTHORIZATION_MODE:-AlwaysAllow}" --allow-privileged=true \
  --service-account-key-file="$DIR/sa.pub" --service-account-signing-key-file="$DIR/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --requestheader-client-ca-file="$DIR/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- --proxy-client-cert-file="$DIR/front-proxy-client.crt" \
  --proxy-client-key-file="$DIR/front-proxy-client.key" --enable-aggregator-routing=true
for _ in $(seq 60); do kubectl get --raw /healthz >/dev/null 2>&1 && break; sleep 1; done
# The `kubernetes` Service (10.96.0.1:443) to the API server, for pods that call the API,
# as kube-proxy would route it (there is none here); removed by down.sh.
nat=(-d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "$NODE_IP:6443")
for chain in PREROUTING OUTPUT; do
  iptables -t nat -C "$chain" "${nat[@]}" 2>/dev/null || iptables -t nat -A "$chain" "${nat[@]}"
done
echo "$NODE_IP" >"$DIR/logs/node-ip"
# --root-ca-file: the service-account token Secrets then hold ca.crt, the CA of the API
# server's self-made certificate (its SANs name the `kubernetes` Service's IP), as a pod's
# client of the API needs (the coordinator's --pod-deletion-cost).
start controller-manager "$B/kube-controller-manager" --kubeconfig="$DIR/kubeconfig" \
  --service-account-private-key-file="$DIR/sa.key" --leader-elect=false --cluster-cidr=10.244.0.0/16 \
  --root-ca-file="$DIR/apiserver-certs/apiserver.crt"
start scheduler "$B/kube-scheduler" --kubeconfig="$DIR/kubeconfig" --leader-elect=false
touch "$DIR/dns/hosts"
start dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$DIR/dns/hosts" \
  --listen-address="$NODE_IP" --bind-interfaces --pid-file="$DIR/dns/dnsmasq.pid"
start dns-sync python3 "$here/dns.py" "$DIR/dns/hosts" "$DIR/dns/dnsmasq.pid"
# Eviction and image garbage collection at a few percent only: at the defaults (imagefs 15%)
# the kubelet of a shared build machine deletes every image it did not pull itself.
start kubelet "$B/kubelet" --kubeconfig="$DIR/kubeconfig" --container-runtime=docker \
  --pod-infra-container-image=localhost/k8s/pause:3.2 --network-plugin=cni \
  --cni-bin-dir=/usr/lib/cni --cni-conf-dir="$DIR/cni" --root-dir="$DIR/kubelet" \
  --cluster-dns="$NODE_IP" --cluster-domain=cluster.local --fail-swap-on=false \
  --cgroup-driver=cgroupfs --hostname-override=node1 --node-ip="$NODE_IP" \
  '--eviction-hard=memory.available<200Mi,nodefs.available<3%,imagefs.available<3%' \
  --image-gc-high-threshold=100 --image-gc-low-threshold=99
for _ in $(seq 90); do kubectl get node node1 2>/dev/null | grep -q ' Ready' && break; sleep 1; done
# No volume provisioner: local PersistentVolumes for the coordinators' claims.
sed "s#@DIR@#$DIR#" "$here/pv.yaml" | kubectl apply -f -
kubectl get nodes -o wide
