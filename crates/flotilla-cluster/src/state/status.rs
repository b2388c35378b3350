//! Serializable views of the coordinator's state, for `flotilla status` and the dashboard.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::{JobId, Resources, Staging, TaskId, WorkerId};
use serde::{Deserialize, Serialize};

use super::coordinator::Coordinator;
use super::job::Job;
use super::{JobState, Millis, Placement, TaskRef, TaskState, Usage};

/// How many of a job's classes with ready tasks [`Coordinator::never_fits`] looks at.
const NEVER_FITS_CLASSES: usize = 32;

/// How many copies of `need` fit side by side in `cap`, by each amount alone (GPUs by their
/// shares, `gpu_mem` against the GPUs' memory in all): an upper bound, enough to tell a gang
/// that can never start.
fn copies(cap: &Resources, need: &Resources) -> u64 {
    let mut n = u64::MAX;
    let mut by = |have: f64, want: f64| {
        if want > 0.0 {
            // Rounding: 0.3 × 10 must fit in 3.
            n = n.min(((have / want) + 1e-9).floor().max(0.0) as u64);
        }
    };
    by(cap.cpus, need.cpus);
    by(cap.gpus, need.gpus);
    by(cap.mem as f64, need.mem as f64);
    by(cap.gpu_mem as f64, need.gpu_mem as f64);
    for (k, want) in &need.custom {
        by(cap.custom.get(k).copied().unwrap_or(0.0), *want);
    }
    n
}

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
    /// A verified task's result: the providers whose results agreed (its cost paid each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agreed: Vec<String>,
    /// A running task: seconds since its worker said its attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_s: Option<f64>,
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
    /// `"met"`, `"missed"`, `"not met: the job failed"` (or `cancelled`: it ended before its
    /// deadline without succeeding), `"on track"`, `"at risk"`; absent without a deadline.
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
    /// When it was submitted (milliseconds since the Unix epoch, by the coordinator's clock).
    pub submitted_ms: Millis,
    /// When it finished.
    pub finished_ms: Option<Millis>,
    /// Seconds from submission to the end (or to now, while running).
    pub makespan_s: f64,
    /// The longest chain of dependent tasks, by their last attempts' wall times (seconds).
    pub critical_path_s: f64,
    /// Why its ready tasks wait: its tenant's quota, its pool's pause, or a task too large for
    /// every connected worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its pool accounts (a job with a `[pool]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<JobPoolStatus>,
    /// Its tasks by id: all of them, or a page of at most [`STATUS_TASKS`] (or as asked)
    /// from `tasks_from` on.
    pub tasks: Vec<TaskStatus>,
    /// The id of the first listed task (0 unless a later page was asked for); with a filter
    /// by state, the id the listing started from.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tasks_from: u64,
    /// When the listing was cut (more tasks, or more in the states asked for, come after):
    /// the id the next page starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_next: Option<u64>,
    /// The states the listing was filtered by (empty: every task).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks_in: Vec<TaskState>,
    /// When `tasks` is a page: the first [`STATUS_FAILED`] failed tasks not on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<TaskStatus>,
    /// What each worker ran of the job (all its tasks, not only the listed ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_worker: Vec<WorkerShare>,
    /// The names of the workers named here, those gone included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workers: BTreeMap<WorkerId, String>,
}

/// How many tasks a job's status lists unless asked otherwise: the status of a larger job
/// lists a page (its counts, failures and per-worker totals are whole), so that it stays a
/// small message however large the job.
pub const STATUS_TASKS: usize = 10_000;

/// How many failed tasks off the page a partial status lists.
pub const STATUS_FAILED: usize = 100;

/// What one worker ran of a job: the tasks whose latest attempt it ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerShare {
    /// The worker.
    pub worker: WorkerId,
    /// Its tasks.
    pub tasks: u64,
    /// Their wall time, in seconds.
    pub busy_s: f64,
    /// Their wall time times the CPUs each held, in CPU-seconds: over the worker's CPUs
    /// and the makespan, its utilization by the job (tasks of half a CPU count half).
    #[serde(default)]
    pub cpu_busy_s: f64,
}

impl JobStatus {
    /// Its final state, once it has one.
    pub fn finished_state(&self) -> Option<JobState> {
        (self.state != JobState::Running).then_some(self.state)
    }

