#!/usr/bin/env python3
"""A stand-in for CoreDNS on the test cluster of up.sh: writes the cluster's Service and
StatefulSet pod names to a hosts file that dnsmasq serves, and SIGHUPs dnsmasq on change."""
import json, os, signal, subprocess, sys, time

hosts, pidfile = sys.argv[1], sys.argv[2]
kubectl = ["kubectl"]  # KUBECONFIG: up.sh sets it
last = None
while True:
    try:
        svcs = json.loads(subprocess.check_output(kubectl + ["get", "svc", "-A", "-o", "json"], stderr=subprocess.DEVNULL))
        eps = json.loads(subprocess.check_output(kubectl + ["get", "endpoints", "-A", "-o", "json"], stderr=subprocess.DEVNULL))
    except Exception:
        time.sleep(1)
        continue
    lines = []
    ep_by = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in eps["items"]}
    for s in svcs["items"]:
        ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
        fq = f"{name}.{ns}.svc.cluster.local"
        ip = s["spec"].get("clusterIP")
        if ip and ip != "None":
            lines.append(f"{ip} {fq}")
            continue
        for sub in (ep_by.get((ns, name)) or {}).get("subsets") or []:
            for a in sub.get("addresses") or []:
                lines.append(f"{a['ip']} {fq}")
                if a.get("hostname"):
                    lines.append(f"{a['ip']} {a['hostname']}.{fq}")
    text = "\n".join(sorted(set(lines))) + "\n"
    if text != last:
        with open(hosts + ".new", "w") as f:
            f.write(text)
        os.replace(hosts + ".new", hosts)
        try:
            os.kill(int(open(pidfile).read().strip()), signal.SIGHUP)
        except Exception:
            pass
        last = text
    time.sleep(1)
