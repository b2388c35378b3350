//! The `flotilla` command line: a thin layer over the library.

mod admin_cmd;
mod alloc_cmd;
mod cli_doc;
mod cluster_cmd;
mod out;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use flotilla::bench::{linalg, overhead};
use flotilla::sched::PolicyKind;
use out::{out, outln};

/// `0.1.0 (commit 0123456789ab)`: the version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FLOTILLA_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "flotilla",
    version = VERSION,
    about = "Turn a machine, a rack or a pool into one parallel, heterogeneous computer"
)]
struct Cli {
    /// How log lines on stderr are written: text, or json (one object per line, for a log
    /// collector). Which lines: FLOTILLA_LOG (e.g. info, flotilla_cluster=debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job file on this machine: an in-process coordinator and a local worker.
    Run(cluster_cmd::RunArgs),
    /// Start a coordinator.
    Server(cluster_cmd::ServerArgs),
    /// Start a worker that takes tasks from a coordinator.
    Worker(Box<cluster_cmd::WorkerArgs>),
    /// The guard a worker starts on itself: kills the worker's tasks when it dies (reads
    /// `+PGID`/`-PGID` lines on stdin until end-of-file).
    #[command(hide = true)]
    WorkerGuard,
    /// Submit a job file to a coordinator; prints the job id on the last line.
    Submit(cluster_cmd::SubmitArgs),
    /// Show a job's status, or every job and worker.
    Status(cluster_cmd::StatusArgs),
    /// Follow a job to its end; exit code 0 only if every task succeeded.
    Wait(cluster_cmd::WaitArgs),
    /// Cancel a job.
    Cancel(cluster_cmd::JobArgs),
    /// Run again a job's tasks that failed or were cancelled, its done tasks kept (a job that
    /// ended runs again, under its id); with --wait, follow it to its end.
    Retry(cluster_cmd::RetryArgs),
    /// Forget a finished job on the coordinator: its tasks, logs and uploads list (cancel a
    /// running one first).
    Rm(cluster_cmd::JobArgs),
    /// Print a task's captured output.
    Logs(cluster_cmd::LogsArgs),
    /// A job's attempts in time as a Chrome/Perfetto trace (JSON; open it in
    /// ui.perfetto.dev): one process per worker, a track per slot and per GPU.
    Trace(cluster_cmd::TraceArgs),
    /// Tenants, tokens and revocation, providers, live workers, the group of coordinators
    /// (takes the admin token).
    #[command(subcommand)]
    Admin(admin_cmd::AdminCmd),
    /// Worker allocations from a batch system (Slurm), asked for as the work needs them
    /// (takes the admin token).
    #[command(subcommand)]
    Alloc(alloc_cmd::AllocCmd),
    /// The pool's providers: `flotilla provider list [--json]`.
    #[command(subcommand)]
    Provider(admin_cmd::ProviderTopCmd),
    /// The ledger of credits: balances (a tenant sees its own).
    Ledger(admin_cmd::LedgerArgs),
    /// Let a job of a pool spend more credits: `flotilla budget JOB +50` (a job paused for
    /// want of budget resumes).
    Budget(admin_cmd::BudgetArgs),
    /// Run a benchmark (one line per result; --json for one JSON object per line).
    #[command(subcommand)]
    Bench(Bench),
    /// Run a placement policy on a DAG in virtual time and print the schedule.
    Simulate(SimulateArgs),
    /// List the devices found (OpenCL, CUDA): memory, PCI address, NUMA node, host link,
    /// peer-to-peer paths, and why others were skipped.
    Devices(DevicesArgs),
    /// Print a shell completion script: `flotilla completions bash >
    /// /etc/bash_completion.d/flotilla` (zsh: into a folder of $fpath as `_flotilla`; fish:
    /// ~/.config/fish/completions/flotilla.fish).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the command-line reference as Markdown (docs/cli.md is this output).
    #[command(hide = true)]
    CliReference,
    /// Write the man pages (one per command) into a folder: the packages ship them.
    #[command(hide = true)]
    Man {
        /// The folder (made when missing).
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Nanoseconds per empty task, next to rayon's scope.spawn in the same run.
    Overhead(OverheadArgs),
    /// Tiled Cholesky factorization through the runtime.
    Cholesky(LinalgArgs),
    /// Tiled matrix multiplication through the runtime.
    Gemm(LinalgArgs),
    /// Trivial tasks through a coordinator and workers (gRPC over loopback).
    Cluster(ClusterArgs),
    /// Coordinator restart time against journal size (a finished job of N tasks).
    Restart(RestartArgs),
    /// Many clients at once against one coordinator: one-task submissions from many
    /// clients, watchers that never read, connections that never speak; the latency of
    /// `status` before and during, and the coordinator's memory.
    Flood(FloodArgs),
    /// What a task sandbox costs: /bin/true without and with bubblewrap (shared or fresh
    /// network namespace, with a cgroup), side by side.
    Isolation(IsolationArgs),
    /// Allreduce (f32 sum) bandwidth, ranks as separate processes (nccl-tests figures).
    Allreduce(AllreduceArgs),
    /// One object over loopback through gRPC (Objects.Fetch) and through framed TCP.
    Transfer(TransferArgs),
    /// The pool's verification of untrusted results in a simulated pool: the compute each
    /// mode costs with cheating providers, and how soon a provider turning to cheating is
    /// caught.
    Verify(VerifyArgs),
    /// The pool's market in virtual time: the coordinator's placement, ledger and
    /// preemption with many providers that come and go, on the workflow traces; credits,
    /// deadlines met, wasted work and energy per objective, with and without checkpoints.
    Market(MarketArgs),
    /// The coordinator at scale in virtual time: 10,000 to 100,000 workers coming and going
    /// as volunteer hosts do, the workflow traces as a stream of jobs up to a million tasks;
    /// the coordinator's time per event and per placement, makespan against the lower
    /// bound, work lost with lost workers.
    Churn(ChurnArgs),
    /// Workers only through batch allocations (Slurm), asked for by the reactive and the
    /// predictive rule, in virtual time: makespan, time to the first task, idle allocation
    /// CPU-hours.
    Alloc(AllocBenchArgs),
    /// Host <-> device copies from pageable and pinned memory, and device -> device.
    Copy(CopyArgs),
    /// One rank of `bench allreduce` (FLOTILLA_RANK, FLOTILLA_WORLD_SIZE, FLOTILLA_RENDEZVOUS
    /// from the environment, as a gang member gets them); rank 0 prints JSON lines.
    #[command(hide = true)]
    AllreduceRank(AllreduceRankArgs),
}

#[derive(Args)]
struct MarketArgs {
    /// Providers (one two-CPU machine each).
    #[arg(long, default_value_t = 1000)]
    providers: usize,
    /// Jobs (the workflow traces in turn).
    #[arg(long, default_value_t = 40)]
    jobs: usize,
    /// Mean seconds between submissions.
    #[arg(long, default_value_t = 120.0)]
    arrival: f64,
    /// Each job's deadline, times its critical path.
    #[arg(long, default_value_t = 3.0)]
    deadline_factor: f64,
    /// Runs: OBJECTIVE[+nockpt] (cost, time, energy; +nockpt: tasks declare no checkpoint).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cost,time,energy,cost+nockpt"
    )]
    runs: Vec<String>,
    /// Seeds, one market each (the figures are summed over them).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ChurnArgs {
    /// Hosts, one worker each while on (a list runs each in turn).
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    workers: Vec<usize>,
    /// CPUs per worker.
    #[arg(long, default_value_t = 2.0)]
    cpus: f64,
    /// Tasks submitted in all (copies of the workflow traces, a job each).
    #[arg(long, default_value_t = 1_000_000)]
    tasks: usize,
    /// Mean seconds a host stays on (exponential).
    #[arg(long, default_value_t = 7200.0)]
    on_mean: f64,
    /// Mean seconds a host stays off (exponential).
    #[arg(long, default_value_t = 3600.0)]
    off_mean: f64,
    /// Hosts never go off.
    #[arg(long)]
    no_churn: bool,
    /// Tasks submitted and not yet done kept at this times the cores online.
    #[arg(long, default_value_t = 2.0)]
    backlog: f64,
    /// Seeds the on/off draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AllocBenchArgs {
    /// Rules to compare: reactive, predictive.
    #[arg(long, value_delimiter = ',', default_value = "reactive,predictive")]
    rules: Vec<String>,
    /// Workers per allocation.
    #[arg(long, default_value_t = 4)]
    workers_per_alloc: u32,
    /// CPUs per worker.
    #[arg(long, default_value_t = 8.0)]
    cpus: f64,
    /// The most allocations queued and running at once.
    #[arg(long, default_value_t = 16)]
    max_allocs: u32,
    /// The most allocations waiting in the batch queue at once.
    #[arg(long, default_value_t = 4)]
    backlog: u32,
    /// An allocation's time limit, seconds.
    #[arg(long, default_value_t = 3600.0)]
    time_limit: f64,
    /// Seconds a worker waits with nothing to run before it leaves.
    #[arg(long, default_value_t = 300.0)]
    idle_timeout: f64,
    /// Mean seconds an allocation waits in the batch queue (exponential; a list runs each).
    #[arg(long, value_delimiter = ',', default_value = "60,600")]
    queue_wait: Vec<f64>,
    /// Times the workflow traces are submitted.
    #[arg(long, default_value_t = 3)]
    waves: usize,
    /// Seconds between waves.
    #[arg(long, default_value_t = 10_800.0)]
    gap: f64,
    /// Seeds the queue waits (a list runs each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct VerifyArgs {
    /// Modes: 1, 2, 3 (replicas that must agree) or adaptive.
    #[arg(long, value_delimiter = ',', default_value = "1,2,adaptive")]
    modes: Vec<String>,
    /// Providers in the pool.
    #[arg(long, default_value_t = 100)]
    providers: usize,
    /// The share of providers that always cheat.
    #[arg(long, default_value_t = 0.1)]
    cheaters: f64,
    /// Tasks per run.
    #[arg(long, default_value_t = 10_000)]
    tasks: u64,
    /// Seeds, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Trials of the turncoat scenario (a provider honest for 500 results, then cheating,
    /// among 4 honest ones); 0 skips it.
    #[arg(long, default_value_t = 1000)]
    turncoat_trials: u64,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RestartArgs {
    /// Tasks of the journaled job, one size per restart series.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    tasks: Vec<u64>,
    /// Starts per size; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Remove the job and leave a small one live; time restarts before and after the
    /// journal's compaction, and the compaction.
    #[arg(long)]
    compaction: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct FloodArgs {
    /// Clients submitting at once.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Jobs submitted in all (one WASM no-op task each).
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Clients that follow a job's events and never read them.
    #[arg(long, default_value_t = 20)]
    stuck_watchers: usize,
    /// TCP connections opened and never spoken on.
    #[arg(long, default_value_t = 20)]
    silent: usize,
    /// The probe's pause between status requests.
    #[arg(long, default_value = "20ms")]
    probe_every: String,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct IsolationArgs {
    /// Tasks per round and setting.
    #[arg(long, default_value_t = 300)]
    tasks: usize,
    /// Rounds (interleaved); the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AllreduceArgs {
    /// Ranks (processes on this machine).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Message sizes, as the job file writes sizes (KiB, MiB, GiB are powers of 1024; K, M, G
    /// of 1000).
    #[arg(long, default_value = "4KiB,1MiB,64MiB,256MiB")]
    bytes: String,
    /// tcp (loopback), shm (shared memory) or auto.
    #[arg(long, value_enum, default_value_t = TransportArg::Auto)]
    transport: TransportArg,
    /// Timed rounds per size; the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Where each rank's data lives: host, or device memory staged through the host:
    /// cpu-device (a host memory node of its own), opencl, cuda.
    #[arg(long, value_enum, default_value_t = MemoryArg::Host)]
    memory: MemoryArg,
    /// Bytes per allreduce call when staging device memory (0: one piece; default 4 MiB).
    #[arg(long)]
    chunk_bytes: Option<usize>,
    /// Device copies on their own threads, overlapping the allreduce (true/false; default:
    /// on CUDA only).
    #[arg(long)]
    overlap: Option<bool>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CopyArgs {
    /// cpu-device, opencl or cuda.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cuda)]
    device: DeviceArg,
    /// MiB per copy.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Timed copies per path; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DevicesArgs {
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TransferArgs {
    /// Object size in MiB.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Fetches per path; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AllreduceRankArgs {
    /// Message sizes, as the job file writes sizes (KiB, MiB, GiB are powers of 1024; K, M, G
    /// of 1000).
    #[arg(long, default_value = "4KiB,1MiB,64MiB,256MiB")]
    bytes: String,
    /// tcp, shm or auto.
    #[arg(long, value_enum, default_value_t = TransportArg::Auto)]
    transport: TransportArg,
    /// Timed rounds per size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// host, cpu-device, opencl or cuda.
    #[arg(long, value_enum, default_value_t = MemoryArg::Host)]
    memory: MemoryArg,
    /// Bytes per allreduce call when staging (0: one piece; default 4 MiB).
    #[arg(long)]
    chunk_bytes: Option<usize>,
    /// Device copies on their own threads (default: on CUDA only).
    #[arg(long)]
    overlap: Option<bool>,
}

#[derive(Args)]
struct ClusterArgs {
    /// true (N × /bin/true), wasm (N × a WASM no-op), chain (N tasks in a row), fanout (N + 1 reduce).
    #[arg(long, value_enum, default_value_t = WorkloadArg::True)]
    workload: WorkloadArg,
    /// For chain and fanout: true or wasm.
    #[arg(long, value_enum, default_value_t = KindArg::True)]
    kind: KindArg,
    /// Tasks.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// CPUs per worker.
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Timed jobs; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Skip timing xargs -P on the same processes.
    #[arg(long)]
    no_xargs: bool,
    /// Chained dispatch depth (0: every hop of a chain goes through the coordinator).
    #[arg(long, default_value_t = 8)]
    chain_depth: usize,
    /// Then restart the coordinator this many times on the same state (journal replay).
    #[arg(long, default_value_t = 0)]
    restarts: usize,
    /// Sandbox the workers' tasks: none (the default here: the figures compare scheduling
    /// with xargs's plain spawns), auto, bwrap, required; `bench isolation` measures what a
    /// sandbox adds.
    #[arg(long, default_value = "none")]
    isolation: flotilla::cluster::worker::Isolation,
    /// Also time each repetition with this many clients scraping the coordinator's
    /// `/metrics` without pause, and report both rates (the dashboard's cost to scheduling).
    #[arg(long, default_value_t = 0)]
    scrapers: usize,
    /// Each scraper's pause between scrapes: 1s is a dashboard refreshing every second,
    /// 0s scrapes without pause.
    #[arg(long, default_value = "1s")]
    scrape_every: String,
    /// The --scrapers are dashboards: each follows the live event stream and fetches the
    /// newest job's status and timeline on every event, as its page in a browser does.
    #[arg(long)]
    dashboards: bool,
    /// Run the jobs through a group of this many coordinators (in this process, the journal
    /// replicated with Raft) instead of one; 0: one alone.
    #[arg(long, default_value_t = 0)]
    group: usize,
    /// Then stop the group's leader this many times, timing each failover until a new
    /// leader answers (the stopped node is started again and catches up in between).
    #[arg(long, default_value_t = 0)]
    failovers: usize,
    /// Before any job, keep the workers connected and idle this long while the coordinator's
    /// CPU time is measured: what heartbeats alone cost (e.g. 20s; 0: not measured).
    #[arg(long, default_value = "0s")]
    idle: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct OverheadArgs {
    /// Tasks per run.
    #[arg(long, default_value_t = 100_000)]
    tasks: usize,
    /// none (independent) or chain (each after the previous).
    #[arg(long, default_value = "none")]
    deps: overhead::Deps,
    /// Workers (default: one per core).
    #[arg(long)]
    cpus: Option<usize>,
    /// Timed runs; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LinalgArgs {
    /// Matrix size.
    #[arg(long, default_value_t = 2048)]
    n: usize,
    /// Tile size (must divide n). Default: chosen for this machine: each candidate tile
    /// (128 to 1024, 8 to 48 tiles per side; with cuda among the devices 1024 to 8192, 4 to
    /// 16 per side) is timed once on this n, and the fastest is remembered in
    /// FLOTILLA_HOME/tiles.json for this CPU, its workers, the devices, n and precision.
    #[arg(long)]
    tile: Option<usize>,
    /// The units that run tasks: cpu, opencl, cuda, or a comma list (cpu,cuda). Without
    /// cpu in the list no CPU worker runs tasks (`--devices cuda` is the GPU alone).
    #[arg(long, default_value = "cpu")]
    devices: String,
    /// CPU workers (default: one per core, less one per device, when --devices lists
    /// cpu; else none).
    #[arg(long)]
    cpus: Option<usize>,
    /// Placement policy: eager, ws, random, dmda, heft (default: FLOTILLA_SCHED, else
    /// dmda with devices, ws without).
    #[arg(long)]
    policy: Option<PolicyKind>,
    /// f64, f32, or f32 storage with the matrix products in tf32 or bf16 (inputs rounded,
    /// f32 accumulation; Cholesky keeps potrf and trsm in f32). The residual is always
    /// reported unless --no-check.
    #[arg(long, default_value = "f64")]
    precision: linalg::Precision,
    /// Timed runs after one calibration run; the best is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Skip the accuracy check.
    #[arg(long)]
    no_check: bool,
    /// Write a Chrome/Perfetto trace here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SimulateArgs {
    /// The DAG: {"processors": [...], "bandwidth": B, "tasks": [{"id", "cost": [...]}], "edges": [{"from", "to", "data"}]}.
    #[arg(long, required_unless_present = "cholesky")]
    dag: Option<PathBuf>,
    /// Instead of a file: the tiled Cholesky DAG with this many tiles per side, on
    /// `--sim-cpus` CPU cores and `--sim-gpus` GPUs (kernel costs from flotilla-sched).
    #[arg(long, conflicts_with = "dag")]
    cholesky: Option<usize>,
    /// CPU cores of the simulated platform (with --cholesky).
    #[arg(long, default_value_t = 2)]
    sim_cpus: usize,
    /// GPUs of the simulated platform (with --cholesky).
    #[arg(long, default_value_t = 0)]
    sim_gpus: usize,
    /// heft, dmda, eager, ws or random.
    #[arg(long, default_value = "heft")]
    policy: PolicyKind,
    /// Instead of --policy: the cluster's own placement (the coordinator's state machine and
    /// one worker agent per processor, each worker one CPU, in virtual time).
    #[arg(long)]
    cluster: bool,
    /// Seed for the random policy.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the schedule as JSON.
    #[arg(long)]
    json: bool,
}

/// Allreduce transports.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportArg {
    Tcp,
    Shm,
    Auto,
}

/// Where allreduce data lives.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum MemoryArg {
    Host,
    CpuDevice,
    Opencl,
    Cuda,
}

/// Devices `bench copy` measures.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum DeviceArg {
    CpuDevice,
    Opencl,
    Cuda,
}

/// `bench cluster` workloads.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum WorkloadArg {
    True,
    Wasm,
    Chain,
    Fanout,
}

/// Task kinds of `bench cluster` chains and fan-outs.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum KindArg {
    True,
    Wasm,
}

