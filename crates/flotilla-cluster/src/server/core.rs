//! The core: the one thread that owns the coordinator's state machine and the journal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::{JobId, TaskId, WorkerId};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::access::{Access, Scope};
use crate::error::{ClusterError, Result};
use crate::journal::Journal;
use crate::proto::{self, PROTOCOL_VERSION};
use crate::state::JournalRecord;
use crate::state::{self, Command, Coordinator, Event, Millis, Notification, TaskRef};

use super::ServerConfig;

pub(super) type Reply<T> = oneshot::Sender<std::result::Result<T, Status>>;

/// What the handlers ask of the core.
pub(super) enum Req {
    Submit {
        spec: flotilla_core::JobSpec,
        /// The spec expanded (off the core thread).
        graph: Box<flotilla_core::TaskGraph>,
        /// The spec as the journal keeps it (written off the core thread).
        toml: String,
        dir: String,
        /// The submitter's tenant (from its token, never from the request).
        tenant: String,
        /// Uploaded job-folder files (transfer staging), already in the store.
        files: Vec<proto::Object>,
        /// The client's id for the submission (`None`: it named none).
        request_id: Option<String>,
        reply: Reply<proto::SubmitReply>,
    },
    Cancel {
        job: JobId,
        scope: Scope,
        reply: Reply<()>,
    },
    Remove {
        job: JobId,
        scope: Scope,
        reply: Reply<()>,
    },
    /// Makes the core panic (tests of its supervision).
    #[cfg(test)]
    Panic,
    Status {
        job: Option<JobId>,
        scope: Scope,
        /// The job's trace (`JobTrace`) instead of its status.
        trace: bool,
        /// At most this many tasks (status; [`state::STATUS_TASKS`] when `None`) or ended
        /// attempts (trace): a page.
        limit: Option<usize>,
        /// The status's first task.
        from: usize,
        /// Only the tasks in these states (all when empty).
        states: Vec<state::TaskState>,
        reply: Reply<String>,
    },
    Outputs {
        job: JobId,
        scope: Scope,
        reply: Reply<proto::OutputsReply>,
    },
    Watch {
        job: JobId,
        scope: Scope,
        tx: Watcher,
    },
    LogInfo {
        job: JobId,
        task: String,
        /// One attempt's (`None`: the latest that ran).
        attempt: Option<u32>,
        scope: Scope,
        reply: Reply<LogInfo>,
    },
    /// The performance model (the dashboard's table), as `scope` may see it.
    Model {
        scope: Scope,
        reply: Reply<String>,
    },
    /// The allocator's round: the work left for each queue's workers, and the live workers.
    AllocView {
        shapes: Vec<(u32, crate::state::WorkerShape)>,
        /// The paused queues, said to jobs waiting with no worker connected.
        note: Option<String>,
        reply: Reply<crate::alloc::CoreView>,
    },
    /// Each live worker's name and the attempts on it (`--pod-deletion-cost`).
    WorkerLoads {
        reply: Reply<Vec<(String, usize)>>,
    },
    Register {
        req: proto::RegisterRequest,
        /// Its id before a reconnect, when its credential proved it.
        previous: Option<WorkerId>,
        /// The provider it enrolled as (its token's) and its price, checked by the handler.
        offer: (Option<String>, flotilla_pool::Price),
        reply: Reply<proto::RegisterReply>,
    },
    /// `flotilla provider list`: the providers with their live workers.
    Providers {
        /// Who asks: a tenant is not shown the providers' token ids.
        scope: Scope,
        providers: Vec<crate::access::ProviderInfo>,
        reply: Reply<String>,
    },
    /// The tenants' quotas changed (a tenant was added).
    Quotas(BTreeMap<String, crate::access::Quota>),
    /// Credits handed to a tenant (journaled before the reply).
    Grant {
        tenant: String,
        amount: flotilla_pool::Credits,
        reply: Reply<()>,
    },
    /// `flotilla budget JOB +N` (journaled before the reply).
    Budget {
        job: JobId,
        scope: Scope,
        amount: flotilla_pool::Credits,
        reply: Reply<String>,
    },
    /// `flotilla retry JOB` (journaled before the reply): how many tasks were put back.
    Retry {
        job: JobId,
        scope: Scope,
        reply: Reply<u64>,
    },
    /// `flotilla admin worker drain NAME`: the ids of the workers told to drain.
    Drain {
        name: String,
        reply: Reply<String>,
    },
    /// `flotilla ledger`: the accounts `scope` sees (`tenant`: only that tenant's).
    Ledger {
        scope: Scope,
        tenant: Option<String>,
        reply: Reply<String>,
    },
    FromWorker(proto::WorkerMessage),
    SessionClosed(WorkerId),
    Stop,
}

/// The most outputs whose ends are kept in memory at once (64 KiB each at most).
const MAX_LOG_TAILS: usize = 4096;
/// Where the kept end of the output logged at `log` is saved while its attempt runs.
fn saved_tail(log: &std::path::Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".tail");
    PathBuf::from(name)
}

fn remove_quietly(path: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("{}: {e}", path.display());
        }
    }
}

/// At start: the kept ends a coordinator saved and did not write (it was killed before
/// their attempts ended) are appended to their logs, as their flush would have; output that
/// comes after keeps an end of its own, written after them. Returns how many.
pub(super) fn recover_log_tails(logs_dir: &std::path::Path) -> usize {
    let mut n = 0;
    let Ok(jobs) = std::fs::read_dir(logs_dir) else {
        return 0;
    };
    for job in jobs.flatten() {
        let Ok(files) = std::fs::read_dir(job.path()) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                remove_quietly(&path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "tail") {
                continue;
            }
            let log = path.with_extension("");
            let r = std::fs::read(&path).and_then(|saved| {
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)?
                    .write_all(&saved)
            });
            match r {
                Ok(()) => {
                    remove_quietly(&path);
                    n += 1;
                }
                Err(e) => tracing::warn!("{}: {e}", path.display()),
            }
        }
    }
    n
}

/// How often the outputs' kept ends are saved beside their logs (`.tail` files).
const TAIL_SAVE: Duration = Duration::from_secs(5);
/// The most bytes of kept ends one save writes (the rest wait for the next).
const TAIL_SAVE_BYTES: usize = 16 << 20;

/// The live workers `flotilla admin worker drain WHO` names: those named `WHO` (several
/// workers of one host share its name), or the one with id `WHO`; `id:WHO` and `name:WHO`
/// say which. A word that is one worker's id and another's name is refused (ids are given
/// afresh on every registration: `w9` may well be another machine's `--name`).
fn drained(
    workers: &[(WorkerId, String)],
    who: &str,
) -> std::result::Result<Vec<WorkerId>, Status> {
    let (by_id, by_name, word) = match who.split_once(':') {
        Some(("id", w)) => (true, false, w),
        Some(("name", w)) => (false, true, w),
        _ => (true, true, who),
    };
    let with_id: Vec<WorkerId> = workers
        .iter()
        .filter(|(id, _)| by_id && id.to_string() == word)
        .map(|(id, _)| *id)
        .collect();
    let named: Vec<WorkerId> = workers
        .iter()
        .filter(|(_, name)| by_name && name == word)
        .map(|(id, _)| *id)
        .collect();
    if let (Some(id), true) = (with_id.first(), named.iter().any(|n| !with_id.contains(n))) {
        let others: Vec<String> = named
            .iter()
            .filter(|n| *n != id)
            .map(ToString::to_string)
            .collect();
        return Err(Status::failed_precondition(format!(
            "{word:?} is the id of worker {id} and the name of {}: say `id:{word}` or \
             `name:{word}`",
            others.join(", ")
        )));
    }
    // Past the refusal, the named are the worker with that id, or there is none.
    let ids = if with_id.is_empty() { named } else { with_id };
    if ids.is_empty() {
        let what = match (by_id, by_name) {
            (true, false) => "with id",
            (false, true) => "named",
            _ => "named, or with id,",
        };
        return Err(Status::not_found(format!("no live worker {what} {word:?}")));
    }
    Ok(ids)
}

/// What a job request answers for a job its sender does not see: exactly what it answers
/// for a job that does not exist. "no job N", the same for an id never given, a job removed
/// and another tenant's (whose existence is not told, nor how many jobs were submitted),
/// with what it may mean (`status` of a removed job said "no job 2", as of one never made).
pub(super) fn no_job(job: JobId) -> Status {
    Status::not_found(format!(
        "no job {} (never submitted, or removed: by `flotilla rm` or the retention of \
         finished jobs; ids are never given twice)",
        job.0
    ))
}

impl Req {
    /// The job a scoped request is about, and the scope it was sent with.
    fn scoped(&self) -> Option<(JobId, &Scope)> {
        match self {
            Req::Cancel { job, scope, .. }
            | Req::Remove { job, scope, .. }
            | Req::Outputs { job, scope, .. }
            | Req::Watch { job, scope, .. }
            | Req::Budget { job, scope, .. }
            | Req::Retry { job, scope, .. }
            | Req::LogInfo { job, scope, .. } => Some((*job, scope)),
            Req::Status {
                job: Some(job),
                scope,
                ..
            } => Some((*job, scope)),
            _ => None,
        }
    }

