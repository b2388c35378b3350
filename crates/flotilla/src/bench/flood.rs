//! `flotilla bench flood`: many clients at once against one coordinator (in this process,
//! gRPC over loopback, two workers): `--jobs` one-task submissions from `--clients` clients
//! together, while `--stuck-watchers` clients follow a job's events and never read them and
//! `--silent` connections are opened and never speak. A probe asks for the cluster's status
//! (what `flotilla status` does) and for one job's status every `--probe-every`, before the
//! flood (the baseline) and during it: their latencies side by side show whether the
//! coordinator stays responsive; its memory before, at the peak and after says whether it
//! stays bounded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use flotilla_cluster::{run_worker, Client, Remote, Server, ServerConfig, WorkerConfig};

/// What to run.
#[derive(Clone, Debug)]
pub struct FloodConfig {
    /// Clients submitting at once.
    pub clients: usize,
    /// Jobs submitted in all (one WASM no-op task each).
    pub jobs: usize,
    /// Clients that open a job's event stream and never read it.
    pub stuck_watchers: usize,
    /// TCP connections opened and left silent.
    pub silent: usize,
    /// The probe's pause between requests.
    pub probe_every: Duration,
}

/// Latencies of one kind of probe request, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Requests timed.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    fn of(mut xs: Vec<f64>) -> Latency {
        if xs.is_empty() {
            return Latency::default();
        }
        xs.sort_by(f64::total_cmp);
        let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
        Latency {
            n: xs.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: xs[xs.len() - 1],
        }
    }
}

/// One result line.
#[derive(Clone, Debug, Serialize)]
pub struct FloodResult {
    /// Always "flood".
    pub bench: &'static str,
    /// Clients submitting at once.
    pub clients: usize,
    /// Jobs submitted.
    pub jobs: usize,
    /// Stuck watchers.
    pub stuck_watchers: usize,
    /// Silent connections.
    pub silent: usize,
    /// Seconds until every submission was accepted.
    pub submit_s: f64,
    /// Submissions accepted per second.
    pub submissions_per_s: f64,
    /// Submissions refused (with the first reason).
    pub refused: usize,
    /// The first refusal's message.
    pub refusal: Option<String>,
    /// Seconds until every job had finished.
    pub done_s: f64,
    /// `status` (the cluster) before the flood.
    pub cluster_status_idle: Latency,
    /// `status` (the cluster) during the flood.
    pub cluster_status_flood: Latency,
    /// `status JOB` before the flood.
    pub job_status_idle: Latency,
    /// `status JOB` during the flood.
    pub job_status_flood: Latency,
    /// This process's resident memory before the flood (MiB).
    pub rss_before_mib: f64,
    /// Its peak (MiB).
    pub rss_peak_mib: f64,
    /// After every job finished and the stuck clients left (MiB).
    pub rss_after_mib: f64,
}

