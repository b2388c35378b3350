//! Unit tests of the coordinator: every transition and failure path, no sockets, no sleeps.
//! This module is their kit (a coordinator and a clock, event helpers, job texts); the tests
//! are in its children by concern.

use std::collections::BTreeMap;

use flotilla_core::{parse_job, JobId, Resources, TaskId, WorkerId};
use flotilla_sched::Prediction;

use super::*;

pub(super) fn config(queue_depth: usize) -> Config {
    Config {
        retry_backoff_ms: 100,
        max_backoff_ms: 350,
        reconcile_grace_ms: 5_000,
        queue_depth,
        chain_depth: 0,
        ..Config::default()
    }
}

pub(super) fn wspec(cpus: f64, gpus: &[u64]) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{cpus}"),
        hostname: "host".into(),
        hw_class: if gpus.is_empty() { "cpu" } else { "gpu" }.into(),
        resources: Resources {
            cpus,
            mem: 16 << 30,
            ..Resources::default()
        },
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, &m)| GpuInfo {
                index: i as u32,
                model: "test".into(),
                mem_bytes: m,
            })
            .collect(),
        data_addr: format!("addr-{cpus}"),
        ..WorkerSpec::default()
    }
}

/// A coordinator and a clock, with helpers to feed events and read commands.
pub(super) struct Sim {
    pub(super) c: Coordinator,
    pub(super) now: Millis,
}

impl Sim {
    pub(super) fn new(queue_depth: usize) -> Sim {
        Sim {
            c: Coordinator::new(config(queue_depth)),
            now: 0,
        }
    }

    pub(super) fn ev(&mut self, e: Event) -> Vec<Command> {
        let mut out = Vec::new();
        self.c.handle(self.now, e, &mut out).expect("a valid event");
        out
    }

    pub(super) fn try_ev(&mut self, e: Event) -> Result<Vec<Command>> {
        let mut out = Vec::new();
        self.c.handle(self.now, e, &mut out).map(|()| out)
    }

    pub(super) fn join(&mut self, spec: WorkerSpec) -> (WorkerId, Vec<Command>) {
        let id = self.c.next_worker_id();
        let out = self.ev(Event::WorkerJoined {
            worker: id,
            spec,
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        });
        (id, out)
    }

    /// A worker that says it leaves in `ms` (a batch allocation's): joins, and its id.
    pub(super) fn join_leaving(&mut self, spec: WorkerSpec, ms: Millis) -> WorkerId {
        let id = self.c.next_worker_id();
        self.c.set_worker_leaves_at(id, Some(self.now + ms));
        self.ev(Event::WorkerJoined {
            worker: id,
            spec,
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        });
        id
    }

    pub(super) fn submit(&mut self, text: &str) -> (JobId, Vec<Command>) {
        self.submit_as(crate::access::ADMIN_TENANT, text)
    }

    pub(super) fn submit_as(&mut self, tenant: &str, text: &str) -> (JobId, Vec<Command>) {
        let spec = parse_job(text, "job.toml").expect("a valid job");
        let job = self.c.next_job_id();
        let out = self.ev(Event::JobSubmitted {
            job,
            spec,
            dir: "/jobs".into(),
            tenant: tenant.into(),
        });
        (job, out)
    }

    pub(super) fn finish(
        &mut self,
        w: WorkerId,
        t: TaskRef,
        attempt: u32,
        outcome: AttemptOutcome,
    ) -> Vec<Command> {
        self.finish_with(w, t, attempt, outcome, Vec::new(), None, 1.0)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_with(
        &mut self,
        w: WorkerId,
        t: TaskRef,
        attempt: u32,
        outcome: AttemptOutcome,
        outputs: Vec<ObjectRef>,
        variant: Option<String>,
        wall: f64,
    ) -> Vec<Command> {
        self.ev(Event::TaskFinished {
            worker: w,
            task: t,
            attempt,
            result: AttemptResult {
                outcome,
                usage: Usage {
                    cpu_seconds: wall,
                    peak_rss_bytes: 0,
                    wall_seconds: wall,
                    ..Default::default()
                },
                outputs,
                variant,
            },
        })
    }

    pub(super) fn state(&self, job: JobId, name: &str) -> TaskState {
        let s = self.c.job_status(job).expect("known job");
        s.tasks
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.state)
            .expect("known task")
    }

