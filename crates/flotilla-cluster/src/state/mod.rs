//! The coordinator's state machine: jobs, tasks, workers and the scheduling loop, as pure
//! code. No I/O, no async, no clocks, no threads: the server feeds [`Event`]s with the time
//! (milliseconds, injected) into [`Coordinator::handle`] and carries out the [`Command`]s it
//! appends. Every transition and failure path is a unit test (`state/tests/`) and the
//! scheduler's guarantees are property-tested (`state/props.rs`).
//!
//! # Task states
//!
//! | from | event | to |
//! | --- | --- | --- |
//! | (submitted) | no predecessors | `Ready` |
//! | (submitted) | has predecessors | `Waiting` |
//! | `Waiting` | last predecessor `Done` | `Ready` |
//! | `Ready` | placed on a worker (attempt + 1, journaled as `TaskAssigned`) | `Assigned` |
//! | `Ready` | transfer staging: an input's only holders are gone (lineage) | `Waiting` |
//! | `Assigned` | `TaskStarted` | `Running` |
//! | `Assigned`, `Running` | `TaskFinished` succeeded | `Done` |
//! | `Assigned`, `Running` | `TaskFinished` failed, retryable, retries left | `Backoff` |
//! | `Assigned`, `Running` | `TaskFinished` failed otherwise | `Failed` (the job fails) |
//! | `Assigned`, `Running` | `TaskFinished` cancelled (job still running) | `Ready`/`Waiting`, no retry counted |
//! | `Assigned`, `Running` | `WorkerLost` | `Ready`/`Waiting`, no retry counted |
//! | `Assigned`, `Running` | `TaskFinished` preempted (its worker reclaimed) | `Ready`/`Waiting`, no retry counted; the next attempt resumes from its checkpoint |
//! | any | `WorkerAvailability` false (reclaimed), true (back) | — (nothing more is placed on that worker until it is back) |
//! | `Assigned` | `TaskReturned` (after a `Retract`) | `Ready`/`Waiting`, no retry counted |
//! | `Assigned` (replayed) | grace expired, its worker did not come back | `Ready`/`Waiting` |
//! | `Backoff` | `now` ≥ now + min(base·2^(failures−1), max) | `Ready`/`Waiting` |
//! | `Done` | transfer staging: outputs lost and still needed | `Ready`/`Waiting` (rerun) |
//! | `Waiting`, `Ready`, `Backoff` | job failed or cancelled | `Cancelled` |
//! | `Assigned`, `Running` | job failed or cancelled | stays, `Cancel` sent; `Cancelled` (or `Done`) when the worker reports |
//!
//! `Ready`/`Waiting` means `Ready` when every predecessor is `Done`, `Waiting` otherwise.
//! The attempt number grows with every assignment, so each `(task, attempt)` names one
//! placement; a report for any other attempt is stale and ignored. Only failures count
//! against a task's `retries`; a lost worker, a retraction or a cancelled attempt do not
//! (a task that kills every worker it lands on is rerun until the job is cancelled).
//!
//! # Job states
//!
//! | from | when | to |
//! | --- | --- | --- |
//! | `Running` | every task `Done` (at once for an empty job) | `Succeeded` |
//! | `Running` | a task failed for good | `Failed` |
//! | `Running` | `JobCancelled` | `Cancelled` |
//! | `Succeeded`, `Failed`, `Cancelled` | `JobRemoved`, once no attempt of it is left on a worker | gone (forgotten; its id is not reused) |
//!
//! `JobFinished` is notified once, when the job leaves `Running`. `JobRemoved` of a running
//! job, or of one whose cancelled attempts have not reported yet, is refused.
//!
//! # Worker slots and batched dispatch (the contract with the worker agent)
//!
//! Each task on a worker holds a *slot*, either **reserved** (its resources count against
//! the worker's capacity; GPU indices chosen) or **queued** (up to `queue_depth` per worker,
//! assigned beyond the free resources so the worker never idles waiting for the next
//! message), or **chained** (up to `chain_depth`: waiting for a predecessor running there;
//! it joins the queue when that predecessor succeeds, so the queue may then hold up to
//! `queue_depth + chain_depth`). Invariant: the reserved slots of a worker fit in its capacity, and every
//! `Running` task holds a reserved slot. Queued tasks never use GPUs or GPU memory.
//! The worker must start its tasks in the order it received them, a task starting only when
//! its resources fit in what is free locally (it may skip over a task that does not fit yet).
//! The coordinator mirrors this: when a slot is released it promotes queued tasks, first fit
//! in assignment order. A `TaskStarted` for a queued task that does not fit is refused.
//! A slot is released only when the worker reports the attempt (`TaskFinished` — also the
//! answer to `Cancel` — or `TaskReturned`) or is lost, so resources of a cancelled attempt stay
//! reserved until the worker confirms. Workers should send `TaskStarted` after staging inputs.
//!
//! # Gangs (`group = { size = N }`)
//!
//! The members of a gang (consecutive instances, `flotilla_core::GangMember`) are placed
//! all or nothing: only when every member is `Ready`, each on a *reserved* slot (never
//! queued, so all start at once), in one `handle` call; if one does not fit, none is placed
//! (trial reservations are undone) and the class waits. Each member's [`Assignment`] carries
//! its rank, the size and a rendezvous key naming this incarnation of the gang
//! (`job-first-attempt`), from which the worker sets `FLOTILLA_RANK`, `FLOTILLA_WORLD_SIZE`
//! and `FLOTILLA_RENDEZVOUS`. Every member runs the variant rank 0 got.
//!
//! | event on a member | effect on the gang |
//! | --- | --- |
//! | `TaskFinished` failed, retries left | it goes to `Backoff`; the other running members get `Cancel` and are marked *broken*; every member's failure count becomes the gang's (one retry per restart) |
//! | `TaskFinished` failed, no retries left | the job fails (every member is cancelled) |
//! | `TaskFinished` cancelled, `WorkerLost` | it goes back to `Ready`; the others are cancelled and marked broken; nothing counted |
//! | `TaskFinished` of a broken attempt (any outcome) | back to `Ready`/`Waiting`, nothing counted (its peer died: its failure is the same restart) |
//! | placement finds members `Done` beside `Ready` ones | the `Done` ones are put back (`undo_done`): a gang reruns as a whole |
//!
//! Checkpoints are the program's: a restarted gang runs in the same job folder (shared
//! staging) and resumes from the files it wrote. Known limit: a gang waiting for room does not
//! hold resources back from smaller tasks of other classes, so it can wait long on a busy
//! cluster.
//!
//! # Restart
//!
//! The server applies a batch of events, then appends the journaled ones ([`JournalRecord`])
//! and the assignments they caused ([`Coordinator::take_journal_records`]) to the journal in
//! one write, and only then replies or sends the `Assign` commands: nothing leaves the
//! coordinator before it is in the journal, so an event applied but not written died with
//! the process before anyone heard of it. After a crash the server replays the records with
//! [`Coordinator::replay`] and calls [`Coordinator::recovered`]. A replayed assignment leaves
//! its task `Assigned` to a *ghost* (the worker id from before the restart): it is not placed
//! again until a worker joins reporting that `(task, attempt)` running (the task becomes
//! `Running` there), a `TaskFinished` for it arrives (applied once, from any worker id), or
//! `reconcile_grace_ms` pass (the task becomes `Ready`).

