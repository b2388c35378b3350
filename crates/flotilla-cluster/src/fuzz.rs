//! Entry points for fuzzing what the cluster decodes from others: each takes any bytes and
//! must return without panicking, however malformed they are (errors are fine). The harness
//! (`crates/flotilla/tests/fuzz.rs`) mutates a corpus kept in the repository and calls them;
//! not part of the API.

use prost::Message as _;

use flotilla_core::{JobId, WorkerId};

use crate::journal::Journal;
use crate::proto;
use crate::state::{Config, Coordinator, Event, Millis};

/// A small transfer job with a dependency, a gang and an array: what the worker-facing
/// targets run their messages against.
const JOB: &str = r#"name = "fuzz"
staging = "transfer"

[[task]]
id = "a"
cmd = ["a"]
outputs = ["a.out"]

[[task]]
id = "b"
after = ["a"]
cmd = ["b"]
outputs = ["b.out"]

[[task]]
id = "arr"
array = "0..4"
cmd = ["x"]
"#;

/// A coordinator with [`JOB`] submitted and one worker (4 CPUs) that took work: what it
/// was assigned.
type Started = (Coordinator, JobId, WorkerId, Vec<proto::Assignment>);

/// A coordinator with [`JOB`] submitted and one worker (4 CPUs) that took work.
fn coordinator() -> Option<Started> {
    let mut c = Coordinator::new(Config::default());
    let mut out = Vec::new();
    let job = c.next_job_id();
    let spec = flotilla_core::parse_job(JOB, "fuzz.toml").ok()?;
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec,
            dir: "/fuzz".into(),
            tenant: "t".into(),
        },
        &mut out,
    )
    .ok()?;
    let worker = c.next_worker_id();
    let req = proto::RegisterRequest {
        name: "w".into(),
        hostname: "h".into(),
        hw_class: "cpu".into(),
        resources: Some(proto::ResourceSet {
            cpus: 4.0,
            mem: 1 << 33,
            ..Default::default()
        }),
        data_addr: "127.0.0.1:1".into(),
        ..Default::default()
    };
    out.clear();
    c.handle(
        1,
        crate::convert::worker_joined(worker, req, None),
        &mut out,
    )
    .ok()?;
    let assigned = out
        .into_iter()
        .filter_map(|cmd| match cmd {
            crate::state::Command::Assign { tasks, .. } => Some(tasks),
            _ => None,
        })
        .flatten()
        .map(crate::convert::assignment)
        .collect();
    Some((c, job, worker, assigned))
}

/// A worker's session message, as the coordinator decodes and applies it: its starts,
/// finishes (with outputs, usage, checkpoints), returns and availability, against a job
/// that runs on that worker.
pub fn worker_message(data: &[u8]) {
    let Ok(m) = proto::WorkerMessage::decode(data) else {
        return;
    };
    let Some((mut c, job, worker, _)) = coordinator() else {
        return;
    };
    let mut out = Vec::new();
    let mut now: Millis = 10;
    let mut step = |c: &mut Coordinator, ev: Event| {
        now += 10;
        let _ = c.handle(now, ev, &mut out);
        out.clear();
    };
    if let Some(available) = m.available {
        step(&mut c, Event::WorkerAvailability { worker, available });
    }
    for k in &m.started {
        let (task, attempt) = crate::convert::task_key(k);
        step(
            &mut c,
            Event::TaskStarted {
                worker,
                task,
                attempt,
            },
        );
    }
    for r in m.finished {
        if let Some(ev) = crate::convert::task_finished(worker, r) {
            step(&mut c, ev);
        }
    }
    for k in &m.returned {
        let (task, attempt) = crate::convert::task_key(k);
        step(
            &mut c,
            Event::TaskReturned {
                worker,
                task,
                attempt,
            },
        );
    }
    let _ = c.job_status_range(job, 0, 100);
}

