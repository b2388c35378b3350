//! Test helpers: random matrices, naive reference kernels, byte conversions.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{Diag, ElemType, Scalar, Side, Trans, Uplo};

pub(crate) fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// `len` values uniform in [-1, 1).
pub(crate) fn random<T: Scalar>(rng: &mut SmallRng, len: usize) -> Vec<T> {
    (0..len)
        .map(|_| T::from_f64(rng.gen_range(-1.0..1.0)))
        .collect()
}

/// An n×n symmetric positive definite matrix (ld = n): M Mᵀ + n I.
pub(crate) fn spd(rng: &mut SmallRng, n: usize) -> Vec<f64> {
    let m: Vec<f64> = random(rng, n * n);
    let mut a = vec![0.0; n * n];
    for j in 0..n {
        for i in 0..n {
            let s: f64 = (0..n).map(|p| m[i + p * n] * m[j + p * n]).sum();
            a[i + j * n] = s + if i == j { n as f64 } else { 0.0 };
        }
    }
    a
}

/// A well-conditioned n×n matrix (ld = lda) whose `uplo` triangle is triangular data and
/// whose other triangle holds garbage the kernels must not read.
pub(crate) fn triangular<T: Scalar>(rng: &mut SmallRng, n: usize, lda: usize) -> Vec<T> {
    let mut a: Vec<T> = random(rng, lda * n.max(1));
    for j in 0..n {
        a[j + j * lda] = T::from_f64(2.0 + rng.gen_range(0.0..1.0));
        for i in 0..n {
            if i != j {
                let v = a[i + j * lda].to_f64() / n as f64;
                a[i + j * lda] = T::from_f64(v);
            }
        }
    }
    a
}

fn at(x: &[f64], t: Trans, i: usize, j: usize, ld: usize) -> f64 {
    match t {
        Trans::No => x[i + j * ld],
        Trans::Yes => x[j + i * ld],
    }
}

pub(crate) fn to_f64<T: Scalar>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Naive gemm in f64.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_gemm(
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
    alpha: f64,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    beta: f64,
    c: &mut [f64],
    ldc: usize,
) {
    for j in 0..n {
        for i in 0..m {
            let s: f64 = (0..k)
                .map(|p| at(a, ta, i, p, lda) * at(b, tb, p, j, ldb))
                .sum();
            let old = if beta == 0.0 {
                0.0
            } else {
                beta * c[i + j * ldc]
            };
            c[i + j * ldc] = alpha * s + old;
        }
    }
}

/// Naive syrk in f64 (only the `uplo` triangle).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_syrk(
    uplo: Uplo,
    t: Trans,
    n: usize,
    k: usize,
    alpha: f64,
    a: &[f64],
    lda: usize,
    beta: f64,
    c: &mut [f64],
    ldc: usize,
) {
    // op(A) is n×k: element (i, p) is A[i,p] (No) or A[p,i] (Yes).
    for j in 0..n {
        for i in 0..n {
            let inside = match uplo {
                Uplo::Lower => i >= j,
                Uplo::Upper => i <= j,
            };
            if !inside {
                continue;
            }
            let s: f64 = (0..k)
                .map(|p| at(a, t, i, p, lda) * at(a, t, j, p, lda))
                .sum();
            let old = if beta == 0.0 {
                0.0
            } else {
                beta * c[i + j * ldc]
            };
            c[i + j * ldc] = alpha * s + old;
        }
    }
}

/// `op(A) X` (left) or `X op(A)` (right) in f64, A triangular as `uplo`/`diag` describe
/// (the other triangle ignored); X m×n with ld `ldx`; result m×n with ld m.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_tri_apply(
    side: Side,
    uplo: Uplo,
    t: Trans,
    diag: Diag,
    m: usize,
    n: usize,
    a: &[f64],
    lda: usize,
    x: &[f64],
    ldx: usize,
) -> Vec<f64> {
    let tri = |i: usize, j: usize| -> f64 {
        // element (i, j) of A as triangular
        if i == j {
            return if diag == Diag::Unit {
                1.0
            } else {
                a[i + j * lda]
            };
        }
        let inside = match uplo {
            Uplo::Lower => i > j,
            Uplo::Upper => i < j,
        };
        if inside {
            a[i + j * lda]
        } else {
            0.0
        }
    };
    let opa = |i: usize, j: usize| match t {
        Trans::No => tri(i, j),
        Trans::Yes => tri(j, i),
    };
    let mut out = vec![0.0; m * n];
    for j in 0..n {
        for i in 0..m {
            out[i + j * m] = match side {
                Side::Left => (0..m).map(|p| opa(i, p) * x[p + j * ldx]).sum(),
                Side::Right => (0..n).map(|p| x[i + p * ldx] * opa(p, j)).sum(),
            };
        }
    }
    out
}

/// max |x - y| / max(max |y|, tiny).
pub(crate) fn rel_err(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len());
    let diff = x
        .iter()
        .zip(y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let scale = y.iter().map(|v| v.abs()).fold(f64::MIN_POSITIVE, f64::max);
    diff / scale
}

/// The relative tolerance for comparing results of element type `e`.
pub(crate) fn tol(e: ElemType) -> f64 {
    match e {
        ElemType::F32 => 1e-4,
        ElemType::F64 => 1e-10,
    }
}

pub(crate) fn to_bytes<T: Scalar>(x: &[T]) -> Vec<u8> {
    match T::ELEM {
        ElemType::F32 => x
            .iter()
            .flat_map(|v| (v.to_f64() as f32).to_ne_bytes())
            .collect(),
        ElemType::F64 => x.iter().flat_map(|v| v.to_f64().to_ne_bytes()).collect(),
    }
}

pub(crate) fn from_bytes<T: Scalar>(b: &[u8]) -> Vec<T> {
    match T::ELEM {
        ElemType::F32 => b
            .chunks_exact(4)
            .map(|c| T::from_f64(f64::from(f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))))
            .collect(),
        ElemType::F64 => b
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                T::from_f64(f64::from_ne_bytes(w))
            })
            .collect(),
    }
}

/// Every value of `Trans`, `Uplo`, `Side` and `Diag`.
pub(crate) const TRANS: [Trans; 2] = [Trans::No, Trans::Yes];
pub(crate) const UPLO: [Uplo; 2] = [Uplo::Lower, Uplo::Upper];
pub(crate) const SIDE: [Side; 2] = [Side::Left, Side::Right];
pub(crate) const DIAG: [Diag; 2] = [Diag::NonUnit, Diag::Unit];
