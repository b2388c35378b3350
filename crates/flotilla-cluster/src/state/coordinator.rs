//! The [`Coordinator`]: applies events, runs timers, places ready tasks, steals work.
//!
//! Every `handle` call: validate the event (an invalid one returns `Err` and changes
//! nothing), apply it, fire due timers (backoffs, reconcile grace), place ready tasks
//! (oldest job first, within a job by priority then id), and let idle workers steal queued
//! tasks. Assignments are gathered per worker and emitted as one `Assign` per worker at the
//! end of the call, and recorded for the journal ([`Coordinator::take_journal_records`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use flotilla_core::{JobId, Staging, TaskId, TaskKind, WorkerId};
use flotilla_sched::{PerfModel, Prediction};

use super::job::Job;
use super::sched::{self, Decision, Problem};
use super::worker::Worker;
use super::{
    AssignedKind, Assignment, AttemptOutcome, AttemptResult, Command, Config, Event,
    GangAssignment, JobState, JournalRecord, Millis, Notification, ObjectRef, Placement, Result,
    StateError, TaskRef, TaskState,
};

/// A task journaled as assigned before a restart, to a worker that has not rejoined yet.
#[derive(Debug, Clone)]
struct Ghost {
    worker: WorkerId,
    attempt: u32,
    gpu_indices: Vec<u32>,
    hw_class: String,
}

/// What placing one ready task did.
enum Placed {
    /// Assigned.
    Yes,
    /// Not placed, but the class may go on (the task went back to `Waiting`).
    Deferred,
    /// The task fits nowhere now; neither will the rest of its class.
    Blocked,
}

/// The coordinator's state machine; see the [module docs](super).
#[derive(Debug)]
pub struct Coordinator {
    config: Config,
    now: Millis,
    jobs: BTreeMap<JobId, Job>,
    /// Jobs still running, oldest first.
    active: BTreeSet<JobId>,
    next_job: u64,
    workers: BTreeMap<WorkerId, Worker>,
    /// Ids that were live (or seen in the journal) and are gone: never reused.
    retired: BTreeSet<WorkerId>,
    next_worker: u32,
    model: PerfModel,
    /// (due, task, attempt) of tasks in `Backoff`.
    backoff: BinaryHeap<Reverse<(Millis, TaskRef, u32)>>,
    /// (due, task, attempt) of ghost assignments.
    grace: BinaryHeap<Reverse<(Millis, TaskRef, u32)>>,
    ghosts: BTreeMap<TaskRef, Ghost>,
    /// End of the reconcile grace after a restart.
    grace_until: Option<Millis>,
    journal: Vec<JournalRecord>,
    pending: BTreeMap<WorkerId, Vec<Assignment>>,
}

impl Coordinator {
    /// An empty coordinator.
    pub fn new(config: Config) -> Self {
        Coordinator {
            config,
            now: 0,
            jobs: BTreeMap::new(),
            active: BTreeSet::new(),
            next_job: 1,
            workers: BTreeMap::new(),
            retired: BTreeSet::new(),
            next_worker: 1,
            model: PerfModel::new(),
            backoff: BinaryHeap::new(),
            grace: BinaryHeap::new(),
            ghosts: BTreeMap::new(),
            grace_until: None,
            journal: Vec::new(),
            pending: BTreeMap::new(),
        }
    }

    /// The id the next submitted job should get (ids are never reused, even after a restart:
    /// replayed jobs raise it).
    pub fn next_job_id(&self) -> JobId {
        JobId::new(self.next_job)
    }

    /// Allocates an id for a joining worker (never reused: replayed ids raise it).
    pub fn next_worker_id(&mut self) -> WorkerId {
        let id = WorkerId::new(self.next_worker);
        self.next_worker += 1;
        id
    }

    /// The performance model learned from finished attempts.
    pub fn perf_model(&self) -> &PerfModel {
        &self.model
    }