    /// Its failed tasks that the status holds: those listed, then those off the page.
    pub fn failed_tasks(&self) -> impl Iterator<Item = &TaskStatus> {
        self.tasks
            .iter()
            .filter(|t| t.state == TaskState::Failed)
            .chain(self.failed.iter())
    }

    /// Whether every task is listed.
    pub fn lists_every_task(&self) -> bool {
        self.tasks_from == 0 && self.tasks.len() as u64 == self.total
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
    /// Why its ready tasks wait: its tenant's quota, its pool's pause, or a task too large for
    /// every connected worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Its pool accounts (a job with a `[pool]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<JobPoolStatus>,
    /// Seconds it has left by the learned runtimes (a running job whose kinds all have a
    /// prediction or an estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
    /// A ready task no connected worker could take even idle, and what it needs (also in
    /// `waiting` when nothing else holds the job back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub never_fits: Option<String>,
    /// Whether any of its tasks ran (or runs): without, its makespan is only how long it
    /// has waited (true from a coordinator that does not say).
    #[serde(default = "yes")]
    pub ran: bool,
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
    /// In a group of coordinators: the leader's API address (the one answering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// In a group of coordinators: its members as the leader sees them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::ha::GroupStatus>,
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
    /// Why it cannot be written now (a full or read-only disk): no new job is taken until
    /// it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
    /// Its provider's price, credits per unit-hour, written as `--price` takes it
    /// (`"cpu=0.02,gpu=0.5,mem_gb=0"`; the ledger's micro-credits read as 20000).
    #[serde(default, with = "price_text")]
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
    /// Its GPUs: model and memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Seconds since the coordinator last heard from it (filled in by the coordinator's
    /// server, which sees the heartbeats; `None` in a simulation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_s: Option<f64>,
}

fn yes() -> bool {
    true
}

/// One attempt as a span on its worker's timeline (`flotilla trace`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptSpan {
    /// The task's name (`tile[3]`).
    pub task: String,
    /// The attempt number.
    pub attempt: u32,
    /// The worker it ran on, and its name.
    pub worker: WorkerId,
    /// The worker's name.
    pub worker_name: String,
    /// The first GPU it held (its position on the worker), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Milliseconds after the job's submission.
    pub start_ms: u64,
    /// Milliseconds after the job's submission.
    pub end_ms: u64,
    /// `succeeded`, `failed`, `cancelled`, `preempted`, `lost`, `running`, or `transfer`
    /// (its inputs fetched before it ran, transfer staging).
    pub outcome: String,
    /// A transfer's bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A job's attempts in time, for a Chrome/Perfetto trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobTrace {
    /// The job.
    pub job: JobId,
    /// Its name.
    pub name: String,
    /// Its spans, in the order the attempts ended.
    pub spans: Vec<AttemptSpan>,
    /// Whether attempts were left out (the first ones kept only, or some ended before the
    /// coordinator last started: a replayed journal has no times).
    pub partial: bool,
    /// Attempts running now, ending at `now_ms` (outcome `running`).
    #[serde(default)]
    pub running: Vec<AttemptSpan>,
    /// Milliseconds from the job's submission to now (or to its end).
    #[serde(default)]
    pub now_ms: u64,
    /// The task graph's edges (predecessor, successor) by task index, for a job of at most
    /// [`GRAPH_TASKS`] tasks (the dashboard draws it); empty for a larger one.
    #[serde(default)]
    pub edges: Vec<(u32, u32)>,
    /// The tasks' names by index, with `edges`.
    #[serde(default)]
    pub names: Vec<String>,
}

/// The most tasks of a job whose graph [`JobTrace`] carries.
pub const GRAPH_TASKS: usize = 300;

