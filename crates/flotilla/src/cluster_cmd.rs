//! The cluster commands of the `flotilla` binary: run, server, worker, submit, status, wait,
//! cancel, logs. Argument parsing and printing only; the work is in `flotilla-cluster`.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use flotilla::cluster::state::{ClusterStatus, JobState, JobStatus, TaskState};
use flotilla::cluster::worker::Isolation;
use flotilla::cluster::{
    proto, run_worker, Client, Remote, Server, ServerConfig, ServerTls, WorkerConfig, WorkerGpu,
};
use flotilla::core::JobId;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::watch;

use crate::out::outln;

/// How a client reaches the coordinator.
#[derive(Args, Clone, Debug)]
pub(crate) struct RemoteArgs {
    /// The coordinator's address (host:port), or a group's addresses (a,b,c: the one that
    /// leads answers).
    #[arg(long, env = "FLOTILLA_SERVER", default_value = "127.0.0.1:7070")]
    pub(crate) server: String,
    /// A file holding the access token (default: FLOTILLA_TOKEN, then ./.flotilla/token).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// A CA certificate (PEM) to verify the coordinator's TLS certificate; enables TLS.
    #[arg(long)]
    pub(crate) tls_ca: Option<PathBuf>,
    /// How long to keep trying a coordinator that refuses connections (starting, or
    /// restarting and replaying its journal), e.g. 30s; 0s tries once [default: 10s]. Not
    /// for `flotilla worker`, which keeps trying until it is stopped.
    #[arg(long)]
    pub(crate) connect_timeout: Option<String>,
}

/// The default of `--connect-timeout`.
const CONNECT_TIMEOUT: &str = "10s";

/// Where this process's client took its token from, for a refusal's message (main's).
pub(crate) static TOKEN_FROM: std::sync::OnceLock<String> = std::sync::OnceLock::new();

impl RemoteArgs {
    pub(crate) fn remote(&self) -> Result<Remote> {
        let token = flotilla::cluster::auth::find_token(
            self.token_file.as_deref(),
            Some(Path::new(".flotilla")),
        )?;
        // The order find_token follows.
        let from = match &self.token_file {
            Some(f) => format!("--token-file {}", f.display()),
            None if std::env::var("FLOTILLA_TOKEN").is_ok_and(|t| !t.trim().is_empty()) => {
                "FLOTILLA_TOKEN".to_string()
            }
            None => "./.flotilla/token, the state folder of a `flotilla run` or a local \
                     `flotilla server` in this folder (neither --token-file nor FLOTILLA_TOKEN \
                     was given)"
                .to_string(),
        };
        let _ = TOKEN_FROM.set(from);
        Ok(Remote {
            addr: self.server.clone(),
            token,
            tls_ca: self.tls_ca.clone(),
        })
    }
    pub(crate) async fn client(&self) -> Result<Client> {
        let remote = self.remote()?;
        let timeout = self.connect_timeout.as_deref().unwrap_or(CONNECT_TIMEOUT);
        let patience = flotilla::core::duration::parse_duration(timeout)
            .map_err(|e| anyhow::anyhow!("--connect-timeout {timeout:?}: {e}"))?;
        Client::connect_patiently(&remote, patience)
            .await
            .map_err(|e| match e {
                flotilla::cluster::ClusterError::Connect { .. } => {
                    // A folder where `flotilla run` ran: its logs need no coordinator.
                    let run_here = Path::new(".flotilla/journal.log").is_file();
                    anyhow::anyhow!(
                        "{e}\n(no coordinator answered at {} within {}: is `flotilla server` \
                         running there? The address comes from --server or FLOTILLA_SERVER; \
                         --connect-timeout waits longer){}",
                        remote.shown(),
                        timeout,
                        if run_here {
                            "\n(this folder holds a `flotilla run`'s state: `flotilla logs \
                             --state .flotilla JOB TASK` reads its logs without a coordinator)"
                        } else {
                            ""
                        }
                    )
                }
                // `Tls` says what to pass, as the other errors say what went wrong.
                e => e.into(),
            })
    }
}

#[derive(Args, Debug)]
pub(crate) struct ServerArgs {
    /// Where to listen [default: 127.0.0.1:7070; in a group, this node's address in
    /// --peers].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// This coordinator's number in a group of coordinators: its position in --peers
    /// (the first is number one), or `ordinal`: one more than the number that ends this
    /// machine's host name (a StatefulSet's pod `flotilla-coordinator-2` is node 3). The group
    /// elects one leader, which alone opens its API port; the journal and the tokens are
    /// replicated on a majority before anything is acknowledged.
    #[arg(long, requires = "peers", value_parser = node_id_arg)]
    node_id: Option<u64>,
    /// Every coordinator of the group by its API address, in node-id order (the same list on
    /// every node, and for clients and workers in --server or FLOTILLA_SERVER). Each node
    /// also listens on its API port + 1 for the group's own traffic. Every node's state
    /// folder must hold the same admin token (copy `token` from the first).
    #[arg(long, value_delimiter = ',', requires = "node_id")]
    peers: Vec<String>,
    /// A node added to a group that runs already: it does not set the group up from --peers
    /// (which must list its own address at position --node-id) but waits, with an empty
    /// state folder and the group's token, until the leader adds it (`flotilla admin group
    /// add ID ADDRESS`). Later starts need no --join.
    #[arg(long, requires = "node_id")]
    join: bool,
    /// The state directory (journal, token, logs).
    #[arg(long, default_value = ".flotilla")]
    state: PathBuf,
    /// Take the admin token from this file (a Kubernetes Secret, a systemd credential; it may
    /// be readable by its group, never by others) instead of STATE/token, which is then
    /// neither read nor written.
    #[arg(long, env = "FLOTILLA_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// TLS certificate (PEM); with --tls-key, the server speaks TLS only.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// In a group with --tls-cert: the CA (PEM) the other nodes' certificates are verified
    /// against on the group port (default: the --tls-cert file itself, right for one
    /// certificate shared by the group or a chain that ends in the group's CA).
    #[arg(long, requires_all = ["peers", "tls_cert"])]
    peer_ca: Option<PathBuf>,
    /// In a group (ignored otherwise): build a Raft snapshot (this node's journal and
    /// replicated files) every this many log entries, then drop the log before it but for
    /// the last min(1000, N) entries; a node further behind is sent the leader's snapshot.
    #[arg(long, env = "FLOTILLA_SNAPSHOT_EVERY",
          default_value_t = flotilla::cluster::ha::DEFAULT_SNAPSHOT_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    /// In a group: how long `flotilla admin group add` waits for the new node to hold the log
    /// before it gives up (the node stays a learner, not a voter, until it does).
    #[arg(long, env = "FLOTILLA_GROUP_ADD_TIMEOUT", default_value = "120s")]
    group_add_timeout: String,
    /// Heartbeat timeout in milliseconds: a worker silent this long is declared lost.
    #[arg(long, default_value_t = 5000)]
    heartbeat_timeout_ms: u64,
    /// fsync the journal before acknowledging anything: survives a crash of the machine, not
    /// only of the coordinator (costs an fsync per batch of events).
    #[arg(long)]
    fsync: bool,
    /// If the journal has a damaged record (not a record torn by a crash at its end), keep
    /// the valid records before it and copy the damaged file aside, instead of refusing to
    /// start. Work recorded after the damage is lost.
    #[arg(long)]
    recover_journal: bool,
    /// The most task instances one submitted job may expand to (arrays included); a larger
    /// job is refused at submit, before anything is expanded.
    #[arg(long, default_value_t = flotilla::cluster::server::DEFAULT_MAX_JOB_TASKS)]
    max_job_tasks: u64,
    /// The most bytes of output kept per stream (stdout, stderr) and attempt: its head and,
    /// once the attempt ends, its end (a quarter of this, at most 64 KiB); what lies between
    /// is dropped, and said (accepts sizes like 64MiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_log_size)]
    max_log_bytes: u64,
    /// How long a finished job is kept (status, logs, uploads, its objects on workers)
    /// before it is removed as by `flotilla rm`, e.g. 7d or 12h; `never` keeps it until
    /// removed.
    #[arg(long, default_value = "7d")]
    retain_finished: String,
    /// Rewrite the journal without the records of removed jobs once these are at least this
    /// large (e.g. 64MiB) and half the file; `never` lets it grow.
    #[arg(long, env = "FLOTILLA_COMPACT_JOURNAL_AFTER", default_value = "64MiB")]
    compact_journal_after: String,
    /// The most disk the files uploaded with jobs may take here (e.g. 20GiB); a submission
    /// beyond is refused until finished jobs are removed. Default: no cap.
    #[arg(long, value_parser = parse_log_size)]
    max_uploads: Option<u64>,
    /// Connections one peer address may hold open at once on the coordinator's port (more
    /// are closed as soon as they are accepted).
    #[arg(long, default_value_t = flotilla::cluster::server::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    max_connections_per_peer: usize,
    /// Serve HTTP here too (e.g. 127.0.0.1:9090): the web dashboard at `/` (log in with the
    /// admin's or a tenant's token) and `/metrics` in the Prometheus text format
    /// (`Authorization: Bearer TOKEN`).
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// The platform's share of every settled cost in the pool (0.05: 5 % of what a
    /// consumer pays goes to the platform, the rest to the provider).
    #[arg(long, default_value_t = 0.05, value_parser = parse_fee)]
    fee: f64,
    /// How often the allocator (`flotilla alloc`) watches its queues' allocations and asks
    /// for more or gives back (e.g. 5s).
    #[arg(long, default_value = "5s")]
    alloc_interval: String,
    /// The port of the gang rendezvous (ranks of a `group` meet there), on the IP of
    /// --listen; 0 lets the kernel pick one at start. Fix it where a firewall or a
    /// NetworkPolicy lists ports.
    #[arg(long, default_value_t = 0)]
    rendezvous_port: u16,
    /// In a Kubernetes pod: set each worker pod's `controller.kubernetes.io/pod-deletion-cost`
    /// to the attempts on it, so that a scale-down of the workers' Deployment takes idle
    /// workers first (Kubernetes 1.22 and later). Needs `patch` on pods for the
    /// coordinator's service account (docs/kubernetes.md).
    #[arg(long, env = "FLOTILLA_POD_DELETION_COST", value_parser = clap::builder::FalseyValueParser::new())]
    pod_deletion_cost: bool,
}

/// A fee between 0 and 1.
fn parse_fee(s: &str) -> std::result::Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{s}: a fee is a share between 0 and 1"))
    }
}

