//! A seeded chaos suite: a group of three coordinators and three workers run a hash DAG while
//! a plan drawn from a seed SIGKILLs and SIGSTOPs workers and coordinators at points of the
//! job's progress (never at wall-clock times). Every job must finish with the right hashes,
//! and no task that had finished before a coordinator fault may complete again after it on a
//! worker that was never frozen (a frozen worker wakes up with the tasks it was given and
//! completes them late; the coordinator discards those results). Each task appends who ran
//! it and when to `runs/<id>`. `FLOTILLA_CHAOS_SEED=N` replays one seed's plan; the seeds and
//! each step are printed.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flotilla::cluster::state::{JobStatus, TaskState};
use flotilla::core::JobId;
use kit::group::Group;
use kit::{assert_succeeded, now_ns, wait_until, HashDag};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const TASKS: usize = 160;
const STEPS: usize = 6;
/// The seeds `.ci/run` runs (each a different plan).
const SEEDS: [u64; 2] = [0xC4A0_5001, 0xC4A0_5002];

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL a worker; a new one takes its place.
    KillWorker,
    /// SIGSTOP a worker until the next step (it is declared lost meanwhile).
    FreezeWorker,
    /// SIGKILL the leader, then start it again (it rejoins as a follower).
    KillLeader,
    /// SIGSTOP the leader until the next step (the others elect another; it stops when it
    /// wakes and finds itself deposed, and is started again).
    FreezeLeader,
}

/// The tasks done in `s`.
fn done(s: &JobStatus) -> HashSet<String> {
    s.tasks
        .iter()
        .filter(|t| t.state == TaskState::Done)
        .map(|t| t.name.clone())
        .collect()
}

/// Waits until `job` has `n` tasks done, restarting any node that stopped meanwhile.
fn wait_done(g: &mut Group, job: JobId, n: usize) -> JobStatus {
    wait_until(
        &format!("{n} tasks of {job} done"),
        Duration::from_secs(240),
        || {
            for id in g.restart_exited() {
                eprintln!("chaos: node {id} had stopped; started again");
            }
            g.status(job)
                .filter(|s| done(s).len() >= n || s.finished_state().is_some())
        },
    )
}

fn run(seed: u64) {
    eprintln!("chaos: seed {seed:#x} (FLOTILLA_CHAOS_SEED={seed} replays this plan)");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dag = HashDag::random(TASKS, seed);
    let mut g = Group::start(3);
    let dir = g.job_dir();
    let file = dag.write_stamped(&dir, "chaos", Some("0.05"));
    let job = g.submit(&file);
    // When a coordinator failed, and the tasks done then: none may complete again.
    let mut settled: Vec<(u128, HashSet<String>)> = Vec::new();
    // Workers that were ever frozen.
    let mut frozen: HashSet<String> = HashSet::new();
    let mut frozen_worker: Option<usize> = None;
    let mut frozen_node: Option<usize> = None;
    for step in 1..=STEPS {
        let s = wait_done(&mut g, job, TASKS * step / (STEPS + 1));
        if s.finished_state().is_some() {
            break;
        }
        if let Some(i) = frozen_worker.take() {
            if let Some(p) = g.worker(i) {
                p.signal(libc::SIGCONT);
            }
        }
        if let Some(id) = frozen_node.take() {
            if let Some(p) = g.node(id) {
                p.signal(libc::SIGCONT);
            }
        }
        let fault = match rng.gen_range(0..4) {
            0 => Fault::KillWorker,
            1 => Fault::FreezeWorker,
            2 => Fault::KillLeader,
            _ => Fault::FreezeLeader,
        };
        let workers: HashMap<String, flotilla::core::WorkerId> = g
            .overview()
            .map(|o| o.workers.into_iter().map(|w| (w.name, w.id)).collect())
            .unwrap_or_default();
        let live: Vec<usize> = (0..16)
            .filter(|i| g.worker(*i).is_some() && workers.contains_key(&format!("w{i}")))
            .collect();
        eprintln!(
            "chaos: step {step}: {} of {TASKS} done; {fault:?}",
            done(&s).len()
        );
        match fault {
            Fault::KillWorker if !live.is_empty() => {
                let i = live[rng.gen_range(0..live.len())];
                g.kill_worker(i);
                g.add_worker();
            }
            Fault::FreezeWorker if !live.is_empty() => {
                let i = live[rng.gen_range(0..live.len())];
                if let Some(p) = g.worker(i) {
                    p.signal(libc::SIGSTOP);
                }
                frozen.insert(format!("tmp-w{i}"));
                frozen_worker = Some(i);
            }
            Fault::KillLeader => {
                let l = g.leader();
                // The time after the status: every task it shows done had completed by then.
                let d = g.status(job).map(|s| done(&s)).unwrap_or_default();
                settled.push((now_ns(), d));
                g.kill_leader(l);
                g.restart_node(l);
            }
            Fault::FreezeLeader => {
                let l = g.leader();
                // The time after the status: every task it shows done had completed by then.
                let d = g.status(job).map(|s| done(&s)).unwrap_or_default();
                settled.push((now_ns(), d));
                if let Some(p) = g.node(l) {
                    p.signal(libc::SIGSTOP);
                }
                frozen_node = Some(l);
            }
            _ => {}
        }
    }
    if let Some(i) = frozen_worker.take() {
        if let Some(p) = g.worker(i) {
            p.signal(libc::SIGCONT);
        }
    }
    if let Some(id) = frozen_node.take() {
        if let Some(p) = g.node(id) {
            p.signal(libc::SIGCONT);
        }
    }
    let s = wait_done(&mut g, job, TASKS);
    let s = if s.finished_state().is_some() {
        s
    } else {
        g.wait_job(job, Duration::from_secs(240))
    };
    assert_succeeded(&s);
    dag.check_outputs(&dir);
    let runs = dag.completed_runs(&dir);
    let mut again = Vec::new();
    for (i, n) in runs.iter().enumerate() {
        let id = HashDag::id(i);
        assert!(*n >= 1, "seed {seed:#x}: {id} never completed");
        let Some(at) = settled
            .iter()
            .filter(|(_, done)| done.contains(&id))
            .map(|(t, _)| *t)
            .min()
        else {
            continue;
        };
        for (who, when) in dag.runs_of(&dir, i) {
            assert!(who.starts_with("tmp-w"), "{id}: run by {who:?}");
            if when > at && !frozen.contains(&who) {
                again.push(format!("{id} by {who} at {when} (settled at {at})"));
            }
        }
    }
    assert!(
        again.is_empty(),
        "seed {seed:#x}: tasks done before a coordinator fault completed again: {again:?}"
    );
}

#[test]
fn seeded_chaos_every_job_finishes_with_the_right_hashes_and_nothing_settled_reruns() {
    let seeds: Vec<u64> = match std::env::var("FLOTILLA_CHAOS_SEED") {
        Ok(s) => vec![s.parse().expect("FLOTILLA_CHAOS_SEED is a number")],
        Err(_) => SEEDS.to_vec(),
    };
    for seed in seeds {
        run(seed);
    }
}
