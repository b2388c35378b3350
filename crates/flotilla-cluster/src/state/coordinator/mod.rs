//! The [`Coordinator`]: applies events, runs timers, places ready tasks, steals work.
//!
//! Every `handle` call: validate the event (an invalid one returns `Err` and changes
//! nothing), apply it, fire due timers (backoffs, reconcile grace), place ready tasks
//! (oldest job first, within a job by priority then id), and let idle workers steal queued
//! tasks. Assignments are gathered per worker and emitted as one `Assign` per worker at the
//! end of the call, and recorded for the journal ([`Coordinator::take_journal_records`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use flotilla_core::{JobId, Staging, TaskGraph, TaskId, TaskKind, WorkerId};
use flotilla_sched::PerfModel;

use super::job::{Held, Job};
use super::worker::Worker;
use super::workers::Workers;
use super::{
    AssignedKind, Assignment, AttemptOutcome, AttemptResult, Command, Config, Event,
    GangAssignment, JobState, JournalRecord, Millis, Notification, ObjectRef, Placement, Quota,
    Result, StateError, TaskRef, TaskState,
};
use flotilla_sched::cluster::{self as sched, Decision, Problem};

mod chain;
mod demand;
mod gangs;
mod membership;
mod placement;
mod pool;
mod reports;

pub use demand::{WorkLeft, WorkerShape};
pub(crate) use pool::JobPool;
pub use pool::VerdictRecord;
mod timers;

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
    /// As `Blocked`, for want of room on every worker: no task of the same resource options
    /// fits in the rest of this pass either.
    NoRoom,
}

/// How many names of workers that left the coordinator remembers.
const LEFT_NAMES: usize = 10_000;

/// The coordinator's state machine; see the [module docs](super).
#[derive(Debug)]
pub struct Coordinator {
    config: Config,
    now: Millis,
    /// Said after "no worker is connected" (the server's allocator: a paused queue, where
    /// the workers would come from); not journaled.
    capacity_note: Option<String>,
    jobs: BTreeMap<JobId, Job>,
    /// Jobs still running, oldest first.
    active: BTreeSet<JobId>,
    /// The active jobs with tasks that may ask for no CPU ([`Job::cpuless`]).
    cpuless: BTreeSet<JobId>,
    /// The active jobs with `Ready` tasks, kept from the state changes each event notifies
    /// ([`Coordinator::note_ready`]), and how many of them each tenant has: a pass with one
    /// tenant placing and no quotas walks these, not every active job.
    ready_jobs: BTreeSet<JobId>,
    ready_tenants: BTreeMap<String, usize>,
    next_job: u64,
    /// Live workers, indexed by free capacity ([`Workers`]).
    workers: Workers,
    /// Ids that were live (or seen in the journal) and are gone: never reused.
    retired: BTreeSet<WorkerId>,
    /// The names of the workers that left, for the status of the tasks they ran (the most
    /// recent [`LEFT_NAMES`]).
    left_names: BTreeMap<WorkerId, String>,
    next_worker: u32,
    model: PerfModel,
    /// The credits: tenants' balances, holds, providers' earnings (`flotilla ledger`).
    ledger: flotilla_pool::Ledger,
    /// (due, task, attempt) of tasks in `Backoff`.
    backoff: BinaryHeap<Reverse<(Millis, TaskRef, u32)>>,
    /// (due, task, attempt) of ghost assignments.
    grace: BinaryHeap<Reverse<(Millis, TaskRef, u32)>>,
    ghosts: BTreeMap<TaskRef, Ghost>,
    /// End of the reconcile grace after a restart.
    grace_until: Option<Millis>,
    /// When the journal's replay ended (jobs older have no spans from before).
    pub(in crate::state) recovered_at: Option<Millis>,
    journal: Vec<JournalRecord>,
    pending: BTreeMap<WorkerId, Vec<Assignment>>,
    /// Tenants' quotas (a tenant not here has none).
    quotas: BTreeMap<String, Quota>,
    /// The shared pool: providers' workers, holds, verification.
    pool: pool::Pool,
    /// Providers' workers live now.
    provider_workers: usize,
    /// When workers that said so leave (a batch allocation's end, less their grace): a task
    /// expected to run longer than a worker has left is not placed there. Not journaled:
    /// a worker says it again when it registers after a restart.
    leaves_at: BTreeMap<WorkerId, Millis>,
    /// The jobs made by submissions that named a request id, by tenant and id (see
    /// [`Coordinator::submission`]); a job leaves it when it is removed.
    submissions: HashMap<String, JobId>,
}