    /// Replaces the performance model (e.g. one saved by an earlier run).
    pub fn set_perf_model(&mut self, model: PerfModel) {
        self.model = model;
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The records the server must append to the journal (durably) before it sends the
    /// `Assign` commands of the `handle` calls since the last take: one
    /// [`JournalRecord::TaskAssigned`] per assignment, in order.
    pub fn take_journal_records(&mut self) -> Vec<JournalRecord> {
        std::mem::take(&mut self.journal)
    }

    /// Applies one journal record after a restart (the same as `handle` with the event).
    pub fn replay(
        &mut self,
        now: Millis,
        record: JournalRecord,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        if let JournalRecord::TaskFinished { worker, .. } = &record {
            // Every worker named in the journal existed before the restart: its reports
            // are stale, never unknown, and its id is not reused.
            if !self.workers.contains_key(worker) {
                self.retired.insert(*worker);
                self.next_worker = self.next_worker.max(worker.0 + 1);
            }
        }
        self.handle(now, record.into(), out)
    }

    /// Call after replaying the journal: from now on, tasks that were assigned before the
    /// restart wait `reconcile_grace_ms` for their worker to rejoin and report them; then
    /// they are placed again.
    pub fn recovered(&mut self, now: Millis) {
        let now = now.max(self.now);
        self.now = now;
        let due = now.saturating_add(self.config.reconcile_grace_ms);
        for (t, g) in &self.ghosts {
            self.grace.push(Reverse((due, *t, g.attempt)));
        }
        self.grace_until = Some(due);
    }

    /// Applies one event at time `now`, appending what must be done to `out`. An invalid
    /// event (unknown job, task or worker, an id reused, a contradiction) returns `Err` and
    /// changes nothing; a stale or duplicate report returns `Ok` and has no effect on the
    /// task.
    pub fn handle(&mut self, now: Millis, event: Event, out: &mut Vec<Command>) -> Result<()> {
        let now = now.max(self.now);
        match event {
            Event::JobSubmitted {
                job,
                spec,
                dir,
                tenant,
            } => {
                if self.jobs.contains_key(&job) {
                    return Err(StateError::DuplicateJob(job));
                }
                let graph = spec
                    .expand()
                    .map_err(|source| StateError::BadJob { job, source })?;
                self.now = now;
                let j = Job::new(
                    job,
                    spec.name.clone(),
                    dir,
                    tenant,
                    spec.staging,
                    graph,
                    now,
                );
                self.next_job = self.next_job.max(job.0 + 1);
                self.jobs.insert(job, j);
                self.active.insert(job);
                self.check_job_end(job, out);
            }
            Event::JobCancelled { job } => {
                let j = self.jobs.get(&job).ok_or(StateError::UnknownJob(job))?;
                self.now = now;
                if j.is_active() {
                    self.end_job(job, JobState::Cancelled, out);
                }
            }
            Event::WorkerJoined {
                worker,
                spec,
                running,
                held,
            } => {
                if self.workers.contains_key(&worker) || self.retired.contains(&worker) {
                    return Err(StateError::DuplicateWorker(worker));
                }
                let w = Worker::new(worker, spec, now)
                    .map_err(|reason| StateError::BadWorker { worker, reason })?;
                self.now = now;
                self.worker_joined(w, running, held, out);
            }
            Event::WorkerReconciled { worker, previous } => {
                if !self.workers.contains_key(&worker) {
                    return Err(StateError::UnknownWorker(worker));
                }
                self.now = now;
                let prev = previous;
                if prev != worker {
                    let unreported: Vec<(TaskRef, u32)> = self
                        .ghosts
                        .iter()
                        .filter(|(_, g)| g.worker == prev)
                        .map(|(t, g)| (*t, g.attempt))
                        .collect();
                    for (t, attempt) in unreported {
                        self.release_ghost(
                            t,
                            attempt,
                            format!("{prev} came back as {worker} without it"),
                            out,
                        );
                    }
                }
            }
            Event::WorkerLost { worker, reason } => {
                if !self.workers.contains_key(&worker) {
                    return Err(StateError::UnknownWorker(worker));
                }
                self.now = now;
                self.worker_lost(worker, &reason, out);
            }
            Event::TaskStarted {
                worker,
                task,
                attempt,
            } => {
                self.check_task(task)?;
                if !self.workers.contains_key(&worker) {
                    return self.stale_or_unknown(worker);
                }
                self.task_started(worker, task, attempt, out)?;
                self.now = now;
            }
            Event::TaskFinished {
                worker,
                task,
                attempt,
                result,
            } => {
                self.check_task(task)?;
                let ghost = self.ghosts.get(&task).is_some_and(|g| g.attempt == attempt);
                if !ghost && !self.workers.contains_key(&worker) {
                    return self.stale_or_unknown(worker);
                }
                self.now = now;
                self.task_finished(worker, task, attempt, result, out);
            }
            Event::TaskReturned {
                worker,
                task,
                attempt,
            } => {
                self.check_task(task)?;
                if !self.workers.contains_key(&worker) {
                    return self.stale_or_unknown(worker);
                }
                self.task_returned(worker, task, attempt, out)?;
                self.now = now;
            }
            Event::TaskAssigned {
                worker,
                task,
                attempt,
                variant,
                gpu_indices,
                hw_class,
            } => {
                self.check_task(task)?;
                self.task_assigned(worker, task, attempt, variant, gpu_indices, hw_class, out)?;
                self.now = now;
            }
            Event::Tick => self.now = now,
        }
        self.run_timers(out);
        self.schedule(out);
        self.steal(out);
        for (worker, tasks) in std::mem::take(&mut self.pending) {
            out.push(Command::Assign { worker, tasks });
        }
        Ok(())
    }

    fn check_task(&self, t: TaskRef) -> Result<()> {
        let j = self.jobs.get(&t.job).ok_or(StateError::UnknownJob(t.job))?;
        if t.task.index() >= j.len() {
            return Err(StateError::UnknownTask(t));
        }
        Ok(())
    }

    /// A report from a worker that is not live: stale (ignored) if the id was known.
    fn stale_or_unknown(&self, worker: WorkerId) -> Result<()> {
        if self.retired.contains(&worker) {
            Ok(())
        } else {
            Err(StateError::UnknownWorker(worker))
        }
    }

    fn job(&mut self, id: JobId) -> &mut Job {
        self.jobs
            .get_mut(&id)
            .expect("callers checked the job exists")
    }

    // ---- jobs ----

    /// Ends a job that is complete (every task `Done`).
    fn check_job_end(&mut self, job: JobId, out: &mut Vec<Command>) {
        let j = &self.jobs[&job];
        if j.is_active() && j.counts[TaskState::Done.index()] == j.len() as u64 {
            self.end_job(job, JobState::Succeeded, out);
        }
    }

    /// Moves a job out of `Running`: tasks not on a worker are cancelled, tasks on a worker
    /// get a `Cancel`; notifies `JobFinished`.
    fn end_job(&mut self, job: JobId, state: JobState, out: &mut Vec<Command>) {
        let now = self.now;
        let j = self
            .jobs
            .get_mut(&job)
            .expect("callers checked the job exists");
        j.state = state;
        j.finished = Some(now);
        self.active.remove(&job);
        if state != JobState::Succeeded {
            let message = format!("job {}", state.as_str());
            for i in 0..j.len() {
                let t = TaskId::new(i as u32);
                let (st, attempt, owner) = {
                    let rt = &j.tasks[i];
                    (rt.state, rt.attempt, rt.worker)
                };
                match st {
                    TaskState::Waiting | TaskState::Ready | TaskState::Backoff => {
                        j.set_state(t, TaskState::Cancelled, Some(message.clone()), out);
                    }
                    TaskState::Assigned | TaskState::Running => {
                        let tref = j.tref(t);
                        let live = owner.and_then(|w| self.workers.get_mut(&w));
                        match live {
                            Some(w) => {
                                if let Some(slot) = w.slots.get_mut(&(tref, attempt)) {
                                    slot.cancel_sent = true;
                                }
                                out.push(Command::Cancel {
                                    worker: w.id,
                                    task: tref,
                                    attempt,
                                });
                            }
                            None => {
                                self.ghosts.remove(&tref);
                                j.set_state(t, TaskState::Cancelled, Some(message.clone()), out);
                            }
                        }
                    }
                    TaskState::Done | TaskState::Failed | TaskState::Cancelled => {}
                }
            }
        }
        out.push(Command::Notify(Notification::JobFinished { job, state }));
    }

    // ---- workers ----

    fn worker_joined(
        &mut self,
        mut w: Worker,
        running: Vec<(TaskRef, u32)>,
        held: Vec<(TaskRef, ObjectRef)>,
        out: &mut Vec<Command>,
    ) {
        let id = w.id;
        self.next_worker = self.next_worker.max(id.0 + 1);
        for (tref, attempt) in running {
            let adopted = self.adopt(&mut w, tref, attempt, out);
            if !adopted {
                out.push(Command::Cancel {
                    worker: id,
                    task: tref,
                    attempt,
                });
            }
        }
        for (tref, obj) in held {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            if j.staging != Staging::Transfer
                || tref.task.index() >= j.len()
                || j.tasks[tref.task.index()].state != TaskState::Done
            {
                continue;
            }
            let objs = j.outputs.entry(tref.task).or_default();
            if !objs.iter().any(|o| o.path == obj.path) {
                objs.push(obj);
            }
            let hs = j.holders.entry(tref.task).or_default();
            if !hs.contains(&id) {
                hs.push(id);
            }
            w.holds.insert(tref);
        }
        self.workers.insert(id, w);
    }

    /// A rejoining worker reports an attempt running: it becomes `Running` there if it is the
    /// current attempt, assigned to a worker that is gone, and fits.
    fn adopt(
        &mut self,
        w: &mut Worker,
        tref: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> bool {
        let Some(j) = self.jobs.get_mut(&tref.job) else {
            return false;
        };
        if tref.task.index() >= j.len() || !j.is_active() {
            return false;
        }
        let rt = &j.tasks[tref.task.index()];
        let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
            && rt.attempt == attempt
            && rt
                .worker
                .is_some_and(|o| o != w.id && !self.workers.contains_key(&o));
        if !current {
            return false;
        }
        let need = resources_of(j, tref.task, rt.variant).clone();
        let ghost = self.ghosts.get(&tref);
        let gpus = ghost
            .and_then(|g| w.gpu_positions(&g.gpu_indices, &need))
            .filter(|g| w.fits_free_on(&need, g))
            .or_else(|| w.fit_free(&need));
        let Some(gpus) = gpus else {
            // It does not fit (the worker shrank?): cancel there and place it again.
            self.ghosts.remove(&tref);
            j.tasks[tref.task.index()].worker = None;
            j.runnable(
                tref.task,
                Some(format!(
                    "{} reported it running but it does not fit there",
                    w.id
                )),
                out,
            );
            return false;
        };
        self.ghosts.remove(&tref);
        w.add((tref, attempt), &need, gpus, true);
        if let Some(s) = w.slots.get_mut(&(tref, attempt)) {
            s.started = true;
        }
        j.tasks[tref.task.index()].worker = Some(w.id);
        j.set_state(
            tref.task,
            TaskState::Running,
            Some(format!("reconciled: running on {}", w.id)),
            out,
        );
        true
    }

    fn worker_lost(&mut self, id: WorkerId, reason: &str, out: &mut Vec<Command>) {
        let w = self
            .workers
            .remove(&id)
            .expect("callers checked the worker");
        self.retired.insert(id);
        for ((_, _), slot) in &w.slots {
            if let Some(thief) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
                thief.incoming = thief.incoming.saturating_sub(1);
            }
        }
        for other in self.workers.values_mut() {
            for s in other.slots.values_mut() {
                if s.thief == Some(id) {
                    s.thief = None;
                }
            }
        }
        let message = format!("worker {id} lost: {reason}");
        let mut gang_hit: Vec<TaskRef> = Vec::new();
        for &(tref, attempt) in w.slots.keys() {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            let rt = &mut j.tasks[tref.task.index()];
            let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
                && rt.attempt == attempt
                && rt.worker == Some(id);
            if !current {
                continue;
            }
            rt.worker = None;
            if j.is_active() {
                j.runnable(tref.task, Some(message.clone()), out);
                if j.graph.task(tref.task).gang.is_some() {
                    gang_hit.push(tref);
                }
            } else {
                j.set_state(tref.task, TaskState::Cancelled, Some(message.clone()), out);
            }
        }
        for tref in gang_hit {
            self.break_gang(tref.job, tref.task, None, &message, out);
        }
        // Lineage: outputs that only this worker held.
        let mut lost: BTreeMap<JobId, Vec<TaskId>> = BTreeMap::new();
        for tref in &w.holds {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            if let Some(hs) = j.holders.get_mut(&tref.task) {
                hs.retain(|h| *h != id);
            }
            if j.is_active() && j.tasks[tref.task.index()].state == TaskState::Done {
                lost.entry(tref.job).or_default().push(tref.task);
            }
        }
        for (job, tasks) in lost {
            for t in tasks {
                if self.has_live_holder(job, t) || !self.outputs_needed(job, t) {
                    continue;
                }
                self.rerun(
                    job,
                    t,
                    &format!("its outputs were lost with worker {id}"),
                    out,
                );
            }
        }
    }

    fn has_live_holder(&self, job: JobId, t: TaskId) -> bool {
        self.jobs[&job]
            .holders
            .get(&t)
            .is_some_and(|hs| hs.iter().any(|h| self.workers.contains_key(h)))
    }

    fn has_ghost_holder(&self, job: JobId, t: TaskId) -> bool {
        self.jobs[&job]
            .holders
            .get(&t)
            .is_some_and(|hs| hs.iter().any(|h| !self.workers.contains_key(h)))
    }

    /// Whether a `Done` task's outputs matter: it has outputs, and a successor that has not
    /// staged them yet (not `Done`, not `Running`).
    fn outputs_needed(&self, job: JobId, t: TaskId) -> bool {
        let j = &self.jobs[&job];
        j.outputs.get(&t).is_some_and(|o| !o.is_empty())
            && j.graph.succs(t).iter().any(|s| {
                !matches!(
                    j.tasks[s.index()].state,
                    TaskState::Done | TaskState::Running | TaskState::Cancelled | TaskState::Failed
                )
            })
    }

    /// Lineage: reruns `Done` task `t` and, recursively, its `Done` predecessors whose outputs
    /// no live worker holds. Successors that were assigned but not started are taken back
    /// (their inputs named the lost worker).
    fn rerun(&mut self, job: JobId, t: TaskId, message: &str, out: &mut Vec<Command>) {
        let mut set: Vec<TaskId> = Vec::new();
        let mut seen: BTreeSet<TaskId> = BTreeSet::new();
        let mut stack = vec![t];
        while let Some(p) = stack.pop() {
            if !seen.insert(p) || self.jobs[&job].tasks[p.index()].state != TaskState::Done {
                continue;
            }
            set.push(p);
            let preds: Vec<TaskId> = self.jobs[&job].graph.preds(p).to_vec();
            for q in preds {
                let j = &self.jobs[&job];
                let has_outputs = j.outputs.get(&q).is_some_and(|o| !o.is_empty());
                if has_outputs && !self.has_live_holder(job, q) {
                    stack.push(q);
                }
            }
        }
        if set.is_empty() {
            return;
        }
        // Successors assigned but not started would fetch from the lost worker.
        let mut take_back: Vec<(TaskId, WorkerId, u32)> = Vec::new();
        {
            let j = &self.jobs[&job];
            for &p in &set {
                for &s in j.graph.succs(p) {
                    let rt = &j.tasks[s.index()];
                    if rt.state != TaskState::Assigned {
                        continue;
                    }
                    if let Some(w) = rt.worker.and_then(|w| self.workers.get(&w)) {
                        let started = w
                            .slots
                            .get(&(j.tref(s), rt.attempt))
                            .is_some_and(|sl| sl.started);
                        if !started {
                            take_back.push((s, w.id, rt.attempt));
                        }
                    }
                }
            }
        }
        take_back.sort();
        take_back.dedup();
        for (s, w, attempt) in take_back {
            let tref = TaskRef { job, task: s };
            if let Some(slot) = self
                .workers
                .get_mut(&w)
                .and_then(|w| w.slots.get_mut(&(tref, attempt)))
            {
                slot.cancel_sent = true;
            }
            out.push(Command::Cancel {
                worker: w,
                task: tref,
                attempt,
            });
            let j = self.job(job);
            j.tasks[s.index()].worker = None;
            j.runnable(s, Some(format!("taken back: {message}")), out);
        }
        let j = self.job(job);
        j.undo_done(&set, &format!("rerun: {message}"), out);
    }

    // ---- task reports ----

    fn task_started(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let w = self
            .workers
            .get_mut(&worker)
            .expect("callers checked the worker");
        let key = (task, attempt);
        let Some(slot) = w.slots.get_mut(&key) else {
            return Ok(()); // stale
        };
        // A chained task starts when its predecessor succeeded there, which the worker
        // reported first; clear the mark in case that report was stale here.
        slot.after = None;
        if !slot.reserved && !w.promote_one(key) {
            return Err(StateError::Conflict {
                task,
                attempt,
                worker,
                reason: "started a queued task beyond the worker's free resources".into(),
            });
        }
        let slot = w.slots.get_mut(&key).expect("present above");
        slot.started = true;
        let thief = slot.thief.take();
        if let Some(t) = thief.and_then(|t| self.workers.get_mut(&t)) {
            t.incoming = t.incoming.saturating_sub(1);
        }
        let j = self.job(task.job);
        let rt = &j.tasks[task.task.index()];
        if rt.state == TaskState::Assigned && rt.attempt == attempt && rt.worker == Some(worker) {
            j.set_state(task.task, TaskState::Running, None, out);
            let inst = j.graph.task(task.task);
            if inst.gang.is_none() && !matches!(inst.kind, TaskKind::Variants(_)) {
                self.chain_successors(task.job, task.task, attempt, worker, out);
            }
        }
        Ok(())
    }

    fn task_returned(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let w = self
            .workers
            .get_mut(&worker)
            .expect("callers checked the worker");
        let key = (task, attempt);
        let Some(slot) = w.slots.get(&key) else {
            return Ok(()); // stale
        };
        if slot.started {
            return Err(StateError::Conflict {
                task,
                attempt,
                worker,
                reason: "returned a task it had reported started".into(),
            });
        }
        let slot = w.remove(key).expect("present above");
        if let Some(t) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
            t.incoming = t.incoming.saturating_sub(1);
        }
        let j = self.job(task.job);
        let rt = &mut j.tasks[task.task.index()];
        if rt.state == TaskState::Assigned && rt.attempt == attempt && rt.worker == Some(worker) {
            rt.worker = None;
            if j.is_active() {
                j.runnable(task.task, Some(format!("returned by {worker}")), out);
            } else {
                j.set_state(task.task, TaskState::Cancelled, None, out);
            }
        }
        self.settle_chained((task, attempt), false, worker, out);
        Ok(())
    }

