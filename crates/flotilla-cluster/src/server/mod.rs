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
//! # Supervision
//! If the core thread panics, or cannot write the journal, the server stops and
//! [`Server::wait`] returns the error (the binary exits non-zero with it), so a supervisor
//! restarts the process and the journal brings back everything acknowledged. It never stays
//! up without its core.
//!
//! # Liveness
//! Workers send a message at least every heartbeat interval. A worker silent for the
//! heartbeat timeout, or whose session stream closes, is declared lost.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::WorkerId;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::access::Access;
use crate::auth::{load_or_create_token, Authn};
use crate::error::{ClusterError, Result};
use crate::journal::{Journal, SyncMode};
use crate::proto::admin_server::AdminServer;
use crate::proto::coordinator_server::CoordinatorServer;
use crate::proto::workers_server::WorkersServer;
use crate::proto::{self};
use crate::state::{self};
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
    /// Take the admin token from this file (a mounted Secret, a systemd credential) instead
    /// of `STATE/token`, which is then neither read nor written.
    pub admin_token_file: Option<PathBuf>,
    /// How often workers must send something.
    pub heartbeat: Duration,
    /// How long a silent worker has before it is declared lost.
    pub heartbeat_timeout: Duration,
    /// The state machine's settings.
    pub coordinator: state::Config,
    /// fsync the journal before acknowledging anything (survives a machine crash, not only a
    /// coordinator crash; costs an fsync per batch).
    pub fsync: bool,
    /// When the journal has a damaged record (not a torn tail), keep the valid records before
    /// it and set the damaged file aside instead of refusing to start.
    pub recover_journal: bool,
    /// The most task instances one submitted job may expand to.
    pub max_job_tasks: u64,
    /// The most bytes kept of each output stream (stdout, stderr) of each attempt.
    pub max_log_bytes: u64,
    /// Messages waiting for one worker before it is dropped as not reading.
    pub worker_queue: usize,
    /// Requests waiting for the core before new ones are refused as busy (a worker's
    /// session waits instead: backpressure on its stream).
    pub core_queue: usize,
    /// Streams (`watch`, `logs`, a worker's session) one token may have open at once.
    pub max_streams: usize,
    /// How long a finished job is kept (its status, logs, uploads, its objects on workers)
    /// before it is removed as by `flotilla rm`; `None`: until removed.
    pub retain_finished: Option<Duration>,
    /// Rewrite the journal without removed jobs' records once those are at least this many
    /// bytes and half the file (see [`Journal::start_compaction`](crate::journal::Journal::start_compaction));
    /// `None`: never.
    pub compact_journal_after: Option<u64>,
    /// The most bytes the files uploaded with jobs may take on the coordinator; a submission
    /// beyond is refused (`RESOURCE_EXHAUSTED`). `None`: no cap.
    pub max_uploads: Option<u64>,
    /// Connections one peer address may hold open at once on the gRPC port.
    pub max_connections_per_peer: usize,
    /// Where to serve HTTP (`/metrics`), if anywhere.
    pub http_listen: Option<SocketAddr>,
    /// A node of a group of coordinators (`--node-id N --peers A,B,C`); `None`: alone.
    pub group: Option<crate::ha::GroupConfig>,
    /// How often the allocator (`flotilla alloc`) looks at its queues.
    pub alloc_interval: Duration,
    /// The gang rendezvous's port, on the IP of `listen` (0: the kernel picks one at start).
    pub rendezvous_port: u16,
    /// In a Kubernetes pod: set each worker pod's `controller.kubernetes.io/pod-deletion-cost`
    /// to the attempts on it, so that a scale-down takes idle workers first
    /// ([`crate::kube`]). `None`: not set.
    pub pod_deletion_cost: Option<crate::kube::InCluster>,
}

/// The default for [`ServerConfig::alloc_interval`].
pub const DEFAULT_ALLOC_INTERVAL: Duration = Duration::from_secs(5);

/// The default for [`ServerConfig::max_connections_per_peer`].
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 1024;

