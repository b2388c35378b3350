//! Unit tests of the coordinator: every transition and failure path, no sockets, no sleeps.

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
        });
        (id, out)
    }

    pub(super) fn submit(&mut self, text: &str) -> (JobId, Vec<Command>) {
        let spec = parse_job(text, "job.toml").expect("a valid job");
        let job = self.c.next_job_id();
        let out = self.ev(Event::JobSubmitted {
            job,
            spec,
            dir: "/jobs".into(),
            tenant: "t".into(),
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

fn job_finished(out: &[Command]) -> Vec<(JobId, JobState)> {
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

fn failed(message: &str, retryable: bool) -> AttemptOutcome {
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

#[test]
fn submission_makes_roots_ready_and_the_rest_waiting() {
    let mut sim = Sim::new(0);
    let (job, out) = sim.submit(DIAMOND);
    assert!(
        notified(&out).is_empty(),
        "initial states are read from job_status"
    );
    assert_eq!(sim.state(job, "a"), TaskState::Ready);
    for n in ["b", "c", "d"] {
        assert_eq!(sim.state(job, n), TaskState::Waiting);
    }
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.counts.ready, 1);
    assert_eq!(s.counts.waiting, 3);
    assert_eq!(s.total, 4);
    assert_eq!(sim.c.next_job_id(), JobId::new(job.0 + 1));
    assert_eq!(sim.c.jobs().len(), 1);
}

#[test]
fn a_bad_or_duplicate_submission_is_refused_and_changes_nothing() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let before = (sim.c.jobs(), sim.c.next_job_id());
    let spec = parse_job(DIAMOND, "job.toml").unwrap();
    let e = sim
        .try_ev(Event::JobSubmitted {
            job,
            spec: spec.clone(),
            dir: String::new(),
            tenant: String::new(),
        })
        .unwrap_err();
    assert_eq!(e, StateError::DuplicateJob(job));
    // A cycle built in code (parse_job would refuse it earlier).
    let mut bad = spec;
    bad.tasks[0].after = vec![flotilla_core::Dependency::parse("d").unwrap()];
    let e = sim
        .try_ev(Event::JobSubmitted {
            job: JobId::new(99),
            spec: bad,
            dir: String::new(),
            tenant: String::new(),
        })
        .unwrap_err();
    assert!(matches!(e, StateError::BadJob { .. }), "{e}");
    assert!(e.to_string().contains("cycle"), "{e}");
    assert_eq!((sim.c.jobs(), sim.c.next_job_id()), before);
}

#[test]
fn an_empty_job_succeeds_at_once() {
    let mut sim = Sim::new(0);
    let job = sim.c.next_job_id();
    let spec = flotilla_core::JobSpec::new("empty");
    let out = sim.ev(Event::JobSubmitted {
        job,
        spec,
        dir: String::new(),
        tenant: String::new(),
    });
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    assert_eq!(
        sim.c.job_status(job).unwrap().finished_state(),
        Some(JobState::Succeeded)
    );
}

#[test]
fn dependencies_run_in_order_and_the_job_succeeds_once() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, out) = sim.join(wspec(4.0, &[]));
    let a = assigns(&out);
    assert_eq!(names(&sim, &out), vec!["a"]);
    assert_eq!(a[0].0, w);
    assert_eq!(a[0].1.attempt, 1);
    assert_eq!(a[0].1.job_name, "diamond");
    assert_eq!(
        a[0].1.kind,
        AssignedKind::Command {
            cmd: vec!["a".into()],
            env: vec![],
            cwd: None
        }
    );
    assert_eq!(sim.state(job, "a"), TaskState::Assigned);
    let ta = sim.tref(job, "a");
    let out = sim.ev(Event::TaskStarted {
        worker: w,
        task: ta,
        attempt: 1,
    });
    assert_eq!(notified(&out), vec![(ta, TaskState::Running)]);
    let out = sim.finish(w, ta, 1, AttemptOutcome::Succeeded);
    let n = notified(&out);
    assert!(n.contains(&(ta, TaskState::Done)));
    assert!(n.contains(&(sim.tref(job, "b"), TaskState::Ready)));
    assert!(n.contains(&(sim.tref(job, "c"), TaskState::Ready)));
    assert_eq!(
        names(&sim, &out),
        vec!["b", "c"],
        "both placed in one batch"
    );
    assert_eq!(
        out.iter()
            .filter(|c| matches!(c, Command::Assign { .. }))
            .count(),
        1
    );
    assert_eq!(sim.state(job, "d"), TaskState::Waiting);
    let out = sim.finish(w, sim.tref(job, "b"), 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty(), "d still waits for c");
    assert_eq!(sim.state(job, "d"), TaskState::Waiting);
    let out = sim.finish(w, sim.tref(job, "c"), 1, AttemptOutcome::Succeeded);
    assert_eq!(names(&sim, &out), vec!["d"]);
    let out = sim.finish(w, sim.tref(job, "d"), 1, AttemptOutcome::Succeeded);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.done, 4);
    assert_eq!(s.retries, 0);
    // A duplicate report changes nothing and finishes nothing twice.
    let out = sim.finish(w, sim.tref(job, "d"), 1, AttemptOutcome::Succeeded);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 4);
}

#[test]
fn older_jobs_first_then_priority_then_id() {
    let mut sim = Sim::new(0);
    let (j1, _) = sim.submit(
        r#"
[[task]]
id = "low"
array = "0..2"
cmd = ["x"]
[[task]]
id = "high"
array = "0..2"
priority = 5
cmd = ["x"]
"#,
    );
    let (j2, _) = sim.submit("[[task]]\nid = \"other\"\npriority = 100\ncmd = [\"x\"]\n");
    let (w, out) = sim.join(wspec(1.0, &[]));
    let mut order = names(&sim, &out);
    let mut cur = assigns(&out)[0].1.task;
    for _ in 0..4 {
        let out = sim.finish(w, cur, 1, AttemptOutcome::Succeeded);
        let a = assigns(&out);
        assert_eq!(a.len(), 1);
        cur = a[0].1.task;
        order.push(sim.name(cur));
    }
    assert_eq!(
        order,
        vec!["high[0]", "high[1]", "low[0]", "low[1]", "other"]
    );
    assert_eq!(cur.job, j2);
    let _ = j1;
}

