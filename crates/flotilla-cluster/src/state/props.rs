//! Property tests of the scheduler's guarantees: random workers, random jobs, random events
//! (starts, finishes, failures, returns, worker losses and joins, time) and after every event:
//! no worker oversubscribed, no task assigned before its predecessors are done, no idle
//! worker left with a ready task that fits it, counters consistent; finally, with a worker
//! big enough for everything, every job ends.

use std::collections::BTreeMap;

use flotilla_core::{parse_job, TaskId, TaskKind, WorkerId};
use proptest::prelude::*;

use super::coordinator::resources_of;
use super::tests::{config, wspec};
use super::*;
use flotilla_core::ledger::EPS;

#[derive(Debug, Clone)]
struct Group {
    count: u32,
    cpus: f64,
    mem_gib: u64,
    gpus: f64,
    gpu_mem_gib: u64,
    lic: u32,
    after: Vec<usize>,
    retries: u32,
    variants: bool,
    priority: i64,
}

fn group() -> impl Strategy<Value = Group> {
    (
        1u32..5,
        prop::sample::select(vec![0.5, 1.0, 2.0]),
        0u64..4,
        prop::sample::select(vec![0.0, 0.0, 0.5, 1.0]),
        0u64..3,
        0u32..2,
        prop::collection::vec(0usize..8, 0..3),
        0u32..3,
        prop::bool::weighted(0.25),
        -1i64..2,
    )
        .prop_map(
            |(count, cpus, mem_gib, gpus, gpu_mem_gib, lic, after, retries, variants, priority)| {
                Group {
                    count,
                    cpus,
                    mem_gib,
                    gpus,
                    gpu_mem_gib: if gpus > 0.0 { gpu_mem_gib } else { 0 },
                    lic,
                    after,
                    retries,
                    variants,
                    priority,
                }
            },
        )
}

fn job_text(groups: &[Group]) -> String {
    let mut s = String::new();
    for (i, g) in groups.iter().enumerate() {
        s.push_str(&format!(
            "[[task]]\nid = \"g{i}\"\narray = \"0..{}\"\nretries = {}\npriority = {}\n",
            g.count, g.retries, g.priority
        ));
        let deps: Vec<String> = g
            .after
            .iter()
            .filter(|&&d| d < i)
            .map(|d| format!("\"g{d}\""))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !deps.is_empty() {
            s.push_str(&format!("after = [{}]\n", deps.join(", ")));
        }
        let mut res = format!("cpus = {}, mem = \"{}GiB\"", g.cpus, g.mem_gib);
        if g.lic > 0 {
            res.push_str(&format!(", lic = {}", g.lic));
        }
        if g.variants {
            s.push_str(&format!("resources = {{ {res} }}\n"));
            s.push_str(
                "[[task.variant]]\nname = \"gpu\"\ncmd = [\"x\"]\nresources = { gpus = 1 }\n",
            );
            s.push_str("[[task.variant]]\nname = \"cpu\"\ncmd = [\"x\"]\n");
        } else {
            if g.gpus > 0.0 {
                res.push_str(&format!(
                    ", gpus = {}, gpu_mem = \"{}GiB\"",
                    g.gpus, g.gpu_mem_gib
                ));
            }
            s.push_str(&format!("cmd = [\"x\"]\nresources = {{ {res} }}\n"));
        }
    }
    s
}

#[derive(Debug, Clone)]
struct WorkerShape {
    cpus: f64,
    mem_gib: u64,
    gpus: Vec<u64>,
    lic: u32,
}

fn worker_shape() -> impl Strategy<Value = WorkerShape> {
    (
        prop::sample::select(vec![1.0, 2.0, 4.0]),
        2u64..9,
        prop::collection::vec(prop::sample::select(vec![1u64, 4]), 0..3),
        0u32..3,
    )
        .prop_map(|(cpus, mem_gib, gpus, lic)| WorkerShape {
            cpus,
            mem_gib,
            gpus,
            lic,
        })
}

fn spec_of(w: &WorkerShape) -> WorkerSpec {
    let gpus: Vec<u64> = w.gpus.iter().map(|g| g << 30).collect();
    let mut s = wspec(w.cpus, &gpus);
    s.resources.mem = w.mem_gib << 30;
    if w.lic > 0 {
        s.resources.custom.insert("lic".into(), f64::from(w.lic));
    }
    s
}