/// The default for [`ServerConfig::compact_journal_after`]: 64 MiB.
pub const DEFAULT_COMPACT_JOURNAL_AFTER: u64 = 64 << 20;

/// The default for [`ServerConfig::retain_finished`]: 7 days.
pub const DEFAULT_RETAIN_FINISHED: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default for [`ServerConfig::max_streams`].
pub const DEFAULT_MAX_STREAMS: usize = 256;

/// The default for [`ServerConfig::worker_queue`].
pub const DEFAULT_WORKER_QUEUE: usize = 4096;

/// The default for [`ServerConfig::core_queue`].
pub const DEFAULT_CORE_QUEUE: usize = 65_536;

/// The default for [`ServerConfig::max_log_bytes`]: 64 MiB.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 << 20;

/// The default for [`ServerConfig::max_job_tasks`].
pub const DEFAULT_MAX_JOB_TASKS: u64 = 1_000_000;

impl ServerConfig {
    /// Defaults: heartbeat 1 s, timeout 5 s.
    pub fn new(listen: SocketAddr, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            state_dir: state_dir.into(),
            tls: None,
            admin_token_file: None,
            heartbeat: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            coordinator: state::Config::default(),
            fsync: false,
            recover_journal: false,
            max_job_tasks: DEFAULT_MAX_JOB_TASKS,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            worker_queue: DEFAULT_WORKER_QUEUE,
            core_queue: DEFAULT_CORE_QUEUE,
            max_streams: DEFAULT_MAX_STREAMS,
            retain_finished: Some(DEFAULT_RETAIN_FINISHED),
            compact_journal_after: Some(DEFAULT_COMPACT_JOURNAL_AFTER),
            max_uploads: None,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            http_listen: None,
            group: None,
            alloc_interval: DEFAULT_ALLOC_INTERVAL,
            rendezvous_port: 0,
            pod_deletion_cost: None,
        }
    }
}

/// A running coordinator.
pub struct Server {
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    token: String,
    stop: Arc<watch::Sender<bool>>,
    done: watch::Receiver<Option<std::result::Result<(), String>>>,
    /// The core's queue, for tests that inject a request.
    #[cfg(test)]
    core: queue::CoreQueue,
}

