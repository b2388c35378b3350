//! `flotilla bench cholesky` and `flotilla bench gemm`: tiled dense linear algebra through
//! the runtime on the chosen devices, with the accuracy of the result.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use flotilla_devices::MathMode;
use flotilla_runtime::linalg::{
    cholesky, cholesky_mixed, gemm, gemm_mixed, Element, Kernels, TiledMatrix,
};
use flotilla_runtime::{DeviceSelection, PolicyKind, Runtime, RuntimeError};

/// The element type, and for f32 how the matrix products read their inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Single precision.
    F32,
    /// Double precision.
    F64,
    /// f32 storage, products with TF32 inputs and f32 accumulation (Cholesky: the
    /// trailing updates; potrf and trsm in f32).
    Tf32,
    /// f32 storage, products with bf16 inputs and f32 accumulation.
    Bf16,
}

impl Precision {
    /// The mixed mode of the f32 products, `None` for f64.
    fn mode(self) -> Option<MathMode> {
        match self {
            Precision::F64 => None,
            Precision::F32 => Some(MathMode::F32),
            Precision::Tf32 => Some(MathMode::Tf32),
            Precision::Bf16 => Some(MathMode::Bf16),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "f64" => Ok(Precision::F64),
            "tf32" => Ok(Precision::Tf32),
            "bf16" => Ok(Precision::Bf16),
            o => Err(format!(
                "unknown precision {o:?} (expected f32, f64, tf32 or bf16)"
            )),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct LinalgConfig {
    /// Matrix size.
    pub n: usize,
    /// Tile size (must divide `n`); [`AUTO_TILE`]: chosen for this machine (see
    /// [`resolve_tile`]).
    pub tile: usize,
    /// The units that run tasks, as `cpu,opencl,cuda`; without `cpu` there are no CPU
    /// workers unless `cpus` says otherwise (`cuda` alone is the GPU alone).
    pub devices: String,
    /// CPU workers (default: one per core, less one per device).
    pub cpus: Option<usize>,
    /// The placement policy (default: the runtime's).
    pub policy: Option<PolicyKind>,
    /// Element type.
    pub precision: Precision,
    /// Timed runs after one calibration run; the best is reported.
    pub reps: usize,
    /// Skip the residual check (it costs about as much as the factorization).
    pub no_check: bool,
    /// Write a Chrome/Perfetto trace of the runs here.
    pub trace: Option<std::path::PathBuf>,
}

/// One result line.
#[derive(Clone, Debug, Serialize)]
pub struct LinalgResult {
    /// "cholesky" or "gemm".
    pub bench: &'static str,
    /// Matrix size.
    pub n: usize,
    /// Tile size.
    pub tile: usize,
    /// Element type.
    pub precision: Precision,
    /// The devices asked for.
    pub devices: String,
    /// The policy used.
    pub policy: String,
    /// CPU workers.
    pub cpus: usize,
    /// Best run's GFLOP/s (n³/3 for Cholesky, 2n³ for GEMM).
    pub gflops: f64,
    /// Best run's seconds.
    pub seconds: f64,
    /// Median run's seconds.
    pub median_seconds: f64,
    /// Cholesky: ‖L·Lᵀ − A‖_F/‖A‖_F. GEMM: ‖C·x − A·(B·x)‖/(‖A‖‖B‖‖x‖) for a random x.
    pub residual: Option<f64>,
    /// Tasks run per unit kind in the timed runs, e.g. {"cpu": 1200, "opencl": 300}.
    pub tasks_per_kind: std::collections::BTreeMap<String, u64>,
    /// How the tile was chosen: `given`, `measured here: …`, `remembered in FILE`.
    pub tile_choice: String,
}

/// A [`LinalgConfig::tile`] of 0: the tile is chosen for this machine.
pub const AUTO_TILE: usize = 0;

/// The tiles tried for `n`: those of 128–1024 that divide it into 8 to 48 tiles per side
/// (fewer starve the cores of parallel work, more drown them in small tasks); at least one.
/// With a CUDA GPU among the devices, those of 1024–8192 that make 4 to 16 tiles per side
/// instead: a GPU needs large tiles to hide each task's launch and scheduling costs (on an
/// H200, n = 32768: tile 4096 ran at 0.81× cuSOLVER, tile 2048 at 0.65×), and does
/// not need many tiles to be busy. Measured, not assumed: each is timed once.
fn tile_candidates(n: usize, gpu: bool) -> Vec<usize> {
    if gpu {
        let c: Vec<usize> = [1024, 2048, 4096, 8192]
            .into_iter()
            .filter(|t| n.is_multiple_of(*t) && (4..=16).contains(&(n / t)))
            .collect();
        if !c.is_empty() {
            return c;
        }
    }
    let c: Vec<usize> = [128, 192, 256, 384, 512, 768, 1024]
        .into_iter()
        .filter(|t| n.is_multiple_of(*t) && (8..=48).contains(&(n / t)))
        .collect();
    if !c.is_empty() {
        return c;
    }
    // A size none of them fits: its largest divisor up to 512 (n itself when small).
    (1..=n.min(512))
        .rev()
        .find(|t| n.is_multiple_of(*t))
        .into_iter()
        .collect()
}

/// What a remembered tile is filed under: the benchmark, precision, n, devices, CPU workers
/// and the machine's hardware class (CPU model and cores, as the cluster's performance models
/// name it).
fn tile_key(cfg: &LinalgConfig, bench: &str) -> String {
    let cpus = cfg
        .cpus
        .map(|c| c.to_string())
        .unwrap_or_else(|| "default".into());
    format!(
        "{bench} {:?} n={} devices={} cpus={cpus} hw={}",
        cfg.precision,
        cfg.n,
        cfg.devices,
        flotilla_cluster::worker::default_hw_class()
    )
}

/// The tile `cfg` runs with, and how it was chosen. A given tile is kept. Otherwise, the
/// choice remembered for this machine (its CPU model, the CPU workers, the devices), this
/// benchmark, `n` and precision is taken from `FLOTILLA_HOME/tiles.json`; failing that,
/// each candidate tile is timed once on this `n` (after one untimed run, as the benchmark
/// itself runs), the fastest is chosen and remembered. Measured rather than predicted: on
/// this machine kind the best tile depends on the CPU's caches and vector width (tile 256
/// beat 512 by 1.2× on an AVX2-only CPU, and lost to it on an AVX-512 one), which the
/// kernels' performance models only learn by running them.
pub fn resolve_tile(cfg: &LinalgConfig, bench: &str) -> Result<(usize, String), RuntimeError> {
    resolve_tile_in(cfg, bench, flotilla_core::host::flotilla_home())
}

/// [`resolve_tile`] with the home folder given.
fn resolve_tile_in(
    cfg: &LinalgConfig,
    bench: &str,
    home: Option<std::path::PathBuf>,
) -> Result<(usize, String), RuntimeError> {
    if cfg.tile != AUTO_TILE {
        return Ok((cfg.tile, "given".into()));
    }
    let gpu = cfg.devices.split(',').any(|d| d.trim() == "cuda");
    let candidates = tile_candidates(cfg.n, gpu);
    if candidates.len() == 1 {
        return Ok((candidates[0], "the only candidate for this n".into()));
    }
    let key = tile_key(cfg, bench);
    let file = home.map(|h| h.join("tiles.json"));
    let mut known: serde_json::Map<String, serde_json::Value> = file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(t) = known
        .get(&key)
        .and_then(|v| v.get("tile"))
        .and_then(|t| t.as_u64())
        .map(|t| t as usize)
        .filter(|t| candidates.contains(t))
    {
        let from = file.map(|f| f.display().to_string()).unwrap_or_default();
        return Ok((t, format!("remembered in {from}")));
    }
    let mut timed = Vec::new();
    for t in candidates {
        let c = LinalgConfig {
            tile: t,
            reps: 1,
            no_check: true,
            trace: None,
            ..cfg.clone()
        };
        let r = match bench {
            "gemm" => run_gemm(&c)?,
            _ => run_cholesky(&c)?,
        };
        timed.push((t, r.seconds));
    }
    let best = timed
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(t, _)| *t)
        .unwrap_or(cfg.n);
    known.insert(
        key,
        serde_json::json!({ "tile": best, "measured_seconds": timed }),
    );
    if let Some(f) = &file {
        let written = f
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                std::fs::write(f, serde_json::to_vec_pretty(&known).unwrap_or_default())
            });
        if let Err(e) = written {
            tracing::warn!("cannot remember the tile in {}: {e}", f.display());
        }
    }
    let how: Vec<String> = timed
        .iter()
        .map(|(t, s)| format!("{t}: {s:.3} s"))
        .collect();
    Ok((best, format!("measured here ({})", how.join(", "))))
}

