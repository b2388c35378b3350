#!/usr/bin/env python3
"""Merges the N shard counts in DIR and writes the 50 most frequent words."""
import collections
import json
import sys

d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
total = collections.Counter()
files = 0
for i in range(n):
    with open("%s/%d.json" % (d, i)) as f:
        part = json.load(f)
    files += len(part["files"])
    total.update(part["counts"])
with open(out, "w") as f:
    f.write("# %d files, %d words, %d distinct\n" % (files, sum(total.values()), len(total)))
    for word, c in total.most_common(50):
        f.write("%8d %s\n" % (c, word))
print("reduced %d shards: %d files, %d words" % (n, files, sum(total.values())))
