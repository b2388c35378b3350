//! Serializable views of the coordinator's state, for `flotilla status` and the dashboard.

use flotilla_core::{JobId, Resources, Staging, TaskId, WorkerId};
use serde::{Deserialize, Serialize};

use super::coordinator::Coordinator;
use super::job::Job;
use super::{JobState, Millis, Placement, TaskRef, TaskState, Usage};

/// How many tasks are in each state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// Waiting for predecessors.
    pub waiting: u64,
    /// Waiting for a worker.
    pub ready: u64,
    /// Sent to a worker.
    pub assigned: u64,
    /// Running.
    pub running: u64,
    /// Succeeded.
    pub done: u64,
    /// Failed for good.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Waiting to be retried.
    pub backoff: u64,
}

impl TaskCounts {
    fn from_array(c: &[u64; 8]) -> TaskCounts {
        let at = |s: TaskState| c[s.index()];
        TaskCounts {
            waiting: at(TaskState::Waiting),
            ready: at(TaskState::Ready),
            assigned: at(TaskState::Assigned),
            running: at(TaskState::Running),
            done: at(TaskState::Done),
            failed: at(TaskState::Failed),
            cancelled: at(TaskState::Cancelled),
            backoff: at(TaskState::Backoff),
        }
    }

    /// The count of one state.
    pub fn get(&self, s: TaskState) -> u64 {
        match s {
            TaskState::Waiting => self.waiting,
            TaskState::Ready => self.ready,
            TaskState::Assigned => self.assigned,
            TaskState::Running => self.running,
            TaskState::Done => self.done,
            TaskState::Failed => self.failed,
            TaskState::Cancelled => self.cancelled,
            TaskState::Backoff => self.backoff,
        }
    }
}

/// One task of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// Its id in the job.
    pub id: TaskId,
    /// `"tile[3]"`.
    pub name: String,
    /// Its state.
    pub state: TaskState,
    /// Its latest attempt number (0 before the first).
    pub attempts: u32,
    /// Failed attempts counted against its retries.
    pub failures: u32,
    /// The worker of its latest attempt.
    pub worker: Option<WorkerId>,
    /// The variant of its latest attempt.
    pub variant: Option<String>,
    /// Why it was placed there.
    pub placement: Option<Placement>,
    /// What its successful attempt used.
    pub usage: Option<Usage>,
    /// The last thing said about it (an error, a lost worker).
    pub message: Option<String>,
    /// What it cost so far, credits (a job with a `[pool]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The provider of its latest attempt's worker (`None`: the operator's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// A job's pool accounts and deadline, as `flotilla status` shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobPoolStatus {
    /// Its budget, credits (`None`: its tenant's balance).
    pub budget: Option<f64>,
    /// Settled so far.
    pub spent: f64,
    /// Held for attempts in flight or waiting for a verdict.
    pub held: f64,
    /// Why it places nothing now (out of budget or credits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// Its deadline, milliseconds after submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// `"met"`, `"missed"`, `"on track"`, `"at risk"`; absent without a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// How its results are verified: `"1"`, `"2"`, … or `"adaptive"`.
    pub verify: String,
    /// Providers' results rejected by verification.
    pub rejected: u64,
}

/// One job, with every task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Its id.
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub tenant: String,
    /// Its folder.
    pub dir: String,
    /// How files reach workers.
    pub staging: Staging,
    /// Its state.
    pub state: JobState,
    /// Tasks per state.
    pub counts: TaskCounts,
    /// Number of tasks.
    pub total: u64,
    /// Failed attempts that were retried.
    pub retries: u32,
    /// When it was submitted (coordinator milliseconds).
    pub submitted_ms: Millis,
    /// When it finished.
    pub finished_ms: Option<Millis>,
    /// Seconds from submission to the end (or to now, while running).
    pub makespan_s: f64,
    /// The longest chain of dependent tasks, by their last attempts' wall times (seconds).
    pub critical_path_s: f64,
    /// Why its ready tasks wait: its tenant's quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its pool accounts (a job with a `[pool]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<JobPoolStatus>,
    /// Every task, by id.
    pub tasks: Vec<TaskStatus>,
}