/// A size such as `64MiB` or `20GiB`.
fn parse_log_size(s: &str) -> std::result::Result<u64, String> {
    flotilla::core::size::parse_size(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// CPUs to offer (default: all cores).
    #[arg(long, value_parser = cpu_amount)]
    cpus: Option<f64>,
    /// Memory to offer, e.g. 8GiB (default: the machine's memory).
    #[arg(long)]
    mem: Option<String>,
    /// GPUs to offer: all, none, or indices (0,1).
    #[arg(long, default_value = "all")]
    gpus: String,
    /// A name (default: FLOTILLA_POD_NAME in a Kubernetes pod, else the hostname).
    #[arg(long)]
    name: Option<String>,
    /// Work directory (logs, sandboxes, held outputs), this worker's alone while it runs.
    /// Default: a new folder in the temporary directory, flotilla-worker-PID, removed when
    /// the worker exits (those of killed workers are removed when the next one starts); a
    /// folder given here is kept (unless --remove-work-dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Remove the --work-dir folder when the worker exits, as the default one is (the
    /// workers of `flotilla alloc` do: a folder per allocation and node).
    #[arg(long, requires = "work_dir")]
    remove_work_dir: bool,
    /// Where to serve held outputs to other workers. Bound to every interface (0.0.0.0:7071),
    /// the worker advertises its address on the route to the coordinator.
    #[arg(long, default_value = "127.0.0.1:0")]
    data_listen: SocketAddr,
    /// Sandbox process tasks (bubblewrap): auto (when this machine can, else a warning),
    /// bwrap or required (refuse to start without), none.
    #[arg(long, default_value = "auto")]
    isolation: Isolation,
    /// Let tasks that say `network = true` use the network (others never have it).
    #[arg(long)]
    allow_network: bool,
    /// The most processes one sandboxed task may have at once (a fork bomb stops there).
    #[arg(long, default_value_t = flotilla::cluster::worker::DEFAULT_TASK_PIDS)]
    task_pids: u64,
    /// The most memory a WASM task may have (a job's `memory` is capped at it; a job that
    /// says nothing gets 1GiB or this, if less).
    #[arg(long, default_value = "4GiB")]
    wasm_max_memory: String,
    /// The longest a WASM task may run (its `timeout` is capped at it; a task without one
    /// gets it), e.g. 24h.
    #[arg(long, default_value = "24h")]
    wasm_max_time: String,
    /// The most disk this worker's object store may take (outputs made here, inputs
    /// fetched), e.g. 50GiB; a task whose objects do not fit fails, retryable elsewhere.
    /// Default: no cap.
    #[arg(long, value_parser = parse_log_size)]
    max_store: Option<u64>,
    /// The most disk one task's folder may use in transfer staging (e.g. 10GiB): a task
    /// whose folder grows past it is stopped and fails, and no file of it may be larger.
    /// Default: no cap.
    #[arg(long, value_parser = parse_log_size)]
    max_sandbox: Option<u64>,
    /// Join the pool as a provider's machine: enrol with the provider token in this file
    /// (`flotilla admin provider add NAME` prints it) instead of --token-file.
    #[arg(long)]
    provider_token: Option<PathBuf>,
    /// A provider's price, credits per unit-hour: `cpu=0.02,gpu=0.5,mem_gb=0.001` (what is
    /// not named is free). Needs --provider-token.
    #[arg(long, requires = "provider_token")]
    price: Option<String>,
    /// When this machine may work, in its local time: `"mon-fri 19:00-07:00; sat,sun
    /// 00:00-24:00"` (days: mon..sun, ranges, lists, daily, weekdays, weekends; a span
    /// ending before it starts runs past midnight), or `always` (the default). When a window ends, running tasks get
    /// SIGTERM and --grace to write their checkpoints, and resume elsewhere.
    #[arg(long)]
    available: Option<String>,
    /// Work only while the machine's owner is idle: the load of other processes below
    /// --idle-load, no keyboard or mouse interrupts, no --owner-active-file; when the owner
    /// comes back, running tasks are preempted as when a window ends.
    #[arg(long)]
    idle_only: bool,
    /// With --idle-only: the load (1-minute average) of the owner's processes above which
    /// the machine is busy.
    #[arg(long, default_value_t = 0.5, requires = "idle_only")]
    idle_load: f64,
    /// With --idle-only: how long the owner must have been idle before work starts again.
    #[arg(long, default_value = "5m", requires = "idle_only")]
    idle_after: String,
    /// With --idle-only: the owner is active while this file exists (a screen locker's or
    /// session manager's hook makes and removes it).
    #[arg(long, requires = "idle_only")]
    owner_active_file: Option<PathBuf>,
    /// This machine may be reclaimed at any moment (a spot instance, a laptop): placement
    /// prefers other machines at the same price for tasks that declare no checkpoint.
    #[arg(long)]
    preemptible: bool,
    /// How long a preempted task has after SIGTERM to write its checkpoint files before it
    /// is killed (drain, SIGTERM to the worker, a window's end, the owner's return).
    #[arg(long, default_value = "30s")]
    grace: String,
    /// Leave (as drained, exit 0) after this long with nothing to run, e.g. 5m: a worker of
    /// a batch allocation gives its machine back.
    #[arg(long)]
    idle_timeout: Option<String>,
    /// Leave (as drained, exit 0) within this long from the start, e.g. 1h (the batch
    /// allocation's time limit): it starts leaving --grace + 15 s before, so that its tasks
    /// are preempted with their grace and resume elsewhere rather than being cut.
    #[arg(long)]
    time_limit: Option<String>,
    /// Watts one busy CPU of this machine draws: energy is estimated from it where RAPL
    /// cannot be read, and `objective = "energy"` compares machines by it.
    #[arg(long, default_value_t = flotilla::cluster::worker::DEFAULT_CPU_WATTS)]
    cpu_watts: f64,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The job file.
    job: PathBuf,
    /// CPUs for the local worker (default: all cores).
    #[arg(long, value_parser = cpu_amount)]
    cpus: Option<f64>,
    /// GPUs for the local worker: all, none, or indices.
    #[arg(long, default_value = "all")]
    gpus: String,
    /// State directory (default: .flotilla beside the job file).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Print the summary as JSON on one line: the job's status document (as `status JOB
    /// --json`), with `cancelled_because` when the run cancelled a task too large for it.
    #[arg(long)]
    json: bool,
    /// Sandbox the tasks: none (your own job on your own machine: the default), auto, bwrap,
    /// required (as `flotilla worker --isolation`).
    #[arg(long, default_value = "none")]
    isolation: Isolation,
    /// Let tasks that say `network = true` run, with the network (as `flotilla worker
    /// --allow-network`; without it they cannot run here).
    #[arg(long)]
    allow_network: bool,
    /// Write the job's attempts in time to this file as a Chrome/Perfetto trace (open it in
    /// ui.perfetto.dev), as `flotilla trace` does.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Serve the web dashboard (and /metrics) while the job runs, at ADDR (default
    /// 127.0.0.1 on a free port); prints the address to open with a login link (it carries
    /// the run's token: keep it as a password).
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    dashboard: Option<SocketAddr>,
    /// Check the job file as a submission would (its inputs too) and print what would run,
    /// with warnings of what only running would find; run nothing. With --json, as JSON.
    #[arg(long)]
    dry_run: bool,
    /// Go on with the newest job of the same name and folder in the state folder, as it was
    /// submitted: one an interrupted run (Ctrl-C, a kill) left unfinished goes on; one that
    /// ended failed or cancelled has its failed and cancelled tasks run again (as `flotilla
    /// retry`); one that succeeded runs nothing. Its done tasks are not run again (in
    /// transfer staging, those whose outputs only the stopped run's worker held are).
    /// Without it, an unfinished job is cancelled and the job file submitted anew.
    #[arg(long, conflicts_with = "dry_run")]
    resume: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
    /// Write it here instead of to stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job file.
    job: PathBuf,
    /// Follow the job to its end (exit code 0 only if every task succeeded).
    #[arg(long)]
    wait: bool,
    /// Check the job file as the submission would (its inputs too) and print what would
    /// run, with warnings of what only running would find; submit nothing, connect to
    /// nothing. The coordinator's own limits (tasks per job, quotas) are not known here.
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
    /// Print JSON on stdout, one line: the submission (`{"job": 7, "name": …, "tasks": …}`);
    /// with --wait, the job's status document at its end (as `status JOB --json`, the
    /// progress on stderr); with --dry-run, the plan.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// A job id (`7` or `job-7`); without it, every job and worker.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// A job's status lists its tasks from this id on (a page of a large job).
    #[arg(long, default_value_t = 0, requires = "job")]
    tasks_from: u64,
    /// A job's status lists at most this many tasks (50 as text, 10,000 with --json; its
    /// counts, first failures and per-worker totals are always whole).
    #[arg(long, requires = "job")]
    tasks_limit: Option<u64>,
    /// A job's status lists only its tasks in these states, e.g. `--state failed` or
    /// `--state failed,cancelled` (its counts stay whole).
    #[arg(long, requires = "job", value_delimiter = ',', value_parser = task_state)]
    state: Vec<TaskState>,
    /// Read a finished `flotilla run`'s status from its state directory (`.flotilla` beside
    /// its job file, or its --state) instead of asking a coordinator.
    #[arg(long, value_name = "DIR")]
    run_state: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct JobArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
}

#[derive(Args, Debug)]
pub(crate) struct RetryArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
    /// Follow the job to its end as `flotilla wait` does (exit code 0 only if every task
    /// succeeded).
    #[arg(long)]
    wait: bool,
    /// Print JSON on stdout, one line: `{"job": 7, "tasks_again": …, "done_kept": …}`; with
    /// --wait, the job's status document at its end (as `status JOB --json`).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
    /// Print the job's status document at its end on stdout, one line (as `status JOB
    /// --json`); the progress goes to stderr.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
    /// The task's name, e.g. tile[3]; an array's or a gang's id alone (tile) prints every
    /// instance's output, each under a header (with --follow, each line behind its name).
    task: String,
    /// Keep printing until the task ends: from its start when it is still queued, and on
    /// with each new attempt after a failed one.
    #[arg(long, short)]
    follow: bool,
    /// Print its standard error instead of its standard output.
    #[arg(long)]
    stderr: bool,
    /// Read a finished `flotilla run`'s logs from its state directory (`.flotilla` beside
    /// its job file, or its --state) instead of asking a coordinator.
    #[arg(long, alias = "run-state", value_name = "DIR")]
    state: Option<PathBuf>,
    /// One attempt's output (1 for the first; `flotilla status JOB` counts a task's
    /// attempts), e.g. an earlier failure of a task retried since. Without it, the latest
    /// attempt's (with --follow, on to the next ones).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    attempt: Option<u32>,
}

pub(crate) fn gpus_from(spec: &str) -> Result<Vec<WorkerGpu>> {
    if spec == "none" {
        return Ok(Vec::new());
    }
    let found: Vec<WorkerGpu> = flotilla::devices::discover(&flotilla::devices::DiscoverOptions {
        opencl: false,
        cuda: true,
        mem_limit: None,
    })
    .iter()
    .enumerate()
    .map(|(i, d)| WorkerGpu {
        index: i as u32,
        model: d.info().name.clone(),
        mem_bytes: d.info().global_mem,
        pci_bus_id: d.info().topology.as_ref().map(|t| t.pci_bus_id.clone()),
    })
    .collect();
    if spec == "all" {
        return Ok(found);
    }
    let mut out = Vec::new();
    for part in spec.split(',') {
        let i: u32 = part
            .trim()
            .parse()
            .with_context(|| format!("--gpus: {part:?} is not a GPU index (or all, none)"))?;
        match found.iter().find(|g| g.index == i) {
            Some(g) => out.push(g.clone()),
            None => bail!("--gpus: no GPU {i} on this machine ({} found)", found.len()),
        }
    }
    Ok(out)
}

pub(crate) async fn server(a: ServerArgs) -> Result<()> {
    let group = match a.node_id {
        Some(id) => {
            let mut g = flotilla::cluster::ha::GroupConfig::new(id, a.peers.clone())?;
            g.peer_ca = a.peer_ca.clone();
            g.snapshot_every = a.snapshot_every;
            g.join = a.join;
            g.add_timeout = flotilla::core::duration::parse_duration(&a.group_add_timeout)
                .with_context(|| format!("--group-add-timeout {}", a.group_add_timeout))?;
            Some(g)
        }
        None => None,
    };
    let listen = match (a.listen, &group) {
        (Some(l), _) => l,
        (None, Some(g)) => {
            use std::net::ToSocketAddrs as _;
            g.own_api()
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .with_context(|| {
                    format!(
                        "--peers: cannot resolve this node's address {} (or give --listen)",
                        g.own_api()
                    )
                })?
        }
        (None, None) => SocketAddr::from(([127, 0, 0, 1], 7070)),
    };
    let in_group = group.is_some();
    let mut cfg = ServerConfig::new(listen, &a.state);
    cfg.admin_token_file = a.admin_token_file.clone();
    let token_at = a
        .admin_token_file
        .clone()
        .unwrap_or_else(|| a.state.join("token"));
    cfg.group = group;
    cfg.heartbeat_timeout = Duration::from_millis(a.heartbeat_timeout_ms);
    cfg.fsync = a.fsync;
    cfg.recover_journal = a.recover_journal;
    cfg.max_job_tasks = a.max_job_tasks;
    cfg.max_log_bytes = a.max_log_bytes;
    cfg.retain_finished = match a.retain_finished.as_str() {
        "never" => None,
        d => Some(
            flotilla::core::duration::parse_duration(d)
                .with_context(|| format!("--retain-finished {d}"))?,
        ),
    };
    cfg.max_uploads = a.max_uploads;
    cfg.max_connections_per_peer = a.max_connections_per_peer;
    cfg.http_listen = a.http_listen;
    cfg.rendezvous_port = a.rendezvous_port;
    if a.pod_deletion_cost {
        cfg.pod_deletion_cost =
            Some(flotilla::cluster::kube::InCluster::from_env().context("--pod-deletion-cost")?);
    }
    cfg.alloc_interval = flotilla::core::duration::parse_duration(&a.alloc_interval)
        .with_context(|| format!("--alloc-interval {}", a.alloc_interval))?;
    cfg.coordinator.fee_ppm = (a.fee * 1e6).round() as u32;
    cfg.compact_journal_after = match a.compact_journal_after.as_str() {
        "never" => None,
        s => Some(
            flotilla::core::size::parse_size(s)
                .with_context(|| format!("--compact-journal-after {s}"))?,
        ),
    };
    if let (Some(cert), Some(key)) = (a.tls_cert, a.tls_key) {
        cfg.tls = Some(ServerTls { cert, key });
    }
    let interrupts = Interrupts::listen();
    let server = Server::start(cfg).await?;
    if in_group {
        eprintln!(
            "flotilla server: node {} of a group of {}, following; it serves on {} when it \
             leads (token in {})",
            a.node_id.unwrap_or(0),
            a.peers.len(),
            server.addr(),
            token_at.display()
        );
    } else {
        eprintln!(
            "flotilla server listening on {} (token in {})",
            server.addr(),
            token_at.display()
        );
    }
    if let Some(http) = server.http_addr() {
        eprintln!("flotilla server: metrics at http://{http}/metrics, dashboard at http://{http}/");
    }
    let stop = server.stop_handle();
    tokio::spawn(async move {
        interrupts.recv().await;
        stop.stop();
    });
    server.wait().await?;
    Ok(())
}

