//! `flotilla alloc`: queues of worker allocations the coordinator asks a batch system
//! (Slurm or PBS) for, as the work needs them. Each command takes the admin token.

use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use flotilla::cluster::alloc::{queues::describe, AllocState, Queue};
use flotilla::cluster::client::AllocOp;
use flotilla::cluster::proto;
use flotilla::core::duration::{format_duration, parse_duration};

use crate::admin_cmd::ListArgs;
use crate::cluster_cmd::RemoteArgs;
use crate::out::outln;

/// `flotilla alloc ...`.
#[derive(Subcommand)]
pub(crate) enum AllocCmd {
    /// Add a queue: the coordinator submits allocations that start workers as the work needs
    /// them, watches them, and gives them back.
    #[command(subcommand)]
    Add(AddCmd),
    /// Every queue: its state, its allocations queued and running, its workers.
    List(ListArgs),
    /// One queue: its settings, why it is paused, its allocations.
    Info(QueueArgs),
    /// Submit nothing more from a queue (what runs goes on).
    Pause(PauseArgs),
    /// Submit again from a paused queue (its failures in a row are forgotten).
    Resume(QueueArgs),
    /// Cancel a queue's allocations (their workers drain: their tasks checkpoint and move)
    /// and forget it.
    Remove(QueueArgs),
}

#[derive(Subcommand)]
pub(crate) enum AddCmd {
    /// Slurm: allocations are `sbatch` jobs of one worker per node.
    Slurm(Box<SlurmArgs>),
    /// PBS (OpenPBS, PBS Professional, Torque, Slurm's PBS wrappers): allocations are `qsub`
    /// jobs of one worker per node.
    Pbs(Box<PbsArgs>),
}

#[derive(Args)]
pub(crate) struct SlurmArgs {
    /// The partition (`sbatch --partition`).
    #[arg(long)]
    partition: String,
    #[command(flatten)]
    common: CommonArgs,
    /// More `sbatch` arguments, after `--`: `-- --account=lab --qos=long`.
    #[arg(last = true)]
    sbatch_args: Vec<String>,
}

#[derive(Args)]
pub(crate) struct PbsArgs {
    /// The queue (`qsub -q`; default: the server's default queue).
    #[arg(long)]
    queue: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
    /// More `qsub` arguments, after `--`: `-- -A lab -l select=1:ncpus=32`.
    #[arg(last = true)]
    qsub_args: Vec<String>,
}

/// What every batch system's queue is given.
#[derive(Args)]
pub(crate) struct CommonArgs {
    /// An allocation's time limit (`sbatch --time`, `qsub -l walltime`), e.g. 1h. Its workers leave before it,
    /// with their tasks' grace; a task expected to run longer than a worker has left goes
    /// elsewhere.
    #[arg(long)]
    time_limit: String,
    /// Workers (nodes) per allocation.
    #[arg(long, default_value_t = 1)]
    workers_per_alloc: u32,
    /// The most allocations queued and running at once.
    #[arg(long, default_value_t = 4)]
    max_allocs: u32,
    /// The most allocations waiting in the batch system's queue at once.
    #[arg(long, default_value_t = 2)]
    backlog: u32,
    /// How long a worker with nothing to run waits before it leaves and gives its node
    /// back, e.g. 5m.
    #[arg(long, default_value = "5m")]
    idle_timeout: String,
    /// CPUs one worker offers (default: learned from the first to join; until then,
    /// `sinfo`'s CPUs per node of the partition, or the fewest of `pbsnodes -a`).
    #[arg(long)]
    cpus_per_worker: Option<f64>,
    /// GPUs one worker offers (tasks asking more do not count toward this queue).
    #[arg(long, default_value_t = 0.0)]
    gpus_per_worker: f64,
    /// `predictive`: ask for what the work left will use when an allocation would start
    /// (the learned runtimes and queue wait); `reactive`: ask only while tasks wait.
    #[arg(long, default_value = "predictive")]
    rule: String,
    /// Failed submissions or allocations in a row that pause the queue.
    #[arg(long, default_value_t = 3)]
    max_failures: u32,
    /// The `flotilla` program on the nodes (default: the coordinator's own).
    #[arg(long)]
    worker_program: Option<String>,
    /// The coordinator's address as the nodes reach it (default: the address it listens
    /// on, with this host's name for 0.0.0.0).
    #[arg(long)]
    server_address: Option<String>,
    /// A folder the nodes see (a shared filesystem): the batch scripts, the allocations'
    /// logs, the workers' enrolment token and work folders (default: STATE/alloc/qID).
    #[arg(long)]
    work_dir: Option<String>,
    /// One more `flotilla worker` argument (repeat it): `--worker-arg=--grace
    /// --worker-arg=2m`.
    #[arg(long = "worker-arg", allow_hyphen_values = true)]
    worker_args: Vec<String>,
    /// A name to recognise the queue by.
    #[arg(long, default_value = "")]
    name: String,
    /// Print the queue as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct QueueArgs {
    /// The queue: its id (`3` or `q3`, as `flotilla alloc list` and Slurm's job names
    /// `flotilla-q3` show it) or its `--name`.
    #[arg(value_name = "ID")]
    id: String,
    /// One JSON document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct PauseArgs {
    #[command(flatten)]
    queue: QueueArgs,
    /// Why (shown by `list` and `info`).
    #[arg(long, default_value = "")]
    reason: String,
}