/// The key of a submission: its tenant and the client's request id.
fn submission_key(tenant: &str, request_id: &str) -> String {
    format!("{tenant}\n{request_id}")
}

/// A task preempted with no checkpoint after running `s` seconds needs more: it is placed
/// again on a worker that leaves only if that worker has `CUT_MARGIN × s` left, and a batch
/// queue whose allocations are shorter does not ask for workers for it (without a margin a
/// task cut at its allocation's end would start again on every next allocation, as each
/// offers about what the last one did, and never finish).
pub(crate) const CUT_MARGIN: f64 = 1.25;

impl Coordinator {
    /// An empty coordinator.
    pub fn new(config: Config) -> Self {
        Coordinator {
            now: 0,
            capacity_note: None,
            jobs: BTreeMap::new(),
            active: BTreeSet::new(),
            cpuless: BTreeSet::new(),
            ready_jobs: BTreeSet::new(),
            ready_tenants: BTreeMap::new(),
            next_job: 1,
            workers: Workers::default(),
            retired: BTreeSet::new(),
            left_names: BTreeMap::new(),
            next_worker: 1,
            model: PerfModel::new(),
            ledger: flotilla_pool::Ledger::new(),
            backoff: BinaryHeap::new(),
            grace: BinaryHeap::new(),
            ghosts: BTreeMap::new(),
            grace_until: None,
            recovered_at: None,
            journal: Vec::new(),
            pending: BTreeMap::new(),
            quotas: BTreeMap::new(),
            pool: pool::Pool::new(config.fee_ppm),
            provider_workers: 0,
            leaves_at: BTreeMap::new(),
            submissions: HashMap::new(),
            config,
        }
    }

    /// The job that `tenant`'s submission with this request id made, if it is still here.
    pub fn submission(&self, tenant: &str, request_id: &str) -> Option<JobId> {
        self.submissions
            .get(&submission_key(tenant, request_id))
            .copied()
            .filter(|j| self.jobs.contains_key(j))
    }

    /// Notes that `tenant`'s submission with this request id made `job` (call it after
    /// [`Coordinator::submit_expanded`]); the record is journaled with the job's.
    pub fn note_submission(&mut self, job: JobId, tenant: &str, request_id: &str) {
        let key = submission_key(tenant, request_id);
        self.submissions.insert(key.clone(), job);
        self.journal.push(JournalRecord::Submission { job, key });
    }

    /// Sets the tenants' quotas (applied from the next scheduling pass).
    pub fn set_quotas(&mut self, quotas: BTreeMap<String, Quota>) {
        self.quotas = quotas;
        if self.quotas.is_empty() {
            // A pass without quotas sets no job's wait (see `schedule`).
            for j in self.jobs.values_mut() {
                j.quota_wait = None;
            }
        }
    }

    /// Says when `worker` leaves (`None`: it does not say). Call it before the worker's
    /// `WorkerJoined` so that nothing is placed there that would not end in time: a task
    /// whose learned runtime there (the performance model's) exceeds what the worker has
    /// left goes to another worker, or waits. A task with no runtime learned yet may go.
    pub fn set_worker_leaves_at(&mut self, worker: WorkerId, at: Option<Millis>) {
        match at {
            Some(at) => {
                self.leaves_at.insert(worker, at);
            }
            None => {
                self.leaves_at.remove(&worker);
            }
        }
    }

    /// Whether task `t` of `j` is expected to end on `w` before `w` leaves (see
    /// [`Coordinator::set_worker_leaves_at`]).
    fn in_time(&self, j: &Job, t: TaskId, w: &Worker) -> bool {
        let Some(&at) = self.leaves_at.get(&w.id) else {
            return true;
        };
        let left_s = at.saturating_sub(self.now) as f64 / 1000.0;
        self.needs(j, t, &w.spec.hw_class)
            .is_none_or(|secs| secs <= left_s)
    }

    /// The seconds task `t` of `j` is taken to need on `hw`: the performance model's, or
    /// more where an attempt of it was preempted with no checkpoint after running longer
    /// ([`CUT_MARGIN`] × that); `None`: nothing known.
    pub(super) fn needs(&self, j: &Job, t: TaskId, hw: &str) -> Option<f64> {
        let cut = j.cut.get(&t).map(|ran| ran * CUT_MARGIN);
        match (self.predicted(j, t, hw), cut) {
            (Some(p), Some(c)) => Some(p.max(c)),
            (p, c) => p.or(c),
        }
    }

    /// The id the next submitted job should get (ids are never reused, even after a restart:
    /// replayed jobs raise it).
    pub fn next_job_id(&self) -> JobId {
        JobId::new(self.next_job)
    }