/// A worker's registration, as the coordinator decodes and applies it (a second worker
/// joining, reporting what it runs and holds).
pub fn register(data: &[u8]) {
    let Ok(req) = proto::RegisterRequest::decode(data) else {
        return;
    };
    let Some((mut c, job, _, _)) = coordinator() else {
        return;
    };
    let mut out = Vec::new();
    let worker = c.next_worker_id();
    let _ = c.handle(
        20,
        crate::convert::worker_joined(worker, req, None),
        &mut out,
    );
    let _ = c.handle(30, Event::Tick, &mut out);
    let _ = c.job_status_range(job, 0, 100);
    let _ = c.workers();
}

/// What a worker decodes from the coordinator: its commands, and the work in them.
pub fn coordinator_message(data: &[u8]) {
    let Ok(m) = proto::CoordinatorMessage::decode(data) else {
        return;
    };
    for a in m.assign {
        let _ = crate::convert::work(a);
    }
}

/// A journal file as the coordinator opens it after a restart: read, repaired when its tail
/// is torn, and replayed into the state machine.
pub fn journal(data: &[u8]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flotilla-fuzz-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let path = dir.join("journal.log");
    let records = std::fs::write(&path, data)
        .ok()
        .and_then(|()| Journal::open_recovering(&path).ok())
        .and_then(|(mut j, _)| j.replay().ok());
    let _ = std::fs::remove_dir_all(&dir);
    let Some(records) = records else {
        return;
    };
    let mut c = Coordinator::new(Config::default());
    let mut out = Vec::new();
    for r in records {
        // A record the state machine refuses stops a real restart with an error; here the
        // rest still runs, to reach more states.
        let _ = c.replay(0, r, &mut out);
        out.clear();
    }
    c.recovered(0);
    let _ = c.handle(1, Event::Tick, &mut out);
}

/// The framed object protocol, both ends: `data` as what a client sends a worker's object
/// server, and as what a server answers a fetching client.
pub fn framed(data: &[u8]) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    rt.block_on(crate::framed::fuzz_both_ends(data));
}

