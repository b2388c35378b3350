"""pi from the samplers' counts: python3 sum.py PARTS N (writes pi.txt)."""

import sys

parts, n = int(sys.argv[1]), int(sys.argv[2])
hits = sum(int(open(f"hits/{i}.txt").read()) for i in range(parts))
with open("pi.txt", "w") as f:
    f.write(f"{4.0 * hits / (parts * n):.5f}\n")
