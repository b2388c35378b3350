//! The worker agent: registers with the coordinator, keeps one session stream open, runs the
//! tasks it is given on its own resources, and reports results, logs and usage.
//!
//! # Local scheduling
//! The coordinator may queue a few more tasks on a worker than fit at once (batched
//! dispatch). The agent starts a queued task only when its resources (cpus, mem, gpus,
//! custom) are free, so running tasks never oversubscribe the worker; tasks that fit are
//! started in arrival order, later ones may backfill around a large one.
//!
//! # Reconnecting
//! When the session breaks, running tasks go on. The agent registers again, reporting the
//! attempts still running, and re-sends the results of the last minute: the coordinator
//! applies each result at most once, so a result that was in flight when the coordinator
//! died is neither lost nor counted twice.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::ledger::{Ledger, LedgerGpu};
use flotilla_core::Resources;
use flotilla_exec::{CancelHandle, Limits, Output, ProcessSpec, Termination, WasmRunner, WasmSpec};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::agent::{Agent, Attempt, Command, Report};
use crate::auth::TokenAdd;
use crate::convert;
use crate::error::{ClusterError, Result};
use crate::objects::ObjectStore;
use crate::proto::workers_client::WorkersClient;
use crate::proto::{self, Assignment, TaskKey};
use crate::state::{AttemptOutcome, AttemptResult, Millis};
use crate::transport::Remote;

/// A GPU the worker offers.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerGpu {
    /// Its index (what CUDA_VISIBLE_DEVICES names).
    pub index: u32,
    /// Its model name.
    pub model: String,
    /// Its memory in bytes.
    pub mem_bytes: u64,
    /// Its PCI address as the driver writes it (`0000:1b:00.0`), when known: how its energy
    /// counter is found in NVML, which numbers GPUs its own way.
    pub pci_bus_id: Option<String>,
}

/// How a worker is set up.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The coordinator.
    pub remote: Remote,
    /// A name for humans (default: the hostname).
    pub name: String,
    /// CPUs offered.
    pub cpus: f64,
    /// Memory offered, bytes (default: the machine's; 0: not accounted).
    pub mem: u64,
    /// GPUs offered.
    pub gpus: Vec<WorkerGpu>,
    /// Custom resources offered.
    pub custom: Vec<(String, f64)>,
    /// The hardware class: workers of one class share learned task runtimes.
    pub hw_class: String,
    /// Where logs, sandboxes and held objects live.
    pub work_dir: PathBuf,
    /// Where to serve held objects to other workers (staging = "transfer"); port 0 picks one.
    pub data_listen: std::net::SocketAddr,
    /// How to start the guard that kills this worker's tasks if it dies
    /// (`flotilla_exec::Guard`): the program and its arguments, e.g. the `flotilla` binary
    /// and `worker-guard`. `None`: no guard (a worker inside another process, as in tests).
    pub guard: Option<Vec<String>>,
    /// Whether process tasks run in a sandbox ([`Isolation`]).
    pub isolation: Isolation,
    /// Whether tasks that ask for the network (`network = true`) may have it: the worker
    /// then offers the custom resource `network`, and only such tasks are placed here.
    pub allow_network: bool,
    /// The most processes (and threads) one sandboxed task may have at once (cgroup
    /// `pids.max`): a fork bomb stops there.
    pub task_pids: u64,
    /// The most linear memory a WASM module may have here; a job's `memory` is capped at
    /// it, and a module whose job says nothing gets [`DEFAULT_WASM_MEMORY`] (or this, if
    /// less).
    pub wasm_max_memory: u64,
    /// The longest a WASM module may run here; a task's `timeout` is capped at it, and a
    /// task without one gets it.
    pub wasm_max_time: Duration,
    /// The most bytes its object store may hold (outputs made here, inputs fetched); an
    /// object beyond fails its task, retryable elsewhere. `None`: no cap.
    pub max_store: Option<u64>,
    /// It enrolls as a provider's machine (`--provider-token`): the coordinator refuses it
    /// unless its token is a provider's.
    pub as_provider: bool,
    /// Its price, when it is a provider's worker (enrolled with a provider token).
    pub price: flotilla_pool::Price,
    /// A deliberate fault for tests (`FLOTILLA_FAULT`, see [`crate::fault`]).
    pub fault: crate::fault::Fault,
    /// Told the worker's id each time it registers (again after a lost session or a
    /// coordinator's restart): `flotilla worker` says so on the terminal.
    pub registered: Option<tokio::sync::mpsc::UnboundedSender<u32>>,
    /// Told why, when the worker starts leaving by itself (drained by the admin, idle for
    /// `--idle-timeout`, near `--time-limit`): `flotilla worker` says so on the terminal.
    pub leaving: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// The most disk one attempt's folder may use (transfer staging): a task whose folder
    /// grows past it is stopped and fails, and no file of it may be larger. `None`: no cap.
    pub max_sandbox: Option<u64>,
    /// How long a preempted task has, after SIGTERM, to write its checkpoint before it is
    /// killed (`--grace`).
    pub grace: Duration,
    /// Its owner may reclaim it at any moment (`--preemptible`), as its provider says.
    pub preemptible: bool,
    /// When it may work (`--available`), local time; `None`: always.
    pub available: Option<flotilla_pool::Windows>,
    /// Work only while the machine's owner is idle (`--idle-only`).
    pub idle: Option<IdleConfig>,
    /// Watts one busy CPU draws here (`--cpu-watts`): estimates energy where RAPL is not
    /// readable, and lets `objective = "energy"` compare machines.
    pub cpu_watts: f64,
    /// The `flotilla-enter` program: with it, sandboxed tasks enter one sandbox holder built
    /// at start instead of building their own (see `flotilla_exec::Holder`). `None`: each
    /// task gets its own bubblewrap sandbox.
    pub enter: Option<PathBuf>,
    /// Leave, as drained, after this long with nothing to run or queued (`--idle-timeout`):
    /// a worker of a batch allocation gives its machine back. `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Leave, as drained, at this instant at the latest (`--time-limit`, counted from the
    /// start: its allocation's end), starting --grace + 15 s before it so that its tasks
    /// are preempted with their grace, not cut. `None`: no limit.
    pub leave_at: Option<Instant>,
}

/// The WASM memory a module gets when its job does not say: 1 GiB.
pub const DEFAULT_WASM_MEMORY: u64 = 1 << 30;

/// The default for [`WorkerConfig::wasm_max_memory`]: 4 GiB (all a 32-bit module can
/// address).
pub const DEFAULT_WASM_MAX_MEMORY: u64 = 4 << 30;

/// The default for [`WorkerConfig::wasm_max_time`]: 24 hours.
pub const DEFAULT_WASM_MAX_TIME: Duration = Duration::from_secs(24 * 3600);

/// The coordinator's addresses as `host:port` (no scheme).
fn coordinator_addrs(remote: &Remote) -> Vec<String> {
    remote
        .addrs()
        .into_iter()
        .map(|a| {
            a.trim_start_matches("http://")
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_string()
        })
        .collect()
}

/// The address other workers fetch this one's outputs from: the bound one, or, bound to
/// every interface (`--data-listen 0.0.0.0:7071`, as in a pod or under systemd), this
/// machine's address on the route to the coordinator (a UDP socket's `connect` picks it;
/// nothing is sent). Before, `0.0.0.0:7071` itself was advertised, which no peer can reach.
async fn advertised(bound: std::net::SocketAddr, coordinator: &[String]) -> std::net::SocketAddr {
    if !bound.ip().is_unspecified() {
        return bound;
    }
    for addr in coordinator {
        let Ok(found) = tokio::net::lookup_host(addr.as_str()).await else {
            continue;
        };
        for to in found {
            let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let Ok(socket) = std::net::UdpSocket::bind(any) else {
                continue;
            };
            if socket.connect(to).is_ok() {
                if let Ok(local) = socket.local_addr() {
                    return std::net::SocketAddr::new(local.ip(), bound.port());
                }
            }
        }
    }
    tracing::warn!(
        "the object server listens on {bound}, and no route to the coordinator names this \
         machine's address: other workers cannot fetch from here (give --data-listen an \
         address)"
    );
    bound
}

/// The machine a worker reports: its Kubernetes node (`FLOTILLA_NODE_NAME`, from the
/// Downward API's `spec.nodeName`) in a pod, else its hostname. Workers on one host share its
/// disks and network: `flotilla status` shows it beside each worker.
pub fn worker_host() -> String {
    env_name("FLOTILLA_NODE_NAME").unwrap_or_else(flotilla_core::host::hostname)
}

