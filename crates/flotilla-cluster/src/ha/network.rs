//! The group's Raft messages between nodes: one gRPC method (`Group.Call`) on each node's
//! group port whose body is postcard of [`Rpc`] / [`Reply`], authenticated by the admin token
//! the group shares.

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
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Append(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    Snapshot(InstallSnapshotResponse<NodeId>),
    /// The node could not handle it (shutting down, a storage error): why.
    Refused(String),
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
            let scheme = if self.ca.is_some() { "https" } else { "http" };
            let mut ep = Endpoint::from_shared(format!("{scheme}://{}", self.addr))
                .map_err(unreachable)?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(1));
            if let Some(ca) = &self.ca {
                ep = ep
                    .tls_config(
                        ClientTlsConfig::new()
                            .ca_certificate(Certificate::from_pem(ca))
                            .domain_name(crate::transport::host_of(&self.addr)),
                    )
                    .map_err(|e| unreachable(format!("tls: {e}")))?;
            }
            let ch = ep
                .connect()
                .await
                .map_err(|e| unreachable(format!("node {} at {}: {e}", self.target, self.addr)))?;
            self.client = Some(
                GroupClient::new(ch)
                    .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES),
            );
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
        };
        let body = postcard::to_allocvec(&reply)
            .map_err(|e| tonic::Status::internal(format!("a group reply: {e}")))?;
        Ok(tonic::Response::new(GroupFrame { body }))
    }
}