impl JobStatus {
    /// Its final state, once it has one.
    pub fn finished_state(&self) -> Option<JobState> {
        (self.state != JobState::Running).then_some(self.state)
    }

    /// The task with this name: (id, latest attempt, whether it is in a final state).
    pub fn task_by_name(&self, name: &str) -> Option<(TaskId, u32, bool)> {
        self.tasks
            .iter()
            .find(|t| t.name == name)
            .map(|t| (t.id, t.attempts, t.state.is_final()))
    }
}

/// One job, without its tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    /// Its id.
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub tenant: String,
    /// Its state.
    pub state: JobState,
    /// Tasks per state.
    pub counts: TaskCounts,
    /// Tasks done.
    pub done: u64,
    /// Number of tasks.
    pub total: u64,
    /// Failed attempts that were retried.
    pub retries: u32,
    /// Seconds from submission to the end (or to now).
    pub makespan_s: f64,
    /// Why its ready tasks wait: its tenant's quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its pool accounts (a job with a `[pool]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<JobPoolStatus>,
}

/// Every job and live worker, as `flotilla status` shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Every job, oldest first.
    pub jobs: Vec<JobSummary>,
    /// The live workers.
    pub workers: Vec<WorkerStatus>,
    /// The coordinator's journal (absent in a simulation).
    #[serde(default)]
    pub journal: Option<JournalStatus>,
}

/// The coordinator's journal as `flotilla status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalStatus {
    /// The file.
    pub path: String,
    /// Records in it.
    pub records: u64,
    /// Its size, bytes.
    pub bytes: u64,
    /// Whether every append is fsync'd (`flotilla server --fsync`).
    pub fsync: bool,
    /// Appends fsync'd since the coordinator started.
    pub syncs: u64,
}

/// One live worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Its id.
    pub id: WorkerId,
    /// Its name.
    pub name: String,
    /// Its host.
    pub hostname: String,
    /// Its hardware class.
    pub hw_class: String,
    /// Its object server.
    pub data_addr: String,
    /// The provider whose machine it is (`None`: the operator's own).
    #[serde(default)]
    pub provider: Option<String>,
    /// Its provider's price, credits per unit-hour.
    #[serde(default)]
    pub price: flotilla_pool::Price,
    /// When it works (`--available`, `--idle-only`); empty: always.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub availability: String,
    /// Whether it takes work now (false: reclaimed by its owner, or drained).
    #[serde(default = "yes")]
    pub available: bool,
    /// Its owner may reclaim it at any moment.
    #[serde(default)]
    pub preemptible: bool,
    /// What it offers.
    pub resources: Resources,
    /// What its reserved (started or about to start) attempts use.
    pub used: Resources,
    /// Attempts on it (reserved and queued), with their attempt numbers.
    pub tasks: Vec<(TaskRef, u32)>,
    /// Of those, how many are queued beyond its free resources.
    pub queued: usize,
    /// Busy CPU seconds over `cpus × uptime`.
    pub utilization: f64,
    /// Seconds since it joined.
    pub uptime_s: f64,
}

fn yes() -> bool {
    true
}

fn makespan(j: &Job, now: Millis) -> f64 {
    j.finished.unwrap_or(now).saturating_sub(j.submitted) as f64 / 1000.0
}