    /// The message `t`'s status shows ("" for none).
    pub(super) fn message(&self, t: TaskRef) -> String {
        self.c.job_status(t.job).expect("known job").tasks[t.task.index()]
            .message
            .clone()
            .unwrap_or_default()
    }

    pub(super) fn tref(&self, job: JobId, name: &str) -> TaskRef {
        let s = self.c.job_status(job).expect("known job");
        let t = s.tasks.iter().find(|t| t.name == name).expect("known task");
        TaskRef { job, task: t.id }
    }

    pub(super) fn name(&self, t: TaskRef) -> String {
        self.c.job_status(t.job).expect("known job").tasks[t.task.index()]
            .name
            .clone()
    }
}

/// The assignments in `out`: (worker, assignment).
pub(super) fn assigns(out: &[Command]) -> Vec<(WorkerId, Assignment)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Assign { worker, tasks } => {
                Some(tasks.iter().map(move |a| (*worker, a.clone())))
            }
            _ => None,
        })
        .flatten()
        .collect()
}

fn names(sim: &Sim, out: &[Command]) -> Vec<String> {
    assigns(out).iter().map(|(_, a)| sim.name(a.task)).collect()
}

fn notified(out: &[Command]) -> Vec<(TaskRef, TaskState)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Notify(Notification::TaskState { task, state, .. }) => Some((*task, *state)),
            _ => None,
        })
        .collect()
}

pub(super) fn job_finished(out: &[Command]) -> Vec<(JobId, JobState)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Notify(Notification::JobFinished { job, state }) => Some((*job, *state)),
            _ => None,
        })
        .collect()
}

pub(super) fn cancels_of(out: &[Command]) -> Vec<(WorkerId, TaskRef, u32)> {
    cancels(out)
}

fn cancels(out: &[Command]) -> Vec<(WorkerId, TaskRef, u32)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Cancel {
                worker,
                task,
                attempt,
            } => Some((*worker, *task, *attempt)),
            _ => None,
        })
        .collect()
}

pub(super) fn retracts(out: &[Command]) -> Vec<(WorkerId, TaskRef, u32)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Retract {
                worker,
                task,
                attempt,
            } => Some((*worker, *task, *attempt)),
            _ => None,
        })
        .collect()
}

pub(super) fn failed(message: &str, retryable: bool) -> AttemptOutcome {
    AttemptOutcome::Failed {
        message: message.into(),
        retryable,
    }
}

const DIAMOND: &str = r#"
name = "diamond"
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
after = ["a"]
[[task]]
id = "d"
cmd = ["d"]
after = ["b", "c"]
"#;

fn obj(path: &str, size: u64) -> ObjectRef {
    ObjectRef {
        path: path.into(),
        hash: "h".into(),
        size,
    }
}

const VARIANTS: &str = r#"
name = "v"
[[task]]
id = "sim"
array = "0..40"
[[task.variant]]
name = "gpu"
cmd = ["sim", "--cuda", "{i}"]
resources = { cpus = 1, gpus = 1 }
[[task.variant]]
name = "cpu"
cmd = ["sim", "{i}"]
resources = { cpus = 1 }
"#;

const TRANSFER: &str = r#"
name = "tr"
staging = "transfer"
[[task]]
id = "a"
cmd = ["a"]
outputs = ["a.out"]
[[task]]
id = "b"
cmd = ["b"]
outputs = ["b.out"]
[[task]]
id = "c"
cmd = ["c"]
after = ["a", "b"]
outputs = ["c.out"]
"#;

mod failures;
mod placement;
mod pool;
mod restart;
mod tenants;
