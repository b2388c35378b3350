//! A 300-task random DAG through a real coordinator and two workers (processes): every
//! task hashes its id and its parents' outputs, and the test recomputes every hash, so a
//! task run before its parents, or on stale or partial data, is caught.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::{Duration, Instant};

use kit::{assert_succeeded, Cluster, HashDag};

#[test]
fn random_dag_of_300_tasks_produces_every_hash_in_order() {
    let dag = HashDag::random(300, 0xF10_7111A);
    // The DAG really has structure: roots, joins of three, long chains.
    assert!(dag.parents.iter().filter(|p| p.is_empty()).count() >= 10);
    assert!(dag.parents.iter().filter(|p| p.len() == 3).count() >= 50);
    let c = Cluster::start(2, 2);
    let dir = c.job_dir();
    let file = dag.write(&dir, "hashdag", None);
    let started = Instant::now();
    let job = c.submit(&file);
    let s = c.wait_job(job, Duration::from_secs(90));
    eprintln!(
        "300-task DAG: makespan {:.2} s (wall {:.2} s)",
        s.makespan_s,
        started.elapsed().as_secs_f64()
    );
    assert_succeeded(&s);
    assert_eq!(s.total, 300);
    // The critical path (by measured wall times) is positive, at least the longest task,
    // and no longer than the makespan.
    let longest = s
        .tasks
        .iter()
        .filter_map(|t| t.usage.as_ref().map(|u| u.wall_seconds))
        .fold(0.0, f64::max);
    assert!(
        s.critical_path_s >= longest && s.critical_path_s <= s.makespan_s + 1e-6,
        "critical path {} (longest task {longest}, makespan {})",
        s.critical_path_s,
        s.makespan_s
    );
    assert_eq!(s.counts.done, 300);
    dag.check_outputs(&dir);
    let runs = dag.completed_runs(&dir);
    let bad: Vec<_> = runs
        .iter()
        .enumerate()
        .filter(|(_, &n)| n != 1)
        .map(|(i, n)| (HashDag::id(i), *n))
        .collect();
    assert!(bad.is_empty(), "tasks not run exactly once: {bad:?}");
    // Both workers took part.
    let workers: std::collections::HashSet<_> = s.tasks.iter().filter_map(|t| t.worker).collect();
    assert_eq!(workers.len(), 2, "tasks ran on {workers:?}");
}