impl Coordinator {
    /// One job with every task; `None` if unknown. Linear in the job's tasks: for a large
    /// job prefer [`Coordinator::job_summary`] and [`Coordinator::task_status`].
    pub fn job_status(&self, job: JobId) -> Option<JobStatus> {
        let j = self.jobs_map().get(&job)?;
        let tasks: Vec<TaskStatus> = (0..j.len())
            .map(|i| self.task_view(j, TaskId::new(i as u32)))
            .collect();
        let wall: Vec<f64> = tasks
            .iter()
            .map(|t| t.usage.as_ref().map_or(0.0, |u| u.wall_seconds))
            .collect();
        let (critical_path_s, _) = j.graph.critical_path(|t| wall[t.index()]);
        Some(JobStatus {
            id: j.id,
            name: j.name.clone(),
            tenant: j.tenant.clone(),
            dir: j.dir.clone(),
            staging: j.staging,
            state: j.state,
            counts: TaskCounts::from_array(&j.counts),
            total: j.len() as u64,
            retries: j.retries,
            submitted_ms: j.submitted,
            finished_ms: j.finished,
            makespan_s: makespan(j, self.now()),
            critical_path_s,
            waiting: self.waiting(j),
            pool: self.pool_status(j),
            tasks,
        })
    }

    /// Every job, oldest first, without tasks.
    pub fn jobs(&self) -> Vec<JobSummary> {
        self.jobs_map().values().map(|j| self.summary(j)).collect()
    }

    /// One job without its tasks (cheap for a million-task job); `None` if unknown.
    pub fn job_summary(&self, job: JobId) -> Option<JobSummary> {
        self.jobs_map().get(&job).map(|j| self.summary(j))
    }

    /// One task, found by name (`"tile[3]"`) in O(1); `None` if the job or task is unknown.
    pub fn task_status(&self, job: JobId, name: &str) -> Option<TaskStatus> {
        let j = self.jobs_map().get(&job)?;
        let id = j.graph.by_name(name)?;
        Some(self.task_view(j, id))
    }

    fn summary(&self, j: &Job) -> JobSummary {
        JobSummary {
            id: j.id,
            name: j.name.clone(),
            tenant: j.tenant.clone(),
            state: j.state,
            counts: TaskCounts::from_array(&j.counts),
            done: j.counts[TaskState::Done.index()],
            total: j.len() as u64,
            retries: j.retries,
            makespan_s: makespan(j, self.now()),
            waiting: self.waiting(j),
            pool: self.pool_status(j),
        }
    }

    /// Why a running job's ready tasks wait: its tenant's quota, or its budget.
    fn waiting(&self, j: &Job) -> Option<String> {
        if !j.is_active() {
            return None;
        }
        j.quota_wait
            .clone()
            .or_else(|| j.pool.as_deref().and_then(|p| p.paused.clone()))
    }

    fn task_view(&self, j: &Job, id: TaskId) -> TaskStatus {
        let rt = &j.tasks[id.index()];
        TaskStatus {
            id,
            name: j.graph.task(id).name.clone(),
            state: rt.state,
            attempts: rt.attempt,
            failures: rt.failures,
            worker: rt.worker,
            variant: j.variant_name(id, rt.variant),
            placement: self.reason_of(j, id),
            usage: rt.ext.as_ref().and_then(|e| e.usage),
            message: rt.ext.as_ref().and_then(|e| e.message.clone()),
            cost: j
                .pool
                .as_deref()
                .map(|p| p.cost.get(&id).copied().unwrap_or_default().as_f64()),
            provider: rt.worker.and_then(|w| self.provider_of(w)),
        }
    }

    /// Every live worker, by id.
    pub fn workers(&self) -> Vec<WorkerStatus> {
        let now = self.now();
        self.workers_map()
            .values()
            .map(|w| WorkerStatus {
                id: w.id,
                name: w.spec.name.clone(),
                hostname: w.spec.hostname.clone(),
                hw_class: w.spec.hw_class.clone(),
                data_addr: w.spec.data_addr.clone(),
                provider: w.spec.provider.clone(),
                price: w.spec.price,
                availability: w.spec.availability.clone(),
                available: !w.unavailable,
                preemptible: w.spec.preemptible,
                resources: w.cap().clone(),
                used: w.used().clone(),
                tasks: w.slots.keys().copied().collect(),
                queued: w.queue.len(),
                utilization: w.utilization(now),
                uptime_s: now.saturating_sub(w.joined) as f64 / 1000.0,
            })
            .collect()
    }
}