#[test]
fn resources_are_never_oversubscribed_and_custom_resources_count() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[[task]]
id = "t"
array = "0..6"
cmd = ["x"]
resources = { cpus = 1.5, mem = "5GiB", licence = 1 }
"#,
    );
    let mut spec = wspec(8.0, &[]);
    spec.resources.custom.insert("licence".into(), 2.0);
    let (w, out) = sim.join(spec);
    // cpus would allow 5, mem 3 (16 GiB), licences 2.
    assert_eq!(assigns(&out).len(), 2);
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.used.custom["licence"], 2.0);
    assert_eq!(ws.used.cpus, 3.0);
    let first = assigns(&out)[0].1.task;
    let out = sim.finish(w, first, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out).len(), 1, "one licence came back");
    assert_eq!(sim.c.job_status(job).unwrap().counts.assigned, 2);
}

#[test]
fn fractional_gpus_share_an_index_and_whole_gpus_take_free_ones() {
    let mut sim = Sim::new(0);
    let (_, _) = sim.submit(
        r#"
[[task]]
id = "half"
array = "0..3"
cmd = ["x"]
resources = { cpus = 0, gpus = 0.5, gpu_mem = "4GiB" }
"#,
    );
    let (w, out) = sim.join(wspec(8.0, &[10 << 30, 10 << 30]));
    let a = assigns(&out);
    assert_eq!(a.len(), 3);
    let idx: Vec<Vec<u32>> = a.iter().map(|(_, x)| x.gpu_indices.clone()).collect();
    assert_eq!(idx, vec![vec![0], vec![0], vec![1]], "packed two per GPU");
    let mut sim2 = Sim::new(0);
    sim2.submit(
        r#"
[[task]]
id = "mem"
array = "0..3"
cmd = ["x"]
resources = { cpus = 0, gpus = 0.25, gpu_mem = "6GiB" }
"#,
    );
    let (_, out) = sim2.join(wspec(8.0, &[10 << 30, 10 << 30]));
    let idx: Vec<Vec<u32>> = assigns(&out)
        .iter()
        .map(|(_, x)| x.gpu_indices.clone())
        .collect();
    assert_eq!(idx, vec![vec![0], vec![1]], "GPU memory limits the sharing");
    // Whole GPUs: two 1-GPU tasks take both indices; a 2-GPU task waits for both.
    let mut sim3 = Sim::new(0);
    let (job, _) = sim3.submit(
        r#"
[[task]]
id = "one"
array = "0..2"
cmd = ["x"]
resources = { cpus = 0, gpus = 1 }
[[task]]
id = "two"
cmd = ["x"]
resources = { cpus = 0, gpus = 2 }
"#,
    );
    let (w3, out) = sim3.join(wspec(8.0, &[1 << 30, 1 << 30]));
    let a = assigns(&out);
    let idx: Vec<Vec<u32>> = a.iter().map(|(_, x)| x.gpu_indices.clone()).collect();
    assert_eq!(idx, vec![vec![0], vec![1]]);
    let out = sim3.finish(w3, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty(), "one GPU free is not enough");
    let out = sim3.finish(w3, a[1].1.task, 1, AttemptOutcome::Succeeded);
    let a = assigns(&out);
    assert_eq!(a[0].1.gpu_indices, vec![0, 1]);
    assert_eq!(a[0].1.resources.gpus, 2.0);
    assert_eq!(sim3.state(job, "two"), TaskState::Assigned);
    let _ = w;
}

#[test]
fn queued_tasks_wait_beyond_capacity_and_are_promoted_in_order() {
    let mut sim = Sim::new(2);
    let (job, _) = sim.submit(
        "[[task]]\nid = \"t\"\narray = \"0..6\"\ncmd = [\"x\"]\nresources = { cpus = 1 }\n",
    );
    let (w, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 4, "2 in capacity + 2 queued, in one Assign");
    assert_eq!(
        out.iter()
            .filter(|c| matches!(c, Command::Assign { .. }))
            .count(),
        1
    );
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.queued, 2);
    assert_eq!(ws.used.cpus, 2.0);
    // Starting a queued task while the capacity is full is refused and changes nothing.
    let t2 = a[2].1.task;
    let e = sim
        .try_ev(Event::TaskStarted {
            worker: w,
            task: t2,
            attempt: 1,
        })
        .unwrap_err();
    assert!(matches!(e, StateError::Conflict { .. }), "{e}");
    assert_eq!(sim.c.workers()[0].queued, 2);
    // A finish frees one cpu: the first queued task is promoted, one more is queued.
    let out = sim.finish(w, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out).len(), 1);
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.queued, 2);
    assert_eq!(ws.used.cpus, 2.0);
    sim.ev(Event::TaskStarted {
        worker: w,
        task: t2,
        attempt: 1,
    });
    assert_eq!(sim.state(job, "t[2]"), TaskState::Running);
    assert_eq!(sim.c.workers()[0].used.cpus, 2.0);
}

