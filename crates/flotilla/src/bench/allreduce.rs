//! `flotilla bench allreduce`: allreduce (f32, sum) bandwidth with ranks as separate
//! processes, nccl-tests figures (`algbw = bytes / seconds`, `busbw = algbw · 2(n−1)/n`).
//!
//! The launcher hosts a rendezvous, starts `ranks` copies of the `flotilla` binary as
//! `flotilla bench allreduce-rank` with `FLOTILLA_RANK`, `FLOTILLA_WORLD_SIZE` and
//! `FLOTILLA_RENDEZVOUS` set (exactly what a gang member gets from a worker), and relays the
//! JSON lines rank 0 prints. The rank side ([`run_rank`]) is also what a gang member of a
//! cluster job runs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use flotilla_collective::{bench, Communicator, Options, Transport};
use flotilla_devices::{Device, DeviceBuffer};

use crate::device_collective::{DeviceCollectiveError, DeviceStaging};
use serde::{Deserialize, Serialize};

/// One size's result: one JSON line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AllreducePoint {
    /// Ranks (processes).
    pub ranks: usize,
    /// The transport in use: `tcp` or `shm`.
    pub transport: String,
    /// `f32`.
    pub dtype: String,
    /// `sum`.
    pub op: String,
    /// Message size in bytes.
    pub bytes: usize,
    /// Calls per timed round.
    pub iters: usize,
    /// Median over rounds of the slowest rank's mean time per call.
    pub seconds: f64,
    /// Fastest round.
    pub min_seconds: f64,
    /// Slowest round.
    pub max_seconds: f64,
    /// `bytes / seconds`, GB/s (1 GB = 1e9 B).
    pub algbw_gbs: f64,
    /// `algbw · 2(n−1)/n`, GB/s.
    pub busbw_gbs: f64,
    /// Where each rank's data lives: `host`, or a device (`cpu-device`, `opencl`, `cuda`)
    /// staged through the host ([`crate::device_collective`]).
    #[serde(default = "host_memory")]
    pub memory: String,
    /// The staging pipeline's chunk in the last call (0: one piece), for device memory.
    #[serde(default)]
    pub chunk_bytes: usize,
    /// Whether the staging memory was page-locked, for device memory.
    #[serde(default)]
    pub pinned: bool,
    /// Whether the copies ran on their own threads, overlapping the allreduce.
    #[serde(default)]
    pub overlap: bool,
}

fn host_memory() -> String {
    "host".into()
}

/// Where `bench allreduce` keeps each rank's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// A host vector (the plain collective).
    Host,
    /// A buffer on a device of this kind (`Cpu`: the host device, a memory node of its own),
    /// staged through host memory.
    Device(flotilla_devices::DeviceKind),
}

/// The memory named on the command line: `host`, `cpu-device`, `opencl` or `cuda`.
pub fn parse_memory(text: &str) -> Result<Memory, AllreduceBenchError> {
    use flotilla_devices::DeviceKind;
    match text {
        "host" => Ok(Memory::Host),
        "cpu-device" => Ok(Memory::Device(DeviceKind::Cpu)),
        "opencl" => Ok(Memory::Device(DeviceKind::OpenCl)),
        "cuda" => Ok(Memory::Device(DeviceKind::Cuda)),
        other => Err(AllreduceBenchError::BadSize(format!(
            "--memory {other:?}: expected host, cpu-device, opencl or cuda"
        ))),
    }
}

/// A device buffer allreduced through [`DeviceStaging`].
struct DeviceTarget {
    device: std::sync::Arc<dyn Device>,
    buf: DeviceBuffer,
    count: usize,
    staging: std::rc::Rc<std::cell::RefCell<DeviceStaging>>,
}

fn staging_err(e: impl std::fmt::Display) -> flotilla_collective::CommError {
    flotilla_collective::CommError::Staging(e.to_string())
}

impl bench::BenchTarget for DeviceTarget {
    fn load(&mut self, values: &[f32]) -> flotilla_collective::Result<()> {
        self.device
            .upload(&self.buf, bytemuck::cast_slice(values))
            .map_err(staging_err)
    }
    fn allreduce(&mut self, comm: &mut Communicator) -> flotilla_collective::Result<()> {
        let r = self.staging.borrow_mut().allreduce::<f32>(
            comm,
            self.device.as_ref(),
            &self.buf,
            self.count,
            flotilla_collective::ReduceOp::Sum,
        );
        r.map_err(|e| match e {
            DeviceCollectiveError::Comm(c) => c,
            other => staging_err(other),
        })
    }
    fn read(&mut self, out: &mut [f32]) -> flotilla_collective::Result<()> {
        self.device
            .download(&self.buf, bytemuck::cast_slice_mut(out))
            .map_err(staging_err)
    }
}