/// A non-empty environment variable.
fn env_name(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl WorkerConfig {
    /// A config with this machine's defaults: all cores, no GPUs, work dir under the temp dir,
    /// named as its pod (`FLOTILLA_POD_NAME`) or else its host.
    pub fn local(remote: Remote) -> Self {
        let host = worker_host();
        Self {
            remote,
            name: env_name("FLOTILLA_POD_NAME").unwrap_or_else(|| host.clone()),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get() as f64)
                .unwrap_or(1.0),
            mem: total_memory(),
            gpus: Vec::new(),
            custom: Vec::new(),
            hw_class: default_hw_class(),
            work_dir: std::env::temp_dir()
                .join(format!("{DEFAULT_WORK_PREFIX}{}", std::process::id())),
            data_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            guard: None,
            isolation: Isolation::Auto,
            allow_network: false,
            task_pids: DEFAULT_TASK_PIDS,
            wasm_max_memory: DEFAULT_WASM_MAX_MEMORY,
            max_store: None,
            price: flotilla_pool::Price::default(),
            as_provider: false,
            fault: crate::fault::Fault::None,
            registered: None,
            leaving: None,
            max_sandbox: None,
            enter: None,
            idle_timeout: None,
            leave_at: None,
            wasm_max_time: DEFAULT_WASM_MAX_TIME,
            grace: DEFAULT_GRACE,
            preemptible: false,
            available: None,
            idle: None,
            cpu_watts: DEFAULT_CPU_WATTS,
        }
    }

    /// When it works, as `flotilla provider list` shows it ("" for always).
    pub fn availability(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = &self.available {
            parts.push(w.to_string());
        }
        if self.idle.is_some() {
            parts.push("idle-only".to_string());
        }
        parts.join(", ")
    }
}

/// The default for [`WorkerConfig::cpu_watts`]: 12 W.
pub const DEFAULT_CPU_WATTS: f64 = 12.0;

/// The default for [`WorkerConfig::grace`]: 30 seconds.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// A worker with a time limit starts leaving its grace plus this before it.
pub const LEAVE_EARLY: Duration = Duration::from_secs(15);

/// The most bytes of checkpoint files one preempted attempt ships to the coordinator
/// (transfer staging); a larger checkpoint is not kept and the task restarts from nothing.
pub const MAX_CHECKPOINT_BYTES: u64 = 256 << 20;

/// `--idle-only`: when the machine's owner counts as active.
#[derive(Clone, Debug, PartialEq)]
pub struct IdleConfig {
    /// The load (1-minute average) of the machine's other processes above which the owner
    /// is busy (this worker's running tasks' CPUs are subtracted).
    pub load: f64,
    /// How long the owner must have been idle before work starts again.
    pub after: Duration,
    /// The owner is active while this file exists (a screen locker's or session manager's
    /// hook can make and remove it).
    pub active_file: Option<PathBuf>,
}

/// This machine's memory in bytes (from /proc/meminfo; 0 if unknown).
pub fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A hardware class from the CPU model and core count, e.g. `x86_64-AMD EPYC 9B14-2c`.
pub fn default_hw_class() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "cpu".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{}-{}-{}c", std::env::consts::ARCH, model, cores)
}

impl WorkerConfig {
    /// What the worker offers, as one amount (GPUs counted from the list).
    pub fn offer(&self) -> Resources {
        let mut r = Resources::zero();
        r.cpus = self.cpus;
        r.mem = self.mem;
        r.gpus = self.gpus.len() as f64;
        r.gpu_mem = self.gpus.iter().map(|g| g.mem_bytes).max().unwrap_or(0);
        r.custom = self.custom.iter().cloned().collect();
        if self.allow_network {
            // Any number of its tasks may use the network at once.
            r.custom
                .entry(flotilla_core::NETWORK.to_string())
                .or_insert(1e6);
        }
        r
    }

    /// The ledger of this offer, as the coordinator keeps it too.
    fn ledger(&self) -> Result<Ledger> {
        let gpus: Vec<LedgerGpu> = self
            .gpus
            .iter()
            .map(|g| LedgerGpu {
                index: g.index,
                mem_bytes: g.mem_bytes,
            })
            .collect();
        Ok(Ledger::new(self.offer(), &gpus)?)
    }
}

/// The device files a task given GPUs `indices` needs inside its sandbox (those missing on
/// this machine are skipped by the sandbox).
fn gpu_devices(indices: &[u32]) -> Vec<PathBuf> {
    if indices.is_empty() {
        return Vec::new();
    }
    let mut d: Vec<PathBuf> = [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/dri",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    d.extend(
        indices
            .iter()
            .map(|i| PathBuf::from(format!("/dev/nvidia{i}"))),
    );
    d
}

/// Whether a worker sandboxes its process tasks (bubblewrap; see `flotilla_exec::sandbox`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// A sandbox when this machine can make one; a warning when it cannot.
    #[default]
    Auto,
    /// Always bubblewrap; the worker refuses to start without it.
    Bwrap,
    /// A sandbox or nothing: the worker refuses to start when it cannot make one.
    Required,
    /// No sandbox: tasks run as the worker's user, in its namespaces.
    None,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Isolation::Auto),
            "bwrap" => Ok(Isolation::Bwrap),
            "required" => Ok(Isolation::Required),
            "none" => Ok(Isolation::None),
            _ => Err(format!(
                "isolation {s:?}: one of auto, bwrap, required, none"
            )),
        }
    }
}

/// The default for [`WorkerConfig::task_pids`].
pub const DEFAULT_TASK_PIDS: u64 = 1024;

/// How this worker sandboxes tasks, found at start.
struct Sandboxing {
    bwrap: PathBuf,
    /// What sandboxes see as `/etc` (`WORK/sandbox-etc`), when it could be made.
    etc: Option<PathBuf>,
    /// One empty network namespace the sandboxes join (when the worker may make one).
    netns: Option<flotilla_exec::EmptyNetns>,
    /// The cgroup parent of its attempts (relative), when cgroups can be used.
    cgroups: Option<PathBuf>,
    /// The sandbox holder tasks enter (without network or devices), when one could be made.
    holder: Option<(flotilla_exec::Holder, flotilla_exec::HolderRef)>,
}

impl Sandboxing {
    /// Resolves `isolation` on this machine; `Ok(None)` when tasks run unsandboxed.
    fn find(config: &WorkerConfig) -> Result<Option<Sandboxing>> {
        let strict = matches!(config.isolation, Isolation::Bwrap | Isolation::Required);
        if config.isolation == Isolation::None {
            return Ok(None);
        }
        let found = flotilla_exec::sandbox::find_bwrap()
            .ok_or_else(|| "bwrap was not found (Debian: apt-get install bubblewrap)".to_string())
            .and_then(|b| flotilla_exec::sandbox::probe(&b).map(|()| b));
        let bwrap = match found {
            Ok(b) => b,
            Err(why) if strict => {
                let mode = if config.isolation == Isolation::Bwrap {
                    "bwrap"
                } else {
                    "required"
                };
                return Err(ClusterError::Config(format!(
                    "--isolation {mode}: no sandbox can be made here: {why}"
                )));
            }
            Err(why) => {
                tracing::warn!(
                    "tasks run WITHOUT a sandbox: {why}; they can read what this worker's \
                     user can read and signal its processes (--isolation required refuses \
                     to start instead)"
                );
                return Ok(None);
            }
        };
        // A pyenv, conda or venv on the worker's PATH is not in its sandboxes: tasks ran
        // another `python3` than `flotilla run` did, and failed on a missing module, unsaid.
        let hidden = std::env::var("PATH")
            .map(|p| flotilla_exec::sandbox::hidden_path_entries(&p))
            .unwrap_or_default();
        if !hidden.is_empty() {
            tracing::warn!(
                "sandboxed tasks do not see these folders of PATH: {}; a program there (a \
                 pyenv, conda or venv python3, a cargo-installed tool) is not the one tasks \
                 run: install it under /usr or /opt, or in the job folder, or run this worker \
                 with --isolation none",
                hidden.join(", ")
            );
        }
        let netns = match flotilla_exec::EmptyNetns::new() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::info!("each sandbox makes its own network namespace ({e})");
                None
            }
        };
        let cgroups = flotilla_exec::cgroup_available().then(|| {
            let name: String = config
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            // One folder per worker process (`worker-NAME.PID`): two workers of one name on
            // a machine (tests, a restart that overlaps) must not clean each other's attempts.
            let base = PathBuf::from("flotilla");
            let own = format!("worker-{name}");
            // Attempts of this worker's earlier lives (killed, crashed) must not run on: the
            // folders of its name whose process is gone (and the PID-less ones of old versions).
            flotilla_exec::cleanup_stale_cgroups(&base, |folder| {
                folder == own
                    || folder
                        .strip_prefix(&own)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .and_then(|pid| pid.parse::<libc::pid_t>().ok())
                        .is_some_and(|pid| !process_alive(pid))
            });
            // Those of killed workers of other names: removed where no process is left.
            flotilla_exec::remove_empty_stale_cgroups(&base, |folder| {
                folder
                    .strip_prefix("worker-")
                    .and_then(|rest| rest.rsplit_once('.'))
                    .and_then(|(_, pid)| pid.parse::<libc::pid_t>().ok())
                    .is_some_and(|pid| !process_alive(pid))
            });
            base.join(format!("{own}.{}", std::process::id()))
        });
        if cgroups.is_none() {
            tracing::warn!(
                "no writable cgroup hierarchy: sandboxed tasks are limited by rlimits only"
            );
        }
        tracing::info!(
            bwrap = %bwrap.display(),
            shared_netns = netns.is_some(),
            cgroups = cgroups.is_some(),
            "process tasks run in sandboxes"
        );
        let etc = config.work_dir.join("sandbox-etc");
        let etc = match flotilla_exec::sandbox::prepare_etc(&etc) {
            Ok(()) => Some(etc),
            Err(e) => {
                tracing::info!(
                    "{}: {e}; sandboxes bind /etc files one by one",
                    etc.display()
                );
                None
            }
        };
        let holder = config.enter.as_ref().and_then(|enter| {
            match start_holder(&bwrap, etc.as_deref(), enter, &config.work_dir) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::info!("each sandbox is built for its task (no holder: {e})");
                    None
                }
            }
        });
        tracing::info!(holder = holder.is_some(), "sandbox holder");
        Ok(Some(Sandboxing {
            bwrap,
            etc,
            netns,
            cgroups,
            holder,
        }))
    }
}

