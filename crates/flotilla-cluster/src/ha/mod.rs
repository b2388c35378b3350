//! A group of coordinators (`flotilla server --node-id N --peers A,B,C`): one leads and
//! serves, the others follow; the journal is replicated with embedded Raft (openraft).
//!
//! # How
//! - Each turn of the leader's core proposes its journal records as one entry
//!   ([`Payload::Journal`]) and waits until a majority holds it; only then does it append
//!   them to its own journal, answer and dispatch (the single coordinator's rule, "nothing
//!   leaves before it is durable", with "durable" now meaning "on a majority").
//! - Followers apply committed entries to their own journal (see [`state_machine`]); they
//!   serve no API: their API port is closed, so clients and workers given the list of
//!   addresses connect to the leader, the one that accepts.
//! - A node that comes to lead commits an empty entry of its own and waits until its state
//!   machine has applied it (and so every entry before it, those it proposed itself before
//!   it last stopped serving included), then replays its journal exactly as a restarted
//!   coordinator does, and opens its API port.
//!   Workers reconnect to it, report their running attempts and re-send recent results,
//!   which it applies at most once.
//! - A leader that loses its leadership (or its majority), or whose commit fails, steps down
//!   at once: it closes its API port and drops its coordinator's whole state (which may hold
//!   records the group never committed), reopens its journal, catches it up from its log,
//!   and follows; it never answers from a state the group may have moved past.
//! - The access registry (tokens, tenants) is replicated the same way
//!   ([`Payload::Access`]), so every token works on whichever node leads.
//!
//! The group's own traffic goes to each node's *group port*, its API port + 1, and carries
//! the admin token the nodes share (every node's `STATE/token` holds the same token).

mod log_store;
mod network;
mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, LogId, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use self::log_store::LogStore;
pub use self::state_machine::StateMachine;
use crate::error::{ClusterError, Result};
use crate::journal::Journal;
use crate::state::JournalRecord;

openraft::declare_raft_types!(
    /// The group's Raft types.
    pub TypeConfig:
        D = Payload,
        R = (),
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// A node's id: its position in `--peers`, from 1.
pub type NodeId = u64;
/// A Raft log entry of the group.
pub type Entry = openraft::Entry<TypeConfig>;
/// The group's Raft.
pub type Raft = openraft::Raft<TypeConfig>;

/// What an entry carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    /// A turn's journal records (postcard of `Vec<JournalRecord>`).
    Journal(Vec<u8>),
    /// The access registry (`access.json`) after a change.
    Access(Vec<u8>),
    /// The allocation queues (`allocs.json`, `flotilla alloc`) after a change.
    Allocs(Vec<u8>),
    /// The files uploaded with job `job` (`uploads/JOB.json`, the list; empty: the job was
    /// removed, and with it the objects no other job's list names).
    Uploads {
        /// The job.
        job: u64,
        /// The list as the coordinator writes it.
        list: Vec<u8>,
    },
    /// The members that have held the group's log (the leader has seen each acknowledge an
    /// entry): one of them that starts again with an empty state folder is refused
    /// ([`Node::start`]), as Raft needs every node to keep its log and its vote.
    Held(Vec<NodeId>),
}

/// How a node of a group is set up.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// This node's id: its position in `peers`, from 1.
    pub node_id: NodeId,
    /// Every node's API address (`host:port`), the same list on every node and in the
    /// clients' `FLOTILLA_SERVER`; each node's group port is its API port + 1.
    pub peers: Vec<String>,
    /// How often the leader sends heartbeats.
    pub heartbeat: Duration,
    /// Followers that hear nothing for a random time in `election` start an election.
    pub election: (Duration, Duration),
    /// How long a turn may wait for a majority before the leader gives up leading.
    pub commit_timeout: Duration,
    /// When the server speaks TLS (`--tls-cert`, `--tls-key`), its group port does too, and
    /// it verifies the other nodes' certificates against this CA (PEM; `None`: the
    /// server's own certificate file, right for one certificate shared by the group or a
    /// chain that ends in the group's CA).
    pub peer_ca: Option<std::path::PathBuf>,
    /// A snapshot is built every this many log entries, and the log before it purged but
    /// for the last `min(1000, snapshot_every)` entries (kept for followers a little
    /// behind; one further behind is sent the snapshot).
    pub snapshot_every: u64,
    /// A node added to a running group (`flotilla server --join`): it does not set the
    /// group up from `peers` but waits for the leader to add it
    /// (`flotilla admin group add`).
    pub join: bool,
    /// How long `flotilla admin group add` waits for the new node to hold the log before
    /// giving up (it stays a learner, not a voter, until it does).
    pub add_timeout: Duration,
}

/// The default for [`GroupConfig::add_timeout`].
pub const DEFAULT_ADD_TIMEOUT: Duration = Duration::from_secs(120);

/// The default for [`GroupConfig::snapshot_every`].
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 10_000;