/// A flag value's name as written on the command line (`cpu-device`).
fn name<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

fn print<T: serde::Serialize>(json: bool, v: &T, human: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(v)?);
    } else {
        outln!("{}", human(v));
    }
    Ok(())
}

fn linalg_config(a: &LinalgArgs) -> linalg::LinalgConfig {
    linalg::LinalgConfig {
        n: a.n,
        tile: a.tile.unwrap_or(linalg::AUTO_TILE),
        devices: a.devices.clone(),
        cpus: a.cpus,
        policy: a.policy,
        precision: a.precision,
        reps: a.reps,
        no_check: a.no_check,
        trace: a.trace.clone(),
    }
}

fn human_linalg(r: &linalg::LinalgResult) -> String {
    format!(
        "{} n={} tile={} ({}) {:?} devices={} policy={} cpus={}: {:.2} GFLOP/s (best {:.3} s, median {:.3} s), residual {}, tasks {:?}",
        r.bench,
        r.n,
        r.tile,
        r.tile_choice,
        r.precision,
        r.devices,
        r.policy,
        r.cpus,
        r.gflops,
        r.seconds,
        r.median_seconds,
        r.residual.map(|x| format!("{x:.3e}")).unwrap_or_else(|| "not checked".into()),
        r.tasks_per_kind
    )
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Runs a command; `Ok(false)` means it ran but the job did not succeed.
fn run(cli: Cli) -> Result<bool> {
    let ok = |r: Result<()>| r.map(|()| true);
    match cli.command {
        Command::Run(a) => {
            flotilla_exec::note_inherited_ignores();
            tokio_runtime()?.block_on(cluster_cmd::run(a))
        }
        Command::Server(a) => ok(tokio_runtime()?.block_on(cluster_cmd::server(a))),
        Command::Worker(a) => {
            // A shell's background job (`flotilla worker &`) ignores SIGINT and SIGQUIT: its
            // tasks inherited that (a task's `kill -QUIT` did nothing).
            flotilla_exec::note_inherited_ignores();
            ok(tokio_runtime()?.block_on(cluster_cmd::worker(*a)))
        }
        Command::WorkerGuard => {
            flotilla_exec::guard_main(std::io::stdin().lock());
            Ok(true)
        }
        Command::Submit(a) => tokio_runtime()?.block_on(cluster_cmd::submit(a)),
        Command::Status(a) => ok(tokio_runtime()?.block_on(cluster_cmd::status(a))),
        Command::Wait(a) => tokio_runtime()?.block_on(cluster_cmd::wait(a)),
        Command::Cancel(a) => ok(tokio_runtime()?.block_on(cluster_cmd::cancel(a))),
        Command::Retry(a) => tokio_runtime()?.block_on(cluster_cmd::retry(a)),
        Command::Rm(a) => ok(tokio_runtime()?.block_on(cluster_cmd::remove(a))),
        Command::Logs(a) => ok(tokio_runtime()?.block_on(cluster_cmd::logs(a))),
        Command::Trace(a) => ok(tokio_runtime()?.block_on(cluster_cmd::trace(a))),
        Command::Admin(a) => ok(tokio_runtime()?.block_on(admin_cmd::admin(a))),
        Command::Alloc(a) => ok(tokio_runtime()?.block_on(alloc_cmd::alloc(a))),
        Command::Provider(a) => ok(tokio_runtime()?.block_on(admin_cmd::provider(a))),
        Command::Ledger(a) => ok(tokio_runtime()?.block_on(admin_cmd::ledger(a))),
        Command::Budget(a) => ok(tokio_runtime()?.block_on(admin_cmd::budget(a))),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "flotilla", &mut script);
            out::write_all(&script)?;
            Ok(true)
        }
        Command::CliReference => {
            let text = cli_doc::markdown(&<Cli as clap::CommandFactory>::command());
            out::write_all(text.as_bytes())?;
            Ok(true)
        }
        Command::Man { out } => {
            let pages = cli_doc::man_pages(&<Cli as clap::CommandFactory>::command(), &out)
                .with_context(|| format!("cannot write the man pages into {}", out.display()))?;
            eprintln!("{} man pages written into {}", pages.len(), out.display());
            Ok(true)
        }
        Command::Bench(Bench::Cluster(a)) => {
            let cfg = flotilla::bench::cluster::ClusterBenchConfig {
                workload: name(&a.workload),
                kind: name(&a.kind),
                tasks: a.tasks,
                workers: a.workers,
                cpus_per_worker: a.cpus,
                reps: a.reps,
                xargs: !a.no_xargs,
                chain_depth: a.chain_depth,
                restarts: a.restarts,
                isolation: a.isolation,
                scrapers: a.scrapers,
                scrape_every: flotilla::core::duration::parse_duration(&a.scrape_every)
                    .map_err(|e| anyhow::anyhow!("--scrape-every: {e}"))?,
                dashboards: a.dashboards,
                group: a.group,
                failovers: a.failovers,
                idle: flotilla::core::duration::parse_duration(&a.idle)
                    .map_err(|e| anyhow::anyhow!("--idle: {e}"))?,
            };
            let r = tokio_runtime()?
                .block_on(flotilla::bench::cluster::run(&cfg))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            print(a.json, &r, |r| {
                format!(
                    "cluster {} ({}) tasks={} workers={}x{}{}: {:.0} tasks/s, {:.3} ms/task, median {:.3} s{}{}{}{}{}",
                    r.workload,
                    r.kind,
                    r.tasks,
                    r.workers,
                    r.cpus_per_worker,
                    if r.group > 0 { format!(" group={}", r.group) } else { String::new() },
                    r.tasks_per_s,
                    r.ms_per_task,
                    r.seconds,
                    match (r.xargs_tasks_per_s, r.ratio_to_xargs) {
                        (Some(x), Some(q)) => format!("; xargs -P {:.0} tasks/s, ratio {q:.2}", x),
                        _ => String::new(),
                    },
                    match (r.restart_s, r.journal_bytes) {
                        (Some(s), Some(b)) => format!("; restart {:.1} ms on a {b}-byte journal", s * 1e3),
                        (Some(s), None) => format!("; restart {:.1} ms", s * 1e3),
                        _ => String::new(),
                    },
                    match (r.scraped_tasks_per_s, r.ratio_scraped, r.scrapes_per_s) {
                        (Some(s), Some(q), Some(n)) => format!(
                            "; with {} {} ({n:.0} {}/s): {s:.0} tasks/s, ratio {q:.3}",
                            r.scrapers,
                            if r.dashboards { "dashboards" } else { "/metrics scrapers" },
                            if r.dashboards { "events" } else { "scrapes" }
                        ),
                        _ => String::new(),
                    },
                    match r.failover_s {
                        Some(f) => format!(
                            "; failover median {:.0} ms of {:?}",
                            f * 1e3,
                            r.failovers.iter().map(|s| (s * 1e3).round() as u64).collect::<Vec<_>>()
                        ),
                        None => String::new(),
                    },
                    match (r.heartbeat_core_us, r.heartbeat_process_us, r.idle_core_share) {
                        (Some(c), Some(p), Some(s)) => format!(
                            "; idle: {c:.1} us of the core thread and {p:.1} us of the process per heartbeat, the core thread at {:.2} % of a core",
                            s * 100.0
                        ),
                        _ => String::new(),
                    }
                )
            })
            .map(|()| true)
        }
        Command::Bench(Bench::Transfer(a)) => {
            let (grpc, framed, framed_tls) = tokio_runtime()?
                .block_on(flotilla::cluster::framed::compare(a.mib << 20, a.reps))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let r = serde_json::json!({
                "bench": "transfer",
                "bytes": a.mib << 20,
                "grpc_gbs": grpc,
                "framed_gbs": framed,
                "framed_over_grpc": framed / grpc,
                "framed_tls_gbs": framed_tls,
                "tls_over_plain": framed_tls / framed,
            });
            if a.json {
                outln!("{r}");
            } else {
                outln!(
                    "transfer {} MiB over loopback: gRPC {grpc:.2} GB/s, framed TCP {framed:.2} GB/s (framed/gRPC {:.2}), framed over TLS {framed_tls:.2} GB/s (TLS/plain {:.2})",
                    a.mib,
                    framed / grpc,
                    framed_tls / framed
                );
            }
            Ok(true)
        }
        other => ok(run_local(other)),
    }
}

