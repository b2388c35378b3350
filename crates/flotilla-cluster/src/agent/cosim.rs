//! The coordinator's state machine and one agent state per worker, wired together as the
//! session would wire them (assignments, cancels and retractions down; starts, finishes and
//! returns up), with random jobs, random workers (GPUs shared and whole), random finish
//! orders, failures and retries. Both sides keep their own [`Ledger`]: the agent must never
//! refuse what the coordinator placed (they agree on what fits), the agent's running
//! attempts never exceed the worker, and every job ends.

use std::collections::{BTreeMap, VecDeque};

use flotilla_core::ledger::Ledger;
use flotilla_core::{parse_job, WorkerId};
use proptest::prelude::*;

use super::*;
use crate::state::{
    Command as CoordCommand, Config, Coordinator, Event, GpuInfo, JobState, WorkerSpec,
};

/// A message on its way to an agent.
enum Down {
    Assign(Vec<Work<()>>),
    Cancel(Attempt),
    Retract(Attempt),
}

struct Node {
    agent: Agent<()>,
    inbox: VecDeque<Down>,
}

fn worker_spec(i: usize, cpus: f64, gpus: usize) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        hostname: "host".into(),
        hw_class: if gpus == 0 { "cpu" } else { "gpu" }.into(),
        resources: Resources {
            cpus,
            mem: 8 << 30,
            ..Resources::zero()
        },
        gpus: (0..gpus)
            .map(|g| GpuInfo {
                index: g as u32,
                model: "test".into(),
                mem_bytes: 16 << 30,
            })
            .collect(),
        data_addr: format!("w{i}"),
    }
}

/// A job of `n` tasks in layers: task i depends on a random earlier one (or none), needs a
/// random amount of CPUs, and some use a GPU share or whole GPUs.
fn job_text(tasks: &[(Option<usize>, u8, u8)]) -> String {
    let mut s = String::from("[defaults]\nretries = 3\n");
    for (i, (after, cpus, gpu)) in tasks.iter().enumerate() {
        s.push_str(&format!("[[task]]\nid = \"t{i}\"\ncmd = [\"x\"]\n"));
        if let Some(a) = after.filter(|&a| a < i) {
            s.push_str(&format!("after = [\"t{a}\"]\n"));
        }
        let gpus = match gpu {
            0 => String::new(),
            1 => ", gpus = 0.5, gpu_mem = \"4GiB\"".into(),
            _ => ", gpus = 1".into(),
        };
        s.push_str(&format!("resources = {{ cpus = {cpus}{gpus} }}\n"));
    }
    s
}

