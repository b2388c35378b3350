//! One job's runtime state: a [`TaskRt`] per instance of its [`TaskGraph`], ready sets per
//! task class, counters per state, and (transfer staging) who holds which outputs.
//!
//! Per-event work is O(log n): successors come from the graph's adjacency lists, each task
//! keeps its count of unfinished predecessors (`unmet`), and ready tasks sit in one ordered
//! set per *class* (the instances of one `[[task]]`, which share resources, variants and
//! priority), so placement pops the next task of a class in O(log n) and stops trying a
//! class as soon as one of its tasks does not fit anywhere.
//!
//! | transition helper | effect |
//! | --- | --- |
//! | [`Job::set_state`] | moves a task, keeps counters and ready sets, notifies |
//! | [`Job::mark_done`] | `Done`, then successors with no unmet predecessor become `Ready` |
//! | [`Job::runnable`] | `Ready` if every predecessor is `Done`, else `Waiting` |
//! | [`Job::undo_done`] | lineage: `Done` tasks back to `Ready`/`Waiting`, successors' `unmet` raised |

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use flotilla_core::{JobId, Staging, TaskGraph, TaskId, TaskKind, WorkerId};

use super::{
    Command, JobState, Millis, Notification, ObjectRef, Placement, TaskRef, TaskState, Usage,
};

/// The instances of one `[[task]]`: consecutive ids sharing resources, variants, priority.
#[derive(Debug)]
pub(crate) struct Class {
    pub(crate) first: u32,
    pub(crate) end: u32,
    pub(crate) priority: i64,
    /// Ready tasks, lowest id first.
    pub(crate) ready: BTreeSet<u32>,
    /// Round-robin counter for exploring uncalibrated variants.
    pub(crate) explore: usize,
    /// `"<job>/<base>"`, the performance model's codelet prefix.
    pub(crate) codelet: String,
    /// A hash of its resource options (variant names and resources): tasks of the same
    /// shape fit the same workers (see the scheduling pass's memo of shapes with no room).
    pub(crate) shape: u64,
}

/// The [`Class::shape`] of a task instance.
fn shape_of(t: &flotilla_core::TaskInstance) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let options: Vec<(Option<&str>, &flotilla_core::Resources)> = match &t.kind {
        TaskKind::Variants(vs) => vs
            .iter()
            .map(|v| (Some(v.name.as_str()), &v.resources))
            .collect(),
        _ => vec![(None, &t.resources)],
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{options:?}").hash(&mut h);
    h.finish()
}

/// What is rarely needed, boxed to keep [`TaskRt`] small.
#[derive(Debug, Default)]
pub(crate) struct TaskExt {
    pub(crate) usage: Option<Usage>,
    pub(crate) message: Option<String>,
    /// Why it was placed where it was, unless it was a plain eager placement.
    pub(crate) reason: Option<Placement>,
    /// The worker `reason` placed it on (a later attempt elsewhere, or a replica's result
    /// accepted from another worker, makes it stale).
    pub(crate) reason_worker: Option<WorkerId>,
    /// The checkpoint its last preempted attempt left (transfer staging).
    pub(crate) resume: Vec<ObjectRef>,
}

/// One task instance's state.
#[derive(Debug)]
pub(crate) struct TaskRt {
    pub(crate) state: TaskState,
    /// Latest attempt number (0 before the first assignment).
    pub(crate) attempt: u32,
    /// Failed attempts counted against `retries`.
    pub(crate) failures: u32,
    /// Predecessors not `Done`.
    pub(crate) unmet: u32,
    /// The worker of the latest attempt (a ghost id while reconciling after a restart).
    pub(crate) worker: Option<WorkerId>,
    /// The variant of the latest attempt.
    pub(crate) variant: Option<u16>,
    pub(crate) ext: Option<Box<TaskExt>>,
}

impl TaskRt {
    pub(crate) fn ext(&mut self) -> &mut TaskExt {
        self.ext.get_or_insert_with(Box::default)
    }
}