/// The device of `kind` this rank uses: the host device, the first OpenCL device, or
/// GPU `rank % count`.
fn rank_device(
    kind: flotilla_devices::DeviceKind,
    rank: usize,
) -> Result<std::sync::Arc<dyn Device>, AllreduceBenchError> {
    use flotilla_devices::{discover_report, DeviceKind, DiscoverOptions};
    if kind == DeviceKind::Cpu {
        return Ok(std::sync::Arc::new(flotilla_devices::cpu::HostDevice::new(
            u64::MAX,
        )));
    }
    let found = discover_report(&DiscoverOptions {
        opencl: kind == DeviceKind::OpenCl,
        cuda: kind == DeviceKind::Cuda,
        mem_limit: None,
    });
    let n = found.devices.len();
    if n == 0 {
        return Err(AllreduceBenchError::Rank {
            rank,
            message: format!("no {kind} device: {}", found.skipped.join("; ")),
        });
    }
    Ok(found.devices[rank % n].clone())
}

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum AllreduceBenchError {
    /// A size that does not parse.
    #[error("--bytes: {0}")]
    BadSize(String),
    /// The communicator failed.
    #[error(transparent)]
    Comm(#[from] flotilla_collective::CommError),
    /// A rank process could not start or failed.
    #[error("rank {rank}: {message}")]
    Rank {
        /// The rank.
        rank: usize,
        /// What happened.
        message: String,
    },
    /// Output that is not a result line.
    #[error("rank 0 printed {0:?}, not a result")]
    BadLine(String),
}

/// Parses a comma-separated list of sizes (`4KiB,1MiB,64MiB`, read by
/// [`flotilla_core::size::parse_size`]: `K` and `M` are decimal, `KiB` and `MiB` binary, as
/// OpenMPI's benchmarks use) into byte counts, each a positive multiple of 4 (whole f32
/// elements).
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, AllreduceBenchError> {
    text.split(',')
        .map(|s| {
            let bytes = flotilla_core::size::parse_size(s)
                .ok()
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| {
                    AllreduceBenchError::BadSize(format!("{:?} is not a size", s.trim()))
                })?;
            if bytes == 0 || bytes % 4 != 0 {
                return Err(AllreduceBenchError::BadSize(format!(
                    "{:?} must be a positive multiple of 4 bytes (f32 elements)",
                    s.trim()
                )));
            }
            Ok(bytes)
        })
        .collect()
}

/// The transport named on the command line.
pub fn parse_transport(text: &str) -> Result<Transport, AllreduceBenchError> {
    match text {
        "auto" => Ok(Transport::Auto),
        "tcp" => Ok(Transport::Tcp),
        "shm" => Ok(Transport::Shm),
        other => Err(AllreduceBenchError::BadSize(format!(
            "--transport {other:?}: expected tcp, shm or auto"
        ))),
    }
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Shm => "shm",
        Transport::Auto => "auto",
    }
}

/// One rank: builds the communicator from `FLOTILLA_RANK`, `FLOTILLA_WORLD_SIZE` and
/// `FLOTILLA_RENDEZVOUS`, runs the sizes, and returns the points (identical on every rank).
pub fn run_rank(
    sizes: &[usize],
    transport: Transport,
    rounds: usize,
    memory: Memory,
    chunk_bytes: Option<usize>,
    overlap: Option<bool>,
) -> Result<(usize, Vec<AllreducePoint>), AllreduceBenchError> {
    let options = Options {
        transport,
        ..Options::default()
    };
    let mut comm = Communicator::from_env_with(options)?;
    let mut staging = match chunk_bytes {
        None => DeviceStaging::new(),
        Some(0) => DeviceStaging::with_chunk_bytes(usize::MAX),
        Some(c) => DeviceStaging::with_chunk_bytes(c),
    };
    if let Some(o) = overlap {
        staging = staging.with_overlap(o);
    }
    let staging = std::rc::Rc::new(std::cell::RefCell::new(staging));
    let (points, memory_name) = match memory {
        Memory::Host => (bench::run(&mut comm, sizes, rounds.max(1))?, host_memory()),
        Memory::Device(kind) => {
            let device = rank_device(kind, comm.rank())?;
            let name = match kind {
                flotilla_devices::DeviceKind::Cpu => "cpu-device".to_string(),
                k => k.to_string(),
            };
            let points = bench::run_with(&mut comm, sizes, rounds.max(1), |count| {
                let buf = device.alloc(count * 4).map_err(staging_err)?;
                Ok(Box::new(DeviceTarget {
                    device: device.clone(),
                    buf,
                    count,
                    staging: staging.clone(),
                }))
            })?;
            (points, name)
        }
    };
    let pinned = memory != Memory::Host && staging.borrow().is_pinned();
    let overlapped = memory != Memory::Host && staging.borrow().last_overlapped();
    let chunk_used = match memory {
        Memory::Host => 0,
        Memory::Device(_) => staging.borrow().last_chunk_bytes(),
    };
    let used = transport_name(comm.transport()).to_string();
    let ranks = comm.size();
    let out = points
        .into_iter()
        .map(|p| AllreducePoint {
            ranks,
            transport: used.clone(),
            dtype: "f32".into(),
            op: "sum".into(),
            bytes: p.bytes,
            iters: p.iters,
            seconds: p.seconds,
            min_seconds: p.min_seconds,
            max_seconds: p.max_seconds,
            algbw_gbs: p.algbw_gbs,
            busbw_gbs: p.busbw_gbs,
            memory: memory_name.clone(),
            chunk_bytes: chunk_used,
            pinned,
            overlap: overlapped,
        })
        .collect();
    Ok((comm.rank(), out))
}

