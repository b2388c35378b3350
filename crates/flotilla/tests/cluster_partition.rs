//! Network faults between one worker and the coordinator, through a relay of the test's own
//! (`kit/relay.rs`): a slow link is tolerated; a link that goes silent (a black hole: the
//! connections stay open and carry nothing) gets the worker declared lost and its work placed
//! on the other worker; when the link heals, the worker rejoins and the results it finished
//! during the partition, re-sent late, are discarded; a link whose connections are reset gets
//! the worker declared lost at once, and it rejoins when the link comes back.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::{Duration, Instant};

use flotilla::cluster::state::TaskState;
use kit::relay::Relay;
use kit::{assert_succeeded, cut, now_ns, wait_until, Cluster, HashDag};

const TASKS: usize = 80;

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
    let far = cut::worker_id(&c, "w1");
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

    // The link goes silent; then it heals, and the worker rejoins (a new session, a new id)
    // and re-sends what it finished meanwhile: none of it changes the job.
    // The cut's time is taken once it is made: a result that crossed before it was stamped
    // before it too (taken before, a result crossing in between failed the check).
    relay.black_hole();
    let cut_ns = now_ns();
    cut::wait_lost(&c, far, Instant::now(), "a silent worker");
    let settled = cut::settle(&c, job, &dag, &dir, far, "far-tmp", cut_ns);
    relay.heal();
    cut::rejoined_and_unchanged(&c, job, "w1", &settled);

    // Reset: every connection of the link closed and new ones refused. The session closes,
    // so the worker is lost at once, not after the heartbeat timeout.
    let back = cut::worker_id(&c, "w1");
    relay.reset();
    cut::wait_lost(&c, back, Instant::now(), "a worker whose link was reset");
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