/// A job.
#[derive(Debug)]
pub(crate) struct Job {
    /// Whether some of its tasks may ask for no CPU (they can be placed on workers whose
    /// CPUs are all taken).
    pub(crate) cpuless: bool,
    /// Tasks whose longest attempt preempted with no checkpoint ran this many seconds: each
    /// needs more ([`super::coordinator::CUT_MARGIN`]).
    pub(crate) cut: HashMap<TaskId, f64>,
    pub(crate) id: JobId,
    pub(crate) name: String,
    pub(crate) dir: String,
    pub(crate) tenant: String,
    pub(crate) staging: Staging,
    pub(crate) graph: TaskGraph,
    pub(crate) tasks: Vec<TaskRt>,
    pub(crate) classes: Vec<Class>,
    /// Class indices by priority (higher first), then first id.
    pub(crate) class_order: Vec<usize>,
    pub(crate) counts: [u64; 8],
    pub(crate) state: JobState,
    pub(crate) submitted: Millis,
    pub(crate) finished: Option<Millis>,
    /// Time it spent ended before it was retried (`flotilla retry`): not part of its
    /// makespan.
    pub(crate) idle: Millis,
    /// Failed attempts that were retried.
    pub(crate) retries: u32,
    /// Wall seconds of every attempt that reported an end, per worker that ran it (failed,
    /// timed out, preempted and replicas too): the job's busy time per worker; and the same
    /// seconds times the CPUs each attempt held (its share of the worker's CPUs).
    pub(crate) busy: BTreeMap<WorkerId, (f64, f64)>,
    /// Transfer staging: outputs of `Done` tasks.
    pub(crate) outputs: HashMap<TaskId, Vec<ObjectRef>>,
    /// Transfer staging: workers (live or not) holding a task's outputs.
    pub(crate) holders: HashMap<TaskId, Vec<WorkerId>>,
    /// Transfer staging: the task declaring each output path (not patterns), so an input
    /// made by an ancestor that is not a direct predecessor is staged too.
    pub(crate) producers: HashMap<String, TaskId>,
    /// Attempts cancelled for a reason outside them (their gang broke: another member
    /// failed or was lost; or, in a pool, an input they read was found wrong): whatever
    /// they report, they go back to `Ready`, counting no failure.
    pub(crate) broken: HashSet<(TaskId, u32)>,
    /// CPUs and GPUs its assigned and running tasks are charged (its tenant's share).
    pub(crate) held: Held,
    /// Why its ready tasks wait although workers may have room (its tenant's quota).
    pub(crate) quota_wait: Option<String>,
    /// Its `[pool]` section and what it spent (`None`: the operator's own workers only).
    pub(crate) pool: Option<Box<super::coordinator::JobPool>>,
    /// Its attempts' spans for `flotilla trace` (the first [`MAX_SPANS`], seen live: a
    /// replayed journal has no start times).
    pub(crate) spans: Vec<Span>,
}

/// The most attempt spans a job keeps for its trace.
pub(crate) const MAX_SPANS: usize = 200_000;

/// One attempt on a worker's timeline.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    pub(crate) worker: WorkerId,
    pub(crate) worker_name: String,
    /// The first GPU it held, if any.
    pub(crate) gpu: Option<u32>,
    pub(crate) start: Millis,
    pub(crate) end: Millis,
    pub(crate) outcome: &'static str,
    /// A transfer span's bytes.
    pub(crate) bytes: u64,
}

/// What a job's tasks in flight are charged, for fair share and quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Held {
    pub(crate) cpus: f64,
    pub(crate) gpus: f64,
}

impl Held {
    pub(crate) fn add(&mut self, other: Held, sign: f64) {
        self.cpus = (self.cpus + sign * other.cpus).max(0.0);
        self.gpus = (self.gpus + sign * other.gpus).max(0.0);
    }
}

