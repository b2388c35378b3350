#!/usr/bin/env python3
"""Stitches DIR/0.pgm .. DIR/(N-1).pgm (bands of equal width) into one picture.

Writes OUT as a PNG (greyscale, 8 bits) with nothing but the standard library: zlib
compresses the rows and struct packs the chunks (the PNG specification, sections 5 and 11).
"""
import struct
import sys
import zlib


def png(width, height, pixels):
    """A greyscale PNG of `pixels` (width * height bytes, row by row)."""

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    # Each row starts with its filter type: 0, none.
    rows = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


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
        band = f.read()
        if len(band) != w * h:
            sys.exit("%s/%d.pgm: %d bytes of pixels, expected %d" % (d, i, len(band), w * h))
        data += band
        height += h
with open(out, "wb") as f:
    f.write(png(width, height, bytes(data)))
print("stitched %d bands into %s (%dx%d)" % (n, out, width, height))