#[derive(Debug, Clone)]
enum Op {
    Start(usize),
    Succeed(usize),
    Fail(usize, bool),
    Cancelled(usize),
    Return(usize),
    Lose(usize),
    Join(WorkerShape),
    Tick(u64),
    Submit(Vec<Group>),
    /// `flotilla retry` of the n-th job (refused when it has nothing to retry).
    Retry(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<usize>().prop_map(Op::Start),
        6 => any::<usize>().prop_map(Op::Succeed),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, r)| Op::Fail(i, r)),
        1 => any::<usize>().prop_map(Op::Cancelled),
        2 => any::<usize>().prop_map(Op::Return),
        1 => any::<usize>().prop_map(Op::Lose),
        1 => worker_shape().prop_map(Op::Join),
        2 => (0u64..400).prop_map(Op::Tick),
        1 => prop::collection::vec(group(), 1..4).prop_map(Op::Submit),
        1 => any::<usize>().prop_map(Op::Retry),
    ]
}

/// The world around the coordinator: what each worker was told.
struct World {
    c: Coordinator,
    now: Millis,
    /// (worker, task, attempt) -> started.
    assigned: BTreeMap<(WorkerId, TaskRef, u32), bool>,
    retracted: Vec<(WorkerId, TaskRef, u32)>,
}

impl World {
    fn apply(&mut self, e: Event) {
        let mut out = Vec::new();
        let r = self.c.handle(self.now, e.clone(), &mut out);
        if r.is_err() {
            assert!(out.is_empty(), "a refused event emitted commands");
        }
        self.absorb(out);
        check(&self.c);
    }

    fn absorb(&mut self, out: Vec<Command>) {
        for cmd in out {
            match cmd {
                Command::Assign { worker, tasks } => {
                    for a in tasks {
                        // No task is assigned before its predecessors are done, except
                        // a chained one, behind its last predecessor on the same worker.
                        let j = &self.c.jobs_map()[&a.task.job];
                        for p in j.graph.preds(a.task.task) {
                            if let Some((pt, pa)) = a.after {
                                if pt.task == *p {
                                    let rt = &j.tasks[p.index()];
                                    assert!(
                                        matches!(
                                            rt.state,
                                            TaskState::Assigned | TaskState::Running
                                        ) && rt.attempt == pa
                                            && rt.worker == Some(worker),
                                        "{} chained behind {p}, which is not on {worker}",
                                        a.task
                                    );
                                    continue;
                                }
                            }
                            assert_eq!(
                                j.tasks[p.index()].state,
                                TaskState::Done,
                                "{} assigned before its predecessor {p}",
                                a.task
                            );
                        }
                        self.assigned.insert((worker, a.task, a.attempt), false);
                    }
                }
                Command::Retract {
                    worker,
                    task,
                    attempt,
                } => self.retracted.push((worker, task, attempt)),
                Command::Cancel { .. } | Command::Notify(_) => {}
            }
        }
    }

    fn pick(&self, i: usize) -> Option<(WorkerId, TaskRef, u32, bool)> {
        if self.assigned.is_empty() {
            return None;
        }
        let (k, s) = self.assigned.iter().nth(i % self.assigned.len())?;
        Some((k.0, k.1, k.2, *s))
    }

    fn finish(&mut self, i: usize, outcome: AttemptOutcome) {
        if let Some((w, t, a, _)) = self.pick(i) {
            // A chained task waiting for its predecessor has not started: a worker can only
            // answer a Cancel for it (with Cancelled), nothing else.
            let slot = self
                .c
                .workers_map()
                .get(&w)
                .and_then(|wk| wk.slots.get(&(t, a)));
            let chained = slot.is_some_and(|s| s.after.is_some());
            let cancelled = slot.is_some_and(|s| s.cancel_sent);
            let outcome = match (chained, cancelled) {
                (false, _) => outcome,
                (true, true) => AttemptOutcome::Cancelled,
                (true, false) if outcome == AttemptOutcome::Cancelled => outcome,
                (true, false) => return,
            };
            self.assigned.remove(&(w, t, a));
            self.apply(Event::TaskFinished {
                worker: w,
                task: t,
                attempt: a,
                result: AttemptResult {
                    outcome,
                    usage: Usage {
                        cpu_seconds: 1.0,
                        peak_rss_bytes: 0,
                        wall_seconds: 1.0,
                        ..Default::default()
                    },
                    outputs: Vec::new(),
                    variant: None,
                },
            });
        }
    }