/// What the codelets (performance model kinds) of `tenant`'s jobs start with: nothing for
/// the admin's (`JOB/TASK`), `TENANT:` for a tenant's, so that no tenant's runtimes mix with
/// (or are read through) another's job of the same name.
pub(crate) fn codelet_prefix(tenant: &str) -> String {
    if tenant == crate::access::ADMIN_TENANT {
        String::new()
    } else {
        format!("{tenant}:")
    }
}

/// Whether a task in `s` holds resources on a worker (counts against its tenant).
fn in_flight(s: TaskState) -> bool {
    matches!(s, TaskState::Assigned | TaskState::Running)
}

impl Job {
    /// A job whose tasks are `Ready` (no predecessors) or `Waiting`; no notifications.
    pub(crate) fn new(
        id: JobId,
        name: String,
        dir: String,
        tenant: String,
        staging: Staging,
        graph: TaskGraph,
        now: Millis,
    ) -> Job {
        let n = graph.len();
        let mut classes: Vec<Class> = Vec::new();
        for t in graph.tasks() {
            let i = t.id.0;
            match classes.last_mut() {
                Some(c) if graph.task(TaskId::new(c.first)).base == t.base => c.end = i + 1,
                _ => classes.push(Class {
                    first: i,
                    end: i + 1,
                    priority: t.priority,
                    ready: BTreeSet::new(),
                    explore: 0,
                    codelet: format!("{}{name}/{}", codelet_prefix(&tenant), t.base),
                    shape: shape_of(t),
                }),
            }
        }
        let mut class_order: Vec<usize> = (0..classes.len()).collect();
        class_order.sort_by_key(|&c| (std::cmp::Reverse(classes[c].priority), classes[c].first));
        let mut counts = [0u64; 8];
        let mut tasks = Vec::with_capacity(n);
        for c in classes.iter_mut() {
            for i in c.first..c.end {
                let unmet = graph.preds(TaskId::new(i)).len() as u32;
                let state = if unmet == 0 {
                    c.ready.insert(i);
                    TaskState::Ready
                } else {
                    TaskState::Waiting
                };
                counts[state.index()] += 1;
                tasks.push(TaskRt {
                    state,
                    attempt: 0,
                    failures: 0,
                    unmet,
                    worker: None,
                    variant: None,
                    ext: None,
                });
            }
        }
        let producers = if staging == Staging::Transfer {
            graph
                .tasks()
                .iter()
                .flat_map(|t| {
                    t.outputs
                        .iter()
                        .filter(|o| !o.contains(['*', '?', '[']))
                        .map(|o| (o.clone(), t.id))
                })
                .collect()
        } else {
            HashMap::new()
        };
        let cpuless = graph.tasks().iter().any(|t| match &t.kind {
            TaskKind::Variants(vs) => vs.iter().any(|v| v.resources.cpus <= 0.0),
            _ => t.resources.cpus <= 0.0,
        });
        Job {
            cpuless,
            cut: HashMap::new(),
            id,
            name,
            dir,
            tenant,
            staging,
            graph,
            tasks,
            classes,
            class_order,
            counts,
            state: JobState::Running,
            submitted: now,
            finished: None,
            idle: 0,
            retries: 0,
            busy: BTreeMap::new(),
            outputs: HashMap::new(),
            holders: HashMap::new(),
            producers,
            broken: HashSet::new(),
            held: Held::default(),
            quota_wait: None,
            pool: None,
            spans: Vec::new(),
        }
    }

    /// What task `t` is charged with variant `v` (whole GPUs rounded up, as a ledger does).
    pub(crate) fn charge(&self, t: TaskId, v: Option<u16>) -> Held {
        // On every assignment and end: no allocation (a replay does this millions of times).
        let r = super::coordinator::resources_of(self, t, v);
        Held {
            cpus: r.cpus,
            gpus: flotilla_core::ledger::Ledger::charged_gpus(r.gpus),
        }
    }

