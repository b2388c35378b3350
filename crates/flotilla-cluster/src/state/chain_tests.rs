//! Chained dispatch: a task whose last unfinished predecessor is placed on a worker is
//! assigned there too, to start the moment that predecessor succeeds (no round trip).

use super::tests::{assigns, cancels_of, retracts as retracts_of, Sim};
use super::*;

const CHAIN: &str = r#"
name = "chain"
[defaults]
retries = 2
[[task]]
id = "a"
cmd = ["a"]
[[task]]
id = "b"
cmd = ["b"]
after = ["a"]
[[task]]
id = "c"
cmd = ["c"]
after = ["b"]
[[task]]
id = "d"
cmd = ["d"]
after = ["c"]
"#;

fn chained_sim() -> Sim {
    let mut sim = Sim::new(2);
    sim.c = Coordinator::new(Config {
        chain_depth: 2,
        ..super::tests::config(2)
    });
    sim
}

fn started(sim: &mut Sim, w: WorkerId, t: TaskRef, attempt: u32) -> Vec<Command> {
    sim.ev(Event::TaskStarted {
        worker: w,
        task: t,
        attempt,
    })
}

#[test]
fn a_chain_is_dispatched_ahead_and_runs_to_the_end() {
    let mut sim = chained_sim();
    let (w, _) = sim.join(super::tests::wspec(1.0, &[]));
    let (job, out) = sim.submit(CHAIN);
    let a = assigns(&out);
    let names: Vec<String> = a.iter().map(|(_, x)| sim.name(x.task)).collect();
    assert_eq!(names, vec!["a", "b", "c"], "a, then two chained behind it");
    let (ta, tb, tc, td) = (
        sim.tref(job, "a"),
        sim.tref(job, "b"),
        sim.tref(job, "c"),
        sim.tref(job, "d"),
    );
    assert_eq!(a[0].1.after, None);
    assert_eq!(a[1].1.after, Some((ta, 1)));
    assert_eq!(a[2].1.after, Some((tb, 1)));
    assert_eq!(a[1].1.reason.policy, "chain");
    assert_eq!(sim.state(job, "b"), TaskState::Assigned);
    assert_eq!(
        sim.state(job, "d"),
        TaskState::Waiting,
        "chain_depth 2 reached"
    );
    // The worker runs a, then b at once (one message: a's finish, b's start).
    started(&mut sim, w, ta, 1);
    sim.finish(w, ta, 1, AttemptOutcome::Succeeded);
    let out = started(&mut sim, w, tb, 1);
    let more = assigns(&out);
    assert_eq!(more.len(), 1, "b started: room for one more link");
    assert_eq!(more[0].1.task, td);
    assert_eq!(more[0].1.after, Some((tc, 1)));
    // b and c finish within one batch (no start reported for c).
    sim.finish(w, tb, 1, AttemptOutcome::Succeeded);
    sim.finish(w, tc, 1, AttemptOutcome::Succeeded);
    sim.finish(w, td, 1, AttemptOutcome::Succeeded);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Succeeded);
    assert!(sim.c.workers_map()[&w].slots.is_empty());
}

#[test]
fn a_failed_predecessor_takes_its_chain_back_and_it_is_chained_again() {
    let mut sim = chained_sim();
    let (w, _) = sim.join(super::tests::wspec(1.0, &[]));
    let (job, _) = sim.submit(CHAIN);
    let (ta, tb, tc) = (sim.tref(job, "a"), sim.tref(job, "b"), sim.tref(job, "c"));
    let out = sim.finish(
        w,
        ta,
        1,
        AttemptOutcome::Failed {
            message: "exit 1".into(),
            retryable: true,
        },
    );
    assert_eq!(retracts_of(&out), vec![(w, tb, 1)]);
    let out = sim.ev(Event::TaskReturned {
        worker: w,
        task: tb,
        attempt: 1,
    });
    assert_eq!(sim.state(job, "b"), TaskState::Waiting);
    assert_eq!(retracts_of(&out), vec![(w, tc, 1)], "c waited on b");
    sim.ev(Event::TaskReturned {
        worker: w,
        task: tc,
        attempt: 1,
    });
    assert_eq!(sim.state(job, "c"), TaskState::Waiting);
    assert!(sim.c.workers_map()[&w].slots.is_empty());
    // a's retry: the chain is dispatched again behind it.
    sim.now += 1_000;
    let out = sim.ev(Event::Tick);
    let a = assigns(&out);
    assert_eq!(a.len(), 3);
    assert_eq!(a[1].1.after, Some((ta, 2)));
    assert_eq!(a[1].1.attempt, 2);
}