impl GroupConfig {
    /// Node `node_id` of `peers`, with the default timeouts: heartbeats every 100 ms;
    /// elections after 400–700 ms of silence (openraft adds a leader lease of the longest,
    /// 700 ms, after a leader was seen: a follower starts an election 1.1–1.4 s after its
    /// leader's last heartbeat); a commit may wait 5 s.
    pub fn new(node_id: NodeId, peers: Vec<String>) -> Result<GroupConfig> {
        if peers.len() < 2 {
            return Err(ClusterError::Config(
                "--peers: a group needs at least two addresses (three to survive a loss)".into(),
            ));
        }
        if node_id == 0 || node_id as usize > peers.len() {
            return Err(ClusterError::Config(format!(
                "--node-id {node_id}: the nodes are numbered 1 to {} in the order of --peers",
                peers.len()
            )));
        }
        let mut seen = BTreeSet::new();
        for p in &peers {
            if group_addr(p).is_none() {
                return Err(ClusterError::Config(format!(
                    "--peers: {p:?} is not host:port (with a port below 65535: the next port \
                     is the node's group port)"
                )));
            }
            if !seen.insert(p.as_str()) {
                return Err(ClusterError::Config(format!(
                    "--peers: {p} is listed twice"
                )));
            }
        }
        // Nodes on one host: a node's group port (its API port + 1) must not be another's
        // API port (each would start, then one fail to bind once it leads).
        for p in &peers {
            if let Some(g) = group_addr(p) {
                if let Some(other) = peers.iter().find(|q| **q == g) {
                    return Err(ClusterError::Config(format!(
                        "--peers: {other} is the group port of {p} (each node also listens on \
                         its API port + 1): space the ports of nodes on one host at least 2 \
                         apart, e.g. 7070, 7080, 7090"
                    )));
                }
            }
        }
        Ok(GroupConfig {
            node_id,
            peers,
            heartbeat: Duration::from_millis(100),
            election: (Duration::from_millis(400), Duration::from_millis(700)),
            commit_timeout: Duration::from_secs(5),
            peer_ca: None,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            join: false,
            add_timeout: DEFAULT_ADD_TIMEOUT,
        })
    }

    /// This node's API address as listed.
    pub fn own_api(&self) -> &str {
        &self.peers[(self.node_id - 1) as usize]
    }
}

/// The group port of the node whose API address is `api`: the same host, the next port.
pub fn group_addr(api: &str) -> Option<String> {
    let (host, port) = api.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(format!("{host}:{}", port.checked_add(1)?))
}

/// A member of the group as `flotilla status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupMember {
    /// Its node id.
    pub id: NodeId,
    /// Its API address.
    pub address: String,
    /// Whether it leads.
    pub leader: bool,
    /// The last log index the leader knows it holds (`None`: nothing yet, or unknown).
    pub matched: Option<u64>,
    /// Whether it votes (a node being added is a learner until it has caught up).
    #[serde(default)]
    pub voter: bool,
    /// Whether it has held the group's log: from then on it may not start again with an
    /// empty state folder (it is replaced by `flotilla admin group remove` and `add`).
    #[serde(default)]
    pub held: bool,
}

/// The group as the leader sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The leader's node id.
    pub node_id: NodeId,
    /// The Raft term.
    pub term: u64,
    /// The last log index committed and applied here.
    pub applied: Option<u64>,
    /// The last log index of this node's latest snapshot.
    #[serde(default)]
    pub snapshot: Option<u64>,
    /// The log here starts after this index (what the snapshot holds was dropped).
    #[serde(default)]
    pub purged: Option<u64>,
    /// Every member.
    pub members: Vec<GroupMember>,
    /// Whether this node would journal its clock leading: no member answers as a version that
    /// cannot read it (jobs' times are then kept across failovers).
    #[serde(default)]
    pub journal_clock: bool,
}

impl GroupStatus {
    /// The leader's API address as the group lists it (`--peers`), which clients and workers
    /// can reach: the address it listens on may be `0.0.0.0`, which they cannot.
    pub fn leader_address(&self) -> Option<&str> {
        self.members
            .iter()
            .find(|m| m.id == self.node_id)
            .map(|m| m.address.as_str())
    }
}

/// A running node: its Raft, its state machine and its group port.
pub struct Node {
    raft: Raft,
    sm: StateMachine,
    config: GroupConfig,
    handle: tokio::runtime::Handle,
    /// The other nodes, for the objects uploaded with jobs.
    objects: Arc<network::ObjectPeers>,
    /// This node's object store as the group port writes it (copies from the leader).
    store: Arc<crate::objects::ObjectStore>,
    /// Whether it takes part in the group (`None` until known; see [`Node::admitted`]).
    admission: watch::Receiver<Option<std::result::Result<(), String>>>,
    /// What every member reads in the group's log ([`network::FEATURES`] bits: clock
    /// records, retries; see [`watch_features`]).
    features: Arc<std::sync::atomic::AtomicU32>,
    /// While the coordinator here leads: the index of the last entry with journal records
    /// that its journal holds ([`Node::commit`] checks that it wrote every one since).
    written: parking_lot::Mutex<Option<u64>>,
}

fn raft_err(what: &str, e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Config(format!("the group: {what}: {e}"))
}

/// Sets this node up in the group: a blank node first asks the others whether it may
/// ([`refuse_if_held`]; its group port takes Raft's messages once it may); then a founder
/// whose Raft is not initialized initializes it with `--peers` (every founder does, with
/// the same members: whichever is first, the others' attempts are refused as done).
async fn take_part(
    raft: &Raft,
    config: &GroupConfig,
    (blank, admitted): (bool, &std::sync::atomic::AtomicBool),
    state_dir: &Path,
    token: &str,
    ca: Option<&[u8]>,
    stop: &mut watch::Receiver<bool>,
) -> Result<()> {
    if blank {
        if !refuse_if_held(config, state_dir, token, ca, stop).await? {
            return Ok(()); // stopping
        }
        admitted.store(true, std::sync::atomic::Ordering::Release);
    }
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| raft_err("state", e))?;
    if !initialized && !config.join {
        let members: BTreeMap<NodeId, BasicNode> = config
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| (i as NodeId + 1, BasicNode::new(p)))
            .collect();
        match raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => return Err(raft_err("initialize", e)),
        }
    }
    Ok(())
}

