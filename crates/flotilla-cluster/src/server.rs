//! The coordinator process: the gRPC services around the pure state machine.
//!
//! # Threads
//! - tonic's async handlers validate requests and forward them to the *core*.
//! - the *core* is one dedicated thread that owns the [`Coordinator`] and the [`Journal`].
//!   It takes requests in batches; for each batch it applies the events, writes every
//!   journaled event and every assignment record in ONE journal transaction (group commit),
//!   and only then answers the requests and sends the commands. Nothing is acknowledged or
//!   dispatched before it is durable, so a coordinator killed at any point and restarted on
//!   the same state directory loses nothing it accepted.
//!
//! # Liveness
//! Workers send a message at least every heartbeat interval. A worker silent for the
//! heartbeat timeout, or whose session stream closes, is declared lost.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use flotilla_core::{JobId, TaskId, WorkerId};
use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{load_or_create_token, TokenCheck};
use crate::error::{ClusterError, Result};
use crate::journal::Journal;
use crate::proto::coordinator_server::{Coordinator as CoordinatorRpc, CoordinatorServer};
use crate::proto::workers_server::{Workers, WorkersServer};
use crate::proto::{self, PROTOCOL_VERSION};
use crate::state::JournalRecord;
use crate::state::{self, Command, Coordinator, Event, Millis, Notification};
use crate::transport::ServerTls;

/// How a coordinator is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where to listen (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// The state directory: journal, token, logs.
    pub state_dir: PathBuf,
    /// TLS certificate and key; plain TCP when `None`.
    pub tls: Option<ServerTls>,
    /// How often workers must send something.
    pub heartbeat: Duration,
    /// How long a silent worker has before it is declared lost.
    pub heartbeat_timeout: Duration,
    /// The state machine's settings.
    pub coordinator: state::Config,
    /// fsync the journal before acknowledging anything (survives a machine crash, not only a
    /// coordinator crash; costs an fsync per batch).
    pub fsync: bool,
}

impl ServerConfig {
    /// Defaults: heartbeat 1 s, timeout 5 s.
    pub fn new(listen: SocketAddr, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            state_dir: state_dir.into(),
            tls: None,
            heartbeat: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            coordinator: state::Config::default(),
            fsync: false,
        }
    }
}

/// A running coordinator.
pub struct Server {
    addr: SocketAddr,
    token: String,
    stop: Arc<watch::Sender<bool>>,
    done: watch::Receiver<Option<std::result::Result<(), String>>>,
}