fn run_local(command: Command) -> Result<()> {
    match command {
        Command::Bench(Bench::Allreduce(a)) => {
            use flotilla::bench::allreduce;
            allreduce::parse_sizes(&a.bytes)?;
            allreduce::parse_transport(&name(&a.transport))?;
            allreduce::parse_memory(&name(&a.memory))?;
            let exe = std::env::current_exe()?;
            let memory_name = name(&a.memory);
            let staging = (memory_name.as_str(), a.chunk_bytes, a.overlap);
            allreduce::launch(
                &exe,
                a.ranks,
                &a.bytes,
                &name(&a.transport),
                a.rounds,
                staging,
                |p| {
                    // A closed stdout shows nothing more; the ranks finish their rounds.
                    let _ = if a.json {
                        out::write(
                            format_args!("{}", serde_json::to_string(&p).unwrap_or_default()),
                            true,
                        )
                    } else {
                        out::write(format_args!(
                        "allreduce f32 sum ranks={} transport={} memory={} bytes={:>10}: {:>10.1} us  algbw {:.3} GB/s  busbw {:.3} GB/s",
                        p.ranks,
                        p.transport,
                        p.memory,
                        p.bytes,
                        p.seconds * 1e6,
                        p.algbw_gbs,
                        p.busbw_gbs
                    ), true)
                    };
                },
            )?;
            Ok(())
        }
        Command::Bench(Bench::AllreduceRank(a)) => {
            use flotilla::bench::allreduce;
            let sizes = allreduce::parse_sizes(&a.bytes)?;
            let transport = allreduce::parse_transport(&name(&a.transport))?;
            let memory = allreduce::parse_memory(&name(&a.memory))?;
            let (rank, points) = allreduce::run_rank(
                &sizes,
                transport,
                a.rounds,
                memory,
                a.chunk_bytes,
                a.overlap,
            )?;
            if rank == 0 {
                for p in points {
                    outln!("{}", serde_json::to_string(&p)?);
                }
            }
            Ok(())
        }
        Command::Bench(Bench::Market(a)) => {
            let traces = flotilla::bench::market::traces()?;
            for run in &a.runs {
                let (objective, checkpoints) = match run.strip_suffix("+nockpt") {
                    Some(o) => (o.to_string(), false),
                    None => (run.clone(), true),
                };
                anyhow::ensure!(
                    ["cost", "time", "energy"].contains(&objective.as_str()),
                    "--runs: {run:?}: the objective is cost, time or energy"
                );
                let mut reports = Vec::new();
                for &seed in &a.seeds {
                    let cfg = flotilla::bench::market::MarketConfig {
                        providers: a.providers,
                        jobs: a.jobs,
                        arrival_s: a.arrival,
                        deadline_factor: a.deadline_factor,
                        objective: objective.clone(),
                        checkpoints,
                        seed,
                    };
                    reports.push(flotilla::bench::market::run(&cfg, &traces)?);
                }
                let sum = |f: &dyn Fn(&flotilla::bench::market::MarketReport) -> f64| -> f64 {
                    reports.iter().map(f).sum()
                };
                if a.json {
                    for r in &reports {
                        outln!("{}", serde_json::to_string(r)?);
                    }
                } else {
                    outln!(
                        "market {run:<12} {} providers, {} jobs x {} seeds: {:.2} credits, deadlines met {}/{}, \
                         {} preemptions, wasted {:.0} of {:.0} CPU-s, {:.0} kJ, mean makespan {:.0} s",
                        a.providers,
                        a.jobs,
                        reports.len(),
                        sum(&|r| r.credits),
                        sum(&|r| r.deadlines_met as f64),
                        sum(&|r| r.jobs as f64),
                        sum(&|r| r.preemptions as f64),
                        sum(&|r| r.wasted_cpu_s),
                        sum(&|r| r.useful_cpu_s + r.wasted_cpu_s),
                        sum(&|r| r.energy_kj),
                        sum(&|r| r.mean_makespan_s) / reports.len().max(1) as f64,
                    );
                }
            }
            Ok(())
        }
        Command::Bench(Bench::Churn(a)) => {
            let traces = flotilla::bench::market::traces()?;
            for &workers in &a.workers {
                let cfg = flotilla::bench::churn::ChurnConfig {
                    workers,
                    cpus: a.cpus,
                    tasks: a.tasks,
                    churn: (!a.no_churn).then_some((a.on_mean, a.off_mean)),
                    backlog: a.backlog,
                    seed: a.seed,
                };
                let r = flotilla::bench::churn::run(&cfg, &traces)?;
                print(a.json, &r, |r| {
                    format!(
                        "churn {} workers x {} CPUs{}: {} tasks in {} jobs ({} succeeded), makespan {:.0} s = {:.3}x the bound {:.0} s ({:.0} cores on average); {} workers lost, {} attempts, wasted {:.0} CPU-s of {:.0}; coordinator {:.1} us/event, {:.1} us/placement over {} events; {:.1} s wall, {:.0} MB peak",
                        r.workers,
                        r.cpus,
                        r.on_off_s.map_or(" (no churn)".to_string(), |(on, off)| format!(" (on {on:.0} s / off {off:.0} s)")),
                        r.tasks,
                        r.jobs,
                        r.succeeded,
                        r.makespan_s,
                        r.ratio_to_bound,
                        r.lower_bound_s,
                        r.mean_cores,
                        r.lost_workers,
                        r.attempts,
                        r.wasted_cpu_s,
                        r.useful_cpu_s + r.wasted_cpu_s,
                        r.us_per_event,
                        r.us_per_placement,
                        r.events,
                        r.wall_s,
                        r.peak_mb,
                    )
                })?;
            }
            Ok(())
        }
        Command::Bench(Bench::Alloc(a)) => {
            use flotilla::sched::alloc::{AllocParams, Rule};
            let traces = flotilla::bench::market::traces()?;
            for &wait in &a.queue_wait {
                for &seed in &a.seeds {
                    for rule in &a.rules {
                        let rule = match rule.as_str() {
                            "reactive" => Rule::Reactive,
                            "predictive" => Rule::Predictive,
                            other => {
                                anyhow::bail!("--rules {other}: expected reactive or predictive")
                            }
                        };
                        let cfg = flotilla::bench::alloc::AllocConfig {
                            rule,
                            params: AllocParams {
                                workers_per_alloc: a.workers_per_alloc,
                                cpus_per_worker: a.cpus,
                                max_allocs: a.max_allocs,
                                backlog: a.backlog,
                                time_limit_s: a.time_limit,
                            },
                            idle_timeout_s: a.idle_timeout,
                            queue_wait_s: wait,
                            waves: a.waves,
                            gap_s: a.gap,
                            seed,
                        };
                        let r = flotilla::bench::alloc::run(&cfg, &traces)?;
                        print(a.json, &r, |r| {
                            format!(
                                "alloc {} (queue wait {wait:.0} s, seed {seed}): {} jobs ({} succeeded), {} tasks; makespan {:.0} s, first task at {:.0} s; {} allocations ({} cancelled queued), {:.1} CPU-h held, {:.1} idle, {:.1} cut at limits, {:.1} useful; {:.1} idle worker-hours",
                                r.rule,
                                r.jobs,
                                r.succeeded,
                                r.tasks,
                                r.makespan_s,
                                r.first_task_s,
                                r.allocations,
                                r.cancelled,
                                r.cpu_hours,
                                r.idle_cpu_hours,
                                r.cut_cpu_hours,
                                r.useful_cpu_hours,
                                r.idle_worker_hours,
                            )
                        })?;
                    }
                }
            }
            Ok(())
        }
        Command::Bench(Bench::Verify(a)) => {
            for p in flotilla::bench::verify::modes(
                &a.modes,
                a.providers,
                a.cheaters,
                a.tasks,
                &a.seeds,
            )? {
                print(a.json, &p, |p| {
                    format!(
                        "verify {:<8} {} providers, {:.0}% cheating, {} tasks: {:.3} runs/task, {} wrong accepted, {} failed (over {} seeds)",
                        p.mode,
                        p.providers,
                        p.cheaters * 100.0,
                        p.tasks,
                        p.cost,
                        p.wrong_accepted,
                        p.failed,
                        p.runs.len()
                    )
                })?;
            }
            if a.turncoat_trials > 0 {
                let t = flotilla::bench::verify::turncoat(4, 500, a.turncoat_trials);
                print(a.json, &t, |t| {
                    format!(
                        "verify turncoat after {} honest results: caught within 20 cheats in {:.3} of {} trials (mean {:.1}, worst {}), {} wrong results left",
                        t.after, t.caught_within_20, t.trials, t.mean, t.worst, t.wrong_at_end
                    )
                })?;
            }
            Ok(())
        }
        Command::Bench(Bench::Isolation(a)) => {
            for p in flotilla::bench::isolation::run(a.tasks, a.rounds)? {
                print(a.json, &p, |p| {
                    format!(
                        "isolation {:<15} {:>7.2} ms/task  ({:+.2} ms over none, median of {})",
                        p.setting,
                        p.ms_per_task,
                        p.added_ms,
                        p.rounds_ms.len()
                    )
                })?;
            }
            Ok(())
        }
        Command::Bench(Bench::Flood(a)) => {
            let cfg = flotilla::bench::flood::FloodConfig {
                clients: a.clients,
                jobs: a.jobs,
                stuck_watchers: a.stuck_watchers,
                silent: a.silent,
                probe_every: flotilla::core::duration::parse_duration(&a.probe_every)
                    .map_err(|e| anyhow::anyhow!("--probe-every: {e}"))?,
            };
            let r = tokio_runtime()?
                .block_on(flotilla::bench::flood::run(&cfg))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            print(a.json, &r, |r| {
                let l = |x: &flotilla::bench::flood::Latency| {
                    format!(
                        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        x.p50_ms, x.p99_ms, x.max_ms
                    )
                };
                format!(
                    "flood: {} jobs from {} clients ({} stuck watchers, {} silent connections): \
                     accepted in {:.2} s ({:.0}/s), {} refused{}, all done in {:.2} s\n  \
                     status (cluster): idle {}; flood {}\n  status JOB: idle {}; flood {}\n  \
                     memory: {:.0} MiB before, {:.0} MiB peak, {:.0} MiB after",
                    r.jobs,
                    r.clients,
                    r.stuck_watchers,
                    r.silent,
                    r.submit_s,
                    r.submissions_per_s,
                    r.refused,
                    r.refusal
                        .as_deref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default(),
                    r.done_s,
                    l(&r.cluster_status_idle),
                    l(&r.cluster_status_flood),
                    l(&r.job_status_idle),
                    l(&r.job_status_flood),
                    r.rss_before_mib,
                    r.rss_peak_mib,
                    r.rss_after_mib
                )
            })?;
            Ok(())
        }
        Command::Bench(Bench::Restart(a)) => {
            let points = tokio_runtime()?.block_on(flotilla::bench::restart::run(
                &a.tasks,
                a.reps,
                a.compaction,
            ))?;
            for p in points {
                print(a.json, &p, |p| {
                    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                    let compacted = match (p.compacted_bytes, p.compact_s, p.restart_compacted_s) {
                        (Some(b), Some(c), Some(r)) => format!(
                            "; compacted to {:.3} MiB in {c:.3} s, then restart {r:.3} s",
                            mib(b)
                        ),
                        _ => String::new(),
                    };
                    format!(
                        "restart: {} tasks, {} records, {:.1} MiB journal: {:.3} s (median of {}){compacted}",
                        p.tasks,
                        p.records,
                        mib(p.journal_bytes),
                        p.restart_s,
                        p.runs_s.len()
                    )
                })?;
            }
            Ok(())
        }
        Command::Bench(Bench::Overhead(a)) => {
            let cpus = a.cpus.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            let r = overhead::run(&overhead::OverheadConfig {
                tasks: a.tasks,
                deps: a.deps,
                cpus,
                reps: a.reps,
            })?;
            print(a.json, &r, |r| {
                format!(
                    "overhead deps={:?} tasks={} cpus={}: flotilla {:.1} ns/task, rayon {:.1} ns/task, ratio {:.2}; codelet tasks with dependency inference {:.1} ns/task",
                    r.deps, r.tasks, r.cpus, r.ns_per_task, r.rayon_ns_per_task, r.ratio, r.codelet_ns_per_task
                )
            })
        }
        Command::Bench(Bench::Cholesky(a)) => {
            let r = linalg::run_cholesky(&linalg_config(&a))?;
            print(a.json, &r, human_linalg)
        }
        Command::Bench(Bench::Gemm(a)) => {
            let r = linalg::run_gemm(&linalg_config(&a))?;
            print(a.json, &r, human_linalg)
        }
        Command::Bench(Bench::Copy(a)) => {
            let points = flotilla::bench::copy::run(&name(&a.device), a.mib << 20, a.reps)?;
            for p in points {
                if a.json {
                    outln!("{}", serde_json::to_string(&p)?);
                } else {
                    outln!(
                        "copy {} {:<32} {} {} MiB: {:.2} GB/s",
                        p.direction,
                        p.memory,
                        p.device,
                        p.bytes >> 20,
                        p.gbs
                    );
                }
            }
            Ok(())
        }
        Command::Devices(a) => {
            let report = flotilla::devices_report::report();
            if a.json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", report.human());
            }
            Ok(())
        }
        Command::Simulate(a) => {
            let dag = match (&a.dag, a.cholesky) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    flotilla::sched::parse_dag(&text)
                        .with_context(|| format!("{}", path.display()))?
                }
                (None, Some(nt)) => flotilla::sched::cholesky_dag(
                    nt,
                    &flotilla::sched::CholeskyPlatform::new(a.sim_cpus, a.sim_gpus),
                )?,
                (None, None) => anyhow::bail!("give --dag FILE or --cholesky NT"),
            };
            let s = if a.cluster {
                let s = flotilla::cluster::sim::simulate_dag(&dag, &Default::default())?;
                s.validate(&dag)
                    .context("the cluster's schedule breaks the DAG")?;
                s
            } else {
                flotilla::sched::simulate(&dag, a.policy, a.seed)?
            };
            print(a.json, &s, |s| {
                // In the DAG's own time unit (seconds for the workflow traces).
                let mut out = format!(
                    "policy {}: makespan {:.3} ({} tasks)\n",
                    s.policy,
                    s.makespan,
                    s.placements.len()
                );
                for p in &s.placements {
                    out.push_str(&format!(
                        "  {:<12} on {:<8} {:>10.3} .. {:>10.3}\n",
                        p.task, p.processor, p.start, p.end
                    ));
                }
                out.trim_end().to_string()
            })
        }
        _ => unreachable!("cluster commands are dispatched in run()"),
    }
}