#[test]
fn queued_tasks_never_hold_gpus() {
    let mut sim = Sim::new(4);
    sim.submit("[[task]]\nid = \"g\"\narray = \"0..3\"\ncmd = [\"x\"]\nresources = { cpus = 0, gpus = 1 }\n");
    let (_, out) = sim.join(wspec(4.0, &[1 << 30]));
    assert_eq!(assigns(&out).len(), 1);
    assert_eq!(sim.c.workers()[0].queued, 0);
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

#[test]
fn variants_are_explored_then_chosen_by_earliest_predicted_finish() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(VARIANTS);
    let (gw, out1) = sim.join(wspec(1.0, &[1 << 30]));
    let (cw, out2) = sim.join(wspec(1.0, &[]));
    let mut seen: BTreeMap<(WorkerId, String), usize> = BTreeMap::new();
    let mut running: std::collections::VecDeque<(WorkerId, Assignment)> = assigns(&out1).into();
    running.extend(assigns(&out2));
    let mut log = Vec::new();
    while let Some((w, a)) = running.pop_front() {
        let v = a.variant.clone().unwrap();
        *seen.entry((w, v.clone())).or_default() += 1;
        log.push((w, v.clone(), a.reason.policy.clone()));
        // Check the command is the chosen variant's.
        let AssignedKind::Command { cmd, .. } = &a.kind else {
            panic!("a command")
        };
        assert_eq!(cmd.contains(&"--cuda".to_string()), v == "gpu");
        assert!(!a.reason.alternatives.is_empty());
        let wall = match (w == gw, v.as_str()) {
            (true, "gpu") => 1.0,
            (true, _) => 10.0,
            (false, _) => 8.0,
        };
        let out = sim.finish_with(
            w,
            a.task,
            a.attempt,
            AttemptOutcome::Succeeded,
            vec![],
            Some(v),
            wall,
        );
        running.extend(assigns(&out));
    }
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    // Every feasible pair was explored until calibrated (3 samples)...
    assert!(seen[&(gw, "gpu".to_string())] >= 3);
    assert!(seen[&(gw, "cpu".to_string())] >= 3);
    assert!(seen[&(cw, "cpu".to_string())] >= 3);
    assert!(!seen.contains_key(&(cw, "gpu".to_string())), "no GPU there");
    // ...then the GPU variant wins on the GPU worker.
    let tail: Vec<_> = log.iter().rev().take(10).collect();
    assert!(tail.iter().all(|(_, _, p)| p == "dmda"), "{tail:?}");
    assert!(tail.iter().any(|(w, v, _)| *w == gw && v == "gpu"));
    assert!(
        !tail.iter().any(|(w, v, _)| *w == gw && v == "cpu"),
        "{tail:?}"
    );
    let m = sim.c.perf_model();
    assert_eq!(
        m.predict("v/sim/gpu", "gpu", 0),
        Prediction::Calibrated(1.0)
    );
    assert_eq!(
        m.predict("v/sim/cpu", "cpu", 0),
        Prediction::Calibrated(8.0)
    );
    // Status reports the variant and the reason.
    let s = sim.c.job_status(job).unwrap();
    assert!(s
        .tasks
        .iter()
        .all(|t| t.variant.is_some() && t.placement.is_some()));
}

fn obj(path: &str, size: u64) -> ObjectRef {
    ObjectRef {
        path: path.into(),
        hash: "h".into(),
        size,
    }
}

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

#[test]
fn transfer_staging_lists_inputs_and_prefers_the_worker_holding_most_bytes() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(TRANSFER);
    let (w1, out1) = sim.join(wspec(1.0, &[]));
    let (w2, out2) = sim.join(wspec(1.0, &[]));
    let (a1, a2) = (assigns(&out1), assigns(&out2));
    assert_eq!((a1.len(), a2.len()), (1, 1));
    let (ta, tb) = (a1[0].1.task, a2[0].1.task);
    assert_eq!(sim.name(ta), "a");
    sim.finish_with(
        w1,
        ta,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 10)],
        None,
        1.0,
    );
    let out = sim.finish_with(
        w2,
        tb,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 1000)],
        None,
        1.0,
    );
    let a = assigns(&out);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, w2, "w2 holds 1000 of the 1010 input bytes");
    assert_eq!(a[0].1.reason.policy, "locality");
    let mut inputs = a[0].1.inputs.clone();
    inputs.sort_by(|x, y| x.0.path.cmp(&y.0.path));
    assert_eq!(
        inputs,
        vec![
            (obj("a.out", 10), "addr-1".into()),
            (obj("b.out", 1000), "addr-1".into())
        ]
    );
    let _ = job;
}

#[test]
fn an_idle_worker_steals_queued_tasks() {
    let mut sim = Sim::new(3);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n");
    let (w1, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(assigns(&out).len(), 4, "1 running + 3 queued");
    let (w2, out) = sim.join(wspec(1.0, &[]));
    let r = retracts(&out);
    assert_eq!(r.len(), 2, "half of the 3 queued, rounded up: {out:?}");
    assert!(r.iter().all(|(w, _, _)| *w == w1));
    // No more retractions while those are pending.
    let out = sim.ev(Event::Tick);
    assert!(retracts(&out).is_empty());
    // One comes back and goes to the idle worker with a new attempt, no retry counted.
    let (_, t, a) = r[0];
    let out = sim.ev(Event::TaskReturned {
        worker: w1,
        task: t,
        attempt: a,
    });
    let a2 = assigns(&out);
    assert_eq!(a2.len(), 1);
    assert_eq!(a2[0].0, w2);
    assert_eq!(a2[0].1.task, t);
    assert_eq!(a2[0].1.attempt, 2);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 0);
    // The other had started before the Retract arrived: the worker says so, it stays.
    // (w1 runs its queue in order: t[0], then t[1], then t[2].)
    let (_, t, a) = r[1];
    assert_eq!(sim.name(t), "t[2]");
    sim.finish(w1, sim.tref(job, "t[0]"), 1, AttemptOutcome::Succeeded);
    let early = sim.try_ev(Event::TaskStarted {
        worker: w1,
        task: t,
        attempt: a,
    });
    assert!(early.is_err(), "t[1] was promoted first");
    sim.finish(w1, sim.tref(job, "t[1]"), 1, AttemptOutcome::Succeeded);
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: t,
        attempt: a,
    });
    let e = sim
        .try_ev(Event::TaskReturned {
            worker: w1,
            task: t,
            attempt: a,
        })
        .unwrap_err();
    assert!(matches!(e, StateError::Conflict { .. }));
    assert_eq!(sim.state(job, &sim.name(t)), TaskState::Running);
}