impl JobTrace {
    /// The trace in the Chrome/Perfetto JSON format (the runtime's `FLOTILLA_TRACE` format):
    /// one process per worker, one track per slot (attempts that overlapped on a worker go
    /// to different slots) and one per GPU; each attempt a span named `task #attempt`.
    pub fn to_chrome(&self) -> String {
        let mut events: Vec<serde_json::Value> = Vec::new();
        let mut by_worker: std::collections::BTreeMap<WorkerId, Vec<&AttemptSpan>> =
            Default::default();
        for s in &self.spans {
            by_worker.entry(s.worker).or_default().push(s);
        }
        for (w, mut spans) in by_worker {
            let pid = w.0;
            let name = &spans[0].worker_name;
            events.push(serde_json::json!({
                "ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                "args": { "name": format!("worker {w} ({name})") }
            }));
            spans.sort_by_key(|s| (s.start_ms, s.end_ms));
            // Interval partitioning: each span on the first slot free at its start.
            let mut slot_ends: Vec<u64> = Vec::new();
            let mut gpus: std::collections::BTreeSet<u32> = Default::default();
            for s in spans {
                let tid = match s.gpu {
                    Some(g) => {
                        gpus.insert(g);
                        10_000 + u64::from(g)
                    }
                    None => {
                        let lane = match slot_ends.iter().position(|&e| e <= s.start_ms) {
                            Some(l) => l,
                            None => {
                                slot_ends.push(0);
                                slot_ends.len() - 1
                            }
                        };
                        slot_ends[lane] = s.end_ms;
                        lane as u64
                    }
                };
                let (name, cat) = if s.outcome == "transfer" {
                    (format!("{} #{} inputs", s.task, s.attempt), "transfer")
                } else {
                    (format!("{} #{}", s.task, s.attempt), s.outcome.as_str())
                };
                events.push(serde_json::json!({
                    "ph": "X", "pid": pid, "tid": tid, "cat": cat, "name": name,
                    "ts": s.start_ms * 1000, "dur": s.end_ms.saturating_sub(s.start_ms) * 1000,
                    "args": { "task": s.task, "attempt": s.attempt, "outcome": s.outcome, "bytes": s.bytes }
                }));
            }
            for lane in 0..slot_ends.len() {
                events.push(serde_json::json!({
                    "ph": "M", "pid": pid, "tid": lane, "name": "thread_name",
                    "args": { "name": format!("slot {lane}") }
                }));
            }
            for g in gpus {
                events.push(serde_json::json!({
                    "ph": "M", "pid": pid, "tid": 10_000 + u64::from(g), "name": "thread_name",
                    "args": { "name": format!("gpu {g}") }
                }));
            }
        }
        let doc = serde_json::json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": { "job": self.job.0, "name": self.name, "partial": self.partial },
        });
        format!("{doc}\n")
    }
}

fn makespan(j: &Job, now: Millis) -> f64 {
    j.finished
        .unwrap_or(now)
        .saturating_sub(j.submitted)
        .saturating_sub(j.idle) as f64
        / 1000.0
}

/// A job's makespan until its last attempt stopped: a job that failed or was cancelled ends
/// at once, but its running attempts are stopped after (up to their grace), and their time
/// counts in the workers' busy time (a failed job read "makespan 26 ms, utilization 3909%").
/// A job that succeeded ended with its last attempt. Scans the spans: for one job's status.
fn makespan_with_stops(j: &Job, now: Millis) -> f64 {
    match j.finished {
        Some(end) if j.state != JobState::Succeeded => {
            let last = j.spans.iter().map(|s| s.end).fold(end, u64::max);
            last.saturating_sub(j.submitted).saturating_sub(j.idle) as f64 / 1000.0
        }
        _ => makespan(j, now),
    }
}

impl Coordinator {
    /// A job's attempts as spans; `None` if unknown.
    pub fn job_trace(&self, job: JobId) -> Option<JobTrace> {
        self.job_trace_last(job, usize::MAX)
    }

