//! The CPU tile kernels of the tiled Cholesky, one core, one tile size at a time:
//! GFLOP/s of the trailing update (gemm `C -= A·Bᵀ`), syrk, the panel solve (trsm) and potrf.
//! `bench/tile_kernels_ref.py` measures OpenBLAS on the same calls, one thread.
//!
//! `cargo run --release -p flotilla-devices --example tile_kernels -- [TILE...]`

use std::time::Instant;

use flotilla_devices::cpu::kernels::{gemm, potrf, syrk, trsm};
use flotilla_devices::{Diag, Side, Trans, Uplo};

/// Best seconds per call over a few rounds of enough calls to last ~0.2 s.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed().as_secs_f64() < 0.05 {
        f();
        calls += 1;
    }
    let per = start.elapsed().as_secs_f64() / f64::from(calls.max(1));
    let n = ((0.2 / per) as u32).clamp(1, 10_000);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / f64::from(n));
    }
    best
}

fn spd(b: usize) -> Vec<f64> {
    let mut a = vec![0.0; b * b];
    for j in 0..b {
        for i in 0..b {
            a[j * b + i] = if i == j {
                b as f64 + 1.0
            } else {
                (((i * 7 + j * 13) % 17) as f64 - 8.0) / 17.0
            };
        }
    }
    for j in 0..b {
        for i in 0..j {
            a[j * b + i] = a[i * b + j];
        }
    }
    a
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tiles: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let tiles = if tiles.is_empty() {
        vec![128, 256, 384, 512]
    } else {
        tiles
    };
    println!("tile  gemm_nt  syrk  trsm  potrf   (GFLOP/s, f64, one core)");
    for b in tiles {
        let x: Vec<f64> = (0..b * b).map(|i| ((i % 97) as f64) / 97.0 - 0.5).collect();
        let y: Vec<f64> = (0..b * b).map(|i| ((i % 89) as f64) / 89.0 - 0.5).collect();
        let mut c = vec![0.0f64; b * b];
        let bf = b as f64;
        let g = time(|| {
            gemm(
                Trans::No,
                Trans::Yes,
                b,
                b,
                b,
                -1.0,
                &x,
                b,
                &y,
                b,
                1.0,
                &mut c,
                b,
            )
            .expect("gemm");
        });
        let s = time(|| {
            syrk(Uplo::Lower, Trans::No, b, b, -1.0, &x, b, 1.0, &mut c, b).expect("syrk");
        });
        let l = {
            let mut l = spd(b);
            potrf(Uplo::Lower, b, &mut l, b)?;
            l
        };
        let mut rhs = y.clone();
        let t = time(|| {
            trsm(
                Side::Right,
                Uplo::Lower,
                Trans::Yes,
                Diag::NonUnit,
                b,
                b,
                1.0,
                &l,
                b,
                &mut rhs,
                b,
            )
            .expect("trsm");
        });
        let a0 = spd(b);
        let mut a = a0.clone();
        let p = time(|| {
            a.copy_from_slice(&a0);
            potrf(Uplo::Lower, b, &mut a, b).expect("potrf");
        });
        println!(
            "{b:>4}  {:>7.1}  {:>4.1}  {:>4.1}  {:>5.1}",
            2.0 * bf.powi(3) / g / 1e9,
            bf.powi(3) / s / 1e9,
            bf.powi(3) / t / 1e9,
            bf.powi(3) / 3.0 / p / 1e9,
        );
    }
    Ok(())
}