pub(crate) async fn worker(a: WorkerArgs) -> Result<()> {
    let interrupts = Interrupts::listen();
    if let Some(t) = &a.remote.connect_timeout {
        anyhow::bail!(
            "--connect-timeout {t}: a worker keeps trying its coordinator until it answers, \
             and reconnects by itself after a break (stop it with SIGTERM); the flag is the \
             clients'"
        );
    }
    if let (Some(p), Some(t)) = (&a.provider_token, &a.remote.token_file) {
        anyhow::bail!(
            "--provider-token {} and --token-file {}: a provider's machine enrols with its \
             provider token alone; leave out --token-file (or --provider-token, for a worker \
             of the operator's own)",
            p.display(),
            t.display()
        );
    }
    let remote = match &a.provider_token {
        Some(file) => Remote {
            addr: a.remote.server.clone(),
            token: flotilla::cluster::auth::read_token_file(file)
                .with_context(|| format!("--provider-token {}", file.display()))?,
            tls_ca: a.remote.tls_ca.clone(),
        },
        None => a.remote.remote()?,
    };
    let mut cfg = WorkerConfig::local(remote);
    cfg.as_provider = a.provider_token.is_some();
    if let Some(p) = &a.price {
        cfg.price = flotilla_pool::Price::parse(p).with_context(|| format!("--price {p}"))?;
    }
    if let Some(w) = &a.available {
        cfg.available = Some(flotilla_pool::Windows::parse(w).context("--available")?);
    }
    if a.idle_only {
        cfg.idle = Some(flotilla::cluster::worker::IdleConfig {
            load: a.idle_load,
            after: flotilla::core::duration::parse_duration(&a.idle_after)
                .with_context(|| format!("--idle-after {}", a.idle_after))?,
            active_file: a.owner_active_file.clone(),
        });
    }
    cfg.preemptible = a.preemptible;
    anyhow::ensure!(
        a.cpu_watts.is_finite() && a.cpu_watts >= 0.0,
        "--cpu-watts {}: watts are a number, 0 or more",
        a.cpu_watts
    );
    cfg.cpu_watts = a.cpu_watts;
    cfg.grace = flotilla::core::duration::parse_duration(&a.grace)
        .with_context(|| format!("--grace {}", a.grace))?;
    if let Some(t) = &a.idle_timeout {
        cfg.idle_timeout = Some(
            flotilla::core::duration::parse_duration(t)
                .with_context(|| format!("--idle-timeout {t}"))?,
        );
    }
    if let Some(t) = &a.time_limit {
        let limit = flotilla::core::duration::parse_duration(t)
            .with_context(|| format!("--time-limit {t}"))?;
        cfg.leave_at = Some(std::time::Instant::now() + limit);
    }
    // The guard that kills this worker's tasks if it dies: this same binary.
    cfg.guard = flotilla::guard_command();
    // Sandboxed tasks enter one holder through the program installed beside this one.
    cfg.enter = flotilla::enter_program();
    // What the machine has (the defaults): an offer beyond it is allowed (oversubscribing
    // is a choice), and said; so is one that cannot be meant.
    let (cores, machine_mem) = (
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        cfg.mem,
    );
    if let Some(c) = a.cpus {
        cfg.cpus = c;
        if c == 0.0 {
            eprintln!("flotilla worker: --cpus 0: it runs only tasks that ask for no CPU");
        } else if c > cores as f64 {
            eprintln!(
                "flotilla worker: --cpus {c} is more than this machine's {cores}: its tasks \
                 will share cores"
            );
        }
    }
    if let Some(m) = &a.mem {
        cfg.mem = flotilla::core::size::parse_size(m).with_context(|| format!("--mem {m}"))?;
        if cfg.mem < 1 << 20 {
            eprintln!(
                "flotilla worker: --mem {m} is {} bytes: a size takes a unit (e.g. 16GiB)",
                cfg.mem
            );
        } else if machine_mem > 0 && cfg.mem > machine_mem {
            eprintln!(
                "flotilla worker: --mem {m} is more than this machine's {}: its tasks may \
                 run out of memory",
                flotilla::core::size::format_size_readable(machine_mem)
            );
        }
    }
    cfg.gpus = gpus_from(&a.gpus)?;
    if let Some(n) = a.name {
        cfg.name = n;
    }
    cfg.isolation = a.isolation;
    cfg.allow_network = a.allow_network;
    cfg.task_pids = a.task_pids;
    cfg.wasm_max_memory = flotilla::core::size::parse_size(&a.wasm_max_memory)
        .with_context(|| format!("--wasm-max-memory {}", a.wasm_max_memory))?;
    cfg.max_store = a.max_store;
    cfg.max_sandbox = a.max_sandbox;
    // Test hooks only (see flotilla_cluster::fault): an unknown value stops the worker.
    cfg.fault = flotilla::cluster::fault::Fault::from_env()?;
    cfg.wasm_max_time = flotilla::core::duration::parse_duration(&a.wasm_max_time)
        .with_context(|| format!("--wasm-max-time {}", a.wasm_max_time))?;
    // The default folder is this process's own: it goes when the worker does. Those of
    // workers that were killed (they could not remove theirs) go now.
    if a.work_dir.is_none() {
        let tmp = cfg.work_dir.parent().map(Path::to_path_buf);
        let gone = tmp.map_or_else(Vec::new, |t| {
            flotilla::cluster::worker::remove_gone_workers_folders(&t)
        });
        if !gone.is_empty() {
            eprintln!(
                "flotilla worker {}: removed {} work folder(s) of workers that were killed ({})",
                cfg.name,
                gone.len(),
                gone.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let mut scratch = a.work_dir.is_none().then(|| cfg.work_dir.clone());
    if let Some(w) = a.work_dir {
        if a.remove_work_dir {
            scratch = Some(w.clone());
        }
        cfg.work_dir = w;
    }
    cfg.data_listen = a.data_listen;
    // Each registration said on the terminal: that it works, and that it came back after a
    // coordinator's restart (tracing's info lines are off by default).
    let (reg_tx, mut reg_rx) = tokio::sync::mpsc::unbounded_channel();
    cfg.registered = Some(reg_tx);
    let offers = format!(
        "cpus={} gpus={} mem={}",
        cfg.cpus,
        cfg.gpus.len(),
        flotilla::core::size::format_size_readable(cfg.mem)
    );
    let (name, server) = (cfg.name.clone(), cfg.remote.addr.clone());
    tokio::spawn(async move {
        let mut again = false;
        while let Some(id) = reg_rx.recv().await {
            eprintln!(
                "flotilla worker {name}: registered{} with {server} as w{id} ({offers})",
                if again { " again" } else { "" }
            );
            again = true;
        }
    });
    // And why it leaves when it leaves by itself (a drain, --idle-timeout, --time-limit).
    let (leave_tx, mut leave_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    cfg.leaving = Some(leave_tx);
    let (name, grace) = (cfg.name.clone(), cfg.grace);
    tokio::spawn(async move {
        while let Some(why) = leave_rx.recv().await {
            eprintln!(
                "flotilla worker {name}: leaving: {why} (running tasks get SIGTERM and {} to \
                 stop; they resume elsewhere)",
                flotilla::core::duration::format_duration(grace)
            );
        }
    });
    let (tx, rx) = watch::channel(false);
    // SIGTERM (systemd's stop, a pod's eviction or a node's drain) as SIGINT: running tasks
    // get --grace to write their checkpoints and resume elsewhere. Before, only SIGINT was
    // heard and SIGTERM killed the worker at once (found writing the Kubernetes manifests).
    tokio::spawn(async move {
        interrupts.recv().await;
        let _ = tx.send(true);
    });
    let ran = run_worker(cfg, rx).await;
    // Another worker's folder is not this one's to remove.
    let theirs = matches!(
        ran,
        Err(flotilla::cluster::ClusterError::WorkDirInUse { .. })
    );
    if let Some(dir) = scratch.filter(|_| !theirs) {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing the work folder {}: {e}", dir.display());
            }
        }
    }
    ran?;
    Ok(())
}

/// For `flotilla run`: once the local worker has registered, checks the job every second
/// and cancels it when a ready task fits no worker even idle, having put why in
/// `why_cancelled` first (the caller aborts this watch when the job ends, which may be
/// before this returns). Ends with the job.
async fn watch_never_fits(
    remote: Remote,
    job: JobId,
    why_cancelled: Arc<OnceLock<String>>,
) -> Option<()> {
    let mut client = Client::connect(&remote).await.ok()?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(s) = client.cluster_status().await else {
            continue;
        };
        if s.workers.is_empty() {
            continue;
        }
        let j = s.jobs.iter().find(|j| j.id == job)?;
        if j.state != JobState::Running {
            return None;
        }
        if let Some(why) = &j.never_fits {
            // Said before the cancel: the run's wait can end, and abort this watch, as soon
            // as the coordinator takes the cancel.
            let _ = why_cancelled.set(why.clone());
            // A cancel that failed (the coordinator busy) is sent again on the next look.
            if client.cancel(job).await.is_ok() {
                return Some(());
            }
        }
    }
}

/// SIGINT and SIGTERM, heard from the moment this is made: one that comes while a server or
/// worker is still starting (replaying its journal, registering) stops it cleanly once it
/// has started, where the default action ended the process by the signal.
struct Interrupts {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
}

impl Interrupts {
    fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Resolves at the first SIGINT or SIGTERM.
    async fn recv(mut self) {
        async fn one(s: Option<&mut tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            _ = one(self.int.as_mut()) => {}
            _ = one(self.term.as_mut()) => {}
        }
    }
}

/// SIGINT (Ctrl-C), heard from when this is made: see [`unless_interrupted`].
fn interrupts() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok()
}

/// Runs `work` unless SIGINT (Ctrl-C, heard through `int`, made before anything it should
/// cover started) comes first: then says what became of the job (`said`, given at most
/// 3 s) on stderr and exits with 130, the status the default action gives. It ended the
/// process silently, and `submit --wait` left users wondering whether the job went on.
/// A handler cannot be taken back: once `work` is done, a SIGINT still exits with 130.
async fn unless_interrupted<T>(
    int: Option<tokio::signal::unix::Signal>,
    work: impl std::future::Future<Output = T>,
    said: impl std::future::Future<Output = String>,
) -> T {
    let Some(mut int) = int else {
        return work.await;
    };
    let r = tokio::select! {
        r = work => r,
        _ = int.recv() => {
            let said = tokio::time::timeout(Duration::from_secs(3), said)
                .await
                .unwrap_or_else(|_| "the coordinator did not answer in 3 s".into());
            eprintln!("\nflotilla: interrupted: {said}");
            std::process::exit(130);
        }
    };
    tokio::spawn(async move {
        if int.recv().await.is_some() {
            eprintln!("\nflotilla: interrupted");
            std::process::exit(130);
        }
    });
    r
}

