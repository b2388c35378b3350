//! The group's Raft messages between nodes: one gRPC method (`Group.Call`) on each node's
//! group port whose body is postcard of [`Rpc`] / [`Reply`], authenticated by the admin token
//! the group shares. The same port carries the files uploaded with jobs from the leader to
//! the others, beside Raft ([`ObjectPeers`]): content-addressed, they need no ordering.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{group_addr, NodeId, Raft, TypeConfig};
use crate::proto::group_client::GroupClient;
use crate::proto::GroupFrame;

#[derive(Serialize, Deserialize)]
enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Keep this object (its bytes); the reply names the hash it was stored under.
    PutObject(Vec<u8>),
    /// Send object `hash`, if held.
    GetObject(String),
    /// Append `data` to the task log at `path` (`logs/JOB/TASK.ATTEMPT.out|err`).
    AppendLog {
        /// The log, relative to the state folder.
        path: String,
        /// What the leader wrote to it.
        data: Vec<u8>,
    },
    /// Has node `id` held the group's log? (Asked by a node starting with an empty state
    /// folder, before it takes part.)
    Held(NodeId),
    /// Which of [`FEATURES`] the node has: asked before the leader writes to the group's log
    /// what a node of an older version could not read (that node cannot decode the question
    /// either, and is told apart as older).
    Features,
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Append(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    Snapshot(InstallSnapshotResponse<NodeId>),
    /// The node could not handle it (shutting down, a storage error): why.
    Refused(String),
    /// The object is kept, under this hash.
    Stored(String),
    /// The object asked for, or `None` when not held.
    Object(Option<Vec<u8>>),
    /// Whether the node asked about has held the group's log, as the answering node knows.
    Held(bool),
    /// The node's [`FEATURES`].
    Features(u32),
}

/// What this version reads in the group's log that earlier ones did not, a bit each.
pub(super) const FEATURES: u32 =
    FEATURE_JOURNAL_CLOCK | FEATURE_JOB_RETRIED | FEATURE_PLACEHOLDER_ESCAPES;
/// It reads [`JournalRecord::Clock`](crate::state::JournalRecord::Clock).
pub(super) const FEATURE_JOURNAL_CLOCK: u32 = 1;
/// It reads [`JournalRecord::JobRetried`](crate::state::JournalRecord::JobRetried).
pub(super) const FEATURE_JOB_RETRIED: u32 = 2;
/// It expands a job file's `${i}` and `{{i}}` as written (older versions replace them).
pub(super) const FEATURE_PLACEHOLDER_ESCAPES: u32 = 4;

/// A client of the group port at `addr` (TLS when `ca` is given, verifying against it).
async fn connect(addr: &str, ca: Option<&[u8]>) -> Result<GroupClient<Channel>, String> {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(1));
    if let Some(ca) = ca {
        ep = ep
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name(crate::transport::host_of(addr)),
            )
            .map_err(|e| format!("tls: {e}"))?;
    }
    let ch = ep.connect().await.map_err(|e| e.to_string())?;
    Ok(GroupClient::new(ch)
        .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES))
}

/// A group message: `body`, due within `ttl`, presenting `header` (`Bearer TOKEN`).
fn framed(body: Vec<u8>, ttl: Duration, header: &str) -> tonic::Request<GroupFrame> {
    let mut req = tonic::Request::new(GroupFrame { body });
    req.set_timeout(ttl);
    if let Ok(v) = header.parse() {
        req.metadata_mut().insert("authorization", v);
    }
    req
}

/// Makes a [`Peer`] per other node.
pub(super) struct Net {
    token: String,
    /// The CA (PEM) the other nodes' certificates are verified against: TLS when set.
    ca: Option<Vec<u8>>,
}

impl Net {
    pub(super) fn new(token: &str, ca: Option<Vec<u8>>) -> Net {
        Net {
            token: token.to_string(),
            ca,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: group_addr(&node.addr).unwrap_or_else(|| node.addr.clone()),
            header: format!("Bearer {}", self.token),
            ca: self.ca.clone(),
            client: None,
            pending: false,
            stalled: 0,
        }
    }
}

/// After this many calls in a row that failed or never finished (their caller gave up on
/// them: openraft's timeouts drop the call), a peer's connection is made anew.
const STALLED_RECONNECT: u32 = 3;

