#!/usr/bin/env python3
"""Collects the sweep's N results from DIR into a CSV."""
import json
import sys

d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(n):
    with open("%s/%d.json" % (d, i)) as f:
        rows.append(json.load(f))
with open(out, "w") as f:
    f.write("point,omega,energy,device\n")
    for r in rows:
        f.write("%d,%.4f,%.6f,%s\n" % (r["point"], r["omega"], r["energy"], r["device"]))
print("collected %d points into %s" % (n, out))