impl Server {
    /// Opens the state directory (replaying the journal), binds, and starts serving. In a
    /// group ([`ServerConfig::group`]) it joins the group and returns at once; the API port
    /// opens when this node leads (see [`crate::ha`]).
    pub fn start(config: ServerConfig) -> crate::Boxed<'static, Result<Server>> {
        crate::boxed(async move {
            // A port another process holds is the commonest start-up failure: say so before
            // a state folder and an admin token are made for a coordinator that never ran.
            if config.group.is_none() {
                probe_port(config.listen).map_err(|e| e.bind_for("--listen"))?;
            }
            if let Some(at) = config.http_listen {
                probe_port(at).map_err(|e| e.bind_for("--http-listen"))?;
            }
            // TLS files that cannot serve: the same.
            if let Some(tls) = &config.tls {
                flotilla_collective::tls::server_config_from_pem(&tls.cert, &tls.key)
                    .map_err(|e| core::tls_files_error(tls, &e.to_string()))?;
            }
            // A node of a group makes no token of its own: each node would hold another, and
            // the group never formed (every node refused the others, and said nothing else).
            let token_file = config.state_dir.join(crate::auth::TOKEN_FILE);
            if config.group.is_some() && config.admin_token_file.is_none() && !token_file.exists() {
                return Err(ClusterError::Config(format!(
                    "{}: no admin token; every node of a group must hold the same one: make it \
                     once (`head -c 24 /dev/urandom | base64 > token; chmod 600 token`) and copy \
                     it into every node's state folder (`cp -p`), or give it with \
                     --admin-token-file",
                    token_file.display()
                )));
            }
            // Made here: private to its owner, as its token is. It holds every tenant's job
            // files (their `env` too) and task output.
            let made = !config.state_dir.exists();
            std::fs::create_dir_all(&config.state_dir)
                .map_err(|e| ClusterError::io(&config.state_dir, e))?;
            if made {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&config.state_dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| ClusterError::io(&config.state_dir, e))?;
            }
            let token = match &config.admin_token_file {
                Some(file) => crate::auth::read_admin_token_file(file)?,
                None => load_or_create_token(&config.state_dir)?,
            };
            let (stop_tx, stop_rx) = watch::channel(false);
            let stop_tx = Arc::new(stop_tx);
            let (done_tx, done_rx) = watch::channel(None);
            if let Some(group) = config.group.clone() {
                return Self::start_in_group(
                    config, group, token, stop_tx, stop_rx, done_tx, done_rx,
                )
                .await;
            }
            let access = Arc::new(
                Access::open(&config.state_dir, &token)
                    .map_err(|e| ClusterError::Config(e.to_string()))?,
            );
            let journal_path = config.state_dir.join("journal.log");
            let mut journal = if config.recover_journal {
                Journal::open_recovering(&journal_path)?.0
            } else {
                Journal::open(&journal_path)?
            };
            journal.set_sync(if config.fsync {
                SyncMode::Always
            } else {
                SyncMode::Process
            });
            let served = serve(&config, access, journal, None, &stop_tx, stop_rx, done_tx).await?;
            Ok(Server {
                addr: served.addr,
                http_addr: served.http_addr,
                token,
                stop: stop_tx,
                done: done_rx,
                #[cfg(test)]
                core: served.core,
            })
        })
    }

    /// [`Server::start`] as a node of a group: follows until it leads, then serves until it
    /// no longer leads, then follows again (see [`lead_and_follow`]).
    #[allow(clippy::too_many_arguments)]
    async fn start_in_group(
        config: ServerConfig,
        group: crate::ha::GroupConfig,
        token: String,
        stop_tx: Arc<watch::Sender<bool>>,
        stop_rx: watch::Receiver<bool>,
        done_tx: watch::Sender<Option<std::result::Result<(), String>>>,
        done_rx: watch::Receiver<Option<std::result::Result<(), String>>>,
    ) -> Result<Server> {
        if config.listen.port() == 0 {
            return Err(ClusterError::Config(
                "a node of a group listens on the address --peers gives it, not on port 0".into(),
            ));
        }
        let node = crate::ha::Node::start(
            group,
            config.listen,
            &config.state_dir,
            &token,
            (config.fsync, config.max_uploads),
            config.tls.as_ref(),
            stop_rx.clone(),
        )
        .await?;
        tracing::info!(
            "node of a group: following; the API opens on {} when this node leads",
            config.listen
        );
        let addr = config.listen;
        let stop = stop_tx.clone();
        let token_out = token.clone();
        #[cfg(test)]
        let (core_tx, _) = queue::queue(1);
        tokio::spawn(async move {
            let outcome = lead_and_follow(&config, &node, &token, &stop, stop_rx).await;
            if outcome.is_err() {
                let _ = stop.send(true);
            }
            let _ = done_tx.send(Some(outcome.map_err(|e| e.to_string())));
            node.shutdown().await;
        });
        Ok(Server {
            addr,
            http_addr: None,
            token: token_out,
            stop: stop_tx,
            done: done_rx,
            #[cfg(test)]
            core: core_tx,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where HTTP (`/metrics`) is served, if it is.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
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
    pub fn wait(mut self) -> crate::Boxed<'static, Result<()>> {
        crate::boxed(async move {
            loop {
                if let Some(r) = self.done.borrow().clone() {
                    return r.map_err(|e| ClusterError::Rpc(format!("server: {e}")));
                }
                if self.done.changed().await.is_err() {
                    return Ok(());
                }
            }
        })
    }
}

/// A node of a group, until `stop` or an error: waits until it leads, serves (the core
/// replays its journal), and when it no longer leads (or its core stops on a failed commit)
/// closes its API port, drops its whole state and follows again, from its journal. A
/// `flotilla shutdown` sent to it stops the node.
async fn lead_and_follow(
    config: &ServerConfig,
    node: &Arc<crate::ha::Node>,
    token: &str,
    stop: &Arc<watch::Sender<bool>>,
    stop_rx: watch::Receiver<bool>,
) -> Result<()> {
    let mut stopping = stop_rx.clone();
    // Test hook: `FLOTILLA_FAULT=lead-commit-fails:N` fails the first commit of this node's
    // first N terms, as a leadership lost at once does.
    let mut failing = std::env::var(crate::fault::FAULT_VAR)
        .ok()
        .and_then(|v| {
            v.trim()
                .strip_prefix("lead-commit-fails:")
                .and_then(|n| n.parse::<u32>().ok())
        })
        .unwrap_or(0);
    // Refused (it held the log and its state is gone): the server stops, saying why.
    node.admitted().await?;
    loop {
        let Some(mut journal) = node.lead(&mut stopping).await? else {
            return Ok(());
        };
        journal.set_sync(if config.fsync {
            SyncMode::Always
        } else {
            SyncMode::Process
        });
        let access = Arc::new(
            Access::open(&config.state_dir, token)
                .map_err(|e| ClusterError::Config(e.to_string()))?,
        );
        let n = node.clone();
        let first = if failing > 0 {
            failing -= 1;
            Err("the group did not commit: a test hook (FLOTILLA_FAULT)".to_string())
        } else {
            access
                .replicate_through(Arc::new(move |b: &[u8]| n.commit_access(b)))
                .map_err(|e| e.to_string())
        };
        if let Err(e) = first {
            // The first commit of this term failed: leadership was lost again at once, or no
            // majority answers (found under load: a node that exited here left the group
            // without a majority). Step down as a deposed leader does, and try again.
            drop(access);
            drop(journal);
            tracing::error!("{e}: this coordinator steps down and follows the group");
            node.follow(config.fsync)?;
            continue;
        }
        // This term's serving stops on its own signal: the node goes on.
        let (term_tx, term_rx) = watch::channel(false);
        let term_tx = Arc::new(term_tx);
        let (term_done_tx, mut term_done) = watch::channel(None);
        let served = serve(
            config,
            access,
            journal,
            Some(node.clone()),
            &term_tx,
            term_rx,
            term_done_tx,
        )
        .await?;
        tracing::warn!(
            "coordinator listening on {} (this node leads the group)",
            served.addr
        );
        let why = tokio::select! {
            why = node.deposed() => Some(why),
            _ = stopped(served.core_done.clone()) => served.fatal.lock().clone(),
            _ = stopped(stop_rx.clone()) => None,
        };
        let _ = term_tx.send(true);
        // The core has dropped the journal and the API port is closed before the node
        // follows again.
        stopped(served.core_done.clone()).await;
        while term_done.borrow().is_none() {
            if term_done.changed().await.is_err() {
                break;
            }
        }
        if *stop_rx.borrow() {
            return Ok(());
        }
        match why {
            Some(why) => {
                tracing::error!("{why}: this coordinator steps down and follows the group");
                node.follow(config.fsync)?;
            }
            // `flotilla shutdown`: the node stops.
            None => {
                let _ = stop.send(true);
                return Ok(());
            }
        }
    }
}

/// How long a stopping server waits for its open calls to end.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What [`serve`] started.
struct Served {
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    /// Why the server stopped, when it must stop (set before `stop`).
    fatal: Arc<Mutex<Option<String>>>,
    /// Turns true when the core's thread has ended (its journal closed).
    core_done: watch::Receiver<bool>,
    #[cfg(test)]
    core: queue::CoreQueue,
}

/// How long a node that comes to lead a group tries to open its API port while it is
/// taken: a client retrying the group's addresses may hold it for a moment (a connection
/// from the port to itself, when the API port lies among the kernel's ephemeral ports).
const GROUP_BIND_PATIENCE: Duration = Duration::from_secs(20);

/// Opens the API port; in a group (`patient`), a port in use is tried again for
/// [`GROUP_BIND_PATIENCE`] before the node gives up (it exited at once: an operator's
/// walkthrough).
async fn bind_api(at: SocketAddr, patient: bool) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    bind_retrying(at, patient, || {}).await
}