    /// [`Coordinator::job_trace`] with only the `last` attempts that ended most recently
    /// (the dashboard's timeline of a large job), and every running one.
    pub fn job_trace_last(&self, job: JobId, last: usize) -> Option<JobTrace> {
        let j = self.jobs_map().get(&job)?;
        let spans: Vec<AttemptSpan> = j.spans[j.spans.len().saturating_sub(last)..]
            .iter()
            .map(|s| AttemptSpan {
                task: j.graph.task(s.task).name.clone(),
                attempt: s.attempt,
                worker: s.worker,
                worker_name: s.worker_name.clone(),
                gpu: s.gpu,
                start_ms: s.start.saturating_sub(j.submitted),
                end_ms: s.end.saturating_sub(j.submitted),
                outcome: s.outcome.to_string(),
                bytes: s.bytes,
            })
            .collect();
        let now = j.finished.unwrap_or(self.now());
        let mut running = Vec::new();
        for w in self.workers_map().values() {
            for (&(tref, attempt), slot) in &w.slots {
                let Some(start) = slot.started_at.filter(|_| tref.job == job) else {
                    continue;
                };
                running.push(AttemptSpan {
                    task: j.graph.task(tref.task).name.clone(),
                    attempt,
                    worker: w.id,
                    worker_name: w.spec.name.clone(),
                    gpu: slot.gpus.first().map(|g| g.0 as u32),
                    start_ms: start.saturating_sub(j.submitted),
                    end_ms: now.saturating_sub(j.submitted),
                    outcome: "running".to_string(),
                    bytes: 0,
                });
            }
        }
        let (mut edges, mut names) = (Vec::new(), Vec::new());
        if j.len() <= GRAPH_TASKS {
            for i in 0..j.len() {
                let t = TaskId::new(i as u32);
                names.push(j.graph.task(t).name.clone());
                edges.extend(j.graph.preds(t).iter().map(|p| (p.0, t.0)));
            }
        }
        Some(JobTrace {
            job: j.id,
            name: j.name.clone(),
            partial: j.spans.len() >= super::job::MAX_SPANS
                || spans.len() < j.spans.len()
                || self.recovered_at.is_some_and(|r| j.submitted < r),
            spans,
            running,
            now_ms: now.saturating_sub(j.submitted),
            edges,
            names,
        })
    }

    /// One job with every task; `None` if unknown. Linear in the job's tasks: for a large
    /// job prefer [`Coordinator::job_summary`] and [`Coordinator::task_status`].
    pub fn job_status(&self, job: JobId) -> Option<JobStatus> {
        self.job_status_page(job, usize::MAX)
    }

    /// [`Coordinator::job_status`] with only the first `first` tasks (the dashboard's page
    /// of a large job: the counts are whole, the task list is not).
    pub fn job_status_page(&self, job: JobId, first: usize) -> Option<JobStatus> {
        self.job_status_range(job, 0, first)
    }

    /// [`Coordinator::job_status`] listing at most `limit` tasks from id `from` on; its
    /// counts, per-worker totals and the first failures off the page are whole.
    pub fn job_status_range(&self, job: JobId, from: usize, limit: usize) -> Option<JobStatus> {
        self.job_status_in(job, from, limit, &[])
    }

