//! The group's state machine: the node's own journal (and access registry).
//!
//! While the node follows, applying an entry appends its records to `STATE/journal.log`,
//! followed by a [`JournalRecord::Replicated`] marker naming the entry, in one append: the
//! marker is how a restarted node knows what it has applied, and the two are durable
//! together or not at all. When the node leads, its coordinator owns the journal and
//! appends each entry's records itself once the group has committed them (with the same
//! marker); the state machine then only keeps count. A deposed leader stops, and its restart
//! applies from its last marker on whatever the new leader committed.
//!
//! # Snapshots
//! A snapshot is the node's journal up to its last marker, with the files the other payloads
//! replace whole (`access.json`, `allocs.json`, `uploads/JOB.json`), read from disk as they
//! are: the marker names the entry the snapshot stops at. Those files may be from later
//! entries, which is harmless: applying an entry that replaces a whole file again writes
//! the same file. Once a snapshot is built, Raft purges the log before it (less the
//! entries it keeps for followers a little behind); a node that needs purged entries is
//! sent the leader's snapshot instead, and installing it replaces its journal and those
//! files. A snapshot is built from disk whenever it is asked for, so none is stored
//! twice.
//!
//! # Compaction
//! The leader decides when the journal is compacted (removed jobs' records weigh enough):
//! it commits its [`JournalRecord::Checkpoint`] as an entry of its own, appends it, and
//! compacts its journal up to there. Every follower that applies that entry compacts its
//! own journal at the same point with the same checkpoint (which is exactly its state
//! there), on a thread, and finishes at a later entry (or within half a second when none
//! comes); a node that starts leading takes the running compaction over with the journal
//! ([`Journal::hand_over`]).

use std::collections::BTreeSet;
use std::io::{Cursor, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Entry, NodeId, Payload, TypeConfig};
use crate::access::ACCESS_FILE;
use crate::journal::{Compaction, Journal, SyncMode};
use crate::state::JournalRecord;

/// What a [`JournalRecord::Replicated`] marker holds.
#[derive(Serialize, Deserialize)]
struct Marker {
    applied: LogId<NodeId>,
    membership: StoredMembership<NodeId, openraft::BasicNode>,
}

struct Inner {
    /// `Some` while the state machine writes the journal (the node follows).
    journal: Option<Journal>,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, openraft::BasicNode>,
    state_dir: PathBuf,
    fsync: bool,
    /// A snapshot's journal installed while the coordinator owned the journal (between
    /// leading and following): [`StateMachine::follow`] puts it in place.
    pending: Option<Vec<u8>>,
    /// The journal's compaction, started where the leader compacted its own (see the
    /// module's doc).
    compaction: Option<Compaction>,
    /// The members that have held the group's log ([`Payload::Held`], `group/held.json`).
    held: BTreeSet<NodeId>,
}

