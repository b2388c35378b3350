//! The allocation queues (`flotilla alloc add`) and their allocations, as the allocator
//! keeps them: in `STATE/allocs.json` (mode 0600, replaced atomically), not in the journal,
//! like the access registry: they change at the pace of a batch queue, and a restarted
//! coordinator must find the allocations it left in the batch system to watch or cancel them.
//!
//! Every change here is pure bookkeeping (the time is given); the allocator
//! ([`super::allocator`]) runs the batch system's commands and reports what they said.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::slurm::BatchState;
use flotilla_sched::alloc::{AllocParams, Fleet, Rule};

/// The file's name inside a server's state directory.
pub const ALLOCS_FILE: &str = "allocs.json";

/// Writes the queues' file through a group of coordinators (see [`Queues::save`]).
pub type Replicator =
    std::sync::Arc<dyn Fn(&[u8]) -> std::result::Result<(), String> + Send + Sync>;

/// Finished allocations a queue keeps for `flotilla alloc info`.
const KEEP_FINISHED: usize = 100;

/// Observed queue waits a queue keeps (their mean is its learned wait).
const KEEP_WAITS: usize = 20;

/// What went wrong with the queues or a request to change them.
#[derive(Debug, Error)]
pub enum AllocError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not one this version reads.
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A refused request (a bad setting).
    #[error("{0}")]
    Refused(String),
    /// No queue has this id.
    #[error("no allocation queue {0} (`flotilla alloc list` shows them)")]
    NoQueue(u32),
}

type Result<T> = std::result::Result<T, AllocError>;

/// A queue's settings (`flotilla alloc add slurm ...`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueSpec {
    /// The batch system: `slurm` or `pbs`.
    pub manager: String,
    /// A name to recognise it by.
    pub name: String,
    /// The partition (Slurm) or queue (PBS; empty: the server's default) its allocations
    /// ask for.
    pub partition: String,
    /// An allocation's time limit, seconds.
    pub time_limit_s: u64,
    /// Workers (nodes) per allocation.
    pub workers_per_alloc: u32,
    /// The most allocations queued and running at once.
    pub max_allocs: u32,
    /// The most allocations waiting in the batch queue at once.
    pub backlog: u32,
    /// Seconds a worker with nothing to run waits before it leaves (giving its node back).
    pub idle_timeout_s: u64,
    /// CPUs one worker offers, if given; else learned from the first to join, or asked of
    /// the batch system (`sinfo`).
    pub cpus_per_worker: Option<f64>,
    /// GPUs one worker offers (tasks asking more do not count toward this queue).
    pub gpus_per_worker: f64,
    /// `predictive` or `reactive` (see [`flotilla_sched::alloc::Rule`]).
    pub rule: String,
    /// Failed submissions or allocations in a row that pause the queue.
    pub max_failures: u32,
    /// The `flotilla` program on the nodes.
    pub worker_program: String,
    /// The coordinator's address as the nodes reach it.
    pub server_address: String,
    /// On the nodes: the workers' folders, the batch scripts, the allocations' logs.
    pub work_dir: String,
    /// The workers' enrolment token (a file in `work_dir`, made for this queue).
    pub token_file: String,
    /// More arguments for `sbatch` (`--account=X`, `--gres=gpu:4`) or `qsub` (`-A X`,
    /// `-l select=1:ncpus=32:ngpus=4`).
    pub sbatch_args: Vec<String>,
    /// More `flotilla worker` arguments.
    pub worker_args: Vec<String>,
}

