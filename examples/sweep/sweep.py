#!/usr/bin/env python3
"""One point of a sweep: an ensemble of damped, driven pendulums (initial angles 0.2,
0.201, ...) integrated for --steps steps, for a driving frequency chosen by --point; the
result is the ensemble's mean energy.

The CPU variant computes with NumPy when it is installed, else in plain Python (slow, but
it runs anywhere). The GPU variant computes the same model with CuPy, or PyTorch, on the GPU
that CUDA_VISIBLE_DEVICES shows; where neither or no GPU is there it says so and fails, so
the scheduler learns not to pick it there. Both variants give the same energies to
rounding. The ensemble's size is --ensemble, else $SWEEP_ENSEMBLE, else 512.
"""
import argparse
import json
import math
import os

p = argparse.ArgumentParser()
p.add_argument("--device", choices=["cpu", "gpu"], required=True)
p.add_argument("--point", type=int, required=True)
p.add_argument("--out", required=True)
p.add_argument("--ensemble", type=int, default=int(os.environ.get("SWEEP_ENSEMBLE", "512")))
p.add_argument("--steps", type=int, default=2000)
a = p.parse_args()

omega = 0.5 + 0.05 * a.point
dt = 1e-2


def vectorized(xp):
    theta = 0.2 + 1e-3 * xp.arange(a.ensemble, dtype=xp.float64)
    v = xp.zeros(a.ensemble, dtype=xp.float64)
    for k in range(a.steps):
        drive = 1.2 * math.cos(omega * k * dt)
        v += (drive - xp.sin(theta) - 0.1 * v) * dt
        theta += v * dt
    return float(xp.mean(0.5 * v * v + (1 - xp.cos(theta))))


def plain():
    total = 0.0
    for j in range(a.ensemble):
        theta, v = 0.2 + 1e-3 * j, 0.0
        for k in range(a.steps):
            drive = 1.2 * math.cos(omega * k * dt)
            v += (drive - math.sin(theta) - 0.1 * v) * dt
            theta += v * dt
        total += 0.5 * v * v + (1 - math.cos(theta))
    return total / a.ensemble


def with_torch(torch):
    dev = torch.device("cuda")
    theta = 0.2 + 1e-3 * torch.arange(a.ensemble, dtype=torch.float64, device=dev)
    v = torch.zeros(a.ensemble, dtype=torch.float64, device=dev)
    for k in range(a.steps):
        drive = 1.2 * math.cos(omega * k * dt)
        v += (drive - torch.sin(theta) - 0.1 * v) * dt
        theta += v * dt
    return float(torch.mean(0.5 * v * v + (1 - torch.cos(theta))))


if a.device == "gpu":
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        energy, how = vectorized(cupy), "cupy"
    except Exception as cupy_missing:  # not installed, no driver, or no GPU visible
        try:
            import torch
        except ImportError:
            raise SystemExit("gpu variant: neither CuPy (%s) nor PyTorch here" % cupy_missing)
        if not torch.cuda.is_available():
            raise SystemExit("gpu variant: no usable GPU")
        energy, how = with_torch(torch), "torch"
else:
    try:
        import numpy
        energy, how = vectorized(numpy), "numpy"
    except ImportError:
        energy, how = plain(), "python"

os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
with open(a.out, "w") as f:
    json.dump(
        {"point": a.point, "omega": omega, "energy": energy, "device": a.device, "with": how}, f
    )
