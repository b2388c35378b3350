//! The coordinator's journal: an append-only log of [`JournalRecord`]s, replayed in order
//! after a restart.
//!
//! # Format (version 2)
//! The file starts with the 8-byte magic `FLOTJRN2` (the last byte is the format version);
//! then each record is a 12-byte header and its payload:
//! `len: u32 LE | crc32(payload): u32 LE | crc32(len ‖ payload crc): u32 LE | payload`,
//! the payload being the record encoded with postcard (every record type, including a whole
//! `JobSpec`, is postcard-friendly). The header has its own checksum, so a damaged length is
//! told from a torn write: a torn write leaves a record cut short at the end of the file (or
//! zeros where the file grew but its data never reached the disk); anything else is
//! corruption, and opening stops with an error naming the file, the record and its byte
//! offset. [`Journal::open_recovering`] (`flotilla server --recover-journal`) then keeps the
//! valid prefix and sets the damaged file aside. A version 1 file (`FLOTJRN1`: no header
//! checksum) is read and rewritten as version 2 when opened.
//!
//! | operation | what happens |
//! | --- | --- |
//! | [`Journal::open`] | opens or creates the file, checks every record; a torn last record (the coordinator died in the middle of a write) is cut off; a damaged record anywhere else is an error |
//! | [`Journal::open_recovering`] | the same, but a damaged record is cut off with everything after it (the whole file is copied aside first) |
//! | [`Journal::append`] | the whole batch in ONE `write` (group commit); with [`SyncMode::Always`] also fsync'd before it returns |
//! | [`Journal::replay`] | every record, in append order |
//! | [`Journal::start_compaction`] / [`Journal::finish_compaction`] | rewrites the file without removed jobs' records, ending the kept ones with a checkpoint, on its own thread while appends go on; then copies those appends and renames the new file over the journal |
//! | [`Journal::hand_over`] / [`Journal::take_handed`] | a compaction still running goes with the journal to its next holder (a group's follower that starts leading), which finishes it; a compaction dropped unfinished waits for its thread and deletes its file |
//!
//! # Why a log file and not redb or SQLite
//! The first version kept the records in redb. Measured here, a redb commit cost about
//! 0.33 ms even without fsync (`Durability::Eventual`), and the coordinator commits once per
//! batch of events, so it bounded the latency of every hop of a chain of tasks. The
//! journal needs nothing a database gives (no lookups, no updates, no concurrent readers):
//! it is written once, in order, and read once, in order. One `write` of a batch costs a few
//! microseconds, and the checksums per record detect damage.
//!
//! Who writes what, in order: the server applies a batch of events, then appends the
//! journaled ones and the `TaskAssigned` records from
//! [`Coordinator::take_journal_records`](crate::state::Coordinator::take_journal_records) in
//! one append, and only then replies and sends the matching `Assign` commands.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use flotilla_core::JobId;

pub use crate::state::JournalRecord;

const MAGIC: &[u8; 8] = b"FLOTJRN2";
const MAGIC_V1: &[u8; 8] = b"FLOTJRN1";
/// The magic's length.
const HEADER: usize = 8;
/// A record's header: length, payload checksum, header checksum.
const RECORD_HEADER: usize = 12;

/// How durable an append is when it returns.
///
/// `Process` survives the coordinator being killed (SIGKILL, a panic, an OOM kill): the
/// records are in the file, in the OS page cache, before `append` returns. Only a crash of
/// the machine itself can lose the last moments of it — SQLite's `synchronous = NORMAL`.
/// `Always` also survives that, at the price of an fsync per batch (about 0.4 ms here, which
/// bounds the latency of each hop of a chain of tasks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// Written before returning; flushed to disk by the OS later.
    #[default]
    Process,
    /// fsync'd before returning.
    Always,
}

/// What can go wrong with the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file could not be opened, read or written.
    #[error("journal {path}: {source}")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Another coordinator (or `flotilla run`) has this journal open.
    #[error(
        "journal {path}: in use by another coordinator (a `flotilla server` or `flotilla run` on \
         the same state directory); stop it or use another --state"
    )]
    InUse {
        /// The journal file.
        path: PathBuf,
    },
    /// The file is not a journal.
    #[error("journal {path}: not a Flotilla journal (bad magic)")]
    NotAJournal {
        /// The file.
        path: PathBuf,
    },
    /// A record could not be encoded.
    #[error("journal {path}: cannot encode record {record}: {source}")]
    Encode {
        /// The journal file.
        path: PathBuf,
        /// The number the record would have had.
        record: u64,
        /// Why.
        #[source]
        source: postcard::Error,
    },
    /// A stored record is damaged or does not decode (not a torn write at the end).
    #[error(
        "journal {path}: record {record} at byte {offset} is corrupt: {reason} (the {record} \
         records before it are intact; `flotilla server --recover-journal` keeps them and sets \
         the damaged file aside)"
    )]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Its number, from 0.
        record: u64,
        /// Where its header starts in the file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A record is too large to be written.
    #[error("journal {path}: record {record} of {bytes} bytes is too large")]
    TooLarge {
        /// The journal file.
        path: PathBuf,
        /// The number the record would have had.
        record: u64,
        /// Its encoded size.
        bytes: usize,
    },
}

/// The journal's result type.
pub type Result<T> = std::result::Result<T, JournalError>;

/// An open journal.
pub struct Journal {
    file: File,
    path: PathBuf,
    len: u64,
    bytes: u64,
    sync: SyncMode,
    syncs: u64,
    /// Bytes of the records of each job not removed (known once replayed or appended).
    job_bytes: HashMap<JobId, u64>,
    /// Bytes of records a compaction would drop: removed jobs', and a group's markers but
    /// the last.
    garbage: u64,
    /// Bytes of the last group marker counted (the one a compaction keeps).
    last_marker: u64,
    /// `<journal>.lock`, locked exclusively while the journal is open: one coordinator per
    /// journal (a second one would interleave records). The lock goes with the process.
    _lock: File,
    /// A compaction its previous holder started and handed over with it
    /// ([`Journal::hand_over`]): a group's follower that becomes the leader.
    handed: Option<Compaction>,
}

