//! The crate's error type.

use std::path::PathBuf;

/// Result of every fallible operation in this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// Everything that can go wrong while loading data, training or checkpointing.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read, written, renamed or synced.
    #[error("{context} {}: {source}", path.display())]
    Io {
        /// What was being done ("reading data file", "renaming checkpoint", ...).
        context: &'static str,
        /// The file or folder concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data file holds a line that is not `label,p0,..,p63`.
    #[error("{}:{line}: {message}", path.display())]
    Data {
        /// The data file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// A checkpoint file is damaged or does not belong to this run.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A setting that cannot work (batch not divisible by the world size, too few samples, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The ranks disagree on something they must share (resume step, parameters, data).
    #[error("ranks disagree on {0}")]
    Disagreement(&'static str),
    /// The device computing the gradient failed.
    #[error("device failed at step {step}: {source}")]
    Device {
        /// The step being run.
        step: u64,
        /// The cause.
        #[source]
        source: flotilla_devices::DevicesError,
    },
    /// The collective operation failed (a peer died, a timeout, a rendezvous problem).
    #[error("collective failed at step {step}: {source}")]
    Comm {
        /// The step being run (0 while starting up).
        step: u64,
        /// The cause.
        #[source]
        source: flotilla_collective::CommError,
    },
}