/// A node starting with nothing on disk asks the others whether it has held the group's
/// log (the leader records who has: [`record_held`]) and refuses to start if one says it
/// has: its log and its vote are lost, and Raft's promises rest on every node keeping
/// them (a node that forgot what it acknowledged can make a majority that lacks a
/// committed entry). Waits until another node answers: a group whose nodes all start
/// blank answers itself, each node answering before it takes part. `Ok(false)`: stopped
/// before an answer came.
async fn refuse_if_held(
    config: &GroupConfig,
    state_dir: &Path,
    token: &str,
    ca: Option<&[u8]>,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool> {
    let me = config.node_id;
    let others: Vec<(NodeId, String)> = config
        .peers
        .iter()
        .enumerate()
        .map(|(i, p)| (i as NodeId + 1, group_addr(p).unwrap_or_else(|| p.clone())))
        .filter(|(id, _)| *id != me)
        .collect();
    const HELD_ROUNDS: u32 = 10;
    let (mut told, mut rounds, mut held_rounds) = (false, 0u32, 0u32);
    loop {
        let answers =
            futures::future::join_all(others.iter().map(|(id, addr)| async move {
                (*id, network::ask_held(addr, ca, token, me).await)
            }))
            .await;
        // Said for a second in a row (a node just removed, to be added again under its
        // id, is still a member for a moment in the others' view).
        let said = answers.iter().find(|(_, r)| matches!(r, Ok(true)));
        held_rounds = if said.is_some() { held_rounds + 1 } else { 0 };
        if let Some((by, _)) = said.filter(|_| held_rounds >= HELD_ROUNDS) {
            return Err(ClusterError::Config(format!(
                "node {me} has held the group's log (node {by} says so), but its state folder \
                 {} holds none: a node that lost its state may not take part again under its \
                 id, as the group's guarantees rest on every node keeping its log and its \
                 vote. Replace it: `flotilla admin group remove {me}`, then start it with \
                 `--join` and `flotilla admin group add {me} ADDRESS` (docs/cluster.md). If \
                 this is the wrong folder, start it with its own --state",
                state_dir.display()
            )));
        }
        // A node of an older version cannot tell (it keeps no such record): an answer too.
        if said.is_none()
            && answers
                .iter()
                .any(|(_, r)| matches!(r, Ok(_) | Err(network::NoAnswer::Older)))
        {
            return Ok(true);
        }
        if !told {
            let why: Vec<String> = answers
                .iter()
                .filter_map(|(id, r)| match r {
                    Err(network::NoAnswer::Unreachable(why)) => Some(format!("node {id}: {why}")),
                    _ => None,
                })
                .collect();
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join("; "))
            };
            tracing::warn!(
                node = me,
                "this node starts with an empty state folder: waiting for another node of \
                 the group to say whether it held the group's log before{why}"
            );
            told = true;
        }
        // Often at first: the nodes of a new group start together, and one that has not
        // taken part when the others go on cannot vote.
        rounds += 1;
        let pause = if rounds <= 20 { 100 } else { 500 };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(pause)) => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return Ok(false);
                }
            }
        }
    }
}

/// Set in [`Node`]'s features once the other members were asked (the bits before are not
/// known: none set).
const FEATURES_KNOWN: u32 = 1 << 31;

/// Keeps `features` saying what every member reads in the group's log
/// ([`network::FEATURES`]: [`JournalRecord::Clock`](crate::state::JournalRecord::Clock),
/// [`JournalRecord::JobRetried`](crate::state::JournalRecord::JobRetried)), asking the others
/// every 5 s: a bit is off while one answers as an older version (mid rolling upgrade, none
/// of them) or without it. A member that does not answer counts as one that reads the clock,
/// as for [`record_held`]: a leader that lost a member to a crash keeps jobs' times (the
/// member comes back as the version it was, or an upgrade; a clock record it cannot read
/// costs only times). Not as one that reads retries: a member down mid-upgrade may come back
/// as the older version, which could not replay a retry at all.
async fn watch_features(
    raft: Raft,
    me: NodeId,
    (token, ca): (String, Option<Vec<u8>>),
    features: Arc<std::sync::atomic::AtomicU32>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
        let others: Vec<String> = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != me)
            .map(|(_, n)| group_addr(&n.addr).unwrap_or_else(|| n.addr.clone()))
            .collect();
        let asked = futures::future::join_all(
            others
                .iter()
                .map(|addr| network::ask_features(addr, ca.as_deref(), &token)),
        )
        .await;
        let all = asked.iter().fold(network::FEATURES, |all, r| match r {
            Ok(f) => all & f,
            Err(network::NoAnswer::Older) => 0,
            Err(network::NoAnswer::Unreachable(_)) => {
                all & !network::FEATURE_JOB_RETRIED & !network::FEATURE_PLACEHOLDER_ESCAPES
            }
        });
        // From the first round on, known (before it no bit is set: none is taken as read).
        let before = features.swap(all | FEATURES_KNOWN, std::sync::atomic::Ordering::AcqRel);
        let said = [
            (
                network::FEATURE_JOURNAL_CLOCK,
                "every member reads the journal's clock: jobs' times are kept",
                "a member runs an older flotilla: the journal's clock is not written until \
                 every member reads it",
            ),
            (
                network::FEATURE_JOB_RETRIED,
                "every member reads retries: `flotilla retry` is taken",
                "a member runs an older flotilla or does not answer: `flotilla retry` is \
                 refused until every member reads retries",
            ),
        ];
        for (bit, on, off) in said {
            if before & bit != all & bit {
                tracing::info!("{}", if all & bit != 0 { on } else { off });
            }
        }
    }
}

