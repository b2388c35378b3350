//! Network faults between one worker and the coordinator, through a relay of the test's own
//! (`kit/relay.rs`): a slow link is tolerated; a link that goes silent (a black hole: the
//! connections stay open and carry nothing) gets the worker declared lost and its work placed
//! on the other worker; when the link heals, the worker rejoins and the results it finished
//! during the partition, re-sent late, are discarded; a link whose connections are reset gets
//! the worker declared lost at once, and it rejoins when the link comes back.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flotilla::cluster::state::TaskState;
use flotilla::core::WorkerId;
use kit::relay::Relay;
use kit::{assert_succeeded, now_ns, wait_until, Cluster, HashDag};

const TASKS: usize = 80;

/// The id of the live worker named `name`, once it is registered.
fn worker_id(c: &Cluster, name: &str) -> WorkerId {
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

#[test]
fn a_partitioned_worker_is_found_lost_its_work_placed_again_and_its_late_results_discarded() {
    let dag = HashDag::random(TASKS, 0x9a_7171);
    let mut c = Cluster::start(1, 2);
    let relay = Relay::start(c.addr);
    // Its tasks see its TMPDIR (one of the few host variables a task gets): they write who
    // ran them, and when, into `runs/<id>`.
    let far_tmp = c.root().join("far-tmp");
    std::fs::create_dir_all(&far_tmp).unwrap();
    c.add_worker_at(
        2,
        &relay.addr.to_string(),
        &[("TMPDIR", far_tmp.to_str().unwrap())],
    );
    c.wait_workers(2);
    let far = worker_id(&c, "w1");
    let dir = c.job_dir();
    // A slow link first: 50 ms on every chunk each way is no reason to lose a worker.
    relay.slow(Duration::from_millis(50));
    let file = dag.write_stamped(&dir, "partition", Some("0.2"));
    let job = c.submit(&file);
    c.wait_status(
        job,
        "the far worker running a task",
        Duration::from_secs(120),
        |s| {
            s.tasks
                .iter()
                .any(|t| t.worker == Some(far) && t.state == TaskState::Done)
                && s.tasks
                    .iter()
                    .any(|t| t.worker == Some(far) && t.state == TaskState::Running)
        },
    );
    relay.heal();
    let before = c.status(job).unwrap();
    assert!(
        before.tasks.iter().all(|t| t.failures == 0),
        "the slow link failed a task"
    );

    // The link goes silent.
    let cut_ns = now_ns();
    relay.black_hole();
    let cut = Instant::now();
    wait_until(
        "the far worker declared lost",
        Duration::from_secs(60),
        || (!c.live_workers().contains_key(&far)).then_some(()),
    );
    eprintln!(
        "a silent worker was declared lost {:?} after its link was cut (heartbeat timeout {} ms)",
        cut.elapsed(),
        kit::HEARTBEAT_TIMEOUT_MS
    );
    let s = c.wait_job(job, Duration::from_secs(180));
    assert_succeeded(&s);
    dag.check_outputs(&dir);
    let settled: HashMap<String, (Option<WorkerId>, u32)> = s
        .tasks
        .iter()
        .map(|t| (t.name.clone(), (t.worker, t.attempts)))
        .collect();
    // What the partitioned worker finished after the cut never counts: a task credited to
    // it completed there before the cut.
    let mut late = 0;
    for i in 0..TASKS {
        let id = HashDag::id(i);
        let far_runs: Vec<u128> = dag
            .runs_of(&dir, i)
            .into_iter()
            .filter(|(who, _)| who == "far-tmp")
            .map(|(_, when)| when)
            .collect();
        late += far_runs.iter().filter(|t| **t > cut_ns).count();
        if settled[&id].0 == Some(far) {
            assert!(
                far_runs.iter().any(|t| *t < cut_ns),
                "{id} is credited to the partitioned worker, which completed it only after the \
                 cut: {:?}",
                dag.runs_of(&dir, i)
            );
        }
    }
    eprintln!("the partitioned worker completed {late} tasks after the cut (not counted)");

    // The link heals: the worker rejoins (a new session, a new id) and re-sends what it
    // finished meanwhile; none of it changes the job.
    relay.heal();
    wait_until("the far worker back", Duration::from_secs(120), || {
        c.live_workers().values().any(|n| n == "w1").then_some(())
    });
    let after = c.status(job).unwrap();
    assert_succeeded(&after);
    for t in &after.tasks {
        assert_eq!(
            settled[&t.name],
            (t.worker, t.attempts),
            "{} changed after the partitioned worker came back",
            t.name
        );
    }

    // Reset: every connection of the link closed and new ones refused. The session closes,
    // so the worker is lost at once, not after the heartbeat timeout.
    let back = worker_id(&c, "w1");
    relay.reset();
    let cut = Instant::now();
    wait_until(
        "the reset worker declared lost",
        Duration::from_secs(60),
        || (!c.live_workers().contains_key(&back)).then_some(()),
    );
    eprintln!(
        "a worker whose link was reset was declared lost after {:?}",
        cut.elapsed()
    );
    relay.heal();
    wait_until("the reset worker back", Duration::from_secs(120), || {
        c.live_workers().values().any(|n| n == "w1").then_some(())
    });
    // It takes work again.
    let dag2 = HashDag::random(20, 0x9a_7172);
    let dir2 = dir.join("again");
    let job2 = c.submit(&dag2.write(&dir2, "again", None));
    let s2 = c.wait_job(job2, Duration::from_secs(120));
    assert_succeeded(&s2);
    dag2.check_outputs(&dir2);
}