impl Server {
    /// Opens the state directory (replaying the journal), binds, and starts serving.
    pub async fn start(config: ServerConfig) -> Result<Server> {
        std::fs::create_dir_all(&config.state_dir)
            .map_err(|e| ClusterError::io(&config.state_dir, e))?;
        let token = load_or_create_token(&config.state_dir)?;
        let journal_path = config.state_dir.join("journal.log");
        let journal =
            Journal::open(&journal_path).map_err(|e| ClusterError::Journal(e.to_string()))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(None);
        let (req_tx, req_rx) = crossbeam_channel::unbounded::<Req>();
        let sessions: Arc<
            Mutex<HashMap<WorkerId, mpsc::UnboundedReceiver<proto::CoordinatorMessage>>>,
        > = Arc::new(Mutex::new(HashMap::new()));
        let core = Core::recover(&config, journal, sessions.clone(), stop_tx.clone())?;
        std::thread::Builder::new()
            .name("flotilla-core".into())
            .spawn(move || core.run(req_rx))
            .map_err(|e| ClusterError::Config(format!("cannot start the core thread: {e}")))?;

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                ClusterError::Config(format!("cannot listen on {}: {e}", config.listen))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| ClusterError::Config(format!("listener address: {e}")))?;
        let check = TokenCheck::new(token.clone());
        let store = Arc::new(crate::objects::ObjectStore::open(
            &config.state_dir.join("objects"),
        )?);
        let api = Api {
            core: req_tx.clone(),
            sessions,
            store: store.clone(),
        };
        let mut builder = tonic::transport::Server::builder().tcp_nodelay(true);
        if let Some(tls) = &config.tls {
            builder = builder
                .tls_config(tls.config()?)
                .map_err(|e| ClusterError::Config(format!("tls: {e}")))?;
        }
        let router = builder
            .add_service(tonic::service::interceptor::InterceptedService::new(
                CoordinatorServer::new(api.clone())
                    .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES),
                check.clone(),
            ))
            .add_service(tonic::service::interceptor::InterceptedService::new(
                WorkersServer::new(api)
                    .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES),
                check.clone(),
            ))
            .add_service(crate::objects::objects_service(store, check));
        let mut stop_wait = stop_rx.clone();
        let req_for_stop = req_tx;
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let r = router
                .serve_with_incoming_shutdown(incoming, async move {
                    while !*stop_wait.borrow() {
                        if stop_wait.changed().await.is_err() {
                            break;
                        }
                    }
                })
                .await;
            let _ = req_for_stop.send(Req::Stop);
            let _ = done_tx.send(Some(r.map_err(|e| e.to_string())));
        });
        tracing::info!(%addr, "coordinator listening");
        Ok(Server {
            addr,
            token,
            stop: Arc::new(stop_tx),
            done: done_rx,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The access token clients and workers must present.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Asks the server to stop.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// A handle that stops the server from elsewhere (a signal handler).
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    /// Waits until the server has stopped (after `stop`, a `Shutdown` request, or an error).
    pub async fn wait(mut self) -> Result<()> {
        loop {
            if let Some(r) = self.done.borrow().clone() {
                return r.map_err(|e| ClusterError::Rpc(format!("server: {e}")));
            }
            if self.done.changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Stops a [`Server`].
#[derive(Clone)]
pub struct StopHandle(Arc<watch::Sender<bool>>);

impl StopHandle {
    /// Asks the server to stop.
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

type Reply<T> = oneshot::Sender<std::result::Result<T, Status>>;

/// What the handlers ask of the core.
enum Req {
    Submit {
        spec: flotilla_core::JobSpec,
        dir: String,
        tenant: String,
        /// Uploaded job-folder files (transfer staging), already in the store.
        files: Vec<proto::Object>,
        reply: Reply<proto::SubmitReply>,
    },
    Cancel {
        job: JobId,
        reply: Reply<()>,
    },
    Status {
        job: Option<JobId>,
        reply: Reply<String>,
    },
    Outputs {
        job: JobId,
        reply: Reply<Vec<proto::Input>>,
    },
    Watch {
        job: JobId,
        tx: mpsc::UnboundedSender<std::result::Result<proto::JobEvent, Status>>,
    },
    LogInfo {
        job: JobId,
        task: String,
        reply: Reply<LogInfo>,
    },
    Register {
        req: proto::RegisterRequest,
        reply: Reply<proto::RegisterReply>,
    },
    FromWorker(proto::WorkerMessage),
    SessionClosed(WorkerId),
    Shutdown,
    Stop,
}

/// Replies sent once the batch they answer is durable.
type AfterCommit = Box<dyn FnOnce(&mut Core)>;

/// Where a task's logs are and whether more may come.
#[derive(Clone, Debug)]
struct LogInfo {
    out: PathBuf,
    err: PathBuf,
    finished: bool,
}

/// The thread that owns the state machine.
struct Core {
    coord: Coordinator,
    journal: Journal,
    epoch: Instant,
    sessions: Arc<Mutex<HashMap<WorkerId, mpsc::UnboundedReceiver<proto::CoordinatorMessage>>>>,
    senders: HashMap<WorkerId, mpsc::UnboundedSender<proto::CoordinatorMessage>>,
    last_seen: HashMap<WorkerId, Instant>,
    watchers:
        HashMap<JobId, Vec<mpsc::UnboundedSender<std::result::Result<proto::JobEvent, Status>>>>,
    logs_dir: PathBuf,
    heartbeat: Duration,
    heartbeat_timeout: Duration,
    stop: watch::Sender<bool>,
    /// Transfer staging: files uploaded with each job, by path.
    uploads: HashMap<JobId, HashMap<String, proto::Object>>,
    /// Where `uploads` is kept across restarts (`<job>.json`).
    uploads_dir: PathBuf,
    /// The rendezvous service of gangs (`group`): ranks meet there to build their
    /// communicator. Kept alive with the core.
    rendezvous: Option<flotilla_collective::RendezvousServer>,
    /// Appended to gang keys so that they cannot be guessed from job and task ids.
    gang_nonce: String,
}

impl Core {
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
        let r = std::fs::create_dir_all(&self.uploads_dir).and_then(|()| {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&list).unwrap_or_default())?;
            std::fs::rename(&tmp, &path)
        });
        if let Err(e) = r {
            tracing::warn!("{}: {e}", path.display());
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
                    for (path, o) in files {
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
            object: Some(o.clone()),
            from: String::new(),
        }));
    }

    /// Transfer staging: every output of the job's done tasks, in task order, with the data
    /// address of a live worker holding it.
    fn outputs(&self, job: JobId) -> std::result::Result<Vec<proto::Input>, Status> {
        let Some(j) = self.coord.jobs_map().get(&job) else {
            return Err(Status::not_found(format!("no job {job}")));
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
                    "the outputs of {job}/{t} ({}) are held by no live worker",
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
                });
            }
        }
        Ok(out)
    }

    fn now(&self) -> Millis {
        self.epoch.elapsed().as_millis() as Millis
    }

    /// Builds the state machine from the journal.
    fn recover(
        config: &ServerConfig,
        journal: Journal,
        sessions: Arc<Mutex<HashMap<WorkerId, mpsc::UnboundedReceiver<proto::CoordinatorMessage>>>>,
        stop: watch::Sender<bool>,
    ) -> Result<Core> {
        let mut core = Core {
            coord: Coordinator::new(config.coordinator.clone()),
            journal,
            epoch: Instant::now(),
            sessions,
            senders: HashMap::new(),
            last_seen: HashMap::new(),
            watchers: HashMap::new(),
            logs_dir: config.state_dir.join("logs"),
            heartbeat: config.heartbeat,
            heartbeat_timeout: config.heartbeat_timeout,
            stop,
            uploads: HashMap::new(),
            uploads_dir: config.state_dir.join("uploads"),
            rendezvous: None,
            gang_nonce: {
                use rand::RngCore;
                let mut bytes = [0u8; 8];
                rand::rngs::OsRng.fill_bytes(&mut bytes);
                bytes.iter().map(|b| format!("{b:02x}")).collect()
            },
        };
        let rdv_addr = SocketAddr::new(config.listen.ip(), 0).to_string();
        core.rendezvous = Some(
            flotilla_collective::RendezvousServer::bind(&rdv_addr).map_err(|e| {
                ClusterError::Config(format!(
                    "cannot start the gang rendezvous on {rdv_addr}: {e}"
                ))
            })?,
        );
        core.load_uploads();
        let records = core
            .journal
            .replay()
            .map_err(|e| ClusterError::Journal(e.to_string()))?;
        let n = records.len();
        let now = core.now();
        let mut sink = Vec::new();
        for r in records {
            core.coord
                .replay(now, r, &mut sink)
                .map_err(|e| ClusterError::Journal(format!("replaying the journal: {e}")))?;
            sink.clear();
        }
        core.coord.recovered(now);
        let _ = core.coord.take_journal_records();
        if n > 0 {
            tracing::info!(records = n, "recovered from the journal");
        }
        Ok(core)
    }

    fn run(mut self, rx: Receiver<Req>) {
        let tick = Duration::from_millis(50);
        let mut last_tick = Instant::now();
        loop {
            let first = match rx.recv_timeout(tick) {
                Ok(r) => Some(r),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            };
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
            if last_tick.elapsed() >= tick {
                last_tick = Instant::now();
                self.check_heartbeats(&mut cmds, &mut records);
                self.handle(Event::Tick, &mut cmds, &mut records);
            }
            if !records.is_empty() {
                if let Err(e) = self.journal.append(&records) {
                    // Nothing of this batch may be acknowledged: stop, and let a restart replay
                    // what is durable.
                    tracing::error!("journal write failed, stopping: {e}");
                    let _ = self.stop.send(true);
                    return;
                }
            }
            for f in after {
                f(&mut self);
            }
            self.dispatch(cmds);
            if stop {
                return;
            }
        }
    }

    /// Applies one event, collecting its journal records (the event itself when journaled,
    /// then the assignments it caused) and commands.
    fn handle(
        &mut self,
        ev: Event,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
    ) -> bool {
        let now = self.now();
        let rec = JournalRecord::from_event(&ev);
        match self.coord.handle(now, ev, cmds) {
            Ok(()) => {
                if let Some(r) = rec {
                    records.push(r);
                }
                records.extend(self.coord.take_journal_records());
                true
            }
            Err(e) => {
                tracing::warn!("event refused: {e}");
                false
            }
        }
    }

    fn apply(
        &mut self,
        req: Req,
        cmds: &mut Vec<Command>,
        records: &mut Vec<JournalRecord>,
        after: &mut Vec<AfterCommit>,
    ) {
        match req {
            Req::Submit {
                spec,
                dir,
                tenant,
                files,
                reply,
            } => {
                let job = self.coord.next_job_id();
                let name = spec.name.clone();
                let ev = Event::JobSubmitted {
                    job,
                    spec,
                    dir,
                    tenant,
                };
                let rec = JournalRecord::from_event(&ev);
                let now = self.now();
                match self.coord.handle(now, ev, cmds) {
                    Ok(()) => {
                        self.note_uploads(job, files);
                        records.extend(rec);
                        records.extend(self.coord.take_journal_records());
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
                    Err(e) => {
                        let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
                    }
                }
            }
            Req::Cancel { job, reply } => {
                if self.coord.job_summary(job).is_none() {
                    let _ = reply.send(Err(Status::not_found(format!("no job {job}"))));
                    return;
                }
                self.handle(Event::JobCancelled { job }, cmds, records);
                after.push(Box::new(move |_| {
                    let _ = reply.send(Ok(()));
                }));
            }
            Req::Status { job, reply } => {
                let json = match job {
                    Some(j) => match self.coord.job_status(j) {
                        Some(s) => serde_json::to_string(&s),
                        None => {
                            let _ = reply.send(Err(Status::not_found(format!("no job {j}"))));
                            return;
                        }
                    },
                    None => serde_json::to_string(&serde_json::json!({
                        "jobs": self.coord.jobs(),
                        "workers": self.coord.workers(),
                    })),
                };
                let _ = reply.send(json.map_err(|e| Status::internal(e.to_string())));
            }
            Req::Outputs { job, reply } => {
                let _ = reply.send(self.outputs(job));
            }
            Req::Watch { job, tx } => match self.coord.job_summary(job) {
                None => {
                    let _ = tx.send(Err(Status::not_found(format!("no job {job}"))));
                }
                Some(s) => {
                    let (done, total) = (s.done as u32, s.total as u32);
                    if s.state != state::JobState::Running {
                        let state = s.state;
                        let _ = tx.send(Ok(proto::JobEvent {
                            job: job.0,
                            job_finished: true,
                            job_state: state.to_string(),
                            done,
                            total,
                            ..Default::default()
                        }));
                    } else {
                        let _ = tx.send(Ok(proto::JobEvent {
                            job: job.0,
                            state: "running".into(),
                            done,
                            total,
                            ..Default::default()
                        }));
                        self.watchers.entry(job).or_default().push(tx);
                    }
                }
            },
            Req::LogInfo { job, task, reply } => {
                let r = match self.coord.task_status(job, &task) {
                    None if self.coord.job_summary(job).is_none() => {
                        Err(Status::not_found(format!("no job {job}")))
                    }
                    None => Err(Status::not_found(format!(
                        "job {job} has no task named {task:?}"
                    ))),
                    Some(t) => {
                        let (out, err) = self.log_paths(job, t.id, t.attempts);
                        Ok(LogInfo {
                            out,
                            err,
                            finished: t.state.is_final(),
                        })
                    }
                };
                let _ = reply.send(r);
            }
            Req::Register { mut req, reply } => {
                if req.protocol_version != PROTOCOL_VERSION {
                    let _ = reply.send(Err(Status::failed_precondition(format!(
                        "protocol version mismatch: the coordinator speaks {PROTOCOL_VERSION}, the worker {}",
                        req.protocol_version
                    ))));
                    return;
                }
                let worker = self.coord.next_worker_id();
                let (tx, rx) = mpsc::unbounded_channel();
                self.senders.insert(worker, tx);
                self.sessions.lock().insert(worker, rx);
                self.last_seen.insert(worker, Instant::now());
                // Everything the worker reports, in order: what it runs, what finished while
                // it was away, then which of its old id's attempts it never had.
                let previous = req.previous_worker.map(WorkerId::new);
                let finished = std::mem::take(&mut req.finished);
                let ev = crate::convert::worker_joined(worker, req);
                self.handle(ev, cmds, records);
                for r in finished {
                    if let Some(ev) = crate::convert::task_finished(worker, r) {
                        self.handle(ev, cmds, records);
                    }
                }
                if let Some(previous) = previous {
                    self.handle(Event::WorkerReconciled { worker, previous }, cmds, records);
                }
                let hb = self.heartbeat.as_millis() as u64;
                let rdv_port = self
                    .rendezvous
                    .as_ref()
                    .map_or(0, |r| u32::from(r.local_addr().port()));
                after.push(Box::new(move |_| {
                    let _ = reply.send(Ok(proto::RegisterReply {
                        worker: worker.0,
                        heartbeat_ms: hb,
                        protocol_version: PROTOCOL_VERSION,
                        rendezvous_port: rdv_port,
                    }));
                }));
            }
            Req::FromWorker(m) => {
                let worker = WorkerId::new(m.worker);
                if !self.senders.contains_key(&worker) {
                    return; // a lost worker's late words
                }
                self.last_seen.insert(worker, Instant::now());
                for l in &m.logs {
                    self.write_log(l);
                }
                // Finishes first: they free what the starts in the same batch use (the
                // worker sent them in that order; a task that started and finished within
                // one batch has only its finish here).
                for r in m.finished {
                    if let Some(ev) = crate::convert::task_finished(worker, r) {
                        self.handle(ev, cmds, records);
                    }
                }
                for k in m.returned {
                    let (task, attempt) = crate::convert::task_key(&k);
                    self.handle(
                        Event::TaskReturned {
                            worker,
                            task,
                            attempt,
                        },
                        cmds,
                        records,
                    );
                }
                for k in m.started {
                    let (task, attempt) = crate::convert::task_key(&k);
                    self.handle(
                        Event::TaskStarted {
                            worker,
                            task,
                            attempt,
                        },
                        cmds,
                        records,
                    );
                }
            }
            Req::SessionClosed(worker) => {
                if self.senders.remove(&worker).is_some() {
                    self.last_seen.remove(&worker);
                    self.handle(
                        Event::WorkerLost {
                            worker,
                            reason: "its session closed".into(),
                        },
                        cmds,
                        records,
                    );
                }
            }
            Req::Shutdown => {
                let _ = self.stop.send(true);
            }
            Req::Stop => {}
        }
    }

    fn check_heartbeats(&mut self, cmds: &mut Vec<Command>, records: &mut Vec<JournalRecord>) {
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

    fn write_log(&self, l: &proto::TaskLog) {
        use std::io::Write;
        let Some(k) = &l.task else { return };
        let (out, err) = self.log_paths(JobId::new(k.job), TaskId::new(k.task), k.attempt);
        let path = if l.stderr { err } else { out };
        let r = (|| -> std::io::Result<()> {
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            f.write_all(&l.data)
        })();
        if let Err(e) = r {
            tracing::warn!("{}: {e}", path.display());
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
                            g.key = format!("{}-{}", g.key, self.gang_nonce);
                        }
                        self.add_uploaded_inputs(&mut a);
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
                Some(tx) => {
                    if tx.send(m).is_err() {
                        broken.push(w);
                    }
                }
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
                if matches!(
                    state,
                    state::TaskState::Failed
                        | state::TaskState::Backoff
                        | state::TaskState::Cancelled
                ) {
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
                        ws.retain(|tx| tx.send(Ok(ev.clone())).is_ok());
                    }
                } else if !progressed.contains(&task.job) {
                    progressed.push(task.job);
                }
            }
            Notification::JobFinished { job, state } => {
                progressed.retain(|j| *j != job);
                let (done, total) = self.progress_of(job);
                if let Some(ws) = self.watchers.remove(&job) {
                    for tx in ws {
                        let _ = tx.send(Ok(proto::JobEvent {
                            job: job.0,
                            job_finished: true,
                            job_state: state.to_string(),
                            done,
                            total,
                            ..Default::default()
                        }));
                    }
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
                ws.retain(|tx| tx.send(Ok(ev.clone())).is_ok());
            }
        }
    }
}

