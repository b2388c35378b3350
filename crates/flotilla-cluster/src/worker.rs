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

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_exec::{CancelHandle, Limits, Output, ProcessSpec, Termination, WasmRunner, WasmSpec};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::auth::TokenAdd;
use crate::error::{ClusterError, Result};
use crate::objects::ObjectStore;
use crate::proto::workers_client::WorkersClient;
use crate::proto::{self, Assignment, TaskKey, TaskResult};
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
}

impl WorkerConfig {
    /// A config with this machine's defaults: all cores, no GPUs, work dir under the temp dir.
    pub fn local(remote: Remote) -> Self {
        let host = hostname();
        Self {
            remote,
            name: host.clone(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get() as f64)
                .unwrap_or(1.0),
            mem: total_memory(),
            gpus: Vec::new(),
            custom: Vec::new(),
            hw_class: default_hw_class(),
            work_dir: std::env::temp_dir().join(format!("flotilla-worker-{}", std::process::id())),
            data_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
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

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
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

/// Free resources of the worker.
#[derive(Clone, Debug)]
struct Free {
    cpus: f64,
    mem: u64,
    /// Free fraction of each GPU, by position in `WorkerConfig::gpus`.
    gpus: Vec<f64>,
    gpu_mem: Vec<u64>,
    custom: HashMap<String, f64>,
}

const EPS: f64 = 1e-9;

impl Free {
    fn fits(&self, r: &proto::ResourceSet, gpu_idx: &[u32], gpus: &[WorkerGpu]) -> bool {
        if r.cpus > self.cpus + EPS || (r.mem > 0 && self.mem < r.mem && self.mem != u64::MAX) {
            return false;
        }
        for c in &r.custom {
            if self.custom.get(&c.name).copied().unwrap_or(0.0) + EPS < c.amount {
                return false;
            }
        }
        let per_gpu = per_gpu_share(r.gpus, gpu_idx.len());
        for i in gpu_idx {
            let Some(pos) = gpus.iter().position(|g| g.index == *i) else {
                return false;
            };
            if self.gpus[pos] + EPS < per_gpu || self.gpu_mem[pos] < r.gpu_mem {
                return false;
            }
        }
        true
    }
    fn take(&mut self, r: &proto::ResourceSet, gpu_idx: &[u32], gpus: &[WorkerGpu], sign: f64) {
        self.cpus += sign * r.cpus;
        if self.mem != u64::MAX {
            if sign < 0.0 {
                self.mem = self.mem.saturating_sub(r.mem);
            } else {
                self.mem = self.mem.saturating_add(r.mem);
            }
        }
        for c in &r.custom {
            *self.custom.entry(c.name.clone()).or_insert(0.0) += sign * c.amount;
        }
        let per_gpu = per_gpu_share(r.gpus, gpu_idx.len());
        for i in gpu_idx {
            if let Some(pos) = gpus.iter().position(|g| g.index == *i) {
                self.gpus[pos] += sign * per_gpu;
                if sign < 0.0 {
                    self.gpu_mem[pos] = self.gpu_mem[pos].saturating_sub(r.gpu_mem);
                } else {
                    self.gpu_mem[pos] = self.gpu_mem[pos].saturating_add(r.gpu_mem);
                }
            }
        }
    }
}

fn per_gpu_share(gpus: f64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else if gpus < 1.0 {
        gpus
    } else {
        1.0
    }
}

struct Running {
    cancel: CancelHandle,
    logs: [(PathBuf, u64); 2],
}

/// Mutable state of the agent, shared by the session and the task threads.
struct Local {
    free: Free,
    queue: VecDeque<Assignment>,
    running: HashMap<(u64, u32, u32), Running>,
    /// Results sent recently, re-sent after a reconnect (the coordinator drops duplicates).
    recent: VecDeque<(Instant, TaskResult)>,
    /// Attempts that succeeded here lately, for chained assignments (`after`): a set and
    /// its insertion order, capped at [`SUCCEEDED_KEPT`].
    succeeded: std::collections::HashSet<(u64, u32, u32)>,
    succeeded_order: VecDeque<(u64, u32, u32)>,
}

/// How many recent successes a worker remembers for chained assignments.
const SUCCEEDED_KEPT: usize = 4096;

enum Out {
    Started(TaskKey),
    Finished(TaskResult),
    Returned(TaskKey),
    Log(proto::TaskLog),
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
    config: WorkerConfig,
    local: Mutex<Local>,
    out: mpsc::UnboundedSender<Out>,
    wasm: Option<WasmRunner>,
    objects: Arc<ObjectStore>,
    data_addr: String,
    /// The coordinator's rendezvous port for gangs (0 before registering or when none).
    rendezvous_port: std::sync::atomic::AtomicU32,
}

fn key3(k: &TaskKey) -> (u64, u32, u32) {
    (k.job, k.task, k.attempt)
}

/// Runs a worker until `shutdown` turns true: connects (retrying while the coordinator is
/// unreachable), registers, runs tasks, reconnects after a broken session.
pub async fn run_worker(config: WorkerConfig, mut shutdown: watch::Receiver<bool>) -> Result<()> {
    std::fs::create_dir_all(&config.work_dir).map_err(|e| ClusterError::io(&config.work_dir, e))?;
    let objects = Arc::new(ObjectStore::open(&config.work_dir.join("objects"))?);
    let data = crate::framed::serve_framed(
        config.data_listen,
        objects.clone(),
        config.remote.token.clone(),
    )
    .await?;
    let data_addr = data.to_string();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Out>();
    let wasm = match WasmRunner::new() {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("wasm tasks disabled: {e}");
            None
        }
    };
    let free = Free {
        cpus: config.cpus,
        mem: if config.mem == 0 {
            u64::MAX
        } else {
            config.mem
        },
        gpus: vec![1.0; config.gpus.len()],
        gpu_mem: config.gpus.iter().map(|g| g.mem_bytes).collect(),
        custom: config.custom.iter().cloned().collect(),
    };
    let shared = Arc::new(Shared {
        pool: Pool::new(),
        previous: Mutex::new(None),
        config,
        local: Mutex::new(Local {
            free,
            queue: VecDeque::new(),
            running: HashMap::new(),
            recent: VecDeque::new(),
            succeeded: std::collections::HashSet::new(),
            succeeded_order: VecDeque::new(),
        }),
        out: out_tx,
        wasm,
        objects,
        data_addr,
        rendezvous_port: std::sync::atomic::AtomicU32::new(0),
    });
    let mut backoff = Duration::from_millis(100);
    loop {
        if *shutdown.borrow() {
            break;
        }
        match session(&shared, &mut out_rx, &mut shutdown).await {
            Ok(SessionEnd::Shutdown) => break,
            Ok(SessionEnd::Broken(why)) => {
                tracing::warn!("session with the coordinator ended: {why}; reconnecting");
                backoff = Duration::from_millis(100);
            }
            Err(e @ ClusterError::Version { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!("cannot reach the coordinator: {e}; retrying in {backoff:?}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    // Stop what still runs.
    let running: Vec<CancelHandle> = shared
        .local
        .lock()
        .running
        .values()
        .map(|r| r.cancel.clone())
        .collect();
    for c in running {
        c.cancel();
    }
    Ok(())
}

enum SessionEnd {
    Shutdown,
    Broken(String),
}

fn resource_set(cfg: &WorkerConfig) -> proto::ResourceSet {
    proto::ResourceSet {
        cpus: cfg.cpus,
        gpus: cfg.gpus.len() as f64,
        mem: cfg.mem,
        gpu_mem: cfg.gpus.iter().map(|g| g.mem_bytes).max().unwrap_or(0),
        custom: cfg
            .custom
            .iter()
            .map(|(n, a)| proto::CustomResource {
                name: n.clone(),
                amount: *a,
            })
            .collect(),
    }
}

async fn session(
    shared: &Arc<Shared>,
    out_rx: &mut mpsc::UnboundedReceiver<Out>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<SessionEnd> {
    let cfg = &shared.config;
    let channel = cfg.remote.channel().await?;
    let mut client = WorkersClient::with_interceptor(channel, TokenAdd::new(&cfg.remote.token)?)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20);
    let (running, resend) = {
        let mut l = shared.local.lock();
        // Attempts queued but not started are dropped: the coordinator places again every
        // attempt this worker does not report running (it declared the old session lost,
        // or, after its own restart, learns it from `previous_worker`).
        l.queue.clear();
        let now = Instant::now();
        while l
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(60))
        {
            l.recent.pop_front();
        }
        let running: Vec<TaskKey> = l
            .running
            .keys()
            .map(|(j, t, a)| TaskKey {
                job: *j,
                task: *t,
                attempt: *a,
            })
            .collect();
        (
            running,
            l.recent.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
        )
    };
    // What finished while there was no session is reported with the registration, before
    // the coordinator decides which of the old id's attempts never reached us. (A task that
    // is no longer in `running` has already queued its result: both happen under the lock.)
    let mut resend = resend;
    let mut carried_logs = Vec::new();
    while let Ok(o) = out_rx.try_recv() {
        match o {
            Out::Finished(r) => {
                shared
                    .local
                    .lock()
                    .recent
                    .push_back((Instant::now(), r.clone()));
                resend.push(r);
            }
            Out::Log(l) => carried_logs.push(l),
            // Starts are implied by `running`; returns by the cleared queue.
            Out::Started(_) | Out::Returned(_) => {}
        }
    }
    let held = shared.objects.held();
    let resources = resource_set(cfg);
    let previous_worker = *shared.previous.lock();
    let reply = client
        .register(proto::RegisterRequest {
            protocol_version: proto::PROTOCOL_VERSION,
            name: cfg.name.clone(),
            hostname: hostname(),
            hw_class: cfg.hw_class.clone(),
            resources: Some(resources),
            gpus: cfg
                .gpus
                .iter()
                .map(|g| proto::Gpu {
                    index: g.index,
                    model: g.model.clone(),
                    mem_bytes: g.mem_bytes,
                })
                .collect(),
            data_addr: shared.data_addr.clone(),
            running,
            held,
            previous_worker,
            finished: resend,
        })
        .await?
        .into_inner();
    if reply.protocol_version != proto::PROTOCOL_VERSION {
        return Err(ClusterError::Version {
            ours: proto::PROTOCOL_VERSION,
            theirs: reply.protocol_version,
        });
    }
    let me = reply.worker;
    *shared.previous.lock() = Some(me);
    shared
        .rendezvous_port
        .store(reply.rendezvous_port, std::sync::atomic::Ordering::Relaxed);
    let heartbeat = Duration::from_millis(reply.heartbeat_ms.max(50));
    tracing::info!(worker = me, "registered with the coordinator");

    let (tx, rx) = mpsc::unbounded_channel::<proto::WorkerMessage>();
    // The first message names us (and carries the output written while away).
    let _ = tx.send(proto::WorkerMessage {
        worker: me,
        logs: carried_logs,
        ..Default::default()
    });
    let mut inbound = client
        .session(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut beat = tokio::time::interval(heartbeat);
    let mut tail = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    return Ok(SessionEnd::Shutdown);
                }
            }
            msg = inbound.message() => {
                match msg {
                    Ok(Some(m)) => on_message(shared, m),
                    Ok(None) => return Ok(SessionEnd::Broken("the coordinator closed the session".into())),
                    Err(e) => return Ok(SessionEnd::Broken(e.message().to_string())),
                }
            }
            Some(first) = out_rx.recv() => {
                let mut m = proto::WorkerMessage { worker: me, ..Default::default() };
                let add = |o: Out, m: &mut proto::WorkerMessage| match o {
                    Out::Started(k) => m.started.push(k),
                    Out::Finished(r) => m.finished.push(r),
                    Out::Returned(k) => m.returned.push(k),
                    Out::Log(l) => m.logs.push(l),
                };
                add(first, &mut m);
                while m.finished.len() + m.started.len() < 4096 {
                    match out_rx.try_recv() {
                        Ok(o) => add(o, &mut m),
                        Err(_) => break,
                    }
                }
                if !m.finished.is_empty() {
                    // A task that started and finished within this batch needs no start.
                    if !m.started.is_empty() {
                        let done: std::collections::HashSet<(u64, u32, u32)> =
                            m.finished.iter().filter_map(|r| r.task.as_ref().map(key3)).collect();
                        m.started.retain(|k| !done.contains(&key3(k)));
                    }
                    let mut l = shared.local.lock();
                    let now = Instant::now();
                    for r in &m.finished {
                        l.recent.push_back((now, r.clone()));
                    }
                    while l.recent.front().is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(60)) {
                        l.recent.pop_front();
                    }
                }
                if tx.send(m).is_err() {
                    return Ok(SessionEnd::Broken("the outgoing stream closed".into()));
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

/// Sends what running tasks wrote since the last look (`flotilla logs --follow`).
fn tail_logs(shared: &Shared) {
    let mut l = shared.local.lock();
    for ((job, task, attempt), r) in l.running.iter_mut() {
        for (i, (path, off)) in r.logs.iter_mut().enumerate() {
            if let Some(data) = read_from(path, off, 1 << 20) {
                let _ = shared.out.send(Out::Log(proto::TaskLog {
                    task: Some(TaskKey {
                        job: *job,
                        task: *task,
                        attempt: *attempt,
                    }),
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
    {
        let mut l = shared.local.lock();
        for k in &m.cancel {
            let key = key3(k);
            if let Some(r) = l.running.get(&key) {
                r.cancel.cancel();
            } else if let Some(pos) = l
                .queue
                .iter()
                .position(|a| a.task.as_ref().map(key3) == Some(key))
            {
                l.queue.remove(pos);
                let _ = shared.out.send(Out::Finished(TaskResult {
                    task: Some(*k),
                    outcome: proto::task_result::Outcome::Cancelled as i32,
                    message: "cancelled before it started".into(),
                    ..Default::default()
                }));
            }
        }
        for k in &m.retract {
            let key = key3(k);
            if let Some(pos) = l
                .queue
                .iter()
                .position(|a| a.task.as_ref().map(key3) == Some(key))
            {
                l.queue.remove(pos);
                let _ = shared.out.send(Out::Returned(*k));
            }
        }
        l.queue.extend(m.assign);
    }
    start_ready(shared);
}

/// Starts every queued task whose resources are free.
fn start_ready(shared: &Arc<Shared>) {
    let mut l = shared.local.lock();
    let gpus = &shared.config.gpus;
    let mut i = 0;
    while i < l.queue.len() {
        let a = &l.queue[i];
        // Chained: waits until its predecessor's attempt succeeded here.
        if let Some(after) = &a.after {
            if !l.succeeded.contains(&key3(after)) {
                i += 1;
                continue;
            }
        }
        let r = a.resources.clone().unwrap_or_default();
        if !l.free.fits(&r, &a.gpu_indices, gpus) {
            i += 1;
            continue;
        }
        let Some(a) = l.queue.remove(i) else { break };
        let Some(key) = a.task else { continue };
        l.free.take(&r, &a.gpu_indices, gpus, -1.0);
        let cancel = CancelHandle::new();
        let logs = log_paths(&shared.config.work_dir, &key);
        l.running.insert(
            key3(&key),
            Running {
                cancel: cancel.clone(),
                logs: [(logs.0.clone(), 0), (logs.1.clone(), 0)],
            },
        );
        let _ = shared.out.send(Out::Started(key));
        let sh = shared.clone();
        shared.pool.spawn(move || {
            let result = execute(&sh, &a, &key, &cancel, &logs);
            let r = a.resources.clone().unwrap_or_default();
            {
                let mut l = sh.local.lock();
                // Final log bytes, then the result.
                if let Some(run) = l.running.remove(&key3(&key)) {
                    for (i, (path, mut off)) in run.logs.into_iter().enumerate() {
                        while let Some(data) = read_from(&path, &mut off, 4 << 20) {
                            let _ = sh.out.send(Out::Log(proto::TaskLog {
                                task: Some(key),
                                data,
                                stderr: i == 1,
                            }));
                        }
                        let _ = std::fs::remove_file(&path);
                    }
                }
                l.free.take(&r, &a.gpu_indices, &sh.config.gpus, 1.0);
                if result.outcome == proto::task_result::Outcome::Succeeded as i32 {
                    let k = key3(&key);
                    if l.succeeded.insert(k) {
                        l.succeeded_order.push_back(k);
                        if l.succeeded_order.len() > SUCCEEDED_KEPT {
                            if let Some(old) = l.succeeded_order.pop_front() {
                                l.succeeded.remove(&old);
                            }
                        }
                    }
                }
                // Sent under the lock: the coordinator must hear of this finish before
                // any start that uses what it freed.
                let _ = sh.out.send(Out::Finished(result));
            }
            start_ready(&sh);
        });
    }
}

fn log_paths(work: &Path, k: &TaskKey) -> (PathBuf, PathBuf) {
    let dir = work.join("logs");
    (
        dir.join(format!("{}-{}-{}.out", k.job, k.task, k.attempt)),
        dir.join(format!("{}-{}-{}.err", k.job, k.task, k.attempt)),
    )
}

fn failed(key: &TaskKey, message: String, retryable: bool) -> TaskResult {
    TaskResult {
        task: Some(*key),
        outcome: proto::task_result::Outcome::Failed as i32,
        message,
        retryable,
        ..Default::default()
    }
}

/// Runs one attempt and turns what happened into a result.
fn execute(
    sh: &Shared,
    a: &Assignment,
    key: &TaskKey,
    cancel: &CancelHandle,
    logs: &(PathBuf, PathBuf),
) -> TaskResult {
    if let Some(dir) = logs.0.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return failed(
                key,
                format!("worker cannot create {}: {e}", dir.display()),
                true,
            );
        }
    }
    // Where the task runs: the shared job folder, or a sandbox with its inputs staged.
    let root = if a.transfer {
        match crate::objects::stage_inputs(&sh.objects, &sh.config.work_dir, a, &sh.config.remote) {
            Ok(dir) => dir,
            Err(e) => return failed(key, format!("staging inputs: {e}"), true),
        }
    } else {
        PathBuf::from(&a.job_dir)
    };
    let cwd = if a.cwd.is_empty() {
        root.clone()
    } else {
        root.join(&a.cwd)
    };
    let mut env: Vec<(String, String)> = vec![
        ("FLOTILLA_JOB".into(), a.job_name.clone()),
        ("FLOTILLA_JOB_ID".into(), key.job.to_string()),
        ("FLOTILLA_TASK".into(), a.name.clone()),
        ("FLOTILLA_ATTEMPT".into(), key.attempt.to_string()),
    ];
    if let Some(i) = a.index {
        env.push(("FLOTILLA_INDEX".into(), i.to_string()));
    }
    if let Some(g) = &a.gang {
        env.push(("FLOTILLA_RANK".into(), g.rank.to_string()));
        env.push(("FLOTILLA_WORLD_SIZE".into(), g.size.to_string()));
        let port = sh
            .rendezvous_port
            .load(std::sync::atomic::Ordering::Relaxed);
        env.push((
            "FLOTILLA_RENDEZVOUS".into(),
            format!("{}:{port}/{}", sh.config.remote.host(), g.key),
        ));
    }
    if !a.gpu_indices.is_empty() {
        let list: Vec<String> = a.gpu_indices.iter().map(|i| i.to_string()).collect();
        env.push(("CUDA_VISIBLE_DEVICES".into(), list.join(",")));
    } else if a.resources.as_ref().is_some_and(|r| r.gpus == 0.0) && !sh.config.gpus.is_empty() {
        env.push(("CUDA_VISIBLE_DEVICES".into(), String::new()));
    }
    env.extend(a.env.iter().map(|e| (e.name.clone(), e.value.clone())));
    let timeout = a.timeout_ms.map(Duration::from_millis);
    let outcome = if !a.wasm_module.is_empty() {
        let Some(runner) = &sh.wasm else {
            return failed(key, "this worker cannot run wasm tasks".into(), false);
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
            memory_bytes: a.wasm_memory,
            timeout,
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
        let spec = ProcessSpec {
            cmd,
            cwd: cwd.clone(),
            env,
            clear_env: false,
            timeout,
            kill_grace: Duration::from_secs(2),
            stdout: Output::File(logs.0.clone()),
            stderr: Output::File(logs.1.clone()),
            limits: Limits {
                mem_bytes: (mem > 0).then_some(mem),
                cpu_seconds: None,
                open_files: None,
            },
            cgroup: None,
        };
        flotilla_exec::run_process(&spec, cancel)
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return failed(key, e.to_string(), false),
    };
    let usage = Some(proto::Usage {
        cpu_seconds: outcome.usage.cpu_seconds,
        peak_rss_bytes: outcome.usage.peak_rss_bytes,
        wall_seconds: outcome.usage.wall_seconds,
    });
    if matches!(outcome.termination, Termination::Cancelled) {
        return TaskResult {
            task: Some(*key),
            outcome: proto::task_result::Outcome::Cancelled as i32,
            message: "cancelled".into(),
            usage,
            ..Default::default()
        };
    }
    if !outcome.success() {
        let mut r = failed(key, outcome.describe(), true);
        r.usage = usage;
        return r;
    }
    // Declared outputs must exist; in transfer staging they are hashed and kept here.
    let outputs = match crate::objects::collect_outputs(
        &sh.objects,
        &root,
        &a.outputs,
        a.transfer,
        Some(*key),
    ) {
        Ok(o) => o,
        Err(e) => {
            let mut r = failed(key, e.to_string(), false);
            r.usage = usage;
            return r;
        }
    };
    TaskResult {
        task: Some(*key),
        outcome: proto::task_result::Outcome::Succeeded as i32,
        usage,
        outputs,
        variant: a.variant.clone(),
        ..Default::default()
    }
}
