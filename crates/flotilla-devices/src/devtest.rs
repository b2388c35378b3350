//! The device test kit: the same checks run against every backend (host, OpenCL, CUDA).
//! Each device result is compared with the CPU kernels on the same inputs.

use std::sync::Arc;

use crate::cpu::kernels as cpu;
use crate::testutil::*;
use crate::{
    args, Device, DeviceBuffer, DeviceKind, DevicesError, ElemType, MathMode, Scalar, Side, Trans,
    Uplo,
};

pub(crate) fn put<T: Scalar>(dev: &dyn Device, x: &[T]) -> DeviceBuffer {
    let buf = dev
        .alloc(std::mem::size_of_val(x))
        .expect("alloc test buffer");
    dev.upload(&buf, &to_bytes(x)).expect("upload");
    buf
}

pub(crate) fn get<T: Scalar>(dev: &dyn Device, buf: &DeviceBuffer) -> Vec<T> {
    let mut bytes = vec![0u8; buf.len_bytes()];
    dev.download(buf, &mut bytes).expect("download");
    from_bytes(&bytes)
}

fn check_gemm_syrk<T: Scalar>(dev: &dyn Device, seed: u64) {
    let e = T::ELEM;
    let mut r = rng(seed);
    let (m, n, k) = (37, 29, 21);
    for ta in TRANS {
        for tb in TRANS {
            for beta in [0.0, 0.5] {
                let (ar, ac) = args::stored(ta, m, k);
                let (br, bc) = args::stored(tb, k, n);
                let (lda, ldb, ldc) = (ar + 1, br + 2, m + 3);
                let a: Vec<T> = random(&mut r, lda * ac);
                let b: Vec<T> = random(&mut r, ldb * bc);
                let mut c: Vec<T> = random(&mut r, ldc * n);
                if beta == 0.0 {
                    c[0] = T::from_f64(f64::NAN);
                }
                let (da, db, dc) = (put(dev, &a), put(dev, &b), put(dev, &c));
                dev.gemm(e, ta, tb, m, n, k, 0.75, &da, lda, &db, ldb, beta, &dc, ldc)
                    .expect("device gemm");
                cpu::gemm(
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    T::from_f64(0.75),
                    &a,
                    lda,
                    &b,
                    ldb,
                    T::from_f64(beta),
                    &mut c,
                    ldc,
                )
                .expect("cpu gemm");
                let err = rel_err(&to_f64(&get::<T>(dev, &dc)), &to_f64(&c));
                assert!(err < tol(e), "opencl gemm {ta:?} {tb:?} {e}: {err}");
            }
        }
    }
    for uplo in UPLO {
        for t in TRANS {
            let (ar, ac) = args::stored(t, n, k);
            let (lda, ldc) = (ar + 2, n + 1);
            let a: Vec<T> = random(&mut r, lda * ac);
            let mut c: Vec<T> = random(&mut r, ldc * n);
            let (da, dc) = (put(dev, &a), put(dev, &c));
            dev.syrk(e, uplo, t, n, k, -1.0, &da, lda, 1.0, &dc, ldc)
                .expect("device syrk");
            cpu::syrk(
                uplo,
                t,
                n,
                k,
                T::from_f64(-1.0),
                &a,
                lda,
                T::one(),
                &mut c,
                ldc,
            )
            .expect("cpu syrk");
            let err = rel_err(&to_f64(&get::<T>(dev, &dc)), &to_f64(&c));
            assert!(err < tol(e), "opencl syrk {uplo:?} {t:?} {e}: {err}");
        }
    }
}

