#!/usr/bin/env python3
"""OpenBLAS (through scipy) on the tiled Cholesky's tile kernels, one thread: the peer of
`cargo run --release -p flotilla-devices --example tile_kernels -- TILE...`.

  env -u OPENBLAS_CORETYPE python3 bench/tile_kernels_ref.py 128 256 384 512
"""
import sys
import time

import numpy as np
import scipy.linalg.blas as blas
import scipy.linalg.lapack as lapack
from threadpoolctl import threadpool_limits


def best(fn):
    fn()
    t = time.perf_counter()
    calls = 0
    while time.perf_counter() - t < 0.05:
        fn()
        calls += 1
    per = (time.perf_counter() - t) / max(calls, 1)
    n = max(1, min(10000, int(0.2 / per)))
    out = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out = min(out, (time.perf_counter() - t) / n)
    return out


def main():
    tiles = [int(a) for a in sys.argv[1:]] or [128, 256, 384, 512]
    print("tile  gemm_nt  syrk  trsm  potrf   (GFLOP/s, f64, one thread, OpenBLAS)")
    with threadpool_limits(1):
        for b in tiles:
            rng = np.random.default_rng(1)
            x = np.asfortranarray(rng.uniform(-0.5, 0.5, (b, b)))
            y = np.asfortranarray(rng.uniform(-0.5, 0.5, (b, b)))
            c = np.asfortranarray(np.zeros((b, b)))
            a0 = np.asfortranarray(x @ x.T + b * np.eye(b))
            low = np.asfortranarray(np.linalg.cholesky(a0))
            g = best(lambda: blas.dgemm(-1.0, x, y, 1.0, c, trans_b=1, overwrite_c=1))
            s = best(lambda: blas.dsyrk(-1.0, x, 1.0, c, lower=1, overwrite_c=1))
            rhs = np.asfortranarray(y.copy())
            t = best(lambda: blas.dtrsm(1.0, low, rhs, side=1, lower=1, trans_a=1, overwrite_b=1))
            a = np.asfortranarray(a0.copy())

            def chol():
                a[:] = a0
                lapack.dpotrf(a, lower=1, overwrite_a=1, clean=0)

            p = best(chol)
            print(f"{b:>4}  {2 * b**3 / g / 1e9:>7.1f}  {b**3 / s / 1e9:>4.1f}  "
                  f"{b**3 / t / 1e9:>4.1f}  {b**3 / 3 / p / 1e9:>5.1f}")


if __name__ == "__main__":
    main()
