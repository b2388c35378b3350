//! Element types and reduction kernels.
//!
//! The kernels are plain zipped slice loops over a monomorphised closure, which LLVM
//! vectorises (checked for `f32` sums: packed `addps`).

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Product (wrapping for integers).
    Prod,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for half::bf16 {}
}

/// An element type the collectives can move and reduce: `f32`, `f64`, `i32`, `i64` and
/// [`half::bf16`] (re-exported as [`crate::bf16`]; each pairwise operation is computed in `f32`
/// and rounded back to bf16, as NCCL does).
///
/// The trait is sealed; its methods are internal kernels.
pub trait Element: bytemuck::Pod + Send + Sync + 'static + sealed::Sealed {
    /// `dst[i] = dst[i] op src[i]` (or `src[i] op dst[i]` when `src_left`).
    #[doc(hidden)]
    fn combine(dst: &mut [Self], src: &[Self], op: ReduceOp, src_left: bool);
    /// `dst[i] = a[i] op b[i]`.
    #[doc(hidden)]
    fn combine_to(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp);
    /// A value made from a small integer (for benchmarks and tests).
    #[doc(hidden)]
    fn from_i32(v: i32) -> Self;
}

#[inline(always)]
fn zip_apply<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn zip_apply_rev<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*s, *d);
    }
}

#[inline(always)]
fn zip_apply_to<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

macro_rules! element_impl {
    ($t:ty, $add:expr, $mul:expr, $min:expr, $max:expr, $from:expr) => {
        impl Element for $t {
            fn combine(dst: &mut [Self], src: &[Self], op: ReduceOp, src_left: bool) {
                debug_assert_eq!(dst.len(), src.len());
                match (op, src_left) {
                    (ReduceOp::Sum, false) => zip_apply(dst, src, $add),
                    (ReduceOp::Sum, true) => zip_apply_rev(dst, src, $add),
                    (ReduceOp::Prod, false) => zip_apply(dst, src, $mul),
                    (ReduceOp::Prod, true) => zip_apply_rev(dst, src, $mul),
                    (ReduceOp::Min, false) => zip_apply(dst, src, $min),
                    (ReduceOp::Min, true) => zip_apply_rev(dst, src, $min),
                    (ReduceOp::Max, false) => zip_apply(dst, src, $max),
                    (ReduceOp::Max, true) => zip_apply_rev(dst, src, $max),
                }
            }
            fn combine_to(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
                debug_assert!(dst.len() == a.len() && dst.len() == b.len());
                match op {
                    ReduceOp::Sum => zip_apply_to(dst, a, b, $add),
                    ReduceOp::Prod => zip_apply_to(dst, a, b, $mul),
                    ReduceOp::Min => zip_apply_to(dst, a, b, $min),
                    ReduceOp::Max => zip_apply_to(dst, a, b, $max),
                }
            }
            fn from_i32(v: i32) -> Self {
                $from(v)
            }
        }
    };
}

element_impl!(
    f32,
    |a: f32, b: f32| a + b,
    |a: f32, b: f32| a * b,
    |a: f32, b: f32| a.min(b),
    |a: f32, b: f32| a.max(b),
    |v: i32| v as f32
);
element_impl!(
    f64,
    |a: f64, b: f64| a + b,
    |a: f64, b: f64| a * b,
    |a: f64, b: f64| a.min(b),
    |a: f64, b: f64| a.max(b),
    f64::from
);
element_impl!(
    i32,
    |a: i32, b: i32| a.wrapping_add(b),
    |a: i32, b: i32| a.wrapping_mul(b),
    |a: i32, b: i32| a.min(b),
    |a: i32, b: i32| a.max(b),
    |v: i32| v
);
element_impl!(
    i64,
    |a: i64, b: i64| a.wrapping_add(b),
    |a: i64, b: i64| a.wrapping_mul(b),
    |a: i64, b: i64| a.min(b),
    |a: i64, b: i64| a.max(b),
    i64::from
);

element_impl!(
    half::bf16,
    |a: half::bf16, b: half::bf16| half::bf16::from_f32(a.to_f32() + b.to_f32()),
    |a: half::bf16, b: half::bf16| half::bf16::from_f32(a.to_f32() * b.to_f32()),
    |a: half::bf16, b: half::bf16| if b.to_f32() < a.to_f32() { b } else { a },
    |a: half::bf16, b: half::bf16| if b.to_f32() > a.to_f32() { b } else { a },
    |v: i32| half::bf16::from_f32(v as f32)
);

/// `dst = srcs(0) op srcs(1) op ... op srcs(n-1)`, strictly left to right (rank order).
pub(crate) fn reduce_rank_order<'a, T: Element>(
    dst: &mut [T],
    n: usize,
    op: ReduceOp,
    mut src: impl FnMut(usize) -> &'a [T],
) {
    match n {
        0 => {}
        1 => dst.copy_from_slice(src(0)),
        _ => {
            let a = src(0);
            let b = src(1);
            T::combine_to(dst, a, b, op);
            for i in 2..n {
                T::combine(dst, src(i), op, false);
            }
        }
    }
}

/// Splits `len` elements into `n` nearly equal blocks; block `i` is `ranges[i]`.
pub(crate) fn partition(len: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    (0..n).map(|i| (i * len / n)..((i + 1) * len / n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_matches_scalar_ops() {
        let a = [1.5f32, -2.0, 3.0, 0.25];
        let b = [2.0f32, 5.0, -1.0, 4.0];
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let mut d = a;
            f32::combine(&mut d, &b, op, false);
            let mut e = [0.0f32; 4];
            f32::combine_to(&mut e, &a, &b, op);
            for i in 0..4 {
                let want = match op {
                    ReduceOp::Sum => a[i] + b[i],
                    ReduceOp::Prod => a[i] * b[i],
                    ReduceOp::Min => a[i].min(b[i]),
                    ReduceOp::Max => a[i].max(b[i]),
                };
                assert_eq!(d[i], want);
                assert_eq!(e[i], want);
            }
        }
    }

    #[test]
    fn integer_ops_wrap() {
        let mut d = [i32::MAX, i64::MAX as i32];
        i32::combine(&mut d, &[1, 2], ReduceOp::Sum, false);
        assert_eq!(d[0], i32::MIN);
        let mut p = [i64::MAX];
        i64::combine(&mut p, &[2], ReduceOp::Prod, true);
        assert_eq!(p[0], i64::MAX.wrapping_mul(2));
    }

    #[test]
    fn rank_order_reduction_is_left_to_right() {
        let xs = [vec![1e8f32], vec![1.0f32], vec![-1e8f32], vec![1.0f32]];
        let mut d = [0.0f32];
        reduce_rank_order(&mut d, 4, ReduceOp::Sum, |i| &xs[i]);
        assert_eq!(d[0], ((1e8f32 + 1.0) + -1e8) + 1.0);
    }

    #[test]
    fn partition_covers_everything() {
        for len in 0..20 {
            for n in 1..6 {
                let p = partition(len, n);
                assert_eq!(p.len(), n);
                assert_eq!(p[0].start, 0);
                assert_eq!(p[n - 1].end, len);
                for w in p.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len().abs_diff(w[1].len()) <= 1);
                }
            }
        }
    }
}