/// What [`unless_interrupted`] says of a job a client followed: it goes on.
async fn still_runs(job: JobId) -> String {
    format!(
        "job {n} goes on running on the coordinator; `flotilla wait {n}` follows it again, \
         `flotilla cancel {n}` stops it",
        n = job.0
    )
}

/// Where [`follow`] shows its progress.
#[derive(Clone, Copy, PartialEq)]
enum Progress {
    /// Standard output: a bar on a terminal, else a line a second.
    Stdout,
    /// Standard error, lines only: standard output is kept for a document (`run --json`).
    Stderr,
}

/// Follows a job with a progress bar (or plain lines when stdout is not a terminal), and
/// with `explain` why it waits when it does; returns whether it succeeded.
async fn follow(
    client: &mut Client,
    job: JobId,
    label: &str,
    to: Progress,
    explain: bool,
) -> Result<bool> {
    let tty = to == Progress::Stdout && std::io::stdout().is_terminal();
    let bar = if tty {
        // Drawn from the first event, which gives its length: a bar of length 0 was drawn
        // full ("0/0 tasks") until then.
        let b = ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::hidden());
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:40}] {pos}/{len} tasks {elapsed} (eta {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_prefix(label.to_string());
        Some(b)
    } else {
        None
    };
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut drawn = false;
    // The first failure to write progress (stdout closed under us); the wait goes on to the end.
    let mut shown: Result<()> = Ok(());
    // Why the job waits, when it does (a quota, a pool's rule, a task no worker fits): no
    // event comes while it is held, so a look every two seconds says it.
    let held = explain.then(|| {
        tokio::spawn(show_waiting(
            client.clone(),
            job,
            label.to_string(),
            to,
            bar.clone(),
        ))
    });
    // A task that failed, waits to retry, or goes back to be placed again for a reason
    // outside it (its worker lost, its machine reclaimed, its gang stopped): one line each
    // (a lost worker showed only as progress going back). Not a task taken back to move to
    // a worker with room ("returned by"): that is the scheduler's own business.
    let told = |ev: &proto::JobEvent| -> Option<String> {
        // (The coordinator sends such events only for these reasons.)
        let moved = (ev.state == "ready" || ev.state == "waiting")
            && ev.attempt > 0
            && !ev.message.is_empty();
        let state = match ev.state.as_str() {
            "failed" | "backoff" => ev.state.as_str(),
            _ if moved => "placed again",
            _ => return None,
        };
        Some(format!(
            "  {} {state} (attempt {}): {}",
            ev.name, ev.attempt, ev.message
        ))
    };
    let finished = client
        .wait(job, |ev: &proto::JobEvent| {
            if let Some(b) = &bar {
                b.set_length(ev.total as u64);
                b.set_position(ev.done as u64);
                if !drawn && ev.total > 0 {
                    drawn = true;
                    b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                    b.enable_steady_tick(Duration::from_millis(120));
                }
                if let Some(l) = told(ev) {
                    b.println(l);
                }
            } else if shown.is_ok() {
                let mut line = |args: std::fmt::Arguments<'_>| match to {
                    Progress::Stdout if shown.is_ok() => shown = crate::out::write(args, true),
                    Progress::Stdout => {}
                    Progress::Stderr => eprintln!("{args}"),
                };
                if let Some(l) = told(ev) {
                    line(format_args!("{l}"));
                }
                if ev.job_finished || last_line.elapsed() >= Duration::from_secs(1) {
                    last_line = Instant::now();
                    line(format_args!("{label}: {}/{} tasks done", ev.done, ev.total));
                }
            }
        })
        .await;
    if let Some(h) = held {
        h.abort();
    }
    let finished = finished?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // The job's outcome is the command's, whether or not its progress could be shown.
    crate::out::after_outcome(shown)?;
    Ok(finished.succeeded())
}

/// Shows why job `job` waits each time that changes (the bar's message, or a line), as
/// [`follow`] shows its progress; until aborted.
async fn show_waiting(
    mut client: Client,
    job: JobId,
    label: String,
    to: Progress,
    bar: Option<ProgressBar>,
) {
    let mut said: Option<String> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Ok(s) = client.job_status_range(job, 0, Some(0)).await else {
            continue;
        };
        if s.waiting == said {
            continue;
        }
        said = s.waiting;
        match (&bar, &said) {
            (Some(b), Some(why)) => b.set_message(format!("waiting: {why}")),
            (Some(b), None) => b.set_message(""),
            (None, Some(why)) if to == Progress::Stderr => eprintln!("{label}: waiting: {why}"),
            (None, Some(why)) => {
                let _ = crate::out::write(format_args!("{label}: waiting: {why}"), true);
            }
            (None, None) => {}
        }
    }
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

/// Prints the end-of-job summary from the job's status document and (for per-worker
/// utilization) the cluster's.
/// The last lines of each failed task's standard error (the first ten failed tasks), for
/// the summary: what a user needs to see why, without `flotilla logs`.
async fn failure_tails(client: &mut Client, status: &JobStatus) -> Vec<(String, Vec<String>)> {
    const LINES: usize = 5;
    const KEEP: usize = 8 << 10;
    let mut tails = Vec::new();
    for t in status.failed_tasks().take(10) {
        let Ok(mut stream) = client.logs(status.id, &t.name, false, true).await else {
            continue;
        };
        let mut tail: Vec<u8> = Vec::new();
        while let Ok(Some(chunk)) = stream.message().await {
            tail.extend_from_slice(&chunk.data);
            if tail.len() > 2 * KEEP {
                tail.drain(..tail.len() - KEEP);
            }
        }
        let text = String::from_utf8_lossy(&tail);
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect();
        let from = lines.len().saturating_sub(LINES);
        if from < lines.len() {
            tails.push((t.name.clone(), lines[from..].to_vec()));
        }
    }
    tails
}

/// How long a summary waits for the tasks being stopped when their job ended (a failure
/// cancels the rest): their SIGTERM, the kill grace (5 s by default), and the report.
const STOPPING_WAIT: Duration = Duration::from_secs(15);

