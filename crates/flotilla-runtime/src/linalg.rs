//! Tiled dense linear algebra on the runtime: tiled matrices, Cholesky and GEMM.
//!
//! Each tile is its own piece of registered data (column-major, leading dimension = tile
//! size), so the runtime's dependency inference derives the tiled algorithms' DAGs from the
//! plain sequential loops below, and each tile can live on whichever memory node last
//! used it. Every kernel codelet has CPU (faer), OpenCL and CUDA (cuBLAS/cuSOLVER)
//! implementations; the policy picks per task.
//!
//! Precision is chosen per codelet: f64, f32, or f32 storage with the matrix products in a
//! mixed mode ([`MathMode::Tf32`], [`MathMode::Bf16`]: inputs rounded, f32 accumulation;
//! [`Kernels::mixed`]). A mixed Cholesky keeps the panel (potrf, trsm) in f32 and runs the
//! trailing updates (syrk, gemm), nearly all of the flops, in the mixed mode; the caller
//! measures the residual, as `flotilla bench` always does.

use std::sync::Arc;

use flotilla_devices::cpu::kernels::{self, Scalar};
use flotilla_devices::{Diag, MathMode, Side, Trans, Uplo};

use crate::data::Data;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::task::{Codelet, TaskError};

/// An element type the tiled algorithms work on (`f32` or `f64`).
pub trait Element: Scalar + bytemuck::Pod + Send + Sync + 'static {}
impl Element for f32 {}
impl Element for f64 {}

/// A square matrix split into `nt × nt` square tiles of `tile × tile` elements, each tile
/// registered with the runtime.
pub struct TiledMatrix<T> {
    n: usize,
    tile: usize,
    nt: usize,
    tiles: Vec<Data<Vec<T>>>,
}

impl<T: Element> TiledMatrix<T> {
    /// Splits the column-major `n × n` matrix `a` into tiles and registers them.
    pub fn from_dense(rt: &Runtime, a: &[T], n: usize, tile: usize) -> Result<Self> {
        if tile == 0 {
            return Err(RuntimeError::Config(
                "a tile size of 0: tiles hold at least one \
                 element (e.g. 256 or 512 on CPUs)"
                    .into(),
            ));
        }
        if !n.is_multiple_of(tile) {
            return Err(RuntimeError::Config(format!(
                "matrix size {n} is not a multiple of the tile size {tile}"
            )));
        }
        if a.len() != n * n {
            return Err(RuntimeError::Config(format!(
                "matrix of size {n} needs {} elements, got {}",
                n * n,
                a.len()
            )));
        }
        let nt = n / tile;
        let mut tiles = Vec::with_capacity(nt * nt);
        // Tile (i, j) is at index j * nt + i (column-major order of tiles).
        for tj in 0..nt {
            for ti in 0..nt {
                let mut t = Vec::with_capacity(tile * tile);
                for c in 0..tile {
                    let col = (tj * tile + c) * n + ti * tile;
                    t.extend_from_slice(&a[col..col + tile]);
                }
                tiles.push(rt.register(t));
            }
        }
        Ok(Self { n, tile, nt, tiles })
    }

    /// The matrix size.
    pub fn n(&self) -> usize {
        self.n
    }
    /// The tile size.
    pub fn tile_size(&self) -> usize {
        self.tile
    }
    /// Tiles per dimension.
    pub fn tiles_per_dim(&self) -> usize {
        self.nt
    }
    /// The tile at tile row `i`, tile column `j`.
    pub fn tile(&self, i: usize, j: usize) -> &Data<Vec<T>> {
        &self.tiles[j * self.nt + i]
    }

