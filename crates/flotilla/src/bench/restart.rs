//! `flotilla bench restart`: how long a coordinator takes to come back on a journal of a given
//! size. For each size N it writes the journal of a coordinator that ran one job of N
//! `/bin/true` tasks to the end (the submission, then one assignment and one success per task,
//! in batches as the core writes them), then starts a real server on it and times until it
//! answers a status request (journal read, checked, replayed), the median of `reps` starts.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{Context, Result};
use flotilla_cluster::journal::Journal;
use flotilla_cluster::state::{AttemptOutcome, AttemptResult, JournalRecord, TaskRef, Usage};
use flotilla_cluster::{Client, Remote, Server, ServerConfig};
use flotilla_core::{parse_job, JobId, TaskId, WorkerId};
use serde::Serialize;

/// One journal size and how long a restart on it took.
#[derive(Debug, Serialize)]
pub struct RestartPoint {
    /// `"restart"`.
    pub bench: &'static str,
    /// Tasks the journaled job ran.
    pub tasks: u64,
    /// Records in the journal.
    pub records: u64,
    /// Its size, bytes.
    pub journal_bytes: u64,
    /// Median seconds from starting the server to its first status answer.
    pub restart_s: f64,
    /// Every start, seconds, sorted.
    pub runs_s: Vec<f64>,
}

/// Writes the journal of a finished `tasks`-task job into `state/journal.log`.
fn write_journal(state: &std::path::Path, tasks: u64) -> Result<Journal> {
    std::fs::create_dir_all(state).with_context(|| state.display().to_string())?;
    let text = format!(
        "name = \"done\"\n[[task]]\nid = \"t\"\narray = \"0..{tasks}\"\ncmd = [\"/bin/true\"]\n"
    );
    let spec = parse_job(&text, "done.toml")?;
    let mut j = Journal::open(state.join("journal.log"))?;
    let job = JobId::new(1);
    j.append(&[JournalRecord::JobSubmitted {
        job,
        spec: Box::new(spec),
        dir: "/bench/done".into(),
        tenant: String::new(),
    }])?;
    let worker = WorkerId::new(1);
    let mut batch = Vec::with_capacity(8192);
    for t in 0..tasks {
        let task = TaskRef {
            job,
            task: TaskId::new(t as u32),
        };
        batch.push(JournalRecord::TaskAssigned {
            worker,
            task,
            attempt: 1,
            variant: None,
            gpu_indices: Vec::new(),
            hw_class: "cpu".into(),
        });
        batch.push(JournalRecord::TaskFinished {
            worker,
            task,
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage {
                    cpu_seconds: 0.001,
                    peak_rss_bytes: 1 << 20,
                    wall_seconds: 0.002,
                },
                outputs: Vec::new(),
                variant: None,
            },
        });
        if batch.len() >= 8192 {
            j.append(&batch)?;
            batch.clear();
        }
    }
    j.append(&batch)?;
    Ok(j)
}

/// Restart time for each size in `sizes`, `reps` starts each.
pub async fn run(sizes: &[u64], reps: usize) -> Result<Vec<RestartPoint>> {
    let mut out = Vec::new();
    for &tasks in sizes {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-bench-restart-{}-{tasks}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        let j = write_journal(&state, tasks)?;
        let (records, journal_bytes) = (j.len(), j.bytes());
        drop(j);
        let listen: SocketAddr = "127.0.0.1:0".parse()?;
        let mut runs = Vec::new();
        for _ in 0..reps.max(1) {
            let start = Instant::now();
            let server = Server::start(ServerConfig::new(listen, &state)).await?;
            let remote = Remote::new(server.addr().to_string(), server.token().to_string());
            let status = Client::connect(&remote).await?.cluster_status().await?;
            runs.push(start.elapsed().as_secs_f64());
            anyhow::ensure!(
                status.jobs.first().is_some_and(|j| j.done == tasks),
                "the restarted coordinator does not have the {tasks} finished tasks"
            );
            server.stop();
            let _ = server.wait().await;
        }
        let _ = std::fs::remove_dir_all(&dir);
        runs.sort_by(f64::total_cmp);
        out.push(RestartPoint {
            bench: "restart",
            tasks,
            records,
            journal_bytes,
            restart_s: runs[runs.len() / 2],
            runs_s: runs,
        });
    }
    Ok(out)
}
