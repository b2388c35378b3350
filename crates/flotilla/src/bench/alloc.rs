//! `flotilla bench alloc`: workers that arrive only through batch allocations (Slurm), asked
//! for by the reactive rule or the predictive one ([`flotilla_sched::alloc`]), with the
//! coordinator's own state machine in virtual time ([`ClusterSim`]).
//!
//! - **Work.** The workflow traces (WfCommons, `tests/data/workflows`) submitted in waves:
//!   every trace at once at time 0, again `--gap` seconds later, `--waves` times (a
//!   scientist's campaign; between waves nothing is ready).
//! - **Allocations.** Each one starts after a wait in the batch queue (exponential, mean
//!   `--queue-wait`; the n-th allocation submitted waits the n-th draw under both rules, so
//!   the rules meet the same queue), brings `--workers-per-alloc` workers of `--cpus` CPUs,
//!   and ends at its time limit. A worker with nothing to run for `--idle-timeout` leaves;
//!   the allocation ends when its last worker has. A worker reaching the time limit while
//!   tasks run on it is lost with them (the work is counted as cut: the allocator of
//!   `flotilla alloc` drains before the limit; here both rules pay it alike).
//! - **What the allocator knows.** Ready tasks no worker can take; the CPU-seconds of work
//!   not done (the traces' runtimes stand for the learned performance models); each
//!   unfinished job's critical path scaled by the share of its work left; the batch queue's
//!   wait as learnt from the allocations started so far.
//!
//! Figures: the makespan, the time to the first task, the allocation CPU-hours in all, how
//! many of them were idle (held with nothing running on them), the worker-hours of whole
//! idle workers, the work cut at time limits, and the allocations submitted and cancelled
//! while queued.

use std::collections::HashMap;

use flotilla_cluster::sim::{ClusterSim, SimError, Start};
use flotilla_cluster::state::{AttemptOutcome, Config};
use flotilla_core::{JobId, WorkerId};
use flotilla_pool::sim::Rng;
use flotilla_sched::alloc::{decide, mean_width, AllocParams, Demand, Fleet, Left, Rule};
use serde::Serialize;

