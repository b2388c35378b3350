//! The coordinator's allocator: every few seconds it asks the batch system where each
//! queue's allocations stand, reads the work left from the core, decides with
//! [`flotilla_sched::alloc::decide`], and submits or cancels allocations. The batch system
//! is behind [`BatchSystem`] ([`Slurm`] runs `sbatch`, `squeue`, `scontrol`, `scancel`;
//! [`Pbs`] runs `qsub`, `qstat`, `qdel`), so the rounds are tested without one too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::duration::format_duration;

use parking_lot::Mutex;

use super::pbs;
use super::queues::{AllocError, Queue, QueueSpec, Queues};
use super::slurm::{self, BatchQueue, BatchState, WorkerLaunch};
use crate::access::Access;
use crate::state::{WorkLeft, WorkerShape};
use flotilla_sched::alloc::{decide, mean_width, Demand};

/// How long a batch command may take before it is killed and counted as failed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a running allocation may go without any worker connecting before it is
/// cancelled as failed (a wrong program path, an unreachable coordinator).
const CONNECT_TIMEOUT_S: u64 = 300;

/// The tasks left the predictive rule lays out, at most (beyond, the work is long enough
/// that the queue's caps decide).
pub const LEFT_LIMIT: usize = 20_000;

/// A task's time when the performance model knows nothing of it yet, seconds.
pub const DEFAULT_TASK_S: f64 = 60.0;

/// The window a new allocation serves, past its wait, seconds (at least).
const WINDOW_S: f64 = 300.0;

/// What the allocator needs of a batch system.
pub trait BatchSystem: Send + Sync {
    /// The batch script of one allocation of `queue`, named `name`, whose nodes each run
    /// one worker as `launch` says.
    fn script(&self, queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String;
    /// Submits `script` with `args` before it; the job id, or the batch system's message.
    fn submit(&self, script: &Path, args: &[String]) -> Result<String, String>;
    /// Where jobs `ids` stand (those it no longer knows are missing from the map: they
    /// ended). An error when it cannot tell (its controller does not answer): the
    /// allocations keep the state last seen.
    fn states(&self, ids: &[String]) -> Result<HashMap<String, BatchState>, String>;
    /// Cancels job `id`.
    fn cancel(&self, id: &str) -> Result<(), String>;
    /// The CPUs of a node of `partition` (Slurm) or of any node (PBS), if it says.
    fn node_cpus(&self, partition: &str) -> Option<f64>;
    /// The partitions (queues) there are, when it can tell; `None`: it cannot (nothing is
    /// checked).
    fn partitions(&self) -> Option<Vec<String>> {
        None
    }
}

/// The batch systems a coordinator's queues may use, by [`QueueSpec::manager`].
#[derive(Clone)]
pub struct Systems {
    /// `slurm`.
    pub slurm: Arc<dyn BatchSystem>,
    /// `pbs`.
    pub pbs: Arc<dyn BatchSystem>,
}

impl Systems {
    /// Slurm's and PBS's commands on `PATH`.
    pub fn on_path() -> Systems {
        Systems {
            slurm: Arc::new(Slurm::default()),
            pbs: Arc::new(Pbs::default()),
        }
    }

    /// One system for every manager (tests).
    pub fn only(system: Arc<dyn BatchSystem>) -> Systems {
        Systems {
            slurm: system.clone(),
            pbs: system,
        }
    }

    /// The system of `manager` (checked by [`QueueSpec::check`]).
    pub fn of(&self, manager: &str) -> &Arc<dyn BatchSystem> {
        if manager == "pbs" {
            &self.pbs
        } else {
            &self.slurm
        }
    }
}

/// Slurm through its commands (with the server's `SLURM_CONF`).
#[derive(Debug, Default)]
pub struct Slurm {
    /// Where its commands are (`None`: on `PATH`).
    pub bin_dir: Option<PathBuf>,
}

impl Slurm {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        run(&command_path(self.bin_dir.as_deref(), program), args)
    }
}

/// `program` in `bin_dir`, or as found on `PATH`.
fn command_path(bin_dir: Option<&Path>, program: &str) -> String {
    match bin_dir {
        Some(dir) => dir.join(program).display().to_string(),
        None => program.to_string(),
    }
}

/// What a command did: whether it succeeded, its stdout and its stderr.
struct Output {
    ok: bool,
    status: String,
    stdout: String,
    stderr: String,
}