    /// Raises the next job id to `next` at least: ids the journal no longer tells of (a
    /// journal recovered with `--recover-journal` lost the records of its last jobs) are
    /// not given again.
    pub fn reserve_job_ids(&mut self, next: u64) {
        self.next_job = self.next_job.max(next);
    }

    /// Allocates an id for a joining worker (never reused: replayed ids raise it).
    pub fn next_worker_id(&mut self) -> WorkerId {
        let id = WorkerId::new(self.next_worker);
        self.next_worker += 1;
        id
    }

    /// The ledger of credits.
    pub fn ledger(&self) -> &flotilla_pool::Ledger {
        &self.ledger
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
        self.pool.replaying = true;
        if record.is_pool_record() {
            let mark = out.len();
            let r = self.replay_pool(record, out);
            self.note_ready(&out[mark..]);
            return r;
        }
        if let JournalRecord::TaskFinished { worker, .. }
        | JournalRecord::TaskFinishedMetered { worker, .. } = &record
        {
            // Every worker named in the journal existed before the restart: its reports
            // are stale, never unknown, and its id is not reused.
            if !self.workers.contains_key(worker) {
                self.retired.insert(*worker);
                self.next_worker = self.next_worker.max(worker.0 + 1);
            }
        }
        // A worker's report on a job the journal no longer holds (removed, then compacted
        // away; an older version journaled such reports): nothing to replay.
        if let JournalRecord::TaskFinished { task, .. }
        | JournalRecord::TaskFinishedMetered { task, .. } = &record
        {
            if !self.jobs.contains_key(&task.job) {
                return Ok(());
            }
        }
        if let JournalRecord::Submission { job, key } = record {
            self.submissions.insert(key, job);
            return Ok(());
        }
        if let JournalRecord::Checkpoint {
            next_job,
            next_worker,
            model,
        } = &record
        {
            let model = PerfModel::from_json(model)
                .map_err(|e| StateError::BadCheckpoint(e.to_string()))?;
            self.next_job = self.next_job.max(*next_job);
            self.next_worker = self.next_worker.max(*next_worker);
            // It was learned from every record before it, the dropped ones and those kept.
            self.model = model;
            return Ok(());
        }
        match record.try_into_event()? {
            Some(event) => self.handle(now, event, out),
            None => Ok(()),
        }
    }

    /// The record a compacted journal ends its kept records with: the id counters and the
    /// performance model now (see [`JournalRecord::Checkpoint`]).
    pub fn checkpoint(&self) -> JournalRecord {
        JournalRecord::Checkpoint {
            next_job: self.next_job,
            next_worker: self.next_worker,
            model: self.model.to_json(),
        }
    }

    /// Call after replaying the journal: from now on, tasks that were assigned before the
    /// restart wait `reconcile_grace_ms` for their worker to rejoin and report them; then
    /// they are placed again.
    pub fn recovered(&mut self, now: Millis) {
        self.pool.replaying = false;
        self.release_stale_holds();
        let now = now.max(self.now);
        self.now = now;
        self.recovered_at = Some(now);
        let due = now.saturating_add(self.config.reconcile_grace_ms);
        for (t, g) in &self.ghosts {
            self.grace.push(Reverse((due, *t, g.attempt)));
        }
        self.grace_until = Some(due);
        // Rebuilt once, whatever the replay noted.
        self.ready_jobs.clear();
        self.ready_tenants.clear();
        let active: Vec<JobId> = self.active.iter().copied().collect();
        for job in active {
            self.recheck_ready(job);
        }
    }

    /// Keeps `ready_jobs` up to date with the task state changes in `cmds`.
    fn note_ready(&mut self, cmds: &[Command]) {
        let mut last = None;
        for c in cmds {
            if let Command::Notify(Notification::TaskState { task, .. }) = c {
                if last != Some(task.job) {
                    last = Some(task.job);
                    self.recheck_ready(task.job);
                }
            }
        }
    }

    /// Whether `job` is active with `Ready` tasks, recorded in `ready_jobs`.
    fn recheck_ready(&mut self, job: JobId) {
        let ready = self.active.contains(&job)
            && self
                .jobs
                .get(&job)
                .is_some_and(|j| j.counts[TaskState::Ready.index()] > 0);
        if ready == self.ready_jobs.contains(&job) {
            return;
        }
        let Some(tenant) = self.jobs.get(&job).map(|j| j.tenant.clone()) else {
            self.ready_jobs.remove(&job);
            return;
        };
        if ready {
            self.ready_jobs.insert(job);
            *self.ready_tenants.entry(tenant).or_default() += 1;
        } else {
            self.ready_jobs.remove(&job);
            if let Some(n) = self.ready_tenants.get_mut(&tenant) {
                *n -= 1;
                if *n == 0 {
                    self.ready_tenants.remove(&tenant);
                }
            }
        }
    }

