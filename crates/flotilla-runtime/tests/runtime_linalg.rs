//! Tiled Cholesky and GEMM through the runtime: on the CPU workers, and with the OpenCL
//! device (PoCL in CI) as a second memory node, data moved there, computed, and back.

#![allow(clippy::unwrap_used)]

use flotilla_runtime::linalg::{cholesky, cholesky_residual, gemm, TiledMatrix};
use flotilla_runtime::{DeviceKind, DeviceSelection, Msi, PolicyKind, Runtime};
use rand::{Rng, SeedableRng};

fn spd(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let b: Vec<f64> = (0..n * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut a = vec![0.0; n * n];
    for j in 0..n {
        for i in 0..n {
            let mut s = 0.0;
            for k in 0..n {
                s += b[k * n + i] * b[k * n + j];
            }
            a[j * n + i] = s + if i == j { n as f64 } else { 0.0 };
        }
    }
    a
}

fn opencl_runtime(builder: flotilla_runtime::RuntimeBuilder) -> Option<Runtime> {
    match builder
        .devices(DeviceSelection::Kinds(vec![DeviceKind::OpenCl]))
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            if std::env::var("FLOTILLA_REQUIRE_OPENCL").as_deref() == Ok("1") {
                panic!("FLOTILLA_REQUIRE_OPENCL=1 but no OpenCL runtime: {e}");
            }
            eprintln!("skipping: no OpenCL device ({e})");
            None
        }
    }
}

#[test]
fn cholesky_on_cpu_workers_is_accurate() {
    let n = 96;
    let a = spd(n, 1);
    for policy in [PolicyKind::Ws, PolicyKind::Eager, PolicyKind::Dmda] {
        let rt = Runtime::builder()
            .cpus(2)
            .policy(policy)
            .model_path(None)
            .build()
            .unwrap();
        let t = TiledMatrix::from_dense(&rt, &a, n, 32).unwrap();
        cholesky(&rt, &t).unwrap();
        rt.wait_all().unwrap();
        let l = t.into_dense(&rt).unwrap();
        let r = cholesky_residual(&a, &l, n);
        assert!(r < 1e-12, "{policy}: residual {r}");
    }
}

#[test]
fn cholesky_of_a_matrix_that_is_not_positive_definite_fails_cleanly() {
    let n = 64;
    let mut a = spd(n, 2);
    a[0] = -1.0;
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let t = TiledMatrix::from_dense(&rt, &a, n, 32).unwrap();
    cholesky(&rt, &t).unwrap();
    let e = rt.wait_all().unwrap_err().to_string();
    assert!(e.contains("potrf"), "{e}");
    // Read back as the guide does, without wait_all: the failure, not the input as a
    // "factor" (into_dense returned the untouched matrix as Ok).
    let t = TiledMatrix::from_dense(&rt, &a, n, 32).unwrap();
    cholesky(&rt, &t).unwrap();
    let e = t.into_dense(&rt).unwrap_err().to_string();
    assert!(
        e.contains("potrf") && e.contains("not positive definite"),
        "{e}"
    );
}

