//! Collective communication for data-parallel training: allreduce, reduce-scatter,
//! allgather, broadcast, reduce, barrier and point-to-point, between processes (or threads)
//! over TCP or shared memory.
//!
//! This crate owns the data plane between ranks of a job; it is separate from the runtime and
//! the cluster crates because it is used by user programs directly (like `torch.distributed`),
//! has no async runtime, and talks to peers over its own sockets.
//!
//! ```no_run
//! use flotilla_collective::{Communicator, ReduceOp};
//! # fn main() -> flotilla_collective::Result<()> {
//! // rank 0 serves the rendezvous on 127.0.0.1:29500, ranks 1..4 connect to it
//! let mut comm = Communicator::connect("127.0.0.1:29500", 0, 4)?;
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.allreduce(&mut grads, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! # Design
//! - Setup: the rendezvous ([`RendezvousServer`], protocol in `rendezvous.rs`) hands every
//!   rank the table of listen addresses, host ids (`hostname/boot_id`) and pids; the ranks then
//!   build a full TCP mesh with a handshake that checks the group key and the ranks (`mesh.rs`).
//!   When every rank is on this host, rank 0 creates a shared memory segment in `/dev/shm`,
//!   every rank maps it, and rank 0 unlinks it right away (`shm.rs`).
//! - TCP data path: non-blocking sockets driven by `poll(2)` from the calling thread, full
//!   duplex, receives reduced chunk by chunk as they arrive (`mesh.rs`, `algo.rs`).
//! - Shared memory data path: chunked, double-buffered; each rank reduces its share of each
//!   chunk across all ranks' slots in rank order (`shm.rs`, `shm_ops.rs`).
//! - Failure: any error breaks the communicator, shuts its sockets (peers see EOF and fail in
//!   turn) and raises the shared memory abort flag; shared memory waits also check that the
//!   peers' connections are open and their processes exist. [`Options::timeout`] is the
//!   backstop.
//!
//! # Measurements
//! Bandwidth and latency against OpenMPI, and the tuning that chose the chunk sizes, buffers
//! and thresholds above, are in `BENCHMARKS.md` ("Collectives"); `flotilla bench allreduce`
//! and `examples/allreduce.rs` measure them.
//!
#![deny(missing_docs)]

mod algo;
pub mod bench;
mod comm;
mod element;
mod error;
mod mesh;
mod options;
mod rendezvous;
mod shm;
mod shm_ops;
pub mod tls;
mod wire;

pub use comm::{Communicator, RD_THRESHOLD_BYTES};
pub use element::{Element, ReduceOp};
pub use error::{CommError, Result};
/// Brain floating point, 16 bits (from the `half` crate), an [`Element`].
pub use half::bf16;
pub use options::{Algorithm, Options, Transport};
pub use rendezvous::{RendezvousServer, MAX_CONNECTIONS as MAX_RENDEZVOUS_CONNECTIONS};