/// The state machine ([`RaftStateMachine`]); clones share it.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<Inner>>,
    /// The node's log: a journal handed back by a coordinator that stopped leading is caught
    /// up from it.
    log: super::LogStore,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&std::io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Opens `STATE/journal.log`, reading what was applied from its last marker.
    pub fn open(
        state_dir: &Path,
        fsync: bool,
        log: super::LogStore,
    ) -> crate::error::Result<StateMachine> {
        let (journal, marker) = open_journal(state_dir, fsync)?;
        let (applied, membership) = match marker {
            Some(m) => (Some(m.applied), m.membership),
            None => (None, StoredMembership::default()),
        };
        let held = read_held(state_dir)
            .map_err(|e| crate::error::ClusterError::io(&state_dir.join(HELD_FILE), e))?;
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(Inner {
                journal: Some(journal),
                applied,
                membership,
                state_dir: state_dir.to_path_buf(),
                fsync,
                pending: None,
                compaction: None,
                held,
            })),
            log,
        })
    }

    /// The node follows again: the journal is reopened here, and the entries applied while
    /// the coordinator owned it but that it did not append (proposed, then committed by the
    /// next leader after this one gave up) are appended from the log.
    pub fn follow(&self, fsync: bool) -> crate::error::Result<()> {
        let mut g = self.inner.lock();
        if let Some(bytes) = g.pending.take() {
            Journal::replace_file(&g.state_dir.join("journal.log"), &bytes)?;
        }
        let (mut journal, marker) = open_journal(&g.state_dir, fsync)?;
        let from = marker.map(|m| m.applied.index + 1).unwrap_or(0);
        if let Some(to) = g.applied.map(|l| l.index).filter(|to| *to >= from) {
            let mut caught_up = 0usize;
            for e in self.log.entries(from..=to) {
                if let EntryPayload::Normal(Payload::Journal(bytes)) = e.payload {
                    let mut records: Vec<JournalRecord> = postcard::from_bytes(&bytes)
                        .map_err(|e| crate::error::ClusterError::Config(e.to_string()))?;
                    let state = postcard::to_allocvec(&Marker {
                        applied: e.log_id,
                        membership: g.membership.clone(),
                    })
                    .map_err(|e| crate::error::ClusterError::Config(e.to_string()))?;
                    records.push(JournalRecord::Replicated { state });
                    journal.append(&records)?;
                    caught_up += 1;
                }
            }
            if caught_up > 0 {
                tracing::warn!(caught_up, "the journal caught up with the group's log");
            }
        }
        g.journal = Some(journal);
        Ok(())
    }

    /// The node leads: its coordinator takes the journal over (see the module's doc), with
    /// the compaction running on it, which the coordinator finishes.
    pub fn take_journal(&self) -> Option<Journal> {
        let mut g = self.inner.lock();
        let compaction = g.compaction.take();
        let mut journal = g.journal.take()?;
        if let Some(c) = compaction {
            journal.hand_over(c);
        }
        Some(journal)
    }

    /// The marker a leader appends after the records of entry `applied`.
    pub fn marker(&self, applied: LogId<NodeId>) -> JournalRecord {
        let membership = self.inner.lock().membership.clone();
        let state = postcard::to_allocvec(&Marker {
            applied,
            membership,
        })
        .unwrap_or_default();
        JournalRecord::Replicated { state }
    }

    /// The indexes of the entries after `after` and before `before` that carry journal
    /// records (those held in this node's log).
    pub fn journal_entries_between(&self, after: Option<u64>, before: u64) -> Vec<u64> {
        let from = after.map_or(0, |a| a + 1);
        if before <= from {
            return Vec::new();
        }
        self.log
            .entries(from..=before - 1)
            .into_iter()
            .filter(|e| matches!(e.payload, EntryPayload::Normal(Payload::Journal(_))))
            .map(|e| e.log_id.index)
            .collect()
    }

    /// The API address the group's membership, as last applied here, gives node `id`.
    pub fn member_address(&self, id: NodeId) -> Option<String> {
        let g = self.inner.lock();
        g.membership
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// The id of the last entry applied here.
    pub fn applied(&self) -> Option<LogId<NodeId>> {
        self.inner.lock().applied
    }

    /// The members that have held the group's log, as last committed
    /// ([`Payload::Held`]).
    pub fn held(&self) -> BTreeSet<NodeId> {
        self.inner.lock().held.clone()
    }

    /// Finishes the follower's compaction if its thread is done (the node calls this now
    /// and then: entries may not come for a while).
    pub fn finish_compaction_if_done(&self) {
        finish_compaction(&mut self.inner.lock(), false);
    }

    /// Waits for the follower's compaction, if one runs, and finishes it.
    #[cfg(test)]
    fn wait_compaction(&self) {
        finish_compaction(&mut self.inner.lock(), true);
    }
}

/// Finishes the follower's compaction when its thread is done (or, with `wait`, waits for it).
fn finish_compaction(g: &mut Inner, wait: bool) {
    if !wait && !g.compaction.as_ref().is_some_and(|c| c.is_finished()) {
        return;
    }
    let (Some(c), Some(j)) = (g.compaction.take(), g.journal.as_mut()) else {
        return;
    };
    if let Some(r) = j.finish_compaction(c) {
        tracing::info!("journal compacted: {r}");
    }
}

