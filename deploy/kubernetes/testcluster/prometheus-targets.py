#!/usr/bin/env python3
"""Writes the coordinator's scrape targets for Prometheus's file discovery, every 5 s, from the
endpoints of the Service flotilla-coordinator (port `http`): what Kubernetes discovery would
find, for Debian's Prometheus, which is built without it. Test cluster only (monitoring.sh).

  prometheus-targets.py OUT.json
"""

import json
import os
import subprocess
import sys
import time


def targets():
    out = subprocess.run(
        ["kubectl", "-n", "flotilla", "get", "endpoints", "-o", "json", "-l",
         "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=coordinator"],
        check=True, capture_output=True, text=True).stdout
    found = []
    for item in json.loads(out)["items"]:
        for subset in item.get("subsets") or []:
            port = next((p["port"] for p in subset.get("ports", []) if p.get("name") == "http"), None)
            if port is None:
                continue
            for address in subset.get("addresses") or []:
                pod = (address.get("targetRef") or {}).get("name", "")
                found.append({"targets": [f"{address['ip']}:{port}"],
                              "labels": {"namespace": "flotilla", "pod": pod}})
    return found


def main():
    path = sys.argv[1]
    while True:
        try:
            with open(path + ".new", "w", encoding="utf-8") as f:
                json.dump(targets(), f)
            os.replace(path + ".new", path)
        except (subprocess.CalledProcessError, OSError, ValueError) as e:
            print(f"listing the coordinator's endpoints: {e}", file=sys.stderr, flush=True)
        time.sleep(5)


if __name__ == "__main__":
    main()