    /// Whether attempt `attempt` of `task` is its current one, still assigned or running.
    pub fn in_flight(&self, task: TaskRef, attempt: u32) -> bool {
        self.jobs
            .get(&task.job)
            .and_then(|j| j.tasks.get(task.task.index()))
            .is_some_and(|rt| {
                rt.attempt == attempt
                    && matches!(rt.state, TaskState::Assigned | TaskState::Running)
            })
    }

    /// Whether attempt `attempt` of `task` is the task's current one and was given to
    /// `worker`: what that worker may send about it (its output included).
    pub fn gave(&self, worker: WorkerId, task: TaskRef, attempt: u32) -> bool {
        self.jobs
            .get(&task.job)
            .and_then(|j| j.tasks.get(task.task.index()))
            .is_some_and(|rt| rt.attempt == attempt && rt.worker == Some(worker))
    }

    /// [`Event::JobSubmitted`] with the spec already expanded (the server expands it off its
    /// core thread): the job `name` with `graph`, owned by `tenant`, in `dir`. The journal
    /// records the spec (the caller's [`JournalRecord::JobSubmitted`]).
    #[allow(clippy::too_many_arguments)]
    pub fn submit_expanded(
        &mut self,
        now: Millis,
        job: JobId,
        name: &str,
        graph: TaskGraph,
        dir: &str,
        tenant: &str,
        staging: Staging,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        if self.jobs.contains_key(&job) {
            return Err(StateError::DuplicateJob(job));
        }
        let now = now.max(self.now);
        self.now = now;
        let j = Job::new(
            job,
            name.to_string(),
            dir.to_string(),
            tenant.to_string(),
            staging,
            graph,
            now,
        );
        self.next_job = self.next_job.max(job.0 + 1);
        if j.cpuless {
            self.cpuless.insert(job);
        }
        self.jobs.insert(job, j);
        self.active.insert(job);
        self.check_job_end(job, out);
        self.recheck_ready(job);
        Ok(())
    }