fn check_trsm_potrf<T: Scalar>(dev: &dyn Device, seed: u64) {
    let e = T::ELEM;
    let mut r = rng(seed);
    let (m, n) = (27, 19);
    for side in SIDE {
        for uplo in UPLO {
            for t in TRANS {
                for diag in DIAG {
                    let na = if side == Side::Left { m } else { n };
                    let (lda, ldb) = (na + 1, m + 2);
                    let a: Vec<T> = triangular(&mut r, na, lda);
                    let mut b: Vec<T> = random(&mut r, ldb * n);
                    let (da, db) = (put(dev, &a), put(dev, &b));
                    dev.trsm(e, side, uplo, t, diag, m, n, 2.0, &da, lda, &db, ldb)
                        .expect("device trsm");
                    cpu::trsm(
                        side,
                        uplo,
                        t,
                        diag,
                        m,
                        n,
                        T::from_f64(2.0),
                        &a,
                        lda,
                        &mut b,
                        ldb,
                    )
                    .expect("cpu trsm");
                    let err = rel_err(&to_f64(&get::<T>(dev, &db)), &to_f64(&b));
                    assert!(
                        err < tol(e),
                        "opencl trsm {side:?} {uplo:?} {t:?} {diag:?} {e}: {err}"
                    );
                }
            }
        }
    }
    let n = 70;
    let lda = n + 2;
    let spd64 = spd(&mut r, n);
    for uplo in UPLO {
        let mut a: Vec<T> = vec![T::from_f64(3.0); lda * n];
        for j in 0..n {
            for i in 0..n {
                a[i + j * lda] = T::from_f64(spd64[i + j * n]);
            }
        }
        let da = put(dev, &a);
        dev.potrf(e, uplo, n, &da, lda).expect("device potrf");
        cpu::potrf(uplo, n, &mut a, lda).expect("cpu potrf");
        let err = rel_err(&to_f64(&get::<T>(dev, &da)), &to_f64(&a));
        assert!(err < tol(e), "opencl potrf {uplo:?} {e}: {err}");
    }
    // A negative pivot in column 5 is reported as such.
    let mut bad = vec![T::zero(); 8 * 8];
    for j in 0..8 {
        bad[j + j * 8] = T::from_f64(if j == 5 { -1.0 } else { 2.0 });
    }
    let db = put(dev, &bad);
    for uplo in UPLO {
        dev.upload(&db, &to_bytes(&bad)).expect("upload");
        let err = dev.potrf(e, uplo, 8, &db, 8).expect_err("not SPD");
        assert_eq!(err, DevicesError::NotPositiveDefinite { column: 5 });
    }
}

/// `gemm_mixed` in every mode: each element's error against the exact product of the
/// unrounded inputs stays within the rounding bound of the mode's input format plus f32
/// accumulation; where the backend emulates the rounding (every backend but CUDA, whose
/// tensor cores may convert differently), the result equals the CPU reference up to f32
/// summation order, and bf16 is measurably less accurate than f32 (the mode is applied).
fn check_gemm_mixed(dev: &dyn Device, seed: u64) {
    let mut r = rng(seed);
    let (m, n, k) = (37, 29, 64);
    let emulated = dev.info().kind != DeviceKind::Cuda;
    for ta in TRANS {
        for tb in TRANS {
            let (ar, ac) = args::stored(ta, m, k);
            let (br, bc) = args::stored(tb, k, n);
            let (lda, ldb, ldc) = (ar + 1, br, m + 2);
            let a: Vec<f32> = random(&mut r, lda * ac);
            let b: Vec<f32> = random(&mut r, ldb * bc);
            let (da, db) = (put(dev, &a), put(dev, &b));
            // Exact (f64) product of the unrounded inputs, and of their magnitudes.
            let (a64, b64) = (to_f64(&a), to_f64(&b));
            let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<f64>>();
            let mut exact = vec![0.0f64; ldc * n];
            let mut mag = vec![0.0f64; ldc * n];
            cpu::gemm(
                ta, tb, m, n, k, 1.0, &a64, lda, &b64, ldb, 0.0, &mut exact, ldc,
            )
            .expect("f64 gemm");
            cpu::gemm(
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                &abs(&a64),
                lda,
                &abs(&b64),
                ldb,
                0.0,
                &mut mag,
                ldc,
            )
            .expect("f64 gemm of magnitudes");
            let mut worst = Vec::new();
            for mode in MathMode::ALL {
                let dc = put(dev, &vec![f32::NAN; ldc * n]);
                dev.gemm_mixed(
                    mode, ta, tb, m, n, k, 1.0, &da, lda, &db, ldb, 0.0, &dc, ldc,
                )
                .expect("device gemm_mixed");
                let got = to_f64(&get::<f32>(dev, &dc));
                let u = mode.unit_roundoff();
                let gamma = (k as f64 + 2.0) * f64::from(f32::EPSILON);
                let mut max_err = 0.0f64;
                for j in 0..n {
                    for i in 0..m {
                        let x = i + j * ldc;
                        let err = (got[x] - exact[x]).abs();
                        let bound = (2.0 * u + u * u + gamma) * mag[x] * 1.01;
                        assert!(
                            err <= bound,
                            "gemm_mixed {mode} {ta:?} {tb:?} ({i},{j}): error {err} > {bound}"
                        );
                        max_err = max_err.max(err);
                    }
                }
                worst.push(max_err);
                if emulated {
                    let mut c = vec![0.0f32; ldc * n];
                    cpu::gemm_mixed(
                        mode, ta, tb, m, n, k, 1.0, &a, lda, &b, ldb, 0.0, &mut c, ldc,
                    )
                    .expect("cpu gemm_mixed");
                    let only = |v: &[f64]| {
                        (0..n)
                            .flat_map(|j| (0..m).map(move |i| i + j * ldc))
                            .map(|x| v[x])
                            .collect::<Vec<f64>>()
                    };
                    let err = rel_err(&only(&got), &only(&to_f64(&c)));
                    assert!(err < tol(ElemType::F32), "gemm_mixed {mode} vs cpu: {err}");
                }
            }
            if emulated {
                assert!(
                    worst[2] > 10.0 * worst[0],
                    "bf16 is not less accurate than f32: {worst:?}"
                );
            }
        }
    }
}