fn secs(flag: &str, text: &str) -> Result<u64> {
    Ok(parse_duration(text)
        .with_context(|| format!("{flag} {text}"))?
        .as_secs())
}

/// Adds a queue of `manager` (`slurm`, `pbs`) at `partition` (a partition or a queue).
async fn add(
    manager: &str,
    partition: String,
    a: CommonArgs,
    batch_args: Vec<String>,
) -> Result<()> {
    let req = proto::AllocAddRequest {
        manager: manager.into(),
        name: a.name.clone(),
        partition,
        time_limit_s: secs("--time-limit", &a.time_limit)?,
        workers_per_alloc: a.workers_per_alloc,
        max_allocs: a.max_allocs,
        backlog: a.backlog,
        idle_timeout_s: secs("--idle-timeout", &a.idle_timeout)?.max(1),
        cpus_per_worker: a.cpus_per_worker.unwrap_or(0.0),
        gpus_per_worker: a.gpus_per_worker,
        rule: a.rule.clone(),
        max_failures: a.max_failures,
        worker_program: a.worker_program.clone().unwrap_or_default(),
        server_address: a.server_address.clone().unwrap_or_default(),
        work_dir: a.work_dir.clone().unwrap_or_default(),
        sbatch_args: batch_args,
        worker_args: a.worker_args.clone(),
    };
    let q = a.remote.client().await?.alloc_add(req).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&q)?);
    } else {
        let place = match (manager, q.spec.partition.is_empty()) {
            ("pbs", true) => "PBS, the default queue".to_string(),
            ("pbs", false) => format!("PBS queue {}", q.spec.partition),
            _ => format!("Slurm partition {}", q.spec.partition),
        };
        outln!(
            "allocation queue {} added: {place}, {} worker(s) per allocation, \
             at most {}; workers run {} and join {}",
            q.id,
            q.spec.workers_per_alloc,
            q.spec.max_allocs,
            q.spec.worker_program,
            q.spec.server_address
        );
    }
    Ok(())
}

/// Runs `flotilla alloc ...`.
pub(crate) async fn alloc(cmd: AllocCmd) -> Result<()> {
    match cmd {
        AllocCmd::Add(AddCmd::Slurm(a)) => {
            let a = *a;
            add("slurm", a.partition, a.common, a.sbatch_args).await?;
        }
        AllocCmd::Add(AddCmd::Pbs(a)) => {
            let a = *a;
            add("pbs", a.queue.unwrap_or_default(), a.common, a.qsub_args).await?;
        }
        AllocCmd::List(a) => {
            let list = a.remote.client().await?.alloc_list().await?;
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let mut t = crate::table::new(&[
                    ">ID",
                    "NAME",
                    "MANAGER",
                    "PARTITION|QUEUE",
                    "STATE",
                    ">QUEUED",
                    ">RUNNING",
                    ">WORKERS",
                    "TIME LIMIT",
                    "LAST ERROR",
                ]);
                for q in list {
                    let f = q.fleet(0);
                    let st = state(&q);
                    // A pause after failures says the last one already.
                    let last = q
                        .last_error
                        .clone()
                        .filter(|e| !st.contains(e.as_str()))
                        .unwrap_or_default();
                    t.add_row([
                        q.id.to_string(),
                        q.spec.name.clone(),
                        q.spec.manager.clone(),
                        q.spec.partition.clone(),
                        st,
                        f.queued.to_string(),
                        f.running_left_s.len().to_string(),
                        q.allocations
                            .iter()
                            .map(|a| a.workers.len())
                            .sum::<usize>()
                            .to_string(),
                        format_duration(Duration::from_secs(q.spec.time_limit_s)),
                        last,
                    ]);
                }
                outln!("{t}");
            }
        }
        AllocCmd::Info(a) => {
            let q = queue_op(&a, AllocOp::Info, "").await?;
            print_queue(&q, a.json)?;
        }
        AllocCmd::Pause(p) => {
            let q = queue_op(&p.queue, AllocOp::Pause, &p.reason).await?;
            print_short(&q, p.queue.json, "paused")?;
        }
        AllocCmd::Resume(a) => {
            let q = queue_op(&a, AllocOp::Resume, "").await?;
            print_short(&q, a.json, "resumed")?;
        }
        AllocCmd::Remove(a) => {
            let q = queue_op(&a, AllocOp::Remove, "").await?;
            print_short(&q, a.json, "removed (its allocations cancelled)")?;
        }
    }
    Ok(())
}