    /// Answers "no job" (the request's job is not in its sender's scope).
    fn refuse(self, job: JobId) {
        match self {
            Req::Cancel { reply, .. } | Req::Remove { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::Outputs { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::Budget { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::Retry { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::Status { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::LogInfo { reply, .. } => {
                let _ = reply.send(Err(no_job(job)));
            }
            Req::Watch { tx, .. } => {
                let _ = tx.try_send(Err(no_job(job)));
            }
            _ => {}
        }
    }
}

/// Replies sent once the batch they answer is durable.
type AfterCommit = Box<dyn FnOnce(&mut Core) + Send>;

/// A `Watch` stream's sender: bounded, so a client that does not read cannot make the
/// coordinator hold its events without limit.
pub(super) type Watcher = mpsc::Sender<std::result::Result<proto::JobEvent, Status>>;

/// Events a watcher may have unread before it is dropped (its client then sees the stream
/// end, and `Client::wait` watches again from the job's state at that moment).
pub(super) const WATCH_BUFFER: usize = 256;

/// Sends `ev` to every watcher that has room; one that is full or gone is dropped.
fn send_or_drop(ws: &mut Vec<Watcher>, ev: &proto::JobEvent) {
    ws.retain(|tx| match tx.try_send(Ok(ev.clone())) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            tracing::debug!(
                job = ev.job,
                "dropping a watcher that does not read its events"
            );
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    });
}

/// The holder id the coordinator's own object store is ticketed under (no worker has it).
pub(crate) const COORDINATOR_HOLDER: WorkerId = WorkerId(0);

/// Where, among a job's uploads, the checkpoints of its preempted attempts are listed.
const CHECKPOINTS: &str = ".flotilla/checkpoints";

/// How long the rendezvous accepts a gang's key after the gang was assigned.
const GANG_KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Where a task's logs are and whether more may come.
#[derive(Clone, Debug)]
pub(super) struct LogInfo {
    pub(super) out: PathBuf,
    pub(super) err: PathBuf,
    /// The attempt those files are of (0 when the task has not been tried yet).
    pub(super) attempt: u32,
    pub(super) finished: bool,
    /// Whether any attempt of the task ran (one placed on a worker's queue and cancelled
    /// there did not).
    pub(super) ran: bool,
}

/// The thread that owns the state machine.
pub(super) struct Core {
    coord: Coordinator,
    journal: Journal,
    /// The clock: `base` milliseconds since the Unix epoch at `epoch`, then monotonic.
    epoch: Instant,
    base: Millis,
    /// The clock of the last [`JournalRecord::Clock`] this core wrote or replayed.
    journal_clock: Option<Millis>,
    sessions: Arc<Mutex<HashMap<WorkerId, mpsc::Receiver<proto::CoordinatorMessage>>>>,
    /// Each worker's command queue (bounded: a worker that does not read is dropped).
    senders: HashMap<WorkerId, mpsc::Sender<proto::CoordinatorMessage>>,
    /// How many messages a worker's queue holds.
    worker_queue: usize,
    /// Workers whose queue was full: declared lost at the next turn.
    overflowed: Vec<WorkerId>,
    last_seen: HashMap<WorkerId, Instant>,
    /// Leaving workers whose outputs peers are copying before they go: per leaver, the
    /// tasks still being copied and the peer copying each ([`Coordinator::handoff`]).
    handoffs: HashMap<WorkerId, HashMap<TaskRef, WorkerId>>,
    watchers: HashMap<JobId, Vec<Watcher>>,
    logs_dir: PathBuf,
    /// The most bytes kept of each stream of each attempt.
    max_log_bytes: u64,
    /// The ends of outputs past their head (see [`super::logcap`]), by attempt and stream,
    /// with the worker that runs it: written when the attempt ends or its worker goes.
    log_tails: HashMap<(TaskRef, u32, bool), (WorkerId, super::logcap::Tail)>,
    /// When the outputs' kept ends were last saved beside their logs (a coordinator killed
    /// before their attempts end loses at most [`TAIL_SAVE`] of them).
    tails_saved: Instant,
    heartbeat: Duration,
    heartbeat_timeout: Duration,
    /// Transfer staging: files uploaded with each job, by path.
    uploads: HashMap<JobId, HashMap<String, proto::Object>>,
    /// Where `uploads` is kept across restarts (`<job>.json`).
    uploads_dir: PathBuf,
    /// The rendezvous service of gangs (`group`): ranks meet there to build their
    /// communicator. Kept alive with the core.
    rendezvous: Option<flotilla_collective::RendezvousServer>,
    /// The fingerprint of the rendezvous's TLS certificate (`""`: plain TCP).
    rendezvous_cert: String,
    /// Keys the secret appended to each gang's key (so that no one else can guess it).
    gang_secret: [u8; 32],
    /// Tokens and keys: tickets for the objects an assignment or a gather fetches.
    access: Arc<Access>,
    /// Which worker serves each data address (tickets are made with the holder's key).
    addr_owner: HashMap<String, WorkerId>,
    /// The TLS certificate fingerprint of each data address's server (`""`: plain TCP).
    addr_cert: HashMap<String, String>,
    /// Whether clients reach this coordinator over TLS (then workers' objects travel so too).
    tls: bool,
    /// The coordinator's object store (uploads).
    objects_dir: PathBuf,
    /// How long finished jobs are kept before they are removed (`None`: until `rm`).
    retain_finished: Option<Duration>,
    /// When finished jobs were last looked at for the retention.
    retention_checked: Instant,
    /// Compact the journal once removed jobs' records are this many bytes (and half of it).
    compact_after: Option<u64>,
    /// The journal compaction running, if any.
    compaction: Option<crate::journal::Compaction>,
    /// When a compaction last failed: the next waits a minute (a full disk must not make the
    /// core rewrite the journal at every turn).
    compaction_failed: Option<Instant>,
    /// Counters, histograms and the snapshots the HTTP side reads (`/metrics`).
    metrics: Arc<super::http::Metrics>,
    /// When the last snapshot was published.
    published_at: Instant,
    /// While the journal cannot be written (a full or read-only disk): why, and what waits
    /// for it. See [`Core::commit`].
    blocked: Option<Blocked>,
    /// In a group of coordinators: this node (it leads while the core runs).
    group: Option<Arc<crate::ha::Node>>,
    /// The API address (`flotilla status` names it as the group's leader).
    api_addr: String,
    /// Reads of this turn that came after its changes: answered once the turn is written
    /// (or, when the journal cannot be written, as they are).
    reads: Vec<AfterCommit>,
    /// Called before each journal append (tests of what leaves the core before it).
    #[cfg(test)]
    pub(super) before_append: Option<Box<dyn FnMut() + Send>>,
}

/// What the core holds while its journal cannot be written: the records not yet durable, and
/// everything they must precede (replies, dispatches, notifications), in order.
struct Blocked {
    /// The append's error.
    error: String,
    records: Vec<JournalRecord>,
    after: Vec<AfterCommit>,
    cmds: Vec<Command>,
    /// When the append is tried again.
    retry_at: Instant,
}

/// The most records held while the journal cannot be written; beyond, the coordinator stops
/// (a restart replays what is durable; workers report again what was not).
const MAX_UNWRITTEN: usize = 1_000_000;

/// Why a worker that said it leaves is gone ([`Event::WorkerLost`]'s reason): not counted
/// as lost.
const LEFT: &str = "it left (reclaimed by its owner, drained or stopped)";

/// How often an append that failed is tried again.
const RETRY_APPEND: Duration = Duration::from_millis(250);

/// Free space the journal's disk keeps beyond a new job's records: a job is refused at once
/// when taking it would leave less (rather than taken and held unacknowledged until its
/// records can be written, which a client that gives up takes for a refusal).
const DISK_RESERVE: u64 = 1 << 20;

/// About how many bytes a job's records take in the journal: its file, and its tasks'
/// assignments and reports to come.
fn journal_bytes_of(toml: &str, dir: &str, tasks: usize) -> u64 {
    (toml.len() + dir.len()) as u64 + 128 * tasks as u64
}

/// Milliseconds since the Unix epoch by the system's clock (0 before it).
fn unix_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis().min(u128::from(u64::MAX)) as Millis)
        .unwrap_or(0)
}

/// Test hook: with `FLOTILLA_FAULT=lose-submit-answer:N`, the first N turns of this process
/// that commit a submission in a group stop leading once the group holds it, before it is
/// answered: the client loses the answer of a job that exists (and sends it again). Unset,
/// it costs one atomic load per commit.
fn lose_submit_answer(records: &[JournalRecord]) -> bool {
    use std::sync::atomic::{AtomicU32, Ordering};
    static LEFT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let left = LEFT.get_or_init(|| {
        AtomicU32::new(
            std::env::var(crate::fault::FAULT_VAR)
                .ok()
                .and_then(|v| {
                    v.trim()
                        .strip_prefix("lose-submit-answer:")
                        .and_then(|n| n.parse().ok())
                })
                .unwrap_or(0),
        )
    });
    left.load(Ordering::Relaxed) > 0
        && records
            .iter()
            .any(|r| matches!(r, JournalRecord::JobSubmittedText { .. }))
        && left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
}

impl Core {
    /// Starts a journal compaction when removed jobs' records weigh enough; finishes one
    /// whose thread is done (or, when `stopping`, waits for it). In a group the checkpoint
    /// is committed first, as an entry of its own, so that every follower compacts its
    /// journal at the same point (see `crate::ha::state_machine`); `Err` when that commit
    /// fails (this coordinator stops leading) or its records cannot be written here.
    fn compact(&mut self, stopping: bool) -> std::result::Result<(), String> {
        if self.blocked.is_some() {
            return Ok(());
        }
        if let Some(c) = self.compaction.take() {
            if !stopping && !c.is_finished() {
                self.compaction = Some(c);
                return Ok(());
            }
            match self.journal.finish_compaction(c) {
                Some(r) => tracing::info!("journal compacted: {r}"),
                None => self.compaction_failed = Some(Instant::now()),
            }
            return Ok(());
        }
        if self
            .compaction_failed
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            return Ok(());
        }
        let Some(min) = self.compact_after else {
            return Ok(());
        };
        let garbage = self.journal.garbage();
        if stopping || garbage < min.max(1) || garbage.saturating_mul(2) < self.journal.bytes() {
            return Ok(());
        }
        let checkpoint = self.coord.checkpoint();
        if let Some(g) = &self.group {
            let marker = g
                .commit(std::slice::from_ref(&checkpoint))
                .map_err(|e| format!("{e}: this coordinator stops leading"))?;
            self.journal
                .append(&[checkpoint.clone(), marker])
                .map_err(|e| format!("journal write failed (a compaction's checkpoint): {e}"))?;
        }
        match self.journal.start_compaction(checkpoint) {
            Ok(c) => self.compaction = Some(c),
            Err(e) => {
                tracing::warn!("cannot start a journal compaction: {e}");
                self.compaction_failed = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// The ledger as `flotilla ledger --json` prints it: the accounts `scope` sees (a
    /// tenant: its own; the admin: all, or `tenant`'s), and for the admin the platform's
    /// fees, the credits handed out and the total (always equal).
    fn on_ledger(
        &self,
        scope: &Scope,
        tenant: Option<&str>,
    ) -> std::result::Result<String, Status> {
        use flotilla_pool::Account;
        let l = self.coord.ledger();
        let accounts: Vec<serde_json::Value> = l
            .balances()
            .filter(|(a, _)| **a != Account::Issuer)
            .filter(|(a, _)| match a {
                Account::Tenant(t) | Account::Escrow(t) => {
                    scope.sees(t) && tenant.is_none_or(|x| x == t)
                }
                _ => *scope == Scope::All && tenant.is_none(),
            })
            .map(|(a, b)| {
                serde_json::json!({
                    "name": a.name(),
                    "kind": a.kind(),
                    "balance": b.as_f64(),
                    "balance_micro": b.as_micro(),
                })
            })
            .collect();
        let mut doc = serde_json::json!({ "accounts": accounts });
        if *scope == Scope::All {
            doc["platform"] = serde_json::json!(l.balance(&Account::Platform).as_f64());
            doc["issued"] = serde_json::json!(l.issued().as_f64());
            doc["total"] = serde_json::json!(l.total().as_f64());
            doc["total_micro"] = serde_json::json!(l.total().as_micro());
        }
        serde_json::to_string(&doc).map_err(|e| Status::internal(e.to_string()))
    }

    /// The providers (from the registry) with their live workers and prices, as JSON.
    fn on_providers(
        &self,
        scope: &Scope,
        providers: Vec<crate::access::ProviderInfo>,
    ) -> std::result::Result<String, Status> {
        let workers = self.coord.workers();
        let list: Vec<crate::client::ProviderSummary> = providers
            .into_iter()
            .map(|p| {
                let mine: Vec<&state::WorkerStatus> = workers
                    .iter()
                    .filter(|w| w.provider.as_deref() == Some(p.name.as_str()))
                    .collect();
                let mut prices: Vec<String> = mine.iter().map(|w| w.price.to_string()).collect();
                prices.sort();
                prices.dedup();
                let rep = self.coord.reputation(&p.name);
                let earned = self
                    .coord
                    .ledger()
                    .balance(&flotilla_pool::Account::Provider(p.name.clone()))
                    .as_f64();
                crate::client::ProviderSummary {
                    reputation: rep.score(),
                    accepted: rep.accepted,
                    rejected: rep.rejected,
                    eligible: self.coord.provider_eligible(&p.name),
                    earned,
                    availability: {
                        let mut a: Vec<String> = mine
                            .iter()
                            .map(|w| match (w.availability.is_empty(), w.available) {
                                (true, _) => "always".to_string(),
                                (false, true) => format!("{} (now)", w.availability),
                                (false, false) => format!("{} (not now)", w.availability),
                            })
                            .collect();
                        a.sort();
                        a.dedup();
                        a
                    },
                    name: p.name,
                    // Which token a provider's is: the admin's business (to revoke it).
                    token: if *scope == Scope::All {
                        p.token
                    } else {
                        String::new()
                    },
                    revoked: p.revoked,
                    workers: mine.iter().map(|w| w.name.clone()).collect(),
                    // `+ 0.0`: an empty sum of f64 is -0.0, which prints as "-0".
                    cpus: mine.iter().map(|w| w.resources.cpus).sum::<f64>() + 0.0,
                    gpus: mine.iter().map(|w| w.resources.gpus).sum::<f64>() + 0.0,
                    prices,
                }
            })
            .collect();
        serde_json::to_string(&list).map_err(|e| Status::internal(e.to_string()))
    }

    /// Tells the live workers named `name` (or with id `name`) to drain: nothing more is
    /// placed on them; they stop their tasks (SIGTERM, their grace period), keep their
    /// checkpoints off the machine, give back what they had queued and leave.
    fn on_drain(
        &mut self,
        name: &str,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) -> std::result::Result<String, Status> {
        let live: Vec<(WorkerId, String)> = self
            .coord
            .workers()
            .into_iter()
            .map(|w| (w.id, w.name))
            .collect();
        let ids = drained(&live, name)?;
        for &w in &ids {
            self.handle(
                Event::WorkerAvailability {
                    worker: w,
                    available: false,
                },
                cmds,
                records,
            );
            if let Some(tx) = self.senders.get(&w) {
                let _ = tx.try_send(proto::CoordinatorMessage {
                    drain: true,
                    ..Default::default()
                });
            }
        }
        let names: Vec<String> = ids.iter().map(ToString::to_string).collect();
        serde_json::to_string(&names).map_err(|e| Status::internal(e.to_string()))
    }

    /// Records the checkpoint files a preempted attempt of `job` left in the store with the
    /// job's uploads (removed with it), under `.flotilla/checkpoints/`.
    fn note_checkpoint(&mut self, job: JobId, task: TaskId, attempt: u32, files: &[proto::Object]) {
        if files.is_empty() {
            return;
        }
        let mut all: Vec<proto::Object> = self
            .uploads
            .get(&job)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        all.extend(files.iter().map(|o| proto::Object {
            path: format!("{CHECKPOINTS}/{}/{attempt}/{}", task.0, o.path),
            ..o.clone()
        }));
        self.note_uploads(job, all);
    }

    /// Records (in memory and on disk) the files uploaded with `job`.
    fn note_uploads(&mut self, job: JobId, files: Vec<proto::Object>) {
        if files.is_empty() {
            return;
        }
        let list: Vec<(String, String, u64)> = files
            .iter()
            .map(|o| (o.path.clone(), o.hash.clone(), o.size))
            .collect();
        let path = self.uploads_dir.join(format!("{}.json", job.0));
        let bytes = serde_json::to_vec(&list).unwrap_or_default();
        if let Some(node) = &self.group {
            // In a group the committed entry writes the list on every node, this one
            // included, so the next leader hands the files out.
            if let Err(e) = node.commit_uploads(job.0, &bytes) {
                tracing::warn!("the uploads of {job} are not replicated: {e}");
            }
        } else {
            let r = std::fs::create_dir_all(&self.uploads_dir).and_then(|()| {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, &bytes)?;
                std::fs::rename(&tmp, &path)
            });
            if let Err(e) = r {
                tracing::warn!("{}: {e}", path.display());
            }
        }
        self.uploads.insert(
            job,
            files.into_iter().map(|o| (o.path.clone(), o)).collect(),
        );
    }

    /// Reads the uploads of every job from `uploads_dir`.
    fn load_uploads(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.uploads_dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Some(job) = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let list: Vec<(String, String, u64)> = match std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("{}: {e}", p.display());
                    continue;
                }
            };
            self.uploads.insert(
                JobId::new(job),
                list.into_iter()
                    .map(|(path, hash, size)| (path.clone(), proto::Object { path, hash, size }))
                    .collect(),
            );
        }
    }

