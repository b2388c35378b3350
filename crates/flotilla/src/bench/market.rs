//! `flotilla bench market`: the pool's market in virtual time. The coordinator's own state
//! machine (placement by cost, energy or time within a deadline, holds and settlement in its
//! ledger, preemption and resumption from checkpoints) runs in a [`ClusterSim`] with
//! hundreds to thousands of providers' machines that come and go, on real workflow traces
//! (WfCommons, in `tests/data/workflows`) submitted as a stream of jobs with deadlines.
//!
//! # The simulated pool
//! Four kinds of machine, each provider one worker of two CPUs with its own price (±30 %
//! around its kind's):
//!
//! | kind | share | speed | credits per CPU-hour | watts per busy CPU | availability |
//! | --- | --- | --- | --- | --- | --- |
//! | old desktop | 30 % | 0.5 | 0.006 | 20 | its office's nights (`daily 19:00-07:00` in one of 24 time zones) |
//! | desktop | 30 % | 1.0 | 0.02 | 12 | exponential on/off (volunteer hosts: mean on 2 h, off 1 h) |
//! | workstation | 25 % | 2.0 | 0.06 | 10 | exponential on/off |
//! | cloud | 15 % | 1.5 | 0.08 | 8 | always (not preemptible) |
//!
//! A reclaimed machine's tasks end preempted; with checkpoints (every task declares one)
//! they resume elsewhere from the work done, without (none declared) they start again: the
//! difference is the wasted work. Energy is the busy CPU-seconds times each kind's watts
//! (an estimate: the simulation has no meter). The runtime of a task on a machine is its
//! trace runtime over the machine's speed; the coordinator learns those per kind.

use std::collections::HashMap;

use flotilla_cluster::sim::{ClusterSim, SimError, SimRun, Start};
use flotilla_cluster::state::{AttemptOutcome, Config, ObjectRef, WorkerSpec};
use flotilla_core::{Resources, WorkerId};
use flotilla_pool::sim::Rng;
use flotilla_pool::{Credits, Price, Windows};
use serde::Serialize;

use super::wfcommons::{job_from_trace, TraceJob, TraceRuntimes};

/// How a market run is set up.
#[derive(Clone, Debug)]
pub struct MarketConfig {
    /// Providers (one two-CPU machine each).
    pub providers: usize,
    /// Jobs submitted: the traces in turn.
    pub jobs: usize,
    /// Mean seconds between submissions (exponential).
    pub arrival_s: f64,
    /// Each job's deadline: this × its critical path at speed 1.
    pub deadline_factor: f64,
    /// `"cost"`, `"time"` or `"energy"`.
    pub objective: String,
    /// Whether tasks declare checkpoints (preempted work resumes instead of restarting).
    pub checkpoints: bool,
    /// Seeds the draws (prices, kinds, time zones, on/off times, arrivals).
    pub seed: u64,
}