/// gemm, syrk, trsm and potrf on `dev` equal the CPU kernels' results (f32 always, f64 when
/// supported, else `Unsupported`).
pub(crate) fn blas_matches_cpu(dev: &dyn Device) {
    eprintln!("testing {:?}", dev.info());
    copies_at_offsets(dev);
    check_gemm_syrk::<f32>(dev, 11);
    check_trsm_potrf::<f32>(dev, 12);
    check_gemm_mixed(dev, 15);
    if dev.supports(ElemType::F64) {
        check_gemm_syrk::<f64>(dev, 13);
        check_trsm_potrf::<f64>(dev, 14);
    } else {
        let b = dev.alloc(64).expect("alloc");
        let err = dev.potrf(ElemType::F64, Uplo::Lower, 2, &b, 2);
        assert!(
            matches!(err, Err(DevicesError::Unsupported { .. })),
            "{err:?}"
        );
    }
    dev.synchronize().expect("synchronize");
}

/// `dev` was opened with a 1000-byte limit: allocations past it fail with `OutOfMemory`
/// and freeing gives the bytes back.
pub(crate) fn out_of_memory_at_limit_1000(dev: &dyn Device) {
    assert_eq!(dev.info().global_mem, 1000);
    let a = dev.alloc(600).expect("fits");
    assert_eq!(dev.mem_used(), 600);
    let err = dev.alloc(600).expect_err("over the limit");
    assert!(
        matches!(
            err,
            DevicesError::OutOfMemory {
                requested: 600,
                available: 400,
                ..
            }
        ),
        "{err:?}"
    );
    drop(a);
    assert_eq!(dev.mem_used(), 0);
    let _b = dev.alloc(1000).expect("fits after the free");
    let err = dev.alloc(1001).expect_err("larger than the device");
    assert!(matches!(err, DevicesError::OutOfMemory { .. }), "{err:?}");
}

