//! Unit tests of the agent's transitions, one per row of the table in the module doc.

use flotilla_core::ledger::{Ledger, LedgerGpu};
use flotilla_core::{JobId, Resources, TaskId};

use super::*;

fn key(task: u32) -> Attempt {
    (
        TaskRef {
            job: JobId::new(1),
            task: TaskId::new(task),
        },
        0,
    )
}

fn cpus(n: f64) -> Resources {
    Resources {
        cpus: n,
        ..Resources::zero()
    }
}

fn work(task: u32, need: Resources) -> Work<u32> {
    Work {
        key: key(task),
        need,
        gpus: Vec::new(),
        after: None,
        payload: task,
    }
}

fn agent(n: f64, gpus: &[(u32, u64)]) -> Agent<u32> {
    let gpus: Vec<LedgerGpu> = gpus
        .iter()
        .map(|&(index, mem_bytes)| LedgerGpu { index, mem_bytes })
        .collect();
    Agent::new(Ledger::new(cpus(n), &gpus).expect("a valid offer"))
}

fn result(outcome: AttemptOutcome) -> AttemptResult {
    AttemptResult {
        outcome,
        usage: Usage::default(),
        outputs: Vec::new(),
        variant: None,
    }
}

fn ok() -> AttemptResult {
    result(AttemptOutcome::Succeeded)
}

fn failed() -> AttemptResult {
    result(AttemptOutcome::Failed {
        message: "exit 1".into(),
        retryable: true,
    })
}

fn assign(a: &mut Agent<u32>, works: Vec<Work<u32>>) -> Vec<Command<u32>> {
    a.message(&[], &[], works, 0)
}

/// The commands as short strings, in order: `started 3`, `start 3`, `finished 3 ok`, ….
fn show(cmds: &[Command<u32>]) -> Vec<String> {
    cmds.iter()
        .map(|c| match c {
            Command::Report(Report::Started(k)) => format!("started {}", k.0.task.0),
            Command::Report(Report::Finished(k, r)) => {
                let how = match &r.outcome {
                    AttemptOutcome::Succeeded => "ok",
                    AttemptOutcome::Cancelled => "cancelled",
                    AttemptOutcome::Failed { .. } => "failed",
                    AttemptOutcome::Preempted { .. } => "preempted",
                };
                format!("finished {} {how}", k.0.task.0)
            }
            Command::Report(Report::Returned(k)) => format!("returned {}", k.0.task.0),
            Command::Start { key, payload } => {
                assert_eq!(
                    key.0.task.0, *payload,
                    "the payload travels with its attempt"
                );
                format!("start {payload}")
            }
            Command::Kill(k) => format!("kill {}", k.0.task.0),
        })
        .collect()
}

#[test]
fn starts_what_fits_and_queues_the_rest() {
    let mut a = agent(2.0, &[]);
    let cmds = assign(&mut a, (1..=3).map(|t| work(t, cpus(1.0))).collect());
    assert_eq!(
        show(&cmds),
        ["started 1", "start 1", "started 2", "start 2"]
    );
    assert_eq!(a.queued().count(), 1);
    assert_eq!(a.ledger().used().cpus, 2.0);
}

#[test]
fn a_finish_is_reported_before_the_start_it_makes_room_for() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    let cmds = a.finished(key(1), ok(), 5);
    assert_eq!(show(&cmds), ["finished 1 ok", "started 2", "start 2"]);
}

#[test]
fn a_later_attempt_may_start_around_one_that_does_not_fit_yet() {
    let mut a = agent(2.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0))]);
    let cmds = assign(&mut a, vec![work(2, cpus(2.0)), work(3, cpus(1.0))]);
    assert_eq!(show(&cmds), ["started 3", "start 3"]);
    a.finished(key(1), ok(), 1);
    let cmds = a.finished(key(3), ok(), 2);
    assert_eq!(show(&cmds), ["finished 3 ok", "started 2", "start 2"]);
}