/// (VmRSS, VmHWM) of this process, MiB.
fn memory() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Times `cluster_status` and `job_status(job)` in turn until `stop`.
async fn probe(
    remote: Remote,
    job: flotilla_core::JobId,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> (Vec<f64>, Vec<f64>) {
    let (mut cluster, mut one) = (Vec::new(), Vec::new());
    let Ok(mut client) = Client::connect(&remote).await else {
        return (cluster, one);
    };
    while !*stop.borrow() {
        let t = Instant::now();
        if client.cluster_status().await.is_ok() {
            cluster.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let t = Instant::now();
        if client.job_status(job).await.is_ok() {
            one.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let _ = tokio::time::timeout(every, stop.changed()).await;
    }
    (cluster, one)
}

/// Runs the benchmark (needs a tokio runtime).
pub fn run<'a>(
    cfg: &'a FloodConfig,
) -> flotilla_cluster::Boxed<'a, Result<FloodResult, Box<dyn std::error::Error + Send + Sync>>> {
    flotilla_cluster::boxed(async move {
        let dir = std::env::temp_dir().join(format!("flotilla-bench-flood-{}", std::process::id()));
        let job_dir = dir.join("job");
        std::fs::create_dir_all(&job_dir)?;
        std::fs::write(job_dir.join("noop.wat"), super::cluster::NOOP_WAT)?;
        let text =
        "name = \"flood\"\n[defaults]\nretries = 0\n\n[[task]]\nid = \"t\"\nwasm = \"noop.wat\"\n";
        let dir_s = job_dir.display().to_string();

        let scfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), dir.join("state"));
        let server = Server::start(scfg).await?;
        let remote = Remote::new(server.addr().to_string(), server.token().to_string());
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut workers = Vec::new();
        for w in 0..2 {
            let mut wc = WorkerConfig::local(remote.clone());
            wc.name = format!("flood-{w}");
            wc.cpus = 1.0;
            wc.work_dir = dir.join(format!("worker{w}"));
            workers.push(tokio::spawn(run_worker(wc, stop_rx.clone())));
        }
        let mut client = Client::connect(&remote).await?;
        let first = client.submit_text("first.toml", text, &dir_s).await?;
        client.wait(first.job, |_| {}).await?;

        // The baseline: the probe alone.
        let (probe_stop, probe_rx) = watch::channel(false);
        let idle = tokio::spawn(probe(remote.clone(), first.job, cfg.probe_every, probe_rx));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = probe_stop.send(true);
        let (cluster_idle, job_idle) = idle.await?;
        let (rss_before, _) = memory();

        // The stuck: watchers that never read, connections that never speak.
        let mut stuck = Vec::new();
        for _ in 0..cfg.stuck_watchers {
            let mut c = Client::connect(&remote).await?;
            // Held, never polled: the coordinator's queue for it fills and it is dropped.
            stuck.push(c.watch(first.job).await?);
        }
        let mut silent = Vec::new();
        for _ in 0..cfg.silent {
            silent.push(tokio::net::TcpStream::connect(server.addr()).await?);
        }

        // The flood, with the probe running.
        let (probe_stop, probe_rx) = watch::channel(false);
        let during = tokio::spawn(probe(remote.clone(), first.job, cfg.probe_every, probe_rx));
        let started = Instant::now();
        let per = cfg.jobs.div_ceil(cfg.clients.max(1));
        let mut submitters = Vec::new();
        for c in 0..cfg.clients.max(1) {
            let (remote, dir_s) = (remote.clone(), dir_s.clone());
            let n = per.min(cfg.jobs.saturating_sub(c * per));
            submitters.push(tokio::spawn(async move {
                let mut refused = (0usize, None::<String>);
                let Ok(mut client) = Client::connect(&remote).await else {
                    return (n, Some("could not connect".to_string()));
                };
                for _ in 0..n {
                    if let Err(e) = client.submit_text("flood.toml", text, &dir_s).await {
                        refused.0 += 1;
                        refused.1.get_or_insert_with(|| e.to_string());
                    }
                }
                refused
            }));
        }
        let (mut refused, mut refusal) = (0usize, None);
        for s in submitters {
            let (n, why) = s.await?;
            refused += n;
            if refusal.is_none() {
                refusal = why;
            }
        }
        let submit_s = started.elapsed().as_secs_f64();
        // Every job done.
        loop {
            let status = client.cluster_status().await?;
            if status
                .jobs
                .iter()
                .all(|j| j.state != flotilla_cluster::state::JobState::Running)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let done_s = started.elapsed().as_secs_f64();
        let _ = probe_stop.send(true);
        let (cluster_flood, job_flood) = during.await?;
        drop(stuck);
        drop(silent);
        let (_, rss_peak) = memory();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss_after, _) = memory();

        let _ = stop_tx.send(true);
        for w in workers {
            let _ = w.await;
        }
        server.stop();
        let _ = server.wait().await;
        let _ = std::fs::remove_dir_all(&dir);
        let accepted = cfg.jobs - refused.min(cfg.jobs);
        Ok(FloodResult {
            bench: "flood",
            clients: cfg.clients,
            jobs: cfg.jobs,
            stuck_watchers: cfg.stuck_watchers,
            silent: cfg.silent,
            submit_s,
            submissions_per_s: accepted as f64 / submit_s,
            refused,
            refusal,
            done_s,
            cluster_status_idle: Latency::of(cluster_idle),
            cluster_status_flood: Latency::of(cluster_flood),
            job_status_idle: Latency::of(job_idle),
            job_status_flood: Latency::of(job_flood),
            rss_before_mib: rss_before,
            rss_peak_mib: rss_peak,
            rss_after_mib: rss_after,
        })
    })
}