#[test]
fn retryable_failures_back_off_exponentially_then_fail_the_job() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[defaults]
retries = 3
[[task]]
id = "flaky"
cmd = ["x"]
[[task]]
id = "other"
cmd = ["y"]
resources = { cpus = 1 }
"#,
    );
    let (w, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    let flaky = sim.tref(job, "flaky");
    assert_eq!(a[0].1.task, flaky);
    let running_other = a[1].1.task;
    sim.ev(Event::TaskStarted {
        worker: w,
        task: running_other,
        attempt: 1,
    });
    let mut attempt = 1;
    // Backoffs: 100, 200, then capped at 350.
    for (k, delay) in [100u64, 200, 350].into_iter().enumerate() {
        let out = sim.finish(w, flaky, attempt, failed("boom", true));
        assert!(notified(&out).contains(&(flaky, TaskState::Backoff)));
        assert_eq!(sim.state(job, "flaky"), TaskState::Backoff);
        assert_eq!(sim.c.job_status(job).unwrap().retries, k as u32 + 1);
        assert!(assigns(&out).is_empty());
        sim.now += delay - 1;
        let out = sim.ev(Event::Tick);
        assert!(assigns(&out).is_empty());
        assert_eq!(sim.state(job, "flaky"), TaskState::Backoff);
        sim.now += 1;
        let out = sim.ev(Event::Tick);
        let a = assigns(&out);
        assert_eq!(a.len(), 1, "retried at exactly the deadline");
        attempt += 1;
        assert_eq!(a[0].1.attempt, attempt);
    }
    let out = sim.finish(w, flaky, attempt, failed("boom", true));
    assert_eq!(sim.state(job, "flaky"), TaskState::Failed);
    assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
    assert_eq!(
        cancels(&out),
        vec![(w, running_other, 1)],
        "the running task is cancelled"
    );
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.running, 1, "until the worker confirms");
    assert!(s.tasks[flaky.task.index()]
        .message
        .as_deref()
        .unwrap()
        .contains("no retries left"));
    let out = sim.finish(w, running_other, 1, AttemptOutcome::Cancelled);
    assert_eq!(notified(&out), vec![(running_other, TaskState::Cancelled)]);
    assert!(job_finished(&out).is_empty(), "JobFinished only once");
    assert_eq!(sim.c.workers()[0].used.cpus, 0.0);
}

#[test]
fn a_non_retryable_failure_fails_for_good() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let out = sim.finish(w, sim.tref(job, "a"), 1, failed("bad command", false));
    assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.failed, 1);
    assert_eq!(s.counts.cancelled, 3);
    assert_eq!(s.retries, 0);
}

#[test]
fn cancelling_a_job_cancels_waiting_tasks_and_stops_running_ones() {
    let mut sim = Sim::new(1);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n");
    let (w, out) = sim.join(wspec(1.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 2);
    sim.ev(Event::TaskStarted {
        worker: w,
        task: a[0].1.task,
        attempt: 1,
    });
    let out = sim.ev(Event::JobCancelled { job });
    assert_eq!(job_finished(&out), vec![(job, JobState::Cancelled)]);
    let mut c = cancels(&out);
    c.sort();
    assert_eq!(c, vec![(w, a[0].1.task, 1), (w, a[1].1.task, 1)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(
        (s.counts.cancelled, s.counts.running, s.counts.assigned),
        (2, 1, 1)
    );
    // Again: nothing; unknown job: refused.
    assert!(sim.ev(Event::JobCancelled { job }).is_empty());
    assert_eq!(
        sim.try_ev(Event::JobCancelled {
            job: JobId::new(77)
        })
        .unwrap_err(),
        StateError::UnknownJob(JobId::new(77))
    );
    // Reports end them: even a success after the cancel is no reason to run more.
    sim.finish(w, a[0].1.task, 1, AttemptOutcome::Cancelled);
    let out = sim.finish(w, a[1].1.task, 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty());
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Cancelled);
    assert_eq!(s.counts.cancelled + s.counts.done, 4);
    assert!(sim.c.workers()[0].tasks.is_empty());
}

#[test]
fn a_lost_worker_s_tasks_are_placed_again_and_its_late_reports_ignored() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"x\"]\n");
    let (w1, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 2);
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: a[0].1.task,
        attempt: 1,
    });
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "no heartbeat".into(),
    });
    let n = notified(&out);
    assert!(n.contains(&(a[0].1.task, TaskState::Ready)));
    assert!(n.contains(&(a[1].1.task, TaskState::Ready)));
    let s = sim.c.job_status(job).unwrap();
    assert!(s
        .tasks
        .iter()
        .all(|t| t.failures == 0 && t.message.as_deref().unwrap().contains("lost")));
    // Unknown worker: refused. Lost worker again: refused (ids are not reused).
    assert_eq!(
        sim.try_ev(Event::WorkerLost {
            worker: w1,
            reason: String::new()
        })
        .unwrap_err(),
        StateError::UnknownWorker(w1)
    );
    let e = sim
        .try_ev(Event::WorkerJoined {
            worker: w1,
            spec: wspec(1.0, &[]),
            running: vec![],
            held: vec![],
        })
        .unwrap_err();
    assert_eq!(e, StateError::DuplicateWorker(w1));
    let (w2, out) = sim.join(wspec(2.0, &[]));
    let a2 = assigns(&out);
    assert_eq!(a2.len(), 2);
    assert!(a2.iter().all(|(w, x)| *w == w2 && x.attempt == 2));
    // The lost worker's late reports: ignored, never double counted.
    let out = sim.finish(w1, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert!(out.is_empty());
    let out = sim.ev(Event::TaskStarted {
        worker: w1,
        task: a[1].1.task,
        attempt: 1,
    });
    assert!(out.is_empty());
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 0);
    // A worker that never existed: refused.
    let e = sim
        .try_ev(Event::TaskStarted {
            worker: WorkerId::new(500),
            task: a[1].1.task,
            attempt: 2,
        })
        .unwrap_err();
    assert_eq!(e, StateError::UnknownWorker(WorkerId::new(500)));
    // A stale attempt from a live worker: ignored.
    assert!(sim
        .ev(Event::TaskStarted {
            worker: w2,
            task: a[1].1.task,
            attempt: 1
        })
        .is_empty());
    for (w, x) in a2 {
        sim.finish(w, x.task, x.attempt, AttemptOutcome::Succeeded);
    }
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 2);
}