mod coordinator;
mod job;
mod status;
mod worker;
mod workers;

#[cfg(test)]
mod chain_tests;
#[cfg(test)]
mod gang_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod variant_sim_tests;

use std::fmt;

use flotilla_core::{JobId, JobSpec, Resources, Staging, TaskId, WorkerId};
use serde::{Deserialize, Serialize};

pub use coordinator::{Coordinator, VerdictRecord, WorkLeft, WorkerShape};
pub use status::{
    AttemptSpan, ClusterStatus, JobPoolStatus, JobStatus, JobSummary, JobTrace, JournalStatus,
    TaskCounts, TaskStatus, WorkerShare, WorkerStatus, GRAPH_TASKS, STATUS_FAILED, STATUS_TASKS,
};

/// Monotonic milliseconds, injected by the caller.
pub type Millis = u64;

/// What the coordinator refuses: the event named is invalid and changed nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// No job with this id.
    #[error("unknown job {}", .0.0)]
    UnknownJob(JobId),
    /// A job with this id exists already.
    #[error("job {} exists already", .0.0)]
    DuplicateJob(JobId),
    /// The job cannot be removed yet.
    #[error("job {} cannot be removed: {why}", job.0)]
    NotRemovable {
        /// The job.
        job: JobId,
        /// Why.
        why: String,
    },
    /// The job's spec did not expand.
    #[error("job {job}: {source}")]
    BadJob {
        /// The job.
        job: JobId,
        /// Why.
        #[source]
        source: flotilla_core::CoreError,
    },
    /// The job has no such task.
    #[error("unknown task {0}")]
    UnknownTask(TaskRef),
    /// No live worker with this id.
    #[error("unknown worker {0}")]
    UnknownWorker(WorkerId),
    /// A worker with this id joined already (or was lost: ids are not reused).
    #[error("worker {0} joined already")]
    DuplicateWorker(WorkerId),
    /// The worker's description is unusable.
    #[error("worker {worker}: {reason}")]
    BadWorker {
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: String,
    },
    /// A ledger operation refused.
    #[error("ledger: {0}")]
    Ledger(String),
    /// A journal checkpoint's performance model does not read back.
    #[error("journal checkpoint: its performance model is unreadable: {0}")]
    BadCheckpoint(String),
    /// The event contradicts what the coordinator knows of this attempt.
    #[error("task {task} attempt {attempt} on worker {worker}: {reason}")]
    Conflict {
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The worker that sent the event.
        worker: WorkerId,
        /// Why it was refused.
        reason: String,
    },
    /// Only a running or succeeded job's outputs are rebuilt.
    #[error("{job} is {state}: its lost outputs are not rebuilt")]
    NotReopenable {
        /// The job.
        job: JobId,
        /// Its state.
        state: &'static str,
    },
    /// `flotilla retry` of a job with nothing to retry, or one that cannot be.
    #[error("job {}: nothing to retry: {why}", job.0)]
    NotRetryable {
        /// The job.
        job: JobId,
        /// Why.
        why: String,
    },
}

/// What the message of a task cancelled by its job's end says before the failure it was
/// waiting to retry (`job failed; its last attempt had failed: exited with code 3 ...`).
pub const FAILED_BEFORE_END: &str = "its last attempt had failed: ";