    /// Waits for the tasks using the tiles, brings them home and reassembles the dense
    /// column-major matrix.
    pub fn into_dense(self, rt: &Runtime) -> Result<Vec<T>> {
        let (n, tile, nt) = (self.n, self.tile, self.nt);
        let mut a = vec![T::from_f64(0.0); n * n];
        for (idx, t) in self.tiles.into_iter().enumerate() {
            let (tj, ti) = (idx / nt, idx % nt);
            let v = match rt.unregister(t) {
                Ok(v) => v,
                // A tile whose task failed: the failure itself says more (a matrix that is
                // not positive definite, a device error) than that the tile is stale.
                Err(e @ crate::RuntimeError::Poisoned { .. }) => {
                    rt.wait_all()?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            for c in 0..tile {
                let col = (tj * tile + c) * n + ti * tile;
                a[col..col + tile].copy_from_slice(&v[c * tile..(c + 1) * tile]);
            }
        }
        Ok(a)
    }
}

fn prec<T: Element>() -> &'static str {
    match T::ELEM {
        flotilla_devices::ElemType::F32 => "f32",
        flotilla_devices::ElemType::F64 => "f64",
    }
}

/// The four Cholesky kernels and GEMM as codelets for tiles of size `b`.
pub struct Kernels {
    /// `A := chol(A)` (lower).
    pub potrf: Arc<Codelet>,
    /// `B := B · L⁻ᵀ` with `L` lower (reads `L`, updates `B`).
    pub trsm: Arc<Codelet>,
    /// `C := C − A·Aᵀ` on the lower triangle (reads `A`, updates `C`).
    pub syrk: Arc<Codelet>,
    /// `C := C − A·Bᵀ` (reads `A`, `B`, updates `C`).
    pub gemm_nt: Arc<Codelet>,
    /// `C := C + A·B` (reads `A`, `B`, updates `C`).
    pub gemm_nn: Arc<Codelet>,
}

fn task_err(e: flotilla_devices::DevicesError) -> TaskError {
    TaskError(e.to_string())
}

impl Kernels {
    /// Codelets for `b × b` tiles of `T`, with every implementation the devices crate has.
    pub fn new<T: Element>(b: usize) -> Self {
        let p = prec::<T>();
        let e = T::ELEM;
        let fp = move |_: &[usize]| b as u64;
        let one = T::from_f64(1.0);
        let minus = T::from_f64(-1.0);
        let potrf = Codelet::new(format!("potrf_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                kernels::potrf(Uplo::Lower, b, ctx.data_mut::<T>(0), b).map_err(task_err)
            })
            .opencl(move |ctx| {
                ctx.device()
                    .potrf(e, Uplo::Lower, b, ctx.buffer(0), b)
                    .map_err(task_err)
            })
            .cuda(move |ctx| {
                ctx.device()
                    .potrf(e, Uplo::Lower, b, ctx.buffer(0), b)
                    .map_err(task_err)
            });
        let trsm = Codelet::new(format!("trsm_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                kernels::trsm(
                    Side::Right,
                    Uplo::Lower,
                    Trans::Yes,
                    Diag::NonUnit,
                    b,
                    b,
                    one,
                    ctx.data::<T>(0),
                    b,
                    ctx.data_mut::<T>(1),
                    b,
                )
                .map_err(task_err)
            })
            .opencl(move |ctx| trsm_dev(ctx, e, b))
            .cuda(move |ctx| trsm_dev(ctx, e, b));
        let syrk = Codelet::new(format!("syrk_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                kernels::syrk(
                    Uplo::Lower,
                    Trans::No,
                    b,
                    b,
                    minus,
                    ctx.data::<T>(0),
                    b,
                    one,
                    ctx.data_mut::<T>(1),
                    b,
                )
                .map_err(task_err)
            })
            .opencl(move |ctx| syrk_dev(ctx, e, b))
            .cuda(move |ctx| syrk_dev(ctx, e, b));
        let gemm_nt = Codelet::new(format!("gemm_nt_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                kernels::gemm(
                    Trans::No,
                    Trans::Yes,
                    b,
                    b,
                    b,
                    minus,
                    ctx.data::<T>(0),
                    b,
                    ctx.data::<T>(1),
                    b,
                    one,
                    ctx.data_mut::<T>(2),
                    b,
                )
                .map_err(task_err)
            })
            .opencl(move |ctx| gemm_dev(ctx, e, b, Trans::Yes, -1.0))
            .cuda(move |ctx| gemm_dev(ctx, e, b, Trans::Yes, -1.0));
        let gemm_nn = Codelet::new(format!("gemm_nn_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                kernels::gemm(
                    Trans::No,
                    Trans::No,
                    b,
                    b,
                    b,
                    one,
                    ctx.data::<T>(0),
                    b,
                    ctx.data::<T>(1),
                    b,
                    one,
                    ctx.data_mut::<T>(2),
                    b,
                )
                .map_err(task_err)
            })
            .opencl(move |ctx| gemm_dev(ctx, e, b, Trans::No, 1.0))
            .cuda(move |ctx| gemm_dev(ctx, e, b, Trans::No, 1.0));
        Self {
            potrf: Arc::new(potrf),
            trsm: Arc::new(trsm),
            syrk: Arc::new(syrk),
            gemm_nt: Arc::new(gemm_nt),
            gemm_nn: Arc::new(gemm_nn),
        }
    }
}