/// A compaction running on its own thread (see [`Journal::start_compaction`]).
#[derive(Debug)]
pub struct Compaction {
    /// The file's length and record count when it started: it rewrites what is before.
    upto: u64,
    records_upto: u64,
    garbage_upto: u64,
    /// The file it writes (`<journal>.compact`).
    tmp: PathBuf,
    /// `None` once joined.
    thread: Option<std::thread::JoinHandle<Result<Compacted>>>,
}

/// What the compaction thread wrote.
#[derive(Debug)]
struct Compacted {
    tmp: PathBuf,
    file: File,
    records: u64,
    bytes: u64,
}

/// What a finished compaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionReport {
    /// The file's size before, bytes.
    pub bytes_before: u64,
    /// The file's size after, bytes.
    pub bytes_after: u64,
    /// Records before.
    pub records_before: u64,
    /// Records after.
    pub records_after: u64,
}

impl std::fmt::Display for CompactionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} bytes, {} -> {} records",
            self.bytes_before, self.bytes_after, self.records_before, self.records_after
        )
    }
}

/// What opening found and did, besides the records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of a torn last record cut off.
    pub torn_bytes: u64,
    /// With [`Journal::open_recovering`]: the damaged record's number, the bytes cut off from
    /// it on, and where the whole damaged file was copied.
    pub recovered: Option<(u64, u64, PathBuf)>,
    /// A version 1 file was rewritten as version 2.
    pub upgraded: bool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("sync", &self.sync)
            .finish()
    }
}

/// The records of a journal file's bytes: their payload ranges, and where the valid part
/// ends; `Err((record, offset, reason))` for a damaged record that is not a torn write.
type Scan = std::result::Result<(Vec<(usize, usize)>, usize), (u64, usize, String)>;

fn header_crc(len: &[u8], payload_crc: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(payload_crc);
    h.finalize()
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Version 2 records (after the magic). A torn write is a record cut short by the end of the
/// file, a last record whose payload does not match, or zeros up to the end of the file.
fn scan(bytes: &[u8]) -> Scan {
    let mut at = HEADER;
    let mut out = Vec::new();
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < RECORD_HEADER {
            // A header cut by the end of the file.
            return Ok((out, at));
        }
        let record = out.len() as u64;
        if header_crc(&rest[0..4], &rest[4..8]) != le32(&rest[8..12]) {
            if rest.iter().all(|&b| b == 0) {
                // Zeros where the file grew but no data reached the disk.
                return Ok((out, at));
            }
            return Err((record, at, "header checksum mismatch".into()));
        }
        let len = le32(&rest[0..4]) as usize;
        let start = at + RECORD_HEADER;
        let end = start.saturating_add(len);
        if end > bytes.len() {
            return Ok((out, at));
        }
        if crc32fast::hash(&bytes[start..end]) != le32(&rest[4..8]) {
            if end == bytes.len() {
                return Ok((out, at));
            }
            return Err((record, at, "payload checksum mismatch".into()));
        }
        out.push((start, end));
        at = end;
    }
    Ok((out, at))
}

/// Version 1 records (`len | crc(payload) | payload`, no header checksum), read once to
/// upgrade the file.
fn scan_v1(bytes: &[u8]) -> Scan {
    let mut at = HEADER;
    let mut out = Vec::new();
    while at + 8 <= bytes.len() {
        let len = le32(&bytes[at..at + 4]) as usize;
        let (start, end) = (at + 8, (at + 8).saturating_add(len));
        if end > bytes.len() {
            break;
        }
        if crc32fast::hash(&bytes[start..end]) != le32(&bytes[at + 4..at + 8]) {
            if end == bytes.len() {
                break;
            }
            return Err((out.len() as u64, at, "checksum mismatch".into()));
        }
        out.push((start, end));
        at = end;
    }
    Ok((out, at))
}

/// Frames one payload as a version 2 record.
fn frame(payload: &[u8], buf: &mut Vec<u8>) -> std::result::Result<(), usize> {
    let len = u32::try_from(payload.len()).map_err(|_| payload.len())?;
    let len = len.to_le_bytes();
    let pcrc = crc32fast::hash(payload).to_le_bytes();
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&pcrc);
    buf.extend_from_slice(&header_crc(&len, &pcrc).to_le_bytes());
    buf.extend_from_slice(payload);
    Ok(())
}

impl Journal {
    /// Opens the journal at `path`, creating it if missing; cuts off a torn last record and
    /// refuses a damaged one anywhere else.
    pub fn open(path: impl AsRef<Path>) -> Result<Journal> {
        Self::open_with(path.as_ref(), false).map(|(j, _)| j)
    }