/// [`bind_api`], calling `waiting` before each wait (tests).
async fn bind_retrying(
    at: SocketAddr,
    patient: bool,
    mut waiting: impl FnMut(),
) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let until = std::time::Instant::now() + GROUP_BIND_PATIENCE;
    loop {
        match crate::transport::bind(at).await {
            Ok(x) => return Ok(x),
            Err(ClusterError::Bind { source, .. })
                if patient
                    && source.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < until =>
            {
                tracing::warn!("cannot listen on {at} yet ({source}): trying again");
                waiting();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.bind_for("--listen")),
        }
    }
}

/// Recovers the core from `journal`, starts its thread, binds, and serves until `stop`;
/// `done` gets the outcome.
async fn serve(
    config: &ServerConfig,
    access: Arc<Access>,
    journal: Journal,
    group: Option<Arc<crate::ha::Node>>,
    stop_tx: &Arc<watch::Sender<bool>>,
    stop_rx: watch::Receiver<bool>,
    done_tx: watch::Sender<Option<std::result::Result<(), String>>>,
) -> Result<Served> {
    let (req_tx, req_rx) = queue::queue(config.core_queue);
    let sessions: Arc<Mutex<HashMap<WorkerId, mpsc::Receiver<proto::CoordinatorMessage>>>> =
        Arc::new(Mutex::new(HashMap::new()));
    let metrics = http::Metrics::new();
    let node = group.clone();
    let core = Core::recover(
        config,
        journal,
        sessions.clone(),
        access.clone(),
        metrics.clone(),
        group,
    )?;
    let fatal: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let (core_done_tx, core_done) = watch::channel(false);
    {
        let (fatal, stop) = (fatal.clone(), stop_tx.clone());
        std::thread::Builder::new()
            .name("flotilla-core".into())
            .spawn(move || {
                // Sent when the thread ends, whatever ends it (the core dropped by then).
                struct Done(watch::Sender<bool>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        let _ = self.0.send(true);
                    }
                }
                let _done = Done(core_done_tx);
                let run = std::panic::AssertUnwindSafe(move || core.run(req_rx));
                let r = std::panic::catch_unwind(run).unwrap_or_else(|p| {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".into());
                    Err(format!("the core thread panicked: {what}"))
                });
                if let Err(m) = r {
                    tracing::error!("coordinator stopping: {m}");
                    *fatal.lock() = Some(m);
                    let _ = stop.send(true);
                }
            })
            .map_err(|e| ClusterError::Config(format!("cannot start the core thread: {e}")))?;
    }

    let (listener, addr) = bind_api(config.listen, node.is_some()).await?;
    let http_addr = match config.http_listen {
        Some(at) => Some(
            serve_http(
                at,
                http::Http {
                    access: access.clone(),
                    metrics,
                    encoded: Default::default(),
                    dashboard: Default::default(),
                    core: dashboard::Core(req_tx.clone()),
                },
                stop_rx.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let check = Authn::new(access.clone());
    let store = Arc::new(crate::objects::ObjectStore::open_capped(
        &config.state_dir.join("objects"),
        config
            .max_uploads
            .map(|cap| (cap, "flotilla server --max-uploads")),
    )?);
    let access_for_objects = access.clone();
    let alloc = Arc::new(
        crate::alloc::Allocator::open(
            &config.state_dir,
            crate::alloc::Systems::on_path(),
            access.clone(),
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "/usr/bin/flotilla".into()),
            workers_reach(config, addr),
        )
        .map_err(|e| ClusterError::Config(e.to_string()))?,
    );
    if let Some(n) = node.clone() {
        alloc.replicate_through(Arc::new(move |b: &[u8]| n.commit_allocs(b)));
    }
    let api = Api {
        core: req_tx.clone(),
        sessions,
        store: store.clone(),
        max_job_tasks: config.max_job_tasks,
        access,
        stop: (**stop_tx).clone(),
        streams: rpc::StreamCounts::new(config.max_streams),
        alloc: alloc.clone(),
        group: node.clone(),
    };
    api.send_quotas();
    if let Some(at) = &config.pod_deletion_cost {
        let pods = crate::kube::PodApi::open(at).map_err(|e| {
            ClusterError::Config(format!(
                "--pod-deletion-cost: {e} (it needs the pod's service-account token \
                     mounted: automountServiceAccountToken; or drop the flag)"
            ))
        })?;
        tokio::spawn(deletion_costs(
            Arc::new(pods),
            req_tx.clone(),
            stop_rx.clone(),
        ));
    }
    tokio::spawn(allocate(
        alloc,
        req_tx.clone(),
        config.alloc_interval,
        stop_rx.clone(),
    ));
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
            AdminServer::new(api.clone()),
            check.clone(),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            WorkersServer::new(api)
                .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES),
            check.clone(),
        ))
        .add_service(crate::objects::objects_service(
            store,
            check,
            access_for_objects,
            node,
        ));
    let stop_wait = stop_rx.clone();
    let per_peer = config.max_connections_per_peer.max(1);
    #[cfg(test)]
    let core_tx = req_tx.clone();
    let req_for_stop = req_tx;
    let fatal_out = fatal.clone();
    let core_gone = core_done.clone();
    tokio::spawn(async move {
        let incoming = peers::incoming(listener, per_peer);
        let grace = stop_wait.clone();
        // A graceful stop waits for the open calls to end, but not for ever: a worker's
        // session or a client's watch may outlive the core, and a node of a group that
        // stops leading must be able to follow (and lead again) meanwhile.
        let r = tokio::select! {
            r = router.serve_with_incoming_shutdown(incoming, stopped(stop_wait)) => r,
            _ = async {
                stopped(grace).await;
                tokio::time::sleep(STOP_GRACE).await;
            } => {
                tracing::warn!("calls still open {STOP_GRACE:?} after the stop: dropped");
                Ok(())
            }
        };
        let _ = req_for_stop.try_send(Req::Stop);
        // `Server::wait` returns once the core has closed the journal: a coordinator started
        // again on the same state right after finds it free (bounded, should the core hang).
        let _ = tokio::time::timeout(STOP_GRACE, stopped(core_gone)).await;
        let r = match fatal.lock().clone() {
            Some(m) => Err(m),
            None => r.map_err(|e| e.to_string()),
        };
        let _ = done_tx.send(Some(r));
    });
    tracing::info!(%addr, "coordinator listening");
    Ok(Served {
        addr,
        http_addr,
        fatal: fatal_out,
        core_done,
        #[cfg(test)]
        core: core_tx,
    })
}