    /// Adds the uploaded files among the task's declared inputs to its assignment (fetched
    /// from the coordinator: `from` is empty).
    fn add_uploaded_inputs(&self, a: &mut proto::Assignment) {
        let Some(k) = a.task else { return };
        let job = JobId::new(k.job);
        let Some(files) = self.uploads.get(&job) else {
            return;
        };
        let Some(j) = self.coord.jobs_map().get(&job) else {
            return;
        };
        let t = TaskId::new(k.task);
        if t.index() >= j.graph.len() {
            return;
        }
        // Exact paths, and every uploaded file a glob pattern matches (`*` within a folder).
        let opts = glob::MatchOptions {
            require_literal_separator: true,
            ..glob::MatchOptions::new()
        };
        let mut chosen: BTreeMap<&str, &proto::Object> = BTreeMap::new();
        for p in &j.graph.task(t).inputs {
            if crate::client::is_glob(p) {
                if let Ok(pattern) = glob::Pattern::new(p) {
                    // Checkpoints kept for preempted attempts are no job inputs.
                    for (path, o) in files.iter().filter(|(p, _)| !p.starts_with(CHECKPOINTS)) {
                        if pattern.matches_with(path, opts) {
                            chosen.insert(path, o);
                        }
                    }
                }
            } else if let Some((path, o)) = files.get_key_value(p) {
                chosen.insert(path, o);
            }
        }
        a.inputs.extend(chosen.into_values().map(|o| proto::Input {
            ticket: self.access.ticket(COORDINATOR_HOLDER, &o.hash),
            object: Some(o.clone()),
            from: String::new(),
            from_cert: String::new(),
        }));
    }

    /// A gather's request: every output with a live holder, or, when some were lost with
    /// their workers, the tasks that made them run again ([`Event::JobReopened`]) and a reply
    /// that says so once that is journaled (the client waits for the job and asks again).
    fn on_outputs(
        &mut self,
        job: JobId,
        reply: Reply<proto::OutputsReply>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        if self.coord.rejoining(job) {
            let _ = reply.send(Err(Status::unavailable(format!(
                "the coordinator restarted and the workers holding outputs of {job} have not \
                 all rejoined yet; try again in a few seconds"
            ))));
            return;
        }
        let lost = self.coord.lost_outputs(job);
        let reopenable = self.coord.jobs_map().get(&job).is_some_and(|j| {
            matches!(
                j.state,
                crate::state::JobState::Running | crate::state::JobState::Succeeded
            )
        });
        if lost.is_empty() || !reopenable {
            let _ = reply.send(self.outputs(job).map(|outputs| proto::OutputsReply {
                outputs,
                rebuilding: String::new(),
            }));
            return;
        }
        let rebuilding = {
            let j = &self.coord.jobs_map()[&job];
            let mut names: Vec<&str> = lost
                .iter()
                .take(5)
                .map(|&t| j.graph.task(t).name.as_str())
                .collect();
            if lost.len() > names.len() {
                names.push("…");
            }
            format!(
                "the outputs of {} task(s) of {job} ({}) were lost with their workers; they \
                 run again from their inputs",
                lost.len(),
                names.join(", ")
            )
        };
        tracing::info!("{rebuilding}");
        if !self.handle(Event::JobReopened { job, tasks: lost }, cmds, records) {
            let _ = reply.send(self.outputs(job).map(|outputs| proto::OutputsReply {
                outputs,
                rebuilding: String::new(),
            }));
            return;
        }
        after.push(Box::new(move |_| {
            let _ = reply.send(Ok(proto::OutputsReply {
                outputs: Vec::new(),
                rebuilding,
            }));
        }));
    }

    /// Transfer staging: every output of the job's done tasks, in task order, with the data
    /// address of a live worker holding it.
    fn outputs(&self, job: JobId) -> std::result::Result<Vec<proto::Input>, Status> {
        let Some(j) = self.coord.jobs_map().get(&job) else {
            return Err(no_job(job));
        };
        let workers = self.coord.workers_map();
        let mut tasks: Vec<TaskId> = j.outputs.keys().copied().collect();
        tasks.sort_unstable();
        let mut out = Vec::new();
        for t in tasks {
            let objs = &j.outputs[&t];
            if objs.is_empty() {
                continue;
            }
            let holder = j
                .holders
                .get(&t)
                .and_then(|hs| hs.iter().find_map(|h| workers.get(h)));
            let Some(w) = holder else {
                return Err(Status::unavailable(format!(
                    "the outputs of task {:?} of {job} ({}) are held by no live worker",
                    j.graph.task(t).name,
                    objs[0].path
                )));
            };
            for o in objs {
                out.push(proto::Input {
                    object: Some(proto::Object {
                        path: o.path.clone(),
                        hash: o.hash.clone(),
                        size: o.size,
                    }),
                    from: w.spec.data_addr.clone(),
                    ticket: self.access.ticket(w.id, &o.hash),
                    from_cert: self
                        .addr_cert
                        .get(&w.spec.data_addr)
                        .cloned()
                        .unwrap_or_default(),
                });
            }
        }
        Ok(out)
    }

    /// Milliseconds since the Unix epoch, never going back within a process.
    fn now(&self) -> Millis {
        self.base
            .saturating_add(self.epoch.elapsed().as_millis().min(u128::from(u64::MAX)) as Millis)
    }

    /// Writes a [`JournalRecord::Clock`] at `records[mark]`, before the records made at `now`
    /// from there on, when there are some and the clock moved since the last one written. In a
    /// group, only while no member answers as a version that cannot read it (see
    /// [`crate::ha::Node::writes_clock`]).
    fn stamp(&mut self, now: Millis, records: &mut Vec<JournalRecord>, mark: usize) {
        let older = self.group.as_ref().is_some_and(|g| !g.writes_clock());
        if older || records.len() <= mark || self.journal_clock == Some(now) {
            return;
        }
        records.insert(mark, JournalRecord::Clock { at_ms: now });
        self.journal_clock = Some(now);
    }

