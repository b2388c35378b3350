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
}

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
        }
    }
}

/// The way to one other node.
pub(super) struct Peer {
    target: NodeId,
    addr: String,
    header: String,
    ca: Option<Vec<u8>>,
    client: Option<GroupClient<Channel>>,
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
        if self.client.is_none() {
            let c = connect(&self.addr, self.ca.as_deref())
                .await
                .map_err(|e| unreachable(format!("node {} at {}: {e}", self.target, self.addr)))?;
            self.client = Some(c);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(unreachable("no connection"));
        };
        let mut req = tonic::Request::new(GroupFrame { body });
        req.set_timeout(ttl);
        if let Ok(v) = self.header.parse() {
            req.metadata_mut().insert("authorization", v);
        }
        match client.call(req).await {
            Ok(r) => postcard::from_bytes(&r.into_inner().body).map_err(network),
            Err(s) => {
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

/// The `Group` service: hands each message to the local Raft (behind a
/// [`TokenCheck`](crate::auth::TokenCheck) of the group's admin token).
pub(super) struct Service {
    pub(super) raft: Raft,
    /// This node's copy of the objects uploaded to the group.
    pub(super) store: Arc<crate::objects::ObjectStore>,
}

#[tonic::async_trait]
impl crate::proto::group_server::Group for Service {
    async fn call(
        &self,
        req: tonic::Request<GroupFrame>,
    ) -> Result<tonic::Response<GroupFrame>, tonic::Status> {
        let rpc: Rpc = postcard::from_bytes(&req.get_ref().body)
            .map_err(|e| tonic::Status::invalid_argument(format!("a group message: {e}")))?;
        let reply = match rpc {
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
    /// The other nodes' group ports.
    peers: Vec<(NodeId, String)>,
    header: String,
    ca: Option<Vec<u8>>,
    clients: parking_lot::Mutex<HashMap<NodeId, GroupClient<Channel>>>,
}

impl ObjectPeers {
    pub(super) fn new(peers: Vec<(NodeId, String)>, token: &str, ca: Option<Vec<u8>>) -> Self {
        ObjectPeers {
            peers,
            header: format!("Bearer {token}"),
            ca,
            clients: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// How many other nodes there are.
    pub(super) fn len(&self) -> usize {
        self.peers.len()
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
        let mut req = tonic::Request::new(GroupFrame { body });
        req.set_timeout(ttl);
        if let Ok(v) = self.header.parse() {
            req.metadata_mut().insert("authorization", v);
        }
        match client.call(req).await {
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
        let (tx, mut rx) = tokio::sync::mpsc::channel(self.peers.len().max(1));
        for (id, addr) in self.peers.clone() {
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
            self.peers.len(),
            why.join("; ")
        ))
    }

    /// Object `hash` from the first other node that holds it (checked against its hash).
    pub(super) async fn get(&self, hash: &str, ttl: Duration) -> Option<Vec<u8>> {
        let body = postcard::to_allocvec(&Rpc::GetObject(hash.to_string())).ok()?;
        for (id, addr) in &self.peers {
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