/// Starts `ranks` processes of `exe` (the `flotilla` binary) as `bench allreduce-rank`,
/// calls `on_point` for each line rank 0 prints, and waits for all of them.
pub fn launch(
    exe: &Path,
    ranks: usize,
    sizes: &str,
    transport: &str,
    rounds: usize,
    staging: (&str, Option<usize>, Option<bool>),
    mut on_point: impl FnMut(AllreducePoint),
) -> Result<(), AllreduceBenchError> {
    let (memory, chunk_bytes, overlap) = staging;
    let server = flotilla_collective::RendezvousServer::bind("127.0.0.1:0")?;
    let key = format!("bench-{}", std::process::id());
    let rendezvous = format!("{}/{key}", server.local_addr());
    let mut children = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let child = Command::new(exe)
            .args(["bench", "allreduce-rank", "--bytes", sizes])
            .args(["--transport", transport, "--rounds", &rounds.to_string()])
            .args(["--memory", memory])
            .args(
                chunk_bytes
                    .map(|c| vec!["--chunk-bytes".to_string(), c.to_string()])
                    .unwrap_or_default(),
            )
            .args(
                overlap
                    .map(|o| vec!["--overlap".to_string(), o.to_string()])
                    .unwrap_or_default(),
            )
            .env("FLOTILLA_RANK", rank.to_string())
            .env("FLOTILLA_WORLD_SIZE", ranks.to_string())
            .env("FLOTILLA_RENDEZVOUS", &rendezvous)
            .stdin(Stdio::null())
            .stdout(if rank == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| AllreduceBenchError::Rank {
                rank,
                message: format!("cannot start {}: {e}", exe.display()),
            })?;
        children.push(child);
    }
    let mut bad: Option<AllreduceBenchError> = None;
    if let Some(stdout) = children[0].stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<AllreducePoint>(&line) {
                Ok(p) => on_point(p),
                Err(_) => {
                    bad.get_or_insert(AllreduceBenchError::BadLine(line));
                }
            }
        }
    }
    let mut failed: Option<AllreduceBenchError> = None;
    for (rank, mut c) in children.into_iter().enumerate() {
        match c.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                failed.get_or_insert(AllreduceBenchError::Rank {
                    rank,
                    message: format!("exited with {s}"),
                });
            }
            Err(e) => {
                failed.get_or_insert(AllreduceBenchError::Rank {
                    rank,
                    message: e.to_string(),
                });
            }
        }
    }
    match failed.or(bad) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_the_job_file_reads_them_and_must_be_whole_floats() {
        assert_eq!(
            parse_sizes("4KiB,1MiB, 64MiB").unwrap(),
            vec![4096, 1 << 20, 64 << 20]
        );
        assert_eq!(parse_sizes("4K,1MB").unwrap(), vec![4000, 1_000_000]);
        assert!(parse_sizes("6")
            .unwrap_err()
            .to_string()
            .contains("multiple of 4"));
        assert!(parse_sizes("1X").is_err());
        assert!(parse_transport("udp").is_err());
        assert_eq!(parse_memory("host").unwrap(), Memory::Host);
        assert!(parse_memory("gpu").is_err());
    }
}