#[test]
fn lost_outputs_are_rebuilt_from_lineage() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
staging = "transfer"
[[task]]
id = "a"
cmd = ["a"]
outputs = ["a.out"]
[[task]]
id = "b"
cmd = ["b"]
after = ["a"]
outputs = ["b.out"]
[[task]]
id = "c"
cmd = ["c"]
after = ["b"]
outputs = ["c.out"]
[[task]]
id = "side"
cmd = ["s"]
"#,
    );
    let (w1, out) = sim.join(wspec(1.0, &[]));
    let ta = sim.tref(job, "a");
    assert_eq!(assigns(&out)[0].1.task, ta);
    let out = sim.finish_with(
        w1,
        ta,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 5)],
        None,
        1.0,
    );
    let tb = sim.tref(job, "b");
    assert_eq!(assigns(&out)[0].1.task, tb);
    assert_eq!(
        assigns(&out)[0].1.inputs,
        vec![(obj("a.out", 5), "addr-1".to_string())]
    );
    let out = sim.finish_with(
        w1,
        tb,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 5)],
        None,
        1.0,
    );
    // c goes next (id order puts c before side).
    let tc = sim.tref(job, "c");
    assert_eq!(assigns(&out)[0].1.task, tc);
    // w1 dies holding a.out and b.out; c was assigned to it and is requeued.
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "killed".into(),
    });
    assert_eq!(
        sim.state(job, "b"),
        TaskState::Waiting,
        "b needs a's lost output"
    );
    assert_eq!(sim.state(job, "a"), TaskState::Ready);
    assert_eq!(sim.state(job, "c"), TaskState::Waiting);
    assert!(notified(&out).contains(&(tb, TaskState::Waiting)));
    let (w2, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(names(&sim, &out), vec!["a"]);
    let out = sim.finish_with(
        w2,
        ta,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 5)],
        None,
        1.0,
    );
    let a = assigns(&out);
    assert_eq!(sim.name(a[0].1.task), "b");
    assert_eq!(a[0].1.inputs, vec![(obj("a.out", 5), "addr-1".to_string())]);
    assert_eq!(a[0].1.attempt, 2);
    let out = sim.finish_with(
        w2,
        tb,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 5)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["c"]);
    let out = sim.finish_with(
        w2,
        tc,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("c.out", 5)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["side"]);
    let ts = sim.tref(job, "side");
    let out = sim.finish(w2, ts, 1, AttemptOutcome::Succeeded);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 0);
}

#[test]
fn outputs_still_held_elsewhere_need_no_rerun_and_unneeded_ones_are_not_rebuilt() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(TRANSFER);
    let (w1, out1) = sim.join(wspec(1.0, &[]));
    let (w2, out2) = sim.join(wspec(1.0, &[]));
    let (ta, tb) = (assigns(&out1)[0].1.task, assigns(&out2)[0].1.task);
    sim.finish_with(
        w1,
        ta,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 10)],
        None,
        1.0,
    );
    let out = sim.finish_with(
        w2,
        tb,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 1000)],
        None,
        1.0,
    );
    let tc = assigns(&out)[0].1.task;
    sim.ev(Event::TaskStarted {
        worker: w2,
        task: tc,
        attempt: 1,
    });
    let out = sim.finish_with(
        w2,
        tc,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("c.out", 1)],
        None,
        1.0,
    );
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    // Nothing needs a.out any more: losing w1 reruns nothing.
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "gone".into(),
    });
    assert!(notified(&out).is_empty());
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 3);
}

/// Runs a replay of `records` into a fresh coordinator and calls `recovered`.
fn replayed(records: &[JournalRecord], now: Millis) -> Coordinator {
    let mut c = Coordinator::new(config(0));
    let mut sink = Vec::new();
    for r in records {
        c.replay(now, r.clone(), &mut sink).expect("replays");
    }
    c.recovered(now);
    c
}