/// The state machine's result type.
pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// One GPU of a worker.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    /// The device index (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    /// The model, e.g. `"NVIDIA H200"`.
    pub model: String,
    /// Its memory in bytes.
    pub mem_bytes: u64,
}

/// What a worker offers, as it registers.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkerSpec {
    /// Its name (as given on the command line, or the host name).
    pub name: String,
    /// The host it runs on.
    pub hostname: String,
    /// Its hardware class: the `arch` key of the performance model.
    pub hw_class: String,
    /// Its resources: cpus, mem, custom. `gpus` and `gpu_mem` are taken from [`gpus`]
    /// when that list is not empty.
    ///
    /// [`gpus`]: WorkerSpec::gpus
    pub resources: Resources,
    /// Its GPUs.
    pub gpus: Vec<GpuInfo>,
    /// `host:port` of its object server, for transfer staging.
    pub data_addr: String,
    /// The provider whose machine it is (it enrolled with that provider's token); `None`:
    /// the operator's own.
    #[serde(default)]
    pub provider: Option<String>,
    /// Its provider's price (zero for the operator's own workers).
    #[serde(default)]
    pub price: flotilla_pool::Price,
    /// When it runs (`--available`, `--idle-only`), as its provider wrote it; empty: always.
    #[serde(default)]
    pub availability: String,
    /// Its owner may reclaim it at any moment (`--preemptible`): placement prefers other
    /// workers at the same price for tasks that declare no checkpoint.
    #[serde(default)]
    pub preemptible: bool,
    /// It registered outside its availability: no work until it says it is available.
    #[serde(default)]
    pub unavailable: bool,
    /// Watts one busy CPU draws there (0: unknown, 12 W assumed): `objective = "energy"`
    /// compares machines by it.
    #[serde(default)]
    pub cpu_watts: f64,
}

impl WorkerSpec {
    /// The resource ledger of this offer, with nothing reserved (what the coordinator and
    /// the worker's agent each keep).
    pub fn ledger(
        &self,
    ) -> std::result::Result<flotilla_core::ledger::Ledger, flotilla_core::ledger::LedgerError>
    {
        let gpus: Vec<flotilla_core::ledger::LedgerGpu> = self
            .gpus
            .iter()
            .map(|g| flotilla_core::ledger::LedgerGpu {
                index: g.index,
                mem_bytes: g.mem_bytes,
            })
            .collect();
        flotilla_core::ledger::Ledger::new(self.resources.clone(), &gpus)
    }
}

/// A task of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct TaskRef {
    /// The job.
    pub job: JobId,
    /// The task instance in the job's graph.
    pub task: TaskId,
}

impl fmt::Display for TaskRef {
    /// `job-3/t5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.job, self.task)
    }
}

/// A tenant's quotas; `None` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    /// The most CPUs its tasks hold at once (assigned or running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// The most GPUs its tasks hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<f64>,
    /// The most of its jobs that run at once; later ones wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_jobs: Option<u32>,
    /// The most tasks one of its jobs may expand to (larger jobs are refused at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u64>,
}

/// A file a task produced (transfer staging).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Relative to the job folder.
    pub path: String,
    /// blake3, hex.
    pub hash: String,
    /// Bytes.
    pub size: u64,
}

/// What an attempt used (its metering: the pool charges CPU seconds, GPUs × wall time and
/// memory × wall time at its provider's price, and records energy and fuel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Peak resident memory.
    pub peak_rss_bytes: u64,
    /// Wall-clock time of the attempt.
    pub wall_seconds: f64,
    /// Energy, joules: measured (RAPL through powercap, its share of the package's by CPU
    /// time) or estimated from CPU time and the worker's watts per CPU
    /// (`energy_estimated`).
    #[serde(default)]
    pub energy_j: Option<f64>,
    /// Whether `energy_j` is an estimate.
    #[serde(default)]
    pub energy_estimated: bool,
    /// WASM: the fuel it consumed.
    #[serde(default)]
    pub fuel: Option<u64>,
}

/// [`Usage`] as journals written before metering recorded energy and fuel have it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LegacyUsage {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Peak resident memory.
    pub peak_rss_bytes: u64,
    /// Wall-clock time of the attempt.
    pub wall_seconds: f64,
}

/// [`AttemptResult`] as journals written before metering recorded energy and fuel have it
/// (the [`JournalRecord::TaskFinished`] of older journals).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LegacyAttemptResult {
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// What it used.
    pub usage: LegacyUsage,
    /// The files it produced.
    pub outputs: Vec<ObjectRef>,
    /// The variant it ran.
    pub variant: Option<String>,
}

impl From<LegacyAttemptResult> for AttemptResult {
    fn from(r: LegacyAttemptResult) -> AttemptResult {
        AttemptResult {
            outcome: r.outcome,
            usage: Usage {
                cpu_seconds: r.usage.cpu_seconds,
                peak_rss_bytes: r.usage.peak_rss_bytes,
                wall_seconds: r.usage.wall_seconds,
                ..Usage::default()
            },
            outputs: r.outputs,
            variant: r.variant,
        }
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// It succeeded.
    Succeeded,
    /// It failed.
    Failed {
        /// Why.
        message: String,
        /// Whether another attempt may succeed (a crash, a timeout) or not (a bad command).
        retryable: bool,
    },
    /// It was cancelled (or returned unrun after a `Cancel`).
    Cancelled,
    /// Its worker was reclaimed (drained, its availability ended, its owner came back, it
    /// got SIGTERM): the task got SIGTERM and a grace period to write its checkpoint files,
    /// kept off the machine (transfer staging: in the coordinator's store; shared staging:
    /// in the job folder, and not listed). The next attempt resumes from them; no retry is
    /// counted.
    Preempted {
        /// The checkpoint files (transfer staging).
        checkpoint: Vec<ObjectRef>,
    },
}

/// The report of one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptResult {
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// What it used.
    pub usage: Usage,
    /// The files it produced (transfer staging), now held by the worker.
    pub outputs: Vec<ObjectRef>,
    /// The variant it ran, for a task with variants.
    pub variant: Option<String>,
}