    /// Applies one event at time `now`, appending what must be done to `out`. An invalid
    /// event (unknown job, task or worker, an id reused, a contradiction) returns `Err` and
    /// changes nothing; a stale or duplicate report returns `Ok` and has no effect on the
    /// task.
    pub fn handle(&mut self, now: Millis, event: Event, out: &mut Vec<Command>) -> Result<()> {
        let now = now.max(self.now);
        // This event's commands start here (the pool's sweep reads its state changes).
        let mark = out.len();
        if self.reports_on_a_removed_job(&event) {
            return Ok(()); // a report a worker re-sent for a job since removed
        }
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
                self.submit_expanded(
                    now,
                    job,
                    &spec.name,
                    graph,
                    &dir,
                    &tenant,
                    spec.staging,
                    out,
                )?;
                if let Some(pool) = spec.pool {
                    self.set_job_pool(job, pool)?;
                }
            }
            Event::JobCancelled { job } => {
                let j = self.jobs.get(&job).ok_or(StateError::UnknownJob(job))?;
                self.now = now;
                if j.is_active() {
                    self.end_job(job, JobState::Cancelled, out);
                }
            }
            Event::JobRemoved { job } => {
                let j = self.jobs.get(&job).ok_or(StateError::UnknownJob(job))?;
                if j.is_active() {
                    return Err(StateError::NotRemovable {
                        job,
                        why: "it has not ended: its tasks run or wait (cancel it first)".into(),
                    });
                }
                // Attempts still stopping on workers hold resources until they report.
                let stopping = self
                    .workers
                    .values()
                    .any(|w| w.slots.keys().any(|(t, _)| t.job == job));
                if stopping || self.ghosts.keys().any(|t| t.job == job) {
                    return Err(StateError::NotRemovable {
                        job,
                        why: "some of its attempts are still stopping; try again in a moment"
                            .into(),
                    });
                }
                self.now = now;
                self.active.remove(&job);
                self.recheck_ready(job);
                self.jobs.remove(&job);
                self.cpuless.remove(&job);
                self.submissions.retain(|_, j| *j != job);
            }
            Event::WorkerJoined {
                worker,
                spec,
                running,
                held,
                previous,
            } => {
                if self.workers.contains_key(&worker) || self.retired.contains(&worker) {
                    return Err(StateError::DuplicateWorker(worker));
                }
                let mut w = Worker::new(worker, spec, now)
                    .map_err(|reason| StateError::BadWorker { worker, reason })?;
                w.previous = previous.filter(|p| *p != worker);
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
            Event::WorkerAvailability { worker, available } => {
                let w = self
                    .workers
                    .get_mut(&worker)
                    .ok_or(StateError::UnknownWorker(worker))?;
                w.unavailable = !available;
                self.now = now;
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
                if let Some(s) = self
                    .workers
                    .get_mut(&worker)
                    .and_then(|w| w.slots.get_mut(&(task, attempt)))
                {
                    s.started_at.get_or_insert(now);
                }
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
            Event::ObjectsCopied { worker, task } => {
                self.objects_copied(worker, task);
                self.now = now;
            }
            Event::JobReopened { job, tasks } => {
                self.reopen(job, &tasks, out)?;
                self.now = now;
            }
            Event::JobRetried { job } => {
                self.now = now;
                self.retry(job, out)?;
            }
            Event::BudgetRaised { job, amount } => {
                self.raise_budget(job, amount)?;
                self.now = now;
            }
            Event::CreditsGranted { tenant, amount } => {
                // Keys in grant order: a replay gives each grant the key it had.
                let key = format!("grant-{}", self.ledger.transactions().len());
                self.ledger
                    .grant(&key, &tenant, amount)
                    .map_err(|e| StateError::Ledger(e.to_string()))?;
                self.now = now;
            }
        }
        self.run_timers(out);
        self.sweep_holds(&out[mark.min(out.len())..]);
        self.note_ready(&out[mark.min(out.len())..]);
        let placing = out.len();
        self.retract_late(out);
        self.schedule(out);
        self.steal(out);
        self.note_ready(&out[placing..]);
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
    /// Whether `job` was submitted here and since removed (`flotilla rm`): workers may still
    /// report on it (a rejoining worker re-sends its recent results), and are not wrong to.
    /// Whether `event` is a worker's report on a task of a job since removed: it changes
    /// nothing, and is not journaled (a restart read such a record, kept by a compaction
    /// before the counters that tell the job was removed, as one of an unknown job, and the
    /// coordinator could not start again).
    pub fn reports_on_a_removed_job(&self, event: &Event) -> bool {
        match event {
            Event::TaskStarted { task, .. }
            | Event::TaskFinished { task, .. }
            | Event::TaskReturned { task, .. } => self.removed(task.job),
            _ => false,
        }
    }

    fn removed(&self, job: JobId) -> bool {
        job.0 < self.next_job && !self.jobs.contains_key(&job)
    }

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
        if !j.is_active() {
            return;
        }
        if j.counts[TaskState::Done.index()] == j.len() as u64 {
            self.end_job(job, JobState::Succeeded, out);
            return;
        }
        // A job that keeps going past a failed task ends once nothing can run any more:
        // no task ready, running, waiting for a retry, or placed to start (one chained on a
        // worker behind a predecessor, `unmet > 0`, can start only if that succeeds). What
        // still waits needs a task that failed: `end_job` cancels it, and stops a chained
        // one. Decided on the failure's own (journaled) report, never on a worker's later
        // answer to the chained task's retraction, which is not journaled: a restart
        // replaying the journal ends the job the same way.
        let c = &j.counts;
        if !j.graph.keep_going() || c[TaskState::Failed.index()] == 0 {
            return;
        }
        let moving = [TaskState::Ready, TaskState::Running, TaskState::Backoff]
            .iter()
            .map(|s| c[s.index()])
            .sum::<u64>();
        if moving > 0 {
            return;
        }
        let placed_to_start = c[TaskState::Assigned.index()] > 0
            && j.tasks
                .iter()
                .any(|rt| rt.state == TaskState::Assigned && rt.unmet == 0);
        if !placed_to_start {
            self.end_job_saying(
                job,
                JobState::Failed,
                "not run: it needs a task that failed",
                out,
            );
        }
    }

    /// Task `t` of `job` failed for good: the job fails at once (its other tasks cancelled
    /// or stopped), unless it keeps going (`keep_going = true`): then it goes on with every
    /// task that does not need `t`, and ends, failed, when nothing more can run. A gang
    /// member's failure ends its job all the same (its gang cannot run without it).
    pub(super) fn failed_for_good(&mut self, job: JobId, t: TaskId, out: &mut Vec<Command>) {
        let j = &self.jobs[&job];
        if j.graph.keep_going() && j.graph.task(t).gang.is_none() {
            self.check_job_end(job, out);
        } else {
            self.end_job(job, JobState::Failed, out);
        }
    }