fn build_runtime(cfg: &LinalgConfig) -> Result<Runtime, RuntimeError> {
    let sel = DeviceSelection::parse(&cfg.devices).map_err(RuntimeError::Config)?;
    let mut b = Runtime::builder().devices(sel);
    let lists_cpu = cfg
        .devices
        .split(',')
        .any(|d| matches!(d.trim(), "cpu" | "all" | ""));
    match cfg.cpus {
        Some(c) => b = b.cpus(c),
        None if !lists_cpu => b = b.cpus(0),
        None => {}
    }
    if let Some(p) = cfg.policy {
        b = b.policy(p);
    }
    if let Some(t) = &cfg.trace {
        b = b.trace(t.clone());
    }
    b.build()
}

/// A random symmetric, strictly diagonally dominant (hence positive definite) matrix,
/// column-major; O(n²) to make.
pub fn spd_matrix<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut a = vec![T::from_f64(0.0); n * n];
    for j in 0..n {
        for i in j + 1..n {
            let v = T::from_f64(rng.gen_range(-1.0..1.0));
            a[j * n + i] = v;
            a[i * n + j] = v;
        }
        a[j * n + j] = T::from_f64(n as f64 + rng.gen_range(0.0..1.0));
    }
    a
}

fn tasks_per_kind(rt: &Runtime, before: &[u64]) -> std::collections::BTreeMap<String, u64> {
    let after = rt.executed_per_unit();
    let mut out = std::collections::BTreeMap::new();
    for (u, info) in rt.units().iter().enumerate() {
        let d = after[u] - before.get(u).copied().unwrap_or(0);
        *out.entry(info.kind.to_string()).or_insert(0) += d;
    }
    out
}