/// Everything that can happen to the coordinator. Journaled ones (J) are written to the
/// journal after they are applied and before anything they caused leaves the coordinator,
/// and replayed after a restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A job was accepted (J).
    JobSubmitted {
        /// Its id, from [`Coordinator::next_job_id`].
        job: JobId,
        /// The job.
        spec: JobSpec,
        /// The job folder.
        dir: String,
        /// Who owns it.
        tenant: String,
    },
    /// A job was cancelled (J).
    JobCancelled {
        /// The job.
        job: JobId,
    },
    /// A finished job is forgotten, with its tasks and outputs' records (J): `flotilla rm`.
    JobRemoved {
        /// The job.
        job: JobId,
    },
    /// A worker registered.
    WorkerJoined {
        /// Its id, from [`Coordinator::next_worker_id`].
        worker: WorkerId,
        /// What it offers.
        spec: WorkerSpec,
        /// Attempts it is running (after a coordinator restart or a reconnect).
        running: Vec<(TaskRef, u32)>,
        /// Outputs it still holds (transfer staging).
        held: Vec<(TaskRef, ObjectRef)>,
        /// The id it had before (a coordinator restart or a reconnect), as its credential
        /// proved: only that id's attempts (`running`, and results it reports later) and
        /// outputs (`held`) are taken from it. `None`: it claims nothing.
        previous: Option<WorkerId>,
    },
    /// A worker that rejoined under a new id has reported everything it ran (its running
    /// attempts in `WorkerJoined`, then what finished while it was away as `TaskFinished`).
    /// Attempts still journaled as assigned to its `previous` id never reached it (or it
    /// dropped them unstarted): they are placed again at once instead of after the grace.
    WorkerReconciled {
        /// Its id now.
        worker: WorkerId,
        /// Its id before.
        previous: WorkerId,
    },
    /// A worker was reclaimed (`available: false`: drained, its availability window ended,
    /// its owner came back; its running attempts report `Preempted`) or is back (`true`):
    /// nothing is placed on it while it is not available.
    WorkerAvailability {
        /// The worker.
        worker: WorkerId,
        /// Whether it takes work.
        available: bool,
    },
    /// A worker missed its heartbeats or its stream closed.
    WorkerLost {
        /// The worker.
        worker: WorkerId,
        /// Why, for the messages.
        reason: String,
    },
    /// A worker started an attempt.
    TaskStarted {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
    },
    /// An attempt ended (J).
    TaskFinished {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The report.
        result: AttemptResult,
    },
    /// A worker gave back a queued, not-started attempt (after a `Retract`).
    TaskReturned {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
    },
    /// An assignment the coordinator made before a restart (J). Produced by the coordinator
    /// (see [`Coordinator::take_journal_records`]) and only ever replayed.
    TaskAssigned {
        /// The worker, an id from before the restart.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The variant chosen, for a task with variants.
        variant: Option<String>,
        /// The GPU indices given.
        gpu_indices: Vec<u32>,
        /// The worker's hardware class (to record its time in the model when it finishes).
        hw_class: String,
    },
    /// Credits handed to a tenant (J): `flotilla admin tenant add NAME --credits C`, then `tenant set NAME --grant C`.
    CreditsGranted {
        /// The tenant.
        tenant: String,
        /// How much.
        amount: flotilla_pool::Credits,
    },
    /// A job may spend more (J): `flotilla budget JOB +N`.
    BudgetRaised {
        /// The job.
        job: JobId,
        /// How much more.
        amount: flotilla_pool::Credits,
    },
    /// Time passed: backoffs, grace periods.
    Tick,
    /// Lineage (J): the `Done` tasks whose outputs no live worker holds any more are run
    /// again, and a job that had succeeded runs again until they are done: what a gather
    /// that finds outputs lost with their workers asks for
    /// ([`Coordinator::lost_outputs`] names the tasks).
    JobReopened {
        /// The job.
        job: JobId,
        /// The tasks to run again.
        tasks: Vec<TaskId>,
    },
    /// `flotilla retry` (J): the tasks of `job` that failed or were cancelled run again, each
    /// with its retries counted afresh, and a job that had ended (failed or cancelled) runs
    /// again; its done tasks are kept. Its attempts still stopping when it is retried go on
    /// as the job's (cancelled, they run again). See [`Coordinator::retry_refusal`].
    JobRetried {
        /// The job.
        job: JobId,
    },
    /// Worker `worker` holds a copy of `task`'s outputs now, made as a [`Handoff`] from a
    /// leaving worker: it is one of their holders, and the task need not run again when the
    /// leaving worker goes. Not journaled: after a restart the copy is forgotten, and a
    /// gather that finds the outputs lost has them rebuilt, as for any lost worker.
    ObjectsCopied {
        /// The worker that holds the copy.
        worker: WorkerId,
        /// The task whose outputs it holds.
        task: TaskRef,
    },
}

