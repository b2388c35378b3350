#!/usr/bin/env python3
"""Counts the words of shard I of N of the corpus ($CORPUS): the files whose sorted position
is I modulo N (every file belongs to exactly one shard, whatever their number)."""
import collections
import json
import os
import re
import sys

i, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
corpus = os.environ.get("CORPUS", "/usr/share/common-licenses")
files = sorted(f for f in os.listdir(corpus) if os.path.isfile(os.path.join(corpus, f)))
counts = collections.Counter()
mine = files[i::n]
for name in mine:
    with open(os.path.join(corpus, name), encoding="utf-8", errors="replace") as f:
        counts.update(w.lower() for w in re.findall(r"[A-Za-z]+", f.read()))
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump({"files": mine, "counts": counts}, f)
print("shard %d/%d: %d files, %d words" % (i, n, len(mine), sum(counts.values())))