    /// Builds the state machine from the journal.
    pub(super) fn recover(
        config: &ServerConfig,
        journal: Journal,
        sessions: Arc<Mutex<HashMap<WorkerId, mpsc::Receiver<proto::CoordinatorMessage>>>>,
        access: Arc<Access>,
        metrics: Arc<super::http::Metrics>,
        group: Option<Arc<crate::ha::Node>>,
    ) -> Result<Core> {
        let mut journal = journal;
        // A follower that now leads may have a compaction running, started where the last
        // leader compacted: this core finishes it.
        let compaction = journal.take_handed();
        let mut core = Core {
            group,
            api_addr: config.listen.to_string(),
            coord: Coordinator::new(config.coordinator.clone()),
            journal,
            epoch: Instant::now(),
            base: unix_ms(),
            journal_clock: None,
            sessions,
            senders: HashMap::new(),
            worker_queue: config.worker_queue.max(1),
            overflowed: Vec::new(),
            last_seen: HashMap::new(),
            handoffs: HashMap::new(),
            watchers: HashMap::new(),
            logs_dir: config.state_dir.join("logs"),
            max_log_bytes: config.max_log_bytes,
            log_tails: HashMap::new(),
            tails_saved: Instant::now(),
            heartbeat: config.heartbeat,
            heartbeat_timeout: config.heartbeat_timeout,
            uploads: HashMap::new(),
            uploads_dir: config.state_dir.join("uploads"),
            rendezvous: None,
            rendezvous_cert: String::new(),
            metrics,
            published_at: Instant::now(),
            blocked: None,
            gang_secret: {
                use rand::RngCore;
                let mut bytes = [0u8; 32];
                rand::rngs::OsRng.fill_bytes(&mut bytes);
                bytes
            },
            access,
            addr_owner: HashMap::new(),
            addr_cert: HashMap::new(),
            tls: config.tls.is_some(),
            objects_dir: config.state_dir.join("objects"),
            retain_finished: config.retain_finished,
            retention_checked: Instant::now(),
            compact_after: config.compact_journal_after,
            compaction,
            compaction_failed: None,
            reads: Vec::new(),
            #[cfg(test)]
            before_append: None,
        };
        let rdv_addr = SocketAddr::new(config.listen.ip(), config.rendezvous_port).to_string();
        let rdv_err = |e| {
            ClusterError::Config(format!(
                "cannot start the gang rendezvous on {rdv_addr}: {e}"
            ))
        };
        // With TLS, the rendezvous uses the coordinator's certificate too; members get its
        // fingerprint and trust only it.
        core.rendezvous = Some(match &config.tls {
            None => flotilla_collective::RendezvousServer::bind_restricted(&rdv_addr)
                .map_err(rdv_err)?,
            Some(tls) => {
                // The files' mistakes are the flags', not the rendezvous's.
                let (cfg, print) =
                    flotilla_collective::tls::server_config_from_pem(&tls.cert, &tls.key)
                        .map_err(|e| tls_files_error(tls, &e.to_string()))?;
                core.rendezvous_cert = print;
                flotilla_collective::RendezvousServer::bind_restricted_tls(&rdv_addr, cfg)
                    .map_err(rdv_err)?
            }
        });
        core.load_uploads();
        let records = core.journal.replay()?;
        let n = records.len();
        let clocks = || {
            records.iter().filter_map(|r| match r {
                JournalRecord::Clock { at_ms } => Some(*at_ms),
                _ => None,
            })
        };
        // Records replay at the clock written before them; those of a journal from before
        // clocks were written (or before the first one) at the first one, or now. The clock
        // then goes on from the last one at least, whatever the system's clock says.
        let mut at = clocks().next();
        if let Some(last) = clocks().max() {
            core.base = core.base.max(last.saturating_add(1));
            core.journal_clock = Some(last);
        }
        let now = core.now();
        let mut sink = Vec::new();
        for (record, r) in records.into_iter().enumerate() {
            if let JournalRecord::Clock { at_ms } = r {
                at = Some(at_ms);
                continue;
            }
            core.coord
                .replay(at.unwrap_or(now), r, &mut sink)
                .map_err(|source| ClusterError::Replay { record, source })?;
            sink.clear();
        }
        core.coord.recovered(now);
        let _ = core.coord.take_journal_records();
        // A job's logs outlive what a recovered journal lost of it: its id is not given
        // again (a new job 1 showed the old job 1's logs).
        let logged = std::fs::read_dir(&core.logs_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
            .max();
        if let Some(last) = logged {
            core.coord.reserve_job_ids(last + 1);
        }
        if n > 0 {
            tracing::info!(records = n, "recovered from the journal");
        }
        let tails = recover_log_tails(&core.logs_dir);
        if tails > 0 {
            tracing::info!(
                tails,
                "outputs' ends saved before a stop were written to their logs"
            );
        }
        Ok(core)
    }

    /// Serves requests until stopped; `Err` when it must stop because the journal cannot be
    /// written.
    pub(super) fn run(mut self, rx: super::queue::Inbox) -> std::result::Result<(), String> {
        let tick = Duration::from_millis(50);
        let mut last_tick = Instant::now();
        loop {
            let first = match rx.recv_timeout(tick) {
                Ok(r) => Some(r),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let started = Instant::now();
            let mut batch: Vec<Req> = first.into_iter().collect();
            while batch.len() < 8192 {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let mut cmds = Vec::new();
            let mut records = Vec::new();
            let mut after: Vec<AfterCommit> = Vec::new();
            let mut stop = false;
            for req in batch {
                if let Req::Stop = req {
                    stop = true;
                    continue;
                }
                self.apply(req, &mut cmds, &mut records, &mut after);
            }
            if stop && !self.log_tails.is_empty() {
                // What was kept of outputs' ends is written before the coordinator goes.
                self.flush_log_tails(|_, _| true);
            }
            self.settle_handoffs(&mut cmds, &mut records);
            for w in std::mem::take(&mut self.overflowed) {
                self.last_seen.remove(&w);
                self.sessions.lock().remove(&w);
                let queue = self.worker_queue;
                self.handle(
                    Event::WorkerLost {
                        worker: w,
                        reason: format!("it did not read its commands ({queue} messages waited)"),
                    },
                    &mut cmds,
                    &mut records,
                );
            }
            if last_tick.elapsed() >= tick {
                last_tick = Instant::now();
                if self.tails_saved.elapsed() >= TAIL_SAVE {
                    self.tails_saved = Instant::now();
                    self.save_log_tails();
                }
                self.retire_finished(&mut cmds, &mut records, &mut after);
                self.check_heartbeats(&mut cmds, &mut records);
                self.handle(Event::Tick, &mut cmds, &mut records);
            }
            let busy = !cmds.is_empty() || !records.is_empty();
            let reads = std::mem::take(&mut self.reads);
            let Some((cmds, after)) = self.commit(records, cmds, after, stop)? else {
                // The journal cannot be written: all of it waits (see `commit`), but reads
                // are answered as they are.
                for f in reads {
                    f(&mut self);
                }
                self.publish();
                if stop {
                    return Ok(());
                }
                continue;
            };
            for f in after.into_iter().chain(reads) {
                f(&mut self);
            }
            self.dispatch(cmds);
            if busy {
                self.metrics
                    .scheduling
                    .observe(started.elapsed().as_secs_f64());
            }
            self.publish();
            self.compact(stop)?;
            if stop {
                return Ok(());
            }
        }
    }

    /// Makes a turn's records durable before anything they caused leaves the core: returns
    /// the commands to dispatch and the replies to send, or `None` while the journal cannot
    /// be written (a full or read-only disk). Then the records, replies and commands wait,
    /// in order, and the append is tried again every [`RETRY_APPEND`]; meanwhile the core
    /// takes no new job ([`Core::journal_refusal`]) and acknowledges nothing, and when the
    /// append succeeds all of it goes out. `Err` when too much waits (or at a stop with
    /// records still unwritten): the coordinator stops, and a restart replays what is
    /// durable.
    #[allow(clippy::type_complexity)]
    fn commit(
        &mut self,
        mut records: Vec<JournalRecord>,
        cmds: Vec<Command>,
        after: Vec<AfterCommit>,
        stop: bool,
    ) -> std::result::Result<Option<(Vec<Command>, Vec<AfterCommit>)>, String> {
        // In a group, a majority holds the records first (then the journal here, as alone).
        if let Some(g) = &self.group {
            if !records.is_empty() {
                let t = Instant::now();
                let marker = g
                    .commit(&records)
                    .map_err(|e| format!("{e}: this coordinator stops leading"))?;
                self.metrics.group_commit.observe(t.elapsed().as_secs_f64());
                if lose_submit_answer(&records) {
                    return Err("a test hook (FLOTILLA_FAULT=lose-submit-answer) stops \
                                leading before a committed submission is answered"
                        .into());
                }
                records.push(marker);
            }
        }
        let was_blocked = self.blocked.is_some();
        let (records, cmds, after) = match self.blocked.take() {
            None => (records, cmds, after),
            Some(mut b) => {
                b.records.extend(records);
                b.cmds.extend(cmds);
                b.after.extend(after);
                if Instant::now() < b.retry_at && !stop {
                    self.blocked = Some(b);
                    return Ok(None);
                }
                (b.records, b.cmds, b.after)
            }
        };
        if records.is_empty() {
            return Ok(Some((cmds, after)));
        }
        #[cfg(test)]
        if let Some(hook) = &mut self.before_append {
            hook();
        }
        let t = Instant::now();
        match self.journal.append(&records) {
            Ok(()) => {
                self.metrics
                    .journal_append
                    .observe(t.elapsed().as_secs_f64());
                if was_blocked {
                    tracing::warn!(
                        "the journal is written again ({} records that waited): new jobs are \
                         taken",
                        records.len()
                    );
                }
                Ok(Some((cmds, after)))
            }
            Err(e) => {
                let error = e.to_string();
                if stop || records.len() > MAX_UNWRITTEN {
                    return Err(format!(
                        "journal write failed with {} records waiting: {error}",
                        records.len()
                    ));
                }
                if !was_blocked {
                    tracing::error!(
                        "the journal cannot be written ({error}): no new job is taken and \
                         nothing is acknowledged until it can; retrying"
                    );
                }
                self.blocked = Some(Blocked {
                    error,
                    records,
                    after,
                    cmds,
                    retry_at: Instant::now() + RETRY_APPEND,
                });
                Ok(None)
            }
        }
    }

    /// Why a new job is refused now, if it is: the journal cannot be written.
    fn journal_refusal(&self) -> Option<Status> {
        let b = self.blocked.as_ref()?;
        Some(Status::unavailable(format!(
            "the coordinator cannot write its journal {} ({}): it takes no new job until it \
             can (free space there, or make it writable); nothing it accepted is lost",
            self.journal.path().display(),
            b.error
        )))
    }

    /// Applies one event, collecting its journal records (the event itself when journaled,
    /// then the assignments it caused) and commands.
    fn handle(
        &mut self,
        ev: Event,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) -> bool {
        match self.try_handle(ev, cmds, records) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("event refused: {e}");
                false
            }
        }
    }

    /// [`Core::handle`], the refusal returned (a request's, answered to its client).
    fn try_handle(
        &mut self,
        ev: Event,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) -> std::result::Result<(), state::StateError> {
        let now = self.now();
        // A report on a removed job changes nothing: not journaled.
        let rec = if self.coord.reports_on_a_removed_job(&ev) {
            None
        } else {
            JournalRecord::from_event(&ev)
        };
        // A worker that said it leaves (drained, reclaimed, stopped) is not lost.
        let lost = matches!(&ev, Event::WorkerLost { reason, .. } if reason != LEFT);
        self.coord.handle(now, ev, cmds)?;
        if lost {
            self.metrics.lost_workers.inc();
        }
        let mark = records.len();
        if let Some(r) = rec {
            records.push(r);
        }
        records.extend(self.coord.take_journal_records());
        self.stamp(now, records, mark);
        Ok(())
    }

    /// Applies one request: its events go to the state machine, its journal records to
    /// `records`, and its reply, when it must wait for the journal, to `after`.
    fn apply(
        &mut self,
        req: Req,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        if let Some((job, scope)) = req.scoped() {
            let seen = self
                .coord
                .jobs_map()
                .get(&job)
                .is_some_and(|j| scope.sees(&j.tenant));
            if !seen {
                req.refuse(job);
                return;
            }
        }
        match req {
            Req::Submit {
                spec,
                graph,
                toml,
                dir,
                tenant,
                files,
                request_id,
                reply,
            } => self.on_submit(
                (spec, graph, toml),
                dir,
                (tenant, request_id),
                files,
                reply,
                cmds,
                records,
                after,
            ),
            Req::Cancel { job, reply, .. } => self.on_cancel(job, reply, cmds, records, after),
            Req::Remove { job, reply, .. } => self.on_remove(job, reply, cmds, records, after),
            Req::Status {
                job,
                scope,
                trace,
                limit,
                from,
                states,
                reply,
            } => {
                let answer = move |core: &mut Core| {
                    core.answer_status(job, &scope, trace, (limit, from, &states), reply)
                };
                // A read after changes of this turn waits for them to be durable: a client
                // is never shown what a crash could take back (found under load: a job seen
                // succeeded, the coordinator killed, and the job running again after its
                // restart). While the journal cannot be written, reads are answered as they
                // are (the overview says why nothing is acknowledged).
                if records.is_empty() || self.blocked.is_some() {
                    answer(self);
                } else {
                    self.reads.push(Box::new(answer));
                }
            }
            Req::Outputs { job, reply, .. } => self.on_outputs(job, reply, cmds, records, after),
            Req::Watch { job, tx, .. } => {
                if records.is_empty() || self.blocked.is_some() {
                    self.on_watch(job, tx);
                } else {
                    self.reads
                        .push(Box::new(move |core: &mut Core| core.on_watch(job, tx)));
                }
            }
            Req::LogInfo {
                job,
                task,
                attempt,
                reply,
                ..
            } => {
                let _ = reply.send(self.on_log_info(job, &task, attempt));
            }
            Req::Register {
                req,
                previous,
                offer,
                reply,
            } => self.on_register(req, (previous, offer), reply, cmds, records, after),
            Req::Model { scope, reply } => {
                let _ = reply.send(Ok(match &scope {
                    Scope::All => self.coord.model_json(),
                    Scope::Tenant(t) => self.coord.model_json_of(t),
                }));
            }
            Req::WorkerLoads { reply } => {
                let _ = reply.send(Ok(self.coord.worker_loads()));
            }
            Req::AllocView {
                shapes,
                note,
                reply,
            } => {
                self.coord.set_capacity_note(note);
                let view = crate::alloc::CoreView {
                    work: shapes
                        .iter()
                        .map(|(q, shape)| {
                            (
                                *q,
                                self.coord.work_left(
                                    shape,
                                    crate::alloc::allocator::DEFAULT_TASK_S,
                                    crate::alloc::allocator::LEFT_LIMIT,
                                ),
                            )
                        })
                        .collect(),
                    workers: self
                        .coord
                        .workers()
                        .into_iter()
                        .map(|w| (w.name, w.resources.cpus, w.hw_class))
                        .collect(),
                };
                let _ = reply.send(Ok(view));
            }
            Req::Providers {
                scope,
                providers,
                reply,
            } => {
                let _ = reply.send(self.on_providers(&scope, providers));
            }
            Req::Quotas(q) => {
                self.coord.set_quotas(q);
                self.handle(Event::Tick, cmds, records);
            }
            Req::Grant {
                tenant,
                amount,
                reply,
            } => {
                // Credits may unpause jobs: what they placed is journaled too.
                let ev = Event::CreditsGranted { tenant, amount };
                match self.try_handle(ev, cmds, records) {
                    Ok(()) => {
                        after.push(Box::new(move |_| {
                            let _ = reply.send(Ok(()));
                        }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
                    }
                }
            }
            Req::Ledger {
                scope,
                tenant,
                reply,
            } => {
                let _ = reply.send(self.on_ledger(&scope, tenant.as_deref()));
            }
            Req::Drain { name, reply } => {
                let _ = reply.send(self.on_drain(&name, cmds, records));
            }
            Req::Retry { job, reply, .. } => self.on_retry(job, reply, cmds, records, after),
            Req::Budget {
                job, amount, reply, ..
            } => {
                // What a raise cannot help, said rather than done (journaled, it changed
                // nothing; on a job with no budget it set a cap where there was none).
                let refused = self.coord.job_summary(job).and_then(|s| {
                    if s.state != state::JobState::Running {
                        Some(format!(
                            "job {} has ended ({}): there is nothing left for a budget to pay",
                            job.0, s.state
                        ))
                    } else if s.pool.as_ref().is_some_and(|p| p.budget.is_none()) {
                        Some(format!(
                            "job {} has no budget: it spends from its tenant's credits with no \
                             cap of its own (`[pool] budget` in a job file sets one); if it \
                             waits for credits, the admin hands its tenant more \
                             (`flotilla admin tenant set {} --grant N`)",
                            job.0, s.tenant
                        ))
                    } else {
                        None
                    }
                });
                if let Some(why) = refused {
                    let _ = reply.send(Err(Status::failed_precondition(why)));
                    return;
                }
                let ev = Event::BudgetRaised { job, amount };
                match self.try_handle(ev, cmds, records) {
                    Ok(()) => {
                        let pool = self.coord.job_summary(job).and_then(|s| s.pool);
                        let json = serde_json::to_string(&pool).unwrap_or_default();
                        after.push(Box::new(move |_| {
                            let _ = reply.send(Ok(json));
                        }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(Status::failed_precondition(e.to_string())));
                    }
                }
            }
            Req::FromWorker(m) => self.on_worker_message(m, cmds, records),
            Req::SessionClosed(worker) => self.on_session_closed(worker, cmds, records),
            Req::Stop => {}
            #[cfg(test)]
            Req::Panic => panic!("injected by a test"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_submit(
        &mut self,
        (spec, graph, toml): (
            flotilla_core::JobSpec,
            Box<flotilla_core::TaskGraph>,
            String,
        ),
        dir: String,
        (tenant, request_id): (String, Option<String>),
        files: Vec<proto::Object>,
        reply: Reply<proto::SubmitReply>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        if let Some(refusal) = self.journal_refusal() {
            let _ = reply.send(Err(refusal));
            return;
        }
        // Sent again (its answer was lost): the job it made, once that is durable.
        if let Some(job) = request_id
            .as_deref()
            .and_then(|id| self.coord.submission(&tenant, id))
        {
            let (name, tasks) = self
                .coord
                .job_summary(job)
                .map(|s| (s.name, s.total as u32))
                .unwrap_or_default();
            tracing::info!(%job, "a submission sent again: answered with the job it made");
            after.push(Box::new(move |_| {
                let _ = reply.send(Ok(proto::SubmitReply {
                    job: job.0,
                    name,
                    tasks,
                }));
            }));
            return;
        }
        let need = journal_bytes_of(&toml, &dir, graph.len()) + DISK_RESERVE;
        if let Some(free) = self.journal.free_bytes().filter(|&free| free < need) {
            let _ = reply.send(Err(Status::resource_exhausted(format!(
                "the coordinator's disk is full: {} bytes are free where it writes its \
                 journal {}, this job needs about {need} (its records and a reserve of \
                 {DISK_RESERVE}); free space there and submit again; nothing it accepted \
                 is lost",
                free,
                self.journal.path().display()
            ))));
            return;
        }
        let job = self.coord.next_job_id();
        let name = spec.name.clone();
        let now = self.now();
        if let Err(e) = self.coord.submit_expanded(
            now,
            job,
            &spec.name,
            *graph,
            &dir,
            &tenant,
            spec.staging,
            cmds,
        ) {
            let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
            return;
        }
        self.note_uploads(job, files);
        if let Some(id) = &request_id {
            self.coord.note_submission(job, &tenant, id);
        }
        if let Some(pool) = spec.pool {
            // Before anything of the job is placed.
            if let Err(e) = self.coord.set_job_pool(job, pool) {
                tracing::warn!("{job}: {e}");
            }
        }
        // The journal keeps the job file; a replay parses and expands it again.
        let mark = records.len();
        records.push(JournalRecord::JobSubmittedText {
            job,
            toml,
            dir,
            tenant,
        });
        records.extend(self.coord.take_journal_records());
        self.stamp(now, records, mark);
        let tasks = self
            .coord
            .job_summary(job)
            .map(|s| s.total as u32)
            .unwrap_or(0);
        after.push(Box::new(move |_| {
            let _ = reply.send(Ok(proto::SubmitReply {
                job: job.0,
                name,
                tasks,
            }));
        }));
    }

    fn on_cancel(
        &mut self,
        job: JobId,
        reply: Reply<()>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        if self.coord.job_summary(job).is_none() {
            let _ = reply.send(Err(no_job(job)));
            return;
        }
        self.handle(Event::JobCancelled { job }, cmds, records);
        after.push(Box::new(move |_| {
            let _ = reply.send(Ok(()));
        }));
    }

    /// `flotilla retry`: the job's failed and cancelled tasks run again (journaled); the
    /// reply, once that is durable, says how many.
    fn on_retry(
        &mut self,
        job: JobId,
        reply: Reply<u64>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        let again = self.coord.retry_count(job);
        match self.try_handle(Event::JobRetried { job }, cmds, records) {
            Ok(()) => {
                after.push(Box::new(move |_| {
                    let _ = reply.send(Ok(again));
                }));
            }
            Err(state::StateError::UnknownJob(_)) => {
                let _ = reply.send(Err(no_job(job)));
            }
            Err(e) => {
                let _ = reply.send(Err(Status::failed_precondition(e.to_string())));
            }
        }
    }

    /// `flotilla rm` (or the retention): a finished job is forgotten (journaled), and once
    /// that is durable its data goes ([`Core::forget`]).
    fn on_remove(
        &mut self,
        job: JobId,
        reply: Reply<()>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        match self.try_handle(Event::JobRemoved { job }, cmds, records) {
            Err(state::StateError::UnknownJob(_)) => {
                let _ = reply.send(Err(no_job(job)));
            }
            Err(e) => {
                let _ = reply.send(Err(Status::failed_precondition(e.to_string())));
            }
            Ok(()) => {
                after.push(Box::new(move |core: &mut Core| {
                    core.forget(job);
                    let _ = reply.send(Ok(()));
                }));
            }
        }
    }

    /// A removed job's data: its uploads list and the uploaded objects no other job uses,
    /// its logs here, and (told to every worker) the objects and logs it left on workers.
    fn forget(&mut self, job: JobId) {
        self.log_tails.retain(|k, _| k.0.job != job);
        let files = self.uploads.remove(&job);
        if let Some(node) = &self.group {
            // In a group the committed entry removes the list, the objects no other list
            // names and the logs on every node, this one included.
            if let Err(e) = node.commit_uploads(job.0, &[]) {
                tracing::warn!("the removal of {job}'s uploads is not replicated: {e}");
            }
        } else {
            if let Some(files) = files {
                let still: std::collections::HashSet<&str> = self
                    .uploads
                    .values()
                    .flat_map(|m| m.values().map(|o| o.hash.as_str()))
                    .collect();
                for o in files.values() {
                    if !still.contains(o.hash.as_str()) && crate::objects::valid_hash(&o.hash) {
                        let _ = std::fs::remove_file(self.objects_dir.join(&o.hash));
                    }
                }
            }
            let _ = std::fs::remove_file(self.uploads_dir.join(format!("{}.json", job.0)));
            let _ = std::fs::remove_dir_all(self.logs_dir.join(job.0.to_string()));
        }
        for tx in self.senders.values() {
            // A worker whose queue is full is being dropped anyway.
            let _ = tx.try_send(proto::CoordinatorMessage {
                forget: vec![job.0],
                ..Default::default()
            });
        }
    }

    /// Finished jobs older than the retention are removed, as `flotilla rm` would.
    fn retire_finished(
        &mut self,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        let Some(keep) = self.retain_finished else {
            return;
        };
        // A look at every job: once a second, not at every tick.
        if self.retention_checked.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.retention_checked = Instant::now();
        let now = self.now();
        let keep_ms = keep.as_millis().min(u128::from(u64::MAX)) as u64;
        let old: Vec<JobId> = self
            .coord
            .jobs_map()
            .values()
            .filter(|j| !j.is_active())
            .filter(|j| j.finished.is_some_and(|f| now.saturating_sub(f) >= keep_ms))
            .map(|j| j.id)
            .collect();
        for job in old {
            let (tx, _rx) = oneshot::channel();
            // Refused while cancelled attempts still stop: tried again at the next look.
            self.on_remove(job, tx, cmds, records, after);
        }
    }

    /// A job's status, or every job and worker, as JSON.
    fn on_cluster_status(&self, scope: &Scope) -> std::result::Result<String, Status> {
        serde_json::to_string(&self.cluster_status(scope))
            .map_err(|e| Status::internal(e.to_string()))
    }

    /// The jobs `scope` sees, every worker, and (for the admin) the journal.
    fn cluster_status(&self, scope: &Scope) -> state::ClusterStatus {
        let mut workers = self.coord.workers();
        for w in &mut workers {
            w.heartbeat_age_s = self.last_seen.get(&w.id).map(|t| t.elapsed().as_secs_f64());
        }
        let group = self.group.as_ref().map(|g| g.status());
        state::ClusterStatus {
            jobs: self
                .coord
                .jobs()
                .into_iter()
                .filter(|j| scope.sees(&j.tenant))
                .collect(),
            workers,
            // The journal is the operator's business.
            journal: (*scope == Scope::All).then(|| state::JournalStatus {
                path: self.journal.path().display().to_string(),
                records: self.journal.len(),
                bytes: self.journal.bytes(),
                fsync: self.journal.sync_mode() == crate::journal::SyncMode::Always,
                syncs: self.journal.syncs(),
                error: self.blocked.as_ref().map(|b| b.error.clone()),
            }),
            // Its address in the group's list: `--listen 0.0.0.0:7070` reached no one.
            leader: group.as_ref().map(|g| {
                g.leader_address()
                    .map_or_else(|| self.api_addr.clone(), str::to_string)
            }),
            group,
        }
    }

    /// Publishes a snapshot for the HTTP side when one was asked for since the last, at
    /// most every [`super::http::SNAPSHOT_EVERY`].
    fn publish(&mut self) {
        use std::sync::atomic::Ordering;
        if self.published_at.elapsed() < super::http::SNAPSHOT_EVERY
            || !self.metrics.wanted.swap(false, Ordering::Relaxed)
        {
            return;
        }
        self.published_at = Instant::now();
        self.metrics.publish(self.cluster_status(&Scope::All));
    }

    /// Answers a status request: a job's status page or trace, or the cluster's overview.
    fn answer_status(
        &mut self,
        job: Option<JobId>,
        scope: &Scope,
        trace: bool,
        (limit, from, states): (Option<usize>, usize, &[state::TaskState]),
        reply: Reply<String>,
    ) {
        let json = |doc: Option<String>, j: JobId| doc.ok_or_else(|| no_job(j));
        let _ = reply.send(match (trace, job, limit) {
            (true, Some(j), _) => json(
                self.coord
                    .job_trace_last(j, limit.unwrap_or(usize::MAX))
                    .and_then(|t| serde_json::to_string(&t).ok()),
                j,
            ),
            (true, None, _) => Err(Status::invalid_argument("a trace is of one job")),
            (false, Some(j), n) => json(
                self.coord
                    .job_status_in(j, from, n.unwrap_or(state::STATUS_TASKS), states)
                    .and_then(|s| serde_json::to_string(&s).ok()),
                j,
            ),
            (false, None, _) => self.on_cluster_status(scope),
        });
    }

    /// A new watcher: the job's state now, then (while it runs) its events.
    fn on_watch(&mut self, job: JobId, tx: Watcher) {
        let Some(s) = self.coord.job_summary(job) else {
            let _ = tx.try_send(Err(no_job(job)));
            return;
        };
        let (done, total) = (s.done as u32, s.total as u32);
        if s.state != state::JobState::Running {
            let _ = tx.try_send(Ok(proto::JobEvent {
                job: job.0,
                job_finished: true,
                job_state: s.state.to_string(),
                done,
                total,
                ..Default::default()
            }));
            return;
        }
        let _ = tx.try_send(Ok(proto::JobEvent {
            job: job.0,
            state: "running".into(),
            done,
            total,
            ..Default::default()
        }));
        self.watchers.entry(job).or_default().push(tx);
    }

    fn on_log_info(
        &self,
        job: JobId,
        task: &str,
        pinned: Option<u32>,
    ) -> std::result::Result<LogInfo, Status> {
        match self.coord.task_status(job, task) {
            None if self.coord.job_summary(job).is_none() => Err(no_job(job)),
            None => {
                // `map` for the array `map[0..N]`: name one of its tasks.
                let first = format!("{task}[0]");
                let hint = if self.coord.task_status(job, &first).is_some() {
                    format!(
                        " ({task} has several instances, an array's or a gang's: name one, \
                         such as {first})"
                    )
                } else {
                    String::new()
                };
                Err(Status::not_found(format!(
                    "job {} has no task named {task:?}{hint}",
                    job.0
                )))
            }
            Some(t) if pinned.is_some_and(|n| n == 0 || n > t.attempts) => {
                Err(Status::not_found(format!(
                    "{task} of job {} has no attempt {}: {}",
                    job.0,
                    pinned.unwrap_or_default(),
                    match t.attempts {
                        0 => "it has not been placed yet".to_string(),
                        1 => "it has had one, attempt 1".to_string(),
                        n => format!("it has had {n}, attempts 1 to {n}"),
                    }
                )))
            }
            Some(t) if pinned.is_some() => {
                let n = pinned.unwrap_or_default();
                let (out, err) = self.log_paths(job, t.id, n);
                let latest = n == t.attempts;
                let live = latest
                    && matches!(
                        t.state,
                        state::TaskState::Running | state::TaskState::Assigned
                    );
                Ok(LogInfo {
                    ran: !latest || live || t.usage.is_some() || out.exists() || err.exists(),
                    out,
                    err,
                    attempt: n,
                    // An earlier attempt has ended; the latest ends with its task.
                    finished: !latest || t.state.is_final() || t.state == state::TaskState::Backoff,
                })
            }
            Some(t) => {
                // The latest attempt, unless it has not run (queued, or cancelled before it
                // started, as when the job failed): then the latest one that wrote anything,
                // whose output says why it ended.
                let live = matches!(
                    t.state,
                    state::TaskState::Running | state::TaskState::Assigned
                );
                let wrote = |n: u32| {
                    let (out, err) = self.log_paths(job, t.id, n);
                    out.exists() || err.exists()
                };
                let attempt = if live || wrote(t.attempts) {
                    t.attempts
                } else {
                    (1..t.attempts)
                        .rev()
                        .find(|&n| wrote(n))
                        .unwrap_or(t.attempts)
                };
                let (out, err) = self.log_paths(job, t.id, attempt);
                let ran = matches!(
                    t.state,
                    state::TaskState::Running | state::TaskState::Done | state::TaskState::Failed
                ) || t.usage.is_some()
                    || out.exists()
                    || err.exists();
                Ok(LogInfo {
                    out,
                    err,
                    attempt,
                    ran,
                    finished: t.state.is_final(),
                })
            }
        }
    }

    /// A worker registers: a new id and session, then everything it reports, in order: what
    /// it runs, what finished while it was away, then which of its old id's attempts it
    /// never had.
    fn on_register(
        &mut self,
        mut req: proto::RegisterRequest,
        (previous, (provider, price)): (Option<WorkerId>, (Option<String>, flotilla_pool::Price)),
        reply: Reply<proto::RegisterReply>,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        if req.protocol_version != PROTOCOL_VERSION {
            let _ = reply.send(Err(Status::failed_precondition(format!(
                "protocol version mismatch: the coordinator speaks {PROTOCOL_VERSION}, the worker {}",
                req.protocol_version
            ))));
            return;
        }
        if self.tls && !req.data_addr.is_empty() && req.data_cert.is_empty() {
            let _ = reply.send(Err(Status::failed_precondition(
                "this coordinator uses TLS, so workers' object servers must too: the worker \
                 offers plain TCP (an older version, or no --tls-ca)",
            )));
            return;
        }
        let worker = self.coord.next_worker_id();
        let (tx, rx) = mpsc::channel(self.worker_queue);
        self.senders.insert(worker, tx);
        self.sessions.lock().insert(worker, rx);
        self.last_seen.insert(worker, Instant::now());
        if !req.data_addr.is_empty() {
            self.addr_owner.insert(req.data_addr.clone(), worker);
            self.addr_cert
                .insert(req.data_addr.clone(), req.data_cert.clone());
        }
        let finished = std::mem::take(&mut req.finished);
        let leaves_at = req.leaves_in_ms.map(|ms| self.now().saturating_add(ms));
        self.coord.set_worker_leaves_at(worker, leaves_at);
        let mut ev = crate::convert::worker_joined(worker, req, previous);
        if let Event::WorkerJoined { spec, .. } = &mut ev {
            spec.provider = provider;
            spec.price = price;
        }
        self.handle(ev, cmds, records);
        for r in finished {
            self.finish_reported(worker, r, cmds, records);
        }
        if let Some(previous) = previous {
            self.handle(Event::WorkerReconciled { worker, previous }, cmds, records);
        }
        let hb = self.heartbeat.as_millis() as u64;
        let rdv_port = self
            .rendezvous
            .as_ref()
            .map_or(0, |r| u32::from(r.local_addr().port()));
        let rdv_cert = self.rendezvous_cert.clone();
        after.push(Box::new(move |_| {
            let _ = reply.send(Ok(proto::RegisterReply {
                worker: worker.0,
                heartbeat_ms: hb,
                protocol_version: PROTOCOL_VERSION,
                rendezvous_port: rdv_port,
                rendezvous_cert: rdv_cert,
                // Set by the handler, which knows the token it enrolled with.
                credential: String::new(),
                data_key: String::new(),
            }));
        }));
    }

    /// An attempt's end as its worker reported it; in transfer staging, the time its inputs
    /// took becomes a transfer span in the job's trace.
    fn finish_reported(
        &mut self,
        worker: WorkerId,
        r: proto::TaskResult,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) {
        let staged = r
            .task
            .as_ref()
            .filter(|_| r.stage_seconds > 0.0 && r.stage_bytes > 0)
            .map(|k| (crate::convert::task_key(k), r.stage_seconds, r.stage_bytes));
        if let Some(ev) = crate::convert::task_finished(worker, r) {
            if self.handle(ev, cmds, records) {
                if let Some(((task, attempt), secs, bytes)) = staged {
                    self.coord.note_transfer(task, attempt, secs, bytes);
                }
            }
        }
    }

    /// A batch from a worker's session: its output, then finishes (they free what the starts
    /// in the same batch use: the worker sent them in that order, and a task that started
    /// and finished within one batch has only its finish here), returns, starts.
    fn on_worker_message(
        &mut self,
        m: proto::WorkerMessage,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) {
        let worker = WorkerId::new(m.worker);
        if !self.senders.contains_key(&worker) {
            return; // a lost worker's late words
        }
        self.last_seen.insert(worker, Instant::now());
        for l in &m.logs {
            // Only the output of an attempt given to this worker: a session cannot write
            // into another task's log.
            let Some(k) = &l.task else { continue };
            let (task, attempt) = crate::convert::task_key(k);
            if self.coord.gave(worker, task, attempt) {
                self.write_log(worker, l);
            } else {
                tracing::debug!(%worker, %task, attempt, "output of an attempt it was not given: dropped");
            }
        }
        if let Some(available) = m.available {
            let ev = Event::WorkerAvailability { worker, available };
            self.handle(ev, cmds, records);
        }
        for r in m.finished {
            // Its output is whole: the end kept past the head follows it.
            if let Some(k) = &r.task {
                let (task, attempt) = crate::convert::task_key(k);
                if !self.log_tails.is_empty() {
                    self.flush_log_tails(|key, w| w == worker && key.0 == task && key.1 == attempt);
                }
            }
            if !r.checkpoint.is_empty() {
                if let Some(k) = &r.task {
                    let (task, attempt) = crate::convert::task_key(k);
                    if self.coord.gave(worker, task, attempt) {
                        let files: Vec<proto::Object> = r
                            .checkpoint
                            .iter()
                            .filter(|c| !c.hash.is_empty())
                            .map(|c| proto::Object {
                                path: c.path.clone(),
                                hash: c.hash.clone(),
                                size: c.size,
                            })
                            .collect();
                        self.note_checkpoint(task.job, task.task, attempt, &files);
                    }
                }
            }
            self.finish_reported(worker, r, cmds, records);
        }
        for k in m.returned {
            let (task, attempt) = crate::convert::task_key(&k);
            let ev = Event::TaskReturned {
                worker,
                task,
                attempt,
            };
            self.handle(ev, cmds, records);
        }
        for k in m.started {
            let (task, attempt) = crate::convert::task_key(&k);
            let ev = Event::TaskStarted {
                worker,
                task,
                attempt,
            };
            self.handle(ev, cmds, records);
        }
        if !m.copied.is_empty() || !m.copy_failed.is_empty() {
            self.on_copies(worker, &m.copied, &m.copy_failed, cmds, records);
        }
        if m.leaving && self.senders.contains_key(&worker) && !self.handoffs.contains_key(&worker) {
            // It said everything. What only it holds is copied to peers first (Dask's
            // `retire_workers`), so that no task runs again for its going; then closing its
            // commands ends its session (its own deadline ends it otherwise).
            let plan = self.coord.handoff(worker);
            if plan.is_empty() {
                self.let_go(worker, cmds, records);
            } else {
                self.order_copies(worker, plan);
            }
        }
    }

    /// A peer's reports on its copy orders: each copy ordered of it makes it a holder of the
    /// task's outputs (a worker cannot claim outputs it was not asked to copy); failures are
    /// left to lineage. Leavers whose copies are all done go at the end of the turn.
    fn on_copies(
        &mut self,
        worker: WorkerId,
        copied: &[proto::HeldObject],
        failed: &[proto::TaskKey],
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) {
        let ordered = |handoffs: &HashMap<WorkerId, HashMap<TaskRef, WorkerId>>, t: &TaskRef| {
            handoffs.values().any(|p| p.get(t) == Some(&worker))
        };
        let done: HashSet<TaskRef> = copied
            .iter()
            .filter_map(|h| h.task.as_ref())
            .map(|k| crate::convert::task_key(k).0)
            .filter(|t| ordered(&self.handoffs, t))
            .collect();
        for &task in &done {
            self.handle(Event::ObjectsCopied { worker, task }, cmds, records);
        }
        let gave_up: HashSet<TaskRef> = failed
            .iter()
            .map(|k| crate::convert::task_key(k).0)
            .filter(|t| ordered(&self.handoffs, t))
            .collect();
        if !gave_up.is_empty() {
            tracing::warn!(%worker, tasks = gave_up.len(), "could not copy a leaving worker's outputs: they are rebuilt if lost");
        }
        for pending in self.handoffs.values_mut() {
            pending.retain(|t, by| !(*by == worker && (done.contains(t) || gave_up.contains(t))));
        }
    }

    /// Sends each peer of `plan` its copy orders; `leaver` goes once they are done.
    fn order_copies(&mut self, leaver: WorkerId, plan: Vec<crate::state::Handoff>) {
        let workers = self.coord.workers_map();
        let Some(from) = workers.get(&leaver).map(|w| w.spec.data_addr.clone()) else {
            return;
        };
        let cert = self.addr_cert.get(&from).cloned().unwrap_or_default();
        let mut orders: HashMap<WorkerId, Vec<proto::CopyOrder>> = HashMap::new();
        let mut pending = HashMap::new();
        for h in plan {
            let inputs = h
                .objects
                .iter()
                .map(|o| proto::Input {
                    object: Some(proto::Object {
                        path: o.path.clone(),
                        hash: o.hash.clone(),
                        size: o.size,
                    }),
                    from: from.clone(),
                    ticket: self.access.ticket(leaver, &o.hash),
                    from_cert: cert.clone(),
                })
                .collect();
            self.metrics
                .transferred_bytes
                .inc_by(h.objects.iter().map(|o| o.size).sum());
            orders.entry(h.to).or_default().push(proto::CopyOrder {
                task: Some(crate::convert::key(h.task, 0)),
                inputs,
            });
            pending.insert(h.task, h.to);
        }
        let n = pending.len();
        for (to, copy) in orders {
            let sent = self.senders.get(&to).is_some_and(|tx| {
                tx.try_send(proto::CoordinatorMessage {
                    copy,
                    ..Default::default()
                })
                .is_ok()
            });
            if !sent {
                pending.retain(|_, by| *by != to);
            }
        }
        tracing::info!(worker = %leaver, tasks = n, "leaving: its outputs are copied to peers before it goes");
        self.handoffs.insert(leaver, pending);
    }

    /// Leavers whose copies are done (or whose copying peers are gone) go; a leaver that
    /// went meanwhile (its deadline) is forgotten.
    fn settle_handoffs(&mut self, cmds: &mut Vec<Command>, records: &mut Vec<JournalRecord>) {
        if self.handoffs.is_empty() {
            return;
        }
        let senders = &self.senders;
        self.handoffs
            .retain(|leaver, _| senders.contains_key(leaver));
        let mut done = Vec::new();
        for (leaver, pending) in &mut self.handoffs {
            pending.retain(|_, by| senders.contains_key(by));
            if pending.is_empty() {
                done.push(*leaver);
            }
        }
        for leaver in done {
            self.handoffs.remove(&leaver);
            self.let_go(leaver, cmds, records);
        }
    }

    /// Ends the session of a worker that said it leaves: closing its commands ends it.
    fn let_go(
        &mut self,
        worker: WorkerId,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) {
        if self.senders.remove(&worker).is_some() {
            self.last_seen.remove(&worker);
            tracing::info!(%worker, "worker left");
            let ev = Event::WorkerLost {
                worker,
                reason: LEFT.into(),
            };
            self.handle(ev, cmds, records);
        }
    }

    fn on_session_closed(
        &mut self,
        worker: WorkerId,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) {
        if self.senders.remove(&worker).is_some() {
            self.last_seen.remove(&worker);
            tracing::warn!(%worker, "worker's session closed: declared lost (its attempts are placed again)");
            let ev = Event::WorkerLost {
                worker,
                reason: "its session closed".into(),
            };
            self.handle(ev, cmds, records);
        }
    }

    fn check_heartbeats(&mut self, cmds: &mut Vec<Command>, records: &mut Vec<JournalRecord>) {
        // The ends kept of a gone worker's outputs: their attempts report no more.
        if !self.log_tails.is_empty() {
            let gone: HashSet<WorkerId> = self
                .log_tails
                .values()
                .map(|(w, _)| *w)
                .filter(|w| !self.senders.contains_key(w))
                .collect();
            if !gone.is_empty() {
                self.flush_log_tails(|_, w| gone.contains(&w));
            }
        }
        let timeout = self.heartbeat_timeout;
        let lost: Vec<WorkerId> = self
            .last_seen
            .iter()
            .filter(|(_, t)| t.elapsed() > timeout)
            .map(|(w, _)| *w)
            .collect();
        for w in lost {
            self.last_seen.remove(&w);
            self.senders.remove(&w);
            self.sessions.lock().remove(&w);
            tracing::warn!(worker = %w, "worker missed its heartbeats: declared lost");
            self.handle(
                Event::WorkerLost {
                    worker: w,
                    reason: format!("no heartbeat for {timeout:?}"),
                },
                cmds,
                records,
            );
        }
    }

    fn log_paths(&self, job: JobId, task: TaskId, attempt: u32) -> (PathBuf, PathBuf) {
        let dir = self.logs_dir.join(job.0.to_string());
        (
            dir.join(format!("{}.{attempt}.out", task.0)),
            dir.join(format!("{}.{attempt}.err", task.0)),
        )
    }

    /// Output of an attempt on `worker`: written to its log up to the cap's head; past it,
    /// its last bytes are kept for the attempt's end ([`super::logcap`]).
    fn write_log(&mut self, worker: WorkerId, l: &proto::TaskLog) {
        let Some(k) = &l.task else { return };
        let (task, attempt) = crate::convert::task_key(k);
        let (out, err) = self.log_paths(task.job, task.task, attempt);
        let path = if l.stderr { err } else { out };
        let cap = self.max_log_bytes;
        let have = std::fs::metadata(&path).map_or(0, |m| m.len());
        let (now, rest) = super::logcap::split(have, cap, &l.data);
        self.append_log(&path, &now);
        if rest.is_empty() {
            return;
        }
        let key = (task, attempt, l.stderr);
        if !self.log_tails.contains_key(&key) && self.log_tails.len() >= MAX_LOG_TAILS {
            return; // the rest is dropped: memory for ends is spent
        }
        self.log_tails
            .entry(key)
            .or_insert_with(|| (worker, super::logcap::Tail::new(cap)))
            .1
            .push(rest);
        // An attempt whose finish came first (re-sent on a reconnect, before the output
        // that waited with it): nothing more comes, its end is written now.
        if !self.coord.in_flight(task, attempt) {
            self.flush_log_tails(|k, _| *k == key);
        }
    }

    /// Appends `data` to the log at `path` (and, in a group, to the other nodes' copies).
    fn append_log(&self, path: &std::path::Path, data: &[u8]) {
        use std::io::Write;
        if data.is_empty() {
            return;
        }
        let r = (|| -> std::io::Result<()> {
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            f.write_all(data)?;
            // In a group, the other nodes keep the same log (best effort, in order).
            if let (Some(node), Ok(rel)) = (&self.group, path.strip_prefix(&self.logs_dir)) {
                node.replicate_log(&format!("logs/{}", rel.to_string_lossy()), data);
            }
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!("{}: {e}", path.display());
        }
    }

    /// Writes the kept ends of the outputs `which` picks, after their heads.
    fn flush_log_tails(&mut self, which: impl Fn(&(TaskRef, u32, bool), WorkerId) -> bool) {
        let keys: Vec<(TaskRef, u32, bool)> = self
            .log_tails
            .iter()
            .filter(|(k, (w, _))| which(k, *w))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some((_, tail)) = self.log_tails.remove(&key) {
                let (task, attempt, stderr) = key;
                let (out, err) = self.log_paths(task.job, task.task, attempt);
                let path = if stderr { &err } else { &out };
                self.append_log(path, &tail.flush());
                remove_quietly(&saved_tail(path));
            }
        }
    }

    /// Saves the changed kept ends beside their logs (`LOG.tail`, replaced whole), at most
    /// [`TAIL_SAVE_BYTES`] a time: a coordinator killed before an attempt ends appends them
    /// to the log when it starts again ([`recover_log_tails`]), and a chatty task's last
    /// lines (why it failed) survive its crash.
    fn save_log_tails(&mut self) {
        let mut budget = TAIL_SAVE_BYTES;
        let keys: Vec<(TaskRef, u32, bool)> = self
            .log_tails
            .iter()
            .filter(|(_, (_, t))| t.dirty)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            let (task, attempt, stderr) = key;
            let (out, err) = self.log_paths(task.job, task.task, attempt);
            let path = saved_tail(if stderr { &err } else { &out });
            let Some((_, tail)) = self.log_tails.get_mut(&key) else {
                continue;
            };
            let bytes = tail.saved();
            let tmp = path.with_extension("tail.tmp");
            let r = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = r {
                tracing::warn!("{}: {e}", path.display());
            }
            budget = budget.saturating_sub(bytes.len());
            if budget == 0 {
                break;
            }
        }
    }

    /// Sends commands: assignments batched per worker, notifications to watchers.
    fn dispatch(&mut self, cmds: Vec<Command>) {
        let mut per_worker: HashMap<WorkerId, proto::CoordinatorMessage> = HashMap::new();
        let mut progressed = Vec::new();
        for c in cmds {
            match c {
                Command::Assign { worker, tasks } => {
                    let m = per_worker.entry(worker).or_default();
                    for t in tasks {
                        let mut a = crate::convert::assignment(t);
                        if let Some(g) = a.gang.as_mut() {
                            // The key's second half is a secret only the gang's members
                            // get (the same for all of them, unguessable by others): the
                            // rendezvous admits only announced keys, so it is the token.
                            let secret = blake3::keyed_hash(&self.gang_secret, g.key.as_bytes());
                            g.key = format!("{}-{}", g.key, &secret.to_hex()[..32]);
                            // Only announced keys meet there, for a day at most.
                            if let Some(r) = &self.rendezvous {
                                r.expect(&g.key, g.size as usize, GANG_KEY_TTL);
                            }
                        }
                        self.add_uploaded_inputs(&mut a);
                        self.metrics.dispatched.inc();
                        for i in &mut a.inputs {
                            if let (Some(o), Some(&holder)) =
                                (&i.object, self.addr_owner.get(&i.from))
                            {
                                if holder != worker {
                                    self.metrics.transferred_bytes.inc_by(o.size);
                                }
                                i.ticket = self.access.ticket(holder, &o.hash);
                                i.from_cert =
                                    self.addr_cert.get(&i.from).cloned().unwrap_or_default();
                            } else if let (Some(o), true) = (&i.object, i.from.is_empty()) {
                                self.metrics.transferred_bytes.inc_by(o.size);
                                // A checkpoint to resume from, in the coordinator's store.
                                i.ticket = self.access.ticket(COORDINATOR_HOLDER, &o.hash);
                            }
                        }
                        m.assign.push(a);
                    }
                }
                Command::Cancel {
                    worker,
                    task,
                    attempt,
                } => {
                    per_worker
                        .entry(worker)
                        .or_default()
                        .cancel
                        .push(crate::convert::key(task, attempt));
                }
                Command::Retract {
                    worker,
                    task,
                    attempt,
                } => {
                    per_worker
                        .entry(worker)
                        .or_default()
                        .retract
                        .push(crate::convert::key(task, attempt));
                }
                Command::Notify(n) => self.notify(n, &mut progressed),
            }
        }
        self.send_progress(progressed);
        let mut broken = Vec::new();
        for (w, m) in per_worker {
            match self.senders.get(&w) {
                Some(tx) => match tx.try_send(m) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        // It does not read its commands: the coordinator will not hold them
                        // for it without limit. Dropping the sender ends its session.
                        tracing::warn!(worker = %w, "its command queue is full: dropped");
                        self.overflowed.push(w);
                        broken.push(w);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => broken.push(w),
                },
                None => tracing::debug!(worker = %w, "command for a worker without a session"),
            }
        }
        for w in broken {
            // The session is gone; the heartbeat check declares the worker lost.
            self.senders.remove(&w);
        }
    }

    /// Forwards notifications to watchers: every failure, backoff and cancellation as it
    /// happens, and one progress event per job per batch for the rest (a 10,000-task job
    /// would otherwise send 30,000 events).
    fn notify(&mut self, n: Notification, progressed: &mut Vec<JobId>) {
        match n {
            Notification::TaskState {
                task,
                name,
                state,
                attempt,
                worker,
                message,
            } => {
                if !self.watchers.contains_key(&task.job) {
                    return;
                }
                // Placed again for a reason outside it (its worker lost, its machine
                // reclaimed, its gang stopped, its inputs lost): said to watchers too. Not a
                // task taken back to move to a worker with room, nor one retried by
                // `flotilla retry` (said once by the command).
                let placed_again =
                    matches!(state, state::TaskState::Ready | state::TaskState::Waiting)
                        && attempt > 0
                        && message
                            .as_deref()
                            .is_some_and(|m| !m.starts_with("returned by") && m != "retried");
                if placed_again
                    || matches!(
                        state,
                        state::TaskState::Failed
                            | state::TaskState::Backoff
                            | state::TaskState::Cancelled
                    )
                {
                    let (done, total) = self.progress_of(task.job);
                    let ev = proto::JobEvent {
                        job: task.job.0,
                        task: task.task.0,
                        name,
                        state: state.to_string(),
                        attempt,
                        worker: worker.map(|w| w.0),
                        message: message.unwrap_or_default(),
                        job_finished: false,
                        job_state: String::new(),
                        done,
                        total,
                    };
                    if let Some(ws) = self.watchers.get_mut(&task.job) {
                        send_or_drop(ws, &ev);
                    }
                } else if !progressed.contains(&task.job) {
                    progressed.push(task.job);
                }
            }
            Notification::JobFinished { job, state } => {
                progressed.retain(|j| *j != job);
                let (done, total) = self.progress_of(job);
                if let Some(mut ws) = self.watchers.remove(&job) {
                    let ev = proto::JobEvent {
                        job: job.0,
                        job_finished: true,
                        job_state: state.to_string(),
                        done,
                        total,
                        ..Default::default()
                    };
                    send_or_drop(&mut ws, &ev);
                }
            }
        }
    }

    fn progress_of(&self, job: JobId) -> (u32, u32) {
        self.coord
            .job_summary(job)
            .map(|s| (s.done as u32, s.total as u32))
            .unwrap_or((0, 0))
    }

    fn send_progress(&mut self, jobs: Vec<JobId>) {
        for job in jobs {
            let (done, total) = self.progress_of(job);
            if let Some(ws) = self.watchers.get_mut(&job) {
                let ev = proto::JobEvent {
                    job: job.0,
                    state: "progress".into(),
                    done,
                    total,
                    ..Default::default()
                };
                send_or_drop(ws, &ev);
            }
        }
    }
}

/// `--tls-cert`/`--tls-key` that cannot serve, said as such, with the usual causes named.
pub(super) fn tls_files_error(tls: &crate::transport::ServerTls, why: &str) -> ClusterError {
    let hint = if why.contains("UnsupportedCertVersion") {
        "; the certificate must be X.509 version 3 with the server's names in subjectAltName \
         (made with `openssl x509 -req`, add `-extfile` with a line `subjectAltName=DNS:HOST` \
         or `IP:ADDR`)"
    } else if why.contains("KeyMismatch") || why.contains("inconsistent") {
        "; --tls-key is not the private key of --tls-cert"
    } else if why.contains("no certificate") {
        "; --tls-cert must hold the certificate (PEM), --tls-key its private key"
    } else {
        ""
    };
    ClusterError::Config(format!(
        "--tls-cert {} / --tls-key {}: {}{hint}",
        tls.cert.display(),
        tls.key.display(),
        why.replace("invalid peer certificate: ", "")
    ))
}

#[cfg(test)]
mod watch_tests {
    use super::*;

    #[test]
    fn a_watcher_that_does_not_read_is_dropped_and_the_others_kept() {
        // Watch streams were unbounded: a client that never read held the coordinator's
        // memory for every event of its job.
        let (slow, _slow_rx) = mpsc::channel(1);
        let (quick, mut quick_rx) = mpsc::channel(WATCH_BUFFER);
        let (gone, gone_rx) = mpsc::channel(1);
        drop(gone_rx);
        let mut ws = vec![slow, quick, gone];
        let ev = proto::JobEvent {
            job: 1,
            ..Default::default()
        };
        send_or_drop(&mut ws, &ev);
        assert_eq!(ws.len(), 2, "a closed watcher is dropped");
        send_or_drop(&mut ws, &ev);
        assert_eq!(ws.len(), 1, "a full watcher is dropped");
        assert!(quick_rx.try_recv().is_ok() && quick_rx.try_recv().is_ok());
    }
}

#[cfg(test)]
mod drain_tests {
    use super::*;

    fn live() -> Vec<(WorkerId, String)> {
        vec![
            (WorkerId::new(9), "w2".into()),
            (WorkerId::new(11), "w9".into()),
            (WorkerId::new(12), "gpu-host".into()),
            (WorkerId::new(13), "gpu-host".into()),
        ]
    }

    /// `drain w9` drained both worker w9 and the worker named w9 (an operator's
    /// walkthrough): a word that is one worker's id and another's name is refused.
    #[test]
    fn a_word_that_is_an_id_and_another_worker_s_name_is_refused() {
        let e = drained(&live(), "w9").unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.message().contains(
                "\"w9\" is the id of worker w9 and the name of w11: say `id:w9` or `name:w9`"
            ),
            "{}",
            e.message()
        );
        assert_eq!(drained(&live(), "id:w9").unwrap(), vec![WorkerId::new(9)]);
        assert_eq!(
            drained(&live(), "name:w9").unwrap(),
            vec![WorkerId::new(11)]
        );
    }

    #[test]
    fn a_name_drains_every_worker_of_it_and_an_id_its_worker() {
        let host = drained(&live(), "gpu-host").unwrap();
        assert_eq!(host, vec![WorkerId::new(12), WorkerId::new(13)]);
        assert_eq!(drained(&live(), "w12").unwrap(), vec![WorkerId::new(12)]);
        assert_eq!(drained(&live(), "w2").unwrap(), vec![WorkerId::new(9)]);
        let none = drained(&live(), "id:gpu-host").unwrap_err();
        assert_eq!(none.message(), "no live worker with id \"gpu-host\"");
        let none = drained(&live(), "nope").unwrap_err();
        assert_eq!(none.message(), "no live worker named, or with id, \"nope\"");
    }
}
