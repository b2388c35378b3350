//! The coordinator's journal: an append-only log of [`JournalRecord`]s in a redb database,
//! replayed in order after a restart.
//!
//! | operation | what happens |
//! | --- | --- |
//! | [`Journal::open`] | opens or creates the file; counts the records |
//! | [`Journal::append`] | one write transaction for the whole batch (group commit), durable (fsync'd) before it returns |
//! | [`Journal::replay`] | every record, in append order; a record that does not decode is an error naming the file and the record number |
//!
//! Records are keyed by their number (`u64`, from 0) in one table, `records`, and encoded
//! with postcard (every record type, including a whole `JobSpec`, is postcard-friendly: no
//! untagged enums, no `deserialize_any`).
//!
//! Who writes what, in order: the server appends each journaled event before applying it,
//! and the `TaskAssigned` records from
//! [`Coordinator::take_journal_records`](crate::state::Coordinator::take_journal_records)
//! before it sends the matching `Assign` commands; one batch of both per append.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

pub use crate::state::JournalRecord;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");

/// What can go wrong with the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The database failed (open, transaction, commit, read).
    #[error("journal {path}: {source}")]
    Db {
        /// The journal file.
        path: PathBuf,
        /// The database error.
        #[source]
        source: Box<redb::Error>,
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
    /// A stored record does not decode.
    #[error("journal {path}: record {record} is corrupt: {source}")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Its number, from 0.
        record: u64,
        /// Why.
        #[source]
        source: postcard::Error,
    },
    /// Record numbers are not contiguous.
    #[error("journal {path}: record {expected} is missing (found {found} instead)")]
    Gap {
        /// The journal file.
        path: PathBuf,
        /// The number expected.
        expected: u64,
        /// The number found.
        found: u64,
    },
}

/// The journal's result type.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

/// An append-only journal of [`JournalRecord`]s; see the [module docs](self).
pub struct Journal {
    db: Database,
    path: PathBuf,
    len: u64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl Journal {
    /// Opens the journal at `path`, creating it if missing.
    pub fn open(path: impl AsRef<Path>) -> Result<Journal> {
        let path = path.as_ref().to_path_buf();
        let db_err = |e: redb::Error| JournalError::Db {
            path: path.clone(),
            source: Box::new(e),
        };
        let db = Database::create(&path).map_err(|e| db_err(e.into()))?;
        let txn = db.begin_write().map_err(|e| db_err(e.into()))?;
        let len = {
            let table = txn.open_table(RECORDS).map_err(|e| db_err(e.into()))?;
            let last = table.last().map_err(|e| db_err(e.into()))?;
            last.map_or(0, |(k, _)| k.value() + 1)
        };
        txn.commit().map_err(|e| db_err(e.into()))?;
        Ok(Journal { db, path, len })
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

    fn db_err(&self, e: impl Into<redb::Error>) -> JournalError {
        JournalError::Db {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }

    /// Appends `records` in one write transaction, durable before it returns. Nothing is
    /// appended on error.
    pub fn append(&mut self, records: &[JournalRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut encoded = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let bytes = postcard::to_stdvec(r).map_err(|source| JournalError::Encode {
                path: self.path.clone(),
                record: self.len + i as u64,
                source,
            })?;
            encoded.push(bytes);
        }
        let txn = self.db.begin_write().map_err(|e| self.db_err(e))?;
        {
            let mut table = txn.open_table(RECORDS).map_err(|e| self.db_err(e))?;
            for (i, bytes) in encoded.iter().enumerate() {
                table
                    .insert(self.len + i as u64, bytes.as_slice())
                    .map_err(|e| self.db_err(e))?;
            }
        }
        txn.commit().map_err(|e| self.db_err(e))?;
        self.len += records.len() as u64;
        Ok(())
    }

    /// Every record, in append order.
    pub fn replay(&self) -> Result<Vec<JournalRecord>> {
        let txn = self.db.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(RECORDS).map_err(|e| self.db_err(e))?;
        let n = table.len().map_err(|e| self.db_err(e))?;
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for (expected, entry) in (0u64..).zip(table.iter().map_err(|e| self.db_err(e))?) {
            let (k, v) = entry.map_err(|e| self.db_err(e))?;
            let found = k.value();
            if found != expected {
                return Err(JournalError::Gap {
                    path: self.path.clone(),
                    expected,
                    found,
                });
            }
            let rec = postcard::from_bytes(v.value()).map_err(|source| JournalError::Corrupt {
                path: self.path.clone(),
                record: found,
                source,
            })?;
            out.push(rec);
        }
        Ok(out)
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
        let path = dir.path().join("journal.redb");
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

    #[test]
    fn a_corrupt_record_names_the_file_and_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.redb");
        {
            let mut j = Journal::open(&path).unwrap();
            j.append(&records()).unwrap();
        }
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(RECORDS).unwrap();
                t.insert(2u64, [0xffu8, 0xff, 0xff].as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let j = Journal::open(&path).unwrap();
        let e = j.replay().unwrap_err();
        assert!(matches!(e, JournalError::Corrupt { record: 2, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("journal.redb"), "{msg}");
        assert!(msg.contains("record 2 is corrupt"), "{msg}");
    }

    #[test]
    fn a_missing_record_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.redb");
        {
            let mut j = Journal::open(&path).unwrap();
            j.append(&records()).unwrap();
        }
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(RECORDS).unwrap();
                t.remove(1u64).unwrap();
            }
            txn.commit().unwrap();
        }
        let e = Journal::open(&path).unwrap().replay().unwrap_err();
        assert!(
            matches!(
                e,
                JournalError::Gap {
                    expected: 1,
                    found: 2,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-db.redb");
        std::fs::write(&path, b"hello, this is not redb").unwrap();
        let e = Journal::open(&path).unwrap_err();
        assert!(e.to_string().contains("not-a-db.redb"), "{e}");
    }

    /// Appends per second with batches of 1 and of 100 records (durable commits). Run with
    /// `cargo test -p flotilla-cluster --release --lib journal_append_rate -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn journal_append_rate() {
        let dir = tempfile::tempdir().unwrap();
        let rec = records()[2].clone();
        for (batch, commits) in [(1usize, 300usize), (100, 100)] {
            let path = dir.path().join(format!("rate-{batch}.redb"));
            let mut j = Journal::open(&path).unwrap();
            let recs = vec![rec.clone(); batch];
            let t0 = Instant::now();
            for _ in 0..commits {
                j.append(&recs).unwrap();
            }
            let s = t0.elapsed().as_secs_f64();
            let n = (batch * commits) as f64;
            println!(
                "journal: batch {batch:>3}: {:>9.0} records/s, {:>7.0} commits/s ({n} records in {s:.3}s)",
                n / s,
                commits as f64 / s
            );
            assert_eq!(j.len() as usize, batch * commits);
        }
    }
}
