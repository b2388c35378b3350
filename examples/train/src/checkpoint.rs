//! Checkpoints: the parameters, step and sampler state of a run, written atomically.
//!
//! A checkpoint is one file `step-NNNNNNNNNNNN.ckpt` in the checkpoint folder. It is written
//! to a temporary name in the same folder, fsynced, renamed into place and the folder is
//! fsynced, so a reader sees either a whole checkpoint or none. The newest few are kept.
//!
//! Layout (little-endian): magic `FLTRAIN\0`, version `u32`, step `u64`, seed `u64`, batch
//! `u64`, learning rate `f32`, data fingerprint `u32`, sampler key, epoch and position
//! (`u64` each), parameter count `u64`, the parameters (`f32` each), and a CRC-32 of
//! everything before it.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};
use crate::rng::SamplerState;

const MAGIC: &[u8; 8] = b"FLTRAIN\0";
const VERSION: u32 = 1;
const PREFIX: &str = "step-";
const SUFFIX: &str = ".ckpt";

/// Everything needed to continue a run exactly where it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Updates applied so far.
    pub step: u64,
    /// The run's seed.
    pub seed: u64,
    /// The global batch size.
    pub batch: u64,
    /// The learning rate.
    pub lr: f32,
    /// [`crate::Dataset::fingerprint`] of the training set.
    pub data_fingerprint: u32,
    /// The sample order's state after `step` batches.
    pub sampler: SamplerState,
    /// The model's flat parameters after `step` updates.
    pub params: Vec<f32>,
}