use super::wfcommons::{TraceJob, TraceRuntimes};

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct AllocConfig {
    /// The rule that sizes the requests.
    pub rule: Rule,
    /// The queue's settings.
    pub params: AllocParams,
    /// Seconds a worker waits with nothing to run before it leaves.
    pub idle_timeout_s: f64,
    /// Mean seconds an allocation waits in the batch queue (exponential).
    pub queue_wait_s: f64,
    /// How many times the traces are submitted.
    pub waves: usize,
    /// Seconds between waves.
    pub gap_s: f64,
    /// Seeds the queue waits.
    pub seed: u64,
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct AllocReport {
    /// `"alloc"`.
    pub bench: &'static str,
    /// `"reactive"` or `"predictive"`.
    pub rule: String,
    /// Jobs submitted and succeeded.
    pub jobs: usize,
    /// Jobs that succeeded.
    pub succeeded: usize,
    /// Tasks submitted.
    pub tasks: usize,
    /// When the last task ended, seconds.
    pub makespan_s: f64,
    /// When the first task started, seconds after the first wave.
    pub first_task_s: f64,
    /// Allocations submitted.
    pub allocations: usize,
    /// Allocations cancelled while still queued.
    pub cancelled: usize,
    /// CPU-hours held by started allocations' workers.
    pub cpu_hours: f64,
    /// Of those, the CPU-hours with nothing running on them.
    pub idle_cpu_hours: f64,
    /// Worker-hours held by workers with nothing running at all (whole idle workers).
    pub idle_worker_hours: f64,
    /// CPU-hours of work cut by time limits (ran again).
    pub cut_cpu_hours: f64,
    /// CPU-hours of work done.
    pub useful_cpu_hours: f64,
}

struct Allocation {
    /// When it starts (virtual seconds); `None` once started or cancelled.
    starts_at: Option<f64>,
    /// When it ends at the latest.
    ends_at: f64,
    /// Its workers while they run, with the time each last had something to run.
    workers: Vec<(WorkerId, f64)>,
    started: bool,
}

/// Runs one simulation.
pub fn run(cfg: &AllocConfig, traces: &[(String, TraceJob)]) -> anyhow::Result<AllocReport> {
    anyhow::ensure!(!traces.is_empty(), "no workflow traces");
    anyhow::ensure!(cfg.waves > 0, "--waves must be at least 1");
    let sim_err = |e: SimError| anyhow::anyhow!("{e}");
    let mut sim = ClusterSim::new(Config::default());
    let mut specs = Vec::with_capacity(traces.len());
    let mut graphs = Vec::with_capacity(traces.len());
    for (name, tj) in traces {
        let spec = flotilla_core::parse_job(&tj.toml, name)?;
        graphs.push(spec.expand()?);
        specs.push(spec);
    }
    let runtime = TraceRuntimes::new(traces);
    let mut duration = |s: &Start<'_>| -> Result<(u64, AttemptOutcome), SimError> {
        let secs = runtime.of(&s.assignment.job_name, &s.assignment.name);
        Ok(((secs * 1000.0).ceil() as u64, AttemptOutcome::Succeeded))
    };
    let mut waits = Rng(cfg.seed ^ 0x616c_6c6f_6300);
    let p = &cfg.params;
    let step_ms: u64 = 10_000;
    let mut now_ms: u64 = 0;
    // Per job: (trace index, total work, work done).
    let mut jobs: HashMap<JobId, (usize, f64, f64)> = HashMap::new();
    let mut waves_sent = 0usize;
    let mut tasks = 0usize;
    let mut allocs: Vec<Allocation> = Vec::new();
    let mut cancelled = 0usize;
    let mut observed_waits: Vec<f64> = Vec::new();
    let mut submitted_at: Vec<f64> = Vec::new();
    let mut held_cpu_s = 0.0;
    let mut idle_worker_s = 0.0;
    let mut busy_cpu_s = 0.0;
    let mut cut_cpu_s = 0.0;
    let mut seen_runs = 0usize;
    let mut last_end: u64 = 0;
    let mut first_start: Option<u64> = None;
    let mut done_tasks = 0usize;
    loop {
        let secs = now_ms as f64 / 1000.0;
        // Waves of work.
        while waves_sent < cfg.waves && secs >= waves_sent as f64 * cfg.gap_s {
            for (i, (_, tj)) in traces.iter().enumerate() {
                let job = sim.submit(specs[i].clone()).map_err(sim_err)?;
                jobs.insert(job, (i, tj.total_work, 0.0));
                tasks += tj.tasks;
            }
            waves_sent += 1;
        }
        // Allocations that start now.
        for (n, a) in allocs.iter_mut().enumerate() {
            if a.starts_at.is_some_and(|t| t <= secs) {
                a.starts_at = None;
                a.started = true;
                a.ends_at = secs + p.time_limit_s;
                observed_waits.push(secs - submitted_at[n]);
                for i in 0..p.workers_per_alloc {
                    let w = sim
                        .add_worker(super::wfcommons::sim_worker(
                            format!("a{n}w{i}"),
                            "node",
                            p.cpus_per_worker,
                        ))
                        .map_err(sim_err)?;
                    a.workers.push((w, secs));
                }
            }
        }
        // Workers that reach their time limit or sat idle too long leave.
        for a in allocs.iter_mut().filter(|a| a.started) {
            let ends_at = a.ends_at;
            let mut kept = Vec::with_capacity(a.workers.len());
            for &(w, mut last_busy) in &a.workers {
                if sim.running_count(w) > 0 {
                    last_busy = secs;
                }
                if secs >= ends_at {
                    for run in sim.lose(w).map_err(sim_err)? {
                        cut_cpu_s += run.end.saturating_sub(run.start) as f64 / 1000.0 * run.cpus;
                    }
                } else if secs - last_busy >= cfg.idle_timeout_s {
                    sim.lose(w).map_err(sim_err)?;
                } else {
                    kept.push((w, last_busy));
                }
            }
            a.workers = kept;
        }
        // What the allocator knows, and its decision.
        let summaries = sim.coordinator().jobs();
        let waiting_cpus: f64 = summaries.iter().map(|j| j.counts.ready as f64).sum();
        let remaining: f64 = jobs
            .values()
            .map(|(_, total, done)| (total - done).max(0.0))
            .sum();
        let queue_wait_s = if observed_waits.is_empty() {
            0.0
        } else {
            observed_waits.iter().sum::<f64>() / observed_waits.len() as f64
        };
        // The work left laid out as soon as possible: what it uses over the window a new
        // allocation would serve (from its start, as long again as the wait, at least 5
        // minutes). Only the predictive rule reads it.
        let future_cpus = if cfg.rule == Rule::Predictive {
            let left = work_left(&sim, &summaries, &jobs, &graphs, traces, &runtime);
            let from = queue_wait_s;
            mean_width(&left, from, from + 300.0)
        } else {
            0.0
        };
        let fleet = Fleet {
            queued: allocs.iter().filter(|a| a.starts_at.is_some()).count() as u32,
            running_left_s: allocs
                .iter()
                .filter(|a| a.started && !a.workers.is_empty())
                .map(|a| (a.ends_at - secs).max(0.0))
                .collect(),
        };
        let demand = Demand {
            waiting_cpus,
            future_cpus,
            remaining_cpu_s: remaining,
            deadline_s: None,
            queue_wait_s,
        };
        let d = decide(cfg.rule, p, &fleet, &demand);
        for _ in 0..d.submit {
            allocs.push(Allocation {
                starts_at: Some(secs + waits.exp(cfg.queue_wait_s.max(1e-3))),
                ends_at: f64::INFINITY,
                workers: Vec::new(),
                started: false,
            });
            submitted_at.push(secs);
        }
        // Cancel the queued allocations submitted last (they would start last).
        let mut to_cancel = d.cancel_queued;
        for a in allocs.iter_mut().rev() {
            if to_cancel == 0 {
                break;
            }
            if a.starts_at.is_some() {
                a.starts_at = None;
                cancelled += 1;
                to_cancel -= 1;
            }
        }
        // Time passes.
        let until = now_ms + step_ms;
        sim.run_until(until, usize::MAX, &mut duration)
            .map_err(sim_err)?;
        let live: usize = allocs.iter().map(|a| a.workers.len()).sum();
        held_cpu_s += live as f64 * p.cpus_per_worker * step_ms as f64 / 1000.0;
        let idle = allocs
            .iter()
            .flat_map(|a| a.workers.iter())
            .filter(|(w, _)| sim.running_count(*w) == 0)
            .count();
        idle_worker_s += idle as f64 * step_ms as f64 / 1000.0;
        for r in &sim.runs()[seen_runs..] {
            let s = r.end.saturating_sub(r.start) as f64 / 1000.0 * r.cpus;
            first_start = Some(first_start.map_or(r.start, |f| f.min(r.start)));
            if r.outcome == AttemptOutcome::Succeeded {
                done_tasks += 1;
                last_end = last_end.max(r.end);
                busy_cpu_s += s;
                if let Some(j) = jobs.get_mut(&r.task.job) {
                    j.2 += s;
                }
            }
        }
        seen_runs = sim.runs().len();
        now_ms = until;
        if waves_sent >= cfg.waves && done_tasks >= tasks {
            break;
        }
        anyhow::ensure!(
            now_ms < 60 * 24 * 3600 * 1000,
            "the run did not end within 60 virtual days ({done_tasks} of {tasks} tasks done)"
        );
    }
    let succeeded = sim
        .coordinator()
        .jobs()
        .iter()
        .filter(|j| j.state == flotilla_cluster::state::JobState::Succeeded)
        .count();
    Ok(AllocReport {
        bench: "alloc",
        rule: match cfg.rule {
            Rule::Reactive => "reactive",
            Rule::Predictive => "predictive",
        }
        .into(),
        jobs: jobs.len(),
        succeeded,
        tasks,
        makespan_s: last_end as f64 / 1000.0,
        first_task_s: first_start.unwrap_or(0) as f64 / 1000.0,
        allocations: allocs.len(),
        cancelled,
        cpu_hours: held_cpu_s / 3600.0,
        idle_cpu_hours: (held_cpu_s - busy_cpu_s - cut_cpu_s).max(0.0) / 3600.0,
        idle_worker_hours: idle_worker_s / 3600.0,
        cut_cpu_hours: cut_cpu_s / 3600.0,
        useful_cpu_hours: busy_cpu_s / 3600.0,
    })
}

