//! What the partition tests check around a worker cut off from the coordinator (through the
//! relay of `relay.rs`, or a network namespace whose link is pulled): it is found lost, the
//! job completes elsewhere, nothing it finished after the cut is credited to it, and when it
//! comes back nothing in the job changes.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use flotilla::cluster::state::JobStatus;
use flotilla::core::{JobId, WorkerId};

use super::{assert_succeeded, wait_until, Cluster, HashDag, HEARTBEAT_TIMEOUT_MS};

/// Each task's worker and attempts, as the final status has them.
pub(crate) type Settled = HashMap<String, (Option<WorkerId>, u32)>;

/// The id of the live worker named `name`, once it is registered.
pub(crate) fn worker_id(c: &Cluster, name: &str) -> WorkerId {
    wait_until(
        &format!("{name} registered"),
        Duration::from_secs(60),
        || {
            c.live_workers()
                .into_iter()
                .find(|(_, n)| n == name)
                .map(|(id, _)| id)
        },
    )
}

/// Waits until `far` is declared lost after the cut made at `cut`; says how long it took.
pub(crate) fn wait_lost(c: &Cluster, far: WorkerId, cut: Instant, what: &str) {
    wait_until(
        &format!("{what} declared lost"),
        Duration::from_secs(60),
        || (!c.live_workers().contains_key(&far)).then_some(()),
    );
    eprintln!(
        "{what} was declared lost {:?} after the cut (heartbeat timeout {HEARTBEAT_TIMEOUT_MS} ms)",
        cut.elapsed()
    );
}

/// Waits for the job (a `write_stamped` hash DAG in `dir`) to succeed with the right outputs,
/// and checks that a task credited to `far` was completed by it (its TMPDIR named `far_tmp`)
/// before `cut_ns`; returns each task's worker and attempts.
pub(crate) fn settle(
    c: &Cluster,
    job: JobId,
    dag: &HashDag,
    dir: &Path,
    far: WorkerId,
    far_tmp: &str,
    cut_ns: u128,
) -> Settled {
    let s = c.wait_job(job, Duration::from_secs(180));
    assert_succeeded(&s);
    dag.check_outputs(dir);
    let settled: Settled = s
        .tasks
        .iter()
        .map(|t| (t.name.clone(), (t.worker, t.attempts)))
        .collect();
    let mut late = 0;
    for i in 0..dag.parents.len() {
        let id = HashDag::id(i);
        let far_runs: Vec<u128> = dag
            .runs_of(dir, i)
            .into_iter()
            .filter(|(who, _)| who == far_tmp)
            .map(|(_, when)| when)
            .collect();
        late += far_runs.iter().filter(|t| **t > cut_ns).count();
        if settled[&id].0 == Some(far) {
            assert!(
                far_runs.iter().any(|t| *t < cut_ns),
                "{id} is credited to the cut-off worker, which completed it only after the cut: \
                 {:?}",
                dag.runs_of(dir, i)
            );
        }
    }
    eprintln!("the cut-off worker completed {late} tasks after the cut (not counted)");
    settled
}

/// Waits until a worker named `name` is registered again, then checks that the job's tasks
/// still have the workers and attempts they settled with.
pub(crate) fn rejoined_and_unchanged(c: &Cluster, job: JobId, name: &str, settled: &Settled) {
    wait_until(&format!("{name} back"), Duration::from_secs(120), || {
        c.live_workers().values().any(|n| n == name).then_some(())
    });
    let after: JobStatus = c.status(job).expect("the job's status");
    assert_succeeded(&after);
    for t in &after.tasks {
        assert_eq!(
            settled[&t.name],
            (t.worker, t.attempts),
            "{} changed after the cut-off worker came back",
            t.name
        );
    }
}
