//! The crate's error type.

use std::time::Duration;

/// Result of every fallible operation in this crate.
pub type Result<T> = std::result::Result<T, CommError>;

/// Everything that can go wrong while setting up or running a collective.
///
/// Any error returned by a collective breaks the communicator: the rank shuts down its
/// sockets and raises the shared-memory abort flag so its peers fail quickly too, and every
/// later call returns an error at once.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A peer closed its connection or its process died.
    #[error("lost peer rank {peer} during {op}: {detail}")]
    PeerLost {
        /// The rank of the peer that went away.
        peer: usize,
        /// The operation that noticed it.
        op: &'static str,
        /// What was observed (eof, connection reset, process gone, ...).
        detail: String,
    },
    /// Nothing arrived within [`crate::Options::timeout`].
    #[error("{op} timed out after {after:?} waiting for {}", fmt_peer(*.peer))]
    Timeout {
        /// The peer that was waited for, if known.
        peer: Option<usize>,
        /// The operation that waited.
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// The rendezvous failed: bad address, size mismatch, duplicate rank, timed out waiting.
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    /// Arguments that do not fit: buffer lengths, root or peer out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An I/O error outside the data path (socket setup, shared memory file).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Another rank aborted the communicator (or this rank did, after an earlier error).
    #[error("communicator aborted by rank {by}")]
    Aborted {
        /// The rank that aborted.
        by: usize,
    },
    /// An earlier call on this rank failed with an error of its own (an invalid argument, an
    /// I/O error), which broke the communicator: its peers were told it aborted.
    #[error("{op}: the communicator was broken by an earlier error on this rank, in {detail}; make a new one")]
    BrokenEarlier {
        /// The operation called now.
        op: &'static str,
        /// The first error: the operation and what went wrong.
        detail: String,
    },
    /// Moving a rank's data between its device memory and the host failed (device
    /// collectives and their benchmark).
    #[error("staging device memory: {0}")]
    Staging(String),
}

fn fmt_peer(peer: Option<usize>) -> String {
    match peer {
        Some(p) => format!("rank {p}"),
        None => "a peer".to_string(),
    }
}

impl CommError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }
}
