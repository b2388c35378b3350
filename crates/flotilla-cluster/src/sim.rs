//! A cluster in virtual time: the coordinator's state machine and one agent state per
//! worker, wired as their sessions wire them (assignments, cancels and retractions down;
//! starts, finishes and returns up, with no delay), and task attempts that take as long as a
//! function says instead of running processes. No I/O, no clock: the same inputs give the same
//! run, so `flotilla simulate --cluster` shows what the real placement (fit in each worker's
//! ledger, queues, chained dispatch, retries) does with a DAG and a set of workers.
//!
//! ```
//! use flotilla_cluster::sim::{simulate_dag, ClusterSimConfig};
//! use flotilla_sched::parse_dag;
//!
//! let dag = parse_dag(r#"{"processors": ["a", "b"], "bandwidth": 1.0,
//!     "tasks": [{"id": "x", "cost": [2, 3]}, {"id": "y", "cost": [2, 2]}, {"id": "z", "cost": [1, 1]}],
//!     "edges": [{"from": "x", "to": "z", "data": 1}, {"from": "y", "to": "z", "data": 1}]}"#)?;
//! let schedule = simulate_dag(&dag, &ClusterSimConfig::default())?;
//! schedule.validate(&dag)?; // dependencies and transfers respected, one task at a time each
//! assert!(schedule.makespan >= 3.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use flotilla_core::ledger::{Ledger, LedgerError};
use flotilla_core::{parse_job, JobId, Resources, WorkerId};
use flotilla_sched::{Dag, Placement, Schedule};

use crate::agent::{Agent, Attempt, Command as AgentCommand, Report, Work};
use crate::state::{
    Assignment, AttemptOutcome, AttemptResult, Command, Config, Coordinator, Event, JobState,
    Millis, StateError, TaskRef, Usage, WorkerSpec,
};

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The coordinator refused an event.
    #[error(transparent)]
    State(#[from] StateError),
    /// A worker's offer is unusable.
    #[error(transparent)]
    Offer(#[from] LedgerError),
    /// The job built from the DAG did not parse.
    #[error("the job built from the DAG: {0}")]
    Job(#[from] flotilla_core::CoreError),
    /// An agent refused what the coordinator placed on it.
    #[error("worker {worker} refused {task} attempt {attempt}: {why}")]
    Refused {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskRef,
        /// The attempt.
        attempt: u32,
        /// What the agent said.
        why: String,
    },
    /// An agent's ledger holds more than its worker has (a bug in the ledger or the agent).
    #[error("worker {worker} is over-committed: {what}")]
    OverCommitted {
        /// The worker.
        worker: WorkerId,
        /// What is over.
        what: String,
    },
    /// The run did not finish within the step bound (a bug: the placement hangs).
    #[error("the simulation did not end within {0} steps")]
    Hung(usize),
}

/// One attempt as it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRun {
    /// The task.
    pub task: TaskRef,
    /// The attempt.
    pub attempt: u32,
    /// The task instance's name.
    pub name: String,
    /// Where it ran.
    pub worker: WorkerId,
    /// When it started and ended, virtual milliseconds.
    pub start: Millis,
    /// When it ended.
    pub end: Millis,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The CPUs it held (its metered CPU seconds are these × its wall time).
    pub cpus: f64,
}

/// What the duration function is told about an attempt that starts.
pub struct Start<'a> {
    /// The assignment as the coordinator made it (name, variant, resources, GPUs).
    pub assignment: &'a Assignment,
    /// The worker.
    pub worker: WorkerId,
    /// Where each finished task's successful attempt ran.
    pub ran_on: &'a HashMap<TaskRef, WorkerId>,
    /// Now, virtual milliseconds.
    pub now: Millis,
}

/// How long an attempt takes and how it ends, asked when it starts.
pub type Duration<'a> = dyn FnMut(&Start<'_>) -> Result<(Millis, AttemptOutcome), SimError> + 'a;

/// A coordinator, its workers' agents and a virtual clock.
pub struct ClusterSim {
    coord: Coordinator,
    agents: BTreeMap<WorkerId, Agent<Assignment>>,
    now: Millis,
    out: Vec<Command>,
    /// (end, sequence, worker, attempt) of running attempts; an entry whose end no longer
    /// matches `ending` is stale (the attempt was killed).
    heap: BinaryHeap<Reverse<(Millis, u64, WorkerId, Attempt)>>,
    ending: HashMap<Attempt, (Millis, AttemptOutcome, SimRun)>,
    /// The attempts in `ending`, by worker.
    running_on: HashMap<WorkerId, std::collections::BTreeSet<Attempt>>,
    seq: u64,
    ran_on: HashMap<TaskRef, WorkerId>,
    runs: Vec<SimRun>,
    /// Wall time spent in the coordinator's `handle` (a measurement only: nothing in the
    /// run depends on it).
    busy: std::time::Duration,
    /// Events handed to the coordinator.
    events: u64,
}