/// Starts a sandbox holder and checks that a task can enter it (`open_tree` and
/// `move_mount` need Linux 5.2 and the capabilities of a worker run as root).
fn start_holder(
    bwrap: &Path,
    etc: Option<&Path>,
    enter: &Path,
    work_dir: &Path,
) -> std::result::Result<(flotilla_exec::Holder, flotilla_exec::HolderRef), String> {
    let holder = flotilla_exec::Holder::start(bwrap, etc).map_err(|e| e.to_string())?;
    let r = holder.reference(enter);
    let out = std::process::Command::new(enter)
        .args([
            "--holder",
            &r.pid.to_string(),
            "--holder-mnt",
            &r.mnt.to_string(),
            "--own",
        ])
        .arg(work_dir)
        .arg("--cwd")
        .arg(work_dir)
        .args(["--", "true"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", enter.display()))?;
    if !out.status.success() {
        return Err(format!(
            "a task cannot enter it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok((holder, r))
}

/// A running attempt's I/O: its cancel handle and log files (path, bytes sent so far).
struct Running {
    cancel: CancelHandle,
    logs: [(PathBuf, u64); 2],
    /// Stopped because the worker is reclaimed: it ends preempted, its checkpoint kept.
    preempt: Arc<std::sync::atomic::AtomicBool>,
}

/// The agent's state and the I/O of what runs, under one lock (task threads and the session
/// both change it).
struct Local {
    agent: Agent<Box<Assignment>>,
    runs: HashMap<Attempt, Running>,
}

enum Out {
    Started(TaskKey),
    Finished(proto::TaskResult),
    Returned(TaskKey),
    Log(proto::TaskLog),
    /// Reclaimed (`false`) or back (`true`).
    Available(bool),
    /// It leaves: once its session ends (after its outputs are copied to peers) it stops.
    Leaving,
    /// A leaving peer's outputs of a task, fetched and held here now.
    Copied(Vec<proto::HeldObject>),
    /// A copy order that failed.
    CopyFailed(TaskKey),
}

/// Threads that run task attempts: an idle one takes the next attempt, a new one is
/// started when none is idle (attempts block in `wait`, so each needs its own thread), and
/// idle ones exit after a minute.
struct Pool {
    tx: crossbeam_channel::Sender<Box<dyn FnOnce() + Send>>,
    rx: crossbeam_channel::Receiver<Box<dyn FnOnce() + Send>>,
    idle: std::sync::atomic::AtomicUsize,
}

impl Pool {
    fn new() -> Arc<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        Arc::new(Self {
            tx,
            rx,
            idle: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn spawn(self: &Arc<Self>, job: impl FnOnce() + Send + 'static) {
        use std::sync::atomic::Ordering;
        let claimed = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if self.tx.send(Box::new(job)).is_err() {
            return;
        }
        if !claimed {
            let me = self.clone();
            let r = std::thread::Builder::new()
                .name("flotilla-task".into())
                .spawn(move || loop {
                    match me.rx.recv_timeout(Duration::from_secs(60)) {
                        Ok(job) => {
                            job();
                            me.idle.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(_) => {
                            // Leave only if no job was handed to us meanwhile.
                            if me
                                .idle
                                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok()
                            {
                                return;
                            }
                        }
                    }
                });
            if let Err(e) = r {
                tracing::error!("cannot start a task thread: {e}");
            }
        }
    }
}

/// Everything a task thread needs.
struct Shared {
    pool: Arc<Pool>,
    /// The id of the last registration, reported at the next one.
    previous: Mutex<Option<u32>>,
    /// The credential of the last registration: its session's token, the proof of its id
    /// at the next registration, and its token for the coordinator's objects.
    credential: Mutex<String>,
    /// The data keys of its registrations: fetches from its data server need a ticket made
    /// with one of them.
    data_keys: Arc<parking_lot::RwLock<Vec<[u8; 32]>>>,
    config: WorkerConfig,
    local: Mutex<Local>,
    out: mpsc::UnboundedSender<Out>,
    /// The WASM engine, or why this worker has none.
    wasm: std::result::Result<WasmRunner, String>,
    objects: Arc<ObjectStore>,
    /// Watches the size of transfer sandboxes (`--max-sandbox`).
    sandbox_watch: Option<Arc<crate::sandbox_watch::SandboxWatch>>,
    /// Where its object server listens (advertised as [`advertised`] says, at each
    /// registration: a coordinator's name may resolve only later, as in a pod).
    data_bound: std::net::SocketAddr,
    /// The fingerprint of its object server's TLS certificate (`""`: plain TCP).
    data_cert: String,
    /// The coordinator's rendezvous port for gangs (0 before registering or when none).
    rendezvous_port: std::sync::atomic::AtomicU32,
    /// The fingerprint of the rendezvous's TLS certificate (`""`: plain TCP).
    rendezvous_cert: Mutex<String>,
    /// The agent's clock starts here.
    epoch: Instant,
    /// Kills the tasks' process groups if this worker dies.
    guard: Option<flotilla_exec::Guard>,
    /// How process tasks are sandboxed (`None`: they are not).
    sandboxing: Option<Sandboxing>,
    /// The checkpoint files of preempted attempts (transfer staging), sent with their
    /// finish.
    checkpoints: Mutex<HashMap<Attempt, Vec<proto::CheckpointFile>>>,
    /// Transfer staging: how long each attempt's inputs took to fetch, and their bytes,
    /// reported with its end (the trace's transfer spans).
    staged: Mutex<HashMap<Attempt, (f64, u64)>>,
}

impl Shared {
    /// Milliseconds since the worker started (the agent's clock).
    fn now(&self) -> Millis {
        self.epoch.elapsed().as_millis() as Millis
    }

    /// Carries out the agent's commands in order (called with its lock held, so reports
    /// leave in the order the agent made them).
    fn apply(
        self: &Arc<Self>,
        runs: &mut HashMap<Attempt, Running>,
        cmds: Vec<Command<Box<Assignment>>>,
    ) {
        for c in cmds {
            match c {
                Command::Report(Report::Started(k)) => {
                    let _ = self.out.send(Out::Started(convert::key(k.0, k.1)));
                }
                Command::Report(Report::Finished(k, r)) => {
                    let mut r = convert::task_result(k, r);
                    if let Some(files) = self.checkpoints.lock().remove(&k) {
                        r.checkpoint = files;
                    }
                    if let Some((secs, bytes)) = self.staged.lock().remove(&k) {
                        r.stage_seconds = secs;
                        r.stage_bytes = bytes;
                    }
                    let _ = self.out.send(Out::Finished(r));
                }
                Command::Report(Report::Returned(k)) => {
                    let _ = self.out.send(Out::Returned(convert::key(k.0, k.1)));
                }
                Command::Kill(k) => {
                    if let Some(r) = runs.get(&k) {
                        r.cancel.cancel();
                    }
                }
                Command::Start { key, payload } => self.start(runs, key, payload),
            }
        }
    }

    /// Runs an attempt the agent started on a pool thread; its end goes back to the agent.
    fn start(
        self: &Arc<Self>,
        runs: &mut HashMap<Attempt, Running>,
        key: Attempt,
        a: Box<Assignment>,
    ) {
        let cancel = CancelHandle::new();
        let pkey = convert::key(key.0, key.1);
        let logs = log_paths(&self.config.work_dir, &pkey);
        let preempt = Arc::new(std::sync::atomic::AtomicBool::new(false));
        runs.insert(
            key,
            Running {
                cancel: cancel.clone(),
                logs: [(logs.0.clone(), 0), (logs.1.clone(), 0)],
                preempt: preempt.clone(),
            },
        );
        let sh = self.clone();
        self.pool.spawn(move || {
            let mut result = execute(&sh, &a, &pkey, &cancel, &logs, &preempt);
            if matches!(result.outcome, AttemptOutcome::Cancelled)
                && preempt.load(std::sync::atomic::Ordering::SeqCst)
            {
                let files = keep_checkpoint(&sh, &a, &pkey);
                result.outcome = AttemptOutcome::Preempted {
                    checkpoint: files
                        .iter()
                        .map(|f| crate::state::ObjectRef {
                            path: f.path.clone(),
                            hash: f.hash.clone(),
                            size: f.size,
                        })
                        .collect(),
                };
                if !files.is_empty() {
                    sh.checkpoints.lock().insert(key, files);
                }
            }
            if a.transfer {
                // Its outputs are copies in the store now: the sandbox goes, whatever the
                // outcome, so a worker's disk does not fill with finished attempts.
                let dir = crate::objects::sandbox_dir(&sh.config.work_dir, &pkey);
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!("removing {}: {e}", dir.display());
                    }
                }
            }
            let mut l = sh.local.lock();
            let Local { agent, runs } = &mut *l;
            // Final log bytes, then the result.
            if let Some(run) = runs.remove(&key) {
                for (i, (path, mut off)) in run.logs.into_iter().enumerate() {
                    while let Some(data) = read_from(&path, &mut off, 4 << 20) {
                        let _ = sh.out.send(Out::Log(proto::TaskLog {
                            task: Some(pkey),
                            data,
                            stderr: i == 1,
                        }));
                    }
                    let _ = std::fs::remove_file(&path);
                }
            }
            let cmds = agent.finished(key, result, sh.now());
            sh.apply(runs, cmds);
        });
    }
}

/// Whether a task that ended badly was stopped together with its worker: a batch system
/// that ends an allocation (`scancel`, preemption, a node drained) signals every process of
/// it, the tasks with their worker, and a task's SIGTERM may be seen before the worker's own
/// (it was a failure, a retry spent, where the worker's drain makes it a preemption). A task
/// killed by SIGTERM, or exiting 143 as a shell does then, waits up to 10 s for its worker to
/// be reclaimed; any other failure counts as one only if the worker is already leaving.
fn stopped_with_the_worker(t: &Termination, preempt: &std::sync::atomic::AtomicBool) -> bool {
    use std::sync::atomic::Ordering;
    if preempt.load(Ordering::SeqCst) {
        return true;
    }
    if !matches!(
        t,
        Termination::Signaled(libc::SIGTERM) | Termination::Exited(143)
    ) {
        return false;
    }
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        if preempt.load(Ordering::SeqCst) {
            return true;
        }
    }
    false
}

/// Reads the checkpoint files a preempted attempt left (its declared patterns, in its
/// folder) to ship them off the machine (transfer staging: the sandbox goes with the
/// attempt). Shared staging keeps them where they are, in the job folder: nothing is sent.
fn keep_checkpoint(sh: &Shared, a: &Assignment, key: &TaskKey) -> Vec<proto::CheckpointFile> {
    if !a.transfer || a.checkpoint.is_empty() {
        return Vec::new();
    }
    let root = crate::objects::sandbox_dir(&sh.config.work_dir, key);
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let mut files = Vec::new();
    let mut total = 0u64;
    for pattern in &a.checkpoint {
        if crate::objects::safe_relative(pattern).is_err() {
            continue;
        }
        let full = root.join(pattern).display().to_string();
        let Ok(paths) = glob::glob_with(&full, opts) else {
            continue;
        };
        for p in paths.flatten().filter(|p| p.is_file()) {
            let Ok(rel) = p.strip_prefix(&root) else {
                continue;
            };
            let Ok(data) = std::fs::read(&p) else {
                continue;
            };
            let path = rel.display().to_string();
            let hash = blake3::hash(&data).to_hex().to_string();
            // A file as it was staged (the checkpoint it resumed from, unchanged) is not
            // new: shipped again, it could stand for a newer one a gang's peer kept.
            let staged = a.inputs.iter().any(|i| {
                i.object
                    .as_ref()
                    .is_some_and(|o| o.path == path && o.hash == hash)
            });
            if staged {
                continue;
            }
            total += data.len() as u64;
            if total > MAX_CHECKPOINT_BYTES {
                tracing::warn!(
                    task = %a.name,
                    "its checkpoint is larger than {MAX_CHECKPOINT_BYTES} bytes: not kept"
                );
                return Vec::new();
            }
            files.push(proto::CheckpointFile {
                path,
                hash,
                size: data.len() as u64,
                data,
            });
        }
    }
    files
}

/// The worker is reclaimed (`why`): the coordinator is told to place nothing more here,
/// queued attempts are given back and running ones stopped with SIGTERM and the grace
/// period, ending preempted with their checkpoints.
fn reclaim(sh: &Arc<Shared>, why: &str) {
    tracing::info!("reclaimed: {why}");
    let mut l = sh.local.lock();
    let Local { agent, runs } = &mut *l;
    let _ = sh.out.send(Out::Available(false));
    let cmds = agent.reclaim();
    sh.apply(runs, cmds);
    for r in runs.values() {
        r.preempt.store(true, std::sync::atomic::Ordering::SeqCst);
        r.cancel.cancel_with_grace(sh.config.grace);
    }
}

/// The worker takes work again.
fn give_work(sh: &Arc<Shared>) {
    tracing::info!("available again");
    sh.local.lock().agent.resume();
    let _ = sh.out.send(Out::Available(true));
}

/// Whether the machine may work now, by its availability windows and its owner's activity;
/// `Err(why)` when it may not.
struct Owner {
    probe: Option<crate::idle::IdleProbe>,
}

impl Owner {
    fn new(config: &WorkerConfig) -> Owner {
        Owner {
            probe: config.idle.clone().map(crate::idle::IdleProbe::new),
        }
    }

    fn may_work(&mut self, sh: &Shared) -> std::result::Result<(), String> {
        if let Some(w) = &sh.config.available {
            let (weekday, minute) = crate::idle::local_time();
            if !w.contains(weekday, minute) {
                return Err(format!("outside its availability ({w})"));
            }
        }
        if let Some(p) = &mut self.probe {
            let own_cpus = {
                let l = sh.local.lock();
                l.agent.ledger().used().cpus
            };
            p.check(own_cpus)?;
        }
        Ok(())
    }
}

/// Runs a worker until `shutdown` turns true: connects (retrying while the coordinator is
/// unreachable), registers, runs tasks, reconnects after a broken session.
pub fn run_worker(
    mut config: WorkerConfig,
    mut shutdown: watch::Receiver<bool>,
) -> crate::Boxed<'static, Result<()>> {
    crate::boxed(async move {
        // Absolute: sandboxes enter their folders from elsewhere (a relative `--work-dir`
        // failed every sandboxed task with "open_tree wa/sandbox/...: No such file").
        config.work_dir = std::path::absolute(&config.work_dir)
            .map_err(|e| ClusterError::io(&config.work_dir, e))?;
        let ledger = config.ledger()?;
        // The work folder first: the sandbox holder is checked with a task entering it.
        std::fs::create_dir_all(&config.work_dir)
            .map_err(|e| ClusterError::io(&config.work_dir, e))?;
        // Held for the worker's life: one worker per folder, and what an earlier one left
        // there (killed, its attempts' folders never removed) is removed once its cgroups
        // (and the processes left in them) are (`Sandboxing::find`).
        let work_lock = lock_work_dir(&config.work_dir)?;
        let sandboxing = Sandboxing::find(&config)?;
        if work_lock.is_some() {
            remove_left_sandboxes(&config.work_dir);
        }
        let objects = Arc::new(ObjectStore::open_capped(
            &config.work_dir.join("objects"),
            config
                .max_store
                .map(|cap| (cap, "flotilla worker --max-store")),
        )?);
        let data_keys = Arc::new(parking_lot::RwLock::new(Vec::new()));
        // With a coordinator over TLS, the objects travel over TLS too, with a certificate made
        // now: the coordinator hands its fingerprint to whoever fetches from here.
        let data_tls = if config.remote.uses_tls() {
            Some(Arc::new(crate::framed::DataTls::generate()?))
        } else {
            None
        };
        let data_cert = data_tls
            .as_ref()
            .map(|t| t.fingerprint().to_string())
            .unwrap_or_default();
        let data = crate::framed::serve_framed_tls(
            config.data_listen,
            objects.clone(),
            crate::framed::Gate::Tickets(data_keys.clone()),
            data_tls,
        )
        .await
        .map_err(|e| e.bind_for("--data-listen"))?;
        let sandbox_watch = match config.max_sandbox {
            Some(cap) => Some(crate::sandbox_watch::SandboxWatch::start(cap).map_err(|e| {
                ClusterError::Config(format!("cannot start the sandbox size watcher: {e}"))
            })?),
            None => None,
        };
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Out>();
        let wasm = WasmRunner::new().map_err(|e| {
            tracing::warn!("wasm tasks disabled: {e}");
            e.to_string()
        });
        let guard = match config.guard.as_deref() {
            Some([program, args @ ..]) => {
                let mut cmd = std::process::Command::new(program);
                cmd.args(args);
                Some(flotilla_exec::Guard::start(cmd).map_err(|e| {
                    ClusterError::Config(format!("cannot start the task guard {program}: {e}"))
                })?)
            }
            _ => None,
        };
        let shared = Arc::new(Shared {
            pool: Pool::new(),
            previous: Mutex::new(None),
            credential: Mutex::new(String::new()),
            data_keys,
            config,
            guard,
            sandboxing,
            local: Mutex::new(Local {
                agent: Agent::new(ledger),
                runs: HashMap::new(),
            }),
            out: out_tx,
            wasm,
            objects,
            sandbox_watch,
            data_bound: data,
            data_cert,
            rendezvous_port: std::sync::atomic::AtomicU32::new(0),
            rendezvous_cert: Mutex::new(String::new()),
            epoch: Instant::now(),
            checkpoints: Mutex::new(HashMap::new()),
            staged: Mutex::new(HashMap::new()),
        });
        let mut backoff = Duration::from_millis(100);
        // Whether a session was ever opened: until then, a TLS mismatch is this worker's
        // settings (read once, at start), not a coordinator that changed.
        let mut connected = false;
        let mut owner = Owner::new(&shared.config);
        // Registered outside its availability: it says so at once.
        if let Err(why) = owner.may_work(&shared) {
            reclaim(&shared, &why);
        }
        loop {
            if *shutdown.borrow() {
                break;
            }
            let ended = session(&shared, &mut out_rx, &mut shutdown, &mut owner).await;
            // Registered once (the coordinator answered these settings), even if the session
            // then failed at once: a coordinator killed right after it, whose port resets the
            // next registration, is not a TLS mismatch.
            connected |= shared.previous.lock().is_some();
            match ended {
                Ok(SessionEnd::Shutdown) => break,
                Ok(SessionEnd::Broken(why)) => {
                    tracing::warn!("session with the coordinator ended: {why}; reconnecting");
                    backoff = Duration::from_millis(100);
                    connected = true;
                }
                Err(e @ ClusterError::Version { .. }) => return Err(e),
                // Its --tls-ca (or its plain TCP) does not fit the coordinator's first
                // answer: retrying with the same settings cannot help. Once connected, a
                // mismatch is the coordinator's change (a certificate being replaced):
                // retried, as an unreachable coordinator is.
                Err(e @ ClusterError::Config(_)) if !connected => return Err(e),
                Err(ClusterError::Tls { addr, message }) if !connected => {
                    return Err(ClusterError::Config(format!(
                        "cannot connect to {addr}: {message}; the worker stops rather than \
                         retry TLS settings it cannot change"
                    )))
                }
                // The token is read once, at start: trying it again cannot help. Stopping
                // shows the mistake (and a service manager's restart reads the token again).
                // Its own settings refused (a price without a provider's token): the same.
                Err(ClusterError::Invalid(why)) => {
                    return Err(ClusterError::Config(format!(
                        "the coordinator refused this worker: {why}; the worker stops rather \
                         than retry settings it cannot change"
                    )))
                }
                Err(ClusterError::Refused(why) | ClusterError::Denied(why)) => {
                    let check = if shared.config.as_provider {
                        "--provider-token (`flotilla admin provider token NAME` gives the \
                         provider another)"
                    } else {
                        "--token-file or FLOTILLA_TOKEN (`flotilla admin worker-token add` \
                         makes one)"
                    };
                    return Err(ClusterError::Config(format!(
                        "the coordinator refused this worker's token ({why}): check {check}; \
                         the worker stops rather than retry a token it cannot change"
                    )));
                }
                Err(e) => {
                    tracing::warn!("cannot reach the coordinator: {e}; retrying in {backoff:?}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.changed() => {}
            }
            // A group's next leader opens its port about a second after the last one died: ask
            // every half second then, not every two.
            let most = if shared.config.remote.addrs().len() > 1 {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(2)
            };
            backoff = (backoff * 2).min(most);
        }
        // Stop what still runs.
        let running: Vec<CancelHandle> = shared
            .local
            .lock()
            .runs
            .values()
            .map(|r| r.cancel.clone())
            .collect();
        for c in running {
            c.cancel();
        }
        // The emptied cgroups kept for reuse, then this process's cgroup folder with whatever
        // still runs in it (attempts still stopping die with their worker). What a killed worker
        // leaves is removed at the next start of a worker of its name.
        flotilla_exec::drain_cgroup_pool();
        if let Some(parent) = shared
            .sandboxing
            .as_ref()
            .and_then(|sb| sb.cgroups.as_ref())
        {
            flotilla_exec::remove_cgroup_tree(parent);
        }
        Ok(())
    })
}

/// Whether a process of this PID exists (signal 0 checks without sending anything).
/// The default work folder of this process: `flotilla-worker-PID` in `tmp`.
const DEFAULT_WORK_PREFIX: &str = "flotilla-worker-";

/// Takes `.lock` in a worker's work folder exclusively (released when the process ends,
/// however it ends), or says another worker uses the folder; then writes who holds it
/// (`owner`: host and boot, read by [`remove_gone_workers_folders`]). `None` where the
/// file system has no locks (a shared one mounted without them): said, and the worker
/// goes on unguarded (nothing is removed from its folder at start).
fn lock_work_dir(dir: &Path) -> Result<Option<std::fs::File>> {
    let at = dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&at)
        .map_err(|e| ClusterError::io(&at, e))?;
    match file.try_lock() {
        Ok(()) => {
            let _ = std::fs::write(dir.join("owner"), this_boot());
            Ok(Some(file))
        }
        Err(std::fs::TryLockError::WouldBlock) => Err(ClusterError::WorkDirInUse {
            dir: dir.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(
                "{}: {e}: this file system takes no locks; nothing keeps another worker out of \
                 this work folder",
                at.display()
            );
            Ok(None)
        }
    }
}

/// This machine's name and boot: a worker's process id means something only on the host,
/// and in the boot, where it was taken.
fn this_boot() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{} {}", host.trim(), boot.trim())
}

/// Removes the attempt folders an earlier worker of this work folder left (it was killed
/// with attempts running); said when there were some.
fn remove_left_sandboxes(work: &Path) {
    let dir = work.join("sandbox");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut removed = 0usize;
    for e in entries.flatten() {
        let p = e.path();
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        match r {
            Ok(()) => removed += 1,
            Err(err) => tracing::warn!("{}: {err}", p.display()),
        }
    }
    if removed > 0 {
        tracing::info!(
            "removed {removed} attempt folder(s) an earlier worker left in {}",
            dir.display()
        );
    }
}

/// Removes the default work folders (`flotilla-worker-PID` in `tmp`, owned by this user) of
/// workers that are gone: killed, they never removed theirs (their object stores with them).
/// Only a folder whose `owner` names this host and boot (a temporary folder shared by hosts
/// holds others'), whose process is not alive and whose lock nobody holds; one without an
/// owner (an older version's, or a worker still starting) is kept. The ones removed.
pub fn remove_gone_workers_folders(tmp: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let boot = this_boot();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DEFAULT_WORK_PREFIX))
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let path = e.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours || pid == std::process::id() as libc::pid_t || process_alive(pid) {
            continue;
        }
        let here = std::fs::read_to_string(path.join("owner")).is_ok_and(|o| o == boot);
        if !here {
            continue;
        }
        // Its lock, when it has one, tells a worker alive in another PID namespace.
        let held = match std::fs::File::open(path.join(".lock")) {
            Ok(f) => f.try_lock().is_err(),
            Err(_) => false,
        };
        if !held && std::fs::remove_dir_all(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 has no memory-safety preconditions and sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

enum SessionEnd {
    Shutdown,
    Broken(String),
}

/// What a registration carries of the agent: what runs, what finished lately (re-sent: the
/// coordinator applies each result once) and the output written while there was no session.
struct Rejoining {
    running: Vec<TaskKey>,
    finished: Vec<proto::TaskResult>,
    logs: Vec<proto::TaskLog>,
}

fn rejoin(shared: &Shared, out_rx: &mut mpsc::UnboundedReceiver<Out>) -> Rejoining {
    let mut l = shared.local.lock();
    // Under the lock nothing new is reported: what waits in the channel is older than the
    // rejoin. Its finishes are among the agent's recent ones, its starts are implied by what
    // runs, its returns by the dropped queue; only the output is kept.
    let mut logs = Vec::new();
    while let Ok(o) = out_rx.try_recv() {
        if let Out::Log(log) = o {
            logs.push(log);
        }
    }
    let r = l.agent.rejoin(shared.now());
    if !r.dropped.is_empty() {
        tracing::debug!(
            dropped = r.dropped.len(),
            "queued attempts dropped: the coordinator places them again"
        );
    }
    Rejoining {
        running: r.running.iter().map(|k| convert::key(k.0, k.1)).collect(),
        finished: r
            .resend
            .into_iter()
            .map(|(k, res)| convert::task_result(k, res))
            .collect(),
        logs,
    }
}

async fn session(
    shared: &Arc<Shared>,
    out_rx: &mut mpsc::UnboundedReceiver<Out>,
    shutdown: &mut watch::Receiver<bool>,
    owner: &mut Owner,
) -> Result<SessionEnd> {
    let cfg = &shared.config;
    let channel = cfg.remote.channel().await?;
    let mut client = WorkersClient::with_interceptor(channel, TokenAdd::new(&cfg.remote.token)?)
        .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let back = rejoin(shared, out_rx);
    let held = shared.objects.held();
    let previous_worker = *shared.previous.lock();
    let previous_credential = shared.credential.lock().clone();
    let paused = shared.local.lock().agent.is_paused();
    let reply = client
        .register(proto::RegisterRequest {
            protocol_version: proto::PROTOCOL_VERSION,
            name: cfg.name.clone(),
            hostname: worker_host(),
            hw_class: cfg.hw_class.clone(),
            resources: Some(convert::resources_to_proto(&cfg.offer())),
            gpus: cfg
                .gpus
                .iter()
                .map(|g| proto::Gpu {
                    index: g.index,
                    model: g.model.clone(),
                    mem_bytes: g.mem_bytes,
                })
                .collect(),
            data_addr: advertised(shared.data_bound, &coordinator_addrs(&cfg.remote))
                .await
                .to_string(),
            data_cert: shared.data_cert.clone(),
            price: cfg.price.to_string(),
            as_provider: cfg.as_provider,
            availability: cfg.availability(),
            preemptible: cfg.preemptible,
            unavailable: paused,
            cpu_watts: cfg.cpu_watts,
            running: back.running,
            held,
            previous_worker,
            previous_credential,
            finished: back.finished,
            leaves_in_ms: cfg.leave_at.map(|at| {
                // It starts leaving --grace + 15 s before its time limit (see `session`).
                let margin = cfg.grace + LEAVE_EARLY;
                at.saturating_duration_since(Instant::now() + margin)
                    .as_millis() as u64
            }),
        })
        .await
        // A plain-TCP worker at a TLS coordinator: say so, as a client would.
        .map_err(|s| {
            crate::client::plain_to_tls_hint(&cfg.remote.addr, cfg.remote.tls_ca.is_some(), s)
        })?
        .into_inner();
    if reply.protocol_version != proto::PROTOCOL_VERSION {
        return Err(ClusterError::Version {
            ours: proto::PROTOCOL_VERSION,
            theirs: reply.protocol_version,
        });
    }
    let me = reply.worker;
    *shared.previous.lock() = Some(me);
    *shared.credential.lock() = reply.credential.clone();
    let key = crate::access::parse_key(&reply.data_key)
        .ok_or_else(|| ClusterError::Rpc("the coordinator sent no valid data key".into()))?;
    {
        let mut keys = shared.data_keys.write();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    // The session is opened with this worker's own credential, not the enrolment token.
    let mut client = WorkersClient::with_interceptor(
        cfg.remote.channel().await?,
        TokenAdd::new(&reply.credential)?,
    )
    .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    shared
        .rendezvous_port
        .store(reply.rendezvous_port, std::sync::atomic::Ordering::Relaxed);
    *shared.rendezvous_cert.lock() = reply.rendezvous_cert.clone();
    let heartbeat = Duration::from_millis(reply.heartbeat_ms.max(50));
    tracing::info!(worker = me, "registered with the coordinator");
    if let Some(tx) = &cfg.registered {
        let _ = tx.send(me);
    }

    let (tx, rx) = mpsc::unbounded_channel::<proto::WorkerMessage>();
    // The first message names us (and carries the output written while away).
    let _ = tx.send(proto::WorkerMessage {
        worker: me,
        logs: back.logs,
        ..Default::default()
    });
    let mut inbound = client
        .session(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut beat = tokio::time::interval(heartbeat);
    let mut tail = tokio::time::interval(Duration::from_millis(500));
    let mut look = tokio::time::interval(Duration::from_millis(500));
    // Leaving (drained, SIGTERM): until when it waits for its tasks and the coordinator.
    let mut leaving: Option<tokio::time::Instant> = None;
    // Since when it has had nothing to run or queued (`--idle-timeout`).
    let mut idle_since: Option<Instant> = None;
    let margin = cfg.grace + LEAVE_EARLY;
    let mut said_leaving = false;
    loop {
        if let Some(deadline) = leaving {
            let idle = shared.local.lock().runs.is_empty() && shared.checkpoints.lock().is_empty();
            if idle && !said_leaving {
                // Everything it had to say is queued before this.
                let _ = shared.out.send(Out::Leaving);
                said_leaving = true;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(SessionEnd::Shutdown);
            }
        }
        tokio::select! {
            _ = shutdown.changed(), if leaving.is_none() => {
                if *shutdown.borrow() {
                    say_leaving(cfg, "stopped (SIGTERM or Ctrl-C)");
                    reclaim(shared, "the worker got SIGTERM");
                    leaving = Some(tokio::time::Instant::now() + cfg.grace + LEAVE_EARLY);
                }
            }
            msg = inbound.message() => {
                match msg {
                    Ok(Some(m)) => {
                        let drain = m.drain;
                        on_message(shared, m);
                        if drain && leaving.is_none() {
                            let why = "drained by the coordinator's admin";
                            reclaim(shared, why);
                            say_leaving(cfg, why);
                            leaving = Some(tokio::time::Instant::now() + cfg.grace + LEAVE_EARLY);
                        }
                    }
                    // Leaving, a session that ends is the end (its tasks are stopping).
                    Ok(None) if leaving.is_some() => return Ok(SessionEnd::Shutdown),
                    Ok(None) => return Ok(SessionEnd::Broken("the coordinator closed the session".into())),
                    Err(e) if leaving.is_some() => {
                        tracing::debug!("session ended as it left: {}", e.message());
                        return Ok(SessionEnd::Shutdown);
                    }
                    Err(e) => return Ok(SessionEnd::Broken(e.message().to_string())),
                }
            }
            Some(first) = out_rx.recv() => {
                if tx.send(batch(me, first, out_rx)).is_err() {
                    return Ok(SessionEnd::Broken("the outgoing stream closed".into()));
                }
            }
            _ = look.tick(), if leaving.is_none() => {
                let (paused, idle) = {
                    let l = shared.local.lock();
                    (l.agent.is_paused(), l.runs.is_empty() && l.agent.is_idle())
                };
                match owner.may_work(shared) {
                    Err(why) if !paused => reclaim(shared, &why),
                    Ok(()) if paused => give_work(shared),
                    _ => {}
                }
                idle_since = if idle { idle_since.or(Some(Instant::now())) } else { None };
                let why = match (cfg.idle_timeout, cfg.leave_at) {
                    (Some(t), _) if idle_since.is_some_and(|s| s.elapsed() >= t) => {
                        Some(format!("nothing to run for {}", flotilla_core::duration::format_duration(t)))
                    }
                    (_, Some(at)) if Instant::now() + margin >= at => {
                        Some("its time limit is near (--time-limit)".to_string())
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    reclaim(shared, &why);
                    say_leaving(cfg, &why);
                    leaving = Some(tokio::time::Instant::now() + margin);
                }
            }
            _ = beat.tick() => {
                if tx.send(proto::WorkerMessage { worker: me, ..Default::default() }).is_err() {
                    return Ok(SessionEnd::Broken("the outgoing stream closed".into()));
                }
            }
            _ = tail.tick() => tail_logs(shared),
        }
    }
}

/// Tells the worker's owner why it leaves (see [`WorkerConfig::leaving`]).
fn say_leaving(cfg: &WorkerConfig, why: &str) {
    if let Some(tx) = &cfg.leaving {
        let _ = tx.send(why.to_string());
    }
}

/// One message of what waits to be sent, `first` first (at most 4,096 starts and finishes).
fn batch(me: u32, first: Out, out_rx: &mut mpsc::UnboundedReceiver<Out>) -> proto::WorkerMessage {
    let mut m = proto::WorkerMessage {
        worker: me,
        ..Default::default()
    };
    let add = |o: Out, m: &mut proto::WorkerMessage| match o {
        Out::Started(k) => m.started.push(k),
        Out::Finished(r) => m.finished.push(r),
        Out::Returned(k) => m.returned.push(k),
        Out::Log(l) => m.logs.push(l),
        Out::Available(a) => m.available = Some(a),
        Out::Leaving => m.leaving = true,
        Out::Copied(h) => m.copied.extend(h),
        Out::CopyFailed(k) => m.copy_failed.push(k),
    };
    add(first, &mut m);
    while m.finished.len() + m.started.len() < 4096 {
        match out_rx.try_recv() {
            Ok(o) => add(o, &mut m),
            Err(_) => break,
        }
    }
    // A task that started and finished within this batch needs no start.
    if !m.finished.is_empty() && !m.started.is_empty() {
        let done: HashSet<TaskKey> = m.finished.iter().filter_map(|r| r.task).collect();
        m.started.retain(|k| !done.contains(k));
    }
    m
}

/// Sends what running tasks wrote since the last look (`flotilla logs --follow`).
fn tail_logs(shared: &Shared) {
    let mut l = shared.local.lock();
    for (key, r) in l.runs.iter_mut() {
        for (i, (path, off)) in r.logs.iter_mut().enumerate() {
            if let Some(data) = read_from(path, off, 1 << 20) {
                let _ = shared.out.send(Out::Log(proto::TaskLog {
                    task: Some(convert::key(key.0, key.1)),
                    data,
                    stderr: i == 1,
                }));
            }
        }
    }
}

/// Reads at most `max` new bytes of `path` from `*off`, advancing it.
fn read_from(path: &Path, off: &mut u64, max: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    // One stat for the common case of nothing new (most tasks print nothing).
    let len = std::fs::metadata(path).ok()?.len();
    if len <= *off {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::Start(*off)).ok()?;
    let n = (len - *off).min(max);
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf).ok()?;
    *off += n;
    Some(buf)
}

fn on_message(shared: &Arc<Shared>, m: proto::CoordinatorMessage) {
    for &job in &m.forget {
        // A removed job: its objects (those serving no other job) and its logs go.
        let n = shared.objects.forget_job(job);
        let logs = shared.config.work_dir.join("logs");
        let prefix = format!("{job}-");
        if let Ok(rd) = std::fs::read_dir(&logs) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        tracing::info!(job, objects = n, "removed job forgotten");
    }
    for order in m.copy {
        // A leaving peer's outputs: fetched off the session's task (they may take a while).
        let sh = shared.clone();
        tokio::spawn(async move {
            let key = order.task.unwrap_or_default();
            let done = match crate::objects::copy_in(&sh.objects, &order).await {
                Ok(held) => Out::Copied(held),
                Err(e) => {
                    tracing::warn!(
                        job = key.job,
                        task = key.task,
                        "copying a leaving worker's outputs: {e}"
                    );
                    Out::CopyFailed(key)
                }
            };
            let _ = sh.out.send(done);
        });
    }
    let cancel: Vec<Attempt> = m.cancel.iter().map(convert::task_key).collect();
    let retract: Vec<Attempt> = m.retract.iter().map(convert::task_key).collect();
    let assign = m.assign.into_iter().filter_map(convert::work).collect();
    let mut l = shared.local.lock();
    let Local { agent, runs } = &mut *l;
    let cmds = agent.message(&cancel, &retract, assign, shared.now());
    shared.apply(runs, cmds);
}

fn log_paths(work: &Path, k: &TaskKey) -> (PathBuf, PathBuf) {
    let dir = work.join("logs");
    (
        dir.join(format!("{}-{}-{}.out", k.job, k.task, k.attempt)),
        dir.join(format!("{}-{}-{}.err", k.job, k.task, k.attempt)),
    )
}

fn failed(message: String, retryable: bool) -> AttemptResult {
    AttemptResult {
        outcome: AttemptOutcome::Failed { message, retryable },
        usage: Default::default(),
        outputs: Vec::new(),
        variant: None,
    }
}

/// Runs one attempt and turns what happened into a result.
fn execute(
    sh: &Shared,
    a: &Assignment,
    key: &TaskKey,
    cancel: &CancelHandle,
    logs: &(PathBuf, PathBuf),
    preempt: &std::sync::atomic::AtomicBool,
) -> AttemptResult {
    if let Some(dir) = logs.0.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return failed(format!("worker cannot create {}: {e}", dir.display()), true);
        }
    }
    // Where the task runs: the shared job folder, or a sandbox with its inputs staged.
    let root = if a.transfer {
        let coordinator = Remote {
            token: sh.credential.lock().clone(),
            ..sh.config.remote.clone()
        };
        let started = Instant::now();
        match crate::objects::stage_inputs(&sh.objects, &sh.config.work_dir, a, &coordinator) {
            Ok(dir) => {
                let bytes = a
                    .inputs
                    .iter()
                    .filter_map(|i| i.object.as_ref())
                    .map(|o| o.size)
                    .sum();
                sh.staged.lock().insert(
                    crate::convert::task_key(key),
                    (started.elapsed().as_secs_f64(), bytes),
                );
                dir
            }
            Err(e) => return failed(format!("staging inputs: {e}"), true),
        }
    } else {
        PathBuf::from(&a.job_dir)
    };
    // The coordinator checked these at submit; a worker checks again before joining them.
    for (what, p) in [("cwd", &a.cwd), ("wasm module", &a.wasm_module)] {
        if !p.is_empty() {
            if let Err(e) = crate::objects::safe_relative(p) {
                return failed(format!("{what}: {e}"), false);
            }
        }
    }
    let cwd = if a.cwd.is_empty() {
        root.clone()
    } else {
        root.join(&a.cwd)
    };
    // In transfer staging the attempt's folder holds only the staged inputs: the `cwd` is
    // made there (in shared staging it is the user's folder, which must exist).
    if a.transfer && !cwd.is_dir() {
        if let Err(e) = std::fs::create_dir_all(&cwd) {
            return failed(
                format!(
                    "cwd {:?}: cannot create it in the attempt's folder: {e}",
                    a.cwd
                ),
                false,
            );
        }
    }
    let rendezvous = a.gang.as_ref().map(|g| {
        let port = sh
            .rendezvous_port
            .load(std::sync::atomic::Ordering::Relaxed);
        flotilla_exec::GangEnv {
            rank: g.rank,
            size: g.size,
            rendezvous: format!("{}:{port}/{}", sh.config.remote.host(), g.key),
            rendezvous_cert: sh.rendezvous_cert.lock().clone(),
            // Zero: a coordinator that does not send them.
            local: (g.local_size > 0).then_some((g.local_rank, g.local_size)),
            master: u16::try_from(g.master_port)
                .ok()
                .filter(|p| *p > 0 && !g.master_addr.is_empty())
                .map(|p| (g.master_addr.clone(), p)),
        }
    });
    // A worker that manages GPUs hides them from a task given none.
    let gpus = (!a.gpu_indices.is_empty() || !sh.config.gpus.is_empty())
        .then_some(a.gpu_indices.as_slice());
    let mut env = flotilla_exec::TaskEnv {
        job: &a.job_name,
        job_id: key.job,
        task: &a.name,
        attempt: key.attempt,
        index: a.index,
        gang: rendezvous,
        gpus,
    }
    .vars();
    env.extend(a.env.iter().map(|e| (e.name.clone(), e.value.clone())));
    let timeout = a.timeout_ms.map(Duration::from_millis);
    // A transfer sandbox is this attempt's alone: its size is watched (`--max-sandbox`).
    let watch = match (&sh.sandbox_watch, a.transfer) {
        (Some(w), true) => Some(w.watch(&root, cancel)),
        _ => None,
    };
    // The held GPUs by PCI address (all of them, or none measured).
    let pci: Option<Vec<String>> = a
        .gpu_indices
        .iter()
        .map(|i| {
            sh.config
                .gpus
                .iter()
                .find(|g| g.index == *i)
                .and_then(|g| g.pci_bus_id.clone())
        })
        .collect();
    let meter = crate::energy::Meter::start(pci.as_deref().unwrap_or(&[]));
    let outcome = if !a.wasm_module.is_empty() {
        let runner = match &sh.wasm {
            Ok(r) => r,
            Err(why) => return failed(format!("this worker cannot run wasm tasks: {why}"), false),
        };
        let spec = WasmSpec {
            module: root.join(&a.wasm_module),
            entry: if a.wasm_entry.is_empty() {
                "_start".into()
            } else {
                a.wasm_entry.clone()
            },
            args: a.wasm_args.clone(),
            env,
            preopen: Some((root.clone(), ".".into())),
            fuel: a.wasm_fuel,
            // Every module has a memory and a time limit: the job's within this worker's
            // maxima, or the defaults.
            memory_bytes: Some(
                a.wasm_memory
                    .unwrap_or(DEFAULT_WASM_MEMORY)
                    .min(sh.config.wasm_max_memory),
            ),
            timeout: Some(
                timeout
                    .unwrap_or(sh.config.wasm_max_time)
                    .min(sh.config.wasm_max_time),
            ),
            stdout: Output::File(logs.0.clone()),
            stderr: Output::File(logs.1.clone()),
        };
        runner.run(&spec, cancel)
    } else {
        let mut cmd = a.cmd.clone();
        if let Some(p) = cmd.first_mut() {
            // A relative program path is relative to the task's working directory.
            if p.contains('/') && !p.starts_with('/') {
                *p = cwd.join(&*p).display().to_string();
            }
        }
        let mem = a.resources.as_ref().map(|r| r.mem).unwrap_or(0);
        let cpus = a.resources.as_ref().map(|r| r.cpus).unwrap_or(0.0);
        // Only the host's basic variables, never the rest of the worker's own (its token
        // above all), then the task's.
        let mut all = flotilla_exec::host_vars();
        let (sandbox, cgroup) = match &sh.sandboxing {
            Some(sb) => {
                // A gang member needs the network to meet its peers.
                let network = a.gang.is_some()
                    || (sh.config.allow_network
                        && a.resources.as_ref().is_some_and(|r| {
                            r.custom
                                .iter()
                                .any(|c| c.name == flotilla_core::NETWORK && c.amount > 0.0)
                        }));
                // Inside, /tmp is the sandbox's own and $HOME is not there.
                all.retain(|(k, _)| k != "TMPDIR" && k != "HOME");
                all.push(("TMPDIR".into(), "/tmp".into()));
                all.push(("HOME".into(), "/tmp".into()));
                let spec = flotilla_exec::SandboxSpec {
                    bwrap: sb.bwrap.clone(),
                    writable: root.clone(),
                    network,
                    netns: if network {
                        None
                    } else {
                        sb.netns.as_ref().map(flotilla_exec::EmptyNetns::fd)
                    },
                    devices: gpu_devices(&a.gpu_indices),
                    etc: sb.etc.clone(),
                    holder: sb.holder.as_ref().map(|(_, r)| r.clone()),
                };
                let cgroup = sb.cgroups.as_ref().map(|parent| flotilla_exec::CgroupSpec {
                    mem_max: (mem > 0).then_some(mem),
                    cpu_max: (cpus > 0.0).then_some(cpus),
                    pids_max: Some(sh.config.task_pids),
                    ..flotilla_exec::CgroupSpec::new(
                        parent,
                        format!("{}-{}-{}", key.job, key.task, key.attempt),
                    )
                });
                (Some(spec), cgroup)
            }
            None => (None, None),
        };
        all.extend(env);
        if let Some(g) = &sh.guard {
            // So that the guard finds the task even before it is registered.
            all.push(g.mark());
        }
        // Without a cgroup, a sandboxed task's processes are capped by RLIMIT_NPROC (which
        // counts all of its user's processes; root is not bound by it).
        // SAFETY: getuid has no preconditions.
        let root_user = unsafe { libc::getuid() } == 0;
        let nproc =
            (sandbox.is_some() && cgroup.is_none() && !root_user).then_some(sh.config.task_pids);
        let spec = ProcessSpec {
            cmd,
            cwd: cwd.clone(),
            env: all,
            clear_env: true,
            timeout,
            kill_grace: Duration::from_secs(2),
            stdout: Output::File(logs.0.clone()),
            stderr: Output::File(logs.1.clone()),
            limits: Limits {
                // A cgroup's memory limit covers the whole tree; RLIMIT_AS otherwise.
                mem_bytes: (mem > 0 && cgroup.is_none()).then_some(mem),
                processes: nproc,
                // No one file past the sandbox's cap (the watcher sees the sum).
                file_bytes: sh
                    .sandbox_watch
                    .as_ref()
                    .filter(|_| a.transfer)
                    .map(|w| w.cap()),
                ..Limits::default()
            },
            cgroup,
            sandbox,
        };
        flotilla_exec::run_process_guarded(&spec, cancel, sh.guard.as_ref())
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return failed(e.to_string(), false),
    };
    if let (Some(size), Some(w)) = (watch.as_ref().and_then(|w| w.over()), &sh.sandbox_watch) {
        let grew = if size == u64::MAX {
            "holds too many files to measure".to_string()
        } else {
            format!("grew to {size} bytes")
        };
        return failed(
            format!(
                "the task's folder {grew}, past this worker's --max-sandbox ({} bytes)",
                w.cap()
            ),
            false,
        );
    }
    // A file that reached the cap: SIGXFSZ kills the writer (a shell reports 128 + 25).
    if let (Some(w), Some(_)) = (&sh.sandbox_watch, &watch) {
        let how = match outcome.termination {
            Termination::Signaled(libc::SIGXFSZ) => Some("killed by SIGXFSZ"),
            Termination::Exited(c) if c == 128 + libc::SIGXFSZ => {
                Some("exited with code 153, 128 + SIGXFSZ")
            }
            _ => None,
        };
        if let Some(how) = how {
            return failed(
                format!(
                    "{how}: a file of the task reached this worker's --max-sandbox ({} bytes)",
                    w.cap()
                ),
                false,
            );
        }
        // The writer got SIGXFSZ but the task went on (a shell running the next command)
        // and ended well: the file is cut at the cap, which is no success (it passed as
        // one, the file silently truncated).
        if crate::sandbox_watch::largest_file(&root) >= w.cap() {
            return failed(
                format!(
                    "a file of the task reached this worker's --max-sandbox ({} bytes) and \
                     was cut there (its writer got SIGXFSZ; the task went on)",
                    w.cap()
                ),
                false,
            );
        }
    }
    drop(watch);
    let gpus = a.resources.as_ref().map_or(0.0, |r| r.gpus);
    let (energy, estimated) = meter.finish(
        outcome.usage.cpu_seconds,
        gpus,
        outcome.usage.wall_seconds,
        sh.config.cpu_watts,
    );
    let usage = crate::state::Usage {
        cpu_seconds: outcome.usage.cpu_seconds,
        peak_rss_bytes: outcome.usage.peak_rss_bytes,
        wall_seconds: sh.config.fault.after_task(outcome.usage.wall_seconds),
        energy_j: Some(energy),
        energy_estimated: estimated,
        fuel: outcome.usage.fuel,
    };
    let end = |outcome: AttemptOutcome| AttemptResult {
        outcome,
        usage,
        outputs: Vec::new(),
        variant: None,
    };
    if matches!(outcome.termination, Termination::Cancelled) {
        return end(AttemptOutcome::Cancelled);
    }
    if !outcome.success() && stopped_with_the_worker(&outcome.termination, preempt) {
        // Preempted (the caller keeps its checkpoint), not failed.
        return end(AttemptOutcome::Cancelled);
    }
    if !outcome.success() {
        return end(AttemptOutcome::Failed {
            message: outcome.describe(),
            retryable: true,
        });
    }
    sh.config.fault.before_outputs(&root, &a.outputs);
    // Declared outputs must exist; in transfer staging they are hashed and kept here.
    match crate::objects::collect_outputs(&sh.objects, &root, &a.outputs, a.transfer, Some(*key)) {
        Ok(outputs) => AttemptResult {
            outputs: outputs.iter().map(convert::object_from).collect(),
            variant: (!a.variant.is_empty()).then(|| a.variant.clone()),
            ..end(AttemptOutcome::Succeeded)
        },
        Err(e) => {
            // A full store is this worker's state, not the task's fault: another may run it.
            let retryable = matches!(
                e,
                ClusterError::StoreFull { .. } | ClusterError::ObjectTooLarge { .. }
            );
            // Said, as "no retries left" is of an exit code: the task ran to its end, and
            // would again without writing what it declares.
            let message = if matches!(e, ClusterError::MissingOutput(_)) {
                format!("{e} (not retried: the task ran to its end without it)")
            } else {
                e.to_string()
            };
            end(AttemptOutcome::Failed { retryable, message })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_bound_to_every_interface_advertises_its_address_toward_the_coordinator() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().expect("an address");
        let coordinator =
            coordinator_addrs(&Remote::new("http://127.0.0.1:7070/, 127.0.0.1:7071", "t"));
        assert_eq!(coordinator, ["127.0.0.1:7070", "127.0.0.1:7071"]);
        assert_eq!(
            advertised(at("0.0.0.0:5005"), &coordinator).await,
            at("127.0.0.1:5005")
        );
        // An address given is advertised as it is.
        assert_eq!(
            advertised(at("127.0.0.2:5005"), &coordinator).await,
            at("127.0.0.2:5005")
        );
    }
}
