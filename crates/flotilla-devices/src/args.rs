//! Argument checks shared by every backend: each matrix operand must fit its slice or buffer.
//! Lengths are in elements.

use crate::{DevicesError, ElemType, MathMode, Result, Side, Trans};

/// Mixed modes apply to f32 products only.
pub(crate) fn gemm_mode(e: ElemType, mode: MathMode) -> Result<()> {
    if e == ElemType::F64 && mode != MathMode::F32 {
        return Err(DevicesError::bad_args(
            "gemm",
            format!("math mode {mode} is for f32 products, not f64"),
        ));
    }
    Ok(())
}

/// Checks that a `rows`×`cols` column-major matrix with leading dimension `ld` fits in `len`
/// elements, and that `ld ≥ max(1, rows)` (so columns never overlap).
pub(crate) fn matrix(
    op: &'static str,
    name: &str,
    rows: usize,
    cols: usize,
    ld: usize,
    len: usize,
) -> Result<()> {
    if ld < rows.max(1) {
        return Err(DevicesError::bad_args(
            op,
            format!("ld{name} = {ld} is less than max(1, rows = {rows})"),
        ));
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let needed = (cols - 1)
        .checked_mul(ld)
        .and_then(|x| x.checked_add(rows))
        .ok_or_else(|| {
            DevicesError::bad_args(op, format!("{name}: {rows}x{cols} with ld {ld} overflows"))
        })?;
    if needed > len {
        return Err(DevicesError::bad_args(
            op,
            format!("{name}: {rows}x{cols} with ld {ld} needs {needed} elements, only {len} given"),
        ));
    }
    Ok(())
}

/// Rows and columns of `op(X)`'s storage when `op(X)` is `rows`×`cols`.
pub(crate) fn stored(t: Trans, rows: usize, cols: usize) -> (usize, usize) {
    match t {
        Trans::No => (rows, cols),
        Trans::Yes => (cols, rows),
    }
}

/// Checks the operands of `gemm`; lengths in elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
    (lda, la): (usize, usize),
    (ldb, lb): (usize, usize),
    (ldc, lc): (usize, usize),
) -> Result<()> {
    let (ar, ac) = stored(ta, m, k);
    let (br, bc) = stored(tb, k, n);
    matrix("gemm", "a", ar, ac, lda, la)?;
    matrix("gemm", "b", br, bc, ldb, lb)?;
    matrix("gemm", "c", m, n, ldc, lc)
}

/// Checks the operands of `syrk`; lengths in elements.
pub(crate) fn syrk(
    t: Trans,
    n: usize,
    k: usize,
    (lda, la): (usize, usize),
    (ldc, lc): (usize, usize),
) -> Result<()> {
    let (ar, ac) = stored(t, n, k);
    matrix("syrk", "a", ar, ac, lda, la)?;
    matrix("syrk", "c", n, n, ldc, lc)
}

/// Checks the operands of `trsm`; lengths in elements.
pub(crate) fn trsm(
    side: Side,
    m: usize,
    n: usize,
    (lda, la): (usize, usize),
    (ldb, lb): (usize, usize),
) -> Result<()> {
    let na = match side {
        Side::Left => m,
        Side::Right => n,
    };
    matrix("trsm", "a", na, na, lda, la)?;
    matrix("trsm", "b", m, n, ldb, lb)
}

/// Checks the operand of `potrf`; length in elements.
pub(crate) fn potrf(n: usize, lda: usize, la: usize) -> Result<()> {
    matrix("potrf", "a", n, n, lda, la)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_checks_ld_and_length() {
        assert!(matrix("t", "a", 3, 2, 3, 6).is_ok());
        assert!(matrix("t", "a", 3, 2, 4, 7).is_ok());
        assert!(matrix("t", "a", 3, 2, 4, 6).is_err());
        assert!(matrix("t", "a", 3, 2, 2, 100).is_err());
        assert!(matrix("t", "a", 0, 5, 0, 0).is_err());
        assert!(matrix("t", "a", 0, 5, 1, 0).is_ok());
        assert!(matrix("t", "a", 2, usize::MAX, usize::MAX, usize::MAX).is_err());
    }

    #[test]
    fn gemm_uses_transposed_shapes() {
        // op(A) = Aᵀ is 2x3 so A is stored 3x2 with lda ≥ 3.
        assert!(gemm(Trans::Yes, Trans::No, 2, 1, 3, (3, 6), (3, 3), (2, 2)).is_ok());
        assert!(gemm(Trans::Yes, Trans::No, 2, 1, 3, (2, 6), (3, 3), (2, 2)).is_err());
    }
}