impl ClusterSim {
    /// A cluster with no workers, its coordinator set up with `config`.
    pub fn new(config: Config) -> Self {
        ClusterSim {
            coord: Coordinator::new(config),
            agents: BTreeMap::new(),
            now: 0,
            out: Vec::new(),
            heap: BinaryHeap::new(),
            ending: HashMap::new(),
            running_on: HashMap::new(),
            seq: 0,
            ran_on: HashMap::new(),
            runs: Vec::new(),
            busy: std::time::Duration::ZERO,
            events: 0,
        }
    }

    /// Hands one event to the coordinator, timing it.
    fn handle(&mut self, event: Event) -> Result<(), SimError> {
        let t = std::time::Instant::now();
        let r = self.coord.handle(self.now, event, &mut self.out);
        self.busy += t.elapsed();
        self.events += 1;
        Ok(r?)
    }

    /// Wall time the coordinator spent handling events so far, and how many it handled.
    pub fn coordinator_time(&self) -> (std::time::Duration, u64) {
        (self.busy, self.events)
    }

    /// The worker is lost (its host went away without a word): the coordinator is told, and
    /// every attempt running there ends with it. Returns those runs, ended now: their work
    /// is wasted.
    pub fn lose(&mut self, worker: WorkerId) -> Result<Vec<SimRun>, SimError> {
        self.agents.remove(&worker);
        let mut lost = Vec::new();
        for key in self.running_on.remove(&worker).unwrap_or_default() {
            if let Some((_, _, mut run)) = self.ending.remove(&key) {
                run.end = self.now;
                lost.push(run);
            }
        }
        self.handle(Event::WorkerLost {
            worker,
            reason: "its host went away".into(),
        })?;
        Ok(lost)
    }

    /// How many attempts run on `worker` now.
    pub fn running_count(&self, worker: WorkerId) -> usize {
        self.running_on.get(&worker).map_or(0, |s| s.len())
    }

    /// Adds a worker; its agent keeps a ledger of `spec`'s offer.
    pub fn add_worker(&mut self, spec: WorkerSpec) -> Result<WorkerId, SimError> {
        let ledger = spec.ledger()?;
        let id = self.coord.next_worker_id();
        self.handle(Event::WorkerJoined {
            worker: id,
            spec,
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        })?;
        self.agents.insert(id, Agent::new(ledger));
        Ok(id)
    }

    /// Submits a job (its folder is `/sim`).
    pub fn submit(&mut self, spec: flotilla_core::JobSpec) -> Result<JobId, SimError> {
        self.submit_as(spec, "sim")
    }

    /// Submits a job owned by `tenant`.
    pub fn submit_as(
        &mut self,
        spec: flotilla_core::JobSpec,
        tenant: &str,
    ) -> Result<JobId, SimError> {
        let job = self.coord.next_job_id();
        self.handle(Event::JobSubmitted {
            job,
            spec,
            dir: "/sim".into(),
            tenant: tenant.into(),
        })?;
        Ok(job)
    }

    /// Hands `tenant` credits.
    pub fn grant(&mut self, tenant: &str, amount: flotilla_pool::Credits) -> Result<(), SimError> {
        self.handle(Event::CreditsGranted {
            tenant: tenant.into(),
            amount,
        })?;
        Ok(())
    }

    /// The worker's owner reclaims it: nothing more is placed there, its queued attempts
    /// go back, and each running one ends now, preempted, with the checkpoint
    /// `checkpoint(run, now)` says it leaves (empty: it starts again from nothing).
    pub fn reclaim(
        &mut self,
        worker: WorkerId,
        checkpoint: &mut dyn FnMut(&SimRun, Millis) -> Vec<crate::state::ObjectRef>,
        duration: &mut Duration<'_>,
    ) -> Result<(), SimError> {
        self.handle(Event::WorkerAvailability {
            worker,
            available: false,
        })?;
        let Some(agent) = self.agents.get_mut(&worker) else {
            return Ok(());
        };
        let back = agent.reclaim();
        self.up(worker, back, duration)?;
        let running: Vec<Attempt> = self
            .running_on
            .get(&worker)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for key in running {
            if let Some((_, _, run)) = self.ending.remove(&key) {
                let files = checkpoint(&run, self.now);
                let outcome = AttemptOutcome::Preempted { checkpoint: files };
                self.schedule_end(worker, key, self.now, outcome, run);
            }
        }
        Ok(())
    }