fn run(workers: &[(u8, u8)], tasks: &[(Option<usize>, u8, u8)], fates: &[u8]) {
    let mut c = Coordinator::new(Config {
        retry_backoff_ms: 0,
        max_backoff_ms: 0,
        reconcile_grace_ms: 0,
        queue_depth: 2,
        chain_depth: 4,
    });
    let mut now = 0;
    let mut nodes: BTreeMap<WorkerId, Node> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, &(cpus, gpus)) in workers.iter().enumerate() {
        let spec = worker_spec(i, f64::from(cpus), usize::from(gpus));
        let id = c.next_worker_id();
        let gpus: Vec<_> = spec
            .gpus
            .iter()
            .map(|g| flotilla_core::ledger::LedgerGpu {
                index: g.index,
                mem_bytes: g.mem_bytes,
            })
            .collect();
        let ledger = Ledger::new(spec.resources.clone(), &gpus).expect("a valid offer");
        nodes.insert(
            id,
            Node {
                agent: Agent::new(ledger),
                inbox: VecDeque::new(),
            },
        );
        c.handle(
            now,
            Event::WorkerJoined {
                worker: id,
                spec,
                running: Vec::new(),
                held: Vec::new(),
            },
            &mut out,
        )
        .expect("joins");
    }
    let spec = parse_job(&job_text(tasks), "job.toml").expect("a valid job");
    let job = c.next_job_id();
    c.handle(
        now,
        Event::JobSubmitted {
            job,
            spec,
            dir: "/jobs".into(),
            tenant: "t".into(),
        },
        &mut out,
    )
    .expect("accepted");
    // What runs on the agents, oldest first.
    let mut running: Vec<(WorkerId, Attempt)> = Vec::new();
    let mut fate = fates.iter().cycle();
    let mut idle = 0;
    for _step in 0..100_000 {
        // Down: the coordinator's commands to the agents' inboxes.
        for cmd in out.drain(..) {
            match cmd {
                CoordCommand::Assign { worker, tasks } => {
                    let works = tasks
                        .into_iter()
                        .map(|a| Work {
                            key: (a.task, a.attempt),
                            need: a.resources,
                            gpus: a.gpu_indices,
                            after: a.after,
                            payload: (),
                        })
                        .collect();
                    nodes
                        .get_mut(&worker)
                        .expect("a live worker")
                        .inbox
                        .push_back(Down::Assign(works));
                }
                CoordCommand::Cancel {
                    worker,
                    task,
                    attempt,
                } => nodes
                    .get_mut(&worker)
                    .expect("a live worker")
                    .inbox
                    .push_back(Down::Cancel((task, attempt))),
                CoordCommand::Retract {
                    worker,
                    task,
                    attempt,
                } => nodes
                    .get_mut(&worker)
                    .expect("a live worker")
                    .inbox
                    .push_back(Down::Retract((task, attempt))),
                CoordCommand::Notify(_) => {}
            }
        }
        // Agents handle their inboxes; up: their reports to the coordinator.
        let mut up: Vec<(WorkerId, Command<()>)> = Vec::new();
        for (id, node) in nodes.iter_mut() {
            while let Some(m) = node.inbox.pop_front() {
                let cmds = match m {
                    Down::Assign(w) => node.agent.message(&[], &[], w, now),
                    Down::Cancel(k) => node.agent.message(&[k], &[], Vec::new(), now),
                    Down::Retract(k) => node.agent.message(&[], &[k], Vec::new(), now),
                };
                up.extend(cmds.into_iter().map(|c| (*id, c)));
            }
            check_capacity(&node.agent);
        }
        if up.is_empty() && running.is_empty() {
            // Nothing moves: let time pass (retry backoffs), a few times, then stop.
            idle += 1;
            if idle > 3 {
                break;
            }
            now += 1_000;
        } else if up.is_empty() {
            idle = 0;
            // Something ends (one of those running, as the fates say); most succeed.
            let f = *fate.next().expect("cycle");
            let (worker, key) = running.remove(usize::from(f) % running.len());
            let outcome = if f % 7 == 3 {
                AttemptOutcome::Failed {
                    message: "exit 1".into(),
                    retryable: true,
                }
            } else {
                AttemptOutcome::Succeeded
            };
            let result = AttemptResult {
                outcome,
                usage: Usage::default(),
                outputs: Vec::new(),
                variant: None,
            };
            now += 10;
            let node = nodes.get_mut(&worker).expect("a live worker");
            let cmds = node.agent.finished(key, result, now);
            check_capacity(&node.agent);
            up.extend(cmds.into_iter().map(|c| (worker, c)));
        }
        for (worker, cmd) in up {
            let ev = match cmd {
                Command::Report(Report::Started(k)) => Event::TaskStarted {
                    worker,
                    task: k.0,
                    attempt: k.1,
                },
                Command::Report(Report::Finished(k, result)) => {
                    if let AttemptOutcome::Failed { message, .. } = &result.outcome {
                        assert!(
                            !message.contains("cannot run"),
                            "the agent refused what the coordinator placed: {message}"
                        );
                    }
                    running.retain(|r| r.1 != k);
                    Event::TaskFinished {
                        worker,
                        task: k.0,
                        attempt: k.1,
                        result,
                    }
                }
                Command::Report(Report::Returned(k)) => Event::TaskReturned {
                    worker,
                    task: k.0,
                    attempt: k.1,
                },
                Command::Start { key, .. } => {
                    running.push((worker, key));
                    continue;
                }
                // Killed attempts end as cancelled, the next time one ends.
                Command::Kill(_) => continue,
            };
            c.handle(now, ev, &mut out).expect("a valid report");
        }
        now += 1;
        c.handle(now, Event::Tick, &mut out).expect("ticks");
    }
    let status = c.job_status(job).expect("known job");
    assert_ne!(
        status.state,
        JobState::Running,
        "the job hangs: {:?}",
        status
            .tasks
            .iter()
            .map(|t| (&t.name, t.state))
            .collect::<Vec<_>>()
    );
}

/// The agent's ledger never holds more than the worker has.
fn check_capacity<P>(a: &Agent<P>) {
    let l = a.ledger();
    assert!(l.used().cpus <= l.cap().cpus + flotilla_core::ledger::EPS);
    for g in l.gpus() {
        assert!(g.share <= 1.0 + flotilla_core::ledger::EPS);
        assert!(g.mem_used <= g.gpu.mem_bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_coordinator_and_its_agents_agree_on_what_fits_and_every_job_ends(
        workers in prop::collection::vec((1u8..5, 0u8..3), 1..4),
        tasks in prop::collection::vec(
            (prop::option::weighted(0.6, 0usize..40), 1u8..3, prop::sample::select(vec![0u8, 0, 0, 1, 2])),
            1..40,
        ),
        fates in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        // Every task must fit some worker, or the job is refused: give the first worker
        // room for the largest request.
        let mut workers = workers;
        workers[0].0 = workers[0].0.max(2);
        if tasks.iter().any(|t| t.2 > 0) {
            workers[0].1 = workers[0].1.max(1);
        }
        run(&workers, &tasks, &fates);
    }
}