/// The outputs of a done task that only a leaving worker holds, and the peer to copy them
/// to ([`Coordinator::handoff`]): the coordinator's answer to a drain, as Dask's
/// `retire_workers` moves data before a worker goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Handoff {
    /// The task.
    pub task: TaskRef,
    /// Its outputs.
    pub objects: Vec<ObjectRef>,
    /// The peer that fetches them.
    pub to: WorkerId,
}

impl Event {
    /// Whether the server must journal this event (before it replies or dispatches anything
    /// the event caused).
    pub fn journaled(&self) -> bool {
        matches!(
            self,
            Event::JobSubmitted { .. }
                | Event::JobCancelled { .. }
                | Event::JobRemoved { .. }
                | Event::TaskFinished { .. }
                | Event::TaskAssigned { .. }
                | Event::CreditsGranted { .. }
                | Event::BudgetRaised { .. }
                | Event::JobReopened { .. }
                | Event::JobRetried { .. }
        )
    }
}

/// A journaled event: what the journal holds, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum JournalRecord {
    /// See [`Event::JobSubmitted`].
    JobSubmitted {
        /// The job's id.
        job: JobId,
        /// The job (boxed: it dwarfs the other records).
        spec: Box<JobSpec>,
        /// The job folder.
        dir: String,
        /// Who owns it.
        tenant: String,
    },
    /// See [`Event::JobCancelled`].
    JobCancelled {
        /// The job.
        job: JobId,
    },
    /// See [`Event::TaskFinished`], as journals written before metering have it (read,
    /// never written: see [`JournalRecord::TaskFinishedMetered`]).
    TaskFinished {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The report.
        result: LegacyAttemptResult,
    },
    /// See [`Event::TaskAssigned`].
    TaskAssigned {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The variant chosen.
        variant: Option<String>,
        /// The GPU indices given.
        gpu_indices: Vec<u32>,
        /// The worker's hardware class.
        hw_class: String,
    },
    /// See [`Event::JobRemoved`] (after the others, so older journals decode unchanged).
    JobRemoved {
        /// The job.
        job: JobId,
    },
    /// What a compacted journal keeps of the records it dropped (those of removed jobs):
    /// written by [`Journal::start_compaction`](crate::journal::Journal::start_compaction)
    /// after the records it kept. Replaying it raises the id counters (ids are never
    /// reused) and replaces the performance model by the one learned from every record up
    /// to that point, the dropped ones included.
    Checkpoint {
        /// The next job id.
        next_job: u64,
        /// The next worker id.
        next_worker: u32,
        /// The performance model, as
        /// [`PerfModel::to_json`](flotilla_sched::PerfModel::to_json) writes it.
        model: String,
    },
    /// See [`Event::CreditsGranted`] (kept by compaction: the ledger is rebuilt from it).
    CreditsGranted {
        /// The tenant.
        tenant: String,
        /// How much.
        amount: flotilla_pool::Credits,
    },
    /// A provider's worker joined (kept by compaction): whose machine it is and its price,
    /// to settle its results after a restart.
    PoolWorker {
        /// The worker.
        worker: WorkerId,
        /// Its provider.
        provider: String,
        /// Its price.
        price: flotilla_pool::Price,
    },
    /// A job accepted, its spec as job-file text (what [`JobSpec::to_toml`] writes): the
    /// form every new journal uses, so that a field added to the job file later never
    /// changes how older records decode. [`JournalRecord::JobSubmitted`] records of older
    /// journals are still read.
    JobSubmittedText {
        /// The job's id.
        job: JobId,
        /// The job file.
        toml: String,
        /// The job folder.
        dir: String,
        /// Who owns it.
        tenant: String,
    },
    /// A ledger transaction made for an attempt (kept by compaction).
    Ledger {
        /// The attempt it is for.
        attempt: Option<(TaskRef, u32)>,
        /// The transaction.
        tx: flotilla_pool::Transaction,
    },
    /// A verified task's result judged (kept by compaction: reputations are rebuilt from
    /// it). Written after the `TaskFinished` it judged.
    Verdict {
        /// The task.
        task: TaskRef,
        /// The attempt whose report it judged.
        attempt: u32,
        /// The verdict.
        verdict: VerdictRecord,
    },
    /// See [`Event::BudgetRaised`].
    BudgetRaised {
        /// The job.
        job: JobId,
        /// How much more.
        amount: flotilla_pool::Credits,
    },
    /// See [`Event::TaskFinished`]: the form every new journal uses (with the attempt's
    /// energy and fuel).
    TaskFinishedMetered {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// The report.
        result: AttemptResult,
    },
    /// See [`Event::JobReopened`].
    JobReopened {
        /// The job.
        job: JobId,
        /// The tasks run again.
        tasks: Vec<TaskId>,
    },
    /// In a group of coordinators (see [`crate::ha`]): the records before it are the group's
    /// log up to an entry, and `state` (opaque to the state machine) says which entry and
    /// the group's membership then. Replays as nothing.
    Replicated {
        /// The group's own encoding of the entry's log id and the membership.
        state: Vec<u8>,
    },
    /// Job `job` was made by the submission the client named `key` (its request id, with
    /// the tenant: see [`Coordinator::submission`]): the same submission sent again gets
    /// that job. Replays as nothing else; dropped with the job.
    Submission {
        /// The job.
        job: JobId,
        /// The tenant and the client's request id.
        key: String,
    },
    /// The coordinator's clock, in milliseconds since the Unix epoch, when the records after
    /// it (up to the next one) were made: replaying them at that time keeps what a job's
    /// times say (submitted, finished, makespan, utilization, retention) across restarts.
    /// Written before a record whenever the clock moved since the last one; in a group of
    /// coordinators only while every member reads it (a node of an older version, mid rolling
    /// upgrade, could not). Replays as nothing; compaction keeps the one before each record it
    /// keeps.
    Clock {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
    },
    /// See [`Event::JobRetried`] (after the others, so older journals decode unchanged; in a
    /// group of coordinators written only while every member reads it).
    JobRetried {
        /// The job.
        job: JobId,
    },
}