impl Checkpoint {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(80 + 4 * self.params.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.step, self.seed, self.batch] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.lr.to_le_bytes());
        out.extend_from_slice(&self.data_fingerprint.to_le_bytes());
        for v in [self.sampler.key, self.sampler.epoch, self.sampler.position] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.params.len() as u64).to_le_bytes());
        for p in &self.params {
            out.extend_from_slice(&p.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a file's bytes; `path` only names the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint> {
        let bad = |message: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad("not a flotilla-train checkpoint (bad magic)".into()));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(crc.try_into().expect("split_at left 4 bytes"));
        if crc32fast::hash(body) != stored {
            return Err(bad("checksum mismatch (truncated or damaged file)".into()));
        }
        let mut reader = Reader {
            bytes: &body[MAGIC.len()..],
        };
        let truncated = || bad("file ends early".into());
        let version = reader.u32().ok_or_else(truncated)?;
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        let step = reader.u64().ok_or_else(truncated)?;
        let seed = reader.u64().ok_or_else(truncated)?;
        let batch = reader.u64().ok_or_else(truncated)?;
        let lr = f32::from_bits(reader.u32().ok_or_else(truncated)?);
        let data_fingerprint = reader.u32().ok_or_else(truncated)?;
        let sampler = SamplerState {
            key: reader.u64().ok_or_else(truncated)?,
            epoch: reader.u64().ok_or_else(truncated)?,
            position: reader.u64().ok_or_else(truncated)?,
        };
        let count = reader.u64().ok_or_else(truncated)?;
        if reader.bytes.len() as u64 != count.saturating_mul(4) {
            return Err(bad(format!(
                "{count} parameters declared, {} bytes of them present",
                reader.bytes.len()
            )));
        }
        let params = reader
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("chunks_exact(4)")))
            .collect();
        Ok(Checkpoint {
            step,
            seed,
            batch,
            lr,
            data_fingerprint,
            sampler,
            params,
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_at_checked(N)?;
        self.bytes = rest;
        head.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

/// The newest readable checkpoint of a folder, and the newer files that could not be read.
#[derive(Debug)]
pub struct Latest {
    /// The checkpoint's file.
    pub path: PathBuf,
    /// Its contents.
    pub checkpoint: Checkpoint,
    /// Newer checkpoint files that were damaged, with the reason (normally empty).
    pub skipped: Vec<TrainError>,
}

/// A folder of checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointDir {
    /// The checkpoints in `dir` (created on the first save), keeping the newest `keep` (at
    /// least 1).
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> CheckpointDir {
        CheckpointDir {
            dir: dir.into(),
            keep: keep.max(1),
        }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The file name of the checkpoint of `step`.
    pub fn file_for(&self, step: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{step:012}{SUFFIX}"))
    }

    /// Writes `checkpoint` atomically, then deletes all but the newest `keep` checkpoints.
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<PathBuf> {
        let io = |context: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| TrainError::Io {
                context,
                path,
                source,
            }
        };
        fs::create_dir_all(&self.dir).map_err(io("creating checkpoint folder", &self.dir))?;
        let target = self.file_for(checkpoint.step);
        let tmp = self.dir.join(format!(
            ".{PREFIX}{:012}{SUFFIX}.tmp-{}",
            checkpoint.step,
            std::process::id()
        ));
        let mut file = File::create(&tmp).map_err(io("creating checkpoint", &tmp))?;
        file.write_all(&checkpoint.encode())
            .map_err(io("writing checkpoint", &tmp))?;
        file.sync_all().map_err(io("syncing checkpoint", &tmp))?;
        drop(file);
        fs::rename(&tmp, &target).map_err(io("renaming checkpoint into", &target))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing checkpoint folder", &self.dir))?;
        let steps = self.steps()?;
        for old in steps.iter().rev().skip(self.keep) {
            let path = self.file_for(*old);
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("removing old checkpoint", &path)(e))
                }
                _ => {}
            }
        }
        Ok(target)
    }

    /// The steps of the checkpoint files present, ascending (by name; contents unchecked).
    pub fn steps(&self) -> Result<Vec<u64>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TrainError::Io {
                    context: "listing checkpoint folder",
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut steps = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| TrainError::Io {
                context: "listing checkpoint folder",
                path: self.dir.clone(),
                source,
            })?;
            let name = entry.file_name();
            let step = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.strip_suffix(SUFFIX))
                .filter(|n| n.len() == 12)
                .and_then(|n| n.parse::<u64>().ok());
            steps.extend(step);
        }
        steps.sort_unstable();
        Ok(steps)
    }

    /// The newest checkpoint that reads back intact, if any. Damaged newer files are skipped
    /// and reported in [`Latest::skipped`].
    pub fn latest(&self) -> Result<Option<Latest>> {
        let mut skipped = Vec::new();
        for step in self.steps()?.into_iter().rev() {
            let path = self.file_for(step);
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                // Pruned by a concurrent writer between listing and reading.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(TrainError::Io {
                        context: "reading checkpoint",
                        path,
                        source,
                    })
                }
            };
            match Checkpoint::decode(&bytes, &path) {
                Ok(checkpoint) if checkpoint.step == step => {
                    return Ok(Some(Latest {
                        path,
                        checkpoint,
                        skipped,
                    }))
                }
                Ok(checkpoint) => skipped.push(TrainError::Checkpoint {
                    path,
                    message: format!("holds step {}, not the step of its name", checkpoint.step),
                }),
                Err(e) => skipped.push(e),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: u64) -> Checkpoint {
        Checkpoint {
            step,
            seed: 7,
            batch: 64,
            lr: 0.25,
            data_fingerprint: 0xDEAD_BEEF,
            sampler: SamplerState {
                key: 1,
                epoch: 2,
                position: 3,
            },
            params: (0..100).map(|i| i as f32 * 0.5 - 3.0).collect(),
        }
    }

    #[test]
    fn encode_decode_round_trips() {
        let c = sample(12);
        assert_eq!(Checkpoint::decode(&c.encode(), Path::new("x")).unwrap(), c);
    }

    #[test]
    fn decode_rejects_every_truncation_and_a_flipped_bit() {
        let bytes = sample(5).encode();
        for len in 0..bytes.len() {
            assert!(
                Checkpoint::decode(&bytes[..len], Path::new("x")).is_err(),
                "len {len}"
            );
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 0x10;
        let err = Checkpoint::decode(&flipped, Path::new("x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn save_keeps_the_newest_and_latest_skips_damaged_files() {
        let dir = tempfile::tempdir().unwrap();
        let ckpts = CheckpointDir::new(dir.path().join("ck"), 2);
        assert!(ckpts.latest().unwrap().is_none());
        for step in [10, 20, 30] {
            ckpts.save(&sample(step)).unwrap();
        }
        assert_eq!(ckpts.steps().unwrap(), vec![20, 30]);
        let latest = ckpts.latest().unwrap().unwrap();
        assert_eq!(latest.checkpoint, sample(30));
        assert!(latest.skipped.is_empty());
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(ckpts.path()).unwrap().collect();
        assert_eq!(names.len(), 2);

        let newest = ckpts.file_for(30);
        let mut bytes = fs::read(&newest).unwrap();
        bytes.truncate(bytes.len() / 2);
        fs::write(&newest, bytes).unwrap();
        let latest = ckpts.latest().unwrap().unwrap();
        assert_eq!(latest.checkpoint.step, 20);
        assert_eq!(latest.skipped.len(), 1);
    }
}