    fn task_finished(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        result: AttemptResult,
        out: &mut Vec<Command>,
    ) {
        let now = self.now;
        let ghost = match self.ghosts.get(&task) {
            Some(g) if g.attempt == attempt => self.ghosts.remove(&task),
            _ => None,
        };
        let mut hw_class = ghost.as_ref().map(|g| g.hw_class.clone());
        let owner = ghost.as_ref().map_or(worker, |g| g.worker);
        if let Some(w) = self.workers.get_mut(&worker) {
            if let Some(slot) = w.remove((task, attempt)) {
                if let Some(t) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
                    t.incoming = t.incoming.saturating_sub(1);
                }
            }
            let w = self.workers.get_mut(&worker).expect("present above");
            if result.usage.cpu_seconds.is_finite() && result.usage.cpu_seconds > 0.0 {
                w.busy_cpu_s += result.usage.cpu_seconds;
            }
            hw_class.get_or_insert_with(|| w.spec.hw_class.clone());
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let t = task.task;
        let rt = &j.tasks[t.index()];
        let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
            && rt.attempt == attempt
            && rt.worker == Some(owner);
        if !current {
            return; // stale or duplicate: no effect
        }
        // The worker that really ran it (a rejoined worker reporting a ghost's attempt).
        let ran_on = if self.workers.contains_key(&worker) {
            worker
        } else {
            owner
        };
        let succeeded = matches!(result.outcome, AttemptOutcome::Succeeded)
            && !j.broken.contains(&(t, attempt));
        self.settle_chained((task, attempt), succeeded, ran_on, out);
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let active = j.is_active();
        let gang = j.graph.task(t).gang;
        if gang.is_some() && j.broken.remove(&(t, attempt)) {
            // Its gang broke while it ran: whatever it says, it reruns with the gang.
            j.tasks[t.index()].worker = None;
            if active {
                j.runnable(
                    t,
                    Some(format!("attempt {attempt} stopped with its gang")),
                    out,
                );
            } else {
                j.set_state(t, TaskState::Cancelled, None, out);
            }
            return;
        }
        let mut broke: Option<(Option<u32>, String)> = None;
        match result.outcome {
            AttemptOutcome::Succeeded => {
                let variant = result
                    .variant
                    .as_deref()
                    .and_then(|v| variant_index(j, t, v))
                    .or(j.tasks[t.index()].variant);
                {
                    let rt = &mut j.tasks[t.index()];
                    rt.variant = variant;
                    rt.worker = Some(ran_on);
                    rt.ext().usage = Some(result.usage);
                }
                if let Some(hw) = &hw_class {
                    let c = j.class_of(t);
                    let codelet = match j.variant_name(t, variant) {
                        Some(v) => format!("{}/{v}", j.classes[c].codelet),
                        None => j.classes[c].codelet.clone(),
                    };
                    self.model
                        .record(&codelet, hw, 0, result.usage.wall_seconds);
                }
                if j.staging == Staging::Transfer {
                    j.outputs.insert(t, result.outputs);
                    j.holders.insert(t, vec![ran_on]);
                    // It fetched its predecessors' outputs: it holds them too.
                    let preds: Vec<TaskId> = j.graph.preds(t).to_vec();
                    let live = self.workers.get_mut(&ran_on);
                    let mut held = Vec::new();
                    for p in preds {
                        if j.outputs.get(&p).is_some_and(|o| !o.is_empty()) {
                            let hs = j.holders.entry(p).or_default();
                            if !hs.contains(&ran_on) {
                                hs.push(ran_on);
                            }
                            held.push(j.tref(p));
                        }
                    }
                    if let Some(w) = live {
                        w.holds.insert(task);
                        w.holds.extend(held);
                    }
                }
                j.mark_done(t, out);
                self.check_job_end(task.job, out);
            }
            AttemptOutcome::Failed { message, retryable } => {
                if !active {
                    j.set_state(t, TaskState::Cancelled, Some(message), out);
                    return;
                }
                let retries = j.graph.task(t).retries;
                let rt = &mut j.tasks[t.index()];
                rt.failures += 1;
                let failures = rt.failures;
                if retryable && failures <= retries {
                    j.retries += 1;
                    let shift = (failures - 1).min(40);
                    let delay = self
                        .config
                        .retry_backoff_ms
                        .saturating_mul(1u64 << shift)
                        .min(self.config.max_backoff_ms);
                    self.backoff
                        .push(Reverse((now.saturating_add(delay), task, attempt)));
                    j.set_state(
                        t,
                        TaskState::Backoff,
                        Some(format!(
                            "{message} (retry {failures} of {retries} in {delay} ms)"
                        )),
                        out,
                    );
                    if gang.is_some() {
                        broke = Some((Some(failures), message));
                    }
                } else {
                    let why = if retryable {
                        format!("{message} (no retries left)")
                    } else {
                        message
                    };
                    j.set_state(t, TaskState::Failed, Some(why), out);
                    self.end_job(task.job, JobState::Failed, out);
                }
            }
            AttemptOutcome::Cancelled => {
                let rt = &mut j.tasks[t.index()];
                rt.worker = None;
                if active {
                    j.runnable(
                        t,
                        Some(format!("attempt {attempt} cancelled on {worker}")),
                        out,
                    );
                    if gang.is_some() {
                        broke = Some((None, format!("a member was cancelled on {worker}")));
                    }
                } else {
                    j.set_state(t, TaskState::Cancelled, None, out);
                }
            }
        }
        if let Some((failures, message)) = broke {
            self.break_gang(task.job, t, failures, &message, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn task_assigned(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        variant: Option<String>,
        gpu_indices: Vec<u32>,
        hw_class: String,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let conflict = |reason: &str| StateError::Conflict {
            task,
            attempt,
            worker,
            reason: reason.into(),
        };
        if self.workers.contains_key(&worker) {
            return Err(conflict(
                "assignments are made by the coordinator; only a replay may apply one",
            ));
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let rt = &j.tasks[task.task.index()];
        let done_for_good = rt.state == TaskState::Done && !j.is_active();
        if done_for_good || matches!(rt.state, TaskState::Failed | TaskState::Cancelled) {
            return Err(conflict("the task is finished"));
        }
        if attempt <= rt.attempt {
            return Err(conflict("an attempt at least as new was seen already"));
        }
        if rt.worker.is_some_and(|w| self.workers.contains_key(&w)) {
            return Err(conflict("the task is on a live worker"));
        }
        let v = match &variant {
            Some(name) => Some(
                variant_index(j, task.task, name)
                    .ok_or_else(|| conflict(&format!("no variant named {name:?}")))?,
            ),
            None => None,
        };
        self.retired.insert(worker);
        self.next_worker = self.next_worker.max(worker.0 + 1);
        if j.tasks[task.task.index()].state == TaskState::Done {
            // Rerun from lineage before the restart (its outputs were lost).
            j.undo_done(&[task.task], "rerun: its outputs were lost", out);
        }
        let rt = &mut j.tasks[task.task.index()];
        rt.attempt = attempt;
        rt.worker = Some(worker);
        rt.variant = v;
        if j.is_active() {
            j.set_state(task.task, TaskState::Assigned, None, out);
            self.ghosts.insert(
                task,
                Ghost {
                    worker,
                    attempt,
                    gpu_indices,
                    hw_class,
                },
            );
            if self.grace_until.is_some() {
                let due = self.now.saturating_add(self.config.reconcile_grace_ms);
                self.grace.push(Reverse((due, task, attempt)));
            }
        } else {
            j.set_state(task.task, TaskState::Cancelled, None, out);
        }
        Ok(())
    }

    // ---- timers ----

    /// A task journaled as assigned to a worker that is gone, and not reported by anyone:
    /// it is placed again.
    fn release_ghost(&mut self, tref: TaskRef, attempt: u32, msg: String, out: &mut Vec<Command>) {
        if self.ghosts.get(&tref).is_none_or(|g| g.attempt != attempt) {
            return;
        }
        self.ghosts.remove(&tref);
        let j = self.job(tref.job);
        let rt = &mut j.tasks[tref.task.index()];
        if rt.attempt == attempt && matches!(rt.state, TaskState::Assigned | TaskState::Running) {
            rt.worker = None;
            if j.is_active() {
                j.runnable(tref.task, Some(msg), out);
            } else {
                j.set_state(tref.task, TaskState::Cancelled, Some(msg), out);
            }
        }
    }

    fn run_timers(&mut self, out: &mut Vec<Command>) {
        let now = self.now;
        while let Some(&Reverse((due, tref, attempt))) = self.backoff.peek() {
            if due > now {
                break;
            }
            self.backoff.pop();
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            let rt = &j.tasks[tref.task.index()];
            if rt.state == TaskState::Backoff && rt.attempt == attempt {
                j.runnable(tref.task, None, out);
            }
        }
        while let Some(&Reverse((due, tref, attempt))) = self.grace.peek() {
            if due > now {
                break;
            }
            self.grace.pop();
            let Some(g) = self.ghosts.get(&tref) else {
                continue;
            };
            if g.attempt != attempt {
                continue;
            }
            let msg = format!("worker {} did not come back after the restart", g.worker);
            self.release_ghost(tref, attempt, msg, out);
        }
        if self.grace_until.is_some_and(|g| g <= now) {
            self.grace_until = None;
        }
    }

    fn in_grace(&self) -> bool {
        self.grace_until.is_some_and(|g| self.now < g)
    }

    // ---- placement ----

    fn schedule(&mut self, out: &mut Vec<Command>) {
        if self.workers.is_empty() {
            return;
        }
        let jobs: Vec<JobId> = self.active.iter().copied().collect();
        for job in jobs {
            if self.jobs[&job].counts[TaskState::Ready.index()] == 0 {
                continue;
            }
            let order = self.jobs[&job].class_order.clone();
            for c in order {
                let first = TaskId::new(self.jobs[&job].classes[c].first);
                if self.jobs[&job].graph.task(first).gang.is_some() {
                    self.schedule_gangs(job, c, out);
                    continue;
                }
                while let Some(&t) = self.jobs[&job].classes[c].ready.first() {
                    match self.place_one(job, TaskId::new(t), out) {
                        Placed::Yes | Placed::Deferred => {}
                        Placed::Blocked => break,
                    }
                }
            }
        }
    }

    /// Transfer staging: where a task's inputs are (bytes per worker) and what to fetch from
    /// whom. `Err` when it cannot be placed now: holders are ghosts still in their grace
    /// (`Blocked`), or lost (their producers are rerun, `Deferred`).
    #[allow(clippy::type_complexity)]
    fn stage(
        &mut self,
        job: JobId,
        t: TaskId,
        out: &mut Vec<Command>,
    ) -> std::result::Result<(HashMap<WorkerId, u64>, Vec<(ObjectRef, String)>), Placed> {
        let staging = self.jobs[&job].staging;
        let mut local_bytes: HashMap<WorkerId, u64> = HashMap::new();
        let mut inputs: Vec<(ObjectRef, String)> = Vec::new();
        if staging == Staging::Transfer {
            let j = &self.jobs[&job];
            let mut lost = Vec::new();
            let mut waiting_for_ghosts = false;
            for &p in j.graph.preds(t) {
                let Some(objs) = j.outputs.get(&p).filter(|o| !o.is_empty()) else {
                    continue;
                };
                let live: Vec<WorkerId> = j
                    .holders
                    .get(&p)
                    .map(|hs| {
                        hs.iter()
                            .copied()
                            .filter(|h| self.workers.contains_key(h))
                            .collect()
                    })
                    .unwrap_or_default();
                match live.first() {
                    Some(first) => {
                        let addr = self.workers[first].spec.data_addr.clone();
                        for o in objs {
                            inputs.push((o.clone(), addr.clone()));
                        }
                        let bytes: u64 = objs.iter().map(|o| o.size).sum();
                        for h in live {
                            *local_bytes.entry(h).or_default() += bytes;
                        }
                    }
                    None if self.in_grace() && self.has_ghost_holder(job, p) => {
                        waiting_for_ghosts = true;
                    }
                    None => lost.push(p),
                }
            }
            if waiting_for_ghosts {
                return Err(Placed::Blocked);
            }
            if !lost.is_empty() {
                for p in lost {
                    self.rerun(job, p, "its outputs are held by no live worker", out);
                }
                return Err(Placed::Deferred);
            }
        }
        Ok((local_bytes, inputs))
    }

    fn place_one(&mut self, job: JobId, t: TaskId, out: &mut Vec<Command>) -> Placed {
        let (local_bytes, inputs) = match self.stage(job, t, out) {
            Ok(x) => x,
            Err(p) => return p,
        };
        let j = &self.jobs[&job];
        let c = j.class_of(t);
        let inst = j.graph.task(t);
        let options: Vec<(Option<&str>, &flotilla_core::Resources)> = match &inst.kind {
            TaskKind::Variants(vs) => vs
                .iter()
                .map(|v| (Some(v.name.as_str()), &v.resources))
                .collect(),
            _ => vec![(None, &inst.resources)],
        };
        let codelet = &j.classes[c].codelet;
        let model = &self.model;
        let predict = |v: Option<usize>, hw: &str| -> Prediction {
            match v.and_then(|v| options.get(v)).and_then(|o| o.0) {
                Some(name) => model.predict(&format!("{codelet}/{name}"), hw, 0),
                None => model.predict(codelet, hw, 0),
            }
        };
        let problem = Problem {
            options: options.clone(),
            local_bytes: &local_bytes,
            queue_depth: self.config.queue_depth,
            explore: j.classes[c].explore,
        };
        let Some(d) = sched::place(&problem, &self.workers, &predict) else {
            return Placed::Blocked;
        };
        self.assign(job, t, d, inputs, out);
        Placed::Yes
    }

    fn assign(
        &mut self,
        job: JobId,
        t: TaskId,
        d: Decision,
        inputs: Vec<(ObjectRef, String)>,
        out: &mut Vec<Command>,
    ) {
        let worker = d.worker;
        let chain = d.variant.is_none() && self.jobs[&job].graph.task(t).gang.is_none();
        self.assign_member(job, t, d, inputs, None, None, out);
        if chain {
            let attempt = self.jobs[&job].tasks[t.index()].attempt;
            self.chain_successors(job, t, attempt, worker, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn assign_member(
        &mut self,
        job: JobId,
        t: TaskId,
        d: Decision,
        inputs: Vec<(ObjectRef, String)>,
        gang: Option<GangAssignment>,
        after: Option<(TaskRef, u32)>,
        out: &mut Vec<Command>,
    ) {
        let j = self
            .jobs
            .get_mut(&job)
            .expect("placing a task of a known job");
        let w = self
            .workers
            .get_mut(&d.worker)
            .expect("placed on a live worker");
        let c = j.class_of(t);
        if d.explored {
            j.classes[c].explore = j.classes[c].explore.wrapping_add(1);
        }
        let variant = d.variant.map(|v| v as u16);
        let need = resources_of(j, t, variant).clone();
        let tref = j.tref(t);
        let rt = &mut j.tasks[t.index()];
        rt.attempt += 1;
        rt.worker = Some(w.id);
        rt.variant = variant;
        let attempt = rt.attempt;
        if d.reason.policy != "eager" {
            rt.ext().reason = Some(d.reason.clone());
        } else if let Some(e) = rt.ext.as_mut() {
            e.reason = None;
        }
        let gpu_indices = w.gpu_indices(&d.gpus);
        match after {
            Some(pred) => w.add_chained((tref, attempt), &need, pred),
            None => w.add((tref, attempt), &need, d.gpus, d.reserved),
        }
        let mut resources = Worker::charge(&need);
        if need.gpus >= 1.0 {
            resources.gpu_mem = need.gpu_mem;
        }
        let inst = j.graph.task(t);
        let env = |e: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            e.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let kind = match (&inst.kind, d.variant) {
            (TaskKind::Command { cmd, env: e, cwd }, _) => AssignedKind::Command {
                cmd: cmd.clone(),
                env: env(e),
                cwd: cwd.clone(),
            },
            (TaskKind::Variants(vs), Some(v)) => AssignedKind::Command {
                cmd: vs[v].cmd.clone(),
                env: env(&vs[v].env),
                cwd: vs[v].cwd.clone(),
            },
            (TaskKind::Variants(vs), None) => AssignedKind::Command {
                cmd: vs[0].cmd.clone(),
                env: env(&vs[0].env),
                cwd: vs[0].cwd.clone(),
            },
            (TaskKind::Wasm(m), _) => AssignedKind::Wasm {
                module: m.module.clone(),
                entry: m.entry.clone(),
                args: m.args.clone(),
                env: env(&m.env),
                fuel: m.fuel,
                memory: m.memory,
            },
        };
        let variant_name = j.variant_name(t, variant);
        let a = Assignment {
            task: tref,
            attempt,
            name: inst.name.clone(),
            job_name: j.name.clone(),
            job_dir: j.dir.clone(),
            staging: j.staging,
            kind,
            variant: variant_name.clone(),
            resources,
            gpu_indices: gpu_indices.clone(),
            timeout_ms: inst
                .timeout
                .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
            index: inst.index,
            inputs,
            outputs: inst.outputs.clone(),
            reason: d.reason,
            gang,
            after,
        };
        self.journal.push(JournalRecord::TaskAssigned {
            worker: w.id,
            task: tref,
            attempt,
            variant: variant_name,
            gpu_indices,
            hw_class: w.spec.hw_class.clone(),
        });
        self.pending.entry(w.id).or_default().push(a);
        j.set_state(t, TaskState::Assigned, None, out);
    }

    // ---- chained dispatch ----

    /// Chains the successors of `t` (attempt `attempt`, placed on `worker`) whose only
    /// unfinished predecessor it is: they are assigned to the same worker now, to start there
    /// the moment `t` succeeds, with no round trip to the coordinator (a chain of dependent
    /// tasks then costs a local hand-off per hop). Only plain tasks (no variants, no gang, no
    /// GPUs) in shared staging, at most `chain_depth` waiting per worker; chains recursively.
    fn chain_successors(
        &mut self,
        job: JobId,
        t: TaskId,
        attempt: u32,
        worker: WorkerId,
        out: &mut Vec<Command>,
    ) {
        let depth = self.config.chain_depth;
        if depth == 0 || self.jobs[&job].staging != Staging::Shared || !self.jobs[&job].is_active()
        {
            return;
        }
        let pred = (self.jobs[&job].tref(t), attempt);
        let succs: Vec<TaskId> = self.jobs[&job].graph.succs(t).to_vec();
        for s in succs {
            let Some(w) = self.workers.get(&worker) else {
                return;
            };
            if w.chained() >= depth {
                return;
            }
            let j = &self.jobs[&job];
            let rt = &j.tasks[s.index()];
            let inst = j.graph.task(s);
            let plain = matches!(inst.kind, TaskKind::Command { .. } | TaskKind::Wasm(_))
                && inst.gang.is_none()
                && inst.resources.gpus <= 0.0
                && inst.resources.gpu_mem == 0;
            if rt.state == TaskState::Assigned && rt.worker == Some(worker) {
                // Chained here already: extend the chain below it.
                let key = (j.tref(s), rt.attempt);
                if w.slots.get(&key).is_some_and(|sl| sl.after == Some(pred)) {
                    self.chain_successors(job, s, key.1, worker, out);
                }
                continue;
            }
            if rt.state != TaskState::Waiting || rt.unmet != 1 || !plain {
                continue;
            }
            if !w.fits_total(&inst.resources) {
                continue;
            }
            let d = Decision {
                worker,
                variant: None,
                gpus: Vec::new(),
                reserved: false,
                explored: false,
                reason: Placement {
                    policy: "chain".into(),
                    predicted_s: None,
                    alternatives: Vec::new(),
                    why: format!(
                        "{worker}: starts there as soon as {} (its last unfinished predecessor) succeeds there",
                        j.graph.task(t).name
                    ),
                },
            };
            self.assign_member(job, s, d, Vec::new(), None, Some(pred), out);
            let a = self.jobs[&job].tasks[s.index()].attempt;
            self.chain_successors(job, s, a, worker, out);
        }
    }

    /// `pred` ended (`succeeded` on `ran_on`, or not): its chained successors on `ran_on`
    /// may start; every other one (elsewhere, or after a failure) is retracted and placed
    /// again once it is `Ready`.
    fn settle_chained(
        &mut self,
        pred: (TaskRef, u32),
        succeeded: bool,
        ran_on: WorkerId,
        out: &mut Vec<Command>,
    ) {
        let job = pred.0.job;
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let mut holders: Vec<WorkerId> = Vec::new();
        for &s in j.graph.succs(pred.0.task) {
            let rt = &j.tasks[s.index()];
            if rt.state == TaskState::Assigned {
                if let Some(w) = rt.worker {
                    if !holders.contains(&w) {
                        holders.push(w);
                    }
                }
            }
        }
        for wid in holders {
            let Some(w) = self.workers.get_mut(&wid) else {
                continue;
            };
            if succeeded && wid == ran_on {
                w.release_chained(pred);
                continue;
            }
            for key in w.chained_on(pred) {
                if let Some(slot) = w.slots.get_mut(&key) {
                    if slot.cancel_sent {
                        continue;
                    }
                    slot.cancel_sent = true;
                }
                out.push(Command::Retract {
                    worker: wid,
                    task: key.0,
                    attempt: key.1,
                });
            }
        }
    }

    // ---- gangs ----

    /// Places the gangs of a class whose members are all `Ready`, oldest gang first; stops
    /// at the first gang that does not fit (later ones would not either).
    fn schedule_gangs(&mut self, job: JobId, c: usize, out: &mut Vec<Command>) {
        let mut leaders: Vec<TaskId> = Vec::new();
        {
            let j = &self.jobs[&job];
            for &t in &j.classes[c].ready {
                if let Some(g) = j.graph.task(TaskId::new(t)).gang {
                    if leaders.last() != Some(&g.first) {
                        leaders.push(g.first);
                    }
                }
            }
        }
        for leader in leaders {
            match self.place_gang(job, leader, out) {
                Placed::Yes | Placed::Deferred => {}
                Placed::Blocked => break,
            }
        }
    }

    /// The members of the gang led by `leader`.
    fn gang_members(&self, job: JobId, leader: TaskId) -> std::ops::Range<u32> {
        let size = self.jobs[&job]
            .graph
            .task(leader)
            .gang
            .map_or(1, |g| g.size);
        leader.0..leader.0 + size
    }

    /// All or nothing: every member of the gang gets a reserved slot (never a queued one, so
    /// all start at once) in the same call, or none is placed.
    fn place_gang(&mut self, job: JobId, leader: TaskId, out: &mut Vec<Command>) -> Placed {
        let members = self.gang_members(job, leader);
        {
            let j = &self.jobs[&job];
            let mut done = Vec::new();
            for m in members.clone() {
                match j.tasks[m as usize].state {
                    TaskState::Ready => {}
                    TaskState::Done => done.push(TaskId::new(m)),
                    // Not all back yet (a member in backoff, or still reporting).
                    _ => return Placed::Deferred,
                }
            }
            if !done.is_empty() {
                // A member finished before the gang broke: the gang reruns as a whole.
                let j = self.job(job);
                j.undo_done(&done, "rerun with its gang", out);
                if done
                    .iter()
                    .any(|&m| j.tasks[m.index()].state != TaskState::Ready)
                {
                    return Placed::Deferred;
                }
            }
        }
        let mut staged = Vec::with_capacity(members.len());
        for m in members.clone() {
            match self.stage(job, TaskId::new(m), out) {
                Ok(x) => staged.push(x),
                Err(p) => return p,
            }
        }
        // Trial reservations, member by member, undone before the real assignments.
        let mut decisions: Vec<Decision> = Vec::with_capacity(members.len());
        let mut trial: Vec<(WorkerId, TaskRef)> = Vec::new();
        let mut leader_variant: Option<usize> = None;
        let mut fits = true;
        for (k, m) in members.clone().enumerate() {
            let t = TaskId::new(m);
            let j = &self.jobs[&job];
            let c = j.class_of(t);
            let inst = j.graph.task(t);
            let all: Vec<(Option<&str>, &flotilla_core::Resources)> = match &inst.kind {
                TaskKind::Variants(vs) => vs
                    .iter()
                    .map(|v| (Some(v.name.as_str()), &v.resources))
                    .collect(),
                _ => vec![(None, &inst.resources)],
            };
            // Every member runs the variant rank 0 got.
            let offset = leader_variant.unwrap_or(0);
            let options = match leader_variant {
                Some(v) => vec![all[v]],
                None => all.clone(),
            };
            let codelet = &j.classes[c].codelet;
            let model = &self.model;
            let predict = |v: Option<usize>, hw: &str| -> Prediction {
                match v
                    .map(|v| v + offset)
                    .and_then(|v| all.get(v))
                    .and_then(|o| o.0)
                {
                    Some(name) => model.predict(&format!("{codelet}/{name}"), hw, 0),
                    None => model.predict(codelet, hw, 0),
                }
            };
            let problem = Problem {
                options,
                local_bytes: &staged[k].0,
                queue_depth: 0,
                explore: j.classes[c].explore,
            };
            let Some(mut d) = sched::place(&problem, &self.workers, &predict) else {
                fits = false;
                break;
            };
            if leader_variant.is_some() {
                d.variant = d.variant.map(|v| v + offset);
                d.explored = false;
            } else {
                leader_variant = d.variant;
            }
            let need = resources_of(j, t, d.variant.map(|v| v as u16)).clone();
            let tref = j.tref(t);
            let w = self
                .workers
                .get_mut(&d.worker)
                .expect("placed on a live worker");
            w.add((tref, u32::MAX), &need, d.gpus.clone(), true);
            trial.push((d.worker, tref));
            d.reason.why = format!(
                "{} (gang of {}: every member placed at once)",
                d.reason.why,
                members.len()
            );
            decisions.push(d);
        }
        for (w, tref) in trial {
            if let Some(w) = self.workers.get_mut(&w) {
                w.remove_trial((tref, u32::MAX));
            }
        }
        if !fits {
            return Placed::Blocked;
        }
        let size = members.len() as u32;
        let attempt = self.jobs[&job].tasks[leader.index()].attempt + 1;
        let key = format!("{}-{}-{attempt}", job, leader);
        for ((m, d), (_, inputs)) in members.zip(decisions).zip(staged) {
            let gang = GangAssignment {
                rank: m - leader.0,
                size,
                key: key.clone(),
            };
            self.assign_member(job, TaskId::new(m), d, inputs, Some(gang), None, out);
        }
        Placed::Yes
    }

    /// A member of a gang failed, was cancelled or lost its worker (its own state is already
    /// dealt with): the other members' current attempts are cancelled and remembered as
    /// broken, so their reports (probably failures: their peer is gone) count nothing; members
    /// not on a live worker go back to `Ready`/`Waiting` at once. With `failures`, every
    /// member's failure count becomes that (the gang's retries are counted once per restart).
    fn break_gang(
        &mut self,
        job: JobId,
        t: TaskId,
        failures: Option<u32>,
        message: &str,
        out: &mut Vec<Command>,
    ) {
        let Some(g) = self.jobs[&job].graph.task(t).gang else {
            return;
        };
        let active = self.jobs[&job].is_active();
        for m in self.gang_members(job, g.first) {
            let m = TaskId::new(m);
            if m == t {
                continue;
            }
            let (state, attempt, owner) = {
                let rt = &mut self.job(job).tasks[m.index()];
                if let Some(f) = failures {
                    rt.failures = rt.failures.max(f);
                }
                (rt.state, rt.attempt, rt.worker)
            };
            if !active || !matches!(state, TaskState::Assigned | TaskState::Running) {
                continue;
            }
            let tref = TaskRef { job, task: m };
            match owner.and_then(|w| self.workers.get_mut(&w)) {
                Some(w) => {
                    if let Some(slot) = w.slots.get_mut(&(tref, attempt)) {
                        slot.cancel_sent = true;
                    }
                    let wid = w.id;
                    out.push(Command::Cancel {
                        worker: wid,
                        task: tref,
                        attempt,
                    });
                    self.job(job).broken.insert((m, attempt));
                }
                None => {
                    self.ghosts.remove(&tref);
                    let j = self.job(job);
                    j.tasks[m.index()].worker = None;
                    j.runnable(m, Some(format!("gang restarts: {message}")), out);
                }
            }
        }
    }

    // ---- work stealing ----

    /// An idle worker (nothing assigned or running, no retraction pending for it) takes
    /// half (rounded up) of the stealable queued tasks of the worker with the longest queue:
    /// `Retract` is sent; the tasks come back `Ready` on `TaskReturned` and are placed again,
    /// on the idle worker if it fits there first.
    fn steal(&mut self, out: &mut Vec<Command>) {
        if self.config.queue_depth == 0 || self.workers.len() < 2 {
            return;
        }
        let idle: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| w.is_idle() && w.incoming == 0)
            .map(|w| w.id)
            .collect();
        for thief in idle {
            let thief_worker = &self.workers[&thief];
            // Victim: the longest queue of tasks that fit the thief.
            let mut best: Option<(WorkerId, Vec<(TaskRef, u32)>)> = None;
            for v in self.workers.values() {
                if v.id == thief || v.queue.is_empty() {
                    continue;
                }
                let stealable: Vec<(TaskRef, u32)> = v
                    .queue
                    .values()
                    .filter(|k| {
                        v.slots.get(k).is_some_and(|s| {
                            s.thief.is_none()
                                && !s.cancel_sent
                                && !s.started
                                && thief_worker.fits_total(&s.res)
                        })
                    })
                    .copied()
                    .collect();
                if !stealable.is_empty()
                    && best.as_ref().is_none_or(|b| stealable.len() > b.1.len())
                {
                    best = Some((v.id, stealable));
                }
            }
            let Some((victim, stealable)) = best else {
                continue;
            };
            let take = stealable.len().div_ceil(2);
            let v = self.workers.get_mut(&victim).expect("found above");
            // Newest first: the worker reaches them last.
            let chosen: Vec<(TaskRef, u32)> = stealable.iter().rev().take(take).copied().collect();
            for key in &chosen {
                if let Some(s) = v.slots.get_mut(key) {
                    s.thief = Some(thief);
                }
                out.push(Command::Retract {
                    worker: victim,
                    task: key.0,
                    attempt: key.1,
                });
            }
            let t = self.workers.get_mut(&thief).expect("idle worker");
            t.incoming += chosen.len() as u32;
        }
    }

    // ---- views for status ----

    pub(crate) fn jobs_map(&self) -> &BTreeMap<JobId, Job> {
        &self.jobs
    }

    pub(crate) fn workers_map(&self) -> &BTreeMap<WorkerId, Worker> {
        &self.workers
    }

    pub(crate) fn now(&self) -> Millis {
        self.now
    }

    /// Adds a worker from its spec with the next id (tests).
    #[cfg(test)]
    pub(crate) fn join(&mut self, spec: super::WorkerSpec, out: &mut Vec<Command>) -> WorkerId {
        let id = self.next_worker_id();
        let now = self.now;
        self.handle(
            now,
            Event::WorkerJoined {
                worker: id,
                spec,
                running: Vec::new(),
                held: Vec::new(),
            },
            out,
        )
        .expect("a valid worker");
        id
    }

    /// The placement reason kept for a task (tests and status).
    pub(crate) fn reason_of(&self, job: &Job, t: TaskId) -> Option<Placement> {
        let rt = &job.tasks[t.index()];
        if let Some(r) = rt.ext.as_ref().and_then(|e| e.reason.clone()) {
            return Some(r);
        }
        rt.worker.filter(|_| rt.attempt > 0).map(|w| Placement {
            policy: "eager".into(),
            predicted_s: None,
            alternatives: Vec::new(),
            why: format!("eager: placed on {w}, the fitting worker with the most free cpus"),
        })
    }
}

/// The resources of a task's chosen variant (or its own).
pub(crate) fn resources_of(j: &Job, t: TaskId, variant: Option<u16>) -> &flotilla_core::Resources {
    let inst = j.graph.task(t);
    match (&inst.kind, variant) {
        (TaskKind::Variants(vs), Some(v)) => vs
            .get(usize::from(v))
            .map_or(&inst.resources, |x| &x.resources),
        _ => &inst.resources,
    }
}

fn variant_index(j: &Job, t: TaskId, name: &str) -> Option<u16> {
    match &j.graph.task(t).kind {
        TaskKind::Variants(vs) => vs.iter().position(|v| v.name == name).map(|i| i as u16),
        _ => None,
    }
}
