#!/usr/bin/env bash
# Stops what up.sh started (by the PIDs it wrote). Pods' containers stay in Docker: remove them
# with `docker rm -f $(docker ps -aq --filter label=io.kubernetes.pod.name)`.
DIR=${TESTCLUSTER_DIR:-/var/tmp/flotilla-testcluster}
for n in kubelet dns-sync dnsmasq scheduler controller-manager apiserver etcd registry; do
  f=$DIR/logs/$n.pid
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  rm -f "$f"
done
if [ -f "$DIR/logs/node-ip" ]; then
  for chain in PREROUTING OUTPUT; do
    iptables -t nat -D "$chain" -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT \
      --to-destination "$(cat "$DIR/logs/node-ip"):6443" 2>/dev/null
  done
  rm -f "$DIR/logs/node-ip"
fi