impl JournalRecord {
    /// The record of a journaled event; `None` for the others.
    pub fn from_event(event: &Event) -> Option<JournalRecord> {
        Some(match event {
            Event::JobSubmitted {
                job,
                spec,
                dir,
                tenant,
            } => JournalRecord::JobSubmittedText {
                job: *job,
                toml: spec.to_toml(),
                dir: dir.clone(),
                tenant: tenant.clone(),
            },
            Event::JobCancelled { job } => JournalRecord::JobCancelled { job: *job },
            Event::JobRemoved { job } => JournalRecord::JobRemoved { job: *job },
            Event::TaskFinished {
                worker,
                task,
                attempt,
                result,
            } => JournalRecord::TaskFinishedMetered {
                worker: *worker,
                task: *task,
                attempt: *attempt,
                result: result.clone(),
            },
            Event::TaskAssigned {
                worker,
                task,
                attempt,
                variant,
                gpu_indices,
                hw_class,
            } => JournalRecord::TaskAssigned {
                worker: *worker,
                task: *task,
                attempt: *attempt,
                variant: variant.clone(),
                gpu_indices: gpu_indices.clone(),
                hw_class: hw_class.clone(),
            },
            Event::CreditsGranted { tenant, amount } => JournalRecord::CreditsGranted {
                tenant: tenant.clone(),
                amount: *amount,
            },
            Event::BudgetRaised { job, amount } => JournalRecord::BudgetRaised {
                job: *job,
                amount: *amount,
            },
            Event::JobReopened { job, tasks } => JournalRecord::JobReopened {
                job: *job,
                tasks: tasks.clone(),
            },
            Event::JobRetried { job } => JournalRecord::JobRetried { job: *job },
            Event::WorkerJoined { .. }
            | Event::WorkerAvailability { .. }
            | Event::WorkerReconciled { .. }
            | Event::WorkerLost { .. }
            | Event::TaskStarted { .. }
            | Event::TaskReturned { .. }
            | Event::ObjectsCopied { .. }
            | Event::Tick => return None,
        })
    }
}

impl JournalRecord {
    /// The job the record is about; `None` for a [`JournalRecord::Checkpoint`].
    pub fn job(&self) -> Option<JobId> {
        match self {
            JournalRecord::JobSubmitted { job, .. }
            | JournalRecord::JobCancelled { job }
            | JournalRecord::JobRemoved { job }
            | JournalRecord::JobSubmittedText { job, .. }
            | JournalRecord::BudgetRaised { job, .. }
            | JournalRecord::JobReopened { job, .. }
            | JournalRecord::JobRetried { job }
            | JournalRecord::Submission { job, .. } => Some(*job),
            JournalRecord::TaskFinished { task, .. }
            | JournalRecord::TaskFinishedMetered { task, .. }
            | JournalRecord::TaskAssigned { task, .. } => Some(task.job),
            JournalRecord::Checkpoint { .. }
            | JournalRecord::CreditsGranted { .. }
            | JournalRecord::PoolWorker { .. }
            | JournalRecord::Ledger { .. }
            | JournalRecord::Verdict { .. }
            | JournalRecord::Replicated { .. }
            | JournalRecord::Clock { .. } => None,
        }
    }

    /// Whether a compaction keeps it whatever its job (the ledger's and the pool's records).
    pub fn always_kept(&self) -> bool {
        matches!(
            self,
            JournalRecord::CreditsGranted { .. }
                | JournalRecord::PoolWorker { .. }
                | JournalRecord::Ledger { .. }
                | JournalRecord::Verdict { .. }
        )
    }

    /// Whether it is one of the pool's own records (replayed by the coordinator, not as an
    /// event).
    pub fn is_pool_record(&self) -> bool {
        matches!(
            self,
            JournalRecord::PoolWorker { .. }
                | JournalRecord::Ledger { .. }
                | JournalRecord::Verdict { .. }
        )
    }

    /// The event the record replays as; `None` for a [`JournalRecord::Checkpoint`] and the
    /// pool's records, which are no events (see [`Coordinator::replay`]), and for a job file
    /// that no longer parses (see [`JournalRecord::try_into_event`]).
    pub fn into_event(self) -> Option<Event> {
        self.try_into_event().ok().flatten()
    }

