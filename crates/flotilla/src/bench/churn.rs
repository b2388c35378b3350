//! `flotilla bench churn`: the coordinator's own state machine at scale, in virtual time
//! ([`ClusterSim`]): 10,000 to 100,000 workers that come and go as volunteer hosts do, and
//! the workflow traces (WfCommons, `tests/data/workflows`) submitted as a stream of jobs,
//! copies of the traces in turn, up to a million tasks.
//!
//! - **Churn.** Each host is on for an exponential time (mean `--on-mean`, 2 h), then off for
//!   one (mean `--off-mean`, 1 h), as volunteer hosts are measured to be. A host going off is
//!   its worker lost without a word: the attempts running there are wasted and placed again.
//!   A host coming back joins as a new worker.
//! - **Load.** A job is submitted whenever fewer than `--backlog` × the cores online tasks are
//!   submitted and not yet done (a closed loop: a busy shared cluster), until `--tasks`.
//! - **Runtimes.** Each task takes its trace runtime (at least 0.1 s) on every worker (one
//!   hardware class): the lower bound below is then exact for the work.
//!
//! Figures: the coordinator's wall time per event and per placement (the scheduler's cost per
//! decision, measured around each `handle` call), the makespan against the lower bound
//! max(longest critical path, total work / cores online on average), the CPU-seconds lost
//! with lost workers, and the peak memory of the process.

use flotilla_cluster::sim::{ClusterSim, SimError, Start};
use flotilla_cluster::state::{AttemptOutcome, Config, WorkerSpec};
use flotilla_core::WorkerId;
use flotilla_pool::sim::Rng;
use serde::Serialize;