    /// The worker takes work again.
    pub fn restore(&mut self, worker: WorkerId) -> Result<(), SimError> {
        if let Some(a) = self.agents.get_mut(&worker) {
            a.resume();
        }
        self.handle(Event::WorkerAvailability {
            worker,
            available: true,
        })?;
        Ok(())
    }

    /// Runs until virtual time `until` (or until nothing more happens, if sooner): at most
    /// `max_steps` events.
    pub fn run_until(
        &mut self,
        until: Millis,
        max_steps: usize,
        duration: &mut Duration<'_>,
    ) -> Result<(), SimError> {
        for _ in 0..max_steps {
            if !self.out.is_empty() {
                self.deliver(duration)?;
                continue;
            }
            match self.next_end() {
                Some((end, worker, key)) if end <= until => {
                    self.now = self.now.max(end);
                    self.end(worker, key, duration)?;
                }
                Some((end, worker, key)) => {
                    // Not yet: put it back.
                    self.seq += 1;
                    self.heap.push(Reverse((end, self.seq, worker, key)));
                    self.now = self.now.max(until);
                    self.handle(Event::Tick)?;
                    if self.out.is_empty() {
                        return Ok(());
                    }
                    continue;
                }
                None => {
                    self.now = self.now.max(until);
                    self.handle(Event::Tick)?;
                    if self.out.is_empty() {
                        return Ok(());
                    }
                    continue;
                }
            }
            self.handle(Event::Tick)?;
        }
        Err(SimError::Hung(max_steps))
    }

    /// The coordinator (its status views).
    pub fn coordinator(&self) -> &Coordinator {
        &self.coord
    }

    /// Every attempt that ran, in the order they ended.
    pub fn runs(&self) -> &[SimRun] {
        &self.runs
    }

    /// Now, virtual milliseconds.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Runs until nothing is running and nothing more happens: `duration` says how long each
    /// attempt takes and how it ends. At most `max_steps` events.
    pub fn run(&mut self, max_steps: usize, duration: &mut Duration<'_>) -> Result<(), SimError> {
        let mut idle = 0;
        for _ in 0..max_steps {
            if !self.out.is_empty() {
                self.deliver(duration)?;
                continue;
            }
            match self.next_end() {
                Some((end, worker, key)) => {
                    idle = 0;
                    self.now = self.now.max(end);
                    self.end(worker, key, duration)?;
                }
                None => {
                    // Nothing runs: let time pass for the coordinator's timers (backoffs),
                    // a few times, then stop.
                    idle += 1;
                    if idle > 3 {
                        return Ok(());
                    }
                    self.now += 1_000;
                }
            }
            self.handle(Event::Tick)?;
        }
        Err(SimError::Hung(max_steps))
    }

    /// The earliest live end, dropping stale entries.
    fn next_end(&mut self) -> Option<(Millis, WorkerId, Attempt)> {
        while let Some(Reverse((end, _, worker, key))) = self.heap.pop() {
            if self.ending.get(&key).is_some_and(|(e, _, _)| *e == end) {
                return Some((end, worker, key));
            }
        }
        None
    }

    fn end(
        &mut self,
        worker: WorkerId,
        key: Attempt,
        duration: &mut Duration<'_>,
    ) -> Result<(), SimError> {
        let Some((end, outcome, mut run)) = self.ending.remove(&key) else {
            return Ok(());
        };
        if let Some(s) = self.running_on.get_mut(&worker) {
            s.remove(&key);
        }
        run.end = end;
        if outcome == AttemptOutcome::Succeeded {
            self.ran_on.insert(key.0, worker);
        }
        let wall = end.saturating_sub(run.start) as f64 / 1000.0;
        let usage = Usage {
            cpu_seconds: wall * run.cpus,
            peak_rss_bytes: 0,
            wall_seconds: wall,
            ..Usage::default()
        };
        self.runs.push(run);
        let result = AttemptResult {
            outcome,
            usage,
            outputs: Vec::new(),
            variant: None,
        };
        let cmds = match self.agents.get_mut(&worker) {
            Some(a) => a.finished(key, result, self.now),
            None => Vec::new(),
        };
        self.up(worker, cmds, duration)
    }