    /// The most task `t` can be charged, whichever variant it gets (quotas are checked
    /// against it before placement, which picks the variant).
    pub(crate) fn max_charge(&self, t: TaskId) -> Held {
        let mut h = Held::default();
        for (_, r) in self.options(t) {
            h.cpus = h.cpus.max(r.cpus);
            h.gpus = h
                .gpus
                .max(flotilla_core::ledger::Ledger::charged_gpus(r.gpus));
        }
        h
    }

    /// Sets the variant of task `t`'s latest attempt, keeping `held` right.
    pub(crate) fn set_variant(&mut self, t: TaskId, v: Option<u16>) {
        let flying = in_flight(self.tasks[t.index()].state);
        if flying {
            let c = self.charge(t, self.tasks[t.index()].variant);
            self.held.add(c, -1.0);
        }
        self.tasks[t.index()].variant = v;
        if flying {
            let c = self.charge(t, v);
            self.held.add(c, 1.0);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(crate) fn is_active(&self) -> bool {
        self.state == JobState::Running
    }

    pub(crate) fn tref(&self, t: TaskId) -> TaskRef {
        TaskRef {
            job: self.id,
            task: t,
        }
    }

    /// The class of a task (binary search over the classes' first ids).
    pub(crate) fn class_of(&self, t: TaskId) -> usize {
        self.classes.partition_point(|c| c.first <= t.0) - 1
    }

    /// Keeps the checkpoint files a preempted attempt of `t` left (transfer staging; the
    /// worker ships only those that changed since they were staged) for its next attempt.
    /// A gang resumes together: every member's next attempt gets them too (rank 0 alone
    /// writes a data-parallel job's checkpoint; the others, stopped with it, would start
    /// from nothing). Each member's files at the same paths are replaced (these are newer),
    /// its others kept (its own shards, or files that did not change).
    pub(crate) fn keep_checkpoint(&mut self, t: TaskId, files: Vec<ObjectRef>) {
        if files.is_empty() {
            return;
        }
        let members = match self.graph.task(t).gang {
            Some(g) => g.first.0..g.first.0 + g.size,
            None => t.0..t.0 + 1,
        };
        for m in members {
            let Some(rt) = self.tasks.get_mut(m as usize) else {
                continue;
            };
            let theirs = &mut rt.ext().resume;
            theirs.retain(|o| !files.iter().any(|c| c.path == o.path));
            theirs.extend(files.iter().cloned());
        }
    }

    /// A task's placement options: `(variant name, resources)` per variant, or one unnamed
    /// entry for a plain task.
    pub(crate) fn options(&self, t: TaskId) -> Vec<(Option<&str>, &flotilla_core::Resources)> {
        let inst = self.graph.task(t);
        match &inst.kind {
            TaskKind::Variants(vs) => vs
                .iter()
                .map(|v| (Some(v.name.as_str()), &v.resources))
                .collect(),
            _ => vec![(None, &inst.resources)],
        }
    }

    /// The performance model's prediction for option `v` of `options` (a task of class
    /// codelet `codelet`) on hardware class `hw`.
    pub(crate) fn predict(
        model: &flotilla_sched::PerfModel,
        codelet: &str,
        options: &[(Option<&str>, &flotilla_core::Resources)],
        v: Option<usize>,
        hw: &str,
    ) -> flotilla_sched::Prediction {
        match v.and_then(|v| options.get(v)).and_then(|o| o.0) {
            Some(name) => model.predict(&format!("{codelet}/{name}"), hw, 0),
            None => model.predict(codelet, hw, 0),
        }
    }

    /// The variant names of a task, if it has variants.
    pub(crate) fn variant_name(&self, t: TaskId, v: Option<u16>) -> Option<String> {
        match (&self.graph.task(t).kind, v) {
            (TaskKind::Variants(vs), Some(v)) => vs.get(usize::from(v)).map(|x| x.name.clone()),
            _ => None,
        }
    }

    /// Moves a task to `new`, keeping counters and ready sets, and notifies.
    pub(crate) fn set_state(
        &mut self,
        t: TaskId,
        new: TaskState,
        message: Option<String>,
        out: &mut Vec<Command>,
    ) {
        let old = self.tasks[t.index()].state;
        if old == new && message.is_none() {
            return;
        }
        if old != new {
            let c = self.class_of(t);
            if old == TaskState::Ready {
                self.classes[c].ready.remove(&t.0);
            }
            if new == TaskState::Ready {
                self.classes[c].ready.insert(t.0);
            }
            self.counts[old.index()] -= 1;
            self.counts[new.index()] += 1;
            if in_flight(old) != in_flight(new) {
                let c = self.charge(t, self.tasks[t.index()].variant);
                self.held.add(c, if in_flight(new) { 1.0 } else { -1.0 });
                if self.counts[TaskState::Assigned.index()]
                    + self.counts[TaskState::Running.index()]
                    == 0
                {
                    self.held = Held::default(); // no rounding left over
                }
            }
        }
        let task = self.tref(t);
        let rt = &mut self.tasks[t.index()];
        rt.state = new;
        if let Some(m) = &message {
            rt.ext().message = Some(m.clone());
        }
        out.push(Command::Notify(Notification::TaskState {
            task,
            name: self.graph.task(t).name.clone(),
            state: new,
            attempt: rt.attempt,
            worker: rt.worker,
            message,
        }));
    }

    /// `Ready` when every predecessor is `Done`, `Waiting` otherwise.
    pub(crate) fn runnable(&mut self, t: TaskId, message: Option<String>, out: &mut Vec<Command>) {
        let s = if self.tasks[t.index()].unmet == 0 {
            TaskState::Ready
        } else {
            TaskState::Waiting
        };
        self.set_state(t, s, message, out);
    }

    /// Marks a task `Done`; successors with no unmet predecessor become `Ready`.
    pub(crate) fn mark_done(&mut self, t: TaskId, out: &mut Vec<Command>) {
        self.set_state(t, TaskState::Done, None, out);
        // What was said of an earlier attempt (a failure retried, a lost worker) no longer
        // holds: a done task's table row read "exit 1 (retry 1 of 3 …)". Its attempts count
        // and the job's retries keep the history.
        if let Some(ext) = &mut self.tasks[t.index()].ext {
            ext.message = None;
        }
        let n = self.graph.succs(t).len();
        for k in 0..n {
            let s = self.graph.succs(t)[k];
            let rt = &mut self.tasks[s.index()];
            rt.unmet = rt.unmet.saturating_sub(1);
            if rt.unmet == 0 && rt.state == TaskState::Waiting {
                self.set_state(s, TaskState::Ready, None, out);
            }
        }
    }

    /// Lineage: puts `Done` tasks back (each to `Ready` or `Waiting`); successors of each get
    /// one more unmet predecessor, and `Ready` ones go back to `Waiting`.
    pub(crate) fn undo_done(&mut self, set: &[TaskId], message: &str, out: &mut Vec<Command>) {
        let members: BTreeSet<TaskId> = set.iter().copied().collect();
        for &p in set {
            self.outputs.remove(&p);
            self.holders.remove(&p);
            let n = self.graph.succs(p).len();
            for k in 0..n {
                let s = self.graph.succs(p)[k];
                self.tasks[s.index()].unmet += 1;
                if self.tasks[s.index()].state == TaskState::Ready && !members.contains(&s) {
                    self.set_state(s, TaskState::Waiting, Some(message.to_string()), out);
                }
            }
        }
        for &p in set {
            self.runnable(p, Some(message.to_string()), out);
        }
    }

    /// Every task in a final state.
    #[cfg(test)]
    pub(crate) fn all_final(&self) -> bool {
        let f = self.counts[TaskState::Done.index()]
            + self.counts[TaskState::Failed.index()]
            + self.counts[TaskState::Cancelled.index()];
        f == self.len() as u64
    }
}
