//! Single-threaded BLAS-like kernels on column-major host slices, built on faer.
//!
//! Every matrix is a slice plus a leading dimension (`ld ≥ rows`, columns `ld` elements
//! apart). Arguments are checked before faer sees them: a slice too short or a leading
//! dimension too small is a [`DevicesError::BadArgs`], never a panic or undefined behaviour.
//! All kernels run with `Par::Seq`, because the runtime already runs one task per core.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{
    cholesky_in_place, cholesky_in_place_scratch, LltError, LltRegularization,
};
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::linalg::triangular_solve as tri;
use faer::{Accum, MatMut, MatRef, Par};

use crate::{args, DevicesError, Diag, ElemType, MathMode, Result, Side, Trans, Uplo};

/// A real element type the kernels work on: `f32` or `f64`.
pub trait Scalar: faer::traits::RealField + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The matching [`ElemType`].
    const ELEM: ElemType;
    /// Converts from `f64` (rounding for `f32`).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64`.
    fn to_f64(self) -> f64;
}

impl Scalar for f32 {
    const ELEM: ElemType = ElemType::F32;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Scalar for f64 {
    const ELEM: ElemType = ElemType::F64;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

fn view<T>(a: &[T], rows: usize, cols: usize, ld: usize) -> MatRef<'_, T> {
    MatRef::from_column_major_slice_with_stride(a, rows, cols, ld)
}

fn view_mut<T>(a: &mut [T], rows: usize, cols: usize, ld: usize) -> MatMut<'_, T> {
    MatMut::from_column_major_slice_with_stride_mut(a, rows, cols, ld)
}

fn op<T>(x: MatRef<'_, T>, t: Trans) -> MatRef<'_, T> {
    match t {
        Trans::No => x,
        Trans::Yes => x.transpose(),
    }
}

/// Multiplies the `rows`×`cols` matrix (or, with `uplo`, only that triangle) by `beta`;
/// `beta = 0` writes zeros without reading (so NaNs in the old contents vanish, as in BLAS).
fn scale<T: Scalar>(c: &mut [T], rows: usize, cols: usize, ld: usize, beta: T, uplo: Option<Uplo>) {
    if beta == T::one() {
        return;
    }
    let zero = beta == T::zero();
    for j in 0..cols {
        let (lo, hi) = match uplo {
            None => (0, rows),
            Some(Uplo::Lower) => (j.min(rows), rows),
            Some(Uplo::Upper) => (0, (j + 1).min(rows)),
        };
        for x in &mut c[j * ld + lo..j * ld + hi] {
            *x = if zero { T::zero() } else { *x * beta };
        }
    }
}

/// `C := alpha op(A) op(B) + beta C`, with `op(A)` m×k, `op(B)` k×n and C m×n.
/// When `beta` is 0, C is not read.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Scalar>(
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    beta: T,
    c: &mut [T],
    ldc: usize,
) -> Result<()> {
    args::gemm(
        ta,
        tb,
        m,
        n,
        k,
        (lda, a.len()),
        (ldb, b.len()),
        (ldc, c.len()),
    )?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    scale(c, m, n, ldc, beta, None);
    if k == 0 || alpha == T::zero() {
        return Ok(());
    }
    let (ar, ac) = args::stored(ta, m, k);
    let (br, bc) = args::stored(tb, k, n);
    let a = op(view(a, ar, ac, lda), ta);
    let b = op(view(b, br, bc, ldb), tb);
    let c = view_mut(c, m, n, ldc);
    faer::linalg::matmul::matmul(c, Accum::Add, a, b, alpha, Par::Seq);
    Ok(())
}