#[test]
fn after_a_restart_finished_tasks_stay_done_and_assigned_ones_wait_for_their_worker() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n[[task]]\nid = \"end\"\ncmd = [\"y\"]\nafter = [\"t\"]\n";
    let spec = parse_job(text, "job.toml").unwrap();
    let job = sim.c.next_job_id();
    let ev = Event::JobSubmitted {
        job,
        spec,
        dir: "/d".into(),
        tenant: "t".into(),
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let (w1, _) = sim.join(wspec(3.0, &[]));
    journal.extend(sim.c.take_journal_records());
    assert_eq!(journal.len(), 4, "the submission and three assignments");
    let t = |i: u32| TaskRef {
        job,
        task: TaskId::new(i),
    };
    let ev = Event::TaskFinished {
        worker: w1,
        task: t(0),
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records()); // t[3] assigned
    assert_eq!(journal.len(), 6);
    // Crash. Replay at a later time.
    let mut c = replayed(&journal, 10_000);
    assert!(c.next_job_id() > job);
    assert!(c.next_worker_id() > w1, "worker ids are not reused");
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Done);
    for i in 1..4 {
        assert_eq!(
            s.tasks[i].state,
            TaskState::Assigned,
            "t[{i}] waits for its worker"
        );
    }
    // A new worker joins: nothing is placed during the grace.
    let mut out = Vec::new();
    let w2 = c.next_worker_id();
    c.handle(
        10_001,
        Event::WorkerJoined {
            worker: w2,
            spec: wspec(8.0, &[]),
            running: vec![],
            held: vec![],
        },
        &mut out,
    )
    .unwrap();
    assert!(assigns(&out).is_empty(), "{out:?}");
    // The old worker comes back under a new id reporting t[1] running and a stale attempt.
    let w3 = c.next_worker_id();
    out.clear();
    c.handle(
        10_002,
        Event::WorkerJoined {
            worker: w3,
            spec: wspec(3.0, &[]),
            running: vec![(t(1), 1), (t(0), 1), (t(2), 7)],
            held: vec![],
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(
        c.job_status(job).unwrap().tasks[1].state,
        TaskState::Running
    );
    assert_eq!(c.job_status(job).unwrap().tasks[1].worker, Some(w3));
    let mut cx = cancels(&out);
    cx.sort();
    assert_eq!(
        cx,
        vec![(w3, t(0), 1), (w3, t(2), 7)],
        "finished or unknown attempts are cancelled"
    );
    // It had finished t[2] while the coordinator was down: applied once.
    out.clear();
    let fin = |w, i, ok: bool| Event::TaskFinished {
        worker: w,
        task: t(i),
        attempt: 1,
        result: AttemptResult {
            outcome: if ok {
                AttemptOutcome::Succeeded
            } else {
                AttemptOutcome::Cancelled
            },
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    c.handle(10_003, fin(w3, 2, true), &mut out).unwrap();
    assert_eq!(c.job_status(job).unwrap().tasks[2].state, TaskState::Done);
    out.clear();
    c.handle(10_004, fin(w3, 2, true), &mut out).unwrap();
    assert!(out.is_empty(), "a duplicate is ignored");
    assert_eq!(c.job_status(job).unwrap().counts.done, 2);
    // t[3]'s worker never reports: after the grace it is placed again (attempt 2).
    out.clear();
    c.handle(14_999, Event::Tick, &mut out).unwrap();
    assert!(assigns(&out).is_empty());
    c.handle(15_000, Event::Tick, &mut out).unwrap();
    let a = assigns(&out);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].1.task, a[0].1.attempt), (t(3), 2));
    // t[0] was never rerun.
    assert_eq!(c.job_status(job).unwrap().tasks[0].attempts, 1);
}

#[test]
fn replay_rebuilds_backoff_cancel_and_the_perf_model() {
    let mut sim = Sim::new(0);
    let mut journal = Vec::new();
    let spec = parse_job(VARIANTS, "job.toml").unwrap();
    let job = sim.c.next_job_id();
    let ev = Event::JobSubmitted {
        job,
        spec,
        dir: "/d".into(),
        tenant: "t".into(),
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let (w, out) = sim.join(wspec(1.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let a = assigns(&out);
    let ev = Event::TaskFinished {
        worker: w,
        task: a[0].1.task,
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage {
                wall_seconds: 2.0,
                ..Usage::default()
            },
            outputs: vec![],
            variant: Some("cpu".into()),
        },
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records());
    journal.push(JournalRecord::JobCancelled { job });
    let c = replayed(&journal, 50);
    assert_eq!(
        c.perf_model().stats("v/sim/cpu", "cpu", 0).map(|s| s.count),
        Some(1)
    );
    let s = c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Cancelled);
    assert_eq!(s.counts.done, 1);
    assert_eq!(s.counts.cancelled, 39);
    assert_eq!(s.tasks[0].variant.as_deref(), Some("cpu"));
}

#[test]
fn replayed_assignments_are_validated() {
    let mut c = Coordinator::new(config(0));
    let mut out = Vec::new();
    let spec = parse_job(VARIANTS, "job.toml").unwrap();
    let job = c.next_job_id();
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec,
            dir: String::new(),
            tenant: String::new(),
        },
        &mut out,
    )
    .unwrap();
    let task = TaskRef {
        job,
        task: TaskId::new(0),
    };
    let assigned = |worker: u32, attempt: u32, variant: &str| Event::TaskAssigned {
        worker: WorkerId::new(worker),
        task,
        attempt,
        variant: Some(variant.into()),
        gpu_indices: vec![],
        hw_class: "cpu".into(),
    };
    c.handle(0, assigned(4, 1, "cpu"), &mut out).unwrap();
    assert!(
        c.handle(0, assigned(4, 1, "cpu"), &mut out).is_err(),
        "not newer"
    );
    assert!(
        c.handle(0, assigned(5, 2, "fpga"), &mut out).is_err(),
        "no such variant"
    );
    c.handle(0, assigned(5, 2, "gpu"), &mut out).unwrap();
    assert_eq!(c.next_worker_id(), WorkerId::new(6));
    let bad = TaskRef {
        job,
        task: TaskId::new(999),
    };
    let e = c
        .handle(
            0,
            Event::TaskAssigned {
                worker: WorkerId::new(1),
                task: bad,
                attempt: 1,
                variant: None,
                gpu_indices: vec![],
                hw_class: String::new(),
            },
            &mut out,
        )
        .unwrap_err();
    assert_eq!(e, StateError::UnknownTask(bad));
    // A live worker cannot be named by a replayed assignment.
    let w = c.join(wspec(1.0, &[]), &mut out);
    assert!(c.handle(0, assigned(w.0, 9, "cpu"), &mut out).is_err());
}