impl Kernels {
    /// Codelets for `b × b` f32 tiles whose matrix products (gemm and the syrk update, run
    /// as a gemm of the whole tile) read their inputs in `mode`; potrf and trsm stay f32.
    /// The codelets are named after the mode (`gemm_nn_bf16`, ...), so their performance
    /// history is their own. `MathMode::F32` gives the same kernels as `new::<f32>`.
    pub fn mixed(b: usize, mode: MathMode) -> Self {
        let base = Self::new::<f32>(b);
        if mode == MathMode::F32 {
            return base;
        }
        let p = mode.as_str();
        let fp = move |_: &[usize]| b as u64;
        // syrk's update C := C − A·Aᵀ as a mixed gemm of the whole tile (the upper half of
        // a diagonal tile is never read by the lower Cholesky).
        let syrk = Codelet::new(format!("syrk_{p}"))
            .footprint(fp)
            .cpu(move |ctx| {
                let a = ctx.data::<f32>(0);
                kernels::gemm_mixed(
                    mode,
                    Trans::No,
                    Trans::Yes,
                    b,
                    b,
                    b,
                    -1.0,
                    a,
                    b,
                    a,
                    b,
                    1.0,
                    ctx.data_mut::<f32>(1),
                    b,
                )
                .map_err(task_err)
            })
            .opencl(move |ctx| syrk_mixed_dev(ctx, mode, b))
            .cuda(move |ctx| syrk_mixed_dev(ctx, mode, b));
        let gemm = |name: &str, tb: Trans, alpha: f32| {
            Codelet::new(format!("{name}_{p}"))
                .footprint(fp)
                .cpu(move |ctx| {
                    kernels::gemm_mixed(
                        mode,
                        Trans::No,
                        tb,
                        b,
                        b,
                        b,
                        alpha,
                        ctx.data::<f32>(0),
                        b,
                        ctx.data::<f32>(1),
                        b,
                        1.0,
                        ctx.data_mut::<f32>(2),
                        b,
                    )
                    .map_err(task_err)
                })
                .opencl(move |ctx| gemm_mixed_dev(ctx, mode, b, tb, f64::from(alpha)))
                .cuda(move |ctx| gemm_mixed_dev(ctx, mode, b, tb, f64::from(alpha)))
        };
        Self {
            potrf: base.potrf,
            trsm: base.trsm,
            syrk: Arc::new(syrk),
            gemm_nt: Arc::new(gemm("gemm_nt", Trans::Yes, -1.0)),
            gemm_nn: Arc::new(gemm("gemm_nn", Trans::No, 1.0)),
        }
    }
}

fn syrk_mixed_dev(
    ctx: &crate::TaskContext<'_>,
    mode: MathMode,
    b: usize,
) -> std::result::Result<(), TaskError> {
    ctx.device()
        .gemm_mixed(
            mode,
            Trans::No,
            Trans::Yes,
            b,
            b,
            b,
            -1.0,
            ctx.buffer(0),
            b,
            ctx.buffer(0),
            b,
            1.0,
            ctx.buffer(1),
            b,
        )
        .map_err(task_err)
}

fn gemm_mixed_dev(
    ctx: &crate::TaskContext<'_>,
    mode: MathMode,
    b: usize,
    tb: Trans,
    alpha: f64,
) -> std::result::Result<(), TaskError> {
    ctx.device()
        .gemm_mixed(
            mode,
            Trans::No,
            tb,
            b,
            b,
            b,
            alpha,
            ctx.buffer(0),
            b,
            ctx.buffer(1),
            b,
            1.0,
            ctx.buffer(2),
            b,
        )
        .map_err(task_err)
}

fn trsm_dev(
    ctx: &crate::TaskContext<'_>,
    e: flotilla_devices::ElemType,
    b: usize,
) -> std::result::Result<(), TaskError> {
    ctx.device()
        .trsm(
            e,
            Side::Right,
            Uplo::Lower,
            Trans::Yes,
            Diag::NonUnit,
            b,
            b,
            1.0,
            ctx.buffer(0),
            b,
            ctx.buffer(1),
            b,
        )
        .map_err(task_err)
}

fn syrk_dev(
    ctx: &crate::TaskContext<'_>,
    e: flotilla_devices::ElemType,
    b: usize,
) -> std::result::Result<(), TaskError> {
    ctx.device()
        .syrk(
            e,
            Uplo::Lower,
            Trans::No,
            b,
            b,
            -1.0,
            ctx.buffer(0),
            b,
            1.0,
            ctx.buffer(1),
            b,
        )
        .map_err(task_err)
}

