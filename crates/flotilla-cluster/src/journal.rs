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

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let mut opened = Opened::default();
        if bytes.is_empty() {
            file.write_all(MAGIC).map_err(io)?;
            file.sync_all().map_err(io)?;
            return Ok((Journal::new(file, path, 0, HEADER as u64), opened));
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
            return Ok((Journal::new(file, path, n, out.len() as u64), opened));
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
        Ok((Journal::new(file, path, n, end as u64), opened))
    }

    fn new(file: File, path: PathBuf, len: u64, bytes: u64) -> Journal {
        Journal {
            file,
            path,
            len,
            bytes,
            sync: SyncMode::default(),
            syncs: 0,
        }
    }

    /// Sets how durable appends are when they return.
    pub fn set_sync(&mut self, mode: SyncMode) {
        self.sync = mode;
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
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
        }
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(&buf).map_err(io)?;
        if self.sync == SyncMode::Always {
            self.file.sync_data().map_err(io)?;
            self.syncs += 1;
        }
        self.len += records.len() as u64;
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Every record, in append order.
    pub fn replay(&self) -> Result<Vec<JournalRecord>> {
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
        ranges
            .into_iter()
            .enumerate()
            .map(|(i, (a, b))| {
                postcard::from_bytes(&bytes[a..b])
                    .map_err(|e| corrupt(i as u64, a - RECORD_HEADER, e.to_string()))
            })
            .collect()
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
            JournalRecord::TaskFinished {
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
        let j = Journal::open(&path).unwrap();
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
            let j = Journal::open(&path).unwrap();
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
}