/// The gRPC handlers.
#[derive(Clone)]
struct Api {
    core: Sender<Req>,
    sessions: Arc<Mutex<HashMap<WorkerId, mpsc::UnboundedReceiver<proto::CoordinatorMessage>>>>,
    /// Files uploaded with transfer jobs, served to workers by `Objects.Fetch`.
    store: Arc<crate::objects::ObjectStore>,
}

impl Api {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Req) -> std::result::Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.core
            .send(make(tx))
            .map_err(|_| Status::unavailable("the coordinator is stopping"))?;
        rx.await
            .map_err(|_| Status::unavailable("the coordinator is stopping"))?
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl CoordinatorRpc for Api {
    async fn submit(
        &self,
        req: Request<proto::SubmitRequest>,
    ) -> std::result::Result<Response<proto::SubmitReply>, Status> {
        let r = req.into_inner();
        let spec = flotilla_core::parse_job(&r.toml, &r.file_name)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !Path::new(&r.dir).is_absolute() {
            return Err(Status::invalid_argument(format!(
                "job folder {:?} must be an absolute path",
                r.dir
            )));
        }
        let mut files = Vec::with_capacity(r.files.len());
        for f in &r.files {
            crate::objects::safe_relative(&f.path)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let (hash, size) = self
                .store
                .put_bytes(&f.data)
                .map_err(|e| Status::internal(format!("storing {}: {e}", f.path)))?;
            files.push(proto::Object {
                path: f.path.clone(),
                hash,
                size,
            });
        }
        let reply = self
            .ask(|reply| Req::Submit {
                spec,
                dir: r.dir,
                tenant: r.tenant,
                files,
                reply,
            })
            .await?;
        Ok(Response::new(reply))
    }

    async fn status(
        &self,
        req: Request<proto::StatusRequest>,
    ) -> std::result::Result<Response<proto::StatusReply>, Status> {
        let job = req.into_inner().job.map(JobId::new);
        let json = self.ask(|reply| Req::Status { job, reply }).await?;
        Ok(Response::new(proto::StatusReply { json }))
    }

    type WatchStream = BoxStream<proto::JobEvent>;
    async fn watch(
        &self,
        req: Request<proto::WatchRequest>,
    ) -> std::result::Result<Response<Self::WatchStream>, Status> {
        let job = JobId::new(req.into_inner().job);
        let (tx, rx) = mpsc::unbounded_channel();
        self.core
            .send(Req::Watch { job, tx })
            .map_err(|_| Status::unavailable("the coordinator is stopping"))?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }

    async fn cancel(
        &self,
        req: Request<proto::CancelRequest>,
    ) -> std::result::Result<Response<proto::CancelReply>, Status> {
        let job = JobId::new(req.into_inner().job);
        self.ask(|reply| Req::Cancel { job, reply }).await?;
        Ok(Response::new(proto::CancelReply {}))
    }

    type LogsStream = BoxStream<proto::LogChunk>;
    async fn logs(
        &self,
        req: Request<proto::LogsRequest>,
    ) -> std::result::Result<Response<Self::LogsStream>, Status> {
        let r = req.into_inner();
        let job = JobId::new(r.job);
        let info = self
            .ask(|reply| Req::LogInfo {
                job,
                task: r.task.clone(),
                reply,
            })
            .await?;
        let (tx, rx) = mpsc::channel(8);
        let core = self.core.clone();
        let task = r.task.clone();
        tokio::spawn(async move {
            let path = if r.stderr {
                info.err.clone()
            } else {
                info.out.clone()
            };
            let mut off = 0u64;
            let mut finished = info.finished;
            loop {
                let chunk = {
                    let p = path.clone();
                    let o = off;
                    tokio::task::spawn_blocking(move || read_chunk(&p, o))
                        .await
                        .unwrap_or_default()
                };
                if !chunk.is_empty() {
                    off += chunk.len() as u64;
                    if tx
                        .send(Ok(proto::LogChunk {
                            data: chunk,
                            stderr: r.stderr,
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                if finished || !r.follow {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (rtx, rrx) = oneshot::channel();
                if core
                    .send(Req::LogInfo {
                        job,
                        task: task.clone(),
                        reply: rtx,
                    })
                    .is_err()
                {
                    return;
                }
                match rrx.await {
                    Ok(Ok(i)) => {
                        if (if r.stderr { &i.err } else { &i.out }) != &path {
                            // A new attempt started; its log is another file.
                            finished = false;
                        } else {
                            finished = i.finished;
                        }
                    }
                    _ => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn outputs(
        &self,
        req: Request<proto::OutputsRequest>,
    ) -> std::result::Result<Response<proto::OutputsReply>, Status> {
        let job = JobId::new(req.into_inner().job);
        let outputs = self.ask(|reply| Req::Outputs { job, reply }).await?;
        Ok(Response::new(proto::OutputsReply { outputs }))
    }

    async fn shutdown(
        &self,
        _req: Request<proto::ShutdownRequest>,
    ) -> std::result::Result<Response<proto::ShutdownReply>, Status> {
        let _ = self.core.send(Req::Shutdown);
        Ok(Response::new(proto::ShutdownReply {}))
    }
}

fn read_chunk(path: &Path, off: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(off)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(1 << 20).read_to_end(&mut buf);
    buf
}

#[tonic::async_trait]
impl Workers for Api {
    async fn register(
        &self,
        req: Request<proto::RegisterRequest>,
    ) -> std::result::Result<Response<proto::RegisterReply>, Status> {
        let req = req.into_inner();
        let reply = self.ask(|reply| Req::Register { req, reply }).await?;
        Ok(Response::new(reply))
    }

    type SessionStream = BoxStream<proto::CoordinatorMessage>;
    async fn session(
        &self,
        req: Request<Streaming<proto::WorkerMessage>>,
    ) -> std::result::Result<Response<Self::SessionStream>, Status> {
        let mut inbound = req.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("a session starts with a message naming the worker")
        })?;
        let worker = WorkerId::new(first.worker);
        let rx = self.sessions.lock().remove(&worker).ok_or_else(|| {
            Status::failed_precondition(format!(
                "worker {worker} is not registered (or already has a session)"
            ))
        })?;
        let core = self.core.clone();
        let _ = core.send(Req::FromWorker(first));
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(m)) => {
                        if m.worker != worker.0 {
                            tracing::warn!(%worker, claimed = m.worker, "session message names another worker; closing");
                            break;
                        }
                        if core.send(Req::FromWorker(m)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(%worker, "session stream error: {}", e.message());
                        break;
                    }
                }
            }
            let _ = core.send(Req::SessionClosed(worker));
        });
        let out = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            Ok,
        );
        Ok(Response::new(Box::pin(out)))
    }
}