/// While this node leads: commits the members that have held the log
/// ([`Payload::Held`]) whenever it changes: a member is added once the leader has seen it
/// acknowledge an entry, and dropped once it is no longer a member (removed, it may be
/// added again under its id with an empty state folder). Not while a member runs an older
/// flotilla, which could not read the entry (a rolling upgrade): it asks every member
/// first, again at most every 30 s.
async fn record_held(
    (raft, sm): (Raft, StateMachine),
    me: NodeId,
    (token, ca): (String, Option<Vec<u8>>),
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    let mut older_until: Option<tokio::time::Instant> = None;
    loop {
        let want = {
            let m = metrics.borrow_and_update();
            (m.state == openraft::ServerState::Leader).then(|| {
                let members: BTreeSet<NodeId> = m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, _)| *id)
                    .collect();
                let had = sm.held();
                let mut want: BTreeSet<NodeId> = had.intersection(&members).copied().collect();
                want.insert(me);
                for (id, matched) in m.replication.iter().flatten() {
                    if matched.is_some() && members.contains(id) {
                        want.insert(*id);
                    }
                }
                // Built only on a change (this runs at every entry the leader commits).
                (want != had).then(|| {
                    let others: Vec<(NodeId, String)> = m
                        .membership_config
                        .membership()
                        .nodes()
                        .filter(|(id, _)| **id != me)
                        .map(|(id, n)| (*id, group_addr(&n.addr).unwrap_or_else(|| n.addr.clone())))
                        .collect();
                    (want, others)
                })
            })
        };
        let waiting = older_until.is_some_and(|t| tokio::time::Instant::now() < t);
        if let Some((want, others)) = want.flatten().filter(|_| !waiting) {
            let asked = futures::future::join_all(others.iter().map(|(id, addr)| {
                let (token, ca) = (&token, ca.as_deref());
                async move { (*id, network::ask_held(addr, ca, token, me).await) }
            }))
            .await;
            if let Some((old, _)) = asked
                .iter()
                .find(|(_, r)| matches!(r, Err(network::NoAnswer::Older)))
            {
                if older_until.is_none() {
                    tracing::warn!(
                        node = old,
                        "a member runs an older flotilla: the members that held the log are \
                         recorded once every member is upgraded"
                    );
                }
                older_until = Some(tokio::time::Instant::now() + Duration::from_secs(30));
                continue;
            }
            older_until = None;
            let ids: Vec<NodeId> = want.into_iter().collect();
            match raft.client_write(Payload::Held(ids.clone())).await {
                Ok(_) => tracing::debug!(?ids, "the members that held the log"),
                Err(e) => tracing::debug!("the members that held the log not recorded: {e}"),
            }
        }
        tokio::select! {
            r = metrics.changed() => {
                if r.is_err() {
                    break;
                }
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
    }
}