    /// Opens the journal like [`Journal::open`], but a damaged record is cut off with
    /// everything after it, once the whole file is copied to `<path>.damaged-<offset>`: only
    /// the valid prefix is kept. For an operator who chose that over a coordinator that does
    /// not start.
    pub fn open_recovering(path: impl AsRef<Path>) -> Result<(Journal, Opened)> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, recover: bool) -> Result<(Journal, Opened)> {
        let path = path.to_path_buf();
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        // A compaction cut short by a crash: the journal itself is whole (the compacted file
        // replaces it only once complete).
        let lock = Self::lock(&path)?;
        let stale = Self::compact_path(&path);
        if stale.exists() {
            std::fs::remove_file(&stale).map_err(|source| JournalError::Io {
                path: stale.clone(),
                source,
            })?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let mut opened = Opened::default();
        if bytes.is_empty() {
            file.write_all(MAGIC).map_err(io)?;
            file.sync_all().map_err(io)?;
            return Ok((Journal::new(file, lock, path, 0, HEADER as u64), opened));
        }
        let v1 = bytes.len() >= HEADER && &bytes[..HEADER] == MAGIC_V1;
        if bytes.len() < HEADER || (!v1 && &bytes[..HEADER] != MAGIC) {
            return Err(JournalError::NotAJournal { path });
        }
        let (records, end) = match if v1 { scan_v1(&bytes) } else { scan(&bytes) } {
            Ok(x) => x,
            Err((record, offset, reason)) if !recover => {
                return Err(JournalError::Corrupt {
                    path,
                    record,
                    offset: offset as u64,
                    reason,
                })
            }
            Err((record, offset, reason)) => {
                let aside = PathBuf::from(format!("{}.damaged-{offset}", path.display()));
                std::fs::write(&aside, &bytes).map_err(|source| JournalError::Io {
                    path: aside.clone(),
                    source,
                })?;
                tracing::warn!(
                    "journal {}: record {record} at byte {offset} is corrupt ({reason}): \
                     keeping the {record} records before it, cutting off {} bytes; the whole \
                     file is in {}",
                    path.display(),
                    bytes.len() - offset,
                    aside.display()
                );
                opened.recovered = Some((record, (bytes.len() - offset) as u64, aside));
                let ranges = match if v1 {
                    scan_v1(&bytes[..offset])
                } else {
                    scan(&bytes[..offset])
                } {
                    Ok(x) => x,
                    Err((record, offset, reason)) => {
                        return Err(JournalError::Corrupt {
                            path,
                            record,
                            offset: offset as u64,
                            reason,
                        })
                    }
                };
                (ranges.0, offset)
            }
        };
        if v1 {
            // Rewrite as version 2, next to it, then over it.
            let mut out = Vec::with_capacity(bytes.len() + records.len() * 4);
            out.extend_from_slice(MAGIC);
            for (i, &(a, b)) in records.iter().enumerate() {
                frame(&bytes[a..b], &mut out).map_err(|n| JournalError::TooLarge {
                    path: path.clone(),
                    record: i as u64,
                    bytes: n,
                })?;
            }
            let tmp = PathBuf::from(format!("{}.v2", path.display()));
            let tmp_io = |source| JournalError::Io {
                path: tmp.clone(),
                source,
            };
            let mut f = File::create(&tmp).map_err(tmp_io)?;
            f.write_all(&out).map_err(tmp_io)?;
            f.sync_all().map_err(tmp_io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            tracing::info!(
                "journal {}: upgraded from format 1 to 2 ({} records)",
                path.display(),
                records.len()
            );
            opened.upgraded = true;
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .open(&path)
                .map_err(io)?;
            let n = records.len() as u64;
            return Ok((Journal::new(file, lock, path, n, out.len() as u64), opened));
        }
        if end < bytes.len() {
            if opened.recovered.is_none() {
                tracing::warn!(
                    "journal {}: cutting off {} bytes of a record torn by a crash",
                    path.display(),
                    bytes.len() - end
                );
                opened.torn_bytes = (bytes.len() - end) as u64;
            }
            file.set_len(end as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
            file.seek(SeekFrom::End(0)).map_err(io)?;
        }
        let n = records.len() as u64;
        Ok((Journal::new(file, lock, path, n, end as u64), opened))
    }

    fn new(file: File, lock: File, path: PathBuf, len: u64, bytes: u64) -> Journal {
        Journal {
            file,
            _lock: lock,
            handed: None,
            path,
            len,
            bytes,
            sync: SyncMode::default(),
            syncs: 0,
            job_bytes: HashMap::new(),
            garbage: 0,
            last_marker: 0,
        }
    }

    /// Counts a record of `bytes` bytes (framed) towards its job, or towards the garbage.
    fn count(&mut self, record: &JournalRecord, bytes: u64) {
        match (record, record.job()) {
            (JournalRecord::JobRemoved { job }, _) => {
                // Everything of the job is dead weight from now on, this record included.
                self.garbage += bytes + self.job_bytes.remove(job).unwrap_or(0);
            }
            // A group's marker makes the one before it dead weight.
            (JournalRecord::Replicated { .. }, _) => {
                self.garbage += std::mem::replace(&mut self.last_marker, bytes);
            }
            (_, Some(job)) => *self.job_bytes.entry(job).or_default() += bytes,
            // A checkpoint: the next compaction replaces it, but one is always left, so it
            // is not counted (or a compaction would call for the next).
            (_, None) => {}
        }
    }

    /// The path a compaction writes to before it replaces the journal.
    /// Takes `<path>.lock` exclusively, or says who holds it.
    fn lock(path: &Path) -> Result<File> {
        let at = PathBuf::from(format!("{}.lock", path.display()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&at)
            .map_err(|source| JournalError::Io {
                path: at.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::InUse {
                path: path.to_path_buf(),
            }),
            Err(std::fs::TryLockError::Error(source)) => Err(JournalError::Io { path: at, source }),
        }
    }

    fn compact_path(path: &Path) -> PathBuf {
        PathBuf::from(format!("{}.compact", path.display()))
    }

    /// Sets how durable appends are when they return.
    pub fn set_sync(&mut self, mode: SyncMode) {
        self.sync = mode;
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes an unprivileged writer may still add to the journal's file system (`None`
    /// where the file system does not say).
    pub fn free_bytes(&self) -> Option<u64> {
        use std::os::fd::AsRawFd as _;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: the descriptor is the journal's open file; `st` is written by the call
        // and read only when it succeeded.
        let st = unsafe {
            if libc::fstatvfs(self.file.as_raw_fd(), st.as_mut_ptr()) != 0 {
                return None;
            }
            st.assume_init()
        };
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }

    /// How durable appends are.
    pub fn sync_mode(&self) -> SyncMode {
        self.sync
    }

    /// How many times an append was fsync'd since the journal was opened.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// The file's size, bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `records` in one write (and, with [`SyncMode::Always`], one fsync).
    pub fn append(&mut self, records: &[JournalRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(records.len() * 64);
        let mut sizes = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let payload = postcard::to_stdvec(r).map_err(|source| JournalError::Encode {
                path: self.path.clone(),
                record: self.len + i as u64,
                source,
            })?;
            frame(&payload, &mut buf).map_err(|bytes| JournalError::TooLarge {
                path: self.path.clone(),
                record: self.len + i as u64,
                bytes,
            })?;
            sizes.push((payload.len() + RECORD_HEADER) as u64);
        }
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        let start = self.file.metadata().map_err(io)?.len();
        let written = self.file.write_all(&buf).and_then(|()| {
            if self.sync == SyncMode::Always {
                self.file.sync_data()?;
                self.syncs += 1;
            }
            Ok(())
        });
        if let Err(e) = written {
            // A write cut short (a full disk) must not leave part of a record behind: the
            // next append would follow it, and a replay stops at the torn record. Cutting
            // the file back needs no space.
            let _ = self.file.set_len(start);
            return Err(io(e));
        }
        self.len += records.len() as u64;
        self.bytes += buf.len() as u64;
        for (r, n) in records.iter().zip(sizes) {
            self.count(r, n);
        }
        Ok(())
    }

    /// Bytes of records that a compaction would drop: those of removed jobs (counted for
    /// the records replayed or appended since the journal was opened).
    pub fn garbage(&self) -> u64 {
        self.garbage
    }

    /// Every record, in append order (and counts them towards their jobs, for
    /// [`Journal::garbage`]).
    pub fn replay(&mut self) -> Result<Vec<JournalRecord>> {
        let bytes = std::fs::read(&self.path).map_err(|source| JournalError::Io {
            path: self.path.clone(),
            source,
        })?;
        if bytes.len() < HEADER || &bytes[..HEADER] != MAGIC {
            return Err(JournalError::NotAJournal {
                path: self.path.clone(),
            });
        }
        let corrupt = |record: u64, offset: usize, reason: String| JournalError::Corrupt {
            path: self.path.clone(),
            record,
            offset: offset as u64,
            reason,
        };
        let (ranges, _) = scan(&bytes).map_err(|(r, o, why)| corrupt(r, o, why))?;
        let records = ranges
            .iter()
            .enumerate()
            .map(|(i, &(a, b))| {
                postcard::from_bytes(&bytes[a..b])
                    .map_err(|e| corrupt(i as u64, a - RECORD_HEADER, e.to_string()))
            })
            .collect::<Result<Vec<JournalRecord>>>()?;
        self.job_bytes.clear();
        self.garbage = 0;
        self.last_marker = 0;
        for (r, &(a, b)) in records.iter().zip(&ranges) {
            self.count(r, (b - a + RECORD_HEADER) as u64);
        }
        Ok(records)
    }

    /// The bytes of a journal with no records.
    pub const EMPTY: &'static [u8] = MAGIC;

    /// Reads the journal file at `path` without opening it as a journal (its owner may be
    /// appending to it) and returns its bytes up to the end of the last record for which
    /// `pick` gives a value, with that value; `None` when no record does (or the file does
    /// not exist). A record cut short at the end (an append under way) is not read.
    pub fn read_upto_last<T>(
        path: &Path,
        mut pick: impl FnMut(&JournalRecord) -> Option<T>,
    ) -> Result<Option<(Vec<u8>, T)>> {
        let mut bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(JournalError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        if bytes.len() < HEADER || &bytes[..HEADER] != MAGIC {
            return Err(JournalError::NotAJournal {
                path: path.to_path_buf(),
            });
        }
        let (ranges, _) =
            scan(&bytes).map_err(|(record, offset, reason)| JournalError::Corrupt {
                path: path.to_path_buf(),
                record,
                offset: offset as u64,
                reason,
            })?;
        for (i, &(a, b)) in ranges.iter().enumerate().rev() {
            let r: JournalRecord =
                postcard::from_bytes(&bytes[a..b]).map_err(|e| JournalError::Corrupt {
                    path: path.to_path_buf(),
                    record: i as u64,
                    offset: (a - RECORD_HEADER) as u64,
                    reason: e.to_string(),
                })?;
            if let Some(v) = pick(&r) {
                bytes.truncate(b);
                return Ok(Some((bytes, v)));
            }
        }
        Ok(None)
    }

    /// Replaces the journal file at `path` (not open) with `bytes`, a whole journal (as
    /// [`Journal::read_upto_last`] gives), durably: written beside it, then renamed over it.
    pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
        if bytes.len() < HEADER || &bytes[..HEADER] != MAGIC {
            return Err(JournalError::NotAJournal {
                path: path.to_path_buf(),
            });
        }
        scan(bytes).map_err(|(record, offset, reason)| JournalError::Corrupt {
            path: path.to_path_buf(),
            record,
            offset: offset as u64,
            reason,
        })?;
        let tmp = PathBuf::from(format!("{}.replacing", path.display()));
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| JournalError::Io { path: p, source }
        };
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        if let Some(dir) = path.parent() {
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }

    /// Starts rewriting the journal without the records of removed jobs (and older
    /// checkpoints), on its own thread: the records before this point that belong to jobs
    /// not removed, in order, then `checkpoint` (what replaying the dropped records would
    /// have left: [`Coordinator::checkpoint`](crate::state::Coordinator::checkpoint), taken
    /// now). Appends go on meanwhile; [`Journal::finish_compaction`] copies them over and
    /// replaces the file. Like Redis's AOF rewrite, the compacted log is the snapshot.
    pub fn start_compaction(&self, checkpoint: JournalRecord) -> Result<Compaction> {
        let path = self.path.clone();
        let upto = self.bytes;
        let live: std::collections::HashSet<JobId> = self.job_bytes.keys().copied().collect();
        let thread = std::thread::Builder::new()
            .name("journal-compaction".into())
            .spawn(move || Self::compact(&path, upto, &live, &checkpoint))
            .map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(Compaction {
            upto,
            records_upto: self.len,
            garbage_upto: self.garbage,
            tmp: Self::compact_path(&self.path),
            thread: Some(thread),
        })
    }

    /// The compaction thread: writes `<path>.compact` from the first `upto` bytes of the
    /// journal.
    fn compact(
        path: &Path,
        upto: u64,
        live: &std::collections::HashSet<JobId>,
        checkpoint: &JournalRecord,
    ) -> Result<Compacted> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut bytes = vec![0u8; upto as usize];
        File::open(path)
            .and_then(|f| f.read_exact_at(&mut bytes, 0))
            .map_err(io)?;
        if bytes.len() < HEADER || &bytes[..HEADER] != MAGIC {
            return Err(JournalError::NotAJournal {
                path: path.to_path_buf(),
            });
        }
        let corrupt = |record: u64, offset: usize, reason: String| JournalError::Corrupt {
            path: path.to_path_buf(),
            record,
            offset: offset as u64,
            reason,
        };
        let (ranges, _) = scan(&bytes).map_err(|(r, o, why)| corrupt(r, o, why))?;
        let mut out = Vec::with_capacity(bytes.len() / 2);
        out.extend_from_slice(MAGIC);
        let mut records = 0u64;
        let mut marker = None;
        // The last clock record not yet copied: copied before the next record kept, so that
        // every kept record replays at the time it was made.
        let mut clock = None;
        for (i, &(a, b)) in ranges.iter().enumerate() {
            let r: JournalRecord = postcard::from_bytes(&bytes[a..b])
                .map_err(|e| corrupt(i as u64, a - RECORD_HEADER, e.to_string()))?;
            if r.always_kept() || r.job().is_some_and(|j| live.contains(&j)) {
                if let Some((ca, cb)) = clock.take() {
                    out.extend_from_slice(&bytes[ca - RECORD_HEADER..cb]);
                    records += 1;
                }
                out.extend_from_slice(&bytes[a - RECORD_HEADER..b]);
                records += 1;
            } else if matches!(r, JournalRecord::Replicated { .. }) {
                marker = Some((a, b));
            } else if matches!(r, JournalRecord::Clock { .. }) {
                clock = Some((a, b));
            }
        }
        // The records appended meanwhile, copied after these, may rely on the last clock.
        if let Some((ca, cb)) = clock {
            out.extend_from_slice(&bytes[ca - RECORD_HEADER..cb]);
            records += 1;
        }
        let payload = postcard::to_stdvec(checkpoint).map_err(|source| JournalError::Encode {
            path: path.to_path_buf(),
            record: records,
            source,
        })?;
        frame(&payload, &mut out).map_err(|n| JournalError::TooLarge {
            path: path.to_path_buf(),
            record: records,
            bytes: n,
        })?;
        records += 1;
        // In a group, the last marker says which log entry the compacted journal stands at
        // (see crate::ha); the earlier ones say nothing more.
        if let Some((a, b)) = marker {
            out.extend_from_slice(&bytes[a - RECORD_HEADER..b]);
            records += 1;
        }
        let tmp = Self::compact_path(path);
        let tmp_io = |source| JournalError::Io {
            path: tmp.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .truncate(false)
            .open(&tmp)
            .map_err(tmp_io)?;
        file.set_len(0).map_err(tmp_io)?;
        file.write_all(&out).map_err(tmp_io)?;
        Ok(Compacted {
            tmp,
            file,
            records,
            bytes: out.len() as u64,
        })
    }

    /// Finishes a compaction whose thread is done (`compaction.is_finished()`; otherwise
    /// this waits for it): copies the records appended since it started, makes the file
    /// durable and puts it in the journal's place. `None`: the compaction failed (logged)
    /// and the journal is unchanged, whole, still appended to.
    pub fn finish_compaction(&mut self, mut compaction: Compaction) -> Option<CompactionReport> {
        let thread = compaction.thread.take()?;
        let done = match thread.join() {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                tracing::warn!("journal compaction failed, the journal is unchanged: {e}");
                let _ = std::fs::remove_file(Self::compact_path(&self.path));
                return None;
            }
            Err(_) => {
                tracing::warn!("journal compaction panicked, the journal is unchanged");
                let _ = std::fs::remove_file(Self::compact_path(&self.path));
                return None;
            }
        };
        let Compacted {
            tmp,
            mut file,
            records,
            bytes,
        } = done;
        let tail_len = self.bytes - compaction.upto;
        let mut step = || -> std::io::Result<()> {
            let mut tail = vec![0u8; tail_len as usize];
            self.file.read_exact_at(&mut tail, compaction.upto)?;
            file.write_all(&tail)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        if let Err(e) = step() {
            tracing::warn!(
                "journal compaction of {} failed, the journal is unchanged: {e}",
                self.path.display()
            );
            let _ = std::fs::remove_file(&tmp);
            return None;
        }
        if let Some(dir) = self.path.parent() {
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                tracing::warn!("journal compaction: cannot sync {}: {e}", dir.display());
            }
        }
        let report = CompactionReport {
            bytes_before: self.bytes,
            bytes_after: bytes + tail_len,
            records_before: self.len,
            records_after: records + (self.len - compaction.records_upto),
        };
        // The handle stays on the compacted file, now the journal.
        self.file = file;
        self.bytes = report.bytes_after;
        self.len = report.records_after;
        // What was garbage when it started is gone.
        self.garbage -= compaction.garbage_upto.min(self.garbage);
        Some(report)
    }

    /// Leaves `compaction`, still running on this journal, for its next holder
    /// ([`Journal::take_handed`]), which finishes it.
    pub fn hand_over(&mut self, compaction: Compaction) {
        self.handed = Some(compaction);
    }

    /// The compaction the journal's previous holder handed over with it, if any.
    pub fn take_handed(&mut self) -> Option<Compaction> {
        self.handed.take()
    }
}

impl Compaction {
    /// Whether its thread is done (then [`Journal::finish_compaction`] does not wait).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

/// A compaction dropped unfinished (its journal replaced, or its holder gone) waits for its
/// thread and deletes what it wrote: no thread is left writing `<journal>.compact` while a
/// later compaction writes the same file.
impl Drop for Compaction {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use flotilla_core::{parse_job, JobId, TaskId, WorkerId};

    use super::*;
    use crate::state::{AttemptOutcome, AttemptResult, ObjectRef, TaskRef, Usage};

    fn records() -> Vec<JournalRecord> {
        let text = r#"
name = "j"
staging = "transfer"
[defaults]
timeout = "5m"
resources = { cpus = 2, mem = "1GiB", licence = 1 }
[[task]]
id = "sim"
array = "0..4"
outputs = ["out/{i}"]
[[task.variant]]
name = "gpu"
cmd = ["./sim", "--cuda", "{i}"]
resources = { gpus = 0.5, gpu_mem = "2GiB" }
[[task.variant]]
name = "cpu"
cmd = ["./sim", "{i}"]
[[task]]
id = "score"
wasm = { module = "s.wasm", args = ["{i}"], fuel = 1000 }
array = "0..2"
after = ["sim"]
"#;
        let spec = parse_job(text, "j.toml").unwrap();
        let task = TaskRef {
            job: JobId::new(7),
            task: TaskId::new(3),
        };
        vec![
            JournalRecord::JobSubmitted {
                job: JobId::new(7),
                spec: Box::new(spec),
                dir: "/jobs/j".into(),
                tenant: "alice".into(),
            },
            JournalRecord::TaskAssigned {
                worker: WorkerId::new(2),
                task,
                attempt: 1,
                variant: Some("gpu".into()),
                gpu_indices: vec![1],
                hw_class: "h200".into(),
            },
            JournalRecord::TaskFinishedMetered {
                worker: WorkerId::new(2),
                task,
                attempt: 1,
                result: AttemptResult {
                    outcome: AttemptOutcome::Failed {
                        message: "exit 3".into(),
                        retryable: true,
                    },
                    usage: Usage {
                        cpu_seconds: 1.5,
                        peak_rss_bytes: 1 << 20,
                        wall_seconds: 2.25,
                        energy_j: Some(30.5),
                        energy_estimated: true,
                        fuel: None,
                    },
                    outputs: vec![ObjectRef {
                        path: "out/3".into(),
                        hash: "ab".repeat(32),
                        size: 42,
                    }],
                    variant: Some("gpu".into()),
                },
            },
            JournalRecord::JobCancelled { job: JobId::new(7) },
        ]
    }

    #[test]
    fn records_round_trip_in_order_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        {
            let mut j = Journal::open(&path).unwrap();
            assert!(j.is_empty());
            j.append(&recs[..1]).unwrap();
            j.append(&recs[1..]).unwrap();
            j.append(&[]).unwrap();
            assert_eq!(j.len(), 4);
            assert_eq!(j.replay().unwrap(), recs);
        }
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(j.len(), 4);
        assert_eq!(j.replay().unwrap(), recs);
        j.append(&recs[3..]).unwrap();
        assert_eq!(j.len(), 5);
        let back = j.replay().unwrap();
        assert_eq!(back.len(), 5);
        assert_eq!(back[4], recs[3]);
        // The job spec survives whole (variants, wasm, resources, staging, timeout).
        match (&back[0], &recs[0]) {
            (
                JournalRecord::JobSubmitted { spec: a, .. },
                JournalRecord::JobSubmitted { spec: b, .. },
            ) => {
                assert_eq!(a, b);
                assert_eq!(a.expand().unwrap().len(), 6);
            }
            _ => panic!("first record is the submission"),
        }
    }

    /// Byte offset of record `n`'s header in a journal file.
    fn record_offset(bytes: &[u8], n: usize) -> usize {
        let mut at = HEADER;
        for _ in 0..n {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at += RECORD_HEADER + len;
        }
        at
    }

    fn written(dir: &Path) -> (PathBuf, Vec<u8>) {
        let path = dir.join("journal.log");
        let mut j = Journal::open(&path).unwrap();
        j.append(&records()).unwrap();
        drop(j);
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    }

    #[test]
    fn a_corrupt_payload_names_the_file_the_record_and_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = written(dir.path());
        let at = record_offset(&bytes, 2);
        bytes[at + RECORD_HEADER] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(
            matches!(e, JournalError::Corrupt { record: 2, offset, .. } if offset == at as u64),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains("journal.log"), "{msg}");
        assert!(
            msg.contains(&format!("record 2 at byte {at} is corrupt")),
            "{msg}"
        );
        assert!(msg.contains("--recover-journal"), "{msg}");
    }

    #[test]
    fn one_coordinator_per_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let first = Journal::open(&path).unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(matches!(e, JournalError::InUse { .. }), "{e}");
        assert!(e.to_string().contains("another coordinator"), "{e}");
        drop(first);
        Journal::open(&path).expect("free again once the first is closed");
    }

    #[test]
    fn a_corrupt_length_in_the_middle_is_corruption_not_a_torn_tail() {
        // Format 1 took a length pointing past the end for a torn write and cut off every
        // record after it at the next start.
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = written(dir.path());
        let at = record_offset(&bytes, 1);
        bytes[at + 2] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(matches!(e, JournalError::Corrupt { record: 1, .. }), "{e}");
        assert!(e.to_string().contains("header checksum"), "{e}");
        // Nothing was cut off.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn recovering_keeps_the_valid_prefix_and_sets_the_damaged_file_aside() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records();
        let (path, mut bytes) = written(dir.path());
        let at = record_offset(&bytes, 2);
        bytes[at + 1] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let (mut j, opened) = Journal::open_recovering(&path).unwrap();
        let (record, cut, aside) = opened.recovered.clone().expect("recovered");
        assert_eq!((record, cut), (2, (bytes.len() - at) as u64));
        assert_eq!(
            std::fs::read(&aside).unwrap(),
            bytes,
            "the whole damaged file is kept"
        );
        assert_eq!(j.len(), 2);
        assert_eq!(j.replay().unwrap(), recs[..2].to_vec());
        j.append(&recs[3..]).unwrap();
        drop(j);
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(
            j.replay().unwrap(),
            vec![recs[0].clone(), recs[1].clone(), recs[3].clone()]
        );
    }

    #[test]
    fn a_record_torn_by_a_crash_is_cut_off_and_appending_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records();
        let (path, bytes) = written(dir.path());
        // The coordinator died in the middle of writing the last record: cut in its payload,
        // in its header, or with the file grown by zeros that never got their data.
        let last = record_offset(&bytes, 3);
        let mut zeros = bytes[..last].to_vec();
        zeros.extend_from_slice(&[0u8; 300]);
        for torn in [
            bytes[..bytes.len() - 5].to_vec(),
            bytes[..last + 7].to_vec(),
            zeros,
        ] {
            std::fs::write(&path, &torn).unwrap();
            let (mut j, opened) = Journal::open_recovering(&path).unwrap();
            assert_eq!(opened.recovered, None, "a torn tail is not damage");
            assert_eq!(opened.torn_bytes, (torn.len() - last) as u64);
            assert_eq!(j.len(), 3);
            assert_eq!(j.replay().unwrap(), recs[..3].to_vec());
            j.append(&recs[3..]).unwrap();
            drop(j);
            let mut j = Journal::open(&path).unwrap();
            assert_eq!(j.replay().unwrap(), recs);
        }
    }

    #[test]
    fn a_format_1_journal_is_read_and_rewritten_as_format_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        let mut v1 = MAGIC_V1.to_vec();
        for r in &recs {
            let p = postcard::to_stdvec(r).unwrap();
            v1.extend_from_slice(&(p.len() as u32).to_le_bytes());
            v1.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
            v1.extend_from_slice(&p);
        }
        // With a torn last record.
        v1.extend_from_slice(&[9, 0, 0]);
        std::fs::write(&path, &v1).unwrap();
        let (mut j, opened) = Journal::open_recovering(&path).unwrap();
        assert!(opened.upgraded);
        assert_eq!(j.replay().unwrap(), recs);
        assert_eq!(&std::fs::read(&path).unwrap()[..HEADER], MAGIC);
        j.append(&recs[..1]).unwrap();
        assert_eq!(j.bytes(), std::fs::metadata(&path).unwrap().len());
        drop(j);
        assert_eq!(Journal::open(&path).unwrap().len(), 5);
    }

    #[test]
    fn appends_are_fsynced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path().join("journal.log")).unwrap();
        j.append(&records()).unwrap();
        assert_eq!(j.syncs(), 0);
        j.set_sync(SyncMode::Always);
        j.append(&records()).unwrap();
        j.append(&[]).unwrap();
        j.append(&records()[..1]).unwrap();
        assert_eq!(j.syncs(), 2);
        assert_eq!(j.bytes(), std::fs::metadata(j.path()).unwrap().len());
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-journal.log");
        std::fs::write(&path, b"hello, this is not a journal").unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(e.to_string().contains("not-a-journal.log"), "{e}");
    }

    /// Appends per second with batches of 1 and of 100 records, without and with fsync. Run with
    /// `cargo test -p flotilla-cluster --release --lib journal_append_rate -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn journal_append_rate() {
        let dir = tempfile::tempdir().unwrap();
        let rec = records()[2].clone();
        for (batch, commits, sync) in [
            (1usize, 3000usize, SyncMode::Process),
            (100, 300, SyncMode::Process),
            (1, 300, SyncMode::Always),
            (100, 100, SyncMode::Always),
        ] {
            let path = dir.path().join(format!("rate-{batch}-{sync:?}.log"));
            let mut j = Journal::open(&path).unwrap();
            j.set_sync(sync);
            let recs = vec![rec.clone(); batch];
            let t0 = Instant::now();
            for _ in 0..commits {
                j.append(&recs).unwrap();
            }
            let s = t0.elapsed().as_secs_f64();
            let n = (batch * commits) as f64;
            println!(
                "journal {sync:?}: batch {batch:>3}: {:>9.0} records/s, {:>7.0} commits/s ({n} records in {s:.3}s)",
                n / s,
                commits as f64 / s
            );
            assert_eq!(j.len() as usize, batch * commits);
        }
    }

    /// `rec` moved to job `job`.
    fn for_job(rec: &JournalRecord, job: u64) -> JournalRecord {
        let mut r = rec.clone();
        match &mut r {
            JournalRecord::JobSubmitted { job: j, .. }
            | JournalRecord::JobCancelled { job: j }
            | JournalRecord::JobRemoved { job: j }
            | JournalRecord::JobSubmittedText { job: j, .. }
            | JournalRecord::BudgetRaised { job: j, .. }
            | JournalRecord::JobReopened { job: j, .. }
            | JournalRecord::JobRetried { job: j }
            | JournalRecord::Submission { job: j, .. } => *j = JobId::new(job),
            JournalRecord::TaskFinished { task, .. }
            | JournalRecord::TaskFinishedMetered { task, .. }
            | JournalRecord::TaskAssigned { task, .. }
            | JournalRecord::Verdict { task, .. } => task.job = JobId::new(job),
            JournalRecord::Checkpoint { .. }
            | JournalRecord::CreditsGranted { .. }
            | JournalRecord::PoolWorker { .. }
            | JournalRecord::Ledger { .. }
            | JournalRecord::Replicated { .. }
            | JournalRecord::Clock { .. } => {}
        }
        r
    }

    #[test]
    fn compaction_keeps_a_groups_last_marker_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let marker = |n: u8| JournalRecord::Replicated { state: vec![n] };
        let checkpoint = JournalRecord::Checkpoint {
            next_job: 3,
            next_worker: 1,
            model: "{}".into(),
        };
        let recs = records();
        let mut j = Journal::open(&path).unwrap();
        j.append(&[for_job(&recs[0], 1), marker(1)]).unwrap();
        j.append(&[for_job(&recs[0], 2), marker(2)]).unwrap();
        // The first marker is dead weight once the second is written.
        let framed = (postcard::to_stdvec(&marker(1)).unwrap().len() + RECORD_HEADER) as u64;
        assert_eq!(j.garbage(), framed);
        j.append(&[JournalRecord::JobRemoved { job: JobId::new(1) }, marker(3)])
            .unwrap();
        let c = j.start_compaction(checkpoint.clone()).unwrap();
        j.finish_compaction(c).expect("compacted");
        assert_eq!(
            j.replay().unwrap(),
            vec![for_job(&recs[0], 2), checkpoint, marker(3)]
        );
        let (_, last) = Journal::read_upto_last(&path, |r| match r {
            JournalRecord::Replicated { state } => Some(state.clone()),
            _ => None,
        })
        .unwrap()
        .expect("a marker");
        assert_eq!(last, vec![3]);
    }

    #[test]
    fn compaction_drops_removed_jobs_and_keeps_what_was_appended_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        let checkpoint = |n: u64| JournalRecord::Checkpoint {
            next_job: n,
            next_worker: 3,
            model: "{}".into(),
        };
        let mut j = Journal::open(&path).unwrap();
        // The ledger's records stay whatever the jobs.
        let grant = JournalRecord::CreditsGranted {
            tenant: "alice".into(),
            amount: flotilla_pool::Credits::whole(5),
        };
        j.append(std::slice::from_ref(&grant)).unwrap();
        let gone: Vec<JournalRecord> = recs.iter().map(|r| for_job(r, 1)).collect();
        let kept: Vec<JournalRecord> = recs[..3].iter().map(|r| for_job(r, 2)).collect();
        j.append(&gone[..2]).unwrap();
        j.append(&kept[..1]).unwrap();
        j.append(&gone[2..]).unwrap();
        assert_eq!(j.garbage(), 0, "nothing removed yet");
        j.append(&[JournalRecord::JobRemoved { job: JobId::new(1) }])
            .unwrap();
        let garbage = j.garbage();
        assert!(garbage > 0 && garbage < j.bytes());
        let before = j.bytes();
        let c = j.start_compaction(checkpoint(3)).unwrap();
        // Appended while the compaction runs: copied over when it finishes.
        j.append(&kept[1..]).unwrap();
        let appended = j.bytes();
        assert!(appended > before);
        let r = j.finish_compaction(c).expect("compacted");
        let ckpt = (postcard::to_stdvec(&checkpoint(3)).unwrap().len() + RECORD_HEADER) as u64;
        assert_eq!(r.bytes_before, appended);
        assert_eq!(r.bytes_after, appended - garbage + ckpt);
        assert_eq!(j.bytes(), r.bytes_after);
        let want: Vec<JournalRecord> = vec![
            grant.clone(),
            kept[0].clone(),
            checkpoint(3),
            kept[1].clone(),
            kept[2].clone(),
        ];
        assert_eq!(r.records_after, 5);
        assert!(r.bytes_after < r.bytes_before);
        assert!(!Journal::compact_path(&path).exists());
        // Appends go on into the compacted file, and it reopens whole.
        j.append(&[JournalRecord::JobCancelled { job: JobId::new(2) }])
            .unwrap();
        let mut want_all = want.clone();
        want_all.push(JournalRecord::JobCancelled { job: JobId::new(2) });
        assert_eq!(j.replay().unwrap(), want_all);
        drop(j);
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(j.len(), 6);
        assert_eq!(j.replay().unwrap(), want_all);
        assert_eq!(j.garbage(), 0, "nothing is left to drop");
    }

    #[test]
    fn compaction_keeps_the_clock_each_kept_record_was_made_at() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        let clock = |at_ms: u64| JournalRecord::Clock { at_ms };
        let checkpoint = JournalRecord::Checkpoint {
            next_job: 3,
            next_worker: 3,
            model: "{}".into(),
        };
        let gone: Vec<JournalRecord> = recs.iter().map(|r| for_job(r, 1)).collect();
        let kept: Vec<JournalRecord> = recs[..3].iter().map(|r| for_job(r, 2)).collect();
        let mut j = Journal::open(&path).unwrap();
        j.append(&[clock(100), gone[0].clone(), kept[0].clone()])
            .unwrap();
        // A clock followed only by dropped records, then one before a kept record.
        j.append(&[clock(200), gone[1].clone(), clock(300), gone[2].clone()])
            .unwrap();
        j.append(&[kept[1].clone(), clock(400), gone[3].clone()])
            .unwrap();
        j.append(&[JournalRecord::JobRemoved { job: JobId::new(1) }])
            .unwrap();
        let c = j.start_compaction(checkpoint.clone()).unwrap();
        // Made at 400 too (the clock did not move): it must not replay at 300.
        j.append(&kept[2..3]).unwrap();
        j.finish_compaction(c).expect("compacted");
        assert_eq!(
            j.replay().unwrap(),
            vec![
                clock(100),
                kept[0].clone(),
                clock(300),
                kept[1].clone(),
                clock(400),
                checkpoint,
                kept[2].clone(),
            ]
        );
    }

    #[test]
    fn a_compaction_cut_short_by_a_crash_leaves_the_journal_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        let mut j = Journal::open(&path).unwrap();
        j.append(&recs).unwrap();
        j.append(&[JournalRecord::JobRemoved { job: JobId::new(7) }])
            .unwrap();
        drop(j);
        // A half-written compacted file from a coordinator that died.
        std::fs::write(Journal::compact_path(&path), b"FLOTJRN2garbage").unwrap();
        let mut j = Journal::open(&path).unwrap();
        assert!(!Journal::compact_path(&path).exists());
        assert_eq!(j.replay().unwrap().len(), recs.len() + 1);
        // A compaction whose file cannot be written changes nothing.
        std::fs::create_dir(Journal::compact_path(&path)).unwrap();
        let c = j
            .start_compaction(JournalRecord::Checkpoint {
                next_job: 8,
                next_worker: 3,
                model: "{}".into(),
            })
            .unwrap();
        assert!(j.finish_compaction(c).is_none());
        assert_eq!(j.replay().unwrap().len(), recs.len() + 1);
        j.append(&recs[..1]).unwrap();
        assert_eq!(j.replay().unwrap().len(), recs.len() + 2);
    }
}