/// The command line's definition, with negative numbers read as values everywhere: `--cpus
/// -4` or `budget 7 -4` is then refused by the value's own check, naming the flag, rather
/// than as an unknown flag with clap's tip to write `-- -4`.
fn cli_command() -> clap::Command {
    fn numbers(cmd: clap::Command) -> clap::Command {
        cmd.allow_negative_numbers(true).mut_subcommands(numbers)
    }
    numbers(Cli::command())
}

fn main() -> ExitCode {
    let matches = match cli_command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            // `flotilla alloc add --partition ...`: the batch system was left out, and clap
            // says only that --partition is unexpected.
            let args: Vec<String> = std::env::args().skip(1).take(3).collect();
            if e.kind() == clap::error::ErrorKind::UnknownArgument
                && args.len() == 3
                && args[0] == "alloc"
                && args[1] == "add"
                && args[2].starts_with('-')
            {
                let _ = e.print();
                eprintln!(
                    "\nhint: name the batch system first: `flotilla alloc add slurm {} ...` \
                     (or `pbs`)",
                    args[2]
                );
                std::process::exit(2);
            }
            e.exit()
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The group's Raft (openraft) reports every unreachable peer as an error while a node is
    // down; our own lines say what matters (who leads, a node that stops leading).
    // `FLOTILLA_LOG=warn,openraft=info` shows it.
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=off"));
    // Colours only on a terminal: a log file or a journal gets plain text.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match cli.log_format {
        LogFormat::Text => logs.try_init(),
        LogFormat::Json => logs.json().try_init(),
    };
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // `flotilla status | head`: the reader has all it wanted.
        Err(e) if out::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flotilla: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated, each cause left out where the message before it
