#!/usr/bin/env python3
"""Stitches DIR/0.pgm .. DIR/(N-1).pgm (bands of equal width) into one PGM."""
import sys

d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
width = None
height = 0
data = bytearray()
for i in range(n):
    with open("%s/%d.pgm" % (d, i), "rb") as f:
        magic = f.readline().strip()
        if magic != b"P5":
            sys.exit("%s/%d.pgm: not a binary PGM" % (d, i))
        w, h = map(int, f.readline().split())
        f.readline()
        if width is None:
            width = w
        elif w != width:
            sys.exit("%s/%d.pgm: width %d, expected %d" % (d, i, w, width))
        data += f.read()
        height += h
with open(out, "wb") as f:
    f.write(b"P5\n%d %d\n255\n" % (width, height))
    f.write(data)
print("stitched %d bands into %s (%dx%d)" % (n, out, width, height))
