//! The shared pool in the state machine: which workers a job may use (its `[pool]`
//! section, providers' prices and reputations, its budget), placement by cost or energy
//! within a deadline, holds on the consumer's credits when an attempt is placed on a
//! provider's machine, verification of results by replicas on distinct providers, and
//! settlement of accepted results (the pure policies are `flotilla_pool`'s).
//!
//! # What is journaled
//!
//! | record | when | replay |
//! | --- | --- | --- |
//! | `PoolWorker` | a provider's worker joins | its provider and price, for settling its results |
//! | `Ledger` | a hold, settlement or release | the same transaction (idempotent by key) and the job's accounts |
//! | `Verdict` | a verified task's result is judged | the same verdict: task state and reputations |
//! | `BudgetRaised` | `flotilla budget JOB +N` | the job's budget |
//!
//! A replay never decides again: the ledger and the verdicts come from their records (so a
//! journal compaction, which drops removed jobs' records but keeps `Ledger`, `Verdict` and
//! `PoolWorker` ones, cannot change a decision), and the sweep of holds does nothing while
//! replaying.
//!
//! # Holds and settlement
//!
//! An attempt placed on a provider's worker (price not zero) holds its estimated cost
//! (price × its resources × its timeout, or twice its predicted time, or an hour) from the
//! tenant's balance. When its result is accepted the hold is settled at the metered cost
//! (measured CPU seconds, GPUs × wall time, peak memory GB × wall time, × price), less the
//! platform's fee; a rejected result, a failure, a cancellation, a lost worker or a
//! retraction release it whole (the sweep at the end of every event releases the holds of
//! attempts that are no longer in flight nor waiting for a verdict). Keys are
//! `hold/<task>/<attempt>`, `settle/…`, `release/…`: an attempt is charged at most once.

use std::collections::{HashMap, HashSet};

use flotilla_core::{Objective, PoolSpec, Trust, Verify};
use flotilla_pool::{Accepted, Applied, Credits, Metered, Price, Transaction, Verdict, Verifier};
use serde::{Deserialize, Serialize};

use super::super::Usage;
use super::*;

/// A provider's worker, as the pool remembers it (also after it left: its late results
/// are settled with it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PoolWorker {
    pub(crate) provider: String,
    pub(crate) price: Price,
}

/// An open hold of an attempt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpenHold {
    pub(crate) key: String,
    pub(crate) amount: Credits,
}

/// The pool's part of the coordinator.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The platform's fee, parts per million of each settled cost.
    pub(crate) fee_ppm: u32,
    pub(crate) verifier: Verifier,
    /// Providers' workers, live or gone.
    pub(crate) workers: BTreeMap<WorkerId, PoolWorker>,
    /// Open holds by attempt.
    pub(crate) holds: BTreeMap<(TaskRef, u32), OpenHold>,
    /// Replaying the journal: decisions come from their records.
    pub(crate) replaying: bool,
    /// How hardware classes compare (learned across task kinds), and the samples recorded
    /// when it was computed.
    pub(crate) ratios: (u64, flotilla_sched::ArchRatios),
    /// Samples recorded into the performance model so far.
    pub(crate) samples: u64,
}

impl Pool {
    pub(crate) fn new(fee_ppm: u32) -> Pool {
        Pool {
            fee_ppm,
            verifier: Verifier::new(flotilla_pool::VerifyConfig::default()),
            workers: BTreeMap::new(),
            holds: BTreeMap::new(),
            replaying: false,
            ratios: (0, flotilla_sched::ArchRatios::default()),
            samples: 0,
        }
    }
}

/// A result waiting for its verdict.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub(crate) attempt: u32,
    pub(crate) worker: WorkerId,
    /// `None`: the operator's own worker (trusted).
    pub(crate) provider: Option<String>,
    pub(crate) hash: String,
    pub(crate) outputs: Vec<ObjectRef>,
    pub(crate) usage: Usage,
    pub(crate) variant: Option<String>,
    pub(crate) hw_class: Option<String>,
}

/// A job's pool state.
#[derive(Debug)]
pub(crate) struct JobPool {
    pub(crate) spec: PoolSpec,
    /// The most it may spend (`None`: its tenant's balance).
    pub(crate) budget: Option<Credits>,
    /// Settled.
    pub(crate) spent: Credits,
    /// Held for attempts in flight or waiting for a verdict.
    pub(crate) held: Credits,
    /// Why it places nothing now (out of budget or credits).
    pub(crate) paused: Option<String>,
    /// Results waiting for a verdict, per task.
    pub(crate) replicas: HashMap<TaskId, Vec<Replica>>,
    /// Tasks verified again with a quorum of two (their provider was caught cheating).
    pub(crate) requorum: HashSet<TaskId>,
    /// Of those, the ones that had been done: the result hash they had (when the new
    /// verdict differs, every task that consumed it runs again).
    pub(crate) suspect: HashMap<TaskId, String>,
    /// Providers that may not run a task again (they disagreed with its accepted result).
    pub(crate) excluded: HashMap<TaskId, Vec<String>>,
    /// What each task cost so far.
    pub(crate) cost: HashMap<TaskId, Credits>,
    /// A verified task's accepted verdict: the providers whose results agreed, and whether
    /// one was taken unchecked (adaptive verification of a trusted provider).
    pub(crate) agreed: HashMap<TaskId, (Vec<String>, bool)>,
    /// Results rejected.
    pub(crate) rejected: u64,
    /// With a deadline, computed at a done count: each task's fastest predicted time and
    /// its remaining path after it (seconds, at the fastest predicted times).
    pub(crate) plan: Option<Plan>,
}

impl JobPool {
    pub(crate) fn new(spec: PoolSpec) -> JobPool {
        JobPool {
            budget: spec.budget.map(Credits::from_f64),
            spec,
            spent: Credits::ZERO,
            held: Credits::ZERO,
            paused: None,
            replicas: HashMap::new(),
            requorum: HashSet::new(),
            suspect: HashMap::new(),
            excluded: HashMap::new(),
            cost: HashMap::new(),
            agreed: HashMap::new(),
            rejected: 0,
            plan: None,
        }
    }

    /// Whether task `t`'s results are verified by more than one run (or judged at all).
    fn verifies(&self, t: TaskId) -> bool {
        self.spec.trust == Trust::Any
            && (self.requorum.contains(&t) || self.spec.verify != Verify::Quorum(1))
    }

    /// Credits it may still hold (`None`: no budget of its own).
    fn budget_room(&self) -> Option<Credits> {
        self.budget.map(|b| b - self.spent - self.held)
    }
}

/// A job's deadline plan (see [`Coordinator::refresh_plan`]).
#[derive(Debug)]
pub(crate) struct Plan {
    /// Tasks done when it was computed.
    done_at: u64,
    /// Each task's fastest predicted time.
    own: Vec<f64>,
    /// Each task's remaining path after it.
    after: Vec<f64>,
}