#[test]
fn invalid_events_change_nothing() {
    let mut sim = Sim::new(1);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let snapshot = |c: &Coordinator| {
        (
            serde_json::to_string(&c.job_status(job)).unwrap(),
            serde_json::to_string(&c.workers()).unwrap(),
            c.next_job_id(),
        )
    };
    let before = snapshot(&sim.c);
    let ghost_task = TaskRef {
        job: JobId::new(42),
        task: TaskId::new(0),
    };
    let bad_task = TaskRef {
        job,
        task: TaskId::new(40),
    };
    let mut bad_gpu = wspec(1.0, &[1, 1]);
    bad_gpu.gpus[1].index = 0;
    let mut neg = wspec(1.0, &[]);
    neg.resources.cpus = -1.0;
    let events = vec![
        Event::JobCancelled {
            job: JobId::new(42),
        },
        Event::TaskStarted {
            worker: w,
            task: ghost_task,
            attempt: 1,
        },
        Event::TaskStarted {
            worker: w,
            task: bad_task,
            attempt: 1,
        },
        Event::TaskReturned {
            worker: WorkerId::new(99),
            task: sim.tref(job, "a"),
            attempt: 1,
        },
        Event::WorkerLost {
            worker: WorkerId::new(99),
            reason: String::new(),
        },
        Event::WorkerJoined {
            worker: w,
            spec: wspec(1.0, &[]),
            running: vec![],
            held: vec![],
        },
        Event::WorkerJoined {
            worker: WorkerId::new(50),
            spec: bad_gpu,
            running: vec![],
            held: vec![],
        },
        Event::WorkerJoined {
            worker: WorkerId::new(51),
            spec: neg,
            running: vec![],
            held: vec![],
        },
        Event::TaskFinished {
            worker: WorkerId::new(99),
            task: sim.tref(job, "a"),
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage::default(),
                outputs: vec![],
                variant: None,
            },
        },
    ];
    for e in events {
        let r = sim.try_ev(e.clone());
        assert!(r.is_err(), "{e:?} should be refused");
        assert_eq!(snapshot(&sim.c), before, "{e:?} changed something");
    }
    assert!(sim
        .try_ev(Event::TaskReturned {
            worker: w,
            task: bad_task,
            attempt: 1
        })
        .is_err());
}

#[test]
fn a_cancelled_attempt_of_a_running_job_is_placed_again_without_a_retry() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let ta = sim.tref(job, "a");
    let out = sim.finish(w, ta, 1, AttemptOutcome::Cancelled);
    let a = assigns(&out);
    assert_eq!((a[0].1.task, a[0].1.attempt), (ta, 2));
    assert_eq!(sim.c.job_status(job).unwrap().tasks[0].failures, 0);
}

#[test]
fn events_and_records_convert_both_ways() {
    let e = Event::JobCancelled { job: JobId::new(3) };
    assert!(e.journaled());
    let r = JournalRecord::from_event(&e).unwrap();
    assert_eq!(Event::from(r), e);
    for e in [
        Event::Tick,
        Event::WorkerLost {
            worker: WorkerId::new(1),
            reason: String::new(),
        },
        Event::TaskStarted {
            worker: WorkerId::new(1),
            task: TaskRef {
                job: JobId::new(1),
                task: TaskId::new(0),
            },
            attempt: 1,
        },
    ] {
        assert!(!e.journaled());
        assert!(JournalRecord::from_event(&e).is_none());
    }
    assert_eq!(TaskState::Backoff.to_string(), "backoff");
    assert_eq!(JobState::Succeeded.to_string(), "succeeded");
    assert_eq!(
        TaskRef {
            job: JobId::new(2),
            task: TaskId::new(5)
        }
        .to_string(),
        "job-2/t5"
    );
}

#[test]
fn worker_status_reports_use_and_utilization() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\ncmd = [\"x\"]\nresources = { cpus = 2 }\n");
    let (w, _) = sim.join(wspec(4.0, &[]));
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.used.cpus, 2.0);
    assert_eq!(ws.tasks, vec![(sim.tref(job, "t"), 1)]);
    sim.now = 10_000;
    sim.finish_with(
        w,
        sim.tref(job, "t"),
        1,
        AttemptOutcome::Succeeded,
        vec![],
        None,
        20.0,
    );
    let ws = &sim.c.workers()[0];
    assert!(
        (ws.utilization - 0.5).abs() < 1e-9,
        "20 cpu-s over 4 cpus x 10 s: {}",
        ws.utilization
    );
    assert_eq!(ws.used.cpus, 0.0);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.makespan_s, 10.0);
    assert_eq!(s.tasks[0].usage.unwrap().cpu_seconds, 20.0);
    assert_eq!(s.task_by_name("t"), Some((TaskId::new(0), 1, true)));
    assert_eq!(sim.c.task_status(job, "t").as_ref(), Some(&s.tasks[0]));
    assert!(sim.c.task_status(job, "nope").is_none());
    assert_eq!(sim.c.job_summary(job).unwrap().done, 1);
    assert!(sim.c.job_summary(JobId::new(9)).is_none());
}