impl Default for MarketConfig {
    fn default() -> Self {
        MarketConfig {
            providers: 1000,
            jobs: 40,
            arrival_s: 120.0,
            deadline_factor: 3.0,
            objective: "cost".into(),
            checkpoints: true,
            seed: 1,
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct MarketReport {
    /// `"market"`.
    pub bench: &'static str,
    /// The objective.
    pub objective: String,
    /// Whether tasks declared checkpoints.
    pub checkpoints: bool,
    /// Providers.
    pub providers: usize,
    /// Jobs.
    pub jobs: usize,
    /// Tasks in all jobs.
    pub tasks: usize,
    /// Jobs that succeeded.
    pub succeeded: usize,
    /// Jobs that met their deadline.
    pub deadlines_met: usize,
    /// Credits the consumers paid (settled).
    pub credits: f64,
    /// The platform's fees among them.
    pub fees: f64,
    /// CPU-seconds of the attempts that completed or carried their work forward.
    pub useful_cpu_s: f64,
    /// CPU-seconds of preempted attempts whose work was lost (no checkpoint).
    pub wasted_cpu_s: f64,
    /// Attempts preempted.
    pub preemptions: usize,
    /// Estimated energy of all attempts, kilojoules.
    pub energy_kj: f64,
    /// Mean makespan of the jobs, seconds.
    pub mean_makespan_s: f64,
    /// Virtual seconds simulated.
    pub horizon_s: f64,
}

struct Kind {
    name: &'static str,
    share: f64,
    speed: f64,
    price: f64,
    watts: f64,
}

const KINDS: [Kind; 4] = [
    Kind {
        name: "old",
        share: 0.30,
        speed: 0.5,
        price: 0.006,
        watts: 20.0,
    },
    Kind {
        name: "desktop",
        share: 0.30,
        speed: 1.0,
        price: 0.02,
        watts: 12.0,
    },
    Kind {
        name: "workstation",
        share: 0.25,
        speed: 2.0,
        price: 0.06,
        watts: 10.0,
    },
    Kind {
        name: "cloud",
        share: 0.15,
        speed: 1.5,
        price: 0.08,
        watts: 8.0,
    },
];

/// How a provider's machine comes and goes.
enum Avail {
    Always,
    /// Its office's nights: a window and the time zone's offset, minutes.
    Window(Windows, i64),
    /// Volunteer on/off: the virtual second of its next flip, and whether it is on.
    OnOff {
        next: f64,
        on: bool,
    },
}

struct Provider {
    worker: WorkerId,
    avail: Avail,
    on: bool,
}

const ON_MEAN_S: f64 = 7200.0;
const OFF_MEAN_S: f64 = 3600.0;

/// The traces the market runs, from the repository's test data.
pub fn traces() -> anyhow::Result<Vec<(String, TraceJob)>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/workflows");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for path in files {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("trace")
            .to_string();
        let json = std::fs::read_to_string(&path)?;
        let job = job_from_trace(&json, &path.display().to_string(), &name, 1.0, 0.1)?;
        out.push((name, job));
    }
    Ok(out)
}

/// Runs the market once.
pub fn run(cfg: &MarketConfig, traces: &[(String, TraceJob)]) -> anyhow::Result<MarketReport> {
    anyhow::ensure!(!traces.is_empty(), "no workflow traces");
    let mut rng = Rng(cfg.seed ^ 0x6d61_726b_6574);
    let mut sim = ClusterSim::new(Config {
        queue_depth: 0,
        chain_depth: 0,
        ..Config::default()
    });
    sim.grant("consumer", Credits::whole(1_000_000_000))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let night = Windows::parse("daily 19:00-07:00")?;
    let mut providers: Vec<Provider> = Vec::with_capacity(cfg.providers);
    let mut speed: HashMap<WorkerId, (f64, f64)> = HashMap::new();
    for i in 0..cfg.providers {
        let draw = rng.unit();
        let mut acc = 0.0;
        let kind = KINDS
            .iter()
            .position(|k| {
                acc += k.share;
                draw < acc
            })
            .unwrap_or(KINDS.len() - 1);
        let k = &KINDS[kind];
        let price = k.price * (0.7 + 0.6 * rng.unit());
        let avail = match kind {
            0 => Avail::Window(night.clone(), (rng.next_u64() % 24) as i64 * 60),
            3 => Avail::Always,
            _ => {
                let on = rng.unit() < ON_MEAN_S / (ON_MEAN_S + OFF_MEAN_S);
                let next = rng.exp(if on { ON_MEAN_S } else { OFF_MEAN_S });
                Avail::OnOff { next, on }
            }
        };
        let spec = WorkerSpec {
            name: format!("p{i}"),
            hostname: format!("p{i}"),
            hw_class: k.name.into(),
            resources: Resources {
                cpus: 2.0,
                ..Resources::zero()
            },
            gpus: Vec::new(),
            data_addr: String::new(),
            provider: Some(format!("p{i}")),
            price: Price {
                cpu: Credits::from_f64(price),
                ..Price::default()
            },
            availability: String::new(),
            preemptible: kind != 3,
            unavailable: false,
            cpu_watts: k.watts,
        };
        let worker = sim.add_worker(spec).map_err(|e| anyhow::anyhow!("{e}"))?;
        speed.insert(worker, (k.speed, k.watts));
        providers.push(Provider {
            worker,
            avail,
            on: true,
        });
    }
    // Jobs: the traces in turn, arriving as a Poisson stream.
    let mut arrivals: Vec<(f64, usize)> = Vec::with_capacity(cfg.jobs);
    let mut t = 0.0;
    for j in 0..cfg.jobs {
        arrivals.push((t, j % traces.len()));
        t += rng.exp(cfg.arrival_s);
    }
    let runtime = TraceRuntimes::new(traces);
    // Per attempt: preempted work lost (CPU-seconds) and energy.
    let mut duration = |s: &Start<'_>| -> Result<(u64, AttemptOutcome), SimError> {
        let work = runtime.of(&s.assignment.job_name, &s.assignment.name);
        let carried: f64 = s
            .assignment
            .resume
            .iter()
            .map(|o| o.size as f64 / 1000.0)
            .sum();
        let left = (work - carried).max(0.0);
        let (sp, _) = speed.get(&s.worker).copied().unwrap_or((1.0, 12.0));
        Ok((
            ((left / sp) * 1000.0).ceil() as u64,
            AttemptOutcome::Succeeded,
        ))
    };
    let step_ms: u64 = 60_000;
    let mut next_arrival = 0;
    let mut now_ms: u64 = 0;
    let limit_ms: u64 = 40 * 24 * 3600 * 1000;
    let mut preemptions = 0usize;
    let mut wasted_cpu_s = 0.0;
    loop {
        // Submissions due.
        while next_arrival < arrivals.len() && arrivals[next_arrival].0 * 1000.0 <= now_ms as f64 {
            let (_, ti) = arrivals[next_arrival];
            let tj = &traces[ti].1;
            let dl = cfg.deadline_factor * tj.critical_path;
            let mut toml = tj.toml.replace(
                "\n[defaults]\n",
                &format!(
                    "\n[pool]\nverify = 1\nobjective = \"{}\"\ndeadline = \"{}s\"\n\n[defaults]\n",
                    cfg.objective,
                    dl.ceil() as u64
                ),
            );
            if cfg.checkpoints {
                toml = toml.replace(
                    "\n[[task]]\n",
                    "\n[[task]]\ncheckpoint = [\"state.ckpt\"]\n",
                );
            }
            let spec = flotilla_core::parse_job(&toml, &traces[ti].0)?;
            sim.submit_as(spec, "consumer")
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            next_arrival += 1;
        }
        // Machines that come and go.
        let secs = now_ms as f64 / 1000.0;
        for p in &mut providers {
            let want = match &mut p.avail {
                Avail::Always => true,
                Avail::Window(w, offset) => {
                    let local = (secs / 60.0) as i64 + *offset;
                    let day = (local.div_euclid(1440) % 7) as u8;
                    w.contains(day, local.rem_euclid(1440) as u16)
                }
                Avail::OnOff { next, on } => {
                    while *next <= secs {
                        *on = !*on;
                        *next += rng.exp(if *on { ON_MEAN_S } else { OFF_MEAN_S });
                    }
                    *on
                }
            };
            if want == p.on {
                continue;
            }
            p.on = want;
            if want {
                sim.restore(p.worker).map_err(|e| anyhow::anyhow!("{e}"))?;
            } else {
                let (sp, _) = speed.get(&p.worker).copied().unwrap_or((1.0, 12.0));
                let keep = cfg.checkpoints;
                let mut lost = 0.0;
                let mut n = 0;
                let mut ckpt = |run: &SimRun, now: u64| -> Vec<ObjectRef> {
                    n += 1;
                    let elapsed = now.saturating_sub(run.start) as f64 / 1000.0;
                    if !keep {
                        lost += elapsed * run.cpus;
                        return Vec::new();
                    }
                    // The work done so far at speed 1, as the checkpoint's "size" (ms).
                    vec![ObjectRef {
                        path: "state.ckpt".into(),
                        hash: String::new(),
                        size: (elapsed * sp * 1000.0) as u64,
                    }]
                };
                sim.reclaim(p.worker, &mut ckpt, &mut duration)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                preemptions += n;
                wasted_cpu_s += lost;
            }
        }
        now_ms += step_ms;
        sim.run_until(now_ms, 10_000_000, &mut duration)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let all_in = next_arrival >= arrivals.len();
        let done = sim
            .coordinator()
            .jobs()
            .iter()
            .all(|j| j.state != flotilla_cluster::state::JobState::Running);
        if (all_in && done) || now_ms > limit_ms {
            break;
        }
    }
    let jobs = sim.coordinator().jobs();
    let mut report = MarketReport {
        bench: "market",
        objective: cfg.objective.clone(),
        checkpoints: cfg.checkpoints,
        providers: cfg.providers,
        jobs: jobs.len(),
        tasks: jobs.iter().map(|j| j.total as usize).sum(),
        succeeded: 0,
        deadlines_met: 0,
        credits: 0.0,
        fees: sim
            .coordinator()
            .ledger()
            .balance(&flotilla_pool::Account::Platform)
            .as_f64(),
        useful_cpu_s: 0.0,
        wasted_cpu_s,
        preemptions,
        energy_kj: 0.0,
        mean_makespan_s: 0.0,
        horizon_s: now_ms as f64 / 1000.0,
    };
    for j in &jobs {
        if j.state == flotilla_cluster::state::JobState::Succeeded {
            report.succeeded += 1;
        }
        if let Some(p) = &j.pool {
            report.credits += p.spent;
            if p.deadline.as_deref() == Some("met") {
                report.deadlines_met += 1;
            }
        }
        report.mean_makespan_s += j.makespan_s / jobs.len().max(1) as f64;
    }
    for r in sim.runs() {
        let secs = r.end.saturating_sub(r.start) as f64 / 1000.0 * r.cpus;
        let (_, watts) = speed.get(&r.worker).copied().unwrap_or((1.0, 12.0));
        report.energy_kj += secs * watts / 1000.0;
        if !matches!(r.outcome, AttemptOutcome::Preempted { ref checkpoint } if checkpoint.is_empty())
        {
            report.useful_cpu_s += secs;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_market_finishes_its_jobs_and_pays_for_them() {
        let traces = traces().unwrap();
        let cfg = MarketConfig {
            providers: 60,
            jobs: 3,
            ..MarketConfig::default()
        };
        let r = run(&cfg, &traces).unwrap();
        assert_eq!(r.jobs, 3);
        assert_eq!(r.succeeded, 3, "{r:?}");
        assert!(r.credits > 0.0 && r.fees > 0.0, "{r:?}");
        assert!(r.useful_cpu_s > 0.0 && r.energy_kj > 0.0, "{r:?}");
    }
}