/// Fails as binding `at` would (in use, not an address of this host); frees it at once. Port
/// 0 is always free.
fn probe_port(at: SocketAddr) -> Result<()> {
    if at.port() == 0 {
        return Ok(());
    }
    std::net::TcpListener::bind(at)
        .map(drop)
        .map_err(|source| ClusterError::Bind {
            addr: at.to_string(),
            flag: None,
            source,
        })
}

/// The coordinator's address(es) as workers on other machines reach it: the group's, or
/// the bound one with this host's name for an unspecified IP (`0.0.0.0`).
fn workers_reach(config: &ServerConfig, addr: SocketAddr) -> String {
    if let Some(g) = &config.group {
        return g.peers.join(",");
    }
    if addr.ip().is_unspecified() {
        let host = hostname();
        if !host.is_empty() {
            return format!("{host}:{}", addr.port());
        }
    }
    addr.to_string()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The allocator's rounds, every `interval` until `stop`: the core's view, then the batch
/// system's commands on a blocking thread (they may take seconds).
async fn allocate(
    alloc: Arc<crate::alloc::Allocator>,
    core: queue::CoreQueue,
    interval: Duration,
    stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(stop.clone()) => return,
        }
        if alloc.is_empty() {
            continue;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shapes = alloc.shapes();
        let note = alloc.paused_note();
        if core
            .try_send(Req::AllocView {
                shapes,
                note,
                reply: tx,
            })
            .is_err()
        {
            continue; // busy or stopping: the next round
        }
        let Ok(Ok(view)) = rx.await else {
            continue;
        };
        let a = alloc.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || a.round(&view)).await {
            tracing::error!("the allocator's round failed: {e}");
        }
    }
}

