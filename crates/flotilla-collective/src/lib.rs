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
//! 2-core AMD EPYC VM, 2 ranks as processes (`examples/allreduce.rs`, nccl-tests semantics,
//! see [`mod@bench`]), `allreduce(f32, Sum)`, busbw in GB/s (1e9 bytes), medians of 5 rounds,
//! range over 3 runs on an idle machine (busy < 10%). OpenMPI 4.1.4 `MPI_Allreduce` from
//! `shared/anchors/hpc/mpi_bench.sh` in the same session, 3 runs.
//!
//! | size   | shm (ours) | OpenMPI vader | tcp (ours)  | OpenMPI tcp loopback |
//! |--------|-----------:|--------------:|------------:|---------------------:|
//! | 4 KB   | 0.8-1.0 µs | 1.2-1.5 µs    | 6.5-9.4 µs  | 18-20 µs             |
//! | 1 MB   | 7.8 - 9.4  | 5.7 - 7.5     | 1.5 - 4.8   | 3.1 - 4.3            |
//! | 64 MB  | 5.4 - 8.4  | 1.73 - 1.75   | 1.8 - 2.1   | 1.04 - 1.13          |
//! | 256 MB | 6.4 - 8.2  | 1.74 - 1.77   | 1.8 - 2.0   | 1.12 - 1.16          |
//!
//! The tcp column above predates the send buffer and chunk tuning below. A later session
//! (OpenMPI run alternately with ours, 4 runs each, median µs per call, range of the runs'
//! medians in brackets; before = fixed 4 MiB chunks and autotuned send buffers):
//!
//! | size   | tcp before           | tcp now              | OpenMPI tcp loopback |
//! |--------|---------------------:|---------------------:|---------------------:|
//! | 4 KB   | 8.1 [6 - 14]         | 8.8 [8 - 9]          | 18.4 [18 - 24]       |
//! | 256 KB | 102 [67 - 193]       | 95 [74 - 118]        | -                    |
//! | 1 MB   | 428 [234 - 760]      | 231 [202 - 277]      | 241 [240 - 431]      |
//! | 4 MB   | 2080 [2020 - 3190]   | 1025 [802 - 1257]    | -                    |
//! | 64 MB  | 36300 [32000 - 41800]| 26600 [21300 - 29100]| 57500 [54000 - 67700]|
//! | 256 MB | 138000 [133000-156000]| 103000 [83500-130000]| 250000 [241000-294000]|
//!
//! At 1 MB ours is now about as fast as OpenMPI (busbw about 4.5 vs 4.35 GB/s at the medians)
//! but does not beat it reliably: two of the four runs were slower than OpenMPI's usual
//! 240 µs. The machine is noisy: per 100 ms round the 1 MB time switches between regimes
//! (about 200 µs and 400 - 750 µs); pinning the two ranks to different cores removed most of
//! the slow rounds (the slow regime looks like both ranks sharing one core), and both ranks
//! pinned to one core gave a steady 415 µs. Profile at 1 MB (`perf record`): kernel copies
//! into and out of socket buffers are 35 - 45% of the time, the reduction 5 - 9%; a 1 MiB
//! copy costs 24 µs cache-hot and 112 µs from DRAM here, so cache locality is what matters.
//!
//! Tuning measured on the same machine:
//! - shared memory slot (chunk per rank per step): 256 KiB was best (the whole 2-rank segment
//!   fits in the 2 MiB L2); 1 MiB reached about half of that at 64 MB, 128 KiB was slower.
//! - TCP send buffer: `SO_SNDBUF` 256 KiB on connections between ranks of one host (see
//!   `LOCAL_SNDBUF_BYTES` in `mesh.rs`), about 45% faster at 1 MB and 25 - 40% at 4 - 64 MB
//!   than autotuning; 128 KiB and 512 KiB were no better; fixed receive buffers (512 KiB - 4 MiB)
//!   no better than autotuning.
//! - TCP reduction chunk: an eighth of the ring segment, clamped to 128 KiB - 4 MiB (see
//!   `tcp_chunk_bytes` in `algo.rs`; with the 256 KiB send buffer, 2 ranks, µs per call vs a
//!   fixed 4 MiB chunk: 1 MB 207 vs 238, 4 MB 809 vs 1427, 64 MB 20800 vs 23900); a fixed
//!   128 KiB chunk was best at 1 - 4 MB but 30% slower at 64 MB. Capping each `send` to one
//!   chunk (to interleave sends and receives more finely) was 2x slower at 1 MB.
//! - Busy-polling 50 µs before sleeping in `poll(2)` gained 10 - 30%; 500 µs and 5 ms were no
//!   better with the tuned buffers (the slow rounds stayed).
//! - [`RD_THRESHOLD_BYTES`] (TCP, 2 ranks, median µs per call, recursive doubling vs ring):
//!   64 KiB 22-25 vs 30-34, 128 KiB 52-69 vs 44-48, 256 KiB 98-125 vs 75-140, 1 MiB 320-540
//!   vs 365-460: the crossover is at about 128 KiB (before busy-polling it was 256 KiB).
//!   Rechecked with the tuned send buffer and chunks (ranks pinned): 64 KiB 23 vs 30, 128 KiB
//!   45 vs 45, 256 KiB 89 - 105 vs 75 - 111, 512 KiB 150 - 225 vs 234 - 254, 1 MiB 260 vs
//!   220, 2 MiB 517 vs 411; so the threshold stays (recursive doubling led at 512 KiB in two
//!   runs, within this machine's noise, and lost from 1 MiB on).
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
mod wire;

pub use comm::{Communicator, RD_THRESHOLD_BYTES};
pub use element::{Element, ReduceOp};
pub use error::{CommError, Result};
/// Brain floating point, 16 bits (from the `half` crate), an [`Element`].
pub use half::bf16;
pub use options::{Algorithm, Options, Transport};
pub use rendezvous::RendezvousServer;