    /// Hands the coordinator's commands to the agents, and what they answer back.
    fn deliver(&mut self, duration: &mut Duration<'_>) -> Result<(), SimError> {
        let cmds: Vec<Command> = std::mem::take(&mut self.out);
        for c in cmds {
            let (worker, cancel, retract, assign) = match c {
                Command::Assign { worker, tasks } => {
                    let works = tasks
                        .into_iter()
                        .map(|a| Work {
                            key: (a.task, a.attempt),
                            need: a.resources.clone(),
                            gpus: a.gpu_indices.clone(),
                            after: a.after,
                            payload: a,
                        })
                        .collect();
                    (worker, Vec::new(), Vec::new(), works)
                }
                Command::Cancel {
                    worker,
                    task,
                    attempt,
                } => (worker, vec![(task, attempt)], Vec::new(), Vec::new()),
                Command::Retract {
                    worker,
                    task,
                    attempt,
                } => (worker, Vec::new(), vec![(task, attempt)], Vec::new()),
                Command::Notify(_) => continue,
            };
            let Some(agent) = self.agents.get_mut(&worker) else {
                continue;
            };
            let answer = agent.message(&cancel, &retract, assign, self.now);
            self.up(worker, answer, duration)?;
        }
        Ok(())
    }

    /// Carries out an agent's commands: reports go to the coordinator, starts get a duration.
    fn up(
        &mut self,
        worker: WorkerId,
        cmds: Vec<AgentCommand<Assignment>>,
        duration: &mut Duration<'_>,
    ) -> Result<(), SimError> {
        if let Some(a) = self.agents.get(&worker) {
            over_committed(a.ledger())
                .map_or(Ok(()), |what| Err(SimError::OverCommitted { worker, what }))?;
        }
        for c in cmds {
            let ev = match c {
                AgentCommand::Report(Report::Started((task, attempt))) => Event::TaskStarted {
                    worker,
                    task,
                    attempt,
                },
                AgentCommand::Report(Report::Finished((task, attempt), result)) => {
                    if let AttemptOutcome::Failed { message, .. } = &result.outcome {
                        if message.starts_with("the worker cannot run") {
                            return Err(SimError::Refused {
                                worker,
                                task,
                                attempt,
                                why: message.clone(),
                            });
                        }
                    }
                    Event::TaskFinished {
                        worker,
                        task,
                        attempt,
                        result,
                    }
                }
                AgentCommand::Report(Report::Returned((task, attempt))) => Event::TaskReturned {
                    worker,
                    task,
                    attempt,
                },
                AgentCommand::Start { key, payload } => {
                    let start = Start {
                        assignment: &payload,
                        worker,
                        ran_on: &self.ran_on,
                        now: self.now,
                    };
                    let (ms, outcome) = duration(&start)?;
                    let run = SimRun {
                        task: key.0,
                        attempt: key.1,
                        name: payload.name.clone(),
                        worker,
                        start: self.now,
                        end: self.now + ms,
                        outcome: outcome.clone(),
                        cpus: payload.resources.cpus,
                    };
                    self.schedule_end(worker, key, self.now + ms, outcome, run);
                    continue;
                }
                AgentCommand::Kill(key) => {
                    if let Some((_, _, run)) = self.ending.remove(&key) {
                        self.schedule_end(worker, key, self.now, AttemptOutcome::Cancelled, run);
                    }
                    continue;
                }
            };
            self.handle(ev)?;
        }
        Ok(())
    }

    fn schedule_end(
        &mut self,
        worker: WorkerId,
        key: Attempt,
        end: Millis,
        outcome: AttemptOutcome,
        run: SimRun,
    ) {
        self.seq += 1;
        self.heap.push(Reverse((end, self.seq, worker, key)));
        self.ending.insert(key, (end, outcome, run));
        self.running_on.entry(worker).or_default().insert(key);
    }
}

/// What a ledger holds beyond its capacity, if anything: checked after every agent step.
fn over_committed(l: &Ledger) -> Option<String> {
    use flotilla_core::ledger::EPS;
    let (used, cap) = (l.used(), l.cap());
    if used.cpus > cap.cpus + EPS {
        return Some(format!("{} cpus of {}", used.cpus, cap.cpus));
    }
    if used.gpu_mem > cap.gpu_mem {
        return Some(format!(
            "{} bytes of GPU memory of {}",
            used.gpu_mem, cap.gpu_mem
        ));
    }
    l.gpus().iter().find_map(|g| {
        (g.share > 1.0 + EPS || g.mem_used > g.gpu.mem_bytes).then(|| {
            format!(
                "GPU {}: share {}, {} of {} bytes",
                g.gpu.index, g.share, g.mem_used, g.gpu.mem_bytes
            )
        })
    })
}