/// Bad shapes, short buffers, aliasing outputs, foreign buffers and oversized transfers are
/// `BadArgs` errors on `dev`; `other` is another device instance.
pub(crate) fn bad_arguments_are_errors(dev: &dyn Device, other: &dyn Device) {
    let e = ElemType::F32;
    let a = dev.alloc(16 * 4).expect("alloc");
    let c = dev.alloc(16 * 4).expect("alloc");
    let (no, yes) = (Trans::No, Trans::Yes);
    // lda < m
    let err = dev.gemm(e, no, no, 4, 4, 4, 1.0, &a, 3, &a, 4, 0.0, &c, 4);
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "gemm", .. })),
        "{err:?}"
    );
    // a mixed mode on an f64 product
    let err = dev.gemm_mode(
        ElemType::F64,
        MathMode::Bf16,
        no,
        no,
        1,
        1,
        1,
        1.0,
        &a,
        1,
        &a,
        1,
        0.0,
        &c,
        1,
    );
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "gemm", .. })),
        "{err:?}"
    );
    // buffer too small for 5x5
    let err = dev.syrk(e, Uplo::Lower, no, 5, 5, 1.0, &a, 5, 0.0, &c, 5);
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "syrk", .. })),
        "{err:?}"
    );
    let err = dev.trsm(
        e,
        Side::Right,
        Uplo::Lower,
        yes,
        crate::Diag::NonUnit,
        4,
        5,
        1.0,
        &a,
        5,
        &c,
        4,
    );
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "trsm", .. })),
        "{err:?}"
    );
    // output aliasing an input
    let err = dev.gemm(e, no, no, 4, 4, 4, 1.0, &a, 4, &c, 4, 0.0, &c, 4);
    assert!(matches!(err, Err(DevicesError::BadArgs { .. })), "{err:?}");
    // a buffer of another device instance
    let foreign = other.alloc(64).expect("alloc");
    let err = dev.potrf(e, Uplo::Lower, 4, &foreign, 4);
    assert!(matches!(err, Err(DevicesError::BadArgs { .. })), "{err:?}");
    let err = dev.upload(&foreign, &[0u8; 4]);
    assert!(matches!(err, Err(DevicesError::BadArgs { .. })), "{err:?}");
    // transfers larger than the buffer
    let err = dev.upload(&a, &[0u8; 65]);
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "upload", .. })),
        "{err:?}"
    );
    let err = dev.download(&a, &mut [0u8; 65]);
    assert!(
        matches!(err, Err(DevicesError::BadArgs { op: "download", .. })),
        "{err:?}"
    );
}

/// Uploads and downloads on one thread while gemms run on another give correct results.
pub(crate) fn transfer_overlaps_compute(dev: &Arc<dyn Device>) {
    let n = 64;
    let mut r = rng(15);
    let a: Vec<f32> = random(&mut r, n * n);
    let b: Vec<f32> = random(&mut r, n * n);
    let (da, db, dc) = (
        put(dev.as_ref(), &a),
        put(dev.as_ref(), &b),
        put(dev.as_ref(), &a),
    );
    let side = dev.alloc(1 << 20).expect("alloc");
    let payload: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    std::thread::scope(|s| {
        let d = Arc::clone(dev);
        let (side, payload) = (&side, &payload);
        let copier = s.spawn(move || {
            for _ in 0..5 {
                d.upload(side, payload).expect("upload");
                let mut back = vec![0u8; payload.len()];
                d.download(side, &mut back).expect("download");
                assert_eq!(&back, payload);
            }
        });
        for _ in 0..5 {
            dev.gemm(
                ElemType::F32,
                Trans::No,
                Trans::No,
                n,
                n,
                n,
                1.0,
                &da,
                n,
                &db,
                n,
                0.0,
                &dc,
                n,
            )
            .expect("gemm");
        }
        copier.join().expect("copier thread");
    });
    let mut want = vec![0.0f32; n * n];
    cpu::gemm(
        Trans::No,
        Trans::No,
        n,
        n,
        n,
        1.0,
        &a,
        n,
        &b,
        n,
        0.0,
        &mut want,
        n,
    )
    .expect("cpu gemm");
    let err = rel_err(&to_f64(&get::<f32>(dev.as_ref(), &dc)), &to_f64(&want));
    assert!(err < 1e-4, "{err}");
}