/// Opens `STATE/journal.log` and reads its last marker.
fn open_journal(state_dir: &Path, fsync: bool) -> crate::error::Result<(Journal, Option<Marker>)> {
    let path = state_dir.join("journal.log");
    let mut journal = Journal::open(&path)?;
    journal.set_sync(if fsync {
        SyncMode::Always
    } else {
        SyncMode::Process
    });
    let mut last = None;
    for r in journal.replay()? {
        if let JournalRecord::Replicated { state } = r {
            let m: Marker = postcard::from_bytes(&state).map_err(|e| {
                crate::error::ClusterError::Config(format!(
                    "{}: a group marker does not decode: {e}",
                    path.display()
                ))
            })?;
            last = Some(m);
        }
    }
    Ok((journal, last))
}

/// Replaces `STATE/access.json` with `bytes` (mode 0600, atomically).
fn write_access(state_dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_file(state_dir, ACCESS_FILE, bytes)
}

/// Writes `STATE/name` (owner-only), replacing it atomically.
fn write_file(state_dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let path = state_dir.join(name);
    let tmp = path.with_extension("json.group");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// Writes `uploads/JOB.json` (the list of files uploaded with job `job`); an empty list
/// removes it, and the uploaded objects no other job's list names.
fn write_uploads(state_dir: &Path, job: u64, list: &[u8]) -> std::io::Result<()> {
    let dir = state_dir.join("uploads");
    let name = format!("{job}.json");
    if !list.is_empty() {
        std::fs::create_dir_all(&dir)?;
        return write_file(&dir, &name, list);
    }
    let hashes = |path: &Path| -> Vec<String> {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<(String, String, u64)>>(&b).ok())
            .map(|l| l.into_iter().map(|(_, h, _)| h).collect())
            .unwrap_or_default()
    };
    // The job was removed: its task logs go too.
    let _ = std::fs::remove_dir_all(state_dir.join("logs").join(job.to_string()));
    let gone = hashes(&dir.join(&name));
    match std::fs::remove_file(dir.join(&name)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    let mut still = std::collections::HashSet::new();
    for (_, file) in upload_lists(state_dir)? {
        still.extend(hashes(&file));
    }
    for h in gone {
        if !still.contains(&h) && crate::objects::valid_hash(&h) {
            let _ = std::fs::remove_file(state_dir.join("objects").join(&h));
        }
    }
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Snapshots;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<NodeId>>,
            StoredMembership<NodeId, openraft::BasicNode>,
        ),
        StorageError<NodeId>,
    > {
        let g = self.inner.lock();
        Ok((g.applied, g.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.inner.lock();
        finish_compaction(&mut g, false);
        let mut out = Vec::new();
        for e in entries {
            out.push(());
            g.applied = Some(e.log_id);
            let mut records = match e.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Membership(m) => {
                    g.membership = StoredMembership::new(Some(e.log_id), m);
                    Vec::new()
                }
                EntryPayload::Normal(Payload::Access(bytes)) => {
                    write_access(&g.state_dir, &bytes).map_err(sm_err)?;
                    Vec::new()
                }
                EntryPayload::Normal(Payload::Allocs(bytes)) => {
                    write_file(&g.state_dir, crate::alloc::queues::ALLOCS_FILE, &bytes)
                        .map_err(sm_err)?;
                    Vec::new()
                }
                EntryPayload::Normal(Payload::Uploads { job, list }) => {
                    write_uploads(&g.state_dir, job, &list).map_err(sm_err)?;
                    Vec::new()
                }
                EntryPayload::Normal(Payload::Held(ids)) => {
                    let bytes = serde_json::to_vec(&ids).map_err(sm_err)?;
                    write_file(&g.state_dir, HELD_FILE, &bytes).map_err(sm_err)?;
                    g.held = ids.into_iter().collect();
                    Vec::new()
                }
                EntryPayload::Normal(Payload::Journal(bytes)) => {
                    if g.journal.is_none() {
                        // The coordinator here appends them itself.
                        continue;
                    }
                    postcard::from_bytes::<Vec<JournalRecord>>(&bytes).map_err(sm_err)?
                }
            };
            // While following, every entry gets its marker (a lone one for the entries that
            // carry no records), so that a snapshot stops at the last entry applied.
            if g.journal.is_none() {
                continue;
            }
            let state = postcard::to_allocvec(&Marker {
                applied: e.log_id,
                membership: g.membership.clone(),
            })
            .map_err(sm_err)?;
            // The leader compacts its journal after committing a checkpoint of its own:
            // this node compacts at the same entry, with the same checkpoint.
            let checkpoint = records
                .iter()
                .find(|r| matches!(r, JournalRecord::Checkpoint { .. }))
                .cloned();
            records.push(JournalRecord::Replicated { state });
            if let Some(j) = g.journal.as_mut() {
                j.append(&records).map_err(sm_err)?;
            }
            if let Some(checkpoint) = checkpoint {
                // One at a time: a checkpoint that comes while one runs waits for the next.
                finish_compaction(&mut g, false);
                if g.compaction.is_none() {
                    let started = g.journal.as_ref().map(|j| j.start_compaction(checkpoint));
                    match started {
                        Some(Ok(c)) => g.compaction = Some(c),
                        Some(Err(e)) => tracing::warn!("cannot start a journal compaction: {e}"),
                        None => {}
                    }
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Snapshots {
            state_dir: self.inner.lock().state_dir.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let files: SnapshotFiles = postcard::from_bytes(snapshot.get_ref()).map_err(sm_err)?;
        let mut g = self.inner.lock();
        // What a running compaction writes is of the journal being replaced.
        drop(g.compaction.take());
        install_files(&g.state_dir, &files).map_err(sm_err)?;
        g.held = read_held(&g.state_dir).map_err(sm_err)?;
        match g.journal.take() {
            Some(journal) => {
                drop(journal);
                let path = g.state_dir.join("journal.log");
                Journal::replace_file(&path, &files.journal).map_err(sm_err)?;
                let (journal, _) = open_journal(&g.state_dir, g.fsync).map_err(sm_err)?;
                g.journal = Some(journal);
            }
            // The coordinator still has it (it stops leading): `follow` puts this in place.
            None => g.pending = Some(files.journal),
        }
        g.applied = meta.last_log_id;
        g.membership = meta.last_membership.clone();
        tracing::info!(
            applied = ?meta.last_log_id.map(|l| l.index),
            "installed the leader's snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let state_dir = self.inner.lock().state_dir.clone();
        // Nothing applied yet: no snapshot to offer.
        Ok(Some(build(&state_dir)?).filter(|s| s.meta.last_log_id.is_some()))
    }
}

/// What a snapshot carries (see the module's doc).
#[derive(Serialize, Deserialize)]
struct SnapshotFiles {
    /// The journal file, up to the end of its last marker.
    journal: Vec<u8>,
    /// `access.json`, when there is one.
    access: Option<Vec<u8>>,
    /// `allocs.json`, when there is one.
    allocs: Option<Vec<u8>>,
    /// Each `uploads/JOB.json`: the job and the list.
    uploads: Vec<(u64, Vec<u8>)>,
    /// `group/held.json`, when there is one.
    held: Option<Vec<u8>>,
}

/// The members that have held the group's log (JSON, a list of node ids), under the state
/// folder.
const HELD_FILE: &str = "group/held.json";

/// Reads `group/held.json` (none: nobody yet).
fn read_held(state_dir: &Path) -> std::io::Result<BTreeSet<NodeId>> {
    match read_opt(&state_dir.join(HELD_FILE))? {
        Some(b) => serde_json::from_slice(&b).map_err(|e| {
            std::io::Error::other(format!("{}: {e}", state_dir.join(HELD_FILE).display()))
        }),
        None => Ok(BTreeSet::new()),
    }
}

fn read_opt(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The jobs that have an uploads list here, with the file of each.
fn upload_lists(state_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let dir = state_dir.join("uploads");
    let entries = match std::fs::read_dir(&dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(job) = name.strip_suffix(".json").and_then(|n| n.parse().ok()) {
            out.push((job, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Builds a snapshot from what is on disk now (with no log id and an empty journal when the
/// journal has no marker yet: nothing applied).
#[allow(clippy::result_large_err)] // openraft's error type, returned as openraft wants it
fn build(state_dir: &Path) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
    let read = |e: &dyn std::fmt::Display| -> StorageError<NodeId> {
        StorageIOError::read_state_machine(&std::io::Error::other(e.to_string())).into()
    };
    let path = state_dir.join("journal.log");
    let found = Journal::read_upto_last(&path, |r| match r {
        JournalRecord::Replicated { state } => Some(state.clone()),
        _ => None,
    })
    .map_err(|e| read(&e))?;
    let (journal, marker) = match found {
        Some((journal, state)) => {
            let m: Marker = postcard::from_bytes(&state).map_err(|e| {
                read(&format!(
                    "{}: a group marker does not decode: {e}",
                    path.display()
                ))
            })?;
            (journal, Some(m))
        }
        None => (Journal::EMPTY.to_vec(), None),
    };
    let mut uploads = Vec::new();
    for (job, file) in upload_lists(state_dir).map_err(|e| read(&e))? {
        if let Some(list) = read_opt(&file).map_err(|e| read(&e))? {
            uploads.push((job, list));
        }
    }
    let files = SnapshotFiles {
        journal,
        access: read_opt(&state_dir.join(ACCESS_FILE)).map_err(|e| read(&e))?,
        allocs: read_opt(&state_dir.join(crate::alloc::queues::ALLOCS_FILE))
            .map_err(|e| read(&e))?,
        uploads,
        held: read_opt(&state_dir.join(HELD_FILE)).map_err(|e| read(&e))?,
    };
    let data = postcard::to_allocvec(&files).map_err(|e| read(&e))?;
    let (last_log_id, last_membership) = match marker {
        Some(m) => (Some(m.applied), m.membership),
        None => (None, StoredMembership::default()),
    };
    let snapshot_id = match last_log_id {
        Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, data.len()),
        None => format!("empty-{}", data.len()),
    };
    Ok(Snapshot {
        meta: SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        },
        snapshot: Box::new(Cursor::new(data)),
    })
}

/// Writes a snapshot's whole files here: the access registry and the allocation queues,
/// and the uploads lists (the lists of jobs the snapshot does not name are removed as a
/// job's removal removes them, with their objects and logs).
fn install_files(state_dir: &Path, files: &SnapshotFiles) -> std::io::Result<()> {
    if let Some(b) = &files.access {
        write_access(state_dir, b)?;
    }
    if let Some(b) = &files.allocs {
        write_file(state_dir, crate::alloc::queues::ALLOCS_FILE, b)?;
    }
    if let Some(b) = &files.held {
        write_file(state_dir, HELD_FILE, b)?;
    }
    let named: std::collections::HashSet<u64> = files.uploads.iter().map(|(j, _)| *j).collect();
    for (job, _) in upload_lists(state_dir)? {
        if !named.contains(&job) {
            write_uploads(state_dir, job, &[])?;
        }
    }
    for (job, list) in &files.uploads {
        if !list.is_empty() {
            write_uploads(state_dir, *job, list)?;
        }
    }
    Ok(())
}

/// Builds the node's snapshots ([`RaftSnapshotBuilder`]): from disk, as the module's doc
/// says.
pub struct Snapshots {
    state_dir: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for Snapshots {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        build(&self.state_dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::JobId;
    use openraft::{CommittedLeaderId, Entry as RaftEntry};

    /// A node's log and state machine in `dir`.
    fn open(dir: &Path) -> (super::super::LogStore, StateMachine) {
        let log = super::super::LogStore::open(&dir.join("group/log"), false).expect("log");
        let sm = StateMachine::open(dir, false, log.clone()).expect("open");
        (log, sm)
    }

    fn entry(index: u64, job: u64) -> Entry {
        let records = vec![JournalRecord::JobCancelled {
            job: JobId::new(job),
        }];
        RaftEntry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Payload::Journal(
                postcard::to_allocvec(&records).expect("encode"),
            )),
        }
    }

    fn cancelled(records: &[JournalRecord]) -> Vec<u64> {
        records
            .iter()
            .filter_map(|r| match r {
                JournalRecord::JobCancelled { job } => Some(job.0),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_follower_appends_each_entry_with_its_marker_and_reads_it_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, mut sm) = open(dir.path());
        futures::executor::block_on(sm.apply(vec![entry(1, 10), entry(2, 20)])).expect("apply");
        assert_eq!(sm.applied().map(|l| l.index), Some(2));
        drop(sm);
        // Reopened: what it applied is read from the journal's last marker.
        let sm = StateMachine::open(dir.path(), false, log).expect("reopen");
        assert_eq!(sm.applied().map(|l| l.index), Some(2));
        let mut j = sm.take_journal().expect("the journal");
        let records = j.replay().expect("replay");
        assert_eq!(cancelled(&records), vec![10, 20]);
        let markers = records
            .iter()
            .filter(|r| matches!(r, JournalRecord::Replicated { .. }))
            .count();
        assert_eq!(markers, 2);
    }

    /// A leader's coordinator that took the journal at entry 1 and is told of entry 4, its
    /// own: entries 2 (journal records) and 3 (a file) came between. Entry 2 is one its
    /// journal lacks; entry 3 is not. Once following, the journal catches entry 2 up.
    #[test]
    fn entries_with_records_the_leaders_journal_lacks_are_named_and_caught_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, mut sm) = open(dir.path());
        log.push_for_test(entry(1, 10));
        futures::executor::block_on(sm.apply(vec![entry(1, 10)])).expect("apply");
        let journal = sm.take_journal().expect("the journal");
        for e in [
            entry(2, 20),
            normal(3, Payload::Allocs(b"[]".to_vec())),
            entry(4, 40),
        ] {
            log.push_for_test(e.clone());
            futures::executor::block_on(sm.apply(vec![e])).expect("apply");
        }
        assert_eq!(sm.journal_entries_between(Some(1), 4), vec![2]);
        assert_eq!(sm.journal_entries_between(Some(2), 4), Vec::<u64>::new());
        assert_eq!(sm.journal_entries_between(Some(3), 4), Vec::<u64>::new());
        // The coordinator stops without appending anything: following again, the journal
        // holds every entry with records, once.
        drop(journal);
        sm.follow(false).expect("follow");
        let mut j = sm.take_journal().expect("the journal");
        assert_eq!(cancelled(&j.replay().expect("replay")), vec![10, 20, 40]);
    }

    fn normal(index: u64, payload: Payload) -> Entry {
        RaftEntry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(payload),
        }
    }

    #[test]
    fn a_snapshot_carries_the_journal_and_the_whole_files_to_another_node() {
        let a_dir = tempfile::tempdir().expect("tempdir");
        let (_, mut a) = open(a_dir.path());
        let list = br#"[["in.txt","00ff","5"]]"#.to_vec();
        futures::executor::block_on(a.apply(vec![
            entry(1, 10),
            normal(2, Payload::Access(b"{\"tokens\":[]}".to_vec())),
            normal(
                3,
                Payload::Uploads {
                    job: 7,
                    list: list.clone(),
                },
            ),
            entry(4, 20),
            normal(5, Payload::Held(vec![1, 3])),
            // The last entry carries no records: it still gets its marker.
            normal(6, Payload::Allocs(b"[]".to_vec())),
        ]))
        .expect("apply");
        assert_eq!(a.held(), BTreeSet::from([1, 3]));
        let snap = futures::executor::block_on(a.get_current_snapshot())
            .expect("build")
            .expect("a snapshot");
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(6));
        let built = futures::executor::block_on(async {
            a.get_snapshot_builder().await.build_snapshot().await
        })
        .expect("the builder's");
        assert_eq!(built.meta.last_log_id, snap.meta.last_log_id);

        // B is behind, and holds the uploads of a job since removed.
        let b_dir = tempfile::tempdir().expect("tempdir");
        let (log, mut b) = open(b_dir.path());
        futures::executor::block_on(b.apply(vec![
            entry(1, 10),
            normal(
                2,
                Payload::Uploads {
                    job: 3,
                    list: list.clone(),
                },
            ),
        ]))
        .expect("apply");
        assert!(b_dir.path().join("uploads/3.json").exists());
        futures::executor::block_on(b.install_snapshot(&snap.meta, snap.snapshot))
            .expect("install");
        assert_eq!(b.applied().map(|l| l.index), Some(6));
        assert_eq!(b.held(), BTreeSet::from([1, 3]));
        assert!(!b_dir.path().join("uploads/3.json").exists());
        assert_eq!(
            std::fs::read(b_dir.path().join("uploads/7.json")).expect("uploads/7.json"),
            list
        );
        assert_eq!(
            std::fs::read(b_dir.path().join(ACCESS_FILE)).expect("access"),
            b"{\"tokens\":[]}"
        );
        // Applying goes on after it, and a restart reads where it stands from the journal.
        futures::executor::block_on(b.apply(vec![entry(7, 30)])).expect("apply");
        drop(b);
        let b = StateMachine::open(b_dir.path(), false, log).expect("reopen");
        assert_eq!(b.applied().map(|l| l.index), Some(7));
        assert_eq!(b.held(), BTreeSet::from([1, 3]));
        let mut j = b.take_journal().expect("the journal");
        assert_eq!(cancelled(&j.replay().expect("replay")), vec![10, 20, 30]);
    }

    #[test]
    fn a_snapshot_installed_while_the_coordinator_holds_the_journal_waits_for_follow() {
        let a_dir = tempfile::tempdir().expect("tempdir");
        let (_, mut a) = open(a_dir.path());
        futures::executor::block_on(a.apply(vec![entry(1, 10), entry(2, 20)])).expect("apply");
        let snap = futures::executor::block_on(a.get_current_snapshot())
            .expect("build")
            .expect("a snapshot");
        let b_dir = tempfile::tempdir().expect("tempdir");
        let (_, mut b) = open(b_dir.path());
        let held = b.take_journal().expect("the journal");
        futures::executor::block_on(b.install_snapshot(&snap.meta, snap.snapshot))
            .expect("install");
        drop(held);
        b.follow(false).expect("follow");
        let mut j = b.take_journal().expect("the journal");
        assert_eq!(cancelled(&j.replay().expect("replay")), vec![10, 20]);
    }

    fn records(index: u64, records: &[JournalRecord]) -> Entry {
        normal(
            index,
            Payload::Journal(postcard::to_allocvec(records).expect("encode")),
        )
    }

    fn checkpoint(next_job: u64) -> JournalRecord {
        JournalRecord::Checkpoint {
            next_job,
            next_worker: 1,
            model: "{}".into(),
        }
    }

    fn checkpoints(records: &[JournalRecord]) -> Vec<u64> {
        records
            .iter()
            .filter_map(|r| match r {
                JournalRecord::Checkpoint { next_job, .. } => Some(*next_job),
                _ => None,
            })
            .collect()
    }

    /// Entries 1–4: jobs 10 and 20 cancelled, job 10 removed, the leader's checkpoint.
    fn up_to_a_checkpoint(sm: &mut StateMachine) {
        let removed = JournalRecord::JobRemoved {
            job: JobId::new(10),
        };
        futures::executor::block_on(sm.apply(vec![
            entry(1, 10),
            entry(2, 20),
            records(3, &[removed]),
            records(4, &[checkpoint(21)]),
        ]))
        .expect("apply");
    }

    #[test]
    fn a_follower_compacts_its_journal_where_the_leader_committed_its_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, mut sm) = open(dir.path());
        let path = dir.path().join("journal.log");
        up_to_a_checkpoint(&mut sm);
        let before = std::fs::metadata(&path).expect("journal").len();
        // Entry 5 comes while the compaction may still run: it is kept either way.
        futures::executor::block_on(sm.apply(vec![entry(5, 30)])).expect("apply");
        sm.wait_compaction();
        assert!(!dir.path().join("journal.log.compact").exists());
        drop(sm);
        let sm = StateMachine::open(dir.path(), false, log).expect("reopen");
        assert_eq!(sm.applied().map(|l| l.index), Some(5));
        let mut j = sm.take_journal().expect("the journal");
        let kept = j.replay().expect("replay");
        // The removed job's records are gone; the checkpoint stands once, before the marker
        // of its entry; the earlier markers are gone too.
        assert_eq!(cancelled(&kept), vec![20, 30]);
        assert_eq!(checkpoints(&kept), vec![21]);
        let markers = kept
            .iter()
            .filter(|r| matches!(r, JournalRecord::Replicated { .. }))
            .count();
        assert_eq!(markers, 2, "{kept:?}");
        assert!(j.bytes() < before, "{} !< {before}", j.bytes());
    }

    #[test]
    fn a_follower_that_starts_leading_hands_its_running_compaction_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut sm) = open(dir.path());
        up_to_a_checkpoint(&mut sm);
        let mut j = sm.take_journal().expect("the journal");
        let c = j.take_handed().expect("the compaction, handed over");
        let r = j.finish_compaction(c).expect("finished");
        assert!(r.bytes_after < r.bytes_before, "{r:?}");
        assert_eq!(cancelled(&j.replay().expect("replay")), vec![20]);
    }

    #[test]
    fn a_snapshot_installed_during_a_compaction_is_not_undone_by_it() {
        let a_dir = tempfile::tempdir().expect("tempdir");
        let (_, mut a) = open(a_dir.path());
        futures::executor::block_on(a.apply(vec![
            entry(1, 10),
            entry(2, 20),
            entry(3, 40),
            entry(4, 45),
            entry(5, 46),
        ]))
        .expect("apply");
        let snap = futures::executor::block_on(a.get_current_snapshot())
            .expect("build")
            .expect("a snapshot");
        let b_dir = tempfile::tempdir().expect("tempdir");
        let (_, mut b) = open(b_dir.path());
        up_to_a_checkpoint(&mut b);
        futures::executor::block_on(b.install_snapshot(&snap.meta, snap.snapshot))
            .expect("install");
        assert!(!b_dir.path().join("journal.log.compact").exists());
        futures::executor::block_on(b.apply(vec![entry(6, 50)])).expect("apply");
        b.wait_compaction();
        let mut j = b.take_journal().expect("the journal");
        assert_eq!(
            cancelled(&j.replay().expect("replay")),
            vec![10, 20, 40, 45, 46, 50]
        );
    }

    #[test]
    fn no_snapshot_before_anything_is_applied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut sm) = open(dir.path());
        assert!(futures::executor::block_on(sm.get_current_snapshot())
            .expect("build")
            .is_none());
    }

    #[test]
    fn a_leader_that_steps_down_catches_its_journal_up_from_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, mut sm) = open(dir.path());
        futures::executor::block_on(sm.apply(vec![entry(1, 10)])).expect("apply");
        // The node leads: its core owns the journal and appends entry 2 itself...
        let mut core_journal = sm.take_journal().expect("the journal");
        let e2 = entry(2, 20);
        log.push_for_test(e2.clone());
        futures::executor::block_on(sm.apply(vec![e2])).expect("apply");
        core_journal
            .append(&[
                JournalRecord::JobCancelled {
                    job: JobId::new(20),
                },
                sm.marker(LogId::new(CommittedLeaderId::new(1, 1), 2)),
            ])
            .expect("append");
        // ...then proposes entries 3 and 4, gives up before they commit, and drops its core;
        // the next leader commits them, and they are applied here while the journal is away.
        for e in [entry(3, 30), entry(4, 40)] {
            log.push_for_test(e.clone());
            futures::executor::block_on(sm.apply(vec![e])).expect("apply");
        }
        drop(core_journal);
        sm.follow(false).expect("follow");
        let mut j = sm.take_journal().expect("the journal");
        assert_eq!(
            cancelled(&j.replay().expect("replay")),
            vec![10, 20, 30, 40]
        );
        // Following again applies into the journal directly.
        drop(j);
        sm.follow(false).expect("follow");
        futures::executor::block_on(sm.apply(vec![entry(5, 50)])).expect("apply");
        let mut j = sm.take_journal().expect("the journal");
        assert_eq!(
            cancelled(&j.replay().expect("replay")),
            vec![10, 20, 30, 40, 50]
        );
    }
}