/// The status of job `job`, which has ended, once the tasks that were running or placed when
/// it ended have stopped (at most [`STOPPING_WAIT`]): the summary then says how each task
/// ended, not "stopping".
async fn settled(client: &mut Client, job: JobId) -> Result<JobStatus> {
    let until = Instant::now() + STOPPING_WAIT;
    // Called once the job was followed to its end: its coordinator answered, so a broken
    // connection now (it restarts, a leader changes) is connected again, as following does.
    let mut outage = flotilla::cluster::Outage::default();
    loop {
        let s = match client
            .job_status(job)
            .await
            .map_err(Client::lost_after_answer)
        {
            Ok(s) => {
                outage.answered();
                s
            }
            Err(e) if e.is_transient() => {
                *client = client.follow_again(&mut outage, false, e).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let stopping = s.counts.running + s.counts.assigned > 0;
        if s.state == JobState::Running || !stopping || Instant::now() >= until {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The summary of a job with the stderr tails of its failed tasks.
/// `run_state`: the job is a finished `flotilla run`'s, read from this state directory
/// (the commands it points at say so).
async fn summarize(
    client: &mut Client,
    status: &JobStatus,
    run_state: Option<&Path>,
) -> Result<()> {
    let cluster = client.cluster_status().await.ok();
    let tails = failure_tails(client, status).await;
    print_summary(status, cluster.as_ref(), &tails, run_state)
}

/// A job's state as the tables show it: a running job none of whose tasks has a worker,
/// held back for a reason it names (its tenant's quota, its pool's pause, a task no worker
/// fits), reads `waiting`; `--json` keeps `running`.
fn shown_state(
    state: flotilla_cluster::state::JobState,
    counts: &flotilla_cluster::state::TaskCounts,
    waiting: Option<&str>,
) -> String {
    let held =
        state == JobState::Running && waiting.is_some() && counts.assigned + counts.running == 0;
    if held {
        "waiting".to_string()
    } else {
        state.to_string()
    }
}

fn print_summary(
    status: &JobStatus,
    cluster: Option<&ClusterStatus>,
    tails: &[(String, Vec<String>)],
    run_state: Option<&Path>,
) -> Result<()> {
    outln!(
        "job {} ({}, tenant {}): {}",
        status.id.0,
        status.name,
        status.tenant,
        shown_state(status.state, &status.counts, status.waiting.as_deref())
    );
    if let Some(w) = &status.waiting {
        outln!("  waiting: {w}");
    }
    if let Ok(serde_json::Value::Object(c)) = serde_json::to_value(&status.counts) {
        // A job that ended while some of its tasks ran: they are being stopped (they end
        // cancelled once their workers have), not running on.
        let ended = status.state != JobState::Running;
        let parts: Vec<String> = c
            .iter()
            .filter(|(_, v)| v.as_u64().is_some_and(|n| n > 0))
            .map(|(k, v)| match k.as_str() {
                "running" | "assigned" if ended => format!("{v} stopping ({k})"),
                _ => format!("{v} {k}"),
            })
            .collect();
        if parts.is_empty() {
            outln!("  tasks: none");
        } else {
            outln!("  tasks: {}", parts.join(", "));
        }
    }
    outln!("  retries: {}", status.retries);
    let m = status.makespan_s;
    if status.per_worker.is_empty() {
        // Nothing ran: no makespan to speak of, only how long the job has waited.
        outln!(
            "  makespan: none, no task ran ({} {})",
            fmt_secs(m),
            if status.finished_ms.is_some() {
                "from submission to its end"
            } else {
                "since submission"
            }
        );
    } else {
        outln!("  makespan: {}", fmt_secs(m));
        outln!("  critical path: {}", fmt_secs(status.critical_path_s));
    }
    // Per worker: tasks run and busy time; its utilization is the CPU-seconds the tasks
    // held (half a CPU for 1 s is 0.5) as a share of its CPUs over the makespan.
    for share in &status.per_worker {
        let (w, n, busy) = (share.worker, share.tasks, share.busy_s);
        let info = cluster.and_then(|c| c.workers.iter().find(|x| x.id == w));
        let wname = info
            .map(|i| i.name.clone())
            .or_else(|| status.workers.get(&w).map(|n| format!("{n}, gone")))
            .unwrap_or_else(|| "gone".to_string());
        match info.map(|i| i.resources.cpus.max(1.0)) {
            // Utilization is of a live worker's CPUs; a gone worker's are no longer known.
            Some(cpus) => {
                let util = if m > 0.0 {
                    share.cpu_busy_s / (cpus * m)
                } else {
                    0.0
                };
                outln!(
                    "  worker {w} ({wname}): {n} task{}, busy {}, utilization {:.0}%",
                    if n == 1 { "" } else { "s" },
                    fmt_secs(busy),
                    util * 100.0
                );
            }
            None => outln!(
                "  worker {w} ({wname}): {n} task{}, busy {}",
                if n == 1 { "" } else { "s" },
                fmt_secs(busy)
            ),
        }
    }
    if let Some(p) = &status.pool {
        let budget = p
            .budget
            .map_or("its tenant's balance".to_string(), |b| format!("{b:.6}"));
        outln!(
            "  pool: spent {:.6} credits, held {:.6}, budget {budget}, verify {}, {} result(s) rejected",
            p.spent, p.held, p.verify, p.rejected
        );
        if let (Some(ms), Some(d)) = (p.deadline_ms, &p.deadline) {
            outln!(
                "  deadline: {} after submission: {d}",
                fmt_secs(ms as f64 / 1000.0)
            );
        }
        // Where each task went, why, and what it cost (the first 20).
        for t in status.tasks.iter().take(20) {
            if t.worker.is_none() {
                // Never placed: no machine to name, nothing spent.
                outln!("  task {}: {}, not placed yet", t.name, t.state);
                continue;
            }
            let mut on = t
                .provider
                .clone()
                .unwrap_or_else(|| "the operator's own worker".into());
            let mut why = t.placement.as_ref().map_or("", |r| r.why.as_str());
            // A verified result ran (and was paid) on each provider that agreed.
            if let [init @ .., last] = t.agreed.as_slice() {
                if !init.is_empty() {
                    on = format!("{} and {last}", init.join(", "));
                    why = "verified: their results agree";
                }
            }
            outln!(
                "  task {}: {} on {on}, cost {:.6}{}",
                t.name,
                t.state,
                t.cost.unwrap_or(0.0),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            );
        }
    }
    for t in status.failed_tasks().take(10) {
        outln!(
            "  failed: {} — {}",
            t.name,
            t.message.as_deref().unwrap_or("")
        );
        if let Some((_, lines)) = tails.iter().find(|(n, _)| *n == t.name) {
            outln!("    last lines of its stderr:");
            for l in lines {
                outln!("    | {l}");
            }
        }
    }
    let failed = status.counts.failed;
    if failed > 10 {
        outln!(
            "  … and {} more failed: `flotilla status {} --state failed{}` lists them all",
            failed - 10,
            status.id.0,
            run_state.map_or(String::new(), |d| format!(" --run-state {}", d.display()))
        );
    }
    // Tasks that had failed too, cancelled while they waited to retry: fixing the first
    // failure alone would not do.
    let also: Vec<&str> = status
        .tasks
        .iter()
        .filter(|t| {
            t.state == TaskState::Cancelled
                && t.message
                    .as_deref()
                    .is_some_and(|m| m.contains(flotilla_cluster::state::FAILED_BEFORE_END))
        })
        .map(|t| t.name.as_str())
        .collect();
    if !also.is_empty() {
        let shown = also.iter().take(10).copied().collect::<Vec<_>>().join(", ");
        let more = also.len().saturating_sub(10);
        outln!(
            "  failed too, cancelled while waiting to retry: {shown}{}",
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// A folder given where a job file is read: said as such, with the file it may hold.
fn not_a_folder(job_path: &Path) -> Result<()> {
    if job_path.is_dir() {
        let inside = job_path.join("job.toml");
        anyhow::bail!(
            "{} is a folder: give the job file{}",
            job_path.display(),
            if inside.is_file() {
                format!(" ({})", inside.display())
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// Reads and checks a job file here, before anything starts or connects: its mistakes are
/// named (with the path as given) whether or not a coordinator is up. With `expand`, its
/// tasks are expanded too (`run`; a coordinator expands a submitted job itself, within its
/// limits).
fn check_job_file(job_path: &Path, expand: bool) -> Result<flotilla::core::JobSpec> {
    not_a_folder(job_path)?;
    let text = std::fs::read_to_string(job_path)
        .with_context(|| format!("reading {}", job_path.display()))?;
    flotilla::core::parse_job(&text, &job_path.display().to_string())
        .and_then(|s| {
            s.validate()?;
            if expand {
                s.expand()?;
            }
            Ok(s)
        })
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// `--dry-run`: the job file checked as a submission checks it, and what would run.
fn dry_run(job: &Path, json: bool) -> Result<bool> {
    not_a_folder(job)?;
    let plan = flotilla_cluster::plan::plan_file(job).map_err(|e| anyhow::anyhow!("{e}"))?;
    if json {
        outln!("{}", serde_json::to_string(&plan)?);
        return Ok(true);
    }
    let staging = match plan.staging {
        flotilla::core::Staging::Shared => "shared staging".to_string(),
        flotilla::core::Staging::Transfer => format!(
            "transfer staging, {} input files to upload ({})",
            plan.uploads,
            flotilla::core::size::format_size_readable(plan.upload_bytes)
        ),
    };
    outln!(
        "{} ({}): {} tasks, {} dependencies, longest chain {}, {staging}",
        plan.name,
        plan.file,
        plan.tasks,
        plan.dependencies,
        plan.longest_chain
    );
    let mut t = crate::table::new(&["task", ">instances", "runs", "resources", "after"]);
    for task in &plan.task_tables {
        t.add_row(vec![
            task.id.clone(),
            task.instances.to_string(),
            task.runs.clone(),
            task.resources.clone(),
            task.after.join(", "),
        ]);
    }
    outln!("{t}");
    print_warnings(&plan);
    outln!("checked; nothing was run (--dry-run)");
    Ok(true)
}

/// A plan's warnings, on stderr.
fn print_warnings(plan: &flotilla_cluster::plan::Plan) {
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    if plan.more_warnings > 0 {
        eprintln!("warning: … and {} more like these", plan.more_warnings);
    }
}

/// `flotilla run`'s one worker, as it will offer itself (its coordinator's address and its
/// guard come later).
fn local_worker(a: &RunArgs) -> Result<WorkerConfig> {
    let mut wcfg = WorkerConfig::local(Remote::new(String::new(), String::new()));
    if let Some(c) = a.cpus {
        wcfg.cpus = c;
    }
    wcfg.gpus = gpus_from(&a.gpus)?;
    wcfg.name = "local".into();
    wcfg.isolation = a.isolation;
    wcfg.allow_network = a.allow_network;
    Ok(wcfg)
}

/// A task, or a gang's members side by side, that `flotilla run`'s one worker can never
/// take is refused before anything runs: it was cancelled only once the tasks before it had
/// run (a whole sweep, before its reduce); `--dry-run` says the same.
fn refuse_unfit(spec: &flotilla::core::JobSpec, wcfg: &WorkerConfig) -> Result<()> {
    let offer = wcfg.offer();
    spec.check_fits(std::slice::from_ref(&offer))
        .and_then(|()| spec.check_gangs_fit(&offer))
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}: it can never run on this machine's worker, so nothing was run (flotilla \
                 run's one worker offers {offer}, what --cpus, --gpus and --allow-network give \
                 it, and no custom resources: for more, run the job on a cluster whose workers \
                 offer what the task needs)"
            )
        })
}

pub(crate) async fn run(a: RunArgs) -> Result<bool> {
    if a.dry_run {
        refuse_unfit(&check_job_file(&a.job, false)?, &local_worker(&a)?)?;
        return dry_run(&a.job, a.json);
    }
    // Heard from now: a Ctrl-C before the job is followed is one too (the default action
    // ended the process silently).
    let int = interrupts();
    let job_path = a.job.clone();
    // Refuse a bad job file before starting anything, and say what `--dry-run` would warn
    // of (an input that no task before it writes raced silently).
    let spec = check_job_file(&job_path, false)?;
    print_warnings(
        &flotilla_cluster::plan::plan_file(&job_path).map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let job_dir = std::fs::canonicalize(&job_path)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    // A folder the coordinator would refuse (`/tmp`, a system folder): said before the state
    // folder is made in it.
    flotilla_cluster::plan::check_job_dir(&job_dir.display().to_string())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The one worker, as it will offer itself (its coordinator's address comes below).
    let mut wcfg = local_worker(&a)?;
    wcfg.guard = flotilla::guard_command();
    refuse_unfit(&spec, &wcfg)?;
    let state = a.state.clone().unwrap_or_else(|| job_dir.join(".flotilla"));
    let mut scfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), &state);
    scfg.http_listen = a.dashboard;
    // One user's own coordinator: any job the file format allows (a shared coordinator's
    // per-job limit, `server --max-job-tasks`, protects its other tenants).
    scfg.max_job_tasks = flotilla_core::job::MAX_INSTANCES;
    // Its one worker lives in this process: an earlier run's, whose attempts a resumed job
    // may still list as running, is gone for good (they waited 30 s for it to rejoin).
    scfg.coordinator.reconcile_grace_ms = 0;
    let name = spec.name;
    // Its API port is any free one: a port that cannot be listened on is the dashboard's.
    let server = Server::start(scfg)
        .await
        .map_err(|e| e.bind_for("--dashboard"))?;
    if let Some(http) = server.http_addr() {
        eprintln!(
            "dashboard: http://{http}/?token={} (the token is exchanged for a session)",
            server.token()
        );
    }
    let remote = Remote::new(server.addr().to_string(), server.token().to_string());
    wcfg.remote = remote.clone();
    wcfg.work_dir = state.join("worker");
    let mut client = Client::connect(&remote).await?;
    // A run interrupted before its job ended (Ctrl-C, a kill) left that job running in the
    // state folder: it would resume here, before and beside this one, unannounced. With
    // --resume the newest job of this name goes on (retried when it ended failed or
    // cancelled); every unfinished other is cancelled, and said so, before the worker starts.
    let leftover = client.cluster_status().await?;
    let unfinished = leftover
        .jobs
        .iter()
        .filter(|j| j.state == JobState::Running);
    // The newest of this name whose job folder is this file's (a --state shared by jobs of
    // several folders holds others) and, for a job a run of this version submitted, whose
    // file is this one (another file of the same name in the folder is another job); and
    // whether that file changed since.
    let this_file = RunSource::of(&job_path)?;
    let mut resumed = None;
    let mut edited = None;
    if a.resume {
        let mut named: Vec<_> = leftover.jobs.iter().filter(|j| j.name == name).collect();
        named.sort_by_key(|j| std::cmp::Reverse(j.id));
        for j in named {
            let same_folder = client
                .job_status_range(j.id, 0, Some(0))
                .await
                .is_ok_and(|s| Path::new(&s.dir) == job_dir);
            let source = RunSource::read(&state, j.id);
            if !same_folder || source.as_ref().is_some_and(|s| s.file != this_file.file) {
                continue;
            }
            edited = source.map(|s| s.hash != this_file.hash);
            resumed = Some(j);
            break;
        }
    }
    if a.resume && resumed.is_none() {
        eprintln!(
            "--resume: no job of {} in {}: the job file is submitted anew",
            job_path.display(),
            state.display()
        );
    }
    // What is said of the file's edits: taken only by a plain run.
    let edits = match edited {
        Some(true) => {
            " (the job file changed since it was submitted: the edits are not taken; a plain \
             `flotilla run` runs it as it is now)"
        }
        Some(false) => "",
        None => " (edits to the job file since are not taken: run without --resume for them)",
    };
    if let Some(j) = resumed.filter(|j| j.state == JobState::Succeeded) {
        eprintln!(
            "--resume: job {} ({}) in {} succeeded already, all {} tasks done: nothing to \
             run{}",
            j.id.0,
            j.name,
            state.display(),
            j.total,
            if edits.is_empty() {
                " (a plain `flotilla run` runs the job file anew)"
            } else {
                edits
            }
        );
        if a.json {
            let s = client.job_status(j.id).await?;
            outln!("{}", serde_json::to_string(&s)?);
        }
        server.stop();
        server.wait().await?;
        return Ok(true);
    }
    for j in unfinished.filter(|j| Some(j.id) != resumed.map(|r| r.id)) {
        client.cancel(j.id).await?;
        eprintln!(
            "cancelled job {} ({}), left unfinished by an earlier run in {} ({} of {} tasks done)",
            j.id.0,
            j.name,
            state.display(),
            j.done,
            j.total
        );
    }
    // One that ended failed or cancelled: its failed and cancelled tasks run again.
    if let Some(j) = resumed.filter(|j| j.state != JobState::Running) {
        let again = match client.retry(j.id).await {
            Ok(n) => n,
            Err(e) => {
                server.stop();
                server.wait().await?;
                anyhow::bail!(
                    "--resume: {e}; a plain `flotilla run {}` runs the job file anew",
                    job_path.display()
                );
            }
        };
        eprintln!(
            "resuming job {} ({}), which ended {}: {} again, its {} done kept{edits}",
            j.id.0,
            j.name,
            j.state.as_str(),
            tasks_run(again, "failed or cancelled "),
            j.done
        );
    } else if let Some(j) = resumed {
        eprintln!(
            "resuming job {} ({}), {} of {} tasks done: it goes on as it was submitted{edits}",
            j.id.0, j.name, j.done, j.total
        );
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let worker = tokio::spawn(run_worker(wcfg, stop_rx));
    let started = Instant::now();
    let submitted = match resumed {
        Some(j) => flotilla::cluster::Submitted {
            job: j.id,
            name: j.name.clone(),
            tasks: u32::try_from(j.total).unwrap_or(u32::MAX),
        },
        None => {
            let s = client.submit_file(&job_path).await?;
            this_file.write(&state, s.job);
            s
        }
    };
    let label = format!("{} (job {})", submitted.name, submitted.job.0);
    let to = if a.json {
        Progress::Stderr
    } else {
        Progress::Stdout
    };
    // The local worker is the only one there will be: a task larger than it offers would
    // wait forever. A watch cancels the job when one appears, and says which.
    let why_cancelled = Arc::new(OnceLock::new());
    let never = tokio::spawn(watch_never_fits(
        remote.clone(),
        submitted.job,
        why_cancelled.clone(),
    ));
    // Interrupted, the job is left unfinished in the journal, its tasks stopped with this
    // process: `run --resume` goes on with it, a plain run cancels it.
    let interrupted = {
        let (remote, job) = (remote.clone(), submitted.job);
        let file = job_path.display().to_string();
        async move {
            let status = match Client::connect(&remote).await {
                Ok(mut c) => c.job_status(job).await.ok(),
                Err(_) => None,
            };
            if let Some(s) = status.as_ref().filter(|s| s.finished_state().is_some()) {
                return format!("job {} had ended ({}) before it", job.0, s.state);
            }
            let done = status
                .map(|s| format!(" ({} of {} tasks done)", s.counts.done, s.total))
                .unwrap_or_default();
            format!(
                "job {} left unfinished{done}, its running tasks stopped: `flotilla run \
                 --resume {file}` goes on with it; a plain `flotilla run` cancels it",
                job.0
            )
        }
    };
    let (ok, status) = unless_interrupted(
        int,
        async {
            // No waiting reasons: its one worker is the machine (a task too large is
            // cancelled).
            let ok = follow(&mut client, submitted.job, &label, to, false).await?;
            let status = settled(&mut client, submitted.job).await?;
            gather_if_transfer(&mut client, &status, ok).await?;
            anyhow::Ok((ok, status))
        },
        interrupted,
    )
    .await?;
    never.abort();
    let too_large = why_cancelled.get();
    if let Some(why) = too_large {
        eprintln!(
            "flotilla: {why}; it can never run on this machine's worker, so the job was \
             cancelled (flotilla run's one worker offers what --cpus, --gpus and \
             --allow-network give it, and no custom resources: for more, run the job on a \
             cluster whose workers offer what the task needs)"
        );
    }
    if let Some(path) = &a.trace {
        let t = client.job_trace(submitted.job).await?;
        std::fs::write(path, t.to_chrome())
            .with_context(|| format!("writing the trace to {}", path.display()))?;
        eprintln!(
            "trace of {} attempts written to {}",
            t.spans.len(),
            path.display()
        );
    }
    let shown = if a.json {
        let mut doc = serde_json::to_value(&status)?;
        // Why `run` cancelled it (a task larger than its one worker), for scripts: the same
        // words as on stderr; absent otherwise.
        if let (Some(why), Some(map)) = (too_large, doc.as_object_mut()) {
            map.insert("cancelled_because".into(), why.clone().into());
        }
        crate::out::write(format_args!("{}", serde_json::to_string(&doc)?), true)
    } else {
        match summarize(&mut client, &status, Some(&state)).await {
            Ok(()) => (|| {
                outln!("  wall time: {}", fmt_secs(started.elapsed().as_secs_f64()));
                // A failed transfer job gathered nothing: no outputs to point at. (In shared
                // staging the done tasks' outputs are there whatever the outcome.)
                if ok || status.staging == flotilla::core::Staging::Shared {
                    outln!("  outputs in {}", job_dir.display());
                }
                // The coordinator is gone with the run: its logs are read from its state.
                outln!(
                    "  a task's output: flotilla logs --state {} {} TASK",
                    state.display(),
                    status.id.0
                );
                Ok(())
            })(),
            e => e,
        }
    };
    if status.state == JobState::Failed && status.pool.is_none() {
        eprintln!(
            "once the cause is fixed, `flotilla run --resume {}` runs its failed tasks and those \
             not run again (its done ones kept)",
            job_path.display()
        );
    }
    let _ = stop_tx.send(true);
    let _ = worker.await;
    server.stop();
    server.wait().await?;
    crate::out::after_outcome(shown.and_then(|()| crate::out::write_all(b"")))?;
    Ok(ok)
}

/// Transfer staging: when the job succeeded, fetches its outputs from the workers holding
/// them into the job folder (the `dir` of its status document).
async fn gather_if_transfer(client: &mut Client, status: &JobStatus, ok: bool) -> Result<()> {
    let done = status.counts.done;
    if status.staging != flotilla::core::Staging::Transfer || (!ok && done == 0) {
        return Ok(());
    }
    let (job, dir) = (status.id, &status.dir);
    // A job that did not succeed still has its done tasks' outputs (a sweep with
    // `keep_going` where a few points failed): gathered too, as far as they can be (they
    // stayed on the workers, unsaid, and `retry` alone brought them).
    let got = match client
        .gather_with(job, Path::new(dir), |why| eprintln!("gathering: {why}"))
        .await
    {
        Ok(got) => got,
        Err(e) if !ok => {
            eprintln!("gathering the done tasks' outputs of {job} into {dir}: {e}");
            return Ok(());
        }
        Err(e) => {
            return Err(e).with_context(|| format!("gathering the outputs of {job} into {dir}"))
        }
    };
    let bytes: u64 = got.iter().map(|o| o.size).sum();
    let n = got.len();
    let s = if n == 1 { "" } else { "s" };
    if ok {
        eprintln!("gathered {n} output{s} ({bytes} bytes) into {dir}");
    } else {
        eprintln!(
            "gathered {n} output{s} ({bytes} bytes) of its {done} done task{} into {dir}; \
             the job {}: the others' are not there",
            if done == 1 { "" } else { "s" },
            status.state.as_str()
        );
    }
    Ok(())
}

/// How long `flotilla submit` goes on sending a submission whose answer was lost (at least
/// 5 times): counting 5 tries alone (7.5 s) could end within one unlucky election of a
/// loaded group.
const SUBMIT_PATIENCE: Duration = Duration::from_secs(30);

pub(crate) async fn submit(a: SubmitArgs) -> Result<bool> {
    if a.dry_run {
        return dry_run(&a.job, a.json);
    }
    // One id for every attempt: a submission that was taken, but whose answer was lost (a
    // leader change, a broken connection), is answered with its job when sent again.
    let spec = check_job_file(&a.job, false)?;
    for w in flotilla::core::lint::placeholder_warnings(&spec) {
        eprintln!("warning: {w}");
    }
    let id = Client::new_request_id();
    let mut attempt = 1;
    let started = Instant::now();
    let (mut client, s) = loop {
        let mut client = a.remote.client().await?;
        match client.submit_file_with_id(&a.job, Some(&id)).await {
            Ok(s) => break (client, s),
            Err(e) if e.is_transient() && (attempt < 5 || started.elapsed() < SUBMIT_PATIENCE) => {
                eprintln!("submitting: {e}; trying again (attempt {})", attempt + 1);
                tokio::time::sleep(Duration::from_millis(250 << attempt.min(3))).await;
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    };
    eprintln!(
        "submitted job {} ({}, {} task{})",
        s.job.0,
        s.name,
        s.tasks,
        if s.tasks == 1 { "" } else { "s" }
    );
    let submission = serde_json::json!({ "job": s.job.0, "name": s.name, "tasks": s.tasks });
    if a.json && !a.wait {
        crate::out::after_outcome(crate::out::write(format_args!("{submission}"), true))?;
        return Ok(true);
    }
    let label = format!("{} (job {})", s.name, s.job.0);
    let waited = if a.wait {
        follow_to_end(&mut client, s.job, &label, a.json).await
    } else {
        Ok(true)
    };
    // The job id alone on the last line of stdout, for scripts, also when following it
    // failed (the coordinator gone for good): the job was taken, and may still run. (With
    // --json the status document is the line, and names the job; the submission's when
    // following failed.)
    if !a.json {
        crate::out::after_outcome(crate::out::write(format_args!("{}", s.job.0), true))?;
    } else if waited.is_err() {
        crate::out::after_outcome(crate::out::write(format_args!("{submission}"), true))?;
    }
    let ok = waited.with_context(|| {
        format!(
            "following job {} (it was submitted; `flotilla wait {}` follows it again)",
            s.job.0, s.job.0
        )
    })?;
    Ok(ok)
}

/// Tasks `flotilla status JOB` lists on the terminal without `--tasks-limit`.
const TEXT_TASKS: u64 = 50;

/// A job's page of tasks as a table, and how to see the next page (`limit`: the
/// `--tasks-limit` given, repeated in the next page's command).
fn print_tasks(s: &JobStatus, limit: Option<u64>, run_state: Option<&Path>) -> Result<()> {
    let more = |limit| {
        let dir = run_state.map_or(String::new(), |d| format!(" --run-state {}", d.display()));
        format!("{dir}{}", more(limit))
    };
    if s.tasks.is_empty() {
        if !s.tasks_in.is_empty() {
            let states: Vec<&str> = s.tasks_in.iter().map(|t| t.as_str()).collect();
            outln!("\nno {} tasks", states.join(" or "));
        }
        return Ok(());
    }
    let mut t = crate::table::new(&["TASK", "STATE", ">ATTEMPTS", "WORKER", ">WALL", "MESSAGE"]);
    for task in &s.tasks {
        let worker = task.worker.map_or(String::new(), |w| {
            s.workers
                .get(&w)
                .map_or_else(|| w.to_string(), |n| format!("{w} ({n})"))
        });
        t.add_row([
            task.name.clone(),
            task.state.to_string(),
            task.attempts.to_string(),
            worker,
            // A running task's time so far.
            task.usage
                .as_ref()
                .map(|u| u.wall_seconds)
                .or(task.running_s)
                .map_or(String::new(), fmt_secs),
            task.message.clone().unwrap_or_default(),
        ]);
    }
    outln!("\n{t}");
    if !s.tasks_in.is_empty() {
        let names: Vec<&str> = s.tasks_in.iter().map(|t| t.as_str()).collect();
        let (flag, said) = (names.join(","), names.join(" or "));
        let n = s.tasks.len();
        let tasks = if n == 1 { "task" } else { "tasks" };
        let all: u64 = s.tasks_in.iter().map(|t| s.counts.get(*t)).sum();
        match s.tasks_next {
            Some(next) => outln!(
                "\n{n} {tasks} listed ({said}, of {all}); the next page: flotilla status {} \
                 --state {flag} --tasks-from {next}{}",
                s.id.0,
                more(limit)
            ),
            None => outln!(
                "\n{n} {tasks} listed ({said}){}",
                if s.tasks_from > 0 {
                    format!(", from id {}", s.tasks_from)
                } else {
                    String::new()
                }
            ),
        }
        return Ok(());
    }
    let end = s.tasks_from + s.tasks.len() as u64;
    if end < s.total {
        outln!(
            "\ntasks {}–{} of {}; the next page: flotilla status {} --tasks-from {end}{}",
            s.tasks_from,
            end - 1,
            s.total,
            s.id.0,
            more(limit)
        );
    } else if s.tasks_from > 0 {
        outln!("\ntasks {}–{} of {}", s.tasks_from, end - 1, s.total);
    }
    Ok(())
}

/// How the next page's command ends: the `--tasks-limit` given again, or how to ask for
/// more at once.
fn more(limit: Option<u64>) -> String {
    match limit {
        Some(n) => format!(" --tasks-limit {n}"),
        None => " (--tasks-limit N for more at once)".into(),
    }
}

/// `--state failed`: a task state as the status documents write it.
fn task_state(s: &str) -> std::result::Result<TaskState, String> {
    let s = s.trim().to_ascii_lowercase();
    s.parse().map_err(|e| match s.as_str() {
        "succeeded" | "success" => format!("{e} (a task that succeeded is done)"),
        _ => e,
    })
}

pub(crate) async fn status(a: StatusArgs) -> Result<()> {
    let (local, mut client) = client_for(&a.remote, a.run_state.as_deref()).await?;
    let shown = show_status(&a, &mut client).await;
    if let Some(server) = local {
        server.stop();
        server.wait().await?;
    }
    shown
}

async fn show_status(a: &StatusArgs, client: &mut Client) -> Result<()> {
    if let Some(job) = a.job.map(JobId::new) {
        // On the terminal, a page of TEXT_TASKS tasks unless asked for more.
        let limit = if a.json {
            a.tasks_limit
        } else {
            Some(a.tasks_limit.unwrap_or(TEXT_TASKS))
        };
        let mut states = a.state.clone();
        states.sort_by_key(|s| s.index());
        states.dedup();
        let s = client
            .job_status_in(job, a.tasks_from, limit, &states)
            .await?;
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            summarize(client, &s, a.run_state.as_deref()).await?;
            print_tasks(&s, a.tasks_limit, a.run_state.as_deref())?;
        }
        return Ok(());
    }
    let s = client.cluster_status().await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let mut jobs = crate::table::new(&[
        ">JOB",
        "NAME",
        "TENANT",
        "STATE",
        ">DONE/TOTAL",
        ">MAKESPAN",
        "WAITING",
    ]);
    for j in &s.jobs {
        jobs.add_row([
            j.id.0.to_string(),
            j.name.clone(),
            j.tenant.clone(),
            shown_state(j.state, &j.counts, j.waiting.as_deref()),
            format!("{}/{}", j.done, j.total),
            // A job none of whose tasks ran has no makespan, only a wait.
            if j.ran {
                fmt_secs(j.makespan_s)
            } else {
                "-".into()
            },
            j.waiting.clone().unwrap_or_default(),
        ]);
    }
    outln!("{jobs}\n");
    let mut workers = crate::table::new(&[
        "WORKER",
        "NAME",
        "HOST",
        ">CPUS",
        ">CPUS USED",
        ">MEM USED",
        ">GPUS",
        ">QUEUED",
        ">UTIL",
        ">UP",
        "HW CLASS",
        "PROVIDER",
    ]);
    let size = flotilla::core::size::format_size_readable;
    for w in &s.workers {
        workers.add_row([
            w.id.to_string(),
            w.name.clone(),
            w.hostname.clone(),
            w.resources.cpus.to_string(),
            w.used.cpus.to_string(),
            // What its attempts reserve, of what it offers (`--mem`).
            format!("{} of {}", size(w.used.mem), size(w.resources.mem)),
            w.resources.gpus.to_string(),
            w.queued.to_string(),
            format!("{:.0}%", w.utilization * 100.0),
            fmt_secs(w.uptime_s),
            w.hw_class.clone(),
            w.provider.clone().unwrap_or_default(),
        ]);
    }
    outln!("{workers}");
    if let Some(j) = &s.journal {
        outln!();
        outln!(
            "journal {}: {} records, {:.1} MiB, fsync {} ({} fsyncs)",
            j.path,
            j.records,
            j.bytes as f64 / (1u64 << 20) as f64,
            if j.fsync { "on" } else { "off" },
            j.syncs
        );
    }
    Ok(())
}

pub(crate) async fn wait(a: WaitArgs) -> Result<bool> {
    let mut client = a.remote.client().await?;
    let job = JobId::new(a.job);
    // Its progress lines are labelled as `submit --wait` labels them: `NAME (job N)`.
    let name = client.job_status_range(job, 0, Some(0)).await?.name;
    follow_to_end(&mut client, job, &format!("{name} (job {})", job.0), a.json).await
}

/// `wait` and `submit --wait`: follows a job to its end, prints its summary (with the last
/// lines of each failed task's stderr, even those that failed before the event stream was
/// opened: the stream does not replay them), gathers its outputs in transfer staging;
/// whether it succeeded. Ctrl-C says that the job goes on. With `json`, the progress goes
/// to stderr and the status document, on one line, takes the summary's place.
async fn follow_to_end(client: &mut Client, job: JobId, label: &str, json: bool) -> Result<bool> {
    unless_interrupted(
        interrupts(),
        async {
            let to = if json {
                Progress::Stderr
            } else {
                Progress::Stdout
            };
            let ok = follow(client, job, label, to, true).await?;
            let status = settled(client, job).await?;
            let shown = if json {
                serde_json::to_string(&status)
                    .map_err(anyhow::Error::from)
                    .and_then(|doc| crate::out::write(format_args!("{doc}"), true))
            } else {
                summarize(client, &status, None).await
            };
            if status.state == JobState::Failed && status.pool.is_none() {
                eprintln!(
                    "once the cause is fixed, `flotilla retry {}` runs its failed tasks and \
                     those not run again (its done ones kept)",
                    job.0
                );
            }
            gather_if_transfer(client, &status, ok).await?;
            crate::out::after_outcome(shown)?;
            Ok(ok)
        },
        still_runs(job),
    )
    .await
}

pub(crate) async fn trace(a: TraceArgs) -> Result<()> {
    let mut client = a.remote.client().await?;
    let t = client.job_trace(JobId::new(a.job)).await?;
    if t.partial {
        eprintln!(
            "note: the trace of {} is partial (attempts that ended before the coordinator last \
             started have no times, and a job keeps its first 200,000)",
            t.job
        );
    }
    let text = t.to_chrome();
    match &a.output {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("writing the trace to {}", path.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    Ok(())
}

pub(crate) async fn cancel(a: JobArgs) -> Result<()> {
    use flotilla_cluster::state::JobState;
    let mut client = a.remote.client().await?;
    let job = JobId::new(a.job);
    // Say what happened: a finished job is left as it was (the coordinator ignores the
    // cancel), and one may finish while the cancel is on its way.
    let before = client.job_status_range(job, 0, Some(0)).await?;
    if before.state != JobState::Running {
        eprintln!(
            "job {} had already finished ({}): nothing to cancel",
            a.job,
            before.state.as_str()
        );
        return Ok(());
    }
    client.cancel(job).await?;
    let after = client.job_status_range(job, 0, Some(0)).await?;
    match after.state {
        JobState::Cancelled => eprintln!(
            "cancelled job {} ({} of {} tasks had finished)",
            a.job, after.counts.done, after.total
        ),
        state => eprintln!(
            "job {} finished ({}) before the cancel reached it",
            a.job,
            state.as_str()
        ),
    }
    Ok(())
}

/// The job file a `flotilla run` submitted a job from, kept in its state folder
/// (`run/<job>.json`): `--resume` goes on only with a job of the same file, and says whether
/// the file changed since.
#[derive(serde::Serialize, serde::Deserialize)]
struct RunSource {
    /// The file's absolute path.
    file: String,
    /// The BLAKE3 hash of its text, hex.
    hash: String,
}

impl RunSource {
    fn of(path: &Path) -> Result<RunSource> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file = std::fs::canonicalize(path)
            .with_context(|| format!("reading {}", path.display()))?
            .display()
            .to_string();
        let hash = blake3::hash(&text).to_hex().to_string();
        Ok(RunSource { file, hash })
    }

    fn path(state: &Path, job: JobId) -> PathBuf {
        state.join("run").join(format!("{}.json", job.0))
    }

    /// What was kept of `job`'s file; `None` for a job no run of this version submitted.
    fn read(state: &Path, job: JobId) -> Option<RunSource> {
        let text = std::fs::read(Self::path(state, job)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Keeps it for `job` (a failure only costs `--resume` its checks, and is said).
    fn write(&self, state: &Path, job: JobId) {
        let path = Self::path(state, job);
        let r = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(self).unwrap_or_default()));
        if let Err(e) = r {
            eprintln!(
                "warning: {}: {e} (`flotilla run --resume` cannot tell this job's file from \
                 another of the same name)",
                path.display()
            );
        }
    }
}

/// "1 task runs", "3 tasks run" (`kind`: words before "task").
fn tasks_run(n: u64, kind: &str) -> String {
    if n == 1 {
        format!("1 {kind}task runs")
    } else {
        format!("{n} {kind}tasks run")
    }
}

/// `flotilla retry`: the job's failed and cancelled tasks run again, its done ones kept;
/// with --wait, followed to the end (whether it succeeded); without, `true`.
pub(crate) async fn retry(a: RetryArgs) -> Result<bool> {
    let mut client = a.remote.client().await?;
    let job = JobId::new(a.job);
    // Its done tasks before the retry: after it, retried ones may be done already.
    let s = client.job_status_range(job, 0, Some(0)).await?;
    let again = client.retry(job).await?;
    eprintln!(
        "job {}: {} again ({} done kept)",
        a.job,
        tasks_run(again, ""),
        s.counts.done
    );
    if !a.wait {
        if a.json {
            let doc = serde_json::json!({
                "job": a.job,
                "tasks_again": again,
                "done_kept": s.counts.done,
            });
            crate::out::after_outcome(crate::out::write(format_args!("{doc}"), true))?;
        }
        return Ok(true);
    }
    let label = format!("{} (job {})", s.name, job.0);
    follow_to_end(&mut client, job, &label, a.json).await
}

pub(crate) async fn remove(a: JobArgs) -> Result<()> {
    let mut client = a.remote.client().await?;
    client.remove(JobId::new(a.job)).await?;
    eprintln!("removed job {}", a.job);
    Ok(())
}

pub(crate) async fn logs(a: LogsArgs) -> Result<()> {
    let (local, mut client) = client_for(&a.remote, a.state.as_deref()).await?;
    let printed = async {
        let job = JobId::new(a.job);
        let tail = local.is_none();
        // One instance, as named; an array's or a gang's id alone is answered with the
        // coordinator's "several instances" (its words, across the RPC): then each of them.
        let one = follow_logs(&mut client, &a, &a.task, tail, &mut Sink::Raw, false).await;
        let several = matches!(&one, Err(e) if e.to_string().contains("has several instances"));
        if !several {
            return one.map(drop);
        }
        let names = instances_of(&mut client, job, &a.task).await?;
        let stream = if a.stderr { "stderr" } else { "stdout" };
        // The instances that printed nothing (or never ran), counted in one line: one
        // line each was hundreds of lines for a sweep.
        let silent = |wrote: &[bool]| {
            let n = wrote.iter().filter(|w| !**w).count();
            if n > 0 {
                eprintln!(
                    "({n} of the {} instances of {} wrote nothing to {stream}, or have not run)",
                    wrote.len(),
                    a.task
                );
            }
        };
        match names.as_slice() {
            [] => one.map(drop),
            many if a.follow => {
                if many.len() > MAX_FOLLOWED {
                    anyhow::bail!(
                        "{} has {} instances: --follow follows at most {MAX_FOLLOWED} at once \
                         (name one, such as {}, or leave out --follow)",
                        a.task,
                        many.len(),
                        many[0]
                    );
                }
                // Each instance's lines as they come, behind its name.
                let all = many.iter().map(|name| {
                    let mut c = client.clone();
                    let a = &a;
                    async move {
                        let mut sink = Sink::labelled(name);
                        let r = follow_logs(&mut c, a, name, tail, &mut sink, true).await;
                        sink.finish()?;
                        r
                    }
                });
                // The first error (stdout closed, the job gone) ends them all.
                let wrote = futures::future::try_join_all(all).await?;
                silent(&wrote);
                Ok(())
            }
            many => {
                // One after another, each under a header, as `tail` prints several files.
                let mut wrote = Vec::with_capacity(many.len());
                for name in many {
                    let gap = if wrote.contains(&true) { "\n" } else { "" };
                    let mut sink = Sink::Headed {
                        header: format!("{gap}==> {name} <==\n"),
                        shown: false,
                    };
                    wrote.push(follow_logs(&mut client, &a, name, tail, &mut sink, true).await?);
                }
                silent(&wrote);
                Ok(())
            }
        }
    }
    .await;
    if let Some(server) = local {
        server.stop();
        server.wait().await?;
    }
    printed
}

/// A client of the coordinator, or, with `state`, of one started on a finished `flotilla
/// run`'s state directory (its coordinator is gone with the run), on a loopback port of its
/// own, which the caller stops when done.
async fn client_for(remote: &RemoteArgs, state: Option<&Path>) -> Result<(Option<Server>, Client)> {
    let local = match state {
        Some(state) => {
            if !state.join("journal.log").is_file() {
                anyhow::bail!(
                    "{}: no journal here: not the state directory of a `flotilla run` \
                     (.flotilla beside its job file, or its --state)",
                    state.display()
                );
            }
            let server = Server::start(ServerConfig::new(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                state,
            ))
            .await
            .with_context(|| format!("opening {}", state.display()))?;
            Some(server)
        }
        None => None,
    };
    let client = match &local {
        Some(server) => {
            Client::connect(&Remote::new(
                server.addr().to_string(),
                server.token().to_string(),
            ))
            .await?
        }
        None => remote.client().await?,
    };
    Ok((local, client))
}

/// `flotilla logs --follow` of several instances follows at most this many at once.
const MAX_FOLLOWED: usize = 64;

/// The instances of an array's or a gang's id without an index (`train`) in `job`: each
/// `train[i]` in order (every rank's or index's output), paging through the job's tasks
/// until they are past.
async fn instances_of(client: &mut Client, job: JobId, task: &str) -> Result<Vec<String>> {
    let prefix = format!("{task}[");
    let mut found = Vec::new();
    let mut from = 0;
    loop {
        let s = client.job_status_range(job, from, None).await?;
        for t in &s.tasks {
            if t.name == task {
                return Ok(vec![task.to_string()]);
            }
            if t.name.starts_with(&prefix) {
                found.push(t.name.clone());
            } else if !found.is_empty() {
                return Ok(found); // an array's instances are consecutive
            }
        }
        let end = from + s.tasks.len() as u64;
        if s.tasks.is_empty() || end >= s.total {
            return Ok(found);
        }
        from = end;
    }
}

/// Where one instance's output goes: to stdout as it comes, or line by line behind its
/// name (several instances followed at once).
enum Sink {
    Raw,
    /// Raw, after a header line printed before its first bytes (none for an instance that
    /// wrote nothing).
    Headed {
        header: String,
        shown: bool,
    },
    Labelled {
        label: String,
        partial: Vec<u8>,
    },
}

impl Sink {
    fn labelled(name: &str) -> Sink {
        Sink::Labelled {
            label: format!("[{name}] "),
            partial: Vec::new(),
        }
    }

    /// Writes to stdout; a reader gone (`| head`) is [`crate::out::StdoutClosed`], a quiet
    /// end.
    fn write(&mut self, data: &[u8]) -> Result<()> {
        match self {
            Sink::Raw => crate::out::write_all(data)?,
            Sink::Headed { header, shown } => {
                if !*shown {
                    crate::out::write_all(header.as_bytes())?;
                    *shown = true;
                }
                crate::out::write_all(data)?;
            }
            Sink::Labelled { label, partial } => {
                partial.extend_from_slice(data);
                // Whole lines only, each in one write: lines of instances do not mix.
                while let Some(n) = partial.iter().position(|b| *b == b'\n') {
                    let mut line = label.as_bytes().to_vec();
                    line.extend(partial.drain(..=n));
                    crate::out::write_all(&line)?;
                }
            }
        }
        Ok(())
    }

    /// The last line, when it has no newline.
    fn finish(&mut self) -> Result<()> {
        if let Sink::Labelled { label, partial } = self {
            if !partial.is_empty() {
                let mut line = label.as_bytes().to_vec();
                line.append(partial);
                line.push(b'\n');
                crate::out::write_all(&line)?;
            }
        }
        Ok(())
    }
}

/// One instance's output (`flotilla logs`): its latest attempt's, or `--attempt N`'s; with
/// `--follow`, until it ends, through a coordinator's restart when `reconnect` (not a local
/// run's state, whose coordinator is this process's).
/// Whether it printed anything; `quiet`: no note on stderr when it did not.
async fn follow_logs(
    client: &mut Client,
    a: &LogsArgs,
    task: &str,
    reconnect: bool,
    sink: &mut Sink,
    quiet: bool,
) -> Result<bool> {
    let mut resume = LogResume::default();
    let mut outage = flotilla::cluster::Outage::default();
    loop {
        resume.stream_opening();
        let ended = match client
            .logs_of(JobId::new(a.job), task, (a.follow, a.stderr), a.attempt)
            .await
        {
            Ok(mut s) => {
                resume.opened = true;
                outage.answered();
                loop {
                    match s.message().await {
                        Ok(Some(c)) => {
                            // (Coordinators before attempts were named send 0 with the data.)
                            if a.attempt.is_some_and(|n| {
                                c.attempt != n && (c.attempt != 0 || !c.data.is_empty())
                            }) {
                                break Err(flotilla::cluster::ClusterError::Rpc(format!(
                                    "the coordinator runs an older flotilla, which gives \
                                     only the latest attempt's output (it sent attempt \
                                     {}): drop --attempt",
                                    c.attempt
                                )));
                            }
                            let before = resume.printed;
                            let new = resume.unprinted(c.attempt, &c.data);
                            if !new.is_empty() && before.1 > 0 && before.0 != c.attempt {
                                // Followed on to a retry: said between the two (on
                                // stderr: stdout holds the task's own output).
                                eprintln!("[flotilla: {task} attempt {}]", c.attempt);
                            }
                            if !new.is_empty() {
                                sink.write(new)?;
                            }
                        }
                        Ok(None) => break Ok(()),
                        Err(st) => break Err(client.stream_error(st)),
                    }
                }
            }
            // A coordinator that answered before and breaks the connection now (it is
            // being killed, or stopping, right after the reconnection) is lost, not
            // one that wants TLS: it failed CI once, as "the server may speak TLS".
            Err(e) if resume.opened_any() => Err(Client::lost_after_answer(e)),
            Err(e) => Err(e),
        };
        match ended {
            Ok(()) => break,
            Err(e) if a.follow && reconnect && e.is_transient() => {
                tracing::info!("following the logs of {task}: {e}; connecting again");
                *client = client
                    .follow_again(&mut outage, resume.stream_carried(), e)
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let wrote = resume.printed_any();
    // Said on stderr, so that stdout holds the task's own output only; of several
    // instances (`quiet`), counted by the caller instead.
    if quiet {
        return Ok(wrote);
    }
    if !wrote && resume.last_attempt == Some(0) {
        let ended = client
            .job_status_range(JobId::new(a.job), 0, Some(0))
            .await
            .ok()
            .filter(|s| s.state != JobState::Running);
        match ended {
            Some(s) => eprintln!(
                "({task} never ran: job {} ended ({}) before it started)",
                a.job, s.state
            ),
            None => eprintln!("({task} has not started yet; --follow waits for its output)"),
        }
    } else if !wrote && a.stderr {
        eprintln!("({task} wrote nothing to stderr)");
    } else if !wrote {
        eprintln!("({task} wrote nothing to stdout; --stderr shows its stderr)");
    }
    Ok(wrote)
}

/// What `flotilla logs` printed, so that a stream opened again (`--follow` through a
/// coordinator's restart or a leader change), which starts from the beginning of the latest
/// attempt, prints only what is new: what was printed of that attempt, and every chunk of
/// an earlier one, is skipped.
#[derive(Debug, Default)]
struct LogResume {
    /// (attempt, bytes of it) printed.
    printed: (u32, usize),
    /// (attempt, bytes of it) carried by the current stream.
    seen: (u32, usize),
    /// Whether a stream was opened: the coordinator answered.
    opened: bool,
    /// The attempt of the last chunk (0: the task never ran, said by an empty chunk).
    last_attempt: Option<u32>,
}

impl LogResume {
    /// A stream is being opened (again): none of its bytes came yet.
    fn stream_opening(&mut self) {
        self.seen = (0, 0);
    }

    fn opened_any(&self) -> bool {
        self.opened
    }

    /// The part of this chunk not printed yet (counted as printed from here on).
    fn unprinted<'a>(&mut self, attempt: u32, data: &'a [u8]) -> &'a [u8] {
        self.last_attempt = Some(attempt);
        if attempt != self.seen.0 {
            self.seen = (attempt, 0);
        }
        let already = match attempt.cmp(&self.printed.0) {
            std::cmp::Ordering::Less => usize::MAX,
            std::cmp::Ordering::Equal => self.printed.1,
            std::cmp::Ordering::Greater => 0,
        };
        let from = already.saturating_sub(self.seen.1).min(data.len());
        self.seen.1 += data.len();
        if from < data.len() {
            self.printed = self.seen;
        }
        &data[from..]
    }

    /// The current stream carried any bytes (printed or skipped).
    fn stream_carried(&self) -> bool {
        self.seen.1 > 0
    }

    fn printed_any(&self) -> bool {
        self.printed.1 > 0
    }
}

/// `--cpus`: a finite number of CPUs, at least 0 (fractions allowed). NaN and infinity
/// parse as numbers, and a worker offering them never placed anything.
pub(crate) fn cpu_amount(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(_) => Err(format!(
            "{s:?}: a number of CPUs must be finite and not negative (e.g. 4 or 0.5)"
        )),
        Err(e) => Err(format!("{s:?}: {e} (a number of CPUs, e.g. 4 or 0.5)")),
    }
}

/// `--node-id`: a number from 1, or `ordinal` (see [`ordinal_node_id`]) with this machine's
/// host name.
fn node_id_arg(s: &str) -> std::result::Result<u64, String> {
    if s == "ordinal" {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .ok_or("ordinal: this machine's host name cannot be read")?;
        return ordinal_node_id(host.trim());
    }
    match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a node id (a number from 1, or `ordinal`)"
        )),
    }
}

/// The node id of a host named as a StatefulSet names its pods, `NAME-ORDINAL`: the ordinal
/// plus one (node ids start at 1, ordinals at 0).
fn ordinal_node_id(host: &str) -> std::result::Result<u64, String> {
    host.rsplit_once('-')
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| {
            format!(
                "ordinal: the host name {host:?} does not end in -NUMBER (a StatefulSet's pod \
                 name does)"
            )
        })
}

/// A job id as the commands take it: its number (`flotilla submit` prints it) or the
/// number as statuses and messages write it, `job-1`.
pub(crate) fn job_number(s: &str) -> std::result::Result<u64, String> {
    let n = s.strip_prefix("job-").unwrap_or(s);
    n.parse()
        .map_err(|_| format!("{s:?} is not a job id (a number, or job-NUMBER)"))
}

#[cfg(test)]
mod tests {
    /// One stream: its chunks, each printed as far as it is new.
    fn stream(r: &mut super::LogResume, chunks: &[(u32, &str)]) -> String {
        r.stream_opening();
        chunks
            .iter()
            .map(|(a, d)| String::from_utf8_lossy(r.unprinted(*a, d.as_bytes())).into_owned())
            .collect()
    }

    #[test]
    fn logs_opened_again_print_only_what_is_new_across_attempts() {
        let mut r = super::LogResume::default();
        assert_eq!(stream(&mut r, &[(1, "ab"), (1, "c"), (2, "de")]), "abcde");
        // Opened again: the coordinator sends the latest attempt from its start.
        assert_eq!(stream(&mut r, &[(2, "d"), (2, "efg")]), "fg");
        assert!(r.printed_any());
        // An earlier attempt's chunks (as an old stream might still send) print nothing.
        assert_eq!(stream(&mut r, &[(1, "abc"), (2, "defgh"), (3, "x")]), "hx");
        // A stream opened again on an attempt already printed, carrying nothing new.
        assert_eq!(stream(&mut r, &[(3, "x")]), "");
        assert!(r.stream_carried());
    }

    #[test]
    fn logs_from_a_coordinator_that_numbers_no_attempt_resume_by_bytes() {
        let mut r = super::LogResume::default();
        assert!(!r.printed_any());
        assert_eq!(stream(&mut r, &[(0, "abc")]), "abc");
        assert_eq!(stream(&mut r, &[(0, "ab"), (0, "cd")]), "d");
        r.stream_opening();
        assert!(!r.stream_carried());
    }

    #[test]
    fn cpus_are_a_finite_amount_not_negative() {
        assert_eq!(super::cpu_amount("4"), Ok(4.0));
        assert_eq!(super::cpu_amount("0.5"), Ok(0.5));
        assert_eq!(super::cpu_amount("0"), Ok(0.0));
        for bad in ["nan", "inf", "-1", "-inf", "four", ""] {
            let e = super::cpu_amount(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_job_id_is_its_number_or_job_number() {
        assert_eq!(super::job_number("7"), Ok(7));
        assert_eq!(super::job_number("job-7"), Ok(7));
        let e = super::job_number("job-x").expect_err("refused");
        assert!(e.contains("\"job-x\" is not a job id"), "{e}");
        assert!(super::job_number("task-7").is_err());
    }

    #[test]
    fn a_node_id_is_a_number_or_the_ordinal_of_a_statefulset_pod() {
        assert_eq!(super::ordinal_node_id("flotilla-coordinator-0"), Ok(1));
        assert_eq!(super::ordinal_node_id("flotilla-coordinator-2"), Ok(3));
        let e = super::ordinal_node_id("coordinator").expect_err("refused");
        assert!(e.contains("does not end in -NUMBER"), "{e}");
        assert!(super::ordinal_node_id("node-x").is_err());
        assert_eq!(super::node_id_arg("2"), Ok(2));
        assert!(super::node_id_arg("0").is_err());
        assert!(super::node_id_arg("two").is_err());
    }
}
