//! The one collective the trainer needs, behind a small trait.
//!
//! [`Reducer`] is implemented by [`flotilla_collective::Communicator`] (real ranks over TCP
//! or shared memory) and by [`Local`] (a single process, or a unit test), so the training
//! math is tested without sockets.

use flotilla_collective::{CommError, Communicator, ReduceOp};

/// Sums buffers across the ranks of a data-parallel gang.
pub trait Reducer {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Replaces `buf` on every rank by the element-wise sum of every rank's `buf`.
    fn allreduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError>;
    /// Whether every rank passed the same `values` (same length on every rank).
    fn agree(&mut self, values: &[i64]) -> Result<bool, CommError>;
}

/// The reducer of a single rank: sums are the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Local;

impl Reducer for Local {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn allreduce_sum(&mut self, _buf: &mut [f32]) -> Result<(), CommError> {
        Ok(())
    }

    fn agree(&mut self, _values: &[i64]) -> Result<bool, CommError> {
        Ok(true)
    }
}

impl Reducer for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn size(&self) -> usize {
        Communicator::size(self)
    }

    fn allreduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        self.allreduce(buf, ReduceOp::Sum)
    }

    fn agree(&mut self, values: &[i64]) -> Result<bool, CommError> {
        let mut max = values.to_vec();
        self.allreduce(&mut max, ReduceOp::Max)?;
        let mut min = values.to_vec();
        self.allreduce(&mut min, ReduceOp::Min)?;
        Ok(max == min)
    }
}