/// The scale target: a 1,000,000-instance array plus a reduce, 2 workers, every Assign
/// answered by TaskFinished. Each event touches O(log n) state (no scan of the tasks).
#[test]
fn a_million_task_job_runs_to_completion() {
    const N: u32 = 1_000_000;
    let mut c = Coordinator::new(Config {
        queue_depth: 4,
        ..config(4)
    });
    let text = format!(
        "[[task]]\nid = \"map\"\narray = \"0..{N}\"\ncmd = [\"m\", \"{{i}}\"]\n[[task]]\nid = \"reduce\"\ncmd = [\"r\"]\nafter = [\"map\"]\n"
    );
    let spec = parse_job(&text, "big.toml").unwrap();
    let job = c.next_job_id();
    let mut out = Vec::new();
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec,
            dir: String::new(),
            tenant: String::new(),
        },
        &mut out,
    )
    .unwrap();
    let mut pending = std::collections::VecDeque::new();
    for _ in 0..2 {
        let w = c.join(wspec(4.0, &[]), &mut out);
        let _ = w;
    }
    let mut finished_jobs = 0;
    let mut now = 0;
    let mut events = 0u64;
    loop {
        for cmd in out.drain(..) {
            match cmd {
                Command::Assign { worker, tasks } => {
                    for a in tasks {
                        pending.push_back((worker, a.task, a.attempt));
                    }
                }
                Command::Notify(Notification::JobFinished { state, .. }) => {
                    assert_eq!(state, JobState::Succeeded);
                    finished_jobs += 1;
                }
                _ => {}
            }
        }
        let Some((worker, task, attempt)) = pending.pop_front() else {
            break;
        };
        now += 1;
        events += 1;
        c.handle(
            now,
            Event::TaskFinished {
                worker,
                task,
                attempt,
                result: AttemptResult {
                    outcome: AttemptOutcome::Succeeded,
                    usage: Usage::default(),
                    outputs: vec![],
                    variant: None,
                },
            },
            &mut out,
        )
        .unwrap();
    }
    assert_eq!(finished_jobs, 1);
    assert_eq!(events, u64::from(N) + 1);
    let s = c.jobs();
    assert_eq!(s[0].done, u64::from(N) + 1);
    assert!(c.jobs_map()[&job].all_final());
}

#[test]
fn replay_accepts_what_was_accepted_live() {
    // Live: a stale report from a worker that never got anything is accepted (and so
    // journaled); a lineage rerun reassigns a Done task. Both must replay.
    let mut sim = Sim::new(0);
    let mut journal = Vec::new();
    let spec = parse_job(
        "staging = \"transfer\"\n[[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.out\"]\n[[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\n",
        "job.toml",
    )
    .unwrap();
    let job = sim.c.next_job_id();
    let ev = Event::JobSubmitted {
        job,
        spec,
        dir: "/d".into(),
        tenant: "t".into(),
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let ta = sim.tref(job, "a");
    let stale = Event::TaskFinished {
        worker: w2,
        task: ta,
        attempt: 9,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&stale));
    assert!(sim.ev(stale).is_empty());
    let done = Event::TaskFinished {
        worker: w1,
        task: ta,
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![obj("a.out", 3)],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&done));
    sim.ev(done);
    journal.extend(sim.c.take_journal_records()); // b on w1 (it holds a.out)
                                                  // w1 dies with b queued: a is rerun (on w2), b waits.
    sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "killed".into(),
    });
    journal.extend(sim.c.take_journal_records());
    assert_eq!(sim.state(job, "a"), TaskState::Assigned);
    assert_eq!(sim.state(job, "b"), TaskState::Waiting);
    let mut c = replayed(&journal, 100);
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Assigned);
    assert_eq!(s.tasks[0].attempts, 2);
    // b's assignment to w1 was journaled, its loss was not: it waits for w1 like any
    // replayed assignment, then goes back to waiting for the rerun of a.
    assert_eq!(s.tasks[1].state, TaskState::Assigned);
    let mut out = Vec::new();
    c.handle(100 + 5_000, Event::Tick, &mut out).unwrap();
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Ready);
    assert_eq!(
        s.tasks[1].state,
        TaskState::Waiting,
        "b waits for the rerun of a"
    );
    assert!(c.next_worker_id() > w2);
}

/// Regression (coordinator SIGKILLed between journaling an assignment and sending it): the
/// worker comes back under a new id naming its previous one; the attempts journaled for the
/// old id that it does not report are placed again at once, not after the grace.
#[test]
fn a_rejoining_worker_releases_the_assignments_it_never_received() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "[[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"x\"]\n";
    let spec = parse_job(text, "job.toml").unwrap();
    let job = sim.c.next_job_id();
    let ev = Event::JobSubmitted {
        job,
        spec,
        dir: "/d".into(),
        tenant: "t".into(),
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let (w1, _) = sim.join(wspec(2.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let t = |i: u32| TaskRef {
        job,
        task: TaskId::new(i),
    };
    let mut c = replayed(&journal, 10_000);
    // w1 comes back as a new worker: it runs t[0]; t[1]'s assignment never reached it.
    let w2 = c.next_worker_id();
    let mut out = Vec::new();
    c.handle(
        10_001,
        Event::WorkerJoined {
            worker: w2,
            spec: wspec(2.0, &[]),
            running: vec![(t(0), 1)],
            held: vec![],
        },
        &mut out,
    )
    .unwrap();
    assert!(
        assigns(&out).is_empty(),
        "nothing moves during the grace yet"
    );
    c.handle(
        10_001,
        Event::WorkerReconciled {
            worker: w2,
            previous: w1,
        },
        &mut out,
    )
    .unwrap();
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Running);
    assert_eq!(s.tasks[0].worker, Some(w2));
    // t[1] is placed again at once, on w2, with a new attempt (well before the grace ends).
    let a = assigns(&out);
    assert_eq!(a.len(), 1, "{out:?}");
    assert_eq!(a[0].0, w2);
    assert_eq!(a[0].1.task, t(1));
    assert_eq!(c.job_status(job).unwrap().tasks[1].attempts, 2);
}
