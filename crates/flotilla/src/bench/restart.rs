//! `flotilla bench restart`: how long a coordinator takes to come back on a journal of a given
//! size. For each size N it writes the journal of a coordinator that ran one job of N
//! `/bin/true` tasks to the end (the submission, then one assignment and one success per task,
//! in batches as the core writes them), then starts a real server on it and times until it
//! answers a status request (journal read, checked, replayed), the median of `reps` starts.
//!
//! With `--compaction` the job is then removed (`flotilla rm`) and a small job is left live:
//! it times a restart on that journal, the compaction that drops the removed job's records
//! (`Journal::start_compaction`, as the coordinator runs it), and a restart on the
//! compacted journal.

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
    /// With `--compaction`: the compacted journal's size, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacted_bytes: Option<u64>,
    /// With `--compaction`: seconds the compaction took (its thread, then the swap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compact_s: Option<f64>,
    /// With `--compaction`: median seconds of a restart on the compacted journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_compacted_s: Option<f64>,
}

/// Starts a server on `state` `reps` times; the sorted seconds to its first status answer,
/// each answer checked by `check`.
async fn restarts(
    state: &std::path::Path,
    reps: usize,
    check: impl Fn(&flotilla_cluster::state::ClusterStatus) -> bool,
) -> Result<Vec<f64>> {
    let listen: SocketAddr = "127.0.0.1:0".parse()?;
    let mut runs = Vec::new();
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let mut config = ServerConfig::new(listen, state);
        // Timed separately: no compaction during a timed start.
        config.compact_journal_after = None;
        let server = Server::start(config).await?;
        let remote = Remote::new(server.addr().to_string(), server.token().to_string());
        let status = Client::connect(&remote).await?.cluster_status().await?;
        runs.push(start.elapsed().as_secs_f64());
        anyhow::ensure!(check(&status), "the restarted coordinator lost jobs");
        server.stop();
        let _ = server.wait().await;
    }
    runs.sort_by(f64::total_cmp);
    Ok(runs)
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
        batch.push(JournalRecord::TaskFinishedMetered {
            worker,
            task,
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage {
                    cpu_seconds: 0.001,
                    peak_rss_bytes: 1 << 20,
                    wall_seconds: 0.002,
                    ..Default::default()
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

/// Restart time for each size in `sizes`, `reps` starts each; with `compaction`, of a
/// journal whose big job was removed, before and after compacting it.
pub fn run<'a>(
    sizes: &'a [u64],
    reps: usize,
    compaction: bool,
) -> flotilla_cluster::Boxed<'a, Result<Vec<RestartPoint>>> {
    flotilla_cluster::boxed(async move {
        let mut out = Vec::new();
        for &tasks in sizes {
            let dir = std::env::temp_dir().join(format!(
                "flotilla-bench-restart-{}-{tasks}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let state = dir.join("state");
            let mut j = write_journal(&state, tasks)?;
            if compaction {
                // The big job is removed; a small one stays live.
                let spec = parse_job(
                    "name = \"live\"\n[[task]]\nid = \"t\"\narray = \"0..10\"\ncmd = [\"true\"]\n",
                    "live.toml",
                )?;
                j.append(&[
                    JournalRecord::JobRemoved { job: JobId::new(1) },
                    JournalRecord::JobSubmitted {
                        job: JobId::new(2),
                        spec: Box::new(spec),
                        dir: "/bench/live".into(),
                        tenant: String::new(),
                    },
                ])?;
            }
            let (records, journal_bytes) = (j.len(), j.bytes());
            drop(j);
            let runs = restarts(&state, reps, |s| {
                if compaction {
                    s.jobs.len() == 1 && s.jobs[0].id == JobId::new(2)
                } else {
                    s.jobs.first().is_some_and(|j| j.done == tasks)
                }
            })
            .await?;
            let mut point = RestartPoint {
                bench: "restart",
                tasks,
                records,
                journal_bytes,
                restart_s: runs[runs.len() / 2],
                runs_s: runs,
                compacted_bytes: None,
                compact_s: None,
                restart_compacted_s: None,
            };
            if compaction {
                let mut j = Journal::open(state.join("journal.log"))?;
                j.replay()?;
                let checkpoint = JournalRecord::Checkpoint {
                    next_job: 3,
                    next_worker: 2,
                    model: flotilla_sched::PerfModel::new().to_json(),
                };
                let start = Instant::now();
                let c = j.start_compaction(checkpoint)?;
                let report = j
                    .finish_compaction(c)
                    .context("the compaction failed (see the log)")?;
                point.compact_s = Some(start.elapsed().as_secs_f64());
                point.compacted_bytes = Some(report.bytes_after);
                drop(j);
                let runs = restarts(&state, reps, |s| {
                    s.jobs.len() == 1 && s.jobs[0].id == JobId::new(2)
                })
                .await?;
                point.restart_compacted_s = Some(runs[runs.len() / 2]);
            }
            let _ = std::fs::remove_dir_all(&dir);
            out.push(point);
        }
        Ok(out)
    })
}