    /// Moves a job out of `Running`: tasks not on a worker are cancelled, tasks on a worker
    /// get a `Cancel`; notifies `JobFinished`.
    fn end_job(&mut self, job: JobId, state: JobState, out: &mut Vec<Command>) {
        self.end_job_saying(job, state, &format!("job {}", state.as_str()), out);
    }

    /// [`Coordinator::end_job`], its unfinished tasks cancelled with `message`.
    fn end_job_saying(
        &mut self,
        job: JobId,
        state: JobState,
        message: &str,
        out: &mut Vec<Command>,
    ) {
        let now = self.now;
        let j = self
            .jobs
            .get_mut(&job)
            .expect("callers checked the job exists");
        j.state = state;
        j.finished = Some(now);
        self.active.remove(&job);
        self.cpuless.remove(&job);
        if state != JobState::Succeeded {
            let message = message.to_string();
            for i in 0..j.len() {
                let t = TaskId::new(i as u32);
                let (st, attempt, owner) = {
                    let rt = &j.tasks[i];
                    (rt.state, rt.attempt, rt.worker)
                };
                match st {
                    TaskState::Waiting | TaskState::Ready => {
                        j.set_state(t, TaskState::Cancelled, Some(message.clone()), out);
                    }
                    TaskState::Backoff => {
                        // It had failed too: said, or a sweep fixed for its first failure
                        // fails again on this one.
                        let mut before = j.tasks[i]
                            .ext
                            .as_ref()
                            .and_then(|e| e.message.clone())
                            .unwrap_or_default();
                        // The retry it waited for will not come.
                        if let Some(at) = before.rfind(" (retry ") {
                            before.truncate(at);
                        }
                        let m = format!("{message}; {}{before}", super::FAILED_BEFORE_END);
                        j.set_state(t, TaskState::Cancelled, Some(m), out);
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
                                // Chained behind a predecessor that did not succeed, it never
                                // started: cancelled now, with the reason (the worker's
                                // answer finds it ended, and only frees its slot).
                                if st == TaskState::Assigned && j.tasks[i].unmet > 0 {
                                    // Never started: no worker ran it (its attempt number
                                    // stays, for the worker's answer to the cancel).
                                    j.tasks[i].worker = None;
                                    j.set_state(
                                        t,
                                        TaskState::Cancelled,
                                        Some(message.clone()),
                                        out,
                                    );
                                } else {
                                    // Whatever it reports (done, failed, cancelled), it
                                    // counts nothing: cancelled, or ready again if the job is
                                    // retried first. A replay, which knows no live worker,
                                    // cancels it here; a late success taken as done (or a
                                    // late failure counted) made the two differ, and a
                                    // replay then refused what the live coordinator had
                                    // journaled after (a retry, a removal).
                                    j.broken.insert((t, attempt));
                                }
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
        self.release_job_holds(job);
        out.push(Command::Notify(Notification::JobFinished { job, state }));
    }

    /// Lineage after a job's end: the `Done` tasks of `job` with outputs that no live worker
    /// holds, in id order (what [`Event::JobReopened`] must run again for a gather to find
    /// every output); empty when none is lost, or while workers that held some may still
    /// rejoin after a restart (see [`Coordinator::rejoining`]).
    pub fn lost_outputs(&self, job: JobId) -> Vec<TaskId> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let mut lost: Vec<TaskId> = j
            .outputs
            .iter()
            .filter(|(t, o)| {
                !o.is_empty()
                    && j.tasks[t.index()].state == TaskState::Done
                    && !self.has_live_holder(job, **t)
            })
            .map(|(t, _)| *t)
            .collect();
        lost.sort_unstable();
        lost
    }

    /// Whether an output of `job` that no live worker holds may still come back with a
    /// worker rejoining after a restart (the grace period): it is not lost yet. An output a
    /// live worker holds is not waited for (a worker that rejoined under a new id holds it
    /// under that id, beside its old one).
    pub fn rejoining(&self, job: JobId) -> bool {
        self.in_grace()
            && self.jobs.get(&job).is_some_and(|j| {
                j.holders
                    .values()
                    .any(|hs| !hs.is_empty() && !hs.iter().any(|h| self.workers.contains_key(h)))
            })
    }

    /// [`Event::JobReopened`]: `tasks` (those still `Done`) run again; a job that had
    /// succeeded is running again until they are done.
    fn reopen(&mut self, job: JobId, tasks: &[TaskId], out: &mut Vec<Command>) -> Result<()> {
        let j = self.jobs.get(&job).ok_or(StateError::UnknownJob(job))?;
        if let Some(&t) = tasks.iter().find(|t| t.index() >= j.len()) {
            return Err(StateError::UnknownTask(TaskRef { job, task: t }));
        }
        if !matches!(j.state, JobState::Running | JobState::Succeeded) {
            return Err(StateError::NotReopenable {
                job,
                state: j.state.as_str(),
            });
        }
        let mut set: Vec<TaskId> = tasks
            .iter()
            .copied()
            .filter(|t| j.tasks[t.index()].state == TaskState::Done)
            .collect();
        set.sort_unstable();
        set.dedup();
        if set.is_empty() {
            return Ok(());
        }
        let j = self.job(job);
        if j.state == JobState::Succeeded {
            j.state = JobState::Running;
            j.finished = None;
            let cpuless = j.cpuless;
            self.active.insert(job);
            if cpuless {
                self.cpuless.insert(job);
            }
        }
        let j = self.job(job);
        j.undo_done(&set, "rerun: its outputs were lost with their workers", out);
        Ok(())
    }

    /// Why `flotilla retry` of `job` would change nothing, or may not be done; `None` when it
    /// may. A job is retried when some of its tasks failed or were cancelled: one that ended
    /// (failed or cancelled), or one that keeps going (`keep_going`) past failed tasks while
    /// it runs. A job of the pool is not (its replicas, holds and verdicts are not undone).
    pub fn retry_refusal(&self, job: JobId) -> Option<String> {
        let Some(j) = self.jobs.get(&job) else {
            return Some("no such job".into());
        };
        if j.pool.is_some() {
            return Some(
                "it runs on the pool (`[pool]`), whose jobs are not retried: submit its job \
                 file again"
                    .into(),
            );
        }
        let failed = j.counts[TaskState::Failed.index()];
        match j.state {
            JobState::Succeeded => Some("it succeeded".into()),
            JobState::Running if failed == 0 => Some(
                "it is running and none of its tasks failed for good (a failed attempt is \
                 retried as its task's `retries` say)"
                    .into(),
            ),
            JobState::Failed | JobState::Cancelled if Self::retried_count(j) == 0 => Some(format!(
                "it ended ({}) with every task done",
                j.state.as_str()
            )),
            _ => None,
        }
    }

    /// How many tasks a retry of `job` runs again: those that failed or were cancelled, and
    /// in a job that ended, those still stopping.
    pub fn retry_count(&self, job: JobId) -> u64 {
        self.jobs.get(&job).map_or(0, Self::retried_count)
    }

    fn retried_count(j: &Job) -> u64 {
        let c = &j.counts;
        let mut n = c[TaskState::Failed.index()];
        if !j.is_active() {
            n += c[TaskState::Cancelled.index()]
                + c[TaskState::Assigned.index()]
                + c[TaskState::Running.index()];
        }
        n
    }

    /// [`Event::JobRetried`]: the tasks that failed or were cancelled go back to `Ready` (or
    /// `Waiting` for what they need), their retries counted afresh, and the job runs again.
    /// Attempts still stopping on workers (the job ended while they ran) are left to report:
    /// their reports count nothing (see `end_job_saying`), and their tasks are ready again
    /// then, their retries counted afresh too.
    fn retry(&mut self, job: JobId, out: &mut Vec<Command>) -> Result<()> {
        if let Some(why) = self.retry_refusal(job) {
            return match self.jobs.contains_key(&job) {
                true => Err(StateError::NotRetryable { job, why }),
                false => Err(StateError::UnknownJob(job)),
            };
        }
        let now = self.now;
        let j = self.job(job);
        let ended = !j.is_active();
        if ended {
            j.state = JobState::Running;
            if let Some(end) = j.finished.take() {
                j.idle += now.saturating_sub(end);
            }
            let cpuless = j.cpuless;
            self.active.insert(job);
            if cpuless {
                self.cpuless.insert(job);
            }
        }
        let j = self.job(job);
        for i in 0..j.len() {
            let t = TaskId::new(i as u32);
            let rt = &mut j.tasks[i];
            match rt.state {
                TaskState::Failed | TaskState::Cancelled => {
                    rt.failures = 0;
                    rt.worker = None;
                    j.runnable(t, Some("retried".into()), out);
                }
                // Stopping, in a job that had ended: it runs again once it reports.
                TaskState::Assigned | TaskState::Running if ended => rt.failures = 0,
                _ => {}
            }
        }
        Ok(())
    }

    // ---- views for status ----

    /// What a job waiting with no worker connected is told besides (the allocation queues
    /// that are paused, and why); `None` to say nothing.
    pub fn set_capacity_note(&mut self, note: Option<String>) {
        self.capacity_note = note;
    }

    pub(crate) fn capacity_note(&self) -> Option<&str> {
        self.capacity_note.as_deref()
    }

    /// The performance model learned so far, as JSON ([`PerfModel::to_json`]).
    pub fn model_json(&self) -> String {
        self.model.to_json()
    }

    /// The performance model as `tenant` may see it: its own codelets (`TENANT:JOB/TASK`),
    /// not what other tenants run.
    pub fn model_json_of(&self, tenant: &str) -> String {
        let prefix = super::job::codelet_prefix(tenant);
        if prefix.is_empty() {
            // The admin's own codelets are those with no tenant's prefix.
            return self.model.to_json_of(|codelet| {
                codelet
                    .split_once('/')
                    .is_some_and(|(job, _)| !job.contains(':'))
            });
        }
        self.model
            .to_json_of(|codelet| codelet.starts_with(&prefix))
    }

    pub(crate) fn jobs_map(&self) -> &BTreeMap<JobId, Job> {
        &self.jobs
    }

    pub(crate) fn workers_map(&self) -> &BTreeMap<WorkerId, Worker> {
        &self.workers
    }

    /// Whether the workers' indexes, brought up to date, are what indexing every worker
    /// afresh gives (tests).
    #[cfg(test)]
    pub(crate) fn check_worker_index(&self) -> std::result::Result<(), String> {
        let mut w = self.workers.clone();
        w.refresh();
        w.check()?;
        // And the jobs with ready tasks, per tenant.
        let ready: BTreeSet<JobId> = self
            .active
            .iter()
            .copied()
            .filter(|j| self.jobs[j].counts[TaskState::Ready.index()] > 0)
            .collect();
        let mut tenants: BTreeMap<String, usize> = BTreeMap::new();
        for j in &ready {
            *tenants.entry(self.jobs[j].tenant.clone()).or_default() += 1;
        }
        if ready != self.ready_jobs || tenants != self.ready_tenants {
            return Err(format!(
                "ready jobs {:?} ({:?}) kept as {:?} ({:?})",
                ready, tenants, self.ready_jobs, self.ready_tenants
            ));
        }
        Ok(())
    }

    /// The name of a worker, live or gone (`None`: gone before a restart, or long ago).
    pub(crate) fn worker_name(&self, id: WorkerId) -> Option<&str> {
        self.workers
            .get(&id)
            .map(|w| w.spec.name.as_str())
            .or_else(|| self.left_names.get(&id).map(String::as_str))
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
                previous: None,
            },
            out,
        )
        .expect("a valid worker");
        id
    }

    /// The placement reason kept for a task (tests and status).
    pub(crate) fn reason_of(&self, job: &Job, t: TaskId) -> Option<Placement> {
        let rt = &job.tasks[t.index()];
        if matches!(
            rt.state,
            TaskState::Waiting | TaskState::Ready | TaskState::Backoff
        ) {
            return None; // not placed now: an earlier attempt's reason would mislead
        }
        // A verified result: where it came from is the verdict's story, not one placement's.
        if let Some((agreed, alone)) = job
            .pool
            .as_deref()
            .filter(|_| rt.state == TaskState::Done)
            .and_then(|p| p.agreed.get(&t))
        {
            let why = match (agreed.as_slice(), alone) {
                ([one], true) => format!(
                    "adaptive verification: taken unchecked from {one}, a provider with a \
                     streak of agreeing results"
                ),
                ([], _) => "verified".to_string(),
                (all, _) => format!(
                    "verified: the results of {} agree",
                    crate::state::coordinator::and_list(all)
                ),
            };
            return Some(Placement {
                policy: "verify".into(),
                predicted_s: None,
                alternatives: Vec::new(),
                why,
            });
        }
        if let Some(e) = rt.ext.as_ref().filter(|e| e.reason.is_some()) {
            // Only for the worker it placed the task on (a replica's result may be accepted
            // from another worker than the last one placed).
            return e.reason.clone().filter(|_| e.reason_worker == rt.worker);
        }
        // The reasons are not journaled: after a restart a pool job's placement (by price,
        // reputation, the pool's rules) cannot be told, and is not guessed as eager's.
        if job.pool.is_some() {
            return None;
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

/// `a`, `a and b`, `a, b and c`.
pub(crate) fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