/// The way to one other node.
pub(super) struct Peer {
    target: NodeId,
    addr: String,
    header: String,
    ca: Option<Vec<u8>>,
    client: Option<GroupClient<Channel>>,
    /// A call is under way (still set at the next call: its caller dropped it).
    pending: bool,
    /// Calls in a row that failed or never finished.
    stalled: u32,
}

fn unreachable<E: std::error::Error>(e: impl std::fmt::Display) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
}

fn network<E: std::error::Error>(e: impl std::fmt::Display) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(e.to_string())))
}

impl Peer {
    async fn call<E: std::error::Error>(
        &mut self,
        rpc: Rpc,
        ttl: Duration,
    ) -> Result<Reply, RPCError<NodeId, BasicNode, E>> {
        let body = postcard::to_allocvec(&rpc).map_err(network)?;
        if std::mem::take(&mut self.pending) {
            self.stalled += 1;
        }
        // A connection whose calls hang (the node's pod came back on another IP: the old
        // one neither answers nor refuses) is dropped, and the next connection resolves the
        // node's name again. Without this the leader reached a recreated pod only once that
        // pod had started an election, and stepped down for it.
        if self.stalled >= STALLED_RECONNECT {
            self.client = None;
            self.stalled = 0;
        }
        if self.client.is_none() {
            let c = connect(&self.addr, self.ca.as_deref())
                .await
                .map_err(|e| unreachable(format!("node {} at {}: {e}", self.target, self.addr)))?;
            self.client = Some(c);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(unreachable("no connection"));
        };
        self.pending = true;
        let r = client.call(framed(body, ttl, &self.header)).await;
        self.pending = false;
        match r {
            Ok(r) => {
                self.stalled = 0;
                postcard::from_bytes(&r.into_inner().body).map_err(network)
            }
            Err(s) => {
                self.stalled += 1;
                if s.code() == tonic::Code::Unavailable {
                    // Reconnect next time (the node restarted).
                    self.client = None;
                    return Err(unreachable(format!(
                        "node {}: {}",
                        self.target,
                        s.message()
                    )));
                }
                Err(network(format!("node {}: {}", self.target, s.message())))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Rpc::Append(rpc), option.hard_ttl()).await? {
            Reply::Append(r) => Ok(r),
            Reply::Refused(why) => Err(network(why)),
            _ => Err(network("a reply of another kind")),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.call(Rpc::Snapshot(rpc), option.hard_ttl()).await? {
            Reply::Snapshot(r) => Ok(r),
            Reply::Refused(why) => Err(network(why)),
            _ => Err(network("a reply of another kind")),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Rpc::Vote(rpc), option.hard_ttl()).await? {
            Reply::Vote(r) => Ok(r),
            Reply::Refused(why) => Err(network(why)),
            _ => Err(network("a reply of another kind")),
        }
    }
}

/// Why [`ask_held`] got no yes or no.
#[derive(Debug)]
pub(super) enum NoAnswer {
    /// The node runs an older flotilla, which does not know the question (nor the record).
    Older,
    /// Down, unreachable, another token...: why.
    Unreachable(String),
}

/// Sends `rpc` to the node whose group port is `addr`: its reply, or why there is none
/// ([`NoAnswer::Older`] when the node could not decode it).
async fn ask(addr: &str, ca: Option<&[u8]>, token: &str, rpc: &Rpc) -> Result<Reply, NoAnswer> {
    let mut client = connect(addr, ca).await.map_err(NoAnswer::Unreachable)?;
    let body = postcard::to_allocvec(rpc).map_err(|e| NoAnswer::Unreachable(e.to_string()))?;
    let req = framed(body, Duration::from_secs(2), &format!("Bearer {token}"));
    let r = client.call(req).await.map_err(|s| {
        // What `Service::call` answers to a message it cannot decode.
        if s.code() == tonic::Code::InvalidArgument && s.message().starts_with(UNDECODED) {
            NoAnswer::Older
        } else {
            NoAnswer::Unreachable(s.message().to_string())
        }
    })?;
    match postcard::from_bytes(&r.into_inner().body) {
        Ok(Reply::Refused(why)) => Err(NoAnswer::Unreachable(why)),
        Ok(reply) => Ok(reply),
        Err(e) => Err(NoAnswer::Unreachable(e.to_string())),
    }
}

/// Asks the node whose group port is `addr` whether node `id` has held the group's log.
pub(super) async fn ask_held(
    addr: &str,
    ca: Option<&[u8]>,
    token: &str,
    id: NodeId,
) -> Result<bool, NoAnswer> {
    match ask(addr, ca, token, &Rpc::Held(id)).await? {
        Reply::Held(held) => Ok(held),
        _ => Err(NoAnswer::Unreachable("a reply of another kind".into())),
    }
}

/// Asks the node whose group port is `addr` for its [`FEATURES`].
pub(super) async fn ask_features(
    addr: &str,
    ca: Option<&[u8]>,
    token: &str,
) -> Result<u32, NoAnswer> {
    match ask(addr, ca, token, &Rpc::Features).await? {
        Reply::Features(f) => Ok(f),
        _ => Err(NoAnswer::Unreachable("a reply of another kind".into())),
    }
}

/// How [`Service::call`] refuses a message it cannot decode (one of a newer version). The
/// words every version so far has used: keep them.
const UNDECODED: &str = "a group message";

/// Whether `path` names a task log as the coordinator writes them:
/// `logs/JOB/TASK.ATTEMPT.out` or `.err`, numbers only (nothing else may be written).
fn is_log_path(path: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = path.split('/');
    let (Some("logs"), Some(job), Some(file), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some(stem) = file
        .strip_suffix(".out")
        .or_else(|| file.strip_suffix(".err"))
    else {
        return false;
    };
    let Some((task, attempt)) = stem.split_once('.') else {
        return false;
    };
    digits(job) && digits(task) && digits(attempt)
}

/// Appends `data` to `state_dir/path` (a task log; see [`is_log_path`]).
fn append_log(state_dir: &std::path::Path, path: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    if !is_log_path(path) {
        return Err(std::io::Error::other(format!("{path:?} is not a task log")));
    }
    let file = state_dir.join(path);
    if let Some(d) = file.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)?
        .write_all(data)
}

/// The `Group` service: hands each message to the local Raft (behind a
/// [`TokenCheck`](crate::auth::TokenCheck) of the group's admin token).
pub(super) struct Service {
    pub(super) raft: Raft,
    /// This node's copy of the objects uploaded to the group.
    pub(super) store: Arc<crate::objects::ObjectStore>,
    /// This node's state folder (task logs are appended under it).
    pub(super) state_dir: std::path::PathBuf,
    /// This node's state machine (which members have held the log).
    pub(super) sm: super::StateMachine,
    /// Whether Raft's messages are taken: not while a node that starts with an empty state
    /// folder asks the others whether it may ([`ask_held`]).
    pub(super) admitted: Arc<std::sync::atomic::AtomicBool>,
}

#[tonic::async_trait]
impl crate::proto::group_server::Group for Service {
    async fn call(
        &self,
        req: tonic::Request<GroupFrame>,
    ) -> Result<tonic::Response<GroupFrame>, tonic::Status> {
        let rpc: Rpc = postcard::from_bytes(&req.get_ref().body)
            .map_err(|e| tonic::Status::invalid_argument(format!("{UNDECODED}: {e}")))?;
        let raft_rpc = matches!(rpc, Rpc::Append(_) | Rpc::Vote(_) | Rpc::Snapshot(_));
        if raft_rpc && !self.admitted.load(std::sync::atomic::Ordering::Acquire) {
            let body = postcard::to_allocvec(&Reply::Refused(
                "this node is starting with an empty state folder and has not yet been \
                 told it may take part"
                    .into(),
            ))
            .map_err(|e| tonic::Status::internal(format!("a group reply: {e}")))?;
            return Ok(tonic::Response::new(GroupFrame { body }));
        }
        let reply = match rpc {
            // A member that held it: once removed (its membership change is in the log of
            // every node of the majority that committed it), it may be added again blank.
            Rpc::Held(id) => {
                let member = self
                    .raft
                    .metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .nodes()
                    .any(|(n, _)| *n == id);
                Reply::Held(member && self.sm.held().contains(&id))
            }
            Rpc::Features => Reply::Features(FEATURES),
            Rpc::Append(r) => match self.raft.append_entries(r).await {
                Ok(r) => Reply::Append(r),
                Err(e) => Reply::Refused(e.to_string()),
            },
            Rpc::Vote(r) => match self.raft.vote(r).await {
                Ok(r) => Reply::Vote(r),
                Err(e) => Reply::Refused(e.to_string()),
            },
            Rpc::Snapshot(r) => match self.raft.install_snapshot(r).await {
                Ok(r) => Reply::Snapshot(r),
                Err(e) => Reply::Refused(e.to_string()),
            },
            Rpc::PutObject(data) => {
                let store = self.store.clone();
                match tokio::task::spawn_blocking(move || store.put_bytes(&data)).await {
                    Ok(Ok((hash, _))) => Reply::Stored(hash),
                    Ok(Err(e)) => Reply::Refused(e.to_string()),
                    Err(e) => Reply::Refused(e.to_string()),
                }
            }
            Rpc::AppendLog { path, data } => {
                let dir = self.state_dir.clone();
                match tokio::task::spawn_blocking(move || append_log(&dir, &path, &data)).await {
                    Ok(Ok(())) => Reply::Stored(String::new()),
                    Ok(Err(e)) => Reply::Refused(e.to_string()),
                    Err(e) => Reply::Refused(e.to_string()),
                }
            }
            Rpc::GetObject(hash) => {
                let path = self.store.has(&hash).then(|| self.store.path(&hash));
                let read = tokio::task::spawn_blocking(move || path.map(std::fs::read)).await;
                match read {
                    Ok(Some(Ok(data))) => Reply::Object(Some(data)),
                    Ok(None) => Reply::Object(None),
                    Ok(Some(Err(e))) => Reply::Refused(e.to_string()),
                    Err(e) => Reply::Refused(e.to_string()),
                }
            }
        };
        let body = postcard::to_allocvec(&reply)
            .map_err(|e| tonic::Status::internal(format!("a group reply: {e}")))?;
        Ok(tonic::Response::new(GroupFrame { body }))
    }
}

/// The other nodes, as the leader reaches them with objects: the files uploaded with jobs,
/// copied to a majority of the group before the submission is acknowledged, and asked for
/// by a new leader that lacks one.
pub(super) struct ObjectPeers {
    /// The other nodes' group ports: `--peers` at first, then the group's members
    /// ([`ObjectPeers::set_peers`]).
    peers: parking_lot::RwLock<Vec<(NodeId, String)>>,
    header: String,
    ca: Option<Vec<u8>>,
    clients: parking_lot::Mutex<HashMap<NodeId, GroupClient<Channel>>>,
    /// Task log chunks on their way to each other node, in order (see
    /// [`ObjectPeers::send_log`]).
    logs: parking_lot::Mutex<HashMap<NodeId, tokio::sync::mpsc::Sender<Vec<u8>>>>,
}

/// Task log chunks queued for one node at most; beyond, chunks are dropped (logs are best
/// effort: a node that cannot keep up must not slow the leader).
const LOG_QUEUE: usize = 1024;

impl ObjectPeers {
    pub(super) fn new(peers: Vec<(NodeId, String)>, token: &str, ca: Option<Vec<u8>>) -> Self {
        ObjectPeers {
            peers: parking_lot::RwLock::new(peers),
            header: format!("Bearer {token}"),
            ca,
            clients: parking_lot::Mutex::new(HashMap::new()),
            logs: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The other nodes now.
    fn peers(&self) -> Vec<(NodeId, String)> {
        self.peers.read().clone()
    }

    /// The group's members changed: `peers` are the other nodes now (with their group
    /// ports). Log senders start for new nodes and stop for nodes gone (from a tokio
    /// runtime).
    pub(super) fn set_peers(self: &Arc<Self>, peers: Vec<(NodeId, String)>) {
        if *self.peers.read() == peers {
            return;
        }
        *self.peers.write() = peers.clone();
        self.clients.lock().clear();
        {
            let mut queues = self.logs.lock();
            queues.retain(|id, _| peers.iter().any(|(p, _)| p == id));
        }
        self.start_log_senders();
    }

    /// Starts a sender, for each other node that has none, that delivers task log chunks
    /// in order (from a tokio runtime).
    pub(super) fn start_log_senders(self: &Arc<Self>) {
        let mut queues = self.logs.lock();
        for (id, addr) in self.peers() {
            if queues.contains_key(&id) {
                continue;
            }
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(LOG_QUEUE);
            queues.insert(id, tx);
            let me = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(body) = rx.recv().await {
                    let Some(me) = me.upgrade() else { return };
                    // One try: a node that is down misses these chunks.
                    if let Err(e) = me.ask(id, &addr, body, Duration::from_secs(5)).await {
                        tracing::debug!(node = id, "a task log chunk not copied: {e}");
                    }
                }
            });
        }
    }

    /// Queues `data`, appended to the task log `path` here, for every other node (in
    /// order, without waiting; dropped for a node whose queue is full).
    pub(super) fn send_log(&self, path: &str, data: &[u8]) {
        let Ok(body) = postcard::to_allocvec(&Rpc::AppendLog {
            path: path.to_string(),
            data: data.to_vec(),
        }) else {
            return;
        };
        for tx in self.logs.lock().values() {
            let _ = tx.try_send(body.clone());
        }
    }

    async fn ask(
        &self,
        id: NodeId,
        addr: &str,
        body: Vec<u8>,
        ttl: Duration,
    ) -> Result<Reply, String> {
        let cached = self.clients.lock().get(&id).cloned();
        let mut client = match cached {
            Some(c) => c,
            None => {
                let c = connect(addr, self.ca.as_deref()).await?;
                self.clients.lock().insert(id, c.clone());
                c
            }
        };
        match client.call(framed(body, ttl, &self.header)).await {
            Ok(r) => postcard::from_bytes(&r.into_inner().body).map_err(|e| e.to_string()),
            Err(s) => {
                if s.code() == tonic::Code::Unavailable {
                    self.clients.lock().remove(&id);
                }
                Err(format!("node {id}: {}", s.message()))
            }
        }
    }

    /// Sends object `data` (hashed `hash`) to every other node; returns once `needed` of
    /// them have stored it (the others go on in the background), or with what each said
    /// when that can no longer happen within `ttl`.
    pub(super) async fn put(
        self: &Arc<Self>,
        hash: &str,
        data: &[u8],
        needed: usize,
        ttl: Duration,
    ) -> Result<(), String> {
        if needed == 0 {
            return Ok(());
        }
        let body =
            postcard::to_allocvec(&Rpc::PutObject(data.to_vec())).map_err(|e| e.to_string())?;
        let peers = self.peers();
        let (tx, mut rx) = tokio::sync::mpsc::channel(peers.len().max(1));
        for (id, addr) in peers.clone() {
            let (me, tx, body, hash) = (self.clone(), tx.clone(), body.clone(), hash.to_string());
            tokio::spawn(async move {
                let r = match tokio::time::timeout(ttl, me.ask(id, &addr, body, ttl)).await {
                    Ok(Ok(Reply::Stored(h))) if h == hash => Ok(()),
                    Ok(Ok(Reply::Stored(h))) => Err(format!("node {id} stored it as {h}")),
                    Ok(Ok(Reply::Refused(why))) => Err(format!("node {id}: {why}")),
                    Ok(Ok(_)) => Err(format!("node {id}: a reply of another kind")),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(format!("node {id}: no answer within {ttl:?}")),
                };
                let _ = tx.send(r).await;
            });
        }
        drop(tx);
        let (mut stored, mut why) = (0, Vec::new());
        while let Some(r) = rx.recv().await {
            match r {
                Ok(()) => {
                    stored += 1;
                    if stored >= needed {
                        return Ok(());
                    }
                }
                Err(e) => why.push(e),
            }
        }
        Err(format!(
            "{stored} of the {} other node(s) kept it, {needed} needed: {}",
            peers.len(),
            why.join("; ")
        ))
    }

    /// Object `hash` from the first other node that holds it (checked against its hash).
    pub(super) async fn get(&self, hash: &str, ttl: Duration) -> Option<Vec<u8>> {
        let body = postcard::to_allocvec(&Rpc::GetObject(hash.to_string())).ok()?;
        for (id, addr) in &self.peers() {
            let asked = tokio::time::timeout(ttl, self.ask(*id, addr, body.clone(), ttl)).await;
            if let Ok(Ok(Reply::Object(Some(data)))) = asked {
                if blake3::hash(&data).to_hex().as_str() == hash {
                    return Some(data);
                }
                tracing::warn!(node = id, "object {hash} came back with other contents");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of an older version: every message it cannot decode is refused as
    /// [`Service::call`] refuses it (`Rpc::Held` is one).
    struct Older;

    #[tonic::async_trait]
    impl crate::proto::group_server::Group for Older {
        async fn call(
            &self,
            _req: tonic::Request<GroupFrame>,
        ) -> Result<tonic::Response<GroupFrame>, tonic::Status> {
            Err(tonic::Status::invalid_argument(
                "a group message: Found an enum variant discriminant that was not expected",
            ))
        }
    }

    /// Serves `group` as a group port on a loopback port of its own: its address.
    async fn serve(group: impl crate::proto::group_server::Group) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = l.local_addr().expect("address");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(crate::proto::group_server::GroupServer::new(group))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
        );
        at
    }

    #[test]
    fn an_older_node_is_told_apart_from_one_that_does_not_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let addr = serve(Older).await.to_string();
            let r = ask_held(&addr, None, "token", 3).await;
            assert!(matches!(r, Err(NoAnswer::Older)), "{r:?}");
            let r = ask_features(&addr, None, "token").await;
            assert!(matches!(r, Err(NoAnswer::Older)), "{r:?}");
            let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = gone.local_addr().expect("address").to_string();
            drop(gone);
            let r = ask_held(&addr, None, "token", 3).await;
            assert!(matches!(r, Err(NoAnswer::Unreachable(_))), "{r:?}");
        });
    }