/// `--pod-deletion-cost`: every second, the attempts on each worker, set as its pod's
/// deletion cost when [`crate::kube::CostPolicy`] says (a few requests at a time), until
/// `stop`.
async fn deletion_costs(
    pods: Arc<crate::kube::PodApi>,
    core: queue::CoreQueue,
    stop: watch::Receiver<bool>,
) {
    use crate::kube::{CostPolicy, KubeError, DEFAULT_COST_GAP, DELETION_COST};
    const AT_ONCE: usize = 8;
    let mut policy = CostPolicy::new(DEFAULT_COST_GAP);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (done_tx, mut done_rx) =
        mpsc::unbounded_channel::<(String, i64, std::result::Result<(), KubeError>)>();
    let permits = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(stop.clone()) => return,
        }
        while let Ok((pod, cost, r)) = done_rx.try_recv() {
            match &r {
                Ok(()) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("workers' pod deletion costs are set again");
                    }
                    tracing::debug!(%pod, cost, "pod deletion cost set");
                }
                Err(e) if e.not_found() => tracing::debug!(
                    "worker {pod} is no pod of namespace {}: its deletion cost is not set",
                    pods.namespace()
                ),
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        let hint = if e.forbidden() {
                            " (the coordinator's service account needs `patch` on pods: \
                             deploy/kubernetes/base/coordinator-rbac.yaml)"
                        } else {
                            ""
                        };
                        tracing::warn!("cannot set pod {pod}'s deletion cost: {e}{hint}");
                    } else {
                        tracing::debug!("cannot set pod {pod}'s deletion cost: {e}");
                    }
                }
            }
            policy.sent(Instant::now(), &pod, cost, &r);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if core.try_send(Req::WorkerLoads { reply: tx }).is_err() {
            continue; // busy or stopping: the next round
        }
        let Ok(Ok(loads)) = rx.await else {
            continue;
        };
        // A pod's workers: one, or an old session not yet timed out beside its new one.
        let mut by_pod: BTreeMap<String, i64> = BTreeMap::new();
        for (name, n) in loads {
            *by_pod.entry(name).or_default() += n as i64;
        }
        let costs: Vec<(String, i64)> = by_pod.into_iter().collect();
        for (pod, cost) in policy.due(Instant::now(), &costs) {
            let (pods, done, permits) = (pods.clone(), done_tx.clone(), permits.clone());
            tokio::spawn(async move {
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                let r = pods.annotate(&pod, DELETION_COST, &cost.to_string()).await;
                let _ = done.send((pod, cost, r));
            });
        }
    }
}

/// Binds `at` and serves the HTTP routes until `stop`; returns the bound address.
async fn serve_http(
    at: SocketAddr,
    state: http::Http,
    stop: watch::Receiver<bool>,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .map_err(|e| ClusterError::Bind {
            addr: at.to_string(),
            flag: Some("--http-listen"),
            source: e,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| ClusterError::Config(format!("HTTP listener address: {e}")))?;
    tokio::spawn(async move {
        let served = axum::serve(listener, http::router(state))
            .with_graceful_shutdown(stopped(stop))
            .await;
        if let Err(e) = served {
            tracing::warn!("the HTTP listener stopped: {e}");
        }
    });
    tracing::info!(%addr, "HTTP (metrics) listening");
    Ok(addr)
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
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

mod core;
mod dashboard;
mod http;
mod logcap;
mod peers;
mod queue;
mod rpc;
#[cfg(test)]
mod tests;

pub(crate) use self::core::COORDINATOR_HOLDER;
use self::core::{Core, Req};
use self::rpc::Api;