/// A verdict as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum VerdictRecord {
    /// The task's result is decided.
    Accepted {
        /// The accepted output hash.
        hash: String,
        /// Providers whose result agreed.
        agreed: Vec<String>,
        /// Providers whose result disagreed.
        rejected: Vec<String>,
        /// Accepted from one trusted provider alone.
        alone: bool,
        /// Tasks verified again (encoded as [`task_key`]).
        reverify: Vec<u64>,
    },
    /// More results are needed.
    NeedMore {
        /// How many.
        more: u32,
    },
    /// No quorum: the task fails.
    Failed {
        /// Why.
        why: String,
    },
}

/// A task as the verifier names it: the job id in the high half, the task in the low.
pub(crate) fn task_key(t: TaskRef) -> u64 {
    (t.job.0 << 32) | u64::from(t.task.0)
}

fn task_of_key(k: u64) -> TaskRef {
    TaskRef {
        job: JobId::new(k >> 32),
        task: TaskId::new((k & 0xffff_ffff) as u32),
    }
}

/// One hash of a result: blake3 over its outputs' paths and hashes, in path order.
pub(crate) fn result_hash(outputs: &[ObjectRef]) -> String {
    let mut sorted: Vec<&ObjectRef> = outputs.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = blake3::Hasher::new();
    for o in sorted {
        h.update(o.path.as_bytes());
        h.update(&[0]);
        h.update(o.hash.as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex().to_string()
}

/// What an attempt used, as it is charged: measured CPU seconds, the GPUs it held × its
/// wall time, its peak memory × its wall time.
fn metered(usage: &Usage, gpus: f64) -> Metered {
    let wall = if usage.wall_seconds.is_finite() {
        usage.wall_seconds.max(0.0)
    } else {
        0.0
    };
    Metered {
        cpu_seconds: if usage.cpu_seconds.is_finite() {
            usage.cpu_seconds.max(0.0)
        } else {
            0.0
        },
        gpu_seconds: gpus * wall,
        mem_gb_seconds: usage.peak_rss_bytes as f64 / 1e9 * wall,
        ..Metered::default()
    }
}

/// A job's highest prices as a [`Price`] (no limit: the largest credits).
fn max_price(spec: &PoolSpec) -> Price {
    let c = |x: Option<f64>| x.map_or(Credits::micro(i64::MAX), Credits::from_f64);
    Price {
        cpu: c(spec.max_price.cpu),
        gpu: c(spec.max_price.gpu),
        mem_gb: c(spec.max_price.mem_gb),
    }
}

/// The estimated power draw (watts) of a task's resources on worker `w`, for
/// `objective = "energy"`: the worker's watts per CPU (12 W where it says nothing), 300 W
/// per GPU.
fn estimated_watts(r: &flotilla_core::Resources, w: &Worker) -> f64 {
    let cpu = if w.spec.cpu_watts > 0.0 {
        w.spec.cpu_watts
    } else {
        12.0
    };
    cpu * r.cpus + 300.0 * r.gpus
}

/// Why a worker may not run a task, for the pause message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    None,
    /// The hold its next attempt needs is more than the job's budget has left.
    Budget(Credits),
    /// The hold is more than its tenant's balance.
    Credits(Credits),
    Other,
}

impl Refusal {
    /// The hold the refused attempt needed.
    fn need(self) -> Option<Credits> {
        match self {
            Refusal::Budget(n) | Refusal::Credits(n) => Some(n),
            Refusal::None | Refusal::Other => None,
        }
    }
}

impl Coordinator {
    /// The job's pool section (from its spec, journaled with it): it may use providers'
    /// workers from now on. Call before anything of the job is placed.
    pub fn set_job_pool(&mut self, job: JobId, pool: PoolSpec) -> Result<()> {
        let j = self.jobs.get_mut(&job).ok_or(StateError::UnknownJob(job))?;
        j.pool = Some(Box::new(JobPool::new(pool)));
        Ok(())
    }

    /// A provider's record: results accepted and rejected, score, streak.
    pub fn reputation(&self, provider: &str) -> flotilla_pool::Reputation {
        self.pool.verifier.reputation(provider)
    }

    /// Whether the verifier still gives `provider` work.
    pub fn provider_eligible(&self, provider: &str) -> bool {
        self.pool.verifier.eligible(provider)
    }

    /// A provider's worker joined: remembered (journaled) for settling its results.
    pub(super) fn pool_worker_joined(&mut self, worker: WorkerId, spec: &super::super::WorkerSpec) {
        let Some(provider) = spec.provider.clone() else {
            return;
        };
        let pw = PoolWorker {
            provider: provider.clone(),
            price: spec.price,
        };
        if self.pool.workers.get(&worker) != Some(&pw) {
            self.pool.workers.insert(worker, pw);
            if !self.pool.replaying {
                self.journal.push(JournalRecord::PoolWorker {
                    worker,
                    provider,
                    price: spec.price,
                });
            }
        }
    }

    /// Applies a pool record read back from the journal.
    pub(super) fn replay_pool(
        &mut self,
        record: JournalRecord,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        match record {
            JournalRecord::PoolWorker {
                worker,
                provider,
                price,
            } => {
                if !self.workers.contains_key(&worker) {
                    self.retired.insert(worker);
                    self.next_worker = self.next_worker.max(worker.0 + 1);
                }
                self.pool
                    .workers
                    .insert(worker, PoolWorker { provider, price });
            }
            JournalRecord::Ledger { attempt, tx } => match self.ledger.replay(&tx) {
                Ok(Applied::Done(_)) => self.account(attempt, &tx),
                Ok(Applied::Duplicate) => {}
                Err(e) => return Err(StateError::Ledger(e.to_string())),
            },
            JournalRecord::Verdict {
                task,
                attempt,
                verdict,
            } => {
                // The tasks to verify again are the recorded ones (what reputations say
                // now may differ after a compaction).
                self.record_reputations(task, &verdict);
                self.apply_verdict(task, attempt, &verdict, out);
            }
            _ => {}
        }
        Ok(())
    }

    /// `flotilla budget JOB +N`: the job may spend `amount` more.
    pub(super) fn raise_budget(&mut self, job: JobId, amount: Credits) -> Result<()> {
        let j = self.jobs.get_mut(&job).ok_or(StateError::UnknownJob(job))?;
        let Some(p) = j.pool.as_mut() else {
            return Err(StateError::Ledger(format!(
                "{job} has no [pool] section: it runs on the operator's own workers and \
                 spends nothing"
            )));
        };
        if amount.is_negative() {
            return Err(StateError::Ledger(format!(
                "a budget raise of {amount} is negative"
            )));
        }
        p.budget = Some(p.budget.unwrap_or(p.spent + p.held) + amount);
        p.paused = None;
        Ok(())
    }

    /// The provider of a worker, live or gone (`None`: the operator's own).
    pub(crate) fn provider_of(&self, w: WorkerId) -> Option<String> {
        self.pool.workers.get(&w).map(|p| p.provider.clone())
    }

    /// A job's pool accounts and deadline for `status`.
    pub(crate) fn pool_status(&self, j: &Job) -> Option<super::super::status::JobPoolStatus> {
        let p = j.pool.as_deref()?;
        let deadline_ms = p.spec.deadline.map(|d| d.as_millis() as u64);
        let deadline = deadline_ms.map(|d| {
            let due = j.submitted.saturating_add(d);
            match j.finished {
                Some(end) if end <= due && j.state == JobState::Succeeded => "met",
                Some(end) if end > due => "missed",
                // Ended in time without succeeding: the deadline was not what failed it.
                Some(_) if j.state == JobState::Failed => "not met: the job failed",
                Some(_) => "not met: the job was cancelled",
                None if self.now > due => "missed",
                None if self.deadline_at_risk(j, p) => "at risk",
                None => "on track",
            }
            .to_string()
        });
        Some(super::super::status::JobPoolStatus {
            budget: p.budget.map(Credits::as_f64),
            spent: p.spent.as_f64(),
            held: p.held.as_f64(),
            paused: p.paused.clone().filter(|_| j.is_active()),
            deadline_ms,
            deadline,
            verify: match p.spec.verify {
                Verify::Quorum(k) => k.to_string(),
                Verify::Adaptive => "adaptive".into(),
            },
            rejected: p.rejected,
        })
    }

    // ---- placement ----

    /// Whether worker `w` may run task `t` of job `j`, and if not, why: `room` is what the
    /// job's budget leaves, `balance` its tenant's credits, `max` its highest prices, `secs`
    /// the task's estimated time on `w`'s class.
    fn refusal(
        &self,
        j: &Job,
        t: TaskId,
        w: &Worker,
        (room, balance): (Option<Credits>, Credits),
        max: &Price,
        secs: Option<f64>,
    ) -> Refusal {
        let Some(provider) = w.spec.provider.as_deref() else {
            return Refusal::None; // the operator's own: trusted and free
        };
        let Some(p) = j.pool.as_deref() else {
            return Refusal::Other;
        };
        if p.spec.trust == Trust::TrustedOnly
            || j.graph.task(t).gang.is_some()
            || !w.spec.price.within(max)
            || !self.pool.verifier.eligible(provider)
        {
            return Refusal::Other;
        }
        let ran =
            |list: Option<&Vec<String>>| list.is_some_and(|l| l.iter().any(|x| x == provider));
        if p.replicas
            .get(&t)
            .is_some_and(|rs| rs.iter().any(|r| r.provider.as_deref() == Some(provider)))
            || ran(p.excluded.get(&t))
        {
            return Refusal::Other;
        }
        let need = Self::hold_estimate(j, t, w, secs);
        if room.is_some_and(|r| need > r) {
            return Refusal::Budget(need);
        }
        if need > balance {
            return Refusal::Credits(need);
        }
        Refusal::None
    }

    /// What an attempt of task `t` of job `j` holds on worker `w`: its price × its resources
    /// × its timeout, else twice its predicted time there (`predicted`; at least a minute),
    /// else an hour.
    fn hold_estimate(j: &Job, t: TaskId, w: &Worker, predicted: Option<f64>) -> Credits {
        if w.spec.provider.is_none() || w.spec.price == Price::default() {
            return Credits::ZERO;
        }
        let inst = j.graph.task(t);
        let r = &inst.resources;
        let secs = match inst.timeout {
            Some(d) => d.as_secs_f64(),
            None => predicted.map_or(3600.0, |s| (2.0 * s).max(60.0)),
        };
        w.spec
            .price
            .cost(&Metered::held(r.cpus, r.gpus, r.mem, secs))
    }

    /// The model's time of task `t` on `hw`: its prediction, else an estimate from the
    /// samples it has there or on another class and how the classes compare.
    pub(super) fn predicted(&self, j: &Job, t: TaskId, hw: &str) -> Option<f64> {
        let c = j.class_of(t);
        let options = j.options(t);
        let codelet = &j.classes[c].codelet;
        let of = |codelet: &str| {
            Job::predict(&self.model, codelet, &options, None, hw)
                .seconds()
                .or_else(|| self.model.estimate(codelet, hw, 0, &self.pool.ratios.1))
        };
        match options.as_slice() {
            // Variants: the fastest one's (the scheduler may choose it).
            [(Some(_), _), ..] => options
                .iter()
                .filter_map(|(name, _)| of(&format!("{codelet}/{}", name.unwrap_or_default())))
                .min_by(f64::total_cmp),
            _ => of(codelet),
        }
    }

    /// The time a running job has left, from the learned runtimes: its tasks left of each
    /// kind × the fastest time the model predicts (or estimates) for that kind on the live
    /// workers' hardware classes × its CPUs, spread over the live workers' CPUs. `None`
    /// when a kind has neither, or no worker is live. A job's tasks left are assumed spread
    /// over its kinds as its tasks are (counting them per kind would cost a pass over the
    /// tasks at every status).
    pub(crate) fn eta(&self, j: &Job) -> Option<f64> {
        if !j.is_active() {
            return None;
        }
        let ended = [TaskState::Done, TaskState::Failed, TaskState::Cancelled]
            .iter()
            .map(|s| j.counts[s.index()])
            .sum::<u64>();
        let left = (j.len() as u64).saturating_sub(ended);
        if left == 0 {
            return Some(0.0);
        }
        let classes: std::collections::BTreeSet<&str> = self
            .workers
            .values()
            .map(|w| w.spec.hw_class.as_str())
            .collect();
        let cpus: f64 = self.workers.values().map(|w| w.cap().cpus).sum();
        if classes.is_empty() || cpus <= 0.0 {
            return None;
        }
        let share = left as f64 / j.len() as f64;
        let mut work = 0.0;
        for c in &j.classes {
            let options = j.options(TaskId::new(c.first));
            let best = classes
                .iter()
                .flat_map(|hw| (0..options.len().max(1)).map(move |v| (*hw, v)))
                .filter_map(|(hw, v)| {
                    Job::predict(&self.model, &c.codelet, &options, Some(v), hw)
                        .seconds()
                        .or_else(|| self.model.estimate(&c.codelet, hw, 0, &self.pool.ratios.1))
                })
                .fold(f64::INFINITY, f64::min);
            if !best.is_finite() {
                return None;
            }
            let per = options.first().map_or(1.0, |o| o.1.cpus.max(0.01));
            work += f64::from(c.end - c.first) * share * best * per;
        }
        Some(work / cpus)
    }

    /// Learns again how hardware classes compare once 32 more samples were recorded.
    pub(super) fn refresh_ratios(&mut self) {
        let (at, _) = self.pool.ratios;
        if self.pool.samples >= at + 32 || (at == 0 && self.pool.samples > 0) {
            self.pool.ratios = (self.pool.samples.max(1), self.model.arch_ratios());
        }
    }

    /// Where task `t` of job `j` goes when its job has a `[pool]` section, or while
    /// providers' workers are connected (a job without one never goes to them): `Err` says
    /// why nowhere (its budget, its tenant's credits, or nothing fits). Call
    /// [`Coordinator::refresh_ratios`] and [`Coordinator::refresh_plan`] first.
    pub(super) fn pooled_decision(
        &self,
        j: &Job,
        t: TaskId,
        problem: &Problem<'_>,
        predict: &dyn Fn(Option<usize>, &str) -> flotilla_sched::Prediction,
    ) -> std::result::Result<sched::Decision, Refusal> {
        let room = j.pool.as_deref().and_then(JobPool::budget_room);
        // The task's time on each hardware class, once per class (not per machine).
        let mut est: HashMap<&str, Option<f64>> = HashMap::new();
        for w in self.workers.values() {
            est.entry(w.spec.hw_class.as_str())
                .or_insert_with(|| self.predicted(j, t, &w.spec.hw_class));
        }
        let est_of = |w: &Worker| est.get(w.spec.hw_class.as_str()).copied().flatten();
        let balance = self
            .ledger
            .balance(&flotilla_pool::Account::Tenant(j.tenant.clone()));
        let max = j
            .pool
            .as_deref()
            .map_or_else(Price::default, |p| max_price(&p.spec));
        let mut allowed: Vec<&Worker> = Vec::new();
        let mut short = Refusal::None;
        for w in self
            .workers
            .values()
            .filter(|w| !w.unavailable && self.in_time(j, t, w))
        {
            match self.refusal(j, t, w, (room, balance), &max, est_of(w)) {
                Refusal::None => allowed.push(w),
                r @ (Refusal::Budget(_) | Refusal::Credits(_)) => {
                    // The smallest hold refused: what would let the job go on.
                    if w.fits_total(resources_of(j, t, None))
                        && short.need().is_none_or(|n| r.need().is_some_and(|m| m < n))
                    {
                        short = r;
                    }
                }
                Refusal::Other => {}
            }
        }
        // Tiers of equal estimated cost (or energy), cheapest first; `time`: one tier.
        let objective = j
            .pool
            .as_deref()
            .map_or(Objective::Time, |p| p.spec.objective);
        let need = resources_of(j, t, None);
        let unit = |w: &Worker| -> f64 {
            let secs = est_of(w).unwrap_or(1.0);
            match objective {
                Objective::Cost => w
                    .spec
                    .price
                    .cost(&Metered::held(need.cpus, need.gpus, need.mem, secs))
                    .as_f64(),
                Objective::Energy => estimated_watts(need, w) * secs,
                Objective::Time => 0.0,
            }
        };
        let mut tiers: Vec<(f64, Vec<&Worker>)> = Vec::new();
        let mut ranked: Vec<(f64, &Worker)> = allowed.iter().map(|w| (unit(w), *w)).collect();
        // At one price, a task that cannot resume from a checkpoint goes to machines whose
        // owners will not reclaim them first.
        let fragile = j.graph.task(t).checkpoint.is_empty();
        ranked.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then((fragile && a.1.spec.preemptible).cmp(&(fragile && b.1.spec.preemptible)))
                .then(a.1.id.cmp(&b.1.id))
        });
        for (u, w) in ranked {
            let shy = fragile && w.spec.preemptible;
            match tiers.last_mut() {
                Some((tu, ws))
                    if (*tu - u).abs() <= 1e-12 * tu.abs().max(1.0)
                        && ws
                            .first()
                            .is_some_and(|f| (fragile && f.spec.preemptible) == shy) =>
                {
                    ws.push(w)
                }
                _ => tiers.push((u, vec![w])),
            }
        }
        // With a deadline: only machines where the task is predicted to end in time for
        // the rest of its path; when there are none, every machine at once (the fastest
        // wins).
        let latest = j.pool.as_deref().and_then(|p| self.latest_finish(j, p, t));
        let mut rush = false;
        if let Some(latest) = latest {
            let now = self.now;
            let in_time = |w: &&Worker| {
                let secs = est_of(w).unwrap_or(1.0);
                now.saturating_add((secs * 1000.0) as u64) <= latest
            };
            let kept: Vec<(f64, Vec<&Worker>)> = tiers
                .iter()
                .map(|(u, ws)| (*u, ws.iter().filter(|w| in_time(w)).copied().collect()))
                .filter(|(_, ws): &(f64, Vec<&Worker>)| !ws.is_empty())
                .collect();
            if kept.is_empty() {
                rush = true;
                let all: Vec<&Worker> = tiers.drain(..).flat_map(|(_, ws)| ws).collect();
                tiers.push((0.0, all));
            } else {
                tiers = kept;
            }
        }
        let n_tiers = tiers.len();
        let mut decision = None;
        for (i, (u, ws)) in tiers.iter().enumerate() {
            if let Some(mut d) = sched::place(problem, ws.iter().map(|w| w.node()), predict) {
                if j.pool.is_some() {
                    let w = &self.workers[&d.worker];
                    let what = match (&w.spec.provider, objective, rush) {
                        (_, _, true) => "no machine ends it in time for its deadline: the fastest within max_price".to_string(),
                        (None, _, _) => "the operator's own worker (trusted, free)".to_string(),
                        (Some(p), Objective::Energy, _) => format!("provider {p}: least estimated energy ({u:.0} J)"),
                        (Some(p), Objective::Time, _) => format!("provider {p}: objective time"),
                        (Some(p), Objective::Cost, _) => format!(
                            "provider {p} at {}: cheapest with room{} (tier {} of {n_tiers}, {u:.6} credits est.)",
                            w.spec.price,
                            if latest.is_some() { " that ends it in time for the deadline" } else { "" },
                            i + 1
                        ),
                    };
                    d.reason.why = format!("{}; {what}", d.reason.why);
                    // Kept for `status` (a plain eager reason is not).
                    d.reason.policy = format!("pool-{}", objective.as_str());
                }
                decision = Some(d);
                break;
            }
        }
        decision.ok_or(short)
    }

    /// Says why a pool job places nothing (`Refusal::Budget`, `Refusal::Credits`), or that
    /// it is not paused (anything else).
    pub(super) fn pause_for(&mut self, job: JobId, why: Refusal) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let tenant = j.tenant.clone();
        let balance = self
            .ledger
            .balance(&flotilla_pool::Account::Tenant(tenant.clone()));
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(p) = j.pool.as_deref_mut() else {
            return;
        };
        // What a hold is: the users saw "held 0 of 13" and could not tell why nothing ran.
        const HOLD: &str = "an attempt holds its price for the task's timeout, or for an hour \
                            while the task has no timeout and no runtime learned yet";
        p.paused = match why {
            Refusal::Budget(need) => {
                let budget = p.budget.unwrap_or_default();
                let left = budget - p.spent - p.held;
                Some(format!(
                    "paused: out of budget: its next task's hold is {need} credits, its budget \
                     has {left} left (budget {budget}, spent {}, held {}); {HOLD}. `flotilla \
                     budget {} +N` resumes it",
                    p.spent, p.held, job.0
                ))
            }
            Refusal::Credits(need) => Some(format!(
                "paused: tenant {tenant:?} has {balance} credits, its next task's hold is \
                 {need}; {HOLD}. An admin grants more (`flotilla admin tenant set {tenant} \
                 --grant C`)"
            )),
            Refusal::None | Refusal::Other => None,
        };
    }

    /// Why no connected worker that could hold task `t` of `j` may run it (the pool's
    /// rules, not room): `None` when one may, or none could hold it. A job that verified
    /// with `verify = 2` on a pool of one provider waited for ever with no word of why.
    pub(crate) fn unserved(&self, j: &Job, t: TaskId) -> Option<String> {
        if j.pool.is_none() && self.provider_workers == 0 {
            return None; // every worker is the operator's
        }
        let need = resources_of(j, t, None);
        let inst = j.graph.task(t);
        let max = j.pool.as_deref().map(|p| max_price(&p.spec));
        let mut why: Vec<String> = Vec::new();
        let mut say = |w: String| {
            if !why.contains(&w) {
                why.push(w);
            }
        };
        for w in self
            .workers
            .values()
            .filter(|w| !w.unavailable && w.fits_total(need))
        {
            let Some(provider) = w.spec.provider.as_deref() else {
                return None; // the operator's own worker takes anything
            };
            let Some(p) = j.pool.as_deref() else {
                say(
                    "the job has no [pool] section, so only the operator's own workers run it \
                     and only providers' workers are connected"
                        .into(),
                );
                continue;
            };
            if p.spec.trust == Trust::TrustedOnly {
                say("trust = \"trusted-only\": only the operator's own workers run it".into());
            } else if inst.gang.is_some() {
                say("a gang runs on the operator's own workers only".into());
            } else if max.is_some_and(|m| !w.spec.price.within(&m)) {
                say(format!(
                    "provider {provider} asks {} (above the job's max_price)",
                    w.spec.price
                ));
            } else if !self.pool.verifier.eligible(provider) {
                say(format!(
                    "provider {provider} gets no work (its results disagreed; see `flotilla \
                     provider list`)"
                ));
            } else if p
                .replicas
                .get(&t)
                .is_some_and(|rs| rs.iter().any(|r| r.provider.as_deref() == Some(provider)))
            {
                let k = match p.spec.verify {
                    Verify::Quorum(k) => k.max(2),
                    Verify::Adaptive => 2,
                };
                say(format!(
                    "provider {provider} ran it already: its result is checked by {k} distinct \
                     providers, and no other is connected"
                ));
            } else if p
                .excluded
                .get(&t)
                .is_some_and(|l| l.iter().any(|x| x == provider))
            {
                say(format!(
                    "provider {provider} disagreed with its accepted result"
                ));
            } else {
                return None; // it may run there: waiting for room, not for a provider
            }
        }
        (!why.is_empty()).then(|| format!("task {} waits: {}", inst.name, why.join("; ")))
    }

    /// The hardware classes of the live workers, each once.
    fn classes(&self) -> Vec<&str> {
        let mut c: Vec<&str> = self
            .workers
            .values()
            .map(|w| w.spec.hw_class.as_str())
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// The fastest time the model predicts for task `t` over `classes` (an unknown task:
    /// `fallback` seconds).
    fn fastest(&self, j: &Job, t: TaskId, classes: &[&str], fallback: f64) -> f64 {
        classes
            .iter()
            .filter_map(|hw| self.predicted(j, t, hw))
            .min_by(f64::total_cmp)
            .unwrap_or(fallback)
    }

    /// Recomputes a job's deadline plan when a hundredth of its tasks (at least one) ended
    /// since the last: each task's remaining path after it, longest first, at the fastest
    /// predicted times (linear in tasks and edges).
    pub(super) fn refresh_plan(&mut self, job: JobId) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let Some(p) = j.pool.as_deref() else {
            return;
        };
        if p.spec.deadline.is_none() {
            return;
        }
        let done = j.counts[TaskState::Done.index()];
        let step = (j.len() as u64 / 100).max(1);
        if p.plan.as_ref().is_some_and(|pl| done < pl.done_at + step) {
            return;
        }
        let n = j.len();
        // Kahn's order from the exits back.
        let mut left: Vec<usize> = (0..n)
            .map(|i| j.graph.succs(TaskId::new(i as u32)).len())
            .collect();
        let mut stack: Vec<usize> = (0..n).filter(|&i| left[i] == 0).collect();
        let mut after = vec![0.0f64; n];
        let classes = self.classes();
        let own: Vec<f64> = (0..n)
            .map(|i| self.fastest(j, TaskId::new(i as u32), &classes, 1.0))
            .collect();
        while let Some(i) = stack.pop() {
            let t = TaskId::new(i as u32);
            let tail = j
                .graph
                .succs(t)
                .iter()
                .map(|s| own[s.index()] + after[s.index()])
                .fold(0.0, f64::max);
            after[i] = tail;
            for &pr in j.graph.preds(t) {
                left[pr.index()] -= 1;
                if left[pr.index()] == 0 {
                    stack.push(pr.index());
                }
            }
        }
        if let Some(p) = self.jobs.get_mut(&job).and_then(|j| j.pool.as_deref_mut()) {
            p.plan = Some(Plan {
                done_at: done,
                own,
                after,
            });
        }
    }

    /// When task `t` must finish for the rest of its path to end by the deadline
    /// (milliseconds); `None` without a deadline or a plan.
    fn latest_finish(&self, j: &Job, p: &JobPool, t: TaskId) -> Option<Millis> {
        let deadline = p.spec.deadline?;
        let due = j.submitted.saturating_add(deadline.as_millis() as u64);
        let after = p.plan.as_ref()?.after.get(t.index()).copied()?;
        Some(due.saturating_sub((after * 1000.0) as u64))
    }

    /// Whether the job's remaining critical path (its unfinished tasks' fastest predicted
    /// times along its longest path) would end after its deadline.
    fn deadline_at_risk(&self, j: &Job, p: &JobPool) -> bool {
        let Some(deadline) = p.spec.deadline else {
            return false;
        };
        let due = j.submitted.saturating_add(deadline.as_millis() as u64);
        if self.now >= due {
            return true;
        }
        let Some(plan) = &p.plan else {
            return false;
        };
        let left_s = (due - self.now) as f64 / 1000.0;
        (0..j.len())
            .filter(|&i| !j.tasks[i].state.is_final())
            .any(|i| plan.own[i] + plan.after[i] > left_s)
    }

    /// An attempt was placed on `w`: holds its estimated cost when `w` is a priced
    /// provider's worker.
    pub(super) fn hold_for(&mut self, job: JobId, t: TaskId, attempt: u32, worker: WorkerId) {
        if self.pool.replaying {
            return;
        }
        let j = &self.jobs[&job];
        if j.pool.is_none() {
            return;
        }
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let amount = Self::hold_estimate(j, t, w, self.predicted(j, t, &w.spec.hw_class));
        if amount == Credits::ZERO {
            return;
        }
        let tref = j.tref(t);
        let key = format!("hold/{tref}/{attempt}");
        let tenant = j.tenant.clone();
        match self.ledger.hold(&key, &tenant, amount) {
            Ok(Applied::Done(tx)) => self.post((tref, attempt), tx),
            Ok(Applied::Duplicate) => {}
            Err(e) => {
                // Checked before placing; a refusal here leaves the attempt unheld (it is
                // still settled only from what the tenant has).
                tracing::warn!("{tref} attempt {attempt}: {e}");
            }
        }
    }

    /// Journals a transaction just made and applies it to the job's accounts.
    fn post(&mut self, attempt: (TaskRef, u32), tx: Transaction) {
        self.account(Some(attempt), &tx);
        self.journal.push(JournalRecord::Ledger {
            attempt: Some(attempt),
            tx,
        });
    }

    /// A transaction's effect on the job's accounts and the open holds.
    fn account(&mut self, attempt: Option<(TaskRef, u32)>, tx: &Transaction) {
        let Some(a) = attempt else {
            return;
        };
        let job = self
            .jobs
            .get_mut(&a.0.job)
            .and_then(|j| j.pool.as_deref_mut());
        match &tx.op {
            flotilla_pool::Op::Hold { amount, .. } => {
                self.pool.holds.insert(
                    a,
                    OpenHold {
                        key: tx.key.clone(),
                        amount: *amount,
                    },
                );
                if let Some(p) = job {
                    p.held += *amount;
                }
            }
            flotilla_pool::Op::Settle { cost, .. } => {
                let h = self.pool.holds.remove(&a);
                if let Some(p) = job {
                    p.held -= h.map_or(Credits::ZERO, |h| h.amount);
                    p.spent += *cost;
                    *p.cost.entry(a.0.task).or_default() += *cost;
                }
            }
            flotilla_pool::Op::Release { .. } => {
                let h = self.pool.holds.remove(&a);
                if let Some(p) = job {
                    p.held -= h.map_or(Credits::ZERO, |h| h.amount);
                }
            }
            flotilla_pool::Op::Grant { .. } => {}
        }
    }

    /// Settles attempt `a`'s hold at its metered cost, paying `provider`.
    fn settle_attempt(&mut self, a: (TaskRef, u32), worker: WorkerId, usage: &Usage) {
        if self.pool.replaying {
            return;
        }
        let Some(h) = self.pool.holds.get(&a).cloned() else {
            return;
        };
        let Some(pw) = self.pool.workers.get(&worker).cloned() else {
            return self.release_attempt(a);
        };
        let gpus = self
            .jobs
            .get(&a.0.job)
            .map_or(0.0, |j| j.graph.task(a.0.task).resources.gpus);
        let cost = pw.price.cost(&metered(usage, gpus));
        let key = format!("settle/{}/{}", a.0, a.1);
        match self
            .ledger
            .settle(&key, &h.key, &pw.provider, cost, self.pool.fee_ppm)
        {
            Ok(Applied::Done(tx)) => self.post(a, tx),
            Ok(Applied::Duplicate) => {}
            Err(e) => tracing::warn!("settling {}: {e}", h.key),
        }
    }

    /// A preempted attempt: settled (its provider paid for the work its checkpoint carries
    /// forward) when it left a checkpoint and its job does not verify replicas; its hold is
    /// released otherwise (by the sweep). Whether it was paid.
    pub(super) fn preempted_pay(
        &mut self,
        a: (TaskRef, u32),
        worker: WorkerId,
        carried: bool,
        usage: &Usage,
    ) -> bool {
        let verifies = self.jobs[&a.0.job]
            .pool
            .as_deref()
            .is_none_or(|p| p.verifies(a.0.task));
        if !carried || verifies || !self.pool.holds.contains_key(&a) {
            return false;
        }
        self.settle_attempt(a, worker, usage);
        true
    }

    /// Gives attempt `a`'s hold back whole.
    fn release_attempt(&mut self, a: (TaskRef, u32)) {
        if self.pool.replaying {
            return;
        }
        let Some(h) = self.pool.holds.get(&a).cloned() else {
            return;
        };
        let key = format!("release/{}/{}", a.0, a.1);
        match self.ledger.release(&key, &h.key) {
            Ok(Applied::Done(tx)) => self.post(a, tx),
            Ok(Applied::Duplicate) => {}
            Err(e) => tracing::warn!("releasing {}: {e}", h.key),
        }
    }

    /// Whether attempt `attempt` of `t` is a replica whose result waits for the others' (its
    /// hold stays until the verdict). Only while its job runs: a cancelled or failed job
    /// gives no verdict, and its replicas' holds stayed in escrow for good.
    fn awaits_verdict(j: &Job, t: TaskRef, attempt: u32) -> bool {
        j.is_active()
            && j.pool.as_deref().is_some_and(|p| {
                p.replicas
                    .get(&t.task)
                    .is_some_and(|rs| rs.iter().any(|r| r.attempt == attempt))
            })
    }

    /// A job ended: the holds of its attempts still in flight go back to its tenant at once
    /// (an ended job pays for nothing more; they waited for the workers' reports, while a
    /// restart released them, so the ledger after a replay was not the live one).
    pub(super) fn release_job_holds(&mut self, job: JobId) {
        let held: Vec<(TaskRef, u32)> = self
            .pool
            .holds
            .keys()
            .filter(|(t, _)| t.job == job)
            .copied()
            .collect();
        for a in held {
            self.release_attempt(a);
        }
    }

    /// After a restart: releases the holds the journal left open of attempts that are
    /// neither in flight nor waiting for a verdict: the replay skips the sweep that releases
    /// them as they end (a failed or lost attempt's hold stayed in escrow after a restart,
    /// found by the ledger's property test), and an older version kept those of replicas of
    /// jobs that ended.
    pub(super) fn release_stale_holds(&mut self) {
        let stale = self.leaked_holds();
        for a in stale {
            self.release_attempt(a);
        }
    }

    /// Releases the holds of attempts that are neither in flight nor waiting for a verdict
    /// (failed, cancelled, lost, returned, superseded), among the tasks whose state changed
    /// in `changes` (the commands of this event: every state change is notified).
    pub(super) fn sweep_holds(&mut self, changes: &[Command]) {
        if self.pool.replaying || self.pool.holds.is_empty() {
            return;
        }
        let mut stale: Vec<(TaskRef, u32)> = Vec::new();
        for c in changes {
            let Command::Notify(Notification::TaskState { task, state, .. }) = c else {
                continue;
            };
            if matches!(state, TaskState::Assigned | TaskState::Running) {
                continue;
            }
            let held = self
                .pool
                .holds
                .range((*task, 0)..=(*task, u32::MAX))
                .map(|(k, _)| *k);
            for (t, attempt) in held {
                let Some(j) = self.jobs.get(&t.job) else {
                    stale.push((t, attempt));
                    continue;
                };
                let rt = &j.tasks[t.task.index()];
                let in_flight = rt.attempt == attempt
                    && matches!(rt.state, TaskState::Assigned | TaskState::Running);
                if !in_flight && !Self::awaits_verdict(j, t, attempt) {
                    stale.push((t, attempt));
                }
            }
        }
        stale.sort_unstable();
        stale.dedup();
        for a in stale {
            self.release_attempt(a);
        }
    }

    /// Open holds of attempts neither in flight nor waiting for a verdict (none may be left
    /// after an event; after a replay, [`Coordinator::release_stale_holds`] releases them).
    pub(crate) fn leaked_holds(&self) -> Vec<(TaskRef, u32)> {
        self.pool
            .holds
            .keys()
            .filter(|(t, attempt)| {
                let Some(j) = self.jobs.get(&t.job) else {
                    return true;
                };
                let rt = &j.tasks[t.task.index()];
                let in_flight = rt.attempt == *attempt
                    && matches!(rt.state, TaskState::Assigned | TaskState::Running);
                !in_flight && !Self::awaits_verdict(j, *t, *attempt)
            })
            .copied()
            .collect()
    }

    // ---- results ----

    /// A successful attempt of a job with a `[pool]` section: verified when the job asks,
    /// settled when accepted. `false`: not the pool's (the caller marks it done).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pool_succeeded(
        &mut self,
        task: TaskRef,
        attempt: u32,
        ran_on: WorkerId,
        hw_class: Option<String>,
        variant: Option<String>,
        usage: Usage,
        outputs: Vec<ObjectRef>,
        out: &mut Vec<Command>,
    ) -> bool {
        let j = &self.jobs[&task.job];
        let Some(p) = j.pool.as_deref() else {
            return false;
        };
        let t = task.task;
        if !p.verifies(t) {
            self.settle_attempt((task, attempt), ran_on, &usage);
            return false;
        }
        let provider = self.pool.workers.get(&ran_on).map(|w| w.provider.clone());
        let replica = Replica {
            attempt,
            worker: ran_on,
            provider,
            hash: result_hash(&outputs),
            outputs,
            usage,
            variant,
            hw_class,
        };
        let p = self
            .jobs
            .get_mut(&task.job)
            .and_then(|j| j.pool.as_deref_mut())
            .expect("checked above");
        let rs = p.replicas.entry(t).or_default();
        if !rs.iter().any(|r| r.attempt == attempt) {
            rs.push(replica);
        }
        if self.pool.replaying {
            // The verdict is the next record.
            return true;
        }
        let mut verdict = self.judge(task);
        let caught = self.record_reputations(task, &verdict);
        if let VerdictRecord::Accepted { reverify, .. } = &mut verdict {
            *reverify = caught;
        }
        self.journal.push(JournalRecord::Verdict {
            task,
            attempt,
            verdict: verdict.clone(),
        });
        self.apply_verdict(task, attempt, &verdict, out);
        true
    }

    /// An accepted verdict's effect on the providers' reputations; the tasks to verify
    /// again (those a rejected provider had been trusted with alone). Nothing for the others.
    fn record_reputations(&mut self, task: TaskRef, verdict: &VerdictRecord) -> Vec<u64> {
        match verdict {
            VerdictRecord::Accepted {
                agreed,
                rejected,
                alone,
                ..
            } => self.pool.verifier.record(
                task_key(task),
                &Accepted {
                    agreed,
                    rejected,
                    alone: *alone,
                },
            ),
            VerdictRecord::NeedMore { .. } | VerdictRecord::Failed { .. } => Vec::new(),
        }
    }

    /// The verdict on task `task`'s results so far.
    fn judge(&self, task: TaskRef) -> VerdictRecord {
        let p = self.jobs[&task.job]
            .pool
            .as_deref()
            .expect("a pool job's task");
        let rs = p.replicas.get(&task.task).map_or(&[][..], Vec::as_slice);
        // A result from the operator's own worker decides alone; the providers' results are
        // judged against it.
        if let Some(trusted) = rs.iter().find(|r| r.provider.is_none()) {
            let (mut agreed, mut rejected) = (Vec::new(), Vec::new());
            for r in rs {
                if let Some(p) = &r.provider {
                    if r.hash == trusted.hash {
                        agreed.push(p.clone());
                    } else {
                        rejected.push(p.clone());
                    }
                }
            }
            return VerdictRecord::Accepted {
                hash: trusted.hash.clone(),
                agreed,
                rejected,
                alone: false,
                reverify: Vec::new(),
            };
        }
        let results: Vec<(String, String)> = rs
            .iter()
            .filter_map(|r| r.provider.clone().map(|p| (p, r.hash.clone())))
            .collect();
        let (adaptive, quorum) = if p.requorum.contains(&task.task) {
            (false, 2)
        } else {
            match p.spec.verify {
                Verify::Adaptive => (true, 1),
                Verify::Quorum(k) => (false, k),
            }
        };
        match self
            .pool
            .verifier
            .judge(task_key(task), adaptive, quorum, &results)
        {
            Verdict::Accepted {
                hash,
                agreed,
                rejected,
                alone,
                ..
            } => VerdictRecord::Accepted {
                hash,
                agreed,
                rejected,
                alone,
                reverify: Vec::new(),
            },
            Verdict::NeedMore { more } => VerdictRecord::NeedMore { more },
            Verdict::Failed { why } => VerdictRecord::Failed { why },
            Verdict::Late => VerdictRecord::NeedMore { more: 0 },
        }
    }

    /// Applies a verdict (just judged, or replayed; its reputations recorded by the
    /// caller): payment, and the task's state.
    pub(super) fn apply_verdict(
        &mut self,
        task: TaskRef,
        attempt: u32,
        verdict: &VerdictRecord,
        out: &mut Vec<Command>,
    ) {
        match verdict {
            VerdictRecord::Accepted {
                hash,
                agreed,
                rejected,
                alone,
                reverify,
            } => {
                let Some(j) = self.jobs.get_mut(&task.job) else {
                    return;
                };
                let Some(p) = j.pool.as_deref_mut() else {
                    return;
                };
                let mut names = agreed.clone();
                names.sort();
                p.agreed.insert(task.task, (names, *alone));
                let rs = p.replicas.remove(&task.task).unwrap_or_default();
                let stale = p.suspect.remove(&task.task).filter(|old| old != hash);
                p.requorum.remove(&task.task);
                p.rejected += rejected.len() as u64;
                p.excluded
                    .entry(task.task)
                    .or_default()
                    .extend(rejected.iter().cloned());
                if stale.is_some() {
                    // Before the task is done again (which may end the job): its consumers
                    // that read the old result go back first.
                    self.rerun_consumers(task, out);
                }
                let mut winner: Option<Replica> = None;
                let mut holders = Vec::new();
                for r in rs {
                    if r.hash == *hash {
                        self.settle_attempt((task, r.attempt), r.worker, &r.usage);
                        holders.push(r.worker);
                        if winner.is_none() {
                            winner = Some(r);
                        }
                    } else {
                        self.release_attempt((task, r.attempt));
                    }
                }
                if let Some(r) = winner {
                    let j = &self.jobs[&task.job];
                    let current = j.tasks[task.task.index()].state != TaskState::Done;
                    if current {
                        self.accept_result(task, r, &holders, out);
                    }
                }
                for &k in reverify {
                    self.reverify(task_of_key(k), rejected, out);
                }
            }
            VerdictRecord::NeedMore { more } => {
                let Some(j) = self.jobs.get_mut(&task.job) else {
                    return;
                };
                let have = j
                    .pool
                    .as_deref()
                    .and_then(|p| p.replicas.get(&task.task))
                    .map_or(0, Vec::len);
                let rt = &mut j.tasks[task.task.index()];
                if rt.attempt == attempt
                    && matches!(rt.state, TaskState::Assigned | TaskState::Running)
                {
                    rt.worker = None;
                    if j.is_active() {
                        j.runnable(
                            task.task,
                            Some(format!(
                                "verifying: {have} result(s) so far, {more} more from other \
                                 providers"
                            )),
                            out,
                        );
                    } else {
                        j.set_state(task.task, TaskState::Cancelled, None, out);
                    }
                }
            }
            VerdictRecord::Failed { why } => {
                let Some(j) = self.jobs.get_mut(&task.job) else {
                    return;
                };
                let rs = j
                    .pool
                    .as_deref_mut()
                    .and_then(|p| p.replicas.remove(&task.task))
                    .unwrap_or_default();
                for r in &rs {
                    self.release_attempt((task, r.attempt));
                }
                let j = self.jobs.get_mut(&task.job).expect("present above");
                if j.is_active() {
                    j.set_state(task.task, TaskState::Failed, Some(why.clone()), out);
                    self.failed_for_good(task.job, task.task, out);
                }
            }
        }
    }

    /// Marks a verified task done with its accepted result; every worker whose result
    /// agreed holds its outputs.
    fn accept_result(
        &mut self,
        task: TaskRef,
        r: Replica,
        holders: &[WorkerId],
        out: &mut Vec<Command>,
    ) {
        let first = r.worker;
        self.attempt_succeeded(
            super::reports::Succeeded {
                task,
                ran_on: r.worker,
                hw_class: r.hw_class,
                variant: r.variant,
                usage: r.usage,
                outputs: r.outputs,
            },
            out,
        );
        let Some(j) = self.jobs.get_mut(&task.job) else {
            return;
        };
        if j.staging != Staging::Transfer {
            return;
        }
        for &h in holders.iter().filter(|&&h| h != first) {
            if let Some(w) = self.workers.get_mut(&h) {
                let hs = j.holders.entry(task.task).or_default();
                if !hs.contains(&h) {
                    hs.push(h);
                }
                w.holds.insert(task);
            }
        }
    }

    /// A task whose result was accepted alone from a provider since caught cheating: run it
    /// again on two other providers (while its job runs).
    fn reverify(&mut self, task: TaskRef, caught: &[String], out: &mut Vec<Command>) {
        let Some(j) = self.jobs.get_mut(&task.job) else {
            return;
        };
        if !j.is_active() || task.task.index() >= j.len() {
            return;
        }
        let done = j.tasks[task.task.index()].state == TaskState::Done;
        let had = j
            .outputs
            .get(&task.task)
            .filter(|_| done)
            .map(|o| result_hash(o));
        if let Some(p) = j.pool.as_deref_mut() {
            p.requorum.insert(task.task);
            p.excluded
                .entry(task.task)
                .or_default()
                .extend(caught.iter().cloned());
            if let Some(h) = had {
                p.suspect.insert(task.task, h);
            }
        }
        if done {
            j.undo_done(
                &[task.task],
                "verified again: its provider was caught returning wrong results",
                out,
            );
        }
    }

    /// Task `task`'s result, verified again, differs from the one its successors read: every
    /// task downstream of it that ran on the wrong one runs again (done ones are put back,
    /// running ones are cancelled and rerun, results waiting for a verdict are dropped and
    /// their holds given back). A task that has not started reads the new result anyway.
    fn rerun_consumers(&mut self, task: TaskRef, out: &mut Vec<Command>) {
        let Some(j) = self.jobs.get(&task.job) else {
            return;
        };
        if !j.is_active() {
            return;
        }
        let mut seen: HashSet<TaskId> = HashSet::new();
        let mut stack = vec![task.task];
        let mut done = Vec::new();
        let mut running = Vec::new();
        let mut waiting = Vec::new();
        while let Some(t) = stack.pop() {
            for &s in j.graph.succs(t) {
                if !seen.insert(s) {
                    continue;
                }
                stack.push(s);
                let rt = &j.tasks[s.index()];
                match rt.state {
                    TaskState::Done => done.push(s),
                    TaskState::Assigned | TaskState::Running => {
                        running.push((s, rt.attempt, rt.worker))
                    }
                    _ => {}
                }
                if j.pool
                    .as_deref()
                    .is_some_and(|p| p.replicas.contains_key(&s))
                {
                    waiting.push(s);
                }
            }
        }
        let why = format!(
            "runs again: {} was verified again and its result differs from the one it read",
            j.graph.task(task.task).name
        );
        for s in waiting {
            let rs = self
                .jobs
                .get_mut(&task.job)
                .and_then(|j| j.pool.as_deref_mut())
                .and_then(|p| p.replicas.remove(&s))
                .unwrap_or_default();
            let tref = TaskRef {
                job: task.job,
                task: s,
            };
            for r in rs {
                self.release_attempt((tref, r.attempt));
            }
        }
        for (s, attempt, owner) in running {
            let tref = TaskRef {
                job: task.job,
                task: s,
            };
            self.break_attempt(tref, attempt, owner, &why, out);
        }
        done.sort_unstable();
        self.job(task.job).undo_done(&done, &why, out);
    }
}