/// Every unfinished job's tasks not done, in topological order with their predecessors
/// among them, timed by the traces' runtimes (standing for the learned models; a running
/// task counts whole).
fn work_left(
    sim: &ClusterSim,
    summaries: &[flotilla_cluster::state::JobSummary],
    jobs: &HashMap<JobId, (usize, f64, f64)>,
    graphs: &[flotilla_core::TaskGraph],
    traces: &[(String, TraceJob)],
    runtime: &TraceRuntimes,
) -> Vec<Left> {
    use flotilla_cluster::state::{JobState, TaskState};
    let mut left = Vec::new();
    for summary in summaries {
        if summary.state != JobState::Running {
            continue;
        }
        let Some(&(trace, _, _)) = jobs.get(&summary.id) else {
            continue;
        };
        let Some(status) = sim
            .coordinator()
            .job_status_range(summary.id, 0, usize::MAX)
        else {
            continue;
        };
        let graph = &graphs[trace];
        let name = &traces[trace].0;
        let mut at: HashMap<flotilla_core::TaskId, usize> = HashMap::new();
        let mut ended = vec![true; graph.len()];
        for t in &status.tasks {
            if let Some(e) = ended.get_mut(t.id.index()) {
                *e = matches!(
                    t.state,
                    TaskState::Done | TaskState::Failed | TaskState::Cancelled
                );
            }
        }
        let done = |id: flotilla_core::TaskId| ended.get(id.index()).is_none_or(|&e| e);
        for &id in graph.topological_order() {
            if done(id) {
                continue;
            }
            let task = graph.task(id);
            let preds = graph
                .preds(id)
                .iter()
                .filter_map(|p| at.get(p).copied())
                .collect();
            at.insert(id, left.len());
            left.push(Left {
                cpus: task.resources.cpus.max(0.0),
                secs: runtime.of(name, &task.name),
                preds,
            });
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_rules_finish_every_job_through_allocations_alone() {
        let traces = super::super::market::traces().expect("the repository's traces");
        let cfg = AllocConfig {
            rule: Rule::Reactive,
            params: AllocParams {
                workers_per_alloc: 2,
                cpus_per_worker: 4.0,
                max_allocs: 8,
                backlog: 2,
                time_limit_s: 3600.0,
            },
            idle_timeout_s: 300.0,
            queue_wait_s: 120.0,
            waves: 2,
            gap_s: 7200.0,
            seed: 3,
        };
        for rule in [Rule::Reactive, Rule::Predictive] {
            let r = run(
                &AllocConfig {
                    rule,
                    ..cfg.clone()
                },
                &traces,
            )
            .expect("runs");
            assert_eq!(r.succeeded, r.jobs, "{r:?}");
            assert!(r.allocations > 0 && r.first_task_s > 0.0, "{r:?}");
            assert!(r.useful_cpu_hours > 0.0, "{r:?}");
            // What was held covers the work done on it.
            assert!(r.cpu_hours + 1e-6 >= r.useful_cpu_hours, "{r:?}");
        }
    }
}