/// The seeds of the binary targets' corpora (target, file name, bytes): real messages and a
/// real journal of [`JOB`], as the coordinator and a worker make them. The harness writes
/// them into the repository (`cargo test -p flotilla --test fuzz -- --ignored`).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let Some((mut c, job, worker, assigned)) = coordinator() else {
        return seeds;
    };
    let keys: Vec<proto::TaskKey> = assigned.iter().filter_map(|a| a.task).collect();
    seeds.push((
        "coordinator_message",
        "assign".to_string(),
        proto::CoordinatorMessage {
            assign: assigned.clone(),
            cancel: keys.iter().take(1).copied().collect(),
            retract: keys.iter().skip(1).take(1).copied().collect(),
            forget: vec![job.0 + 1],
            drain: false,
            copy: Vec::new(),
        }
        .encode_to_vec(),
    ));
    let result =
        |k: proto::TaskKey, outcome: proto::task_result::Outcome, path: &str| proto::TaskResult {
            task: Some(k),
            outcome: outcome as i32,
            message: "why".into(),
            retryable: true,
            usage: Some(proto::Usage {
                cpu_seconds: 1.5,
                peak_rss_bytes: 1 << 20,
                wall_seconds: 2.0,
                energy_j: Some(3.0),
                energy_estimated: true,
                fuel: Some(100),
            }),
            outputs: vec![proto::Object {
                path: path.into(),
                hash: "0".repeat(64),
                size: 5,
            }],
            variant: String::new(),
            checkpoint: Vec::new(),
            stage_seconds: 0.1,
            stage_bytes: 10,
        };
    use proto::task_result::Outcome;
    let finished: Vec<proto::TaskResult> = keys
        .iter()
        .zip([
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Preempted,
            Outcome::Cancelled,
        ])
        .map(|(k, o)| result(*k, o, "a.out"))
        .collect();
    seeds.push((
        "worker_message",
        "start-and-finish".to_string(),
        proto::WorkerMessage {
            worker: worker.0,
            started: keys.clone(),
            finished: finished.clone(),
            returned: keys.iter().skip(2).copied().collect(),
            logs: vec![proto::TaskLog {
                task: keys.first().copied(),
                data: b"hello\n".to_vec(),
                stderr: true,
            }],
            available: Some(false),
            leaving: false,
            copied: Vec::new(),
            copy_failed: Vec::new(),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "register",
        "rejoin".to_string(),
        proto::RegisterRequest {
            protocol_version: 1,
            name: "w2".into(),
            hostname: "h".into(),
            hw_class: "cpu".into(),
            resources: Some(proto::ResourceSet {
                cpus: 2.0,
                gpus: 1.0,
                mem: 1 << 30,
                gpu_mem: 1 << 30,
                custom: Vec::new(),
            }),
            gpus: vec![proto::Gpu {
                index: 0,
                model: "H200".into(),
                mem_bytes: 1 << 30,
            }],
            data_addr: "127.0.0.1:2".into(),
            running: keys.clone(),
            held: keys
                .iter()
                .map(|k| proto::HeldObject {
                    task: Some(*k),
                    object: Some(proto::Object {
                        path: "a.out".into(),
                        hash: "0".repeat(64),
                        size: 5,
                    }),
                })
                .collect(),
            previous_worker: Some(worker.0),
            finished,
            price: "cpu=0.02".into(),
            availability: "mon-fri 19:00-07:00".into(),
            preemptible: true,
            cpu_watts: 10.0,
            ..Default::default()
        }
        .encode_to_vec(),
    ));
    // A journal: the job, its assignments, a finish, a reopening.
    let mut records = Vec::new();
    if let Ok(spec) = flotilla_core::parse_job(JOB, "fuzz.toml") {
        records.push(crate::state::JournalRecord::JobSubmittedText {
            job,
            toml: spec.to_toml(),
            dir: "/fuzz".into(),
            tenant: "t".into(),
        });
    }
    records.extend(c.take_journal_records());
    if let Some(k) = keys.first() {
        let (task, attempt) = crate::convert::task_key(k);
        records.push(crate::state::JournalRecord::TaskFinishedMetered {
            worker,
            task,
            attempt,
            result: crate::state::AttemptResult {
                outcome: crate::state::AttemptOutcome::Succeeded,
                usage: crate::state::Usage::default(),
                outputs: vec![crate::convert::object_from(&proto::Object {
                    path: "a.out".into(),
                    hash: "0".repeat(64),
                    size: 5,
                })],
                variant: None,
            },
        });
        records.push(crate::state::JournalRecord::JobReopened {
            job,
            tasks: vec![task.task],
        });
        records.push(crate::state::JournalRecord::JobCancelled { job });
        records.push(crate::state::JournalRecord::JobRetried { job });
    }
    records.push(c.checkpoint());
    let dir = std::env::temp_dir().join(format!("flotilla-fuzz-seeds-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("journal.log");
    let written = Journal::open(&path)
        .and_then(|mut j| j.append(&records))
        .ok()
        .and_then(|()| std::fs::read(&path).ok());
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(bytes) = written {
        seeds.push(("journal", "job".to_string(), bytes));
    }
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The targets reach the state machine: the job is placed on the worker, and each seed
    /// decodes (a fuzzer that stopped at the decoder would test nothing).
    #[test]
    fn the_targets_reach_past_the_decoders() {
        let (_, _, _, assigned) = coordinator().expect("a coordinator with a job and a worker");
        assert!(!assigned.is_empty(), "nothing was assigned to the worker");
        let seeds = seeds();
        let targets: Vec<&str> = seeds.iter().map(|(t, _, _)| *t).collect();
        assert_eq!(
            targets,
            [
                "coordinator_message",
                "worker_message",
                "register",
                "journal"
            ]
        );
        for (target, _, bytes) in &seeds {
            match *target {
                "coordinator_message" => {
                    let m = proto::CoordinatorMessage::decode(bytes.as_slice()).unwrap();
                    assert!(m
                        .assign
                        .iter()
                        .all(|a| crate::convert::work(a.clone()).is_some()));
                }
                "worker_message" => {
                    assert!(!proto::WorkerMessage::decode(bytes.as_slice())
                        .unwrap()
                        .finished
                        .is_empty());
                }
                "register" => {
                    proto::RegisterRequest::decode(bytes.as_slice()).unwrap();
                }
                _ => {}
            }
            // And every target takes its seed without panicking.
            worker_message(bytes);
            register(bytes);
            coordinator_message(bytes);
            journal(bytes);
        }
    }
}