impl QueueSpec {
    /// Checks the settings a user gave; the error names the flag.
    pub fn check(&self) -> Result<()> {
        let refuse = |m: String| Err(AllocError::Refused(m));
        if self.manager != "slurm" && self.manager != "pbs" {
            return refuse(format!("manager {:?}: `slurm` or `pbs`", self.manager));
        }
        if self.manager == "slurm" && self.partition.trim().is_empty() {
            return refuse("--partition: a Slurm partition is needed".into());
        }
        if self.time_limit_s < 60 {
            return refuse(format!(
                "--time-limit {}s: batch systems count in minutes (at least 1m)",
                self.time_limit_s
            ));
        }
        if self.workers_per_alloc == 0 || self.max_allocs == 0 || self.backlog == 0 {
            return refuse("--workers-per-alloc, --max-allocs and --backlog are at least 1".into());
        }
        if self
            .cpus_per_worker
            .is_some_and(|c| !c.is_finite() || c <= 0.0)
        {
            return refuse("--cpus-per-worker: a positive number".into());
        }
        if !self.gpus_per_worker.is_finite() || self.gpus_per_worker < 0.0 {
            return refuse("--gpus-per-worker: zero or more".into());
        }
        if self.rule_of().is_none() {
            return refuse(format!(
                "--rule {:?}: `predictive` or `reactive`",
                self.rule
            ));
        }
        if self.max_failures == 0 {
            return refuse("--max-failures: at least 1".into());
        }
        if !Path::new(&self.worker_program).is_absolute() {
            return refuse(format!(
                "--worker-program {:?}: an absolute path on the nodes",
                self.worker_program
            ));
        }
        if !Path::new(&self.work_dir).is_absolute() {
            return refuse(format!(
                "--work-dir {:?}: an absolute path on the nodes",
                self.work_dir
            ));
        }
        if self.name.len() > 64 || self.name.chars().any(|c| c.is_control()) {
            return refuse(format!(
                "--name {:?}: at most 64 printable characters",
                self.name
            ));
        }
        Ok(())
    }

    /// Its rule.
    pub fn rule_of(&self) -> Option<Rule> {
        match self.rule.as_str() {
            "predictive" | "" => Some(Rule::Predictive),
            "reactive" => Some(Rule::Reactive),
            _ => None,
        }
    }
}

/// Where an allocation stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum AllocState {
    /// Waiting in the batch queue, with the batch system's reason.
    Queued {
        /// Why it waits (`Priority`, `Resources`...).
        reason: String,
    },
    /// Its nodes are up.
    Running,
    /// Ended: its workers left (idle, or its time limit near), or it completed.
    Ended,
    /// Failed, or ended by the batch system (time limit, node failure), with why.
    Failed {
        /// The batch system's state and reason, or ours.
        reason: String,
    },
    /// Cancelled by the allocator (no longer needed while queued, or the queue removed).
    Cancelled,
}

impl AllocState {
    /// Queued or running.
    pub fn is_live(&self) -> bool {
        matches!(self, AllocState::Queued { .. } | AllocState::Running)
    }
}

/// One allocation: a batch job that starts `workers_per_alloc` workers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// The batch system's job id.
    pub id: String,
    /// Its job name (its workers are named `NAME-ID-NODE`).
    pub name: String,
    /// When it was submitted (seconds since the Unix epoch).
    pub submitted_at: u64,
    /// When it was first seen running.
    pub started_at: Option<u64>,
    /// When it was first seen ended.
    pub ended_at: Option<u64>,
    /// Where it stands.
    #[serde(flatten)]
    pub state: AllocState,
    /// Its workers connected now (names).
    #[serde(default)]
    pub workers: Vec<String>,
    /// Its workers that ever connected.
    #[serde(default)]
    pub workers_seen: u32,
}

impl Allocation {
    /// Its log file (`sbatch --output`, written on the nodes).
    pub fn log(&self, work_dir: &str) -> String {
        format!("{work_dir}/{}-{}.log", self.name, self.id)
    }
}

/// One queue and its allocations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    /// Its id (`flotilla alloc info ID`).
    pub id: u32,
    /// Its settings.
    pub spec: QueueSpec,
    /// The id of its workers' enrolment token (revoked when it is removed).
    pub token_id: String,
    /// Why it is paused (by `flotilla alloc pause`, or after failures in a row); `None`:
    /// active.
    pub paused: Option<String>,
    /// Failed submissions or allocations in a row.
    pub failures: u32,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Its allocations, live ones and the last finished ones.
    pub allocations: Vec<Allocation>,
    /// Observed waits in the batch queue, seconds (the last few).
    pub waits_s: Vec<f64>,
    /// What a worker of this queue offered when one joined: CPUs.
    pub learned_cpus: Option<f64>,
    /// ... and its hardware class.
    pub learned_hw: Option<String>,
    /// Allocations submitted so far (names the next batch script).
    pub submitted: u64,
    /// The tasks waiting that need more time than one of its allocations offers (learned
    /// from attempts preempted at their allocation's end with no checkpoint): it asks for
    /// no allocation for them. `None`: no such task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub too_long: Option<String>,
}

