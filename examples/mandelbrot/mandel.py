#!/usr/bin/env python3
"""Renders band `--tile` of `--tiles` horizontal bands of a `--size`² Mandelbrot image (PGM)."""
import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("--tile", type=int, required=True)
p.add_argument("--tiles", type=int, required=True)
p.add_argument("--size", type=int, default=512)
p.add_argument("--iters", type=int, default=200)
p.add_argument("--out", required=True)
a = p.parse_args()

n = a.size
rows = n // a.tiles
y0 = a.tile * rows
pixels = bytearray()
inside = 0
for y in range(y0, y0 + rows):
    ci = -1.25 + 2.5 * y / n
    for x in range(n):
        cr = -2.0 + 2.5 * x / n
        zr = zi = 0.0
        k = 0
        while k < a.iters and zr * zr + zi * zi <= 4.0:
            zr, zi = zr * zr - zi * zi + cr, 2 * zr * zi + ci
            k += 1
        inside += k == a.iters
        pixels.append(255 - (255 * k) // a.iters)
os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
tmp = a.out + ".tmp"
with open(tmp, "wb") as f:
    f.write(b"P5\n%d %d\n255\n" % (n, rows))
    f.write(pixels)
os.replace(tmp, a.out)
print(f"tile {a.tile}: rows {y0}..{y0 + rows} of {n}, {inside} of {rows * n} points in the set -> {a.out}")
