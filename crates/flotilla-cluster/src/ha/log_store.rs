//! The group's Raft log on disk: one append-only file of framed operations (entries appended,
//! a suffix truncated, a prefix purged, a vote, the committed id), read back whole at start.
//!
//! Frame: `len: u32 LE`, `crc32(body): u32 LE`, `body` (postcard of [`Op`]). A torn last
//! frame (a crash mid-write) is cut off at open; a damaged frame before the end is an error,
//! never silently skipped: the log is what the group promised.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Entry, NodeId, TypeConfig};

/// One change to the log, as written.
#[derive(Serialize, Deserialize)]
enum Op {
    Entries(Vec<Entry>),
    /// Every entry from this index on is removed.
    Truncate(u64),
    /// Every entry up to this id is removed.
    Purge(LogId<NodeId>),
    Vote(Vote<NodeId>),
    Committed(Option<LogId<NodeId>>),
}

struct Inner {
    file: File,
    path: PathBuf,
    fsync: bool,
    log: BTreeMap<u64, Entry>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

impl Inner {
    fn write(&mut self, op: &Op) -> std::io::Result<()> {
        let mut frame = Vec::new();
        encode(op, &mut frame)?;
        self.file.write_all(&frame)?;
        if self.fsync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Rewrites the file with only what it holds now (after a purge: the file would
    /// otherwise keep every entry ever appended): written beside it, synced, renamed over it.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        if let Some(v) = self.vote {
            encode(&Op::Vote(v), &mut bytes)?;
        }
        encode(&Op::Committed(self.committed), &mut bytes)?;
        if let Some(p) = self.purged {
            encode(&Op::Purge(p), &mut bytes)?;
        }
        let entries: Vec<Entry> = self.log.values().cloned().collect();
        for chunk in entries.chunks(256) {
            encode(&Op::Entries(chunk.to_vec()), &mut bytes)?;
        }
        let tmp = self.path.with_extension("rewrite");
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)?;
        Ok(())
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Entries(es) => {
                for e in es {
                    self.log.insert(e.log_id.index, e);
                }
            }
            Op::Truncate(from) => {
                self.log.split_off(&from);
            }
            Op::Purge(upto) => {
                self.log = self.log.split_off(&(upto.index + 1));
                self.purged = Some(upto);
            }
            Op::Vote(v) => self.vote = Some(v),
            Op::Committed(c) => self.committed = c,
        }
    }
}