    /// [`Coordinator::job_status_range`] listing only the tasks in `states` (all when
    /// empty): at most `limit` of them, from id `from` on (`flotilla status JOB --state
    /// failed`). Linear in the job's tasks from `from`.
    pub fn job_status_in(
        &self,
        job: JobId,
        from: usize,
        limit: usize,
        states: &[TaskState],
    ) -> Option<JobStatus> {
        let j = self.jobs_map().get(&job)?;
        let from = from.min(j.len());
        let wanted = |i: &usize| states.is_empty() || states.contains(&j.tasks[*i].state);
        let mut ids = (from..j.len()).filter(wanted);
        let listed: Vec<usize> = ids.by_ref().take(limit).collect();
        let tasks_next = ids
            .next()
            .and_then(|_| listed.last().map(|l| *l as u64 + 1));
        let tasks: Vec<TaskStatus> = listed
            .iter()
            .map(|&i| self.task_view(j, TaskId::new(i as u32)))
            .collect();
        let partial = from > 0 || listed.len() < j.len();
        let failed: Vec<TaskStatus> = if partial {
            j.tasks
                .iter()
                .enumerate()
                .filter(|(i, rt)| rt.state == TaskState::Failed && listed.binary_search(i).is_err())
                .take(STATUS_FAILED)
                .map(|(i, _)| self.task_view(j, TaskId::new(i as u32)))
                .collect()
        } else {
            Vec::new()
        };
        // Tasks by the worker of their latest attempt; busy time of every attempt.
        let mut shares: BTreeMap<WorkerId, (u64, f64, f64)> = BTreeMap::new();
        for rt in &j.tasks {
            if let Some(w) = rt.worker {
                shares.entry(w).or_default().0 += 1;
            }
        }
        for (w, (wall, cpu)) in &j.busy {
            let share = shares.entry(*w).or_default();
            share.1 += wall;
            share.2 += cpu;
        }
        let named: BTreeSet<WorkerId> = shares
            .keys()
            .copied()
            .chain(tasks.iter().chain(&failed).filter_map(|t| t.worker))
            .collect();
        let (critical_path_s, _) = j.graph.critical_path(|t| {
            j.tasks[t.index()]
                .ext
                .as_ref()
                .and_then(|e| e.usage.as_ref())
                .map_or(0.0, |u| u.wall_seconds)
        });
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
            makespan_s: makespan_with_stops(j, self.now()),
            critical_path_s: to_ms(critical_path_s),
            waiting: self.waiting(j),
            pool: self.pool_status(j),
            workers: named
                .into_iter()
                .filter_map(|w| Some((w, self.worker_name(w)?.to_string())))
                .collect(),
            tasks,
            tasks_from: from as u64,
            tasks_next,
            tasks_in: states.to_vec(),
            failed,
            per_worker: shares
                .into_iter()
                .map(|(worker, (tasks, busy_s, cpu_busy_s))| WorkerShare {
                    worker,
                    tasks,
                    busy_s: to_ms(busy_s),
                    cpu_busy_s: to_ms(cpu_busy_s),
                })
                .collect(),
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
        let never_fits = j.is_active().then(|| self.never_fits(j)).flatten();
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
            waiting: self
                .held_back(j)
                .or_else(|| self.unserved_job(j))
                .or_else(|| never_fits.clone()),
            pool: self.pool_status(j),
            eta_s: self.eta(j),
            never_fits,
            ran: !j.busy.is_empty() || j.counts[TaskState::Running.index()] > 0,
        }
    }

    /// Why a running job's ready tasks wait: its tenant's quota, its budget, or their size.
    fn waiting(&self, j: &Job) -> Option<String> {
        if !j.is_active() {
            return None;
        }
        self.held_back(j)
            .or_else(|| self.unserved_job(j))
            .or_else(|| self.never_fits(j))
    }

    /// A ready task of `j` that the connected workers could hold but may not run by the
    /// pool's rules (its providers ran it already, their prices, trusted-only, no `[pool]`
    /// section), and why; the first [`NEVER_FITS_CLASSES`] classes with ready tasks, as
    /// [`Coordinator::never_fits`].
    fn unserved_job(&self, j: &Job) -> Option<String> {
        if !j.is_active() {
            return None;
        }
        j.class_order
            .iter()
            .filter_map(|&c| j.classes.get(c))
            .filter_map(|c| c.ready.first())
            .take(NEVER_FITS_CLASSES)
            .find_map(|&t| self.unserved(j, TaskId::new(t)))
    }

    /// What holds a running job's ready tasks back, other than their size: its tenant's
    /// quota, or its pool's pause.
    fn held_back(&self, j: &Job) -> Option<String> {
        if !j.is_active() {
            return None;
        }
        j.quota_wait
            .clone()
            .or_else(|| j.pool.as_deref().and_then(|p| p.paused.clone()))
    }

    /// A ready task of `j` that no connected worker could take even idle (its resources
    /// exceed every worker's offer), named with what it needs: it waits for a larger worker,
    /// and without this a user saw only "0/1 tasks done". The first such task of the first
    /// [`NEVER_FITS_CLASSES`] classes with ready tasks (a bounded cost per status); with no
    /// worker at all, that none is connected.
    pub(crate) fn never_fits(&self, j: &Job) -> Option<String> {
        let workers = self.workers_map();
        if workers.is_empty() {
            return j.classes.iter().any(|c| !c.ready.is_empty()).then(|| {
                match self.capacity_note() {
                    Some(note) => format!("no worker is connected; {note}"),
                    None => "no worker is connected".to_string(),
                }
            });
        }
        for c in j
            .class_order
            .iter()
            .filter_map(|&c| j.classes.get(c))
            .filter(|c| !c.ready.is_empty())
            .take(NEVER_FITS_CLASSES)
        {
            let t = TaskId::new(*c.ready.first()?);
            let inst = j.graph.task(t);
            let options: Vec<&Resources> = match &inst.kind {
                flotilla_core::TaskKind::Variants(vs) => vs.iter().map(|v| &v.resources).collect(),
                _ => vec![&inst.resources],
            };
            if workers
                .values()
                .any(|w| options.iter().any(|r| w.fits_total(r)))
            {
                // A gang starts all its members at once: they must fit side by side.
                if let Some(g) = inst.gang.as_ref().filter(|g| g.size > 1) {
                    let room = workers
                        .values()
                        .map(|w| copies(w.ledger_cap(), &inst.resources))
                        .fold(0u64, u64::saturating_add);
                    if room < u64::from(g.size) {
                        return Some(format!(
                            "the gang of task {} needs {} members of {} at once: the connected \
                             workers hold {room}",
                            inst.name, g.size, inst.resources
                        ));
                    }
                }
                continue;
            }
            let needs = options
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" or ");
            let offers = {
                let mut seen: Vec<String> = workers
                    .values()
                    .map(|w| w.ledger_cap().to_string())
                    .collect();
                seen.sort_unstable();
                seen.dedup();
                let more = seen.len().saturating_sub(3);
                seen.truncate(3);
                if workers.len() == 1 {
                    return Some(format!(
                        "task {} needs {needs}: the only connected worker offers {}",
                        inst.name, seen[0]
                    ));
                }
                format!(
                    "no connected worker offers that (they offer {}{})",
                    seen.join("; "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                )
            };
            return Some(format!("task {} needs {needs}: {offers}", inst.name));
        }
        None
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
            agreed: j
                .pool
                .as_deref()
                .filter(|_| rt.state == TaskState::Done)
                .and_then(|p| p.agreed.get(&id))
                .map(|(a, _)| a.clone())
                .unwrap_or_default(),
            running_s: rt
                .worker
                .filter(|_| rt.state == TaskState::Running)
                .and_then(|w| self.workers_map().get(&w))
                .and_then(|w| w.slots.get(&(j.tref(id), rt.attempt)))
                .and_then(|s| s.started_at)
                .map(|at| self.now().saturating_sub(at) as f64 / 1000.0),
        }
    }

    /// Each live worker's name and the attempts placed on it (reserved or queued): what
    /// taking it away would preempt (`flotilla server --pod-deletion-cost`).
    pub fn worker_loads(&self) -> Vec<(String, usize)> {
        self.workers_map()
            .values()
            .map(|w| (w.spec.name.clone(), w.slots.len()))
            .collect()
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
                gpus: w
                    .spec
                    .gpus
                    .iter()
                    .map(|g| {
                        format!(
                            "{} ({:.0} GiB)",
                            g.model,
                            g.mem_bytes as f64 / (1u64 << 30) as f64
                        )
                    })
                    .collect(),
                heartbeat_age_s: None,
            })
            .collect()
    }
}