/// How [`simulate_dag`] sets up the cluster.
#[derive(Clone, Debug)]
pub struct ClusterSimConfig {
    /// The coordinator's settings (queue depth, chained dispatch, retries' backoff).
    pub coordinator: Config,
    /// Virtual milliseconds per DAG time unit; costs are rounded up to whole ones (the
    /// default, a million, keeps the rounding below a millionth of a unit per task).
    pub ms_per_unit: f64,
}

impl Default for ClusterSimConfig {
    fn default() -> Self {
        ClusterSimConfig {
            coordinator: Config::default(),
            ms_per_unit: 1_000_000.0,
        }
    }
}

/// Runs a DAG through the cluster's own placement: one worker per DAG processor (one CPU,
/// its hardware class the processor's name), one plain one-CPU task per DAG task, each taking
/// its cost on the worker it was placed on plus the transfer of its inputs from predecessors
/// that ran on other workers (`data / bandwidth`, as the DAG's other policies count it),
/// rounded up to whole virtual milliseconds.
/// Returns the schedule with policy `"cluster"`, in DAG time units.
pub fn simulate_dag(dag: &Dag, cfg: &ClusterSimConfig) -> Result<Schedule, SimError> {
    let mut sim = ClusterSim::new(cfg.coordinator.clone());
    let mut proc_of: BTreeMap<WorkerId, usize> = BTreeMap::new();
    for (p, name) in dag.processors().iter().enumerate() {
        let id = sim.add_worker(WorkerSpec {
            name: name.clone(),
            hostname: "sim".into(),
            hw_class: name.clone(),
            resources: Resources {
                cpus: 1.0,
                ..Resources::zero()
            },
            gpus: Vec::new(),
            data_addr: String::new(),
            ..WorkerSpec::default()
        })?;
        proc_of.insert(id, p);
    }
    let mut text = String::from("name = \"dag\"\n[defaults]\nretries = 0\n");
    for i in 0..dag.tasks().len() {
        text.push_str(&format!("[[task]]\nid = \"t{i}\"\ncmd = [\"sim\"]\n"));
        let preds: Vec<String> = dag
            .in_edges(i)
            .iter()
            .map(|&e| format!("\"t{}\"", dag.edges()[e].from))
            .collect();
        if !preds.is_empty() {
            text.push_str(&format!("after = [{}]\n", preds.join(", ")));
        }
    }
    let spec = parse_job(&text, "dag.toml")?;
    let job = sim.submit(spec)?;
    // DAG index → the job's task, by name (`t{i}`).
    let tasks: HashMap<usize, TaskRef> = sim
        .coordinator()
        .job_status(job)
        .map(|s| {
            s.tasks
                .iter()
                .map(|t| (dag_index(&t.name), TaskRef { job, task: t.id }))
                .collect()
        })
        .unwrap_or_default();
    let unit = cfg.ms_per_unit;
    let mut duration = |s: &Start<'_>| -> Result<(Millis, AttemptOutcome), SimError> {
        let i = dag_index(&s.assignment.name);
        let p = proc_of.get(&s.worker).copied().unwrap_or(0);
        // A checked DAG's costs are finite and non-negative.
        let cost = dag.tasks()[i].cost[p];
        let mut fetch: f64 = 0.0;
        for &e in dag.in_edges(i) {
            let edge = dag.edges()[e];
            let from = tasks.get(&edge.from);
            if let Some(q) = from
                .and_then(|t| s.ran_on.get(t))
                .and_then(|w| proc_of.get(w))
            {
                fetch = fetch.max(dag.comm_time(edge.data, *q, p));
            }
        }
        // Rounded up to whole milliseconds, so no dependency or transfer is shortened.
        Ok((
            ((fetch + cost) * unit).ceil() as Millis,
            AttemptOutcome::Succeeded,
        ))
    };
    sim.run(10 * dag.tasks().len() + 1_000, &mut duration)?;
    let status = sim.coordinator().job_status(job);
    if status
        .as_ref()
        .is_none_or(|s| s.state != JobState::Succeeded)
    {
        return Err(SimError::Hung(sim.runs().len()));
    }
    let names: BTreeMap<WorkerId, &String> = proc_of
        .iter()
        .map(|(w, &p)| (*w, &dag.processors()[p]))
        .collect();
    let placements = sim
        .runs()
        .iter()
        .map(|r| {
            let i = dag_index(&r.name);
            let p = proc_of.get(&r.worker).copied().unwrap_or(0);
            let cost = dag.tasks()[i].cost[p];
            Placement {
                task: dag.tasks()[i].id.clone(),
                processor: names
                    .get(&r.worker)
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                // The fetch comes first; the schedule shows the computation.
                start: r.end as f64 / unit - cost,
                end: r.end as f64 / unit,
            }
        })
        .collect();
    Ok(Schedule::from_placements("cluster", placements))
}