/// Appends `op`'s frame to `out`.
fn encode(op: &Op, out: &mut Vec<u8>) -> std::io::Result<()> {
    let body = postcard::to_allocvec(op).map_err(std::io::Error::other)?;
    let len =
        u32::try_from(body.len()).map_err(|_| std::io::Error::other("a log frame over 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// The log store ([`RaftLogStorage`]); clones share the one file.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

impl LogStore {
    /// Opens (or creates) the log at `path`, reading it back; `fsync`: sync every write
    /// (survives a machine crash, not only a process crash).
    pub fn open(path: &Path, fsync: bool) -> std::io::Result<LogStore> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut inner = Inner {
            file,
            path: path.to_path_buf(),
            fsync,
            log: BTreeMap::new(),
            vote: None,
            committed: None,
            purged: None,
        };
        let mut at = 0usize;
        while at < bytes.len() {
            let Some(head) = bytes.get(at..at + 8) else {
                break;
            };
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            let Some(body) = bytes.get(at + 8..at + 8 + len) else {
                break;
            };
            let last = at + 8 + len == bytes.len();
            let op = if crc32fast::hash(body) == crc {
                postcard::from_bytes::<Op>(body).ok()
            } else {
                None
            };
            match op {
                Some(op) => inner.apply(op),
                // A damaged last frame is a torn write: cut below.
                None if last => break,
                None => {
                    return Err(std::io::Error::other(format!(
                        "{}: damaged record at byte {at} (not at the end): the group's log \
                         cannot be trusted; replace this node: `flotilla admin group remove` \
                         it, then start a node with an empty state folder under a new id \
                         and `flotilla admin group add` it (docs/cluster.md)",
                        path.display()
                    )))
                }
            }
            at += 8 + len;
        }
        if at < bytes.len() {
            tracing::warn!(
                "{}: cut a torn last record ({} bytes)",
                path.display(),
                bytes.len() - at
            );
            inner.file.set_len(at as u64)?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    fn io(e: std::io::Error, path: &Path) -> StorageError<NodeId> {
        StorageIOError::write_logs(&std::io::Error::other(format!("{}: {e}", path.display())))
            .into()
    }

    /// Whether nothing was ever written here: no vote, no entry (a node's first start, or
    /// a node whose state folder was emptied).
    pub fn is_blank(&self) -> bool {
        let g = self.inner.lock();
        g.vote.is_none() && g.log.is_empty() && g.purged.is_none() && g.committed.is_none()
    }

    /// What the latest membership entry held here says of node `id`'s API address: `None`
    /// when the log holds no membership entry (purged into a snapshot, or none came yet);
    /// `Some(None)` when it does not name the node. The entry may not be applied yet: a node
    /// stopped before it learned that the entry was committed holds it all the same.
    pub fn member_address(&self, id: NodeId) -> Option<Option<String>> {
        self.inner
            .lock()
            .log
            .values()
            .rev()
            .find_map(|e| match &e.payload {
                openraft::EntryPayload::Membership(m) => {
                    Some(m.get_node(&id).map(|n| n.addr.clone()))
                }
                _ => None,
            })
    }

    /// The entries held in `range` (a state machine catching up its journal).
    pub fn entries(&self, range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        self.inner
            .lock()
            .log
            .range(range)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Appends `e` as a leader's log would (tests of the state machine).
    #[cfg(test)]
    pub(crate) fn push_for_test(&self, e: Entry) {
        let mut g = self.inner.lock();
        let op = Op::Entries(vec![e]);
        g.write(&op).expect("write the log");
        g.apply(op);
    }

    #[allow(clippy::result_large_err)] // openraft's error type, returned as openraft wants it
    fn change(&self, op: Op) -> Result<(), StorageError<NodeId>> {
        let mut g = self.inner.lock();
        if let Err(e) = g.write(&op) {
            return Err(Self::io(e, &g.path));
        }
        g.apply(op);
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let g = self.inner.lock();
        Ok(g.log.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let g = self.inner.lock();
        let last = g.log.values().next_back().map(|e| e.log_id).or(g.purged);
        Ok(LogState {
            last_purged_log_id: g.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.change(Op::Vote(*vote))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // Written without its own sync: it is a hint (a restart applies less at once).
        let mut g = self.inner.lock();
        let fsync = std::mem::replace(&mut g.fsync, false);
        let r = g.write(&Op::Committed(committed));
        g.fsync = fsync;
        if let Err(e) = r {
            return Err(Self::io(e, &g.path));
        }
        g.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut g = self.inner.lock();
        let op = Op::Entries(entries);
        match g.write(&op) {
            Ok(()) => {
                g.apply(op);
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let err = Self::io(std::io::Error::new(e.kind(), e.to_string()), &g.path);
                callback.log_io_completed(Err(e));
                Err(err)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.change(Op::Truncate(log_id.index))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.change(Op::Purge(log_id))?;
        let mut g = self.inner.lock();
        if let Err(e) = g.rewrite() {
            // The purge itself is written: the file is only larger than it needs to be.
            tracing::warn!("{}: cannot rewrite the log smaller: {e}", g.path.display());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(super::super::Payload::Journal(vec![index as u8])),
        }
    }

    #[test]
    fn what_was_written_is_read_back_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        {
            let s = LogStore::open(&path, false).expect("open");
            let mut g = s.inner.lock();
            for op in [
                Op::Vote(Vote::new(2, 1)),
                Op::Entries((1..=5).map(|i| entry(1, i)).collect()),
                Op::Truncate(4),
                Op::Entries(vec![entry(2, 4)]),
                Op::Purge(LogId::new(CommittedLeaderId::new(1, 1), 1)),
            ] {
                g.write(&op).expect("write");
                g.apply(op);
            }
        }
        // A torn frame at the end (a crash mid-write).
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&[200, 0, 0, 0, 1, 2]).expect("write");
        drop(f);
        let s = LogStore::open(&path, false).expect("reopen");
        let g = s.inner.lock();
        assert_eq!(g.vote, Some(Vote::new(2, 1)));
        let kept: Vec<(u64, u64)> = g
            .log
            .values()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect();
        assert_eq!(kept, vec![(1, 2), (1, 3), (2, 4)]);
        assert_eq!(g.purged.map(|p| p.index), Some(1));
        drop(g);
        let len = std::fs::metadata(&path).expect("stat").len();
        let again = LogStore::open(&path, false).expect("reopen");
        drop(again);
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), len);
    }

    #[test]
    fn a_log_is_blank_until_a_vote_or_an_entry_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        assert!(LogStore::open(&path, false).expect("open").is_blank());
        for op in [Op::Vote(Vote::new(1, 2)), Op::Entries(vec![entry(1, 0)])] {
            let _ = std::fs::remove_file(&path);
            let s = LogStore::open(&path, false).expect("open");
            s.inner.lock().write(&op).expect("write");
            drop(s);
            assert!(!LogStore::open(&path, false).expect("reopen").is_blank());
        }
    }

    #[test]
    fn a_purge_rewrites_the_file_with_only_what_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let mut s = LogStore::open(&path, false).expect("open");
        futures::executor::block_on(async {
            s.save_vote(&Vote::new(3, 2)).await.expect("vote");
            for i in 1..=200 {
                s.change(Op::Entries(vec![entry(3, i)])).expect("append");
            }
            s.save_committed(Some(LogId::new(CommittedLeaderId::new(3, 1), 200)))
                .await
                .expect("committed");
        });
        let before = std::fs::metadata(&path).expect("stat").len();
        futures::executor::block_on(s.purge(LogId::new(CommittedLeaderId::new(3, 1), 190)))
            .expect("purge");
        let after = std::fs::metadata(&path).expect("stat").len();
        assert!(after * 10 < before, "{before} -> {after} bytes");
        // Appends go on in the new file, and everything reads back.
        s.change(Op::Entries(vec![entry(3, 201)])).expect("append");
        drop(s);
        let mut s = LogStore::open(&path, false).expect("reopen");
        let g = s.inner.lock();
        assert_eq!(g.vote, Some(Vote::new(3, 2)));
        assert_eq!(g.committed.map(|c| c.index), Some(200));
        assert_eq!(g.purged.map(|p| p.index), Some(190));
        let kept: Vec<u64> = g.log.keys().copied().collect();
        assert_eq!(kept, (191..=201).collect::<Vec<_>>());
        drop(g);
        let state = futures::executor::block_on(s.get_log_state()).expect("state");
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(190));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(201));
    }

    #[test]
    fn a_damaged_record_before_the_end_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        {
            let s = LogStore::open(&path, false).expect("open");
            let mut g = s.inner.lock();
            g.write(&Op::Vote(Vote::new(1, 1))).expect("write");
            g.write(&Op::Vote(Vote::new(2, 1))).expect("write");
        }
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[9] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let err = LogStore::open(&path, false).err().expect("refused");
        assert!(
            err.to_string().contains("damaged record at byte 0"),
            "{err}"
        );
    }
}
