//! The coordinator's journal: an append-only log of [`JournalRecord`]s, replayed in order
//! after a restart.
//!
//! # Format
//! The file starts with the 8-byte magic `FLOTJRN1`; then each record is
//! `len: u32 LE | crc32(payload): u32 LE | payload`, the payload being the record encoded with
//! postcard (every record type, including a whole `JobSpec`, is postcard-friendly).
//!
//! | operation | what happens |
//! | --- | --- |
//! | [`Journal::open`] | opens or creates the file, checks every record; a torn last record (the coordinator died in the middle of a write) is cut off |
//! | [`Journal::append`] | the whole batch in ONE `write` (group commit); with [`SyncMode::Always`] also fsync'd before it returns |
//! | [`Journal::replay`] | every record, in append order; a damaged record before the end is an error naming the file and the record number |
//!
//! # Why a log file and not redb or SQLite
//! The first version kept the records in redb. Measured here, a redb commit cost about
//! 0.33 ms even without fsync (`Durability::Eventual`), and the coordinator commits once per
//! batch of events, so it bounded the latency of every hop of a chain of tasks. The
//! journal needs nothing a database gives (no lookups, no updates, no concurrent readers):
//! it is written once, in order, and read once, in order. One `write` of a batch costs a few
//! microseconds, and a crc per record detects damage.
//!
//! Who writes what, in order: the server applies a batch of events, then appends the
//! journaled ones and the `TaskAssigned` records from
//! [`Coordinator::take_journal_records`](crate::state::Coordinator::take_journal_records) in
//! one append, and only then replies and sends the matching `Assign` commands.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub use crate::state::JournalRecord;

const MAGIC: &[u8; 8] = b"FLOTJRN1";
const HEADER: usize = 8;

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
    /// A stored record is damaged or does not decode.
    #[error("journal {path}: record {record} is corrupt: {reason}")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Its number, from 0.
        record: u64,
        /// What is wrong.
        reason: String,
    },
}

/// The journal's result type.
pub type Result<T> = std::result::Result<T, JournalError>;

/// An open journal.
pub struct Journal {
    file: File,
    path: PathBuf,
    len: u64,
    sync: SyncMode,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

/// The records of a journal file's bytes (after the magic): their payload ranges, and where
/// the valid part ends. A damaged record that is the last thing in the file is a torn write
/// (`Ok`, with `end` before it); one followed by more bytes is corruption.
fn scan(path: &Path, bytes: &[u8]) -> Result<(Vec<(usize, usize)>, usize)> {
    let mut at = HEADER;
    let mut out = Vec::new();
    while at < bytes.len() {
        let record = out.len() as u64;
        let torn_or =
            |reason: &str, end_of_damage: usize| -> Result<(Vec<(usize, usize)>, usize)> {
                if end_of_damage >= bytes.len() {
                    Ok((Vec::new(), at))
                } else {
                    Err(JournalError::Corrupt {
                        path: path.to_path_buf(),
                        record,
                        reason: reason.to_string(),
                    })
                }
            };
        if bytes.len() - at < 8 {
            let r = torn_or("truncated header", bytes.len())?;
            return Ok((out, r.1));
        }
        let len =
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let crc = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        let start = at + 8;
        let end = start.saturating_add(len);
        if end > bytes.len() {
            let r = torn_or("truncated payload", bytes.len())?;
            return Ok((out, r.1));
        }
        if crc32fast::hash(&bytes[start..end]) != crc {
            let r = torn_or("checksum mismatch", end)?;
            return Ok((out, r.1));
        }
        out.push((start, end));
        at = end;
    }
    Ok((out, at))
}

impl Journal {
    /// Opens the journal at `path`, creating it if missing; cuts off a torn last record.
    pub fn open(path: impl AsRef<Path>) -> Result<Journal> {
        let path = path.as_ref().to_path_buf();
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
        if bytes.is_empty() {
            file.write_all(MAGIC).map_err(io)?;
            file.sync_all().map_err(io)?;
            return Ok(Journal {
                file,
                path,
                len: 0,
                sync: SyncMode::default(),
            });
        }
        if bytes.len() < HEADER || &bytes[..HEADER] != MAGIC {
            return Err(JournalError::NotAJournal { path });
        }
        let (records, end) = scan(&path, &bytes)?;
        if end < bytes.len() {
            tracing::warn!(
                "journal {}: cutting off {} bytes of a record torn by a crash",
                path.display(),
                bytes.len() - end
            );
            file.set_len(end as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
            file.seek(SeekFrom::End(0)).map_err(io)?;
        }
        Ok(Journal {
            file,
            path,
            len: records.len() as u64,
            sync: SyncMode::default(),
        })
    }

    /// Sets how durable appends are when they return.
    pub fn set_sync(&mut self, mode: SyncMode) {
        self.sync = mode;
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
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
            let len = u32::try_from(payload.len()).map_err(|_| JournalError::Corrupt {
                path: self.path.clone(),
                record: self.len + i as u64,
                reason: format!("record of {} bytes is too large", payload.len()),
            })?;
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            buf.extend_from_slice(&payload);
        }
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(&buf).map_err(io)?;
        if self.sync == SyncMode::Always {
            self.file.sync_data().map_err(io)?;
        }
        self.len += records.len() as u64;
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
        let (ranges, _) = scan(&self.path, &bytes)?;
        ranges
            .into_iter()
            .enumerate()
            .map(|(i, (a, b))| {
                postcard::from_bytes(&bytes[a..b]).map_err(|e| JournalError::Corrupt {
                    path: self.path.clone(),
                    record: i as u64,
                    reason: e.to_string(),
                })
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

    /// Byte offset of record `n`'s payload in a journal file.
    fn payload_offset(bytes: &[u8], n: usize) -> usize {
        let mut at = HEADER;
        for _ in 0..n {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at += 8 + len;
        }
        at + 8
    }

    #[test]
    fn a_corrupt_record_names_the_file_and_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        {
            let mut j = Journal::open(&path).unwrap();
            j.append(&records()).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let at = payload_offset(&bytes, 2);
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(matches!(e, JournalError::Corrupt { record: 2, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("journal.log"), "{msg}");
        assert!(msg.contains("record 2 is corrupt"), "{msg}");
    }

    #[test]
    fn a_record_torn_by_a_crash_is_cut_off_and_appending_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let recs = records();
        {
            let mut j = Journal::open(&path).unwrap();
            j.append(&recs).unwrap();
        }
        let bytes = std::fs::read(&path).unwrap();
        // The coordinator died in the middle of writing the last record.
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(j.len(), 3);
        assert_eq!(j.replay().unwrap(), recs[..3].to_vec());
        j.append(&recs[3..]).unwrap();
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.replay().unwrap(), recs);
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