/// A right-looking tiled Cholesky (f64) run entirely on `dev` over separately allocated
/// tiles, as the runtime drives it; ‖L Lᵀ − A‖ / ‖A‖ must stay below 1e-12.
pub(crate) fn tiled_cholesky_on_device(dev: &dyn Device) {
    if !dev.supports(ElemType::F64) {
        eprintln!("{}: no f64, tiled Cholesky skipped", dev.info().name);
        return;
    }
    let e = ElemType::F64;
    let (n, nb) = (200, 48); // 4 full tiles and one of 8
    let a = spd(&mut rng(16), n);
    let nt = n.div_ceil(nb);
    let dim = |t: usize| nb.min(n - t * nb);
    let tile = |i: usize, j: usize| -> Vec<f64> {
        let (r, c) = (dim(i), dim(j));
        (0..c)
            .flat_map(|jj| (0..r).map(move |ii| (ii, jj)))
            .map(|(ii, jj)| a[(i * nb + ii) + (j * nb + jj) * n])
            .collect()
    };
    let tiles: Vec<Vec<DeviceBuffer>> = (0..nt)
        .map(|i| (0..=i).map(|j| put(dev, &tile(i, j))).collect())
        .collect();
    let (no, yes) = (Trans::No, Trans::Yes);
    for k in 0..nt {
        let dk = dim(k);
        dev.potrf(e, Uplo::Lower, dk, &tiles[k][k], dk)
            .expect("potrf");
        for (i, row) in tiles.iter().enumerate().skip(k + 1) {
            let di = dim(i);
            let diag = crate::Diag::NonUnit;
            dev.trsm(
                e,
                Side::Right,
                Uplo::Lower,
                yes,
                diag,
                di,
                dk,
                1.0,
                &tiles[k][k],
                dk,
                &row[k],
                di,
            )
            .expect("trsm");
        }
        for (i, row) in tiles.iter().enumerate().skip(k + 1) {
            let di = dim(i);
            dev.syrk(
                e,
                Uplo::Lower,
                no,
                di,
                dk,
                -1.0,
                &row[k],
                di,
                1.0,
                &row[i],
                di,
            )
            .expect("syrk");
            for j in k + 1..i {
                let dj = dim(j);
                dev.gemm(
                    e,
                    no,
                    yes,
                    di,
                    dj,
                    dk,
                    -1.0,
                    &row[k],
                    di,
                    &tiles[j][k],
                    dj,
                    1.0,
                    &row[j],
                    di,
                )
                .expect("gemm");
            }
        }
    }
    let mut l = vec![0.0; n * n];
    for (i, row) in tiles.iter().enumerate() {
        for (j, buf) in row.iter().enumerate() {
            let t: Vec<f64> = get(dev, buf);
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
    let mut num = 0.0;
    let mut den = 0.0;
    for j in 0..n {
        for i in 0..n {
            let s: f64 = (0..=i.min(j)).map(|p| l[i + p * n] * l[j + p * n]).sum();
            num += (s - a[i + j * n]).powi(2);
            den += a[i + j * n].powi(2);
        }
    }
    let res = (num / den).sqrt();
    assert!(
        res < 1e-12,
        "{}: tiled Cholesky residual {res}",
        dev.info().name
    );
}

/// Host memory pinned through `dev` uploads and downloads the same bytes (64 MiB, so a
/// GPU's DMA path is the one taken), and unpinning it leaves it usable.
pub(crate) fn pinned_copies_round_trip(dev: &dyn Device) {
    let len = 64 << 20;
    let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let mut dst = vec![0u8; len];
    // SAFETY: both vectors outlive their pins (dropped at the end of this block).
    let pins = unsafe {
        (
            dev.pin_host_memory(src.as_ptr(), len).expect("pin src"),
            dev.pin_host_memory(dst.as_ptr(), len).expect("pin dst"),
        )
    };
    let buf = dev.alloc(len).expect("alloc");
    let t = std::time::Instant::now();
    dev.upload(&buf, &src).expect("upload");
    let up = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    dev.download(&buf, &mut dst).expect("download");
    let down = t.elapsed().as_secs_f64();
    eprintln!(
        "{}: pinned={} upload {:.1} GB/s, download {:.1} GB/s",
        dev.info().name,
        pins.0.is_some(),
        len as f64 / up / 1e9,
        len as f64 / down / 1e9
    );
    assert!(src == dst, "pinned round trip changed the bytes");
    drop(pins);
    dst.fill(0);
    dev.download(&buf, &mut dst)
        .expect("download after unpinning");
    assert!(src == dst);
}

/// On a GPU: bf16 and TF32 products of large matrices really run in the narrower format
/// (their error against f32 is of the format's size), and are reported with their speed.
pub(crate) fn mixed_precision_on_tensor_cores(dev: &dyn Device) {
    let n = 2048;
    let mut r = rng(21);
    let a: Vec<f32> = random(&mut r, n * n);
    let b: Vec<f32> = random(&mut r, n * n);
    let (da, db) = (put(dev, &a), put(dev, &b));
    let mut results = Vec::new();
    for mode in MathMode::ALL {
        let dc = put(dev, &vec![0.0f32; n * n]);
        let no = Trans::No;
        dev.gemm_mixed(mode, no, no, n, n, n, 1.0, &da, n, &db, n, 0.0, &dc, n)
            .expect("warm-up");
        let t = std::time::Instant::now();
        dev.gemm_mixed(mode, no, no, n, n, n, 1.0, &da, n, &db, n, 0.0, &dc, n)
            .expect("gemm_mixed");
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "{} gemm_mixed {mode} n={n}: {:.1} TFLOP/s",
            dev.info().name,
            2.0 * (n as f64).powi(3) / s / 1e12
        );
        results.push(to_f64(&get::<f32>(dev, &dc)));
    }
    for (i, mode) in MathMode::ALL.iter().enumerate().skip(1) {
        let err = rel_err(&results[i], &results[0]);
        eprintln!("{mode} vs f32: relative difference {err:.2e}");
        assert!(err < 8.0 * mode.unit_roundoff(), "{mode}: {err}");
    }
}

/// A buffer written on `a` arrives intact on `b` by a direct copy, when the two have one.
pub(crate) fn peer_copies_between(a: &dyn Device, b: &dyn Device) {
    if !a.can_copy_to_peer(b) {
        eprintln!("{} → {}: no peer path", a.info().name, b.info().name);
        return;
    }
    let len = 64 << 20;
    let src: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
    let (ba, bb) = (a.alloc(len).expect("alloc"), b.alloc(len).expect("alloc"));
    a.upload(&ba, &src).expect("upload");
    let t = std::time::Instant::now();
    a.copy_to_peer(&ba, b, &bb, len).expect("peer copy");
    eprintln!(
        "peer copy {} → {}: {:.1} GB/s",
        a.info().name,
        b.info().name,
        len as f64 / t.elapsed().as_secs_f64() / 1e9
    );
    let mut out = vec![0u8; len];
    b.download(&bb, &mut out).expect("download");
    assert!(out == src, "peer copy changed the bytes");
}

/// `upload_at` and `download_at` touch exactly the bytes asked for, and a range past the
/// buffer's end is `BadArgs`.
fn copies_at_offsets(dev: &dyn Device) {
    let buf = dev.alloc(1000).expect("alloc");
    dev.upload(&buf, &[7u8; 1000]).expect("fill");
    dev.upload_at(&buf, 100, &[1u8; 50]).expect("upload_at");
    dev.upload_at(&buf, 990, &[2u8; 10])
        .expect("upload_at the end");
    let mut all = vec![0u8; 1000];
    dev.download(&buf, &mut all).expect("download");
    for (i, &b) in all.iter().enumerate() {
        let want = match i {
            100..150 => 1,
            990.. => 2,
            _ => 7,
        };
        assert_eq!(b, want, "byte {i}");
    }
    let mut part = vec![0u8; 60];
    dev.download_at(&buf, 95, &mut part).expect("download_at");
    assert_eq!(&part[..5], &[7; 5]);
    assert_eq!(&part[5..55], &[1; 50]);
    assert_eq!(&part[55..], &[7; 5]);
    for r in [
        dev.upload_at(&buf, 991, &[0u8; 10]),
        dev.download_at(&buf, usize::MAX, &mut [0u8; 2]),
    ] {
        assert!(matches!(r, Err(DevicesError::BadArgs { .. })), "{r:?}");
    }
}
