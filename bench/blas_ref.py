#!/usr/bin/env python3
"""The peer for `flotilla bench cholesky|gemm`: numpy/scipy (OpenBLAS) on the same sizes.

Prints one JSON line per measurement, with the same field names as flotilla's --json:
{"bench": "cholesky"|"gemm", "system": "scipy-openblas", "n", "precision", "gflops", "seconds",
 "median_seconds", "threads", "blas"}.

Run with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset (they pin a kernel other than the CPU's own):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 bench/blas_ref.py --n 8192 --reps 3
"""
import argparse
import json
import time

import numpy as np
import scipy.linalg

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # threadpoolctl is optional; without it the default thread count is used
    threadpool_info = None
    threadpool_limits = None


def spd(n, dtype, seed=42):
    # Same construction as flotilla's bench: symmetric, strictly diagonally dominant.
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, size=(n, n))
    a = np.tril(a, -1)
    a = a + a.T
    a[np.diag_indices(n)] = n + rng.uniform(0.0, 1.0, size=n)
    return np.asfortranarray(a.astype(dtype))


def timed(fn, reps):
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[2048])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--precision", choices=["f64", "f32"], nargs="+", default=["f64"])
    p.add_argument("--only", default="cg", help="c: cholesky, g: gemm")
    a = p.parse_args()
    limits = threadpool_limits(a.threads) if (a.threads and threadpool_limits) else None
    blas = ""
    if threadpool_info:
        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            blas = "%s %s %s threads=%s" % (info[0].get("internal_api"), info[0].get("version"),
                                            info[0].get("architecture"), info[0].get("num_threads"))
    for prec in a.precision:
        dtype = np.float64 if prec == "f64" else np.float32
        for n in a.n:
            if "c" in a.only:
                m = spd(n, dtype)
                ts = timed(lambda: scipy.linalg.cholesky(m, lower=True, overwrite_a=False, check_finite=False), a.reps)
                print(json.dumps({"bench": "cholesky", "system": "scipy-openblas", "n": n, "precision": prec,
                                  "gflops": n ** 3 / 3 / ts[0] / 1e9, "seconds": ts[0],
                                  "median_seconds": ts[len(ts) // 2], "blas": blas}), flush=True)
                del m
            if "g" in a.only:
                rng = np.random.default_rng(7)
                x = rng.uniform(-1, 1, size=(n, n)).astype(dtype)
                y = rng.uniform(-1, 1, size=(n, n)).astype(dtype)
                ts = timed(lambda: x @ y, a.reps)
                print(json.dumps({"bench": "gemm", "system": "numpy-openblas", "n": n, "precision": prec,
                                  "gflops": 2 * n ** 3 / ts[0] / 1e9, "seconds": ts[0],
                                  "median_seconds": ts[len(ts) // 2], "blas": blas}), flush=True)
    del limits


if __name__ == "__main__":
    main()