    fn submit(&mut self, groups: &[Group]) {
        let spec = parse_job(&job_text(groups), "p.toml").expect("generated jobs parse");
        let job = self.c.next_job_id();
        self.apply(Event::JobSubmitted {
            job,
            spec,
            dir: String::new(),
            tenant: String::new(),
        });
    }

    fn join(&mut self, w: &WorkerShape) {
        let id = self.c.next_worker_id();
        self.apply(Event::WorkerJoined {
            worker: id,
            spec: spec_of(w),
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        });
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Start(i) => {
                if let Some((w, t, a, started)) = self.pick(*i) {
                    // A worker starts a chained task only after its predecessor succeeded.
                    let chained =
                        self.c.workers_map().get(&w).is_some_and(|wk| {
                            wk.slots.get(&(t, a)).is_some_and(|s| s.after.is_some())
                        });
                    if !started && !chained {
                        let mut out = Vec::new();
                        // A queued task beyond capacity is refused: that is the contract.
                        if self
                            .c
                            .handle(
                                self.now,
                                Event::TaskStarted {
                                    worker: w,
                                    task: t,
                                    attempt: a,
                                },
                                &mut out,
                            )
                            .is_ok()
                        {
                            self.assigned.insert((w, t, a), true);
                        }
                        self.absorb(out);
                        check(&self.c);
                    }
                }
            }
            Op::Succeed(i) => self.finish(*i, AttemptOutcome::Succeeded),
            Op::Fail(i, retryable) => self.finish(
                *i,
                AttemptOutcome::Failed {
                    message: "x".into(),
                    retryable: *retryable,
                },
            ),
            Op::Cancelled(i) => self.finish(*i, AttemptOutcome::Cancelled),
            Op::Return(i) => {
                if self.retracted.is_empty() {
                    return;
                }
                let (w, t, a) = self.retracted.remove(i % self.retracted.len());
                if self.assigned.get(&(w, t, a)) == Some(&false) {
                    self.assigned.remove(&(w, t, a));
                    self.apply(Event::TaskReturned {
                        worker: w,
                        task: t,
                        attempt: a,
                    });
                }
            }
            Op::Lose(i) => {
                let ws: Vec<WorkerId> = self.c.workers_map().keys().copied().collect();
                if ws.is_empty() {
                    return;
                }
                let w = ws[i % ws.len()];
                self.assigned.retain(|k, _| k.0 != w);
                self.retracted.retain(|k| k.0 != w);
                self.apply(Event::WorkerLost {
                    worker: w,
                    reason: "test".into(),
                });
            }
            Op::Join(shape) => self.join(shape),
            Op::Tick(dt) => {
                self.now += dt;
                self.apply(Event::Tick);
            }
            Op::Submit(groups) => self.submit(groups),
            Op::Retry(i) => {
                let jobs: Vec<JobId> = self.c.jobs_map().keys().copied().collect();
                if !jobs.is_empty() {
                    let job = jobs[i % jobs.len()];
                    self.apply(Event::JobRetried { job });
                }
            }
        }
    }
}