/// Runs `program args` (in `cwd`, if given) within [`COMMAND_TIMEOUT`]; an error only when
/// it could not be run or did not end in time.
fn run_in(program: &str, args: &[&str], cwd: Option<&Path>) -> Result<Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{program} did not answer within {}s",
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{program}: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    Ok(Output {
        ok: out.status.success(),
        status: out.status.to_string(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

impl Output {
    /// Its stdout if it succeeded, else a message with its stderr.
    fn into_result(self, program: &str) -> Result<String, String> {
        if self.ok {
            return Ok(self.stdout);
        }
        let text = self.stderr.trim();
        Err(if text.is_empty() {
            // Some (Slurm's PBS wrappers) say why on stdout.
            let out = self.stdout.trim();
            if out.is_empty() {
                format!("{program} exited with {}", self.status)
            } else {
                out.lines().map(str::trim).collect::<Vec<_>>().join("; ")
            }
        } else {
            text.lines().collect::<Vec<_>>().join("; ")
        })
    }
}

/// Runs `program args`; its stdout, or a message with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    run_in(program, args, None)?.into_result(program)
}

impl BatchSystem for Slurm {
    fn script(&self, queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String {
        slurm::batch_script(queue, launch, name)
    }

    fn submit(&self, script: &Path, args: &[String]) -> Result<String, String> {
        let script = script.display().to_string();
        let mut all: Vec<&str> = vec!["--parsable"];
        all.extend(args.iter().map(String::as_str));
        all.push(&script);
        let out = self.run("sbatch", &all)?;
        slurm::parse_sbatch(&out).ok_or_else(|| format!("sbatch printed no job id: {out:?}"))
    }

    fn states(&self, ids: &[String]) -> Result<HashMap<String, BatchState>, String> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let list = ids.join(",");
        // squeue fails when it knows none of them ("Invalid job id"): they ended. Any other
        // failure (the controller down) says nothing of them: they keep their state.
        let mut states = match self.run("squeue", &["-h", "-o", "%i|%T|%r", "-j", &list]) {
            Ok(out) => slurm::parse_squeue(&out),
            Err(e) if e.contains("Invalid job id") => HashMap::new(),
            Err(e) => return Err(e),
        };
        let missing: Vec<&String> = ids.iter().filter(|id| !states.contains_key(*id)).collect();
        for id in missing {
            // Ended jobs: scontrol keeps them for MinJobAge; sacct where accounting is on.
            let seen = self
                .run("scontrol", &["show", "job", "-o", id])
                .ok()
                .and_then(|out| slurm::parse_scontrol(&out))
                .or_else(|| {
                    self.run(
                        "sacct",
                        &["-n", "-P", "-X", "-o", "JobIDRaw,State,Reason", "-j", id],
                    )
                    .ok()
                    .and_then(|out| slurm::parse_sacct(&out).remove(id.as_str()))
                });
            if let Some(s) = seen {
                states.insert(id.clone(), s);
            }
        }
        Ok(states)
    }

    fn cancel(&self, id: &str) -> Result<(), String> {
        self.run("scancel", &[id]).map(|_| ())
    }

    fn node_cpus(&self, partition: &str) -> Option<f64> {
        self.run("sinfo", &["-h", "-p", partition, "-o", "%c"])
            .ok()
            .and_then(|out| slurm::parse_sinfo_cpus(&out))
    }

    fn partitions(&self) -> Option<Vec<String>> {
        let out = self.run("sinfo", &["-h", "-o", "%P"]).ok()?;
        // The default partition is marked with `*`.
        let mut names: Vec<String> = out
            .lines()
            .map(|l| l.trim().trim_end_matches('*').to_string())
            .filter(|l| !l.is_empty())
            .collect();
        names.dedup();
        (!names.is_empty()).then_some(names)
    }
}

/// PBS (OpenPBS, PBS Professional, Torque, or Slurm's PBS wrappers) through its commands:
/// `qsub`, `qstat -f` (then `qstat -x -f` for jobs that left the live list), `qdel`,
/// `pbsnodes -a`.
#[derive(Debug, Default)]
pub struct Pbs {
    /// Where its commands are (`None`: on `PATH`).
    pub bin_dir: Option<PathBuf>,
}

impl Pbs {
    fn program(&self, name: &str) -> String {
        command_path(self.bin_dir.as_deref(), name)
    }

    /// `qstat ARGS IDS`: the states it printed, or an error when it could not tell (a
    /// server that does not answer, rather than jobs it no longer knows).
    fn qstat(&self, args: &[&str], ids: &[String]) -> Result<HashMap<String, BatchState>, String> {
        let program = self.program("qstat");
        let mut all: Vec<&str> = args.to_vec();
        all.extend(ids.iter().map(String::as_str));
        let out = run_in(&program, &all, None)?;
        let states = pbs::parse_qstat(&out.stdout);
        if out.ok || pbs::only_unknown_jobs(&out.stderr) {
            Ok(states)
        } else {
            out.into_result("qstat").map(|_| states)
        }
    }
}

impl BatchSystem for Pbs {
    fn script(&self, queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String {
        pbs::batch_script(queue, launch, name)
    }

    fn submit(&self, script: &Path, args: &[String]) -> Result<String, String> {
        let path = script.display().to_string();
        let mut all: Vec<&str> = pbs::QSUB_ARGS.to_vec();
        all.extend(args.iter().map(String::as_str));
        all.push(&path);
        // In the script's folder: whatever PBS writes there by default lands beside it.
        let out = run_in(&self.program("qsub"), &all, script.parent())?.into_result("qsub")?;
        pbs::parse_qsub(&out).ok_or_else(|| format!("qsub printed no job id: {out:?}"))
    }

    fn states(&self, ids: &[String]) -> Result<HashMap<String, BatchState>, String> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let printed = self.qstat(&["-f"], ids)?;
        let mut states = HashMap::new();
        let mut missing = Vec::new();
        for id in ids {
            match printed.iter().find(|(p, _)| pbs::same_job(id, p)) {
                Some((_, s)) => {
                    states.insert(id.clone(), s.clone());
                }
                None => missing.push(id.clone()),
            }
        }
        // OpenPBS drops finished jobs from the live list: its history has their exit
        // status. Torque reads `-x` as XML and the wrappers refuse it: nothing parses, and
        // the jobs count as ended, as any job the batch system no longer knows.
        if !missing.is_empty() {
            if let Ok(history) = self.qstat(&["-x", "-f"], &missing) {
                for id in &missing {
                    if let Some((_, s)) = history.iter().find(|(p, _)| pbs::same_job(id, p)) {
                        states.insert(id.clone(), s.clone());
                    }
                }
            }
        }
        Ok(states)
    }

    fn cancel(&self, id: &str) -> Result<(), String> {
        run(&self.program("qdel"), &[id]).map(|_| ())
    }

    fn node_cpus(&self, _queue: &str) -> Option<f64> {
        run(&self.program("pbsnodes"), &["-a"])
            .ok()
            .and_then(|out| pbs::parse_pbsnodes_cpus(&out))
    }
}

/// What the core tells the allocator at each round.
#[derive(Clone, Debug, Default)]
pub struct CoreView {
    /// The work left for each queue's workers (by queue id).
    pub work: HashMap<u32, WorkLeft>,
    /// The live workers: name, CPUs, hardware class.
    pub workers: Vec<(String, f64, String)>,
}

/// The allocation queues of one coordinator and what acts on them.
pub struct Allocator {
    state_dir: PathBuf,
    queues: Mutex<Queues>,
    /// In a group: how the queues' file reaches every node.
    replicate: Mutex<Option<super::queues::Replicator>>,
    systems: Systems,
    access: Arc<Access>,
    /// The `flotilla` program the workers run when `--worker-program` is not given.
    pub default_program: String,
    /// The coordinator's address for workers when `--server-address` is not given.
    pub default_server: String,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Allocator {
    /// Reads the queues from `state_dir`.
    pub fn open(
        state_dir: &Path,
        systems: Systems,
        access: Arc<Access>,
        default_program: String,
        default_server: String,
    ) -> Result<Allocator, AllocError> {
        Ok(Allocator {
            state_dir: state_dir.to_path_buf(),
            queues: Mutex::new(Queues::load(state_dir)?),
            replicate: Mutex::new(None),
            systems,
            access,
            default_program,
            default_server,
        })
    }

    /// In a group of coordinators: every change is written through `r` (to every node's
    /// `allocs.json`, once committed), so the next leader knows the queues and their
    /// allocations.
    pub fn replicate_through(&self, r: super::queues::Replicator) {
        *self.replicate.lock() = Some(r);
    }

    fn save(&self, queues: &Queues) -> Result<(), AllocError> {
        let r = self.replicate.lock().clone();
        queues.save(&self.state_dir, r.as_ref())
    }

    /// Whether there is any queue (else rounds do nothing).
    pub fn is_empty(&self) -> bool {
        self.queues.lock().queues.is_empty()
    }

    /// Adds a queue: fills the defaults, checks the settings, makes its work folder and its
    /// workers' enrolment token there. The queue as stored.
    pub fn add(&self, mut spec: QueueSpec) -> Result<Queue, AllocError> {
        if spec.worker_program.is_empty() {
            spec.worker_program = self.default_program.clone();
        }
        if spec.server_address.is_empty() {
            spec.server_address = self.default_server.clone();
        }
        let mut queues = self.queues.lock();
        let id = queues.next_id.max(1);
        if spec.work_dir.is_empty() {
            spec.work_dir = self
                .state_dir
                .join("alloc")
                .join(format!("q{id}"))
                .display()
                .to_string();
        }
        spec.token_file = format!("{}/worker.token", spec.work_dir);
        spec.check()?;
        // A partition Slurm does not have fails every request: said now (it was accepted,
        // and each allocation failed until the queue paused).
        if !spec.partition.trim().is_empty() {
            if let Some(known) = self.systems.of(&spec.manager).partitions() {
                if !known.iter().any(|p| p == spec.partition.trim()) {
                    return Err(AllocError::Refused(format!(
                        "--partition {}: {} has no such partition (it has: {})",
                        spec.partition,
                        spec.manager,
                        known.join(", ")
                    )));
                }
            }
        }
        let dir = Path::new(&spec.work_dir);
        std::fs::create_dir_all(dir).map_err(|e| AllocError::Io {
            path: format!("--work-dir {}", dir.display()),
            source: e,
        })?;
        let (info, token) = self
            .access
            .add_worker_token(&format!("alloc-q{id}"))
            .map_err(|e| AllocError::Refused(e.to_string()))?;
        if let Err(e) = write_private(Path::new(&spec.token_file), &token) {
            let _ = self.access.revoke(&info.id);
            return Err(e);
        }
        let token_id = info.id.clone();
        // What its workers will offer, as the batch system says, shown from the start (it
        // read "not known yet" until the first round).
        let cpus = if spec.cpus_per_worker.is_none() {
            self.systems.of(&spec.manager).node_cpus(&spec.partition)
        } else {
            None
        };
        let id = queues.add(spec, info.id);
        if let Ok(q) = queues.get_mut(id) {
            q.learned_cpus = cpus;
        }
        if let Err(e) = self.save(&queues) {
            queues.queues.remove(&id);
            let _ = self.access.revoke(&token_id);
            return Err(e);
        }
        tracing::info!(queue = id, "allocation queue added");
        queues.get(id).cloned()
    }

    /// Every queue.
    pub fn list(&self) -> Vec<Queue> {
        self.queues.lock().queues.values().cloned().collect()
    }

    /// One queue.
    pub fn info(&self, id: u32) -> Result<Queue, AllocError> {
        self.queues.lock().get(id).cloned()
    }

    /// Pauses queue `id` (nothing more is submitted; what runs goes on).
    pub fn pause(&self, id: u32, reason: &str) -> Result<Queue, AllocError> {
        self.change(id, |q| {
            q.paused = Some(if reason.trim().is_empty() {
                "paused by `flotilla alloc pause`".into()
            } else {
                reason.trim().to_string()
            });
        })
    }

    /// Resumes queue `id` (its failures in a row start again from none).
    pub fn resume(&self, id: u32) -> Result<Queue, AllocError> {
        if self.queues.lock().get(id)?.paused.is_none() {
            return Err(AllocError::Refused(format!(
                "allocation queue {id} is not paused: there is nothing to resume"
            )));
        }
        self.change(id, |q| {
            q.paused = None;
            q.failures = 0;
        })
    }

    /// Removes queue `id`: cancels its live allocations (their workers get SIGTERM from
    /// Slurm and drain) and revokes its workers' token.
    pub fn remove(&self, id: u32) -> Result<Queue, AllocError> {
        let mut queues = self.queues.lock();
        let q = queues.get(id)?.clone();
        let mut left = Vec::new();
        for a in q.live() {
            if let Err(e) = self.systems.of(&q.spec.manager).cancel(&a) {
                left.push(format!("{a} ({e})"));
            }
        }
        if !left.is_empty() {
            return Err(AllocError::Refused(format!(
                "queue {id} kept: could not cancel allocation(s) {}",
                left.join(", ")
            )));
        }
        queues.queues.remove(&id);
        self.save(&queues)?;
        let _ = self.access.revoke(&q.token_id);
        tracing::info!(queue = id, "allocation queue removed");
        Ok(q)
    }

    fn change(&self, id: u32, f: impl FnOnce(&mut Queue)) -> Result<Queue, AllocError> {
        let mut queues = self.queues.lock();
        let before = queues.clone();
        f(queues.get_mut(id)?);
        if let Err(e) = self.save(&queues) {
            *queues = before;
            return Err(e);
        }
        queues.get(id).cloned()
    }

    /// The paused queues, for a job that waits with no worker connected: "allocation queue
    /// 1 is paused: REASON (`flotilla alloc list`)"; `None` when none is.
    pub fn paused_note(&self) -> Option<String> {
        let queues = self.queues.lock();
        let paused: Vec<String> = queues
            .queues
            .values()
            .filter_map(|q| {
                q.paused
                    .as_ref()
                    .map(|why| format!("allocation queue {} is paused: {why}", q.id))
            })
            .collect();
        (!paused.is_empty()).then(|| {
            format!(
                "{} (`flotilla alloc list`; `flotilla alloc resume ID` once fixed)",
                paused.join("; ")
            )
        })
    }

    /// The shapes of the queues' workers, for the core's [`CoreView`].
    pub fn shapes(&self) -> Vec<(u32, WorkerShape)> {
        self.queues
            .lock()
            .queues
            .values()
            .map(|q| {
                (
                    q.id,
                    WorkerShape {
                        cpus: q.cpus_per_worker(),
                        gpus: q.spec.gpus_per_worker,
                        hw_class: q.learned_hw.clone(),
                        time_s: Some(q.task_time_s()),
                    },
                )
            })
            .collect()
    }

    /// One round: watch, decide, submit, cancel; saves what changed. Blocking (it runs the
    /// batch system's commands).
    pub fn round(&self, view: &CoreView) {
        let now = unix_now();
        let mut queues = self.queues.lock();
        let before = queues.clone();
        for q in queues.queues.values_mut() {
            self.round_one(q, view, now);
        }
        if *queues != before {
            if let Err(e) = self.save(&queues) {
                tracing::error!("allocation queues not saved: {e}");
            }
        }
    }

    fn round_one(&self, q: &mut Queue, view: &CoreView, now: u64) {
        let system = self.systems.of(&q.spec.manager).clone();
        // Where its allocations stand.
        let live = q.live();
        if !live.is_empty() {
            match system.states(&live) {
                Ok(states) => {
                    for id in &live {
                        let mut seen = states.get(id).cloned().unwrap_or(BatchState::Ended);
                        // Waiting for something waiting cannot bring (a request over the
                        // partition's or the account's limits): a failure, given back now
                        // (it stayed queued for good, the queue never pausing).
                        if let BatchState::Queued(reason) = &seen {
                            if let Some(why) = never_starts(reason) {
                                let _ = system.cancel(id);
                                seen = BatchState::Failed(why);
                            }
                        }
                        if let Some(line) = q.observe(id, seen, now) {
                            tracing::info!(queue = q.id, "{line}");
                        }
                    }
                }
                Err(e) => tracing::warn!(queue = q.id, "cannot read allocations' states: {e}"),
            }
        }
        q.note_workers(&view.workers);
        // Running ones whose workers never came are given back, as failed.
        let stuck: Vec<String> = q
            .allocations
            .iter()
            .filter(|a| {
                a.state == super::queues::AllocState::Running
                    && a.workers_seen == 0
                    && a.started_at
                        .is_some_and(|s| now.saturating_sub(s) >= CONNECT_TIMEOUT_S)
            })
            .map(|a| a.id.clone())
            .collect();
        for id in stuck {
            let _ = system.cancel(&id);
            // `observe` adds where its log is.
            q.observe(
                &id,
                BatchState::Failed(format!("no worker connected within {CONNECT_TIMEOUT_S}s")),
                now,
            );
        }
        if q.paused.is_some() {
            return;
        }
        if q.spec.cpus_per_worker.is_none() && q.learned_cpus.is_none() {
            q.learned_cpus = system.node_cpus(&q.spec.partition);
        }
        let Some(rule) = q.spec.rule_of() else {
            return;
        };
        let work = view.work.get(&q.id).cloned().unwrap_or_default();
        q.too_long = work.longest.as_ref().map(|(name, needs)| {
            let secs = |s: f64| format_duration(Duration::from_secs(s.ceil() as u64));
            format!(
                "{} task(s) need more than the {} a worker of its allocations has for tasks \
                 (the longest, {name}, is taken to need {}, from an attempt preempted with no \
                 checkpoint), so no allocation is asked for them; give them a checkpoint, or \
                 add a queue with a longer --time-limit",
                work.too_long,
                secs(q.task_time_s()),
                secs(*needs)
            )
        });
        let queue_wait_s = q.queue_wait_s();
        let future_cpus = mean_width(
            &work.left,
            queue_wait_s,
            queue_wait_s + WINDOW_S.max(queue_wait_s),
        );
        let demand = Demand {
            waiting_cpus: work.waiting_cpus,
            future_cpus,
            // Only the work of jobs with a deadline is due by it.
            remaining_cpu_s: work.due_cpu_s,
            deadline_s: work.deadline_s,
            queue_wait_s,
        };
        let d = decide(rule, &q.params(), &q.fleet(now), &demand);
        for _ in 0..d.submit {
            match self.submit(q) {
                Ok(id) => {
                    tracing::info!(queue = q.id, allocation = %id, "allocation submitted");
                    q.submitted(id, now);
                }
                Err(e) => {
                    tracing::warn!(queue = q.id, "allocation refused: {e}");
                    q.failed(e);
                    break;
                }
            }
            if q.paused.is_some() {
                break;
            }
        }
        for id in q.newest_queued(d.cancel_queued) {
            match system.cancel(&id) {
                Ok(()) => {
                    tracing::info!(queue = q.id, allocation = %id, "queued allocation no longer needed: cancelled");
                    q.cancelled(&id, now);
                }
                Err(e) => tracing::warn!(queue = q.id, allocation = %id, "cannot cancel: {e}"),
            }
        }
    }

    /// Writes the next batch script of `q` and submits it.
    fn submit(&self, q: &Queue) -> Result<String, String> {
        let name = q.job_name();
        let system = self.systems.of(&q.spec.manager);
        let sq = BatchQueue {
            partition: q.spec.partition.clone(),
            time_limit: Duration::from_secs(q.spec.time_limit_s),
            workers_per_alloc: q.spec.workers_per_alloc,
            idle_timeout: Duration::from_secs(q.spec.idle_timeout_s),
            cpus_per_worker: q.spec.cpus_per_worker,
        };
        let launch = WorkerLaunch {
            program: q.spec.worker_program.clone(),
            server: q.spec.server_address.clone(),
            token_file: q.spec.token_file.clone(),
            work_dir: q.spec.work_dir.clone(),
            worker_args: q.spec.worker_args.clone(),
        };
        let script = Path::new(&q.spec.work_dir).join(format!("{name}-{}.sh", q.submitted + 1));
        std::fs::write(&script, system.script(&sq, &launch, &name))
            .map_err(|e| format!("{}: {e}", script.display()))?;
        system.submit(&script, &q.spec.sbatch_args)
    }
}

/// Slurm's pending reasons that waiting cannot end (the request exceeds a limit of the
/// partition, the account or the QOS, or asks for what no node has), as a failure's reason.
pub(crate) fn never_starts(reason: &str) -> Option<String> {
    const NEVER: [&str; 12] = [
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidQOS",
        "InvalidAccount",
        "DependencyNeverSatisfied",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
        "AssocMaxCpuPerJobLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "QOSMaxCpuPerJobLimit",
    ];
    let code = reason.trim().trim_matches(|c| c == '(' || c == ')');
    NEVER.contains(&code).then(|| {
        format!(
            "queued for a reason waiting cannot end ({code}: the request exceeds a limit of \
             the partition, account or QOS, or no node has what it asks); cancelled"
        )
    })
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), AllocError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |e| AllocError::Io {
        path: path.display().to_string(),
        source: e,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.write_all(b"\n").map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocState;
    use flotilla_sched::alloc::Left;

    /// A batch system of the test's own: it records what it is asked and answers from a
    /// table the test sets.
    #[derive(Default)]
    struct Fake {
        next: Mutex<u32>,
        refuse: Mutex<Option<String>>,
        states: Mutex<HashMap<String, BatchState>>,
        submitted: Mutex<Vec<(PathBuf, Vec<String>)>>,
        cancelled: Mutex<Vec<String>>,
        down: Mutex<bool>,
    }

    impl BatchSystem for Fake {
        fn script(&self, queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String {
            slurm::batch_script(queue, launch, name)
        }
        fn submit(&self, script: &Path, args: &[String]) -> Result<String, String> {
            if let Some(e) = self.refuse.lock().clone() {
                return Err(e);
            }
            let mut n = self.next.lock();
            *n += 1;
            let id = format!("{}", 100 + *n);
            self.states
                .lock()
                .insert(id.clone(), BatchState::Queued("Priority".into()));
            self.submitted
                .lock()
                .push((script.to_path_buf(), args.to_vec()));
            Ok(id)
        }
        fn states(&self, ids: &[String]) -> Result<HashMap<String, BatchState>, String> {
            if *self.down.lock() {
                return Err("slurm_load_jobs error: Unable to contact slurm controller".into());
            }
            let s = self.states.lock();
            Ok(ids
                .iter()
                .filter_map(|i| s.get(i).map(|x| (i.clone(), x.clone())))
                .collect())
        }
        fn cancel(&self, id: &str) -> Result<(), String> {
            self.cancelled.lock().push(id.to_string());
            self.states
                .lock()
                .insert(id.to_string(), BatchState::Failed("CANCELLED".into()));
            Ok(())
        }
        fn node_cpus(&self, _: &str) -> Option<f64> {
            Some(4.0)
        }
    }

    fn allocator(dir: &Path, fake: Arc<Fake>) -> Allocator {
        let access = Arc::new(Access::open(dir, "admin-token-0123456789").expect("access"));
        Allocator::open(
            dir,
            Systems::only(fake),
            access,
            "/usr/bin/flotilla".into(),
            "head:7070".into(),
        )
        .expect("open")
    }

    fn spec(rule: &str) -> QueueSpec {
        QueueSpec {
            manager: "slurm".into(),
            name: String::new(),
            partition: "debug".into(),
            time_limit_s: 3600,
            workers_per_alloc: 1,
            max_allocs: 3,
            backlog: 2,
            idle_timeout_s: 60,
            cpus_per_worker: None,
            gpus_per_worker: 0.0,
            rule: rule.into(),
            max_failures: 2,
            worker_program: String::new(),
            server_address: String::new(),
            work_dir: String::new(),
            token_file: String::new(),
            sbatch_args: vec!["--account=lab".into()],
            worker_args: Vec::new(),
        }
    }

    fn waiting(queue: u32, cpus: f64) -> CoreView {
        CoreView {
            work: HashMap::from([(
                queue,
                WorkLeft {
                    waiting_cpus: cpus,
                    left: vec![
                        Left {
                            cpus: 1.0,
                            secs: 600.0,
                            preds: Vec::new(),
                        };
                        cpus as usize
                    ],
                    truncated: false,
                    deadline_s: None,
                    due_cpu_s: 0.0,
                    ..WorkLeft::default()
                },
            )]),
            workers: Vec::new(),
        }
    }

    #[test]
    fn waiting_work_submits_allocations_that_start_enrolled_workers() {
        let dir = tempfile::tempdir().expect("tmp");
        let fake = Arc::new(Fake::default());
        let a = allocator(dir.path(), fake.clone());
        let q = a.add(spec("reactive")).expect("added");
        // Its workers' token: in its folder, owner-only, a live worker enrolment token.
        let token = std::fs::read_to_string(&q.spec.token_file).expect("token file");
        assert!(token.trim().starts_with("flt_"), "{token}");
        // Nothing to do: nothing asked.
        a.round(&CoreView::default());
        assert!(fake.submitted.lock().is_empty());
        // 6 CPUs wait; a node has 4 (sinfo): 2 allocations (within the backlog).
        a.round(&waiting(q.id, 6.0));
        let subs = fake.submitted.lock().clone();
        assert_eq!(subs.len(), 2, "{subs:?}");
        assert_eq!(subs[0].1, vec!["--account=lab".to_string()]);
        let script = std::fs::read_to_string(&subs[0].0).expect("script");
        assert!(script.contains("#SBATCH --partition=debug"), "{script}");
        assert!(
            script.contains("/usr/bin/flotilla worker --server head:7070"),
            "{script}"
        );
        // They start; a worker joins; the waits are learned; the queue is saved.
        for id in ["101", "102"] {
            fake.states.lock().insert(id.into(), BatchState::Running);
        }
        let mut view = waiting(q.id, 6.0);
        view.workers = vec![("flotilla-q1-101-0".into(), 4.0, "cpu".into())];
        a.round(&view);
        let q = a.info(q.id).expect("known");
        assert_eq!(
            q.allocations[0].workers,
            vec!["flotilla-q1-101-0".to_string()]
        );
        assert_eq!(q.learned_hw.as_deref(), Some("cpu"));
        let reread = Queues::load(dir.path()).expect("saved");
        assert_eq!(reread.queues[&q.id], q);
    }

    #[test]
    fn tasks_too_long_for_the_queue_ask_for_nothing_and_are_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let fake = Arc::new(Fake::default());
        let a = allocator(dir.path(), fake.clone());
        let q = a.add(spec("predictive")).expect("added");
        let shapes = a.shapes();
        assert_eq!(shapes[0].1.time_s, Some(q.task_time_s()));
        // The core left the task out (it needs 75 minutes; allocations give an hour).
        let mut view = CoreView::default();
        view.work.insert(
            q.id,
            WorkLeft {
                too_long: 1,
                longest: Some(("job-1/sim".into(), 4500.0)),
                ..WorkLeft::default()
            },
        );
        a.round(&view);
        assert!(fake.submitted.lock().is_empty());
        let note = a.info(q.id).expect("q").too_long.expect("a note");
        assert!(
            note.starts_with(&format!(
                "1 task(s) need more than the {} a worker",
                format_duration(Duration::from_secs(q.task_time_s() as u64))
            )) && note.contains("job-1/sim, is taken to need 1h15m"),
            "{note}"
        );
        // Gone once no task is too long.
        a.round(&CoreView::default());
        assert!(a.info(q.id).expect("q").too_long.is_none());
    }

    #[test]
    fn requests_that_can_never_start_are_failures() {
        assert!(
            never_starts("PartitionNodeLimit").is_some_and(|w| w.contains("PartitionNodeLimit"))
        );
        assert!(never_starts("(QOSMaxWallDurationPerJobLimit)").is_some());
        for waits in [
            "Resources",
            "Priority",
            "ReqNodeNotAvail",
            "PartitionDown",
            "",
        ] {
            assert_eq!(never_starts(waits), None, "{waits}");
        }
    }

    #[test]
    fn refused_submissions_pause_the_queue_with_the_reason_until_resumed() {
        let dir = tempfile::tempdir().expect("tmp");
        let fake = Arc::new(Fake::default());
        let a = allocator(dir.path(), fake.clone());
        let q = a.add(spec("predictive")).expect("added");
        *fake.refuse.lock() = Some("sbatch: error: invalid partition specified: debug".into());
        a.round(&waiting(q.id, 2.0));
        assert!(a.info(q.id).expect("q").paused.is_none(), "one failure");
        a.round(&waiting(q.id, 2.0));
        let paused = a.info(q.id).expect("q").paused.expect("paused");
        assert!(paused.contains("invalid partition"), "{paused}");
        // Paused: nothing more is tried.
        *fake.refuse.lock() = None;
        a.round(&waiting(q.id, 2.0));
        assert!(fake.submitted.lock().is_empty());
        a.resume(q.id).expect("resumed");
        // Resumed again: nothing to resume, said (it said "resumed").
        let again = a.resume(q.id).expect_err("not paused");
        assert!(again.to_string().contains("is not paused"), "{again}");
        a.round(&waiting(q.id, 2.0));
        assert!(!fake.submitted.lock().is_empty());
    }

    /// Writes each `(name, body)` as an executable shell script in `DIR/bin`; that folder.
    fn scripts(dir: &Path, bin: &str, scripts: &[(&str, String)]) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = dir.join(bin);
        std::fs::create_dir_all(&bin).expect("bin");
        for (name, body) in scripts {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        bin
    }

    /// Slurm's commands as scripts of the test's own: `squeue` exits 1 with `squeue_err`.
    fn fake_slurm(dir: &Path, squeue_err: &str) -> Slurm {
        let bin = scripts(
            dir,
            "bin",
            &[
                ("squeue", format!("echo '{squeue_err}' >&2; exit 1")),
                (
                    "scontrol",
                    "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1".into(),
                ),
                ("sacct", "exit 1".into()),
            ],
        );
        Slurm { bin_dir: Some(bin) }
    }

    #[test]
    fn slurm_jobs_it_no_longer_knows_ended_but_a_controller_down_tells_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let gone = fake_slurm(
            dir.path(),
            "slurm_load_jobs error: Invalid job id specified",
        );
        assert_eq!(gone.states(&["5".into()]), Ok(HashMap::new()));
        let down = fake_slurm(
            dir.path(),
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        );
        let e = down.states(&["5".into()]).expect_err("cannot tell");
        assert!(e.contains("Unable to contact"), "{e}");
    }

    /// PBS's commands as scripts of the test's own: `qstat` as `qstat_body` says.
    fn fake_pbs(dir: &Path, qstat_body: &str) -> Pbs {
        let bin = scripts(
            dir,
            "pbsbin",
            &[
                ("qstat", qstat_body.to_string()),
                (
                    "qsub",
                    "pwd > qsub.cwd; echo \"$@\" > qsub.args; echo 88.head".into(),
                ),
            ],
        );
        Pbs { bin_dir: Some(bin) }
    }

    #[test]
    fn pbs_reads_live_jobs_then_the_history_and_tells_a_server_down_from_ended_jobs() {
        let dir = tempfile::tempdir().expect("tmp");
        // OpenPBS: 5 runs; 6 left the live list ("Job has finished", exit 35); its history
        // (-x) says it ended well; 7 is unknown everywhere (ended).
        let openpbs = fake_pbs(
            dir.path(),
            r#"case "$1" in
  -x) echo 'Job Id: 6.head.example.org'; echo '    job_state = F'; echo '    Exit_status = 0';
      echo 'qstat: Unknown Job Id 7.head' >&2; exit 153 ;;
  *) echo 'Job Id: 5.head.example.org'; echo '    job_state = R'
     echo 'qstat: 6.head Job has finished, use -x or -H to obtain historical job information' >&2
     echo 'qstat: Unknown Job Id 7.head' >&2; exit 35 ;;
esac"#,
        );
        let ids: Vec<String> = ["5.head", "6.head", "7.head"].map(String::from).to_vec();
        let s = openpbs.states(&ids).expect("told");
        assert_eq!(s.get("5.head"), Some(&BatchState::Running));
        assert_eq!(s.get("6.head"), Some(&BatchState::Ended));
        assert_eq!(s.get("7.head"), None, "unknown: ended");
        // A server that does not answer says nothing of any job.
        let down = fake_pbs(
            dir.path(),
            "echo 'qstat: cannot connect to server head (errno=111)' >&2; exit 2",
        );
        let e = down.states(&ids).expect_err("cannot tell");
        assert!(e.contains("cannot connect"), "{e}");
        // qsub runs in the script's folder, output joined and discarded, the user's
        // arguments before the script.
        let script = dir.path().join("q1-1.sh");
        std::fs::write(&script, "#!/bin/sh\n").expect("script");
        let id = down
            .submit(&script, &["-A".into(), "lab".into()])
            .expect("submitted");
        assert_eq!(id, "88.head");
        let args = std::fs::read_to_string(dir.path().join("qsub.args")).expect("args");
        assert_eq!(
            args.trim(),
            format!("-j oe -o /dev/null -A lab {}", script.display())
        );
    }

    #[test]
    fn a_controller_that_does_not_answer_changes_no_allocation() {
        let dir = tempfile::tempdir().expect("tmp");
        let fake = Arc::new(Fake::default());
        let a = allocator(dir.path(), fake.clone());
        let q = a.add(spec("reactive")).expect("added");
        a.round(&waiting(q.id, 4.0));
        fake.states.lock().insert("101".into(), BatchState::Running);
        a.round(&CoreView::default());
        let before = a.info(q.id).expect("q").allocations;
        assert_eq!(before[0].state, AllocState::Running);
        // Slurm's controller down: nothing is taken for ended, nothing more is asked.
        *fake.down.lock() = true;
        a.round(&CoreView::default());
        assert_eq!(a.info(q.id).expect("q").allocations, before);
    }

    #[test]
    fn queued_allocations_no_longer_needed_are_cancelled_and_removal_cancels_the_rest() {
        let dir = tempfile::tempdir().expect("tmp");
        let fake = Arc::new(Fake::default());
        let a = allocator(dir.path(), fake.clone());
        let q = a.add(spec("predictive")).expect("added");
        a.round(&waiting(q.id, 4.0));
        assert_eq!(fake.submitted.lock().len(), 2, "twice the shortfall of one");
        // The work is gone before they start: both cancelled.
        a.round(&CoreView::default());
        assert_eq!(fake.cancelled.lock().len(), 2);
        assert!(a.info(q.id).expect("q").live().is_empty());
        a.round(&waiting(q.id, 4.0));
        let token = a.info(q.id).expect("q").token_id;
        a.remove(q.id).expect("removed");
        assert_eq!(fake.cancelled.lock().len(), 4);
        assert!(a.info(q.id).is_err());
        assert!(a.access.tokens().iter().any(|t| t.id == token && t.revoked));
    }
}
