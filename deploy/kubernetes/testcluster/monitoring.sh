#!/usr/bin/env bash
# What docs/kubernetes.md section 9 (autoscaling) needs, on this test cluster: Prometheus
# (Debian's `prometheus`) scraping the coordinator as components/prometheus-servicemonitor
# says (the Service's `http` port, every 15 s, with the token of the Secret
# flotilla-metrics-token), and metrics-adapter.py, a stand-in for prometheus-adapter,
# registered with the API server as the External metrics API. Both run on the node, as root.
#   apt-get install prometheus python3-yaml
#   deploy/kubernetes/testcluster/monitoring.sh up      # after the Secret exists (section 9)
#   deploy/kubernetes/testcluster/monitoring.sh down
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${TESTCLUSTER_DIR:-/var/tmp/flotilla-testcluster}
NODE_IP=${NODE_IP:-$(ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
export KUBECONFIG=$DIR/kubeconfig
M=$DIR/monitoring
start() { local name=$1; shift; (nohup "$@" >"$DIR/logs/$name.log" 2>&1 & echo $! >"$DIR/logs/$name.pid"); }

case ${1:-} in
up)
  mkdir -p "$M/prometheus"
  (umask 077; kubectl -n flotilla get secret flotilla-metrics-token -o jsonpath='{.data.token}' |
    base64 -d >"$M/token")
  # The scrape configuration the prometheus-operator makes of the ServiceMonitor. Debian's
  # Prometheus is built without Kubernetes discovery: the Service's endpoints (port `http`)
  # are written to a file every 5 s instead (prometheus-targets.py).
  cat >"$M/prometheus.yml" <<YML
global: {scrape_interval: 15s, evaluation_interval: 15s}
scrape_configs:
  - job_name: serviceMonitor/flotilla/flotilla-coordinator/0
    metrics_path: /metrics
    authorization: {type: Bearer, credentials_file: $M/token}
    file_sd_configs: [{files: [$M/targets.json], refresh_interval: 5s}]
YML
  echo '[]' >"$M/targets.json"
  start prometheus-targets python3 "$here/prometheus-targets.py" "$M/targets.json"
  start prometheus prometheus --config.file="$M/prometheus.yml" --storage.tsdb.path="$M/prometheus" \
    --web.listen-address=127.0.0.1:9091
  start metrics-adapter python3 "$here/metrics-adapter.py" \
    --values "$here/../components/autoscale-hpa/prometheus-adapter-values.yaml" \
    --prometheus http://127.0.0.1:9091 --listen "$NODE_IP:6444" --cert-dir "$M"
  # The API server reaches the adapter on the node through a Service without a selector
  # (--enable-aggregator-routing: it dials the Endpoints' address itself).
  kubectl apply -f - <<YML
apiVersion: v1
kind: Namespace
metadata: {name: monitoring}
---
apiVersion: v1
kind: Service
metadata: {name: flotilla-metrics-adapter, namespace: monitoring}
spec: {ports: [{port: 443, targetPort: 6444}]}
---
apiVersion: v1
kind: Endpoints
metadata: {name: flotilla-metrics-adapter, namespace: monitoring}
subsets: [{addresses: [{ip: "$NODE_IP"}], ports: [{port: 6444}]}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.external.metrics.k8s.io}
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  service: {name: flotilla-metrics-adapter, namespace: monitoring, port: 443}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
YML
  for _ in $(seq 60); do
    kubectl get apiservice v1beta1.external.metrics.k8s.io | grep -q True && break
    sleep 1
  done
  kubectl get apiservice v1beta1.external.metrics.k8s.io
  ;;
down)
  kubectl delete apiservice v1beta1.external.metrics.k8s.io --ignore-not-found
  for n in metrics-adapter prometheus prometheus-targets; do
    f=$DIR/logs/$n.pid
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
    rm -f "$f"
  done
  ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