    /// [`JournalRecord::into_event`], saying why a journaled job file does not parse.
    pub fn try_into_event(self) -> Result<Option<Event>> {
        Ok(Some(match self {
            JournalRecord::JobSubmittedText {
                job,
                toml,
                dir,
                tenant,
            } => {
                let spec = flotilla_core::parse_job(&toml, &format!("journal({job})"))
                    .map_err(|source| StateError::BadJob { job, source })?;
                Event::JobSubmitted {
                    job,
                    spec,
                    dir,
                    tenant,
                }
            }
            JournalRecord::JobSubmitted {
                job,
                spec,
                dir,
                tenant,
            } => Event::JobSubmitted {
                job,
                spec: *spec,
                dir,
                tenant,
            },
            JournalRecord::JobCancelled { job } => Event::JobCancelled { job },
            JournalRecord::JobRemoved { job } => Event::JobRemoved { job },
            JournalRecord::TaskFinished {
                worker,
                task,
                attempt,
                result,
            } => Event::TaskFinished {
                worker,
                task,
                attempt,
                result: result.into(),
            },
            JournalRecord::TaskFinishedMetered {
                worker,
                task,
                attempt,
                result,
            } => Event::TaskFinished {
                worker,
                task,
                attempt,
                result,
            },
            JournalRecord::TaskAssigned {
                worker,
                task,
                attempt,
                variant,
                gpu_indices,
                hw_class,
            } => Event::TaskAssigned {
                worker,
                task,
                attempt,
                variant,
                gpu_indices,
                hw_class,
            },
            JournalRecord::CreditsGranted { tenant, amount } => {
                Event::CreditsGranted { tenant, amount }
            }
            JournalRecord::BudgetRaised { job, amount } => Event::BudgetRaised { job, amount },
            JournalRecord::JobReopened { job, tasks } => Event::JobReopened { job, tasks },
            JournalRecord::JobRetried { job } => Event::JobRetried { job },
            JournalRecord::Checkpoint { .. }
            | JournalRecord::PoolWorker { .. }
            | JournalRecord::Ledger { .. }
            | JournalRecord::Verdict { .. }
            | JournalRecord::Replicated { .. }
            | JournalRecord::Submission { .. }
            | JournalRecord::Clock { .. } => return Ok(None),
        }))
    }
}

/// What the coordinator wants done. The server turns these into messages.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Run these attempts; at most one per worker per `handle` call.
    Assign {
        /// The worker.
        worker: WorkerId,
        /// The attempts, in the order the worker should start them.
        tasks: Vec<Assignment>,
    },
    /// Stop this attempt; the worker answers with `TaskFinished` (cancelled, or its real
    /// outcome if it had ended).
    Cancel {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
    },
    /// Give back this queued, not-started attempt (work stealing); the worker answers with
    /// `TaskReturned`, or `TaskStarted` if it had started it already.
    Retract {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
    },
    /// For watchers (`flotilla status/wait`) and the progress bar.
    Notify(Notification),
}

/// What one attempt runs, the variant already resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum AssignedKind {
    /// A process.
    Command {
        /// Program and arguments.
        cmd: Vec<String>,
        /// Environment.
        env: Vec<(String, String)>,
        /// Working directory, relative to the job folder.
        cwd: Option<String>,
    },
    /// A WASI module.
    Wasm {
        /// Path of the module.
        module: String,
        /// Exported function to call.
        entry: String,
        /// Arguments.
        args: Vec<String>,
        /// Environment.
        env: Vec<(String, String)>,
        /// Fuel limit.
        fuel: Option<u64>,
        /// Memory limit in bytes.
        memory: Option<u64>,
    },
}

/// One attempt sent to a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The task.
    pub task: TaskRef,
    /// The attempt.
    pub attempt: u32,
    /// The instance's name, `"tile[3]"`.
    pub name: String,
    /// The job's name.
    pub job_name: String,
    /// The job folder.
    pub job_dir: String,
    /// How files reach the worker.
    pub staging: Staging,
    /// What to run.
    pub kind: AssignedKind,
    /// The variant chosen, for a task with variants.
    pub variant: Option<String>,
    /// What it may use (a whole number of GPUs when it takes whole GPUs).
    pub resources: Resources,
    /// Which of the worker's GPUs; a fractional task shares its index.
    pub gpu_indices: Vec<u32>,
    /// Time limit.
    pub timeout_ms: Option<u64>,
    /// Array index.
    pub index: Option<u64>,
    /// Transfer staging: predecessors' outputs to fetch, each with the `data_addr` of a live
    /// worker holding it.
    pub inputs: Vec<(ObjectRef, String)>,
    /// Declared output paths.
    pub outputs: Vec<String>,
    /// Why it was placed there.
    pub reason: Placement,
    /// For a member of a gang (`group`): its rank, the gang's size and the rendezvous key.
    pub gang: Option<GangAssignment>,
    /// Chained dispatch: start only after this attempt of a predecessor succeeded on the
    /// same worker (the coordinator retracts it if that attempt fails).
    pub after: Option<(TaskRef, u32)>,
    /// The checkpoint files the task declares (kept when it is preempted).
    pub checkpoint: Vec<String>,
    /// The checkpoint of its last preempted attempt, to stage before it starts (transfer
    /// staging: objects in the coordinator's store).
    pub resume: Vec<ObjectRef>,
}