/// [`gemm`] on f32 with the inputs read in `mode`: A and B rounded to TF32 or bf16
/// ([`MathMode::round`]), then multiplied and accumulated in f32. This is the reference for
/// the devices' mixed-precision products.
#[allow(clippy::too_many_arguments)]
pub fn gemm_mixed(
    mode: MathMode,
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<()> {
    if mode == MathMode::F32 {
        return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    let round = |x: &[f32]| x.iter().map(|&v| mode.round(v)).collect::<Vec<f32>>();
    let (ar, br) = (round(a), round(b));
    gemm(ta, tb, m, n, k, alpha, &ar, lda, &br, ldb, beta, c, ldc)
}

/// `C := alpha A Aᵀ + beta C` (`t = No`, A n×k) or `C := alpha Aᵀ A + beta C` (`t = Yes`,
/// A k×n). Only the `uplo` triangle (with the diagonal) of the n×n matrix C is read or
/// written; faer's triangular matmul computes just that half.
#[allow(clippy::too_many_arguments)]
pub fn syrk<T: Scalar>(
    uplo: Uplo,
    t: Trans,
    n: usize,
    k: usize,
    alpha: T,
    a: &[T],
    lda: usize,
    beta: T,
    c: &mut [T],
    ldc: usize,
) -> Result<()> {
    args::syrk(t, n, k, (lda, a.len()), (ldc, c.len()))?;
    if n == 0 {
        return Ok(());
    }
    scale(c, n, n, ldc, beta, Some(uplo));
    if k == 0 || alpha == T::zero() {
        return Ok(());
    }
    let (ar, ac) = args::stored(t, n, k);
    let a = op(view(a, ar, ac, lda), t);
    let structure = match uplo {
        Uplo::Lower => BlockStructure::TriangularLower,
        Uplo::Upper => BlockStructure::TriangularUpper,
    };
    let c = view_mut(c, n, n, ldc);
    triangular::matmul(
        c,
        structure,
        Accum::Add,
        a,
        BlockStructure::Rectangular,
        a.transpose(),
        BlockStructure::Rectangular,
        alpha,
        Par::Seq,
    );
    Ok(())
}

/// Solves `op(A) X = alpha B` (`side = Left`, A m×m) or `X op(A) = alpha B`
/// (`side = Right`, A n×n) for X, overwriting the m×n matrix B. A is triangular (`uplo`);
/// with `Diag::Unit` its diagonal is taken as ones and not read. The Cholesky panel solve
/// `B := B L⁻ᵀ` is `trsm(Right, Lower, Yes, NonUnit, ..)`.
#[allow(clippy::too_many_arguments)]
pub fn trsm<T: Scalar>(
    side: Side,
    uplo: Uplo,
    t: Trans,
    diag: Diag,
    m: usize,
    n: usize,
    alpha: T,
    a: &[T],
    lda: usize,
    b: &mut [T],
    ldb: usize,
) -> Result<()> {
    args::trsm(side, m, n, (lda, a.len()), (ldb, b.len()))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    scale(b, m, n, ldb, alpha, None);
    if alpha == T::zero() {
        return Ok(());
    }
    let na = match side {
        Side::Left => m,
        Side::Right => n,
    };
    let a = view(a, na, na, lda);
    let b = view_mut(b, m, n, ldb);
    // Left: solve op(A) X = B. Right: X op(A) = B  <=>  op(A)ᵀ Xᵀ = Bᵀ.
    let (tri_mat, rhs, transposed) = match side {
        Side::Left => (a, b, t == Trans::Yes),
        Side::Right => (a, b.transpose_mut(), t == Trans::No),
    };
    let (tri_mat, lower) = if transposed {
        (tri_mat.transpose(), uplo == Uplo::Upper)
    } else {
        (tri_mat, uplo == Uplo::Lower)
    };
    match (lower, diag) {
        (true, Diag::NonUnit) => tri::solve_lower_triangular_in_place(tri_mat, rhs, Par::Seq),
        (true, Diag::Unit) => tri::solve_unit_lower_triangular_in_place(tri_mat, rhs, Par::Seq),
        (false, Diag::NonUnit) => tri::solve_upper_triangular_in_place(tri_mat, rhs, Par::Seq),
        (false, Diag::Unit) => tri::solve_unit_upper_triangular_in_place(tri_mat, rhs, Par::Seq),
    }
    Ok(())
}

/// Cholesky factorisation in place of the n×n matrix A: `A = L Lᵀ` (`Lower`, L written to
/// the lower triangle) or `A = Uᵀ U` (`Upper`, U written to the upper triangle). Only the
/// `uplo` triangle is read or written.
///
/// Fails with [`DevicesError::NotPositiveDefinite`] (0-based column) when a pivot is not
/// positive; A is then partly overwritten.
pub fn potrf<T: Scalar>(uplo: Uplo, n: usize, a: &mut [T], lda: usize) -> Result<()> {
    args::potrf(n, lda, a.len())?;
    if n == 0 {
        return Ok(());
    }
    match uplo {
        Uplo::Lower => llt_lower(a, n, lda),
        Uplo::Upper => {
            // Uᵀ U = A: factor the transpose (a lower triangle) in a column-major copy, since
            // faer reads a transposed (row-major) view's other triangle.
            let mut t = vec![T::zero(); n * n];
            for j in 0..n {
                for i in j..n {
                    t[i + j * n] = a[j + i * lda];
                }
            }
            let outcome = llt_lower(&mut t, n, n);
            for j in 0..n {
                for i in j..n {
                    a[j + i * lda] = t[i + j * n];
                }
            }
            outcome
        }
    }
}

/// Cholesky of the lower triangle of a column-major matrix; the strict upper triangle is
/// left as it was.
fn llt_lower<T: Scalar>(a: &mut [T], n: usize, lda: usize) -> Result<()> {
    // faer uses the upper triangle as scratch; LAPACK's contract leaves it untouched, so it
    // is saved and restored (O(n²) against the O(n³) factorisation).
    let saved = strict_triangle(a, n, lda, Uplo::Upper, None);
    let req = cholesky_in_place_scratch::<T>(n, Par::Seq, Default::default());
    let mut mem = MemBuffer::new(req);
    let stack = MemStack::new(&mut mem);
    let outcome = cholesky_in_place(
        view_mut(a, n, n, lda),
        LltRegularization::default(),
        Par::Seq,
        stack,
        Default::default(),
    );
    strict_triangle(a, n, lda, Uplo::Upper, Some(&saved));
    match outcome {
        Ok(_) => Ok(()),
        Err(LltError::NonPositivePivot { index }) => {
            Err(DevicesError::NotPositiveDefinite { column: index })
        }
    }
}

/// Copies out (`restore = None`) or writes back the strict `uplo` triangle of the n×n matrix.
fn strict_triangle<T: Scalar>(
    a: &mut [T],
    n: usize,
    lda: usize,
    uplo: Uplo,
    restore: Option<&[T]>,
) -> Vec<T> {
    let mut saved = Vec::new();
    let mut pos = 0;
    for j in 0..n {
        let rows = match uplo {
            Uplo::Lower => j + 1..n,
            Uplo::Upper => 0..j,
        };
        let col = &mut a[j * lda + rows.start..j * lda + rows.end];
        match restore {
            None => saved.extend_from_slice(col),
            Some(src) => {
                col.copy_from_slice(&src[pos..pos + col.len()]);
                pos += col.len();
            }
        }
    }
    saved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn check_gemm<T: Scalar>(seed: u64) {
        let mut r = rng(seed);
        let (m, n, k) = (37, 23, 19);
        for ta in TRANS {
            for tb in TRANS {
                for beta in [0.0, 0.5, 1.0] {
                    let (ar, ac) = args::stored(ta, m, k);
                    let (br, bc) = args::stored(tb, k, n);
                    let (lda, ldb, ldc) = (ar + 3, br + 1, m + 2);
                    let a: Vec<T> = random(&mut r, lda * ac);
                    let b: Vec<T> = random(&mut r, ldb * bc);
                    let mut c: Vec<T> = random(&mut r, ldc * n);
                    if beta == 0.0 {
                        c[0] = T::from_f64(f64::NAN); // must not be read
                    }
                    let mut want = to_f64(&c);
                    let alpha = -1.25;
                    ref_gemm(
                        ta,
                        tb,
                        m,
                        n,
                        k,
                        alpha,
                        &to_f64(&a),
                        lda,
                        &to_f64(&b),
                        ldb,
                        beta,
                        &mut want,
                        ldc,
                    );
                    gemm(
                        ta,
                        tb,
                        m,
                        n,
                        k,
                        T::from_f64(alpha),
                        &a,
                        lda,
                        &b,
                        ldb,
                        T::from_f64(beta),
                        &mut c,
                        ldc,
                    )
                    .expect("valid gemm");
                    let err = rel_err(&to_f64(&c), &want);
                    assert!(
                        err < tol(T::ELEM),
                        "gemm {ta:?} {tb:?} beta {beta} {}: {err}",
                        T::ELEM
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_matches_reference_all_transposes() {
        check_gemm::<f64>(1);
        check_gemm::<f32>(2);
    }

    fn check_syrk<T: Scalar>(seed: u64) {
        let mut r = rng(seed);
        let (n, k) = (29, 17);
        for uplo in UPLO {
            for t in TRANS {
                for beta in [0.0, 0.75] {
                    let (ar, ac) = args::stored(t, n, k);
                    let (lda, ldc) = (ar + 2, n + 1);
                    let a: Vec<T> = random(&mut r, lda * ac);
                    let mut c: Vec<T> = random(&mut r, ldc * n);
                    let mut want = to_f64(&c);
                    ref_syrk(uplo, t, n, k, 0.5, &to_f64(&a), lda, beta, &mut want, ldc);
                    syrk(
                        uplo,
                        t,
                        n,
                        k,
                        T::from_f64(0.5),
                        &a,
                        lda,
                        T::from_f64(beta),
                        &mut c,
                        ldc,
                    )
                    .expect("valid syrk");
                    // The other triangle (and the padding) is untouched, so the whole
                    // buffer must match the reference, which only writes the triangle.
                    let err = rel_err(&to_f64(&c), &want);
                    assert!(err < tol(T::ELEM), "syrk {uplo:?} {t:?} {}: {err}", T::ELEM);
                }
            }
        }
    }

    #[test]
    fn syrk_updates_only_its_triangle() {
        check_syrk::<f64>(3);
        check_syrk::<f32>(4);
    }

    fn check_trsm<T: Scalar>(seed: u64) {
        let mut r = rng(seed);
        let (m, n) = (21, 13);
        for side in SIDE {
            for uplo in UPLO {
                for t in TRANS {
                    for diag in DIAG {
                        let na = if side == Side::Left { m } else { n };
                        let lda = na + 2;
                        let ldb = m + 3;
                        let a: Vec<T> = triangular(&mut r, na, lda);
                        let b0: Vec<T> = random(&mut r, ldb * n);
                        let mut b = b0.clone();
                        let alpha = 1.5;
                        trsm(
                            side,
                            uplo,
                            t,
                            diag,
                            m,
                            n,
                            T::from_f64(alpha),
                            &a,
                            lda,
                            &mut b,
                            ldb,
                        )
                        .expect("valid trsm");
                        // op(A) X (or X op(A)) must give back alpha B.
                        let got = ref_tri_apply(
                            side,
                            uplo,
                            t,
                            diag,
                            m,
                            n,
                            &to_f64(&a),
                            lda,
                            &to_f64(&b),
                            ldb,
                        );
                        let want: Vec<f64> = (0..n)
                            .flat_map(|j| (0..m).map(move |i| (i, j)))
                            .map(|(i, j)| alpha * b0[i + j * ldb].to_f64())
                            .collect();
                        let err = rel_err(&got, &want);
                        assert!(
                            err < tol(T::ELEM),
                            "trsm {side:?} {uplo:?} {t:?} {diag:?} {}: {err}",
                            T::ELEM
                        );
                        // Padding rows of B are untouched.
                        for j in 0..n {
                            for i in m..ldb {
                                assert_eq!(b[i + j * ldb], b0[i + j * ldb]);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn trsm_solves_every_side_uplo_trans_diag() {
        check_trsm::<f64>(5);
        check_trsm::<f32>(6);
    }

    /// ‖L Lᵀ − A‖ / ‖A‖ over the whole matrix, L read from the `uplo` triangle.
    pub(crate) fn llt_residual(uplo: Uplo, n: usize, f: &[f64], lda: usize, a: &[f64]) -> f64 {
        let l = |i: usize, j: usize| -> f64 {
            match uplo {
                Uplo::Lower if i >= j => f[i + j * lda],
                Uplo::Upper if i >= j => f[j + i * lda], // L = Uᵀ
                _ => 0.0,
            }
        };
        let mut num = 0.0;
        let mut den = 0.0;
        for j in 0..n {
            for i in 0..n {
                let s: f64 = (0..n).map(|p| l(i, p) * l(j, p)).sum();
                num += (s - a[i + j * n]).powi(2);
                den += a[i + j * n].powi(2);
            }
        }
        (num / den).sqrt()
    }

    fn check_potrf<T: Scalar>(seed: u64) {
        let mut r = rng(seed);
        let n = 45;
        let lda = n + 3;
        let a64 = spd(&mut r, n);
        for uplo in UPLO {
            let mut a: Vec<T> = vec![T::from_f64(7.0); lda * n];
            for j in 0..n {
                for i in 0..n {
                    let inside = match uplo {
                        Uplo::Lower => i >= j,
                        Uplo::Upper => i <= j,
                    };
                    // The other triangle holds garbage the factorisation must not read.
                    a[i + j * lda] = T::from_f64(if inside { a64[i + j * n] } else { -1e30 });
                }
            }
            let before = a.clone();
            potrf(uplo, n, &mut a, lda).expect("SPD matrix");
            let res = llt_residual(uplo, n, &to_f64(&a), lda, &a64);
            let bound = match T::ELEM {
                ElemType::F64 => 1e-13,
                ElemType::F32 => 1e-5,
            };
            assert!(res < bound, "potrf {uplo:?} {}: residual {res}", T::ELEM);
            for j in 0..n {
                for i in 0..lda {
                    let outside = i >= n
                        || match uplo {
                            Uplo::Lower => i < j,
                            Uplo::Upper => i > j,
                        };
                    if outside {
                        assert_eq!(a[i + j * lda], before[i + j * lda], "({i},{j}) written");
                    }
                }
            }
        }
    }

    #[test]
    fn potrf_factors_spd_matrices() {
        check_potrf::<f64>(7);
        check_potrf::<f32>(8);
    }

    #[test]
    fn potrf_reports_the_failing_column() {
        let n = 6;
        for uplo in UPLO {
            let mut a = vec![0.0f64; n * n];
            for j in 0..n {
                a[j + j * n] = if j == 3 { -2.0 } else { 4.0 };
            }
            let err = potrf(uplo, n, &mut a, n).expect_err("not positive definite");
            assert_eq!(err, DevicesError::NotPositiveDefinite { column: 3 });
        }
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let a = vec![0.0f64; 12];
        let b = vec![0.0f64; 12];
        let mut c = vec![0.0f64; 12];
        // lda below the row count.
        let e = gemm(
            Trans::No,
            Trans::No,
            4,
            3,
            3,
            1.0,
            &a,
            3,
            &b,
            3,
            0.0,
            &mut c,
            4,
        );
        assert!(
            matches!(e, Err(DevicesError::BadArgs { op: "gemm", .. })),
            "{e:?}"
        );
        // c too short for 4x4.
        let e = gemm(
            Trans::No,
            Trans::No,
            4,
            4,
            3,
            1.0,
            &a,
            4,
            &b,
            3,
            0.0,
            &mut c,
            4,
        );
        assert!(matches!(e, Err(DevicesError::BadArgs { .. })), "{e:?}");
        let e = syrk(Uplo::Lower, Trans::No, 4, 4, 1.0, &a, 4, 0.0, &mut c, 4);
        assert!(
            matches!(e, Err(DevicesError::BadArgs { op: "syrk", .. })),
            "{e:?}"
        );
        let e = trsm(
            Side::Right,
            Uplo::Lower,
            Trans::Yes,
            Diag::NonUnit,
            3,
            4,
            1.0,
            &a,
            4,
            &mut c,
            2,
        );
        assert!(
            matches!(e, Err(DevicesError::BadArgs { op: "trsm", .. })),
            "{e:?}"
        );
        let e = potrf(Uplo::Lower, 4, &mut c, 4);
        assert!(
            matches!(e, Err(DevicesError::BadArgs { op: "potrf", .. })),
            "{e:?}"
        );
        // Empty problems are fine.
        gemm(
            Trans::No,
            Trans::No,
            0,
            0,
            0,
            1.0,
            &[],
            1,
            &[],
            1,
            0.0,
            &mut [],
            1,
        )
        .expect("empty gemm");
        potrf::<f64>(Uplo::Lower, 0, &mut [], 1).expect("empty potrf");
    }

    /// Right-looking tiled Cholesky over tiles stored separately (as the runtime does):
    /// POTRF on the diagonal, TRSM on the panel, SYRK/GEMM on the trailing matrix.
    #[allow(clippy::needless_range_loop)] // tile indices read more clearly than iterators
    fn tiled_cholesky(n: usize, nb: usize, a: &[f64]) -> Vec<f64> {
        let nt = n.div_ceil(nb);
        let dim = |t: usize| nb.min(n - t * nb);
        // tiles[i][j], i >= j, each dim(i) x dim(j) with ld dim(i).
        let mut tiles: Vec<Vec<Vec<f64>>> = (0..nt)
            .map(|i| {
                (0..=i)
                    .map(|j| {
                        let (r, c) = (dim(i), dim(j));
                        let mut t = vec![0.0; r * c];
                        for jj in 0..c {
                            for ii in 0..r {
                                t[ii + jj * r] = a[(i * nb + ii) + (j * nb + jj) * n];
                            }
                        }
                        t
                    })
                    .collect()
            })
            .collect();
        for k in 0..nt {
            let dk = dim(k);
            potrf(Uplo::Lower, dk, &mut tiles[k][k], dk).expect("SPD");
            let lkk = tiles[k][k].clone();
            for i in k + 1..nt {
                let di = dim(i);
                trsm(
                    Side::Right,
                    Uplo::Lower,
                    Trans::Yes,
                    Diag::NonUnit,
                    di,
                    dk,
                    1.0,
                    &lkk,
                    dk,
                    &mut tiles[i][k],
                    di,
                )
                .expect("panel solve");
            }
            for i in k + 1..nt {
                let di = dim(i);
                let lik = tiles[i][k].clone();
                syrk(
                    Uplo::Lower,
                    Trans::No,
                    di,
                    dk,
                    -1.0,
                    &lik,
                    di,
                    1.0,
                    &mut tiles[i][i],
                    di,
                )
                .expect("syrk");
                for j in k + 1..i {
                    let dj = dim(j);
                    let ljk = tiles[j][k].clone();
                    gemm(
                        Trans::No,
                        Trans::Yes,
                        di,
                        dj,
                        dk,
                        -1.0,
                        &lik,
                        di,
                        &ljk,
                        dj,
                        1.0,
                        &mut tiles[i][j],
                        di,
                    )
                    .expect("gemm");
                }
            }
        }
        let mut l = vec![0.0; n * n];
        for (i, row) in tiles.iter().enumerate() {
            for (j, t) in row.iter().enumerate() {
                let (r, c) = (dim(i), dim(j));
                for jj in 0..c {
                    for ii in 0..r {
                        if i != j || ii >= jj {
                            l[(i * nb + ii) + (j * nb + jj) * n] = t[ii + jj * r];
                        }
                    }
                }
            }
        }
        l
    }

    #[test]
    fn tiled_cholesky_residual_is_tiny() {
        let mut r = rng(9);
        let n = 300; // 4 full tiles of 64 and a partial one of 44
        let a = spd(&mut r, n);
        let l = tiled_cholesky(n, 64, &a);
        let res = llt_residual(Uplo::Lower, n, &l, n, &a);
        assert!(res < 1e-12, "tiled Cholesky residual {res}");
    }

    /// Single-core throughput of the kernels on 512 tiles; run with
    /// `cargo test --release -p flotilla-devices -- --ignored --nocapture kernel_throughput`.
    #[test]
    #[ignore = "timing, not a check"]
    fn kernel_throughput() {
        let nb = 512;
        let mut r = rng(10);
        let a: Vec<f64> = random(&mut r, nb * nb);
        let b: Vec<f64> = random(&mut r, nb * nb);
        let mut c: Vec<f64> = random(&mut r, nb * nb);
        let spd_tile = spd(&mut r, nb);
        let time = |name: &str, flops: f64, f: &mut dyn FnMut()| {
            f();
            let reps = 5;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f();
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!("{name}: {:.1} GFLOP/s ({:.2} ms)", flops / s / 1e9, s * 1e3);
        };
        let n3 = (nb * nb * nb) as f64;
        time("dgemm NT 512", 2.0 * n3, &mut || {
            gemm(
                Trans::No,
                Trans::Yes,
                nb,
                nb,
                nb,
                -1.0,
                &a,
                nb,
                &b,
                nb,
                1.0,
                &mut c,
                nb,
            )
            .expect("gemm");
        });
        time("dsyrk LN 512", n3, &mut || {
            syrk(
                Uplo::Lower,
                Trans::No,
                nb,
                nb,
                -1.0,
                &a,
                nb,
                1.0,
                &mut c,
                nb,
            )
            .expect("syrk");
        });
        let mut l = spd_tile.clone();
        potrf(Uplo::Lower, nb, &mut l, nb).expect("spd");
        time("dtrsm RLTN 512", n3, &mut || {
            let mut x = b.clone();
            trsm(
                Side::Right,
                Uplo::Lower,
                Trans::Yes,
                Diag::NonUnit,
                nb,
                nb,
                1.0,
                &l,
                nb,
                &mut x,
                nb,
            )
            .expect("trsm");
        });
        time("dpotrf L 512", n3 / 3.0, &mut || {
            let mut x = spd_tile.clone();
            potrf(Uplo::Lower, nb, &mut x, nb).expect("spd");
        });
    }
}
