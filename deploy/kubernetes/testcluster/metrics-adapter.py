#!/usr/bin/env python3
"""A stand-in for prometheus-adapter on the test cluster: serves Kubernetes' External metrics
API (external.metrics.k8s.io/v1beta1) from Prometheus, with the external rules of a
prometheus-adapter values file (components/autoscale-hpa/prometheus-adapter-values.yaml).

Not for production, and no copy of prometheus-adapter: it exists because that adapter cannot be
had on the machine the test cluster was made on (no Go module proxy, no container registry).
It does what the HorizontalPodAutoscaler needs of the real one for these rules: for each rule
with `resources: {namespaced: false}`, the metric `name.as` answers the value of `metricsQuery`
(an instant query), whatever namespace is asked. The templates prometheus-adapter fills in
(`<<.Series>>`, `<<.LabelMatchers>>`) are not supported: a rule using them is refused at start.
It does not authenticate the API server's proxied requests (the test cluster's API server
authorizes everything anyway).

  metrics-adapter.py --values FILE --prometheus http://127.0.0.1:9091 \
      --listen 10.0.0.5:6444 --cert-dir DIR
"""

import argparse
import datetime
import json
import os
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"


def load_rules(path):
    with open(path, encoding="utf-8") as f:
        values = yaml.safe_load(f)
    rules = {}
    for i, rule in enumerate((values.get("rules") or {}).get("external") or []):
        where = f"{path}: rules.external[{i}]"
        name = (rule.get("name") or {}).get("as")
        query = rule.get("metricsQuery")
        if not name or not query:
            sys.exit(f"{where}: needs name.as and metricsQuery")
        if "<<" in query:
            sys.exit(f"{where}: templates (<<...>>) are not supported by this stand-in")
        if (rule.get("resources") or {}).get("namespaced", True):
            sys.exit(f"{where}: only resources.namespaced: false is supported by this stand-in")
        rules[name] = query
    if not rules:
        sys.exit(f"{path}: no rules.external")
    return rules


def quantity(value):
    """A Kubernetes quantity string, as prometheus-adapter writes them (milli-units if needed)."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def query_prometheus(base, query):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus answered {body}")
    result = body["data"]["result"]
    # An empty vector (no series yet) is no value, as prometheus-adapter answers it.
    return [float(sample["value"][1]) for sample in result]


class Handler(BaseHTTPRequestHandler):
    rules = {}
    prometheus = ""

    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code, message):
        self.send_json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": message, "code": code})

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path.rstrip("/")
        if path in ("/healthz", "/readyz", "/livez"):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
            return
        if path == "/apis":
            version = {"groupVersion": GROUP_VERSION, "version": "v1beta1"}
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": "external.metrics.k8s.io", "versions": [version],
                 "preferredVersion": version}]})
            return
        if path == "/apis/" + GROUP_VERSION:
            self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                 "groupVersion": GROUP_VERSION, "resources": [
                                     {"name": name, "singularName": "", "namespaced": True,
                                      "kind": "ExternalMetricValueList", "verbs": ["get"]}
                                     for name in sorted(self.rules)]})
            return
        parts = path.split("/")
        # /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC
        if len(parts) == 7 and parts[4] == "namespaces":
            name = parts[6]
            if name not in self.rules:
                self.status(404, f"no external metric {name}")
                return
            try:
                values = query_prometheus(self.prometheus, self.rules[name])
            except Exception as e:  # noqa: BLE001 - any failure is the client's 500
                self.status(500, f"querying Prometheus for {name}: {e}")
                return
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.send_json(200, {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION,
                                 "metadata": {}, "items": [
                                     {"metricName": name, "metricLabels": {}, "timestamp": now,
                                      "value": quantity(v)} for v in values]})
            return
        self.status(404, f"not found: {path}")

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (datetime.datetime.now().isoformat(timespec="seconds"),
                                      fmt % args))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", required=True)
    p.add_argument("--prometheus", required=True)
    p.add_argument("--listen", required=True, help="HOST:PORT")
    p.add_argument("--cert-dir", required=True)
    a = p.parse_args()
    Handler.rules = load_rules(a.values)
    Handler.prometheus = a.prometheus.rstrip("/")
    os.makedirs(a.cert_dir, exist_ok=True)
    crt, key = (os.path.join(a.cert_dir, f) for f in ("adapter.crt", "adapter.key"))
    if not os.path.exists(crt):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                        "-subj", "/CN=flotilla-metrics-adapter", "-keyout", key, "-out", crt],
                       check=True, capture_output=True)
    host, port = a.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), Handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(crt, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    print(f"serving {sorted(Handler.rules)} on https://{a.listen}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
