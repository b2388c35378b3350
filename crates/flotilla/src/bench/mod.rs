//! The benchmarks behind `flotilla bench`: each returns a serializable result so the CLI can
//! print it as a table line or one JSON line, and each measures its peer (rayon) in the same
//! run where the peer is a Rust crate.

pub mod alloc;
pub mod allreduce;
pub mod churn;
pub mod cluster;
pub mod copy;
pub mod flood;
pub mod isolation;
pub mod linalg;
pub mod market;
pub mod overhead;
pub mod restart;
pub mod verify;
pub mod wfcommons;

use std::time::{Duration, Instant};

/// Times `f` `reps` times (after `warmup` untimed runs) and returns the durations, sorted.
pub(crate) fn time_runs(warmup: usize, reps: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    let mut v: Vec<Duration> = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v
}

/// The median of sorted durations.
pub(crate) fn median(v: &[Duration]) -> Duration {
    v[v.len() / 2]
}
