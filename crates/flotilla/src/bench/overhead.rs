//! `flotilla bench overhead`: nanoseconds per empty task through the runtime, next to
//! rayon's `scope.spawn` measured in the same run.

use std::sync::Arc;

use serde::Serialize;

use flotilla_runtime::{Codelet, PolicyKind, Runtime, RuntimeError};

use super::{median, time_runs};

/// The dependency pattern between the tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Deps {
    /// Independent tasks.
    None,
    /// Each task depends on the previous one.
    Chain,
}

impl std::str::FromStr for Deps {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Deps::None),
            "chain" => Ok(Deps::Chain),
            o => Err(format!("unknown --deps {o:?} (expected none or chain)")),
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct OverheadConfig {
    /// Tasks per run.
    pub tasks: usize,
    /// The dependency pattern.
    pub deps: Deps,
    /// CPU workers (rayon gets as many threads).
    pub cpus: usize,
    /// Timed runs (the median is reported).
    pub reps: usize,
}

/// One result line.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadResult {
    /// Always "overhead".
    pub bench: &'static str,
    /// The dependency pattern.
    pub deps: Deps,
    /// Tasks per run.
    pub tasks: usize,
    /// Workers.
    pub cpus: usize,
    /// Flotilla, closures (`scope.spawn`; for chain: each task spawns the next).
    pub ns_per_task: f64,
    /// Flotilla, codelet tasks with access-mode dependency inference (for `none`: each
    /// task reads its own datum; for `chain`: every task read-writes the same datum).
    pub codelet_ns_per_task: f64,
    /// rayon, same pattern as `ns_per_task`, same run.
    pub rayon_ns_per_task: f64,
    /// `ns_per_task / rayon_ns_per_task`.
    pub ratio: f64,
}

fn chain_rayon(s: &rayon::Scope<'_>, left: usize) {
    if left > 0 {
        s.spawn(move |s| chain_rayon(s, left - 1));
    }
}

fn chain_flotilla(s: &flotilla_runtime::Scope<'_>, left: usize) {
    if left > 0 {
        s.spawn(move |s| chain_flotilla(s, left - 1));
    }
}

/// Runs the benchmark.
pub fn run(cfg: &OverheadConfig) -> Result<OverheadResult, RuntimeError> {
    let n = cfg.tasks.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.cpus)
        .build()
        .map_err(|e| RuntimeError::Config(format!("rayon pool: {e}")))?;
    let rt = Runtime::builder()
        .cpus(cfg.cpus)
        .policy(PolicyKind::Ws)
        .model_path(None)
        .build()?;

    let (ours, theirs) = match cfg.deps {
        Deps::None => {
            let ours = time_runs(1, cfg.reps, || {
                rt.scope(|s| {
                    for _ in 0..n {
                        s.spawn(|_| {});
                    }
                })
            });
            let theirs = time_runs(1, cfg.reps, || {
                pool.scope(|s| {
                    for _ in 0..n {
                        s.spawn(|_| {});
                    }
                })
            });
            (ours, theirs)
        }
        Deps::Chain => {
            let ours = time_runs(1, cfg.reps, || rt.scope(|s| chain_flotilla(s, n)));
            let theirs = time_runs(1, cfg.reps, || pool.scope(|s| chain_rayon(s, n)));
            (ours, theirs)
        }
    };

    let empty = Arc::new(Codelet::new("empty").calibrate(false).cpu(|_| Ok(())));
    let codelet = match cfg.deps {
        Deps::None => {
            let data: Vec<_> = (0..n.min(4096)).map(|_| rt.register(vec![0u8])).collect();
            let mut err = None;
            let t = time_runs(1, cfg.reps, || {
                for i in 0..n {
                    if let Err(e) = rt.task(&empty).read(&data[i % data.len()]).submit() {
                        err = Some(e);
                    }
                }
                if let Err(e) = rt.wait_all() {
                    err = Some(e);
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            t
        }
        Deps::Chain => {
            let x = rt.register(vec![0u8]);
            let mut err = None;
            let t = time_runs(1, cfg.reps, || {
                for _ in 0..n {
                    if let Err(e) = rt.task(&empty).rw(&x).submit() {
                        err = Some(e);
                    }
                }
                if let Err(e) = rt.wait_all() {
                    err = Some(e);
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            t
        }
    };
    let per = |d: &[std::time::Duration]| median(d).as_secs_f64() * 1e9 / n as f64;
    let ns = per(&ours);
    let rayon_ns = per(&theirs);
    Ok(OverheadResult {
        bench: "overhead",
        deps: cfg.deps,
        tasks: n,
        cpus: cfg.cpus,
        ns_per_task: ns,
        codelet_ns_per_task: per(&codelet),
        rayon_ns_per_task: rayon_ns,
        ratio: ns / rayon_ns,
    })
}