/// A gang member's part of an [`Assignment`]: the worker sets `FLOTILLA_RANK`,
/// `FLOTILLA_WORLD_SIZE` and `FLOTILLA_RENDEZVOUS` (`HOST:PORT/KEY`, the coordinator's
/// rendezvous service) from it, and PyTorch's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangAssignment {
    /// `0..size`.
    pub rank: u32,
    /// The gang's size.
    pub size: u32,
    /// Names this incarnation of the gang at the rendezvous: `job-first-attempt`, where
    /// `attempt` is rank 0's attempt (every restart of the gang gets a new key).
    pub key: String,
    /// Its rank among the members on its machine (`LOCAL_RANK`): same host name and same
    /// data address IP.
    pub local_rank: u32,
    /// How many members are on its machine (`LOCAL_WORLD_SIZE`).
    pub local_size: u32,
    /// Where rank 0 runs, as the other members reach it (`MASTER_ADDR`): the IP of rank 0's
    /// worker's data address when that is not a loopback or unspecified one (its
    /// `--data-listen`), else `127.0.0.1` when every member shares its machine, else its
    /// host name.
    pub master_addr: String,
    /// A port for rank 0 to listen on (`MASTER_PORT`), from the key:
    /// [`GANG_PORTS`] wide from [`GANG_PORT_BASE`] (every restart gets another).
    pub master_port: u16,
}

/// The first port a gang's rank 0 may be told to listen on (`MASTER_PORT`): below Linux's
/// ephemeral ports (32768 on), which outgoing connections take.
pub const GANG_PORT_BASE: u16 = 20000;
/// How many ports from [`GANG_PORT_BASE`] (to 29999; PyTorch's own default, 29500, among
/// them).
pub const GANG_PORTS: u16 = 10000;

/// `MASTER_PORT` for the gang incarnation `key`: FNV-1a of the key in the gang port range,
/// the same on every member's worker and after a replay.
pub fn gang_port(key: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    GANG_PORT_BASE + (h % u32::from(GANG_PORTS)) as u16
}

/// Why a task was placed where it was (the placement's own type, from `flotilla-sched`).
pub type Placement = flotilla_sched::cluster::Reason;

/// A change for watchers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Notification {
    /// A task changed state.
    TaskState {
        /// The task.
        task: TaskRef,
        /// Its name.
        name: String,
        /// The new state.
        state: TaskState,
        /// Its latest attempt (0 before the first).
        attempt: u32,
        /// The worker, when it has one.
        worker: Option<WorkerId>,
        /// Why, when there is something to say (an error, a lost worker).
        message: Option<String>,
    },
    /// A job ended.
    JobFinished {
        /// The job.
        job: JobId,
        /// How.
        state: JobState,
    },
}

/// The state of a task; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting for predecessors.
    Waiting,
    /// Waiting for a worker.
    Ready,
    /// Sent to a worker, not started.
    Assigned,
    /// Running on a worker.
    Running,
    /// Succeeded.
    Done,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Failed, waiting to be retried.
    Backoff,
}

impl TaskState {
    /// Every state, in the order of [`TaskState::index`].
    pub const ALL: [TaskState; 8] = [
        TaskState::Waiting,
        TaskState::Ready,
        TaskState::Assigned,
        TaskState::Running,
        TaskState::Done,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::Backoff,
    ];

    /// A dense index, for counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether nothing more will happen to it (`Done`, `Failed`, `Cancelled`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Done | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Ready => "ready",
            TaskState::Assigned => "assigned",
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Backoff => "backoff",
        }
    }
}

impl std::str::FromStr for TaskState {
    type Err = String;

    /// A state as [`TaskState::as_str`] writes it (`failed`), naming the others when it is
    /// none of them.
    fn from_str(s: &str) -> std::result::Result<TaskState, String> {
        TaskState::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = TaskState::ALL.iter().map(|t| t.as_str()).collect();
                format!("task state {s:?}: one of {}", all.join(", "))
            })
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of a job; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Not finished.
    Running,
    /// Every task succeeded.
    Succeeded,
    /// A task failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl JobState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the coordinator behaves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Base of the retry backoff, doubled per failure.
    pub retry_backoff_ms: u64,
    /// Cap of the retry backoff.
    pub max_backoff_ms: u64,
    /// After a restart, how long tasks journaled as assigned wait for their worker to rejoin.
    pub reconcile_grace_ms: u64,
    /// Tasks queued on a worker beyond its free resources (batched dispatch).
    pub queue_depth: usize,
    /// Chained dispatch: how many tasks a worker may hold that wait for a predecessor
    /// running there (their last unfinished one), to start the moment it succeeds with no
    /// round trip to the coordinator. 0 turns chaining off.
    #[serde(default)]
    pub chain_depth: usize,
    /// The platform's fee on every settled cost in the pool, parts per million
    /// (`flotilla server --fee 0.05` is 50,000).
    #[serde(default = "default_fee_ppm")]
    pub fee_ppm: u32,
}

fn default_fee_ppm() -> u32 {
    50_000
}

impl Default for Config {
    /// 1 s backoff doubling up to 1 min, 30 s grace, 2 queued tasks per worker, 8 chained,
    /// a 5 % fee.
    fn default() -> Self {
        Config {
            retry_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            reconcile_grace_ms: 30_000,
            queue_depth: 2,
            chain_depth: 8,
            fee_ppm: default_fee_ppm(),
        }
    }
}
