//! The cluster's errors.

use std::path::Path;

use thiserror::Error;

/// What went wrong in the coordinator, a worker or a client.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// A file or directory could not be read or written.
    /// (The I/O error is in the message, not a source: chains would print it twice.)
    #[error("{path}: {error}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Bad configuration or arguments.
    #[error("{0}")]
    Config(String),
    /// A task ended without writing a file it declares (`outputs`), or wrote a folder there.
    #[error("{0}")]
    MissingOutput(String),
    /// Another worker holds this work folder.
    #[error("{dir}: another worker uses this work folder; give each worker its own (--work-dir)")]
    WorkDirInUse {
        /// The folder.
        dir: String,
    },
    /// A worker offers resources no ledger can hold (a negative amount, a GPU listed twice).
    #[error("the worker's offer: {0}")]
    Offer(#[from] flotilla_core::ledger::LedgerError),
    /// The job file was refused.
    #[error(transparent)]
    Job(#[from] flotilla_core::CoreError),
    /// Could not reach the other side.
    #[error("cannot connect to {addr}: {message}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        message: String,
    },
    /// The other side was reached but TLS stood between: its certificate does not verify
    /// against the CA given, or it speaks TLS to a plain-TCP client. Waiting does not help.
    #[error("cannot connect to {addr}: {message}")]
    Tls {
        /// The address.
        addr: String,
        /// What the connection saw, and what to pass.
        message: String,
    },
    /// The other side answered with an error.
    #[error("{0}")]
    Rpc(String),
    /// The server refused the request's content (`INVALID_ARGUMENT`): sent again as it is,
    /// it would be refused again.
    #[error("{0}")]
    Invalid(String),
    /// The server knows the token but its role may not do this (a tenant's token registering
    /// a worker): trying again with the same token cannot help.
    #[error("{0}")]
    Denied(String),
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: this side speaks {ours}, the other {theirs}")]
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// A journal record could not be replayed (the journal does not match this version's
    /// state machine, or it is damaged in a way its checksums do not show).
    #[error("replaying journal record {record}: {source}")]
    Replay {
        /// Its number, from 0.
        record: usize,
        /// Why the state machine refused it.
        #[source]
        source: crate::state::StateError,
    },
    /// A listening socket could not be opened.
    #[error("cannot listen on {addr}{}: {source}{}", flag_of(.flag), bind_hint(.source))]
    Bind {
        /// The address.
        addr: String,
        /// The flag that gave it (`--data-listen`), when known.
        flag: Option<&'static str>,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Something unexpected in the state machine.
    #[error("{0}")]
    State(String),
    /// An object store is at its cap.
    #[error(
        "the object store {dir} is full: {used} of its {cap} bytes are used and {wanted} more \
         are needed ({flag}); a finished job's objects leave it when the job is removed \
         (`flotilla rm`, or `flotilla server --retain-finished`)"
    )]
    StoreFull {
        /// The store's folder.
        dir: String,
        /// Bytes held.
        used: u64,
        /// Its cap.
        cap: u64,
        /// The object's size.
        wanted: u64,
        /// The option that sets the cap.
        flag: &'static str,
    },
    /// An object larger than its store's whole cap: no removal makes room for it.
    #[error(
        "an object of {wanted} bytes is larger than the whole object store {dir} may hold \
         ({cap} bytes, {flag}): raise {flag}"
    )]
    ObjectTooLarge {
        /// The store's folder.
        dir: String,
        /// Its cap.
        cap: u64,
        /// The object's size.
        wanted: u64,
        /// The option that sets the cap.
        flag: &'static str,
    },
    /// The server answered that it cannot serve now (it stops, it lost its leadership, it
    /// cannot reach its group): trying again, on whichever node leads, may succeed.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The server refused the token presented (invalid, revoked or missing).
    #[error("refused: {0}")]
    Refused(String),
}

impl ClusterError {
    /// Whether the request may succeed if sent again, on whichever node then leads: no
    /// server was reached, or it answered that it cannot serve now.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClusterError::Connect { .. } | ClusterError::Unavailable(_)
        )
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        ClusterError::Io {
            path: path.display().to_string(),
            error: source,
        }
    }
}

/// How a [`ClusterError::Bind`] names its flag: ` (--data-listen)`.
fn flag_of(flag: &Option<&'static str>) -> String {
    flag.map(|f| format!(" ({f})")).unwrap_or_default()
}

impl ClusterError {
    /// A [`ClusterError::Bind`] says which flag gave the address.
    pub fn bind_for(self, flag: &'static str) -> ClusterError {
        match self {
            ClusterError::Bind { addr, source, .. } => ClusterError::Bind {
                addr,
                flag: Some(flag),
                source,
            },
            e => e,
        }
    }
}

/// What a port already taken may mean (a second `flotilla server` on the port said only
/// "Address already in use").
fn bind_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        " (another process listens there, such as a flotilla server or worker already \
         running: stop it, or give another port)"
    } else {
        ""
    }
}

impl From<tonic::Status> for ClusterError {
    fn from(s: tonic::Status) -> Self {
        match s.code() {
            tonic::Code::Unauthenticated => ClusterError::Refused(s.message().to_string()),
            tonic::Code::Unavailable => ClusterError::Unavailable(s.message().to_string()),
            tonic::Code::PermissionDenied => ClusterError::Denied(s.message().to_string()),
            tonic::Code::InvalidArgument => ClusterError::Invalid(s.message().to_string()),
            // An HTTP server that is not a coordinator's API answered (the dashboard and
            // metrics port, most likely): tonic's words name only the missing header.
            _ if s.message().contains("grpc-status header missing") => ClusterError::Rpc(format!(
                "{} (the address answers HTTP but is not a coordinator's API: the \
                     coordinator's --http-listen port, for its dashboard and metrics, or \
                     another server? Clients and workers use its --listen address)",
                s.message()
            )),
            _ => ClusterError::Rpc(s.message().to_string()),
        }
    }
}

/// The cluster's result type.
pub type Result<T> = std::result::Result<T, ClusterError>;