    /// Answers every message with `Held(true)`.
    struct Answers;

    #[tonic::async_trait]
    impl crate::proto::group_server::Group for Answers {
        async fn call(
            &self,
            _req: tonic::Request<GroupFrame>,
        ) -> Result<tonic::Response<GroupFrame>, tonic::Status> {
            let body = postcard::to_allocvec(&Reply::Held(true))
                .map_err(|e| tonic::Status::internal(e.to_string()))?;
            Ok(tonic::Response::new(GroupFrame { body }))
        }
    }

    /// A TCP relay to `to` whose connections, once `freeze` is raised past the generation
    /// they were accepted in, stop passing bytes but stay open: what a pod's old IP does
    /// once the pod was made again elsewhere.
    async fn freezing_relay(
        to: std::net::SocketAddr,
        freeze: Arc<std::sync::atomic::AtomicU32>,
    ) -> std::net::SocketAddr {
        use std::sync::atomic::Ordering;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = l.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((a, _)) = l.accept().await {
                let born = freeze.load(Ordering::SeqCst);
                let Ok(b) = tokio::net::TcpStream::connect(to).await else {
                    continue;
                };
                let (ar, aw) = a.into_split();
                let (br, bw) = b.into_split();
                for (mut r, mut w) in [
                    (
                        Box::new(ar) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(bw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    ),
                    (Box::new(br), Box::new(aw)),
                ] {
                    let freeze = freeze.clone();
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = r.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            if freeze.load(Ordering::SeqCst) > born {
                                // Held open, silent, for as long as the test runs.
                                std::future::pending::<()>().await;
                            }
                            if w.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        at
    }

    /// A call given up after `ttl`, as openraft gives up on its calls.
    async fn call_within(peer: &mut Peer, ttl: Duration) -> Option<Reply> {
        tokio::time::timeout(ttl, peer.call::<std::io::Error>(Rpc::Held(1), ttl))
            .await
            .ok()?
            .ok()
    }

    #[test]
    fn a_peer_whose_connection_hangs_connects_anew() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let server = serve(Answers).await;
            let freeze = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let relay = freezing_relay(server, freeze.clone()).await;
            let mut peer = Net::new("token", None)
                .new_client(
                    2,
                    &BasicNode {
                        // The API address: the group port is the next one.
                        addr: format!("127.0.0.1:{}", relay.port() - 1),
                    },
                )
                .await;
            let ttl = Duration::from_millis(200);
            assert!(matches!(
                call_within(&mut peer, ttl).await,
                Some(Reply::Held(true))
            ));
            freeze.store(1, std::sync::atomic::Ordering::SeqCst);
            // openraft gives up on each call after its timeout, dropping it, as here.
            let mut answered = None;
            for i in 0..10 {
                if let Some(Reply::Held(true)) = call_within(&mut peer, ttl).await {
                    answered = Some(i);
                    break;
                }
            }
            let i = answered.expect("the peer never connected anew: its calls hung for good");
            assert!(i >= 1, "the frozen connection answered");
        });
    }

    #[test]
    fn only_task_log_paths_are_appended_to() {
        for ok in ["logs/1/0.1.out", "logs/12/345.2.err"] {
            assert!(is_log_path(ok), "{ok}");
        }
        for bad in [
            "logs/1/0.1.txt",
            "logs/../0.1.out",
            "logs/1/../../token.1.out",
            "/etc/passwd",
            "logs/1/a.1.out",
            "logs/1/0.out",
            "logs/1/2/0.1.out",
            "token",
            "",
        ] {
            assert!(!is_log_path(bad), "{bad}");
        }
        let dir = tempfile::tempdir().expect("tmp");
        append_log(dir.path(), "logs/3/1.1.out", b"one ").expect("appended");
        append_log(dir.path(), "logs/3/1.1.out", b"two").expect("appended");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("logs/3/1.1.out")).expect("read"),
            "one two"
        );
        assert!(append_log(dir.path(), "../x.1.out", b"no").is_err());
    }
}
