"""Counts the points of a seeded sequence that fall in the quarter circle.

    python3 sample.py INDEX N

Deterministic (a linear congruential generator seeded by INDEX), so two machines agree on
the result. On SIGTERM it writes state/INDEX.ckpt (how far it got, its count, its generator)
and exits; started again with that file present, it resumes from it.
"""

import json
import os
import signal
import sys

index, n = int(sys.argv[1]), int(sys.argv[2])
ckpt = f"state/{index}.ckpt"
state = {"done": 0, "hits": 0, "x": 12345 + 7919 * index}
if os.path.exists(ckpt):
    with open(ckpt) as f:
        state = json.load(f)


def save(*_):
    os.makedirs("state", exist_ok=True)
    with open(ckpt, "w") as f:
        json.dump(state, f)
    sys.exit(143)


signal.signal(signal.SIGTERM, save)
M = 2**31 - 1
while state["done"] < n:
    x = (state["x"] * 48271) % M
    y = (x * 48271) % M
    state["x"] = y
    u, v = x / M, y / M
    if u * u + v * v <= 1.0:
        state["hits"] += 1
    state["done"] += 1
os.makedirs("hits", exist_ok=True)
with open(f"hits/{index}.txt", "w") as f:
    f.write(f"{state['hits']}\n")