use super::wfcommons::{TraceJob, TraceRuntimes};

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct ChurnConfig {
    /// Hosts (one worker each while on).
    pub workers: usize,
    /// CPUs per worker.
    pub cpus: f64,
    /// Tasks to submit in all.
    pub tasks: usize,
    /// Mean seconds on and off (exponential); `None`: every host stays on.
    pub churn: Option<(f64, f64)>,
    /// Tasks submitted and not done kept at this × the cores online.
    pub backlog: f64,
    /// Seeds the draws (on/off times).
    pub seed: u64,
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnReport {
    /// `"churn"`.
    pub bench: &'static str,
    /// Hosts.
    pub workers: usize,
    /// CPUs per worker.
    pub cpus: f64,
    /// Mean seconds on and off, when hosts come and go.
    pub on_off_s: Option<(f64, f64)>,
    /// Jobs submitted.
    pub jobs: usize,
    /// Tasks submitted.
    pub tasks: usize,
    /// Jobs that succeeded.
    pub succeeded: usize,
    /// Attempts that ran (including lost ones).
    pub attempts: usize,
    /// Workers lost (hosts going off).
    pub lost_workers: usize,
    /// Virtual seconds from the first submission to the last task's end.
    pub makespan_s: f64,
    /// max(longest critical path, total work / cores online on average).
    pub lower_bound_s: f64,
    /// Makespan over the lower bound.
    pub ratio_to_bound: f64,
    /// Cores online, averaged over the makespan.
    pub mean_cores: f64,
    /// CPU-seconds of the attempts that succeeded.
    pub useful_cpu_s: f64,
    /// CPU-seconds of the attempts lost with their workers.
    pub wasted_cpu_s: f64,
    /// Events the coordinator handled.
    pub events: u64,
    /// Microseconds of coordinator time per event.
    pub us_per_event: f64,
    /// Microseconds of coordinator time per attempt placed (the scheduler's cost per
    /// decision, with everything else an event costs).
    pub us_per_placement: f64,
    /// Wall seconds of the whole run (the agents' simulation included).
    pub wall_s: f64,
    /// Peak resident memory of this process, MB (Linux; 0 elsewhere).
    pub peak_mb: f64,
}

/// One host.
struct Host {
    /// Its worker while on.
    worker: Option<WorkerId>,
    /// When it next turns off (on) or on (off), virtual seconds.
    next: f64,
}

fn spec(i: usize, cpus: f64) -> WorkerSpec {
    super::wfcommons::sim_worker(format!("h{i}"), "host", cpus)
}

/// Peak resident memory of this process (VmHWM), MB.
fn peak_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs once.
pub fn run(cfg: &ChurnConfig, traces: &[(String, TraceJob)]) -> anyhow::Result<ChurnReport> {
    anyhow::ensure!(!traces.is_empty(), "no workflow traces");
    anyhow::ensure!(cfg.workers > 0, "--workers must be at least 1");
    let wall = std::time::Instant::now();
    let sim_err = |e: SimError| anyhow::anyhow!("{e}");
    let mut rng = Rng(cfg.seed ^ 0x6368_7572_6e00);
    let mut sim = ClusterSim::new(Config::default());
    let mut hosts: Vec<Host> = Vec::with_capacity(cfg.workers);
    for i in 0..cfg.workers {
        let worker = sim.add_worker(spec(i, cfg.cpus)).map_err(sim_err)?;
        let next = cfg.churn.map_or(f64::INFINITY, |(on, _)| rng.exp(on));
        hosts.push(Host {
            worker: Some(worker),
            next,
        });
    }
    // The traces parsed once; each copy is submitted as its own job.
    let mut specs = Vec::with_capacity(traces.len());
    for (name, tj) in traces {
        specs.push(flotilla_core::parse_job(&tj.toml, name)?);
    }
    let runtime = TraceRuntimes::new(traces);
    let mut duration = |s: &Start<'_>| -> Result<(u64, AttemptOutcome), SimError> {
        let secs = runtime.of(&s.assignment.job_name, &s.assignment.name);
        Ok(((secs * 1000.0).ceil() as u64, AttemptOutcome::Succeeded))
    };
    let step_ms: u64 = 10_000;
    let mut now_ms: u64 = 0;
    let mut submitted = 0usize;
    let mut jobs = 0usize;
    let mut longest_path = 0.0f64;
    let mut total_work = 0.0f64;
    let mut lost_workers = 0usize;
    let mut lost_attempts = 0usize;
    let mut wasted_cpu_s = 0.0;
    let mut done_tasks = 0usize;
    let mut seen_runs = 0usize;
    let mut online = cfg.workers;
    // (step start, cores online during it), for the cores online on average.
    let mut cores_at: Vec<(u64, f64)> = Vec::new();
    let mut next_trace = 0usize;
    let mut last_end: u64 = 0;
    loop {
        let secs = now_ms as f64 / 1000.0;
        // Hosts that go off or come back.
        if cfg.churn.is_some() {
            let (on_mean, off_mean) = cfg.churn.unwrap_or((1.0, 1.0));
            for (i, h) in hosts.iter_mut().enumerate() {
                while h.next <= secs {
                    match h.worker.take() {
                        Some(w) => {
                            for run in sim.lose(w).map_err(sim_err)? {
                                let s = run.end.saturating_sub(run.start) as f64 / 1000.0;
                                wasted_cpu_s += s * run.cpus;
                                lost_attempts += 1;
                            }
                            lost_workers += 1;
                            online -= 1;
                            h.next += rng.exp(off_mean);
                        }
                        None => {
                            h.worker = Some(sim.add_worker(spec(i, cfg.cpus)).map_err(sim_err)?);
                            online += 1;
                            h.next += rng.exp(on_mean);
                        }
                    }
                }
            }
        }
        // Submissions: the backlog kept up.
        let want = (cfg.backlog * online as f64 * cfg.cpus).ceil() as usize;
        while submitted < cfg.tasks && submitted.saturating_sub(done_tasks) < want.max(1) {
            let i = next_trace % traces.len();
            next_trace += 1;
            let tj = &traces[i].1;
            sim.submit(specs[i].clone()).map_err(sim_err)?;
            submitted += tj.tasks;
            jobs += 1;
            longest_path = longest_path.max(secs + tj.critical_path);
            total_work += tj.total_work;
        }
        let until = now_ms + step_ms;
        sim.run_until(until, usize::MAX, &mut duration)
            .map_err(sim_err)?;
        cores_at.push((now_ms, online as f64 * cfg.cpus));
        for r in &sim.runs()[seen_runs..] {
            if r.outcome == AttemptOutcome::Succeeded {
                done_tasks += 1;
                last_end = last_end.max(r.end);
            }
        }
        seen_runs = sim.runs().len();
        now_ms = until;
        if submitted >= cfg.tasks && done_tasks >= submitted {
            break;
        }
        anyhow::ensure!(
            now_ms < 400 * 24 * 3600 * 1000,
            "the run did not end within 400 virtual days ({done_tasks} of {submitted} tasks done)"
        );
    }
    let (busy, events) = sim.coordinator_time();
    let summaries = sim.coordinator().jobs();
    let makespan_s = last_end as f64 / 1000.0;
    // Cores online on average up to the last end.
    let core_ms: f64 = cores_at
        .iter()
        .map(|&(start, cores)| {
            let end = (start + step_ms).min(last_end);
            end.saturating_sub(start) as f64 * cores
        })
        .sum();
    let mean_cores = if last_end > 0 {
        core_ms / last_end as f64
    } else {
        0.0
    };
    let lower_bound_s = longest_path.max(total_work / mean_cores.max(1e-9));
    let useful_cpu_s = sim
        .runs()
        .iter()
        .filter(|r| r.outcome == AttemptOutcome::Succeeded)
        .map(|r| r.end.saturating_sub(r.start) as f64 / 1000.0 * r.cpus)
        .sum();
    let attempts = sim.runs().len() + lost_attempts;
    Ok(ChurnReport {
        bench: "churn",
        workers: cfg.workers,
        cpus: cfg.cpus,
        on_off_s: cfg.churn,
        jobs,
        tasks: submitted,
        succeeded: summaries
            .iter()
            .filter(|j| j.state == flotilla_cluster::state::JobState::Succeeded)
            .count(),
        attempts,
        lost_workers,
        makespan_s,
        lower_bound_s,
        ratio_to_bound: makespan_s / lower_bound_s.max(1e-9),
        mean_cores,
        useful_cpu_s,
        wasted_cpu_s,
        events,
        us_per_event: busy.as_secs_f64() * 1e6 / events.max(1) as f64,
        us_per_placement: busy.as_secs_f64() * 1e6 / attempts.max(1) as f64,
        wall_s: wall.elapsed().as_secs_f64(),
        peak_mb: peak_mb(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_churning_cluster_finishes_every_job_and_wastes_only_lost_work() {
        let traces = super::super::market::traces().expect("the repository's traces");
        let cfg = ChurnConfig {
            workers: 40,
            cpus: 2.0,
            tasks: 2_000,
            churn: Some((600.0, 300.0)),
            backlog: 2.0,
            seed: 7,
        };
        let r = run(&cfg, &traces).expect("runs");
        assert_eq!(r.succeeded, r.jobs, "every job succeeds: {r:?}");
        assert!(r.tasks >= 2_000);
        assert!(r.lost_workers > 0, "hosts went off: {r:?}");
        assert!(r.attempts > r.tasks, "lost attempts ran again: {r:?}");
        assert!(r.wasted_cpu_s > 0.0);
        assert!(r.makespan_s >= r.lower_bound_s * 0.999, "{r:?}");
        // Without churn, nothing is wasted and every task runs once.
        let calm = run(
            &ChurnConfig {
                churn: None,
                ..cfg.clone()
            },
            &traces,
        )
        .expect("runs");
        assert_eq!(calm.succeeded, calm.jobs);
        assert_eq!(calm.attempts, calm.tasks);
        assert_eq!(calm.wasted_cpu_s, 0.0);
        assert_eq!(calm.lost_workers, 0);
    }
}