/// already says it: many of our errors put their source in their own message (`{path}:
/// {source}`), and `{:#}` would then print it twice.
fn report(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    for cause in e.chain().skip(1) {
        let said = cause.to_string();
        if !last.contains(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        last = said;
    }
    // A refused token: say which one was sent (a folder where `flotilla run` ran hands its
    // own token to every client started there).
    if let Some(from) = cluster_cmd::TOKEN_FROM.get() {
        out.push_str(&token_hint(&out, from));
    }
    out
}

/// What a refusal of the token adds to its message: where the token came from.
fn token_hint(message: &str, from: &str) -> String {
    if message.contains("invalid, revoked or missing access token") {
        format!(
            "\n(the token sent came from {from}; give the coordinator's with --token-file FILE \
             or FLOTILLA_TOKEN: the admin's is STATE_DIR/token of `flotilla server --state \
             STATE_DIR`, a tenant's is printed by `flotilla admin tenant add`, a worker's \
             enrolment token by `flotilla admin worker-token add`)"
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::{report, token_hint};

    #[test]
    fn a_refused_token_says_where_it_came_from() {
        let refused = "refused: invalid, revoked or missing access token";
        let hint = token_hint(refused, "FLOTILLA_TOKEN");
        assert!(
            hint.contains("the token sent came from FLOTILLA_TOKEN; give the coordinator's"),
            "{hint}"
        );
        assert_eq!(token_hint("no job 7", "FLOTILLA_TOKEN"), "");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Says {
        path: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading the job")]
    struct Quiet {
        source: std::io::Error,
    }

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let e = anyhow::Error::new(Says {
            path: "job.toml".into(),
            source: io(),
        });
        assert_eq!(report(&e), "job.toml: no such file");
        // The same through a context, as the binary's edge adds them.
        let e = e.context("submitting");
        assert_eq!(report(&e), "submitting: job.toml: no such file");
    }

    #[test]
    fn a_cause_the_message_leaves_out_is_added() {
        let e = anyhow::Error::new(Quiet { source: io() });
        assert_eq!(report(&e), "reading the job: no such file");
    }
}