/// `op` on the queue `a` names: by id (`3`, `q3`), else by name.
async fn queue_op(a: &QueueArgs, op: AllocOp, reason: &str) -> Result<Queue> {
    let mut client = a.remote.client().await?;
    let text = a.id.trim();
    let id = match text.strip_prefix('q').unwrap_or(text).parse::<u32>() {
        Ok(id) => id,
        Err(_) => {
            let list = client.alloc_list().await?;
            match list.iter().find(|q| q.spec.name == text) {
                Some(q) => q.id,
                None => anyhow::bail!(
                    "no allocation queue {text:?}: give its id (3 or q3) or its name, as \
                     `flotilla alloc list` shows them"
                ),
            }
        }
    };
    Ok(client.alloc_queue(op, id, reason).await?)
}

fn state(q: &Queue) -> String {
    let state = match &q.paused {
        Some(why) => format!("paused: {why}"),
        None => "active".into(),
    };
    match &q.too_long {
        Some(_) => format!("{state} (tasks too long for it: see alloc info)"),
        None => state,
    }
}

fn print_short(q: &Queue, json: bool, what: &str) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(q)?);
    } else {
        outln!("allocation queue {} {what}", q.id);
    }
    Ok(())
}

fn print_queue(q: &Queue, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(q)?);
        return Ok(());
    }
    let s = &q.spec;
    outln!("queue        {} {}", q.id, s.name);
    outln!("state        {}", state(q));
    match (s.manager.as_str(), s.partition.is_empty()) {
        ("pbs", true) => outln!("manager      pbs (the default queue)"),
        ("pbs", false) => outln!("manager      pbs (queue {})", s.partition),
        _ => outln!("manager      {} (partition {})", s.manager, s.partition),
    }
    outln!(
        "allocations  {} worker(s) each, {} at most, {} queued at most, time limit {}",
        s.workers_per_alloc,
        s.max_allocs,
        s.backlog,
        format_duration(Duration::from_secs(s.time_limit_s))
    );
    outln!(
        "workers      {} CPUs each{}, leave after {} idle; run {}; join {}",
        q.cpus_per_worker(),
        if s.cpus_per_worker.is_some() {
            ""
        } else if q.learned_cpus.is_some() {
            " (as the batch system or a worker said)"
        } else {
            " (not known yet)"
        },
        format_duration(Duration::from_secs(s.idle_timeout_s)),
        s.worker_program,
        s.server_address
    );
    outln!("rule         {}", s.rule);
    outln!("work folder  {}", s.work_dir);
    if !s.sbatch_args.is_empty() {
        let command = if s.manager == "pbs" { "qsub" } else { "sbatch" };
        outln!("{command:<12} {}", s.sbatch_args.join(" "));
    }
    outln!(
        "queue wait   {}",
        if q.waits_s.is_empty() {
            "not seen yet".into()
        } else {
            format!(
                "{:.0}s on average (the last {})",
                q.queue_wait_s(),
                q.waits_s.len()
            )
        }
    );
    if let Some(e) = &q.last_error {
        outln!("last error   {e} ({} in a row)", q.failures);
    }
    if let Some(note) = &q.too_long {
        outln!("too long     {note}");
    }
    let mut t = crate::table::new(&["ALLOCATION", "STATE", ">WAITED", ">WORKERS", "LOG"]);
    for a in &q.allocations {
        let waited = a
            .started_at
            .map(|s| format_duration(Duration::from_secs(s.saturating_sub(a.submitted_at))))
            .unwrap_or_default();
        let workers = if a.state == AllocState::Running {
            a.workers.len().to_string()
        } else {
            format!("({} came)", a.workers_seen)
        };
        t.add_row([
            a.id.clone(),
            describe(&a.state),
            waited,
            workers,
            a.log(&s.work_dir),
        ]);
    }
    outln!("{t}");
    Ok(())
}
