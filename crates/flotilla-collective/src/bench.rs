//! Allreduce benchmark with nccl-tests semantics.
//!
//! For each size: a warm-up call whose result is checked, then `rounds` rounds of `iters`
//! timed `allreduce(f32, Sum)` calls, each round between barriers. A round's time is the
//! maximum over ranks of the mean time per call (agreed with an allreduce of `Max`); the
//! report has the median, minimum and maximum round. `algbw = bytes / seconds` and
//! `busbw = algbw * 2 (n - 1) / n`, in GB/s (1e9 bytes). After the timed rounds the result of
//! one more call is checked again.

use std::time::Instant;

use crate::comm::Communicator;
use crate::element::ReduceOp;
use crate::error::{CommError, Result};

/// One measured message size.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchPoint {
    /// Bytes per allreduce (a multiple of 4: f32 elements).
    pub bytes: usize,
    /// Timed calls per round.
    pub iters: usize,
    /// Median over rounds of the seconds per call.
    pub seconds: f64,
    /// Fastest round.
    pub min_seconds: f64,
    /// Slowest round.
    pub max_seconds: f64,
    /// Algorithm bandwidth of the median round, GB/s.
    pub algbw_gbs: f64,
    /// Bus bandwidth of the median round, GB/s.
    pub busbw_gbs: f64,
}

/// Calls per round for a message of `bytes`: about 256 MB of data per round, 1 to 1000 calls.
pub fn iters_for(bytes: usize) -> usize {
    ((256usize << 20) / bytes.max(1)).clamp(1, 1000)
}

fn fill(buf: &mut [f32], rank: usize) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = ((i % 61) as f32) + (rank as f32) * 0.5;
    }
}

fn check(buf: &[f32], n: usize, bytes: usize) -> Result<()> {
    let ranks: f32 = (0..n).map(|r| r as f32 * 0.5).sum();
    for (i, x) in buf.iter().enumerate() {
        let want = ((i % 61) as f32) * n as f32 + ranks;
        if *x != want {
            return Err(CommError::InvalidArgument(format!(
                "bench: wrong allreduce result at element {i} of {bytes} bytes: {x} != {want}"
            )));
        }
    }
    Ok(())
}

/// Where the benchmarked data lives: host memory ([`run`]) or, for device collectives, a
/// device buffer staged through the host.
pub trait BenchTarget {
    /// Makes the target's elements equal to `values`.
    fn load(&mut self, values: &[f32]) -> Result<()>;
    /// One allreduce (f32, sum) of the target's elements.
    fn allreduce(&mut self, comm: &mut Communicator) -> Result<()>;
    /// Copies the target's elements into `out`.
    fn read(&mut self, out: &mut [f32]) -> Result<()>;
}

/// A host vector.
struct HostTarget(Vec<f32>);

impl BenchTarget for HostTarget {
    fn load(&mut self, values: &[f32]) -> Result<()> {
        self.0.copy_from_slice(values);
        Ok(())
    }
    fn allreduce(&mut self, comm: &mut Communicator) -> Result<()> {
        comm.allreduce(&mut self.0, ReduceOp::Sum)
    }
    fn read(&mut self, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self.0);
        Ok(())
    }
}

/// Runs the benchmark for every size in `sizes` (bytes) on host memory; every rank gets
/// the same points.
pub fn run(comm: &mut Communicator, sizes: &[usize], rounds: usize) -> Result<Vec<BenchPoint>> {
    run_with(comm, sizes, rounds, |count| {
        Ok(Box::new(HostTarget(vec![0f32; count])))
    })
}

/// [`run`] on the targets `target_for(count)` makes, one per size (`count` f32 elements).
pub fn run_with(
    comm: &mut Communicator,
    sizes: &[usize],
    rounds: usize,
    mut target_for: impl FnMut(usize) -> Result<Box<dyn BenchTarget>>,
) -> Result<Vec<BenchPoint>> {
    let n = comm.size();
    let rounds = rounds.max(1);
    let mut out = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let count = bytes / 4;
        let bytes = count * 4;
        let iters = iters_for(bytes);
        let mut target = target_for(count)?;
        let mut host = vec![0f32; count];
        fill(&mut host, comm.rank());
        target.load(&host)?;
        target.allreduce(comm)?;
        target.read(&mut host)?;
        check(&host, n, bytes)?;
        host.iter_mut().for_each(|x| *x = 0.0);
        target.load(&host)?;
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..iters {
                target.allreduce(comm)?;
            }
            let mut mean = [t.elapsed().as_secs_f64() / iters as f64];
            comm.allreduce(&mut mean, ReduceOp::Max)?;
            times.push(mean[0]);
        }
        fill(&mut host, comm.rank());
        target.load(&host)?;
        target.allreduce(comm)?;
        target.read(&mut host)?;
        check(&host, n, bytes)?;
        times.sort_by(f64::total_cmp);
        let seconds = times[times.len() / 2];
        let algbw = if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            0.0
        };
        out.push(BenchPoint {
            bytes,
            iters,
            seconds,
            min_seconds: times[0],
            max_seconds: times[times.len() - 1],
            algbw_gbs: algbw,
            busbw_gbs: algbw * 2.0 * (n - 1) as f64 / n as f64,
        });
    }
    Ok(out)
}
