//! Communicator options.

use std::time::Duration;

/// How ranks exchange data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Shared memory when every rank runs on this host (same hostname and boot id), else TCP.
    Auto,
    /// TCP connections between every pair of ranks.
    Tcp,
    /// A shared memory segment (all ranks must be on one host). Point-to-point `send`/`recv`
    /// still go over the TCP mesh, which is always built.
    Shm,
}

/// Which allreduce algorithm the TCP transport uses.
///
/// The shared memory transport always uses its segment algorithm (see [`crate`] docs), which
/// was faster than both at every size measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Recursive doubling below [`crate::RD_THRESHOLD_BYTES`], ring from there on.
    Auto,
    /// Ring: reduce-scatter then allgather, pipelined in chunks; bandwidth optimal.
    Ring,
    /// Recursive doubling (with the usual fold for sizes that are not a power of two);
    /// `log2(n)` steps, latency optimal.
    RecursiveDoubling,
}

/// Options for [`crate::Communicator::connect_with`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The transport; [`Transport::Auto`] by default.
    pub transport: Transport,
    /// The allreduce algorithm on TCP; [`Algorithm::Auto`] by default.
    pub algorithm: Algorithm,
    /// The longest any single wait may take (rendezvous, connecting, one receive); 60 s by
    /// default. Past it the call fails with [`crate::CommError::Timeout`].
    pub timeout: Duration,
    /// Reduce every element in rank order `0..n-1`, so that results are bitwise identical for
    /// every algorithm and transport (at some cost on TCP). False by default.
    pub deterministic: bool,
    /// The fingerprint (blake3 of the DER, hex) of the rendezvous server's TLS certificate:
    /// set, a `HOST:PORT/KEY` rendezvous is reached over TLS and trusted only with that
    /// certificate (`FLOTILLA_RENDEZVOUS_CERT`, given to gang members by a worker whose
    /// coordinator uses TLS). `None`: plain TCP.
    pub rendezvous_cert: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            transport: Transport::Auto,
            algorithm: Algorithm::Auto,
            timeout: Duration::from_secs(60),
            deterministic: false,
            rendezvous_cert: None,
        }
    }
}