/// Runs the tiled Cholesky benchmark (the tile chosen first when not given).
pub fn run_cholesky(cfg: &LinalgConfig) -> Result<LinalgResult, RuntimeError> {
    let (tile, how) = resolve_tile(cfg, "cholesky")?;
    let cfg = &LinalgConfig {
        tile,
        ..cfg.clone()
    };
    let mut r = match cfg.precision.mode() {
        None => cholesky_t::<f64>(cfg, cholesky),
        Some(mode) => cholesky_t::<f32>(cfg, move |rt, a| cholesky_mixed(rt, a, mode)),
    }?;
    r.tile_choice = how;
    Ok(r)
}

/// Runs the tiled GEMM benchmark (the tile chosen first when not given).
pub fn run_gemm(cfg: &LinalgConfig) -> Result<LinalgResult, RuntimeError> {
    let (tile, how) = resolve_tile(cfg, "gemm")?;
    let cfg = &LinalgConfig {
        tile,
        ..cfg.clone()
    };
    let mut r = match cfg.precision.mode() {
        None => gemm_t::<f64>(cfg, gemm),
        Some(mode) => gemm_t::<f32>(cfg, move |rt, a, b, c| gemm_mixed(rt, a, b, c, mode)),
    }?;
    r.tile_choice = how;
    Ok(r)
}