#[test]
fn tiles_must_divide_the_matrix() {
    let rt = Runtime::builder().cpus(1).model_path(None).build().unwrap();
    let e = TiledMatrix::from_dense(&rt, &[0.0f64; 100], 10, 3)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a multiple"), "{e}");
    let e = TiledMatrix::from_dense(&rt, &[0.0f64; 100], 10, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a tile size of 0"), "{e}");
}

/// Data registered on the host moves to the OpenCL node, is computed there, and comes back
/// equal to the CPU result.
#[test]
fn opencl_node_computes_the_same_cholesky_as_the_cpu() {
    let n = 128;
    let tile = 32;
    let a = spd(n, 3);
    // CPU reference through the runtime.
    let cpu = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let t = TiledMatrix::from_dense(&cpu, &a, n, tile).unwrap();
    cholesky(&cpu, &t).unwrap();
    let l_cpu = t.into_dense(&cpu).unwrap();

    // Only the OpenCL device: every task must run there, so every tile crosses over.
    let Some(rt) = opencl_runtime(Runtime::builder().cpus(0).model_path(None)) else {
        return;
    };
    let t = TiledMatrix::from_dense(&rt, &a, n, tile).unwrap();
    cholesky(&rt, &t).unwrap();
    rt.wait_all().unwrap();
    // Before unregistering, the factor lives on the device (node 1), not on the host.
    let states = t.tile(0, 0).states();
    assert_eq!(states[1], Msi::Modified, "{states:?}");
    assert_eq!(states[0], Msi::Invalid, "{states:?}");
    let l_dev = t.into_dense(&rt).unwrap();
    let stats = rt.transfer_stats();
    assert!(stats.uploads >= 10 && stats.downloads >= 10, "{stats:?}");
    let r = cholesky_residual(&a, &l_dev, n);
    assert!(r < 1e-12, "residual {r}");
    for j in 0..n {
        for i in j..n {
            let (x, y) = (l_cpu[j * n + i], l_dev[j * n + i]);
            assert!(
                (x - y).abs() <= 1e-10 * (1.0 + x.abs()),
                "L[{i},{j}]: cpu {x} opencl {y}"
            );
        }
    }
}

/// CPU workers and the OpenCL device together, with a device memory cap far below the
/// working set: replicas are evicted (written back when modified) and the result is still
/// exact.
#[test]
fn mixed_cpu_and_opencl_with_eviction_gives_the_exact_product() {
    let n = 128;
    let tile = 32;
    let tile_bytes = (tile * tile * 8) as u64;
    let Some(rt) = opencl_runtime(
        Runtime::builder()
            .cpus(1)
            .policy(PolicyKind::Eager)
            .model_path(None)
            .device_mem_limit(6 * tile_bytes),
    ) else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    // Small integers: every partial sum is exact in f64, so the result is bit-exact.
    let a: Vec<f64> = (0..n * n).map(|_| rng.gen_range(-4..=4) as f64).collect();
    let b: Vec<f64> = (0..n * n).map(|_| rng.gen_range(-4..=4) as f64).collect();
    let ta = TiledMatrix::from_dense(&rt, &a, n, tile).unwrap();
    let tb = TiledMatrix::from_dense(&rt, &b, n, tile).unwrap();
    let tc = TiledMatrix::from_dense(&rt, &vec![0.0; n * n], n, tile).unwrap();
    gemm(&rt, &ta, &tb, &tc).unwrap();
    rt.wait_all().unwrap();
    let c = tc.into_dense(&rt).unwrap();
    for j in 0..n {
        for i in 0..n {
            let want: f64 = (0..n).map(|k| a[k * n + i] * b[j * n + k]).sum();
            assert_eq!(c[j * n + i], want, "C[{i},{j}]");
        }
    }
    let stats = rt.transfer_stats();
    assert!(stats.evictions > 0, "{stats:?}");
}

#[test]
fn dmda_learns_and_the_model_persists() {
    let dir = tempfile_dir();
    let path = dir.join("model.json");
    let n = 128;
    let a = spd(n, 4);
    {
        let rt = Runtime::builder()
            .cpus(2)
            .policy(PolicyKind::Dmda)
            .model_path(Some(path.clone()))
            .trace(dir.join("trace.json"))
            .build()
            .unwrap();
        let t = TiledMatrix::from_dense(&rt, &a, n, 32).unwrap();
        cholesky(&rt, &t).unwrap();
        rt.wait_all().unwrap();
        let m = rt.perf_model();
        assert!(matches!(
            m.predict("gemm_nt_f64", "cpu", 32),
            flotilla_sched::Prediction::Calibrated(_)
        ));
        rt.shutdown().unwrap();
    }
    let rt = Runtime::builder()
        .cpus(2)
        .model_path(Some(path))
        .build()
        .unwrap();
    assert!(matches!(
        rt.perf_model().predict("gemm_nt_f64", "cpu", 32),
        flotilla_sched::Prediction::Calibrated(_)
    ));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let spans = events.iter().filter(|e| e["ph"] == "X").count();
    // 4 tiles per side: 4 potrf + 6 trsm + 6 syrk + 4 gemm = 20 tasks.
    assert_eq!(spans, 20);
    assert!(events.iter().any(|e| e["name"] == "potrf_f64"));
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "flotilla-rt-test-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Mixed precision per codelet: f32 tiles whose products read TF32 or bf16 inputs. The
/// residual of the Cholesky factor and the error of the product grow with the mode's unit
/// roundoff (f32 < tf32 < bf16) and stay within a small multiple of it, on the CPU workers
/// and, where there is one, with the OpenCL device taking part.
#[test]
fn mixed_precision_cholesky_and_gemm_are_as_accurate_as_their_mode() {
    use flotilla_runtime::linalg::{cholesky_mixed, gemm_mixed};
    use flotilla_runtime::MathMode;
    let n = 128;
    let a64 = spd(n, 5);
    let a: Vec<f32> = a64.iter().map(|&x| x as f32).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let x: Vec<f32> = (0..n * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let y: Vec<f32> = (0..n * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    // The exact product of x and y, in f64.
    let mut exact = vec![0.0f64; n * n];
    for j in 0..n {
        for k in 0..n {
            let ykj = f64::from(y[j * n + k]);
            for i in 0..n {
                exact[j * n + i] += f64::from(x[k * n + i]) * ykj;
            }
        }
    }
    let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
    let mut runtimes = vec![(
        "cpu",
        Runtime::builder().cpus(2).model_path(None).build().unwrap(),
    )];
    if let Some(rt) = opencl_runtime(Runtime::builder().cpus(1).model_path(None)) {
        runtimes.push(("cpu+opencl", rt));
    }
    for (name, rt) in &runtimes {
        let mut chol = Vec::new();
        let mut prod = Vec::new();
        for mode in MathMode::ALL {
            let t = TiledMatrix::from_dense(rt, &a, n, 32).unwrap();
            cholesky_mixed(rt, &t, mode).unwrap();
            rt.wait_all().unwrap();
            let l = t.into_dense(rt).unwrap();
            let r = cholesky_residual(&a, &l, n);
            let u = mode.unit_roundoff();
            eprintln!("{name} cholesky {mode}: residual {r:.3e} (u = {u:.1e})");
            assert!(r < 4.0 * u, "{name} cholesky {mode}: residual {r} ≥ 4u");
            chol.push(r);

            let (tx, ty) = (
                TiledMatrix::from_dense(rt, &x, n, 32).unwrap(),
                TiledMatrix::from_dense(rt, &y, n, 32).unwrap(),
            );
            let tc = TiledMatrix::from_dense(rt, &vec![0.0f32; n * n], n, 32).unwrap();
            gemm_mixed(rt, &tx, &ty, &tc, mode).unwrap();
            rt.wait_all().unwrap();
            let c = tc.into_dense(rt).unwrap();
            drop((tx.into_dense(rt).unwrap(), ty.into_dense(rt).unwrap()));
            let diff: Vec<f64> = c
                .iter()
                .zip(&exact)
                .map(|(&g, &e)| f64::from(g) - e)
                .collect();
            let err = norm(&diff) / norm(&exact);
            eprintln!("{name} gemm {mode}: relative error {err:.3e}");
            assert!(err < 4.0 * u, "{name} gemm {mode}: error {err} ≥ 4u");
            prod.push(err);
        }
        assert!(
            chol[0] < chol[1] && chol[1] < chol[2],
            "{name}: cholesky residuals not ordered by precision: {chol:?}"
        );
        assert!(
            prod[0] < prod[1] && prod[1] < prod[2],
            "{name}: gemm errors not ordered by precision: {prod:?}"
        );
    }
}
