//! The tiled Cholesky on this machine's CPU workers alone, with where the time went: the
//! time in each kernel, and each worker's time in kernels against the time the
//! factorizations took (from the runtime's trace).
//!
//! `cargo run --release -p flotilla-runtime --example cholesky -- [N] [TILE] [REPS]`

use std::time::Instant;

use flotilla_runtime::linalg::{cholesky, TiledMatrix};
use flotilla_runtime::{DeviceSelection, Runtime};

fn spd(n: usize) -> Vec<f64> {
    let mut a = vec![0.0; n * n];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for j in 0..n {
        for i in j + 1..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            a[j * n + i] = v;
            a[i * n + j] = v;
        }
        a[j * n + j] = n as f64 + 0.5;
    }
    a
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let n = args.first().copied().unwrap_or(8192);
    let tile = args.get(1).copied().unwrap_or(256);
    let reps = args.get(2).copied().unwrap_or(3);
    let trace = std::env::temp_dir().join(format!("cholesky-{}.json", std::process::id()));
    let a = spd(n);
    let mut best = f64::INFINITY;
    // All the factorizations, the untimed first one included (the trace holds them all).
    let mut factoring = 0.0;
    {
        let rt = Runtime::builder()
            .devices(DeviceSelection::parse("cpu").map_err(std::io::Error::other)?)
            .trace(&trace)
            .build()?;
        for rep in 0..=reps {
            let t = TiledMatrix::from_dense(&rt, &a, n, tile)?;
            let start = Instant::now();
            cholesky(&rt, &t)?;
            rt.wait_all()?;
            let s = start.elapsed().as_secs_f64();
            factoring += s;
            if rep > 0 {
                best = best.min(s);
            }
            println!(
                "rep {rep}: {s:.3} s, {:.1} GFLOP/s",
                (n as f64).powi(3) / 3.0 / s / 1e9
            );
            drop(t.into_dense(&rt)?);
        }
    }
    println!(
        "n {n} tile {tile}: best {:.1} GFLOP/s",
        (n as f64).powi(3) / 3.0 / best / 1e9
    );
    // Busy time per track and per kernel over the whole run (all reps).
    let text = std::fs::read_to_string(&trace)?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    let mut per_kernel = std::collections::BTreeMap::<String, (f64, u64)>::new();
    let mut per_track = std::collections::BTreeMap::<u64, f64>::new();
    for e in doc["traceEvents"].as_array().into_iter().flatten() {
        let Some(dur) = e["dur"].as_f64() else {
            continue;
        };
        let name = e["name"].as_str().unwrap_or("?").to_string();
        let k = per_kernel.entry(name).or_default();
        k.0 += dur;
        k.1 += 1;
        *per_track.entry(e["tid"].as_u64().unwrap_or(0)).or_default() += dur;
    }
    for (name, (us, count)) in &per_kernel {
        println!(
            "{name}: {count} tasks, {:.3} s, {:.3} ms each",
            us / 1e6,
            us / 1e3 / *count as f64
        );
    }
    for (tid, us) in &per_track {
        println!(
            "worker {tid}: in kernels {:.3} s of {factoring:.3} s factoring ({:.1} %)",
            us / 1e6,
            us / 1e6 / factoring * 100.0
        );
    }
    let _ = std::fs::remove_file(&trace);
    Ok(())
}