fn gemm_dev(
    ctx: &crate::TaskContext<'_>,
    e: flotilla_devices::ElemType,
    b: usize,
    tb: Trans,
    alpha: f64,
) -> std::result::Result<(), TaskError> {
    ctx.device()
        .gemm(
            e,
            Trans::No,
            tb,
            b,
            b,
            b,
            alpha,
            ctx.buffer(0),
            b,
            ctx.buffer(1),
            b,
            1.0,
            ctx.buffer(2),
            b,
        )
        .map_err(task_err)
}

/// Submits the tiled right-looking Cholesky factorization `A = L·Lᵀ` of `a` (lower
/// triangle) and returns without waiting. Priorities follow the critical path: the
/// panel of step k outranks the trailing updates.
pub fn cholesky<T: Element>(rt: &Runtime, a: &TiledMatrix<T>) -> Result<()> {
    cholesky_with(rt, a, &Kernels::new::<T>(a.tile))
}

/// [`cholesky`] of f32 tiles with the trailing updates in `mode` ([`Kernels::mixed`]).
pub fn cholesky_mixed(rt: &Runtime, a: &TiledMatrix<f32>, mode: MathMode) -> Result<()> {
    cholesky_with(rt, a, &Kernels::mixed(a.tile, mode))
}

fn cholesky_with<T: Element>(rt: &Runtime, a: &TiledMatrix<T>, k: &Kernels) -> Result<()> {
    let nt = a.nt as i32;
    for s in 0..a.nt {
        let si = s as i32;
        rt.task(&k.potrf)
            .rw(a.tile(s, s))
            .priority(3 * (nt - si))
            .submit()?;
        for i in s + 1..a.nt {
            rt.task(&k.trsm)
                .read(a.tile(s, s))
                .rw(a.tile(i, s))
                .priority(3 * (nt - si) - 1)
                .submit()?;
        }
        for i in s + 1..a.nt {
            rt.task(&k.syrk)
                .read(a.tile(i, s))
                .rw(a.tile(i, i))
                .priority(3 * (nt - si) - 2)
                .submit()?;
            for j in s + 1..i {
                rt.task(&k.gemm_nt)
                    .read(a.tile(i, s))
                    .read(a.tile(j, s))
                    .rw(a.tile(i, j))
                    .priority(3 * (nt - si) - 3)
                    .submit()?;
            }
        }
    }
    Ok(())
}

/// Submits `C += A·B` on tiled matrices of the same shape and returns without waiting.
pub fn gemm<T: Element>(
    rt: &Runtime,
    a: &TiledMatrix<T>,
    b: &TiledMatrix<T>,
    c: &TiledMatrix<T>,
) -> Result<()> {
    gemm_with(rt, a, b, c, &Kernels::new::<T>(a.tile))
}

/// [`gemm`] of f32 tiles with the products in `mode` ([`Kernels::mixed`]).
pub fn gemm_mixed(
    rt: &Runtime,
    a: &TiledMatrix<f32>,
    b: &TiledMatrix<f32>,
    c: &TiledMatrix<f32>,
    mode: MathMode,
) -> Result<()> {
    gemm_with(rt, a, b, c, &Kernels::mixed(a.tile, mode))
}

fn gemm_with<T: Element>(
    rt: &Runtime,
    a: &TiledMatrix<T>,
    b: &TiledMatrix<T>,
    c: &TiledMatrix<T>,
    k: &Kernels,
) -> Result<()> {
    if a.n != b.n || a.n != c.n || a.tile != b.tile || a.tile != c.tile {
        return Err(RuntimeError::Config(
            "gemm: the three matrices must have the same size and tiles".into(),
        ));
    }
    for i in 0..a.nt {
        for j in 0..a.nt {
            for l in 0..a.nt {
                rt.task(&k.gemm_nn)
                    .read(a.tile(i, l))
                    .read(b.tile(l, j))
                    .rw(c.tile(i, j))
                    .submit()?;
            }
        }
    }
    Ok(())
}

/// `‖L·Lᵀ − A‖_F / ‖A‖_F` for the lower factor `l` of `a` (both dense, column-major).
pub fn cholesky_residual<T: Element>(a: &[T], l: &[T], n: usize) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for j in 0..n {
        for i in j..n {
            let mut s = 0.0f64;
            for k in 0..=j {
                s += l[k * n + i].to_f64() * l[k * n + j].to_f64();
            }
            let aij = a[j * n + i].to_f64();
            let w = if i == j { 1.0 } else { 2.0 };
            num += w * (s - aij) * (s - aij);
            den += w * aij * aij;
        }
    }
    (num / den).sqrt()
}