fn cholesky_t<T: Element>(
    cfg: &LinalgConfig,
    factor: impl Fn(&Runtime, &TiledMatrix<T>) -> Result<(), RuntimeError>,
) -> Result<LinalgResult, RuntimeError> {
    let rt = build_runtime(cfg)?;
    let n = cfg.n;
    let a = spd_matrix::<T>(n, 42);
    // One untimed run calibrates the performance models (dmda needs them).
    {
        let t = TiledMatrix::from_dense(&rt, &a, n, cfg.tile)?;
        factor(&rt, &t)?;
        rt.wait_all()?;
        drop(t.into_dense(&rt)?);
    }
    let before = rt.executed_per_unit();
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..cfg.reps.max(1) {
        let t = TiledMatrix::from_dense(&rt, &a, n, cfg.tile)?;
        let start = Instant::now();
        factor(&rt, &t)?;
        rt.wait_all()?;
        times.push(start.elapsed().as_secs_f64());
        last = Some(t);
    }
    let per_kind = tasks_per_kind(&rt, &before);
    let residual = match last {
        Some(t) if !cfg.no_check => Some(tiled_residual(&rt, &a, t)?),
        Some(t) => {
            drop(t.into_dense(&rt)?);
            None
        }
        None => None,
    };
    Ok(result(
        "cholesky",
        cfg,
        &rt,
        (n as f64).powi(3) / 3.0,
        times,
        residual,
        per_kind,
    ))
}

fn result(
    bench: &'static str,
    cfg: &LinalgConfig,
    rt: &Runtime,
    flops: f64,
    mut times: Vec<f64>,
    residual: Option<f64>,
    tasks_per_kind: std::collections::BTreeMap<String, u64>,
) -> LinalgResult {
    times.sort_by(f64::total_cmp);
    let best = times[0];
    LinalgResult {
        bench,
        n: cfg.n,
        tile: cfg.tile,
        precision: cfg.precision,
        devices: cfg.devices.clone(),
        policy: rt.policy().to_string(),
        cpus: rt.cpu_workers(),
        gflops: flops / best / 1e9,
        seconds: best,
        median_seconds: times[times.len() / 2],
        residual,
        tasks_per_kind,
        tile_choice: String::new(),
    }
}

/// ‖L·Lᵀ − A‖_F/‖A‖_F computed with the runtime itself (tiled, in parallel), so checking
/// n = 8192 costs about as much as factorizing it.
fn tiled_residual<T: Element>(
    rt: &Runtime,
    a: &[T],
    l: TiledMatrix<T>,
) -> Result<f64, RuntimeError> {
    let (n, tile, nt) = (l.n(), l.tile_size(), l.tiles_per_dim());
    let mut ld = l.into_dense(rt)?;
    for j in 0..n {
        for i in 0..j {
            ld[j * n + i] = T::from_f64(0.0);
        }
    }
    let lt = TiledMatrix::from_dense(rt, &ld, n, tile)?;
    drop(ld);
    let r = TiledMatrix::from_dense(rt, a, n, tile)?;
    let k = Kernels::new::<T>(tile);
    for i in 0..nt {
        for j in 0..=i {
            for s in 0..=j {
                rt.task(&k.gemm_nt)
                    .read(lt.tile(i, s))
                    .read(lt.tile(j, s))
                    .rw(r.tile(i, j))
                    .submit()?;
            }
        }
    }
    rt.wait_all()?;
    let rd = r.into_dense(rt)?;
    drop(lt);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for j in 0..n {
        for i in j..n {
            let w = if i == j { 1.0 } else { 2.0 };
            let x = rd[j * n + i].to_f64();
            let y = a[j * n + i].to_f64();
            num += w * x * x;
            den += w * y * y;
        }
    }
    Ok((num / den).sqrt())
}