#[test]
fn a_chained_attempt_waits_for_its_predecessor_to_succeed_here() {
    let mut a = agent(4.0, &[]);
    let mut b = work(2, cpus(1.0));
    b.after = Some(key(1));
    let mut c = work(3, cpus(1.0));
    c.after = Some(key(2));
    let cmds = assign(&mut a, vec![work(1, cpus(1.0)), b, c]);
    assert_eq!(
        show(&cmds),
        ["started 1", "start 1"],
        "free cores do not start b or c"
    );
    let cmds = a.finished(key(1), ok(), 1);
    assert_eq!(show(&cmds), ["finished 1 ok", "started 2", "start 2"]);
    let cmds = a.finished(key(2), failed(), 2);
    assert_eq!(show(&cmds), ["finished 2 failed"], "c waits: b failed");
    assert_eq!(
        a.queued().count(),
        1,
        "c stays until the coordinator retracts it"
    );
    let cmds = a.message(&[], &[key(3)], Vec::new(), 3);
    assert_eq!(show(&cmds), ["returned 3"]);
}

#[test]
fn a_success_of_another_attempt_does_not_release_a_chained_one() {
    let mut a = agent(2.0, &[]);
    let mut b = work(2, cpus(1.0));
    b.after = Some((key(1).0, 1));
    assign(&mut a, vec![work(1, cpus(1.0)), b]);
    let cmds = a.finished(key(1), ok(), 1);
    assert_eq!(show(&cmds), ["finished 1 ok"], "attempt 0 is not attempt 1");
}

#[test]
fn cancelling_a_queued_attempt_ends_it_and_a_running_one_is_killed() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    let cmds = a.message(&[key(2), key(1), key(9)], &[], Vec::new(), 1);
    assert_eq!(show(&cmds), ["finished 2 cancelled", "kill 1"]);
    assert_eq!(
        a.running().count(),
        1,
        "a killed attempt runs until it reports"
    );
    let cmds = a.finished(key(1), result(AttemptOutcome::Cancelled), 2);
    assert_eq!(show(&cmds), ["finished 1 cancelled"]);
    assert_eq!(a.ledger().held(), 0);
}

#[test]
fn retracting_returns_a_queued_attempt_and_ignores_a_running_one() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    let cmds = a.message(&[], &[key(1), key(2)], Vec::new(), 1);
    assert_eq!(show(&cmds), ["returned 2"]);
    assert_eq!(a.running().count(), 1);
}

#[test]
fn an_attempt_that_can_never_run_here_fails_at_once() {
    let mut a = agent(2.0, &[(0, 100)]);
    let mut gpu = work(2, cpus(1.0));
    gpu.need.gpus = 1.0;
    gpu.gpus = vec![5];
    let mut no_gpu_given = work(3, cpus(1.0));
    no_gpu_given.need.gpus = 1.0;
    let cmds = assign(&mut a, vec![work(1, cpus(3.0)), gpu, no_gpu_given]);
    assert_eq!(
        show(&cmds),
        [
            "finished 1 failed",
            "finished 2 failed",
            "finished 3 failed"
        ]
    );
    let Command::Report(Report::Finished(_, r)) = &cmds[0] else {
        panic!("a finish first");
    };
    assert!(
        matches!(&r.outcome, AttemptOutcome::Failed { message, retryable: true }
            if message.contains("cpus=3") && message.contains("cpus=2")),
        "{r:?}"
    );
}

#[test]
fn gpu_shares_are_counted_per_gpu() {
    let mut a = agent(8.0, &[(0, 100), (1, 100)]);
    let half = |t: u32, gpu: u32| {
        let mut w = work(t, cpus(1.0));
        w.need.gpus = 0.5;
        w.need.gpu_mem = 40;
        w.gpus = vec![gpu];
        w
    };
    let cmds = assign(&mut a, vec![half(1, 0), half(2, 0), half(3, 0), half(4, 1)]);
    assert_eq!(
        show(&cmds),
        [
            "started 1",
            "start 1",
            "started 2",
            "start 2",
            "started 4",
            "start 4"
        ]
    );
    let mut whole = work(5, cpus(1.0));
    whole.need.gpus = 1.0;
    whole.gpus = vec![1];
    assert!(
        show(&assign(&mut a, vec![whole])).is_empty(),
        "GPU 1 is half taken"
    );
    let cmds = a.finished(key(4), ok(), 1);
    assert_eq!(show(&cmds), ["finished 4 ok", "started 5", "start 5"]);
    let cmds = a.finished(key(1), ok(), 2);
    assert_eq!(show(&cmds), ["finished 1 ok", "started 3", "start 3"]);
}