impl Queue {
    /// The job name of its allocations (its workers are `NAME-JOBID-NODE`).
    pub fn job_name(&self) -> String {
        format!("flotilla-q{}", self.id)
    }

    /// CPUs one of its workers offers: given, learned, or 1 until known.
    pub fn cpus_per_worker(&self) -> f64 {
        self.spec
            .cpus_per_worker
            .or(self.learned_cpus)
            .unwrap_or(1.0)
    }

    /// The seconds one of its workers has for tasks: its `--time-limit` in an allocation
    /// ([`super::slurm::worker_time_limit`]) less its grace (`--grace` among the worker
    /// arguments, or the default) and the time it starts leaving before
    /// ([`crate::worker::LEAVE_EARLY`]).
    pub fn task_time_s(&self) -> f64 {
        let args = &self.spec.worker_args;
        let grace = args
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a.strip_prefix("--grace") {
                Some("") => args.get(i + 1).map(String::as_str),
                Some(v) => v.strip_prefix('='),
                None => None,
            })
            .next_back()
            .and_then(|v| flotilla_core::duration::parse_duration(v).ok())
            .unwrap_or(crate::worker::DEFAULT_GRACE);
        let limit = std::time::Duration::from_secs(self.spec.time_limit_s);
        super::slurm::worker_time_limit(limit)
            .saturating_sub(grace + crate::worker::LEAVE_EARLY)
            .as_secs_f64()
    }

    /// Its settings as the policy reads them.
    pub fn params(&self) -> AllocParams {
        AllocParams {
            workers_per_alloc: self.spec.workers_per_alloc,
            cpus_per_worker: self.cpus_per_worker(),
            max_allocs: self.spec.max_allocs,
            backlog: self.spec.backlog,
            time_limit_s: self.spec.time_limit_s as f64,
        }
    }

    /// Its learned wait in the batch queue (the mean of the last observed), seconds; 0
    /// until one has started.
    pub fn queue_wait_s(&self) -> f64 {
        if self.waits_s.is_empty() {
            0.0
        } else {
            self.waits_s.iter().sum::<f64>() / self.waits_s.len() as f64
        }
    }

    /// Its allocations as the policy sees them at `now`.
    pub fn fleet(&self, now: u64) -> Fleet {
        let mut fleet = Fleet::default();
        for a in &self.allocations {
            match a.state {
                AllocState::Queued { .. } => fleet.queued += 1,
                AllocState::Running => {
                    let started = a.started_at.unwrap_or(a.submitted_at);
                    let end = started + self.spec.time_limit_s;
                    fleet.running_left_s.push(end.saturating_sub(now) as f64);
                }
                _ => {}
            }
        }
        fleet
    }

    /// Its live allocations' ids.
    pub fn live(&self) -> Vec<String> {
        self.allocations
            .iter()
            .filter(|a| a.state.is_live())
            .map(|a| a.id.clone())
            .collect()
    }

    /// Queued allocations to cancel, the last submitted first (they would start last).
    pub fn newest_queued(&self, n: u32) -> Vec<String> {
        self.allocations
            .iter()
            .rev()
            .filter(|a| matches!(a.state, AllocState::Queued { .. }))
            .take(n as usize)
            .map(|a| a.id.clone())
            .collect()
    }

    /// A failure (a refused submission, an allocation that failed or brought no worker):
    /// counted, and the queue pauses at `max_failures` in a row.
    pub fn failed(&mut self, why: String) {
        self.failures += 1;
        if self.failures >= self.spec.max_failures && self.paused.is_none() {
            self.paused = Some(match self.failures {
                1 => format!("it failed: {why}"),
                n => format!("{n} failures in a row; the last: {why}"),
            });
        }
        self.last_error = Some(why);
    }

    /// An allocation submitted at `now` as `id`.
    pub fn submitted(&mut self, id: String, now: u64) {
        self.submitted += 1;
        self.allocations.push(Allocation {
            id,
            name: self.job_name(),
            submitted_at: now,
            started_at: None,
            ended_at: None,
            state: AllocState::Queued {
                reason: String::new(),
            },
            workers: Vec::new(),
            workers_seen: 0,
        });
    }

    /// What the batch system says of allocation `id` at `now`. Returns a line for the log
    /// when its state changed.
    pub fn observe(&mut self, id: &str, seen: BatchState, now: u64) -> Option<String> {
        let a = self.allocations.iter_mut().find(|a| a.id == id)?;
        if !a.state.is_live() {
            return None;
        }
        let before = a.state.clone();
        let mut failure = None;
        match seen {
            BatchState::Queued(reason) => a.state = AllocState::Queued { reason },
            BatchState::Running => {
                if a.started_at.is_none() {
                    a.started_at = Some(now);
                    self.waits_s.push(now.saturating_sub(a.submitted_at) as f64);
                    if self.waits_s.len() > KEEP_WAITS {
                        self.waits_s.remove(0);
                    }
                }
                a.state = AllocState::Running;
            }
            BatchState::Ended => {
                a.ended_at = Some(now);
                a.state = AllocState::Ended;
            }
            BatchState::Failed(reason) => {
                a.ended_at = Some(now);
                // One that never ran, or whose workers never came, is a failure of the
                // queue's request; one cut by its time limit after working is not.
                if a.workers_seen == 0 {
                    failure = Some(format!(
                        "allocation {}: {reason} (its log: {})",
                        a.id,
                        a.log(&self.spec.work_dir)
                    ));
                }
                a.state = AllocState::Failed { reason };
            }
        }
        let changed = a.state != before;
        let line = changed.then(|| format!("allocation {} is {}", a.id, describe(&a.state)));
        if let Some(f) = failure {
            self.failed(f);
        }
        self.trim();
        line
    }

    /// Allocation `id` cancelled by the allocator at `now`.
    pub fn cancelled(&mut self, id: &str, now: u64) {
        if let Some(a) = self.allocations.iter_mut().find(|a| a.id == id) {
            if a.state.is_live() {
                a.state = AllocState::Cancelled;
                a.ended_at = Some(now);
            }
        }
        self.trim();
    }

    /// The workers connected now (names, CPUs, hardware class): each allocation's, and
    /// what the first tells of the queue's workers. A worker counts as a success of the
    /// queue (its failures in a row end).
    pub fn note_workers(&mut self, workers: &[(String, f64, String)]) {
        for a in self.allocations.iter_mut() {
            let prefix = format!("{}-{}-", a.name, a.id);
            let now: Vec<String> = workers
                .iter()
                .filter(|(n, _, _)| n.starts_with(&prefix))
                .map(|(n, _, _)| n.clone())
                .collect();
            let new = now.iter().filter(|n| !a.workers.contains(n)).count() as u32;
            a.workers_seen += new;
            if new > 0 {
                self.failures = 0;
            }
            if let Some((_, cpus, hw)) = workers.iter().find(|(n, _, _)| n.starts_with(&prefix)) {
                self.learned_cpus = Some(*cpus);
                self.learned_hw = Some(hw.clone());
            }
            a.workers = now;
        }
    }

    /// Keeps the live allocations and the last [`KEEP_FINISHED`] finished ones.
    fn trim(&mut self) {
        let finished = self
            .allocations
            .iter()
            .filter(|a| !a.state.is_live())
            .count();
        let mut drop = finished.saturating_sub(KEEP_FINISHED);
        self.allocations.retain(|a| {
            if drop > 0 && !a.state.is_live() {
                drop -= 1;
                false
            } else {
                true
            }
        });
    }
}