fn gemm_t<T: Element>(
    cfg: &LinalgConfig,
    product: impl Fn(
        &Runtime,
        &TiledMatrix<T>,
        &TiledMatrix<T>,
        &TiledMatrix<T>,
    ) -> Result<(), RuntimeError>,
) -> Result<LinalgResult, RuntimeError> {
    let rt = build_runtime(cfg)?;
    let n = cfg.n;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let a: Vec<T> = (0..n * n)
        .map(|_| T::from_f64(rng.gen_range(-1.0..1.0)))
        .collect();
    let b: Vec<T> = (0..n * n)
        .map(|_| T::from_f64(rng.gen_range(-1.0..1.0)))
        .collect();
    let zero = vec![T::from_f64(0.0); n * n];
    let ta = TiledMatrix::from_dense(&rt, &a, n, cfg.tile)?;
    let tb = TiledMatrix::from_dense(&rt, &b, n, cfg.tile)?;
    let mut times = Vec::new();
    let mut before = None;
    let mut c = Vec::new();
    for rep in 0..=cfg.reps.max(1) {
        if rep == 1 {
            before = Some(rt.executed_per_unit());
        }
        let tc = TiledMatrix::from_dense(&rt, &zero, n, cfg.tile)?;
        let start = Instant::now();
        product(&rt, &ta, &tb, &tc)?;
        rt.wait_all()?;
        if rep > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
        c = tc.into_dense(&rt)?;
    }
    let per_kind = match &before {
        Some(b) => tasks_per_kind(&rt, b),
        None => Default::default(),
    };
    let residual = (!cfg.no_check).then(|| {
        let x: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mv = |m: &[T], v: &[f64]| -> Vec<f64> {
            let mut y = vec![0.0; n];
            for (j, vj) in v.iter().enumerate() {
                for i in 0..n {
                    y[i] += m[j * n + i].to_f64() * vj;
                }
            }
            y
        };
        let cx = mv(&c, &x);
        let abx = mv(&a, &mv(&b, &x));
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let fro = |m: &[T]| {
            m.iter()
                .map(|x| x.to_f64() * x.to_f64())
                .sum::<f64>()
                .sqrt()
        };
        let diff: Vec<f64> = cx.iter().zip(&abx).map(|(p, q)| p - q).collect();
        norm(&diff) / (fro(&a) * fro(&b) * norm(&x))
    });
    drop(ta.into_dense(&rt)?);
    drop(tb.into_dense(&rt)?);
    Ok(result(
        "gemm",
        cfg,
        &rt,
        2.0 * (n as f64).powi(3),
        times,
        residual,
        per_kind,
    ))
}

#[cfg(test)]
mod tile_tests {
    use super::*;

    fn cfg(n: usize) -> LinalgConfig {
        LinalgConfig {
            n,
            tile: AUTO_TILE,
            devices: "cpu".into(),
            cpus: Some(2),
            policy: None,
            precision: Precision::F64,
            reps: 1,
            no_check: true,
            trace: None,
        }
    }

    #[test]
    fn candidates_split_n_into_8_to_48_tiles_per_side() {
        assert_eq!(tile_candidates(8192, false), vec![256, 512, 1024]);
        assert_eq!(tile_candidates(4096, false), vec![128, 256, 512]);
        assert_eq!(tile_candidates(2048, false), vec![128, 256]);
        // None fits: the largest divisor up to 512.
        assert_eq!(tile_candidates(100, false), vec![100]);
        assert_eq!(tile_candidates(3000, false), vec![500]);
        // With a CUDA GPU: large tiles, 4 to 16 per side; the CPU rule where none fits.
        assert_eq!(tile_candidates(32768, true), vec![2048, 4096, 8192]);
        assert_eq!(tile_candidates(16384, true), vec![1024, 2048, 4096]);
        assert_eq!(tile_candidates(8192, true), vec![1024, 2048]);
        assert_eq!(tile_candidates(2048, true), vec![128, 256]);
    }

    #[test]
    fn a_given_tile_is_kept_and_a_remembered_one_is_reused_without_measuring() {
        let c = LinalgConfig {
            tile: 64,
            ..cfg(256)
        };
        assert_eq!(
            resolve_tile_in(&c, "cholesky", None).unwrap(),
            (64, "given".into())
        );
        let home = tempfile::tempdir().unwrap();
        let c = cfg(8192);
        let known = serde_json::json!({ tile_key(&c, "cholesky"): { "tile": 512 } });
        std::fs::write(home.path().join("tiles.json"), known.to_string()).unwrap();
        // Measuring would factor 8192² three times; remembered, nothing runs.
        let (t, how) = resolve_tile_in(&c, "cholesky", Some(home.path().into())).unwrap();
        assert_eq!(t, 512);
        assert!(how.starts_with("remembered in"), "{how}");
        // Another precision is another key.
        let f32c = LinalgConfig {
            precision: Precision::F32,
            ..cfg(2048)
        };
        assert_ne!(tile_key(&f32c, "cholesky"), tile_key(&c, "cholesky"));
    }
}