impl Node {
    /// Opens this node's log (`STATE/group/log`) and journal, serves the group port, and
    /// joins (initializing the group the first time its nodes start).
    ///
    /// With `tls` (the server's certificate and key), the group port speaks TLS only, and
    /// this node reaches the others over TLS, verifying them against
    /// [`GroupConfig::peer_ca`]. `max_uploads` caps the objects this node keeps for the
    /// group as it caps its own uploads (`flotilla server --max-uploads`): a copy beyond is
    /// refused, and a submission a majority cannot keep is refused too. The group port is
    /// `listen`'s port + 1, on every interface when `listen` is (else on the address this
    /// node's entry in --peers resolves to).
    pub async fn start(
        config: GroupConfig,
        listen: SocketAddr,
        state_dir: &Path,
        token: &str,
        (fsync, max_uploads): (bool, Option<u64>),
        tls: Option<&crate::transport::ServerTls>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Arc<Node>> {
        let peer_tls = match tls {
            Some(t) => {
                let ca = config.peer_ca.clone().unwrap_or_else(|| t.cert.clone());
                let pem = std::fs::read(&ca).map_err(|e| ClusterError::io(&ca, e))?;
                Some((t.config()?, pem))
            }
            None => None,
        };
        let log_path = state_dir.join("group").join("log");
        let log = LogStore::open(&log_path, fsync).map_err(|e| ClusterError::io(&log_path, e))?;
        let sm = StateMachine::open(state_dir, fsync, log.clone())?;
        // A node with nothing on disk asks the others whether it has held the log before
        // taking part (below); until then its group port refuses Raft's messages.
        let blank = log.is_blank() && sm.applied().is_none();
        let admitted = Arc::new(std::sync::atomic::AtomicBool::new(!blank));
        let rc = openraft::Config {
            cluster_name: "flotilla".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election.0.as_millis() as u64,
            election_timeout_max: config.election.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every.max(1)),
            max_in_snapshot_log_to_keep: config.snapshot_every.clamp(1, 1000),
            // A snapshot is the whole journal: give its chunks time on a loaded machine.
            install_snapshot_timeout: config.commit_timeout.as_millis() as u64,
            max_payload_entries: 64,
            ..Default::default()
        }
        .validate()
        .map_err(|e| raft_err("settings", e))?;
        let logged = log.member_address(config.node_id);
        let raft = Raft::new(
            config.node_id,
            Arc::new(rc),
            network::Net::new(token, peer_tls.as_ref().map(|(_, ca)| ca.clone())),
            log,
            sm.clone(),
        )
        .await
        .map_err(|e| raft_err("start", e))?;
        // The group knows this node by the address it was added with: started under
        // another (a typo in its own entry of --peers), it would lead at an address no client
        // or worker is given, and the group would have no reachable leader. The latest
        // membership its log holds, applied or not (a node stopped soon after the group
        // formed held it unapplied, and ran on unchecked), else the one applied.
        let known = logged.unwrap_or_else(|| sm.member_address(config.node_id));
        if let Some(known) = known.filter(|k| k != config.own_api()) {
            raft.shutdown().await.ok();
            return Err(ClusterError::Config(format!(
                "--peers gives node {} the address {}, but the group knows it as {known}: give \
                 every node the same list, in the group's order (`flotilla status --json` \
                 lists the members); to move a node, remove it (`flotilla admin group remove \
                 {}`) and add it at its new address",
                config.node_id,
                config.own_api(),
                config.node_id
            )));
        }
        // On every interface when the API is (`--listen 0.0.0.0:PORT`): then this node's own
        // name in --peers need not resolve yet (a pod's DNS record appears after it starts).
        let at: SocketAddr = match listen.port().checked_add(1) {
            Some(port) if listen.ip().is_unspecified() => SocketAddr::new(listen.ip(), port),
            _ => {
                let own = group_addr(config.own_api()).unwrap_or_default();
                tokio::net::lookup_host(&own)
                    .await
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        ClusterError::Config(format!("--peers: cannot resolve this node's {own}"))
                    })?
            }
        };
        let listener = tokio::net::TcpListener::bind(at)
            .await
            .map_err(|e| ClusterError::Bind {
                addr: at.to_string(),
                flag: Some("--peers"),
                source: e,
            })?;
        let store = Arc::new(crate::objects::ObjectStore::open_capped(
            &state_dir.join("objects"),
            max_uploads.map(|cap| (cap, "flotilla server --max-uploads")),
        )?);
        let objects = Arc::new(network::ObjectPeers::new(
            config
                .peers
                .iter()
                .enumerate()
                .map(|(i, p)| (i as NodeId + 1, group_addr(p).unwrap_or_else(|| p.clone())))
                .filter(|(id, _)| *id != config.node_id)
                .collect(),
            token,
            peer_tls.as_ref().map(|(_, ca)| ca.clone()),
        ));
        objects.start_log_senders();
        let service = tonic::service::interceptor::InterceptedService::new(
            crate::proto::group_server::GroupServer::new(network::Service {
                raft: raft.clone(),
                store: store.clone(),
                state_dir: state_dir.to_path_buf(),
                sm: sm.clone(),
                admitted: admitted.clone(),
            })
            .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES),
            crate::auth::TokenCheck::for_group(token.to_string()),
        );
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let stop_serving = stop.clone();
        let mut builder = tonic::transport::Server::builder().tcp_nodelay(true);
        let peer_ca = peer_tls.as_ref().map(|(_, ca)| ca.clone());
        if let Some((server_tls, _)) = peer_tls {
            builder = builder
                .tls_config(server_tls)
                .map_err(|e| ClusterError::Config(format!("the group port's tls: {e}")))?;
        }
        tokio::spawn(async move {
            let r = builder
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, crate::server::stopped(stop_serving))
                .await;
            if let Err(e) = r {
                tracing::error!("the group port stopped: {e}");
            }
        });
        tracing::info!(node = config.node_id, %at, "group port listening");
        // Taking part (after asking the others, when blank) goes on in the background:
        // the nodes of a new group may be started one after another.
        let (admission_tx, admission) = watch::channel(None);
        {
            let (raft, config, state_dir) = (raft.clone(), config.clone(), state_dir.to_owned());
            let (token, mut stop, ca) = (token.to_string(), stop.clone(), peer_ca.clone());
            tokio::spawn(async move {
                let r = take_part(
                    &raft,
                    &config,
                    (blank, &admitted),
                    &state_dir,
                    &token,
                    ca.as_deref(),
                    &mut stop,
                )
                .await;
                let _ = admission_tx.send(Some(r.map_err(|e| e.to_string())));
            });
        }
        // The nodes uploads and task logs are copied to follow the group's members (added
        // and removed with `flotilla admin group`); `--peers` until the group is set up.
        let (me, members_objects) = (config.node_id, objects.clone());
        let mut metrics = raft.metrics();
        let mut members_stop = stop.clone();
        tokio::spawn(async move {
            // The metrics change with every entry; the members only with a membership entry.
            let mut seen = None;
            loop {
                let peers: Option<Vec<(NodeId, String)>> = {
                    let m = metrics.borrow_and_update();
                    let at = *m.membership_config.log_id();
                    (seen != Some(at)).then(|| {
                        seen = Some(at);
                        m.membership_config
                            .membership()
                            .nodes()
                            .filter(|(id, _)| **id != me)
                            .map(|(id, n)| {
                                (*id, group_addr(&n.addr).unwrap_or_else(|| n.addr.clone()))
                            })
                            .collect()
                    })
                };
                if let Some(peers) = peers.filter(|p| !p.is_empty()) {
                    members_objects.set_peers(peers);
                }
                tokio::select! {
                    r = metrics.changed() => {
                        if r.is_err() {
                            break;
                        }
                    }
                    r = members_stop.changed() => {
                        if r.is_err() || *members_stop.borrow() {
                            break;
                        }
                    }
                }
            }
        });
        // The leader records which members have held the log (see `refuse_if_held`).
        tokio::spawn(record_held(
            (raft.clone(), sm.clone()),
            config.node_id,
            (token.to_string(), peer_ca.clone()),
            stop.clone(),
        ));
        let features = Arc::new(std::sync::atomic::AtomicU32::new(0));
        tokio::spawn(watch_features(
            raft.clone(),
            config.node_id,
            (token.to_string(), peer_ca.clone()),
            features.clone(),
            stop.clone(),
        ));
        // A follower's compaction finishes at the next entry it applies, or here when the
        // group is idle.
        let finisher = sm.clone();
        let mut finisher_stop = stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        let sm = finisher.clone();
                        let _ = tokio::task::spawn_blocking(move || sm.finish_compaction_if_done())
                            .await;
                    }
                    r = finisher_stop.changed() => {
                        if r.is_err() || *finisher_stop.borrow() {
                            break;
                        }
                    }
                }
            }
        });
        let _ = stop.borrow_and_update();
        Ok(Arc::new(Node {
            raft,
            sm,
            config,
            handle: tokio::runtime::Handle::current(),
            objects,
            store,
            admission,
            features,
            written: parking_lot::Mutex::new(None),
        }))
    }

    /// Waits until this node takes part in the group: `Err` when it may not (it held the
    /// log and its state is gone) or its Raft could not be set up.
    pub async fn admitted(&self) -> Result<()> {
        let mut rx = self.admission.clone();
        let r = rx
            .wait_for(Option::is_some)
            .await
            .map(|r| r.clone())
            .map_err(|_| ClusterError::Config("the group's start-up task ended".into()))?;
        r.unwrap_or(Ok(())).map_err(ClusterError::Config)
    }

    /// Copies an object this node (the leader) was given to the others; returns once a
    /// majority of the group holds it (this node counted), so that whichever node leads
    /// next has it or can get it ([`Node::recover_object`]). Waits at most the commit
    /// timeout.
    pub async fn replicate_object(
        &self,
        hash: &str,
        data: &[u8],
    ) -> std::result::Result<(), String> {
        let voters = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .count();
        let needed = voters / 2; // a majority, less this node
        self.objects
            .put(hash, data, needed, self.config.commit_timeout)
            .await
    }

    /// Copies what this node (the leader) appended to a task log (`logs/JOB/TASK.ATTEMPT.out`
    /// or `.err`, relative to the state folder) to the other nodes, in order, without
    /// waiting: best effort, so that the next leader can show earlier attempts' logs.
    pub fn replicate_log(&self, path: &str, data: &[u8]) {
        self.objects.send_log(path, data);
    }

    /// Object `hash` from another node of the group, when this one lacks it (it was
    /// uploaded to a leader before this one and reached a majority without this node).
    pub async fn recover_object(&self, hash: &str) -> Option<Vec<u8>> {
        self.objects.get(hash, self.config.commit_timeout).await
    }

    /// Waits until this node leads and has applied everything committed before; then hands
    /// over the journal for the coordinator to replay. `None` when `stop` came first.
    pub async fn lead(&self, stop: &mut watch::Receiver<bool>) -> Result<Option<Journal>> {
        let mut m = self.raft.metrics();
        loop {
            if *stop.borrow() {
                return Ok(None);
            }
            let leads = {
                let b = m.borrow_and_update();
                b.state == ServerState::Leader && b.current_leader == Some(self.config.node_id)
            };
            if leads {
                // A barrier: an entry of this node's, committed and applied here while the
                // state machine still writes the journal. Every entry before it is then in
                // the journal, those this node proposed before it stopped serving and
                // that are committed only now included: its term may be the same (a leader
                // that lost its majority stays Raft's leader), so there is no new term's
                // first entry to wait for, and such an entry applied after the journal was
                // handed over was written by no one (the other nodes held it, this one did
                // not: their journals disagreed and failed to replay when they led).
                let barrier = postcard::to_allocvec(&Vec::<JournalRecord>::new())
                    .map_err(|e| ClusterError::Config(e.to_string()))?;
                let ready = tokio::time::timeout(
                    self.config.commit_timeout,
                    self.raft.client_write(Payload::Journal(barrier)),
                )
                .await;
                if let Ok(Ok(_)) = ready {
                    let journal = self.sm.take_journal().ok_or_else(|| {
                        ClusterError::Config("the group: the journal was taken already".into())
                    })?;
                    *self.written.lock() = self.sm.applied().map(|l| l.index);
                    // A leadership change is the operator's business: said at the default level.
                    tracing::warn!(
                        node = self.config.node_id,
                        applied = ?self.sm.applied().map(|l| l.index),
                        "this node leads the group"
                    );
                    return Ok(Some(journal));
                }
                continue;
            }
            tokio::select! {
                r = m.changed() => {
                    if r.is_err() {
                        return Err(ClusterError::Config("the group's Raft stopped".into()));
                    }
                }
                _ = stop.changed() => {}
            }
        }
    }

    /// The coordinator here stopped leading (and dropped the journal): the node follows
    /// again, its journal caught up with what it applied meanwhile.
    pub fn follow(&self, fsync: bool) -> Result<()> {
        // The objects taken while leading were written by the coordinator's own store.
        self.store.recount();
        self.sm.follow(fsync)
    }

    /// Resolves when this node no longer leads, or has not heard from a majority for two
    /// election timeouts; says why.
    pub async fn deposed(&self) -> String {
        let mut m = self.raft.metrics();
        let quiet = self.config.election.1 * 2;
        loop {
            {
                let b = m.borrow_and_update();
                if b.state != ServerState::Leader {
                    return match b.current_leader {
                        Some(l) if l != self.config.node_id => {
                            format!("node {l} leads the group now")
                        }
                        _ => "this node no longer leads the group".into(),
                    };
                }
                if let Some(ms) = b.millis_since_quorum_ack {
                    if Duration::from_millis(ms) > quiet {
                        return format!(
                            "this node has not heard from a majority of the group for {ms} ms"
                        );
                    }
                }
            }
            tokio::select! {
                r = m.changed() => {
                    if r.is_err() {
                        return "the group's Raft stopped".into();
                    }
                }
                _ = tokio::time::sleep(self.config.heartbeat) => {}
            }
        }
    }

    /// Proposes `records` and waits until a majority holds them; returns the marker to
    /// append after them. Blocking: for the core's thread, never a runtime's.
    ///
    /// Every entry with journal records committed since the coordinator here took the
    /// journal must be one of its own: one that is not (it would be in the other nodes'
    /// journals and not in this one's) stops this coordinator, and the node, following
    /// again, appends the entries its journal lacks from its log.
    pub fn commit(&self, records: &[JournalRecord]) -> std::result::Result<JournalRecord, String> {
        let bytes = postcard::to_allocvec(records).map_err(|e| e.to_string())?;
        let log_id = self.write_blocking(Payload::Journal(bytes))?;
        let mut written = self.written.lock();
        let missed = self.sm.journal_entries_between(*written, log_id.index);
        if !missed.is_empty() {
            return Err(format!(
                "entries {missed:?} of the group's log were committed while this node led, \
                 and its journal does not hold them: it catches up"
            ));
        }
        *written = Some(log_id.index);
        Ok(self.sm.marker(log_id))
    }

    /// Replicates the access registry `bytes` (written to `STATE/access.json` on every node,
    /// this one included, once committed). Blocking; from a multi-thread runtime's task.
    pub fn commit_access(&self, bytes: &[u8]) -> std::result::Result<(), String> {
        self.commit_file(Payload::Access(bytes.to_vec()))
    }

    /// Replicates the allocation queues `bytes` (written to `STATE/allocs.json` on every
    /// node, this one included, once committed). Blocking; from a multi-thread runtime's task
    /// or a blocking thread.
    pub fn commit_allocs(&self, bytes: &[u8]) -> std::result::Result<(), String> {
        self.commit_file(Payload::Allocs(bytes.to_vec()))
    }

    /// Replicates the list of files uploaded with job `job` (`list`: `uploads/JOB.json` on
    /// every node once committed; empty: the job was removed). Blocking, as
    /// [`Node::commit_allocs`].
    pub fn commit_uploads(&self, job: u64, list: &[u8]) -> std::result::Result<(), String> {
        self.commit_file(Payload::Uploads {
            job,
            list: list.to_vec(),
        })
    }

    fn commit_file(&self, p: Payload) -> std::result::Result<(), String> {
        let write = || self.write_blocking(p);
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(write).map(|_| ())
            }
            Ok(_) => Err("a group needs a multi-thread runtime".into()),
            Err(_) => write().map(|_| ()),
        }
    }

    fn write_blocking(&self, p: Payload) -> std::result::Result<LogId<NodeId>, String> {
        let timeout = self.config.commit_timeout;
        let raft = self.raft.clone();
        match self
            .handle
            .block_on(async move { tokio::time::timeout(timeout, raft.client_write(p)).await })
        {
            Ok(Ok(r)) => Ok(r.log_id),
            Ok(Err(e)) => Err(format!("the group did not commit: {e}")),
            Err(_) => Err(format!(
                "the group did not commit within {timeout:?} (no majority reachable)"
            )),
        }
    }

    /// Adds node `id`, whose API address is `addr`, to the group (on the leader): first as
    /// a learner, sent the log (or the leader's snapshot) until it holds what is committed,
    /// then as a voter. The node runs `flotilla server --node-id ID --peers ... --join`.
    pub async fn add_member(
        &self,
        id: NodeId,
        addr: &str,
    ) -> std::result::Result<GroupStatus, String> {
        if id == 0 {
            return Err("node ids start at 1".into());
        }
        if group_addr(addr).is_none() {
            return Err(format!(
                "{addr:?} is not host:port (with a port below 65535: the next port is the \
                 node's group port)"
            ));
        }
        let (voters, taken) = {
            let m = self.raft.metrics().borrow().clone();
            let ms = m.membership_config.membership().clone();
            let taken = ms
                .nodes()
                .find(|(other, n)| **other != id && n.addr == addr)
                .map(|(other, _)| *other);
            (ms.voter_ids().collect::<BTreeSet<_>>(), taken)
        };
        if voters.contains(&id) {
            return Err(format!("node {id} is a member already"));
        }
        if let Some(other) = taken {
            return Err(format!("{addr} is node {other}'s address"));
        }
        let wait = self.config.add_timeout;
        let not_caught_up = || {
            format!(
                "node {id} at {addr} did not catch up within {wait:?} (is it running, with \
                 `flotilla server --node-id {id} ... --join`?); it stays a learner until it \
                 does, or until `flotilla admin group remove {id}`"
            )
        };
        let added = match tokio::time::timeout(
            wait,
            self.raft.add_learner(id, BasicNode::new(addr), false),
        )
        .await
        {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(format!("node {id} not added: {e}")),
            Err(_) => return Err(not_caught_up()),
        };
        // Wait until it holds the log up to its own addition. (openraft's blocking
        // add_learner gives up waiting after its default timeout and answers Ok all the same:
        // a node that was never started became a voter, and the group then lost its
        // majority with one more node down.)
        let target = added.log_id.index;
        self.raft
            .wait(Some(wait))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).cloned().flatten())
                        .is_some_and(|l| l.index >= target)
                },
                "the new learner to catch up",
            )
            .await
            .map_err(|_| not_caught_up())?;
        let mut new = voters;
        new.insert(id);
        self.raft
            .change_membership(new, false)
            .await
            .map_err(|e| format!("node {id} caught up but was not made a voter: {e}"))?;
        tracing::warn!(node = id, %addr, "a node was added to the group");
        Ok(self.status())
    }

    /// Removes node `id` (a voter or a learner) from the group (on the leader). The leader
    /// may remove itself: it leads until the change is committed, then another leads.
    pub async fn remove_member(&self, id: NodeId) -> std::result::Result<GroupStatus, String> {
        let (voters, known) = {
            let m = self.raft.metrics().borrow().clone();
            let ms = m.membership_config.membership().clone();
            let known = ms.nodes().any(|(n, _)| *n == id);
            (ms.voter_ids().collect::<BTreeSet<_>>(), known)
        };
        if !known {
            return Err(format!("node {id} is not in the group"));
        }
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(format!("node {id} is the last voter: a group needs one"));
            }
            // Not kept as a learner either.
            openraft::ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| format!("node {id} not removed: {e}"))?;
        tracing::warn!(node = id, "a node was removed from the group");
        Ok(self.status())
    }

    /// Whether the leader may write clock records: no member answers as a version that cannot
    /// read them (see [`watch_features`]).
    pub fn writes_clock(&self) -> bool {
        self.features.load(std::sync::atomic::Ordering::Acquire) & network::FEATURE_JOURNAL_CLOCK
            != 0
    }

    /// Why the leader may not take a `flotilla retry` (write
    /// [`JournalRecord::JobRetried`](crate::state::JournalRecord::JobRetried)) now, if so: a
    /// member answers as an older version or does not answer, or the members have not been
    /// asked yet (see [`watch_features`]).
    pub fn retry_refusal(&self) -> Option<String> {
        self.lacks(
            network::FEATURE_JOB_RETRIED,
            "cannot read a retry in the group's log",
        )
    }

    /// Why the leader may not take a job file with `${i}` or `{{i}}` now, if so: as for
    /// [`Node::retry_refusal`] (an older version expands them otherwise).
    pub fn placeholder_refusal(&self) -> Option<String> {
        self.lacks(
            network::FEATURE_PLACEHOLDER_ESCAPES,
            "would expand `${i}` and `{{i}}` otherwise (only newer versions keep them as \
             written)",
        )
    }

    /// What stops the group from taking what needs feature `bit` of every member, if it is
    /// not known that every member has it: `older` says what an older version would do.
    fn lacks(&self, bit: u32, older: &str) -> Option<String> {
        let f = self.features.load(std::sync::atomic::Ordering::Acquire);
        if f & FEATURES_KNOWN == 0 {
            Some(
                "this coordinator has not yet asked the group's other members what they read \
                 in the group's log: try again in a moment"
                    .into(),
            )
        } else if f & bit == 0 {
            Some(format!(
                "a coordinator of the group runs an older flotilla, which {older}, or does not \
                 answer (it could come back as one): upgrade or restart every member first \
                 (`flotilla status` lists them)"
            ))
        } else {
            None
        }
    }

    /// The group as this node sees it.
    pub fn status(&self) -> GroupStatus {
        let m = self.raft.metrics().borrow().clone();
        let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        let held = self.sm.held();
        let members = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, n)| GroupMember {
                id: *id,
                address: n.addr.clone(),
                voter: voters.contains(id),
                held: held.contains(id),
                leader: m.current_leader == Some(*id),
                matched: if *id == self.config.node_id {
                    m.last_log_index
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id).cloned().flatten())
                        .map(|l| l.index)
                },
            })
            .collect();
        GroupStatus {
            node_id: self.config.node_id,
            term: m.current_term,
            applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
            members,
            journal_clock: self.writes_clock(),
        }
    }

    /// Stops the node's Raft.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("the group's Raft did not stop cleanly: {e}");
        }
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn the_leader_is_named_by_its_address_in_the_group() {
        let member = |id: NodeId, address: &str| GroupMember {
            id,
            address: address.into(),
            leader: id == 3,
            matched: None,
            voter: true,
            held: true,
        };
        let mut g = GroupStatus {
            node_id: 3,
            members: vec![
                member(1, "n1:7070"),
                member(2, "n2:7070"),
                member(3, "n3:7070"),
            ],
            ..GroupStatus::default()
        };
        assert_eq!(g.leader_address(), Some("n3:7070"));
        g.node_id = 9; // not (or no longer) a member
        assert_eq!(g.leader_address(), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(peers: &[&str]) -> String {
        match GroupConfig::new(1, peers.iter().map(|p| p.to_string()).collect()) {
            Ok(_) => panic!("{peers:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn peers_are_checked_before_the_group_starts() {
        assert!(refused(&["a:1"]).contains("at least two"));
        assert!(refused(&["a:1", "a:1"]).contains("listed twice"));
        assert!(refused(&["a", "b:2"]).contains("not host:port"));
        // Consecutive ports on one host: node 1's group port is node 2's API port.
        let e = refused(&["h:7070", "h:7071", "h:7072"]);
        assert!(e.contains("h:7071 is the group port of h:7070"), "{e}");
        for ok in [
            &["h:7070", "h:7072", "h:7074"][..],
            &["a:7070", "b:7070", "c:7070"][..],
        ] {
            assert!(
                GroupConfig::new(1, ok.iter().map(|p| p.to_string()).collect()).is_ok(),
                "{ok:?}"
            );
        }
    }
}