/// Seconds summed from many attempts, rounded to the millisecond the clocks give (a sum of
/// floats reads 12.300000000000002 in `--json`).
fn to_ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// A price in a status document as its text (`cpu=0.02,...`); an older coordinator's
/// micro-credit fields are read too.
mod price_text {
    use flotilla_pool::Price;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(p: &Price, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(p)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Price, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Micro(Price),
        }
        match Either::deserialize(d)? {
            Either::Text(t) => Price::parse(&t).map_err(serde::de::Error::custom),
            Either::Micro(p) => Ok(p),
        }
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Priced {
        #[serde(with = "super::price_text")]
        price: flotilla_pool::Price,
    }

    #[test]
    fn prices_read_as_credits_in_status_documents() {
        let p = flotilla_pool::Price::parse("cpu=0.02,gpu=0.5").unwrap();
        let json = serde_json::to_string(&Priced { price: p }).unwrap();
        assert_eq!(json, r#"{"price":"cpu=0.02,gpu=0.5,mem_gb=0"}"#);
        let back: Priced = serde_json::from_str(&json).unwrap();
        assert_eq!(back.price, p);
        // An older coordinator's document: micro-credits.
        let old: Priced =
            serde_json::from_str(r#"{"price":{"cpu":20000,"gpu":500000,"mem_gb":0}}"#).unwrap();
        assert_eq!(old.price, p);
    }
}