/// The DAG index of a task named `t{i}`.
fn dag_index(name: &str) -> usize {
    name.trim_start_matches('t').parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use flotilla_sched::parse_dag;

    use super::*;
    use crate::state::GpuInfo;

    #[test]
    fn a_chain_runs_on_one_worker_and_its_transfers_are_free() {
        let dag = parse_dag(
            r#"{"processors": ["a", "b"], "bandwidth": 1.0,
            "tasks": [{"id": "x", "cost": [1, 1]}, {"id": "y", "cost": [1, 1]}, {"id": "z", "cost": [1, 1]}],
            "edges": [{"from": "x", "to": "y", "data": 5}, {"from": "y", "to": "z", "data": 5}]}"#,
        )
        .expect("a valid DAG");
        let s = simulate_dag(&dag, &ClusterSimConfig::default()).expect("runs");
        s.validate(&dag).expect("a valid schedule");
        // Chained dispatch keeps the chain where it started: no transfer, 3 units.
        assert_eq!(s.makespan, 3.0);
        let procs: Vec<&str> = s.placements.iter().map(|p| p.processor.as_str()).collect();
        assert!(procs.iter().all(|p| *p == procs[0]), "{procs:?}");
    }

    #[test]
    fn independent_tasks_spread_over_the_workers() {
        let dag = parse_dag(
            r#"{"processors": ["a", "b"], "bandwidth": 1.0,
            "tasks": [{"id": "p", "cost": [2, 2]}, {"id": "q", "cost": [2, 2]},
                      {"id": "r", "cost": [2, 2]}, {"id": "s", "cost": [2, 2]}]}"#,
        )
        .expect("a valid DAG");
        let s = simulate_dag(&dag, &ClusterSimConfig::default()).expect("runs");
        s.validate(&dag).expect("a valid schedule");
        assert_eq!(s.makespan, 4.0, "{s:?}");
    }

    #[test]
    fn failures_are_retried_and_kills_end_attempts() {
        let mut sim = ClusterSim::new(Config {
            retry_backoff_ms: 10,
            max_backoff_ms: 10,
            ..Config::default()
        });
        let gpu = GpuInfo {
            index: 0,
            model: "g".into(),
            mem_bytes: 1 << 30,
        };
        sim.add_worker(WorkerSpec {
            name: "w".into(),
            hostname: "h".into(),
            hw_class: "c".into(),
            resources: Resources {
                cpus: 2.0,
                ..Resources::zero()
            },
            gpus: vec![gpu],
            data_addr: String::new(),
            ..WorkerSpec::default()
        })
        .expect("joins");
        let job = sim
            .submit(
                parse_job(
                    "[defaults]\nretries = 2\n[[task]]\nid = \"a\"\narray = \"0..4\"\ncmd = [\"x\"]\nresources = { cpus = 1, gpus = 0.5 }\n",
                    "j.toml",
                )
                .expect("a valid job"),
            )
            .expect("accepted");
        let mut failed_once = std::collections::HashSet::new();
        sim.run(10_000, &mut |s: &Start<'_>| {
            // Every task fails its first attempt.
            let outcome = if failed_once.insert(s.assignment.task) {
                AttemptOutcome::Failed {
                    message: "first try".into(),
                    retryable: true,
                }
            } else {
                AttemptOutcome::Succeeded
            };
            Ok((100, outcome))
        })
        .expect("ends");
        let status = sim.coordinator().job_status(job).expect("known job");
        assert_eq!(status.state, JobState::Succeeded);
        assert_eq!(sim.runs().len(), 8, "two attempts each");
        // Two tasks at a time share the GPU: 4 tasks × 2 attempts × 100 ms over 2 slots.
        assert!(sim.now() >= 400, "{}", sim.now());
    }
}