/// `queued (Priority)`, `running`, `failed (TIMEOUT)`...
pub fn describe(s: &AllocState) -> String {
    match s {
        AllocState::Queued { reason } if !reason.is_empty() && reason != "None" => {
            format!("queued ({reason})")
        }
        AllocState::Queued { .. } => "queued".into(),
        AllocState::Running => "running".into(),
        AllocState::Ended => "ended".into(),
        AllocState::Failed { reason } => format!("failed ({reason})"),
        AllocState::Cancelled => "cancelled".into(),
    }
}

/// The queues, as stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Queues {
    /// The id of the next queue made (ids are never reused).
    pub next_id: u32,
    /// By id.
    pub queues: BTreeMap<u32, Queue>,
}

impl Queues {
    /// Reads `STATE/allocs.json` (none yet: no queues).
    pub fn load(state_dir: &Path) -> Result<Queues> {
        let path = state_dir.join(ALLOCS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| AllocError::Corrupt {
                path: path.display().to_string(),
                message: format!("not an allocation-queue file this version reads: {e}"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Queues {
                next_id: 1,
                queues: BTreeMap::new(),
            }),
            Err(e) => Err(AllocError::Io {
                path: path.display().to_string(),
                source: e,
            }),
        }
    }

    /// Writes them to `STATE/allocs.json`, replacing it atomically; in a group, through
    /// `replicate` (which writes it on every node once the group has committed it).
    pub fn save(&self, state_dir: &Path, replicate: Option<&Replicator>) -> Result<()> {
        let path = state_dir.join(ALLOCS_FILE);
        let tmp: PathBuf = state_dir.join(format!("{ALLOCS_FILE}.tmp"));
        let io = |p: &Path, e: std::io::Error| AllocError::Io {
            path: p.display().to_string(),
            source: e,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| AllocError::Corrupt {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        if let Some(r) = replicate {
            return r(&bytes).map_err(|e| io(&path, std::io::Error::other(e)));
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(&tmp, e))?;
        f.write_all(&bytes).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }

    /// Adds a queue; its id.
    pub fn add(&mut self, spec: QueueSpec, token_id: String) -> u32 {
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.queues.insert(
            id,
            Queue {
                id,
                spec,
                token_id,
                paused: None,
                failures: 0,
                last_error: None,
                allocations: Vec::new(),
                waits_s: Vec::new(),
                learned_cpus: None,
                learned_hw: None,
                submitted: 0,
                too_long: None,
            },
        );
        id
    }

    /// Queue `id`, or an error naming it.
    pub fn get_mut(&mut self, id: u32) -> Result<&mut Queue> {
        self.queues.get_mut(&id).ok_or_else(|| no_queue(id))
    }

    /// Queue `id`, or an error naming it.
    pub fn get(&self, id: u32) -> Result<&Queue> {
        self.queues.get(&id).ok_or_else(|| no_queue(id))
    }
}

fn no_queue(id: u32) -> AllocError {
    AllocError::NoQueue(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> QueueSpec {
        QueueSpec {
            manager: "slurm".into(),
            name: "cpu".into(),
            partition: "debug".into(),
            time_limit_s: 3600,
            workers_per_alloc: 2,
            max_allocs: 4,
            backlog: 2,
            idle_timeout_s: 300,
            cpus_per_worker: None,
            gpus_per_worker: 0.0,
            rule: "predictive".into(),
            max_failures: 3,
            worker_program: "/usr/bin/flotilla".into(),
            server_address: "head:7070".into(),
            work_dir: "/scratch/f".into(),
            token_file: "/scratch/f/worker.token".into(),
            sbatch_args: Vec::new(),
            worker_args: Vec::new(),
        }
    }

    #[test]
    fn a_worker_has_its_time_limit_less_its_grace_and_the_leaving_for_tasks() {
        let mut qs = Queues::default();
        let mut with = |args: &[&str], limit: u64| {
            let mut sp = spec();
            sp.time_limit_s = limit;
            sp.worker_args = args.iter().map(|a| a.to_string()).collect();
            let id = qs.add(sp, "t".into());
            qs.get(id).expect("added").task_time_s()
        };
        // 1 h: the worker's limit is 59 m; less 30 s of default grace and 15 s.
        assert_eq!(with(&[], 3600), 3540.0 - 45.0);
        assert_eq!(with(&["--grace", "2m"], 3600), 3540.0 - 135.0);
        assert_eq!(with(&["--cpus", "1", "--grace=5s"], 3600), 3540.0 - 20.0);
        // 2 min: a quarter inside, 90 s; less 45 s.
        assert_eq!(with(&[], 120), 45.0);
        // Less than the grace: nothing.
        assert_eq!(with(&["--grace", "10m"], 600), 0.0);
    }

    #[test]
    fn settings_are_checked_and_the_error_names_the_flag() {
        assert!(spec().check().is_ok());
        let bad = |f: fn(&mut QueueSpec), flag: &str| {
            let mut s = spec();
            f(&mut s);
            let e = s.check().expect_err("refused").to_string();
            assert!(e.contains(flag), "{e} names {flag}");
        };
        bad(|s| s.partition = " ".into(), "--partition");
        bad(|s| s.time_limit_s = 30, "--time-limit");
        bad(|s| s.max_allocs = 0, "--max-allocs");
        bad(|s| s.cpus_per_worker = Some(-1.0), "--cpus-per-worker");
        bad(|s| s.rule = "eager".into(), "--rule");
        bad(|s| s.worker_program = "flotilla".into(), "--worker-program");
        bad(|s| s.work_dir = "rel".into(), "--work-dir");
        bad(|s| s.manager = "lsf".into(), "`slurm` or `pbs`");
        // PBS has a default queue: none needs naming.
        let mut pbs = spec();
        pbs.manager = "pbs".into();
        pbs.partition = String::new();
        assert!(pbs.check().is_ok());
    }

    #[test]
    fn allocations_move_through_their_states_and_waits_are_learned() {
        let mut qs = Queues::default();
        let id = qs.add(spec(), "tok1".into());
        let q = qs.get_mut(id).expect("made");
        q.submitted("101".into(), 1000);
        q.submitted("102".into(), 1000);
        assert_eq!(q.fleet(1000).queued, 2);
        assert_eq!(q.newest_queued(1), vec!["102".to_string()]);
        let line = q.observe("101", BatchState::Queued("Priority".into()), 1010);
        assert_eq!(line.as_deref(), Some("allocation 101 is queued (Priority)"));
        assert_eq!(
            q.observe("101", BatchState::Running, 1060).as_deref(),
            Some("allocation 101 is running")
        );
        assert_eq!(q.queue_wait_s(), 60.0);
        let f = q.fleet(1100);
        assert_eq!(
            (f.queued, f.running_left_s.clone()),
            (1, vec![3600.0 - 40.0])
        );
        q.note_workers(&[("flotilla-q1-101-0".into(), 8.0, "cpu".into())]);
        assert_eq!(q.learned_cpus, Some(8.0));
        assert_eq!(q.cpus_per_worker(), 8.0);
        q.cancelled("102", 1100);
        q.observe("101", BatchState::Ended, 1200);
        assert!(q.live().is_empty());
        assert_eq!(q.failures, 0);
        assert!(q.paused.is_none());
        // Saved and read back alike.
        let dir = tempfile::tempdir().expect("tmp");
        qs.save(dir.path(), None).expect("saved");
        assert_eq!(Queues::load(dir.path()).expect("read"), qs);
        let mode = std::fs::metadata(dir.path().join(ALLOCS_FILE))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .expect("stat");
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn failures_in_a_row_pause_the_queue_with_the_last_reason_and_a_worker_resets_them() {
        let mut qs = Queues::default();
        let id = qs.add(spec(), "t".into());
        let q = qs.get_mut(id).expect("made");
        q.failed("sbatch: error: invalid partition specified: nope".into());
        q.submitted("7".into(), 0);
        q.observe(
            "7",
            BatchState::Failed("FAILED (NonZeroExitCode)".into()),
            5,
        );
        assert_eq!(q.failures, 2);
        assert!(q.paused.is_none());
        // A worker that came resets the count.
        q.submitted("8".into(), 6);
        q.observe("8", BatchState::Running, 7);
        q.note_workers(&[("flotilla-q1-8-0".into(), 2.0, "cpu".into())]);
        assert_eq!(q.failures, 0);
        // ...and an allocation that worked, then was cut, is not a failure.
        q.observe("8", BatchState::Failed("TIMEOUT".into()), 100);
        assert_eq!(q.failures, 0);
        for _ in 0..3 {
            q.failed("sbatch: error: invalid partition specified: nope".into());
        }
        let why = q.paused.clone().expect("paused");
        assert!(
            why.contains("3 failures in a row") && why.contains("invalid partition"),
            "{why}"
        );
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join(ALLOCS_FILE), b"{ not json").expect("written");
        let e = Queues::load(dir.path()).expect_err("refused").to_string();
        assert!(e.contains(ALLOCS_FILE), "{e}");
        assert_eq!(
            Queues::load(tempfile::tempdir().expect("tmp").path())
                .expect("none")
                .queues
                .len(),
            0
        );
    }
}