#[test]
fn a_lost_worker_takes_its_chain_with_it_and_others_run_it() {
    let mut sim = chained_sim();
    let (w1, _) = sim.join(super::tests::wspec(1.0, &[]));
    let (job, _) = sim.submit(CHAIN);
    let (w2, _) = sim.join(super::tests::wspec(1.0, &[]));
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "gone".into(),
    });
    assert!(cancels_of(&out).is_empty());
    let a = assigns(&out);
    assert_eq!(a[0].0, w2);
    assert_eq!(sim.name(a[0].1.task), "a");
    assert_eq!(
        sim.state(job, "b"),
        TaskState::Assigned,
        "chained again on w2"
    );
    assert_eq!(a[1].0, w2);
}

#[test]
fn no_chaining_with_two_unfinished_predecessors_or_transfer_staging() {
    let mut sim = chained_sim();
    sim.join(super::tests::wspec(2.0, &[]));
    let (job, out) = sim.submit(
        "[[task]]\nid = \"x\"\ncmd = [\"x\"]\n[[task]]\nid = \"y\"\ncmd = [\"y\"]\n[[task]]\nid = \"z\"\ncmd = [\"z\"]\nafter = [\"x\", \"y\"]\n",
    );
    assert_eq!(assigns(&out).len(), 2);
    assert_eq!(sim.state(job, "z"), TaskState::Waiting);
    let (job, out) = sim.submit(&format!("staging = \"transfer\"\n{CHAIN}"));
    let placed = assigns(&out);
    assert_eq!(
        placed.len(),
        1,
        "only a: nothing chained behind it in transfer staging"
    );
    assert_eq!(sim.name(placed[0].1.task), "a");
    assert_eq!(placed[0].1.after, None);
    assert_eq!(sim.state(job, "b"), TaskState::Waiting);
}

/// A job that keeps going ends on the failure's own report when the only task left is one
/// chained behind the failed task: the worker's answer to its retraction is not journaled,
/// and waiting for it left the job running after a restart (and for good after a lost
/// worker). The chained task is stopped and cancelled as one that needs the failed task.
#[test]
fn a_job_that_keeps_going_ends_on_the_failure_of_a_task_with_a_chained_successor() {
    let mut sim = chained_sim();
    let (job, _) = sim.submit(&format!(
        "keep_going = true\n{}",
        CHAIN.replace("retries = 2", "retries = 0")
    ));
    let (w, out) = sim.join(super::tests::wspec(1.0, &[]));
    let a = sim.tref(job, "a");
    let b = sim.tref(job, "b");
    let placed: Vec<TaskRef> = assigns(&out).iter().map(|(_, t)| t.task).collect();
    assert!(
        placed.contains(&a) && placed.contains(&b),
        "b chained behind a: {placed:?}"
    );
    started(&mut sim, w, a, 1);
    let out = sim.finish(w, a, 1, super::tests::failed("boom", true));
    assert_eq!(
        super::tests::job_finished(&out),
        vec![(job, JobState::Failed)],
        "ended on a's report"
    );
    assert!(
        !retracts_of(&out).is_empty() || !cancels_of(&out).is_empty(),
        "b is stopped"
    );
    // b and c, chained on the worker, never started: cancelled at once with d, for the same
    // reason; the worker's answers for them change nothing.
    let s = sim.c.job_status(job).unwrap();
    for t in ["b", "c", "d"] {
        let task = s.tasks.iter().find(|x| x.name == t).unwrap();
        assert_eq!(task.state, TaskState::Cancelled, "{t}");
        assert_eq!(
            task.message.as_deref(),
            Some("not run: it needs a task that failed"),
            "{t}"
        );
    }
    for t in ["b", "c"] {
        let task = sim.tref(job, t);
        let out = sim.ev(Event::TaskReturned {
            worker: w,
            task,
            attempt: 1,
        });
        assert!(super::tests::job_finished(&out).is_empty());
        assert_eq!(sim.state(job, t), TaskState::Cancelled, "{t}");
    }
    assert_eq!(sim.c.workers()[0].used.cpus, 0.0, "their slots are freed");
}