/// The invariants, checked against the coordinator's internals.
fn check(c: &Coordinator) {
    if let Err(e) = c.check_worker_index() {
        panic!("{e}");
    }
    for w in c.workers_map().values() {
        // Reserved slots fit the capacity (recomputed from the slots, not from `used`).
        let (mut cpus, mut mem, mut lic) = (0.0, 0u64, 0.0);
        let mut share = vec![0.0; w.ledger.gpus().len()];
        let mut gmem = vec![0u64; w.ledger.gpus().len()];
        for ((t, _), s) in &w.slots {
            if s.started {
                assert!(s.reserved, "{t} running on {} without a reservation", w.id);
            }
            if !s.reserved {
                assert!(
                    s.gpus.is_empty() && s.res.gpus == 0.0,
                    "a queued task holds GPUs"
                );
                continue;
            }
            cpus += s.res.cpus;
            mem += s.res.mem;
            lic += s.res.custom.get("lic").copied().unwrap_or(0.0);
            let per = if s.gpus.is_empty() {
                0
            } else {
                s.res.gpu_mem / s.gpus.len() as u64
            };
            for (i, sh) in &s.gpus {
                share[*i] += sh;
                gmem[*i] += per;
            }
        }
        assert!(
            cpus <= w.cap().cpus + EPS,
            "{}: cpus {cpus} > {}",
            w.id,
            w.cap().cpus
        );
        assert!(mem <= w.cap().mem, "{}: mem oversubscribed", w.id);
        let cap_lic = w.cap().custom.get("lic").copied().unwrap_or(0.0);
        assert!(lic <= cap_lic + EPS, "{}: lic {lic} > {cap_lic}", w.id);
        for (i, g) in w.ledger.gpus().iter().enumerate() {
            assert!(share[i] <= 1.0 + EPS, "{}: GPU {i} shared beyond 1", w.id);
            assert!(
                gmem[i] <= g.gpu.mem_bytes,
                "{}: GPU {i} memory oversubscribed",
                w.id
            );
        }
        // Placement queues at most `queue_depth`; chained tasks released into the queue when
        // their predecessor succeeds (and that do not fit yet) may add up to `chain_depth`.
        let cfg = c.config();
        assert!(
            w.queue.len() <= cfg.queue_depth + cfg.chain_depth,
            "{}: {} queued",
            w.id,
            w.queue.len()
        );
        assert!(w.chained() <= cfg.chain_depth, "{}: too many chained", w.id);
    }
    for j in c.jobs_map().values() {
        let mut counts = [0u64; 8];
        for rt in &j.tasks {
            counts[rt.state.index()] += 1;
        }
        assert_eq!(counts, j.counts, "counters of {}", j.id);
        if !j.is_active() {
            assert_eq!(counts[TaskState::Ready.index()], 0);
            continue;
        }
        // No idle worker is left with a ready task that fits it.
        for c_ in &j.classes {
            let Some(&t) = c_.ready.first() else { continue };
            let t = TaskId::new(t);
            for w in c.workers_map().values().filter(|w| w.is_idle()) {
                let fits = match &j.graph.task(t).kind {
                    TaskKind::Variants(vs) => vs.iter().any(|v| w.fit_free(&v.resources).is_some()),
                    _ => w.fit_free(resources_of(j, t, None)).is_some(),
                };
                assert!(
                    !fits,
                    "{} is ready and fits idle worker {}",
                    j.tref(t),
                    w.id
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_scheduler_keeps_its_guarantees(
        workers in prop::collection::vec(worker_shape(), 1..4),
        jobs in prop::collection::vec(prop::collection::vec(group(), 1..5), 1..3),
        ops in prop::collection::vec(op(), 0..120),
        depth in 0usize..3,
    ) {
        let mut world = World {
            // Chained dispatch on whenever batched dispatch is.
            c: Coordinator::new(Config { chain_depth: depth, ..config(depth) }),
            now: 0,
            assigned: BTreeMap::new(),
            retracted: Vec::new(),
        };
        for g in &jobs {
            world.submit(g);
        }
        for w in &workers {
            world.join(w);
        }
        for op in &ops {
            world.step(op);
        }
        // Drain: a worker that fits everything joins, every attempt succeeds, time passes.
        world.join(&WorkerShape { cpus: 4.0, mem_gib: 16, gpus: vec![4, 4], lic: 2 });
        for _ in 0..10_000 {
            if world.c.jobs_map().values().all(|j| !j.is_active()) {
                break;
            }
            if world.assigned.is_empty() {
                world.now += 1_000;
                world.apply(Event::Tick);
                continue;
            }
            // Answer retractions first, then finish the oldest attempt.
            if let Some((w, t, a)) = world.retracted.pop() {
                if world.assigned.get(&(w, t, a)) == Some(&false) {
                    world.assigned.remove(&(w, t, a));
                    world.apply(Event::TaskReturned { worker: w, task: t, attempt: a });
                }
                continue;
            }
            // The oldest attempt a worker could have started (not a chained one still
            // waiting for its predecessor).
            let i = world
                .assigned
                .keys()
                .position(|(w, t, a)| {
                    world.c.workers_map().get(w).is_none_or(|wk| {
                        wk.slots
                            .get(&(*t, *a))
                            .is_none_or(|s| s.after.is_none() || s.cancel_sent)
                    })
                })
                .unwrap_or(0);
            world.finish(i, AttemptOutcome::Succeeded);
        }
        for j in world.c.jobs_map().values() {
            prop_assert!(!j.is_active(), "job {} did not finish: {:?}", j.id, j.counts);
            prop_assert!(j.all_final() || j.state != JobState::Succeeded);
        }
    }
}