#[test]
fn gpu_memory_bounds_sharing() {
    let mut a = agent(8.0, &[(0, 100)]);
    let big = |t: u32| {
        let mut w = work(t, cpus(1.0));
        w.need.gpus = 0.25;
        w.need.gpu_mem = 60;
        w.gpus = vec![0];
        w
    };
    let cmds = assign(&mut a, vec![big(1), big(2)]);
    assert_eq!(show(&cmds), ["started 1", "start 1"], "60 + 60 > 100");
}

#[test]
fn a_duplicate_assignment_is_dropped() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    let cmds = assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    assert!(cmds.is_empty());
    assert_eq!(a.queued().count(), 1);
    assert_eq!(a.running().count(), 1);
}

#[test]
fn rejoining_drops_the_queue_and_resends_recent_finishes() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, (1..=3).map(|t| work(t, cpus(1.0))).collect());
    a.finished(key(1), ok(), 1_000);
    let rejoin = a.rejoin(1_000 + RESEND_MS);
    assert_eq!(rejoin.running, vec![key(2)]);
    assert_eq!(rejoin.resend, vec![(key(1), ok())]);
    assert_eq!(rejoin.dropped, vec![key(3)]);
    assert_eq!(a.queued().count(), 0);
    let rejoin = a.rejoin(1_001 + RESEND_MS);
    assert!(rejoin.resend.is_empty(), "older than RESEND_MS");
}

#[test]
fn a_finish_of_an_attempt_not_running_here_is_ignored() {
    let mut a = agent(1.0, &[]);
    assign(&mut a, vec![work(1, cpus(1.0))]);
    assert!(a.finished(key(7), ok(), 1).is_empty());
    assert_eq!(a.ledger().held(), 1);
}

#[test]
fn only_the_last_successes_are_remembered_for_chains() {
    let mut a = agent(1.0, &[]);
    for t in 0..=SUCCEEDED_KEPT as u32 {
        assign(&mut a, vec![work(t, cpus(1.0))]);
        a.finished(key(t), ok(), 0);
    }
    let chained = |t: u32, after: u32| {
        let mut w = work(t, cpus(1.0));
        w.after = Some(key(after));
        w
    };
    let first = SUCCEEDED_KEPT as u32 + 1;
    let cmds = assign(&mut a, vec![chained(first, 0), chained(first + 1, 1)]);
    assert_eq!(
        started(&cmds),
        vec![key(first + 1)],
        "success 0 was forgotten"
    );
}

#[test]
fn a_reclaimed_worker_gives_back_its_queue_and_what_still_arrives_until_it_resumes() {
    let mut a = agent(1.0, &[]);
    let out = assign(&mut a, vec![work(1, cpus(1.0)), work(2, cpus(1.0))]);
    assert_eq!(show(&out), ["started 1", "start 1"]);
    assert_eq!(show(&a.reclaim()), ["returned 2"]);
    assert!(a.is_paused());
    assert_eq!(
        show(&assign(&mut a, vec![work(3, cpus(1.0))])),
        ["returned 3"]
    );
    // The running one ends preempted; nothing starts in its place.
    let preempted = result(AttemptOutcome::Preempted {
        checkpoint: Vec::new(),
    });
    assert_eq!(
        show(&a.finished(key(1), preempted, 0)),
        ["finished 1 preempted"]
    );
    a.resume();
    assert_eq!(
        show(&assign(&mut a, vec![work(4, cpus(1.0))])),
        ["started 4", "start 4"]
    );
}
